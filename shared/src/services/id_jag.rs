//! Enterprise-managed authorization: the token endpoint's `jwt-bearer` grant with an Identity
//! Assertion JWT Authorization Grant (ID-JAG, draft-ietf-oauth-identity-assertion-authz-grant;
//! MCP ext-auth "Enterprise-Managed Authorization").
//!
//! A tenant that trusts its identity provider for ID-JAGs (`tenant_idps.id_jag`) lets a
//! confidential client (registered by the tenant's admin, or a client ID metadata document
//! with `private_key_jwt`) trade an ID-JAG its IdP signed for an access token:
//!
//! - the ID-JAG is a `jose` profile: `typ` `oauth-id-jag+jwt` only, the IdP's keys and issuer,
//!   `aud` this authorization server, at most ten minutes ahead, its `jti` used once per issuer;
//! - `client_id` is the authenticated client, `resource` (when present) an MCP URL of ours,
//!   `sub` a person linked to a member of the IdP's tenant (through single sign-on);
//! - rights are the ID-JAG's scope ∩ the requested scope, and must lie within the person's
//!   current role (R4 cuts them live afterwards as for any connection);
//! - the token is bound to the MCP resource, and no refresh token is issued: the client asks
//!   its IdP for a new ID-JAG, so the IdP stays the one that decides.
//!
//! Each (client, person) pair is one connection marked `granted_by = idp`: the tenant admin
//! sees it and revokes it like any other.

use serde::Serialize;

use crate::ctx::OpCtx;
use crate::datastore::{self as db, AuditEntry, Services, from_ts};
use crate::error::{Error, Result};
use crate::handle::ConnectionHandle;
use crate::rights::{Right, RightSet, Role};
use crate::secret::{self, CredentialKind};
use crate::services::admin;
use crate::services::jose::{self, Expect, Jti, Typ};
use crate::services::oauth::{
    ACCESS_TTL_SECS, FetchPolicy, OAuthError, TokenResponse, check_scope,
};
use crate::services::sso::{self, IdpJtis, IdpKeys};

/// The grant type the token endpoint takes an ID-JAG with (RFC 7523).
pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// The grant profile advertised in `authorization_grant_profiles_supported`.
pub const PROFILE: &str = "urn:ietf:params:oauth:grant-profile:id-jag";
/// The only `typ` an ID-JAG may carry.
pub const TYP: &str = "oauth-id-jag+jwt";
/// How far ahead an ID-JAG's `exp` may lie: its `jti` is kept that long.
pub const MAX_LIFETIME_SECS: i64 = 600;

fn oauth(error: &'static str, description: impl Into<String>) -> OAuthError {
    OAuthError { error, error_description: description.into() }
}

fn grant_refused(why: String) -> OAuthError {
    oauth("invalid_grant", why)
}

/// A token request with an ID-JAG, its client already authenticated.
pub struct Request<'a> {
    pub client_id: &'a str,
    pub assertion: &'a str,
    pub scope: Option<&'a str>,
    pub resource: Option<&'a str>,
}

#[derive(Debug, serde::Deserialize)]
struct JagClaims {
    #[serde(default)]
    client_id: Option<String>,
    #[serde(default)]
    resource: Option<serde_json::Value>,
    #[serde(default)]
    scope: Option<String>,
}

