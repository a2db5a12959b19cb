//! The entry point of every MCP request (DESIGN steps 1–3; R4, R5, R18, R20).
//!
//! Before rmcp sees a request: the bearer token must be an MCP token; its SHA-256 is looked
//! up with one query that returns the whole connection context; the global kill switch
//! answers 503, the tenant's agent switch 403; anything else missing or foreign is 401 with
//! `WWW-Authenticate` pointing at the protected resource metadata. The resulting
//! [`McpContext`] rides in the request extensions to the tool layer. Nothing is cached across
//! requests, so a revocation or a role change holds from the very next call on every worker.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use shared::auth::{self, AuthFailure, McpContext};
use shared::rights::RightSet;
use shared::secret::CredentialKind;
use shared::telemetry::{self, Attr, Name};

use crate::AppState;

mod answers;
mod headers;
pub(crate) use answers::is_event_stream;
use answers::*;
use headers::*;

/// Seconds a client should wait before retrying while the kill switch is on.
pub const RETRY_AFTER_SECS: u32 = 30;

pub async fn authenticate(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let received = telemetry::enabled().then(std::time::SystemTime::now);
    // A browser origin not on the allow-list is refused first, whatever the request carries
    // (R20): the answer never depends on its credentials, the load or the switches.
    if let Some(refusal) = foreign_origin(&state.settings.allowed_origins, request.headers()) {
        refused(&state, received, request.headers(), "origin");
        return finish(&state, before_body(request, refusal));
    }
    // Step 0: room to serve it. A full worker answers at once rather than queue: the client
    // retries (on another worker behind the balancer) and latency stays bounded.
    let Ok(_permit) = state.capacity.clone().try_acquire_owned() else {
        refused(&state, received, request.headers(), "overloaded");
        let body = serde_json::json!({
            "error": "overloaded",
            "error_description": "This worker is at capacity; retry in a second.",
        });
        let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(1u32));
        return finish(&state, before_body(request, response));
    };
    // Step 1: the kill switch as NATS last pushed it, before any database work.
    if state.live.killed() {
        refused(&state, received, request.headers(), "kill_switch");
        let response =
            unavailable("Agent access to Gatehouse is paused by an operator; retry later.");
        return finish(&state, before_body(request, response));
    }
    // What of the body has already arrived (all of it, for a client that sends a call with its
    // headers) is taken now, without waiting: when it is a call of a tool that reads ahead, the
    // statement that reads the connection context also reads what the tool will read, so the
    // call costs one round trip. A body still arriving is read after authentication, as any
    // body is, so an unauthenticated client can never make the worker wait for one.
    let (parts, body) = request.into_parts();
    // Not for a client that waits for `100 Continue` (taking its body would invite it to send
    // before it is authenticated), nor for a request whose bearer is not an MCP token.
    let mcp_bearer = auth::expect_kind(
        auth::bearer(parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())),
        CredentialKind::Mcp,
    )
    .is_ok();
    let early = if mcp_bearer && !parts.headers.contains_key(header::EXPECT) {
        EarlyBody::take(body)
    } else {
        EarlyBody::Arriving(Vec::new(), body)
    };
    // Only a small body is parsed before authentication (a call's arguments are small; a
    // forged token's megabytes are not worth the CPU).
    let probe = match &early {
        EarlyBody::Complete(bytes) if bytes.len() <= PROBE_BEFORE_AUTH => {
            serde_json::from_slice::<Probe>(bytes).ok()
        }
        _ => None,
    };
    let ahead = probe.as_ref().and_then(|p| read_ahead(&state, p));
    // Noted before the credential is read: a listen stream registered after a revocation that
    // this read could not see re-reads its credential at once.
    let rechecks_seen = state.streams.rechecks_seen();
    let authorization = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let outcome = match auth::authenticate_mcp(
        &state.ds,
        authorization,
        &state.settings.mcp_url(),
        jiff::Timestamp::now(),
        ahead,
    )
    .await
    {
        Ok(outcome) => outcome,
        Err(e) => {
            // The cause was logged with its SQLSTATE where it was met.
            refused(&state, received, &parts.headers, "database_unavailable");
            // Before authentication the caller is told no more than that the database is away;
            // the cause (Postgres's message, the pool) stays in the log.
            let response = match &e {
                shared::Error::Unavailable { .. } => unavailable_database("no connection to it"),
                _ => {
                    tracing::error!(error = %e, "connection context lookup failed");
                    unavailable("The database is unreachable; retry shortly.")
                }
            };
            return finish(&state, early.settle(parts.version, response));
        }
    };
    let looked_up = received.map(|at| (at, std::time::SystemTime::now()));
    let label = if outcome.is_ok() { "ok" } else { "refused" };
    state
        .metrics
        .auth_duration
        .with_label_values(&[label])
        .observe(started.elapsed().as_secs_f64());
    let context = match outcome {
        Ok(context) => context,
        Err(failure) => {
            refused(&state, received, &parts.headers, "unauthenticated");
            return finish(&state, early.settle(parts.version, unauthorized(&state, &failure)));
        }
    };
    if context.global_kill {
        refused(&state, received, &parts.headers, "kill_switch");
        let response =
            unavailable("Agent access to Gatehouse is paused by an operator; retry later.");
        return finish(&state, early.settle(parts.version, response));
    }
    if !context.tenant_agent_access || state.live.tenant_off(context.ctx.tenant().handle.as_str()) {
        let body = serde_json::json!({
            "error": "agent_access_off",
            "error_description": "Agent access for this tenant is turned off (by a tenant admin or a platform operator); a tenant admin can turn it back on in the console under Agent access, and the audit log names who turned it off.",
        });
        refused(&state, received, &parts.headers, "agent_access_off");
        let response = (StatusCode::FORBIDDEN, Json(body)).into_response();
        return finish(&state, early.settle(parts.version, response));
    }
    let context: Arc<McpContext> = Arc::new(context);
    // A revocation pushed while this request runs cancels it: registered before anything else
    // of the request is read, so no part of it (a slow body included) outlives a revocation.
    let connection = context.ctx.connection().map(|c| c.handle.as_str()).unwrap_or_default();
    let inflight = state.live.register(connection);
    let version = parts.version;
    let work = async {
        // Every body is read here, within a deadline and a size limit, so no request holds a
        // worker longer than that whatever the client does, and a revocation cancels it while
        // it arrives. What the body says is parsed only when something needs it before rmcp:
        // a step-up check (an OAuth client calling a tool its token lacks but its person
        // could grant is told so in HTTP, so it can ask for the right) or the request's span.
        let step_up = context.grantable != RightSet::EMPTY;
        let mut span = None;
        let bytes = match early {
            EarlyBody::Complete(bytes) => bytes,
            EarlyBody::Refused(refusal) => return closing(version, refusal),
            EarlyBody::Arriving(head, rest) => {
                let bytes = match read_rest(head, rest).await {
                    Ok(bytes) => bytes,
                    Err(refusal) => return closing(version, refusal),
                };
                // The credential was checked before its body arrived; a slow body may have
                // arrived after a revocation whose push has not reached this worker yet. Asked
                // again now (one statement, slow bodies only), the answer is the database's.
                let authorization =
                    parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
                match auth::authenticate_mcp(
                    &state.ds,
                    authorization,
                    &state.settings.mcp_url(),
                    jiff::Timestamp::now(),
                    None,
                )
                .await
                {
                    Ok(Ok(_)) => bytes,
                    Ok(Err(failure)) => return closing(version, unauthorized(&state, &failure)),
                    Err(_) => {
                        return closing(version, unavailable_database("no connection to it"));
                    }
                }
            }
        };
        if let Some(refusal) = legacy_header_mismatch(&parts.headers, &bytes) {
            return refusal;
        }
        // A listen stream takes its place within the bounds before rmcp acknowledges it, so a
        // refusal is the request's answer, never a subscription that is cut after its ack.
        let reserved = match reserve_listen(&state, &context, &parts.headers, &bytes, rechecks_seen)
        {
            Ok(reserved) => reserved,
            Err(refusal) => return *refusal,
        };
        // Parsed before authentication when it could read ahead; else only when needed.
        let probe = probe.or_else(|| {
            (step_up || looked_up.is_some())
                .then(|| serde_json::from_slice::<Probe>(&bytes).ok())
                .flatten()
        });
        if let Some((received, context_done)) = looked_up {
            span = Some(request_span(
                &state,
                &context,
                &parts,
                probe.as_ref(),
                received,
                context_done,
            ));
        }
        if step_up && let Some(challenge) = step_up_challenge(&state, &context, probe.as_ref()) {
            state.metrics.refusals.with_label_values(&["rights"]).inc();
            if let Some(span) = &span {
                span.fail(&[
                    Attr::Outcome("insufficient_scope"),
                    Attr::ErrorType("insufficient_scope"),
                ]);
            }
            return challenge;
        }
        let body = bytes.clone();
        // rmcp's 415 means "not JSON-RPC" only when the body was sent as JSON.
        // (Compared in place: this runs on every call, and a lowercase copy would allocate.)
        let sent_as_json =
            parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(
                |v| {
                    v.trim_start()
                        .get(.."application/json".len())
                        .is_some_and(|p| p.eq_ignore_ascii_case("application/json"))
                },
            );
        let mut request = Request::from_parts(parts, axum::body::Body::from(bytes));
        request.extensions_mut().insert(context.clone());
        let outage = DatabaseUnavailable::default();
        request.extensions_mut().insert(outage.clone());
        let written = crate::written::WrittenOnce::default();
        request.extensions_mut().insert(written.clone());
        // A listen stream's task tells its response directly (see `listen::Direct`).
        let direct = reserved
            .as_ref()
            .and_then(|r| r.0.lock().ok()?.as_ref().map(|registered| registered.direct.clone()));
        if let Some(reserved) = reserved {
            if let Ok(mut guard) = reserved.0.lock()
                && let Some(registered) = guard.as_mut()
            {
                registered.revoked = Some(inflight.token.clone());
            }
            request.extensions_mut().insert(reserved);
        }
        if let Some(span) = &span {
            request.extensions_mut().insert(telemetry::RequestTrace(span.context()));
        }
        let response = written.write(&body, next.run(request).await).await;
        let response = match &direct {
            Some(direct) if is_event_stream(&response) => {
                let (mut parts, stream) = response.into_parts();
                // Marked, so a revocation lets the stream's task end it with its result.
                parts.extensions.insert(ListenBody(direct.clone()));
                Response::from_parts(parts, crate::listen::attach(direct.clone(), stream))
            }
            _ => response,
        };
        // A JSON answer (not a stream already under way) to a call the database could not
        // serve becomes the retryable 503 it is.
        let response = match outage.take() {
            Some(cause) if !is_event_stream(&response) => unavailable_database(&cause),
            _ => response,
        };
        let response = if sent_as_json { malformed_as_json_rpc(response, &body) } else { response };
        if let Some(span) = &span
            && !response.status().is_success()
        {
            span.fail(&[Attr::HttpStatus(response.status().as_u16())]);
        }
        response
    };
    let response = tokio::select! {
        response = work => response,
        // Its body may still be arriving: the connection is not reused.
        _ = inflight.token.cancelled() => closing(version, unauthorized(&state, &AuthFailure::Revoked)),
    };
    finish(&state, end_stream_on_revocation(response, inflight))
}

