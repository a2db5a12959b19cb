//! The audit log's hash chain, its signed checkpoints and the tenant's SIEM webhook (R19).
//! Rows are chained by the control plane after they commit (`job_`), read for verification
//! with the reader's context, and never updated or deleted here but by retention.

use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

/// Every column an audit row's hash commits to (docs/operations.md, "Verifying the audit log").
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AuditContent {
    pub id: i64,
    pub tenant_id: i64,
    pub tenant_handle: Option<String>,
    pub at: DateTime<Utc>,
    pub channel: String,
    pub actor_id: Option<i64>,
    pub actor_handle: Option<String>,
    pub connection_id: Option<i64>,
    pub connection_handle: Option<String>,
    pub connection_name: Option<String>,
    pub client_name: Option<String>,
    pub action: String,
    pub outcome: String,
    pub targets: Vec<String>,
    pub request_id: Option<String>,
    pub pending_action_id: Option<i64>,
    pub pending_handle: Option<String>,
    pub reason: Option<String>,
    pub proof: Option<serde_json::Value>,
    /// What a settings change changed (absent on rows before it was kept).
    pub change: Option<serde_json::Value>,
    /// The policy set behind an agent's decision (absent with no set, and before it was kept).
    pub policy: Option<serde_json::Value>,
}

/// The columns of [`AuditContent`], with the public handles the version 2 form names (each
/// a primary-key lookup; none of those rows is ever deleted).
const CONTENT_COLUMNS: &str = "a.id, a.tenant_id, a.at, a.channel, a.actor_id, a.connection_id, a.connection_name,
     a.client_name, a.action, a.outcome, a.targets, a.request_id, a.pending_action_id, a.reason, a.proof, a.change, a.policy,
     (SELECT handle FROM tenants WHERE id = a.tenant_id) AS tenant_handle,
     (SELECT handle FROM people WHERE id = a.actor_id) AS actor_handle,
     (SELECT handle FROM connections WHERE id = a.connection_id) AS connection_handle,
     (SELECT handle FROM pending_actions WHERE id = a.pending_action_id) AS pending_handle";

/// One link of a chain as stored, with its row's content when the row is still there.
#[derive(Debug, Clone)]
pub struct ChainLinkRow {
    pub audit_id: i64,
    pub seq: i64,
    /// The canonical form's version the link hashes.
    pub v: i16,
    pub prev_hash: Vec<u8>,
    pub hash: Vec<u8>,
    pub content: Option<AuditContent>,
}

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for ChainLinkRow {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> std::result::Result<Self, sqlx::Error> {
        use sqlx::Row as _;
        let present: Option<i64> = row.try_get("id")?;
        Ok(ChainLinkRow {
            audit_id: row.try_get("audit_id")?,
            seq: row.try_get("seq")?,
            v: row.try_get("v")?,
            prev_hash: row.try_get("prev_hash")?,
            hash: row.try_get("hash")?,
            content: match present {
                Some(_) => Some(AuditContent::from_row(row)?),
                None => None,
            },
        })
    }
}

/// A link the chainer writes.
#[derive(Debug, Clone)]
pub struct NewLink {
    pub audit_id: i64,
    pub seq: i64,
    pub v: i16,
    pub prev_hash: Vec<u8>,
    pub hash: Vec<u8>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CheckpointRow {
    pub tenant_id: i64,
    pub tenant_handle: String,
    pub seq: i64,
    pub head_hash: Vec<u8>,
    pub signed_at: DateTime<Utc>,
    pub kid: String,
    pub signature: Vec<u8>,
    pub v: i16,
    pub prev_seq: Option<i64>,
    pub prev_digest: Option<Vec<u8>>,
    /// As stored; verifiers recompute it and compare.
    pub digest: Option<Vec<u8>>,
}

const CHECKPOINT_COLUMNS: &str =
    "c.tenant_id, t.handle AS tenant_handle, c.seq, c.head_hash, c.signed_at, c.kid,
     c.signature, c.v, c.prev_seq, c.prev_digest, c.digest";

/// A tenant whose chain the signer looks at: its head and its last checkpoint as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CheckpointCandidate {
    pub tenant_id: i64,
    pub tenant_handle: String,
    pub tenant_slug: String,
    pub head_seq: i64,
    pub last_seq: Option<i64>,
    pub last_digest: Option<Vec<u8>>,
}

