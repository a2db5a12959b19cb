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
pub fn set_decision(input: &IdpInput) -> crate::services::passkeys::Decision {
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
pub fn remove_decision() -> crate::services::passkeys::Decision {
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

// ---------------------------------------------------------------- signing in

fn random_token() -> String {
    secret::generate(CredentialKind::Session)["gh_ses_".len()..].to_owned()
}

/// Where the browser goes to sign in at the IdP, and the `state` it must bring back (the
/// adapter keeps it in a cookie, so a callback started in another browser is refused).
pub struct Started {
    pub redirect: String,
    pub state: String,
}

/// The redirect URI a tenant registers at its IdP.
pub fn redirect_uri(public_url: &str) -> String {
    format!("{}/sso/callback", public_url.trim_end_matches('/'))
}

/// The back-channel logout URI a tenant registers at its IdP.
pub fn backchannel_logout_uri(public_url: &str) -> String {
    format!("{}/sso/backchannel-logout", public_url.trim_end_matches('/'))
}

/// Starts a sign-in for the person who named `who`: their work email (its domain) or the
/// tenant's short name.
pub async fn sign_in_start(
    ds: &Services,
    public_url: &str,
    who: &str,
    next: &str,
    source: &str,
) -> Result<Started> {
    // Anyone may start one (each stores a row): a bounded number a minute per address, and
    // a return path of bounded length (a longer one returns to the start page).
    let key = format!("sso_start:{}", source.chars().take(64).collect::<String>());
    if ds.preauth_throttle_take(&key, 60).await?.0 > SIGN_INS_PER_MINUTE {
        return Err(Error::Unauthenticated(
            "Too many single sign-on attempts from this address; wait a minute and try again."
                .into(),
        ));
    }
    let next = if next.len() > 2048 { "/" } else { next };
    let who = who.trim().to_lowercase();
    let (key, email) = match who.rsplit_once('@') {
        Some((_, domain)) => (domain.to_owned(), Some(who.clone())),
        None => (who.clone(), None),
    };
    let not_found = || {
        Error::Unauthenticated(
            "No tenant signs in with single sign-on under that name. Give your work email address or your organization's short name, or sign in with your password.".into(),
        )
    };
    if key.is_empty() || key.len() > 253 {
        return Err(not_found());
    }
    let idp = ds.preauth_idp_for(&key).await?.ok_or_else(not_found)?;
    let state = random_token();
    let nonce = random_token();
    let verifier = format!("{}{}", random_token(), random_token());
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    ds.preauth_sso_sign_in_insert(
        &secret::hash_token(&state),
        idp.tenant_id,
        idp.id,
        &nonce,
        &verifier,
        next,
        SIGN_IN_TTL_SECS,
    )
    .await?;
    let mut url = url::Url::parse(&idp.authorization_endpoint)
        .map_err(|_| Error::Internal("stored authorization endpoint is not a URL".into()))?;
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("response_type", "code")
            .append_pair("client_id", &idp.client_id)
            .append_pair("redirect_uri", &redirect_uri(public_url))
            .append_pair("scope", "openid email profile")
            .append_pair("state", &state)
            .append_pair("nonce", &nonce)
            .append_pair("code_challenge", &challenge)
            .append_pair("code_challenge_method", "S256");
        if let Some(email) = &email {
            q.append_pair("login_hint", email);
        }
    }
    Ok(Started { redirect: url.to_string(), state })
}

/// What the IdP sent back to the callback.
pub struct Callback<'a> {
    pub state: Option<&'a str>,
    pub code: Option<&'a str>,
    pub error: Option<&'a str>,
    /// The `state` the browser kept when the sign-in started.
    pub browser_state: Option<&'a str>,
}

pub struct SsoSignedIn {
    /// The session secret for the cookie.
    pub token: String,
    pub next: String,
    /// How long the session lives (the tenant's session lifetime).
    pub ttl_secs: i64,
}

#[derive(Debug, Deserialize)]
struct IdClaims {
    #[serde(default)]
    nonce: Option<String>,
    #[serde(default)]
    azp: Option<String>,
    #[serde(default)]
    email: Option<String>,
    #[serde(default)]
    email_verified: Option<serde_json::Value>,
    /// Entra ID's "email domain owner verified" (it sends no `email_verified`).
    #[serde(default)]
    xms_edov: Option<serde_json::Value>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    sid: Option<String>,
}

