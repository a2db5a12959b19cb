//! Console sessions (stored hashed, with their CSRF token).

use crate::datastore::*;
use crate::error::Result;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SessionRow {
    pub id: i64,
    pub person_id: i64,
    pub person_handle: String,
    pub email: String,
    pub name: String,
    pub person_active: bool,
    pub is_operator: bool,
    pub csrf_token: String,
    pub tenant_id: Option<i64>,
    pub tenant_handle: Option<String>,
    pub tenant_slug: Option<String>,
    pub tenant_name: Option<String>,
    pub tenant_zone: Option<String>,
    pub tenant_currency: Option<String>,
    pub tenant_agent_access: Option<bool>,
    /// The tenant's policy "decisions need a passkey", for pages to ask for one up front.
    pub tenant_passkey_policy: Option<bool>,
    pub role: Option<String>,
    pub membership_active: Option<bool>,
    /// How the session began: `password`, `passkey` or `sso`.
    pub signed_in_with: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// The identity provider that started the session, if one did.
    pub idp_id: Option<i64>,
    /// The session's tenant's identity provider, and whether it takes only sessions it started.
    pub tenant_idp_id: Option<i64>,
    pub tenant_sso_required: Option<bool>,
    /// The platform's kill switch (R18), read with the session for every page's banner.
    pub global_kill: bool,
    /// Since when the tenant's SIEM webhook fails, and its last error.
    pub webhook_failing_since: Option<chrono::DateTime<chrono::Utc>>,
    pub webhook_last_error: Option<String>,
}

impl Services {
    pub(crate) async fn preauth_session_create(
        &self,
        token_hash: &[u8],
        person_id: i64,
        tenant_id: Option<i64>,
        csrf: &str,
        ttl_secs: i64,
        signed_in_with: (&str, Option<i64>),
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO console_sessions (token_hash, person_id, tenant_id, csrf_token, expires_at,
                                           signed_in_with, passkey_id)
             VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5), $6, $7)",
        )
        .bind(token_hash)
        .bind(person_id)
        .bind(tenant_id)
        .bind(csrf)
        .bind(ttl_secs as f64)
        .bind(signed_in_with.0)
        .bind(signed_in_with.1)
        .execute(self.pool())
        .await?;
        Ok(())
    }
}

impl Services {
    /// A live session with its person and, when picked, the tenant and current membership.
    pub(crate) async fn entry_session_get(&self, token_hash: &[u8]) -> Result<Option<SessionRow>> {
        Ok(sqlx::query_as::<_, SessionRow>(
            "SELECT s.id, p.id AS person_id, p.handle AS person_handle, p.email, p.name,
                    p.active AS person_active, p.is_operator, s.csrf_token,
                    t.id AS tenant_id, t.handle AS tenant_handle, t.slug AS tenant_slug, t.name AS tenant_name,
                    t.zone AS tenant_zone, t.currency::text AS tenant_currency, t.agent_access AS tenant_agent_access,
                    t.decisions_need_passkey AS tenant_passkey_policy,
                    m.role, m.active AS membership_active, s.signed_in_with, s.created_at,
                    s.idp_id, i.id AS tenant_idp_id, i.sso_required AS tenant_sso_required,
                    coalesce((SELECT global_kill FROM platform_state), false) AS global_kill,
                    w.failing_since AS webhook_failing_since, w.last_error AS webhook_last_error
             FROM console_sessions s
             JOIN people p ON p.id = s.person_id
             LEFT JOIN tenants t ON t.id = s.tenant_id
             LEFT JOIN memberships m ON m.tenant_id = s.tenant_id AND m.person_id = s.person_id
             LEFT JOIN tenant_idps i ON i.tenant_id = s.tenant_id
             LEFT JOIN audit_webhooks w ON w.tenant_id = s.tenant_id
             WHERE s.token_hash = $1 AND s.expires_at > now()",
        )
        .bind(token_hash)
        .fetch_optional(self.pool())
        .await?)
    }
}

impl Services {
    pub(crate) async fn preauth_session_set_tenant(
        &self,
        session_id: i64,
        tenant_id: i64,
    ) -> Result<()> {
        sqlx::query("UPDATE console_sessions SET tenant_id = $2 WHERE id = $1")
            .bind(session_id)
            .bind(tenant_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}

impl Services {
    pub(crate) async fn preauth_session_delete(&self, token_hash: &[u8]) -> Result<()> {
        sqlx::query("DELETE FROM console_sessions WHERE token_hash = $1")
            .bind(token_hash)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}
