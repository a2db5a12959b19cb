//! What a tool call returns (R15, R16): the one place a [`shared::Error`] becomes a tool
//! result.
//!
//! Success: `structuredContent` is the presenter output and the text block is the same JSON.
//! Failure: `isError: true`; the text starts with `Error:`, names the cause, the fix and the
//! tool to call next with real handles, and ends with one line of JSON that equals
//! `structuredContent`. Every tool's `outputSchema` covers both shapes.

use rmcp::model::{CallToolResult, ContentBlock};
use serde::Serialize;
use serde_json::{Map, Value, json};
use shared::error::{Error, Resource};

pub fn success(value: Value) -> CallToolResult {
    CallToolResult::structured(value)
}

/// The JSON detail of an error: `{"error": {...}}`.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub code: &'static str,
    pub message: String,
    pub fix: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_tool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unknown: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub right: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

fn find_tool(resource: Resource) -> Option<&'static str> {
    match resource {
        Resource::Customer => Some("find_customers"),
        Resource::Booking => Some("find_bookings"),
        Resource::Technician => Some("find_technicians"),
        _ => None,
    }
}

fn get_tool(resource: Resource) -> Option<&'static str> {
    match resource {
        Resource::Customer => Some("get_customer"),
        Resource::Booking => Some("get_booking"),
        _ => None,
    }
}

impl ErrorBody {
    fn new(code: &'static str, message: String, fix: String) -> Self {
        ErrorBody {
            code,
            message,
            fix,
            next_tool: None,
            field: None,
            options: Vec::new(),
            unknown: Vec::new(),
            allowed: Vec::new(),
            right: None,
            request_id: None,
        }
    }

    pub fn from_error(tool: &str, error: &Error, request_id: &str) -> Self {
        match error {
            Error::NotFound { resource, handle } => {
                let finder = find_tool(*resource);
                let fix = match finder {
                    Some(f) => format!(
                        "Look the {} up with {f} and use a handle from its results.",
                        resource.noun()
                    ),
                    None => format!("Check the {} handle.", resource.noun()),
                };
                let mut body = ErrorBody::new(
                    error.code(),
                    format!("No {} {handle} exists in this tenant.", resource.noun()),
                    fix,
                );
                body.next_tool = finder.map(str::to_owned);
                body
            }
            Error::Invalid { field, problem, options } => {
                let fix = if options.is_empty() {
                    format!("Correct `{field}` and call {tool} again.")
                } else {
                    format!(
                        "Call {tool} again with `{field}` set to one of: {}.",
                        options.join(", ")
                    )
                };
                let mut body =
                    ErrorBody::new(error.code(), format!("Invalid `{field}`: {problem}."), fix);
                body.field = Some(field.clone());
                body.options = options.clone();
                body.next_tool = Some(tool.to_owned());
                body
            }
            Error::UnknownFields { unknown, allowed } => {
                let mut body = ErrorBody::new(
                    error.code(),
                    format!(
                        "{tool} does not take {}.",
                        unknown.iter().map(|u| format!("`{u}`")).collect::<Vec<_>>().join(", ")
                    ),
                    format!(
                        "Remove them and call {tool} again with only: {}. The tenant is fixed by this connection and is never an argument.",
                        if allowed.is_empty() {
                            "no arguments".to_owned()
                        } else {
                            allowed.join(", ")
                        }
                    ),
                );
                body.unknown = unknown.clone();
                body.allowed = allowed.clone();
                body.next_tool = Some(tool.to_owned());
                body
            }
            Error::Forbidden { right } => {
                let mut body = ErrorBody::new(
                    error.code(),
                    format!("This connection lacks the right `{}` ({}).", right.as_str(), right.description()),
                    "Ask a tenant admin to grant it; a connection never holds more than its creator's current role allows.".into(),
                );
                body.right = Some(right.as_str().to_owned());
                body
            }
            Error::NoActor => ErrorBody::new(
                error.code(),
                "No person is bound to this request.".into(),
                "Reconnect with a valid connection token.".into(),
            ),
            Error::Conflict { resource, handle, expected, current } => {
                let mut body = ErrorBody::new(
                    error.code(),
                    format!(
                        "The {} {handle} changed since version {expected}; it is now {current}.",
                        resource.noun()
                    ),
                    format!(
                        "Read it again and retry with version {current} if the change still makes sense."
                    ),
                );
                body.next_tool = get_tool(*resource).map(str::to_owned);
                body
            }
            Error::Unauthenticated(message) => ErrorBody::new(
                error.code(),
                message.clone(),
                "Reconnect with a valid connection token.".into(),
            ),
            Error::Internal(_) => {
                let mut body = ErrorBody::new(
                    error.code(),
                    "Gatehouse could not complete this call.".into(),
                    "Retry in a moment; if it keeps failing, give the request id to an operator."
                        .into(),
                );
                body.request_id = Some(request_id.to_owned());
                body
            }
        }
    }
}

/// A tool error result: text `Error: …` ending with one JSON line equal to `structuredContent`.
pub fn failure(body: ErrorBody) -> CallToolResult {
    let structured = json!({ "error": body });
    let text = format!(
        "Error: {} {}\n{}",
        body_message(&structured),
        body_fix(&structured),
        serde_json::to_string(&structured).unwrap_or_default()
    );
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    result.structured_content = Some(structured);
    result
}

fn body_message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or_default()
}

fn body_fix(v: &Value) -> &str {
    v["error"]["fix"].as_str().unwrap_or_default()
}

/// The schema of every error's `structuredContent`.
pub fn error_schema() -> Value {
    json!({
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "fix"],
                "properties": {
                    "code": {"type": "string", "enum": ["not_found", "invalid_argument", "unknown_field", "permission_denied", "conflict", "unauthenticated", "internal"]},
                    "message": {"type": "string"},
                    "fix": {"type": "string"},
                    "next_tool": {"type": "string"},
                    "field": {"type": "string"},
                    "options": {"type": "array", "items": {"type": "string"}},
                    "unknown": {"type": "array", "items": {"type": "string"}},
                    "allowed": {"type": "array", "items": {"type": "string"}},
                    "right": {"type": "string"},
                    "request_id": {"type": "string"}
                },
                "additionalProperties": false
            }
        },
        "additionalProperties": false
    })
}

/// An output schema covering the success type and the error shape.
pub fn output_schema(success: schemars::Schema) -> Map<String, Value> {
    let mut success = success.to_value();
    let defs = success.as_object_mut().and_then(|o| {
        o.remove("$schema");
        o.remove("title");
        o.remove("$defs")
    });
    let mut root = Map::new();
    root.insert("type".into(), json!("object"));
    root.insert("anyOf".into(), json!([success, error_schema()]));
    if let Some(defs) = defs {
        root.insert("$defs".into(), defs);
    }
    root
}
