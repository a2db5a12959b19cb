//! Tenants, people, memberships, credentials and the audit log.

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};

use crate::ctx::OpCtx;
use crate::datastore::Services;
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

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PersonRow {
    pub id: i64,
    pub handle: String,
    pub email: String,
    pub name: String,
    pub active: bool,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MembershipRow {
    pub role: String,
    pub active: bool,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ConnectionRow {
    pub handle: String,
    pub name: String,
    pub client_name: String,
    pub rights: Vec<String>,
    pub status: String,
    pub toolset: String,
    pub creator_email: String,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
}

/// One audit entry. Only public ids and names of things, never arguments (R14, R23).
#[derive(Debug, Clone)]
pub struct AuditEntry<'a> {
    pub action: &'a str,
    pub outcome: &'a str,
    pub targets: Vec<String>,
    /// The two-step action this row belongs to.
    pub pending_action: Option<i64>,
    /// Why, when a person says so (switch flips, revocations).
    pub reason: Option<&'a str>,
}

impl<'a> AuditEntry<'a> {
    pub(crate) fn ok(action: &'a str, targets: Vec<String>) -> Self {
        AuditEntry { action, outcome: "ok", targets, pending_action: None, reason: None }
    }
}

pub type Tx<'c> = Transaction<'c, Postgres>;

impl Services {
    /// Starts the one kind of transaction services use; dropping it uncommitted rolls back.
    pub(crate) async fn begin(&self) -> Result<Tx<'static>> {
        Ok(self.pool().begin().await?)
    }

    pub(crate) async fn tenant_by_slug(&self, slug: &str) -> Result<Option<TenantRow>> {
        Ok(sqlx::query_as::<_, TenantRow>(
            "SELECT id, handle, slug, name, currency::text AS currency, zone, agent_access
             FROM tenants WHERE slug = $1",
        )
        .bind(slug)
        .fetch_optional(self.pool())
        .await?)
    }

    pub(crate) async fn person_by_email(&self, email: &str) -> Result<Option<PersonRow>> {
        Ok(sqlx::query_as::<_, PersonRow>(
            "SELECT id, handle, email, name, active FROM people WHERE lower(email) = lower($1)",
        )
        .bind(email)
        .fetch_optional(self.pool())
        .await?)
    }

    pub(crate) async fn membership_get(
        &self,
        ctx: &OpCtx,
        person_id: i64,
    ) -> Result<Option<MembershipRow>> {
        Ok(sqlx::query_as::<_, MembershipRow>(
            "SELECT role, active FROM memberships WHERE tenant_id = $1 AND person_id = $2",
        )
        .bind(ctx.tenant_id())
        .bind(person_id)
        .fetch_optional(self.pool())
        .await?)
    }

    pub(crate) async fn connection_list(&self, ctx: &OpCtx) -> Result<Vec<ConnectionRow>> {
        Ok(sqlx::query_as::<_, ConnectionRow>(
            "SELECT c.id, c.handle, c.name, c.client_name, c.rights, c.status, c.toolset,
                    p.email AS creator_email, c.created_at, c.last_used_at
             FROM connections c JOIN people p ON p.id = c.creator_id
             WHERE c.tenant_id = $1 ORDER BY c.created_at, c.id",
        )
        .bind(ctx.tenant_id())
        .fetch_all(self.pool())
        .await?)
    }
}

pub(crate) async fn tenant_insert(
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

pub(crate) async fn person_insert(
    tx: &mut Tx<'_>,
    handle: &str,
    email: &str,
    name: &str,
    password_hash: Option<&str>,
) -> Result<PersonRow> {
    Ok(sqlx::query_as::<_, PersonRow>(
        "INSERT INTO people (handle, email, name, password_hash) VALUES ($1, $2, $3, $4)
         RETURNING id, handle, email, name, active",
    )
    .bind(handle)
    .bind(email)
    .bind(name)
    .bind(password_hash)
    .fetch_one(&mut **tx)
    .await?)
}

pub(crate) async fn membership_upsert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    person_id: i64,
    role: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO memberships (tenant_id, person_id, role) VALUES ($1, $2, $3)
         ON CONFLICT (tenant_id, person_id) DO UPDATE SET role = EXCLUDED.role, active = true",
    )
    .bind(ctx.tenant_id())
    .bind(person_id)
    .bind(role)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Ends a person's membership in the context's tenant; returns whether there was one.
