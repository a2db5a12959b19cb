//! The tenant admins' console (server-rendered HTML). Every write goes through the same
//! services as the CLI and the API and is audited with channel `console`; every form carries
//! the session's CSRF token ([`extract::CsrfForm`] checks it); the session cookie is HttpOnly,
//! SameSite=Lax and Secure behind https. The console takes console sessions only: a bearer
//! token gets 401 naming the kind (R20).
//!
//! Pages are maud templates ([`layout`]), one module per page family; handlers extract (a
//! [`extract::Tenant`], a checked form), call a service and render.

pub mod layout;

mod activity;
mod api_tokens;
mod approvals;
mod audit;
mod banners;
mod budgets;
mod connections;
mod extract;
mod invitations;
mod messages;
mod operator;
mod passkeys;
mod people;
mod policies;
mod settings;
mod sign_in;
mod sso;
mod step_up;
mod webhook;

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::{Markup, html};
use shared::error::Error;
use shared::{OpCtx, time};

pub use banners::AuditSeen;
pub use extract::{Session, Source};
pub use passkeys::SCRIPT as PASSKEY_SCRIPT;
pub use step_up::offer as offer_step_up;

use crate::AppState;
use layout::{error_box, page};

/// The session cookie: `__Host-` prefixed when served over https (Secure, Path=/, no Domain,
/// so no sibling host can set or read it); plain over http on a development machine, where
/// browsers refuse `__Host-` cookies.
pub fn session_cookie(state: &AppState) -> &'static str {
    if state.public_url.starts_with("https://") { "__Host-gh_session" } else { "gh_session" }
}

/// The sign-in form's CSRF cookie (double submit): the form must echo it. `__Host-` over https,
/// so a sibling subdomain cannot plant one.
pub fn login_cookie(state: &AppState) -> &'static str {
    if state.public_url.starts_with("https://") { "__Host-gh_login" } else { "gh_login" }
}

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/", get(sign_in::home))
        .route("/login", get(sign_in::login_form).post(sign_in::login))
        .route("/login/passkey/options", post(passkeys::sign_in_options))
        .route("/login/passkey", post(passkeys::sign_in))
        .route("/account/passkeys", get(passkeys::page).post(passkeys::register))
        .route("/account/passkeys/options", post(passkeys::register_options))
        .route("/account/passkeys/{passkey}/remove", post(passkeys::remove))
        .route("/settings/passkey-policy", post(passkeys::set_policy))
        .route("/logout", post(sign_in::logout))
        .route("/tenants", get(sign_in::tenants).post(sign_in::pick_tenant))
        .route("/connections", get(connections::list).post(connections::create))
        .route("/connections/new", get(connections::new_form))
        .route("/connections/{connection}", get(connections::detail))
        .route("/connections/{connection}/created", get(connections::created))
        .route(
            "/connections/{connection}/edit",
            get(connections::edit_form).post(connections::edit),
        )
        .route(
            "/connections/{connection}/revoke",
            get(connections::revoke_confirm).post(connections::revoke),
        )
        .route("/api-tokens", get(api_tokens::list).post(api_tokens::create))
        .route("/api-tokens/new", get(api_tokens::new_form))
        .route("/api-tokens/{token}/created", get(api_tokens::created))
        .route(
            "/api-tokens/{token}/revoke",
            get(api_tokens::revoke_confirm).post(api_tokens::revoke),
        )
        .route("/people", get(people::list))
        .route("/people/invite", get(invitations::new_form).post(invitations::create))
        .route("/people/invitations/{invitation}/sent", get(invitations::sent))
        .route("/people/invitations/{invitation}/revoke", post(invitations::revoke))
        .route("/invitations/{token}", get(invitations::open).post(invitations::accept))
        .route("/invitations/{token}/passkey/options", post(invitations::passkey_options))
        .route("/people/role", get(people::role_confirm).post(people::set_role))
        .route("/people/deactivate", get(people::deactivate_confirm).post(people::deactivate))
        .route("/approvals", get(approvals::page))
        .route("/approvals/count", get(approvals::count))
        .route("/approvals/{action}/{decision}", post(approvals::decide))
        .route("/settings/approval-policy", post(settings::set_policy))
        .route("/settings/rate-limit", post(settings::set_rate_limit))
        .route("/budgets", post(settings::set_budget))
        .route("/settings", get(settings::page))
        .route("/settings/approvals", get(settings::approvals_page))
        .route("/settings/limits", get(settings::limits_page))
        .route("/settings/policies", get(policies::page).post(policies::post))
        .route("/settings/security", get(settings::security_page))
        .route("/settings/agent-access", post(settings::agent_access))
        .route("/audit", get(audit::page))
        .route("/audit.csv", get(audit::csv))
        .route("/audit/webhook", get(webhook::page).post(webhook::set))
        .route("/audit/webhook/rotate", post(webhook::rotate))
        .route("/audit/webhook/remove", get(webhook::remove_confirm).post(webhook::remove))
        .route("/activity", get(activity::page))
        .route("/messages", get(messages::page))
        .route("/operator", get(operator::page))
        .route("/operator/kill-switch", post(operator::global_switch))
        .route("/sso/start", post(sso::start))
        .route("/sso/callback", get(sso::callback))
        .route("/sso/backchannel-logout", post(sso::backchannel_logout))
        .route("/settings/sso", get(sso::settings).post(sso::save))
        .route("/settings/sso/remove", post(sso::remove))
        .route("/settings/sso/clients", post(sso::register_client))
}

