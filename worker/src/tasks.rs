//! Tasks for slow tools (MCP extension `io.modelcontextprotocol/tasks`, SEP-2663; R22).
//!
//! A `tools/call` of a tool the registry marks slow ([`crate::tools::TaskSupport::Optional`]),
//! from a request that declares the extension, is answered at once with a task stored in
//! Postgres (`shared::services::tasks`); this worker runs the tool in the background and writes
//! its result there. `tasks/get` and `tasks/cancel` reach any worker: each passes the entry
//! point like any request (live rights, the connection re-read from Postgres), and the service
//! reads only the tasks of that connection and tenant; a task of a tool the connection's live
//! rights no longer show is not found either. So another connection, a revoked one, or one that
//! lost the right sees nothing (-32602, as for an unknown id), never "forbidden".
//!
//! The run heartbeats every second: the heartbeat carries the latest progress (shown as the
//! task's `statusMessage`) and returns the task's status, so a `tasks/cancel` on any worker, or
//! the revocation of its connection (also pushed at once through `Live::register`), stops it.
//! At every heartbeat the run also asks what a new call of its tool would be asked (the
//! credential, the creator, the rights, the toolset, the tenant's and the global switch, as
//! the entry point reads them): a task runs only while its call would still be admitted, and
//! is cancelled saying why otherwise (R5, R12).
//! A task whose worker dies stops heartbeating and is failed after
//! `services::tasks::STALE_SECS` by the next `tasks/get` or by housekeeping.

use std::sync::{Arc, Mutex};

use rmcp::ErrorData;
use rmcp::model::{
    CreateTaskResult, DetailedTask, GetTaskResult, JsonObject, Task, TaskPayload, TaskStatus,
};
use serde_json::{Value, json};
use shared::OpCtx;
use shared::services::tasks::{self, Status, TaskView};

use crate::AppState;
use crate::results::{self, ErrorBody};
use crate::tools::{Env, Progress};

/// The answer to `tasks/get` and `tasks/cancel` for a task this connection cannot see.
fn not_found(task: &str) -> ErrorData {
    let shown: String = task.chars().take(64).collect();
    ErrorData::invalid_params(
        format!(
            "Unknown task {shown:?}: no task of this connection has that id (it may have expired)."
        ),
        None,
    )
}

fn unavailable(e: &shared::Error) -> ErrorData {
    tracing::error!(error = %e, "task store unavailable");
    ErrorData::internal_error("tasks are unavailable; retry shortly", None)
}