pub(crate) async fn membership_deactivate(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    person_id: i64,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE memberships SET active = false WHERE tenant_id = $1 AND person_id = $2 AND active",
    )
    .bind(ctx.tenant_id())
    .bind(person_id)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() > 0)
}

pub(crate) async fn connection_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    creator_id: i64,
    name: &str,
    client_name: &str,
    rights: &[String],
) -> Result<i64> {
    connection_insert_toolset(tx, ctx, handle, creator_id, name, client_name, rights, "full").await
}

#[expect(clippy::too_many_arguments, reason = "one column each")]
pub(crate) async fn connection_insert_toolset(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    creator_id: i64,
    name: &str,
    client_name: &str,
    rights: &[String],
    toolset: &str,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO connections (tenant_id, handle, creator_id, name, client_name, rights, toolset)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(creator_id)
    .bind(name)
    .bind(client_name)
    .bind(rights)
    .bind(toolset)
    .fetch_one(&mut **tx)
    .await?)
}

pub(crate) async fn connection_token_insert(
    tx: &mut Tx<'_>,
    connection_id: i64,
    kind: &str,
    token_hash: &[u8],
    audience: Option<&str>,
    expires_at: Option<DateTime<Utc>>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO connection_tokens (connection_id, kind, token_hash, audience, expires_at)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(connection_id)
    .bind(kind)
    .bind(token_hash)
    .bind(audience)
    .bind(expires_at)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Revokes the active connections of the tenant that match: one handle, or every connection a
/// creator made. Returns the ids and handles revoked.
pub(crate) async fn connection_revoke_where(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: Option<&str>,
    creator_id: Option<i64>,
    reason: &str,
) -> Result<Vec<(i64, String)>> {
    let revoked: Vec<(i64, String)> = sqlx::query_as(
        "UPDATE connections SET status = 'revoked', revoked_at = now(), revoked_reason = $4
         WHERE tenant_id = $1 AND status = 'active'
           AND ($2::text IS NULL OR handle = $2)
           AND ($3::bigint IS NULL OR creator_id = $3)
         RETURNING id, handle",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(creator_id)
    .bind(reason)
    .fetch_all(&mut **tx)
    .await?;
    if !revoked.is_empty() {
        // Tokens die with their connection.
        sqlx::query(
            "DELETE FROM connection_tokens WHERE connection_id = ANY($2)
               AND connection_id IN (SELECT id FROM connections WHERE tenant_id = $1)",
        )
        .bind(ctx.tenant_id())
        .bind(revoked.iter().map(|(id, _)| *id).collect::<Vec<i64>>())
        .execute(&mut **tx)
        .await?;
    }
    Ok(revoked)
}

pub(crate) async fn connection_status(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
) -> Result<Option<String>> {
    Ok(sqlx::query_scalar("SELECT status FROM connections WHERE tenant_id = $1 AND handle = $2")
        .bind(ctx.tenant_id())
        .bind(handle)
        .fetch_optional(&mut **tx)
        .await?)
}

pub(crate) async fn api_token_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    person_id: i64,
    name: &str,
    token_hash: &[u8],
) -> Result<()> {
    sqlx::query(
        "INSERT INTO api_tokens (tenant_id, handle, person_id, name, token_hash)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(person_id)
    .bind(name)
    .bind(token_hash)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Writes one audit row from the context: channel, actor, connection and client name come from
/// the entry point (R19), never from the caller's arguments.
pub(crate) async fn audit_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    entry: AuditEntry<'_>,
) -> Result<()> {
    let connection = ctx.connection();
    sqlx::query(
        "INSERT INTO audit_log (tenant_id, channel, actor_id, connection_id, connection_name,
                                client_name, action, outcome, targets, request_id, pending_action_id, reason)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(ctx.tenant_id())
    .bind(ctx.channel().as_str())
    .bind(ctx.actor_person_id())
    .bind(connection.map(|c| c.id))
    .bind(connection.map(|c| c.name.as_str()))
    .bind(connection.map(|c| c.client_name.as_str()))
    .bind(entry.action)
    .bind(entry.outcome)
    .bind(&entry.targets)
    .bind(ctx.request_id())
    .bind(entry.pending_action)
    .bind(entry.reason)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

// Seed data for the bookings domain. The write tools and their guards arrive with the write
// services; these inserts serve the demo and test fixtures.

pub struct NewBooking<'a> {
    pub handle: &'a str,
    pub customer_id: i64,
    pub technician_id: Option<i64>,
    pub service_id: i64,
    pub starts_at: DateTime<Utc>,
    pub zone: &'a str,
    pub status: &'a str,
    pub currency: &'a str,
    pub net_minor: i64,
    pub tax_minor: i64,
    pub customer_note: Option<&'a str>,
}

pub(crate) async fn customer_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    name: &str,
    email: Option<&str>,
    phone: Option<&str>,
    portal_password_hash: Option<&str>,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO customers (tenant_id, handle, name, email, phone, portal_password_hash, created_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(name)
    .bind(email)
    .bind(phone)
    .bind(portal_password_hash)
    .bind(ctx.actor_person_id())
    .fetch_one(&mut **tx)
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

pub(crate) async fn booking_insert(tx: &mut Tx<'_>, ctx: &OpCtx, b: NewBooking<'_>) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO bookings (tenant_id, handle, customer_id, technician_id, service_id, starts_at,
                               zone, status, currency, net_minor, tax_minor, total_minor,
                               customer_note, created_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $10 + $11, $12, $13) RETURNING id",
    )
    .bind(ctx.tenant_id())
    .bind(b.handle)
    .bind(b.customer_id)
    .bind(b.technician_id)
    .bind(b.service_id)
    .bind(b.starts_at)
    .bind(b.zone)
    .bind(b.status)
    .bind(b.currency)
    .bind(b.net_minor)
    .bind(b.tax_minor)
    .bind(b.customer_note)
    .bind(ctx.actor_person_id())
    .fetch_one(&mut **tx)
    .await?)
}

