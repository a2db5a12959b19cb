//! Tasks of slow tools (MCP extension `io.modelcontextprotocol/tasks`, SEP-2663; R22).
//!
//! A slow tool's call may be answered at once with a task; the worker that accepted it runs
//! the tool and writes the outcome here, and `tasks/get` / `tasks/cancel` on any worker read
//! and write the same row. A task belongs to the connection and tenant of the context that
//! created it: every function filters by both, so another connection (or tenant) sees no task
//! at all — not found, never forbidden (R3, R4). Handles are random (`tsk_` + 80 bits).
//! Results are bounded ([`MAX_RESULT_BYTES`]) and expire with the task ([`TTL_MS`]);
//! housekeeping deletes expired rows. A working task whose worker stopped heartbeating for
//! [`STALE_SECS`] is failed when read (and by housekeeping), so none stays working forever.

use serde_json::{Value, json};

use crate::ctx::OpCtx;
use crate::datastore::{Services, TaskRow};
use crate::error::{Error, Result};
use crate::handle::TaskHandle;

/// How long a task and its result are kept from creation (announced as `ttlMs`).
pub const TTL_MS: i64 = 60 * 60 * 1000;
/// How often a client should poll (announced as `pollIntervalMs`).
pub const POLL_INTERVAL_MS: i64 = 1000;
/// How often the running worker heartbeats (and learns of a cancellation).
pub const HEARTBEAT_MS: u64 = 1000;
/// A working task not heartbeaten for this long has lost its worker: it is failed.
pub const STALE_SECS: i64 = 30;
/// The largest result kept; a larger one fails the task with a JSON-RPC error.
pub const MAX_RESULT_BYTES: usize = 1024 * 1024;

/// A task's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Working,
    Completed,
    Failed,
    Cancelled,
}

impl Status {
    fn parse(text: &str) -> Status {
        match text {
            "working" => Status::Working,
            "completed" => Status::Completed,
            "cancelled" => Status::Cancelled,
            _ => Status::Failed,
        }
    }
}

/// A task as its connection reads it.
#[derive(Debug, Clone)]
pub struct TaskView {
    pub task: String,
    pub tool: String,
    pub status: Status,
    pub status_message: Option<String>,
    /// The tool's `CallToolResult` JSON, when completed.
    pub result: Option<Value>,
    /// The JSON-RPC error object, when failed.
    pub error: Option<Value>,
    pub created: jiff::Timestamp,
    pub updated: jiff::Timestamp,
    pub ttl_ms: i64,
}

impl From<TaskRow> for TaskView {
    fn from(row: TaskRow) -> Self {
        let at = |ms: i64| jiff::Timestamp::from_millisecond(ms).unwrap_or_default();
        TaskView {
            task: row.handle,
            tool: row.tool,
            status: Status::parse(&row.status),
            status_message: row.status_message,
            result: row.result,
            error: row.error,
            created: at(row.created_ms),
            updated: at(row.updated_ms),
            ttl_ms: (row.expires_ms - row.created_ms).max(1),
        }
    }
}

fn require_connection(ctx: &OpCtx) -> Result<()> {
    match ctx.connection() {
        Some(_) => Ok(()),
        None => Err(Error::NoActor),
    }
}

/// Creates a working task for a call of `tool` by the context's connection, run by `worker`.
pub async fn create(ds: &Services, ctx: &OpCtx, tool: &str, worker: &str) -> Result<TaskView> {
    require_connection(ctx)?;
    let handle = TaskHandle::generate();
    match ds.task_create(ctx, handle.as_str(), tool, worker, TTL_MS, MAX_WORKING).await? {
        Some(row) => Ok(row.into()),
        None => Err(Error::WrongState {
            message: format!(
                "this connection has {MAX_WORKING} tasks working already; wait for one to finish (tasks/get) or cancel one (tasks/cancel), then call again"
            ),
            use_instead: None,
        }),
    }
}

/// Tasks one connection may have working at once, across all workers.
pub const MAX_WORKING: i64 = 4;

/// The context's task, or `None` for a task that is unknown, expired, malformed or another
/// connection's: the caller cannot tell these apart.
pub async fn get(ds: &Services, ctx: &OpCtx, task: &str) -> Result<Option<TaskView>> {
    require_connection(ctx)?;
    let Ok(handle) = TaskHandle::parse("taskId", task) else { return Ok(None) };
    let stale = json!({"code": -32603, "message": "The worker running this task stopped; call the tool again."});
    Ok(ds.task_get(ctx, handle.as_str(), STALE_SECS, &stale).await?.map(TaskView::from))
}

/// Cancels the context's task if it is still working; `false` when there is no such task
/// (as for [`get`]). A task already ended is left as it is (cancel is idempotent).
pub async fn cancel(ds: &Services, ctx: &OpCtx, task: &str, reason: &str) -> Result<bool> {
    require_connection(ctx)?;
    let Ok(handle) = TaskHandle::parse("taskId", task) else { return Ok(false) };
    ds.task_cancel(ctx, handle.as_str(), reason).await
}

/// The running worker's heartbeat, with the progress to show; returns the task's status
/// (`Cancelled` tells the worker to stop).
pub async fn heartbeat(
    ds: &Services,
    ctx: &OpCtx,
    task: &str,
    message: Option<&str>,
) -> Result<Status> {
    require_connection(ctx)?;
    Ok(ds
        .task_heartbeat(ctx, task, message)
        .await?
        .map_or(Status::Cancelled, |s| Status::parse(&s)))
}

/// Ends the task with the tool's result (a tool error included: that is a completed call).
/// A result larger than [`MAX_RESULT_BYTES`] is not kept: the task fails saying so.
pub async fn complete(ds: &Services, ctx: &OpCtx, task: &str, result: &Value) -> Result<Status> {
    require_connection(ctx)?;
    let size = serde_json::to_vec(result).map(|v| v.len()).unwrap_or(usize::MAX);
    if size > MAX_RESULT_BYTES {
        let error = json!({"code": -32603, "message": format!(
            "The result is larger than {} KiB and was not kept; call the tool with a narrower range.",
            MAX_RESULT_BYTES / 1024)});
        return fail(ds, ctx, task, &error).await;
    }
    Ok(ds
        .task_finish(ctx, task, Some(result), None)
        .await?
        .map_or(Status::Cancelled, |s| Status::parse(&s)))
}

/// Ends the task with a JSON-RPC error (`{code, message}`).
pub async fn fail(ds: &Services, ctx: &OpCtx, task: &str, error: &Value) -> Result<Status> {
    require_connection(ctx)?;
    Ok(ds
        .task_finish(ctx, task, None, Some(error))
        .await?
        .map_or(Status::Cancelled, |s| Status::parse(&s)))
}
