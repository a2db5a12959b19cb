//! Inviting people, and joining by an invitation's link. An admin invites from People (the
//! email goes through the outbox; the link is also shown once, after the redirect, to pass on
//! by hand) and can revoke a waiting invitation. The link's page lets the person join by
//! setting a password, making a passkey, signing in to the account they have, or through the
//! tenant's single sign-on; the service decides which of these the tenant allows.
//!
//! The acceptance forms have no session to carry a CSRF token, so they echo a cookie their
//! page set (double submit, as the sign-in form does): another site cannot make a browser
//! join a tenant on an invitation of its own.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Form;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde_json::json;
use shared::error::Error;
use shared::rights::Role;
use shared::secret::{self, CredentialKind};
use shared::services::console::{self, ConsoleSession};
use shared::services::invitations::{self, Opened};

use super::extract::{CsrfForm, Tenant, cookie};
use super::layout::{Entered, csrf_field, error_box, page};
use super::{Answer, segment, session_cookie, shown};
use crate::AppState;

/// A refusal in words: a field's problem without the field's internal name.
fn words(e: &Error) -> String {
    match e {
        Error::Invalid { problem, .. } => {
            let mut s = problem.clone();
            if let Some(first) = s.get(0..1) {
                s.replace_range(0..1, &first.to_uppercase());
            }
            format!("{s}.")
        }
        other => other.to_string(),
    }
}

/// The acceptance forms' double-submit cookie: `__Host-` prefixed over https (no sibling
/// host can plant one), plain over http on a development machine.
fn invite_cookie(state: &AppState) -> &'static str {
    if state.public_url.starts_with("https://") { "__Host-gh_invite" } else { "gh_invite" }
}

// ------------------------------------------------------------------ the admin's side

/// The invitation form, on its own page.
pub(super) async fn new_form(t: Tenant) -> Answer {
    Ok(shown("Invite someone", &t.nav("/people"), new_body(&t, &Entered::fresh())))
}

fn new_body(t: &Tenant, entered: &Entered<'_>) -> Markup {
    let role = entered.value("role", "viewer");
    html! {
        (entered.summary(&["email", "name", "role"]))
        form method="post" action="/people/invite" class="card" {
            (csrf_field(t.csrf()))
            p { "They get an email with a link to join " (t.ctx.tenant().slug) ", valid for " (invitations::DAYS) " days. They join by setting a password, with a passkey, with the Gatehouse account they have, or through your single sign-on." }
            label {
                "Email "
                input type="email" name="email" required maxlength="254" autocomplete="off"
                    value=(entered.value("email", "")) aria-invalid=[entered.invalid("email")] aria-describedby=[entered.described("email")];
                (entered.message("email"))
            }
            label {
                "Name "
                input type="text" name="name" required maxlength="100"
                    value=(entered.value("name", "")) aria-invalid=[entered.invalid("name")] aria-describedby=[entered.described("name")];
                (entered.message("name"))
            }
            label {
                "Role "
                select name="role" aria-invalid=[entered.invalid("role")] aria-describedby=[entered.described("role")] {
                    @for r in Role::ALL.iter() {
                        option value=(r.as_str()) selected[role == r.as_str()] { (r.as_str()) " — " (super::rights_words(r.rights())) }
                    }
                }
                (entered.message("role"))
            }
            button type="submit" { "Send the invitation" }
            " "
            a href="/people" { "Cancel" }
        }
    }
}

pub(super) async fn create(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let again = |e: Error| -> Answer {
        super::shown_again(
            "Invite someone",
            &t.nav("/people"),
            new_body(&t, &Entered::failed(&form, &e)),
        )
    };
    let role = match form.get("role").map(str::parse::<Role>) {
        Some(Ok(role)) => role,
        Some(Err(e)) => return again(e),
        None => return again(Error::invalid("role", "pick the role they get")),
    };
    let invite = invitations::Invite {
        email: form.get("email").unwrap_or_default(),
        name: form.get("name").unwrap_or_default(),
        role,
    };
    let ctx = super::step_up::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    match invitations::invite(&state.ds, &ctx, invite, &state.public_url).await {
        Ok(sent) => {
            let to = format!("/people/invitations/{}/sent", segment(&sent.invitation));
            super::created_once(
                &state,
                &t.session,
                "/people/invitations/",
                &to,
                &sent.invitation,
                &sent.link,
            )
        }
        Err(e @ (Error::Invalid { .. } | Error::WrongState { .. })) => again(e),
        Err(e) => Err(e.into()),
    }
}