pub(crate) async fn booking_note_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    booking_id: i64,
    source: &str,
    body: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO booking_notes (tenant_id, handle, booking_id, source, author_id, body)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(booking_id)
    .bind(source)
    .bind(ctx.actor_person_id())
    .bind(body)
    .execute(&mut **tx)
    .await?;
    Ok(())
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

/// Makes a person an operator of the platform (or not): operators get the global kill switch.
pub(crate) async fn person_set_operator(
    tx: &mut Tx<'_>,
    person_id: i64,
    operator: bool,
) -> Result<()> {
    sqlx::query("UPDATE people SET is_operator = $2 WHERE id = $1")
        .bind(person_id)
        .bind(operator)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// An audit row of the platform (no tenant): operator grants and the like, with who did it.
pub(crate) async fn platform_audit_insert(
    tx: &mut Tx<'_>,
    channel: &str,
    actor_id: Option<i64>,
    action: &str,
    target: &str,
) -> Result<()> {
    sqlx::query("INSERT INTO audit_log (tenant_id, channel, actor_id, action, outcome, targets) VALUES (NULL, $1, $2, $3, 'ok', ARRAY[$4])")
        .bind(channel)
        .bind(actor_id)
        .bind(action)
        .bind(target)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A person as the operator check reads them.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OperatorRow {
    pub id: i64,
    pub handle: String,
    pub email: String,
    pub active: bool,
    pub is_operator: bool,
}

pub(crate) async fn operator_get(ds: &Services, email: &str) -> Result<Option<OperatorRow>> {
    Ok(sqlx::query_as::<_, OperatorRow>(
        "SELECT id, handle, email, active, is_operator FROM people WHERE lower(email) = lower($1)",
    )
    .bind(email.trim())
    .fetch_optional(ds.pool())
    .await?)
}

pub(crate) async fn operator_by_id(ds: &Services, id: i64) -> Result<Option<OperatorRow>> {
    Ok(sqlx::query_as::<_, OperatorRow>(
        "SELECT id, handle, email, active, is_operator FROM people WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(ds.pool())
    .await?)
}

/// How many active operators the platform has, serialized against other grants in `tx` so that
/// two racing bootstraps cannot both find none.
pub(crate) async fn operator_count_locked(tx: &mut Tx<'_>) -> Result<i64> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('operator-role', 0))")
        .execute(&mut **tx)
        .await?;
    Ok(sqlx::query_scalar("SELECT count(*) FROM people WHERE is_operator AND active")
        .fetch_one(&mut **tx)
        .await?)
}
