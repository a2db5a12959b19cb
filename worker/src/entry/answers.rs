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
/// headers; a revocation pushed meanwhile ends the stream, which also cancels the call. A listen
/// stream is ended by its own task, which the same revocation wakes: the stream ends with its
/// final result, as a listen stream ends (MCP 2026-07-28), and its client is told nothing
/// more meanwhile; a stream whose task has not ended it within [`LISTEN_END_GRACE`] is cut.
pub(super) fn end_stream_on_revocation(
    response: Response,
    inflight: crate::live::InFlight,
) -> Response {
    if !is_event_stream(&response) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let listen = parts.extensions.get::<super::ListenBody>().map(|l| l.0.clone());
    let (flag, waker) = crate::listen::WokenFlag::new();
    let revoked = Box::pin(inflight.token.clone().cancelled_owned());
    let stream = UntilRevoked {
        body: body.into_data_stream(),
        revoked,
        flag,
        waker,
        _inflight: inflight,
        listen,
        grace: None,
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
    /// A listen stream's response: its task ends it on a revocation.
    listen: Option<Arc<crate::listen::Direct>>,
    /// Revoked: how long a listen stream's task has left to end it.
    grace: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    ended: bool,
}

/// How long a revoked listen stream's task has to end it with its result before it is cut.
pub(super) const LISTEN_END_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

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
        if let Some(grace) = &mut this.grace {
            // Revoked: the task's final result (taken first when both are ready), or the cut
            // at the end of the grace.
            let polled = std::pin::Pin::new(&mut this.body).poll_next(cx);
            if polled.is_pending() && grace.as_mut().poll(cx).is_ready() {
                this.ended = true;
                return std::task::Poll::Ready(None);
            }
            return polled;
        }
        this.flag.register(cx);
        if this.flag.take() {
            let mut own = std::task::Context::from_waker(&this.waker);
            if this.revoked.as_mut().poll(&mut own).is_ready() {
                let Some(listen) = &this.listen else {
                    this.ended = true;
                    return std::task::Poll::Ready(None);
                };
                // Nothing more is told; the task, woken by the same token, ends the stream.
                listen.close();
                let mut grace = Box::pin(tokio::time::sleep(LISTEN_END_GRACE));
                if grace.as_mut().poll(cx).is_ready() {
                    this.ended = true;
                    return std::task::Poll::Ready(None);
                }
                this.grace = Some(grace);
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt as _;

    /// An SSE response whose chunks come from `rx`; it ends when `rx`'s sender is dropped.
    fn sse(rx: tokio::sync::mpsc::Receiver<&'static str>) -> Response {
        let body = futures_util::stream::unfold(rx, |mut rx| async move {
            let chunk = rx.recv().await?;
            Some((Ok::<_, std::io::Error>(axum::body::Bytes::from(chunk)), rx))
        });
        let mut response = Response::new(axum::body::Body::from_stream(body));
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        response
    }

    async fn next(body: &mut axum::body::BodyDataStream) -> Option<String> {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(5), body.next())
            .await
            .expect("the body answers")?;
        Some(String::from_utf8_lossy(&chunk.expect("chunk")).into_owned())
    }

    #[tokio::test]
    async fn a_revocation_cuts_an_sse_response_and_lets_a_listen_stream_end_with_its_result() {
        let live = Arc::new(crate::live::Live::default());

        // A progress stream: cut at the revocation, whatever its handler still sends.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let inflight = live.register("con_a");
        let token = inflight.token.clone();
        let mut body = end_stream_on_revocation(sse(rx), inflight).into_body().into_data_stream();
        tx.send("data: one\n\n").await.expect("send");
        assert_eq!(next(&mut body).await.as_deref(), Some("data: one\n\n"));
        token.cancel();
        tx.send("data: two\n\n").await.expect("send");
        assert_eq!(next(&mut body).await, None, "nothing after the revocation");

        // A listen stream: told nothing more, and its task's final result still goes out.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let inflight = live.register("con_b");
        let token = inflight.token.clone();
        let direct = Arc::new(crate::listen::Direct::default());
        let mut response = sse(rx);
        response.extensions_mut().insert(super::super::ListenBody(direct.clone()));
        let mut body = end_stream_on_revocation(response, inflight).into_body().into_data_stream();
        tx.send("data: ack\n\n").await.expect("send");
        assert_eq!(next(&mut body).await.as_deref(), Some("data: ack\n\n"));
        assert!(!direct.closed());
        token.cancel();
        tx.send("data: final\n\n").await.expect("send");
        drop(tx);
        assert_eq!(next(&mut body).await.as_deref(), Some("data: final\n\n"), "its result");
        assert!(direct.closed(), "the stream tells nothing more once revoked");
        assert_eq!(next(&mut body).await, None);

        // A listen stream whose task does not end it: cut when the grace runs out.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let inflight = live.register("con_c");
        let token = inflight.token.clone();
        let mut response = sse(rx);
        response
            .extensions_mut()
            .insert(super::super::ListenBody(Arc::new(crate::listen::Direct::default())));
        let mut body = end_stream_on_revocation(response, inflight).into_body().into_data_stream();
        tx.send("data: ack\n\n").await.expect("send");
        assert_eq!(next(&mut body).await.as_deref(), Some("data: ack\n\n"));
        token.cancel();
        let revoked_at = std::time::Instant::now();
        assert_eq!(next(&mut body).await, None, "cut");
        assert!(revoked_at.elapsed() >= LISTEN_END_GRACE, "after the grace");
        drop(tx);

        // Revoked while the client waits on an idle body: the revocation itself wakes it.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let inflight = live.register("con_d");
        let token = inflight.token.clone();
        let mut body = end_stream_on_revocation(sse(rx), inflight).into_body().into_data_stream();
        tx.send("data: one\n\n").await.expect("send");
        assert_eq!(next(&mut body).await.as_deref(), Some("data: one\n\n"));
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            token.cancel();
        });
        assert_eq!(next(&mut body).await, None, "woken and cut while idle");
        drop(tx);
    }
}
