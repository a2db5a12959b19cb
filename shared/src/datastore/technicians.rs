use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::Services;
use crate::datastore::customers::escape_like;
use crate::datastore::*;
use crate::error::Result;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TechnicianRow {
    pub id: i64,
    pub handle: String,
    pub name: String,
    pub email: Option<String>,
    pub phone: Option<String>,
    pub skills: Vec<String>,
    pub active: bool,
    pub region: Option<String>,
    pub updated_at: DateTime<Utc>,
}

impl Services {
    pub(crate) async fn technician_find(
        &self,
        ctx: &OpCtx,
        query: Option<&str>,
        skill: Option<&str>,
        include_inactive: bool,
        limit: i64,
    ) -> Result<Vec<TechnicianRow>> {
        let pattern = query.map(|q| format!("%{}%", escape_like(&q.to_lowercase())));
        let rows = sqlx::query_as::<_, TechnicianRow>(
            "SELECT id, handle, name, email, phone, skills, active, region, updated_at FROM technicians
             WHERE tenant_id = $1
               AND ($2::text IS NULL OR lower(name) LIKE $2)
               AND ($3::text IS NULL OR $3 = ANY(skills))
               AND ($4 OR active)
             ORDER BY lower(name), handle
             LIMIT $5",
        )
        .bind(ctx.tenant_id())
        .bind(pattern)
        .bind(skill)
        .bind(include_inactive)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        Ok(rows)
    }
}

pub(crate) async fn technician_lock(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
) -> Result<Option<TechnicianRow>> {
    Ok(sqlx::query_as::<_, TechnicianRow>(
        "SELECT id, handle, name, email, phone, skills, active, region, updated_at FROM technicians
         WHERE tenant_id = $1 AND handle = $2 FOR UPDATE",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .fetch_optional(&mut **tx)
    .await?)
}

pub(crate) async fn technician_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    name: &str,
    phone: Option<&str>,
    skills: &[String],
    home_address: Option<&str>,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO technicians (tenant_id, handle, name, phone, skills, home_address)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(name)
    .bind(phone)
    .bind(skills)
    .bind(home_address)
    .fetch_one(&mut **tx)
    .await?)
}

/// Where a technician works (`None`: nowhere in particular), as a tenant's policies read it.
pub(crate) async fn technician_set_region(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    region: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "UPDATE technicians SET region = $3, updated_at = now() WHERE tenant_id = $1 AND id = $2",
    )
    .bind(ctx.tenant_id())
    .bind(id)
    .bind(region)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
