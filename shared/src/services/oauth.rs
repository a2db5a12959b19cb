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

/// The decision a consent form would make, for its passkey ceremony: `None` when it grants
/// reading only (no passkey asked) or the request is gone.
pub async fn consent_form_decision(
    ds: &Services,
    session: &ConsoleSession,
    ctx: &OpCtx,
    handle: &str,
    rights: &[&str],
) -> Result<Option<crate::services::passkeys::Decision>> {
    let row = session.row();
    let Some(tenant) = row.tenant_id else { return Ok(None) };
    if !handle.starts_with("areq_") || handle.len() > 64 {
        return Ok(None);
    }
    let Some(req) = ds.preauth_oauth_request_peek(handle, row.id, tenant).await? else {
        return Ok(None);
    };
    let granted = RightSet::parse_lenient(rights).intersect(ctx.rights());
    if granted.is_subset_of(crate::rights::read_only()) {
        return Ok(None);
    }
    let name = ds
        .preauth_oauth_client_get(&req.client_id)
        .await?
        .map(|c| c.client_name)
        .unwrap_or_else(|| req.client_id.clone());
    Ok(Some(consent_decision(&req, granted, &name)))
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

#[derive(Debug, Serialize)]
pub struct TokenResponse {
    pub access_token: String,
    pub token_type: &'static str,
    pub expires_in: i64,
    /// None for grants that carry no refresh (an ID-JAG: the client asks its IdP again).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// The rights granted, space-separated: a narrowed grant says so (RFC 6749 §5.1).
    pub scope: String,
}

fn pkce_matches(verifier: &str, challenge: &str) -> bool {
    let valid = (43..=128).contains(&verifier.len())
        && verifier.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b));
    valid && URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes())) == challenge
}

async fn issue(
    tx: &mut db::Tx<'static>,
    connection_id: i64,
    resource: &str,
    grant_ends: jiff::Timestamp,
) -> Result<TokenResponse> {
    let access = secret::generate(CredentialKind::Mcp);
    let refresh = secret::generate(CredentialKind::Mcp);
    let now = jiff::Timestamp::now();
    let at = |secs: i64| {
        now.checked_add(jiff::SignedDuration::from_secs(secs))
            .map(from_ts)
            .map_err(|e| Error::Internal(e.to_string()))
    };
    db::preauth_connection_token_insert(
        tx,
        connection_id,
        "access",
        &secret::hash_token(&access),
        Some(resource),
        Some(at(ACCESS_TTL_SECS)?),
        None,
    )
    .await?;
    db::preauth_connection_token_insert(
        tx,
        connection_id,
        "refresh",
        &secret::hash_token(&refresh),
        Some(resource),
        Some(at(REFRESH_TTL_SECS)?.min(from_ts(grant_ends))),
        Some(from_ts(grant_ends)),
    )
    .await?;
    let scope = db::preauth_connection_rights(tx, connection_id).await?.join(" ");
    Ok(TokenResponse {
        access_token: access,
        token_type: "Bearer",
        expires_in: ACCESS_TTL_SECS,
        refresh_token: Some(refresh),
        scope,
    })
}

/// `grant_type=authorization_code`.
pub async fn exchange_code(
    ds: &Services,
    code: &str,
    client_id: &str,
    redirect_uri: &str,
    verifier: &str,
    resource: Option<&str>,
) -> std::result::Result<TokenResponse, OAuthError> {
    let mut tx = ds.begin().await.map_err(OAuthError::from)?;
    let code_hash = secret::hash_token(code);
    // The connection first, then the code: the order a consent takes them in, so the two never
    // wait on each other. A consent or a revocation running now finishes first and is seen.
    let active = match db::preauth_oauth_code_connection(&mut tx, &code_hash).await? {
        Some(connection_id) => db::preauth_connection_is_active(&mut tx, connection_id).await?,
        None => false,
    };
    let Some(c) = db::preauth_oauth_code_lock(&mut tx, &code_hash).await? else {
        return Err(oauth("invalid_grant", "unknown authorization code"));
    };
    if c.used {
        // A code used twice: someone replays it; end the grant it produced (RFC 6749 §4.1.2).
        revoke_connection(ds, tx, c.connection_id, "authorization code reused").await?;
        return Err(oauth(
            "invalid_grant",
            "this authorization code was used already; the grant is revoked",
        ));
    }
    if c.expired {
        return Err(oauth("invalid_grant", "the authorization code expired; authorize again"));
    }
    if c.client_id != client_id {
        return Err(oauth("invalid_grant", "the code was issued to another client"));
    }
    if c.redirect_uri != redirect_uri {
        return Err(oauth("invalid_grant", "redirect_uri differs from the authorization request"));
    }
    if !pkce_matches(verifier, &c.code_challenge) {
        return Err(oauth("invalid_grant", "code_verifier does not match the code_challenge"));
    }
    if resource.is_some_and(|r| r.trim_end_matches('/') != c.resource.trim_end_matches('/')) {
        return Err(oauth("invalid_target", "resource differs from the authorization request"));
    }
    // A connection revoked after the person approved issues nothing.
    if !active {
        return Err(oauth(
            "invalid_grant",
            "the connection this code was issued for was revoked; authorize again",
        ));
    }
    db::preauth_oauth_code_use(&mut tx, c.id).await?;
    let grant_ends = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(GRANT_TTL_SECS))
        .map_err(|e| OAuthError::from(Error::Internal(e.to_string())))?;
    let tokens = issue(&mut tx, c.connection_id, &c.resource, grant_ends).await?;
    tx.commit().await.map_err(Error::from)?;
    Ok(tokens)
}