/// rmcp answers a body it cannot read as a JSON-RPC message with 415 and plain text, and a
/// `tools/call` whose params do not match the method with 404 "method not found". A client is
/// told what JSON-RPC says instead: 400 with -32700 (not JSON) or -32600 (not one valid
/// request: a batch, another `jsonrpc`, an id that is neither string nor integer), and
/// -32602 for a `tools/call` whose params are not what the method takes. Only failures pass
/// through here; a served call is untouched.
fn malformed_as_json_rpc(response: Response, body: &[u8]) -> Response {
    let status = response.status();
    if status != StatusCode::UNSUPPORTED_MEDIA_TYPE && status != StatusCode::NOT_FOUND {
        return response;
    }
    let parsed = serde_json::from_slice::<serde_json::Value>(body);
    let id = parsed
        .as_ref()
        .ok()
        .and_then(|v| v.get("id"))
        .filter(|id| id.is_string() || id.is_i64() || id.is_u64())
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    let (code, message) = match (status, &parsed) {
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, Err(_)) => {
            (-32700, "Parse error: the body is not JSON.".to_owned())
        }
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, Ok(serde_json::Value::Array(_))) => (
            -32600,
            "Invalid Request: JSON-RPC batches are not taken; send one request per POST.".to_owned(),
        ),
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, Ok(_)) => (
            -32600,
            "Invalid Request: send one JSON-RPC 2.0 message with \"jsonrpc\": \"2.0\", a string or integer id, a method and its params.".to_owned(),
        ),
        (_, Ok(v)) if v.get("method").and_then(|m| m.as_str()) == Some("tools/call") => (
            -32602,
            "Invalid params: tools/call takes {\"name\": a tool name, \"arguments\": an object}; call tools/list for the tools and their input schemas.".to_owned(),
        ),
        _ => return response,
    };
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})),
    )
        .into_response()
}

