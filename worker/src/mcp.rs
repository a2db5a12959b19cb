//! The rmcp server handler: per-caller tool lists and tool dispatch.
//!
//! `tools/list` shows the tools the call's live rights allow, in name order. `tools/call`
//! looks the tool up (unknown → JSON-RPC -32602), refuses a tool hidden by rights with a tool
//! error naming the missing right (R15), then runs its adapter. Nothing is kept between
//! requests.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CancelTaskParams, GetTaskParams,
    GetTaskResult, Implementation, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
    ServerCapabilities, ServerConfig, ServerNotification, SubscriptionFilter, Tool,
    ToolListChangedNotification, UpdateTaskParams,
};
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext};
use rmcp::{ErrorData, ServerHandler};
use serde_json::Value;
use shared::auth::McpContext;
use shared::error::Error;
use shared::services::approvals::Completion;
use shared::services::outcome::{Outcome, PreviewStatus};
use shared::telemetry::{self, Attr, Name};

use crate::listen::TURNED_AWAY;
use crate::results::{self, ErrorBody};
use crate::tools::{Answer, Env};
use crate::written::WrittenOnce;
use crate::{AppState, listen};

#[derive(Clone)]
pub struct Server {
    state: Arc<AppState>,
}

impl Server {
    pub fn new(state: Arc<AppState>) -> Self {
        Server { state }
    }
}

/// The context the entry middleware bound to this HTTP request.
fn bound(context: &RequestContext<RoleServer>) -> Result<Arc<McpContext>, ErrorData> {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Arc<McpContext>>())
        .cloned()
        .ok_or_else(|| {
            ErrorData::internal_error("no connection context bound to the request", None)
        })
}

/// The tenant's policies for a read or a silent write, before the tool runs (two-step actions
/// are decided by the engine at prepare and at confirm, with what their plan touches). No
/// policy set: nothing to read, the call goes on.
async fn policy_gate(
    state: &crate::AppState,
    spec: &crate::tools::ToolSpec,
    bound: &McpContext,
    arguments: Option<&serde_json::Map<String, Value>>,
) -> Result<(), Error> {
    if bound.policy_version == 0 || !judged_at_gate(spec) {
        return Ok(());
    }
    let ctx = &bound.ctx;
    let Some(connection) = ctx.connection() else { return Ok(()) };
    let caller = shared::policies::CallerFacts {
        version: bound.policy_version,
        principal: shared::policies::Principal {
            handle: connection.handle.to_string(),
            role: bound.creator_role.as_str().to_owned(),
            client: connection.client_name.clone(),
            grant: bound.grant.to_owned(),
            name: connection.name.clone(),
            creator: ctx.actor_handle().unwrap_or_default().to_owned(),
        },
    };
    let args = arguments.map(|a| Value::Object(a.clone())).unwrap_or_default();
    shared::services::policies::check_call(
        &state.ds,
        ctx,
        &caller,
        spec.name,
        spec.class,
        &args,
        jiff::Timestamp::now(),
    )
    .await
}

/// Whether a call of the tool is judged by the tenant's policies at the worker's gate: every
/// read and silent write. A two-step tool is judged at prepare and at confirm, in the action's
/// transaction, and confirming or rejecting is judged there too.
pub(crate) fn judged_at_gate(spec: &crate::tools::ToolSpec) -> bool {
    !(spec.class.two_step() || matches!(spec.name, "confirm_action" | "reject_action"))
}

/// The request's span, when traces are exported.
fn traced(context: &RequestContext<RoleServer>) -> Option<&telemetry::RequestTrace> {
    context.extensions.get::<http::request::Parts>()?.extensions.get::<telemetry::RequestTrace>()
}

