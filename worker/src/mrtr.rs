//! Multi round-trip confirmation (MCP 2026-07-28, R7): a two-step tool called by a client that
//! declared form elicitation answers `input_required` instead of a PREVIEW. The elicitation
//! shows the server-written summary; the `requestState` is sealed (AEAD, key id from the
//! configuration) and binds the connection, the tool, the digest of the arguments, the pending
//! action and the hash of what it will do, and its expiry. The client's retry with the
//! person's answer executes once (accept) or rejects the pending action (decline, cancel),
//! through the same engine as `confirm_action`. Single use is the pending action row.
//!
//! Clients that declare no elicitation, legacy clients, workers without a key, and actions a
//! person must approve in the console keep PREVIEW + `confirm_action`.

use std::collections::BTreeMap;

use rmcp::model::{InputRequest, InputRequiredResult, InputResponses};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::{Value, json};
use shared::error::{ActionRefusal, Error};
use shared::services::actions::{self, ConfirmState};
use shared::services::outcome::{Outcome, Preview};

use crate::AppState;

/// What the workers' sealed states are for (bound into the seal).
const PURPOSE: &str = "gatehouse/mrtr-confirm/v1";

/// The key of the one input request a confirmation asks for.
pub const CONFIRM_INPUT: &str = "confirm";

/// Whether this request may be answered with an elicitation: a worker with a sealing key, a
/// 2026-07-28 request, and a client that declared form elicitation. Nothing is ever sent to a
/// client that did not declare it.
pub fn eligible(state: &AppState, context: &RequestContext<RoleServer>) -> bool {
    state.settings.mrtr_keys.is_some()
        && context.protocol_version().is_some_and(|v| v.as_str() >= "2026-07-28")
        && context
            .client_capabilities()
            .and_then(|c| c.elicitation)
            .is_some_and(|e| e.form.is_some() || e.url.is_none())
}

fn refused(message: &str) -> Error {
    Error::ActionRefused { reason: ActionRefusal::Unknown, message: message.to_owned() }
}

/// Turns a PREVIEW into an elicitation with a sealed state: the preview carries all the state
/// binds, so nothing is read again.
pub fn ask(
    state: &AppState,
    ctx: &shared::OpCtx,
    arguments: &Value,
    preview: &Preview,
) -> shared::Result<InputRequiredResult> {
    let keys = state.settings.mrtr_keys.as_ref().ok_or_else(|| refused("no sealing key"))?;
    let bound = actions::confirm_state(ctx, preview, actions::request_digest(arguments))?;
    let plain = serde_json::to_vec(&bound).map_err(|e| Error::Internal(e.to_string()))?;
    let sealed = keys.seal(PURPOSE, &plain).map_err(Error::Internal)?;
    let message = format!(
        "{}\n\nNothing has happened yet. Accept to do exactly this once; decline to drop it.",
        preview.confirm_summary
    );
    let request: InputRequest = serde_json::from_value(json!({
        "method": "elicitation/create",
        "params": {"mode": "form", "message": message, "requestedSchema": {"type": "object", "properties": {}}}
    }))
    .map_err(|e| Error::Internal(format!("elicitation: {e}")))?;
    Ok(InputRequiredResult::new(
        Some(BTreeMap::from([(CONFIRM_INPUT.to_owned(), request)])),
        Some(sealed),
    ))
}

/// The retry: opens the sealed state and acts on the person's answer.
pub async fn resume(
    state: &AppState,
    ctx: &shared::OpCtx,
    tool: &str,
    arguments: &Value,
    sealed: &str,
    responses: Option<&InputResponses>,
    now: jiff::Timestamp,
) -> shared::Result<Outcome> {
    let keys =
        state.settings.mrtr_keys.as_ref().ok_or_else(|| {
            refused("this server issued no requestState; call the tool without one")
        })?;
    let bound: ConfirmState = keys
        .open(PURPOSE, sealed)
        .and_then(|plain| serde_json::from_slice(&plain).ok())
        .ok_or_else(|| refused("requestState is not one this server issued, or it was changed; call the tool again without it"))?;
    let answer = responses.and_then(|r| r.get(CONFIRM_INPUT)).and_then(|a| a["action"].as_str());
    let accept = match answer {
        Some("accept") => true,
        Some("decline" | "cancel") => false,
        _ => {
            return Err(Error::invalid(
                "inputResponses",
                format!(
                    "answer the elicitation {CONFIRM_INPUT:?} with action accept, decline or cancel"
                ),
            ));
        }
    };
    actions::confirm_sealed(
        &state.ds,
        ctx,
        &bound,
        tool,
        &actions::request_digest(arguments),
        accept,
        now,
    )
    .await
}
