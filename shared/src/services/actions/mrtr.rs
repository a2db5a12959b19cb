//! Multi round-trip confirmation (MCP 2026-07-28): the preview travels as a sealed
//! `requestState` and the retried call confirms it, through the same engine.

use super::*;

/// What a sealed `requestState` binds (MCP 2026-07-28 multi round-trip confirmation): the
/// connection, the tool, the digest of the request's arguments, the pending action and the
/// hash of exactly what it will do, and when it stops being answerable.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ConfirmState {
    pub connection: i64,
    pub tool: String,
    pub request_digest: String,
    pub action: String,
    pub content_hash: String,
    pub expires: i64,
}

/// The digest of a tool call's arguments as sent (canonical JSON, nulls dropped): what a
/// retry must repeat exactly.
pub fn request_digest(arguments: &Value) -> String {
    let kept = match arguments {
        Value::Object(map) => Value::Object(
            map.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect(),
        ),
        other => other.clone(),
    };
    sha256_hex(canonical_json(&kept).as_bytes())
}

/// The state to seal for a preview this connection just received: everything it binds is in
/// the preview the rail returned, so nothing is read again.
pub fn confirm_state(
    ctx: &OpCtx,
    preview: &Preview,
    request_digest: String,
) -> Result<ConfirmState> {
    // Only what the agent may confirm is sealed; an action a person approves never is.
    if preview.status != PreviewStatus::Preview || preview.content_hash.is_empty() {
        return Err(Error::Internal(format!("action {} cannot be sealed", preview.action)));
    }
    Ok(ConfirmState {
        connection: connection_id(ctx)?,
        tool: preview.tool.clone(),
        request_digest,
        action: preview.action.clone(),
        content_hash: preview.content_hash.clone(),
        expires: preview.expires_at,
    })
}

/// The person answered the elicitation of a sealed state: accepted executes once through the
/// same engine as `confirm_action`; declined rejects the pending action. The state must be
/// this connection's, for this tool and these exact arguments, unexpired, and its action must
/// still be the one sealed (content hash) and unused: single use is the pending action row.
pub async fn confirm_sealed(
    ds: &Services,
    ctx: &OpCtx,
    state: &ConfirmState,
    tool: &str,
    request_digest: &str,
    accept: bool,
    now: Timestamp,
) -> Result<Outcome> {
    let stale = |why: &str| {
        refused(
            ActionRefusal::Unknown,
            format!("requestState {why}; call the tool again without it for a new confirmation"),
        )
    };
    let mut tx = ds.begin().await?;
    let Some(p) = db::pending_lock_by_handle(&mut tx, ctx, &state.action).await? else {
        return Err(stale("names no action"));
    };
    // Every refusal of a state that names an action of this tenant is audited with it, as
    // confirm_action's are.
    let refusal = if Some(state.connection) != ctx.connection().map(|c| c.id) {
        Some(refused(
            ActionRefusal::OtherConnection,
            "this requestState belongs to another connection",
        ))
    } else if state.tool != tool || state.request_digest != request_digest {
        Some(stale(
            "was issued for another tool call (the tool and its arguments must be repeated exactly)",
        ))
    } else if state.expires <= now.as_second() {
        Some(refused(ActionRefusal::Expired, "the confirmation expired; call the tool again"))
    } else if p.connection_id != state.connection
        || p.content_hash != state.content_hash
        || p.completion != db::PendingCompletion::AgentConfirms
    {
        Some(stale("does not match its action"))
    } else {
        None
    };
    if let Some(error) = refusal {
        return Err(refuse(tx, ctx, &p.tool, p.id, error).await);
    }
    if let Some(error) = state_refusal(&p) {
        return Err(refuse(tx, ctx, &p.tool, p.id, error).await);
    }
    if !accept {
        db::pending_decide(&mut tx, ctx, p.id, db::PendingStatus::Rejected, None).await?;
        let action = format!("{}.reject", p.tool);
        let entry = AuditEntry {
            action: &action,
            outcome: "rejected",
            targets: Vec::new(),
            pending_action: Some(p.id),
            reason: Some("declined in the client"),
            change: None,
            policy: None,
            call_facts: None,
        };
        db::audit_insert(&mut tx, ctx, entry).await?;
        tx.commit().await?;
        return Ok(Outcome::Rejected(Rejected::new(p.handle, p.tool)));
    }
    execute(ds, tx, ctx, p, now).await.map(Outcome::Executed)
}
