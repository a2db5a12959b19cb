//! Passkeys in the console: a person's own passkeys (add, name, remove), signing in with one,
//! the tenant's policy "decisions need a passkey", and the ceremony a widening decision asks
//! for. The decision itself is checked by its service (`services::passkeys::require`); here a
//! form's assertion becomes the context's proof ([`proven`]), and [`decision`] answers which
//! decision a form would make, so the browser's assertion is made for exactly that one.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Form;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde_json::json;
use shared::OpCtx;
use shared::error::Error;
use shared::rights::{RightSet, Role};
use shared::services::passkeys::{self, Decision, StepUp};
use shared::services::{admin, approvals, id_jag, oauth, rates, sso};

use super::extract::{CsrfForm, Fields, Session, Source, Tenant, cookie};
use super::layout::csrf_field;
use super::{Answer, Fail, login_cookie, safe_next, segment, shown};
use crate::AppState;

/// The script of the passkey ceremonies, served from the console's origin.
pub const SCRIPT: &str = include_str!("passkeys.js");

/// A fetch endpoint's refusal: JSON the script shows beside the form.
fn refused(e: Error) -> Response {
    let status = match &e {
        Error::Forbidden { .. } | Error::NoActor | Error::PasskeyRequired { .. } => {
            StatusCode::FORBIDDEN
        }
        Error::NotFound { .. } => StatusCode::NOT_FOUND,
        Error::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        Error::Internal(d) => {
            tracing::error!(error = %d, "passkey request failed");
            StatusCode::INTERNAL_SERVER_ERROR
        }
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    };
    let message = match &e {
        Error::Internal(_) => "something failed on our side".to_owned(),
        other => other.to_string(),
    };
    (status, Json(json!({ "error": message }))).into_response()
}

/// The context of a decision with the proof its form carried: a passkey assertion turned into
/// a proof by the library, or the context as it was (the service decides whether that is
/// enough under the tenant's policy). A bad assertion refuses the form and changes nothing.
pub(super) async fn proven(
    state: &AppState,
    session: &Session,
    ctx: OpCtx,
    form: &Fields,
) -> Result<OpCtx, Fail> {
    match assertion(form) {
        Some((ceremony, assertion)) => {
            let proof =
                passkeys::prove(&state.ds, &state.passkeys, &session.row, ceremony, assertion)
                    .await?;
            Ok(ctx.with_proof(proof))
        }
        None => Ok(ctx),
    }
}

/// The form's passkey ceremony and assertion, when it carries both.
pub(super) fn assertion(form: &Fields) -> Option<(&str, &str)> {
    Some((form.get("passkey_ceremony")?, form.get("passkey_assertion")?))
        .filter(|(c, a)| !c.is_empty() && !a.is_empty())
}

// ------------------------------------------------------------------ the person's passkeys

