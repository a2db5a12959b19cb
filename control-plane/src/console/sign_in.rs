//! Signing in and out, picking a tenant, and where a person starts. The sign-in form is
//! guarded by a double-submit cookie (there is no session yet); everything after it by the
//! session's CSRF token.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use shared::error::Error;
use shared::rights::Right;
use shared::secret::{self, CredentialKind};
use shared::services::console;

use super::extract::{CsrfForm, Session, Source, cookie};
use super::layout::{csrf_field, error_box, page};
use super::{Answer, login_cookie, safe_next, session_cookie, shown};
use crate::AppState;

pub(super) async fn login_form(
    State(state): State<Arc<AppState>>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let token = login_token();
    let body = login_page(&safe_next(q.get("next").map(String::as_str)), &token, None);
    with_login_cookie(&state, &token, body.into_response())
}

/// A fresh token for the sign-in form's double submit.
fn login_token() -> String {
    secret::generate(CredentialKind::Session)["gh_ses_".len()..].to_owned()
}

/// Sets the sign-in form's CSRF cookie on a response that shows the form.
fn with_login_cookie(state: &AppState, token: &str, mut response: Response) -> Response {
    let secure = if state.public_url.starts_with("https://") { "; Secure" } else { "" };
    // `__Host-` cookies must have Path=/; over plain http the cookie stays on /login.
    let path = if secure.is_empty() { "/login" } else { "/" };
    let cookie = format!(
        "{}={token}; HttpOnly; SameSite=Lax; Path={path}; Max-Age=3600{secure}",
        login_cookie(state)
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

fn login_page(next: &str, csrf: &str, error: Option<&str>) -> Markup {
    page(
        "Sign in",
        None,
        html! {
            @if let Some(error) = error { (error_box(error)) }
            form method="post" action="/login" class="card" {
                input type="hidden" name="next" value=(next);
                input type="hidden" name="login_csrf" value=(csrf);
                label { "Email " input type="email" name="email" autocomplete="username" required maxlength="254"; }
                label { "Password " input type="password" name="password" autocomplete="current-password" required maxlength="1024"; }
                button type="submit" { "Sign in" }
            }
            form method="post" action="/login/passkey" class="card" data-passkey-signin id="passkey-sign-in" {
                input type="hidden" name="next" value=(next);
                input type="hidden" name="login_csrf" value=(csrf);
                p { "Or sign in with a passkey on this device or your phone; no email or password needed." }
                button type="submit" class="plain" { "Use a passkey" }
            }
            (super::sso::sign_in_card(next))
        },
    )
}

/// The sign-in page again with a reason, and a fresh form token.
pub(super) fn refuse_login(state: &AppState, next: &str, message: &str) -> Response {
    let token = login_token();
    let page = login_page(next, &token, Some(message));
    with_login_cookie(state, &token, (StatusCode::UNAUTHORIZED, page).into_response())
}

/// A new session's cookie, and on to where the person was going.
pub(super) fn signed_in(state: &AppState, token: &str, next: &str) -> Response {
    let secure = if state.public_url.starts_with("https://") { "; Secure" } else { "" };
    let cookie = format!(
        "{}={}; HttpOnly; SameSite=Lax; Path=/; Max-Age={}{secure}",
        session_cookie(state),
        token,
        console::SESSION_TTL_SECS
    );
    let mut response = Redirect::to(next).into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

pub(super) async fn login(
    State(state): State<Arc<AppState>>,
    Source(source): Source,
    headers: HeaderMap,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    let next = safe_next(form.get("next").map(String::as_str));
    // The form must echo the cookie its page set: another site cannot sign a browser in.
    let expected = cookie(&headers, login_cookie(&state)).filter(|c| !c.is_empty());
    let Some(csrf) = expected
        .filter(|c| form.get("login_csrf").is_some_and(|f| shared::secret::tokens_match(f, c)))
    else {
        let token = login_token();
        let page = login_page(&next, &token, Some("This sign-in form expired; sign in again."));
        return with_login_cookie(&state, &token, (StatusCode::FORBIDDEN, page).into_response());
    };
    let (email, password) = (
        form.get("email").cloned().unwrap_or_default(),
        form.get("password").cloned().unwrap_or_default(),
    );
    match console::sign_in(&state.ds, &email, &password, &source).await {
        Ok(signed) => signed_in(&state, &signed.token, &next),
        Err(Error::Unauthenticated(message)) => {
            (StatusCode::UNAUTHORIZED, login_page(&next, &csrf, Some(&message))).into_response()
        }
        Err(e) => super::fail(e),
    }
}

pub(super) async fn logout(State(state): State<Arc<AppState>>, s: Session, _: CsrfForm) -> Answer {
    console::sign_out(&state.ds, &s.token).await?;
    let mut response = Redirect::to("/login").into_response();
    let secure = if state.public_url.starts_with("https://") { "; Secure" } else { "" };
    let gone =
        format!("{}=; HttpOnly; SameSite=Lax; Path=/; Max-Age=0{secure}", session_cookie(&state));
    if let Ok(v) = HeaderValue::from_str(&gone) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(response)
}

pub(super) async fn tenants(
    State(state): State<Arc<AppState>>,
    s: Session,
    Query(q): Query<BTreeMap<String, String>>,
) -> Answer {
    let list = console::tenants_of(&state.ds, &s.row).await?;
    let next = safe_next(q.get("next").map(String::as_str));
    let body = html! {
        @if list.is_empty() {
            (error_box("You are not a member of any tenant."))
        } @else {
            ul {
                @for m in &list {
                    li {
                        form method="post" action="/tenants" {
                            (csrf_field(s.csrf()))
                            input type="hidden" name="tenant" value=(m.tenant_id);
                            input type="hidden" name="next" value=(next);
                            button type="submit" { (m.name) } " as " (m.role)
                        }
                    }
                }
            }
        }
    };
    Ok(shown("Pick a tenant", &s.nav("/tenants"), body))
}

pub(super) async fn pick_tenant(
    State(state): State<Arc<AppState>>,
    s: Session,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let Some(tenant) = form.get("tenant").and_then(|t| t.parse::<i64>().ok()) else {
        return Err(Error::invalid("tenant", "pick a tenant").into());
    };
    console::pick_tenant(&state.ds, &s.row, tenant).await?;
    Ok(Redirect::to(&safe_next(form.get("next"))).into_response())
}

/// Where a person starts: admins at their connections, approvers at what waits for them.
pub(super) async fn home(s: Session) -> Response {
    if s.row.shut_out_by_sso() {
        // Every page of the tenant sends such a session here: say why, and what to do.
        let tenant = s.row.tenant_name().unwrap_or("This tenant").to_owned();
        let body = html! {
            div class="card warning" role="alert" {
                h2 { (tenant) " requires single sign-on" }
                p {
                    "You are signed in as " strong { (s.row.name()) } " without " (tenant)
                    "'s identity provider, so its pages are closed to this session."
                }
                p { "Sign out, then choose " strong { "Sign in with single sign-on" } " and give your work email." }
                form method="post" action="/logout" {
                    (csrf_field(s.csrf()))
                    button type="submit" { "Sign out" }
                }
                p { a href="/tenants" { "Work in another tenant" } }
            }
        };
        return shown("Single sign-on required", &s.nav("/"), body);
    }
    let rights = console::session_rights(&s.row);
    let start = if rights.contains(Right::ConnectionsManage) {
        "/connections"
    } else if shared::services::actions::Op::ALL.iter().any(|op| rights.contains(op.right())) {
        "/approvals"
    } else if rights.contains(Right::AuditRead) {
        "/audit"
    } else if let Some(tenant) = s.row.tenant_name() {
        // A role with no console pages in this tenant (a viewer): say so, instead of sending
        // the person back to the tenant picker with no word.
        let body = html! {
            div class="card" {
                p {
                    "Signed in as " strong { (s.row.name()) } " in " strong { (tenant) }
                    ". Your role here has no console pages: connections, approvals and the audit log are for tenant admins and dispatchers."
                }
                p { "You can still connect an agent from your MCP client; it signs you in here and acts with your rights. For more, ask a tenant admin for another role." }
                p { a href="/tenants" { "Work in another tenant" } }
            }
        };
        return shown("Nothing to manage here", &s.nav("/"), body);
    } else {
        "/tenants"
    };
    Redirect::to(start).into_response()
}