/// Whether a claim says yes (a boolean, or the string some IdPs send).
fn yes(claim: Option<&serde_json::Value>) -> bool {
    match claim {
        Some(serde_json::Value::Bool(b)) => *b,
        Some(serde_json::Value::String(s)) => s == "true",
        _ => false,
    }
}

fn refused(why: impl Into<String>) -> Error {
    Error::Unauthenticated(why.into())
}

/// Finishes a sign-in: the state (from this browser, once), the code exchanged at the IdP's
/// token endpoint with the PKCE verifier, the ID token verified, the person linked, a session
/// bounded by the tenant's lifetime.
pub async fn sign_in_finish(
    ds: &Services,
    policy: &FetchPolicy,
    public_url: &str,
    cb: Callback<'_>,
) -> Result<SsoSignedIn> {
    let again = "start again from the sign-in page";
    let state = cb
        .state
        .filter(|s| !s.is_empty() && s.len() <= 200)
        .ok_or_else(|| refused(format!("The identity provider sent no sign-in state; {again}.")))?;
    if !cb.browser_state.is_some_and(|b| secret::tokens_match(b, state)) {
        return Err(refused(format!("This sign-in was not started in this browser; {again}.")));
    }
    let row = ds.preauth_sso_sign_in_take(&secret::hash_token(state)).await?.ok_or_else(|| {
        refused(format!("This single sign-on attempt expired or was used already; {again}."))
    })?;
    if let Some(error) = cb.error {
        return Err(refused(format!(
            "Your identity provider did not sign you in ({}); {again}, or ask your administrator.",
            error.chars().filter(|c| c.is_ascii_graphic()).take(60).collect::<String>()
        )));
    }
    let code = cb.code.filter(|c| !c.is_empty() && c.len() <= 4096).ok_or_else(|| {
        refused(format!("The identity provider sent no authorization code; {again}."))
    })?;
    let idp = ds
        .preauth_idp_by_id(row.idp_id)
        .await?
        .ok_or_else(|| refused("This tenant no longer signs in with single sign-on."))?;
    let client_secret = open_secret(ds, &idp)?;
    let redirect = redirect_uri(public_url);
    let mut form = vec![
        ("grant_type", "authorization_code"),
        ("code", code),
        ("redirect_uri", redirect.as_str()),
        ("code_verifier", row.pkce_verifier.as_str()),
        ("client_id", idp.client_id.as_str()),
    ];
    let basic = if idp.token_auth_method == "client_secret_post" {
        form.push(("client_secret", client_secret.as_str()));
        None
    } else {
        Some((idp.client_id.as_str(), client_secret.as_str()))
    };
    let (status, body) =
        guarded_post(&idp.token_endpoint, policy, &form, basic).await.map_err(|why| {
            refused(format!("The identity provider's token endpoint: {why}; {again}."))
        })?;
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let Some(id_token) = answer.get("id_token").and_then(|t| t.as_str()).filter(|_| status == 200)
    else {
        let error = answer.get("error").and_then(|e| e.as_str()).unwrap_or("no ID token");
        return Err(refused(format!(
            "The identity provider refused the sign-in code ({}); {again}.",
            error.chars().take(60).collect::<String>()
        )));
    };
    let audiences = [idp.client_id.clone()];
    let expect = Expect {
        what: "the ID token",
        typ: Typ::AbsentOr(&["JWT"]),
        issuer: Some(&idp.issuer),
        subject: jose::Subject::Required,
        audiences: &audiences,
        max_lifetime_secs: ID_TOKEN_MAX_LIFETIME_SECS,
        jti: Jti::NotRequired,
        now: jiff::Timestamp::now().as_second(),
    };
    let keys = IdpKeys { ds, policy, idp: &idp, refuse: refused };
    let jtis = IdpJtis { ds, refuse: refused };
    let verified = jose::verify::<IdClaims, Error>(id_token, &expect, &keys, &jtis, |why| {
        refused(format!(
            "Your identity provider's answer was refused: {why}. Ask your administrator."
        ))
    })
    .await?;
    let claims = &verified.claims;
    // The nonce is the ID token's single use: the sign-in row held it and is consumed now.
    if !claims.nonce.as_deref().is_some_and(|n| secret::tokens_match(n, &row.nonce)) {
        return Err(refused(format!("The ID token is not for this sign-in (nonce); {again}.")));
    }
    if claims.azp.as_deref().is_some_and(|azp| azp != idp.client_id) {
        return Err(refused(
            "The ID token was issued to another client (azp). Ask your administrator.",
        ));
    }
    let verified_email = match &claims.email_verified {
        Some(said) => yes(Some(said)),
        None => yes(claims.xms_edov.as_ref()),
    };
    let person_id = link(
        ds,
        &idp,
        &verified.registered.sub,
        claims.email.as_deref(),
        verified_email,
        claims.name.as_deref(),
    )
    .await?;
    let token = secret::generate(CredentialKind::Session);
    let csrf = random_token();
    let ttl_secs = SESSION_TTL_SECS.min(i64::from(idp.session_hours) * 3600);
    ds.preauth_session_create_sso(
        &secret::hash_token(&token),
        person_id,
        idp.tenant_id,
        &csrf,
        ttl_secs,
        idp.id,
        claims.sid.as_deref().filter(|s| s.len() <= 255),
    )
    .await?;
    Ok(SsoSignedIn { token, next: row.next, ttl_secs })
}

