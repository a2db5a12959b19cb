//! The OAuth 2.1 authorization server's HTTP endpoints (the rules are in
//! `shared::services::oauth`): RFC 8414 metadata, dynamic registration, client ID metadata
//! documents fetched behind an SSRF guard, the consent screen, the token and revocation
//! endpoints.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use maud::{Markup, html};
use serde_json::json;
use shared::rights::RightSet;
use shared::services::oauth::{self, AuthorizeRequest, ClientCredentials, ClientRow, OAuthError};
use shared::services::{client_assertion, id_jag};

use crate::AppState;
use crate::console::layout::{csrf_field, error_box, page};
use crate::console::{Session, Source};

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/.well-known/oauth-authorization-server", get(metadata))
        .route("/oauth/register", post(register))
        .route("/oauth/authorize", get(authorize).post(decide))
        .route("/oauth/token", post(token))
        .route("/oauth/revoke", post(revoke))
}

async fn metadata(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let issuer = &state.public_url;
    Json(json!({
        "issuer": issuer,
        "authorization_endpoint": format!("{issuer}/oauth/authorize"),
        "token_endpoint": format!("{issuer}/oauth/token"),
        "registration_endpoint": format!("{issuer}/oauth/register"),
        "revocation_endpoint": format!("{issuer}/oauth/revoke"),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token", id_jag::GRANT_TYPE],
        "authorization_grant_profiles_supported": [id_jag::PROFILE],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none", "private_key_jwt", "client_secret_basic", "client_secret_post"],
        "token_endpoint_auth_signing_alg_values_supported": client_assertion::SIGNING_ALGS,
        "revocation_endpoint_auth_methods_supported": ["none"],
        "scopes_supported": oauth::scopes_supported(),
        "client_id_metadata_document_supported": true,
        "authorization_response_iss_parameter_supported": true,
    }))
}

fn oauth_error(status: StatusCode, e: OAuthError) -> Response {
    let mut r = (status, Json(e)).into_response();
    r.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    r
}

async fn register(
    State(state): State<Arc<AppState>>,
    Source(source): Source,
    body: axum::body::Bytes,
) -> Response {
    match oauth::registration_take(&state.ds, &source).await {
        Ok(Ok(())) => {}
        Ok(Err(wait)) => {
            let mut r = oauth_error(
                StatusCode::TOO_MANY_REQUESTS,
                OAuthError {
                    error: "too_many_requests",
                    error_description: format!(
                        "this address registered {} clients within the hour; reuse a registered client_id, or retry in {wait} seconds",
                        oauth::REGISTRATIONS_PER_SOURCE
                    ),
                },
            );
            r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(wait));
            return r;
        }
        Err(e) => return oauth_error(StatusCode::SERVICE_UNAVAILABLE, e.into()),
    }
    // A body that is not client metadata is an OAuth error (RFC 7591 §3.2.2), not a bare 422.
    let req: oauth::RegisterRequest = match serde_json::from_slice(&body) {
        Ok(req) => req,
        Err(e) => {
            return oauth_error(
                StatusCode::BAD_REQUEST,
                OAuthError {
                    error: "invalid_client_metadata",
                    error_description: format!("the body is not client metadata JSON ({e})"),
                },
            );
        }
    };
    match oauth::register(&state.ds, req).await {
        Ok(registered) => (StatusCode::CREATED, Json(registered)).into_response(),
        Err(e) => oauth_error(StatusCode::BAD_REQUEST, e),
    }
}

async fn client(state: &AppState, client_id: &str) -> Result<ClientRow, OAuthError> {
    oauth::resolve_client(&state.ds, client_id, &state.fetch).await
}

// ---------------------------------------------------------------- authorize and consent

fn show_error(e: OAuthError) -> Response {
    (
        StatusCode::BAD_REQUEST,
        page(
            "Authorization failed",
            None,
            error_box(&format!("{}: {}", e.error, e.error_description)),
        ),
    )
        .into_response()
}

/// Where an authorization request stands after its checks: refused before the redirect URI is
/// known to be the client's (shown to the person), refused after (sent back to the client), or
/// valid.
enum Checked {
    ShowError(OAuthError),
    SendBack { redirect_uri: String, state: Option<String>, error: OAuthError },
    Valid(Box<ClientRow>, AuthorizeRequest),
}

