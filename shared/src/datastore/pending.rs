//! Pending two-step actions (R7): stored at the preview, locked at the confirmation.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

// ------------------------------------------------------------------ pending actions (R7)

/// Where a pending action is in its life, and the one place its transitions are written:
/// `pending` → `executed` (confirmed or approved, once), `rejected` (by the agent or a person),
/// or `superseded` (its content changed before anyone decided; a newer preview replaces it).
/// The three ends are final. Expiry is not a state: a `pending` action past its time is expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum PendingStatus {
    Pending,
    Executed,
    Rejected,
    Superseded,
}

impl PendingStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            PendingStatus::Pending => "pending",
            PendingStatus::Executed => "executed",
            PendingStatus::Rejected => "rejected",
            PendingStatus::Superseded => "superseded",
        }
    }

    /// Whether an action in this state may move to `to`: only a pending one moves, and only
    /// to an end.
    pub fn may_become(self, to: PendingStatus) -> bool {
        self == PendingStatus::Pending && to != PendingStatus::Pending
    }
}

impl std::fmt::Display for PendingStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who completes a pending action, fixed when it is prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum PendingCompletion {
    AgentConfirms,
    PersonApproves,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PendingRow {
    pub id: i64,
    pub handle: String,
    pub connection_id: i64,
    pub tool: String,
    pub args: Value,
    pub content_hash: String,
    pub summary: String,
    pub status: PendingStatus,
    pub expired: bool,
    /// When the preview was made: durations in the preview are measured from here.
    pub created_at: DateTime<Utc>,
    /// Fixed at the preview.
    pub completion: PendingCompletion,
    pub approver_not_creator: bool,
    /// The person whose connection prepared it.
    pub creator_id: i64,
    pub connection_status: String,
    pub result: Option<Value>,
    pub decision_reason: Option<String>,
    /// The handle of the version that replaced it, when it changed before approval.
    pub replaced_by: Option<String>,
}

pub struct NewPending<'a> {
    pub handle: &'a str,
    pub connection_id: i64,
    pub tool: &'a str,
    pub args: &'a Value,
    pub args_digest: &'a str,
    pub content_hash: &'a str,
    pub summary: &'a str,
    pub token_hash: &'a [u8],
    pub ttl_seconds: i64,
    /// The instant the preview was planned at.
    pub previewed_at: DateTime<Utc>,
    pub completion: &'a str,
    pub approver_not_creator: bool,
    pub preview: &'a Value,
}

pub(crate) async fn pending_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    p: NewPending<'_>,
) -> Result<(i64, DateTime<Utc>)> {
    Ok(sqlx::query_as::<_, (i64, DateTime<Utc>)>(
        "INSERT INTO pending_actions (tenant_id, handle, connection_id, tool, args, args_digest,
                                      content_hash, summary, token_hash, expires_at, created_at,
                                      completion, approver_not_creator, preview)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now() + make_interval(secs => $10), $11,
                 $12, $13, $14)
         RETURNING id, expires_at",
    )
    .bind(ctx.tenant_id())
    .bind(p.handle)
    .bind(p.connection_id)
    .bind(p.tool)
    .bind(p.args)
    .bind(p.args_digest)
    .bind(p.content_hash)
    .bind(p.summary)
    .bind(p.token_hash)
    .bind(p.ttl_seconds as f64)
    .bind(p.previewed_at)
    .bind(p.completion)
    .bind(p.approver_not_creator)
    .bind(p.preview)
    .fetch_one(&mut **tx)
    .await?)
}

const PENDING_LOCKED_SQL: &str =
    "SELECT p.id, p.handle, p.connection_id, p.tool, p.args, p.content_hash, p.summary, p.status,
            p.expires_at <= now() AS expired, p.created_at, p.completion, p.approver_not_creator,
            c.creator_id, c.status AS connection_status, p.result, p.decision_reason, p.replaced_by
     FROM pending_actions p JOIN connections c ON c.id = p.connection_id WHERE p.id = $1";

/// Takes the advisory lock of a pending action for the rest of the transaction and reads it
/// again under the lock.
async fn pending_locked(tx: &mut Tx<'_>, id: Option<i64>) -> Result<Option<PendingRow>> {
    let Some(id) = id else { return Ok(None) };
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(id).execute(&mut **tx).await?;
    Ok(sqlx::query_as::<_, PendingRow>(PENDING_LOCKED_SQL)
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?)
}

