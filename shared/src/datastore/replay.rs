//! The replay cache of silent writes (R8).

use serde_json::Value;

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::{Error, Result};

// ------------------------------------------------------------------ replay cache (R8)

pub(crate) const REPLAY_LOCK_SQL: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, $2))";
pub(crate) const REPLAY_FIND_SQL: &str = "SELECT result FROM replay_entries
         WHERE connection_id = $1 AND tool = $2 AND args_digest = $3
           AND created_at > now() - make_interval(secs => $4)
         ORDER BY created_at DESC LIMIT 1";
pub(crate) const REPLAY_INSERT_SQL: &str =
    "INSERT INTO replay_entries (connection_id, tool, args_digest, idempotency_key, result)
         VALUES ($1, $2, $3, $4, $5)";

/// Whose replay cache a silent write uses: an MCP connection's or a REST API token's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplayScope {
    Connection(i64),
    ApiToken(i64),
}

impl ReplayScope {
    /// The context's replay cache: an MCP call replays within its connection, a REST call
    /// within its API token; a console or CLI write has a person at the keyboard and none.
    pub(crate) fn of(ctx: &OpCtx) -> Option<Self> {
        ctx.connection()
            .map(|c| ReplayScope::Connection(c.id))
            .or_else(|| ctx.api_token().map(ReplayScope::ApiToken))
    }

    /// The same, for the functions below, which only a context with a cache calls.
    fn require(ctx: &OpCtx) -> Result<Self> {
        ReplayScope::of(ctx).ok_or_else(|| {
            Error::Internal("a replay cache needs a connection or an API token".into())
        })
    }

    /// The advisory-lock namespace and id: the two kinds of id never share a lock.
    fn lock(self, what: &str) -> (String, i64) {
        match self {
            ReplayScope::Connection(id) => (format!("replay:{what}"), id),
            ReplayScope::ApiToken(id) => (format!("replay-api:{what}"), id),
        }
    }
}

/// Serializes identical silent writes of one connection (or API token) across workers for
/// this transaction.
pub(crate) async fn replay_lock(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    tool: &str,
    digest: &str,
) -> Result<()> {
    let scope = ReplayScope::require(ctx)?;
    let (text, id) = scope.lock(&format!("{tool}:{digest}"));
    sqlx::query(REPLAY_LOCK_SQL).bind(text).bind(id).execute(&mut **tx).await?;
    Ok(())
}

pub(crate) async fn replay_find(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    tool: &str,
    digest: &str,
    window_secs: i64,
) -> Result<Option<Value>> {
    let scope = ReplayScope::require(ctx)?;
    let (sql, id) = match scope {
        ReplayScope::Connection(id) => (REPLAY_FIND_SQL, id),
        ReplayScope::ApiToken(id) => (
            "SELECT result FROM replay_entries
             WHERE api_token_id = $1 AND tool = $2 AND args_digest = $3
               AND created_at > now() - make_interval(secs => $4)
             ORDER BY created_at DESC LIMIT 1",
            id,
        ),
    };
    Ok(sqlx::query_scalar(sql)
        .bind(id)
        .bind(tool)
        .bind(digest)
        .bind(window_secs as f64)
        .fetch_optional(&mut **tx)
        .await?)
}

/// The entry recorded under an idempotency key: tool, digest and result.
pub(crate) async fn replay_find_key(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    key: &str,
) -> Result<Option<(String, String, Value)>> {
    let scope = ReplayScope::require(ctx)?;
    let (sql, id) = match scope {
        ReplayScope::Connection(id) => (
            "SELECT tool, args_digest, result FROM replay_entries WHERE connection_id = $1 AND idempotency_key = $2",
            id,
        ),
        ReplayScope::ApiToken(id) => (
            "SELECT tool, args_digest, result FROM replay_entries WHERE api_token_id = $1 AND idempotency_key = $2",
            id,
        ),
    };
    Ok(sqlx::query_as::<_, (String, String, Value)>(sql)
        .bind(id)
        .bind(key)
        .fetch_optional(&mut **tx)
        .await?)
}

pub(crate) async fn replay_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    tool: &str,
    digest: &str,
    key: Option<&str>,
    result: &Value,
) -> Result<()> {
    let scope = ReplayScope::require(ctx)?;
    let (sql, id) = match scope {
        ReplayScope::Connection(id) => (REPLAY_INSERT_SQL, id),
        ReplayScope::ApiToken(id) => (
            "INSERT INTO replay_entries (api_token_id, tool, args_digest, idempotency_key, result)
             VALUES ($1, $2, $3, $4, $5)",
            id,
        ),
    };
    sqlx::query(sql)
        .bind(id)
        .bind(tool)
        .bind(digest)
        .bind(key)
        .bind(result)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