/// After sending: the link, once, for when the email does not arrive.
pub(super) async fn sent(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Path(handle): Path<String>,
    headers: HeaderMap,
) -> Answer {
    let inv = invitations::get_open(&state.ds, &t.ctx, &handle).await?;
    let (link, clear) =
        super::once_secret(&state, &t.session, &headers, "/people/invitations/", &inv.invitation);
    let body = html! {
        p class="ok" role="status" {
            "Invitation sent to " strong { (inv.email) } " as " (inv.role) "; it works until " (super::local(&t.ctx, &inv.expires_at)) "."
        }
        @match link {
            Some(link) => div class="card" {
                p { "If the email does not arrive, give them this link yourself. It is shown once; anyone holding it can join as " (inv.email) "." }
                pre id="invitation-link" { (link) }
                button type="button" class="plain" data-copy="invitation-link" { "Copy link" }
            },
            None => p class="muted" { "The link was shown once, right after sending. To send a new one, revoke this invitation and invite them again." },
        }
        p { a href="/people" { "Back to people" } }
    };
    super::shown_once("Invitation sent", &t.nav("/people"), body, clear)
}

pub(super) async fn revoke(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Path(handle): Path<String>,
    _: CsrfForm,
) -> Answer {
    let email = invitations::revoke(&state.ds, &t.ctx, &handle).await?;
    Ok(super::saved(
        "/people",
        &format!("The invitation to {email} is revoked: its link no longer works."),
    ))
}

