//! The passkey step-up of a widening decision, driven by the service that makes it.
//!
//! A form posts as any form does. When its service refuses with
//! [`Error::PasskeyRequired`] naming the decision it built from its own input, the console
//! answers with a page of confirmation instead of a refusal ([`offer`]): the decision in
//! words, a ceremony made for exactly that decision, and the same form again (its fields
//! hidden). The person signs with their passkey and the form posts again with the assertion,
//! which [`proven`] turns into the context's proof; the service rebuilds its decision from the
//! same input and finds it proven. No page names or predicts a decision: adding a widening
//! decision touches its own service and page only.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use maud::html;
use shared::OpCtx;
use shared::error::Error;
use shared::services::passkeys;

use super::Fail;
use super::extract::{Fields, Session, cookie};
use super::layout::{error_box, page};
use crate::AppState;

/// The longest form the console reads (a policy set is at most 64 KiB of source).
const FORM_LIMIT: usize = 512 * 1024;

/// The fields a confirmation never carries over: the proof of the attempt before.
const PROOF_FIELDS: [&str; 2] = ["passkey_ceremony", "passkey_assertion"];

/// What a refused form needs to go ahead: the decision as its service named it. Put on the
/// refusal's response by the console's error mapping, read by [`offer`].
#[derive(Clone, Debug)]
pub(super) struct Confirm {
    pub label: String,
    pub problem: String,
    pub digest: String,
}

impl Confirm {
    /// The confirmation a service's refusal asks for, when a ceremony can satisfy it.
    pub(super) fn of(e: &Error) -> Option<Confirm> {
        match e {
            Error::PasskeyRequired { decision, problem, ceremony_for: Some(digest) } => {
                Some(Confirm {
                    label: decision.clone(),
                    problem: problem.clone(),
                    digest: digest.clone(),
                })
            }
            _ => None,
        }
    }
}

/// The console's layer: a form refused for want of a passkey comes back as the page that
/// confirms it. Every other request and answer passes untouched.
pub async fn offer(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let is_form = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if request.method() != Method::POST || !is_form {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, FORM_LIMIT).await else {
        let body = error_box("This form is larger than the console takes; nothing changed.");
        return (StatusCode::PAYLOAD_TOO_LARGE, page("Too large", None, body)).into_response();
    };
    let action = parts.uri.path_and_query().map(|p| p.as_str().to_owned()).unwrap_or_default();
    let token = cookie(&parts.headers, super::session_cookie(&state));
    // Cancel goes back to the page the form was on, when it was the console's own.
    let back = parts
        .headers
        .get(header::REFERER)
        .and_then(|v| v.to_str().ok())
        .and_then(|r| url::Url::parse(r).ok())
        .filter(|r| state.public_url.starts_with(&r.origin().ascii_serialization()))
        .map(|r| super::safe_next(Some(&r[url::Position::BeforePath..])))
        .unwrap_or_else(|| "/".into());
    let response = next.run(Request::from_parts(parts, Body::from(bytes.clone()))).await;
    let Some(confirm) = response.extensions().get::<Confirm>().cloned() else {
        return response;
    };
    let Some(token) = token else { return response };
    let Ok(Some(row)) = shared::services::console::session(&state.ds, &token).await else {
        return response;
    };
    let session = Session { row, token, notice: None };
    match begin(&state, &session, &confirm).await {
        Ok((ceremony, options)) => {
            let form = Shown { action: &action, back: &back, fields: &bytes };
            confirmation(&session, &confirm, &form, &ceremony, &options)
        }
        Err(e) => super::Fail::from(e).into_response(),
    }
}

/// The form a confirmation posts again: where to, its fields as they came, and where Cancel
/// goes.
struct Shown<'a> {
    action: &'a str,
    back: &'a str,
    fields: &'a Bytes,
}

/// The page that confirms a decision: what it is, why a passkey is asked, and the form again
/// with its ceremony. Refused (403) as the form was: nothing happened yet.
fn confirmation(
    session: &Session,
    confirm: &Confirm,
    form: &Shown<'_>,
    ceremony: &str,
    options: &serde_json::Value,
) -> Response {
    let fields: Vec<(String, String)> = url::form_urlencoded::parse(form.fields)
        .filter(|(k, _)| !PROOF_FIELDS.contains(&k.as_ref()))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let body = html! {
        div class="card" id="confirm-decision" {
            h2 { "Confirm with your passkey" }
            p { strong { (confirm.label) } }
            p class="muted" { (super::sentence(&confirm.problem)) }
            form method="post" action=(form.action) data-passkey-confirm
                data-ceremony=(ceremony) data-options=(options.to_string()) {
                @for (name, value) in &fields {
                    input type="hidden" name=(name) value=(value);
                }
                button type="submit" { "Confirm with your passkey" }
                " "
                a href=(form.back) { "Cancel" }
            }
            p class="muted" { "Nothing has changed yet. Your device asks for your PIN, fingerprint or face; the check is made for this decision alone and holds five minutes." }
        }
    };
    let nav = session.nav("");
    (StatusCode::FORBIDDEN, page("Confirm with your passkey", Some(&nav), body)).into_response()
}

/// A fetch endpoint's answer when its service asks for a passkey: the ceremony for the
/// decision, as JSON (`{"needed": true, "ceremony", "options", "decision"}`), so the script
/// signs it and asks again; any other error as [`super::passkeys::refused`] words it.
pub(super) async fn ceremony_json(state: &AppState, session: &Session, e: Error) -> Response {
    let Some(confirm) = Confirm::of(&e) else { return super::passkeys::refused(e) };
    match begin(state, session, &confirm).await {
        Ok((ceremony, options)) => (
            StatusCode::FORBIDDEN,
            axum::Json(serde_json::json!({
                "needed": true, "ceremony": ceremony, "options": options, "decision": confirm.label,
            })),
        )
            .into_response(),
        Err(e) => super::passkeys::refused(e),
    }
}

/// A ceremony for the decision the service named, limited to the person's own passkeys.
async fn begin(
    state: &AppState,
    session: &Session,
    confirm: &Confirm,
) -> Result<(String, serde_json::Value), Error> {
    passkeys::decision_begin(
        &state.ds,
        &state.passkeys,
        &session.row,
        &confirm.label,
        &confirm.digest,
    )
    .await
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