/// A console request that did not succeed, as the response to send: a service's error
/// (mapped once, by [`fail`]) or a refusal the handler chose.
pub struct Fail(Box<Response>);

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail(Box::new(fail(e)))
    }
}

impl From<Response> for Fail {
    fn from(r: Response) -> Self {
        Fail(Box::new(r))
    }
}

impl IntoResponse for Fail {
    fn into_response(self) -> Response {
        *self.0
    }
}

/// What a console handler returns.
pub type Answer<T = Response> = Result<T, Fail>;

/// A service's refusal as the console's page (a decision a passkey can confirm comes back as
/// its confirmation), for the OAuth consent, which is not a console route.
pub fn refusal(e: Error) -> Response {
    fail(e)
}

/// The one mapping of a service error to a console page.
fn fail(e: Error) -> Response {
    let status = match &e {
        Error::Forbidden { .. } | Error::NoActor | Error::PasskeyRequired { .. } => {
            StatusCode::FORBIDDEN
        }
        Error::NotFound { .. } => StatusCode::NOT_FOUND,
        Error::WrongState { .. } => StatusCode::CONFLICT,
        Error::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        Error::Internal(d) => {
            tracing::error!(error = %d, "console request failed");
            StatusCode::INTERNAL_SERVER_ERROR
        }
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    };
    let message = match &e {
        Error::Forbidden { right } => {
            format!("Your role does not include {} ({}).", right.as_str(), right.description())
        }
        Error::Internal(_) => "Something failed on our side; try again.".into(),
        Error::Unavailable { .. } => format!(
            "The database is unavailable for a moment, so nothing was saved; try again in {} seconds.",
            shared::error::UNAVAILABLE_RETRY_AFTER_SECS
        ),
        // In words: the problem itself, never the internal name of the field.
        Error::Invalid { problem, .. } => sentence(problem),
        other => other.to_string(),
    };
    let mut response =
        (status, page("Cannot do that", None, failed_body(&message))).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(shared::error::UNAVAILABLE_RETRY_AFTER_SECS),
        );
    }
    // The console's layer draws this again with the person's navigation ([`with_navigation`]);
    // a decision a passkey can confirm comes back as its confirmation ([`step_up::offer`]).
    response.extensions_mut().insert(Failed(message));
    if let Some(confirm) = step_up::Confirm::of(&e) {
        response.extensions_mut().insert(confirm);
    }
    response
}

/// A message as a sentence: a capital first letter and a full stop.
fn sentence(text: &str) -> String {
    let mut chars = text.trim().chars();
    let mut out: String = chars.next().map(|c| c.to_uppercase().collect()).unwrap_or_default();
    out.push_str(chars.as_str());
    if !out.ends_with(['.', '?', '!']) {
        out.push('.');
    }
    out
}

/// What a refused console request said, for [`with_navigation`].
#[derive(Clone)]
struct Failed(String);

