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
use shared::error::{ActionRefusal, Error, Resource};

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
    /// With `unknown_field`: every field the tool takes (possibly none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub right: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The handle of the record a create would duplicate (R9).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub existing: Option<String>,
    /// The object's current version and state after a version conflict (R10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<Value>,
    /// What a batch filter matched when the count differed (R11).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matches: Option<Vec<String>>,
    /// With `count_mismatch`: how many records the filter really matches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
    /// A fresh preview when the action changed since the last one (R7).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preview: Option<Value>,
    /// With `rate_limited`: the effect class, its limit per minute, and when to retry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u32>,
    /// With `not_in_toolset`: this connection's toolset and the toolsets that have the tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub toolset: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_in: Option<Vec<String>>,
}

/// Whether an argument name tries to pick a tenant (R3): those get told why they never can.
fn looks_like_a_tenant(field: &str) -> bool {
    let f = field.to_ascii_lowercase();
    ["tenant", "workspace", "org", "account", "company"].iter().any(|w| f.contains(w))
}

fn find_tool(resource: Resource) -> Option<&'static str> {
    match resource {
        Resource::Customer => Some("find_customers"),
        Resource::Booking => Some("find_bookings"),
        Resource::Technician => Some("find_technicians"),
        Resource::Service => Some("find_services"),
        Resource::AlertRule => Some("find_alert_rules"),
        _ => None,
    }
}

