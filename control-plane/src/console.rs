//! The tenant admins' console (server-rendered HTML). Every write goes through the same
//! services as the CLI and the API and is audited with channel `console`; every form carries
//! the session's CSRF token; the session cookie is HttpOnly, SameSite=Lax and Secure behind
//! https. The console takes console sessions only: a bearer token gets 401 naming the kind.

#![expect(
    clippy::result_large_err,
    reason = "handlers return early with the axum response to send"
)]

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use shared::error::Error;
use shared::rights::{Right, RightSet, Role};
use shared::secret::{self, CredentialKind};
use shared::services::console::ConsoleSession;
use shared::services::operators;
use shared::services::{activity, admin, approvals, console};
use shared::{OpCtx, time};

use crate::AppState;
use crate::html::{Nav, csrf_field, error_box, esc, page};

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
        .route("/", get(home))
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
        .route("/tenants", get(tenants).post(pick_tenant))
        .route("/connections", get(connections).post(create_connection))
        .route("/connections/{connection}", get(connection_detail))
        .route("/connections/{connection}/revoke", get(revoke_confirm).post(revoke))
        .route("/api-tokens", get(api_tokens).post(create_api_token))
        .route("/api-tokens/{token}/revoke", get(api_token_revoke_confirm).post(api_token_revoke))
        .route("/people", get(people))
        .route("/people/role", post(set_role))
        .route("/people/deactivate", get(deactivate_confirm).post(deactivate))
        .route("/approvals", get(approvals_page))
        .route("/approvals/count", get(approvals_count))
        .route("/approvals/{action}/{decision}", post(decide))
        .route("/settings/approval-policy", post(set_policy))
        .route("/settings/rate-limit", post(set_rate_limit))
        .route("/settings", get(settings))
        .route("/settings/agent-access", post(agent_access))
        .route("/audit", get(audit))
        .route("/audit.csv", get(audit_csv))
        .route("/activity", get(activity_page))
        .route("/messages", get(messages))
        .route("/operator", get(operator))
        .route("/operator/kill-switch", post(global_switch))
}

/// A signed-in console user.
pub struct Session {
    pub row: ConsoleSession,
    /// The cookie's session secret, to sign out with.
    token: String,
}

impl Session {
    fn ctx(&self) -> Option<OpCtx> {
        console::session_ctx(&self.row)
    }

    fn nav<'a>(&'a self, current: &'a str) -> Nav<'a> {
        let rights = console::session_rights(&self.row);
        Nav {
            current,
            tenant: self.row.tenant_name(),
            person: self.row.email(),
            csrf: self.row.csrf_token(),
            admin: rights.contains(Right::ConnectionsManage)
                || rights.contains(Right::PeopleManage),
            approver: shared::services::actions::Op::ALL
                .iter()
                .any(|op| rights.contains(op.right())),
            operator: self.row.is_operator(),
        }
    }

    fn check_csrf(&self, form: &BTreeMap<String, String>) -> Result<(), Response> {
        match form.get("csrf") {
            Some(t) if *t == self.row.csrf_token() => Ok(()),
            _ => Err((
                StatusCode::FORBIDDEN,
                Html(page(
                    "Form expired",
                    None,
                    &error_box("This form is stale or forged; reload the page and try again."),
                )),
            )
                .into_response()),
        }
    }
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name).then(|| v.to_owned())
        })
}

impl FromRequestParts<Arc<AppState>> for Session {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        // R20: the console takes console sessions only.
        if let Some(auth) = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
            let kind = match shared::auth::bearer(Some(auth)).and_then(CredentialKind::of) {
                Some(CredentialKind::Mcp) => "an MCP token, which only /mcp accepts",
                Some(CredentialKind::Api) => "an API token, which only /api accepts",
                _ => "a bearer token",
            };
            let body = page(
                "Sign in",
                None,
                &error_box(&format!(
                    "The console takes a console session (sign in at /login); the request carried {kind}."
                )),
            );
            return Err((StatusCode::UNAUTHORIZED, Html(body)).into_response());
        }
        let next =
            parts.uri.path_and_query().map(|p| p.as_str().to_owned()).unwrap_or_else(|| "/".into());
        let login = Redirect::to(&format!(
            "/login?next={}",
            url::form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>()
        ))
        .into_response();
        let Some(token) = cookie(&parts.headers, session_cookie(state)) else {
            return Err(login);
        };
        match console::session(&state.ds, &token).await {
            Ok(Some(row)) => Ok(Session { row, token }),
            Ok(None) => Err(login),
            Err(e) => Err(fail(e)),
        }
    }
}

fn fail(e: Error) -> Response {
    let status = match &e {
        Error::Forbidden { .. } | Error::NoActor => StatusCode::FORBIDDEN,
        Error::NotFound { .. } => StatusCode::NOT_FOUND,
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
        other => other.to_string(),
    };
    (
        status,
        Html(page(
            "Cannot do that",
            None,
            &format!("{}<p><a href=\"/\">Back</a></p>", error_box(&message)),
        )),
    )
        .into_response()
}

/// The session's tenant context, or a redirect to pick a tenant.
fn tenant_ctx(s: &Session) -> Result<OpCtx, Response> {
    s.ctx().ok_or_else(|| Redirect::to("/tenants").into_response())
}

/// A stored UTC time (ISO 8601) as people in the tenant read it: weekday, local time, zone.
fn local(ctx: &OpCtx, iso: &str) -> String {
    iso.parse::<jiff::Timestamp>()
        .map(|t| {
            time::present(t, &ctx.tenant().zone, &ctx.tenant().zone_name, jiff::Timestamp::now())
                .display
        })
        .unwrap_or_else(|_| iso.to_owned())
}

/// A post-sign-in target: resolved as a browser resolves it against the console's own origin,
/// and kept only if it stays there (so `//evil`, `/\\evil`, `/\tevil` and `https://evil` all
/// become `/`). What is returned is the parsed path and query, never the raw text.
pub fn safe_next(next: Option<&String>) -> String {
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
fn direction(form: &BTreeMap<String, String>) -> Result<bool, Response> {
    match form.get("to").map(String::as_str) {
        Some("on") => Ok(true),
        Some("off") => Ok(false),
        _ => Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            Html(page(
                "Choose",
                None,
                &error_box("Say whether to turn it on or off; nothing changed."),
            )),
        )
            .into_response()),
    }
}

/// The reason a revocation form gives, or the console's default one.
fn reason(form: &BTreeMap<String, String>) -> &str {
    form.get("reason")
        .map(|r| r.trim())
        .filter(|r| !r.is_empty())
        .unwrap_or("revoked in the console")
}