/// `grant_type=refresh_token`: rotates; a refresh token used twice revokes the connection.
pub async fn refresh(
    ds: &Services,
    token: &str,
    client_id: &str,
    resource: Option<&str>,
) -> std::result::Result<TokenResponse, OAuthError> {
    let mut tx = ds.begin().await.map_err(OAuthError::from)?;
    let Some(r) = db::preauth_refresh_lock(&mut tx, &secret::hash_token(token)).await? else {
        return Err(oauth("invalid_grant", "unknown refresh token"));
    };
    if r.used {
        revoke_connection(ds, tx, r.connection_id, "refresh token reused").await?;
        return Err(oauth(
            "invalid_grant",
            "this refresh token was used already; the connection is revoked for safety",
        ));
    }
    if r.connection_status != "active" {
        return Err(oauth("invalid_grant", "the connection was revoked"));
    }
    if r.expired {
        return Err(oauth("invalid_grant", "the refresh token expired; authorize again"));
    }
    if r.oauth_client_id.as_deref() != Some(client_id) {
        return Err(oauth("invalid_grant", "the refresh token belongs to another client"));
    }
    let audience = r.audience.clone().unwrap_or_default();
    if resource.is_some_and(|res| res.trim_end_matches('/') != audience.trim_end_matches('/')) {
        return Err(oauth("invalid_target", "resource differs from the one this grant is for"));
    }
    // Rotation renews the token, never the grant: past its absolute lifetime, consent again.
    let grant_ends = r.grant_expires_at.map(crate::datastore::to_ts);
    let Some(grant_ends) = grant_ends.filter(|g| *g > jiff::Timestamp::now()) else {
        return Err(oauth("invalid_grant", "this grant reached its lifetime; authorize again"));
    };
    db::preauth_token_mark_used(&mut tx, r.id).await?;
    let tokens = issue(&mut tx, r.connection_id, &audience, grant_ends).await?;
    tx.commit().await.map_err(Error::from)?;
    Ok(tokens)
}

/// Ends a connection found through one of its tokens, through the one revocation service.
async fn revoke_connection(
    ds: &Services,
    mut tx: db::Tx<'static>,
    connection_id: i64,
    reason: &str,
) -> Result<()> {
    let Some((tenant_id, handle)) = db::entry_connection_by_id(&mut tx, connection_id).await?
    else {
        return Ok(());
    };
    let tenant = db::entry_tenant_by_id(&mut tx, tenant_id).await?;
    drop(tx);
    // Reuse of a refresh token is a theft signal: the authorization server ends the grant.
    let ctx = OpCtx::for_job(
        "oauth-reuse-detection",
        admin::tenant_ref(&tenant)?,
        &[Right::ConnectionsManage],
    );
    match admin::connection_revoke(ds, &ctx, &handle, reason).await {
        Ok(_) | Err(Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// RFC 7009: an access token is deleted; a refresh token ends its connection. Unknown tokens
/// are not an error. A token is revoked only by the client it was issued to, when the request
/// names one (`client`, authenticated by [`authenticate_client`]); a `private_key_jwt` client's
/// tokens only with its assertion (§2.1), so a stolen refresh token alone cannot end its grant.
pub async fn revoke(
    ds: &Services,
    token: &str,
    client: Option<&str>,
) -> std::result::Result<(), OAuthError> {
    let hash = secret::hash_token(token);
    if let Some((issued_to, method)) = ds.preauth_token_client(&hash).await? {
        if method != "none" && client != Some(issued_to.as_str()) {
            return Err(oauth(
                "invalid_client",
                "this client is confidential: revoke with its client_assertion or client secret",
            ));
        }
        if client.is_some_and(|c| c != issued_to) {
            // Not this client's token: nothing to do, and nothing said about it.
            return Ok(());
        }
    }
    let mut tx = ds.begin().await?;
    if let Some(tenant) = db::preauth_access_token_delete(&mut tx, &hash).await? {
        tx.commit().await.map_err(Error::from)?;
        // A listen stream opened with this token re-reads its context and ends.
        crate::bus::publish(ds.bus(), crate::bus::Event::TenantChanged { tenant }).await;
        return Ok(());
    }
    match db::preauth_refresh_lock(&mut tx, &hash).await? {
        Some(r) => Ok(revoke_connection(ds, tx, r.connection_id, "revoked by the client").await?),
        None => Ok(()),
    }
}

/// The rights an authorization server advertises.
pub fn scopes_supported() -> Vec<&'static str> {
    Right::ALL.iter().map(|r| r.as_str()).collect()
}

// ---------------------------------------------------------------- client ID metadata documents

/// Why an address may not be fetched: loopback, private, link-local (cloud metadata),
/// unspecified, multicast, unique-local, and every entry of [`ALWAYS_REFUSED`].
pub fn forbidden_ip(ip: IpAddr) -> bool {
    always_refused(ip).is_some()
        || match ip {
            IpAddr::V4(v4) => forbidden_v4(v4),
            IpAddr::V6(v6) => forbidden_v6(v6),
        }
}

/// An address range: `addr` with its first `len` bits significant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Net {
    addr: IpAddr,
    len: u8,
}

impl Net {
    const fn v4(o: [u8; 4], len: u8) -> Self {
        Net { addr: IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], o[3])), len }
    }

    const fn v6(s: [u16; 8], len: u8) -> Self {
        Net { addr: IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7])), len }
    }

    fn contains(self, ip: IpAddr) -> bool {
        let (net, ip, width) = match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(i)) => {
                (u128::from(u32::from(n)), u128::from(u32::from(i)), 32)
            }
            (IpAddr::V6(n), IpAddr::V6(i)) => (u128::from(n), u128::from(i), 128),
            _ => return false,
        };
        // A shift of the whole width (a /0) compares nothing: `checked_shr` gives None to both.
        let shift = width - u32::from(self.len);
        net.checked_shr(shift) == ip.checked_shr(shift)
    }
}