fn update_tool(resource: Resource) -> &'static str {
    match resource {
        Resource::Booking => "update_booking",
        _ => "update_customer",
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
            allowed: None,
            right: None,
            request_id: None,
            existing: None,
            current_version: None,
            current: None,
            matches: None,
            count: None,
            preview: None,
            class: None,
            limit: None,
            retry_after_secs: None,
            toolset: None,
            available_in: None,
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
                        "Remove {} and call {tool} again with only: {}.{}",
                        if unknown.len() == 1 { "it" } else { "them" },
                        if allowed.is_empty() {
                            "no arguments".to_owned()
                        } else {
                            allowed.join(", ")
                        },
                        if unknown.iter().any(|u| looks_like_a_tenant(u)) {
                            " The tenant is fixed by this connection and is never an argument."
                        } else {
                            ""
                        }
                    ),
                );
                body.unknown = unknown.clone();
                body.allowed = Some(allowed.clone());
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
            Error::Conflict { resource, handle, expected, current_version, current } => {
                let mut body = ErrorBody::new(
                    error.code(),
                    format!(
                        "The {} {handle} changed since version {expected}; nothing was written.",
                        resource.noun()
                    ),
                    format!(
                        "Look at its current state below; if your change still makes sense, call {tool} again with version {current_version}."
                    ),
                );
                body.next_tool = Some(tool.to_owned());
                body.current_version = Some(current_version.clone());
                body.current = Some((**current).clone());
                body
            }
            Error::Duplicate { resource, existing, key } => {
                let update = update_tool(*resource);
                let create = format!("create_{}", resource.noun());
                let noun = resource.noun();
                // A create can be told the record is meant to be separate; an update cannot
                // give another record's key to this one.
                let mut body = if tool.starts_with("create_") {
                    ErrorBody::new(
                        error.code(),
                        format!(
                            "A {noun} with the same {key} exists already: {existing}. Nothing was created."
                        ),
                        format!(
                            "Use {existing}; change it with {update} if needed. Only if this really is a different {noun}, call {create} again with separate: true and a reason."
                        ),
                    )
                } else {
                    ErrorBody::new(
                        error.code(),
                        format!(
                            "Another {noun} has this {key} already: {existing}. Nothing was changed."
                        ),
                        format!(
                            "Call {tool} again with a {key} no other {noun} has, or work with {existing}."
                        ),
                    )
                };
                body.existing = Some(existing.clone());
                body.next_tool = Some(update.to_owned());
                body
            }
            Error::CountMismatch { expected, count, matches } => {
                let listed = if matches.len() < *count {
                    format!(" The first {} are listed.", matches.len())
                } else {
                    String::new()
                };
                let mut body = ErrorBody::new(
                    error.code(),
                    format!(
                        "The filter matches {count} booking(s), not the expected {expected}. Nothing was changed.{listed}"
                    ),
                    format!(
                        "Check the matches listed here. If all {count} should be cancelled, call {tool} again with expected_count: {count}; otherwise narrow the filter or pass booking handles."
                    ),
                );
                body.count = Some(*count);
                body.matches = Some(matches.clone());
                body.next_tool = Some(tool.to_owned());
                body
            }
            Error::ActionRefused { reason, message } => {
                let fix = match reason {
                    ActionRefusal::SummaryMismatch => "Call confirm_action again with confirm_summary copied exactly from the preview.".to_owned(),
                    ActionRefusal::Used | ActionRefusal::Rejected => "Nothing more happened. Check list_recent_changes; prepare a new action if one is still needed.".to_owned(),
                    ActionRefusal::AlreadyExecuted => "It took effect once already: do not prepare it again. list_recent_changes shows what it changed.".to_owned(),
                    ActionRefusal::AwaitingApproval => "A person decides in the console; call confirm_action again later to learn the outcome. Do not prepare it again.".to_owned(),
                    ActionRefusal::Denied => "Tell the user it was denied and why; do not prepare it again unless they ask.".to_owned(),
                    _ => "Prepare the action again with its tool; the preview gives a new token.".to_owned(),
                };
                let said = if *reason == ActionRefusal::AlreadyExecuted {
                    format!("This call executed nothing new: {message}.")
                } else {
                    format!("Nothing was executed: {message}.")
                };
                let mut body = ErrorBody::new(error.code(), said, fix);
                if matches!(reason, ActionRefusal::Used | ActionRefusal::AlreadyExecuted) {
                    body.next_tool = Some("list_recent_changes".into());
                }
                body
            }
            Error::ChangedSincePreview { preview } => {
                let mut body = ErrorBody::new(
                    error.code(),
                    "What this action would do changed since its preview (the records it touches changed). Nothing was executed and the old confirm_token no longer works.".into(),
                    "Show the new confirm_summary to the user; if they agree, call confirm_action with the new confirm_token and confirm_summary from `preview`.".into(),
                );
                body.next_tool = Some("confirm_action".into());
                body.preview = Some((**preview).clone());
                body
            }
            Error::RateLimited { class, limit, retry_after_secs } => {
                let mut body = ErrorBody::new(
                    error.code(),
                    if *class == "read" {
                        // Reads are counted by each worker (no shared write on the read path).
                        format!(
                            "This connection used up its read allowance of {limit} calls per minute on this server. Nothing was done."
                        )
                    } else {
                        format!(
                            "This connection used up its {class} allowance of {limit} calls per minute. Nothing was done."
                        )
                    },
                    format!(
                        "Retry {tool} in {retry_after_secs} seconds; a tenant admin can raise the limit if this is normal work."
                    ),
                );
                body.class = Some((*class).to_owned());
                body.limit = Some(*limit);
                body.retry_after_secs = Some(*retry_after_secs);
                body
            }
            // Decisions are people's, in the console; an agent's call never makes one.
            Error::PasskeyRequired { .. } => ErrorBody::new(
                error.code(),
                error.to_string(),
                "Tell the user: a person decides this in the Gatehouse console with their passkey.".to_owned(),
            ),
            Error::PolicyRefused { policy, reason, approval } => ErrorBody::new(
                error.code(),
                if *approval {
                    format!("The tenant's policy `{policy}` sends such calls to a person ({reason}), and this one cannot wait for one. Nothing was done.")
                } else {
                    format!("The tenant's policy `{policy}` refuses this call: {reason}. Nothing was done.")
                },
                "Do not retry the same call; tell the user which policy refused it. A tenant admin reads and changes the policies in the console (Policies) or with `gatehousectl policy show`.".to_owned(),
            ),
            Error::TurnedOff { tool, class } => ErrorBody::new(
                error.code(),
                format!("A tenant admin turned {class} actions off for agents, so {tool} prepares nothing here."),
                "Tell the user: a person can do this in the product itself, or a tenant admin can change the approval policy (console: Agent access).".to_owned(),
            ),
            Error::NotInToolset { tool, toolset, available_in } => {
                let mut body = ErrorBody::new(
                    error.code(),
                    format!("{tool} is not in this connection's toolset `{toolset}`."),
                    format!(
                        "Use the tools tools/list shows for this connection; {tool} is in the toolset(s) {}, which a tenant admin can give a connection.",
                        available_in.join(", ")
                    ),
                );
                body.toolset = Some(toolset.clone());
                body.available_in = Some(available_in.clone());
                body
            }
            Error::WrongState { message, use_instead } => {
                let fix = match use_instead {
                    Some(t) => format!("Use {t} instead."),
                    None => {
                        "Check the object's current state with the matching get_ or find_ tool."
                            .into()
                    }
                };
                let mut body =
                    ErrorBody::new(error.code(), format!("{message}. Nothing was changed."), fix);
                body.next_tool = use_instead.map(str::to_owned);
                body
            }
            Error::Unauthenticated(message) => ErrorBody::new(
                error.code(),
                message.clone(),
                "Reconnect with a valid connection token.".into(),
            ),
            Error::Unavailable { cause } => {
                let mut body = ErrorBody::new(
                    error.code(),
                    format!("The database could not serve this call for a moment ({cause})."),
                    format!(
                        "Retry the very same call, with the same arguments, in {} seconds: if the connection broke while it committed it may have taken effect, and a silent write repeated within ten minutes is then answered with its first result (replayed), a confirmation with token_used. Do not change the arguments or prepare the action again.",
                        shared::error::UNAVAILABLE_RETRY_AFTER_SECS
                    ),
                );
                body.retry_after_secs = Some(shared::error::UNAVAILABLE_RETRY_AFTER_SECS);
                body.request_id = Some(request_id.to_owned());
                body
            }
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
                    "code": {"type": "string", "enum": [
                        "not_found", "invalid_argument", "unknown_field", "permission_denied", "conflict",
                        "duplicate", "count_mismatch", "changed_since_preview", "wrong_state",
                        "unknown_token", "token_used", "action_rejected", "token_expired", "foreign_token",
                        "summary_mismatch", "awaiting_approval", "action_denied", "turned_off_by_policy", "forbidden_by_policy",
                        "rate_limited", "not_in_toolset", "unauthenticated", "internal"]},
                    "message": {"type": "string"},
                    "fix": {"type": "string"},
                    "next_tool": {"type": "string"},
                    "field": {"type": "string"},
                    "options": {"type": "array", "items": {"type": "string"}},
                    "unknown": {"type": "array", "items": {"type": "string"}},
                    "allowed": {"type": "array", "items": {"type": "string"}},
                    "right": {"type": "string"},
                    "request_id": {"type": "string"},
                    "existing": {"type": "string"},
                    "current_version": {"type": "string"},
                    "current": {"type": "object"},
                    "matches": {"type": "array", "items": {"type": "string"}},
                    "count": {"type": "integer", "minimum": 0},
                    "preview": {"type": "object"},
                    "class": {"type": "string"},
                    "limit": {"type": "integer"},
                    "retry_after_secs": {"type": "integer"},
                    "toolset": {"type": "string"},
                    "available_in": {"type": "array", "items": {"type": "string"}}
                },
                "additionalProperties": false
            }
        },
        "additionalProperties": false
    })
}