/// The largest request body: far above any tool call's arguments.
const BODY_LIMIT: usize = 4 * 1024 * 1024;
/// The largest body read for a read-ahead before the caller is authenticated.
const PROBE_BEFORE_AUTH: usize = 64 * 1024;
/// How long a request's body may take to arrive.
const BODY_SECS: u64 = 10;

/// What the entry point reads of a JSON-RPC request (read-ahead, step-up, the span);
/// everything else is ignored, and arguments and `_meta` stay unparsed until needed.
#[derive(serde::Deserialize)]
struct Probe {
    /// A request, not a notification: only a request has an answer to refuse (and an id).
    #[serde(default)]
    id: Option<serde_json::Value>,
    method: String,
    #[serde(default)]
    params: Option<ProbeParams>,
}

#[derive(serde::Deserialize)]
struct ProbeParams {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Box<serde_json::value::RawValue>>,
    /// Where a 2026-07-28 client puts its `traceparent`.
    #[serde(default, rename = "_meta")]
    meta: Option<Box<serde_json::value::RawValue>>,
}

/// The read a call's tool declared it does, for these arguments (see `ToolSpec::reads_ahead`);
/// else, for a call the policy gate judges, what the tenant's policies would read of the
/// records it names (read only when the tenant has a policy set).
fn read_ahead(state: &AppState, probe: &Probe) -> Option<shared::auth::ReadAhead> {
    if probe.method != "tools/call" || probe.id.is_none() {
        return None;
    }
    let params = probe.params.as_ref()?;
    let spec = state.tools.get(params.name.as_deref()?)?;
    if !spec.reads_ahead_any() && !crate::mcp::judged_at_gate(spec) {
        return None;
    }
    let args = match &params.arguments {
        Some(raw) => serde_json::from_str(raw.get()).ok()?,
        None => serde_json::Value::Object(Default::default()),
    };
    if spec.reads_ahead_any() {
        spec.read_ahead(args)
    } else {
        shared::services::policies::facts_ahead(spec.name, &args)
    }
}

