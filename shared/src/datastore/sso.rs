//! Tenant identity providers, the identities linked to people, sign-ins in flight, sessions
//! an IdP started, and the `jti`s of JWTs an IdP signed.

use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct IdpRow {
    pub id: i64,
    pub tenant_id: i64,
    pub issuer: String,
    pub client_id: String,
    pub client_secret_sealed: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub jwks_uri: String,
    pub token_auth_method: String,
    pub email_domains: Vec<String>,
    pub allow_join: bool,
    pub sso_required: bool,
    pub id_jag: bool,
    pub session_hours: i32,
    pub jwks: Option<serde_json::Value>,
    pub jwks_fetched_at: Option<DateTime<Utc>>,
    pub jwks_tried_at: Option<DateTime<Utc>>,
}

const IDP_COLUMNS: &str = "id, tenant_id, issuer, client_id, client_secret_sealed,
    authorization_endpoint, token_endpoint, jwks_uri, token_auth_method, email_domains,
    allow_join, sso_required, id_jag, session_hours, jwks, jwks_fetched_at, jwks_tried_at";

/// What a tenant admin sets (the secret already sealed).
pub struct NewIdp<'a> {
    pub issuer: &'a str,
    pub client_id: &'a str,
    pub client_secret_sealed: &'a str,
    pub authorization_endpoint: &'a str,
    pub token_endpoint: &'a str,
    pub jwks_uri: &'a str,
    pub token_auth_method: &'a str,
    pub email_domains: &'a [String],
    pub allow_join: bool,
    pub sso_required: bool,
    pub id_jag: bool,
    pub session_hours: i32,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SsoSignInRow {
    pub idp_id: i64,
    pub nonce: String,
    pub pkce_verifier: String,
    pub next: String,
}

