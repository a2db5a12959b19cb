//! Pending two-step actions (R7): stored at the preview, locked at the confirmation.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

// ------------------------------------------------------------------ pending actions (R7)

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PendingRow {
    pub id: i64,
    pub handle: String,
    pub connection_id: i64,
    pub tool: String,
    pub args: Value,
    pub content_hash: String,
    pub summary: String,
    pub status: String,
    pub expired: bool,
    /// When the preview was made: durations in the preview are measured from here.
    pub created_at: DateTime<Utc>,
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
}

pub(crate) async fn pending_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    p: NewPending<'_>,
) -> Result<(i64, DateTime<Utc>)> {
    Ok(sqlx::query_as::<_, (i64, DateTime<Utc>)>(
        "INSERT INTO pending_actions (tenant_id, handle, connection_id, tool, args, args_digest,
                                      content_hash, summary, token_hash, expires_at, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now() + make_interval(secs => $10), $11)
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
    .fetch_one(&mut **tx)
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
    let Some(id) = id else { return Ok(None) };
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(id).execute(&mut **tx).await?;
    Ok(sqlx::query_as::<_, PendingRow>(
        "SELECT id, handle, connection_id, tool, args, content_hash, summary, status, expires_at,
                expires_at <= now() AS expired, created_at
         FROM pending_actions WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&mut **tx)
    .await?)
}

pub(crate) async fn pending_decide(
    tx: &mut Tx<'_>,
    id: i64,
    status: &str,
    result: Option<&Value>,
) -> Result<()> {
    sqlx::query(
        "UPDATE pending_actions SET status = $2, decided_at = now(), result = $3 WHERE id = $1",
    )
    .bind(id)
    .bind(status)
    .bind(result)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