/// The request's `Authorization` header, for work that outlives the request and asks the
/// entry point's questions again (listen streams, tasks).
fn authorization_of(context: &RequestContext<RoleServer>) -> Option<String> {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|p| p.headers.get(http::header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn toolset(ctx: &shared::OpCtx) -> &str {
    ctx.connection().map(|c| c.toolset.as_str()).unwrap_or("full")
}

impl Server {
    /// One call against the connection's bucket for the tool's class.
    async fn take_rate(
        &self,
        spec: &crate::tools::ToolSpec,
        ctx: &shared::OpCtx,
        read_limit: i32,
    ) -> shared::Result<()> {
        match spec.rate_class() {
            None => Ok(()),
            Some(crate::tools::EffectClass::Read) => {
                self.state.reads.take(ctx, read_limit, jiff::Timestamp::now().as_second())
            }
            Some(class) => {
                shared::services::rates::take_shared(&self.state.ds, ctx, class.as_str()).await
            }
        }
    }
}

impl Server {
    /// The tools a connection sees now: its live rights, its toolset, and the tenant's
    /// approval policy (which hides what it turned off and says who completes the rest).
    async fn visible_tools(&self, ctx: &shared::OpCtx) -> Result<Vec<Tool>, ErrorData> {
        let policy =
            shared::services::approvals::policy(&self.state.ds, ctx).await.map_err(|e| {
                tracing::error!(error = %e, "approval policy lookup failed");
                ErrorData::internal_error("the tool list is unavailable; retry", None)
            })?;
        Ok(self
            .state
            .tools
            .all()
            .iter()
            .filter(|t| t.access.missing(ctx.rights()).is_none())
            .filter(|t| t.toolsets.contains(&toolset(ctx)))
            .filter_map(|t| match policy.for_tool(t.name) {
                Some(Completion::Off) => None,
                Some(Completion::PersonApproves) => {
                    let mut tool = t.tool.clone();
                    let described = tool.description.as_deref().unwrap_or_default();
                    tool.description = Some(format!("{described} In this tenant a person must approve it in the Gatehouse console: the agent cannot complete it, and confirm_action only reports the outcome.").into());
                    Some(tool)
                }
                _ => Some(t.tool.clone()),
            })
            .collect())
    }

    /// What a listen stream compares: the list a connection would see, or that agents are
    /// turned away (a switch off: every call is refused, so the usable list is empty).
    async fn list_digest(&self, context: &McpContext) -> Result<Vec<u8>, ErrorData> {
        let tenant = context.ctx.tenant().handle.as_str();
        if context.global_kill
            || !context.tenant_agent_access
            || self.state.live.killed()
            || self.state.live.tenant_off(tenant)
        {
            return Ok(TURNED_AWAY.to_vec());
        }
        let tools = self.visible_tools(&context.ctx).await?;
        let listed = serde_json::to_vec(&tools).unwrap_or_default();
        Ok(shared::secret::hash_token(&String::from_utf8_lossy(&listed)))
    }

    /// A woken listen stream's question, asked as a new request would (the credential, its
    /// rights, the creator, the switches), at most [`listen::RECHECKS_AT_ONCE`] at once per
    /// worker: one push may wake thousands of streams.
    async fn reread(&self, authorization: Option<&str>) -> listen::Reread {
        let _slot = self.state.rechecks.acquire().await;
        self.state.metrics.listen_rereads.inc();
        let fresh = match shared::auth::authenticate_mcp(
            &self.state.ds,
            authorization,
            &self.state.settings.mcp_url(),
            jiff::Timestamp::now(),
            None,
        )
        .await
        {
            Ok(Ok(fresh)) => fresh,
            Ok(Err(failure)) => return listen::Reread::Ended(failure),
            Err(e) => {
                tracing::warn!(error = %e, "listen stream could not re-read its context");
                return listen::Reread::Failed;
            }
        };
        match self.list_digest(&fresh).await {
            Ok(digest) => listen::Reread::Fresh { digest, expires_at: fresh.expires_at },
            Err(_) => listen::Reread::Failed,
        }
    }

    /// A tool's answer as a result built from a `Value`; a database outage explained.
    async fn present(
        &self,
        answer: shared::Result<Answer>,
    ) -> shared::Result<rmcp::model::CallToolResult> {
        match answer.and_then(Answer::into_json) {
            Ok(value) => Ok(results::success(value)),
            Err(e @ Error::Unavailable { .. }) => Err(self.state.ds.explain(e).await),
            Err(e) => Err(e),
        }
    }

    /// One listen stream: told when the tool list its connection sees changes, ended when its
    /// credential stops working (see [`crate::listen`]).
    async fn follow_tool_list(&self, subscription: SubscriptionContext) -> Result<(), ErrorData> {
        let request = subscription.request_context();
        let first = bound(request)?;
        let authorization = authorization_of(request);
        let tenant = first.ctx.tenant().handle.to_string();
        let connection = first.ctx.connection().map(|c| c.handle.to_string()).unwrap_or_default();
        let metrics = &self.state.metrics;
        // Declared before the registration, so it is dropped after it: the gauge is read
        // once this stream is out of the count.
        let _gauge = scopeguard(self.state.clone());
        // The entry point took the stream's place before the acknowledgement; a request that
        // reached here another way (the conformance fixture) takes it now.
        let reserved = request
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<crate::entry::ReservedStream>())
            .and_then(|r| r.0.lock().ok()?.take());
        let registered = match reserved {
            Some(r) => r,
            // When its credential was read is not known here: any change this worker heard
            // makes it re-read at once (one read, never a missed revocation).
            None => match self.state.streams.open(&tenant, &connection, 0) {
                Ok(r) => r,
                Err(full) => {
                    metrics.listen_events.with_label_values(&["refused"]).inc();
                    return Err(ErrorData::invalid_request(full.message(), None));
                }
            },
        };
        metrics.listen_events.with_label_values(&["opened"]).inc();
        metrics.listen_streams.set(self.state.streams.open_count() as i64);
        let tells = subscription.accepted().tools_list_changed == Some(true);
        let direct = registered.direct.clone();
        if tells {
            direct.set_event(tools_changed_event(&request.id));
        }
        let credential = shared::secret::hash_token(authorization.as_deref().unwrap_or_default());
        let seen = self.list_digest(&first).await?;
        // A switch's fan-out tells this stream without its task, while the task is not looking
        // (once the entry point attached its response).
        registered.wake.start(seen, tells, Some(direct.clone()));
        let mut expires_at = first.expires_at;
        // Made once per stream, not per wake: the worker's draining token is one for all its
        // streams, and a waiter made and dropped on each wake takes that token's lock each time
        // (a switch wakes ten thousand streams at once).
        let cancelled = subscription.cancelled();
        let draining = self.state.draining.cancelled();
        // The connection revoked (the entry point's token for this request): the stream ends
        // with its final result at once, whether or not the database answers a re-read.
        let revoked_token = registered.revoked.clone();
        let revoked = async {
            match &revoked_token {
                Some(token) => token.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(cancelled, draining, revoked);
        // Counters looked up once, not by label on each wake.
        let (told, unchanged) = (
            metrics.listen_events.with_label_values(&["changed"]),
            metrics.listen_events.with_label_values(&["unchanged"]),
        );
        loop {
            let until_expiry = expires_at.map(|at| {
                let left = at.as_millisecond() - jiff::Timestamp::now().as_millisecond();
                std::time::Duration::from_millis(left.max(0) as u64)
            });
            tokio::select! {
                // A wake first: its turn polls nothing else (a cancellation waiter checks its
                // token under the token's lock on every poll, and the draining token is the
                // worker's, one for all its streams).
                biased;
                _ = registered.wake.notified() => {}
                _ = &mut cancelled => return Ok(()),
                // The worker is stopping: the final result tells the client to listen again.
                _ = &mut draining => return Ok(()),
                _ = &mut revoked => {
                    revoked_end(&direct, &connection, metrics);
                    return Ok(());
                }
                // A timer only for a credential that expires (an async block makes none).
                _ = async {
                    match until_expiry {
                        Some(left) => tokio::time::sleep(left).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
            // Every look runs marked as one, so a switch's push leaves this stream to it.
            registered.wake.begin_look();
            // A wake wins the biased select whenever one is waiting, so a stream woken again
            // and again (pushes faster than its re-reads, a database that keeps failing) looks
            // at its end here too: its client gone, or the worker stopping.
            if request.ct.is_cancelled() || direct.closed() {
                return Ok(());
            }
            // A revocation's push both cancels the token and wakes the stream, and the wake
            // wins the select: the token is looked at here, so no re-read decides instead.
            if revoked_token.as_ref().is_some_and(|t| t.is_cancelled()) {
                revoked_end(&direct, &connection, metrics);
                return Ok(());
            }
            if self.state.draining_now.load(std::sync::atomic::Ordering::Acquire) {
                return Ok(());
            }
            // A credential past its expiry ends the stream without asking Postgres.
            if expires_at.is_some_and(|at| at <= jiff::Timestamp::now()) {
                metrics.listen_events.with_label_values(&["ended"]).inc();
                return Ok(());
            }
            // Agents turned away (a switch this worker holds from NATS): every call is refused,
            // so the usable list is empty whatever the context says; no read is needed to say
            // so, unless the change may concern the credential itself (a revocation, a deleted
            // token): then it is re-read, and a credential that stopped working ends the stream
            // even while its tenant is off. Otherwise one re-read per credential and push,
            // shared by its streams.
            let recheck = registered.wake.take_recheck();
            let turned_away = self.state.live.killed() || self.state.live.tenant_off(&tenant);
            let reread = if turned_away && !recheck {
                listen::Reread::Fresh { digest: TURNED_AWAY.to_vec(), expires_at }
            } else {
                let cell = self.state.streams.reread(credential.clone());
                // A revocation arriving during the read ends the stream without its answer.
                let answer = tokio::select! {
                    answer = cell.get_or_init(|| self.reread(authorization.as_deref())) => answer.clone(),
                    _ = &mut revoked => {
                        revoked_end(&direct, &connection, metrics);
                        return Ok(());
                    }
                };
                if matches!(answer, listen::Reread::Failed) {
                    self.state.streams.forget_reread(&credential, &cell);
                }
                answer
            };
            let now = match reread {
                listen::Reread::Fresh { digest, expires_at: at } => {
                    expires_at = at;
                    digest
                }
                listen::Reread::Ended(failure) => {
                    tracing::info!(connection = %connection, reason = ?failure, "listen stream ended: its credential stopped working");
                    metrics.listen_events.with_label_values(&["ended"]).inc();
                    return Ok(());
                }
                listen::Reread::Failed => {
                    // The database is away: look again in a moment (and at the next change),
                    // unless the client leaves or the worker stops meanwhile.
                    registered.wake.end_look_failed();
                    registered.wake.again();
                    tokio::select! {
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                        _ = &mut cancelled => return Ok(()),
                        _ = &mut draining => return Ok(()),
                        _ = &mut revoked => {
                            revoked_end(&direct, &connection, metrics);
                            return Ok(());
                        }
                    }
                    continue;
                }
            };
            if !registered.wake.end_look(now) {
                unchanged.inc();
                tracing::debug!(connection = %connection, "listen stream woken; tool list unchanged");
                continue;
            }
            tracing::debug!(connection = %connection, "listen stream woken; tool list changed");
            if !tells {
                continue;
            }
            if direct.attached() {
                if !direct.tell() {
                    return Ok(());
                }
            } else {
                let changed = ServerNotification::ToolListChangedNotification(
                    ToolListChangedNotification::default(),
                );
                if subscription.sink().send(changed).await.is_err() {
                    return Ok(());
                }
            }
            told.inc();
        }
    }
}

/// A listen stream's `toolsListChanged` as its response carries it: the message rmcp's
/// subscription sink sends (the notification with the listen request's id as its subscription
/// id), framed as rmcp's event stream frames it.
pub fn tools_changed_event(subscription: &rmcp::model::RequestId) -> axum::body::Bytes {
    use rmcp::model::GetMeta as _;
    let mut notification =
        ServerNotification::ToolListChangedNotification(ToolListChangedNotification::default());
    notification.get_meta_mut().set_subscription_id(subscription.clone());
    let message = rmcp::model::ServerJsonRpcMessage::notification(notification);
    let mut event = b"data: ".to_vec();
    // A notification of rmcp's own types always serializes.
    let _ = serde_json::to_writer(&mut event, &message);
    event.extend_from_slice(b"\n\n");
    event.into()
}

/// A listen stream whose connection was revoked: it tells nothing more (a count of events not
/// yet written is dropped), and its task returns, so rmcp writes the stream's final result.
fn revoked_end(direct: &listen::Direct, connection: &str, metrics: &crate::metrics::Metrics) {
    direct.close();
    tracing::info!(connection = %connection, "listen stream ended: its connection was revoked");
    metrics.listen_events.with_label_values(&["ended"]).inc();
}

/// Keeps the open-streams gauge right when a stream ends, however it ends.
fn scopeguard(state: Arc<AppState>) -> impl Drop {
    struct Gauge(Arc<AppState>);
    impl Drop for Gauge {
        fn drop(&mut self) {
            self.0.metrics.listen_streams.set(self.0.streams.open_count() as i64);
        }
    }
    Gauge(state)
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        // Tool lists change with the connection's live rights and the tenant's policy; clients
        // learn it on a `subscriptions/listen` stream. Slow tools run as tasks.
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("gatehouse", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Gatehouse serves one tenant's bookings (customers, technicians, bookings). \
                 The tenant is fixed by the connection. Handles look like cus_…, tec_…, bkg_….",
        )
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // Tools are what Gatehouse lists; prompts and resources it has none of.
        let mut accepted = SubscriptionFilter::default();
        accepted.tools_list_changed = requested.tools_list_changed.filter(|on| *on);
        Some(accepted)
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), ErrorData> {
        // Every stream, whatever it asked for, is registered (bounded) and ends with its
        // credential; only one that asked for tools is ever told anything.
        self.follow_tool_list(subscription).await
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let bound = bound(&context)?;
        let tools = self.visible_tools(&bound.ctx).await?;
        // The list depends on this caller's live rights: cache it briefly and privately.
        Ok(ListToolsResult::with_all_items(tools)
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let bound = bound(&context)?;
        crate::tasks::get(&self.state, &bound.ctx, &request.task_id).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let bound = bound(&context)?;
        crate::tasks::cancel(&self.state, &bound.ctx, &request.task_id).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        // No Gatehouse task waits for input: an update of a visible task changes nothing.
        let bound = bound(&context)?;
        crate::tasks::get(&self.state, &bound.ctx, &request.task_id).await.map(|_| ())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let bound = bound(&context)?;
        let started = Instant::now();
        let name = request.name.as_ref();
        let Some(spec) = self.state.tools.get(name) else {
            if let Some(trace) = traced(&context) {
                trace.fail(&[Attr::Outcome("unknown_tool"), Attr::ErrorCode(-32602)]);
            }
            return Err(ErrorData::invalid_params(
                format!(
                    "Unknown tool {name:?}; call tools/list for the tools this connection has."
                ),
                None,
            ));
        };
        let ctx = bound.ctx.clone();
        let request_id = ctx.request_id().to_owned();
        let connection = ctx.connection().map(|c| c.handle.to_string()).unwrap_or_default();
        let missing = spec.access.missing(ctx.rights());
        let mut confirm_path = (spec.name == "confirm_action").then_some("confirm_action");
        let outcome = if !spec.toolsets.contains(&toolset(&ctx)) {
            Err(Error::NotInToolset {
                tool: name.to_owned(),
                toolset: toolset(&ctx).to_owned(),
                available_in: spec.toolsets.iter().map(|t| (*t).to_owned()).collect(),
            })
        } else if let Some(right) = missing {
            Err(Error::Forbidden { right })
        } else if let Err(limited) = self.take_rate(spec, &ctx, bound.read_limit).await {
            Err(limited)
        } else if let Err(refused) =
            policy_gate(&self.state, spec, &bound, request.arguments.as_ref()).await
        {
            Err(refused)
        } else if spec.tasks == crate::tools::TaskSupport::Optional
            && context.client_capabilities().is_some_and(|c| c.supports_tasks())
        {
            // A slow tool, and a client that polls tasks: answered at once with the task.
            let args = request.arguments.map(Value::Object).unwrap_or(Value::Null);
            let authorization = authorization_of(&context);
            let created =
                crate::tasks::start(&self.state, &ctx, spec.name, args, authorization).await?;
            self.state
                .metrics
                .tool_calls
                .with_label_values(&[name, spec.class.as_str(), "task"])
                .inc();
            tracing::info!(tool.name = name, outcome = "task", task.id = %created.task.task_id, connection.id = %connection, request.id = %request_id, "tool call");
            return Ok(CallToolResponse::Task(created));
        } else if let Some(sealed) = request.request_state.as_deref() {
            confirm_path = Some("multi_round_trip");
            // The retry of a multi round-trip confirmation: the person answered.
            let args = request.arguments.map(Value::Object).unwrap_or(Value::Null);
            let now = jiff::Timestamp::now();
            let responses = request.input_responses.as_ref();
            crate::mrtr::resume(&self.state, &ctx, name, &args, sealed, responses, now)
                .await
                .map(|o| Answer::TwoStep(Box::new(o)))
        } else {
            let args = request.arguments.map(Value::Object).unwrap_or(Value::Null);
            let progress = crate::tools::Progress {
                peer: Some(context.peer.clone()),
                token: context.meta.get_progress_token(),
                task: None,
            };
            let env = Env {
                ds: self.state.ds.clone(),
                ctx: ctx.clone(),
                now: jiff::Timestamp::now(),
                progress,
                cancel: context.ct.clone(),
            };
            let called = if spec.class.two_step() { Some(args.clone()) } else { None };
            let attrs = [Attr::Tool(spec.name), Attr::Class(spec.class)];
            let service = telemetry::child(
                Name::MethodTarget("gatehouse.service", spec.name),
                &attrs,
                spec.call(env, args),
            );
            let outcome = match traced(&context) {
                Some(trace) => trace.run(service).await,
                None => service.await,
            };
            // A client that can show the person a form confirms in its own UI (MRTR).
            match (&outcome, called) {
                (Ok(Answer::TwoStep(outcome)), Some(args))
                    if let Outcome::Preview(preview) = &**outcome
                        && preview.status == PreviewStatus::Preview
                        && crate::mrtr::eligible(&self.state, &context) =>
                {
                    match crate::mrtr::ask(&self.state, &ctx, &args, preview) {
                        Ok(input_required) => {
                            let metrics = &self.state.metrics;
                            metrics
                                .tool_calls
                                .with_label_values(&[name, spec.class.as_str(), "input_required"])
                                .inc();
                            self.state.activity.record(
                                &ctx,
                                spec.name,
                                spec.class,
                                "input_required",
                                jiff::Timestamp::now(),
                                started.elapsed().as_secs_f32() * 1000.0,
                            );
                            tracing::info!(tool.name = name, outcome = "input_required", request.id = %request_id, "tool call");
                            return Ok(CallToolResponse::InputRequired(input_required));
                        }
                        Err(e) => Err(e),
                    }
                }
                _ => outcome,
            }
        };
        // What the call did, for counts and pictures: a two-step tool's first step is a
        // preview, and a confirmation counts under the class of the action it executed.
        let mut class = spec.class;
        if let Ok(Answer::TwoStep(outcome)) = &outcome
            && let Outcome::Executed(executed) = &**outcome
            && let Some(tool) = self.state.tools.get(&executed.tool)
        {
            class = tool.class;
        }
        let label = match &outcome {
            Ok(Answer::TwoStep(o)) if matches!(&**o, Outcome::Preview(p) if p.status == PreviewStatus::Preview) => {
                "previewed"
            }
            _ => "ok",
        };
        // A typed output is written once, into both places of a JSON answer; anything else
        // becomes a `Value` first.
        let outcome = match outcome {
            Ok(Answer::Written(text)) if let Some(once) = WrittenOnce::offered(&context) => {
                match once.hold(text) {
                    Ok(result) => Ok(result),
                    Err(text) => self.present(Ok(Answer::Written(text))).await,
                }
            }
            other => self.present(other).await,
        };
        let (result, label) = match outcome {
            Ok(result) => (result, label),
            Err(error) => {
                if let Error::Internal(detail) = &error {
                    tracing::error!(tool.name = name, request.id = %request_id, error = %detail, "tool failed");
                }
                if let Error::Unavailable { cause } = &error
                    && let Some(outage) = context
                        .extensions
                        .get::<http::request::Parts>()
                        .and_then(|p| p.extensions.get::<crate::entry::DatabaseUnavailable>())
                {
                    outage.set(cause);
                }
                let label = error.code();
                (results::failure(ErrorBody::from_error(name, &error, &request_id)), label)
            }
        };
        let elapsed = started.elapsed();
        if let Some(trace) = traced(&context) {
            trace.set(&[Attr::Outcome(label), Attr::Class(class)]);
            if label != "ok" && label != "previewed" {
                trace.fail(&[Attr::ErrorType("tool_error")]);
            }
        }
        let metrics = &self.state.metrics;
        let class_name = class.as_str();
        metrics.tool_calls.with_label_values(&[name, class_name, label]).inc();
        metrics.tool_duration.with_label_values(&[name, class_name]).observe(elapsed.as_secs_f64());
        if let Some(reason) = crate::metrics::refusal_reason(label) {
            metrics.refusals.with_label_values(&[reason]).inc();
        }
        if let Some(used) = ctx.read_ahead_used() {
            metrics.read_ahead.with_label_values(&[if used { "used" } else { "unused" }]).inc();
        }
        if let Some(path) = confirm_path {
            metrics
                .confirm_duration
                .with_label_values(&[path, label])
                .observe(elapsed.as_secs_f64());
        }
        let ms = elapsed.as_secs_f32() * 1000.0;
        self.state.activity.record(&ctx, spec.name, class, label, jiff::Timestamp::now(), ms);
        tracing::info!(
            tool.name = name,
            tool.class = class.as_str(),
            outcome = label,
            connection.id = %connection,
            request.id = %request_id,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            "tool call"
        );
        Ok(result.into())
    }
}
