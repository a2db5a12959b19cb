//! Passkeys in the console: a person's own passkeys (add, name, remove), signing in with one,
//! the tenant's policy "decisions need a passkey", and the ceremony a widening decision asks
//! for. The decision itself is checked by its service (`services::passkeys::require`), which
//! names it when it asks for a passkey; `step_up` starts the ceremony for that decision and
//! turns a form's assertion into the context's proof.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Form;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde_json::json;
use shared::error::Error;
use shared::services::passkeys::{self, StepUp};

use super::extract::{CsrfForm, Session, Source, Tenant, cookie};
use super::layout::csrf_field;
use super::{Answer, login_cookie, safe_next, segment, shown};
use crate::AppState;

/// The script of the passkey ceremonies, served from the console's origin.
pub const SCRIPT: &str = include_str!("passkeys.js");

/// A fetch endpoint's refusal: JSON the script shows beside the form.
pub(super) fn refused(e: Error) -> Response {
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
                                    form method="post" action={ "/account/passkeys/" (segment(&p.passkey)) "/remove" } class="inline" {
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
        form method="post" action="/account/passkeys" class="card" data-passkey-register id="add-passkey" {
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
    let proof = match super::step_up::assertion(&form) {
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
        // A further passkey is a decision: the ceremony for it, signed with one held already.
        Err(e) => super::step_up::ceremony_json(&state, &s, e).await,
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
    let proof = match super::step_up::assertion(&form) {
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

// ------------------------------------------------------------------ the tenant's policy

pub(super) async fn set_policy(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let on = super::direction(&form)?;
    let ctx = super::step_up::proven(&state, &t.session, t.ctx, &form).await?;
    passkeys::policy_set(&state.ds, &ctx, on).await?;
    let message = if on {
        "The passkey policy is on: every decision that widens what agents may do needs a passkey."
    } else {
        "The passkey policy is off: a signed-in session decides alone."
    };
    Ok(super::saved("/settings/security", message))
}
