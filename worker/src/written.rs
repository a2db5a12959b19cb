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
    /// become a `Value` as before (rmcp treats those differently for older clients).
    pub fn hold(&self, json: String) -> Result<CallToolResult, String> {
        if !json.starts_with('{') {
            return Err(json);
        }
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(json);
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

    /// The response with the held text in place of the markers; the response as it is when
    /// nothing was held. A held text whose response is not the JSON body it was written for
    /// (which [`WrittenOnce::offered`] rules out) is answered as an internal error rather than
    /// sent with markers in it.
    pub async fn write(&self, response: Response) -> Response {
        let Some(json) = self.take() else { return response };
        let is_json = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        let (mut parts, body) = response.into_parts();
        let spliced = if is_json {
            match axum::body::to_bytes(body, usize::MAX).await {
                Ok(bytes) => splice(&bytes, &json),
                Err(_) => None,
            }
        } else {
            None
        };
        let Some(spliced) = spliced else {
            tracing::error!("a result written once met a response it was not written for");
            let body = serde_json::json!({
                "error": "internal",
                "error_description": "The server could not write this result. Send the very same request again: a silent write repeated within ten minutes is answered with its first result, never run twice.",
            });
            return (http::StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response();
        };
        parts.headers.remove(header::CONTENT_LENGTH);
        Response::from_parts(parts, axum::body::Body::from(spliced))
    }
}

/// `body` (rmcp's response, holding each marker once) with `json` in place of the structured
/// marker (an object of one key) and `json` as a JSON string in place of the text marker.
fn splice(body: &[u8], json: &str) -> Option<Bytes> {
    let structured = format!("{{\"{}\":true}}", MARKERS.structured);
    let text = format!("\"{}\"", MARKERS.text);
    let at_structured = find(body, structured.as_bytes())?;
    let at_text = find(body, text.as_bytes())?;
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

    /// What rmcp writes for the held result, spliced, is what it writes for the same result
    /// built as a `Value`: byte for byte, text with quotes, backslashes, control and non-ASCII
    /// characters, and a marker's own spelling inside the output included.
    #[test]
    fn a_result_written_once_is_the_result_rmcp_writes_from_a_value() {
        let output = serde_json::json!({
            "booking": "bkg_1",
            "quoted": "she said \"ring twice\" \\ then\nleft\u{1}",
            "zone": "Europe/Zürich ✓",
            "count": 3,
            "planted": MARKERS.text.clone(),
            "nested": {"structured": MARKERS.structured.clone(), "list": [1, null, true]},
        });
        let json = serde_json::to_string(&output).expect("json");
        let envelope = |result: CallToolResult| {
            serde_json::to_vec(&serde_json::json!({"jsonrpc": "2.0", "id": 7, "result": result}))
                .expect("json")
        };
        let expected = envelope(CallToolResult::structured(output));
        let held = WrittenOnce::default().hold(json.clone()).expect("an object");
        let written = splice(&envelope(held), &json).expect("both markers");
        assert_eq!(
            String::from_utf8_lossy(&written),
            String::from_utf8_lossy(&expected),
            "the same bytes"
        );
        // What rmcp does for a client on an older protocol version leaves both markers.
        let mut legacy = rmcp::model::ServerResult::CallToolResult(
            WrittenOnce::default().hold(json.clone()).expect("an object"),
        );
        legacy.strip_non_object_output_for_legacy_peer();
        let rmcp::model::ServerResult::CallToolResult(legacy) = legacy else { unreachable!() };
        let written = splice(&envelope(legacy), &json).expect("both markers");
        assert_eq!(String::from_utf8_lossy(&written), String::from_utf8_lossy(&expected));
        // An output that is not an object is not held.
        assert_eq!(WrittenOnce::default().hold("[1]".into()).err().as_deref(), Some("[1]"));
        // A body without the markers is not spliced.
        let plain = envelope(CallToolResult::structured(serde_json::json!({"a": 1})));
        assert!(splice(&plain, &json).is_none());
    }
}