impl std::fmt::Display for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Never fetched, in development either: the link-local ranges and the instance metadata and
/// credential endpoints of the major clouds, some of which sit outside link-local (in private,
/// shared or unique-local space that development allows, or in public space). Each entry says
/// what it is, and a refusal names the entry that matched; the most specific entries come
/// first because the first match wins.
const ALWAYS_REFUSED: &[(&str, Net)] = &[
    (
        "a cloud metadata address (AWS, GCP, Azure, OCI, OpenStack, DigitalOcean, Akamai…)",
        Net::v4([169, 254, 169, 254], 32),
    ),
    ("the AWS ECS task metadata and credentials address", Net::v4([169, 254, 170, 2], 32)),
    ("the AWS EKS Pod Identity credentials address", Net::v4([169, 254, 170, 23], 32)),
    ("the Tencent Cloud metadata address", Net::v4([169, 254, 0, 23], 32)),
    ("the Scaleway metadata address", Net::v4([169, 254, 42, 42], 32)),
    ("the Alibaba Cloud metadata address", Net::v4([100, 100, 100, 200], 32)),
    ("the Oracle Cloud legacy metadata address", Net::v4([192, 0, 0, 192], 32)),
    ("the Azure WireServer (host agent) address", Net::v4([168, 63, 129, 16], 32)),
    ("the AWS IPv6 instance metadata address", Net::v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128)),
    (
        "the AWS EKS Pod Identity IPv6 credentials address",
        Net::v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23], 128),
    ),
    ("the GCP IPv6 metadata address", Net::v6([0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254], 128)),
    ("the OCI IPv6 metadata address", Net::v6([0xfd00, 0xc1, 0, 0, 0, 0, 0xa9fe, 0xa9fe], 128)),
    (
        "the Akamai (Linode) IPv6 metadata address",
        Net::v6([0xfd00, 0xa9fe, 0xa9fe, 0, 0, 0, 0, 1], 128),
    ),
    ("the Scaleway IPv6 metadata address", Net::v6([0xfd00, 0x42, 0, 0, 0, 0, 0, 0x42], 128)),
    ("the OpenStack IPv6 metadata address", Net::v6([0xfe80, 0, 0, 0, 0, 0, 0xa9fe, 0xa9fe], 128)),
    (
        "an IPv4 link-local address (169.254.0.0/16), where cloud metadata services answer",
        Net::v4([169, 254, 0, 0], 16),
    ),
    ("an IPv6 link-local address (fe80::/10)", Net::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10)),
];

/// An address the guard refuses in every mode, and why.
#[derive(Debug)]
struct AlwaysRefused {
    ip: IpAddr,
    /// The IPv6 form and the IPv4 address inside it that matched, when the match is indirect.
    via: Option<(&'static str, Ipv4Addr)>,
    what: &'static str,
    net: Net,
}

impl std::fmt::Display for AlwaysRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self { ip, via, what, net } = self;
        match via {
            None => write!(f, "{ip} is {what}, which is never fetched (refused range {net})"),
            Some((form, v4)) => write!(
                f,
                "{ip} carries {v4} ({form}), and {v4} is {what}, which is never fetched \
                 (refused range {net})"
            ),
        }
    }
}

/// The [`ALWAYS_REFUSED`] entry `ip` falls in, directly or through an IPv4 address it carries.
fn always_refused(ip: IpAddr) -> Option<AlwaysRefused> {
    let entry = |ip: IpAddr| ALWAYS_REFUSED.iter().find(|(_, net)| net.contains(ip));
    if let Some(&(what, net)) = entry(ip) {
        return Some(AlwaysRefused { ip, via: None, what, net });
    }
    let IpAddr::V6(v6) = ip else { return None };
    embedded_v4(v6).into_iter().find_map(|(form, v4)| {
        entry(IpAddr::V4(v4)).map(|&(what, net)| AlwaysRefused {
            ip,
            via: Some((form, v4)),
            what,
            net,
        })
    })
}

/// The IPv4 addresses an IPv6 address carries, each with its form: a connection to it may end
/// at that IPv4 address (a dual-stack socket, a translator, a tunnel relay), so each is judged
/// like the IPv4 address itself. The local-use NAT64 prefix may be cut at any RFC 6052 length,
/// so every position it allows is read; Teredo names its server and, inverted, its client.
fn embedded_v4(ip: Ipv6Addr) -> Vec<(&'static str, Ipv4Addr)> {
    let s = ip.segments();
    let o = ip.octets();
    let at = |i: [usize; 4]| Ipv4Addr::new(o[i[0]], o[i[1]], o[i[2]], o[i[3]]);
    let last = at([12, 13, 14, 15]);
    if s[..5] == [0; 5] && s[5] == 0xffff {
        vec![("IPv4-mapped", last)]
    } else if s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0 {
        vec![("IPv4-translated", last)]
    } else if s[..6] == [0; 6] {
        vec![("IPv4-compatible", last)]
    } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        vec![("NAT64", last)]
    } else if s[..3] == [0x64, 0xff9b, 1] {
        vec![
            ("local-use NAT64 /48", at([6, 7, 9, 10])),
            ("local-use NAT64 /56", at([7, 9, 10, 11])),
            ("local-use NAT64 /64", at([9, 10, 11, 12])),
            ("local-use NAT64 /96", last),
        ]
    } else if s[0] == 0x2002 {
        vec![("6to4", at([2, 3, 4, 5]))]
    } else if s[..2] == [0x2001, 0] {
        vec![
            ("Teredo client", Ipv4Addr::from(!u32::from(last))),
            ("Teredo server", at([4, 5, 6, 7])),
        ]
    } else {
        Vec::new()
    }
}

/// Why the guard refuses to connect to any of `addrs`, for the client's error description:
/// an [`ALWAYS_REFUSED`] entry in any mode (named first, whichever address it is), any other
/// forbidden address outside development. The generic refusal names no address, so the guard
/// never tells a client what an internal name resolves to.
fn refusal(addrs: &[IpAddr], dev: bool) -> Option<String> {
    if let Some(hit) = addrs.iter().find_map(|a| always_refused(*a)) {
        return Some(hit.to_string());
    }
    (!dev && addrs.iter().any(|a| forbidden_ip(*a))).then(|| {
        "the host resolves to a private, loopback or link-local address, which is never fetched"
            .to_owned()
    })
}

