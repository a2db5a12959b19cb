//! The replay cache of silent writes (R8).

use serde_json::Value;

use crate::datastore::*;
use crate::error::Result;

// ------------------------------------------------------------------ replay cache (R8)

pub(crate) const REPLAY_LOCK_SQL: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, $2))";
pub(crate) const REPLAY_FIND_SQL: &str = "SELECT result FROM replay_entries
         WHERE connection_id = $1 AND tool = $2 AND args_digest = $3
           AND created_at > now() - make_interval(secs => $4)
         ORDER BY created_at DESC LIMIT 1";
pub(crate) const REPLAY_INSERT_SQL: &str =
    "INSERT INTO replay_entries (connection_id, tool, args_digest, idempotency_key, result)
         VALUES ($1, $2, $3, $4, $5)";

/// Serializes identical silent writes of one connection across workers for this transaction.
pub(crate) async fn replay_lock(
    tx: &mut Tx<'_>,
    connection_id: i64,
    tool: &str,
    digest: &str,
) -> Result<()> {
    sqlx::query(REPLAY_LOCK_SQL)
        .bind(format!("replay:{tool}:{digest}"))
        .bind(connection_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

pub(crate) async fn replay_find(
    tx: &mut Tx<'_>,
    connection_id: i64,
    tool: &str,
    digest: &str,
    window_secs: i64,
) -> Result<Option<Value>> {
    Ok(sqlx::query_scalar(REPLAY_FIND_SQL)
        .bind(connection_id)
        .bind(tool)
        .bind(digest)
        .bind(window_secs as f64)
        .fetch_optional(&mut **tx)
        .await?)
}

/// The entry recorded under an idempotency key: tool, digest and result.
pub(crate) async fn replay_find_key(
    tx: &mut Tx<'_>,
    connection_id: i64,
    key: &str,
) -> Result<Option<(String, String, Value)>> {
    Ok(sqlx::query_as::<_, (String, String, Value)>(
        "SELECT tool, args_digest, result FROM replay_entries WHERE connection_id = $1 AND idempotency_key = $2",
    )
    .bind(connection_id)
    .bind(key)
    .fetch_optional(&mut **tx)
    .await?)
}

pub(crate) async fn replay_insert(
    tx: &mut Tx<'_>,
    connection_id: i64,
    tool: &str,
    digest: &str,
    key: Option<&str>,
    result: &Value,
) -> Result<()> {
    sqlx::query(REPLAY_INSERT_SQL)
        .bind(connection_id)
        .bind(tool)
        .bind(digest)
        .bind(key)
        .bind(result)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
