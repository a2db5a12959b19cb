//! Tenant single sign-on (OpenID Connect): a tenant admin connects the tenant's identity
//! provider (issuer, client id and secret, the email domains it vouches for), and people sign
//! in through it with the authorization code flow, PKCE, `state` and `nonce`.
//!
//! - **Every call to the IdP goes through the SSRF guard** (`oauth::guarded_fetch` and
//!   `guarded_post`): discovery, the key set, the token endpoint. https only and public
//!   addresses only, unless the fetch policy is development's.
//! - **ID tokens are a `jose` profile**: `typ` absent or `JWT`, the IdP's issuer, `aud` the
//!   tenant's client id (and `azp`, when present, the same), short-lived; the `nonce` is the
//!   single use, held by the sign-in row and consumed once with its `state`.
//! - **People are linked by (issuer, subject)**, never by email alone: a first sign-in links
//!   the active member whose *verified* email (of a domain the IdP vouches for) matches, or
//!   joins a verified person as a viewer when the tenant allows it. A subject linked in
//!   another tenant is refused.
//! - **Sessions the IdP started end** after the tenant's session lifetime (8 hours by default,
//!   12 at most) or when the IdP sends a back-channel logout for them.
//! - **SSO required**: a session the tenant's IdP did not start cannot work in the tenant
//!   (`console::session_ctx`), so password sign-in is off for it.
//!
//! Every configuration change is audited in the transaction that makes it.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ctx::OpCtx;
use crate::datastore::{self as db, AuditEntry, IdpRow, NewIdp, Services};
use crate::error::{Error, Result};
use crate::rights::{Right, Role};
use crate::secret::{self, CredentialKind};
use crate::services::console::SESSION_TTL_SECS;
use crate::services::jose::{self, Expect, Jti, KeySet, Typ};
use crate::services::oauth::{FetchPolicy, guarded_fetch, guarded_post, guarded_target};
use crate::services::{admin, invitations};

mod logout;
mod sign_in;
pub use logout::*;
pub use sign_in::*;

/// How long a person has to come back from the IdP.
pub const SIGN_IN_TTL_SECS: i64 = 600;
/// How far ahead an ID token's `exp` may lie (IdPs issue them for an hour or so).
pub const ID_TOKEN_MAX_LIFETIME_SECS: i64 = 24 * 3600;
/// How far ahead a logout token's `exp` may lie; its `jti` is kept that long.
pub const LOGOUT_TOKEN_MAX_LIFETIME_SECS: i64 = 3600;
/// The session lifetime of a tenant that sets none, and the longest one may set.
pub const DEFAULT_SESSION_HOURS: i32 = 8;
pub const MAX_SESSION_HOURS: i32 = 12;
/// The event a back-channel logout token carries (OpenID Connect Back-Channel Logout 1.0).
pub const BACKCHANNEL_LOGOUT_EVENT: &str = "http://schemas.openid.net/event/backchannel-logout";
const SECRET_PURPOSE: &str = "tenant-idp-client-secret";
/// The least time between two fetches of an IdP's key set.
const JWKS_REFRESH_SECS: i64 = 60;
const JWKS_CACHE_SECS: i64 = 3600;
const MAX_DOMAINS: usize = 20;

/// What a tenant admin sets. A missing secret keeps the one stored for the same client id.
#[derive(Debug, Clone)]
pub struct IdpInput {
    pub issuer: String,
    pub client_id: String,
    pub client_secret: Option<String>,
    pub email_domains: Vec<String>,
    pub allow_join: bool,
    pub sso_required: bool,
    pub id_jag: bool,
    pub session_hours: i32,
}

/// A tenant's identity provider as admins see it: never its secret.
#[derive(Debug, Clone, Serialize)]
pub struct IdpView {
    pub issuer: String,
    pub client_id: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub jwks_uri: String,
    pub token_auth_method: String,
    pub email_domains: Vec<String>,
    pub allow_join: bool,
    pub sso_required: bool,
    pub id_jag: bool,
    pub session_hours: i32,
}