/// A request body as far as it had arrived when the request reached the entry point.
enum EarlyBody {
    /// All of it.
    Complete(axum::body::Bytes),
    /// Part of it (possibly nothing), and the rest still to read.
    Arriving(Vec<u8>, axum::body::Body),
    /// Too large, or broken: the answer to give once the caller is authenticated.
    Refused(Response),
}

impl EarlyBody {
    /// Takes the frames that are ready, never waiting for one.
    fn take(mut body: axum::body::Body) -> EarlyBody {
        use axum::body::HttpBody as _;
        let mut head = Vec::new();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            match std::pin::Pin::new(&mut body).poll_frame(&mut cx) {
                std::task::Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        if head.len() + data.len() > BODY_LIMIT {
                            return EarlyBody::Refused(too_large());
                        }
                        head.extend_from_slice(&data);
                    }
                }
                std::task::Poll::Ready(Some(Err(_))) => return EarlyBody::Refused(too_large()),
                std::task::Poll::Ready(None) => return EarlyBody::Complete(head.into()),
                std::task::Poll::Pending => return EarlyBody::Arriving(head, body),
            }
        }
    }
}

impl EarlyBody {
    /// A refusal given after the body was taken as far as it had arrived: a body read to its
    /// end leaves the connection for the client's next request, any other closes it.
    fn settle(self, version: http::Version, response: Response) -> Response {
        match self {
            EarlyBody::Complete(_) => response,
            EarlyBody::Arriving(..) | EarlyBody::Refused(_) => closing(version, response),
        }
    }
}

/// A refusal given before anything of the request's body was read (a foreign origin, a full
/// worker, the kill switch). What has already arrived of a small body is read and dropped, so
/// the connection stays usable; a body still arriving, a large one, or one whose client waits
/// for `100 Continue` is not waited for, and the answer closes the connection instead.
fn before_body(request: Request, response: Response) -> Response {
    use axum::body::HttpBody as _;
    let version = request.version();
    if request.headers().contains_key(header::EXPECT) {
        return closing(version, response);
    }
    let mut body = request.into_body();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut read = 0;
    loop {
        match std::pin::Pin::new(&mut body).poll_frame(&mut cx) {
            std::task::Poll::Ready(Some(Ok(frame))) => {
                read += frame.data_ref().map_or(0, |d| d.len());
                if read > PROBE_BEFORE_AUTH {
                    return closing(version, response);
                }
            }
            std::task::Poll::Ready(None) => return response,
            std::task::Poll::Ready(Some(Err(_))) | std::task::Poll::Pending => {
                return closing(version, response);
            }
        }
    }
}

