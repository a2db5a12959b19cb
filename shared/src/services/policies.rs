//! Tenants' policies: a security team's rules over calls, in Cedar (see `crate::policies` for
//! the language's side). Set and read here, by the console, the CLI and the REST API alike;
//! enforced on every call: reads and silent writes at the worker's gate ([`check_call`]), two-
//! step actions at prepare and again at confirm, with the records the plan touches
//! ([`two_step`]).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use serde::Serialize;
use serde_json::{Value, json};

use crate::ctx::OpCtx;
use crate::datastore::{self as db, AuditEntry, Services};
use crate::effect::EffectClass;
use crate::error::{Error, Result};
use crate::policies::{
    Call, CallerFacts, Compiled, PolicyInfo, PolicySchema, Principal, Problem, Resource,
    TechnicianFacts, Verdict,
};
use crate::rights::Right;

/// The registry as policies see it, generated from the worker's tool registry and committed
/// (`shared/src/policies/registry.json`; the worker's test
/// `the_policy_schema_is_the_registrys` fails until a new tool is in it): each tool's class
/// and the Cedar schema.
static REGISTRY: LazyLock<Value> = LazyLock::new(|| {
    serde_json::from_str(include_str!("../policies/registry.json"))
        .expect("the committed policy registry is JSON")
});

/// The schema every policy set is validated and evaluated against.
pub fn schema() -> Arc<PolicySchema> {
    static SCHEMA: LazyLock<Arc<PolicySchema>> = LazyLock::new(|| {
        Arc::new(
            PolicySchema::new(REGISTRY["schema"].clone())
                .expect("the committed policy schema is Cedar's"),
        )
    });
    SCHEMA.clone()
}

/// Each tool's effect class, by name.
fn classes() -> &'static HashMap<String, EffectClass> {
    static CLASSES: LazyLock<HashMap<String, EffectClass>> = LazyLock::new(|| {
        REGISTRY["classes"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(tool, class)| {
                        Some((tool.clone(), EffectClass::parse(class.as_str()?)?))
                    })
                    .collect()
            })
            .unwrap_or_default()
    });
    &CLASSES
}

/// The committed registry file's content for these tools (the worker's test writes and
/// compares it).
pub fn registry_json(tools: &[crate::policies::ToolFacts<'_>]) -> Value {
    // Confirming and rejecting are decided as the action they complete, never by their own
    // name: a policy naming them would validate and never apply, so the schema leaves them out.
    let kept: Vec<crate::policies::ToolFacts<'_>> = tools
        .iter()
        .filter(|t| !matches!(t.name, "confirm_action" | "reject_action"))
        .map(|t| crate::policies::ToolFacts {
            name: t.name,
            class: t.class,
            input_schema: t.input_schema,
        })
        .collect();
    let tools = kept.as_slice();
    let classes: serde_json::Map<String, Value> =
        tools.iter().map(|t| (t.name.to_owned(), Value::from(t.class.as_str()))).collect();
    serde_json::json!({"classes": classes, "schema": crate::policies::schema_json(tools)})
}

/// The tenant's set at `version`, compiled once per process and version (`None` for version
/// 0: no policy). A version that no longer compiles (the schema lost a tool it names) is an
/// error, and calls are refused with it, never allowed.
pub async fn compiled(ds: &Services, ctx: &OpCtx, version: i32) -> Result<Option<Arc<Compiled>>> {
    if version <= 0 {
        return Ok(None);
    }
    let tenant = ctx.tenant_id();
    let cache = &ds.compiled_policies().0;
    if let Some((v, set)) = cache.lock().ok().and_then(|m| m.get(&tenant).cloned())
        && v == version
    {
        return Ok(Some(set));
    }
    let source = ds.policy_at(ctx, version).await?.ok_or_else(|| {
        Error::Internal(format!("policy version {version} of the tenant is missing"))
    })?;
    let set = Arc::new(compile_guarded(&source).map_err(|problems| Error::PolicyRefused {
        policy: format!("version {version}"),
        reason: format!("the tenant's policy set no longer compiles: {}", join(&problems)),
        approval: false,
    })?);
    if let Ok(mut map) = cache.lock() {
        map.insert(tenant, (version, set.clone()));
    }
    Ok(Some(set))
}

/// Compiles on a thread of its own with a large stack: Cedar's parser recurses on the source's
/// nesting, and a tenant's set must never take a worker down.
fn compile_guarded(source: &str) -> std::result::Result<Compiled, Vec<Problem>> {
    let owned = source.to_owned();
    let schema = schema();
    // On the async runtime, the wait for the compiling thread must not stall other requests.
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| compile_on_thread(owned, schema))
        }
        _ => compile_on_thread(owned, schema),
    }
}