/// A path segment for a console URL, percent-encoded.
fn segment(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

// ---------------------------------------------------------------- sign in / out

async fn login_form(
    State(state): State<Arc<AppState>>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let token = secret::generate(CredentialKind::Session)["gh_ses_".len()..].to_owned();
    with_login_cookie(
        &state,
        &token,
        Html(login_page(&safe_next(q.get("next")), &token, None)).into_response(),
    )
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

fn login_page(next: &str, csrf: &str, error: Option<&str>) -> String {
    page(
        "Sign in",
        None,
        &format!(
            "{}<form method=\"post\" action=\"/login\" class=\"card\"><input type=\"hidden\" name=\"next\" value=\"{}\"><input type=\"hidden\" name=\"login_csrf\" value=\"{}\">\
             <label>Email <input type=\"email\" name=\"email\" autocomplete=\"username\" required maxlength=\"254\"></label>\
             <label>Password <input type=\"password\" name=\"password\" autocomplete=\"current-password\" required maxlength=\"1024\"></label>\
             <button type=\"submit\">Sign in</button></form>",
            error.map(error_box).unwrap_or_default(),
            esc(next),
            esc(csrf)
        ),
    )
}

/// The address a request came from, for throttling: the last `X-Forwarded-For` entry (the one
/// the trusted proxy appended) behind a trusted proxy, the peer's address otherwise.
pub struct Source(pub String);

impl FromRequestParts<Arc<AppState>> for Source {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        // The entry our proxy appended is the last one, of the last header line (proxies may
        // add a line of their own); those before it are the client's word.
        let forwarded = state
            .trust_forwarded_for
            .then(|| parts.headers.get_all("x-forwarded-for").iter().next_back())
            .flatten()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit(',').next())
            .and_then(|v| v.trim().parse::<std::net::IpAddr>().ok());
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0.ip());
        Ok(Source(forwarded.or(peer).map(|ip| ip.to_string()).unwrap_or_else(|| "unknown".into())))
    }
}

async fn login(
    State(state): State<Arc<AppState>>,
    Source(source): Source,
    headers: HeaderMap,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    let next = safe_next(form.get("next"));
    // The form must echo the cookie its page set: another site cannot sign a browser in.
    let expected = cookie(&headers, login_cookie(&state)).filter(|c| !c.is_empty());
    let Some(csrf) = expected.filter(|c| form.get("login_csrf") == Some(c)) else {
        let token = secret::generate(CredentialKind::Session)["gh_ses_".len()..].to_owned();
        let page = login_page(&next, &token, Some("This sign-in form expired; sign in again."));
        return with_login_cookie(
            &state,
            &token,
            (StatusCode::FORBIDDEN, Html(page)).into_response(),
        );
    };
    let (email, password) = (
        form.get("email").cloned().unwrap_or_default(),
        form.get("password").cloned().unwrap_or_default(),
    );
    match console::sign_in(&state.ds, &email, &password, &source).await {
        Ok(signed) => {
            let secure = if state.public_url.starts_with("https://") { "; Secure" } else { "" };
            let cookie = format!(
                "{}={}; HttpOnly; SameSite=Lax; Path=/; Max-Age={}{secure}",
                session_cookie(&state),
                signed.token,
                console::SESSION_TTL_SECS
            );
            let mut response = Redirect::to(&next).into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, v);
            }
            response
        }
        Err(Error::Unauthenticated(message)) => {
            (StatusCode::UNAUTHORIZED, Html(login_page(&next, &csrf, Some(&message))))
                .into_response()
        }
        Err(e) => fail(e),
    }
}

