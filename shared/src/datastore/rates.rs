//! Rate windows shared by every worker.

use crate::ctx::OpCtx;
use crate::datastore::hot_path::Sql;
use crate::datastore::*;
use crate::error::{Error, Result};

impl Services {
    /// Counts one call of the context's connection `connection_id` in the current minute's
    /// window; returns the count, the limit (the context tenant's override or `default_limit`)
    /// and the seconds until the window ends.
    pub(crate) async fn rate_take(
        &self,
        ctx: &OpCtx,
        connection_id: i64,
        class: &str,
        default_limit: i32,
    ) -> Result<(i32, i32, f64)> {
        let tenant_id = ctx.tenant_id();
        // One statement on its own: on the hot path's pipe.
        let row = self
            .pipe()
            .query_opt(Sql::RateTake, &[&connection_id, &tenant_id, &class, &default_limit])
            .await?
            .ok_or_else(|| Error::Internal("the rate window answered with no row".into()))?;
        Ok((row.get("count")?, row.get("per_minute")?, row.get("seconds_left")?))
    }
}

impl Services {
    /// The tenant's overrides, by class.
    pub(crate) async fn rate_overrides(&self, ctx: &OpCtx) -> Result<Vec<(String, i32)>> {
        Ok(sqlx::query_as("SELECT class, per_minute FROM tenant_rate_limits WHERE tenant_id = $1")
            .bind(ctx.tenant_id())
            .fetch_all(self.pool())
            .await?)
    }
}

/// Sets (or with `None` removes) the tenant's override of one class.
pub(crate) async fn rate_override_put(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    class: &str,
    per_minute: Option<i32>,
) -> Result<()> {
    match per_minute {
        Some(n) => {
            sqlx::query(
                "INSERT INTO tenant_rate_limits (tenant_id, class, per_minute) VALUES ($1, $2, $3)
                 ON CONFLICT (tenant_id, class) DO UPDATE SET per_minute = EXCLUDED.per_minute",
            )
            .bind(ctx.tenant_id())
            .bind(class)
            .bind(n)
            .execute(&mut **tx)
            .await?;
        }
        None => {
            sqlx::query("DELETE FROM tenant_rate_limits WHERE tenant_id = $1 AND class = $2")
                .bind(ctx.tenant_id())
                .bind(class)
                .execute(&mut **tx)
                .await?;
        }
    }
    Ok(())
}