fn compile_on_thread(
    owned: String,
    schema: Arc<PolicySchema>,
) -> std::result::Result<Compiled, Vec<Problem>> {
    std::thread::Builder::new()
        .name("policy-compile".into())
        .stack_size(256 * 1024 * 1024)
        .spawn(move || Compiled::compile(&owned, schema))
        .map_err(|e| vec![Problem { line: 0, message: format!("could not start compiling: {e}") }])?
        .join()
        .unwrap_or_else(|_| {
            Err(vec![Problem { line: 0, message: "the policy set could not be compiled".into() }])
        })
}

fn join(problems: &[Problem]) -> String {
    problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// The handle argument `field` names, trimmed as the tools read handles, when it has the
/// prefix of its kind.
fn named(args: &Value, field: &str, prefix: &str) -> Option<String> {
    args.get(field)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|h| h.starts_with(prefix))
        .map(str::to_owned)
}

/// The tools whose `technician` argument is the technician the call acts on or for (assigns
/// or pages), given to policies as `context.technician`; a search's technician filter is not.
/// Each names that technician among its audit targets, so the replay sees it too.
const NAMES_A_TECHNICIAN: [&str; 3] = ["update_booking", "create_booking", "page_technician"];

/// The technician `tool`'s arguments name for `context.technician`.
fn technician_named(tool: &str, args: &Value) -> Option<String> {
    NAMES_A_TECHNICIAN.contains(&tool).then(|| named(args, "technician", "tec_")).flatten()
}

/// The records a call's arguments name, as policies see them, read in one round trip: the
/// resource (the booking, else the customer, else the technician, else the tenant) and the
/// technician the call acts on or for (`context.technician`, also when it is the resource). A booking named but not found in the
/// tenant is no record at all, and the call cannot be judged on it: `Err`, which refuses (a
/// policy on its start must not be dodged by a handle the tool would have read otherwise).
async fn records_of<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    ctx: &OpCtx,
    tool: &str,
    args: &Value,
    now: jiff::Timestamp,
    ahead: Ahead,
) -> Result<std::result::Result<(Resource, Option<TechnicianFacts>), NotFound>> {
    let booked = named(args, "booking", "bkg_");
    let customer = if booked.is_some() { None } else { named(args, "customer", "cus_") };
    let technician = technician_named(tool, args);
    if let (Some(handle), None, Ahead::Use) = (&booked, &technician, ahead) {
        // `get_booking` read its booking with the context: the same row, no second round trip.
        if let Some(ahead) = crate::auth::peek_read_ahead_booking(ctx, handle) {
            return Ok(match ahead {
                Some((status, starts, region)) => {
                    Ok((booking(handle.clone(), status, starts, region, now), None))
                }
                None => Err(NotFound(handle.clone())),
            });
        }
    }
    // A technician named otherwise (a filter) is still the resource, as before.
    let resource_technician = technician.clone().or_else(|| named(args, "technician", "tec_"));
    if booked.is_none() && customer.is_none() && resource_technician.is_none() {
        return Ok(Ok((Resource::Tenant(ctx.tenant().handle.to_string()), None)));
    }
    let rows = db::policy_facts(
        executor,
        ctx,
        booked.as_slice(),
        customer.as_slice(),
        resource_technician.as_slice(),
    )
    .await?;
    let found = |h: &str| rows.iter().find(|r| r.handle == h);
    let beside = technician.as_deref().and_then(found).map(technician_of);
    if let Some(handle) = booked {
        return Ok(match found(&handle) {
            Some(row) => Ok((booking_of(row, now), beside)),
            None => Err(NotFound(handle)),
        });
    }
    if let Some(handle) = customer {
        // A customer the tenant does not have is refused by the tool itself; to a policy it is
        // a customer with no facts but the tenant's clock.
        return Ok(Ok((customer_of(ctx, handle.clone(), found(&handle), now), beside)));
    }
    let handle = resource_technician.unwrap_or_default();
    let facts = found(&handle).map(technician_of);
    Ok(Ok((
        Resource::Technician(facts.unwrap_or(TechnicianFacts {
            handle,
            region: None,
            active: None,
        })),
        beside,
    )))
}

/// A booking named by a call that the tenant does not have.
struct NotFound(String);

/// Whether a booking read ahead with the call's context may stand for the booking a call names:
/// for the worker's gate of a read, which judges the row the tool then reads; never inside a
/// two-step action's transaction, which judges the row as that transaction sees it.
enum Ahead {
    Use,
    Never,
}