async fn logout(
    State(state): State<Arc<AppState>>,
    s: Session,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    if let Err(r) = s.check_csrf(&form) {
        return r;
    }
    if let Err(e) = console::sign_out(&state.ds, &s.token).await {
        return fail(e);
    }
    let mut response = Redirect::to("/login").into_response();
    let secure = if state.public_url.starts_with("https://") { "; Secure" } else { "" };
    let gone =
        format!("{}=; HttpOnly; SameSite=Lax; Path=/; Max-Age=0{secure}", session_cookie(&state));
    if let Ok(v) = HeaderValue::from_str(&gone) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

async fn tenants(
    State(state): State<Arc<AppState>>,
    s: Session,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let list = match console::tenants_of(&state.ds, &s.row).await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let next = safe_next(q.get("next"));
    let items: String = list
        .iter()
        .map(|m| {
            format!(
                "<li><form method=\"post\" action=\"/tenants\">{}<input type=\"hidden\" name=\"tenant\" value=\"{}\"><input type=\"hidden\" name=\"next\" value=\"{}\">\
                 <button type=\"submit\">{}</button> as {}</form></li>",
                csrf_field(s.row.csrf_token()),
                m.tenant_id,
                esc(&next),
                esc(&m.name),
                esc(&m.role)
            )
        })
        .collect();
    let body = if items.is_empty() {
        error_box("You are not a member of any tenant.")
    } else {
        format!("<ul>{items}</ul>")
    };
    Html(page("Pick a tenant", Some(&s.nav("/tenants")), &body)).into_response()
}

async fn pick_tenant(
    State(state): State<Arc<AppState>>,
    s: Session,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    if let Err(r) = s.check_csrf(&form) {
        return r;
    }
    let Some(tenant) = form.get("tenant").and_then(|t| t.parse::<i64>().ok()) else {
        return fail(Error::invalid("tenant", "pick a tenant"));
    };
    if let Err(e) = console::pick_tenant(&state.ds, &s.row, tenant).await {
        return fail(e);
    }
    Redirect::to(&safe_next(form.get("next"))).into_response()
}

// ---------------------------------------------------------------- connections

fn rights_picker(holds: RightSet, checked: RightSet) -> String {
    let boxes: String = holds
        .iter()
        .map(|r| {
            format!(
                "<label><input type=\"checkbox\" name=\"right\" value=\"{0}\"{1}> <code>{0}</code> — {2}</label>",
                r.as_str(),
                if checked.contains(r) { " checked" } else { "" },
                esc(r.description())
            )
        })
        .collect();
    format!("<fieldset><legend>Rights (at most your own)</legend>{boxes}</fieldset>")
}

async fn connections(State(state): State<Arc<AppState>>, s: Session) -> Response {
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let list = match admin::connection_list(&state.ds, &ctx).await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let rows: String = list
        .iter()
        .map(|c| {
            format!(
                "<tr><td><a href=\"/connections/{0}\">{1}</a><br><code>{0}</code></td><td>{2}</td><td>{3}</td><td>{4}<br><small>toolset {8}</small></td><td>{5}</td><td>{6}</td><td class=\"status-{7}\">{7}</td></tr>",
                esc(&c.connection),
                esc(&c.name),
                esc(&c.client_name),
                esc(&c.creator),
                esc(&c.rights.join(", ")),
                esc(&local(&ctx, &c.created_at)),
                esc(&c.last_used_at.as_deref().map(|t| local(&ctx, t)).unwrap_or_else(|| "never".into())),
                esc(&c.status),
                esc(&c.toolset)
            )
        })
        .collect();
    let body = format!(
        "<table><thead><tr><th>Connection</th><th>Client</th><th>Created by</th><th>Rights</th><th>Created</th><th>Last used</th><th>Status</th></tr></thead><tbody>{rows}</tbody></table>\
         <form method=\"post\" action=\"/connections\" class=\"card\"><h2>New connection</h2>{}\
         <label>Name <input type=\"text\" name=\"name\" required maxlength=\"80\" placeholder=\"Claude Code on my laptop\"></label>\
         <label>Toolset <select name=\"toolset\"><option value=\"full\">full — every tool the rights allow</option>\
         <option value=\"read_only\">read_only — read tools only</option><option value=\"small\">small — a few combined tools for small models</option></select></label>{}\
         <button type=\"submit\">Create connection</button></form>",
        csrf_field(s.row.csrf_token()),
        rights_picker(ctx.rights(), shared::rights::read_only().intersect(ctx.rights()))
    );
    Html(page("Connections", Some(&s.nav("/connections")), &body)).into_response()
}

async fn create_connection(
    State(state): State<Arc<AppState>>,
    s: Session,
    Form(form): Form<Vec<(String, String)>>,
) -> Response {
    let map: BTreeMap<String, String> = form.iter().cloned().collect();
    if let Err(r) = s.check_csrf(&map) {
        return r;
    }
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let names: Vec<&str> =
        form.iter().filter(|(k, _)| k == "right").map(|(_, v)| v.as_str()).collect();
    let rights = match RightSet::parse(&names) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let name = map.get("name").cloned().unwrap_or_default();
    let toolset = map.get("toolset").map(String::as_str).unwrap_or("full");
    let new = admin::NewConnection {
        creator_email: s.row.email(),
        name: &name,
        client_name: "console",
        rights,
        toolset,
    };
    match admin::connection_create(&state.ds, &ctx, new).await {
        Ok(c) => {
            let mcp = state.mcp_resources.first().cloned().unwrap_or_default();
            let claude = format!(
                "claude mcp add --transport http gatehouse {mcp} --header \"Authorization: Bearer {}\"",
                c.token
            );
            let body = format!(
                "<p class=\"ok\" role=\"status\">Connection <code>{}</code> created with {}.</p>\
                 <div class=\"card\"><p><strong>Copy the token now: it is shown once and only its hash is kept.</strong></p>\
                 <pre id=\"token\">{}</pre><button type=\"button\" class=\"plain\" data-copy=\"token\">Copy token</button>\
                 <p>Claude Code:</p><pre id=\"claude\">{}</pre><button type=\"button\" class=\"plain\" data-copy=\"claude\">Copy command</button></div>\
                 <p><a href=\"/connections\">Back to connections</a></p>",
                esc(&c.connection),
                esc(&c.rights.join(", ")),
                esc(&c.token),
                esc(&claude)
            );
            Html(page("Connection created", Some(&s.nav("/connections")), &body)).into_response()
        }
        Err(e) => fail(e),
    }
}

async fn connection_detail(
    State(state): State<Arc<AppState>>,
    s: Session,
    Path(handle): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let c = match admin::connection_get(&state.ds, &ctx, &handle).await {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let changes = match admin::audit_list(&state.ds, &ctx, Some(&c.connection), 50).await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let span = activity::Span::parse(q.get("span").map(String::as_str));
    let pictures = match activity::activity(
        &state.ds,
        &ctx,
        Some(&c.connection),
        span,
        jiff::Timestamp::now(),
    )
    .await
    {
        Ok(a) => crate::pictures::section(
            "connection-activity",
            &format!("/connections/{}", segment(&c.connection)),
            &a,
            true,
        ),
        Err(e) => return fail(e),
    };
    let rows: String = changes
        .iter()
        .map(|a| {
            format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&local(&ctx, &a.at)),
                esc(&a.action),
                esc(&a.outcome),
                esc(&a.targets.join(", "))
            )
        })
        .collect();
    let changes = if rows.is_empty() {
        "<p class=\"muted\">No changes yet.</p>".to_owned()
    } else {
        format!(
            "<table><thead><tr><th>When</th><th>Tool</th><th>Outcome</th><th>Records</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    };
    let revoke = if c.status == "active" {
        format!(
            "<p><a href=\"/connections/{}/revoke\">Revoke this connection…</a></p>",
            esc(&c.connection)
        )
    } else {
        String::new()
    };
    let body = format!(
        "<div class=\"card\"><p><code>{handle}</code> · client {client} · created by {creator} on {created} · last used {used} · <span class=\"status-{status}\">{status}</span></p><p>Rights: {rights}</p>{revoke}</div>{pictures}\
         <h2>Recent changes</h2><p><a href=\"/audit?connection={handle}\">All of this connection's changes in the audit log</a></p>{changes}",
        handle = esc(&c.connection),
        client = esc(&c.client_name),
        creator = esc(&c.creator),
        created = esc(&local(&ctx, &c.created_at)),
        used = esc(&c
            .last_used_at
            .as_deref()
            .map(|t| local(&ctx, t))
            .unwrap_or_else(|| "never".into())),
        status = esc(&c.status),
        rights = esc(&c.rights.join(", ")),
    );
    Html(page(&c.name, Some(&s.nav("/connections")), &body)).into_response()
}

async fn revoke_confirm(
    State(state): State<Arc<AppState>>,
    s: Session,
    Path(handle): Path<String>,
) -> Response {
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    // A confirmation page exists only for a connection that exists; its URL is built from the
    // parsed handle, never from the raw path.
    let handle = match admin::connection_get(&state.ds, &ctx, &handle).await {
        Ok(c) => segment(&c.connection),
        Err(e) => return fail(e),
    };
    let body = format!(
        "<form method=\"post\" action=\"/connections/{0}/revoke\" class=\"card\">{1}<p>Revoke <code>{0}</code>? Its tokens stop working on their next request, on every worker. This cannot be undone.</p>\
         <label>Reason <input type=\"text\" name=\"reason\" required maxlength=\"300\"></label><button type=\"submit\" class=\"danger\">Revoke</button> <a href=\"/connections/{0}\">Cancel</a></form>",
        esc(&handle),
        csrf_field(s.row.csrf_token())
    );
    Html(page("Revoke connection", Some(&s.nav("/connections")), &body)).into_response()
}

async fn revoke(
    State(state): State<Arc<AppState>>,
    s: Session,
    Path(handle): Path<String>,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    if let Err(r) = s.check_csrf(&form) {
        return r;
    }
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let reason = reason(&form);
    match admin::connection_revoke(&state.ds, &ctx, &handle, reason).await {
        Ok(r) => Redirect::to(&format!("/connections/{}", segment(&r.connection))).into_response(),
        Err(e) => fail(e),
    }
}

// ---------------------------------------------------------------- API tokens

async fn api_tokens(State(state): State<Arc<AppState>>, s: Session) -> Response {
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let list = match admin::api_token_list(&state.ds, &ctx).await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let rows: String = list
        .iter()
        .map(|t| {
            let action = if t.status == "active" {
                format!("<a href=\"/api-tokens/{}/revoke\">Revoke…</a>", esc(&segment(&t.api_token)))
            } else {
                String::new()
            };
            format!(
                "<tr><td>{}<br><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td class=\"status-{status}\">{status}</td><td>{action}</td></tr>",
                esc(&t.name),
                esc(&t.api_token),
                esc(&t.person),
                esc(&local(&ctx, &t.created_at)),
                esc(&local(&ctx, &t.expires_at)),
                status = esc(t.status),
            )
        })
        .collect();
    let body = format!(
        "<p>API tokens call the REST API (<code>/api/v1</code>) as a person, with that person's current role. They never work on the MCP endpoint, and they expire.</p>\
         <table><thead><tr><th>Token</th><th>Acts for</th><th>Created</th><th>Expires</th><th>Status</th><th></th></tr></thead><tbody>{rows}</tbody></table>\
         <form method=\"post\" action=\"/api-tokens\" class=\"card\"><h2>New API token</h2>{csrf}\
         <label>Name <input type=\"text\" name=\"name\" required maxlength=\"{max_name}\" placeholder=\"Nightly export\"></label>\
         <p>It acts for you ({me}), with your role's rights at the time of each request; it ends when you leave the tenant.</p>\
         <label>Expires after <select name=\"expires_in_days\"><option value=\"7\">7 days</option><option value=\"30\">30 days</option><option value=\"90\" selected>90 days</option><option value=\"365\">365 days</option></select></label>\
         <button type=\"submit\">Create API token</button></form>",
        csrf = csrf_field(s.row.csrf_token()),
        max_name = admin::API_TOKEN_NAME_CHARS,
        me = esc(s.row.email()),
    );
    Html(page("API tokens", Some(&s.nav("/api-tokens")), &body)).into_response()
}

async fn create_api_token(
    State(state): State<Arc<AppState>>,
    s: Session,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    if let Err(r) = s.check_csrf(&form) {
        return r;
    }
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let days = match form.get("expires_in_days").map(|d| d.trim().parse::<i64>()) {
        Some(Ok(days)) => days,
        _ => {
            return fail(Error::invalid(
                "expires_in_days",
                "choose how many days the token lives (1 to 365)",
            ));
        }
    };
    // A console token acts for the person who creates it: an admin cannot mint a credential
    // that speaks as someone else and outlives the admin's own membership.
    let name = form.get("name").map(String::as_str).unwrap_or_default();
    match admin::api_token_create(&state.ds, &ctx, s.row.email(), name, Some(days)).await {
        Ok(t) => {
            let body = format!(
                "<p class=\"ok\" role=\"status\">API token <code>{}</code> created for {}; it expires {}.</p>\
                 <div class=\"card\"><p><strong>Copy the token now: it is shown once and only its hash is kept.</strong></p>\
                 <pre id=\"token\">{}</pre><button type=\"button\" class=\"plain\" data-copy=\"token\">Copy token</button>\
                 <p>Use it as <code>Authorization: Bearer …</code> on <code>/api/v1</code>.</p></div>\
                 <p><a href=\"/api-tokens\">Back to API tokens</a></p>",
                esc(&t.api_token),
                esc(&t.person),
                esc(&local(&ctx, &t.expires_at)),
                esc(&t.token),
            );
            Html(page("API token created", Some(&s.nav("/api-tokens")), &body)).into_response()
        }
        Err(e) => fail(e),
    }
}

async fn api_token_revoke_confirm(
    State(state): State<Arc<AppState>>,
    s: Session,
    Path(handle): Path<String>,
) -> Response {
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    // A confirmation page exists only for a token of this tenant; its URL is built from the
    // parsed handle, never from the raw path.
    let t = match admin::api_token_get(&state.ds, &ctx, &handle).await {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let body = format!(
        "<form method=\"post\" action=\"/api-tokens/{0}/revoke\" class=\"card\">{1}<p>Revoke <code>{2}</code> ({3}, acting for {4})? It is refused from its next request on. This cannot be undone.</p>\
         <label>Reason <input type=\"text\" name=\"reason\" required maxlength=\"300\"></label><button type=\"submit\" class=\"danger\">Revoke</button> <a href=\"/api-tokens\">Cancel</a></form>",
        esc(&segment(&t.api_token)),
        csrf_field(s.row.csrf_token()),
        esc(&t.api_token),
        esc(&t.name),
        esc(&t.person),
    );
    Html(page("Revoke API token", Some(&s.nav("/api-tokens")), &body)).into_response()
}

async fn api_token_revoke(
    State(state): State<Arc<AppState>>,
    s: Session,
    Path(handle): Path<String>,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    if let Err(r) = s.check_csrf(&form) {
        return r;
    }
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let reason = reason(&form);
    match admin::api_token_revoke(&state.ds, &ctx, &handle, reason).await {
        Ok(_) => Redirect::to("/api-tokens").into_response(),
        Err(e) => fail(e),
    }
}

// ---------------------------------------------------------------- approvals

/// Where a person starts: admins at their connections, approvers at what waits for them.
async fn home(s: Session) -> Response {
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
        let body = format!(
            "<div class=\"card\"><p>Signed in as <strong>{}</strong> in <strong>{}</strong>. Your role here has no console pages: connections, approvals and the audit log are for tenant admins and dispatchers.</p>\
             <p>You can still connect an agent from your MCP client; it signs you in here and acts with your rights. For more, ask a tenant admin for another role.</p>\
             <p><a href=\"/tenants\">Work in another tenant</a></p></div>",
            esc(s.row.name()),
            esc(tenant)
        );
        return Html(page("Nothing to manage here", Some(&s.nav("/")), &body)).into_response();
    } else {
        "/tenants"
    };
    Redirect::to(start).into_response()
}

/// A pending action's handle as it may appear in a URL: `pac_` and lowercase alphanumerics.
fn action_handle(raw: &str) -> Option<&str> {
    let tail = raw.strip_prefix("pac_")?;
    (!tail.is_empty()
        && tail.len() <= 40
        && tail.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()))
    .then_some(raw)
}

/// The approval policy as a form: one row per effect class.
fn policy_form(policy: &approvals::Policy, csrf: &str) -> String {
    let rows: String = approvals::CLASSES
        .iter()
        .map(|class| {
            let scope = format!("class:{}", class.as_str());
            let rule = policy.rules.iter().find(|r| r.scope == scope);
            let mode = rule.map(|r| r.mode).unwrap_or(approvals::DEFAULT);
            let options: String = [
                (approvals::Completion::AgentConfirms, "the agent confirms (preview, then confirm_action)"),
                (approvals::Completion::PersonApproves, "a person approves in the console"),
                (approvals::Completion::Off, "off: agents cannot prepare it"),
            ]
            .iter()
            .map(|(m, label)| {
                format!(
                    "<option value=\"{}\"{}>{label}</option>",
                    m.as_str(),
                    if *m == mode { " selected" } else { "" }
                )
            })
            .collect();
            format!(
                "<form method=\"post\" action=\"/settings/approval-policy\" class=\"policy-row\">{csrf}<input type=\"hidden\" name=\"scope\" value=\"{class}\">\
                 <label><strong>{class}</strong> actions: <select name=\"mode\" aria-label=\"Who completes {class} actions\">{options}</select></label>\
                 <label><input type=\"checkbox\" name=\"approver_not_creator\" value=\"yes\"{checked}> with a person approving: never the connection's own creator</label>\
                 <button type=\"submit\">Save</button></form>",
                csrf = csrf_field(csrf),
                class = esc(class.as_str()),
                checked = if rule.is_some_and(|r| r.approver_not_creator) { " checked" } else { "" },
            )
        })
        .collect();
    let tools: String = policy
        .rules
        .iter()
        .filter(|r| r.scope.starts_with("tool:"))
        .map(|r| format!("<li><code>{}</code>: {}</li>", esc(&r.scope[5..]), esc(r.mode.as_str())))
        .collect();
    format!(
        "<div class=\"card\"><h2>Who completes agents' actions</h2><p>Actions that reach customers (notify), page someone (wake), mute alerts (alert) or delete are prepared by agents and completed as set here. A tool's own rule (set with <code>gatehousectl approval-policy set --scope TOOL</code>) comes before its class's.</p>{rows}{}</div>",
        if tools.is_empty() { String::new() } else { format!("<p>Per tool:</p><ul>{tools}</ul>") }
    )
}

/// The rate buckets as a form: one row per class.
fn limits_form(limits: &[shared::services::rates::Limit], csrf: &str) -> String {
    let rows: String = limits
        .iter()
        .map(|l| {
            format!(
                "<tr><td><code>{class}</code></td><td>{counted}</td><td>{default}</td><td><form method=\"post\" action=\"/settings/rate-limit\" class=\"inline\">{csrf}<input type=\"hidden\" name=\"class\" value=\"{class}\">\
                 <input type=\"number\" name=\"per_minute\" min=\"1\" max=\"{max}\" value=\"{value}\" aria-label=\"Calls per minute for {class}\" required> <button type=\"submit\">Save</button></form>{reset}</td></tr>",
                class = esc(l.class),
                counted = if l.counted == "per_worker" { "on each worker" } else { "across all workers" },
                default = l.default,
                value = l.per_minute,
                max = shared::services::rates::MAX_PER_MINUTE,
                csrf = csrf_field(csrf),
                reset = if l.overridden {
                    format!(
                        " <form method=\"post\" action=\"/settings/rate-limit\" class=\"inline\">{}<input type=\"hidden\" name=\"class\" value=\"{}\"><input type=\"hidden\" name=\"per_minute\" value=\"default\"><button type=\"submit\" class=\"plain\">Back to default</button></form>",
                        csrf_field(csrf),
                        esc(l.class)
                    )
                } else {
                    String::new()
                },
            )
        })
        .collect();
    format!(
        "<div class=\"card\"><h2>Rate limits per connection</h2><p>Calls each agent connection may make per minute, by effect class. A connection past its limit is told which limit and when to retry.</p>\
         <table><thead><tr><th>Class</th><th>Counted</th><th>Default</th><th>Per minute</th></tr></thead><tbody>{rows}</tbody></table></div>"
    )
}

async fn set_rate_limit(
    State(state): State<Arc<AppState>>,
    s: Session,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    if let Err(r) = s.check_csrf(&form) {
        return r;
    }
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let per_minute = match form.get("per_minute").map(|v| v.trim()) {
        Some("default") => None,
        Some(n) => match n.parse::<i32>() {
            Ok(n) => Some(n),
            Err(_) => {
                return fail(Error::invalid("per_minute", "a whole number of calls per minute"));
            }
        },
        None => {
            return fail(Error::invalid("per_minute", "say how many calls per minute, or default"));
        }
    };
    let class = form.get("class").map(String::as_str).unwrap_or_default();
    match shared::services::rates::set_limit(&state.ds, &ctx, class, per_minute).await {
        Ok(_) => Redirect::to("/settings").into_response(),
        Err(e) => fail(e),
    }
}

async fn set_policy(
    State(state): State<Arc<AppState>>,
    s: Session,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    if let Err(r) = s.check_csrf(&form) {
        return r;
    }
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    // A form names its mode; a missing or unknown one changes nothing.
    let mode = match form.get("mode").map(|m| approvals::Completion::parse("mode", m)) {
        Some(Ok(mode)) => mode,
        Some(Err(e)) => return fail(e),
        None => return fail(Error::invalid("mode", "choose who completes these actions")),
    };
    let scope = form.get("scope").map(String::as_str).unwrap_or_default();
    let not_creator = form.get("approver_not_creator").is_some_and(|v| v == "yes")
        && mode == approvals::Completion::PersonApproves;
    match approvals::policy_set(&state.ds, &ctx, scope, Some(mode), not_creator).await {
        Ok(_) => Redirect::to("/settings").into_response(),
        Err(e) => fail(e),
    }
}

async fn approvals_page(
    State(state): State<Arc<AppState>>,
    s: Session,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    // The outcome of the decision just made (post, redirect, get): handles parsed, the
    // outcome one of three words, nothing else of the query shown.
    let decided = q.get("decided").and_then(|h| action_handle(h));
    let status = match (decided, q.get("outcome").map(String::as_str)) {
        (Some(a), Some("executed")) => format!(
            "<p class=\"ok\" role=\"status\">Approved and executed {}; the agent sees the result when it asks.</p>",
            esc(a)
        ),
        (Some(a), Some("denied")) => format!(
            "<p class=\"ok\" role=\"status\">Denied {}; the agent is told, with your reason.</p>",
            esc(a)
        ),
        (Some(a), Some("changed")) => format!(
            "<p class=\"error\" role=\"status\">{} changed since it was prepared, so nothing was executed; the new version {} waits below.</p>",
            esc(a),
            esc(q.get("replaced_by").and_then(|h| action_handle(h)).unwrap_or("(see below)"))
        ),
        _ => String::new(),
    };
    let waiting = match approvals::awaiting(&state.ds, &ctx).await {
        Ok(w) => w,
        Err(e) => return fail(e),
    };
    let cards: String = waiting
        .iter()
        .map(|a| {
            let action = segment(&a.action);
            let effect = serde_json::to_string_pretty(&a.effect).unwrap_or_default();
            format!(
                "<div class=\"card approval\" data-action=\"{handle}\"><p><strong>{summary}</strong></p>\
                 <p>Asked by the connection <strong>{connection}</strong> (client {client}) of {person}; prepared {created}; expires {expires}. Tool <code>{tool}</code>, action <code>{handle}</code>.</p>\
                 <details open><summary>Exactly what will be sent or changed</summary><pre>{effect}</pre></details>\
                 <form method=\"post\" action=\"/approvals/{action}/approve\">{csrf}<label>Reason to approve <input type=\"text\" name=\"reason\" required maxlength=\"500\" aria-label=\"Reason to approve {handle}\"></label><button type=\"submit\">Approve</button></form>\
                 <form method=\"post\" action=\"/approvals/{action}/deny\">{csrf}<label>Reason to deny <input type=\"text\" name=\"reason\" required maxlength=\"500\" aria-label=\"Reason to deny {handle}\"></label><button type=\"submit\" class=\"danger\">Deny</button></form></div>",
                handle = esc(&a.action),
                summary = esc(&a.summary),
                connection = esc(&a.connection),
                client = esc(&a.client),
                person = esc(&a.asked_for_by),
                created = esc(&local(&ctx, &a.created_at)),
                expires = esc(&local(&ctx, &a.expires_at)),
                tool = esc(&a.tool),
                effect = esc(&effect),
                action = esc(&action),
                csrf = csrf_field(s.row.csrf_token()),
            )
        })
        .collect();
    let body = if cards.is_empty() {
        format!(
            "{status}<p class=\"card\" id=\"no-approvals\">Nothing waits for approval. Agents' actions wait here when the tenant's policy (Agent access) says a person approves them.</p>"
        )
    } else {
        format!("{status}{cards}")
    };
    Html(page("Approvals", Some(&s.nav("/approvals")), &body)).into_response()
}

/// The navigation's count of waiting actions, polled by the console's script.
async fn approvals_count(State(state): State<Arc<AppState>>, s: Session) -> Response {
    let Some(ctx) = s.ctx() else {
        return axum::Json(serde_json::json!({"count": 0})).into_response();
    };
    match approvals::awaiting_count(&state.ds, &ctx).await {
        Ok(n) => axum::Json(serde_json::json!({"count": n})).into_response(),
        Err(e) => fail(e),
    }
}

async fn decide(
    State(state): State<Arc<AppState>>,
    s: Session,
    Path((action, decision)): Path<(String, String)>,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    if let Err(r) = s.check_csrf(&form) {
        return r;
    }
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let reason = form.get("reason").map(String::as_str).unwrap_or_default();
    let now = jiff::Timestamp::now();
    let decided = match decision.as_str() {
        "approve" => approvals::approve(&state.ds, &ctx, &action, reason, now).await,
        "deny" => approvals::deny(&state.ds, &ctx, &action, reason, now).await,
        _ => {
            return (
                StatusCode::NOT_FOUND,
                Html(page("Not found", None, &error_box("No such decision."))),
            )
                .into_response();
        }
    };
    // Post, redirect, get: a reload never sends the decision again.
    let target = match decided {
        Ok(approvals::Decided::Executed { action, .. }) => {
            format!("/approvals?decided={}&outcome=executed", segment(&action))
        }
        Ok(approvals::Decided::Denied { action }) => {
            format!("/approvals?decided={}&outcome=denied", segment(&action))
        }
        Ok(approvals::Decided::Changed { action, replaced_by }) => format!(
            "/approvals?decided={}&outcome=changed&replaced_by={}",
            segment(&action),
            segment(&replaced_by)
        ),
        Err(e) => return fail(e),
    };
    Redirect::to(&target).into_response()
}

// ---------------------------------------------------------------- people

async fn people(State(state): State<Arc<AppState>>, s: Session) -> Response {
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let list = match console::people(&state.ds, &ctx).await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let rows: String = list
        .iter()
        .map(|p| {
            let options: String = Role::ALL
                .iter()
                .map(|r| format!("<option value=\"{0}\"{1}>{0}</option>", r.as_str(), if r.as_str() == p.role { " selected" } else { "" }))
                .collect();
            let actions = if p.active {
                format!(
                    "<form method=\"post\" action=\"/people/role\">{}<input type=\"hidden\" name=\"email\" value=\"{}\"><label>Role <select name=\"role\" aria-label=\"Role of {}\">{options}</select></label> <button type=\"submit\">Save role</button></form>\
                     <a href=\"/people/deactivate?email={}\">Deactivate…</a>",
                    csrf_field(s.row.csrf_token()),
                    esc(&p.email),
                    esc(&p.email),
                    url::form_urlencoded::byte_serialize(p.email.as_bytes()).collect::<String>()
                )
            } else {
                "deactivated".into()
            };
            format!("<tr><td>{}<br><code>{}</code></td><td>{}</td><td>{}</td><td>{actions}</td></tr>", esc(&p.name), esc(&p.handle), esc(&p.email), esc(&p.role))
        })
        .collect();
    let body = format!(
        "<table><thead><tr><th>Person</th><th>Email</th><th>Role</th><th></th></tr></thead><tbody>{rows}</tbody></table>"
    );
    Html(page("People", Some(&s.nav("/people")), &body)).into_response()
}

async fn set_role(
    State(state): State<Arc<AppState>>,
    s: Session,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    if let Err(r) = s.check_csrf(&form) {
        return r;
    }
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let role = match form.get("role").map(|r| r.parse::<Role>()) {
        Some(Ok(r)) => r,
        Some(Err(e)) => return fail(e),
        None => return fail(Error::invalid("role", "pick a role")),
    };
    match admin::person_set_role(
        &state.ds,
        &ctx,
        form.get("email").map(String::as_str).unwrap_or_default(),
        role,
    )
    .await
    {
        Ok(_) => Redirect::to("/people").into_response(),
        Err(e) => fail(e),
    }
}

async fn deactivate_confirm(
    State(state): State<Arc<AppState>>,
    s: Session,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    // A confirmation page exists only for a person of this tenant.
    let wanted = q.get("email").map(|e| e.trim().to_lowercase()).unwrap_or_default();
    let email = match console::people(&state.ds, &ctx).await {
        Ok(people) => match people.into_iter().find(|p| p.email.to_lowercase() == wanted) {
            Some(p) => p.email,
            None => return fail(Error::not_found(shared::error::Resource::Person, wanted)),
        },
        Err(e) => return fail(e),
    };
    let body = format!(
        "<form method=\"post\" action=\"/people/deactivate\" class=\"card\">{}<input type=\"hidden\" name=\"email\" value=\"{1}\">\
         <p>Deactivate <strong>{1}</strong>? Every connection they created in this tenant ends at once.</p>\
         <button type=\"submit\" class=\"danger\">Deactivate</button> <a href=\"/people\">Cancel</a></form>",
        csrf_field(s.row.csrf_token()),
        esc(&email)
    );
    Html(page("Deactivate person", Some(&s.nav("/people")), &body)).into_response()
}

async fn deactivate(
    State(state): State<Arc<AppState>>,
    s: Session,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    if let Err(r) = s.check_csrf(&form) {
        return r;
    }
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    match admin::person_deactivate(
        &state.ds,
        &ctx,
        form.get("email").map(String::as_str).unwrap_or_default(),
    )
    .await
    {
        Ok(_) => Redirect::to("/people").into_response(),
        Err(e) => fail(e),
    }
}

// ---------------------------------------------------------------- switches and audit

async fn settings(State(state): State<Arc<AppState>>, s: Session) -> Response {
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let policy = match approvals::policy(&state.ds, &ctx).await {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let limits = match shared::services::rates::limits(&state.ds, &ctx).await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let on = s.row.tenant_agent_access().unwrap_or(true);
    let (state_text, button, to) = if on {
        (
            "Agents can use this tenant's connections.",
            "<button type=\"submit\" class=\"danger\">Turn agent access off</button>",
            "off",
        )
    } else {
        (
            "Agent access is OFF: every agent request for this tenant is refused.",
            "<button type=\"submit\">Turn agent access on</button>",
            "on",
        )
    };
    let body = format!(
        "<div class=\"card\"><p id=\"agent-access-state\">{state_text}</p><form method=\"post\" action=\"/settings/agent-access\">{}<input type=\"hidden\" name=\"to\" value=\"{to}\">\
         <label>Reason <input type=\"text\" name=\"reason\" required maxlength=\"300\"></label>{button}</form></div><p>Tenant: {}</p>{}",
        csrf_field(s.row.csrf_token()),
        esc(&ctx.tenant().slug),
        policy_form(&policy, s.row.csrf_token()),
    ) + &limits_form(&limits, s.row.csrf_token());
    Html(page("Agent access", Some(&s.nav("/settings")), &body)).into_response()
}

async fn agent_access(
    State(state): State<Arc<AppState>>,
    s: Session,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    if let Err(r) = s.check_csrf(&form) {
        return r;
    }
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    // Agent access `on` lets agents in; `off` is the kill switch for the tenant.
    let kill = match direction(&form) {
        Ok(on) => !on,
        Err(r) => return r,
    };
    let reason = form.get("reason").cloned().unwrap_or_default();
    match admin::kill_switch_set(&state.ds, admin::SwitchScope::Tenant(&ctx), kill, &reason).await {
        Ok(_) => Redirect::to("/settings").into_response(),
        Err(e) => fail(e),
    }
}

/// The audit search of a request's query: the filters of [`admin::AuditFilter`].
fn audit_filter(q: &BTreeMap<String, String>) -> admin::AuditFilter {
    let get = |k: &str| q.get(k).cloned();
    admin::AuditFilter {
        connection: get("connection"),
        action: get("action").or_else(|| get("tool")),
        outcome: get("outcome"),
        channel: get("channel"),
        since: get("since"),
        until: get("until"),
        cursor: get("cursor"),
    }
}

/// The query string of a search without its cursor, for the next page and the CSV link.
fn audit_query(q: &BTreeMap<String, String>) -> String {
    let pairs: Vec<(&str, &str)> = ["connection", "action", "outcome", "channel", "since", "until"]
        .iter()
        .filter_map(|k| q.get(*k).map(|v| (*k, v.trim())).filter(|(_, v)| !v.is_empty()))
        .collect();
    url::form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish()
}

async fn audit(
    State(state): State<Arc<AppState>>,
    s: Session,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let filter = audit_filter(&q);
    let value = |k: &str| esc(q.get(k).map(String::as_str).unwrap_or(""));
    let select = |name: &str, options: &[&str]| {
        let current = q.get(name).map(|v| v.trim()).unwrap_or("");
        let mut out = format!("<select name=\"{name}\"><option value=\"\">any</option>");
        for o in options {
            let selected = if *o == current { " selected" } else { "" };
            out.push_str(&format!("<option{selected}>{o}</option>"));
        }
        out.push_str("</select>");
        out
    };
    let form = format!(
        "<form method=\"get\" action=\"/audit\" class=\"card filters\"><label>Connection <input type=\"text\" name=\"connection\" value=\"{}\" placeholder=\"con_…\"></label>\
         <label>Action starts with <input type=\"text\" name=\"action\" value=\"{}\" placeholder=\"confirm_booking\"></label>\
         <label>Outcome {}</label><label>Channel {}</label>\
         <label>From (UTC day) <input type=\"date\" name=\"since\" value=\"{}\"></label>\
         <label>Until (UTC day, included) <input type=\"date\" name=\"until\" value=\"{}\"></label><button type=\"submit\">Search</button> <a href=\"/audit\">Clear</a></form>",
        value("connection"),
        esc(filter.action.as_deref().unwrap_or("")),
        select("outcome", &admin::AUDIT_OUTCOMES),
        select("channel", &admin::AUDIT_CHANNELS),
        value("since"),
        value("until"),
    );
    let found = match admin::audit_search(&state.ds, &ctx, &filter, 100).await {
        Ok(found) => found,
        Err(e @ (Error::Invalid { .. } | Error::NotFound { .. })) => {
            let body = format!("{form}{}", error_box(&e.to_string()));
            return (StatusCode::BAD_REQUEST, Html(page("Audit", Some(&s.nav("/audit")), &body)))
                .into_response();
        }
        Err(e) => return fail(e),
    };
    let shown: String = found
        .rows
        .iter()
        .map(|r| {
            format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&r.at),
                esc(&r.channel),
                esc(&r.action),
                esc(&r.outcome),
                esc(&r.targets.join(", ")),
                esc(&format!("{} {}", r.connection_name.as_deref().unwrap_or(""), r.connection.as_deref().unwrap_or(""))),
                esc(r.client_name.as_deref().unwrap_or(""))
            )
        })
        .collect();
    let query = audit_query(&q);
    let next = match &found.next {
        Some(cursor) => {
            let sep = if query.is_empty() { "" } else { "&" };
            let cursor = url::form_urlencoded::Serializer::new(String::new())
                .append_pair("cursor", cursor)
                .finish();
            format!(
                "<a rel=\"next\" href=\"/audit?{}{sep}{}\">Next page</a>",
                esc(&query),
                esc(&cursor)
            )
        }
        None => "<span class=\"muted\">End of the log</span>".to_owned(),
    };
    let body = format!(
        "{form}<p>{} rows{} · <a href=\"/audit.csv?{}\" download>Export everything that matches as CSV</a></p>\
         <table><thead><tr><th>When (UTC)</th><th>Channel</th><th>Action</th><th>Outcome</th><th>Records</th><th>Connection</th><th>Client</th></tr></thead><tbody>{shown}</tbody></table><p class=\"pager\">{next}</p>",
        found.rows.len(),
        if found.next.is_some() { " on this page" } else { "" },
        esc(&query),
    );
    Html(page("Audit", Some(&s.nav("/audit")), &body)).into_response()
}

