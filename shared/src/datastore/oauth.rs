//! The OAuth server: clients, authorization codes, access and refresh tokens.

use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

/// What `/oauth/authorize` was asked for, validated.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, sqlx::FromRow)]
pub struct AuthorizeRequest {
    pub client_id: String,
    pub redirect_uri: String,
    pub code_challenge: String,
    pub state: Option<String>,
    pub resource: String,
    /// Rights asked for (the `scope`); the read rights are ticked when absent.
    pub scope: Option<String>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClientRow {
    pub client_id: String,
    pub client_name: String,
    pub redirect_uris: Vec<String>,
    pub kind: String,
    pub fetched_at: Option<DateTime<Utc>>,
    /// `none` (public client, PKCE) or `private_key_jwt` (RFC 7523, metadata documents only).
    pub token_endpoint_auth_method: String,
    pub jwks_uri: Option<String>,
    /// The key set: inline in the document, or as last fetched from `jwks_uri`.
    pub jwks: Option<serde_json::Value>,
    pub jwks_fetched_at: Option<DateTime<Utc>>,
    /// The last attempt to fetch `jwks_uri`, successful or not.
    pub jwks_tried_at: Option<DateTime<Utc>>,
    /// A confidential client's secret, hashed (`client_secret`).
    pub client_secret_hash: Option<Vec<u8>>,
    /// The tenant that registered a confidential client; it serves no other.
    pub tenant_id: Option<i64>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CodeRow {
    pub id: i64,
    pub client_id: String,
    pub connection_id: i64,
    pub redirect_uri: String,
    pub code_challenge: String,
    pub resource: String,
    pub expired: bool,
    pub used: bool,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RefreshRow {
    pub id: i64,
    pub connection_id: i64,
    pub audience: Option<String>,
    pub expired: bool,
    pub used: bool,
    pub connection_status: String,
    pub oauth_client_id: Option<String>,
    pub grant_expires_at: Option<DateTime<Utc>>,
}

impl Services {
    pub(crate) async fn preauth_oauth_client_get(
        &self,
        client_id: &str,
    ) -> Result<Option<ClientRow>> {
        Ok(sqlx::query_as::<_, ClientRow>(
            "SELECT client_id, client_name, redirect_uris, kind, fetched_at, token_endpoint_auth_method,
                    jwks_uri, jwks, jwks_fetched_at, jwks_tried_at, client_secret_hash, tenant_id
             FROM oauth_clients WHERE client_id = $1",
        )
        .bind(client_id)
        .fetch_optional(self.pool())
        .await?)
    }
}

impl Services {
    pub(crate) async fn preauth_oauth_client_put(&self, c: NewClient<'_>) -> Result<()> {
        // A document that changes its key set drops the cached copy of the old one.
        sqlx::query(
            "INSERT INTO oauth_clients (client_id, client_name, redirect_uris, kind, fetched_at,
                                        token_endpoint_auth_method, jwks_uri, jwks)
             VALUES ($1, $2, $3, $4, CASE WHEN $4 = 'metadata_document' THEN now() END, $5, $6, $7)
             ON CONFLICT (client_id) DO UPDATE SET client_name = EXCLUDED.client_name,
                 redirect_uris = EXCLUDED.redirect_uris, fetched_at = EXCLUDED.fetched_at,
                 token_endpoint_auth_method = EXCLUDED.token_endpoint_auth_method,
                 jwks = CASE WHEN oauth_clients.jwks_uri IS NOT DISTINCT FROM EXCLUDED.jwks_uri
                             AND EXCLUDED.jwks IS NULL THEN oauth_clients.jwks ELSE EXCLUDED.jwks END,
                 jwks_fetched_at = CASE WHEN oauth_clients.jwks_uri IS NOT DISTINCT FROM EXCLUDED.jwks_uri
                             AND EXCLUDED.jwks IS NULL THEN oauth_clients.jwks_fetched_at END,
                 jwks_tried_at = CASE WHEN oauth_clients.jwks_uri IS NOT DISTINCT FROM EXCLUDED.jwks_uri
                             THEN oauth_clients.jwks_tried_at END,
                 jwks_uri = EXCLUDED.jwks_uri",
        )
        .bind(c.client_id)
        .bind(c.name)
        .bind(c.redirect_uris)
        .bind(c.kind)
        .bind(c.auth_method)
        .bind(c.jwks_uri)
        .bind(c.jwks)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Keeps a key set fetched from a client's `jwks_uri`.
    pub(crate) async fn preauth_oauth_client_jwks_put(
        &self,
        client_id: &str,
        jwks: &serde_json::Value,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE oauth_clients SET jwks = $2, jwks_fetched_at = now(), jwks_tried_at = now()
             WHERE client_id = $1",
        )
        .bind(client_id)
        .bind(jwks)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Records a failed attempt to fetch a client's key set (the keys it had stay).
    pub(crate) async fn preauth_oauth_client_jwks_tried(&self, client_id: &str) -> Result<()> {
        sqlx::query("UPDATE oauth_clients SET jwks_tried_at = now() WHERE client_id = $1")
            .bind(client_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Records a client assertion's `jti` until it expires; false when it was seen already.
    pub(crate) async fn preauth_oauth_assertion_use(
        &self,
        client_id: &str,
        jti: &str,
        expires_at: DateTime<Utc>,
    ) -> Result<bool> {
        Ok(sqlx::query(
            "INSERT INTO oauth_client_assertions (client_id, jti, expires_at) VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING",
        )
        .bind(client_id)
        .bind(jti)
        .bind(expires_at)
        .execute(self.pool())
        .await?
        .rows_affected()
            == 1)
    }
}

/// A client as registered or published.
pub struct NewClient<'a> {
    pub client_id: &'a str,
    pub name: &'a str,
    pub redirect_uris: &'a [String],
    pub kind: &'a str,
    pub auth_method: &'a str,
    pub jwks_uri: Option<&'a str>,
    pub jwks: Option<&'a serde_json::Value>,
}

/// The active OAuth connection of this client for the context's person, if any.
pub(crate) async fn oauth_connection_find(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    person_id: i64,
    client_id: &str,
) -> Result<Option<(i64, String)>> {
    Ok(sqlx::query_as::<_, (i64, String)>(
        "SELECT id, handle FROM connections
         WHERE tenant_id = $1 AND creator_id = $2 AND oauth_client_id = $3 AND status = 'active' FOR UPDATE",
    )
    .bind(ctx.tenant_id())
    .bind(person_id)
    .bind(client_id)
    .fetch_optional(&mut **tx)
    .await?)
}

impl Services {
    /// The rights this client's active connection for the context's person holds now.
    pub(crate) async fn oauth_grant_rights(
        &self,
        ctx: &OpCtx,
        person_id: i64,
        client_id: &str,
    ) -> Result<Option<Vec<String>>> {
        Ok(sqlx::query_scalar(
            "SELECT rights FROM connections
             WHERE tenant_id = $1 AND creator_id = $2 AND oauth_client_id = $3 AND status = 'active'",
        )
        .bind(ctx.tenant_id())
        .bind(person_id)
        .bind(client_id)
        .fetch_optional(self.pool())
        .await?)
    }
}

pub(crate) async fn connection_set_oauth(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    client_id: &str,
    rights: &[String],
) -> Result<()> {
    sqlx::query(
        "UPDATE connections SET oauth_client_id = $2, rights = $3 WHERE id = $1 AND tenant_id = $4",
    )
    .bind(id)
    .bind(client_id)
    .bind(rights)
    .bind(ctx.tenant_id())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub struct NewCode<'a> {
    pub code_hash: &'a [u8],
    pub client_id: &'a str,
    pub connection_id: i64,
    pub redirect_uri: &'a str,
    pub code_challenge: &'a str,
    pub resource: &'a str,
}

pub(crate) async fn oauth_code_insert(tx: &mut Tx<'_>, ctx: &OpCtx, c: NewCode<'_>) -> Result<()> {
    let inserted = sqlx::query(
        "INSERT INTO oauth_codes (code_hash, client_id, connection_id, redirect_uri, code_challenge, resource, expires_at)
         SELECT $1, $2, id, $4, $5, $6, now() + interval '2 minutes'
         FROM connections WHERE id = $3 AND tenant_id = $7",
    )
    .bind(c.code_hash)
    .bind(c.client_id)
    .bind(c.connection_id)
    .bind(c.redirect_uri)
    .bind(c.code_challenge)
    .bind(c.resource)
    .bind(ctx.tenant_id())
    .execute(&mut **tx)
    .await?;
    one_row(inserted.rows_affected(), "authorization code for a connection outside the tenant")
}

/// Locks a code for exchange.
pub(crate) async fn preauth_oauth_code_lock(
    tx: &mut Tx<'_>,
    code_hash: &[u8],
) -> Result<Option<CodeRow>> {
    Ok(sqlx::query_as::<_, CodeRow>(
        "SELECT id, client_id, connection_id, redirect_uri, code_challenge, resource,
                expires_at <= now() AS expired, used_at IS NOT NULL AS used
         FROM oauth_codes WHERE code_hash = $1 FOR UPDATE",
    )
    .bind(code_hash)
    .fetch_optional(&mut **tx)
    .await?)
}

/// The connection a code was issued for (it never changes), read without a lock.
pub(crate) async fn preauth_oauth_code_connection(
    tx: &mut Tx<'_>,
    code_hash: &[u8],
) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar("SELECT connection_id FROM oauth_codes WHERE code_hash = $1")
        .bind(code_hash)
        .fetch_optional(&mut **tx)
        .await?)
}

/// Drops a connection's codes not yet exchanged (a new consent replaces them).
pub(crate) async fn oauth_codes_drop_unused(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    connection_id: i64,
) -> Result<()> {
    sqlx::query(
        "DELETE FROM oauth_codes WHERE used_at IS NULL
           AND connection_id = (SELECT id FROM connections WHERE id = $1 AND tenant_id = $2)",
    )
    .bind(connection_id)
    .bind(ctx.tenant_id())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Whether a connection is active, read in `tx` and held so (a revocation or a new consent
/// waits for this transaction, and this one sees theirs if they came first).
pub(crate) async fn preauth_connection_is_active(
    tx: &mut Tx<'_>,
    connection_id: i64,
) -> Result<bool> {
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM connections WHERE id = $1 FOR SHARE")
            .bind(connection_id)
            .fetch_optional(&mut **tx)
            .await?;
    Ok(status.as_deref() == Some("active"))
}

pub(crate) async fn preauth_oauth_code_use(tx: &mut Tx<'_>, id: i64) -> Result<()> {
    sqlx::query("UPDATE oauth_codes SET used_at = now() WHERE id = $1")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

pub(crate) async fn preauth_refresh_lock(
    tx: &mut Tx<'_>,
    token_hash: &[u8],
) -> Result<Option<RefreshRow>> {
    Ok(sqlx::query_as::<_, RefreshRow>(
        "SELECT t.id, t.connection_id, t.audience, coalesce(t.expires_at <= now(), false) AS expired,
                t.used_at IS NOT NULL AS used, c.status AS connection_status, c.tenant_id, c.oauth_client_id,
                t.grant_expires_at
         FROM connection_tokens t JOIN connections c ON c.id = t.connection_id
         WHERE t.token_hash = $1 AND t.kind = 'refresh' FOR UPDATE OF t",
    )
    .bind(token_hash)
    .fetch_optional(&mut **tx)
    .await?)
}

pub(crate) async fn preauth_token_mark_used(tx: &mut Tx<'_>, id: i64) -> Result<()> {
    sqlx::query("UPDATE connection_tokens SET used_at = now() WHERE id = $1")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Deletes one access token by hash; returns whether it existed.
/// Deletes an access token; returns its tenant's handle when there was one (listen streams
/// opened with it are told to look again).
pub(crate) async fn preauth_access_token_delete(
    tx: &mut Tx<'_>,
    token_hash: &[u8],
) -> Result<Option<String>> {
    Ok(sqlx::query_scalar::<_, String>(
        "WITH gone AS (DELETE FROM connection_tokens WHERE token_hash = $1 AND kind = 'access'
                       RETURNING connection_id)
         SELECT t.handle FROM gone JOIN connections c ON c.id = gone.connection_id
         JOIN tenants t ON t.id = c.tenant_id",
    )
    .bind(token_hash)
    .fetch_optional(&mut **tx)
    .await?)
}

impl Services {
    /// Keeps a validated authorization request until the consent form answers it.
    pub(crate) async fn preauth_oauth_request_insert(
        &self,
        handle: &str,
        session_id: i64,
        tenant_id: i64,
        req: &AuthorizeRequest,
        ttl_secs: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO oauth_requests (handle, session_id, client_id, redirect_uri, code_challenge, state, resource, scope, expires_at, tenant_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9), $10)",
        )
        .bind(handle)
        .bind(session_id)
        .bind(&req.client_id)
        .bind(&req.redirect_uri)
        .bind(&req.code_challenge)
        .bind(&req.state)
        .bind(&req.resource)
        .bind(&req.scope)
        .bind(ttl_secs as f64)
        .bind(tenant_id)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Marks a consent request used and returns it, in one statement: a second answer, another
    /// session's answer or a late one finds nothing.
    pub(crate) async fn preauth_oauth_request_take(
        &self,
        handle: &str,
        session_id: i64,
        tenant_id: i64,
    ) -> Result<Option<AuthorizeRequest>> {
        Ok(sqlx::query_as(
            "UPDATE oauth_requests SET used_at = now()
             WHERE handle = $1 AND session_id = $2 AND tenant_id = $3 AND used_at IS NULL AND expires_at > now()
             RETURNING client_id, redirect_uri, code_challenge, state, resource, scope",
        )
        .bind(handle)
        .bind(session_id)
        .bind(tenant_id)
        .fetch_optional(self.pool())
        .await?)
    }
}

impl Services {
    /// Reads a consent request without using it (to name it in a passkey ceremony).
    pub(crate) async fn preauth_oauth_request_peek(
        &self,
        handle: &str,
        session_id: i64,
        tenant_id: i64,
    ) -> Result<Option<AuthorizeRequest>> {
        Ok(sqlx::query_as(
            "SELECT client_id, redirect_uri, code_challenge, state, resource, scope FROM oauth_requests
             WHERE handle = $1 AND session_id = $2 AND tenant_id = $3 AND used_at IS NULL AND expires_at > now()",
        )
        .bind(handle)
        .bind(session_id)
        .bind(tenant_id)
        .fetch_optional(self.pool())
        .await?)
    }
}

impl Services {
    /// Counts one use of a throttled key in its window and returns the count with the window's
    /// age in seconds, in one statement (concurrent uses serialize on the row). A window older
    /// than `window_secs` starts again at one. Shares the sign-in counters' table.
    pub(crate) async fn preauth_throttle_take(
        &self,
        key: &str,
        window_secs: i64,
    ) -> Result<(i32, i64)> {
        Ok(sqlx::query_as(
            "INSERT INTO login_throttle AS t (key, window_start, attempts) VALUES ($1, now(), 1)
             ON CONFLICT (key) DO UPDATE SET
                 attempts = CASE WHEN t.window_start < now() - make_interval(secs => $2) THEN 1 ELSE t.attempts + 1 END,
                 window_start = CASE WHEN t.window_start < now() - make_interval(secs => $2) THEN now() ELSE t.window_start END
             RETURNING attempts, extract(epoch FROM now() - window_start)::bigint",
        )
        .bind(key)
        .bind(window_secs as f64)
        .fetch_one(self.pool())
        .await?)
    }
}

impl Services {
    /// The OAuth client an access or refresh token was issued to, with its authentication
    /// method at the token endpoint.
    pub(crate) async fn preauth_token_client(
        &self,
        token_hash: &[u8],
    ) -> Result<Option<(String, String)>> {
        Ok(sqlx::query_as(
            "SELECT c.oauth_client_id, coalesce(o.token_endpoint_auth_method, 'none')
             FROM connection_tokens t
             JOIN connections c ON c.id = t.connection_id
             LEFT JOIN oauth_clients o ON o.client_id = c.oauth_client_id
             WHERE t.token_hash = $1 AND t.kind IN ('access', 'refresh') AND c.oauth_client_id IS NOT NULL",
        )
        .bind(token_hash)
        .fetch_optional(self.pool())
        .await?)
    }
}
