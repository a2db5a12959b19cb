//! The outbox: messages written with their action, delivered by the dispatcher.

use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

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
        "INSERT INTO outbox (tenant_id, pending_action_id, channel, recipient, subject, body, idempotency_key, traceparent)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(ctx.tenant_id())
    .bind(m.pending_action_id)
    .bind(m.channel)
    .bind(m.recipient)
    .bind(m.subject)
    .bind(m.body)
    .bind(m.idempotency_key)
    // The trace of the call that queued it, so its delivery joins that trace.
    .bind(crate::telemetry::current_traceparent())
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
    pub traceparent: Option<String>,
}

/// How long a message is leased to the dispatcher that claimed it, from the claim and again
/// from the start of its delivery: a dispatcher that stopped leaves its messages to others after
/// this long.
pub const OUTBOX_LEASE: std::time::Duration = std::time::Duration::from_secs(90);

/// Attempts after which a message is given up (`failed`).
const OUTBOX_ATTEMPTS: i32 = 5;

impl Services {
    /// Leases up to `limit` due messages (skipping rows another dispatcher is claiming this
    /// instant) to `token`, in a statement of its own: no transaction stays open while they are
    /// delivered. A due message whose fifth attempt started and never finished (a delivery that
    /// took its process down) is given up instead.
    pub(crate) async fn job_outbox_claim(&self, limit: i64, token: i64) -> Result<Vec<OutboxRow>> {
        let mut rows = sqlx::query_as::<_, OutboxRow>(
            "WITH due AS (
                 SELECT id, attempts FROM outbox WHERE status = 'queued' AND due_at <= now()
                 ORDER BY due_at, id LIMIT $1 FOR UPDATE SKIP LOCKED),
             given_up AS (
                 UPDATE outbox SET status = 'failed', lease_token = NULL,
                        last_error = coalesce(last_error || '; ', '') || 'its fifth attempt never finished'
                 WHERE id IN (SELECT id FROM due WHERE attempts >= $4))
             UPDATE outbox o SET lease_token = $2, due_at = now() + make_interval(secs => $3)
             WHERE o.id IN (SELECT id FROM due WHERE attempts < $4)
             RETURNING o.id, o.channel, o.recipient, o.subject, o.body, o.idempotency_key, o.attempts,
                       o.traceparent",
        )
        .bind(limit)
        .bind(token)
        .bind(OUTBOX_LEASE.as_secs_f64())
        .bind(OUTBOX_ATTEMPTS)
        .fetch_all(self.pool())
        .await?;
        // In the order they were queued: `RETURNING` keeps none.
        rows.sort_by_key(|r| r.id);
        Ok(rows)
    }

    /// Starts an attempt at a message leased to `token`: counts it and renews the lease.
    /// Returns the attempt's number, or `None` when the lease is another dispatcher's now.
    pub(crate) async fn job_outbox_start(&self, id: i64, token: i64) -> Result<Option<i32>> {
        Ok(sqlx::query_scalar(
            "UPDATE outbox SET attempts = attempts + 1, due_at = now() + make_interval(secs => $3)
             WHERE id = $1 AND lease_token = $2 AND status = 'queued'
             RETURNING attempts",
        )
        .bind(id)
        .bind(token)
        .bind(OUTBOX_LEASE.as_secs_f64())
        .fetch_optional(self.pool())
        .await?)
    }

    /// Records how attempt `attempt` of a message leased to `token` ended, and ends the lease:
    /// sent; or failed, retried after a pause that doubles (30 s, 1, 2, 4 min), given up after
    /// the fifth. Whether the lease was still `token`'s (`false`: another dispatcher's now, and
    /// the row is left to it).
    pub(crate) async fn job_outbox_mark(
        &self,
        id: i64,
        token: i64,
        attempt: i32,
        error: Option<&str>,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE outbox SET last_error = $4,
                    status = CASE WHEN $4 IS NULL THEN 'sent' WHEN $3 >= $5 THEN 'failed' ELSE 'queued' END,
                    sent_at = CASE WHEN $4 IS NULL THEN now() ELSE sent_at END,
                    lease_token = NULL,
                    due_at = now() + make_interval(secs => 30 * power(2.0::float8, ($3 - 1)::float8))
             WHERE id = $1 AND lease_token = $2",
        )
        .bind(id)
        .bind(token)
        .bind(attempt)
        .bind(error)
        .bind(OUTBOX_ATTEMPTS)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Ends the leases `token` still holds (messages not attempted this round), so the next
    /// round takes them at once.
    pub(crate) async fn job_outbox_release(&self, token: i64) -> Result<()> {
        sqlx::query(
            "UPDATE outbox SET lease_token = NULL, due_at = now()
             WHERE lease_token = $1 AND status = 'queued'",
        )
        .bind(token)
        .execute(self.pool())
        .await?;
        Ok(())
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

/// What a search of the tenant's messages asks for.
#[derive(Debug, Default, Clone, Copy)]
pub struct OutboxQuery<'a> {
    /// Part of the recipient or the subject.
    pub text: Option<&'a str>,
    /// `queued`, `sent` or `failed`.
    pub status: Option<&'a str>,
    /// `email` or `page`.
    pub channel: Option<&'a str>,
    /// The last message of the previous page.
    pub before_id: Option<i64>,
}

impl Services {
    /// A page of the tenant's outgoing messages, newest first, searched and filtered in SQL
    /// (the text stays out of lists).
    pub(crate) async fn outbox_search(
        &self,
        ctx: &OpCtx,
        q: &OutboxQuery<'_>,
        limit: i64,
    ) -> Result<Vec<OutboxListRow>> {
        Ok(sqlx::query_as::<_, OutboxListRow>(
            "SELECT o.id, o.channel, o.recipient, o.subject, o.status, o.attempts, o.created_at, o.sent_at,
                    p.handle AS action_handle
             FROM outbox o LEFT JOIN pending_actions p ON p.id = o.pending_action_id
             WHERE o.tenant_id = $1
               AND ($2::text IS NULL OR strpos(lower(o.recipient || ' ' || o.subject), lower($2)) > 0)
               AND ($3::text IS NULL OR o.status = $3)
               AND ($4::text IS NULL OR o.channel = $4)
               AND ($5::bigint IS NULL OR o.id < $5)
             ORDER BY o.id DESC LIMIT $6",
        )
        .bind(ctx.tenant_id())
        .bind(q.text)
        .bind(q.status)
        .bind(q.channel)
        .bind(q.before_id)
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }
}

/// What waits in the outbox, for the control plane's metrics.
#[derive(Debug, Clone, Copy, Default, sqlx::FromRow)]
pub struct OutboxBacklog {
    /// Messages queued for delivery.
    pub queued: i64,
    /// Seconds the oldest queued message has waited.
    pub oldest_secs: f64,
    /// Messages given up on after their last attempt.
    pub failed: i64,
}

impl Services {
    pub(crate) async fn platform_outbox_backlog(&self) -> Result<OutboxBacklog> {
        Ok(sqlx::query_as::<_, OutboxBacklog>(
            "SELECT (SELECT count(*) FROM outbox WHERE status = 'queued') AS queued,
                    coalesce((SELECT extract(epoch FROM now() - min(created_at))::float8
                              FROM outbox WHERE status = 'queued'), 0) AS oldest_secs,
                    (SELECT count(*) FROM outbox WHERE status = 'failed') AS failed",
        )
        .fetch_one(self.pool())
        .await?)
    }
}
