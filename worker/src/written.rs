//! Results written once: a typed tool output is serialized to JSON text one time, and that text
//! is both the result's `structuredContent` and its text block (R16).
//!
//! rmcp's `CallToolResult` holds `structuredContent` as a `serde_json::Value`. Through it, a
//! result is built as a `Value` (a map and a string per field), written as text for the text
//! block, and written again by rmcp into the response: for a page of bookings that was about a
//! third of a worker's CPU per call (docs/profile-read-path.md). Here the tool layer gives rmcp a
//! result whose two places hold markers and keeps the text in the request's [`WrittenOnce`];
//! the entry point, which holds the response rmcp wrote, puts the text in both places: as it is
//! where `structuredContent` goes, as a JSON string where the text goes. Everything else of the
//! exchange (the envelope, the id, the status, the headers) is rmcp's, unchanged.
//!
//! The markers hold a random value drawn when the worker starts: no output can spell one by
//! chance, and one that a third party wrote into a record would sit in the text that replaces
//! the markers, never be taken for them (the markers are found in rmcp's response before
//! anything is put in).
//!
//! Only a JSON answer is written this way: a call that asked for progress may be answered as an
//! event stream, so the tool layer keeps its result a `Value` ([`WrittenOnce::offered`]).

use std::sync::{Arc, LazyLock, Mutex};

use axum::body::Bytes;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::Value;

struct Markers {
    structured: String,
    text: String,
}

static MARKERS: LazyLock<Markers> = LazyLock::new(|| {
    let kind = shared::secret::CredentialKind::Mcp;
    let drawn = shared::secret::generate(kind);
    let nonce = &drawn[kind.prefix().len()..];
    Markers {
        structured: format!("gatehouse-written-once-{nonce}-structured"),
        text: format!("gatehouse-written-once-{nonce}-text"),
    }
});

/// The request's place for its result's text, offered by the entry point.
#[derive(Clone, Default)]
pub struct WrittenOnce(Arc<Mutex<Option<String>>>);

impl WrittenOnce {
    /// The place the entry point offered this call, when its answer will be one JSON body: a
    /// call with a progress token may stream, and a call that came another way (the conformance
    /// fixture) has no entry point to write it.
    pub fn offered(context: &RequestContext<RoleServer>) -> Option<WrittenOnce> {
        if context.meta.get_progress_token().is_some() {
            return None;
        }
        context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<WrittenOnce>())
            .cloned()
    }

    /// Keeps `json` (a tool's output as JSON text) for the entry point and gives rmcp the
    /// result with markers where it goes; an output that is not a JSON object is returned, to
    /// become a `Value` as before (rmcp treats those differently for older clients), as is one
    /// that cannot be kept.
    pub fn hold(&self, json: String) -> Result<CallToolResult, String> {
        if !json.starts_with('{') {
            return Err(json);
        }
        match self.0.lock() {
            Ok(mut slot) => *slot = Some(json),
            Err(_) => return Err(json),
        }
        // An object, as the output is: rmcp moves a structured result that is not an object
        // into the text for a client on an older protocol version.
        let mut marker = serde_json::Map::new();
        marker.insert(MARKERS.structured.clone(), Value::Bool(true));
        let mut result = CallToolResult::structured(Value::Object(marker));
        result.content = vec![ContentBlock::text(MARKERS.text.clone())];
        Ok(result)
    }

    fn take(&self) -> Option<String> {
        self.0.lock().ok().and_then(|mut slot| slot.take())
    }

    fn holds(&self) -> bool {
        self.0.lock().is_ok_and(|slot| slot.is_some())
    }

    /// The response with the held text in place of the markers. A JSON answer is written when
    /// it is returned (the call is over). An event stream (a call that sent something before
    /// its result) is written as it flows: the event that carries the markers gets the text the
    /// call held by then. What holds no markers passes as it is (nothing was held, or rmcp
    /// answered otherwise); markers that cannot be written are never sent: a JSON answer
    /// becomes a JSON-RPC internal error for the request's `id`, a stream ends.
    pub async fn write(&self, request: &[u8], response: Response) -> Response {
        if crate::entry::is_event_stream(&response) {
            let once = self.clone();
            let (parts, body) = response.into_parts();
            let stream = body.into_data_stream().map(move |chunk| {
                let chunk = chunk?;
                if !once.holds() || find(&chunk, MARKERS.text.as_bytes()).is_none() {
                    return Ok(chunk);
                }
                once.take().and_then(|json| splice(&chunk, &json)).ok_or_else(|| {
                    tracing::error!("a streamed result's markers could not be written");
                    axum::Error::new(std::io::Error::other("a result could not be written"))
                })
            });
            return Response::from_parts(parts, axum::body::Body::from_stream(stream));
        }
        let Some(json) = self.take() else { return response };
        let (mut parts, body) = response.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
            return internal_error(request);
        };
        match splice(&bytes, &json) {
            Some(spliced) => {
                parts.headers.remove(header::CONTENT_LENGTH);
                Response::from_parts(parts, axum::body::Body::from(spliced))
            }
            None if find(&bytes, MARKERS.text.as_bytes()).is_none()
                && find(&bytes, MARKERS.structured.as_bytes()).is_none() =>
            {
                Response::from_parts(parts, axum::body::Body::from(bytes))
            }
            None => {
                tracing::error!("a result's markers could not be written");
                internal_error(request)
            }
        }
    }
}