/// The People page's list of invitations still waiting.
pub(super) fn waiting(t: &Tenant, list: &[invitations::InvitationSummary]) -> Markup {
    html! {
        @if !list.is_empty() {
            h2 { "Invitations waiting" }
            table id="invitations" {
                thead { tr { th { "Email" } th { "Role" } th { "Invited by" } th { "Until" } th { span class="visually-hidden" { "Actions" } } } }
                tbody {
                    @for i in list {
                        tr {
                            td { (i.name) br; (i.email) }
                            td { (i.role) }
                            td { (i.invited_by.as_deref().unwrap_or("—")) }
                            td {
                                @if i.expired { span class="status-expired" { "expired" } " " }
                                (super::local(&t.ctx, &i.expires_at))
                            }
                            td {
                                form method="post" action={ "/people/invitations/" (segment(&i.invitation)) "/revoke" } class="inline" {
                                    (csrf_field(t.csrf()))
                                    button type="submit" class="plain" aria-label={ "Revoke the invitation to " (i.email) } { "Revoke" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

// ------------------------------------------------------------------ the invited person's side

/// The signed-in session of this browser, if any (the acceptance page is public).
async fn session_of(state: &AppState, headers: &HeaderMap) -> Option<ConsoleSession> {
    let token = cookie(headers, session_cookie(state))?;
    console::session(&state.ds, &token).await.ok().flatten()
}

fn with_invite_cookie(state: &AppState, token: &str, mut response: Response) -> Response {
    // `__Host-` cookies must have Path=/; over plain http the cookie stays on /invitations.
    let (secure, path) = if state.public_url.starts_with("https://") {
        ("; Secure", "/")
    } else {
        ("", "/invitations")
    };
    let c = format!(
        "{}={token}; HttpOnly; SameSite=Strict; Path={path}; Max-Age=3600{secure}",
        invite_cookie(state)
    );
    if let Ok(v) = HeaderValue::from_str(&c) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

fn closed(message: &str) -> Response {
    let body = html! {
        (error_box(message))
        p { a href="/login" { "Go to sign-in" } }
    };
    (StatusCode::NOT_FOUND, page("Invitation", None, body)).into_response()
}

/// The page a link opens: what the invitation is, and the ways in.
pub(super) async fn open(
    State(state): State<Arc<AppState>>,
    Path(token): Path<String>,
    headers: HeaderMap,
) -> Response {
    let session = session_of(&state, &headers).await;
    match invitations::open(&state.ds, &token).await {
        Ok(opened) => accept_page(&state, &token, &opened, session.as_ref(), None),
        Err(Error::Unauthenticated(m)) => closed(&m),
        Err(e) => super::fail(e),
    }
}

fn accept_page(
    state: &AppState,
    token: &str,
    inv: &Opened,
    session: Option<&ConsoleSession>,
    error: Option<(&BTreeMap<String, String>, &Error)>,
) -> Response {
    let csrf = secret::generate(CredentialKind::Session)["gh_ses_".len()..].to_owned();
    let action = format!("/invitations/{}", segment(token));
    let typed = |k: &str| error.and_then(|(f, _)| f.get(k).cloned()).unwrap_or_default();
    let field_error = |k: &str| match error {
        Some((_, Error::Invalid { field, problem, .. })) if field == k => Some(problem.clone()),
        _ => None,
    };
    let general = match error {
        Some((_, Error::Invalid { field, .. }))
            if ["name", "password"].contains(&field.as_str()) =>
        {
            None
        }
        Some((_, e)) => Some(words(e)),
        None => None,
    };
    let me = session.filter(|s| s.email().eq_ignore_ascii_case(&inv.email));
    let body = html! {
        div class="card" {
            p {
                @if let Some(by) = &inv.invited_by { (by) " invites you" } @else { "You are invited" }
                " to join " strong { (inv.tenant) } " on Gatehouse as " strong { (inv.role) } "."
            }
            p class="muted" {
                "For " (inv.email) " · the link works until "
                time datetime=(inv.expires_at) title={ (inv.expires_at) " UTC" } { (inv.expires_local) } "."
            }
        }
        @if let Some(m) = general { (error_box(&m)) }
        @if inv.sso {
            form method="post" action="/sso/start" class="card" id="join-sso" {
                input type="hidden" name="next" value="/";
                input type="hidden" name="who" value=(inv.email);
                p { strong { "Join through single sign-on" } " — sign in with your organization's account for " (inv.email) "." }
                button type="submit" { "Continue with single sign-on" }
            }
        }
        @if inv.sso_required {
            p class="muted" { (inv.tenant) " is entered through single sign-on only." }
        } @else if inv.account {
            @match me {
                Some(s) => form method="post" action=(action) class="card" id="join-account" {
                    (csrf_field(s.csrf_token()))
                    input type="hidden" name="how" value="account";
                    p { "You are signed in as " strong { (s.email()) } "." }
                    button type="submit" { "Join " (inv.tenant) }
                },
                None => div class="card" id="join-account" {
                    p { (inv.email) " has a Gatehouse account already. Sign in to it, and this page lets you join." }
                    a class="button" href={ "/login?next=" (url::form_urlencoded::byte_serialize(action.as_bytes()).collect::<String>()) } { "Sign in to accept" }
                    @if let Some(s) = session {
                        p class="warning" { "You are signed in as " (s.email()) ", not " (inv.email) ": sign out first." }
                    }
                },
            }
        } @else {
            form method="post" action=(action) class="card" id="join-password" {
                input type="hidden" name="invite_csrf" value=(csrf);
                input type="hidden" name="how" value="password";
                h2 { "Set a password" }
                (name_field(&typed("name"), field_error("name"), "name"))
                label {
                    "Password (12 characters or more) "
                    input type="password" name="password" autocomplete="new-password" required minlength="12" maxlength="1024"
                        aria-invalid=[field_error("password").map(|_| "true")] aria-describedby=[field_error("password").map(|_| "password-error")];
                    @if let Some(p) = field_error("password") { span class="field-error" id="password-error" { (p) } }
                    @if error.is_some() && field_error("password").is_none() { span class="muted" { " Type your password again." } }
                }
                button type="submit" { "Join with a password" }
            }
            form method="post" action=(action) class="card" id="join-passkey" data-passkey-register data-options={ (action) "/passkey/options" } {
                input type="hidden" name="invite_csrf" value=(csrf);
                input type="hidden" name="how" value="passkey";
                h2 { "Or make a passkey" }
                p { "No password: your device (PIN, fingerprint or face) signs you in." }
                (name_field(&typed("name"), None, "passkey-name"))
                button type="submit" class="plain" { "Join with a passkey" }
            }
        }
    };
    let status = if error.is_some() { StatusCode::UNPROCESSABLE_ENTITY } else { StatusCode::OK };
    with_invite_cookie(state, &csrf, (status, page("Join", None, body)).into_response())
}

fn name_field(value: &str, error: Option<String>, id: &str) -> Markup {
    html! {
        label {
            "Your name "
            input type="text" name="name" id=(id) required maxlength="100" autocomplete="name" value=(value)
                aria-invalid=[error.as_ref().map(|_| "true")] aria-describedby=[error.as_ref().map(|_| "name-error")];
            @if let Some(e) = error { span class="field-error" id="name-error" { (e) } }
        }
    }
}

/// Whether an acceptance form echoes its page's cookie.
fn checked(state: &AppState, headers: &HeaderMap, form: &BTreeMap<String, String>) -> bool {
    cookie(headers, invite_cookie(state))
        .filter(|c| !c.is_empty())
        .is_some_and(|c| form.get("invite_csrf").is_some_and(|f| secret::tokens_match(f, &c)))
}

pub(super) async fn accept(
    State(state): State<Arc<AppState>>,
    Path(token): Path<String>,
    headers: HeaderMap,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    let ds = &state.ds;
    let session = session_of(&state, &headers).await;
    let get = |k: &str| form.get(k).map(String::as_str).unwrap_or_default();
    let result = match get("how") {
        "account" => {
            let Some(s) =
                session.as_ref().filter(|s| secret::tokens_match(get("csrf"), s.csrf_token()))
            else {
                return closed("This form expired; open the invitation's link again.");
            };
            match invitations::accept_signed_in(ds, &token, s).await {
                Ok(()) => {
                    return super::saved("/", "You joined the tenant. Welcome.");
                }
                Err(e) => Err(e),
            }
        }
        _ if !checked(&state, &headers, &form) => {
            return closed("This form expired; open the invitation's link again.");
        }
        "password" => {
            invitations::accept_with_password(ds, &token, get("name"), get("password")).await
        }
        "passkey" => {
            invitations::accept_with_passkey(
                ds,
                &state.passkeys,
                &token,
                get("ceremony"),
                get("credential"),
            )
            .await
        }
        _ => {
            Err(Error::invalid("how", "choose how to join: a password, a passkey or your account"))
        }
    };
    match result {
        Ok(signed) => super::sign_in::signed_in(&state, &signed.token, "/"),
        Err(Error::Unauthenticated(m)) => closed(&m),
        Err(e @ (Error::Invalid { .. } | Error::WrongState { .. })) => {
            match invitations::open(ds, &token).await {
                Ok(opened) => {
                    accept_page(&state, &token, &opened, session.as_ref(), Some((&form, &e)))
                }
                Err(Error::Unauthenticated(m)) => closed(&m),
                Err(e) => super::fail(e),
            }
        }
        Err(e) => super::fail(e),
    }
}

/// The options of the passkey a new account joins with (JSON, for the page's script).
pub(super) async fn passkey_options(
    State(state): State<Arc<AppState>>,
    Path(token): Path<String>,
    headers: HeaderMap,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    let refuse = |status: StatusCode, message: String| {
        (status, Json(json!({ "error": message }))).into_response()
    };
    if !checked(&state, &headers, &form) {
        return refuse(
            StatusCode::FORBIDDEN,
            "This form expired; open the invitation's link again.".into(),
        );
    }
    let name = form.get("name").map(String::as_str).unwrap_or_default();
    match invitations::passkey_begin(&state.ds, &state.passkeys, &token, name).await {
        Ok((ceremony, options)) => {
            Json(json!({ "ceremony": ceremony, "options": options })).into_response()
        }
        Err(Error::Unauthenticated(m)) => refuse(StatusCode::NOT_FOUND, m),
        Err(e @ (Error::Invalid { .. } | Error::WrongState { .. })) => {
            refuse(StatusCode::UNPROCESSABLE_ENTITY, words(&e))
        }
        Err(e) => {
            tracing::error!(error = %e, "invitation passkey options failed");
            refuse(StatusCode::INTERNAL_SERVER_ERROR, "something failed on our side".into())
        }
    }
}