/// The IANA IPv4 special-purpose registry's ranges that are not globally reachable, plus
/// multicast and the reserved block: none is ever fetched.
fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    a == 0                                        // "this network" 0.0.0.0/8
        || a == 10                                // private 10/8
        || a == 127                               // loopback
        || (a == 100 && (64..128).contains(&b))   // shared address space 100.64/10
        || (a == 169 && b == 254)                 // link local (cloud metadata)
        || (a == 172 && (16..32).contains(&b))    // private 172.16/12
        || (a == 192 && b == 0 && c == 0)         // IETF protocol assignments 192.0.0/24
        || (a == 192 && b == 0 && c == 2)         // documentation TEST-NET-1
        || (a == 192 && b == 88 && c == 99)       // 6to4 relay anycast
        || (a == 192 && b == 168)                 // private 192.168/16
        || (a == 198 && (18..20).contains(&b))    // benchmarking 198.18/15
        || (a == 198 && b == 51 && c == 100)      // documentation TEST-NET-2
        || (a == 203 && b == 0 && c == 113)       // documentation TEST-NET-3
        || a >= 224 // multicast, reserved, broadcast
}

/// The IANA IPv6 special-purpose registry's non-global ranges, and every form that embeds an
/// IPv4 address (mapped, compatible, NAT64, 6to4, Teredo), judged by the address inside.
fn forbidden_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    embedded_v4(ip).into_iter().any(|(_, v4)| forbidden_v4(v4))
        || ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        // IPv4-compatible ::a.b.c.d (deprecated) and IPv4-translated ::ffff:0:a.b.c.d: never fetched
        || (s[..6] == [0; 6])
        || (s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0)
        // NAT64 64:ff9b::/96 and the local-use 64:ff9b:1::/48: a translator reaches anything, never fetched
        || (s[0] == 0x64 && s[1] == 0xff9b)
        // Teredo 2001::/32, ORCHID and the IETF protocol block 2001::/23, documentation 2001:db8::/32
        || (s[0] == 0x2001 && s[1] < 0x0200)
        || (s[0] == 0x2001 && s[1] == 0x0db8)
        // documentation 3fff::/20
        || (s[0] & 0xfff0) == 0x3ff0
        // discard-only 100::/64
        || (s[0] == 0x0100 && s[1..4] == [0; 3])
        // unique local fc00::/7, link local fe80::/10, site local fec0::/10
        || (s[0] & 0xfe00) == 0xfc00
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
}

const CIMD_MAX_BYTES: usize = 64 * 1024;
const CIMD_CACHE_SECS: i64 = 3600;
/// The least time between two fetches of a client's key set for an unknown `kid`.
const JWKS_REFRESH_SECS: i64 = 60;

/// How client metadata documents and key sets may be fetched. The default is production's:
/// https only, public addresses only, the system's web PKI roots.
#[derive(Clone, Debug, Default)]
pub struct FetchPolicy {
    /// Development on one machine: loopback and private addresses, and http, are allowed;
    /// link-local and cloud metadata addresses (the guard's always-refused table) never are.
    pub dev: bool,
    /// Extra trusted roots (a development or test CA), in addition to the web PKI roots.
    pub extra_roots: Vec<reqwest::Certificate>,
}

/// Fetches a small JSON document for the authorization server: https only (http too in
/// development), every resolved address public (unless in development), the connection
/// pinned to the checked address, never through a proxy, five seconds and 64 KiB at most, no
/// redirects. The error says why, for the client's `error_description`.
pub(crate) async fn guarded_fetch(
    url: &str,
    policy: &FetchPolicy,
) -> std::result::Result<Vec<u8>, String> {
    guarded(url, policy, Outbound::Get).await.map(|(_, body)| body)
}

/// POSTs a form behind the same guard as [`guarded_fetch`] (a tenant IdP's token endpoint),
/// with HTTP Basic client authentication when `basic` names a client id and secret. A JSON
/// answer is returned whatever its status: token endpoints explain refusals in the body.
pub(crate) async fn guarded_post(
    url: &str,
    policy: &FetchPolicy,
    form: &[(&str, &str)],
    basic: Option<(&str, &str)>,
) -> std::result::Result<(u16, Vec<u8>), String> {
    guarded(url, policy, Outbound::Post { form, basic }).await
}

/// POSTs a JSON body with extra headers behind the same guard (a tenant's audit webhook);
/// returns the status, whatever it is.
pub(crate) async fn guarded_post_json(
    url: &str,
    policy: &FetchPolicy,
    body: &[u8],
    headers: &[(&str, String)],
) -> std::result::Result<u16, String> {
    guarded(url, policy, Outbound::Json { body, headers }).await.map(|(status, _)| status)
}

/// Checks that a URL could be fetched behind the guard (scheme, host, addresses) without
/// fetching it: an endpoint named now and called later (an IdP's token endpoint).
pub(crate) async fn guarded_target(
    url: &str,
    policy: &FetchPolicy,
) -> std::result::Result<(), String> {
    guarded(url, policy, Outbound::CheckOnly).await.map(|_| ())
}