fn iso(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

fn task_of(view: &TaskView) -> Task {
    let status = match view.status {
        Status::Working => TaskStatus::Working,
        Status::Completed => TaskStatus::Completed,
        Status::Failed => TaskStatus::Failed,
        Status::Cancelled => TaskStatus::Cancelled,
    };
    let mut task = Task::new(view.task.clone(), status, iso(view.created), iso(view.updated))
        .with_ttl_ms(view.ttl_ms as u64)
        .with_poll_interval_ms(tasks::POLL_INTERVAL_MS as u64);
    if let Some(message) = &view.status_message {
        task = task.with_status_message(message.clone());
    }
    task
}

/// Starts a task for a call already admitted (rights, toolset, bucket): stores it, then runs
/// the tool on this worker. The task exists in Postgres before its id is answered.
pub async fn start(
    state: &Arc<AppState>,
    ctx: &OpCtx,
    tool: &'static str,
    args: Value,
    authorization: Option<String>,
) -> Result<CreateTaskResult, ErrorData> {
    let view = match tasks::create(&state.ds, ctx, tool, &state.settings.worker_id).await {
        Ok(view) => view,
        // Past the connection's bound on working tasks: said plainly, nothing started.
        Err(shared::Error::WrongState { message, .. }) => {
            return Err(ErrorData::invalid_request(message, None));
        }
        Err(e) => return Err(unavailable(&e)),
    };
    let connection = ctx.connection().map(|c| c.handle.as_str()).unwrap_or_default();
    // Registered before the answer leaves: a revocation pushed from now on cancels the run.
    let inflight = state.live.register(connection);
    let created = CreateTaskResult::new(task_of(&view));
    let admitted = Admission { authorization, tenant: ctx.tenant().handle.to_string(), tool };
    tokio::spawn(run(state.clone(), ctx.clone(), admitted, args, view.task, inflight));
    Ok(created)
}

/// What a task's call was admitted with, to ask again at every heartbeat.
struct Admission {
    /// The request's `Authorization` header, kept in memory for the run only.
    authorization: Option<String>,
    /// The tenant's handle, for the switch NATS pushes.
    tenant: String,
    tool: &'static str,
}

impl Admission {
    /// Why a new call of the tool would now be refused, in words for the task's
    /// `statusMessage`; `None` while it would be admitted, or when Postgres cannot say (the
    /// heartbeat's own failure is logged, and the next beat asks again).
    async fn refusal(&self, state: &AppState) -> Option<String> {
        if state.live.killed() {
            return Some(KILLED.into());
        }
        // Pushed switches hold even while Postgres cannot be read.
        if state.live.tenant_off(&self.tenant) {
            return Some(TENANT_OFF.into());
        }
        let fresh = match shared::auth::authenticate_mcp(
            &state.ds,
            self.authorization.as_deref(),
            &state.settings.mcp_url(),
            jiff::Timestamp::now(),
            None,
        )
        .await
        {
            Ok(Ok(fresh)) => fresh,
            Ok(Err(failure)) => {
                return Some(match failure {
                    shared::auth::AuthFailure::Revoked => REVOKED.into(),
                    shared::auth::AuthFailure::CreatorGone => {
                        "The connection's creator no longer belongs to the tenant.".into()
                    }
                    shared::auth::AuthFailure::Expired => {
                        "The connection's access token expired; call the tool again with a new one."
                            .into()
                    }
                    _ => "The connection's credential stopped working.".into(),
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "a task could not re-read its connection's context");
                return None;
            }
        };
        if fresh.global_kill {
            return Some(KILLED.into());
        }
        let tenant = fresh.ctx.tenant().handle.as_str();
        if !fresh.tenant_agent_access || state.live.tenant_off(tenant) {
            return Some(TENANT_OFF.into());
        }
        let spec = state.tools.get(self.tool)?;
        if let Some(right) = spec.access.missing(fresh.ctx.rights()) {
            return Some(format!(
                "The connection lost the right {right} that {} needs.",
                self.tool
            ));
        }
        let toolset = fresh.ctx.connection().map(|c| c.toolset.as_str()).unwrap_or("full");
        if !spec.toolsets.contains(&toolset) {
            return Some(format!("{} is no longer in the connection's toolset.", self.tool));
        }
        None
    }
}

const TENANT_OFF: &str = "The tenant turned agent access off.";
const KILLED: &str = "Agents were paused platform-wide (the kill switch).";
const REVOKED: &str = "The connection was revoked.";

/// Runs the tool of a task to its end, heartbeating, and writes what it answered.
async fn run(
    state: Arc<AppState>,
    ctx: OpCtx,
    admitted: Admission,
    args: Value,
    task: String,
    inflight: crate::live::InFlight,
) {
    let tool = admitted.tool;
    let started = std::time::Instant::now();
    let Some(spec) = state.tools.get(tool) else { return };
    let latest = Arc::new(Mutex::new(None));
    let cancel = tokio_util::sync::CancellationToken::new();
    let env = Env {
        ds: state.ds.clone(),
        ctx: ctx.clone(),
        now: jiff::Timestamp::now(),
        progress: Progress { peer: None, token: None, task: Some(latest.clone()) },
        cancel: cancel.clone(),
    };
    let call = spec.call(env, args);
    tokio::pin!(call);
    let mut beat = tokio::time::interval(std::time::Duration::from_millis(tasks::HEARTBEAT_MS));
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    beat.tick().await;
    let outcome = loop {
        tokio::select! {
            outcome = &mut call => break Some(outcome),
            _ = inflight.token.cancelled() => {
                cancel.cancel();
                if let Err(e) = tasks::cancel(&state.ds, &ctx, &task, REVOKED).await {
                    tracing::warn!(error = %e, task.id = %task, "marking a revoked connection's task cancelled failed");
                }
                break None;
            }
            _ = beat.tick() => {
                if let Some(why) = admitted.refusal(&state).await {
                    cancel.cancel();
                    if let Err(e) = tasks::cancel(&state.ds, &ctx, &task, &why).await {
                        tracing::warn!(error = %e, task.id = %task, "marking a task cancelled failed");
                    }
                    tracing::info!(task.id = %task, reason = %why, "a running task stopped: its call would no longer be admitted");
                    break None;
                }
                let message = latest.lock().unwrap_or_else(|p| p.into_inner()).take();
                match tasks::heartbeat(&state.ds, &ctx, &task, message.as_deref()).await {
                    Ok(Status::Working) => {}
                    Ok(_) => {
                        cancel.cancel();
                        break None;
                    }
                    Err(e) => tracing::warn!(error = %e, task.id = %task, "task heartbeat failed"),
                }
            }
        }
    };
    let request_id = ctx.request_id().to_owned();
    let label = match outcome {
        None => "cancelled",
        Some(outcome) => {
            let (result, label) = match outcome.and_then(crate::tools::Answer::into_json) {
                Ok(value) => (results::success(value), "ok"),
                Err(error) => {
                    if let shared::Error::Internal(detail) = &error {
                        tracing::error!(tool.name = tool, request.id = %request_id, error = %detail, "tool failed");
                    }
                    let label = error.code();
                    (results::failure(ErrorBody::from_error(tool, &error, &request_id)), label)
                }
            };
            // A tool error is a completed call (`isError: true`), as the extension says.
            let value = serde_json::to_value(&result).unwrap_or(Value::Null);
            match tasks::complete(&state.ds, &ctx, &task, &value).await {
                Ok(Status::Completed) => label,
                Ok(Status::Cancelled) => "cancelled",
                Ok(_) => "too_large",
                Err(e) => {
                    tracing::error!(error = %e, task.id = %task, "writing a task's result failed");
                    "internal"
                }
            }
        }
    };
    let elapsed = started.elapsed();
    let metrics = &state.metrics;
    metrics.tool_calls.with_label_values(&[tool, spec.class.as_str(), label]).inc();
    metrics
        .tool_duration
        .with_label_values(&[tool, spec.class.as_str()])
        .observe(elapsed.as_secs_f64());
    state.activity.record(
        &ctx,
        spec.name,
        spec.class,
        label,
        jiff::Timestamp::now(),
        elapsed.as_secs_f32() * 1000.0,
    );
    tracing::info!(
        tool.name = tool,
        tool.class = spec.class.as_str(),
        outcome = label,
        task.id = %task,
        connection.id = %ctx.connection().map(|c| c.handle.to_string()).unwrap_or_default(),
        request.id = %request_id,
        duration_ms = elapsed.as_secs_f64() * 1000.0,
        "task run"
    );
}

/// The connection's task, if its live rights still show the task's tool.
async fn visible(state: &AppState, ctx: &OpCtx, task: &str) -> Result<TaskView, ErrorData> {
    let view = tasks::get(&state.ds, ctx, task).await.map_err(|e| unavailable(&e))?;
    let toolset = ctx.connection().map(|c| c.toolset.as_str()).unwrap_or("full");
    view.filter(|v| {
        state.tools.get(&v.tool).is_some_and(|spec| {
            spec.access.missing(ctx.rights()).is_none() && spec.toolsets.contains(&toolset)
        })
    })
    .ok_or_else(|| not_found(task))
}

/// `tasks/get`: the task with its result (completed) or error (failed) inlined.
pub async fn get(state: &AppState, ctx: &OpCtx, task: &str) -> Result<GetTaskResult, ErrorData> {
    let view = visible(state, ctx, task).await?;
    let object = |v: &Option<Value>| -> JsonObject {
        v.as_ref().and_then(|v| v.as_object().cloned()).unwrap_or_default()
    };
    let payload = match view.status {
        Status::Working => TaskPayload::Working,
        Status::Cancelled => TaskPayload::Cancelled,
        Status::Completed => TaskPayload::Completed { result: object(&view.result) },
        Status::Failed => TaskPayload::Failed {
            error: match &view.error {
                Some(Value::Object(error)) => error.clone(),
                _ => object(&Some(json!({"code": -32603, "message": "The task failed."}))),
            },
        },
    };
    Ok(GetTaskResult::new(DetailedTask::new(task_of(&view), payload)))
}

/// `tasks/cancel`: cancels a working task (the worker running it stops at its next heartbeat);
/// a task already ended is acknowledged as it is.
pub async fn cancel(state: &AppState, ctx: &OpCtx, task: &str) -> Result<(), ErrorData> {
    visible(state, ctx, task).await?;
    match tasks::cancel(&state.ds, ctx, task, "Cancelled by the client.").await {
        Ok(true) => Ok(()),
        Ok(false) => Err(not_found(task)),
        Err(e) => Err(unavailable(&e)),
    }
}
