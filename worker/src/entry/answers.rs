//! The entry point's own answers: refusals before any tool runs (401 with its challenge,
//! 403 naming the scope to ask for, 503 with Retry-After), in one place.

use super::*;

/// A request refused before it reached the tools (no or a bad token, a switch, no database):
/// counted by reason, and a span with the outcome under the client's trace from its headers.
pub(super) fn refused(
    state: &AppState,
    received: Option<std::time::SystemTime>,
    headers: &http::HeaderMap,
    outcome: &'static str,
) {
    if let Some(reason) = crate::metrics::refusal_reason(outcome) {
        state.metrics.refusals.with_label_values(&[reason]).inc();
    }
    if let Some(received) = received {
        let parent = telemetry::remote_parent(None, Some(headers));
        let span = telemetry::server(Name::Static("mcp.request"), &parent, received, &[]);
        span.fail(&[Attr::Outcome(outcome), Attr::ErrorType(outcome)]);
    }
}

/// HTTP 403 with the scope challenge of RFC 6750 §3.1 as MCP uses it: the scope to ask for is
/// what the connection holds now plus the right the tool needs.
pub(super) fn insufficient_scope(
    state: &AppState,
    holds: RightSet,
    right: shared::rights::Right,
) -> Response {
    let scope = holds.union(RightSet::of(&[right])).names().join(" ");
    let description = format!(
        "This tool needs the right {} ({}), which this connection was not granted; ask the person to approve it.",
        right.as_str(),
        right.description()
    );
    let challenge = format!(
        "Bearer error=\"insufficient_scope\", scope=\"{scope}\", resource_metadata=\"{}\", error_description=\"{}\"",
        state.settings.resource_metadata_url(),
        header_safe(&description),
    );
    let body = serde_json::json!({
        "error": "insufficient_scope",
        "error_description": description,
        "scope": scope,
    });
    let mut response = (StatusCode::FORBIDDEN, Json(body)).into_response();
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// An SSE response (progress, long tools) keeps streaming after the handler returned its
/// headers; a revocation pushed meanwhile ends the stream, which also cancels the call.
pub(super) fn end_stream_on_revocation(
    response: Response,
    inflight: crate::live::InFlight,
) -> Response {
    if !is_event_stream(&response) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let (flag, waker) = crate::listen::WokenFlag::new();
    let revoked = Box::pin(inflight.token.clone().cancelled_owned());
    let stream = UntilRevoked {
        body: body.into_data_stream(),
        revoked,
        flag,
        waker,
        _inflight: inflight,
        ended: false,
    };
    Response::from_parts(parts, axum::body::Body::from_stream(stream))
}

/// An SSE body that ends when its call's token is cancelled (a revocation). The token is looked
/// at only when it woke: a listen stream's body is polled once or twice for each event it is
/// told, ten thousand streams at once after a switch, and looking at a token locks it.
struct UntilRevoked {
    body: axum::body::BodyDataStream,
    revoked: std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    flag: Arc<crate::listen::WokenFlag>,
    waker: std::task::Waker,
    /// The call's registration lives as long as its stream.
    _inflight: crate::live::InFlight,
    ended: bool,
}

impl futures_util::Stream for UntilRevoked {
    type Item = Result<axum::body::Bytes, axum::Error>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return std::task::Poll::Ready(None);
        }
        this.flag.register(cx);
        if this.flag.take() {
            let mut own = std::task::Context::from_waker(&this.waker);
            if this.revoked.as_mut().poll(&mut own).is_ready() {
                this.ended = true;
                return std::task::Poll::Ready(None);
            }
        }
        std::pin::Pin::new(&mut this.body).poll_next(cx)
    }
}

pub(super) fn finish(state: &AppState, response: Response) -> Response {
    state.metrics.http_requests.with_label_values(&[response.status().as_str()]).inc();
    response
}

pub(super) fn unauthorized(state: &AppState, failure: &AuthFailure) -> Response {
    let description = failure.message(CredentialKind::Mcp);
    // A request that carried no credential gets the challenge without an error code
    // (RFC 6750 §3.1); one that carried a bad one is told `invalid_token`.
    // The scope a client should ask for when it knows nothing yet: the read rights. Clients
    // that take their scope from the challenge (the TypeScript SDK does) then ask for least
    // privilege, not for every right the metadata lists; the person can tick more.
    let scope = shared::rights::read_only().names().join(" ");
    let (challenge, body) = if *failure == AuthFailure::Missing {
        (
            format!(
                "Bearer resource_metadata=\"{}\", scope=\"{scope}\"",
                state.settings.resource_metadata_url()
            ),
            serde_json::json!({"error_description": description}),
        )
    } else {
        (
            format!(
                "Bearer resource_metadata=\"{}\", scope=\"{scope}\", error=\"invalid_token\", error_description=\"{}\"",
                state.settings.resource_metadata_url(),
                header_safe(&description),
            ),
            serde_json::json!({"error": "invalid_token", "error_description": description}),
        )
    };
    let mut response = (StatusCode::UNAUTHORIZED, Json(body)).into_response();
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// Header values are ASCII: drop quotes and spell the ellipsis out.
pub(super) fn header_safe(text: &str) -> String {
    text.replace('…', "...")
        .replace('"', "'")
        .chars()
        .filter(|c| c.is_ascii() && !c.is_ascii_control())
        .collect()
}

pub(crate) fn is_event_stream(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// The database could not serve the call: 503, `Retry-After`, the cause and what to do.
pub(super) fn unavailable_database(cause: &str) -> Response {
    let secs = shared::error::UNAVAILABLE_RETRY_AFTER_SECS;
    let body = serde_json::json!({
        "error": "unavailable",
        "error_description": format!(
            "The database could not serve this call ({cause}). Retry the very same request in {secs} seconds, with the same arguments: if the connection broke while it committed it may have taken effect, and a silent write repeated within ten minutes is answered with its first result (replayed), a confirmation with token_used; neither runs twice."
        ),
    });
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    response
}

pub(super) fn unavailable(message: &str) -> Response {
    let body = serde_json::json!({"error": "unavailable", "error_description": message});
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    response
}