fn failed_body(message: &str) -> Markup {
    html! {
        (error_box(message))
        p { "Nothing was changed. " a href="/" { "Back to the console's start" } }
    }
}

/// The console's layer: a refusal page keeps the navigation of the person who got it (their
/// links, who is signed in, sign-out), so nobody is stranded on a page without a way on.
pub async fn with_navigation(
    axum::extract::State(state): axum::extract::State<Arc<AppState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let token = extract::cookie(request.headers(), session_cookie(&state));
    let response = next.run(request).await;
    let Some(Failed(message)) = response.extensions().get::<Failed>().cloned() else {
        return response;
    };
    let Some(token) = token else { return response };
    let Ok(Some(row)) = shared::services::console::session(&state.ds, &token).await else {
        return response;
    };
    let session = extract::Session { row, token, notice: None };
    let (mut parts, _) = response.into_parts();
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    let body = page("Cannot do that", Some(&session.nav("")), failed_body(&message));
    // The refusal's status and headers stay; only the page gains its navigation.
    Response::from_parts(parts, axum::body::Body::from(body.into_string()))
}

/// A stored UTC time (ISO 8601) as people in the tenant read it: the tenant's zone in the
/// console's one format, the UTC instant on hover and for machines (`<time datetime>`).
fn local(ctx: &OpCtx, iso: &str) -> Markup {
    match iso.parse::<jiff::Timestamp>() {
        Ok(t) => local_time(ctx, t),
        Err(_) => html! { (iso) },
    }
}

/// An instant as [`local`] shows it.
fn local_time(ctx: &OpCtx, t: jiff::Timestamp) -> Markup {
    let utc = t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string();
    html! { time datetime=(t.to_string()) title=(utc) { (local_text(ctx, t)) } }
}

/// An instant in the tenant's zone, as text (for sentences and attributes).
fn local_text(ctx: &OpCtx, t: jiff::Timestamp) -> String {
    time::present(t, &ctx.tenant().zone, &ctx.tenant().zone_name, jiff::Timestamp::now()).display
}

/// A post-sign-in target: resolved as a browser resolves it against the console's own origin,
/// and kept only if it stays there (so `//evil`, `/\\evil`, `/\tevil` and `https://evil` all
/// become `/`). What is returned is the parsed path and query, never the raw text.
pub fn safe_next(next: Option<&str>) -> String {
    let base = url::Url::parse("https://console.invalid/").expect("a valid base");
    next.and_then(|n| base.join(n).ok())
        .filter(|u| u.origin() == base.origin() && u.username().is_empty())
        // A path that itself begins `//` (from `/.//x`) would leave the origin when a browser
        // follows it: only a single leading slash is kept.
        .filter(|u| !u.path().starts_with("//") && !u.path().starts_with("/\\"))
        .map(|u| match u.query() {
            Some(q) => format!("{}?{q}", u.path()),
            None => u.path().to_owned(),
        })
        .unwrap_or_else(|| "/".into())
}

/// The direction a switch form names: exactly `on` or `off`. A missing or unknown one is
/// refused and changes nothing; a switch never falls back to a default.
fn direction(form: &extract::Fields) -> Result<bool, Fail> {
    match form.get("to") {
        Some("on") => Ok(true),
        Some("off") => Ok(false),
        _ => {
            let body = error_box("Say whether to turn it on or off; nothing changed.");
            Err((StatusCode::UNPROCESSABLE_ENTITY, page("Choose", None, body))
                .into_response()
                .into())
        }
    }
}

/// The reason a revocation form gives, or the console's default one.
fn reason(form: &extract::Fields) -> &str {
    form.get("reason").map(str::trim).filter(|r| !r.is_empty()).unwrap_or("revoked in the console")
}

