//! The OAuth 2.1 authorization server's rules: clients (dynamic registration, RFC 7591, and
//! client ID metadata documents), authorization codes with PKCE S256 only and exact redirect
//! URI matching, tokens bound to the MCP resource they were requested for (RFC 8707),
//! refresh tokens that rotate with reuse detection, and revocation (RFC 7009).
//!
//! Every grant is a connection: approving consent creates (or narrows) the connection of this
//! client, tenant and person, capped by the person's current rights. Access and refresh tokens
//! are `gh_mcp_…` secrets stored hashed and belong to it; revocation goes through the one
//! revocation service.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ctx::OpCtx;
pub use crate::datastore::ClientRow;
use crate::datastore::{self as db, AuditEntry, NewCode, Services, from_ts};
use crate::error::{Error, Result};
use crate::handle::ConnectionHandle;
use crate::rights::{Right, RightSet};
use crate::secret::{self, CredentialKind};
use crate::services::admin;
use crate::services::client_assertion;
use crate::services::console::ConsoleSession;
use crate::services::jose::{self, KeySet};

pub const ACCESS_TTL_SECS: i64 = 3600;
pub const REFRESH_TTL_SECS: i64 = 30 * 24 * 3600;
/// How long a grant lives however often its refresh token rotates; then the person consents again.
pub const GRANT_TTL_SECS: i64 = 90 * 24 * 3600;

/// An OAuth error as the token and registration endpoints answer it.
#[derive(Debug, Serialize)]
pub struct OAuthError {
    pub error: &'static str,
    pub error_description: String,
}

fn oauth(error: &'static str, description: impl Into<String>) -> OAuthError {
    OAuthError { error, error_description: description.into() }
}

impl From<Error> for OAuthError {
    fn from(e: Error) -> Self {
        match e {
            Error::Internal(detail) => {
                tracing::error!(error = %detail, "oauth failure");
                oauth("server_error", "the authorization server failed; retry")
            }
            other => oauth("invalid_request", other.to_string()),
        }
    }
}

/// How many redirect URIs a client may register, and how long each may be.
pub const MAX_REDIRECT_URIS: usize = 10;
pub const MAX_REDIRECT_URI_LEN: usize = 2000;
/// How long a client's name may be, as shown on the consent screen.
pub const MAX_CLIENT_NAME_CHARS: usize = 80;

