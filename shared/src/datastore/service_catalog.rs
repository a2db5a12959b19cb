//! The service catalog (prices, tax rates, durations).

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ServiceRow {
    pub id: i64,
    pub handle: String,
    pub name: String,
    pub duration_minutes: i32,
    pub price_minor: i64,
    pub tax_rate_bp: i32,
}

const SERVICE_COLUMNS: &str = "id, handle, name, duration_minutes, price_minor, tax_rate_bp";

pub(crate) async fn service_get(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
) -> Result<Option<ServiceRow>> {
    Ok(sqlx::query_as::<_, ServiceRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {SERVICE_COLUMNS} FROM services WHERE tenant_id = $1 AND handle = $2"
    )))
    .bind(ctx.tenant_id())
    .bind(handle)
    .fetch_optional(&mut **tx)
    .await?)
}

impl Services {
    pub(crate) async fn service_list(&self, ctx: &OpCtx) -> Result<Vec<ServiceRow>> {
        Ok(sqlx::query_as::<_, ServiceRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {SERVICE_COLUMNS} FROM services WHERE tenant_id = $1 ORDER BY name, handle"
        )))
        .bind(ctx.tenant_id())
        .fetch_all(self.pool())
        .await?)
    }
}

pub(crate) async fn service_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    name: &str,
    duration_minutes: i32,
    price_minor: i64,
    tax_rate_bp: i32,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO services (tenant_id, handle, name, duration_minutes, price_minor, tax_rate_bp)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(name)
    .bind(duration_minutes)
    .bind(price_minor)
    .bind(tax_rate_bp)
    .fetch_one(&mut **tx)
    .await?)
}
