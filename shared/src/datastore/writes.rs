//! SQL of the write side: customer and booking writes, pending two-step actions, the replay
//! cache, the outbox, alert rules and the connection's audit trail. Every function filters by
//! the context's tenant and runs inside the caller's transaction.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::ctx::OpCtx;
use crate::datastore::{CustomerRow, Services, TechnicianRow, Tx};
use crate::error::Result;

const CUSTOMER_COLUMNS: &str = "id, handle, name, email, phone, created_at, updated_at";

pub(crate) async fn customer_lock(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
) -> Result<Option<CustomerRow>> {
    Ok(sqlx::query_as::<_, CustomerRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {CUSTOMER_COLUMNS} FROM customers WHERE tenant_id = $1 AND handle = $2 FOR UPDATE"
    )))
    .bind(ctx.tenant_id())
    .bind(handle)
    .fetch_optional(&mut **tx)
    .await?)
}

/// The handle and key of a customer with this normalized email or phone, if any (R9).
pub(crate) async fn customer_by_key(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    email: Option<&str>,
    phone: Option<&str>,
    except_id: Option<i64>,
) -> Result<Option<(String, String)>> {
    Ok(sqlx::query_as::<_, (String, String)>(
        "SELECT handle, CASE WHEN $2::text IS NOT NULL AND lower(email) = $2 THEN 'email' ELSE 'phone' END
         FROM customers
         WHERE tenant_id = $1 AND ($4::bigint IS NULL OR id <> $4)
           AND (($2::text IS NOT NULL AND lower(email) = $2)
             OR ($3::text IS NOT NULL AND regexp_replace(coalesce(phone, ''), '[^0-9+]', '', 'g') = $3))
         ORDER BY id LIMIT 1",
    )
    .bind(ctx.tenant_id())
    .bind(email)
    .bind(phone)
    .bind(except_id)
    .fetch_optional(&mut **tx)
    .await?)
}

pub(crate) async fn customer_create(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    name: &str,
    email: Option<&str>,
    phone: Option<&str>,
    separate_reason: Option<&str>,
) -> Result<CustomerRow> {
    Ok(sqlx::query_as::<_, CustomerRow>(sqlx::AssertSqlSafe(format!(
        "INSERT INTO customers (tenant_id, handle, name, email, phone, separate_reason, created_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {CUSTOMER_COLUMNS}"
    )))
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(name)
    .bind(email)
    .bind(phone)
    .bind(separate_reason)
    .bind(ctx.actor_person_id())
    .fetch_one(&mut **tx)
    .await?)
}

pub(crate) async fn customer_update(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    name: &str,
    email: Option<&str>,
    phone: Option<&str>,
) -> Result<CustomerRow> {
    Ok(sqlx::query_as::<_, CustomerRow>(sqlx::AssertSqlSafe(format!(
        "UPDATE customers SET name = $3, email = $4, phone = $5, updated_at = clock_timestamp()
         WHERE tenant_id = $1 AND id = $2 RETURNING {CUSTOMER_COLUMNS}"
    )))
    .bind(ctx.tenant_id())
    .bind(id)
    .bind(name)
    .bind(email)
    .bind(phone)
    .fetch_one(&mut **tx)
    .await?)
}

pub(crate) async fn customer_booking_handles(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    customer_id: i64,
) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT handle FROM bookings WHERE tenant_id = $1 AND customer_id = $2 ORDER BY starts_at",
    )
    .bind(ctx.tenant_id())
    .bind(customer_id)
    .fetch_all(&mut **tx)
    .await?)
}