enum Outbound<'a> {
    CheckOnly,
    Get,
    Post { form: &'a [(&'a str, &'a str)], basic: Option<(&'a str, &'a str)> },
    Json { body: &'a [u8], headers: &'a [(&'a str, String)] },
}

async fn guarded(
    url: &str,
    policy: &FetchPolicy,
    how: Outbound<'_>,
) -> std::result::Result<(u16, Vec<u8>), String> {
    let parsed = url::Url::parse(url).map_err(|_| "not a URL".to_owned())?;
    if parsed.scheme() != "https" && !(policy.dev && parsed.scheme() == "http") {
        return Err("documents are fetched over https only".into());
    }
    let host = parsed.host_str().ok_or("no host")?.to_owned();
    if parsed.path().len() <= 1 {
        return Err("the URL has no path".into());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() || parsed.fragment().is_some() {
        return Err("the URL carries user information or a fragment".into());
    }
    let port = parsed.port_or_known_default().unwrap_or(443);
    let addrs: Vec<SocketAddr> = tokio::time::timeout(
        Duration::from_secs(3),
        tokio::net::lookup_host((host.trim_matches(['[', ']']), port)),
    )
    .await
    .map_err(|_| "DNS lookup timed out".to_owned())?
    .map_err(|_| "the host does not resolve".to_owned())?
    .collect();
    if addrs.is_empty() {
        return Err("the host does not resolve".into());
    }
    // Development lets loopback and private addresses through, never link-local or cloud
    // metadata ones in any form (no development server lives there).
    let ips: Vec<IpAddr> = addrs.iter().map(SocketAddr::ip).collect();
    if let Some(why) = refusal(&ips, policy.dev) {
        return Err(why);
    }
    let mut builder = reqwest::Client::builder()
        // Never through a proxy: the address checked is the address connected to.
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(5))
        .resolve(&host, addrs[0]);
    for root in &policy.extra_roots {
        builder = builder.add_root_certificate(root.clone());
    }
    let client = builder.build().map_err(|_| "cannot build the HTTP client".to_owned())?;
    let (request, any_status) = match how {
        Outbound::CheckOnly => return Ok((0, Vec::new())),
        Outbound::Get => (client.get(parsed), false),
        Outbound::Post { form, basic } => {
            let mut request = client.post(parsed).form(form);
            if let Some((id, secret)) = basic {
                // RFC 6749 §2.3.1: each part form-urlencoded before the Basic encoding.
                let enc = |s: &str| {
                    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()
                };
                request = request.basic_auth(enc(id), Some(enc(secret)));
            }
            (request, true)
        }
        Outbound::Json { body, headers } => {
            let mut request = client
                .post(parsed)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_vec());
            for (name, value) in headers {
                request = request.header(*name, value.as_str());
            }
            (request, true)
        }
    };
    let mut response =
        request.header(reqwest::header::ACCEPT, "application/json").send().await.map_err(|e| {
            tracing::warn!(error = ?e, url = %url, "outbound fetch failed");
            "fetching it failed".to_owned()
        })?;
    if !any_status && !response.status().is_success() {
        return Err(format!("fetching it answered {}", response.status()));
    }
    let status = response.status().as_u16();
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|_| "reading it failed".to_owned())? {
        body.extend_from_slice(&chunk);
        if body.len() > CIMD_MAX_BYTES {
            return Err("it is larger than 64 KiB".into());
        }
    }
    Ok((status, body))
}

/// Fetches a client ID metadata document behind the SSRF guard; results are cached for an hour.
async fn fetch_metadata_document(
    svc: &Services,
    url: &str,
    policy: &FetchPolicy,
) -> std::result::Result<ClientRow, OAuthError> {
    if let Some(client) = svc.preauth_oauth_client_get(url).await.map_err(OAuthError::from)?
        && client
            .fetched_at
            .is_some_and(|t| (chrono::Utc::now() - t).num_seconds() < CIMD_CACHE_SECS)
    {
        return Ok(client);
    }
    let invalid = |why: &str| OAuthError {
        error: "invalid_client",
        error_description: format!("client_id {url}: {why}"),
    };
    let body = guarded_fetch(url, policy).await.map_err(|why| invalid(&why))?;
    let doc: MetadataDocument = serde_json::from_slice(&body)
        .map_err(|_| invalid("the document is not client metadata JSON"))?;
    accept_metadata_document(svc, url, doc).await
}

/// Resolves the `client_id` of an authorization request: a registered client, or a client ID
/// metadata document fetched behind the SSRF guard.
pub async fn resolve_client(
    svc: &Services,
    client_id: &str,
    policy: &FetchPolicy,
) -> std::result::Result<ClientRow, OAuthError> {
    if client_id.starts_with("https://") || client_id.starts_with("http://") {
        return fetch_metadata_document(svc, client_id, policy).await;
    }
    svc.preauth_oauth_client_get(client_id).await.map_err(OAuthError::from)?.ok_or(OAuthError {
        error: "invalid_client",
        error_description: "unknown client_id; register first".into(),
    })
}

// ---------------------------------------------------------------- client authentication

/// What the token endpoint received to authenticate the client.
#[derive(Debug, Default)]
pub struct ClientCredentials<'a> {
    pub client_id: Option<&'a str>,
    /// A confidential client's secret (`client_secret_post`, or `client_secret_basic` as the
    /// adapter decoded it from the Authorization header).
    pub client_secret: Option<&'a str>,
    pub assertion_type: Option<&'a str>,
    pub assertion: Option<&'a str>,
}

