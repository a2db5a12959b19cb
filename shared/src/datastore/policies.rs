//! Tenants' policy sets: every version kept, the tenant's row naming the one in force.

use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::pipe::PipeRow;
use crate::datastore::*;
use crate::error::Result;

/// One version of a tenant's policy set.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PolicyRow {
    pub version: i32,
    pub source: String,
    pub author: String,
    pub note: String,
    pub created_at: DateTime<Utc>,
}

impl Services {
    /// The version in force (0: none) and its source.
    pub(crate) async fn policy_current(&self, ctx: &OpCtx) -> Result<Option<PolicyRow>> {
        Ok(sqlx::query_as::<_, PolicyRow>(
            "SELECT p.version, p.source, p.author, p.note, p.created_at
             FROM tenants t JOIN tenant_policies p ON p.tenant_id = t.id AND p.version = t.policy_version
             WHERE t.id = $1",
        )
        .bind(ctx.tenant_id())
        .fetch_optional(self.pool())
        .await?)
    }

    /// One version's source.
    pub(crate) async fn policy_at(&self, ctx: &OpCtx, version: i32) -> Result<Option<String>> {
        policy_source(self.pool(), ctx, version).await
    }

    /// The versions, newest first.
    pub(crate) async fn policy_history(&self, ctx: &OpCtx, limit: i64) -> Result<Vec<PolicyRow>> {
        Ok(sqlx::query_as::<_, PolicyRow>(
            "SELECT version, source, author, note, created_at FROM tenant_policies
             WHERE tenant_id = $1 ORDER BY version DESC LIMIT $2",
        )
        .bind(ctx.tenant_id())
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }
}

/// One version's source, read on `on`: the pool, or a transaction that is open anyway (a
/// transaction waiting for a second connection can hold up a small pool, or a transaction
/// pooler's few server connections, until it times out).
pub(crate) async fn policy_source<'e>(
    on: impl sqlx::PgExecutor<'e>,
    ctx: &OpCtx,
    version: i32,
) -> Result<Option<String>> {
    Ok(sqlx::query_scalar(
        "SELECT source FROM tenant_policies WHERE tenant_id = $1 AND version = $2",
    )
    .bind(ctx.tenant_id())
    .bind(version)
    .fetch_optional(on)
    .await?)
}

/// The version in force, read in `tx` with the tenant's row held, so two admins setting the
/// set at once are told apart.
pub(crate) async fn policy_version_locked(tx: &mut Tx<'_>, ctx: &OpCtx) -> Result<i32> {
    Ok(sqlx::query_scalar("SELECT policy_version FROM tenants WHERE id = $1 FOR UPDATE")
        .bind(ctx.tenant_id())
        .fetch_one(&mut **tx)
        .await?)
}

/// The version in force, read in `tx`.
pub(crate) async fn policy_version_in(tx: &mut Tx<'_>, ctx: &OpCtx) -> Result<i32> {
    Ok(sqlx::query_scalar("SELECT policy_version FROM tenants WHERE id = $1")
        .bind(ctx.tenant_id())
        .fetch_one(&mut **tx)
        .await?)
}

/// Stores `source` as version `version` and puts it in force.
pub(crate) async fn policy_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    version: i32,
    source: &str,
    author: &str,
    note: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO tenant_policies (tenant_id, version, source, author_id, author, note)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(ctx.tenant_id())
    .bind(version)
    .bind(source)
    .bind(ctx.actor_person_id())
    .bind(author)
    .bind(note)
    .execute(&mut **tx)
    .await?;
    sqlx::query("UPDATE tenants SET policy_version = $2 WHERE id = $1")
        .bind(ctx.tenant_id())
        .bind(version)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// One record as policies see it (see [`policy_facts`]): a booking's status, start and its
/// customer's region; a customer's region and zone; a technician's region and whether active.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct PolicyFactRow {
    pub handle: String,
    pub status: Option<String>,
    pub starts_at: Option<DateTime<Utc>>,
    pub region: Option<String>,
    pub zone: Option<String>,
    pub active: Option<bool>,
}

/// The records named, of the tenant only, as policies see them: bookings, customers and
/// technicians by handle (a handle's prefix tells which it is), as one select over the tenant
/// `tenant` and the handle arrays `bookings`, `customers`, `technicians` (SQL expressions). A
/// handle the tenant does not have is absent. One text for [`policy_facts`] and for the
/// worker's pipe, which reads the same facts with the connection context.
pub(crate) fn policy_facts_sql_with(
    tenant: &str,
    bookings: &str,
    customers: &str,
    technicians: &str,
) -> String {
    format!(
        "SELECT b.handle, b.status, b.starts_at, c.region, NULL::text AS zone, NULL::bool AS active
           FROM bookings b JOIN customers c ON c.id = b.customer_id AND c.tenant_id = b.tenant_id
          WHERE b.tenant_id = {tenant} AND b.handle = ANY({bookings})
         UNION ALL
         SELECT handle, NULL, NULL, region, zone, NULL
           FROM customers WHERE tenant_id = {tenant} AND handle = ANY({customers})
         UNION ALL
         SELECT handle, NULL, NULL, region, NULL, active
           FROM technicians WHERE tenant_id = {tenant} AND handle = ANY({technicians})"
    )
}