/// Drops schemars' numeric `format`s (`uint`, `int64`, …): they are not JSON Schema formats,
/// and validating clients warn about every one of them.
pub fn strip_numeric_formats(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.get("format").and_then(Value::as_str).is_some_and(|f| {
                f.starts_with("int") || f.starts_with("uint") || f == "float" || f == "double"
            }) {
                map.remove("format");
            }
            map.values_mut().for_each(strip_numeric_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_numeric_formats),
        _ => {}
    }
}

/// Rewrites a schema for strict clients (OpenAI strict mode, Gemini function declarations, the
/// Inspector's `--strict` check): a `type` array such as `["string", "null"]` becomes `anyOf`
/// branches of one type each, the keywords that constrain the value moving into its non-null
/// branch; what it accepts does not change.
pub fn portable(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.values_mut().for_each(portable);
            let types = match map.get("type") {
                Some(Value::Array(types)) if !map.contains_key("anyOf") => types.clone(),
                _ => return,
            };
            map.remove("type");
            // What describes the property stays on it; what constrains the value goes with
            // each typed branch.
            let kept = ["description", "title", "default", "examples", "deprecated"];
            let constraints: Map<String, Value> = map
                .iter()
                .filter(|(k, _)| !kept.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            map.retain(|k, _| kept.contains(&k.as_str()));
            let branches: Vec<Value> = types
                .into_iter()
                .map(|t| {
                    if t == "null" {
                        json!({"type": "null"})
                    } else {
                        let mut branch = constraints.clone();
                        branch.insert("type".into(), t);
                        Value::Object(branch)
                    }
                })
                .collect();
            map.insert("anyOf".into(), Value::Array(branches));
        }
        Value::Array(items) => items.iter_mut().for_each(portable),
        _ => {}
    }
}

/// An output schema covering the success type and the error shape.
pub fn output_schema(success: schemars::Schema) -> Map<String, Value> {
    let mut success = success.to_value();
    strip_numeric_formats(&mut success);
    portable(&mut success);
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