fn view(row: &IdpRow) -> IdpView {
    IdpView {
        issuer: row.issuer.clone(),
        client_id: row.client_id.clone(),
        authorization_endpoint: row.authorization_endpoint.clone(),
        token_endpoint: row.token_endpoint.clone(),
        jwks_uri: row.jwks_uri.clone(),
        token_auth_method: row.token_auth_method.clone(),
        email_domains: row.email_domains.clone(),
        allow_join: row.allow_join,
        sso_required: row.sso_required,
        id_jag: row.id_jag,
        session_hours: row.session_hours,
    }
}

/// The tenant's identity provider, if one is connected.
pub async fn idp_show(ds: &Services, ctx: &OpCtx) -> Result<Option<IdpView>> {
    ctx.require(Right::PeopleManage)?;
    Ok(ds.idp_get(ctx).await?.as_ref().map(view))
}

/// A URL the IdP names: https (http too in development), a host, no credentials or fragment.
fn endpoint(field: &str, raw: &str, policy: &FetchPolicy) -> Result<url::Url> {
    let url =
        url::Url::parse(raw).map_err(|_| Error::invalid(field, format!("{raw:?} is not a URL")))?;
    let scheme_ok = url.scheme() == "https" || (policy.dev && url.scheme() == "http");
    if !scheme_ok || url.host_str().is_none() {
        return Err(Error::invalid(field, format!("{raw} must be an https URL")));
    }
    if !url.username().is_empty() || url.password().is_some() || url.fragment().is_some() {
        return Err(Error::invalid(field, format!("{raw} carries credentials or a fragment")));
    }
    Ok(url)
}

#[derive(Debug, Deserialize)]
struct Discovery {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
    #[serde(default)]
    token_endpoint_auth_methods_supported: Option<Vec<String>>,
}

/// Reads the issuer's discovery document and key set (both behind the SSRF guard) and checks
/// them: the document names this issuer, every endpoint is https, the key set has a key.
async fn discover(issuer: &str, policy: &FetchPolicy) -> Result<(Discovery, serde_json::Value)> {
    let base = issuer.trim_end_matches('/');
    let at = format!("{base}/.well-known/openid-configuration");
    let body = guarded_fetch(&at, policy)
        .await
        .map_err(|why| Error::invalid("issuer", format!("its discovery document {at}: {why}")))?;
    let doc: Discovery = serde_json::from_slice(&body).map_err(|_| {
        Error::invalid("issuer", format!("{at} is not an OpenID Connect discovery document"))
    })?;
    if doc.issuer != issuer {
        return Err(Error::invalid(
            "issuer",
            format!(
                "the discovery document names the issuer {:?}; use exactly that as the issuer",
                doc.issuer.chars().take(200).collect::<String>()
            ),
        ));
    }
    endpoint("authorization_endpoint", &doc.authorization_endpoint, policy)?;
    endpoint("token_endpoint", &doc.token_endpoint, policy)?;
    endpoint("jwks_uri", &doc.jwks_uri, policy)?;
    // The token endpoint is called at every sign-in: it must pass the guard now too.
    guarded_target(&doc.token_endpoint, policy).await.map_err(|why| {
        Error::invalid("issuer", format!("its token_endpoint {}: {why}", doc.token_endpoint))
    })?;
    let keys = guarded_fetch(&doc.jwks_uri, policy)
        .await
        .map_err(|why| Error::invalid("issuer", format!("its jwks_uri {}: {why}", doc.jwks_uri)))?;
    let keys: serde_json::Value = serde_json::from_slice(&keys).map_err(|_| {
        Error::invalid("issuer", format!("its jwks_uri {}: not JSON", doc.jwks_uri))
    })?;
    KeySet::parse(&keys).ok_or_else(|| {
        Error::invalid(
            "issuer",
            format!("its jwks_uri {} holds no ES256, RS256 or PS256 signing key", doc.jwks_uri),
        )
    })?;
    Ok((doc, keys))
}

