//! Tasks of slow tools (MCP tasks extension): every statement names the connection and the
//! tenant of the context, so another connection's task is never seen, cancelled or written.

use serde_json::Value;

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::{Error, Result};

/// A task as its connection may read it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TaskRow {
    pub handle: String,
    pub tool: String,
    pub status: String,
    pub status_message: Option<String>,
    pub result: Option<Value>,
    pub error: Option<Value>,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub expires_ms: i64,
}

macro_rules! task_columns {
    () => {
        "handle, tool, status, status_message, result, error,
         (extract(epoch FROM created_at) * 1000)::bigint AS created_ms,
         (extract(epoch FROM updated_at) * 1000)::bigint AS updated_ms,
         (extract(epoch FROM expires_at) * 1000)::bigint AS expires_ms"
    };
}

/// Stores a task unless the connection has `$7` working already (decided in the statement,
/// under the connection's row lock, so concurrent calls on two workers cannot both pass).
const TASK_CREATE_SQL: &str = concat!(
    "WITH held AS (SELECT id FROM connections WHERE id = $3 AND tenant_id = $2 FOR UPDATE)
     INSERT INTO tasks (handle, tenant_id, connection_id, tool, worker, expires_at)
     SELECT $1, $2, $3, $4, $5, now() + make_interval(secs => $6::double precision / 1000)
     FROM held
     WHERE (SELECT count(*) FROM tasks WHERE connection_id = $3 AND status = 'working'
            AND expires_at > now()) < $7
     RETURNING ",
    task_columns!()
);
const TASK_GET_SQL: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM tasks WHERE handle = $1 AND tenant_id = $2 AND connection_id = $3 AND expires_at > now()"
);

fn connection_of(ctx: &OpCtx) -> Result<i64> {
    ctx.connection()
        .map(|c| c.id)
        .ok_or_else(|| Error::Internal("a task belongs to an MCP connection".into()))
}

impl Services {
    /// Stores a new working task of the context's connection; returns it as stored, so the
    /// task exists (and `tasks/get` finds it on any worker) before its handle is answered.
    pub(crate) async fn task_create(
        &self,
        ctx: &OpCtx,
        handle: &str,
        tool: &str,
        worker: &str,
        ttl_ms: i64,
        max_working: i64,
    ) -> Result<Option<TaskRow>> {
        Ok(sqlx::query_as::<_, TaskRow>(TASK_CREATE_SQL)
            .bind(handle)
            .bind(ctx.tenant_id())
            .bind(connection_of(ctx)?)
            .bind(tool)
            .bind(worker)
            .bind(ttl_ms)
            .bind(max_working)
            .fetch_optional(self.pool())
            .await?)
    }

    /// The context's task by handle, unexpired; first failing it when it has been working
    /// without a heartbeat for `stale_secs` (its worker stopped).
    pub(crate) async fn task_get(
        &self,
        ctx: &OpCtx,
        handle: &str,
        stale_secs: i64,
        stale_error: &Value,
    ) -> Result<Option<TaskRow>> {
        let connection = connection_of(ctx)?;
        sqlx::query(
            "UPDATE tasks SET status = 'failed', error = $5, status_message = NULL, updated_at = now()
             WHERE handle = $1 AND tenant_id = $2 AND connection_id = $3 AND status = 'working'
               AND heartbeat_at < now() - make_interval(secs => $4)",
        )
        .bind(handle)
        .bind(ctx.tenant_id())
        .bind(connection)
        .bind(stale_secs as f64)
        .bind(stale_error)
        .execute(self.pool())
        .await?;
        Ok(sqlx::query_as::<_, TaskRow>(TASK_GET_SQL)
            .bind(handle)
            .bind(ctx.tenant_id())
            .bind(connection)
            .fetch_optional(self.pool())
            .await?)
    }

    /// Cancels the context's task when it is still working. Returns whether the task exists
    /// (cancelled now or already terminal), so a foreign or unknown one reads as not found.
    pub(crate) async fn task_cancel(
        &self,
        ctx: &OpCtx,
        handle: &str,
        message: &str,
    ) -> Result<bool> {
        let row: Option<(String,)> = sqlx::query_as(
            "WITH cancelled AS (
                UPDATE tasks SET status = 'cancelled', status_message = $4, updated_at = now()
                WHERE handle = $1 AND tenant_id = $2 AND connection_id = $3 AND status = 'working'
                  AND expires_at > now()
                RETURNING handle)
             SELECT handle FROM cancelled
             UNION ALL
             SELECT handle FROM tasks
             WHERE handle = $1 AND tenant_id = $2 AND connection_id = $3 AND expires_at > now()
             LIMIT 1",
        )
        .bind(handle)
        .bind(ctx.tenant_id())
        .bind(connection_of(ctx)?)
        .bind(message)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.is_some())
    }

    /// The running worker's heartbeat and progress; returns the task's status, so the worker
    /// learns of a cancellation (by the client, or of a revoked connection) here.
    pub(crate) async fn task_heartbeat(
        &self,
        ctx: &OpCtx,
        handle: &str,
        message: Option<&str>,
    ) -> Result<Option<String>> {
        // A revoked connection's working task is cancelled here too, so a revocation ends its
        // tasks even when the push (NATS) that cancels them at once was missed.
        let row: Option<(String,)> = sqlx::query_as(
            "UPDATE tasks t SET heartbeat_at = now(),
                    status = CASE WHEN t.status = 'working' AND c.status <> 'active' THEN 'cancelled'
                                  ELSE t.status END,
                    status_message = CASE
                        WHEN t.status = 'working' AND c.status <> 'active' THEN 'The connection was revoked.'
                        WHEN t.status = 'working' THEN coalesce($4, t.status_message)
                        ELSE t.status_message END,
                    updated_at = CASE WHEN t.status = 'working' AND c.status <> 'active' THEN now()
                                      ELSE t.updated_at END
             FROM connections c
             WHERE c.id = t.connection_id
               AND t.handle = $1 AND t.tenant_id = $2 AND t.connection_id = $3
             RETURNING t.status",
        )
        .bind(handle)
        .bind(ctx.tenant_id())
        .bind(connection_of(ctx)?)
        .bind(message)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(|r| r.0))
    }

    /// Ends a working task with its result or its error; a task cancelled meanwhile stays
    /// cancelled. Returns the status it ended with.
    pub(crate) async fn task_finish(
        &self,
        ctx: &OpCtx,
        handle: &str,
        result: Option<&Value>,
        error: Option<&Value>,
    ) -> Result<Option<String>> {
        let status = if result.is_some() { "completed" } else { "failed" };
        let row: Option<(String,)> = sqlx::query_as(
            "UPDATE tasks SET status = CASE WHEN status = 'working' THEN $4 ELSE status END,
                    result = CASE WHEN status = 'working' THEN $5 ELSE result END,
                    error = CASE WHEN status = 'working' THEN $6 ELSE error END,
                    status_message = CASE WHEN status = 'working' THEN NULL ELSE status_message END,
                    updated_at = now()
             WHERE handle = $1 AND tenant_id = $2 AND connection_id = $3
             RETURNING status",
        )
        .bind(handle)
        .bind(ctx.tenant_id())
        .bind(connection_of(ctx)?)
        .bind(status)
        .bind(result)
        .bind(error)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(|r| r.0))
    }
}