/// A CSV cell: quoted, and a value a spreadsheet would run as a formula (`=`, `+`, `-`, `@`,
/// tab, carriage return) is prefixed with `'`, since names come from clients.
fn csv_cell(value: &str) -> String {
    let risky = value.starts_with(['=', '+', '-', '@', '\t', '\r']);
    let value = if risky { format!("'{value}") } else { value.to_owned() };
    format!("\"{}\"", value.replace('"', "\"\""))
}

/// Everything the search matches, as CSV, read page by page (1,000 rows a statement) and
/// streamed, so a long log neither waits nor sits in memory.
async fn audit_csv(
    State(state): State<Arc<AppState>>,
    s: Session,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let mut filter = audit_filter(&q);
    filter.cursor = None;
    // The first page answers now, so a bad filter is a 400 with the reason, not a broken file.
    let first = match admin::audit_search(&state.ds, &ctx, &filter, 1000).await {
        Ok(found) => found,
        Err(e @ (Error::Invalid { .. } | Error::NotFound { .. })) => {
            return (StatusCode::BAD_REQUEST, e.to_string()).into_response();
        }
        Err(e) => return fail(e),
    };
    let header =
        "at,channel,action,outcome,records,connection,connection_name,client_name,reason\r\n";
    let rows = |page: &admin::AuditPage| -> String {
        page.rows
            .iter()
            .map(|r| {
                [
                    r.at.as_str(),
                    &r.channel,
                    &r.action,
                    &r.outcome,
                    &r.targets.join(" "),
                    r.connection.as_deref().unwrap_or(""),
                    r.connection_name.as_deref().unwrap_or(""),
                    r.client_name.as_deref().unwrap_or(""),
                    r.reason.as_deref().unwrap_or(""),
                ]
                .iter()
                .map(|c| csv_cell(c))
                .collect::<Vec<_>>()
                .join(",")
                    + "\r\n"
            })
            .collect()
    };
    let first_chunk = format!("{header}{}", rows(&first));
    let slug: String =
        ctx.tenant().slug.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
    let name = format!("attachment; filename=\"audit-{slug}.csv\"");
    let ds = state.ds.clone();
    let stream = futures_util::stream::unfold(
        (Some(first_chunk), first.next, filter),
        move |(chunk, next, mut filter)| {
            let ds = ds.clone();
            let ctx = ctx.clone();
            async move {
                if let Some(chunk) = chunk {
                    return Some((Ok::<_, std::io::Error>(chunk), (None, next, filter)));
                }
                let cursor = next?;
                filter.cursor = Some(cursor);
                match admin::audit_search(&ds, &ctx, &filter, 1000).await {
                    Ok(page) => {
                        let chunk = rows(&page);
                        Some((Ok(chunk), (None, page.next, filter)))
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "audit export interrupted");
                        Some((
                            Err(std::io::Error::other("the audit export was interrupted")),
                            (None, None, filter),
                        ))
                    }
                }
            }
        },
    );
    let mut response = axum::body::Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/csv; charset=utf-8"));
    if let Ok(v) = HeaderValue::from_str(&name) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    response
}

