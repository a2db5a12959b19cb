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
    /// What the decision sets, in words (`rights`, `toolset`, `url`…).
    pub facts: Vec<(String, String)>,
}

impl Confirm {
    /// The confirmation a service's refusal asks for, when a ceremony can satisfy it.
    pub(super) fn of(e: &Error) -> Option<Confirm> {
        match e {
            Error::PasskeyRequired { decision, problem, ceremony_for: Some(asked) } => {
                Some(Confirm {
                    label: decision.clone(),
                    problem: problem.clone(),
                    digest: asked.digest.clone(),
                    facts: asked.facts.clone(),
                })
            }
            _ => None,
        }
    }
}

/// The console's layer: a form refused for want of a passkey comes back as the page that
/// confirms it, and that page's post becomes the form again. Every other request and answer
/// passes untouched; a post without a session cookie is not even read here.
pub async fn offer(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let is_form =
        request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(
            |v| v.to_ascii_lowercase().starts_with("application/x-www-form-urlencoded"),
        );
    let token = cookie(request.headers(), super::session_cookie(&state));
    let (true, true, Some(token)) = (request.method() == Method::POST, is_form, token) else {
        return next.run(request).await;
    };
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, FORM_LIMIT).await {
        Ok(bytes) => bytes,
        Err(e) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            let (status, text) = if too_large {
                (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "This form is larger than the console takes; nothing changed.",
                )
            } else {
                (
                    StatusCode::BAD_REQUEST,
                    "The form did not arrive whole; nothing changed. Try again.",
                )
            };
            return (status, page("Not done", None, error_box(text))).into_response();
        }
    };
    let path = parts.uri.path().to_owned();
    let action = parts.uri.path_and_query().map(|p| p.as_str().to_owned()).unwrap_or(path.clone());
    // The confirmation's own post: the form as it was first posted, sealed to this session and
    // this path, with the passkey's assertion beside it.
    let bytes = match sealed_form(&bytes) {
        Some(sealed) => match opened(&state, &token, &path, sealed, &bytes).await {
            Some(form) => form,
            None => {
                let body = error_box(
                    "This confirmation was not made for this form or this session; submit the form again.",
                );
                return (StatusCode::FORBIDDEN, page("Not done", None, body)).into_response();
            }
        },
        None => bytes,
    };
    let response = next.run(Request::from_parts(parts, Body::from(bytes.clone()))).await;
    let Some(confirm) = response.extensions().get::<Confirm>().cloned() else {
        return response;
    };
    let Ok(Some(row)) = shared::services::console::session(&state.ds, &token).await else {
        return response;
    };
    let session = Session { row, token, notice: None };
    let sealed = shared::services::console::once_seal(
        &state.ds,
        &session.row,
        &purpose(&path),
        &without_proof(&bytes),
    );
    match (sealed, begin(&state, &session, &confirm).await) {
        (Ok(sealed), Ok((ceremony, options))) => {
            let form = Shown { action: &action, sealed: &sealed };
            confirmation(&session, &confirm, &form, &ceremony, &options)
        }
        (Err(e), _) | (_, Err(e)) => super::Fail::from(e).into_response(),
    }
}

/// The field a confirmation carries its form in.
const SEALED_FIELD: &str = "confirm_form";

fn purpose(path: &str) -> String {
    format!("confirm-form\0{path}")
}

/// The sealed form a confirmation's post carries, if it is one.
fn sealed_form(body: &Bytes) -> Option<String> {
    url::form_urlencoded::parse(body).find(|(k, _)| k == SEALED_FIELD).map(|(_, v)| v.into_owned())
}

/// A form's fields without the proof of an attempt before.
fn without_proof(body: &Bytes) -> String {
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in url::form_urlencoded::parse(body) {
        if !PROOF_FIELDS.contains(&k.as_ref()) && k != SEALED_FIELD {
            out.append_pair(&k, &v);
        }
    }
    out.finish()
}

/// The form a confirmation sealed, opened for this session and path, with the assertion the
/// confirmation's post brought; `None` when the seal is not this session's or this path's.
async fn opened(
    state: &AppState,
    token: &str,
    path: &str,
    sealed: String,
    posted: &Bytes,
) -> Option<Bytes> {
    let row = shared::services::console::session(&state.ds, token).await.ok().flatten()?;
    let form = shared::services::console::once_open(&state.ds, &row, &purpose(path), &sealed)?;
    let mut out = url::form_urlencoded::Serializer::new(form);
    for (k, v) in url::form_urlencoded::parse(posted) {
        if PROOF_FIELDS.contains(&k.as_ref()) {
            out.append_pair(&k, &v);
        }
    }
    Some(Bytes::from(out.finish()))
}

/// The form a confirmation posts again: where to, and the form itself, sealed to the session
/// (so nothing typed, a secret included, is written into the page).
struct Shown<'a> {
    action: &'a str,
    sealed: &'a str,
}

/// The page that confirms a decision: what it is, why a passkey is asked, and the form again
/// (sealed) with its ceremony. Refused (403) as the form was: nothing happened yet.
fn confirmation(
    session: &Session,
    confirm: &Confirm,
    form: &Shown<'_>,
    ceremony: &str,
    options: &serde_json::Value,
) -> Response {
    let body = html! {
        div class="card" id="confirm-decision" {
            h2 { "Confirm with your passkey" }
            p { strong { (confirm.label) } }
            @if !confirm.facts.is_empty() {
                table class="facts" {
                    @for (name, value) in &confirm.facts {
                        tr { th scope="row" { (name) } td { code { (value) } } }
                    }
                }
            }
            p class="muted" { (super::sentence(&confirm.problem)) }
            form method="post" action=(form.action) data-passkey-confirm
                data-ceremony=(ceremony) data-options=(options.to_string()) {
                input type="hidden" name=(SEALED_FIELD) value=(form.sealed);
                button type="submit" { "Confirm with your passkey" }
                " "
                a href="/" data-back { "Cancel" }
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