async fn check(state: &AppState, q: &BTreeMap<String, String>) -> Checked {
    let get = |k: &str| q.get(k).map(String::as_str);
    let client = match client(state, get("client_id").unwrap_or_default()).await {
        Ok(c) => c,
        Err(e) => return Checked::ShowError(e),
    };
    let redirect_uri = get("redirect_uri").unwrap_or_default();
    if let Err(e) = oauth::check_redirect(&client, redirect_uri) {
        return Checked::ShowError(e);
    }
    let checks = oauth::check_request(
        get("response_type").unwrap_or_default(),
        get("code_challenge"),
        get("code_challenge_method"),
        get("resource"),
        &state.mcp_resources,
    )
    .and_then(|()| oauth::check_scope(get("scope")));
    if let Err(error) = checks {
        return Checked::SendBack {
            redirect_uri: redirect_uri.to_owned(),
            state: get("state").map(str::to_owned),
            error,
        };
    }
    Checked::Valid(
        Box::new(client),
        AuthorizeRequest {
            client_id: get("client_id").unwrap_or_default().to_owned(),
            redirect_uri: redirect_uri.to_owned(),
            code_challenge: get("code_challenge").unwrap_or_default().to_owned(),
            state: get("state").map(str::to_owned),
            resource: get("resource").unwrap_or_default().to_owned(),
            scope: get("scope").map(str::to_owned),
        },
    )
}

/// Back to the client with an error (RFC 6749 §4.1.2.1), `state` and `iss` (RFC 9207).
fn send_back(state: &AppState, redirect_uri: &str, st: Option<&str>, e: &OAuthError) -> Response {
    let mut params = vec![("error", e.error), ("error_description", e.error_description.as_str())];
    if let Some(st) = st {
        params.push(("state", st));
    }
    params.push(("iss", state.public_url.as_str()));
    redirect_with(redirect_uri, &params)
}

/// A request refused before the person decided anything. Anyone can register a client with
/// any https redirect URI, so sending such a refusal back at once would make this server an
/// open redirector that lends its name to wherever the registrant points (RFC 9700 §4.11.2):
/// the person sees the error here instead. A loopback redirect URI goes back to the native app
/// on the person's own machine, which is waiting for the answer.
fn refuse_before_consent(
    state: &AppState,
    redirect_uri: &str,
    st: Option<&str>,
    error: OAuthError,
) -> Response {
    let loopback = url::Url::parse(redirect_uri).is_ok_and(|u| {
        u.scheme() == "http"
            && match u.host() {
                Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                Some(url::Host::Domain(d)) => d == "localhost",
                None => false,
            }
    });
    if loopback { send_back(state, redirect_uri, st, &error) } else { show_error(error) }
}