fn open_secret(ds: &Services, idp: &IdpRow) -> Result<String> {
    let keys = ds.secret_keys().ok_or_else(|| {
        Error::Internal("GATEHOUSE_SECRET_KEYS is not set on this control plane".into())
    })?;
    let plain = keys.open(SECRET_PURPOSE, &idp.client_secret_sealed).ok_or_else(|| {
        refused("The tenant's single sign-on secret cannot be read with this server's keys; ask your administrator to set the IdP's client secret again.")
    })?;
    String::from_utf8(plain).map_err(|_| Error::Internal("sealed secret is not text".into()))
}

/// The tenant the IdP serves, as a context for linking and joining (a job of the library,
/// audited as `sso-sign-in`).
async fn tenant_ctx(ds: &Services, tenant_id: i64) -> Result<OpCtx> {
    let mut tx = ds.begin().await?;
    let tenant = db::entry_tenant_by_id(&mut tx, tenant_id).await?;
    drop(tx);
    Ok(OpCtx::for_job("sso-sign-in", admin::tenant_ref(&tenant)?, &[Right::PeopleManage]))
}

/// The person an IdP subject is, linking them on their first sign-in.
async fn link(
    ds: &Services,
    idp: &IdpRow,
    subject: &str,
    email: Option<&str>,
    email_verified: bool,
    name: Option<&str>,
) -> Result<i64> {
    let ctx = tenant_ctx(ds, idp.tenant_id).await?;
    let tenant = ctx.tenant().slug.clone();
    if let Some((person_id, tenant_id)) = ds.preauth_identity_get(&idp.issuer, subject).await? {
        if tenant_id != idp.tenant_id {
            return Err(refused(
                "Your account at this identity provider is linked to another tenant here. Ask your administrator.",
            ));
        }
        return match ds.membership_get(&ctx, person_id).await? {
            Some(m) if m.active => Ok(person_id),
            // Invited back: the IdP linked this person before, so its word is theirs.
            _ => match invitations::accept_through_sso(
                ds,
                idp.tenant_id,
                invitations::SsoJoiner::Linked(person_id),
            )
            .await?
            {
                Some(id) => Ok(id),
                None => Err(refused(format!(
                    "You are no longer a member of {tenant}; ask one of its admins to add you again."
                ))),
            },
        };
    }
    let email = email.map(|e| e.trim().to_lowercase()).filter(|e| !e.is_empty()).ok_or_else(|| {
        refused("Your identity provider sent no email address; ask your administrator to release the email claim to Gatehouse.")
    })?;
    if !email_verified {
        return Err(refused(
            "Your identity provider has not verified your email address (email_verified); ask your administrator to verify it there, then sign in again.",
        ));
    }
    let domain = email.rsplit_once('@').map(|(_, d)| d).unwrap_or_default();
    if !idp.email_domains.iter().any(|d| d == domain) {
        return Err(refused(format!(
            "{domain} is not an email domain {tenant}'s identity provider signs in; ask your administrator."
        )));
    }
    let person = ds.platform_person_by_email(&email).await?;
    let member = match &person {
        Some(p) => ds.membership_get(&ctx, p.id).await?,
        None => None,
    };
    // A new address an admin invited joins with the invitation's role. An account that
    // exists accepts on the link's page by signing in to it, never by its email alone.
    let invited = match &person {
        Some(_) => None,
        None => {
            let name: String =
                name.unwrap_or_default().chars().filter(|c| !c.is_control()).take(100).collect();
            let joiner = invitations::SsoJoiner::New { email: &email, name: &name };
            invitations::accept_through_sso(ds, idp.tenant_id, joiner).await?
        }
    };
    let person_id = match (person, member) {
        _ if invited.is_some() => invited.unwrap_or_default(),
        (Some(p), Some(m)) if m.active && p.active => p.id,
        (_, Some(_)) => {
            return Err(refused(format!(
                "Your membership of {tenant} was ended; ask one of its admins to add you again."
            )));
        }
        (Some(p), None) if !p.active => {
            return Err(refused("This account is deactivated; ask your administrator."));
        }
        // An account that exists elsewhere is never joined here by its email alone: the
        // tenant's IdP vouches for this tenant's people, not for another tenant's.
        (Some(_), None) => {
            return Err(refused(format!(
                "You have a Gatehouse account already, and you are not a member of {tenant}; ask one of its admins to add you, then sign in here again."
            )));
        }
        (None, None) if idp.allow_join => {
            let name = name.map(str::trim).filter(|n| !n.is_empty()).unwrap_or(&email);
            let name: String = name.chars().filter(|c| !c.is_control()).take(100).collect();
            admin::person_create(ds, &ctx, &email, &name, Role::Viewer, None).await?;
            ds.platform_person_by_email(&email)
                .await?
                .ok_or_else(|| Error::Internal("joined person vanished".into()))?
                .id
        }
        (_, None) => {
            return Err(refused(format!(
                "You are not a member of {tenant} yet; ask one of its admins to add you."
            )));
        }
    };
    let mut tx = ds.begin().await?;
    db::identity_insert(&mut tx, &ctx, &idp.issuer, subject, person_id).await?;
    let handle = ds_person_handle(ds, &email).await?;
    db::audit_insert(&mut tx, &ctx, AuditEntry::ok("person.link_idp", vec![handle])).await?;
    tx.commit().await?;
    Ok(person_id)
}