impl Services {
    /// The context tenant's identity provider.
    pub(crate) async fn idp_get(&self, ctx: &OpCtx) -> Result<Option<IdpRow>> {
        Ok(sqlx::query_as::<_, IdpRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {IDP_COLUMNS} FROM tenant_idps WHERE tenant_id = $1"
        )))
        .bind(ctx.tenant_id())
        .fetch_optional(self.pool())
        .await?)
    }

    /// The identity provider of an issuer, whichever tenant it serves (ID-JAGs and logout
    /// tokens name their issuer before anything else is known).
    pub(crate) async fn preauth_idp_by_issuer(&self, issuer: &str) -> Result<Option<IdpRow>> {
        Ok(sqlx::query_as::<_, IdpRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {IDP_COLUMNS} FROM tenant_idps WHERE issuer = $1"
        )))
        .bind(issuer)
        .fetch_optional(self.pool())
        .await?)
    }

    /// The identity provider a person signing in names: by the tenant's slug, or by the
    /// domain of their email.
    pub(crate) async fn preauth_idp_for(&self, slug_or_domain: &str) -> Result<Option<IdpRow>> {
        Ok(sqlx::query_as::<_, IdpRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {IDP_COLUMNS} FROM tenant_idps
             WHERE tenant_id = (SELECT id FROM tenants WHERE slug = lower($1))
                OR lower($1) = ANY (email_domains)
             ORDER BY id LIMIT 1"
        )))
        .bind(slug_or_domain)
        .fetch_optional(self.pool())
        .await?)
    }

    pub(crate) async fn preauth_idp_by_id(&self, id: i64) -> Result<Option<IdpRow>> {
        Ok(sqlx::query_as::<_, IdpRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {IDP_COLUMNS} FROM tenant_idps WHERE id = $1"
        )))
        .bind(id)
        .fetch_optional(self.pool())
        .await?)
    }

    /// Keeps a key set fetched from an IdP's `jwks_uri`.
    pub(crate) async fn preauth_idp_jwks_put(
        &self,
        id: i64,
        jwks: &serde_json::Value,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE tenant_idps SET jwks = $2, jwks_fetched_at = now(), jwks_tried_at = now() WHERE id = $1",
        )
        .bind(id)
        .bind(jwks)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Records a failed attempt to fetch an IdP's key set (the keys it had stay).
    pub(crate) async fn preauth_idp_jwks_tried(&self, id: i64) -> Result<()> {
        sqlx::query("UPDATE tenant_idps SET jwks_tried_at = now() WHERE id = $1")
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Records the `jti` of a JWT an IdP signed until it expires; false when seen already.
    pub(crate) async fn preauth_idp_jti_use(
        &self,
        issuer: &str,
        jti: &str,
        expires_at: DateTime<Utc>,
    ) -> Result<bool> {
        Ok(sqlx::query(
            "INSERT INTO idp_jtis (issuer, jti, expires_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        )
        .bind(issuer)
        .bind(jti)
        .bind(expires_at)
        .execute(self.pool())
        .await?
        .rows_affected()
            == 1)
    }

    #[expect(clippy::too_many_arguments, reason = "one column each")]
    pub(crate) async fn preauth_sso_sign_in_insert(
        &self,
        state_hash: &[u8],
        tenant_id: i64,
        idp_id: i64,
        nonce: &str,
        verifier: &str,
        next: &str,
        ttl_secs: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO sso_sign_ins (state_hash, tenant_id, idp_id, nonce, pkce_verifier, next, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7))",
        )
        .bind(state_hash)
        .bind(tenant_id)
        .bind(idp_id)
        .bind(nonce)
        .bind(verifier)
        .bind(next)
        .bind(ttl_secs as f64)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Takes a sign-in by its state, once: unexpired and not taken before.
    pub(crate) async fn preauth_sso_sign_in_take(
        &self,
        state_hash: &[u8],
    ) -> Result<Option<SsoSignInRow>> {
        Ok(sqlx::query_as::<_, SsoSignInRow>(
            "UPDATE sso_sign_ins SET consumed_at = now()
             WHERE state_hash = $1 AND consumed_at IS NULL AND expires_at > now()
             RETURNING idp_id, nonce, pkce_verifier, next",
        )
        .bind(state_hash)
        .fetch_optional(self.pool())
        .await?)
    }

    /// The person and tenant an IdP identity is linked to.
    pub(crate) async fn preauth_identity_get(
        &self,
        issuer: &str,
        subject: &str,
    ) -> Result<Option<(i64, i64)>> {
        Ok(sqlx::query_as::<_, (i64, i64)>(
            "SELECT person_id, tenant_id FROM person_identities WHERE issuer = $1 AND subject = $2",
        )
        .bind(issuer)
        .bind(subject)
        .fetch_optional(self.pool())
        .await?)
    }

    /// A console session the tenant's IdP started, living at most `ttl_secs`.
    #[expect(clippy::too_many_arguments, reason = "one column each")]
    pub(crate) async fn preauth_session_create_sso(
        &self,
        token_hash: &[u8],
        person_id: i64,
        tenant_id: i64,
        csrf: &str,
        ttl_secs: i64,
        idp_id: i64,
        sid: Option<&str>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO console_sessions (token_hash, person_id, tenant_id, csrf_token, expires_at, idp_id, idp_sid,
                                           signed_in_with)
             VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5), $6, $7, 'sso')",
        )
        .bind(token_hash)
        .bind(person_id)
        .bind(tenant_id)
        .bind(csrf)
        .bind(ttl_secs as f64)
        .bind(idp_id)
        .bind(sid)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Ends the sessions an IdP started for a session id (`sid`), for a linked person, or for
    /// that person's session when both are given.
    pub(crate) async fn preauth_sessions_end_idp(
        &self,
        idp_id: i64,
        sid: Option<&str>,
        person_id: Option<i64>,
    ) -> Result<u64> {
        Ok(sqlx::query(
            // Never every session of the IdP: one of sid and person is always given.
            "DELETE FROM console_sessions WHERE idp_id = $1
               AND ($2::text IS NOT NULL OR $3::bigint IS NOT NULL)
               AND ($2::text IS NULL OR idp_sid = $2)
               AND ($3::bigint IS NULL OR person_id = $3)",
        )
        .bind(idp_id)
        .bind(sid)
        .bind(person_id)
        .execute(self.pool())
        .await?
        .rows_affected())
    }
}

/// Sets the context tenant's IdP; returns whether SSO was required before (`None`: no IdP was
/// set). An issuer another tenant uses fails on the unique index.
pub(crate) async fn idp_upsert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    i: NewIdp<'_>,
) -> Result<Option<bool>> {
    let before: Option<bool> =
        sqlx::query_scalar("SELECT sso_required FROM tenant_idps WHERE tenant_id = $1 FOR UPDATE")
            .bind(ctx.tenant_id())
            .fetch_optional(&mut **tx)
            .await?;
    sqlx::query(
        "INSERT INTO tenant_idps (tenant_id, issuer, client_id, client_secret_sealed, authorization_endpoint,
             token_endpoint, jwks_uri, token_auth_method, email_domains, allow_join, sso_required, id_jag, session_hours)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
         ON CONFLICT (tenant_id) DO UPDATE SET issuer = EXCLUDED.issuer, client_id = EXCLUDED.client_id,
             client_secret_sealed = EXCLUDED.client_secret_sealed,
             authorization_endpoint = EXCLUDED.authorization_endpoint, token_endpoint = EXCLUDED.token_endpoint,
             jwks_uri = EXCLUDED.jwks_uri, token_auth_method = EXCLUDED.token_auth_method,
             email_domains = EXCLUDED.email_domains, allow_join = EXCLUDED.allow_join,
             sso_required = EXCLUDED.sso_required, id_jag = EXCLUDED.id_jag,
             session_hours = EXCLUDED.session_hours, updated_at = now(),
             jwks = CASE WHEN tenant_idps.jwks_uri = EXCLUDED.jwks_uri THEN tenant_idps.jwks END,
             jwks_fetched_at = CASE WHEN tenant_idps.jwks_uri = EXCLUDED.jwks_uri THEN tenant_idps.jwks_fetched_at END,
             jwks_tried_at = NULL",
    )
    .bind(ctx.tenant_id())
    .bind(i.issuer)
    .bind(i.client_id)
    .bind(i.client_secret_sealed)
    .bind(i.authorization_endpoint)
    .bind(i.token_endpoint)
    .bind(i.jwks_uri)
    .bind(i.token_auth_method)
    .bind(i.email_domains)
    .bind(i.allow_join)
    .bind(i.sso_required)
    .bind(i.id_jag)
    .bind(i.session_hours)
    .execute(&mut **tx)
    .await?;
    Ok(before)
}