fn booking(
    handle: String,
    status: String,
    starts: chrono::DateTime<chrono::Utc>,
    region: Option<String>,
    now: jiff::Timestamp,
) -> Resource {
    let starts = crate::datastore::to_ts(starts);
    let hours = (starts.as_second() - now.as_second()).div_euclid(3600);
    Resource::Booking { handle, status: Some(status), hours_until_start: Some(hours), region }
}

fn booking_of(row: &db::PolicyFactRow, now: jiff::Timestamp) -> Resource {
    match (&row.status, row.starts_at) {
        (Some(status), Some(starts)) => {
            booking(row.handle.clone(), status.clone(), starts, row.region.clone(), now)
        }
        _ => Resource::Booking {
            handle: row.handle.clone(),
            status: row.status.clone(),
            hours_until_start: None,
            region: row.region.clone(),
        },
    }
}

/// A customer as policies see it: its region, and the time in its zone (the tenant's when it
/// keeps none, or keeps one this build does not know).
fn customer_of(
    ctx: &OpCtx,
    handle: String,
    row: Option<&db::PolicyFactRow>,
    now: jiff::Timestamp,
) -> Resource {
    let zone = row
        .and_then(|r| r.zone.as_deref())
        .and_then(|z| jiff::tz::TimeZone::get(z).ok())
        .unwrap_or_else(|| ctx.tenant().zone.clone());
    Resource::Customer {
        handle,
        region: row.and_then(|r| r.region.clone()),
        local: Some(now.to_zoned_datetime(zone)),
    }
}

fn technician_of(row: &db::PolicyFactRow) -> TechnicianFacts {
    TechnicianFacts { handle: row.handle.clone(), region: row.region.clone(), active: row.active }
}

/// The gate for reads and silent writes: refused when a `forbid` matches (or an `@approval`
/// one: a read or silent write cannot wait for a person), or when the set cannot be evaluated.
pub async fn check_call(
    ds: &Services,
    ctx: &OpCtx,
    caller: &CallerFacts,
    tool: &str,
    class: EffectClass,
    args: &Value,
    now: jiff::Timestamp,
) -> Result<()> {
    let Some(set) = compiled(ds, ctx, caller.version).await? else { return Ok(()) };
    // A tool no policy applies to needs no facts: no query, no request.
    if !set.judges(tool) {
        return Ok(());
    }
    // No policy judging the tool reads the records: the verdict is the same whatever they are,
    // so none is read (a booking the tenant lacks is then the tool's own not-found).
    let named = if set.reads_records(tool) {
        records_of(ds.pool(), ctx, tool, args, now, Ahead::Use).await?
    } else {
        Ok((Resource::Tenant(ctx.tenant().handle.to_string()), None))
    };
    let (resource, technician) = match named {
        Ok(records) => records,
        // A booking the tenant does not have: the answer the tool itself gives (R3, R15).
        Err(NotFound(handle)) => {
            return Err(Error::not_found(crate::error::Resource::Booking, handle));
        }
    };
    let call = Call {
        connection: &caller.principal,
        tool,
        class,
        phase: "call",
        args: args.clone(),
        resource,
        technician,
        budgets: Vec::new(),
        effects: 0,
        now: now.to_zoned_datetime(ctx.tenant().zone.clone()),
    };
    match set.evaluate(&call) {
        Verdict::Allow => Ok(()),
        Verdict::Forbid(p) | Verdict::Approval(p) => Err(refusal(&p)),
        Verdict::Error(e) => Err(evaluation_error(e)),
    }
}

fn refusal(p: &PolicyInfo) -> Error {
    Error::PolicyRefused { policy: p.id.clone(), reason: p.reason.clone(), approval: p.approval }
}

fn evaluation_error(e: String) -> Error {
    Error::PolicyRefused { policy: "(evaluation)".into(), reason: e, approval: false }
}

/// A two-step action as the engine knows it when it asks the tenant's policies.
pub(crate) struct TwoStepCall<'a> {
    /// The connection that asked for it (not the person deciding in the console).
    pub connection_id: i64,
    pub tool: &'a str,
    pub class: EffectClass,
    pub args: &'a Value,
    /// The records the plan touches (its audit targets).
    pub targets: &'a [String],
    /// The plan's effects, by kind (`context.budgets`).
    pub effects: Vec<(crate::services::two_step::EffectKind, i64)>,
    /// The pending action being confirmed, whose own reservation its budgets do not count.
    pub pending: Option<i64>,
    pub phase: &'static str,
    pub now: jiff::Timestamp,
}

