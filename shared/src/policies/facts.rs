//! What a call brings to its policies: the caller, the records, the clock, and the verdict.

use std::sync::Arc;

use serde_json::Value;

use super::*;

/// Compiled sets by tenant, one version each (a new version replaces the old): held by the
/// `Services` of one database, so two databases' tenants never share an entry.
#[derive(Debug, Default)]
pub struct CompiledByTenant(
    /// By tenant: the version last compiled, and the set, or why it no longer compiles.
    pub(crate) std::sync::Mutex<std::collections::HashMap<i64, (i32, Kept)>>,
    /// One compilation at a time per tenant: the calls that arrive together right after a new
    /// version wait for the first one's instead of each compiling it (a set of 500 policies
    /// takes a core for a fraction of a second).
    pub(crate) std::sync::Mutex<std::collections::HashMap<i64, Arc<tokio::sync::Mutex<()>>>>,
);

/// A version as compiled: the set, or why it no longer compiles.
pub(crate) type Kept = Result<Arc<Compiled>, String>;

/// What the worker knows of the caller from the connection context: the policy version in
/// force and who the connection is.
#[derive(Debug, Clone)]
pub struct CallerFacts {
    pub version: i32,
    pub principal: Principal,
}

/// The connection a call comes through, as policies see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub handle: String,
    /// The creator's current role in the tenant.
    pub role: String,
    pub client: String,
    /// `static`, `oauth` or `id_jag`.
    pub grant: String,
    pub name: String,
    /// The person who created the connection (`per_…`).
    pub creator: String,
}

/// The record a call names.
#[derive(Debug, Clone)]
pub enum Resource {
    Tenant(String),
    Booking {
        handle: String,
        status: Option<String>,
        hours_until_start: Option<i64>,
        /// Its customer's region.
        region: Option<String>,
    },
    Customer {
        handle: String,
        region: Option<String>,
        /// The time in the customer's zone (the tenant's when the customer has none).
        local: Option<jiff::ZonedDateTime>,
    },
    Technician(TechnicianFacts),
}

/// One kind of effect of a two-step action against the connection's budget of that kind.
#[derive(Debug, Clone)]
pub struct BudgetFact {
    /// One of [`BUDGET_KINDS`].
    pub kind: &'static str,
    /// Used in the budget's window, apart from this action.
    pub used: i64,
    pub limit: i64,
    /// What this action adds.
    pub amount: i64,
}

/// A technician as policies see it: as the resource (`page_technician`) or as the one a call
/// names beside its record (`context.technician`).
#[derive(Debug, Clone)]
pub struct TechnicianFacts {
    pub handle: String,
    pub region: Option<String>,
    /// `None` for a technician the tenant does not have.
    pub active: Option<bool>,
}

impl Resource {
    /// Its type, as an index into [`RESOURCE_TYPES`], and its handle.
    pub(super) fn uid(&self) -> (usize, &str) {
        match self {
            Resource::Tenant(h) => (0, h),
            Resource::Booking { handle, .. } => (1, handle),
            Resource::Customer { handle, .. } => (2, handle),
            Resource::Technician(t) => (3, &t.handle),
        }
    }
}

/// A wall clock's fields, as `context.now` and a customer's `local_time` give them.
///
/// They change once a minute, so each thread keeps the last two it built (the tenant's zone
/// and a customer's), by the local date, hour and minute they were built from: every other
/// call of that minute in that zone shares the value instead of building it again.
pub(super) fn clock(at: &jiff::ZonedDateTime) -> cedar_policy_core::ast::Value {
    use cedar_policy_core::ast::Value;
    type Minute = (jiff::civil::Date, i8, i8);
    thread_local! {
        static KEPT: std::cell::RefCell<[Option<(Minute, Value)>; 2]> =
            const { std::cell::RefCell::new([None, None]) };
    }
    let date = at.date();
    let minute: Minute = (date, at.hour(), at.minute());
    let kept = KEPT.with_borrow(|kept| {
        kept.iter().flatten().find(|(m, _)| *m == minute).map(|(_, value)| value.clone())
    });
    if let Some(value) = kept {
        return value;
    }
    let day = format!("{:04}-{:02}-{:02}", date.year(), date.month(), date.day());
    let fields = [
        ("hour", Value::from(i64::from(at.hour()))),
        ("minute", Value::from(i64::from(at.minute()))),
        ("weekday", Value::from(weekday(date.weekday()))),
        ("date", Value::from(day.as_str())),
    ];
    let value = Value::record(fields, None);
    KEPT.with_borrow_mut(|kept| {
        // The newest first: the older of the two makes room.
        kept.swap(0, 1);
        kept[0] = Some((minute, value.clone()));
    });
    value
}

