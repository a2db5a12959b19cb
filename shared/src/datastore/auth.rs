//! The connection context: one query per MCP request (DESIGN step 3, R4).

use crate::datastore::Services;
use crate::error::Result;

/// Everything a worker needs to decide about one MCP request, read in one round trip:
/// the token, its connection, the tenant and both switches, the creator and their current
/// membership. Live rights are computed from it in [`crate::auth`].
#[derive(Debug, sqlx::FromRow)]
pub struct ConnectionContextRow {
    pub token_expires_at: Option<chrono::DateTime<chrono::Utc>>,
    pub token_audience: Option<String>,
    pub connection_id: i64,
    pub connection_handle: String,
    pub connection_name: String,
    pub client_name: String,
    pub connection_rights: Vec<String>,
    pub connection_status: String,
    pub connection_toolset: String,
    pub tenant_id: i64,
    pub tenant_handle: String,
    pub tenant_slug: String,
    pub tenant_zone: String,
    pub tenant_currency: String,
    pub tenant_agent_access: bool,
    pub creator_id: i64,
    pub creator_handle: String,
    pub creator_active: bool,
    pub creator_role: Option<String>,
    pub membership_active: Option<bool>,
    pub global_kill: bool,
    /// The tenant's override of the per-worker read bucket, if it set one.
    pub read_per_minute: Option<i32>,
}

/// What an API token resolves to: the person's current role in the token's tenant.
#[derive(Debug, sqlx::FromRow)]
pub struct ApiContextRow {
    pub person_id: i64,
    pub person_handle: String,
    pub person_active: bool,
    pub role: Option<String>,
    pub membership_active: Option<bool>,
    pub tenant_id: i64,
    pub tenant_handle: String,
    pub tenant_slug: String,
    pub tenant_zone: String,
    pub tenant_currency: String,
    /// The token is past its expiry.
    pub expired: bool,
}

/// The hot-path query: the token, its connection, tenant, switches and the creator's current
/// membership in one round trip. Public so the benchmark can run the same SQL through pgbench.
pub(crate) const CONNECTION_CONTEXT_SQL: &str = r#"
            WITH tok AS (
                SELECT connection_id, kind, expires_at, audience
                FROM connection_tokens
                WHERE token_hash = $1 AND kind IN ('static', 'access')
            ), touch AS (
                UPDATE connections c SET last_used_at = now()
                FROM tok
                WHERE c.id = tok.connection_id
                  AND (c.last_used_at IS NULL OR c.last_used_at < now() - interval '1 minute')
                RETURNING c.id
            )
            SELECT tok.kind AS token_kind, tok.expires_at AS token_expires_at,
                   tok.audience AS token_audience,
                   c.id AS connection_id, c.handle AS connection_handle,
                   c.name AS connection_name, c.client_name, c.rights AS connection_rights,
                   c.status AS connection_status, c.toolset AS connection_toolset,
                   t.id AS tenant_id, t.handle AS tenant_handle, t.slug AS tenant_slug,
                   t.zone AS tenant_zone, t.currency::text AS tenant_currency,
                   t.agent_access AS tenant_agent_access,
                   p.id AS creator_id, p.handle AS creator_handle, p.active AS creator_active,
                   m.role AS creator_role, m.active AS membership_active,
                   (SELECT global_kill FROM platform_state) AS global_kill,
                   (SELECT r.per_minute FROM tenant_rate_limits r
                     WHERE r.tenant_id = t.id AND r.class = 'read') AS read_per_minute
            FROM tok
            JOIN connections c ON c.id = tok.connection_id
            JOIN tenants t ON t.id = c.tenant_id
            JOIN people p ON p.id = c.creator_id
            LEFT JOIN memberships m ON m.tenant_id = c.tenant_id AND m.person_id = c.creator_id
            "#;

impl Services {
    /// Looks up an MCP token by hash. Also stamps `last_used_at`, at most once a minute, in
    /// the same statement so the hot path stays one round trip.
    pub(crate) async fn connection_context(
        &self,
        token_hash: &[u8],
    ) -> Result<Option<ConnectionContextRow>> {
        let row = sqlx::query_as::<_, ConnectionContextRow>(CONNECTION_CONTEXT_SQL)
            .bind(token_hash)
            .fetch_optional(self.pool())
            .await?;
        Ok(row)
    }

    /// Looks up an API token by hash, with its person's current membership.
    pub(crate) async fn api_token_context(
        &self,
        token_hash: &[u8],
    ) -> Result<Option<ApiContextRow>> {
        let row = sqlx::query_as::<_, ApiContextRow>(
            r#"
            SELECT p.id AS person_id, p.handle AS person_handle, p.active AS person_active,
                   m.role, m.active AS membership_active,
                   t.id AS tenant_id, t.handle AS tenant_handle, t.slug AS tenant_slug,
                   t.zone AS tenant_zone, t.currency::text AS tenant_currency,
                   a.expires_at <= now() AS expired
            FROM api_tokens a
            JOIN people p ON p.id = a.person_id
            JOIN tenants t ON t.id = a.tenant_id
            LEFT JOIN memberships m ON m.tenant_id = a.tenant_id AND m.person_id = a.person_id
            WHERE a.token_hash = $1 AND a.revoked_at IS NULL
            "#,
        )
        .bind(token_hash)
        .fetch_optional(self.pool())
        .await?;
        Ok(row)
    }
}