async fn authorize(
    State(state): State<Arc<AppState>>,
    session: Session,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let (client, req) = match check(&state, &q).await {
        Checked::Valid(client, req) => (client, req),
        Checked::ShowError(e) => return show_error(e),
        Checked::SendBack { redirect_uri, state: st, error } => {
            return refuse_before_consent(&state, &redirect_uri, st.as_deref(), error);
        }
    };
    let Some(ctx) = shared::services::console::session_ctx(&session.row) else {
        let back = format!(
            "/oauth/authorize?{}",
            url::form_urlencoded::Serializer::new(String::new()).extend_pairs(q.iter()).finish()
        );
        return Redirect::to(&format!(
            "/tenants?next={}",
            url::form_urlencoded::byte_serialize(back.as_bytes()).collect::<String>()
        ))
        .into_response();
    };
    // The validated request stays on the server; the form names it and nothing else of it.
    let request = match oauth::consent_begin(&state.ds, &session.row, &req).await {
        Ok(handle) => handle,
        Err(e) => return show_error(e.into()),
    };
    let wanted = oauth::requested_rights(req.scope.as_deref(), ctx.rights());
    // A client that holds a grant already and asks for more (step-up) sees what is added.
    let before = match oauth::granted_before(&state.ds, &ctx, &client.client_id).await {
        Ok(before) => before,
        Err(e) => return show_error(e.into()),
    };
    let added = before.map(|b| wanted.without(b)).unwrap_or(RightSet::EMPTY);
    let tenant = session.row.tenant_name().unwrap_or(&ctx.tenant().slug);
    let csrf = csrf_field(session.row.csrf_token());
    let body = html! {
        div class="card" {
            p {
                "Signed in as " strong { (session.row.name()) } " (" (session.row.email()) ") in "
                strong { (tenant) } " (" code { (ctx.tenant().slug) } ")."
            }
            form method="post" action="/logout" {
                (csrf)
                button type="submit" class="plain" { "Not you? Sign out and use another account" }
            }
        }
        form method="post" action="/oauth/authorize" class="card" {
            (csrf)
            input type="hidden" name="request" value=(request);
            p { strong { (client.client_name) } " asks to act for you in " strong { (tenant) } ". It will be able to:" }
            @if added != RightSet::EMPTY {
                p role="note" {
                    strong { (client.client_name) } " already has access; it now also asks for: "
                    (added.iter().map(|r| r.description()).collect::<Vec<_>>().join("; ")) "."
                }
            }
            fieldset {
                legend { "What it may do (never more than you can; untick to narrow)" }
                @for r in ctx.rights().iter() {
                    label {
                        input type="checkbox" name="right" value=(r.as_str()) checked[wanted.contains(r)];
                        " " (r.description()) " " code { (r.as_str()) }
                        @if added.contains(r) { " " strong class="added" { "new" } }
                    }
                }
            }
            p {
                "It connects to " code { (req.resource) } " and returns to " code { (req.redirect_uri) }
                " (client id " code { (client.client_id) } ")."
            }
            (provenance(&client))
            p {
                button type="submit" name="decision" value="approve" { "Approve" }
                " "
                button type="submit" name="decision" value="deny" class="plain" { "Deny" }
            }
        }
    };
    page("Connect an agent", None, body).into_response()
}

/// What the consent screen can say of who the client is. A registered client chose its own
/// name, so the name proves nothing; a metadata-document client is named by a page on its own
/// domain.
fn provenance(client: &ClientRow) -> Markup {
    let host = |uri: &str| url::Url::parse(uri).ok().and_then(|u| u.host_str().map(str::to_owned));
    html! {
        @if client.kind == "metadata_document" {
            p role="note" {
                "Its name comes from " code { (host(&client.client_id).unwrap_or_default()) } ", a page on its own domain."
            }
        } @else {
            p role="note" {
                strong { "This application registered itself." }
                " Gatehouse has not checked that it is what its name says: approve only if you started this connection from the application you expect, and the address it returns to is that application's."
            }
        }
    }
}

/// A redirect to the client; a URI that does not parse shows an error instead (never panics).
fn redirect_with(uri: &str, params: &[(&str, &str)]) -> Response {
    match url::Url::parse(uri) {
        Ok(mut url) => {
            url.query_pairs_mut().extend_pairs(params);
            Redirect::to(url.as_str()).into_response()
        }
        Err(_) => show_error(OAuthError {
            error: "invalid_request",
            error_description: "the redirect URI is not a URL".into(),
        }),
    }
}