/// Says `Connection: close` on an HTTP/1 answer given while the request's body was not read
/// to its end. Without it, hyper notices the unread body only after it has sent the head
/// without the header, and then closes the connection silently, so the client's next request
/// on it fails; with it, the client (or nginx) knows not to reuse the connection.
fn closing(version: http::Version, mut response: Response) -> Response {
    if version <= http::Version::HTTP_11 {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Set by the tool layer when the database could not serve a call: the entry point then
/// answers the request 503 with `Retry-After` (a retryable outage, never an `internal` tool
/// error), with the cause in words.
#[derive(Clone, Default)]
pub struct DatabaseUnavailable(pub Arc<std::sync::Mutex<Option<String>>>);

impl DatabaseUnavailable {
    pub fn set(&self, cause: &str) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(cause.to_owned());
        }
    }

    fn take(&self) -> Option<String> {
        self.0.lock().ok().and_then(|mut slot| slot.take())
    }
}

/// A listen stream's place, taken by the entry point (see [`reserve_listen`]) and handed to
/// A listen stream's response, as the entry point attached it (see `listen::Direct`).
#[derive(Clone)]
pub(crate) struct ListenBody(pub Arc<crate::listen::Direct>);

/// the stream through the request's extensions.
#[derive(Clone)]
pub struct ReservedStream(pub Arc<std::sync::Mutex<Option<crate::listen::Registered>>>);

/// For a `subscriptions/listen` request: on the legacy protocol, a JSON-RPC error saying
/// which version serves it; else its place among the streams, or the bound's refusal. Other
/// requests pass (`Ok(None)`); the body is parsed only when it names the method.
fn reserve_listen(
    state: &AppState,
    context: &McpContext,
    headers: &http::HeaderMap,
    body: &[u8],
    rechecks_seen: u64,
) -> Result<Option<ReservedStream>, Box<Response>> {
    const METHOD: &str = "subscriptions/listen";
    let said = headers.get("mcp-method").and_then(|v| v.to_str().ok());
    if said.is_some_and(|m| m != METHOD)
        || (said.is_none() && !body.windows(METHOD.len()).any(|w| w == METHOD.as_bytes()))
    {
        return Ok(None);
    }
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(body) else { return Ok(None) };
    if request.get("method").and_then(|m| m.as_str()) != Some(METHOD) {
        return Ok(None);
    }
    let id = request
        .get("id")
        .filter(|id| id.is_string() || id.is_i64() || id.is_u64())
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    let error = |code: i32, message: String| {
        let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
        Box::new((StatusCode::OK, Json(body)).into_response())
    };
    let version = headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            request
                .pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion")
                .and_then(|v| v.as_str())
        })
        .unwrap_or("2025-03-26");
    let listen_version = rmcp::model::ProtocolVersion::STANDARD_HEADERS.as_str();
    if version < listen_version {
        return Err(error(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND.0,
            format!(
                "subscriptions/listen is served on protocol version {listen_version} and later; this request speaks {version}. Send it with MCP-Protocol-Version: {listen_version} (and the protocol version in _meta), or, on {version}, list the tools again when you need them."
            ),
        ));
    }
    let tenant = context.ctx.tenant().handle.as_str();
    let connection = context.ctx.connection().map(|c| c.handle.as_str()).unwrap_or_default();
    match state.streams.open(tenant, connection, rechecks_seen) {
        Ok(registered) => {
            Ok(Some(ReservedStream(Arc::new(std::sync::Mutex::new(Some(registered))))))
        }
        Err(full) => {
            state.metrics.listen_events.with_label_values(&["refused"]).inc();
            Err(error(rmcp::model::ErrorCode::INVALID_REQUEST.0, full.message()))
        }
    }
}