/// A two-step step's verdict, and what the audit rows of that step record of the set behind
/// it (`None` with no set in force).
pub(crate) struct Judged {
    pub verdict: Verdict,
    pub record: Option<Value>,
}

/// What an audit row records of the policy set `version` that decided: its version and the
/// policies that refused or held the call (none when the set allowed it).
fn decision_record(version: i32, verdict: &Verdict) -> Option<Value> {
    let decided_by: Vec<&str> = match verdict {
        Verdict::Allow => Vec::new(),
        Verdict::Forbid(p) | Verdict::Approval(p) => vec![p.id.as_str()],
        Verdict::Error(_) => vec!["(evaluation)"],
    };
    (version > 0).then(|| json!({"version": version, "decided_by": decided_by}))
}

/// What the audit row of an agent's read or silent write records: the set its call read with
/// its context allowed it (the worker's gate refused otherwise); `None` with no set in force.
pub(crate) fn allowed_record(ctx: &OpCtx) -> Option<Value> {
    decision_record(ctx.policy_version(), &Verdict::Allow)
}

/// The verdict for a two-step action at `phase` (`prepare`, `confirm`), in `tx`: judged on each
/// booking its plan touches (a batch is refused when any of its bookings is), else on the
/// record its arguments name, with the number of records touched as `context.effects`; with
/// what the step's audit rows record of the set.
pub(crate) async fn two_step(
    ds: &Services,
    tx: &mut db::Tx<'static>,
    ctx: &OpCtx,
    action: &TwoStepCall<'_>,
) -> Result<Judged> {
    let version = db::policy_version_in(tx, ctx).await?;
    let verdict = judge_two_step(ds, tx, ctx, action, version).await?;
    let record = decision_record(version, &verdict);
    Ok(Judged { verdict, record })
}

async fn judge_two_step(
    ds: &Services,
    tx: &mut db::Tx<'static>,
    ctx: &OpCtx,
    action: &TwoStepCall<'_>,
    version: i32,
) -> Result<Verdict> {
    // A set that cannot be read or compiled refuses, audited like any refusal, never rolled
    // back with the action's transaction.
    let set = match compiled(ds, ctx, version).await {
        Ok(Some(set)) => set,
        Ok(None) => return Ok(Verdict::Allow),
        Err(e @ Error::Unavailable { .. }) => return Err(e),
        Err(e) => return Ok(Verdict::Error(e.to_string())),
    };
    if !set.judges(action.tool) {
        return Ok(Verdict::Allow);
    }
    let Some((handle, role, client, name, grant, creator)) =
        db::policy_principal(&mut **tx, ctx, action.connection_id).await?
    else {
        return Ok(Verdict::Error("the connection that asked for it is gone".into()));
    };
    let principal = Principal { handle, role, client, grant, name, creator };
    let budgets = crate::services::budgets::standing(
        tx,
        ctx,
        action.connection_id,
        action.pending,
        &action.effects,
    )
    .await?;
    let bookings: Vec<String> =
        action.targets.iter().filter(|t| t.starts_with("bkg_")).cloned().collect();
    let (resources, technician): (Vec<Resource>, _) = if bookings.is_empty() {
        match records_of(&mut **tx, ctx, action.tool, action.args, action.now, Ahead::Never).await?
        {
            Ok((resource, technician)) => (vec![resource], technician),
            Err(NotFound(handle)) => {
                return Ok(Verdict::Error(format!("no booking {handle} in this tenant")));
            }
        }
    } else {
        let technician = technician_named(action.tool, action.args);
        let found = db::policy_facts(&mut **tx, ctx, &bookings, &[], technician.as_slice()).await?;
        let beside =
            technician.and_then(|h| found.iter().find(|r| r.handle == h)).map(technician_of);
        let found: Vec<Resource> = found
            .iter()
            .filter(|r| r.handle.starts_with("bkg_"))
            .map(|r| booking_of(r, action.now))
            .collect();
        if found.len() != bookings.len() {
            return Ok(Verdict::Error("a booking of the plan is gone".into()));
        }
        (found, beside)
    };
    let verdicts = resources.into_iter().map(|resource| {
        set.evaluate(&Call {
            connection: &principal,
            tool: action.tool,
            class: action.class,
            phase: action.phase,
            args: action.args.clone(),
            resource,
            technician: technician.clone(),
            budgets: budgets.clone(),
            effects: action.targets.len() as i64,
            now: action.now.to_zoned_datetime(ctx.tenant().zone.clone()),
        })
    });
    Ok(strictest(verdicts))
}