/// JSON-RPC's internal error for the request, in place of a result that could not be written.
fn internal_error(request: &[u8]) -> Response {
    let id = serde_json::from_slice::<Value>(request)
        .ok()
        .and_then(|r| r.get("id").cloned())
        .unwrap_or(Value::Null);
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": -32603,
            "message": "The server could not write this result. Send the very same request again: a silent write repeated within ten minutes is answered with its first result, never run twice.",
        },
    });
    (http::StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response()
}

/// `body` (rmcp's response, or one event of its stream) with `json` in place of the structured
/// marker (an object of one key) and `json` as a JSON string in place of the text marker. Each
/// marker is looked for in the result only (after `"result":`, which rmcp writes after the
/// request's `id`: an `id` spelling a marker is left alone) and must be there once.
fn splice(body: &[u8], json: &str) -> Option<Bytes> {
    let structured = format!("{{\"{}\":true}}", MARKERS.structured);
    let text = format!("\"{}\"", MARKERS.text);
    let result = find(body, b"\"result\":")?;
    let once = |marker: &[u8]| {
        let at = result + find(&body[result..], marker)?;
        find(&body[at + 1..], marker).is_none().then_some(at)
    };
    let at_structured = once(structured.as_bytes())?;
    let at_text = once(text.as_bytes())?;
    let mut as_string = Vec::with_capacity(json.len() + json.len() / 4 + 2);
    serde_json::to_writer(&mut as_string, json).ok()?;
    let mut places = [
        (at_structured, structured.len(), json.as_bytes()),
        (at_text, text.len(), as_string.as_slice()),
    ];
    places.sort_by_key(|(at, _, _)| *at);
    let mut out = Vec::with_capacity(body.len() + json.len() + as_string.len());
    let mut from = 0;
    for (at, len, with) in places {
        out.extend_from_slice(&body[from..at]);
        out.extend_from_slice(with);
        from = at + len;
    }
    out.extend_from_slice(&body[from..]);
    Some(Bytes::from(out))
}