/// `=?base64?…?=` values (SEP-2243) decoded; anything else as it is.
fn decode_header_value(value: &str) -> Option<String> {
    use base64::Engine as _;
    match value.strip_prefix("=?base64?").and_then(|v| v.strip_suffix("?=")) {
        Some(inner) => {
            let bytes = base64::prelude::BASE64_STANDARD.decode(inner).ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(value.to_owned()),
    }
}

/// Reads the rest of a body (what rmcp would read next), bounded in size and time.
async fn read_rest(head: Vec<u8>, rest: axum::body::Body) -> Result<axum::body::Bytes, Response> {
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(BODY_SECS),
        axum::body::to_bytes(rest, BODY_LIMIT.saturating_sub(head.len())),
    )
    .await;
    match read {
        Ok(Ok(bytes)) if head.is_empty() => Ok(bytes),
        Ok(Ok(bytes)) => {
            let mut whole = head;
            whole.extend_from_slice(&bytes);
            Ok(whole.into())
        }
        Err(_) => {
            let body = serde_json::json!({"error": "request_timeout", "error_description": "The request body did not arrive in time; send it again."});
            Err((StatusCode::REQUEST_TIMEOUT, Json(body)).into_response())
        }
        Ok(Err(_)) => Err(too_large()),
    }
}

fn too_large() -> Response {
    let body = serde_json::json!({"error": "request_too_large", "error_description": "The request body is larger than 4 MiB."});
    (StatusCode::PAYLOAD_TOO_LARGE, Json(body)).into_response()
}

/// HTTP 403 `insufficient_scope` when the request calls a tool that a right the person can
/// still grant would allow.
fn step_up_challenge(
    state: &AppState,
    context: &McpContext,
    probe: Option<&Probe>,
) -> Option<Response> {
    let needed = probe
        .filter(|p| p.id.is_some() && p.method == "tools/call")
        .and_then(|p| p.params.as_ref()?.name.as_deref())
        .and_then(|name| state.tools.get(name))
        .filter(|spec| {
            let toolset = context.ctx.connection().map(|c| c.toolset.as_str()).unwrap_or("full");
            spec.toolsets.contains(&toolset)
        })
        .and_then(|spec| spec.access.step_up(context.ctx.rights(), context.grantable));
    needed.map(|right| insufficient_scope(state, context.ctx.rights(), right))
}

/// The span of one MCP request (MCP semantic conventions), continuing the trace the client
/// sent in the request's `_meta` or its headers, backdated to its arrival, with the
/// connection-context lookup as its first child. Attributes come from the registry and the
/// context, never from the request's arguments.
fn request_span(
    state: &AppState,
    context: &McpContext,
    parts: &http::request::Parts,
    probe: Option<&Probe>,
    received: std::time::SystemTime,
    context_done: std::time::SystemTime,
) -> telemetry::Active {
    let method = probe.map_or("other", |p| telemetry::method_name(&p.method));
    let tool = probe
        .filter(|p| p.method == "tools/call")
        .and_then(|p| p.params.as_ref()?.name.as_deref())
        .and_then(|name| state.tools.get(name))
        .map(|spec| spec.name);
    let meta: Option<serde_json::Map<String, serde_json::Value>> = probe
        .and_then(|p| p.params.as_ref()?.meta.as_ref())
        .and_then(|raw| serde_json::from_str(raw.get()).ok());
    let parent = telemetry::remote_parent(meta.as_ref(), Some(&parts.headers));
    let version = parts
        .headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .and_then(|asked| {
            rmcp::model::ProtocolVersion::KNOWN_VERSIONS.iter().find(|v| v.as_str() == asked)
        })
        .map(|v| v.as_str());
    let mut attrs = vec![Attr::Method(method), Attr::NetworkProtocol("http")];
    let name = match tool {
        Some(tool) => {
            // The effect class is set by the tool layer: a confirmation takes its action's.
            attrs.extend([Attr::Tool(tool), Attr::Operation("execute_tool")]);
            Name::MethodTarget(method, tool)
        }
        None => Name::Static(method),
    };
    attrs.extend(version.map(Attr::ProtocolVersion));
    match probe.and_then(|p| p.id.as_ref()) {
        Some(serde_json::Value::Number(n)) => attrs.extend(n.as_i64().map(Attr::RequestNumber)),
        Some(serde_json::Value::String(s)) => attrs.push(Attr::RequestText(s)),
        _ => {}
    }
    attrs.push(Attr::Tenant(&context.ctx.tenant().handle));
    attrs.extend(context.ctx.connection().map(|c| Attr::Connection(&c.handle)));
    let span = telemetry::server(name, &parent, received, &attrs);
    span.child_done(
        Name::Static("gatehouse.connection_context"),
        received,
        context_done,
        &[Attr::DbSystem("postgresql")],
    );
    span
}

/// Names the worker that answered, so operators and tests can see the balancing.
pub async fn tag_worker(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    if let Ok(value) = HeaderValue::from_str(&state.settings.worker_id) {
        response.headers_mut().insert("gatehouse-worker", value);
    }
    response
}