pub(crate) async fn customer_delete(tx: &mut Tx<'_>, ctx: &OpCtx, id: i64) -> Result<()> {
    sqlx::query("DELETE FROM customers WHERE tenant_id = $1 AND id = $2")
        .bind(ctx.tenant_id())
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

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

pub(crate) async fn technician_lock(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
) -> Result<Option<TechnicianRow>> {
    Ok(sqlx::query_as::<_, TechnicianRow>(
        "SELECT id, handle, name, email, phone, skills, active, updated_at FROM technicians
         WHERE tenant_id = $1 AND handle = $2 FOR UPDATE",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .fetch_optional(&mut **tx)
    .await?)
}

/// Another live booking of this customer for this service at this start (R9).
pub(crate) async fn booking_by_key(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    customer_id: i64,
    service_id: i64,
    starts_at: DateTime<Utc>,
) -> Result<Option<String>> {
    Ok(sqlx::query_scalar(
        "SELECT handle FROM bookings
         WHERE tenant_id = $1 AND customer_id = $2 AND service_id = $3 AND starts_at = $4
           AND status <> 'cancelled'
         ORDER BY id LIMIT 1",
    )
    .bind(ctx.tenant_id())
    .bind(customer_id)
    .bind(service_id)
    .bind(starts_at)
    .fetch_optional(&mut **tx)
    .await?)
}

pub struct BookingChange<'a> {
    pub technician_id: Option<i64>,
    pub service_id: i64,
    pub starts_at: DateTime<Utc>,
    pub net_minor: i64,
    pub tax_minor: i64,
    pub priority: &'a str,
    pub reference: Option<&'a str>,
    pub status: &'a str,
}

pub(crate) async fn booking_update(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    c: BookingChange<'_>,
) -> Result<()> {
    sqlx::query(
        "UPDATE bookings SET technician_id = $3, service_id = $4, starts_at = $5, net_minor = $6,
                tax_minor = $7, total_minor = $6 + $7, priority = $8, reference = $9, status = $10,
                updated_at = clock_timestamp()
         WHERE tenant_id = $1 AND id = $2",
    )
    .bind(ctx.tenant_id())
    .bind(id)
    .bind(c.technician_id)
    .bind(c.service_id)
    .bind(c.starts_at)
    .bind(c.net_minor)
    .bind(c.tax_minor)
    .bind(c.priority)
    .bind(c.reference)
    .bind(c.status)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(crate) async fn booking_set_separate_reason(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    reason: &str,
) -> Result<()> {
    sqlx::query("UPDATE bookings SET separate_reason = $3 WHERE tenant_id = $1 AND id = $2")
        .bind(ctx.tenant_id())
        .bind(id)
        .bind(reason)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

pub(crate) async fn booking_delete(tx: &mut Tx<'_>, ctx: &OpCtx, id: i64) -> Result<()> {
    sqlx::query("DELETE FROM bookings WHERE tenant_id = $1 AND id = $2")
        .bind(ctx.tenant_id())
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

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

// ------------------------------------------------------------------ pending actions (R7)

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PendingRow {
    pub id: i64,
    pub handle: String,
    pub connection_id: i64,
    pub tool: String,
    pub args: Value,
    pub content_hash: String,
    pub summary: String,
    pub status: String,
    pub expired: bool,
    /// When the preview was made: durations in the preview are measured from here.
    pub created_at: DateTime<Utc>,
}

pub struct NewPending<'a> {
    pub handle: &'a str,
    pub connection_id: i64,
    pub tool: &'a str,
    pub args: &'a Value,
    pub args_digest: &'a str,
    pub content_hash: &'a str,
    pub summary: &'a str,
    pub token_hash: &'a [u8],
    pub ttl_seconds: i64,
    /// The instant the preview was planned at.
    pub previewed_at: DateTime<Utc>,
}

pub(crate) async fn pending_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    p: NewPending<'_>,
) -> Result<(i64, DateTime<Utc>)> {
    Ok(sqlx::query_as::<_, (i64, DateTime<Utc>)>(
        "INSERT INTO pending_actions (tenant_id, handle, connection_id, tool, args, args_digest,
                                      content_hash, summary, token_hash, expires_at, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now() + make_interval(secs => $10), $11)
         RETURNING id, expires_at",
    )
    .bind(ctx.tenant_id())
    .bind(p.handle)
    .bind(p.connection_id)
    .bind(p.tool)
    .bind(p.args)
    .bind(p.args_digest)
    .bind(p.content_hash)
    .bind(p.summary)
    .bind(p.token_hash)
    .bind(p.ttl_seconds as f64)
    .bind(p.previewed_at)
    .fetch_one(&mut **tx)
    .await?)
}

/// Finds a pending action of the tenant by token hash, takes its advisory lock for the rest of
/// the transaction, and reads it again under the lock.
pub(crate) async fn pending_lock_by_token(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    token_hash: &[u8],
) -> Result<Option<PendingRow>> {
    let id: Option<i64> = sqlx::query_scalar(
        "SELECT id FROM pending_actions WHERE tenant_id = $1 AND token_hash = $2",
    )
    .bind(ctx.tenant_id())
    .bind(token_hash)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(id) = id else { return Ok(None) };
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(id).execute(&mut **tx).await?;
    Ok(sqlx::query_as::<_, PendingRow>(
        "SELECT id, handle, connection_id, tool, args, content_hash, summary, status, expires_at,
                expires_at <= now() AS expired, created_at
         FROM pending_actions WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&mut **tx)
    .await?)
}

pub(crate) async fn pending_decide(
    tx: &mut Tx<'_>,
    id: i64,
    status: &str,
    result: Option<&Value>,
) -> Result<()> {
    sqlx::query(
        "UPDATE pending_actions SET status = $2, decided_at = now(), result = $3 WHERE id = $1",
    )
    .bind(id)
    .bind(status)
    .bind(result)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

// ------------------------------------------------------------------ business keys (R9)

/// Serializes, for this transaction, every write of the tenant that could claim the same
/// business key (a customer's email or phone), so that the duplicate guard's read and the
/// insert that follows it act as one step across workers.
pub(crate) async fn business_key_lock(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    kind: &str,
    key: &str,
) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, $2))")
        .bind(format!("key:{kind}:{key}"))
        .bind(ctx.tenant_id())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