/// Finds a pending action of the tenant by token hash, takes its advisory lock for the rest of
/// the transaction, and reads it again under the lock.
pub(crate) async fn pending_lock_by_token(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    token_hash: &[u8],
) -> Result<Option<PendingRow>> {
    let id: Option<i64> = sqlx::query_scalar(
        "SELECT id FROM pending_actions WHERE tenant_id = $1 AND token_hash = $2",
    )
    .bind(ctx.tenant_id())
    .bind(token_hash)
    .fetch_optional(&mut **tx)
    .await?;
    pending_locked(tx, id).await
}

/// The same by the action's handle (pac_…), for a person deciding in the console.
pub(crate) async fn pending_lock_by_handle(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
) -> Result<Option<PendingRow>> {
    let id: Option<i64> =
        sqlx::query_scalar("SELECT id FROM pending_actions WHERE tenant_id = $1 AND handle = $2")
            .bind(ctx.tenant_id())
            .bind(handle)
            .fetch_optional(&mut **tx)
            .await?;
    pending_locked(tx, id).await
}

/// Records who decided a pending action and why.
pub(crate) async fn pending_decided_by(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    person_id: Option<i64>,
    reason: &str,
) -> Result<()> {
    sqlx::query(
        "UPDATE pending_actions SET decided_by = $2, decision_reason = $3 WHERE id = $1 AND tenant_id = $4",
    )
    .bind(id)
    .bind(person_id)
    .bind(Some(reason).filter(|r| !r.is_empty()))
    .bind(ctx.tenant_id())
    .execute(&mut **tx)
        .await?;
    Ok(())
}

/// An action that waited for a person and is done: decided, changed before it could be, or
/// expired with nobody deciding.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DecidedRow {
    pub handle: String,
    pub tool: String,
    pub summary: String,
    pub status: PendingStatus,
    pub expired: bool,
    pub at: DateTime<Utc>,
    pub connection_name: String,
    pub decider_name: Option<String>,
    pub decider_email: Option<String>,
    pub decision_reason: Option<String>,
    pub proof: Option<serde_json::Value>,
}

/// An action waiting for a person, as the console lists it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AwaitingRow {
    pub handle: String,
    pub tool: String,
    pub summary: String,
    pub preview: Option<Value>,
    pub connection_name: String,
    pub client_name: String,
    pub creator_email: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Why it waits because of a budget, when it does.
    pub budget_reason: Option<String>,
}

impl Services {
    /// The tenant's actions waiting for a person, oldest first.
    pub(crate) async fn pending_awaiting(
        &self,
        ctx: &OpCtx,
        tools: &[String],
        limit: i64,
    ) -> Result<Vec<AwaitingRow>> {
        Ok(sqlx::query_as::<_, AwaitingRow>(
            "SELECT p.handle, p.tool, p.summary, p.preview, c.name AS connection_name,
                    c.client_name, pe.email AS creator_email, p.created_at, p.expires_at,
                    p.budget_reason
             FROM pending_actions p
             JOIN connections c ON c.id = p.connection_id
             JOIN people pe ON pe.id = c.creator_id
             WHERE p.tenant_id = $1 AND p.status = 'pending' AND p.completion = 'person_approves'
               AND p.expires_at > now() AND c.status = 'active' AND p.tool = ANY($3)
             ORDER BY p.created_at, p.id LIMIT $2",
        )
        .bind(ctx.tenant_id())
        .bind(limit)
        .bind(tools)
        .fetch_all(self.pool())
        .await?)
    }