/// Whether `policy` reads the records a call names: a scope that constrains the resource, or a
/// condition that names `resource` or `technician` anywhere (read from the policy's JSON form;
/// when that form cannot be had, it is taken to read them).
pub(super) fn reads_a_record(policy: &cedar_policy::Policy) -> bool {
    if !matches!(policy.resource_constraint(), cedar_policy::ResourceConstraint::Any) {
        return true;
    }
    match policy.to_json() {
        Ok(json) => {
            let conditions = json["conditions"].to_string();
            conditions.contains("\"Var\":\"resource\"") || conditions.contains("technician")
        }
        Err(_) => true,
    }
}

/// The attributes of `context` a policy reads (`context.now`, `context has args`), or `None`
/// when it uses `context` otherwise (as a whole value) or its JSON form cannot be read: then a
/// call judged by it gets every attribute. A call's context is built with only the attributes
/// its tool's policies read; one they never read cannot change their verdict.
pub(super) fn context_reads(
    policy: &cedar_policy::Policy,
) -> Option<std::collections::BTreeSet<String>> {
    fn walk(
        node: &Value,
        reads: &mut std::collections::BTreeSet<String>,
        seen: &mut usize,
        used: &mut usize,
    ) {
        match node {
            Value::Object(map) => {
                if map.len() == 1 && map.get("Var").and_then(Value::as_str) == Some("context") {
                    *used += 1;
                    return;
                }
                for (key, inner) in map {
                    if (key == "." || key == "has")
                        && inner["left"].get("Var").and_then(Value::as_str) == Some("context")
                        && let Some(attr) = inner["attr"].as_str()
                    {
                        reads.insert(attr.to_owned());
                        *seen += 1;
                    }
                    walk(inner, reads, seen, used);
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, reads, seen, used)),
            _ => {}
        }
    }
    let json = policy.to_json().ok()?;
    let (mut reads, mut seen, mut used) = (std::collections::BTreeSet::new(), 0, 0);
    walk(&json["conditions"], &mut reads, &mut seen, &mut used);
    (seen == used).then_some(reads)
}

/// A weekday's English name, as `context.now.weekday` gives it.
pub(super) fn weekday(day: jiff::civil::Weekday) -> &'static str {
    use jiff::civil::Weekday::*;
    match day {
        Monday => "Monday",
        Tuesday => "Tuesday",
        Wednesday => "Wednesday",
        Thursday => "Thursday",
        Friday => "Friday",
        Saturday => "Saturday",
        Sunday => "Sunday",
    }
}

/// One call, as policies see it.
#[derive(Debug)]
pub struct Call<'a> {
    pub connection: &'a Principal,
    pub tool: &'a str,
    pub class: EffectClass,
    /// `call` (a read or a silent write), `prepare` or `confirm` (a two-step action).
    pub phase: &'static str,
    /// The call's arguments as sent; those the schema types are kept, with their type.
    pub args: Value,
    pub resource: Resource,
    /// The technician the arguments name beside the resource (`context.technician`).
    pub technician: Option<TechnicianFacts>,
    /// A two-step action's effects against the connection's budgets (`context.budgets`);
    /// empty for reads and silent writes, which budgets do not count.
    pub budgets: Vec<BudgetFact>,
    /// How many records the action touches (0 for a read).
    pub effects: i64,
    /// The tenant's local time.
    pub now: jiff::ZonedDateTime,
}

/// What a policy set decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// A `forbid` matched: refused, naming it.
    Forbid(PolicyInfo),
    /// Only `@approval` policies matched: a person decides.
    Approval(PolicyInfo),
    /// The set could not be evaluated for this call: refused (never allowed).
    Error(String),
}
