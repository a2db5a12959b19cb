//! SQL of the console (sessions, sign-in throttling, people) and of the OAuth server
//! (clients, codes, grants).

use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::{Services, Tx};
use crate::error::Result;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LoginRow {
    pub id: i64,
    pub password_hash: Option<String>,
    pub active: bool,
}

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
    pub role: Option<String>,
    pub membership_active: Option<bool>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MembershipListRow {
    pub tenant_id: i64,
    pub slug: String,
    pub name: String,
    pub role: String,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PersonListRow {
    pub handle: String,
    pub email: String,
    pub name: String,
    pub role: String,
    pub active: bool,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClientRow {
    pub client_id: String,
    pub client_name: String,
    pub redirect_uris: Vec<String>,
    pub kind: String,
    pub fetched_at: Option<DateTime<Utc>>,
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
}

impl Services {
    pub(crate) async fn person_login(&self, email: &str) -> Result<Option<LoginRow>> {
        Ok(sqlx::query_as::<_, LoginRow>(
            "SELECT id, password_hash, active FROM people WHERE lower(email) = lower($1)",
        )
        .bind(email)
        .fetch_optional(self.pool())
        .await?)
    }

    pub(crate) async fn login_failures_recent(&self, email: &str, window_secs: i64) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM login_failures WHERE lower(email) = lower($1) AND at > now() - make_interval(secs => $2)",
        )
        .bind(email)
        .bind(window_secs as f64)
        .fetch_one(self.pool())
        .await?)
    }

    pub(crate) async fn login_failure_add(&self, email: &str) -> Result<()> {
        sqlx::query("INSERT INTO login_failures (email) VALUES ($1)")
            .bind(email)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    pub(crate) async fn session_create(
        &self,
        token_hash: &[u8],
        person_id: i64,
        tenant_id: Option<i64>,
        csrf: &str,
        ttl_secs: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO console_sessions (token_hash, person_id, tenant_id, csrf_token, expires_at)
             VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))",
        )
        .bind(token_hash)
        .bind(person_id)
        .bind(tenant_id)
        .bind(csrf)
        .bind(ttl_secs as f64)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// A live session with its person and, when picked, the tenant and current membership.
    pub(crate) async fn session_get(&self, token_hash: &[u8]) -> Result<Option<SessionRow>> {
        Ok(sqlx::query_as::<_, SessionRow>(
            "SELECT s.id, p.id AS person_id, p.handle AS person_handle, p.email, p.name,
                    p.active AS person_active, p.is_operator, s.csrf_token,
                    t.id AS tenant_id, t.handle AS tenant_handle, t.slug AS tenant_slug, t.name AS tenant_name,
                    t.zone AS tenant_zone, t.currency::text AS tenant_currency, t.agent_access AS tenant_agent_access,
                    m.role, m.active AS membership_active
             FROM console_sessions s
             JOIN people p ON p.id = s.person_id
             LEFT JOIN tenants t ON t.id = s.tenant_id
             LEFT JOIN memberships m ON m.tenant_id = s.tenant_id AND m.person_id = s.person_id
             WHERE s.token_hash = $1 AND s.expires_at > now()",
        )
        .bind(token_hash)
        .fetch_optional(self.pool())
        .await?)
    }

    pub(crate) async fn session_set_tenant(&self, session_id: i64, tenant_id: i64) -> Result<()> {
        sqlx::query("UPDATE console_sessions SET tenant_id = $2 WHERE id = $1")
            .bind(session_id)
            .bind(tenant_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    pub(crate) async fn session_delete(&self, token_hash: &[u8]) -> Result<()> {
        sqlx::query("DELETE FROM console_sessions WHERE token_hash = $1")
            .bind(token_hash)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    pub(crate) async fn memberships_of(&self, person_id: i64) -> Result<Vec<MembershipListRow>> {
        Ok(sqlx::query_as::<_, MembershipListRow>(
            "SELECT t.id AS tenant_id, t.slug, t.name, m.role FROM memberships m JOIN tenants t ON t.id = m.tenant_id
             WHERE m.person_id = $1 AND m.active ORDER BY t.name",
        )
        .bind(person_id)
        .fetch_all(self.pool())
        .await?)
    }

    pub(crate) async fn people_list(&self, ctx: &OpCtx) -> Result<Vec<PersonListRow>> {
        Ok(sqlx::query_as::<_, PersonListRow>(
            "SELECT p.handle, p.email, p.name, m.role, (m.active AND p.active) AS active
             FROM memberships m JOIN people p ON p.id = m.person_id
             WHERE m.tenant_id = $1 ORDER BY p.name, p.handle",
        )
        .bind(ctx.tenant_id())
        .fetch_all(self.pool())
        .await?)
    }

    pub(crate) async fn oauth_client_get(&self, client_id: &str) -> Result<Option<ClientRow>> {
        Ok(sqlx::query_as::<_, ClientRow>(
            "SELECT client_id, client_name, redirect_uris, kind, fetched_at FROM oauth_clients WHERE client_id = $1",
        )
        .bind(client_id)
        .fetch_optional(self.pool())
        .await?)
    }

    pub(crate) async fn oauth_client_put(
        &self,
        client_id: &str,
        name: &str,
        redirect_uris: &[String],
        kind: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO oauth_clients (client_id, client_name, redirect_uris, kind, fetched_at)
             VALUES ($1, $2, $3, $4, CASE WHEN $4 = 'metadata_document' THEN now() END)
             ON CONFLICT (client_id) DO UPDATE SET client_name = EXCLUDED.client_name,
                 redirect_uris = EXCLUDED.redirect_uris, fetched_at = EXCLUDED.fetched_at",
        )
        .bind(client_id)
        .bind(name)
        .bind(redirect_uris)
        .bind(kind)
        .execute(self.pool())
        .await?;
        Ok(())
    }
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

pub(crate) async fn connection_set_oauth(
    tx: &mut Tx<'_>,
    id: i64,
    client_id: &str,
    rights: &[String],
) -> Result<()> {
    sqlx::query("UPDATE connections SET oauth_client_id = $2, rights = $3 WHERE id = $1")
        .bind(id)
        .bind(client_id)
        .bind(rights)
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

pub(crate) async fn oauth_code_insert(tx: &mut Tx<'_>, c: NewCode<'_>) -> Result<()> {
    sqlx::query(
        "INSERT INTO oauth_codes (code_hash, client_id, connection_id, redirect_uri, code_challenge, resource, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, now() + interval '2 minutes')",
    )
    .bind(c.code_hash)
    .bind(c.client_id)
    .bind(c.connection_id)
    .bind(c.redirect_uri)
    .bind(c.code_challenge)
    .bind(c.resource)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Locks a code for exchange.
pub(crate) async fn oauth_code_lock(tx: &mut Tx<'_>, code_hash: &[u8]) -> Result<Option<CodeRow>> {
    Ok(sqlx::query_as::<_, CodeRow>(
        "SELECT id, client_id, connection_id, redirect_uri, code_challenge, resource,
                expires_at <= now() AS expired, used_at IS NOT NULL AS used
         FROM oauth_codes WHERE code_hash = $1 FOR UPDATE",
    )
    .bind(code_hash)
    .fetch_optional(&mut **tx)
    .await?)
}

pub(crate) async fn oauth_code_use(tx: &mut Tx<'_>, id: i64) -> Result<()> {
    sqlx::query("UPDATE oauth_codes SET used_at = now() WHERE id = $1")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

pub(crate) async fn refresh_lock(tx: &mut Tx<'_>, token_hash: &[u8]) -> Result<Option<RefreshRow>> {
    Ok(sqlx::query_as::<_, RefreshRow>(
        "SELECT t.id, t.connection_id, t.audience, coalesce(t.expires_at <= now(), false) AS expired,
                t.used_at IS NOT NULL AS used, c.status AS connection_status, c.tenant_id, c.oauth_client_id
         FROM connection_tokens t JOIN connections c ON c.id = t.connection_id
         WHERE t.token_hash = $1 AND t.kind = 'refresh' FOR UPDATE OF t",
    )
    .bind(token_hash)
    .fetch_optional(&mut **tx)
    .await?)
}

pub(crate) async fn token_mark_used(tx: &mut Tx<'_>, id: i64) -> Result<()> {
    sqlx::query("UPDATE connection_tokens SET used_at = now() WHERE id = $1")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Deletes one access token by hash; returns whether it existed.
pub(crate) async fn access_token_delete(tx: &mut Tx<'_>, token_hash: &[u8]) -> Result<bool> {
    Ok(sqlx::query("DELETE FROM connection_tokens WHERE token_hash = $1 AND kind = 'access'")
        .bind(token_hash)
        .execute(&mut **tx)
        .await?
        .rows_affected()
        > 0)
}

/// The tenant, handle and status of a connection, by id (for revocations found by token).
pub(crate) async fn connection_by_id(tx: &mut Tx<'_>, id: i64) -> Result<Option<(i64, String)>> {
    Ok(sqlx::query_as::<_, (i64, String)>(
        "SELECT tenant_id, handle FROM connections WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&mut **tx)
    .await?)
}

pub(crate) async fn tenant_by_id(tx: &mut Tx<'_>, id: i64) -> Result<crate::datastore::TenantRow> {
    Ok(sqlx::query_as::<_, crate::datastore::TenantRow>(
        "SELECT id, handle, slug, name, currency::text AS currency, zone, agent_access FROM tenants WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&mut **tx)
    .await?)
}