/// The arguments whose values a policy simulation may keep: handles, times and zones,
/// numbers, choices and switches. Everything else a tool takes is withheld: free text (a note,
/// a message, a reason), contact details and names, search words, and opaque tokens (versions,
/// cursors, idempotency keys). The worker's registry test fails until a new argument is in one
/// of the two lists.
pub const KEPT_ARGUMENTS: &[&str] = &[
    "booking",
    "bookings",
    "customer",
    "technician",
    "service",
    "rule",
    "start",
    "from",
    "to",
    "date",
    "zone",
    "status",
    "priority",
    "minutes",
    "limit",
    "expected_count",
    "separate",
    "include_inactive",
    "skill",
];

/// The arguments a simulation never keeps (see [`KEPT_ARGUMENTS`]).
pub const WITHHELD_ARGUMENTS: &[&str] = &[
    "text",
    "body",
    "subject",
    "message",
    "name",
    "email",
    "phone",
    "query",
    "reference",
    "reason",
    "version",
    "idempotency_key",
    "cursor",
    "notes_cursor",
];

/// What an agent's audited call keeps for simulation: the arguments of `tool` that policies
/// can name and that are not secret ([`KEPT_ARGUMENTS`]), as sent; `None` when there are none,
/// and for every call that is not an agent's (a person's re-planned preview, the REST API).
/// Only values of the shapes a kept argument has are kept (a short string, a number, a
/// switch, a short list of those): a future tool whose argument of a kept name carried free
/// text or an object keeps nothing of it.
pub(crate) fn call_facts(ctx: &OpCtx, tool: &str, args: &Value) -> Option<Value> {
    if ctx.channel() != crate::ctx::Channel::Mcp {
        return None;
    }
    const LONGEST: usize = 100;
    fn plain(v: &Value) -> bool {
        match v {
            Value::String(s) => s.chars().count() <= LONGEST,
            Value::Number(_) | Value::Bool(_) => true,
            _ => false,
        }
    }
    let typed = &REGISTRY["schema"][""]["actions"][tool]["appliesTo"]["context"]["attributes"]["args"]
        ["attributes"];
    let kept: serde_json::Map<String, Value> = args
        .as_object()?
        .iter()
        .filter(|(name, value)| {
            KEPT_ARGUMENTS.contains(&name.as_str())
                && typed.get(*name).is_some()
                && match value {
                    Value::Array(items) => {
                        items.len() <= crate::policies::MAX_ARG_ITEMS && items.iter().all(plain)
                    }
                    other => plain(other),
                }
        })
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    // Well inside the table's bound (16 KiB as Postgres prints it, with its spaces), so
    // keeping facts never fails an agent's write; past it, nothing is kept.
    let kept = Value::Object(kept);
    (kept.as_object().is_some_and(|m| !m.is_empty()) && kept.to_string().len() <= 8 * 1024)
        .then_some(kept)
}

/// The handle prefix of the record a call of `tool` is judged on, as [`records_of`] picks it
/// from the tool's arguments: a booking, else a customer, else a technician (`None`: the
/// tenant).
fn resource_prefix(tool: &str) -> Option<&'static str> {
    let args = &REGISTRY["schema"][""]["actions"][tool]["appliesTo"]["context"]["attributes"]["args"]
        ["attributes"];
    [("booking", "bkg_"), ("customer", "cus_"), ("technician", "tec_")]
        .into_iter()
        .find(|(arg, _)| args.get(arg).is_some())
        .map(|(_, prefix)| prefix)
}

/// The strictest verdict of a plan's records: a refusal, then an error, then a person.
fn strictest(verdicts: impl Iterator<Item = Verdict>) -> Verdict {
    let rank = |v: &Verdict| match v {
        Verdict::Allow => 0,
        Verdict::Approval(_) => 1,
        Verdict::Error(_) => 2,
        Verdict::Forbid(_) => 3,
    };
    let mut worst = Verdict::Allow;
    for verdict in verdicts {
        if rank(&verdict) > rank(&worst) {
            worst = verdict;
        }
    }
    worst
}

/// The refusal of a two-step action by policy: the error the agent sees.
pub(crate) fn refused_by(verdict: &Verdict) -> Option<Error> {
    match verdict {
        Verdict::Forbid(p) => Some(refusal(p)),
        Verdict::Error(e) => Some(evaluation_error(e.clone())),
        Verdict::Allow | Verdict::Approval(_) => None,
    }
}

// ------------------------------------------------------------------ reading and setting

/// The set in force.
#[derive(Debug, Serialize)]
pub struct PolicyView {
    /// 0 when the tenant has none.
    pub version: i32,
    pub source: String,
    pub policies: Vec<PolicyInfo>,
    pub author: Option<String>,
    pub note: Option<String>,
    pub set_at: Option<String>,
}