/// Parses a redirect URI a client registers (RFC 8252, OAuth 2.1): https with a host, or http on
/// a loopback address (`127.0.0.1`, `[::1]`, `localhost`) with any port; never userinfo, never
/// a fragment. The parsed URL is what is compared later, never the raw string.
pub fn parse_redirect_uri(raw: &str) -> std::result::Result<url::Url, String> {
    if raw.len() > MAX_REDIRECT_URI_LEN {
        return Err(format!("redirect URIs are at most {MAX_REDIRECT_URI_LEN} characters"));
    }
    let url = url::Url::parse(raw).map_err(|e| format!("{raw:?} is not a URL ({e})"))?;
    if url.fragment().is_some() || raw.contains('#') {
        return Err(format!("{raw} has a fragment; redirect URIs never do"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{raw} carries user information; redirect URIs never do"));
    }
    match (url.scheme(), url.host()) {
        ("https", Some(_)) => Ok(url),
        ("http", Some(host)) if is_loopback(&host) => Ok(url),
        _ => Err(format!(
            "{raw} is not allowed: use https, or http on 127.0.0.1, [::1] or localhost"
        )),
    }
}

fn is_loopback(host: &url::Host<&str>) -> bool {
    match host {
        url::Host::Domain(d) => d.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    }
}

/// Whether a requested redirect URI is one the client registered: the same URL, except that a
/// loopback http URI may use any port (RFC 8252 §7.3: native apps pick a free port per run).
pub fn redirect_matches(registered: &str, requested: &str) -> bool {
    if registered == requested {
        return true;
    }
    let (Ok(a), Ok(b)) = (parse_redirect_uri(registered), parse_redirect_uri(requested)) else {
        return false;
    };
    let loopback = a.scheme() == "http" && a.host().is_some_and(|h| is_loopback(&h));
    loopback
        && b.scheme() == "http"
        && a.host() == b.host()
        && a.path() == b.path()
        && a.query() == b.query()
}

/// A client's name as display text: control characters dropped, trimmed, capped.
fn display_name(raw: Option<&str>, fallback: &str) -> String {
    let name: String = raw
        .unwrap_or_default()
        .chars()
        .filter(|c| {
            !c.is_control() && !crate::text::is_hidden(*c) && !matches!(c, '\u{2028}' | '\u{2029}')
        })
        .collect::<String>()
        .trim()
        .chars()
        .take(MAX_CLIENT_NAME_CHARS)
        .collect();
    if name.is_empty() { fallback.to_owned() } else { name }
}

/// Checks the redirect URIs a client registers or publishes.
fn check_redirect_uris(
    uris: &[String],
    error: &'static str,
) -> std::result::Result<(), OAuthError> {
    if uris.is_empty() || uris.len() > MAX_REDIRECT_URIS {
        return Err(oauth(error, format!("give 1 to {MAX_REDIRECT_URIS} redirect_uris")));
    }
    for uri in uris {
        parse_redirect_uri(uri).map_err(|why| oauth(error, why))?;
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
pub struct RegisterRequest {
    #[serde(default)]
    pub redirect_uris: Vec<String>,
    #[serde(default)]
    pub client_name: Option<String>,
    #[serde(default)]
    pub token_endpoint_auth_method: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Registered {
    pub client_id: String,
    pub client_name: String,
    pub redirect_uris: Vec<String>,
    pub token_endpoint_auth_method: &'static str,
    pub grant_types: [&'static str; 2],
    pub response_types: [&'static str; 1],
}

/// How many clients one source may register per window: an IPv4 address, or an IPv6 /64; an
/// IPv6 /48 (a site, or a free tunnel broker's allocation) may register five times that.
pub const REGISTRATIONS_PER_SOURCE: i32 = 20;
pub const REGISTRATIONS_PER_SITE: i32 = 100;
pub const REGISTRATION_WINDOW_SECS: i64 = 3600;

/// The throttling buckets of a source address, each with its limit. IPv4 counts by address;
/// every IPv6 form that carries an IPv4 address (mapped, compatible, 6to4, Teredo) counts as
/// that address, so one IPv4 host cannot mint 65,536 buckets from its 6to4 prefix; native IPv6
/// counts by /64 (one subscriber holds a whole /64) and by /48.
pub fn source_buckets(source: &str) -> Vec<(String, i32)> {
    let v4 = |ip: std::net::Ipv4Addr| vec![(format!("v4:{ip}"), REGISTRATIONS_PER_SOURCE)];
    match source.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => v4(ip),
        Ok(IpAddr::V6(ip)) => {
            let s = ip.segments();
            let embedded = |hi: u16, lo: u16| {
                std::net::Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)
            };
            if let Some(mapped) = ip.to_ipv4_mapped() {
                v4(mapped)
            } else if s[..6] == [0; 6] {
                v4(embedded(s[6], s[7]))
            } else if s[0] == 0x2002 {
                v4(embedded(s[1], s[2]))
            } else if s[0] == 0x2001 && s[1] == 0 {
                // Teredo: the client's address is the last 32 bits, inverted.
                v4(embedded(!s[6], !s[7]))
            } else {
                vec![
                    (
                        format!("v6:{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3]),
                        REGISTRATIONS_PER_SOURCE,
                    ),
                    (format!("v6:{:x}:{:x}:{:x}::/48", s[0], s[1], s[2]), REGISTRATIONS_PER_SITE),
                ]
            }
        }
        Err(_) => vec![(
            format!("other:{}", source.chars().take(64).collect::<String>()),
            REGISTRATIONS_PER_SOURCE,
        )],
    }
}

/// Counts a registration from `source` in each of its buckets; `Err(seconds)` says how long
/// it must wait when any bucket is past its limit (counted atomically, so concurrent requests
/// cannot slip past).
pub async fn registration_take(
    ds: &Services,
    source: &str,
) -> Result<std::result::Result<(), i64>> {
    let mut wait = None;
    for (bucket, limit) in source_buckets(source) {
        let (count, age) = ds
            .preauth_throttle_take(&format!("register:{bucket}"), REGISTRATION_WINDOW_SECS)
            .await?;
        if count > limit {
            wait = Some(wait.unwrap_or(0).max((REGISTRATION_WINDOW_SECS - age).max(1)));
        }
    }
    Ok(wait.map_or(Ok(()), Err))
}

/// Dynamic client registration (RFC 7591): public clients only.
pub async fn register(
    ds: &Services,
    req: RegisterRequest,
) -> std::result::Result<Registered, OAuthError> {
    check_redirect_uris(&req.redirect_uris, "invalid_redirect_uri")?;
    if req.token_endpoint_auth_method.as_deref().is_some_and(|m| m != "none") {
        return Err(oauth(
            "invalid_client_metadata",
            "only public clients (token_endpoint_auth_method none) with PKCE are supported",
        ));
    }
    let name = display_name(req.client_name.as_deref(), "Unnamed client");
    let client_id =
        format!("ghc_{}", &secret::generate(CredentialKind::Session)["gh_ses_".len()..][..24]);
    ds.preauth_oauth_client_put(db::NewClient {
        client_id: &client_id,
        name: &name,
        redirect_uris: &req.redirect_uris,
        kind: "registered",
        auth_method: "none",
        jwks_uri: None,
        jwks: None,
    })
    .await?;
    Ok(Registered {
        client_id,
        client_name: name,
        redirect_uris: req.redirect_uris,
        token_endpoint_auth_method: "none",
        grant_types: ["authorization_code", "refresh_token"],
        response_types: ["code"],
    })
}

/// A client ID metadata document, as fetched from the `client_id` URL.
#[derive(Debug, Deserialize)]
pub struct MetadataDocument {
    pub client_id: String,
    #[serde(default)]
    pub client_name: Option<String>,
    #[serde(default)]
    pub redirect_uris: Vec<String>,
    /// `none` (the default) or `private_key_jwt` with `jwks_uri` or `jwks`.
    #[serde(default)]
    pub token_endpoint_auth_method: Option<String>,
    #[serde(default)]
    pub jwks_uri: Option<String>,
    #[serde(default)]
    pub jwks: Option<serde_json::Value>,
}

/// Checks a fetched metadata document against the URL it came from and stores it.
pub async fn accept_metadata_document(
    ds: &Services,
    url: &str,
    doc: MetadataDocument,
) -> std::result::Result<ClientRow, OAuthError> {
    if doc.client_id != url {
        return Err(oauth(
            "invalid_client",
            "the metadata document's client_id differs from its URL",
        ));
    }
    check_redirect_uris(&doc.redirect_uris, "invalid_client")?;
    let method = doc.token_endpoint_auth_method.as_deref().unwrap_or("none");
    let (jwks_uri, jwks) = match method {
        "none" => (None, None),
        "private_key_jwt" => {
            if let Some(uri) = &doc.jwks_uri {
                let parsed = url::Url::parse(uri)
                    .map_err(|_| oauth("invalid_client", "the document's jwks_uri is not a URL"))?;
                if parsed.scheme() != "https" && parsed.scheme() != "http" {
                    return Err(oauth("invalid_client", "the document's jwks_uri must be https"));
                }
            }
            if let Some(keys) = &doc.jwks {
                KeySet::parse(keys).ok_or_else(|| {
                    oauth("invalid_client", "the document's jwks is not a JWK set")
                })?;
            }
            if doc.jwks_uri.is_none() && doc.jwks.is_none() {
                return Err(oauth(
                    "invalid_client",
                    "private_key_jwt needs the client's keys: give jwks_uri (or jwks) in the document",
                ));
            }
            (doc.jwks_uri.as_deref(), doc.jwks.as_ref())
        }
        other => {
            return Err(oauth(
                "invalid_client",
                format!(
                    "token_endpoint_auth_method {:?} is not supported; use none or private_key_jwt",
                    other.chars().take(40).collect::<String>()
                ),
            ));
        }
    };
    let host = url::Url::parse(url).ok().and_then(|u| u.host_str().map(str::to_owned));
    let name = display_name(doc.client_name.as_deref(), host.as_deref().unwrap_or(url));
    ds.preauth_oauth_client_put(db::NewClient {
        client_id: url,
        name: &name,
        redirect_uris: &doc.redirect_uris,
        kind: "metadata_document",
        auth_method: method,
        jwks_uri,
        jwks,
    })
    .await?;
    ds.preauth_oauth_client_get(url).await?.ok_or_else(|| oauth("server_error", "client vanished"))
}

pub use crate::datastore::AuthorizeRequest;

mod client_auth;
mod metadata_documents;
mod tokens;
pub use client_auth::*;
pub use metadata_documents::*;
pub use tokens::*;

/// Validates an authorization request for `client`. Errors before the redirect URI is known to
/// be the client's are shown to the person, never redirected (RFC 6749 §4.1.2.1).
pub fn check_authorize(
    client: &ClientRow,
    redirect_uri: &str,
    response_type: &str,
    code_challenge: Option<&str>,
    method: Option<&str>,
    resource: Option<&str>,
    allowed_resources: &[String],
) -> std::result::Result<(), OAuthError> {
    check_redirect(client, redirect_uri)?;
    check_request(response_type, code_challenge, method, resource, allowed_resources)
}

/// The first half of an authorization request's checks: the redirect URI is the client's.
/// Until this holds, errors are shown to the person, never redirected.
pub fn check_redirect(
    client: &ClientRow,
    redirect_uri: &str,
) -> std::result::Result<(), OAuthError> {
    if !client.redirect_uris.iter().any(|u| redirect_matches(u, redirect_uri)) {
        return Err(oauth(
            "invalid_request",
            "redirect_uri does not match one the client registered",
        ));
    }
    Ok(())
}

/// The second half: errors here go back to the client by redirect, with `state` and `iss`.
pub fn check_request(
    response_type: &str,
    code_challenge: Option<&str>,
    method: Option<&str>,
    resource: Option<&str>,
    allowed_resources: &[String],
) -> std::result::Result<(), OAuthError> {
    if response_type != "code" {
        return Err(oauth("unsupported_response_type", "only response_type=code"));
    }
    if method != Some("S256") || code_challenge.is_none_or(|c| c.len() < 43 || c.len() > 128) {
        return Err(oauth("invalid_request", "PKCE with code_challenge_method=S256 is required"));
    }
    match resource {
        Some(r)
            if allowed_resources
                .iter()
                .any(|a| a.trim_end_matches('/') == r.trim_end_matches('/')) =>
        {
            Ok(())
        }
        Some(r) => Err(oauth("invalid_target", format!("{r} is not a resource of this server"))),
        None => Err(oauth(
            "invalid_target",
            "the resource parameter (RFC 8707) naming the MCP URL is required",
        )),
    }
}

/// Refuses a `scope` naming rights the catalog does not know (`invalid_scope`).
pub fn check_scope(scope: Option<&str>) -> std::result::Result<(), OAuthError> {
    let unknown: Vec<&str> = scope
        .unwrap_or_default()
        .split_whitespace()
        .filter(|s| s.parse::<crate::rights::Right>().is_err())
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(oauth("invalid_scope", format!("unknown scope(s): {}", unknown.join(" "))))
    }
}

/// The rights a request asks for, capped by what the person holds now.
pub fn requested_rights(scope: Option<&str>, holds: RightSet) -> RightSet {
    match scope.map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) => {
            RightSet::parse_lenient(&s.split_whitespace().collect::<Vec<_>>()).intersect(holds)
        }
        // A client that names no scope gets the read rights ticked; anything more the person
        // ticks themselves.
        None => crate::rights::read_only().intersect(holds),
    }
}

/// What this client's earlier grant for the person holds, if it has one: the consent screen
/// marks what a new request adds (step-up).
pub async fn granted_before(
    ds: &Services,
    ctx: &OpCtx,
    client_id: &str,
) -> Result<Option<RightSet>> {
    let Some(person_id) = ctx.actor_person_id() else { return Ok(None) };
    Ok(ds
        .oauth_grant_rights(ctx, person_id, client_id)
        .await?
        .map(|names| RightSet::parse_lenient(&names)))
}

/// How long a consent screen stays answerable.
pub const CONSENT_TTL_SECS: i64 = 600;

/// Keeps a validated authorization request on the server for the consent step, bound to the
/// session that sees the consent screen; the form carries only the returned handle.
pub async fn consent_begin(
    ds: &Services,
    session: &ConsoleSession,
    req: &AuthorizeRequest,
) -> Result<String> {
    let handle =
        format!("areq_{}", &secret::generate(CredentialKind::Session)["gh_ses_".len()..][..24]);
    let session = session.row();
    let tenant =
        session.tenant_id.ok_or_else(|| Error::invalid("tenant", "pick a tenant first"))?;
    ds.preauth_oauth_request_insert(&handle, session.id, tenant, req, CONSENT_TTL_SECS).await?;
    Ok(handle)
}

/// Takes the request a consent form names, once: this session's, unexpired, unused.
pub async fn consent_take(
    ds: &Services,
    session: &ConsoleSession,
    handle: &str,
) -> Result<Option<AuthorizeRequest>> {
    if !handle.starts_with("areq_") || handle.len() > 64 {
        return Ok(None);
    }
    // The consent was shown for the session's tenant then; a tenant switched since voids it.
    let session = session.row();
    let Some(tenant) = session.tenant_id else { return Ok(None) };
    ds.preauth_oauth_request_take(handle, session.id, tenant).await
}

/// Asked before a consent is taken (a consent request is used once): whether approving it
/// needs a passkey the form did not carry. Refuses as [`approve`] would, with
/// [`Error::PasskeyRequired`] naming the decision, so the person confirms it and posts again
/// while the request still waits; `Ok` when it grants reading only, the tenant's policy does
/// not ask, or the request is gone (the take then says so).
pub async fn consent_step_up(
    ds: &Services,
    session: &ConsoleSession,
    ctx: &OpCtx,
    handle: &str,
    rights: &[&str],
) -> Result<()> {
    let row = session.row();
    let Some(tenant) = row.tenant_id else { return Ok(()) };
    if !handle.starts_with("areq_") || handle.len() > 64 {
        return Ok(());
    }
    let Some(req) = ds.preauth_oauth_request_peek(handle, row.id, tenant).await? else {
        return Ok(());
    };
    let granted = RightSet::parse_lenient(rights).intersect(ctx.rights());
    if granted.is_subset_of(crate::rights::read_only()) {
        return Ok(());
    }
    let name = ds
        .preauth_oauth_client_get(&req.client_id)
        .await?
        .map(|c| c.client_name)
        .unwrap_or_else(|| req.client_id.clone());
    let mut tx = ds.begin().await?;
    crate::services::passkeys::require(&mut tx, ctx, &consent_decision(&req, granted, &name)).await
}

/// The decision a consent is, as a passkey ceremony names it: the client, where the code
/// goes, the resource and the rights granted (cut to what the person holds).
/// `client_name` is only what a person reads; the digest binds the client's id.
pub fn consent_decision(
    req: &AuthorizeRequest,
    granted: RightSet,
    client_name: &str,
) -> crate::services::passkeys::Decision {
    crate::services::passkeys::Decision::consent(
        &format!("{} {} {}", req.code_challenge, req.redirect_uri, req.resource),
        &req.client_id,
        &granted.names().join(" "),
    )
    .shown_as(client_name)
}

/// The person approved: create or update the client's connection in this tenant with the
/// granted rights (never more than the person holds) and issue a code.
pub async fn approve(
    ds: &Services,
    ctx: &OpCtx,
    client: &ClientRow,
    req: &AuthorizeRequest,
    granted: RightSet,
) -> Result<String> {
    let person_id = ctx.actor_person_id().ok_or(Error::NoActor)?;
    let granted = granted.intersect(ctx.rights());
    if granted == RightSet::EMPTY {
        return Err(Error::invalid("rights", "grant at least one right"));
    }
    let mut tx = ds.begin().await?;
    if !granted.is_subset_of(crate::rights::read_only()) {
        let decision = consent_decision(req, granted, &client.client_name);
        crate::services::passkeys::require(&mut tx, ctx, &decision).await?;
    }
    // The person approving is still an active member, under the membership's row lock, so a
    // deactivation running now either revokes what this creates or is seen here.
    if !db::membership_active_held(&mut tx, ctx, person_id).await? {
        return Err(Error::Unauthenticated(
            "you are no longer an active member of this tenant".into(),
        ));
    }
    let existing = db::oauth_connection_find(&mut tx, ctx, person_id, &client.client_id).await?;
    let regranted = existing.is_some();
    let (connection_id, handle) = match existing {
        Some(found) => found,
        None => {
            let handle = ConnectionHandle::generate();
            let id = db::connection_insert(
                &mut tx,
                ctx,
                handle.as_str(),
                person_id,
                &client.client_name,
                &client.client_name,
                &granted.names(),
            )
            .await?;
            (id, handle.to_string())
        }
    };
    // A new consent replaces the grant: tokens of an earlier one end, so none of them gains the
    // rights approved now.
    db::connection_tokens_end(&mut tx, ctx, connection_id).await?;
    // And so do its codes not yet exchanged: a code from an earlier consent would mint tokens
    // beside the new grant's.
    db::oauth_codes_drop_unused(&mut tx, ctx, connection_id).await?;
    db::connection_set_oauth(&mut tx, ctx, connection_id, &client.client_id, &granted.names())
        .await?;
    let code = secret::generate(CredentialKind::Mcp);
    db::oauth_code_insert(
        &mut tx,
        ctx,
        NewCode {
            code_hash: &secret::hash_token(&code),
            client_id: &client.client_id,
            connection_id,
            redirect_uri: &req.redirect_uri,
            code_challenge: &req.code_challenge,
            resource: &req.resource,
        },
    )
    .await?;
    db::audit_insert(&mut tx, ctx, AuditEntry::ok("connection.authorize", vec![handle])).await?;
    tx.commit().await?;
    // A consent that replaced an existing grant changes what its streams list (a new
    // connection has none yet).
    if regranted {
        crate::bus::publish(
            ds.bus(),
            crate::bus::Event::TenantChanged { tenant: ctx.tenant().handle.to_string() },
        )
        .await;
    }
    Ok(code)
}

/// The rights an authorization server advertises.
pub fn scopes_supported() -> Vec<&'static str> {
    Right::ALL.iter().map(|r| r.as_str()).collect()
}

#[cfg(test)]
mod tests;