/// The token endpoint's client authentication: Basic when the IdP takes it (the default of
/// OpenID Connect), the form otherwise.
fn auth_method(doc: &Discovery) -> Result<&'static str> {
    match &doc.token_endpoint_auth_methods_supported {
        None => Ok("client_secret_basic"),
        Some(m) if m.iter().any(|m| m == "client_secret_basic") => Ok("client_secret_basic"),
        Some(m) if m.iter().any(|m| m == "client_secret_post") => Ok("client_secret_post"),
        Some(_) => Err(Error::invalid(
            "issuer",
            "its token endpoint takes neither client_secret_basic nor client_secret_post",
        )),
    }
}

fn email_domains(raw: &[String]) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for d in raw.iter().flat_map(|d| d.split(',')).map(|d| d.trim().to_lowercase()) {
        if d.is_empty() {
            continue;
        }
        let d = d.trim_start_matches('@').to_owned();
        let valid = d.len() <= 253
            && d.contains('.')
            && d.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                    && !l.starts_with('-')
            });
        if !valid {
            return Err(Error::invalid("email_domains", format!("{d:?} is not a domain name")));
        }
        if !out.contains(&d) {
            out.push(d);
        }
    }
    if out.len() > MAX_DOMAINS {
        return Err(Error::invalid("email_domains", format!("at most {MAX_DOMAINS} domains")));
    }
    Ok(out)
}

/// The decision connecting or changing the IdP is, as a passkey ceremony names it: every
/// setting it stores (never the secret itself, only whether one is given).
pub(crate) fn set_decision(input: &IdpInput) -> crate::services::passkeys::Decision {
    let domains = email_domains(&input.email_domains).unwrap_or_default().join(" ");
    crate::services::passkeys::Decision::identity_provider(
        "set",
        &[
            ("issuer", input.issuer.trim().to_owned()),
            ("client_id", input.client_id.trim().to_owned()),
            (
                "new_secret",
                input.client_secret.as_deref().is_some_and(|s| !s.trim().is_empty()).to_string(),
            ),
            ("email_domains", domains),
            ("allow_join", input.allow_join.to_string()),
            ("sso_required", input.sso_required.to_string()),
            ("id_jag", input.id_jag.to_string()),
            ("session_hours", input.session_hours.to_string()),
        ],
    )
}

/// Single sign-on starts one address may make a minute.
const SIGN_INS_PER_MINUTE: i32 = 30;