pub async fn show(ds: &Services, ctx: &OpCtx) -> Result<PolicyView> {
    ctx.require(Right::TenantSwitch)?;
    let Some(row) = ds.policy_current(ctx).await? else {
        return Ok(PolicyView {
            version: 0,
            source: String::new(),
            policies: Vec::new(),
            author: None,
            note: None,
            set_at: None,
        });
    };
    let policies =
        compile_guarded(&row.source).map(|c| c.policies().cloned().collect()).unwrap_or_default();
    Ok(PolicyView {
        version: row.version,
        source: row.source,
        policies,
        author: Some(row.author),
        note: Some(row.note),
        set_at: Some(row.created_at.to_rfc3339()),
    })
}

/// Checks a draft against the schema: every problem at its line, or the policies it holds.
pub fn check(source: &str) -> std::result::Result<Vec<PolicyInfo>, Vec<Problem>> {
    compile_guarded(source).map(|c| c.policies().cloned().collect())
}

/// What setting a set came to.
#[derive(Debug, Serialize)]
pub struct PolicySetOutcome {
    pub version: i32,
    pub previous: i32,
    /// Whether it may widen what agents may do (then it was a passkey decision).
    pub widens: bool,
    pub policies: Vec<PolicyInfo>,
}

/// Puts `source` in force as the next version, when `expected` is the version in force (two
/// admins editing at once: the second is told, nothing is lost). A set that does not parse or
/// validate is refused with every problem at its line, and the set in force stays.
pub async fn set(
    ds: &Services,
    ctx: &OpCtx,
    source: &str,
    expected: i32,
    note: &str,
) -> Result<PolicySetOutcome> {
    ctx.require(Right::TenantSwitch)?;
    let note = note.trim();
    if note.chars().count() > 300 {
        return Err(Error::invalid("note", "at most 300 characters"));
    }
    let compiled =
        compile_guarded(source).map_err(|problems| Error::invalid("policy", join(&problems)))?;
    let mut tx = ds.begin().await?;
    let current = db::policy_version_locked(&mut tx, ctx).await?;
    if current != expected {
        return Err(Error::WrongState {
            message: format!(
                "the policy set changed while you edited it: version {current} is in force, your edit started from version {expected}; nothing was saved. Read version {current}, apply your change to it and set it again"
            ),
            use_instead: None,
        });
    }
    let old = match current {
        0 => String::new(),
        v => ds.policy_at(ctx, v).await?.unwrap_or_default(),
    };
    let widens = crate::policies::widens(&old, source);
    let version = current + 1;
    if widens {
        let digest = crate::canon::sha256_hex(source.as_bytes());
        let decision = crate::services::passkeys::Decision::policy_widen(version, &digest);
        crate::services::passkeys::require(&mut tx, ctx, &decision).await?;
    }
    let author = ctx.actor_handle().unwrap_or("operator").to_owned();
    db::policy_insert(&mut tx, ctx, version, source, &author, note).await?;
    let change = db::change("policy_version", current.to_string(), version.to_string());
    db::audit_insert(
        &mut tx,
        ctx,
        AuditEntry {
            action: "policy.set",
            outcome: "ok",
            targets: Vec::new(),
            pending_action: None,
            reason: Some(note).filter(|n| !n.is_empty()),
            change: Some(change),
            policy: None,
            call_facts: None,
        },
    )
    .await?;
    tx.commit().await?;
    Ok(PolicySetOutcome {
        version,
        previous: current,
        widens,
        policies: compiled.policies().cloned().collect(),
    })
}

/// The decision setting `source` would be, for its passkey ceremony: `None` when it only
/// narrows what the version in force allows.
pub async fn set_decision(
    ds: &Services,
    ctx: &OpCtx,
    source: &str,
    expected: i32,
) -> Result<Option<crate::services::passkeys::Decision>> {
    ctx.require(Right::TenantSwitch)?;
    let old = match expected {
        v if v > 0 => ds.policy_at(ctx, v).await?.unwrap_or_default(),
        _ => String::new(),
    };
    Ok(crate::policies::widens(&old, source).then(|| {
        let digest = crate::canon::sha256_hex(source.as_bytes());
        crate::services::passkeys::Decision::policy_widen(expected + 1, &digest)
    }))
}

/// One version in the history, with what it changed from the one before.
#[derive(Debug, Serialize)]
pub struct PolicyVersion {
    pub version: i32,
    pub author: String,
    pub note: String,
    pub set_at: String,
    /// Lines added since the previous version.
    pub added: Vec<String>,
    /// Lines removed since the previous version.
    pub removed: Vec<String>,
}

