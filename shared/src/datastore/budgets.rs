//! Budgets on effects and their ledger (see `services::budgets`).

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

/// A tenant's own budget of one kind: (limit, window in seconds).
pub(crate) type BudgetSetting = (i64, i32);

/// Serializes every check and write of one kind's budgets in the context's tenant until the
/// transaction ends. One key per (tenant, kind) covers the connections' budgets and the
/// tenant-wide one; the two-key form keeps these apart from the one-key locks of pending
/// actions and the replay cache.
pub(crate) async fn budget_lock(tx: &mut Tx<'_>, ctx: &OpCtx, kind_index: i32) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock(($1::bigint % 2147483647)::int4, 23000 + $2)")
        .bind(ctx.tenant_id())
        .bind(kind_index)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The tenant's own budget of `kind` for a connection (`None`: the tenant-wide one).
pub(crate) async fn budget_get(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    connection_id: Option<i64>,
    kind: &str,
) -> Result<Option<BudgetSetting>> {
    Ok(sqlx::query_as(
        "SELECT limit_units, window_secs FROM budgets
         WHERE tenant_id = $1 AND connection_id IS NOT DISTINCT FROM $2 AND kind = $3",
    )
    .bind(ctx.tenant_id())
    .bind(connection_id)
    .bind(kind)
    .fetch_optional(&mut **tx)
    .await?)
}

/// Sets (or with `None` removes) the tenant's budget of `kind` for a connection or, with
/// `connection_id` `None`, for the whole tenant.
pub(crate) async fn budget_put(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    connection_id: Option<i64>,
    kind: &str,
    setting: Option<BudgetSetting>,
) -> Result<()> {
    sqlx::query(
        "DELETE FROM budgets WHERE tenant_id = $1 AND connection_id IS NOT DISTINCT FROM $2 AND kind = $3",
    )
    .bind(ctx.tenant_id())
    .bind(connection_id)
    .bind(kind)
    .execute(&mut **tx)
    .await?;
    if let Some((limit, window)) = setting {
        sqlx::query(
            "INSERT INTO budgets (tenant_id, connection_id, kind, limit_units, window_secs)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(ctx.tenant_id())
        .bind(connection_id)
        .bind(kind)
        .bind(limit)
        .bind(window)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// What counts against a budget of `kind` in the last `window_secs`, for one connection (or
/// with `None` the whole tenant): executed effects, and the reservations of actions an agent
/// may still confirm (pending, unexpired, `agent_confirms`). `except` leaves out one action's
/// own reservation (the one being executed).
pub(crate) async fn budget_used(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    connection_id: Option<i64>,
    kind: &str,
    window_secs: i32,
    except: Option<i64>,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(sum(u.amount), 0)::bigint FROM budget_usage u
         WHERE u.tenant_id = $1 AND ($2::bigint IS NULL OR u.connection_id = $2) AND u.kind = $3
           AND u.at > now() - make_interval(secs => $4)
           AND u.pending_action_id IS DISTINCT FROM $5
           AND (u.counted OR EXISTS (
                 SELECT 1 FROM pending_actions p
                 WHERE p.id = u.pending_action_id AND p.status = 'pending'
                   AND p.completion = 'agent_confirms' AND p.expires_at > now()))",
    )
    .bind(ctx.tenant_id())
    .bind(connection_id)
    .bind(kind)
    .bind(f64::from(window_secs))
    .bind(except)
    .fetch_one(&mut **tx)
    .await?)
}

/// Writes one action's effects to the ledger: a reservation, or (`counted`) what it did, which
/// replaces its reservation.
pub(crate) async fn budget_usage_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    connection_id: i64,
    pending_action_id: i64,
    effects: &[(&str, i64)],
    counted: bool,
) -> Result<()> {
    if counted {
        sqlx::query("DELETE FROM budget_usage WHERE tenant_id = $1 AND pending_action_id = $2")
            .bind(ctx.tenant_id())
            .bind(pending_action_id)
            .execute(&mut **tx)
            .await?;
    }
    for (kind, amount) in effects {
        sqlx::query(
            "INSERT INTO budget_usage (tenant_id, connection_id, kind, amount, pending_action_id, counted)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(ctx.tenant_id())
        .bind(connection_id)
        .bind(kind)
        .bind(amount)
        .bind(pending_action_id)
        .bind(counted)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// The id of a connection of the context's tenant, by handle.
pub(crate) async fn budget_connection_id(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar("SELECT id FROM connections WHERE tenant_id = $1 AND handle = $2")
        .bind(ctx.tenant_id())
        .bind(handle)
        .fetch_optional(&mut **tx)
        .await?)
}

/// Why an action waits for a person because of a budget.
pub(crate) async fn pending_budget_reason(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    reason: &str,
) -> Result<()> {
    sqlx::query("UPDATE pending_actions SET budget_reason = $2 WHERE id = $1 AND tenant_id = $3")
        .bind(id)
        .bind(reason)
        .bind(ctx.tenant_id())
        .execute(&mut **tx)
        .await?;
    Ok(())
}