fn same_resource(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer` with an ID-JAG.
pub async fn exchange(
    ds: &Services,
    policy: &FetchPolicy,
    issuer: &str,
    mcp_resources: &[String],
    req: Request<'_>,
) -> std::result::Result<TokenResponse, OAuthError> {
    let client = ds
        .preauth_oauth_client_get(req.client_id)
        .await?
        .ok_or_else(|| oauth("invalid_client", "unknown client"))?;
    if !matches!(client.token_endpoint_auth_method.as_str(), "client_secret" | "private_key_jwt") {
        return Err(oauth(
            "unauthorized_client",
            "an ID-JAG is taken from confidential clients only: a client a tenant admin registered (client secret) or a client ID metadata document with private_key_jwt",
        ));
    }
    if req.assertion.is_empty() {
        return Err(oauth("invalid_request", "send the ID-JAG as assertion"));
    }
    check_scope(req.scope)?;
    let iss = jose::unverified_issuer(req.assertion)
        .ok_or_else(|| grant_refused("the assertion is not a JWT naming its issuer".into()))?;
    let idp = sso::id_jag_issuer(ds, &iss).await?.ok_or_else(|| {
        grant_refused(
            "the ID-JAG's issuer is not an identity provider a tenant here trusts for ID-JAGs"
                .into(),
        )
    })?;
    if client.tenant_id.is_some_and(|t| t != idp.tenant_id) {
        return Err(grant_refused(
            "this client was registered by another tenant than the one this IdP serves".into(),
        ));
    }
    let audiences = [issuer.to_owned()];
    let expect = Expect {
        what: "the ID-JAG",
        typ: Typ::Required(TYP),
        issuer: Some(&idp.issuer),
        subject: jose::Subject::Required,
        audiences: &audiences,
        max_lifetime_secs: MAX_LIFETIME_SECS,
        jti: Jti::Required,
        now: jiff::Timestamp::now().as_second(),
    };
    let keys = IdpKeys { ds, policy, idp: &idp, refuse: grant_refused };
    let jtis = IdpJtis { ds, refuse: grant_refused };
    let verified =
        jose::verify::<JagClaims, OAuthError>(req.assertion, &expect, &keys, &jtis, grant_refused)
            .await?;
    let claims = verified.claims;
    if claims.client_id.as_deref() != Some(req.client_id) {
        return Err(grant_refused(
            "the ID-JAG was issued to another client (client_id); ask the IdP for one for this client".into(),
        ));
    }
    let claimed = match &claims.resource {
        None => None,
        Some(serde_json::Value::String(r)) => Some(r.as_str()),
        Some(_) => return Err(grant_refused("the ID-JAG's resource must be one URL".into())),
    };
    let resource = match (claimed, req.resource) {
        (Some(c), Some(r)) if !same_resource(c, r) => {
            return Err(oauth("invalid_target", "resource differs from the ID-JAG's resource"));
        }
        (Some(r), _) | (None, Some(r)) => r.to_owned(),
        (None, None) => mcp_resources.first().cloned().unwrap_or_default(),
    };
    let Some(resource) = mcp_resources.iter().find(|a| same_resource(a, &resource)).cloned() else {
        return Err(oauth(
            "invalid_target",
            format!("{resource} is not a resource of this server"),
        ));
    };
    let sub = &verified.registered.sub;
    let person_id = match ds.preauth_identity_get(&idp.issuer, sub).await? {
        Some((person, tenant)) if tenant == idp.tenant_id => person,
        _ => {
            return Err(grant_refused(
                "the ID-JAG's sub is not linked to a member of this tenant; the person signs in once through single sign-on first".into(),
            ));
        }
    };
    let mut tx = ds.begin().await?;
    let tenant = db::entry_tenant_by_id(&mut tx, idp.tenant_id).await?;
    drop(tx);
    let ctx =
        OpCtx::for_job("id-jag-grant", admin::tenant_ref(&tenant)?, &[Right::ConnectionsManage]);
    let role = match ds.membership_get(&ctx, person_id).await? {
        Some(m) if m.active => m.role.parse::<Role>().map_err(OAuthError::from)?,
        _ => {
            return Err(grant_refused(
                "the ID-JAG's person is no longer a member of this tenant".into(),
            ));
        }
    };
    let holds = role.rights();
    let from_jag = claims.scope.as_deref().map(parse_scope);
    let asked = req.scope.map(str::trim).filter(|s| !s.is_empty()).map(parse_scope);
    let wanted = match (from_jag, asked) {
        (Some(j), Some(r)) => j.intersect(r),
        (Some(s), None) | (None, Some(s)) => s,
        (None, None) => crate::rights::read_only().intersect(holds),
    };
    let beyond = wanted.without(holds);
    if beyond != RightSet::EMPTY {
        return Err(oauth(
            "invalid_scope",
            format!(
                "the person's role ({}) does not include {}; ask for at most: {}",
                role.as_str(),
                beyond.names().join(" "),
                holds.names().join(" ")
            ),
        ));
    }
    if wanted == RightSet::EMPTY {
        return Err(oauth(
            "invalid_scope",
            "the ID-JAG's scope and the requested scope share no right",
        ));
    }
    grant(ds, &ctx, person_id, &client.client_id, &client.client_name, wanted, &resource)
        .await
        .map_err(OAuthError::from)
}

fn parse_scope(s: &str) -> RightSet {
    RightSet::parse_lenient(&s.split_whitespace().collect::<Vec<_>>())
}

/// Creates or updates the (client, person) connection marked as granted by the IdP, and
/// issues an access token bound to `resource`; audited as `connection.id_jag`.
async fn grant(
    ds: &Services,
    ctx: &OpCtx,
    person_id: i64,
    client_id: &str,
    client_name: &str,
    rights: RightSet,
    resource: &str,
) -> Result<TokenResponse> {
    let person = ds.platform_person_handle(person_id).await?.unwrap_or_default();
    let mut tx = ds.begin().await?;
    if !db::membership_active_held(&mut tx, ctx, person_id).await? {
        return Err(Error::Unauthenticated("the person is no longer an active member".into()));
    }
    let (connection_id, handle) =
        match db::oauth_connection_find(&mut tx, ctx, person_id, client_id).await? {
            Some(found) => found,
            None => {
                let handle = ConnectionHandle::generate();
                let id = db::connection_insert(
                    &mut tx,
                    ctx,
                    handle.as_str(),
                    person_id,
                    client_name,
                    client_name,
                    &rights.names(),
                )
                .await?;
                (id, handle.to_string())
            }
        };
    // Tokens of an earlier grant with other rights end, so none of them gains what this one adds.
    let regranted =
        db::connection_set_idp_grant(&mut tx, ctx, connection_id, client_id, &rights.names())
            .await?;
    if regranted {
        db::connection_tokens_end(&mut tx, ctx, connection_id).await?;
    }
    let access = secret::generate(CredentialKind::Mcp);
    let expires = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(ACCESS_TTL_SECS))
        .map_err(|e| Error::Internal(e.to_string()))?;
    db::preauth_connection_token_insert(
        &mut tx,
        connection_id,
        "access",
        &secret::hash_token(&access),
        Some(resource),
        Some(from_ts(expires)),
        None,
    )
    .await?;
    db::audit_insert(&mut tx, ctx, AuditEntry::ok("connection.id_jag", vec![handle, person]))
        .await?;
    tx.commit().await?;
    if regranted {
        crate::bus::publish(
            ds.bus(),
            crate::bus::Event::TenantChanged { tenant: ctx.tenant().handle.to_string() },
        )
        .await;
    }
    Ok(TokenResponse {
        access_token: access,
        token_type: "Bearer",
        expires_in: ACCESS_TTL_SECS,
        refresh_token: None,
        scope: rights.names().join(" "),
    })
}

// ---------------------------------------------------------------- confidential clients

/// A confidential client a tenant admin registered, shown once with its secret.
#[derive(Debug, Serialize)]
pub struct ClientRegistered {
    pub client_id: String,
    /// Shown once; stored only as a hash.
    pub client_secret: String,
    pub name: String,
    pub token_endpoint_auth_methods: [&'static str; 2],
}

#[derive(Debug, Serialize)]
pub struct ClientView {
    pub client_id: String,
    pub name: String,
    pub created_at: String,
}

/// Registers a confidential client for the tenant (an agent platform that presents ID-JAGs
/// from the tenant's IdP); audited as `oauth_client.register`.
/// The decision registering a confidential client is (it may then trade ID-JAGs for tokens).
pub(crate) fn client_decision(name: &str) -> crate::services::passkeys::Decision {
    crate::services::passkeys::Decision::identity_provider(
        "register_client",
        &[("name", name.trim().to_owned())],
    )
}

pub async fn client_register(ds: &Services, ctx: &OpCtx, name: &str) -> Result<ClientRegistered> {
    ctx.require(Right::ConnectionsManage)?;
    let name = crate::services::fields::name("name", name)?;
    let client_id =
        format!("ghcc_{}", &secret::generate(CredentialKind::Session)["gh_ses_".len()..][..24]);
    let client_secret =
        format!("ghcs_{}", &secret::generate(CredentialKind::Session)["gh_ses_".len()..]);
    let mut tx = ds.begin().await?;
    crate::services::passkeys::require(&mut tx, ctx, &client_decision(&name)).await?;
    db::oauth_confidential_client_insert(
        &mut tx,
        ctx,
        &client_id,
        &name,
        &secret::hash_token(&client_secret),
    )
    .await?;
    db::audit_insert(
        &mut tx,
        ctx,
        AuditEntry::ok("oauth_client.register", vec![client_id.clone()]),
    )
    .await?;
    tx.commit().await?;
    Ok(ClientRegistered {
        client_id,
        client_secret,
        name,
        token_endpoint_auth_methods: ["client_secret_basic", "client_secret_post"],
    })
}

/// The confidential clients the tenant registered.
pub async fn client_list(ds: &Services, ctx: &OpCtx) -> Result<Vec<ClientView>> {
    ctx.require(Right::ConnectionsManage)?;
    Ok(ds
        .oauth_confidential_clients(ctx)
        .await?
        .into_iter()
        .map(|(client_id, name, at)| ClientView {
            client_id,
            name,
            created_at: crate::datastore::to_ts(at).strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        })
        .collect())
}