pub async fn history(ds: &Services, ctx: &OpCtx, limit: i64) -> Result<Vec<PolicyVersion>> {
    ctx.require(Right::TenantSwitch)?;
    let rows = ds.policy_history(ctx, limit.clamp(1, 100) + 1).await?;
    let mut out = Vec::new();
    for (i, row) in rows.iter().enumerate().take(limit.clamp(1, 100) as usize) {
        let before = rows.get(i + 1).map(|r| r.source.as_str()).unwrap_or_default();
        let (added, removed) = diff(before, &row.source);
        out.push(PolicyVersion {
            version: row.version,
            author: row.author.clone(),
            note: row.note.clone(),
            set_at: row.created_at.to_rfc3339(),
            added,
            removed,
        });
    }
    Ok(out)
}

/// The lines of `after` not in `before`, and of `before` not in `after`.
fn diff(before: &str, after: &str) -> (Vec<String>, Vec<String>) {
    let lines = |s: &str| -> Vec<String> {
        s.lines().map(str::trim_end).filter(|l| !l.trim().is_empty()).map(str::to_owned).collect()
    };
    let (b, a) = (lines(before), lines(after));
    let added = a.iter().filter(|l| !b.contains(l)).cloned().collect();
    let removed = b.iter().filter(|l| !a.contains(l)).cloned().collect();
    (added, removed)
}

// ------------------------------------------------------------------ simulation

/// What a draft would have done to the tenant's audited calls of a window.
#[derive(Debug, Serialize)]
pub struct Simulation {
    pub calls: usize,
    pub allowed: usize,
    pub forbidden: usize,
    pub to_a_person: usize,
    pub errors: usize,
    /// By policy id: how many calls it would have forbidden or sent to a person.
    pub by_policy: Vec<PolicyCount>,
    /// Up to five calls each policy would have caught.
    pub examples: Vec<SimulatedCall>,
    /// What the replay cannot know: withheld arguments (free text, contacts, tokens), what a
    /// budget's window had used, records as they were then.
    pub caveat: String,
}

#[derive(Debug, Serialize)]
pub struct PolicyCount {
    pub policy: String,
    pub forbidden: usize,
    pub to_a_person: usize,
}

#[derive(Debug, Serialize)]
pub struct SimulatedCall {
    pub policy: String,
    pub verdict: &'static str,
    /// Why the call could not be evaluated, for a verdict of `error`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    pub tool: String,
    pub connection: String,
    pub at: String,
}

/// The most audited calls one simulation replays (the newest of the window).
const REPLAY_LIMIT: i64 = 20_000;