/// Where `needle` first occurs in `haystack` (rmcp's response before splicing is a few hundred
/// bytes: the envelope and the two markers).
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{NumberOrString, ServerJsonRpcMessage, ServerResult};

    /// Fields in an order no sorted map keeps, text a JSON string must escape, and a record
    /// that spells both markers (as a third party could write into a note).
    #[derive(serde::Serialize)]
    struct Output {
        zeta: &'static str,
        booking: &'static str,
        quoted: &'static str,
        zone: &'static str,
        count: u32,
        planted: String,
        nested: Value,
    }

    fn output() -> Output {
        Output {
            zeta: "first",
            booking: "bkg_1",
            quoted: "she said \"ring twice\" \\ then\nleft\u{1}",
            zone: "Europe/Zürich ✓",
            count: 3,
            planted: MARKERS.text.clone(),
            nested: serde_json::json!({"structured": MARKERS.structured.clone(), "list": [1, null]}),
        }
    }

    /// rmcp's own response message for `result`, as it writes it.
    fn rmcp_body(result: CallToolResult, id: NumberOrString) -> Vec<u8> {
        let message = ServerJsonRpcMessage::response(ServerResult::CallToolResult(result), id);
        serde_json::to_vec(&message).expect("json")
    }

    fn json_response(body: Vec<u8>) -> Response {
        let mut response = Response::new(axum::body::Body::from(body.clone()));
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
        response.headers_mut().insert(header::CONTENT_LENGTH, http::HeaderValue::from(body.len()));
        response
    }

    async fn body_of(response: Response) -> String {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
        String::from_utf8(bytes.to_vec()).expect("utf-8")
    }

    /// What the entry point writes for a held result is what rmcp writes for the same result
    /// built as a `Value`, byte for byte, for a client on either protocol version.
    #[tokio::test]
    async fn a_result_written_once_is_the_result_rmcp_writes_from_a_value() {
        let json = serde_json::to_string(&output()).expect("json");
        let value = serde_json::to_value(output()).expect("value");
        let id = || NumberOrString::Number(7);
        let expected = rmcp_body(CallToolResult::structured(value), id());
        let once = WrittenOnce::default();
        let held = once.hold(json.clone()).expect("an object");
        let written = once.write(b"{}", json_response(rmcp_body(held, id()))).await;
        assert_eq!(written.headers().get(header::CONTENT_LENGTH), None, "its length changed");
        assert_eq!(body_of(written).await, String::from_utf8_lossy(&expected), "the same bytes");
        // What rmcp does for a client on an older protocol version leaves both markers.
        let mut legacy = ServerResult::CallToolResult(
            WrittenOnce::default().hold(json.clone()).expect("an object"),
        );
        legacy.strip_non_object_output_for_legacy_peer();
        let ServerResult::CallToolResult(legacy) = legacy else { unreachable!() };
        let written = splice(&rmcp_body(legacy, id()), &json).expect("both markers");
        assert_eq!(String::from_utf8_lossy(&written), String::from_utf8_lossy(&expected));
        // An output that is not an object is not held.
        assert_eq!(WrittenOnce::default().hold("[1]".into()).err().as_deref(), Some("[1]"));
    }

    /// A request `id` that spells the text marker stays the id: only the result is written.
    #[tokio::test]
    async fn an_id_spelling_a_marker_is_left_alone() {
        let json = serde_json::to_string(&output()).expect("json");
        let id = || NumberOrString::String(MARKERS.text.clone().into());
        let expected = rmcp_body(
            CallToolResult::structured(serde_json::to_value(output()).expect("value")),
            id(),
        );
        let once = WrittenOnce::default();
        let held = once.hold(json).expect("an object");
        let written = once.write(b"{}", json_response(rmcp_body(held, id()))).await;
        assert_eq!(body_of(written).await, String::from_utf8_lossy(&expected));
    }

    /// Nothing held, or an answer without markers (rmcp answered otherwise): passed as it is.
    /// Markers that cannot be written are never sent: the request's id gets JSON-RPC's
    /// internal error.
    #[tokio::test]
    async fn markers_are_written_or_never_sent() {
        let plain = rmcp_body(
            CallToolResult::structured(serde_json::json!({"a": 1})),
            NumberOrString::Number(1),
        );
        let nothing = WrittenOnce::default().write(b"{}", json_response(plain.clone())).await;
        assert_eq!(body_of(nothing).await, String::from_utf8_lossy(&plain));
        let once = WrittenOnce::default();
        once.hold("{\"b\":2}".into()).expect("held");
        let otherwise = once.write(b"{}", json_response(plain.clone())).await;
        assert_eq!(body_of(otherwise).await, String::from_utf8_lossy(&plain));
        // One marker only (the other lost): an error for the request, no marker in it.
        let once = WrittenOnce::default();
        let mut held = once.hold("{\"b\":2}".into()).expect("held");
        held.content.clear();
        let half = rmcp_body(held, NumberOrString::Number(9));
        let refused = once.write(br#"{"jsonrpc":"2.0","id":9}"#, json_response(half)).await;
        assert_eq!(refused.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
        let body: Value = serde_json::from_str(&body_of(refused).await).expect("json");
        assert_eq!(body["id"], 9, "{body}");
        assert_eq!(body["error"]["code"], -32603, "{body}");
        assert!(!body.to_string().contains("written-once"), "{body}");
    }

    /// A call that sent something before its result is answered as an event stream: the event
    /// carrying the markers is written with the text held by the time it flows (after the
    /// entry point had the response); the events before it pass as they are.
    #[tokio::test]
    async fn a_streamed_result_is_written_as_it_flows() {
        let json = serde_json::to_string(&output()).expect("json");
        let id = || NumberOrString::Number(3);
        let once = WrittenOnce::default();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<Bytes, std::io::Error>>();
        let stream = tokio_stream_of(rx);
        let mut response = Response::new(axum::body::Body::from_stream(stream));
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, http::HeaderValue::from_static("text/event-stream"));
        let written = once.write(b"{}", response).await;
        let progress = Bytes::from_static(b"data: {\"method\":\"notifications/progress\"}\n\n");
        tx.send(Ok(progress.clone())).expect("send");
        let held = once.hold(json.clone()).expect("an object");
        let mut event = b"data: ".to_vec();
        event.extend(rmcp_body(held, id()));
        event.extend(b"\n\n");
        tx.send(Ok(Bytes::from(event))).expect("send");
        drop(tx);
        let mut expected = String::from_utf8_lossy(&progress).into_owned();
        expected.push_str("data: ");
        expected.push_str(&String::from_utf8_lossy(&rmcp_body(
            CallToolResult::structured(serde_json::to_value(output()).expect("value")),
            id(),
        )));
        expected.push_str("\n\n");
        assert_eq!(body_of(written).await, expected);
    }

    fn tokio_stream_of(
        mut rx: tokio::sync::mpsc::UnboundedReceiver<Result<Bytes, std::io::Error>>,
    ) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
