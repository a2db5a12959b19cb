//! Single sign-on through the tenant's identity provider: the "Sign in with single sign-on"
//! path of `/login` (by work email or the tenant's short name), the IdP's callback, its
//! back-channel logout, and the settings page where a tenant admin connects the IdP and
//! registers confidential clients for ID-JAG. The rules are `shared::services::sso` and
//! `shared::services::id_jag`; this module extracts, calls and renders.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use shared::error::Error;
use shared::services::{id_jag, sso};

use super::extract::{CsrfForm, Tenant, cookie};
use super::layout::{Entered, csrf_field, error_box, page};
use super::{Answer, safe_next, session_cookie, shown};
use crate::AppState;

/// The cookie that keeps a sign-in's `state` in the browser that started it.
fn state_cookie(state: &AppState) -> &'static str {
    if state.public_url.starts_with("https://") { "__Host-gh_sso" } else { "gh_sso" }
}

fn secure(state: &AppState) -> &'static str {
    if state.public_url.starts_with("https://") { "; Secure" } else { "" }
}

/// The card on the sign-in page.
pub(super) fn sign_in_card(next: &str) -> Markup {
    html! {
        form method="post" action="/sso/start" class="card" id="sso" {
            input type="hidden" name="next" value=(next);
            p { strong { "Sign in with single sign-on" } " — if your organization signs in through its identity provider (and always when it requires single sign-on)." }
            label { "Organization or work address " input type="text" name="who" autocomplete="username" required maxlength="254" placeholder="you@example.com"; }
            button type="submit" { "Continue with single sign-on" }
        }
    }
}

fn refused_page(status: StatusCode, message: &str) -> Response {
    let body = html! {
        (error_box(message))
        p { a href="/login" { "Back to sign-in" } }
    };
    (status, page("Single sign-on", None, body)).into_response()
}

pub(super) async fn start(
    State(state): State<Arc<AppState>>,
    super::extract::Source(source): super::extract::Source,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    let next = safe_next(form.get("next").map(String::as_str));
    let who = form.get("who").map(String::as_str).unwrap_or_default();
    match sso::sign_in_start(&state.ds, &state.public_url, who, &next, &source).await {
        Ok(started) => {
            let mut response = Redirect::to(&started.redirect).into_response();
            let c = format!(
                "{}={}; HttpOnly; SameSite=Lax; Path=/; Max-Age={}{}",
                state_cookie(&state),
                started.state,
                sso::SIGN_IN_TTL_SECS,
                secure(&state)
            );
            if let Ok(v) = HeaderValue::from_str(&c) {
                response.headers_mut().insert(header::SET_COOKIE, v);
            }
            response
        }
        Err(Error::Unauthenticated(m)) => refused_page(StatusCode::NOT_FOUND, &m),
        Err(e) => super::fail(e),
    }
}