/// Replays the tenant's audited calls of the last `hours` against `source`.
pub async fn simulate(ds: &Services, ctx: &OpCtx, source: &str, hours: i64) -> Result<Simulation> {
    ctx.require(Right::TenantSwitch)?;
    if !(1..=24 * 90).contains(&hours) {
        return Err(Error::invalid("hours", "a window of 1 hour to 90 days"));
    }
    let set =
        compile_guarded(source).map_err(|problems| Error::invalid("policy", join(&problems)))?;
    let calls = ds.policy_replay(ctx, hours, REPLAY_LIMIT).await?;
    let truncated = calls.len() as i64 == REPLAY_LIMIT;
    // Every record the calls touched, read once, as enforcement reads them.
    let of_kind = |prefix: &str| -> Vec<String> {
        calls
            .iter()
            .flat_map(|c| c.targets.iter().filter(|t| t.starts_with(prefix)).cloned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    let records: HashMap<String, db::PolicyFactRow> =
        db::policy_facts(ds.pool(), ctx, &of_kind("bkg_"), &of_kind("cus_"), &of_kind("tec_"))
            .await?
            .into_iter()
            .map(|r| (r.handle.clone(), r))
            .collect();
    let mut sim = Simulation {
        calls: 0,
        allowed: 0,
        forbidden: 0,
        to_a_person: 0,
        errors: 0,
        by_policy: Vec::new(),
        examples: Vec::new(),
        caveat: format!(
            "The audit log keeps tool, outcome, connection, time and the records touched; the non-secret facts of an agent's arguments are kept beside it for 91 days (handles, times, zones, numbers, choices; never free text, names, contacts, search words or tokens): a rule over context.args replays with those, and without the withheld ones; a rule over context.budgets is replayed without them (what a window had used then is not kept). Bookings, customers and technicians are judged as they are now, connections with their creator's current role.{}",
            if truncated {
                format!(" Only the newest {REPLAY_LIMIT} calls of the window were replayed.")
            } else {
                String::new()
            }
        ),
    };
    let mut counts: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
    let mut shown: HashMap<String, usize> = HashMap::new();
    for call in calls {
        let (tool, phase) = match call.action.strip_suffix(".preview") {
            Some(tool) => (tool.to_owned(), "prepare"),
            None => (call.action.clone(), "call"),
        };
        let Some(class) = classes().get(tool.as_str()).copied() else { continue };
        // A two-step action is judged where it was prepared; its execution row is the same call.
        if class.two_step() != (phase == "prepare") {
            continue;
        }
        sim.calls += 1;
        let principal = Principal {
            handle: call.connection.clone(),
            role: call.role.clone(),
            client: call.client.clone(),
            grant: call.grant.clone(),
            name: call.name.clone(),
            creator: call.creator.clone(),
        };
        // The record enforcement judged the call on: the kind its arguments name first, as
        // the audit targets name it.
        let first = resource_prefix(&tool)
            .and_then(|p| call.targets.iter().find(|t| t.starts_with(p)))
            .cloned()
            .unwrap_or_default();
        let at = crate::datastore::to_ts(call.at);
        // As enforcement judges it: a prepared plan on each booking it touches, else the
        // record the call named; hours until a start from the time of the call.
        let bookings: Vec<&String> = if phase == "prepare" {
            call.targets.iter().filter(|t| t.starts_with("bkg_")).collect()
        } else {
            std::iter::once(&first).filter(|t| t.starts_with("bkg_")).collect()
        };
        let resources: Option<Vec<Resource>> = if !bookings.is_empty() {
            bookings.iter().map(|h| records.get(*h).map(|r| booking_of(r, at))).collect()
        } else if first.starts_with("cus_") {
            Some(vec![customer_of(ctx, first.clone(), records.get(&first), at)])
        } else if first.starts_with("tec_") {
            Some(vec![Resource::Technician(match records.get(&first) {
                Some(row) => technician_of(row),
                None => TechnicianFacts { handle: first.clone(), region: None, active: None },
            })])
        } else {
            Some(vec![Resource::Tenant(ctx.tenant().handle.to_string())])
        };
        let Some(resources) = resources else {
            sim.errors += 1;
            continue;
        };
        // The technician the call acted on or for, as its audit targets name it.
        let technician = NAMES_A_TECHNICIAN
            .contains(&tool.as_str())
            .then(|| call.targets.iter().find(|t| t.starts_with("tec_")))
            .flatten()
            .and_then(|h| records.get(h))
            .map(technician_of);
        let verdict = strictest(resources.into_iter().map(|resource| {
            set.evaluate(&Call {
                connection: &principal,
                tool: &tool,
                class,
                phase,
                args: call.facts.clone().unwrap_or_else(|| Value::Object(Default::default())),
                resource,
                technician: technician.clone(),
                // Budgets are not replayed: what a window had used at the time is not kept.
                budgets: Vec::new(),
                effects: if phase == "prepare" { call.targets.len() as i64 } else { 0 },
                now: at.to_zoned_datetime(ctx.tenant().zone.clone()),
            })
        }));
        let mut why = None;
        let (policy, word) = match &verdict {
            Verdict::Allow => {
                sim.allowed += 1;
                continue;
            }
            Verdict::Forbid(p) => {
                sim.forbidden += 1;
                counts.entry(p.id.clone()).or_default().0 += 1;
                (p.id.clone(), "forbidden")
            }
            // A read or silent write cannot wait for a person: enforcement refuses it.
            Verdict::Approval(p) if phase == "call" => {
                sim.forbidden += 1;
                counts.entry(p.id.clone()).or_default().0 += 1;
                (p.id.clone(), "forbidden")
            }
            Verdict::Approval(p) => {
                sim.to_a_person += 1;
                counts.entry(p.id.clone()).or_default().1 += 1;
                (p.id.clone(), "to a person")
            }
            Verdict::Error(e) => {
                sim.errors += 1;
                why = Some(e.clone());
                ("(evaluation)".to_owned(), "error")
            }
        };
        let seen = shown.entry(policy.clone()).or_default();
        if *seen < 5 {
            *seen += 1;
            sim.examples.push(SimulatedCall {
                policy,
                verdict: word,
                why,
                tool,
                connection: call.connection,
                at: crate::time::present(at, &ctx.tenant().zone, &ctx.tenant().zone_name, at)
                    .display,
            });
        }
    }
    sim.by_policy = counts
        .into_iter()
        .map(|(policy, (forbidden, to_a_person))| PolicyCount { policy, forbidden, to_a_person })
        .collect();
    Ok(sim)
}
