//! Enforcement: the verdict for a call at the worker's gate, and for a two-step action at
//! prepare and at confirm, over the records the call names.

use super::*;

/// The handle argument `field` names, trimmed as the tools read handles, when it has the
/// prefix of its kind.
pub(super) fn named(args: &Value, field: &str, prefix: &str) -> Option<String> {
    args.get(field)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|h| h.starts_with(prefix))
        .map(str::to_owned)
}

/// The tools whose `technician` argument is the technician the call acts on or for (assigns
/// or pages), given to policies as `context.technician`; a search's technician filter is not.
/// Each names that technician among its audit targets, so the replay sees it too.
pub(super) const NAMES_A_TECHNICIAN: [&str; 3] =
    ["update_booking", "create_booking", "page_technician"];

/// The technician `tool`'s arguments name for `context.technician`.
pub(super) fn technician_named(tool: &str, args: &Value) -> Option<String> {
    NAMES_A_TECHNICIAN.contains(&tool).then(|| named(args, "technician", "tec_")).flatten()
}

/// The handles of the records a call of `tool` with `args` names, as policies see them: the
/// booking, else the customer; and the technician (the one the call acts on or for, else a
/// filter's). What [`records_of`] reads, and the key of the read done ahead with the context.
pub(super) fn records_named(
    tool: &str,
    args: &Value,
) -> (Option<String>, Option<String>, Option<String>) {
    let booked = named(args, "booking", "bkg_");
    let customer = if booked.is_some() { None } else { named(args, "customer", "cus_") };
    let technician = technician_named(tool, args).or_else(|| named(args, "technician", "tec_"));
    (booked, customer, technician)
}

/// The read the worker's entry point does with the connection context for a call of `tool`
/// judged at the gate ([`check_call`]): what the tenant's policies see of the records its
/// arguments name, so that judging them costs no round trip of its own. `None` when the call
/// names no record. The statement reads them only when the tenant has a policy set in force.
pub fn facts_ahead(tool: &str, args: &Value) -> Option<crate::auth::ReadAhead> {
    let (booked, customer, technician) = records_named(tool, args);
    (booked.is_some() || customer.is_some() || technician.is_some()).then(|| {
        crate::auth::ReadAhead::Facts {
            bookings: booked.into_iter().collect(),
            customers: customer.into_iter().collect(),
            technicians: technician.into_iter().collect(),
        }
    })
}

/// The records a call's arguments name, as policies see them, read in one round trip: the
/// resource (the booking, else the customer, else the technician, else the tenant) and the
/// technician the call acts on or for (`context.technician`, also when it is the resource). A booking named but not found in the
/// tenant is no record at all, and the call cannot be judged on it: `Err`, which refuses (a
/// policy on its start must not be dodged by a handle the tool would have read otherwise).
pub(super) async fn records_of<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    ctx: &OpCtx,
    tool: &str,
    args: &Value,
    now: jiff::Timestamp,
    ahead: Ahead,
) -> Result<std::result::Result<(Resource, Option<TechnicianFacts>), NotFound>> {
    let (booked, customer, resource_technician) = records_named(tool, args);
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
    if booked.is_none() && customer.is_none() && resource_technician.is_none() {
        return Ok(Ok((Resource::Tenant(ctx.tenant().handle.to_string()), None)));
    }
    // Read with the context when the entry point asked for these very records (the gate of a
    // call, not a two-step action's transaction); else read now.
    let key = crate::auth::ReadAhead::Facts {
        bookings: booked.clone().into_iter().collect(),
        customers: customer.clone().into_iter().collect(),
        technicians: resource_technician.clone().into_iter().collect(),
    };
    let ahead_rows = match ahead {
        Ahead::Use => match crate::auth::take_read_ahead(ctx, &key) {
            Some(crate::auth::AheadRows::Facts(rows)) => Some(rows),
            _ => None,
        },
        Ahead::Never => None,
    };
    let rows = match ahead_rows {
        Some(rows) => rows,
        None => {
            db::policy_facts(
                executor,
                ctx,
                booked.as_slice(),
                customer.as_slice(),
                resource_technician.as_slice(),
            )
            .await?
        }
    };
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
pub(super) struct NotFound(String);

/// Whether a booking read ahead with the call's context may stand for the booking a call names:
/// for the worker's gate of a read, which judges the row the tool then reads; never inside a
/// two-step action's transaction, which judges the row as that transaction sees it.
#[derive(Clone, Copy)]
pub(super) enum Ahead {
    Use,
    Never,
}

pub(super) fn booking(
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

pub(super) fn booking_of(row: &db::PolicyFactRow, now: jiff::Timestamp) -> Resource {
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
pub(super) fn customer_of(
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

pub(super) fn technician_of(row: &db::PolicyFactRow) -> TechnicianFacts {
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

pub(super) fn refusal(p: &PolicyInfo) -> Error {
    Error::PolicyRefused { policy: p.id.clone(), reason: p.reason.clone(), approval: p.approval }
}

pub(super) fn evaluation_error(e: String) -> Error {
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
pub(super) fn decision_record(version: i32, verdict: &Verdict) -> Option<Value> {
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

pub(super) async fn judge_two_step(
    ds: &Services,
    tx: &mut db::Tx<'static>,
    ctx: &OpCtx,
    action: &TwoStepCall<'_>,
    version: i32,
) -> Result<Verdict> {
    // A set that cannot be read or compiled refuses, audited like any refusal, never rolled
    // back with the action's transaction.
    let set = match compiled_on(ds, Some(tx), ctx, version).await {
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
    // When no policy of the tool reads a record, every record of the plan gets the same verdict:
    // judged once, not once per booking of a batch.
    let judged = if set.reads_records(action.tool) { resources.len() } else { 1 };
    let verdicts = resources.into_iter().take(judged).map(|resource| {
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
    // Strings as the tools read them, trimmed (a handle padded with spaces names its record),
    // and measured after that.
    fn plain(v: &Value) -> bool {
        match v {
            Value::String(s) => s.trim().chars().count() <= LONGEST,
            Value::Number(_) | Value::Bool(_) => true,
            _ => false,
        }
    }
    fn trimmed(v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(s.trim().to_owned()),
            Value::Array(items) => Value::Array(items.iter().map(trimmed).collect()),
            other => other.clone(),
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
        .map(|(name, value)| (name.clone(), trimmed(value)))
        .collect();
    // Well inside the table's bound (16 KiB as Postgres prints it, with its spaces), so
    // keeping facts never fails an agent's write; past it, nothing is kept.
    let kept = Value::Object(kept);
    (kept.as_object().is_some_and(|m| !m.is_empty()) && kept.to_string().len() <= 8 * 1024)
        .then_some(kept)
}

/// The handle prefixes of the records a call of `tool` may be judged on, in the order
/// [`records_of`] picks among the ones its arguments name: a booking, else a customer, else a
/// technician (none named: the tenant).
pub(super) fn resource_prefixes(tool: &str) -> impl Iterator<Item = &'static str> {
    let args = &REGISTRY["schema"][""]["actions"][tool]["appliesTo"]["context"]["attributes"]["args"]
        ["attributes"];
    [("booking", "bkg_"), ("customer", "cus_"), ("technician", "tec_")]
        .into_iter()
        .filter(move |(arg, _)| args.get(arg).is_some())
        .map(|(_, prefix)| prefix)
}

/// The strictest verdict of a plan's records: a refusal, then an error, then a person.
pub(super) fn strictest(verdicts: impl Iterator<Item = Verdict>) -> Verdict {
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