async fn decide(
    State(state): State<Arc<AppState>>,
    session: Session,
    Form(form): Form<Vec<(String, String)>>,
) -> Response {
    let one = |k: &str| {
        let mut values = form.iter().filter(|(key, _)| key == k).map(|(_, v)| v.as_str());
        match (values.next(), values.next()) {
            (Some(v), None) => Some(v),
            _ => None,
        }
    };
    if !one("csrf").is_some_and(|c| shared::secret::tokens_match(c, session.row.csrf_token())) {
        return (
            StatusCode::FORBIDDEN,
            page(
                "Form expired",
                None,
                error_box("This form is stale or forged; start again from your client."),
            ),
        )
            .into_response();
    }
    // Consent beyond reading under the tenant's passkey policy is confirmed before the request
    // is used up: the assertion (if the form carries one) is checked first, then the service
    // names the decision it still needs, and the console's layer shows its confirmation, which
    // posts this form again. A bad or stale assertion leaves the request waiting.
    let proven = match shared::services::console::session_ctx(&session.row) {
        Some(ctx) => match (one("passkey_ceremony"), one("passkey_assertion")) {
            (Some(ceremony), Some(assertion)) if !ceremony.is_empty() && !assertion.is_empty() => {
                match shared::services::passkeys::prove(
                    &state.ds,
                    &state.passkeys,
                    &session.row,
                    ceremony,
                    assertion,
                )
                .await
                {
                    Ok(proof) => Some(ctx.with_proof(proof)),
                    Err(e) => return crate::console::refusal(e),
                }
            }
            _ => Some(ctx),
        },
        None => None,
    };
    if let Some(ctx) = &proven
        && one("decision") == Some("approve")
    {
        let rights: Vec<&str> =
            form.iter().filter(|(k, _)| k == "right").map(|(_, v)| v.as_str()).collect();
        let asked = oauth::consent_step_up(
            &state.ds,
            &session.row,
            ctx,
            one("request").unwrap_or_default(),
            &rights,
        )
        .await;
        if let Err(e) = asked {
            return crate::console::refusal(e);
        }
    }
    // The request comes from the server, once; nothing of it is read from the form.
    let req = match oauth::consent_take(&state.ds, &session.row, one("request").unwrap_or_default())
        .await
    {
        Ok(Some(req)) => req,
        Ok(None) => {
            return show_error(OAuthError {
                error: "invalid_request",
                error_description: "this consent screen expired or was answered already; start again from your client".into(),
            });
        }
        Err(e) => return show_error(e.into()),
    };
    let client = match client(&state, &req.client_id).await {
        Ok(c) => c,
        Err(e) => return show_error(e),
    };
    if let Err(e) = oauth::check_redirect(&client, &req.redirect_uri) {
        return show_error(e);
    }
    let st = req.state.as_deref();
    match one("decision") {
        Some("approve") => {}
        Some("deny") => {
            let denied = OAuthError {
                error: "access_denied",
                error_description: "the person declined".into(),
            };
            return send_back(&state, &req.redirect_uri, st, &denied);
        }
        _ => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                page("Choose", None, error_box("Approve or deny; nothing was granted.")),
            )
                .into_response();
        }
    }
    let Some(ctx) = proven else {
        return Redirect::to("/tenants").into_response();
    };
    let names: Vec<&str> =
        form.iter().filter(|(k, _)| k == "right").map(|(_, v)| v.as_str()).collect();
    let granted = RightSet::parse_lenient(&names);
    let issuer = state.public_url.clone();
    match oauth::approve(&state.ds, &ctx, &client, &req, granted).await {
        Ok(code) => {
            let mut params = vec![("code", code.as_str())];
            if let Some(st) = st {
                params.push(("state", st));
            }
            params.push(("iss", issuer.as_str()));
            redirect_with(&req.redirect_uri, &params)
        }
        Err(e) => show_error(e.into()),
    }
}

// ---------------------------------------------------------------- token and revoke