/// Removes the context tenant's IdP (its sessions end with it); false when none was set.
pub(crate) async fn idp_delete(tx: &mut Tx<'_>, ctx: &OpCtx) -> Result<bool> {
    Ok(sqlx::query("DELETE FROM tenant_idps WHERE tenant_id = $1")
        .bind(ctx.tenant_id())
        .execute(&mut **tx)
        .await?
        .rows_affected()
        == 1)
}

/// Links an IdP identity to a person of the context tenant.
pub(crate) async fn identity_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    issuer: &str,
    subject: &str,
    person_id: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO person_identities (issuer, subject, person_id, tenant_id) VALUES ($1, $2, $3, $4)",
    )
    .bind(issuer)
    .bind(subject)
    .bind(person_id)
    .bind(ctx.tenant_id())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Registers a confidential client for the context tenant (its secret hashed).
pub(crate) async fn oauth_confidential_client_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    client_id: &str,
    name: &str,
    secret_hash: &[u8],
) -> Result<()> {
    sqlx::query(
        "INSERT INTO oauth_clients (client_id, client_name, redirect_uris, kind, token_endpoint_auth_method,
                                    client_secret_hash, tenant_id)
         VALUES ($1, $2, '{}', 'confidential', 'client_secret', $3, $4)",
    )
    .bind(client_id)
    .bind(name)
    .bind(secret_hash)
    .bind(ctx.tenant_id())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Services {
    /// The confidential clients the context tenant registered.
    pub(crate) async fn oauth_confidential_clients(
        &self,
        ctx: &OpCtx,
    ) -> Result<Vec<(String, String, DateTime<Utc>)>> {
        Ok(sqlx::query_as::<_, (String, String, DateTime<Utc>)>(
            "SELECT client_id, client_name, created_at FROM oauth_clients
             WHERE kind = 'confidential' AND tenant_id = $1 ORDER BY created_at",
        )
        .bind(ctx.tenant_id())
        .fetch_all(self.pool())
        .await?)
    }
}

/// Marks a connection as granted by the tenant's IdP, with the rights of its latest grant.
pub(crate) async fn connection_set_idp_grant(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    client_id: &str,
    rights: &[String],
) -> Result<bool> {
    let before: Vec<String> =
        sqlx::query_scalar("SELECT rights FROM connections WHERE id = $1 AND tenant_id = $2")
            .bind(id)
            .bind(ctx.tenant_id())
            .fetch_one(&mut **tx)
            .await?;
    sqlx::query(
        "UPDATE connections SET oauth_client_id = $2, rights = $3, granted_by = 'idp'
         WHERE id = $1 AND tenant_id = $4",
    )
    .bind(id)
    .bind(client_id)
    .bind(rights)
    .bind(ctx.tenant_id())
    .execute(&mut **tx)
    .await?;
    Ok(before != rights)
}

impl Services {
    /// A person's public handle, by id.
    pub(crate) async fn platform_person_handle(&self, person_id: i64) -> Result<Option<String>> {
        Ok(sqlx::query_scalar("SELECT handle FROM people WHERE id = $1")
            .bind(person_id)
            .fetch_optional(self.pool())
            .await?)
    }
}

impl Services {
    /// Whether a session was started by the identity provider of a tenant.
    pub(crate) async fn preauth_session_from_idp_of(
        &self,
        session_id: i64,
        tenant_id: i64,
    ) -> Result<bool> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM console_sessions s JOIN tenant_idps i ON i.id = s.idp_id
                            WHERE s.id = $1 AND i.tenant_id = $2)",
        )
        .bind(session_id)
        .bind(tenant_id)
        .fetch_one(self.pool())
        .await?)
    }
}

impl Services {
    /// The email domains of `domains` another tenant's IdP vouches for already.
    pub(crate) async fn idp_domains_taken(
        &self,
        ctx: &OpCtx,
        domains: &[String],
    ) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT DISTINCT d FROM tenant_idps, unnest(email_domains) AS d
             WHERE tenant_id <> $1 AND d = ANY ($2) ORDER BY d",
        )
        .bind(ctx.tenant_id())
        .bind(domains)
        .fetch_all(self.pool())
        .await?)
    }
}
