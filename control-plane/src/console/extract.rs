//! What a console handler receives instead of repeating a preamble: the signed-in person
//! ([`Session`]), the person working in a tenant ([`Tenant`], with the `OpCtx` the library
//! builds for the session), a form whose CSRF token matched the session's ([`CsrfForm`]) and
//! the client's address ([`Source`]). Each rejects as the console always has: a bearer token
//! gets 401 naming its kind (R20), no session goes to sign-in, no tenant goes to the picker
//! (before any form is read, so a forged form from a session without a tenant is sent there
//! too), and a stale or forged form gets 403 and changes nothing.

use std::sync::Arc;

use axum::Form;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use shared::OpCtx;
use shared::rights::Right;
use shared::secret::CredentialKind;
use shared::services::console::{self, ConsoleSession};

use super::fail;
use super::layout::{Banner, Nav, error_box, page};
use crate::AppState;

/// A signed-in console user.
#[derive(Clone)]
pub struct Session {
    pub row: ConsoleSession,
    /// The cookie's session secret, to sign out with.
    pub(super) token: String,
    /// What the save before the redirect said ([`super::saved`]), shown once.
    pub notice: Option<String>,
}

impl Session {
    /// The session's tenant context, once a tenant is picked.
    pub fn ctx(&self) -> Option<OpCtx> {
        console::session_ctx(&self.row)
    }

    /// The navigation of a page whose link is `current`, from the session's rights.
    pub fn nav<'a>(&'a self, current: &'a str) -> Nav<'a> {
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
            notice: self.notice.as_deref(),
            banners: &[],
        }
    }

    pub fn csrf(&self) -> &str {
        self.row.csrf_token()
    }
}

/// A cookie's value from the request's `Cookie` headers.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
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
        // Read once a request: a handler that takes a tenant and a form asks twice.
        if let Some(session) = parts.extensions.get::<Session>() {
            return Ok(session.clone());
        }
        // R20: the console takes console sessions only.
        if let Some(auth) = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
            let kind = match shared::auth::bearer(Some(auth)).and_then(CredentialKind::of) {
                Some(CredentialKind::Mcp) => "an MCP token, which only /mcp accepts",
                Some(CredentialKind::Api) => "an API token, which only /api accepts",
                _ => "a bearer token",
            };
            let message = format!(
                "The console takes a console session (sign in at /login); the request carried {kind}."
            );
            let body = page("Sign in", None, error_box(&message));
            return Err((StatusCode::UNAUTHORIZED, body).into_response());
        }
        let next =
            parts.uri.path_and_query().map(|p| p.as_str().to_owned()).unwrap_or_else(|| "/".into());
        let login = Redirect::to(&format!(
            "/login?next={}",
            url::form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>()
        ))
        .into_response();
        let Some(token) = cookie(&parts.headers, super::session_cookie(state)) else {
            return Err(login);
        };
        match console::session(&state.ds, &token).await {
            Ok(Some(row)) => {
                let notice = cookie(&parts.headers, super::NOTICE_COOKIE)
                    .and_then(|v| super::notice_text(&v));
                let session = Session { row, token, notice };
                parts.extensions.insert(session.clone());
                Ok(session)
            }
            Ok(None) => Err(login),
            Err(e) => Err(fail(e)),
        }
    }
}

/// A signed-in person working in a tenant: the session and the context the library built
/// for it (`OpCtx::for_session`, with the person's current role in that tenant).
pub struct Tenant {
    pub session: Session,
    pub ctx: OpCtx,
    /// The tenant's states every page shows while they last.
    pub banners: Vec<Banner>,
}

impl Tenant {
    pub fn nav<'a>(&'a self, current: &'a str) -> Nav<'a> {
        Nav { banners: &self.banners, ..self.session.nav(current) }
    }

    pub fn csrf(&self) -> &str {
        self.session.csrf()
    }
}

impl FromRequestParts<Arc<AppState>> for Tenant {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let session = Session::from_request_parts(parts, state).await?;
        match session.ctx() {
            Some(ctx) => {
                let banners = super::banners::of(state, &session.row, &ctx).await;
                Ok(Tenant { session, ctx, banners })
            }
            // Shut out by the tenant's single sign-on requirement: the home page says so.
            None if session.row.shut_out_by_sso() => Err(Redirect::to("/").into_response()),
            None => Err(Redirect::to("/tenants").into_response()),
        }
    }
}

pub use super::layout::Fields;

/// A form posted by the signed-in person, whose `csrf` field matched the session's token.
pub struct CsrfForm(pub Fields);

impl FromRequest<Arc<AppState>> for CsrfForm {
    type Rejection = Response;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        let session = Session::from_request_parts(&mut parts, state).await?;
        let Form(pairs) =
            Form::<Vec<(String, String)>>::from_request(Request::from_parts(parts, body), state)
                .await
                .map_err(IntoResponse::into_response)?;
        let fields = Fields(pairs);
        if !fields.get("csrf").is_some_and(|c| shared::secret::tokens_match(c, session.csrf())) {
            let body = page(
                "Form expired",
                None,
                error_box("This form is stale or forged; reload the page and try again."),
            );
            return Err((StatusCode::FORBIDDEN, body).into_response());
        }
        Ok(CsrfForm(fields))
    }
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