/// A path segment for a console URL, percent-encoded.
fn segment(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// A page of the console as a response: the layout around `body`, with the navigation. A
/// notice the page shows is cleared with it, so a reload does not say it again.
fn shown(title: &str, nav: &layout::Nav<'_>, body: Markup) -> Response {
    let mut response = page(title, Some(nav), body).into_response();
    if nav.notice.is_some()
        && let Ok(v) = axum::http::HeaderValue::from_str(&format!(
            "{NOTICE_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
        ))
    {
        response.headers_mut().append(axum::http::header::SET_COOKIE, v);
    }
    response
}

/// A page that showed a one-time secret (or said it was shown): it clears the secret's cookie.
/// (Every console page is `no-store` already, from the security headers layer.)
fn shown_once(
    title: &str,
    nav: &layout::Nav<'_>,
    body: Markup,
    clear: axum::http::HeaderValue,
) -> Answer {
    let mut response = shown(title, nav, body);
    response.headers_mut().append(axum::http::header::SET_COOKIE, clear);
    Ok(response)
}

/// A form that came back with a mistake: its page again, with the status saying so.
fn shown_again(title: &str, nav: &layout::Nav<'_>, body: Markup) -> Answer {
    let mut response = shown(title, nav, body);
    *response.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
    Ok(response)
}

/// The cookie that carries what a save said across its redirect (post/redirect/get).
pub(crate) const NOTICE_COOKIE: &str = "gh_notice";

/// The longest notice a save leaves.
const NOTICE_MAX: usize = 400;

/// After a form changed something: 303 to `to` (so a reload repeats nothing) with what was
/// saved, shown once on the page there.
fn saved(to: &str, message: &str) -> Response {
    let message: String = message.chars().take(NOTICE_MAX).collect();
    let value: String = url::form_urlencoded::byte_serialize(message.as_bytes()).collect();
    let mut response = Redirect::to(to).into_response();
    if let Ok(v) = axum::http::HeaderValue::from_str(&format!(
        "{NOTICE_COOKIE}={value}; Path=/; Max-Age=60; HttpOnly; SameSite=Strict"
    )) {
        response.headers_mut().append(axum::http::header::SET_COOKIE, v);
    }
    response
}

/// A notice cookie's text, when it holds one.
fn notice_text(value: &str) -> Option<String> {
    let text: String = url::form_urlencoded::parse(format!("m={value}").as_bytes())
        .next()
        .map(|(_, v)| v.chars().filter(|c| !c.is_control()).take(NOTICE_MAX).collect())?;
    (!text.trim().is_empty()).then_some(text)
}

/// The cookie that carries a new secret, sealed to the session, across the redirect after
/// the create: read once by the page it was set for, then cleared.
const ONCE_COOKIE: &str = "gh_once";

/// After creating a credential: 303 to `to` (under `path`), carrying the sealed secret for
/// that page alone. A reload of that page never creates another credential.
fn created_once(
    state: &AppState,
    session: &extract::Session,
    path: &str,
    to: &str,
    what: &str,
    secret: &str,
) -> Answer {
    let sealed = shared::services::console::once_seal(&state.ds, &session.row, what, secret)?;
    let mut response = Redirect::to(to).into_response();
    let secure = if state.public_url.starts_with("https://") { "; Secure" } else { "" };
    let cookie = format!(
        "{ONCE_COOKIE}={sealed}; Path={path}; Max-Age=300; HttpOnly; SameSite=Strict{secure}"
    );
    if let Ok(v) = axum::http::HeaderValue::from_str(&cookie) {
        response.headers_mut().append(axum::http::header::SET_COOKIE, v);
    }
    Ok(response)
}

/// The secret a create left for this page, opened once; and the header that clears it.
fn once_secret(
    state: &AppState,
    session: &extract::Session,
    headers: &axum::http::HeaderMap,
    path: &str,
    what: &str,
) -> (Option<String>, axum::http::HeaderValue) {
    let secret = extract::cookie(headers, ONCE_COOKIE)
        .and_then(|v| shared::services::console::once_open(&state.ds, &session.row, what, &v));
    let clear = axum::http::HeaderValue::from_str(&format!(
        "{ONCE_COOKIE}=; Path={path}; Max-Age=0; HttpOnly; SameSite=Strict"
    ))
    .unwrap_or(axum::http::HeaderValue::from_static("gh_once=; Max-Age=0"));
    (secret, clear)
}

/// Rights in words for a sentence: `customers:write (create and edit customers), …`.
fn rights_words(rights: shared::rights::RightSet) -> String {
    rights
        .iter()
        .map(|r| format!("{} ({})", r.as_str(), r.description()))
        .collect::<Vec<_>>()
        .join(", ")
}