pub(super) async fn callback(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let browser = cookie(&headers, state_cookie(&state));
    let get = |k: &str| q.get(k).map(String::as_str);
    let cb = sso::Callback {
        state: get("state"),
        code: get("code"),
        error: get("error"),
        browser_state: browser.as_deref(),
    };
    let mut response =
        match sso::sign_in_finish(&state.ds, &state.fetch, &state.public_url, cb).await {
            Ok(signed) => {
                let mut r = Redirect::to(&safe_next(Some(&signed.next))).into_response();
                let c = format!(
                    "{}={}; HttpOnly; SameSite=Lax; Path=/; Max-Age={}{}",
                    session_cookie(&state),
                    signed.token,
                    signed.ttl_secs,
                    secure(&state)
                );
                if let Ok(v) = HeaderValue::from_str(&c) {
                    r.headers_mut().append(header::SET_COOKIE, v);
                }
                r
            }
            Err(Error::Unauthenticated(m)) => refused_page(StatusCode::UNAUTHORIZED, &m),
            Err(e) => super::fail(e),
        };
    // The state is used once, whatever happened.
    let gone = format!(
        "{}=; HttpOnly; SameSite=Lax; Path=/; Max-Age=0{}",
        state_cookie(&state),
        secure(&state)
    );
    if let Ok(v) = HeaderValue::from_str(&gone) {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    response
}

/// OpenID Connect Back-Channel Logout: the IdP posts `logout_token`.
pub(super) async fn backchannel_logout(
    State(state): State<Arc<AppState>>,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    let token = form.get("logout_token").map(String::as_str).unwrap_or_default();
    let mut response = match sso::backchannel_logout(&state.ds, &state.fetch, token).await {
        Ok(ended) => {
            tracing::info!(sessions.ended = ended, "back-channel logout");
            StatusCode::OK.into_response()
        }
        Err(Error::Internal(d)) => {
            tracing::error!(error = %d, "back-channel logout failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            axum::Json(
                serde_json::json!({"error": "invalid_request", "error_description": e.to_string()}),
            ),
        )
            .into_response(),
    };
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

// ---------------------------------------------------------------- settings

pub(super) async fn settings(State(state): State<Arc<AppState>>, t: Tenant) -> Answer {
    let idp = sso::idp_show(&state.ds, &t.ctx).await?;
    let clients = id_jag::client_list(&state.ds, &t.ctx).await.unwrap_or_default();
    Ok(shown(
        "Single sign-on",
        &t.nav("/settings"),
        settings_body(&state, &t, idp.as_ref(), &clients, None, &Entered::fresh()),
    ))
}

fn yes_no(name: &str, label: &str, on: bool, entered: &Entered<'_>) -> Markup {
    let on = entered.value(name, if on { "yes" } else { "no" }) == "yes";
    html! {
        label {
            (label) " "
            select name=(name) {
                option value="yes" selected[on] { "yes" }
                option value="no" selected[!on] { "no" }
            }
        }
    }
}

fn settings_body(
    state: &AppState,
    t: &Tenant,
    idp: Option<&sso::IdpView>,
    clients: &[id_jag::ClientView],
    registered: Option<&id_jag::ClientRegistered>,
    entered: &Entered<'_>,
) -> Markup {
    let csrf = t.csrf();
    let tabs = super::settings::tabs("/settings/sso");
    let domains = idp.map(|i| i.email_domains.join(", ")).unwrap_or_default();
    let hours = idp.map(|i| i.session_hours).unwrap_or(sso::DEFAULT_SESSION_HOURS).to_string();
    let field = |name: &'static str| (entered.invalid(name), entered.described(name));
    html! {
        (tabs)
        div class="card" {
            h2 { "Your identity provider" }
            p { "Register Gatehouse at your IdP as a web application (OpenID Connect, authorization code) with:" }
            ul {
                li { "Sign-in redirect URI: " code { (sso::redirect_uri(&state.public_url)) } }
                li { "Back-channel logout URI (if your IdP sends one): " code { (sso::backchannel_logout_uri(&state.public_url)) } }
                li { "Scopes: " code { "openid email profile" } }
            }
            @match idp {
                Some(i) => {
                    p id="sso-state" {
                        "Connected to " code { (i.issuer) } " (client " code { (i.client_id) } ", " (i.token_auth_method) "). "
                        "Email domains: " (i.email_domains.join(", ")) ". "
                        @if i.sso_required { strong { "Single sign-on is required: password sign-in is off for this tenant." } }
                        @else { "People may also sign in with a password." }
                        " Sessions from the IdP last " (i.session_hours) " hours."
                        @if i.id_jag { " The IdP may grant agents access (ID-JAG)." }
                    }
                }
                None => { p id="sso-state" { "No identity provider is connected; people sign in with passwords." } }
            }
        }
        form method="post" action="/settings/sso" class="card" {
            (csrf_field(csrf))
            h2 { @if idp.is_some() { "Change the identity provider" } @else { "Connect an identity provider" } }
            (entered.summary(&["issuer", "client_id", "client_secret", "email_domains", "session_hours"]))
            label {
                "Issuer "
                input type="text" name="issuer" required maxlength="500" placeholder="https://example.okta.com"
                    value=(entered.value("issuer", idp.map(|i| i.issuer.as_str()).unwrap_or_default()))
                    aria-invalid=[field("issuer").0] aria-describedby=[field("issuer").1];
                (entered.message("issuer"))
            }
            label {
                "Client id "
                input type="text" name="client_id" required maxlength="255"
                    value=(entered.value("client_id", idp.map(|i| i.client_id.as_str()).unwrap_or_default()))
                    aria-invalid=[field("client_id").0] aria-describedby=[field("client_id").1];
                (entered.message("client_id"))
            }
            label {
                "Client secret "
                // A secret is never sent back to the browser: after a failed save it is typed again.
                input type="password" name="client_secret" maxlength="1024" autocomplete="off"
                    placeholder=(if idp.is_some() { "leave empty to keep the stored one" } else { "" })
                    aria-invalid=[field("client_secret").0] aria-describedby=[field("client_secret").1];
                (entered.message("client_secret"))
                @if entered.has_error() && !entered.value("client_secret", "").is_empty() {
                    span class="field-error" { "Type the client secret again: secrets are never shown back." }
                }
            }
            label {
                "Email domains it vouches for (comma-separated) "
                input type="text" name="email_domains" required maxlength="2000" placeholder="example.com"
                    value=(entered.value("email_domains", &domains))
                    aria-invalid=[field("email_domains").0] aria-describedby=[field("email_domains").1];
                (entered.message("email_domains"))
            }
            (yes_no("allow_join", "People of these domains who are not members join as viewers", idp.is_some_and(|i| i.allow_join), entered))
            (yes_no("sso_required", "Require single sign-on (password sign-in off for this tenant)", idp.is_some_and(|i| i.sso_required), entered))
            (yes_no("id_jag", "Let the IdP grant agents access (ID-JAG)", idp.is_some_and(|i| i.id_jag), entered))
            label {
                "Session lifetime in hours (1 to 12) "
                input type="number" name="session_hours" min="1" max="12" required
                    value=(entered.value("session_hours", &hours))
                    aria-invalid=[field("session_hours").0] aria-describedby=[field("session_hours").1];
                (entered.message("session_hours"))
            }
            button type="submit" { "Save" }
        }
        @if idp.is_some() {
            form method="post" action="/settings/sso/remove" class="card" {
                (csrf_field(csrf))
                p { "Disconnecting ends every session the IdP started; people sign in with passwords again (your platform operator can set a password for someone who has none)." }
                button type="submit" class="danger" { "Disconnect the identity provider" }
            }
        }
        div class="card" {
            h2 { "Agent platforms (ID-JAG clients)" }
            p { "An agent platform that presents ID-JAGs from your IdP authenticates as a confidential client. Register it here and give its operator the client id and secret." }
            @if let Some(r) = registered {
                p class="ok" role="status" {
                    "Registered " strong { (r.name) } ". Client id " code id="client-id" { (r.client_id) }
                    " · client secret (shown once) " code id="client-secret" { (r.client_secret) }
                }
            }
            @if !clients.is_empty() {
                ul { @for c in clients { li { (c.name) " · " code { (c.client_id) } } } }
            }
            form method="post" action="/settings/sso/clients" {
                (csrf_field(csrf))
                label { "Name " input type="text" name="name" required maxlength="80" placeholder="Acme agent platform"; }
                button type="submit" { "Register a client" }
            }
        }
    }
}

fn required_choice(form: &super::extract::Fields, name: &str) -> Result<bool, Error> {
    match form.get(name) {
        Some("yes") => Ok(true),
        Some("no") => Ok(false),
        _ => Err(Error::invalid(name, "choose yes or no; nothing changed")),
    }
}

/// The settings form as the service's input.
pub(super) fn input_of(form: &super::extract::Fields) -> Result<sso::IdpInput, Error> {
    Ok(sso::IdpInput {
        issuer: form.get("issuer").unwrap_or_default().to_owned(),
        client_id: form.get("client_id").unwrap_or_default().to_owned(),
        client_secret: form.get("client_secret").map(str::to_owned),
        email_domains: vec![form.get("email_domains").unwrap_or_default().to_owned()],
        allow_join: required_choice(form, "allow_join")?,
        sso_required: required_choice(form, "sso_required")?,
        id_jag: required_choice(form, "id_jag")?,
        session_hours: form
            .get("session_hours")
            .and_then(|h| h.trim().parse().ok())
            .ok_or_else(|| Error::invalid("session_hours", "give a whole number of hours"))?,
    })
}

pub(super) async fn save(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    // A mistake comes back in place, everything typed kept but the secret.
    let again = |e: Error, idp: Option<sso::IdpView>, clients: Vec<id_jag::ClientView>| -> Answer {
        let entered = Entered::failed(&form, &e);
        let body = settings_body(&state, &t, idp.as_ref(), &clients, None, &entered);
        super::shown_again("Single sign-on", &t.nav("/settings"), body)
    };
    let saved = match input_of(&form) {
        Ok(input) => {
            let ctx = super::step_up::proven(&state, &t.session, t.ctx.clone(), &form).await?;
            sso::idp_set(&state.ds, &ctx, &state.fetch, input).await
        }
        Err(e) => Err(e),
    };
    match saved {
        Ok(_) => Ok(super::saved("/settings/sso", "Single sign-on settings saved.")),
        Err(e @ (Error::Invalid { .. } | Error::WrongState { .. })) => {
            let idp = sso::idp_show(&state.ds, &t.ctx).await?;
            let clients = id_jag::client_list(&state.ds, &t.ctx).await.unwrap_or_default();
            again(e, idp, clients)
        }
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn remove(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let ctx = super::step_up::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    sso::idp_remove(&state.ds, &ctx).await?;
    Ok(Redirect::to("/settings/sso").into_response())
}

pub(super) async fn register_client(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let ctx = super::step_up::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    let registered =
        id_jag::client_register(&state.ds, &ctx, form.get("name").unwrap_or_default()).await?;
    let idp = sso::idp_show(&state.ds, &t.ctx).await?;
    let clients = id_jag::client_list(&state.ds, &t.ctx).await?;
    let body =
        settings_body(&state, &t, idp.as_ref(), &clients, Some(&registered), &Entered::fresh());
    Ok(shown("Single sign-on", &t.nav("/settings"), body))
}
