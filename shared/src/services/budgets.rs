//! Budgets on effects (R7, R19): how much one agent connection (and, when the tenant sets
//! one, the whole tenant) may do over a rolling window, counted in effects — customers
//! messaged, bookings changed, technicians paged, alert-minutes muted, records deleted — as
//! the plan of each action reports them (`two_step::Plan::effects`), not in calls.
//!
//! Within budget the approval policy applies as before. An action that would take a window
//! over budget waits for a person whatever its class's policy (`off` stays off). The check
//! runs in the rail (`services::actions`), under one advisory lock per (tenant, kind) taken
//! in the transaction that checks and writes the ledger: at the preview, where an action the
//! agent may confirm reserves its effects so concurrent prepares on any worker see each
//! other, and again at execution under the pending action's lock. What a person approved
//! counts, and never asks again. Setting a budget is audited; raising one is a widening
//! decision (`passkeys::require`).

use serde::Serialize;

use crate::ctx::OpCtx;
use crate::datastore::{self as db, AuditEntry, Services, Tx};
use crate::error::{Error, Resource, Result};
use crate::handle::ConnectionHandle;
use crate::rights::Right;
use crate::services::passkeys::Decision;
pub use crate::services::two_step::EffectKind;

/// The shortest and longest window a budget may have.
pub const MIN_WINDOW_SECS: i64 = 60;
pub const MAX_WINDOW_SECS: i64 = 30 * 24 * 3600;
/// The largest budget that may be set.
pub const MAX_LIMIT: i64 = 1_000_000_000;

/// Every connection's budget of a kind when the tenant set none, per day: generous, meant to
/// stop a runaway agent, not a busy one. Defined once; docs/operations.md lists them.
pub fn default_budget(kind: EffectKind) -> (i64, i64) {
    const DAY: i64 = 24 * 3600;
    match kind {
        EffectKind::CustomersMessaged => (500, DAY),
        EffectKind::BookingsChanged => (500, DAY),
        EffectKind::TechniciansPaged => (50, DAY),
        EffectKind::AlertMinutesMuted => (2_880, DAY),
        EffectKind::RecordsDeleted => (100, DAY),
    }
}

/// Whose budget: one connection's, or the tenant's over all its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Connection,
    Tenant,
}

/// One budget as it stands now.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct BudgetView {
    pub kind: EffectKind,
    pub scope: Scope,
    /// How many units the window allows.
    pub limit: i64,
    /// The rolling window, e.g. `24h`.
    pub window: String,
    /// The same window in seconds.
    pub window_secs: i64,
    /// Executed in the window, plus what prepared actions the agent may still confirm reserve.
    pub used: i64,
    /// What the window still allows (0 when used up).
    pub left: i64,
    /// Whether it is the default (the tenant set none).
    pub default: bool,
}

/// A window as people write it: `90s`, `30m`, `1h`, `7d` (seconds without a unit).
pub fn parse_window(raw: &str) -> Result<i64> {
    let t = raw.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: Option<i64> = digits.parse().ok();
    let secs = match (n, unit) {
        (Some(n), "" | "s") => Some(n),
        (Some(n), "m") => n.checked_mul(60),
        (Some(n), "h") => n.checked_mul(3600),
        (Some(n), "d") => n.checked_mul(86_400),
        _ => None,
    };
    secs.filter(|s| (MIN_WINDOW_SECS..=MAX_WINDOW_SECS).contains(s))
        .ok_or_else(|| Error::invalid("window", "give a window of 1m to 30d, e.g. 1h, 24h or 7d"))
}

