//! Tenants, their agent switch, and the platform state (the global kill switch).

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TenantRow {
    pub id: i64,
    pub handle: String,
    pub slug: String,
    pub name: String,
    pub currency: String,
    pub zone: String,
    pub agent_access: bool,
}

impl Services {
    pub(crate) async fn platform_tenant_by_slug(&self, slug: &str) -> Result<Option<TenantRow>> {
        Ok(sqlx::query_as::<_, TenantRow>(
            "SELECT id, handle, slug, name, currency::text AS currency, zone, agent_access
             FROM tenants WHERE slug = $1",
        )
        .bind(slug)
        .fetch_optional(self.pool())
        .await?)
    }
}

pub(crate) async fn platform_tenant_insert(
    tx: &mut Tx<'_>,
    handle: &str,
    slug: &str,
    name: &str,
    currency: &str,
    zone: &str,
) -> Result<TenantRow> {
    Ok(sqlx::query_as::<_, TenantRow>(
        "INSERT INTO tenants (handle, slug, name, currency, zone) VALUES ($1, $2, $3, $4, $5)
         RETURNING id, handle, slug, name, currency::text AS currency, zone, agent_access",
    )
    .bind(handle)
    .bind(slug)
    .bind(name)
    .bind(currency)
    .bind(zone)
    .fetch_one(&mut **tx)
    .await?)
}

/// Sets the platform kill switch and audits it as a platform-wide row (no tenant).
pub(crate) async fn platform_kill_set(
    tx: &mut Tx<'_>,
    on: bool,
    by: &str,
    channel: &str,
    reason: &str,
    request_id: &str,
) -> Result<bool> {
    let was: bool = sqlx::query_scalar("SELECT global_kill FROM platform_state FOR UPDATE")
        .fetch_one(&mut **tx)
        .await?;
    sqlx::query("UPDATE platform_state SET global_kill = $1, updated_at = now(), updated_by = $2, reason = $3")
        .bind(on)
        .bind(by)
        .bind(reason)
        .execute(&mut **tx)
        .await?;
    sqlx::query(
        "INSERT INTO audit_log (tenant_id, channel, action, outcome, targets, request_id, reason)
         VALUES (NULL, $1, $2, 'ok', ARRAY[$3], $4, $5)",
    )
    .bind(channel)
    .bind(if on { "kill_switch.on" } else { "kill_switch.off" })
    .bind(format!("platform by {by}"))
    .bind(request_id)
    .bind(reason)
    .execute(&mut **tx)
    .await?;
    Ok(was)
}

pub(crate) async fn tenant_agent_access_set(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    on: bool,
) -> Result<bool> {
    let was: bool = sqlx::query_scalar("SELECT agent_access FROM tenants WHERE id = $1 FOR UPDATE")
        .bind(ctx.tenant_id())
        .fetch_one(&mut **tx)
        .await?;
    sqlx::query("UPDATE tenants SET agent_access = $2 WHERE id = $1")
        .bind(ctx.tenant_id())
        .bind(on)
        .execute(&mut **tx)
        .await?;
    Ok(was)
}

pub(crate) async fn platform_kill_get(ds: &Services) -> Result<bool> {
    Ok(sqlx::query_scalar("SELECT global_kill FROM platform_state").fetch_one(ds.pool()).await?)
}

/// A tenant by id, to build a job context for it.
pub(crate) async fn entry_tenant_by_id(
    tx: &mut Tx<'_>,
    id: i64,
) -> Result<crate::datastore::TenantRow> {
    Ok(sqlx::query_as::<_, crate::datastore::TenantRow>(
        "SELECT id, handle, slug, name, currency::text AS currency, zone, agent_access FROM tenants WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&mut **tx)
    .await?)
}