pub(super) async fn page(State(state): State<Arc<AppState>>, s: Session) -> Answer {
    let list = passkeys::list(&state.ds, &s.row).await?;
    let has_password = s.row.signed_in_with() != shared::ctx::ProofMethod::SingleSignOn;
    let body = html! {
        div class="card" {
            p { "A passkey signs you in without a password and confirms your decisions: your device checks it is you (PIN, fingerprint or face), and nothing secret leaves it." }
            @if list.is_empty() {
                p id="no-passkeys" { "You have no passkey yet." }
            } @else {
                table {
                    thead { tr { th { "Name" } th { "Added" } th { "Last used" } th {} } }
                    tbody {
                        @for p in &list {
                            tr data-passkey-row=(p.passkey) {
                                td { (p.name) }
                                td { (p.created_at) }
                                td { (p.last_used_at.as_deref().unwrap_or("never")) }
                                td {
                                    form method="post" action={ "/account/passkeys/" (segment(&p.passkey)) "/remove" } class="inline" data-passkey {
                                        (csrf_field(s.csrf()))
                                        button type="submit" class="danger" aria-label={ "Remove " (p.name) } { "Remove" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        form method="post" action="/account/passkeys" class="card" data-passkey-register data-passkey[!list.is_empty()] id="add-passkey" {
            (csrf_field(s.csrf()))
            h2 { "Add a passkey" }
            label { "Name " input type="text" name="name" required maxlength="60" placeholder="Work laptop"; }
            @if list.is_empty() && has_password {
                label { "Your password " input type="password" name="password" autocomplete="current-password" required maxlength="1024"; }
            }
            @if !list.is_empty() {
                p class="muted" { "You will confirm with a passkey you already have." }
            }
            button type="submit" { "Add a passkey" }
        }
        p class="muted" { "Lost every passkey? Ask your platform operator to reset them; you then sign in with your password or your organization's sign-in and add a new one." }
    };
    Ok(shown("Passkeys", &s.nav("/account/passkeys"), body))
}

pub(super) async fn register_options(
    State(state): State<Arc<AppState>>,
    s: Session,
    CsrfForm(form): CsrfForm,
) -> Response {
    let name = form.get("name").unwrap_or_default();
    let proof = match assertion(&form) {
        Some((ceremony, assertion)) => {
            match passkeys::prove(&state.ds, &state.passkeys, &s.row, ceremony, assertion).await {
                Ok(p) => Some(p),
                Err(e) => return refused(e),
            }
        }
        None => None,
    };
    let step_up = match (&proof, form.get("password")) {
        (Some(p), _) => StepUp::Passkey(Some(p)),
        (None, Some(password)) => StepUp::Password(password),
        (None, None) => StepUp::Passkey(None),
    };
    match passkeys::register_begin(&state.ds, &state.passkeys, &s.row, name, step_up).await {
        Ok((ceremony, options)) => {
            Json(json!({ "ceremony": ceremony, "options": options })).into_response()
        }
        Err(e) => refused(e),
    }
}

pub(super) async fn register(
    State(state): State<Arc<AppState>>,
    s: Session,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let ceremony = form.get("ceremony").unwrap_or_default();
    let credential = form.get("credential").unwrap_or_default();
    passkeys::register_finish(&state.ds, &state.passkeys, &s.row, ceremony, credential).await?;
    Ok(Redirect::to("/account/passkeys").into_response())
}

pub(super) async fn remove(
    State(state): State<Arc<AppState>>,
    s: Session,
    Path(handle): Path<String>,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let proof = match assertion(&form) {
        Some((ceremony, assertion)) => {
            Some(passkeys::prove(&state.ds, &state.passkeys, &s.row, ceremony, assertion).await?)
        }
        None => None,
    };
    passkeys::remove(&state.ds, &s.row, &handle, proof.as_ref()).await?;
    Ok(Redirect::to("/account/passkeys").into_response())
}

// ------------------------------------------------------------------ signing in

/// The sign-in form's double-submit token, checked as the password form checks it.
fn login_checked(state: &AppState, headers: &HeaderMap, form: &BTreeMap<String, String>) -> bool {
    cookie(headers, login_cookie(state)).filter(|c| !c.is_empty()).is_some_and(|c| {
        form.get("login_csrf").is_some_and(|f| shared::secret::tokens_match(f, &c))
    })
}

pub(super) async fn sign_in_options(
    State(state): State<Arc<AppState>>,
    Source(source): Source,
    headers: HeaderMap,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    if !login_checked(&state, &headers, &form) {
        return refused(Error::Unauthenticated(
            "This sign-in form expired; reload the page.".into(),
        ));
    }
    match passkeys::sign_in_begin(&state.ds, &state.passkeys, &source).await {
        Ok((ceremony, options)) => {
            Json(json!({ "ceremony": ceremony, "options": options })).into_response()
        }
        Err(e) => refused(e),
    }
}

pub(super) async fn sign_in(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    let next = safe_next(form.get("next").map(String::as_str));
    if !login_checked(&state, &headers, &form) {
        return super::sign_in::refuse_login(
            &state,
            &next,
            "This sign-in form expired; sign in again.",
        );
    }
    let ceremony = form.get("ceremony").map(String::as_str).unwrap_or_default();
    let assertion = form.get("assertion").map(String::as_str).unwrap_or_default();
    match passkeys::sign_in_finish(&state.ds, &state.passkeys, ceremony, assertion).await {
        Ok(signed) => super::sign_in::signed_in(&state, &signed.token, &next),
        Err(Error::Unauthenticated(message)) | Err(Error::Invalid { problem: message, .. }) => {
            super::sign_in::refuse_login(&state, &next, &message)
        }
        Err(e) => super::fail(e),
    }
}

// ------------------------------------------------------------------ decisions

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

// ------------------------------------------------------------------ the tenant's policy

pub(super) async fn set_policy(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let on = super::direction(&form)?;
    let ctx = proven(&state, &t.session, t.ctx, &form).await?;
    passkeys::policy_set(&state.ds, &ctx, on).await?;
    let message = if on {
        "The passkey policy is on: every decision that widens what agents may do needs a passkey."
    } else {
        "The passkey policy is off: a signed-in session decides alone."
    };
    Ok(super::saved("/settings/security", message))
}

/// The policy's card on the settings page.
pub(super) fn policy_card(on: bool, csrf: &str) -> maud::Markup {
    html! {
        div class="card" id="passkey-policy" {
            h2 { "Decisions need a passkey" }
            @if on {
                p { "On: approving an agent's action, consenting to an agent beyond reading, creating a connection, raising a role, a rate limit, a budget or the approval policy's looseness, and turning agent access back on each need a passkey confirmation made for that decision. Denying, revoking and turning things off stay one step." }
            } @else {
                p { "Off: a signed-in session decides alone. Turn it on so a stolen session or password cannot approve or widen anything." }
            }
            form method="post" action="/settings/passkey-policy" data-passkey[on] {
                (csrf_field(csrf))
                input type="hidden" name="to" value=(if on { "off" } else { "on" });
                button type="submit" class=(if on { "danger" } else { "" }) {
                    @if on { "Turn the passkey policy off" } @else { "Require a passkey for decisions" }
                }
            }
        }
    }
}
