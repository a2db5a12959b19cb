//! Which decision a console form would make, asked by the page's script before it posts: the
//! answer names the decision as its service will, and starts a passkey ceremony made for it
//! when the tenant's policy (or the decision itself) wants one. This module reads the pages'
//! forms; no page imports it.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use shared::OpCtx;
use shared::error::Error;
use shared::rights::{RightSet, Role};
use shared::services::passkeys::{self, Decision};
use shared::services::{admin, approvals, id_jag, oauth, rates, sso};

use super::extract::{CsrfForm, Fields, Session};
use super::passkeys::refused;
use crate::AppState;

/// Which decision a console form would make, as its service will name it; `None` when it
/// narrows (or changes nothing) and needs no passkey.
async fn decision_of(
    state: &AppState,
    s: &Session,
    ctx: Option<&OpCtx>,
    path: &str,
    form: &Fields,
) -> Result<Option<Decision>, Error> {
    let ds = &state.ds;
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let need_ctx = || ctx.ok_or_else(|| Error::invalid("tenant", "pick a tenant first"));
    let to_on = form.get("to") == Some("on");
    Ok(match segments.as_slice() {
        ["approvals", action, "approve"] => {
            Some(approvals::decision_for(ds, need_ctx()?, action).await?)
        }
        ["approvals", _, "deny"] => None,
        ["connections"] => Some(admin::connection_decision(
            form.get("name").unwrap_or_default(),
            RightSet::parse(&form.all("right"))?,
            form.get("toolset").unwrap_or("full"),
            s.row.email(),
            super::connections::CONSOLE_CLIENT,
        )),
        ["connections", handle, "edit"] => {
            let current = admin::connection_get(ds, need_ctx()?, handle).await?;
            let edit = super::connections::edit_of(form, &current)?;
            admin::connection_edit_decision(&current, &edit)
        }
        ["api-tokens"] => {
            let days = form.get("expires_in_days").and_then(|d| d.trim().parse().ok()).unwrap_or(0);
            Some(Decision::create_api_token(form.get("name").unwrap_or_default(), days))
        }
        ["settings", "sso"] => Some(sso::set_decision(&super::sso::input_of(form)?)),
        ["settings", "sso", "remove"] => Some(sso::remove_decision()),
        ["settings", "sso", "clients"] => {
            Some(id_jag::client_decision(form.get("name").unwrap_or_default()))
        }
        ["account", "passkeys", handle, "remove"] => Some(Decision::remove_passkey(handle)),
        ["audit", "webhook"] => {
            Some(Decision::audit_webhook("set", form.get("url").unwrap_or_default()))
        }
        ["audit", "webhook", "rotate"] => {
            let ctx = need_ctx()?;
            let url = shared::services::audit::webhook_show(ds, ctx).await?.map(|w| w.url);
            Some(Decision::audit_webhook("rotate", url.as_deref().unwrap_or_default()))
        }
        ["people", "invite"] => {
            let role: Role = form.get("role").unwrap_or_default().parse()?;
            Some(shared::services::invitations::invite_decision(
                form.get("email").unwrap_or_default(),
                role,
            ))
        }
        ["people", "role"] => {
            let role: Role = form.get("role").unwrap_or_default().parse()?;
            admin::role_decision(ds, need_ctx()?, form.get("email").unwrap_or_default(), role)
                .await?
        }
        ["settings", "approval-policy"] => {
            let (scope, mode, not_creator) = super::settings::policy_fields(form)?;
            approvals::policy_decision(ds, need_ctx()?, scope, Some(mode), not_creator).await?
        }
        ["settings", "rate-limit"] => {
            let (class, per_minute) = super::settings::rate_fields(form)?;
            rates::limit_decision(ds, need_ctx()?, class, per_minute).await?
        }
        ["budgets"] => {
            shared::services::budgets::set_decision(ds, need_ctx()?, &super::budgets::fields(form)?)
                .await?
        }
        ["settings", "agent-access"] => to_on.then(Decision::agent_access_on),
        ["settings", "policies"] if form.get("do") == Some("set") => {
            let expected = form.get("expected_version").and_then(|v| v.parse().ok()).unwrap_or(-1);
            shared::services::policies::set_decision(
                ds,
                need_ctx()?,
                &form.get("source").unwrap_or_default().replace("\r\n", "\n"),
                expected,
            )
            .await?
        }
        ["settings", "policies"] => None,
        ["settings", "passkey-policy"] => {
            (form.get("to") == Some("off")).then(Decision::passkey_policy_off)
        }
        // The global switch form says where the kill switch goes: `off` lets agents back in.
        ["operator", "kill-switch"] => {
            (form.get("to") == Some("off")).then(Decision::global_switch_on)
        }
        ["oauth", "authorize"] if form.get("decision") != Some("approve") => None,
        ["oauth", "authorize"] => {
            oauth::consent_form_decision(
                ds,
                &s.row,
                need_ctx()?,
                form.get("request").unwrap_or_default(),
                &form.all("right"),
            )
            .await?
        }
        ["account", "passkeys"] => {
            let held = passkeys::list(ds, &s.row).await?;
            (!held.is_empty())
                .then(|| Decision::add_passkey(form.get("name").unwrap_or_default().trim()))
        }
        _ => return Err(Error::invalid("for", "this form makes no decision a passkey confirms")),
    })
}

/// Answers whether a form's decision needs a passkey now and, when it does, starts the
/// ceremony made for it: `{"needed": false}` or `{"needed": true, "ceremony", "options"}`.
pub(super) async fn decision(
    State(state): State<Arc<AppState>>,
    s: Session,
    CsrfForm(form): CsrfForm,
) -> Response {
    let ctx = s.ctx();
    let path = form.get("for").unwrap_or_default().to_owned();
    let decision = match decision_of(&state, &s, ctx.as_ref(), &path, &form).await {
        Ok(d) => d,
        Err(e) => return refused(e),
    };
    let Some(decision) = decision else { return Json(json!({ "needed": false })).into_response() };
    // The global switch and a further passkey always ask; a tenant's decisions under its policy.
    let always = path.starts_with("/operator/") || path.starts_with("/account/passkeys");
    let needed = always
        || match &ctx {
            Some(ctx) => match passkeys::policy(&state.ds, ctx).await {
                Ok(on) => on,
                Err(e) => return refused(e),
            },
            None => false,
        };
    if !needed {
        return Json(json!({ "needed": false })).into_response();
    }
    match passkeys::decision_begin(&state.ds, &state.passkeys, &s.row, &decision).await {
        Ok((ceremony, options)) => Json(json!({
            "needed": true, "ceremony": ceremony, "options": options, "decision": decision.label(),
        }))
        .into_response(),
        Err(e) => refused(e),
    }
}