/// Authenticates the client of a token request and returns its `client_id`. Public clients
/// (`none`) prove nothing here (PKCE and the refresh token bind them); a `private_key_jwt`
/// client must send a fresh, single-use assertion signed by a key of its published set
/// (RFC 7523). A client that is public yet sends an assertion is refused, so no client can
/// choose the weaker method. `audiences` are this server's token endpoint and issuer.
pub async fn authenticate_client(
    ds: &Services,
    policy: &FetchPolicy,
    creds: ClientCredentials<'_>,
    audiences: &[String],
) -> std::result::Result<String, OAuthError> {
    let invalid = |why: String| oauth("invalid_client", why);
    let asserted = creds.assertion.map(|a| (a, client_assertion::unverified_subject(a)));
    let client_id = match (creds.client_id, &asserted) {
        (Some(id), Some((_, Some(sub)))) if id != sub => {
            return Err(invalid("client_id differs from the assertion's subject".into()));
        }
        (Some(id), _) => id.to_owned(),
        (None, Some((_, Some(sub)))) => sub.clone(),
        (None, Some((_, None))) => return Err(invalid("the client_assertion is not a JWT".into())),
        (None, None) => return Err(invalid("client_id is required".into())),
    };
    // A metadata-document client is read through its one-hour cache, so a key (or method) the
    // client changed in its document holds at the token endpoint too, not only at consent.
    let client = if client_id.starts_with("https://") || client_id.starts_with("http://") {
        match ds.preauth_oauth_client_get(&client_id).await.map_err(OAuthError::from)? {
            Some(_) => Some(fetch_metadata_document(ds, &client_id, policy).await?),
            None => None,
        }
    } else {
        ds.preauth_oauth_client_get(&client_id).await.map_err(OAuthError::from)?
    };
    let Some(client) = client else {
        // Unknown clients fall through to the grant's own check (the code or refresh token
        // names its client), which answers invalid_grant as before.
        return match (asserted, creds.client_secret) {
            (None, None) => Ok(client_id),
            _ => Err(invalid("unknown client".into())),
        };
    };
    if client.token_endpoint_auth_method == "client_secret" {
        // A confidential client a tenant admin registered: its secret, and nothing else.
        return match (creds.client_secret, asserted, &client.client_secret_hash) {
            (Some(given), None, Some(hash))
                if secret::tokens_match(&hex::encode(secret::hash_token(given)), &hex::encode(hash)) =>
            {
                Ok(client_id)
            }
            (Some(_), None, _) => Err(invalid("the client secret is wrong".into())),
            (_, Some(_), _) => Err(invalid(
                "this client authenticates with its client secret (client_secret_basic or client_secret_post), not an assertion".into(),
            )),
            (None, None, _) => Err(invalid(
                "this client is confidential: send its client_secret (client_secret_basic or client_secret_post)".into(),
            )),
        };
    }
    if creds.client_secret.is_some() {
        return Err(invalid(format!(
            "this client authenticates with {}; it has no client secret",
            client.token_endpoint_auth_method
        )));
    }
    match (client.token_endpoint_auth_method.as_str(), asserted) {
        ("none", None) => Ok(client_id),
        ("none", Some(_)) => Err(invalid(
            "this client is public (token_endpoint_auth_method none); it sends no client_assertion".into(),
        )),
        ("private_key_jwt", None) => Err(invalid(
            "this client authenticates with private_key_jwt: send client_assertion_type and client_assertion".into(),
        )),
        ("private_key_jwt", Some((assertion, _))) => {
            if creds.assertion_type != Some(client_assertion::ASSERTION_TYPE) {
                return Err(invalid(format!(
                    "client_assertion_type must be {}",
                    client_assertion::ASSERTION_TYPE
                )));
            }
            let now = jiff::Timestamp::now().as_second();
            let keys = ClientKeys { ds, policy, client: &client };
            let jtis = AssertionJtis { ds, client_id: &client_id };
            client_assertion::verify(assertion, &client_id, audiences, now, &keys, &jtis, invalid)
                .await?;
            Ok(client_id)
        }
        _ => Err(invalid("the client's authentication method is unknown".into())),
    }
}

/// The key set of a `private_key_jwt` client: inline in its document, else from its
/// `jwks_uri` (behind the SSRF guard, cached for an hour; a refresh fetches anew).
struct ClientKeys<'a> {
    ds: &'a Services,
    policy: &'a FetchPolicy,
    client: &'a ClientRow,
}

impl jose::KeySource for ClientKeys<'_> {
    type Error = OAuthError;

    async fn keys(&self, refresh: bool) -> std::result::Result<KeySet, OAuthError> {
        let invalid = |why: String| oauth("invalid_client", why);
        let client = self.client;
        let age = |t: chrono::DateTime<chrono::Utc>| (chrono::Utc::now() - t).num_seconds();
        let fresh = client.jwks_fetched_at.is_some_and(|t| age(t) < CIMD_CACHE_SECS);
        // A fetch, failed or not, is not repeated within the minute: the keys kept serve
        // meanwhile, and a client with none is told to try again.
        let tried_recently = client.jwks_tried_at.is_some_and(|t| age(t) < JWKS_REFRESH_SECS);
        let cached = match (&client.jwks, &client.jwks_uri) {
            (Some(keys), None) => Some(keys.clone()),
            (Some(keys), Some(_)) if (fresh && !refresh) || tried_recently => Some(keys.clone()),
            _ => None,
        };
        let keys = match cached {
            Some(keys) => keys,
            None => {
                let uri = client
                    .jwks_uri
                    .as_deref()
                    .ok_or_else(|| invalid("the client publishes no keys".into()))?;
                if tried_recently {
                    return Err(invalid(format!(
                        "jwks_uri {uri} could not be fetched a moment ago; publish the key set there and try again in a minute"
                    )));
                }
                let fetched = async {
                    let body = guarded_fetch(uri, self.policy)
                        .await
                        .map_err(|why| invalid(format!("jwks_uri {uri}: {why}")))?;
                    let keys: serde_json::Value = serde_json::from_slice(&body)
                        .map_err(|_| invalid(format!("jwks_uri {uri}: not JSON")))?;
                    KeySet::parse(&keys)
                        .ok_or_else(|| invalid(format!("jwks_uri {uri}: not a JWK set")))?;
                    Ok::<_, OAuthError>(keys)
                }
                .await;
                match fetched {
                    // Only a key set is kept: a glitch on the client's host does not lock it out.
                    Ok(keys) => {
                        self.ds.preauth_oauth_client_jwks_put(&client.client_id, &keys).await?;
                        keys
                    }
                    Err(refusal) => {
                        self.ds.preauth_oauth_client_jwks_tried(&client.client_id).await?;
                        return Err(refusal);
                    }
                }
            }
        };
        KeySet::parse(&keys).ok_or_else(|| invalid("the client's key set is not a JWK set".into()))
    }

    /// The client may have rotated its keys: an unknown `kid` refetches at most once a
    /// minute, so forged assertions cannot make the server fetch on every request.
    fn may_refresh(&self) -> bool {
        let last = self.client.jwks_tried_at.or(self.client.jwks_fetched_at);
        self.client.jwks_uri.is_some()
            && last.is_none_or(|t| (chrono::Utc::now() - t).num_seconds() >= JWKS_REFRESH_SECS)
    }
}

/// Client assertions' `jti`s, each kept until its assertion expires.
struct AssertionJtis<'a> {
    ds: &'a Services,
    client_id: &'a str,
}