/// A window as people read it: the largest unit that divides it.
pub fn show_window(secs: i64) -> String {
    match secs {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// One budget an action would pass.
#[derive(Debug, Clone)]
pub(crate) struct Over {
    kind: EffectKind,
    scope: Scope,
    limit: i64,
    window_secs: i64,
    used: i64,
    amount: i64,
}

impl Over {
    /// "over the customers_messaged budget by 3 (used 48 of 50 in the last 1h)".
    fn line(&self) -> String {
        let whose = match self.scope {
            Scope::Connection => "",
            Scope::Tenant => "tenant-wide ",
        };
        format!(
            "over the {whose}{} budget by {} (used {} of {} in the last {})",
            self.kind.as_str(),
            self.used + self.amount - self.limit,
            self.used,
            self.limit,
            show_window(self.window_secs)
        )
    }
}

/// Why an action waits for a person: every budget it would pass, on one line.
pub(crate) fn reason(over: &[Over]) -> Option<String> {
    (!over.is_empty()).then(|| over.iter().map(Over::line).collect::<Vec<_>>().join("; "))
}

/// The budget of a kind for a connection: the tenant's setting or the default.
async fn connection_budget(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    connection_id: i64,
    kind: EffectKind,
) -> Result<(i64, i64, bool)> {
    Ok(match db::budget_get(tx, ctx, Some(connection_id), kind.as_str()).await? {
        Some((limit, window)) => (limit, i64::from(window), false),
        None => {
            let (limit, window) = default_budget(kind);
            (limit, window, true)
        }
    })
}

/// Takes the budget locks of `effects`' kinds (in one order) and returns every budget the
/// effects would pass, counting what is used now apart from `except`'s own reservation. The
/// locks hold until the transaction ends, so the reservation or the count written after this
/// is seen by the next check.
pub(crate) async fn check(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    connection_id: i64,
    except: Option<i64>,
    effects: &[(EffectKind, i64)],
) -> Result<Vec<Over>> {
    lock(tx, ctx, effects).await?;
    let mut over = Vec::new();
    for &(kind, amount) in effects {
        let (limit, window_secs, _) = connection_budget(tx, ctx, connection_id, kind).await?;
        let used = used(tx, ctx, Some(connection_id), kind, window_secs, except).await?;
        if used + amount > limit {
            over.push(Over { kind, scope: Scope::Connection, limit, window_secs, used, amount });
        }
        if let Some((limit, window)) = db::budget_get(tx, ctx, None, kind.as_str()).await? {
            let window_secs = i64::from(window);
            let used = used_tenant(tx, ctx, kind, window_secs, except).await?;
            if used + amount > limit {
                over.push(Over { kind, scope: Scope::Tenant, limit, window_secs, used, amount });
            }
        }
    }
    Ok(over)
}

/// Where `effects` stand against the connection's budgets, as a tenant's policies read them
/// (`context.budgets`): per kind, what the window has used apart from `except`'s own
/// reservation, the limit, and what the action adds. No lock is taken: the budget check that
/// follows decides under its locks; a policy reads the same figures a moment earlier.
pub(crate) async fn standing(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    connection_id: i64,
    except: Option<i64>,
    effects: &[(EffectKind, i64)],
) -> Result<Vec<crate::policies::BudgetFact>> {
    let mut facts = Vec::new();
    for &(kind, amount) in effects {
        let (limit, window_secs, _) = connection_budget(tx, ctx, connection_id, kind).await?;
        let used = used(tx, ctx, Some(connection_id), kind, window_secs, except).await?;
        facts.push(crate::policies::BudgetFact { kind: kind.as_str(), used, limit, amount });
    }
    Ok(facts)
}

async fn lock(tx: &mut Tx<'static>, ctx: &OpCtx, effects: &[(EffectKind, i64)]) -> Result<()> {
    let mut kinds: Vec<EffectKind> = effects.iter().map(|(k, _)| *k).collect();
    kinds.sort_unstable();
    kinds.dedup();
    for kind in kinds {
        db::budget_lock(tx, ctx, kind.index()).await?;
    }
    Ok(())
}

async fn used(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    connection_id: Option<i64>,
    kind: EffectKind,
    window_secs: i64,
    except: Option<i64>,
) -> Result<i64> {
    let window = i32::try_from(window_secs).unwrap_or(i32::MAX);
    db::budget_used(tx, ctx, connection_id, kind.as_str(), window, except).await
}

async fn used_tenant(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    kind: EffectKind,
    window_secs: i64,
    except: Option<i64>,
) -> Result<i64> {
    used(tx, ctx, None, kind, window_secs, except).await
}

fn named(effects: &[(EffectKind, i64)]) -> Vec<(&'static str, i64)> {
    effects.iter().map(|(k, n)| (k.as_str(), *n)).collect()
}

/// Reserves an action's effects while the agent may confirm it (call after [`check`]).
pub(crate) async fn reserve(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    connection_id: i64,
    pending: i64,
    effects: &[(EffectKind, i64)],
) -> Result<()> {
    db::budget_usage_insert(tx, ctx, connection_id, pending, &named(effects), false).await
}

/// Counts what an action did, in place of its reservation, under the budget locks.
pub(crate) async fn count(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    connection_id: i64,
    pending: i64,
    effects: &[(EffectKind, i64)],
) -> Result<()> {
    lock(tx, ctx, effects).await?;
    db::budget_usage_insert(tx, ctx, connection_id, pending, &named(effects), true).await
}

/// Why an action waits for a person because of a budget, kept with it for the console.
pub(crate) async fn note(tx: &mut Tx<'static>, ctx: &OpCtx, pending: i64, why: &str) -> Result<()> {
    db::pending_budget_reason(tx, ctx, pending, why).await
}

// ------------------------------------------------------------------ reading and setting

async fn views(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    connection_id: Option<i64>,
) -> Result<Vec<BudgetView>> {
    let mut out = Vec::new();
    for &kind in EffectKind::ALL {
        if let Some(id) = connection_id {
            let (limit, window_secs, default) = connection_budget(tx, ctx, id, kind).await?;
            let used = used(tx, ctx, Some(id), kind, window_secs, None).await?;
            out.push(view(kind, Scope::Connection, limit, window_secs, used, default));
        }
        if let Some((limit, window)) = db::budget_get(tx, ctx, None, kind.as_str()).await? {
            let window_secs = i64::from(window);
            let used = used_tenant(tx, ctx, kind, window_secs, None).await?;
            out.push(view(kind, Scope::Tenant, limit, window_secs, used, false));
        }
    }
    Ok(out)
}

fn view(
    kind: EffectKind,
    scope: Scope,
    limit: i64,
    window_secs: i64,
    used: i64,
    default: bool,
) -> BudgetView {
    BudgetView {
        kind,
        scope,
        limit,
        window: show_window(window_secs),
        window_secs,
        used,
        left: (limit - used).max(0),
        default,
    }
}

/// The budgets of the context's own connection (and the tenant's), used and left: what
/// `list_recent_changes` shows an agent.
pub(crate) async fn of_this_connection(ds: &Services, ctx: &OpCtx) -> Result<Vec<BudgetView>> {
    let Some(connection) = ctx.connection() else { return Ok(Vec::new()) };
    let mut tx = ds.begin().await?;
    let out = views(&mut tx, ctx, Some(connection.id)).await?;
    tx.rollback().await?;
    Ok(out)
}

async fn connection_id(tx: &mut Tx<'static>, ctx: &OpCtx, raw: &str) -> Result<i64> {
    let not_found =
        || Error::not_found(Resource::Connection, raw.chars().take(40).collect::<String>());
    let handle = ConnectionHandle::parse("connection", raw).map_err(|_| not_found())?;
    db::budget_connection_id(tx, ctx, handle.as_str()).await?.ok_or_else(not_found)
}

/// A connection's budgets and the tenant's (`connection` `None`: the tenant-wide ones only),
/// for the console and `gatehousectl budget show`.
pub async fn show(ds: &Services, ctx: &OpCtx, connection: Option<&str>) -> Result<Vec<BudgetView>> {
    ctx.require(Right::ConnectionsManage)?;
    let mut tx = ds.begin().await?;
    let id = match connection {
        Some(raw) => Some(connection_id(&mut tx, ctx, raw).await?),
        None => None,
    };
    let out = views(&mut tx, ctx, id).await?;
    tx.rollback().await?;
    Ok(out)
}

/// A budget to set: `limit` `None` puts a connection's budget back to the default, or
/// removes the tenant-wide one; `window_secs` `None` keeps the current window.
#[derive(Debug, Clone)]
pub struct BudgetSet<'a> {
    /// A connection handle, or `None` for the tenant-wide budget.
    pub connection: Option<&'a str>,
    pub kind: &'a str,
    pub limit: Option<i64>,
    pub window_secs: Option<i64>,
}

/// What a setting would be, checked, against what is in force: (kind, connection id,
/// before, after) with `None` meaning no tenant-wide budget.
type Change = (EffectKind, Option<i64>, Option<(i64, i64)>, Option<(i64, i64)>);

async fn change(tx: &mut Tx<'static>, ctx: &OpCtx, set: &BudgetSet<'_>) -> Result<Change> {
    let kind = EffectKind::parse("kind", set.kind)?;
    if set.limit.is_some_and(|n| !(0..=MAX_LIMIT).contains(&n)) {
        return Err(Error::invalid("limit", format!("give 0 to {MAX_LIMIT} units, or `default`")));
    }
    if set.window_secs.is_some_and(|w| !(MIN_WINDOW_SECS..=MAX_WINDOW_SECS).contains(&w)) {
        return Err(Error::invalid("window", "give a window of 1m to 30d"));
    }
    let id = match set.connection {
        Some(raw) => Some(connection_id(tx, ctx, raw).await?),
        None => None,
    };
    let before = match id {
        Some(id) => {
            let (limit, window, _) = connection_budget(tx, ctx, id, kind).await?;
            Some((limit, window))
        }
        None => db::budget_get(tx, ctx, None, kind.as_str()).await?.map(|(l, w)| (l, i64::from(w))),
    };
    let after = match (set.limit, id) {
        (Some(limit), _) => {
            let window =
                set.window_secs.or(before.map(|b| b.1)).unwrap_or_else(|| default_budget(kind).1);
            Some((limit, window))
        }
        (None, Some(_)) => Some(default_budget(kind)),
        (None, None) => None,
    };
    Ok((kind, id, before, after))
}

/// Whether a budget lets agents do more than before: a larger limit, a shorter window, or no
/// tenant-wide budget where there was one.
fn raises(before: Option<(i64, i64)>, after: Option<(i64, i64)>) -> bool {
    match (before, after) {
        (Some((l0, w0)), Some((l1, w1))) => l1 > l0 || w1 < w0,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

fn decision(set: &BudgetSet<'_>, kind: EffectKind, after: Option<(i64, i64)>) -> Decision {
    Decision::raise_budget(set.connection.map(str::trim).unwrap_or("tenant"), kind.as_str(), after)
}

/// Sets a budget, audited; raising one needs the passkey under the tenant's policy. Holds from
/// the next action on every worker: budgets are read in the transaction of every check.
pub async fn set(ds: &Services, ctx: &OpCtx, set: &BudgetSet<'_>) -> Result<Vec<BudgetView>> {
    ctx.require(Right::TenantSwitch)?;
    let mut tx = ds.begin().await?;
    let (kind, id, before, after) = change(&mut tx, ctx, set).await?;
    if raises(before, after) {
        crate::services::passkeys::require(&mut tx, ctx, &decision(set, kind, after)).await?;
    }
    let stored = match (set.limit, after) {
        (Some(_), Some((limit, window))) => {
            Some((limit, i32::try_from(window).unwrap_or(i32::MAX)))
        }
        _ => None,
    };
    db::budget_put(&mut tx, ctx, id, kind.as_str(), stored).await?;
    let scope = set.connection.map(str::trim).unwrap_or("tenant").to_owned();
    let reason = match after {
        Some((limit, window)) if set.limit.is_some() => {
            format!("{}: {limit} per {}", kind.as_str(), show_window(window))
        }
        Some((limit, window)) => {
            format!("{}: default ({limit} per {})", kind.as_str(), show_window(window))
        }
        None => format!("{}: no tenant-wide budget", kind.as_str()),
    };
    let mut entry = AuditEntry::ok("budget.set", vec![scope, kind.as_str().to_owned()]);
    entry.reason = Some(&reason);
    let shown = |b: Option<(i64, i64)>| b.map(|(l, w)| format!("{l} per {}", show_window(w)));
    entry.change = Some(db::change("budget", shown(before), shown(after)));
    db::audit_insert(&mut tx, ctx, entry).await?;
    let out = views(&mut tx, ctx, id).await?;
    tx.commit().await?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_read_and_show_in_their_units() {
        assert_eq!(parse_window("1h").ok(), Some(3600));
        assert_eq!(parse_window("90s").ok(), Some(90));
        assert_eq!(parse_window("7d").ok(), Some(7 * 86_400));
        assert!(parse_window("30s").is_err());
        assert!(parse_window("31d").is_err());
        assert!(parse_window("1w").is_err());
        assert_eq!(show_window(86_400), "1d");
        assert_eq!(show_window(5400), "90m");
    }

    #[test]
    fn raising_is_a_larger_limit_a_shorter_window_or_no_tenant_budget() {
        assert!(raises(Some((10, 3600)), Some((11, 3600))));
        assert!(raises(Some((10, 3600)), Some((10, 60))));
        assert!(raises(Some((10, 3600)), None));
        assert!(!raises(Some((10, 3600)), Some((5, 7200))));
        assert!(!raises(None, Some((5, 3600))));
    }
}