/// Connects (or changes) the tenant's identity provider after checking its discovery
/// document and key set; audited as `idp.set`, and a change of "SSO required" as
/// `idp.sso_required.on` / `.off`.
pub async fn idp_set(
    ds: &Services,
    ctx: &OpCtx,
    policy: &FetchPolicy,
    input: IdpInput,
) -> Result<IdpView> {
    ctx.require(Right::PeopleManage)?;
    let issuer = input.issuer.trim().to_owned();
    let parsed = endpoint("issuer", &issuer, policy)?;
    if parsed.query().is_some() {
        return Err(Error::invalid("issuer", "an issuer has no query"));
    }
    let client_id = input.client_id.trim().to_owned();
    if client_id.is_empty() || client_id.len() > 255 {
        return Err(Error::invalid(
            "client_id",
            "give the client id the IdP issued (1 to 255 characters)",
        ));
    }
    if !(1..=MAX_SESSION_HOURS).contains(&input.session_hours) {
        return Err(Error::invalid(
            "session_hours",
            format!("sessions from the IdP last 1 to {MAX_SESSION_HOURS} hours"),
        ));
    }
    let domains = email_domains(&input.email_domains)?;
    if domains.is_empty() {
        return Err(Error::invalid(
            "email_domains",
            "name the email domains the IdP vouches for (e.g. example.com)",
        ));
    }
    // A domain picks the tenant a person signing in is sent to: one tenant per domain, so no
    // tenant can send another's people to its own IdP.
    let taken = ds.idp_domains_taken(ctx, &domains).await?;
    if !taken.is_empty() {
        return Err(Error::invalid(
            "email_domains",
            format!(
                "{} is signed in through another tenant's identity provider already; each email domain belongs to one tenant",
                taken.join(", ")
            ),
        ));
    }
    if let Some(other) = ds.preauth_idp_by_issuer(&issuer).await?
        && other.tenant_id != ctx.tenant_id()
    {
        return Err(Error::invalid(
            "issuer",
            format!(
                "{issuer} is connected to another tenant already; an issuer serves one tenant. Use the issuer of your own IdP tenant or app (Okta: your org or authorization server; Entra ID: your directory's v2.0 issuer)"
            ),
        ));
    }
    let keys = ds.secret_keys().ok_or_else(|| {
        Error::invalid(
            "client_secret",
            "this server keeps no secrets yet: the operator sets GATEHOUSE_SECRET_KEYS (see docs/operations.md)",
        )
    })?;
    let existing = ds.idp_get(ctx).await?;
    let sealed = match input.client_secret.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        Some(secret) if secret.len() > 1024 => {
            return Err(Error::invalid("client_secret", "at most 1024 characters"));
        }
        Some(secret) => keys.seal(SECRET_PURPOSE, secret.as_bytes()).map_err(Error::Internal)?,
        None => match &existing {
            Some(e) if e.client_id == client_id && e.issuer == issuer => {
                e.client_secret_sealed.clone()
            }
            _ => {
                return Err(Error::invalid(
                    "client_secret",
                    "give the client secret the IdP issued for this client id",
                ));
            }
        },
    };
    let (doc, jwks) = discover(&issuer, policy).await?;
    let method = auth_method(&doc)?;
    let mut tx = ds.begin().await?;
    // Which IdP vouches for the tenant's people decides who can become them: under the
    // passkey policy every change is a decision with a passkey.
    crate::services::passkeys::require(&mut tx, ctx, &set_decision(&input)).await?;
    let before = db::idp_upsert(
        &mut tx,
        ctx,
        NewIdp {
            issuer: &issuer,
            client_id: &client_id,
            client_secret_sealed: &sealed,
            authorization_endpoint: &doc.authorization_endpoint,
            token_endpoint: &doc.token_endpoint,
            jwks_uri: &doc.jwks_uri,
            token_auth_method: method,
            email_domains: &domains,
            allow_join: input.allow_join,
            sso_required: input.sso_required,
            id_jag: input.id_jag,
            session_hours: input.session_hours,
        },
    )
    .await
    .map_err(|e| match e {
        Error::Internal(d) if d.contains("tenant_idps_issuer_key") => {
            Error::invalid("issuer", format!("{issuer} is connected to another tenant already"))
        }
        other => other,
    })?;
    let tenant = ctx.tenant().handle.to_string();
    db::audit_insert(&mut tx, ctx, AuditEntry::ok("idp.set", vec![tenant.clone()])).await?;
    if before.unwrap_or(false) != input.sso_required {
        let action =
            if input.sso_required { "idp.sso_required.on" } else { "idp.sso_required.off" };
        db::audit_insert(&mut tx, ctx, AuditEntry::ok(action, vec![tenant])).await?;
    }
    tx.commit().await?;
    let row = ds.idp_get(ctx).await?.ok_or_else(|| Error::Internal("idp vanished".into()))?;
    ds.preauth_idp_jwks_put(row.id, &jwks).await?;
    Ok(view(&row))
}

/// The decision removing an IdP the tenant requires is.
pub(crate) fn remove_decision() -> crate::services::passkeys::Decision {
    crate::services::passkeys::Decision::identity_provider("remove", &[])
}

/// Disconnects the tenant's identity provider: the sessions it started end; the identities
/// linked through it stay (so another tenant taking the issuer cannot take these people).
/// Audited as `idp.remove`.
pub async fn idp_remove(ds: &Services, ctx: &OpCtx) -> Result<bool> {
    ctx.require(Right::PeopleManage)?;
    let required = ds.idp_get(ctx).await?.is_some_and(|i| i.sso_required);
    let mut tx = ds.begin().await?;
    // Removing an IdP that the tenant required turns password sign-in back on.
    if required {
        crate::services::passkeys::require(&mut tx, ctx, &remove_decision()).await?;
    }
    let removed = db::idp_delete(&mut tx, ctx).await?;
    if removed {
        db::audit_insert(
            &mut tx,
            ctx,
            AuditEntry::ok("idp.remove", vec![ctx.tenant().handle.to_string()]),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(removed)
}