async fn ds_person_handle(ds: &Services, email: &str) -> Result<String> {
    Ok(ds.platform_person_by_email(email).await?.map(|p| p.handle).unwrap_or_default())
}

// ---------------------------------------------------------------- back-channel logout

#[derive(Debug, Deserialize)]
struct LogoutClaims {
    #[serde(default)]
    events: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    nonce: Option<serde_json::Value>,
    #[serde(default)]
    sid: Option<String>,
}

/// OpenID Connect Back-Channel Logout: the IdP posts a signed logout token; the sessions it
/// started for that session id (`sid`), for the person (`sub`), or for that person's session
/// when it names both, end. Returns how many ended; a refusal is a sentence for the IdP's logs.
pub async fn backchannel_logout(
    ds: &Services,
    policy: &FetchPolicy,
    logout_token: &str,
) -> std::result::Result<u64, Error> {
    let bad = |why: String| Error::invalid("logout_token", why);
    let issuer = jose::unverified_issuer(logout_token)
        .ok_or_else(|| bad("the logout token is not a JWT with an issuer".into()))?;
    let idp = ds
        .preauth_idp_by_issuer(&issuer)
        .await?
        .ok_or_else(|| bad("no tenant signs in with this issuer".into()))?;
    let audiences = [idp.client_id.clone()];
    let expect = Expect {
        what: "the logout token",
        typ: Typ::AbsentOr(&["logout+jwt", "JWT"]),
        issuer: Some(&idp.issuer),
        subject: jose::Subject::Optional,
        audiences: &audiences,
        max_lifetime_secs: LOGOUT_TOKEN_MAX_LIFETIME_SECS,
        jti: Jti::Required,
        now: jiff::Timestamp::now().as_second(),
    };
    let keys = IdpKeys { ds, policy, idp: &idp, refuse: bad };
    let jtis = IdpJtis { ds, refuse: bad };
    let verified =
        jose::verify::<LogoutClaims, Error>(logout_token, &expect, &keys, &jtis, bad).await?;
    let claims = verified.claims;
    if !claims.events.as_ref().is_some_and(|e| e.contains_key(BACKCHANNEL_LOGOUT_EVENT)) {
        return Err(bad(format!("the logout token's events must name {BACKCHANNEL_LOGOUT_EVENT}")));
    }
    if claims.nonce.is_some() {
        return Err(bad("a logout token carries no nonce".into()));
    }
    // §2.4: a logout token names the session (`sid`), the person (`sub`), or both; both
    // means that session of that person.
    let sid = claims.sid.as_deref().filter(|s| !s.is_empty());
    let sub = Some(verified.registered.sub.as_str()).filter(|s| !s.is_empty());
    let person = match sub {
        None => None,
        Some(sub) => match ds
            .preauth_identity_get(&idp.issuer, sub)
            .await?
            .filter(|(_, tenant)| *tenant == idp.tenant_id)
        {
            Some((person, _)) => Some(person),
            // Nobody here signed in as that subject: no session of theirs to end.
            None => return Ok(0),
        },
    };
    if sid.is_none() && person.is_none() {
        return Err(
            bad("the logout token names neither sub nor sid; send sub, sid or both".into()),
        );
    }
    ds.preauth_sessions_end_idp(idp.id, sid, person).await
}