/// A client's id and secret from `Authorization: Basic` (RFC 6749 §2.3.1: each part
/// form-urlencoded, then base64); `Err` for a header that is Basic but unreadable.
fn basic_credentials(headers: &HeaderMap) -> Result<Option<(String, String)>, OAuthError> {
    let Some(value) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    let Some(encoded) = value.strip_prefix("Basic ").or_else(|| value.strip_prefix("basic "))
    else {
        return Ok(None);
    };
    let unreadable = || OAuthError {
        error: "invalid_client",
        error_description:
            "the Basic authorization header is not base64 of client_id:client_secret".into(),
    };
    use base64::Engine;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(unreadable)?;
    let (id, secret) = decoded.split_once(':').ok_or_else(unreadable)?;
    let decode = |s: &str| {
        url::form_urlencoded::parse(format!("x={s}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    };
    Ok(Some((decode(id), decode(secret))))
}

/// The client credentials of a token or revocation request: the form's, or Basic's.
fn credentials<'a>(
    form: &'a BTreeMap<String, String>,
    basic: &'a Option<(String, String)>,
) -> Result<ClientCredentials<'a>, OAuthError> {
    let form_id = form.get("client_id").map(String::as_str);
    if let Some((id, _)) = basic {
        if form_id.is_some_and(|f| f != id) {
            return Err(OAuthError {
                error: "invalid_client",
                error_description: "client_id differs from the Basic authorization header".into(),
            });
        }
        if form.contains_key("client_secret") {
            return Err(OAuthError {
                error: "invalid_request",
                error_description: "send the client secret once: Basic or client_secret, not both"
                    .into(),
            });
        }
    }
    Ok(ClientCredentials {
        client_id: basic.as_ref().map(|(id, _)| id.as_str()).or(form_id),
        client_secret: basic
            .as_ref()
            .map(|(_, s)| s.as_str())
            .or(form.get("client_secret").map(String::as_str)),
        assertion_type: form.get("client_assertion_type").map(String::as_str),
        assertion: form.get("client_assertion").map(String::as_str),
    })
}

async fn token(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    let get = |k: &str| form.get(k).map(String::as_str).unwrap_or_default();
    let resource = form.get("resource").map(String::as_str);
    let basic = match basic_credentials(&headers) {
        Ok(b) => b,
        Err(e) => return oauth_error(StatusCode::UNAUTHORIZED, e),
    };
    let creds = match credentials(&form, &basic) {
        Ok(c) => c,
        Err(e) => return oauth_error(StatusCode::UNAUTHORIZED, e),
    };
    let audiences = [format!("{}/oauth/token", state.public_url), state.public_url.clone()];
    let client_id =
        match oauth::authenticate_client(&state.ds, &state.fetch, creds, &audiences).await {
            Ok(id) => id,
            // A client that failed to authenticate gets 401 (RFC 6749 §5.2).
            Err(e) => return oauth_error(StatusCode::UNAUTHORIZED, e),
        };
    let result = match get("grant_type") {
        "authorization_code" => {
            oauth::exchange_code(
                &state.ds,
                get("code"),
                &client_id,
                get("redirect_uri"),
                get("code_verifier"),
                resource,
            )
            .await
        }
        "refresh_token" => {
            oauth::refresh(&state.ds, get("refresh_token"), &client_id, resource).await
        }
        id_jag::GRANT_TYPE => {
            let request = id_jag::Request {
                client_id: &client_id,
                assertion: get("assertion"),
                scope: form.get("scope").map(String::as_str),
                resource,
            };
            id_jag::exchange(
                &state.ds,
                &state.fetch,
                &state.public_url,
                &state.mcp_resources,
                request,
            )
            .await
        }
        other => Err(OAuthError {
            error: "unsupported_grant_type",
            error_description: format!("{other:?} is not supported"),
        }),
    };
    match result {
        Ok(tokens) => {
            let mut r = Json(tokens).into_response();
            r.headers_mut()
                .insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
            r
        }
        Err(e) => oauth_error(StatusCode::BAD_REQUEST, e),
    }
}

async fn revoke(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    // A client that names itself is authenticated as at the token endpoint (RFC 7009 §2.1).
    let basic = match basic_credentials(&headers) {
        Ok(b) => b,
        Err(e) => return oauth_error(StatusCode::UNAUTHORIZED, e),
    };
    let creds = match credentials(&form, &basic) {
        Ok(c) => c,
        Err(e) => return oauth_error(StatusCode::UNAUTHORIZED, e),
    };
    let client = if creds.client_id.is_some() || creds.assertion.is_some() {
        let audiences = [
            format!("{}/oauth/revoke", state.public_url),
            format!("{}/oauth/token", state.public_url),
            state.public_url.clone(),
        ];
        match oauth::authenticate_client(&state.ds, &state.fetch, creds, &audiences).await {
            Ok(id) => Some(id),
            Err(e) => return oauth_error(StatusCode::UNAUTHORIZED, e),
        }
    } else {
        None
    };
    let token = form.get("token").map(String::as_str).unwrap_or_default();
    match oauth::revoke(&state.ds, token, client.as_deref()).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) if e.error == "invalid_client" => oauth_error(StatusCode::UNAUTHORIZED, e),
        Err(e) => oauth_error(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}