    /// The latest actions that waited for a person and are done, newest first.
    pub(crate) async fn pending_decided(
        &self,
        ctx: &OpCtx,
        tools: &[String],
        limit: i64,
    ) -> Result<Vec<DecidedRow>> {
        Ok(sqlx::query_as::<_, DecidedRow>(
            "SELECT p.handle, p.tool, p.summary, p.status,
                    (p.status = 'pending' AND p.expires_at <= now()) AS expired,
                    coalesce(p.decided_at, p.expires_at) AS at, c.name AS connection_name,
                    d.name AS decider_name, d.email AS decider_email, p.decision_reason,
                    (SELECT a.proof FROM audit_log a WHERE a.pending_action_id = p.id AND a.actor_id = p.decided_by
                     ORDER BY a.id DESC LIMIT 1) AS proof
             FROM pending_actions p
             JOIN connections c ON c.id = p.connection_id
             LEFT JOIN people d ON d.id = p.decided_by
             WHERE p.tenant_id = $1 AND p.completion = 'person_approves' AND p.tool = ANY($3)
               AND (p.status <> 'pending' OR p.expires_at <= now())
             ORDER BY coalesce(p.decided_at, p.expires_at) DESC, p.id DESC LIMIT $2",
        )
        .bind(ctx.tenant_id())
        .bind(limit)
        .bind(tools)
        .fetch_all(self.pool())
        .await?)
    }

    /// How many actions wait for a person in the tenant.
    pub(crate) async fn pending_awaiting_count(
        &self,
        ctx: &OpCtx,
        tools: &[String],
    ) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM pending_actions p JOIN connections c ON c.id = p.connection_id
             WHERE p.tenant_id = $1 AND p.status = 'pending' AND p.completion = 'person_approves'
               AND p.expires_at > now() AND c.status = 'active' AND p.tool = ANY($2)",
        )
        .bind(ctx.tenant_id())
        .bind(tools)
        .fetch_one(self.pool())
        .await?)
    }

    /// The tenant's approval policy rows: (scope, mode, approver_not_creator).
    pub(crate) async fn approval_policy_rows(
        &self,
        ctx: &OpCtx,
    ) -> Result<Vec<(String, String, bool)>> {
        Ok(sqlx::query_as(
            "SELECT scope, mode, approver_not_creator FROM approval_policies WHERE tenant_id = $1 ORDER BY scope",
        )
        .bind(ctx.tenant_id())
        .fetch_all(self.pool())
        .await?)
    }
}

/// The same inside a transaction (the prepare and approve steps read it with their locks).
pub(crate) async fn approval_policy_rows_tx(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
) -> Result<Vec<(String, String, bool)>> {
    Ok(sqlx::query_as(
        "SELECT scope, mode, approver_not_creator FROM approval_policies WHERE tenant_id = $1 ORDER BY scope",
    )
    .bind(ctx.tenant_id())
    .fetch_all(&mut **tx)
    .await?)
}

/// Sets one scope's rule; `None` removes it (the default applies again).
pub(crate) async fn approval_policy_put(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    scope: &str,
    rule: Option<(&str, bool)>,
) -> Result<()> {
    match rule {
        Some((mode, not_creator)) => {
            sqlx::query(
                "INSERT INTO approval_policies (tenant_id, scope, mode, approver_not_creator) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (tenant_id, scope) DO UPDATE SET mode = EXCLUDED.mode,
                     approver_not_creator = EXCLUDED.approver_not_creator, updated_at = now()",
            )
            .bind(ctx.tenant_id())
            .bind(scope)
            .bind(mode)
            .bind(not_creator)
            .execute(&mut **tx)
            .await?;
        }
        None => {
            sqlx::query("DELETE FROM approval_policies WHERE tenant_id = $1 AND scope = $2")
                .bind(ctx.tenant_id())
                .bind(scope)
                .execute(&mut **tx)
                .await?;
        }
    }
    Ok(())
}

/// The tenant's active members whose role is one of `roles`, for telling approvers.
pub(crate) async fn members_with_roles(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    roles: &[String],
) -> Result<Vec<(i64, String)>> {
    Ok(sqlx::query_as(
        "SELECT p.id, p.email FROM memberships m JOIN people p ON p.id = m.person_id
         WHERE m.tenant_id = $1 AND m.active AND p.active AND m.role = ANY($2) ORDER BY p.id",
    )
    .bind(ctx.tenant_id())
    .bind(roles)
    .fetch_all(&mut **tx)
    .await?)
}

pub(crate) async fn pending_decide(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    status: PendingStatus,
    result: Option<&Value>,
) -> Result<()> {
    // Only a pending action moves, and only to an end (PendingStatus::may_become); a caller
    // holds its row lock, so a row that is no longer pending is a bug, said loudly.
    if !PendingStatus::Pending.may_become(status) {
        return Err(crate::error::Error::Internal(format!(
            "a pending action cannot become {status}"
        )));
    }
    let moved = sqlx::query(
        "UPDATE pending_actions SET status = $2, decided_at = now(), result = $3
         WHERE id = $1 AND tenant_id = $4 AND status = 'pending'",
    )
    .bind(id)
    .bind(status)
    .bind(result)
    .bind(ctx.tenant_id())
    .execute(&mut **tx)
    .await?
    .rows_affected();
    one_row(moved, "a pending action changed state under its lock")
}