/// Where a tenant's chain ends, for the chainer.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ChainHead {
    pub seq: i64,
    pub hash: Vec<u8>,
}

impl Services {
    /// Tenants with rows waiting to be chained.
    pub(crate) async fn job_audit_tenants_unchained(&self) -> Result<Vec<i64>> {
        Ok(sqlx::query_scalar("SELECT DISTINCT tenant_id FROM audit_unchained")
            .fetch_all(self.pool())
            .await?)
    }

    /// Locks a tenant's chain head (creating it at the genesis) and reads up to `limit` rows
    /// waiting to be chained, in id order. Two chainers never chain one tenant at once.
    pub(crate) async fn job_audit_chain_claim(
        &self,
        tenant_id: i64,
        limit: i64,
    ) -> Result<(Tx<'static>, ChainHead, Vec<AuditContent>)> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO audit_chain_heads (tenant_id, seq, hash) VALUES ($1, 0, $2)
             ON CONFLICT (tenant_id) DO NOTHING",
        )
        .bind(tenant_id)
        .bind(vec![0u8; 32])
        .execute(&mut *tx)
        .await?;
        let head = sqlx::query_as::<_, ChainHead>(
            "SELECT seq, hash FROM audit_chain_heads WHERE tenant_id = $1 FOR UPDATE",
        )
        .bind(tenant_id)
        .fetch_one(&mut *tx)
        .await?;
        let rows = sqlx::query_as::<_, AuditContent>(sqlx::AssertSqlSafe(format!(
            "SELECT {CONTENT_COLUMNS} FROM audit_unchained q JOIN audit_log a ON a.id = q.audit_id
             WHERE q.tenant_id = $1 ORDER BY q.audit_id LIMIT $2"
        )))
        .bind(tenant_id)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        Ok((tx, head, rows))
    }
}

/// Appends links to a tenant's chain, moves its head and takes the rows off the queue.
pub(crate) async fn job_audit_chain_append(
    tx: &mut Tx<'_>,
    tenant_id: i64,
    links: &[NewLink],
) -> Result<()> {
    let Some(last) = links.last() else { return Ok(()) };
    let ids: Vec<i64> = links.iter().map(|l| l.audit_id).collect();
    let seqs: Vec<i64> = links.iter().map(|l| l.seq).collect();
    let prevs: Vec<Vec<u8>> = links.iter().map(|l| l.prev_hash.clone()).collect();
    let hashes: Vec<Vec<u8>> = links.iter().map(|l| l.hash.clone()).collect();
    sqlx::query(
        "INSERT INTO audit_chain (audit_id, tenant_id, seq, prev_hash, hash, v)
         SELECT i, $1, s, p, h, v FROM unnest($2::bigint[], $3::bigint[], $4::bytea[], $5::bytea[], $6::smallint[]) AS u(i, s, p, h, v)",
    )
    .bind(tenant_id)
    .bind(&ids)
    .bind(&seqs)
    .bind(&prevs)
    .bind(&hashes)
    .bind(links.iter().map(|l| l.v).collect::<Vec<i16>>())
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "UPDATE audit_chain_heads SET seq = $2, hash = $3, chained_at = now() WHERE tenant_id = $1",
    )
    .bind(tenant_id)
    .bind(last.seq)
    .bind(&last.hash)
    .execute(&mut **tx)
    .await?;
    sqlx::query("DELETE FROM audit_unchained WHERE audit_id = ANY($1)")
        .bind(&ids)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

