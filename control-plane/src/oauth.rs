//! The OAuth 2.1 authorization server's HTTP endpoints (the rules are in
//! `shared::services::oauth`): RFC 8414 metadata, dynamic registration, client ID metadata
//! documents fetched behind an SSRF guard, the consent screen, the token and revocation
//! endpoints.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use serde_json::json;
use shared::rights::RightSet;
use shared::services::oauth::{self, AuthorizeRequest, ClientRow, OAuthError};

use crate::AppState;
use crate::console::Session;
use crate::html::{csrf_field, error_box, esc, page};

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
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
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
    Json(req): Json<oauth::RegisterRequest>,
) -> Response {
    match oauth::register(&state.ds, req).await {
        Ok(registered) => (StatusCode::CREATED, Json(registered)).into_response(),
        Err(e) => oauth_error(StatusCode::BAD_REQUEST, e),
    }
}

async fn client(state: &AppState, client_id: &str) -> Result<ClientRow, OAuthError> {
    oauth::resolve_client(&state.ds, client_id, state.dev_mode).await
}

// ---------------------------------------------------------------- authorize and consent

fn show_error(e: OAuthError) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Html(page(
            "Authorization failed",
            None,
            &error_box(&format!("{}: {}", e.error, e.error_description)),
        )),
    )
        .into_response()
}

async fn validated(
    state: &AppState,
    q: &BTreeMap<String, String>,
) -> Result<(ClientRow, AuthorizeRequest), OAuthError> {
    let get = |k: &str| q.get(k).map(String::as_str);
    let client = client(state, get("client_id").unwrap_or_default()).await?;
    let redirect_uri = get("redirect_uri").unwrap_or_default();
    oauth::check_authorize(
        &client,
        redirect_uri,
        get("response_type").unwrap_or_default(),
        get("code_challenge"),
        get("code_challenge_method"),
        get("resource"),
        &state.mcp_resources,
    )?;
    Ok((
        client,
        AuthorizeRequest {
            client_id: get("client_id").unwrap_or_default().to_owned(),
            redirect_uri: redirect_uri.to_owned(),
            code_challenge: get("code_challenge").unwrap_or_default().to_owned(),
            state: get("state").map(str::to_owned),
            resource: get("resource").unwrap_or_default().to_owned(),
            scope: get("scope").map(str::to_owned),
        },
    ))
}

async fn authorize(
    State(state): State<Arc<AppState>>,
    session: Session,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let (client, req) = match validated(&state, &q).await {
        Ok(v) => v,
        Err(e) => return show_error(e),
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
    let wanted = oauth::requested_rights(req.scope.as_deref(), ctx.rights());
    let hidden: String = q
        .iter()
        .filter(|(k, _)| *k != "csrf")
        .map(|(k, v)| format!("<input type=\"hidden\" name=\"{}\" value=\"{}\">", esc(k), esc(v)))
        .collect();
    let boxes: String = ctx
        .rights()
        .iter()
        .map(|r| {
            format!(
                "<label><input type=\"checkbox\" name=\"right\" value=\"{0}\"{1}> <code>{0}</code> — {2}</label>",
                r.as_str(),
                if wanted.contains(r) { " checked" } else { "" },
                esc(r.description())
            )
        })
        .collect();
    let body = format!(
        "<form method=\"post\" action=\"/oauth/authorize\" class=\"card\">{}{hidden}\
         <p><strong>{}</strong> asks to act for you in <strong>{}</strong> through <code>{}</code>.</p>\
         <p>Client id: <code>{}</code> · it will return to <code>{}</code></p>\
         <fieldset><legend>Rights it may use (never more than your own; untick to narrow)</legend>{boxes}</fieldset>\
         <p><button type=\"submit\" name=\"decision\" value=\"approve\">Approve</button> <button type=\"submit\" name=\"decision\" value=\"deny\" class=\"plain\">Deny</button></p></form>",
        csrf_field(&session.row.csrf_token),
        esc(&client.client_name),
        esc(&ctx.tenant().slug),
        esc(&req.resource),
        esc(&client.client_id),
        esc(&req.redirect_uri)
    );
    Html(page("Connect an agent", None, &body)).into_response()
}

fn redirect_with(uri: &str, params: &[(&str, &str)]) -> Response {
    let mut url = url::Url::parse(uri).expect("a registered redirect URI is a URL");
    url.query_pairs_mut().extend_pairs(params);
    Redirect::to(url.as_str()).into_response()
}

async fn decide(
    State(state): State<Arc<AppState>>,
    session: Session,
    Form(form): Form<Vec<(String, String)>>,
) -> Response {
    let map: BTreeMap<String, String> =
        form.iter().filter(|(k, _)| k != "right").cloned().collect();
    if map.get("csrf") != Some(&session.row.csrf_token) {
        return (
            StatusCode::FORBIDDEN,
            Html(page(
                "Form expired",
                None,
                &error_box("This form is stale or forged; start again from your client."),
            )),
        )
            .into_response();
    }
    let (client, req) = match validated(&state, &map).await {
        Ok(v) => v,
        Err(e) => return show_error(e),
    };
    let issuer = state.public_url.clone();
    let st = req.state.clone().unwrap_or_default();
    if map.get("decision").map(String::as_str) != Some("approve") {
        return redirect_with(
            &req.redirect_uri,
            &[("error", "access_denied"), ("state", &st), ("iss", &issuer)],
        );
    }
    let Some(ctx) = shared::services::console::session_ctx(&session.row) else {
        return Redirect::to("/tenants").into_response();
    };
    let names: Vec<&str> =
        form.iter().filter(|(k, _)| k == "right").map(|(_, v)| v.as_str()).collect();
    let granted = RightSet::parse_lenient(&names);
    match oauth::approve(&state.ds, &ctx, &client, &req, granted).await {
        Ok(code) => {
            redirect_with(&req.redirect_uri, &[("code", &code), ("state", &st), ("iss", &issuer)])
        }
        Err(e) => show_error(e.into()),
    }
}

// ---------------------------------------------------------------- token and revoke

async fn token(
    State(state): State<Arc<AppState>>,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    let get = |k: &str| form.get(k).map(String::as_str).unwrap_or_default();
    let resource = form.get("resource").map(String::as_str);
    let result = match get("grant_type") {
        "authorization_code" => {
            oauth::exchange_code(
                &state.ds,
                get("code"),
                get("client_id"),
                get("redirect_uri"),
                get("code_verifier"),
                resource,
            )
            .await
        }
        "refresh_token" => {
            oauth::refresh(&state.ds, get("refresh_token"), get("client_id"), resource).await
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
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    match oauth::revoke(&state.ds, form.get("token").map(String::as_str).unwrap_or_default()).await
    {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => oauth_error(StatusCode::SERVICE_UNAVAILABLE, e.into()),
    }
}