// ---------------------------------------------------------------- the IdP's keys and jtis

/// The key set of a tenant's IdP, from its `jwks_uri` behind the SSRF guard: cached for an
/// hour, refetched for an unknown `kid` at most once a minute, failed fetches included (the
/// keys kept serve meanwhile).
pub(crate) struct IdpKeys<'a, E> {
    pub(crate) ds: &'a Services,
    pub(crate) policy: &'a FetchPolicy,
    pub(crate) idp: &'a IdpRow,
    pub(crate) refuse: fn(String) -> E,
}

impl<E: From<Error>> jose::KeySource for IdpKeys<'_, E> {
    type Error = E;

    async fn keys(&self, refresh: bool) -> std::result::Result<KeySet, E> {
        let idp = self.idp;
        let age = |t: chrono::DateTime<chrono::Utc>| (chrono::Utc::now() - t).num_seconds();
        let fresh = idp.jwks_fetched_at.is_some_and(|t| age(t) < JWKS_CACHE_SECS);
        let tried_recently = idp.jwks_tried_at.is_some_and(|t| age(t) < JWKS_REFRESH_SECS);
        let keys = match &idp.jwks {
            Some(keys) if (fresh && !refresh) || tried_recently => keys.clone(),
            _ if tried_recently => {
                return Err((self.refuse)(format!(
                    "the identity provider's key set ({}) could not be fetched a moment ago; try again in a minute",
                    idp.jwks_uri
                )));
            }
            _ => {
                let fetched = match guarded_fetch(&idp.jwks_uri, self.policy).await {
                    Ok(body) => serde_json::from_slice::<serde_json::Value>(&body)
                        .ok()
                        .filter(|k| KeySet::parse(k).is_some())
                        .ok_or_else(|| "not a JWK set".to_owned()),
                    Err(why) => Err(why),
                };
                match fetched {
                    Ok(keys) => {
                        self.ds.preauth_idp_jwks_put(idp.id, &keys).await?;
                        keys
                    }
                    Err(why) => {
                        self.ds.preauth_idp_jwks_tried(idp.id).await?;
                        match &idp.jwks {
                            Some(kept) => kept.clone(),
                            None => {
                                return Err((self.refuse)(format!(
                                    "the identity provider's key set {}: {why}",
                                    idp.jwks_uri
                                )));
                            }
                        }
                    }
                }
            }
        };
        KeySet::parse(&keys)
            .ok_or_else(|| (self.refuse)("the identity provider's key set is not a JWK set".into()))
    }

    fn may_refresh(&self) -> bool {
        let last = self.idp.jwks_tried_at.or(self.idp.jwks_fetched_at);
        last.is_none_or(|t| (chrono::Utc::now() - t).num_seconds() >= JWKS_REFRESH_SECS)
    }
}

/// `jti`s of JWTs a tenant's IdP signed (ID-JAGs, logout tokens), per issuer, each kept until
/// its JWT expires.
pub(crate) struct IdpJtis<'a, E> {
    pub(crate) ds: &'a Services,
    pub(crate) refuse: fn(String) -> E,
}

impl<E: From<Error>> jose::JtiStore for IdpJtis<'_, E> {
    type Error = E;

    async fn first_use(
        &self,
        issuer: &str,
        jti: &str,
        expires: i64,
    ) -> std::result::Result<bool, E> {
        let expires = chrono::DateTime::from_timestamp(expires, 0)
            .ok_or_else(|| (self.refuse)("exp is out of range".into()))?;
        Ok(self.ds.preauth_idp_jti_use(issuer, jti, expires).await?)
    }
}

/// The identity provider a tenant trusts to sign ID-JAGs, by the issuer an ID-JAG names.
pub(crate) async fn id_jag_issuer(ds: &Services, issuer: &str) -> Result<Option<IdpRow>> {
    Ok(ds.preauth_idp_by_issuer(issuer).await?.filter(|idp| idp.id_jag))
}