async fn activity_page(
    State(state): State<Arc<AppState>>,
    s: Session,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let span = activity::Span::parse(q.get("span").map(String::as_str));
    let found = match activity::activity(&state.ds, &ctx, None, span, jiff::Timestamp::now()).await
    {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let body = format!(
        "<p>What every agent connection of this tenant did. Open a connection for its own picture.</p>{}",
        crate::pictures::section("tenant-activity", "/activity", &found, false)
    );
    Html(page("Activity", Some(&s.nav("/activity")), &body)).into_response()
}

async fn operator(State(state): State<Arc<AppState>>, s: Session) -> Response {
    let operator = match operators::from_session(&state.ds, &s.row).await {
        Ok(op) => op,
        Err(e) => return fail(e),
    };
    let on = match admin::global_kill_state(&state.ds, &operator).await {
        Ok(on) => on,
        Err(e) => return fail(e),
    };
    let body = format!(
        "<div class=\"card\"><p id=\"global-state\">{}</p><form method=\"post\" action=\"/operator/kill-switch\">{}<input type=\"hidden\" name=\"to\" value=\"{}\">\
         <label>Reason <input type=\"text\" name=\"reason\" required maxlength=\"300\"></label><button type=\"submit\" class=\"{}\">{}</button></form></div><p>Now: {}</p>",
        if on {
            "The global kill switch is ON: every agent request answers 503."
        } else {
            "Agents are served."
        },
        csrf_field(s.row.csrf_token()),
        if on { "off" } else { "on" },
        if on { "" } else { "danger" },
        if on { "Turn the kill switch off" } else { "Turn the kill switch on" },
        time::present(
            jiff::Timestamp::now(),
            &jiff::tz::TimeZone::UTC,
            "UTC",
            jiff::Timestamp::now()
        )
        .display
    );
    Html(page("Operator", Some(&s.nav("/operator")), &body)).into_response()
}

async fn global_switch(
    State(state): State<Arc<AppState>>,
    s: Session,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    if let Err(r) = s.check_csrf(&form) {
        return r;
    }
    let operator = match operators::from_session(&state.ds, &s.row).await {
        Ok(op) => op,
        Err(e) => return fail(e),
    };
    // The kill switch `on` refuses every agent.
    let kill = match direction(&form) {
        Ok(on) => on,
        Err(r) => return r,
    };
    match admin::kill_switch_set(
        &state.ds,
        admin::SwitchScope::Global(&operator),
        kill,
        form.get("reason").map(String::as_str).unwrap_or(""),
    )
    .await
    {
        Ok(_) => Redirect::to("/operator").into_response(),
        Err(e) => fail(e),
    }
}

async fn messages(State(state): State<Arc<AppState>>, s: Session) -> Response {
    let ctx = match tenant_ctx(&s) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let rows = match console::messages(&state.ds, &ctx, 200).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let fmt = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M:%S UTC").to_string();
    let shown: String = rows
        .iter()
        .map(|m| {
            format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
                esc(&fmt(m.created_at)),
                esc(&m.channel),
                esc(&m.recipient),
                esc(&m.subject),
                esc(&format!("{} (attempts: {})", m.status, m.attempts)),
                esc(&m.sent_at.map(fmt).unwrap_or_default()),
                esc(m.action_handle.as_deref().unwrap_or(""))
            )
        })
        .collect();
    let body = format!(
        "<p>Emails and pages that confirmed agent actions sent, newest first.</p>\
         <table><thead><tr><th>Queued</th><th>Channel</th><th>To</th><th>Subject</th><th>Status</th><th>Sent</th><th>Action</th></tr></thead><tbody>{shown}</tbody></table>"
    );
    Html(page("Messages", Some(&s.nav("/messages")), &body)).into_response()
}