impl Services {
    /// Every tenant with a chain: its head, and its last checkpoint as stored.
    pub(crate) async fn job_audit_checkpoint_candidates(&self) -> Result<Vec<CheckpointCandidate>> {
        Ok(sqlx::query_as::<_, CheckpointCandidate>(
            "SELECT h.tenant_id, t.handle AS tenant_handle, t.slug AS tenant_slug, h.seq AS head_seq,
                    c.seq AS last_seq, c.digest AS last_digest
             FROM audit_chain_heads h JOIN tenants t ON t.id = h.tenant_id
             LEFT JOIN LATERAL (SELECT seq, digest FROM audit_checkpoints c
                                WHERE c.tenant_id = h.tenant_id ORDER BY seq DESC LIMIT 1) c ON true
             ORDER BY h.tenant_id",
        )
        .fetch_all(self.pool())
        .await?)
    }

    /// A tenant's checkpoints from position `from` on, oldest first.
    pub(crate) async fn job_audit_checkpoints_from(
        &self,
        tenant_id: i64,
        from: i64,
    ) -> Result<Vec<CheckpointRow>> {
        Ok(sqlx::query_as::<_, CheckpointRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints c JOIN tenants t ON t.id = c.tenant_id
             WHERE c.tenant_id = $1 AND c.seq >= $2 ORDER BY c.seq"
        )))
        .bind(tenant_id)
        .bind(from)
        .fetch_all(self.pool())
        .await?)
    }

    /// A tenant's version 2 checkpoints after position `after` (for its webhook), oldest first.
    pub(crate) async fn job_audit_checkpoints_after(
        &self,
        tenant_id: i64,
        after: i64,
    ) -> Result<Vec<CheckpointRow>> {
        Ok(sqlx::query_as::<_, CheckpointRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints c JOIN tenants t ON t.id = c.tenant_id
             WHERE c.tenant_id = $1 AND c.seq > $2 AND c.v >= 2 ORDER BY c.seq LIMIT 100"
        )))
        .bind(tenant_id)
        .bind(after)
        .fetch_all(self.pool())
        .await?)
    }

    /// Stores a checkpoint; false when one is already at that position.
    pub(crate) async fn job_audit_checkpoint_insert(&self, c: &CheckpointRow) -> Result<bool> {
        let done = sqlx::query(
            "INSERT INTO audit_checkpoints (tenant_id, seq, head_hash, signed_at, kid, signature, v, prev_seq, prev_digest, digest)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (tenant_id, seq) DO NOTHING",
        )
        .bind(c.tenant_id)
        .bind(c.seq)
        .bind(&c.head_hash)
        .bind(c.signed_at)
        .bind(&c.kid)
        .bind(&c.signature)
        .bind(c.v)
        .bind(c.prev_seq)
        .bind(&c.prev_digest)
        .bind(&c.digest)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// A tenant's links with `after < seq <= through`, in chain order, each with its row's
    /// content (or none when the row is gone).
    pub(crate) async fn job_audit_chain_links(
        &self,
        tenant_id: i64,
        after: i64,
        through: Option<i64>,
        limit: i64,
    ) -> Result<Vec<ChainLinkRow>> {
        Ok(sqlx::query_as::<_, ChainLinkRow>(sqlx::AssertSqlSafe(format!(
            "SELECT c.audit_id, c.seq, c.v, c.prev_hash, c.hash, {CONTENT_COLUMNS}
             FROM audit_chain c LEFT JOIN audit_log a ON a.id = c.audit_id
             WHERE c.tenant_id = $1 AND c.seq > $2 AND ($3::bigint IS NULL OR c.seq <= $3)
             ORDER BY c.seq LIMIT $4"
        )))
        .bind(tenant_id)
        .bind(after)
        .bind(through)
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    /// How long the oldest row waiting to be chained has waited (seconds; 0 when none).
    pub(crate) async fn job_audit_chain_lag(&self) -> Result<f64> {
        Ok(sqlx::query_scalar(
            "SELECT coalesce(extract(epoch FROM now() - min(queued_at))::float8, 0) FROM audit_unchained",
        )
        .fetch_one(self.pool())
        .await?)
    }

    /// How far retention removed the tenant's chain, from its own `audit.prune` rows
    /// (their reason says `N rows through SEQ`); 0 when it never ran.
    pub(crate) async fn audit_pruned_through(&self, ctx: &OpCtx) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT coalesce(max(substring(reason FROM 'through ([0-9]+)$')::bigint), 0)
             FROM audit_log WHERE tenant_id = $1 AND action = 'audit.prune'",
        )
        .bind(ctx.tenant_id())
        .fetch_one(self.pool())
        .await?)
    }

    /// The tenant's handle.
    pub(crate) async fn audit_tenant_handle(&self, ctx: &OpCtx) -> Result<String> {
        Ok(sqlx::query_scalar("SELECT handle FROM tenants WHERE id = $1")
            .bind(ctx.tenant_id())
            .fetch_one(self.pool())
            .await?)
    }

    /// Chained rows after position `covered` that were chained more than `secs` ago: how many,
    /// the first position and the oldest chaining time.
    pub(crate) async fn audit_unanchored(
        &self,
        ctx: &OpCtx,
        covered: i64,
        secs: i64,
    ) -> Result<Option<(i64, i64, DateTime<Utc>)>> {
        let row: (i64, Option<i64>, Option<DateTime<Utc>>) = sqlx::query_as(
            "SELECT count(*), min(seq), min(chained_at) FROM audit_chain
             WHERE tenant_id = $1 AND seq > $2 AND chained_at < now() - make_interval(secs => $3)",
        )
        .bind(ctx.tenant_id())
        .bind(covered)
        .bind(secs as f64)
        .fetch_one(self.pool())
        .await?;
        Ok(match row {
            (n, Some(seq), Some(at)) if n > 0 => Some((n, seq, at)),
            _ => None,
        })
    }

    /// A tenant's published checkpoints (version 2) after `after`, by the tenant's handle;
    /// `None` when no tenant has that handle.
    pub(crate) async fn platform_audit_checkpoints_published(
        &self,
        tenant_handle: &str,
        after: i64,
        limit: i64,
    ) -> Result<Option<Vec<CheckpointRow>>> {
        let Some(tenant_id) =
            sqlx::query_scalar::<_, i64>("SELECT id FROM tenants WHERE handle = $1")
                .bind(tenant_handle)
                .fetch_optional(self.pool())
                .await?
        else {
            return Ok(None);
        };
        Ok(Some(
            sqlx::query_as::<_, CheckpointRow>(sqlx::AssertSqlSafe(format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints c JOIN tenants t ON t.id = c.tenant_id
                 WHERE c.tenant_id = $1 AND c.seq > $2 AND c.v >= 2 ORDER BY c.seq LIMIT $3"
            )))
            .bind(tenant_id)
            .bind(after)
            .bind(limit)
            .fetch_all(self.pool())
            .await?,
        ))
    }

    /// The tenant's checkpoints, oldest first.
    pub(crate) async fn audit_checkpoints(&self, ctx: &OpCtx) -> Result<Vec<CheckpointRow>> {
        Ok(sqlx::query_as::<_, CheckpointRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints c JOIN tenants t ON t.id = c.tenant_id
             WHERE c.tenant_id = $1 ORDER BY c.seq"
        )))
        .bind(ctx.tenant_id())
        .fetch_all(self.pool())
        .await?)
    }

    /// Rows of the tenant's log that are neither chained nor waiting to be: written behind the
    /// chain's back (the queueing trigger off), oldest first.
    pub(crate) async fn audit_outside_chain(
        &self,
        ctx: &OpCtx,
        limit: i64,
    ) -> Result<Vec<AuditContent>> {
        Ok(sqlx::query_as::<_, AuditContent>(sqlx::AssertSqlSafe(format!(
            "SELECT {CONTENT_COLUMNS} FROM audit_log a
             WHERE a.tenant_id = $1
               AND NOT EXISTS (SELECT 1 FROM audit_chain c WHERE c.audit_id = a.id)
               AND NOT EXISTS (SELECT 1 FROM audit_unchained q WHERE q.audit_id = a.id)
             ORDER BY a.id LIMIT $2"
        )))
        .bind(ctx.tenant_id())
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    /// How many of the tenant's rows wait to be chained.
    pub(crate) async fn audit_unchained_count(&self, ctx: &OpCtx) -> Result<i64> {
        Ok(sqlx::query_scalar("SELECT count(*) FROM audit_unchained WHERE tenant_id = $1")
            .bind(ctx.tenant_id())
            .fetch_one(self.pool())
            .await?)
    }

    /// The chain links of the given audit rows (for the CSV export), keyed by audit id.
    pub(crate) async fn audit_links_of(
        &self,
        ctx: &OpCtx,
        ids: &[i64],
    ) -> Result<Vec<(i64, i64, i16, Vec<u8>, Vec<u8>)>> {
        Ok(sqlx::query_as(
            "SELECT audit_id, seq, v, prev_hash, hash FROM audit_chain WHERE tenant_id = $1 AND audit_id = ANY($2)",
        )
        .bind(ctx.tenant_id())
        .bind(ids)
        .fetch_all(self.pool())
        .await?)
    }

    /// The content of the given audit rows of the tenant (for the CSV export).
    pub(crate) async fn audit_contents_of(
        &self,
        ctx: &OpCtx,
        ids: &[i64],
    ) -> Result<Vec<AuditContent>> {
        Ok(sqlx::query_as::<_, AuditContent>(sqlx::AssertSqlSafe(format!(
            "SELECT {CONTENT_COLUMNS} FROM audit_log a WHERE a.tenant_id = $1 AND a.id = ANY($2)"
        )))
        .bind(ctx.tenant_id())
        .bind(ids)
        .fetch_all(self.pool())
        .await?)
    }
}

// ------------------------------------------------------------------ the SIEM webhook

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AuditWebhookRow {
    pub url: String,
    pub secret_sealed: String,
    pub previous_sealed: Option<String>,
    pub previous_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub rotated_at: Option<DateTime<Utc>>,
    pub delivered_seq: i64,
    pub delivered_checkpoint_seq: i64,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_error: Option<String>,
    pub failing_since: Option<DateTime<Utc>>,
    pub last_delivered_at: Option<DateTime<Utc>>,
    pub dropped_events: i64,
    pub dropped_note: Option<String>,
}

const WEBHOOK_COLUMNS: &str = "w.url, w.secret_sealed, w.previous_sealed, w.previous_until, w.created_at, w.rotated_at,
     w.delivered_seq, w.delivered_checkpoint_seq, w.attempts, w.next_attempt_at, w.last_error, w.failing_since,
     w.last_delivered_at, w.dropped_events, w.dropped_note";

impl Services {
    pub(crate) async fn audit_webhook_get(&self, ctx: &OpCtx) -> Result<Option<AuditWebhookRow>> {
        self.job_audit_webhook_of(ctx.tenant_id()).await
    }

    pub(crate) async fn job_audit_webhook_of(
        &self,
        tenant_id: i64,
    ) -> Result<Option<AuditWebhookRow>> {
        Ok(sqlx::query_as::<_, AuditWebhookRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {WEBHOOK_COLUMNS} FROM audit_webhooks w WHERE w.tenant_id = $1"
        )))
        .bind(tenant_id)
        .fetch_optional(self.pool())
        .await?)
    }

    /// The tenant's chain head now (0 when nothing is chained yet).
    pub(crate) async fn audit_head_seq(&self, ctx: &OpCtx) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT coalesce((SELECT seq FROM audit_chain_heads WHERE tenant_id = $1), 0)",
        )
        .bind(ctx.tenant_id())
        .fetch_one(self.pool())
        .await?)
    }

    /// Tenants whose webhook has events or checkpoints to deliver, is due, and is not held.
    pub(crate) async fn job_audit_webhooks_due(&self) -> Result<Vec<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT w.tenant_id FROM audit_webhooks w LEFT JOIN audit_chain_heads h ON h.tenant_id = w.tenant_id
             WHERE w.next_attempt_at <= now() AND (w.lease_until IS NULL OR w.lease_until < now())
               AND (coalesce(h.seq, 0) > w.delivered_seq
                    OR EXISTS (SELECT 1 FROM audit_checkpoints c WHERE c.tenant_id = w.tenant_id
                               AND c.seq > w.delivered_checkpoint_seq AND c.v >= 2))
             ORDER BY w.tenant_id",
        )
        .fetch_all(self.pool())
        .await?)
    }

    /// Takes the tenant's webhook for one delivery round (a lease with a token, committed at
    /// once: no transaction stays open while the endpoint is called). `None` when it is not
    /// due or another delivery holds it. Returns the webhook and the tenant's handle.
    pub(crate) async fn job_audit_webhook_lease(
        &self,
        tenant_id: i64,
        token: &str,
        lease_secs: i64,
    ) -> Result<Option<(AuditWebhookRow, String)>> {
        let row = sqlx::query_as::<_, AuditWebhookRow>(sqlx::AssertSqlSafe(format!(
            "UPDATE audit_webhooks w SET lease_token = $2, lease_until = now() + make_interval(secs => $3)
             WHERE w.tenant_id = $1 AND w.next_attempt_at <= now()
               AND (w.lease_until IS NULL OR w.lease_until < now())
             RETURNING {WEBHOOK_COLUMNS}"
        )))
        .bind(tenant_id)
        .bind(token)
        .bind(lease_secs as f64)
        .fetch_optional(self.pool())
        .await?;
        let Some(row) = row else { return Ok(None) };
        let handle: String = sqlx::query_scalar("SELECT handle FROM tenants WHERE id = $1")
            .bind(tenant_id)
            .fetch_one(self.pool())
            .await?;
        Ok(Some((row, handle)))
    }

    /// The next `limit` events after the cursor, in chain order.
    pub(crate) async fn job_audit_webhook_events(
        &self,
        tenant_id: i64,
        after: i64,
        limit: i64,
    ) -> Result<Vec<ChainLinkRow>> {
        self.job_audit_chain_links(tenant_id, after, None, limit).await
    }

    /// Moves the cursors after an event or checkpoint the endpoint took, and extends the lease
    /// (only while this delivery holds it).
    pub(crate) async fn job_audit_webhook_advance(
        &self,
        tenant_id: i64,
        token: &str,
        delivered_seq: i64,
        delivered_checkpoint_seq: i64,
        lease_secs: i64,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE audit_webhooks SET delivered_seq = greatest(delivered_seq, $3),
                    delivered_checkpoint_seq = greatest(delivered_checkpoint_seq, $4),
                    last_delivered_at = now(), lease_until = now() + make_interval(secs => $5)
             WHERE tenant_id = $1 AND lease_token = $2",
        )
        .bind(tenant_id)
        .bind(token)
        .bind(delivered_seq)
        .bind(delivered_checkpoint_seq)
        .bind(lease_secs as f64)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Ends a delivery round: releases the lease and, on failure, records the attempt, the
    /// error and when to try again.
    pub(crate) async fn job_audit_webhook_release(
        &self,
        tenant_id: i64,
        token: &str,
        failure: Option<(&str, i64)>,
    ) -> Result<()> {
        match failure {
            None => sqlx::query(
                "UPDATE audit_webhooks SET attempts = 0, last_error = NULL, failing_since = NULL,
                        next_attempt_at = now(), lease_token = NULL, lease_until = NULL
                 WHERE tenant_id = $1 AND lease_token = $2",
            )
            .bind(tenant_id)
            .bind(token)
            .execute(self.pool())
            .await?,
            Some((error, backoff_ms)) => {
                sqlx::query(
                    "UPDATE audit_webhooks SET attempts = attempts + 1, last_error = $3,
                        failing_since = coalesce(failing_since, now()),
                        next_attempt_at = now() + make_interval(secs => $4),
                        lease_token = NULL, lease_until = NULL
                 WHERE tenant_id = $1 AND lease_token = $2",
                )
                .bind(tenant_id)
                .bind(token)
                .bind(error)
                .bind(backoff_ms as f64 / 1000.0)
                .execute(self.pool())
                .await?
            }
        };
        Ok(())
    }

    /// Skips events older than the bounded age: moves the cursor past them and notes what
    /// was dropped for the console.
    pub(crate) async fn job_audit_webhook_drop(
        &self,
        tenant_id: i64,
        token: &str,
        to_seq: i64,
        count: i64,
        note: &str,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE audit_webhooks SET delivered_seq = $3, dropped_events = dropped_events + $4, dropped_note = $5
             WHERE tenant_id = $1 AND lease_token = $2",
        )
        .bind(tenant_id)
        .bind(token)
        .bind(to_seq)
        .bind(count)
        .bind(note)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Per tenant with a webhook: events not yet delivered and the age of the oldest (metrics).
    pub(crate) async fn platform_audit_webhook_backlog(&self) -> Result<Vec<(String, i64, f64)>> {
        Ok(sqlx::query_as(
            "SELECT t.slug, greatest(coalesce(h.seq, 0) - w.delivered_seq, 0),
                    coalesce(extract(epoch FROM now() - (SELECT a.at FROM audit_chain c JOIN audit_log a ON a.id = c.audit_id
                        WHERE c.tenant_id = w.tenant_id AND c.seq = w.delivered_seq + 1))::float8, 0)
             FROM audit_webhooks w JOIN tenants t ON t.id = w.tenant_id
             LEFT JOIN audit_chain_heads h ON h.tenant_id = w.tenant_id",
        )
        .fetch_all(self.pool())
        .await?)
    }
}