// ------------------------------------------------------------------ replay cache (R8)

/// Serializes identical silent writes of one connection across workers for this transaction.
pub(crate) async fn replay_lock(
    tx: &mut Tx<'_>,
    connection_id: i64,
    tool: &str,
    digest: &str,
) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, $2))")
        .bind(format!("replay:{tool}:{digest}"))
        .bind(connection_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

pub(crate) async fn replay_find(
    tx: &mut Tx<'_>,
    connection_id: i64,
    tool: &str,
    digest: &str,
    window_secs: i64,
) -> Result<Option<Value>> {
    Ok(sqlx::query_scalar(
        "SELECT result FROM replay_entries
         WHERE connection_id = $1 AND tool = $2 AND args_digest = $3
           AND created_at > now() - make_interval(secs => $4)
         ORDER BY created_at DESC LIMIT 1",
    )
    .bind(connection_id)
    .bind(tool)
    .bind(digest)
    .bind(window_secs as f64)
    .fetch_optional(&mut **tx)
    .await?)
}

/// The entry recorded under an idempotency key: tool, digest and result.
pub(crate) async fn replay_find_key(
    tx: &mut Tx<'_>,
    connection_id: i64,
    key: &str,
) -> Result<Option<(String, String, Value)>> {
    Ok(sqlx::query_as::<_, (String, String, Value)>(
        "SELECT tool, args_digest, result FROM replay_entries WHERE connection_id = $1 AND idempotency_key = $2",
    )
    .bind(connection_id)
    .bind(key)
    .fetch_optional(&mut **tx)
    .await?)
}

pub(crate) async fn replay_insert(
    tx: &mut Tx<'_>,
    connection_id: i64,
    tool: &str,
    digest: &str,
    key: Option<&str>,
    result: &Value,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO replay_entries (connection_id, tool, args_digest, idempotency_key, result)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(connection_id)
    .bind(tool)
    .bind(digest)
    .bind(key)
    .bind(result)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

// ------------------------------------------------------------------ outbox

pub struct NewMessage<'a> {
    pub pending_action_id: Option<i64>,
    pub channel: &'a str,
    pub recipient: &'a str,
    pub subject: &'a str,
    pub body: &'a str,
    pub idempotency_key: &'a str,
}

pub(crate) async fn outbox_insert(tx: &mut Tx<'_>, ctx: &OpCtx, m: NewMessage<'_>) -> Result<()> {
    sqlx::query(
        "INSERT INTO outbox (tenant_id, pending_action_id, channel, recipient, subject, body, idempotency_key)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(ctx.tenant_id())
    .bind(m.pending_action_id)
    .bind(m.channel)
    .bind(m.recipient)
    .bind(m.subject)
    .bind(m.body)
    .bind(m.idempotency_key)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxRow {
    pub id: i64,
    pub channel: String,
    pub recipient: String,
    pub subject: String,
    pub body: String,
    pub idempotency_key: String,
    pub attempts: i32,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AuditRow {
    pub at: DateTime<Utc>,
    pub action: String,
    pub outcome: String,
    pub targets: Vec<String>,
}

impl Services {
    /// Claims up to `limit` queued messages (skipping rows another dispatcher holds) and
    /// hands them to `deliver` inside the claiming transaction; delivered rows are marked sent.
    pub(crate) async fn outbox_claim(&self, limit: i64) -> Result<(Tx<'static>, Vec<OutboxRow>)> {
        let mut tx = self.begin().await?;
        let rows = sqlx::query_as::<_, OutboxRow>(
            "SELECT id, channel, recipient, subject, body, idempotency_key, attempts FROM outbox
             WHERE status = 'queued' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        Ok((tx, rows))
    }

    pub(crate) async fn alert_rule_list(&self, ctx: &OpCtx) -> Result<Vec<AlertRuleRow>> {
        Ok(sqlx::query_as::<_, AlertRuleRow>(
            "SELECT id, handle, name, description, muted_until FROM alert_rules WHERE tenant_id = $1 ORDER BY name",
        )
        .bind(ctx.tenant_id())
        .fetch_all(self.pool())
        .await?)
    }

    pub(crate) async fn service_list(&self, ctx: &OpCtx) -> Result<Vec<ServiceRow>> {
        Ok(sqlx::query_as::<_, ServiceRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {SERVICE_COLUMNS} FROM services WHERE tenant_id = $1 ORDER BY name, handle"
        )))
        .bind(ctx.tenant_id())
        .fetch_all(self.pool())
        .await?)
    }

    /// What one connection did, newest first.
    pub(crate) async fn audit_for_connection(
        &self,
        ctx: &OpCtx,
        connection_id: i64,
        limit: i64,
    ) -> Result<Vec<AuditRow>> {
        Ok(sqlx::query_as::<_, AuditRow>(
            "SELECT at, action, outcome, targets, channel, connection_name, client_name FROM audit_log
             WHERE tenant_id = $1 AND connection_id = $2 ORDER BY at DESC, id DESC LIMIT $3",
        )
        .bind(ctx.tenant_id())
        .bind(connection_id)
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }
}

pub(crate) async fn outbox_mark(
    tx: &mut Tx<'_>,
    id: i64,
    sent: bool,
    error: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "UPDATE outbox SET attempts = attempts + 1, last_error = $3,
                status = CASE WHEN $2 THEN 'sent' WHEN attempts + 1 >= 5 THEN 'failed' ELSE 'queued' END,
                sent_at = CASE WHEN $2 THEN now() ELSE sent_at END
         WHERE id = $1",
    )
    .bind(id)
    .bind(sent)
    .bind(error)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AuditListRow {
    pub at: DateTime<Utc>,
    pub channel: String,
    pub action: String,
    pub outcome: String,
    pub targets: Vec<String>,
    pub connection_handle: Option<String>,
    pub connection_name: Option<String>,
    pub client_name: Option<String>,
    pub reason: Option<String>,
}

impl Services {
    pub(crate) async fn audit_list(
        &self,
        ctx: &OpCtx,
        connection: Option<&str>,
        limit: i64,
    ) -> Result<Vec<AuditListRow>> {
        Ok(sqlx::query_as::<_, AuditListRow>(
            "SELECT a.at, a.channel, a.action, a.outcome, a.targets, c.handle AS connection_handle,
                    a.connection_name, a.client_name, a.reason
             FROM audit_log a LEFT JOIN connections c ON c.id = a.connection_id
             WHERE a.tenant_id = $1 AND ($2::text IS NULL OR c.handle = $2)
             ORDER BY a.at DESC, a.id DESC LIMIT $3",
        )
        .bind(ctx.tenant_id())
        .bind(connection)
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxListRow {
    pub id: i64,
    pub channel: String,
    pub recipient: String,
    pub subject: String,
    pub status: String,
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
    pub sent_at: Option<DateTime<Utc>>,
    pub action_handle: Option<String>,
}

impl Services {
    /// The tenant's outgoing messages, newest first (the text stays out of lists).
    pub(crate) async fn outbox_list(&self, ctx: &OpCtx, limit: i64) -> Result<Vec<OutboxListRow>> {
        Ok(sqlx::query_as::<_, OutboxListRow>(
            "SELECT o.id, o.channel, o.recipient, o.subject, o.status, o.attempts, o.created_at, o.sent_at,
                    p.handle AS action_handle
             FROM outbox o LEFT JOIN pending_actions p ON p.id = o.pending_action_id
             WHERE o.tenant_id = $1 ORDER BY o.id DESC LIMIT $2",
        )
        .bind(ctx.tenant_id())
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }
}

impl Services {
    /// Counts one call in the current minute's window; returns the count, the limit (the
    /// tenant's override or `default_limit`) and the seconds until the window ends.
    pub(crate) async fn rate_take(
        &self,
        connection_id: i64,
        tenant_id: i64,
        class: &str,
        default_limit: i32,
    ) -> Result<(i32, i32, f64)> {
        Ok(sqlx::query_as::<_, (i32, i32, f64)>(
            "WITH up AS (
                 INSERT INTO rate_windows (connection_id, class, window_start, count)
                 VALUES ($1, $3, date_trunc('minute', now()), 1)
                 ON CONFLICT (connection_id, class, window_start) DO UPDATE SET count = rate_windows.count + 1
                 RETURNING count, window_start)
             SELECT up.count,
                    coalesce((SELECT per_minute FROM tenant_rate_limits WHERE tenant_id = $2 AND class = $3), $4),
                    extract(epoch FROM up.window_start + interval '1 minute' - now())::float8
             FROM up",
        )
        .bind(connection_id)
        .bind(tenant_id)
        .bind(class)
        .bind(default_limit)
        .fetch_one(self.pool())
        .await?)
    }

    /// Drops what has outlived its use: rate windows older than an hour, replay entries older
    /// than a day (the replay window is minutes), expired console sessions, sign-in failures
    /// older than a day, expired authorization codes and tokens expired for a day. Returns the
    /// rows removed.
    pub(crate) async fn housekeeping(&self) -> Result<u64> {
        let mut removed = 0;
        for sql in [
            "DELETE FROM rate_windows WHERE window_start < now() - interval '1 hour'",
            "DELETE FROM replay_entries WHERE created_at < now() - interval '1 day'",
            "DELETE FROM console_sessions WHERE expires_at < now()",
            "DELETE FROM login_failures WHERE at < now() - interval '1 day'",
            "DELETE FROM oauth_codes WHERE expires_at < now() - interval '1 hour'",
            // Expired access and refresh tokens (a used refresh token is kept until it expires,
            // to detect reuse).
            "DELETE FROM connection_tokens WHERE expires_at < now() - interval '1 day'",
        ] {
            removed += sqlx::query(sql).execute(self.pool()).await?.rows_affected();
        }
        Ok(removed)
    }
}
