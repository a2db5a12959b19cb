//! Alert rules and their mutes.

use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AlertRuleRow {
    pub id: i64,
    pub handle: String,
    pub name: String,
    pub description: String,
    pub muted_until: Option<DateTime<Utc>>,
}

pub(crate) async fn alert_rule_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    name: &str,
    description: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO alert_rules (tenant_id, handle, name, description) VALUES ($1, $2, $3, $4)
         ON CONFLICT (tenant_id, name) DO NOTHING",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(name)
    .bind(description)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(crate) async fn alert_rule_lock(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
) -> Result<Option<AlertRuleRow>> {
    Ok(sqlx::query_as::<_, AlertRuleRow>(
        "SELECT id, handle, name, description, muted_until FROM alert_rules
         WHERE tenant_id = $1 AND handle = $2 FOR UPDATE",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .fetch_optional(&mut **tx)
    .await?)
}

pub(crate) async fn alert_rule_mute(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    until: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(
        "UPDATE alert_rules SET muted_until = $3, muted_by = $4 WHERE tenant_id = $1 AND id = $2",
    )
    .bind(ctx.tenant_id())
    .bind(id)
    .bind(until)
    .bind(ctx.actor_person_id())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Services {
    pub(crate) async fn alert_rule_list(&self, ctx: &OpCtx) -> Result<Vec<AlertRuleRow>> {
        Ok(sqlx::query_as::<_, AlertRuleRow>(
            "SELECT id, handle, name, description, muted_until FROM alert_rules WHERE tenant_id = $1 ORDER BY name",
        )
        .bind(ctx.tenant_id())
        .fetch_all(self.pool())
        .await?)
    }
}