/// Creates or replaces the tenant's webhook; deliveries start after the current chain head.
pub(crate) async fn audit_webhook_put(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    url: &str,
    secret_sealed: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO audit_webhooks (tenant_id, url, secret_sealed, delivered_seq, delivered_checkpoint_seq)
         VALUES ($1, $2, $3, coalesce((SELECT seq FROM audit_chain_heads WHERE tenant_id = $1), 0),
                 coalesce((SELECT max(seq) FROM audit_checkpoints WHERE tenant_id = $1), 0))
         ON CONFLICT (tenant_id) DO UPDATE SET url = EXCLUDED.url, attempts = 0, next_attempt_at = now(),
             last_error = NULL, failing_since = NULL",
    )
    .bind(ctx.tenant_id())
    .bind(url)
    .bind(secret_sealed)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A new secret; the previous one keeps signing beside it until `previous_until`.
pub(crate) async fn audit_webhook_rotate(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    secret_sealed: &str,
    overlap_secs: i64,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE audit_webhooks SET previous_sealed = secret_sealed, secret_sealed = $2,
                previous_until = now() + make_interval(secs => $3), rotated_at = now()
         WHERE tenant_id = $1",
    )
    .bind(ctx.tenant_id())
    .bind(secret_sealed)
    .bind(overlap_secs as f64)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub(crate) async fn audit_webhook_delete(tx: &mut Tx<'_>, ctx: &OpCtx) -> Result<bool> {
    let done = sqlx::query("DELETE FROM audit_webhooks WHERE tenant_id = $1")
        .bind(ctx.tenant_id())
        .execute(&mut **tx)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Retention: removes the tenant's log rows and their links up to chain position `through`
/// (a signed checkpoint's head), in one transaction that says it is retention (the only
/// delete the append-only trigger lets through). Returns how many rows went.
pub(crate) async fn audit_prune(tx: &mut Tx<'_>, ctx: &OpCtx, through: i64) -> Result<u64> {
    sqlx::query("SELECT set_config('gatehouse.audit_retention', 'on', true)")
        .execute(&mut **tx)
        .await?;
    let removed = sqlx::query(
        "WITH gone AS (DELETE FROM audit_chain WHERE tenant_id = $1 AND seq <= $2 RETURNING audit_id)
         DELETE FROM audit_log WHERE tenant_id = $1 AND id IN (SELECT audit_id FROM gone)",
    )
    .bind(ctx.tenant_id())
    .bind(through)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    sqlx::query("SELECT set_config('gatehouse.audit_retention', 'off', true)")
        .execute(&mut **tx)
        .await?;
    Ok(removed)
}

/// The last chain position of the tenant whose row was written before `before`.
pub(crate) async fn audit_last_seq_before(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    before: DateTime<Utc>,
) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar::<_, Option<i64>>(
        "SELECT max(c.seq) FROM audit_chain c JOIN audit_log a ON a.id = c.audit_id
         WHERE c.tenant_id = $1 AND a.at < $2",
    )
    .bind(ctx.tenant_id())
    .bind(before)
    .fetch_one(&mut **tx)
    .await?)
}