impl jose::JtiStore for AssertionJtis<'_> {
    type Error = OAuthError;

    async fn first_use(
        &self,
        _issuer: &str,
        jti: &str,
        expires: i64,
    ) -> std::result::Result<bool, OAuthError> {
        let expires = chrono::DateTime::from_timestamp(expires, 0)
            .ok_or_else(|| oauth("invalid_client", "the assertion's exp is out of range"))?;
        Ok(self.ds.preauth_oauth_assertion_use(self.client_id, jti, expires).await?)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn private_loopback_and_metadata_addresses_are_never_fetched() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "0.1.2.3",
            "192.0.0.8",
            "198.18.0.1",
            "192.0.2.1",
            "240.0.0.1",
            "255.255.255.255",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::7f00:1",
            "64:ff9b:1::1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            "2001:0:4136:e378::1",
            "2001:db8::1",
            "fec0::1",
            "100::1",
            "::ffff:0:7f00:1",
        ] {
            assert!(forbidden_ip(ip.parse().expect("ip")), "{ip}");
        }
        assert!(
            !forbidden_ip("2002:5db8:d822::1".parse().expect("ip")),
            "6to4 of a public address"
        );
        for ip in ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"] {
            assert!(!forbidden_ip(ip.parse().expect("ip")), "{ip}");
        }
        // Development lets private addresses through, never link-local ones (cloud metadata).
        for ip in ["169.254.169.254", "fe80::1", "::ffff:169.254.169.254"] {
            assert!(always_refused(ip.parse().expect("ip")).is_some(), "{ip}");
        }
        for ip in ["127.0.0.1", "10.1.2.3", "::1", "fd00::1"] {
            assert!(always_refused(ip.parse().expect("ip")).is_none(), "{ip}");
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    /// The entry that refuses `text`, asserting it is refused in production and in development
    /// with a message that names the entry.
    fn refused_everywhere(text: &str) -> AlwaysRefused {
        let hit = always_refused(ip(text)).unwrap_or_else(|| panic!("{text}: not always refused"));
        assert!(forbidden_ip(ip(text)), "{text}");
        for dev in [false, true] {
            let why =
                refusal(&[ip(text)], dev).unwrap_or_else(|| panic!("{text}: allowed, dev {dev}"));
            assert!(why.contains(hit.what), "{text}, dev {dev}: {why}");
            assert!(why.starts_with(&ip(text).to_string()), "{text}, dev {dev}: {why}");
        }
        hit
    }

    #[test]
    fn every_link_local_and_metadata_entry_is_refused_in_production_and_development() {
        // One address per entry, with the entry it must match: removing an entry lets its
        // address through or names a broader entry, and the case fails.
        let cases = [
            ("169.254.169.254", "169.254.169.254/32", "cloud metadata address (AWS, GCP, Azure"),
            ("169.254.170.2", "169.254.170.2/32", "ECS"),
            ("169.254.170.23", "169.254.170.23/32", "EKS Pod Identity"),
            ("169.254.0.23", "169.254.0.23/32", "Tencent"),
            ("169.254.42.42", "169.254.42.42/32", "Scaleway"),
            ("100.100.100.200", "100.100.100.200/32", "Alibaba"),
            ("192.0.0.192", "192.0.0.192/32", "Oracle"),
            ("168.63.129.16", "168.63.129.16/32", "Azure WireServer"),
            ("fd00:ec2::254", "fd00:ec2::254/128", "AWS IPv6 instance metadata"),
            ("fd00:ec2::23", "fd00:ec2::23/128", "EKS Pod Identity IPv6"),
            ("fd20:ce::254", "fd20:ce::254/128", "GCP IPv6"),
            ("fd00:c1::a9fe:a9fe", "fd00:c1::a9fe:a9fe/128", "OCI IPv6"),
            ("fd00:a9fe:a9fe::1", "fd00:a9fe:a9fe::1/128", "Linode"),
            ("fd00:42::42", "fd00:42::42/128", "Scaleway IPv6"),
            ("fe80::a9fe:a9fe", "fe80::a9fe:a9fe/128", "OpenStack IPv6"),
            ("169.254.1.1", "169.254.0.0/16", "IPv4 link-local"),
            ("169.254.255.254", "169.254.0.0/16", "IPv4 link-local"),
            ("fe80::1", "fe80::/10", "IPv6 link-local"),
            ("febf:ffff::1", "fe80::/10", "IPv6 link-local"),
        ];
        for (text, net, what) in cases {
            let hit = refused_everywhere(text);
            assert_eq!(hit.net.to_string(), net, "{text}");
            assert!(hit.what.contains(what), "{text}: {}", hit.what);
            assert!(hit.via.is_none(), "{text}");
        }
        // Every entry has its case, so a new entry comes with one.
        for (what, net) in ALWAYS_REFUSED {
            assert!(cases.iter().any(|(_, n, _)| *n == net.to_string()), "no case for {what}");
        }
        // The message names the entry, as the client reads it.
        assert_eq!(
            refusal(&[ip("169.254.169.254")], true).as_deref(),
            Some(
                "169.254.169.254 is a cloud metadata address (AWS, GCP, Azure, OCI, OpenStack, \
                 DigitalOcean, Akamai…), which is never fetched (refused range 169.254.169.254/32)"
            )
        );
        // A metadata address among public ones is named, whatever its place.
        let why = refusal(&[ip("93.184.216.34"), ip("10.0.0.1"), ip("fd00:ec2::254")], false);
        assert!(why.is_some_and(|w| w.starts_with("fd00:ec2::254 is the AWS IPv6")));
        // Just outside an entry is not that entry.
        for text in ["169.253.255.255", "169.255.0.0", "100.100.100.201", "192.0.0.193", "fec0::1"]
        {
            assert!(always_refused(ip(text)).is_none(), "{text}");
        }
    }

    #[test]
    fn ipv4_inside_every_ipv6_form_is_judged_as_the_ipv4_address() {
        // 169.254.169.254 = a9fe:a9fe, 100.100.100.200 = 6464:64c8, 169.254.170.2 = a9fe:aa02;
        // Teredo carries its client inverted (!a9fe = 5601).
        let metadata = [
            ("::ffff:169.254.169.254", "IPv4-mapped", "169.254.169.254"),
            ("::ffff:0:a9fe:a9fe", "IPv4-translated", "169.254.169.254"),
            ("::169.254.169.254", "IPv4-compatible", "169.254.169.254"),
            ("64:ff9b::a9fe:a9fe", "NAT64", "169.254.169.254"),
            ("64:ff9b:1:a9fe:a9:fe00::", "local-use NAT64 /48", "169.254.169.254"),
            ("64:ff9b:1:a9:fe:a9fe::", "local-use NAT64 /56", "169.254.169.254"),
            ("64:ff9b:1:0:a9:fea9:fe00:0", "local-use NAT64 /64", "169.254.169.254"),
            ("64:ff9b:1::a9fe:a9fe", "local-use NAT64 /96", "169.254.169.254"),
            ("2002:a9fe:a9fe::1", "6to4", "169.254.169.254"),
            ("2001:0:4136:e378:8000:63bf:5601:5601", "Teredo client", "169.254.169.254"),
            ("2001:0:a9fe:a9fe::1", "Teredo server", "169.254.169.254"),
            ("::ffff:100.100.100.200", "IPv4-mapped", "100.100.100.200"),
            ("2002:6464:64c8::1", "6to4", "100.100.100.200"),
            ("64:ff9b::a9fe:aa02", "NAT64", "169.254.170.2"),
            ("::ffff:169.254.7.7", "IPv4-mapped", "169.254.7.7"),
        ];
        for (text, form, v4) in metadata {
            let hit = refused_everywhere(text);
            let (got_form, got_v4) = hit.via.unwrap_or_else(|| panic!("{text}: matched directly"));
            assert_eq!((got_form, got_v4.to_string().as_str()), (form, v4), "{text}");
            assert!(
                hit.to_string().contains(&format!("carries {v4} ({form}), and {v4} is ")),
                "{hit}"
            );
        }
        // Loopback and private addresses inside a form are refused in production and
        // allowed in development, like the IPv4 address itself.
        for text in [
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:0:7f00:1",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "64:ff9b:1::a00:1",
            "2002:7f00:1::",
            "2002:c0a8:101::1",
            "2001:0:4136:e378:8000:63bf:f5ff:fffe",
        ] {
            assert!(forbidden_ip(ip(text)), "{text}");
            assert!(refusal(&[ip(text)], false).is_some(), "{text}: allowed in production");
            assert!(refusal(&[ip(text)], true).is_none(), "{text}: refused in development");
        }
        // A public address inside a form that is otherwise public stays allowed.
        for text in ["::ffff:93.184.216.34", "2002:5db8:d822::1"] {
            assert!(refusal(&[ip(text)], false).is_none(), "{text}");
        }
    }

    #[test]
    fn public_addresses_pass_and_development_still_reaches_loopback_and_private_ones() {
        for text in ["93.184.216.34", "2606:4700::1111", "1.1.1.1", "2a00:1450:4001:80b::200e"] {
            assert!(!forbidden_ip(ip(text)), "{text}");
            assert_eq!(refusal(&[ip(text)], false), None, "{text}");
            assert_eq!(refusal(&[ip(text)], true), None, "{text}");
        }
        for text in
            ["127.0.0.1", "10.0.0.1", "192.168.1.1", "172.16.0.1", "::1", "fd00::1", "100.64.0.1"]
        {
            assert_eq!(
                refusal(&[ip(text)], false).as_deref(),
                Some(
                    "the host resolves to a private, loopback or link-local address, which is \
                     never fetched"
                ),
                "{text}"
            );
            assert_eq!(refusal(&[ip(text)], true), None, "{text}: development reaches it");
        }
    }

    use super::*;

    #[test]
    fn pkce_accepts_only_the_matching_s256_verifier() {
        // RFC 7636 appendix B.
        let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
        assert!(pkce_matches(verifier, "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"));
        assert!(!pkce_matches(
            "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXX",
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        ));
        assert!(!pkce_matches("short", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"));
    }

    #[test]
    fn redirect_uris_are_parsed_never_string_matched() {
        let ok = |u: &str| parse_redirect_uri(u).is_ok();
        assert!(ok("https://app.example.com/cb"));
        assert!(ok("http://127.0.0.1:33418/callback"));
        assert!(ok("http://[::1]:8080/cb"));
        assert!(ok("http://localhost/cb"));
        for bad in [
            "http://evil.example.com/cb",
            "http://localhost.evil.example/cb",
            "http://127.0.0.1.evil.example/cb",
            "https://app.example.com/cb#frag",
            "https://user:pass@app.example.com/cb",
            "https://app.example.com@evil.example/cb",
            "javascript:alert(1)",
            "https://",
            "not a url",
            "",
        ] {
            assert!(!ok(bad), "{bad}");
        }
        assert!(!ok(&format!("https://app.example.com/{}", "a".repeat(MAX_REDIRECT_URI_LEN))));
        // Loopback redirects may use any port at request time; nothing else may differ.
        assert!(redirect_matches("http://127.0.0.1/cb", "http://127.0.0.1:51234/cb"));
        assert!(!redirect_matches("http://127.0.0.1/cb", "http://127.0.0.1:51234/other"));
        assert!(!redirect_matches("http://127.0.0.1/cb", "http://localhost:51234/cb"));
        assert!(!redirect_matches("https://app.example.com/cb", "https://app.example.com:8443/cb"));
        assert!(!redirect_matches("https://app.example.com/cb", "https://app.example.com/cb?x=1"));
    }

    #[test]
    fn client_names_are_display_text() {
        assert_eq!(display_name(Some("  Claude\u{202E}  \u{0007}Code "), "x"), "Claude  Code");
        assert_eq!(display_name(Some("\u{0000}"), "fallback"), "fallback");
        let tags: String =
            "x".chars().map(|c| char::from_u32(0xE0000 + c as u32).unwrap_or(c)).collect();
        assert_eq!(
            display_name(
                Some(&format!("Claude\u{FEFF}\u{2060}\u{00AD}{tags}\u{180E}\u{FE00} Desktop")),
                "x"
            ),
            "Claude Desktop"
        );
        assert_eq!(
            display_name(Some(&"n".repeat(500)), "x").chars().count(),
            MAX_CLIENT_NAME_CHARS
        );
    }

    #[test]
    fn unknown_scopes_are_invalid() {
        assert!(check_scope(Some("bookings:read customers:read")).is_ok());
        assert_eq!(
            check_scope(Some("bookings:read admin:everything")).map_err(|e| e.error),
            Err("invalid_scope")
        );
        assert!(check_scope(None).is_ok());
    }
}