/// The person who created a connection.
pub(crate) async fn connection_creator(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    connection_id: i64,
) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar("SELECT creator_id FROM connections WHERE id = $1 AND tenant_id = $2")
        .bind(connection_id)
        .bind(ctx.tenant_id())
        .fetch_optional(&mut **tx)
        .await?)
}

/// The tenant's agent switch and the platform's kill switch, as Postgres has them now.
pub(crate) async fn switches(tx: &mut Tx<'_>, ctx: &OpCtx) -> Result<(bool, bool)> {
    Ok(sqlx::query_as(
        "SELECT t.agent_access, (SELECT global_kill FROM platform_state LIMIT 1)
         FROM tenants t WHERE t.id = $1",
    )
    .bind(ctx.tenant_id())
    .fetch_one(&mut **tx)
    .await?)
}

/// When a pending action expires, in seconds since the epoch.
pub(crate) async fn pending_expiry(tx: &mut Tx<'_>, ctx: &OpCtx, id: i64) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT extract(epoch FROM expires_at)::bigint FROM pending_actions
         WHERE id = $1 AND tenant_id = $2",
    )
    .bind(id)
    .bind(ctx.tenant_id())
    .fetch_one(&mut **tx)
    .await?)
}

/// Hands a pending action to a person (the tenant's policy changed since it was prepared).
pub(crate) async fn pending_to_person(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    not_creator: bool,
) -> Result<()> {
    sqlx::query(
        "UPDATE pending_actions SET completion = 'person_approves', approver_not_creator = $2
         WHERE id = $1 AND tenant_id = $3",
    )
    .bind(id)
    .bind(not_creator)
    .bind(ctx.tenant_id())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records the version that replaced a pending action, and moves its token there so the agent
/// that asked can follow the outcome.
pub(crate) async fn pending_replaced(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    newer: &str,
) -> Result<()> {
    // Two statements, in this order: the token hash is unique, so the old row lets go first.
    let token: Vec<u8> = sqlx::query_scalar(
        "UPDATE pending_actions p SET replaced_by = $2, token_hash = sha256(old.token_hash || 'replaced'::bytea)
         FROM (SELECT token_hash FROM pending_actions WHERE id = $1 AND tenant_id = $3) old
         WHERE p.id = $1 RETURNING old.token_hash",
    )
    .bind(id)
    .bind(newer)
    .bind(ctx.tenant_id())
    .fetch_one(&mut **tx)
    .await?;
    sqlx::query("UPDATE pending_actions SET token_hash = $2 WHERE handle = $1 AND tenant_id = $3")
        .bind(newer)
        .bind(token)
        .bind(ctx.tenant_id())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A connection's stored rights, its creator's role, and whether creator and membership are active.
type LiveRightsRow = (Vec<String>, Option<String>, bool, Option<bool>);

/// The live rights of a connection: its stored rights cut to its creator's current role, or
/// `None` when the creator is no longer an active member (R4).
pub(crate) async fn connection_live_rights(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    connection_id: i64,
) -> Result<Option<crate::rights::RightSet>> {
    let row: Option<LiveRightsRow> = sqlx::query_as(
        "SELECT c.rights, m.role, p.active, m.active FROM connections c
         JOIN people p ON p.id = c.creator_id
         LEFT JOIN memberships m ON m.tenant_id = c.tenant_id AND m.person_id = c.creator_id
         WHERE c.id = $1 AND c.tenant_id = $2",
    )
    .bind(connection_id)
    .bind(ctx.tenant_id())
    .fetch_optional(&mut **tx)
    .await?;
    Ok(row.and_then(|(rights, role, person_active, member_active)| {
        let role: crate::rights::Role = role?.parse().ok()?;
        (person_active && member_active == Some(true))
            .then(|| crate::rights::RightSet::parse_lenient(&rights).intersect(role.rights()))
    }))
}