static POLICY_FACTS_SQL: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| policy_facts_sql_with("$1", "$2", "$3", "$4"));

/// The records named, of the tenant only, as policies see them, in one round trip (see
/// [`policy_facts_sql_with`]).
pub(crate) async fn policy_facts<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    ctx: &OpCtx,
    bookings: &[String],
    customers: &[String],
    technicians: &[String],
) -> Result<Vec<PolicyFactRow>> {
    Ok(sqlx::query_as(POLICY_FACTS_SQL.as_str())
        .bind(ctx.tenant_id())
        .bind(bookings)
        .bind(customers)
        .bind(technicians)
        .fetch_all(executor)
        .await?)
}

impl PolicyFactRow {
    /// Reads the facts of one record from a row of the pipe (read with the connection
    /// context), where each column carries the prefix `fact_`.
    pub(crate) fn from_pipe(row: &PipeRow) -> Result<Self> {
        Ok(PolicyFactRow {
            handle: row.get("fact_handle")?,
            status: row.get("fact_status")?,
            starts_at: row.get("fact_starts_at")?,
            region: row.get("fact_region")?,
            zone: row.get("fact_zone")?,
            active: row.get("fact_active")?,
        })
    }
}

/// Who a connection is, as policies see it: its creator's role, client and how it was granted.
pub(crate) async fn policy_principal<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    ctx: &OpCtx,
    connection_id: i64,
) -> Result<Option<(String, String, String, String, String, String)>> {
    Ok(sqlx::query_as(
        "SELECT c.handle, coalesce(m.role, ''), c.client_name, c.name,
                CASE WHEN c.granted_by = 'idp' THEN 'id_jag'
                     WHEN c.oauth_client_id IS NOT NULL THEN 'oauth' ELSE 'static' END,
                coalesce(p.handle, '')
         FROM connections c
         LEFT JOIN memberships m ON m.tenant_id = c.tenant_id AND m.person_id = c.creator_id
         LEFT JOIN people p ON p.id = c.creator_id
         WHERE c.tenant_id = $1 AND c.id = $2",
    )
    .bind(ctx.tenant_id())
    .bind(connection_id)
    .fetch_optional(executor)
    .await?)
}

/// One audited agent call, as a policy replay reads it.
#[derive(Debug, sqlx::FromRow)]
pub struct ReplayedCall {
    pub action: String,
    pub connection: String,
    pub role: String,
    pub client: String,
    pub name: String,
    pub grant: String,
    /// The connection's creator (`per_…`).
    pub creator: String,
    pub targets: Vec<String>,
    pub at: DateTime<Utc>,
    /// The non-secret facts of its arguments, while kept (`audit_call_facts`).
    pub facts: Option<serde_json::Value>,
}

impl Services {
    /// The tenant's agent calls of the last `hours`, the newest `limit` of them.
    pub(crate) async fn policy_replay(
        &self,
        ctx: &OpCtx,
        hours: i64,
        limit: i64,
    ) -> Result<Vec<ReplayedCall>> {
        Ok(sqlx::query_as::<_, ReplayedCall>(
            "SELECT a.action, c.handle AS connection, coalesce(m.role, '') AS role,
                    c.client_name AS client, c.name,
                    CASE WHEN c.granted_by = 'idp' THEN 'id_jag'
                         WHEN c.oauth_client_id IS NOT NULL THEN 'oauth' ELSE 'static' END AS grant,
                    coalesce(p.handle, '') AS creator, a.targets, a.at, f.facts
             FROM audit_log a
             LEFT JOIN audit_call_facts f ON f.audit_id = a.id
             JOIN connections c ON c.id = a.connection_id AND c.tenant_id = a.tenant_id
             LEFT JOIN memberships m ON m.tenant_id = c.tenant_id AND m.person_id = c.creator_id
             LEFT JOIN people p ON p.id = c.creator_id
             WHERE a.tenant_id = $1 AND a.channel = 'mcp' AND a.at > now() - make_interval(hours => $2::int)
               AND a.action NOT LIKE '%.confirm' AND a.action NOT LIKE '%.reject'
             ORDER BY a.at DESC LIMIT $3",
        )
        .bind(ctx.tenant_id())
        .bind(hours as i32)
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }
}
