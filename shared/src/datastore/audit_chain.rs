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
    pub at: DateTime<Utc>,
    pub channel: String,
    pub actor_id: Option<i64>,
    pub connection_id: Option<i64>,
    pub connection_name: Option<String>,
    pub client_name: Option<String>,
    pub action: String,
    pub outcome: String,
    pub targets: Vec<String>,
    pub request_id: Option<String>,
    pub pending_action_id: Option<i64>,
    pub reason: Option<String>,
    pub proof: Option<serde_json::Value>,
}

const CONTENT_COLUMNS: &str = "a.id, a.tenant_id, a.at, a.channel, a.actor_id, a.connection_id, a.connection_name,
     a.client_name, a.action, a.outcome, a.targets, a.request_id, a.pending_action_id, a.reason, a.proof";

/// One link of a chain as stored, with its row's content when the row is still there.
#[derive(Debug, Clone)]
pub struct ChainLinkRow {
    pub audit_id: i64,
    pub seq: i64,
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
    pub prev_hash: Vec<u8>,
    pub hash: Vec<u8>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CheckpointRow {
    pub tenant_id: i64,
    pub seq: i64,
    pub head_hash: Vec<u8>,
    pub signed_at: DateTime<Utc>,
    pub kid: String,
    pub signature: Vec<u8>,
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
        "INSERT INTO audit_chain (audit_id, tenant_id, seq, prev_hash, hash)
         SELECT i, $1, s, p, h FROM unnest($2::bigint[], $3::bigint[], $4::bytea[], $5::bytea[]) AS u(i, s, p, h)",
    )
    .bind(tenant_id)
    .bind(&ids)
    .bind(&seqs)
    .bind(&prevs)
    .bind(&hashes)
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
    /// Chain heads that moved past their tenant's last checkpoint.
    pub(crate) async fn job_audit_heads_to_sign(&self) -> Result<Vec<(i64, ChainHead)>> {
        let rows: Vec<(i64, i64, Vec<u8>)> = sqlx::query_as(
            "SELECT h.tenant_id, h.seq, h.hash FROM audit_chain_heads h
             WHERE h.seq > coalesce((SELECT max(seq) FROM audit_checkpoints c WHERE c.tenant_id = h.tenant_id), 0)",
        )
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(|(t, seq, hash)| (t, ChainHead { seq, hash })).collect())
    }

    pub(crate) async fn job_audit_checkpoint_insert(&self, c: &CheckpointRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO audit_checkpoints (tenant_id, seq, head_hash, signed_at, kid, signature)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant_id, seq) DO NOTHING",
        )
        .bind(c.tenant_id)
        .bind(c.seq)
        .bind(&c.head_hash)
        .bind(c.signed_at)
        .bind(&c.kid)
        .bind(&c.signature)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The tenant's links with `seq > after`, in chain order, each with its row's content (or
    /// none when the row is gone).
    pub(crate) async fn audit_chain_links(
        &self,
        ctx: &OpCtx,
        after: i64,
        limit: i64,
    ) -> Result<Vec<ChainLinkRow>> {
        Ok(sqlx::query_as::<_, ChainLinkRow>(sqlx::AssertSqlSafe(format!(
            "SELECT c.audit_id, c.seq, c.prev_hash, c.hash, {CONTENT_COLUMNS}
             FROM audit_chain c LEFT JOIN audit_log a ON a.id = c.audit_id
             WHERE c.tenant_id = $1 AND c.seq > $2 ORDER BY c.seq LIMIT $3"
        )))
        .bind(ctx.tenant_id())
        .bind(after)
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    /// The tenant's checkpoints, oldest first.
    pub(crate) async fn audit_checkpoints(&self, ctx: &OpCtx) -> Result<Vec<CheckpointRow>> {
        Ok(sqlx::query_as::<_, CheckpointRow>(
            "SELECT tenant_id, seq, head_hash, signed_at, kid, signature FROM audit_checkpoints
             WHERE tenant_id = $1 ORDER BY seq",
        )
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
    ) -> Result<Vec<(i64, i64, Vec<u8>, Vec<u8>)>> {
        Ok(sqlx::query_as(
            "SELECT audit_id, seq, prev_hash, hash FROM audit_chain WHERE tenant_id = $1 AND audit_id = ANY($2)",
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
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_error: Option<String>,
    pub last_delivered_at: Option<DateTime<Utc>>,
    pub dropped_events: i64,
    pub dropped_note: Option<String>,
}

const WEBHOOK_COLUMNS: &str = "url, secret_sealed, previous_sealed, previous_until, created_at, rotated_at,
     delivered_seq, attempts, next_attempt_at, last_error, last_delivered_at, dropped_events, dropped_note";

impl Services {
    pub(crate) async fn audit_webhook_get(&self, ctx: &OpCtx) -> Result<Option<AuditWebhookRow>> {
        Ok(sqlx::query_as::<_, AuditWebhookRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {WEBHOOK_COLUMNS} FROM audit_webhooks WHERE tenant_id = $1"
        )))
        .bind(ctx.tenant_id())
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

    /// Tenants whose webhook has events to deliver and is due.
    pub(crate) async fn job_audit_webhooks_due(&self) -> Result<Vec<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT w.tenant_id FROM audit_webhooks w JOIN audit_chain_heads h ON h.tenant_id = w.tenant_id
             WHERE h.seq > w.delivered_seq AND w.next_attempt_at <= now()",
        )
        .fetch_all(self.pool())
        .await?)
    }

    /// Claims a tenant's webhook for delivery (skipped when another dispatcher holds it) and
    /// reads the next `limit` events after its cursor, in chain order.
    pub(crate) async fn job_audit_webhook_claim(
        &self,
        tenant_id: i64,
        limit: i64,
    ) -> Result<Option<(Tx<'static>, AuditWebhookRow, Vec<ChainLinkRow>)>> {
        let mut tx = self.begin().await?;
        let hook = sqlx::query_as::<_, AuditWebhookRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {WEBHOOK_COLUMNS} FROM audit_webhooks WHERE tenant_id = $1 AND next_attempt_at <= now()
             FOR UPDATE SKIP LOCKED"
        )))
        .bind(tenant_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(hook) = hook else { return Ok(None) };
        let events = sqlx::query_as::<_, ChainLinkRow>(sqlx::AssertSqlSafe(format!(
            "SELECT c.audit_id, c.seq, c.prev_hash, c.hash, {CONTENT_COLUMNS}
             FROM audit_chain c LEFT JOIN audit_log a ON a.id = c.audit_id
             WHERE c.tenant_id = $1 AND c.seq > $2 ORDER BY c.seq LIMIT $3"
        )))
        .bind(tenant_id)
        .bind(hook.delivered_seq)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        Ok(Some((tx, hook, events)))
    }

    /// Handles of connections by id (the webhook's events name connections by handle).
    pub(crate) async fn job_connection_handles(&self, ids: &[i64]) -> Result<Vec<(i64, String)>> {
        Ok(sqlx::query_as("SELECT id, handle FROM connections WHERE id = ANY($1)")
            .bind(ids)
            .fetch_all(self.pool())
            .await?)
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
        "INSERT INTO audit_webhooks (tenant_id, url, secret_sealed, delivered_seq)
         VALUES ($1, $2, $3, coalesce((SELECT seq FROM audit_chain_heads WHERE tenant_id = $1), 0))
         ON CONFLICT (tenant_id) DO UPDATE SET url = EXCLUDED.url, attempts = 0, next_attempt_at = now(), last_error = NULL",
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

/// Records a delivery round: the cursor after what was delivered, and on failure the attempt
/// count, the error and when to try again.
pub(crate) async fn job_audit_webhook_mark(
    tx: &mut Tx<'_>,
    tenant_id: i64,
    delivered_seq: i64,
    failure: Option<(&str, i64)>,
) -> Result<()> {
    match failure {
        None => sqlx::query(
            "UPDATE audit_webhooks SET delivered_seq = $2, attempts = 0, last_error = NULL,
                    next_attempt_at = now(), last_delivered_at = now()
             WHERE tenant_id = $1",
        )
        .bind(tenant_id)
        .bind(delivered_seq)
        .execute(&mut **tx)
        .await?,
        Some((error, backoff_ms)) => sqlx::query(
            "UPDATE audit_webhooks SET delivered_seq = $2, attempts = attempts + 1, last_error = $3,
                    next_attempt_at = now() + make_interval(secs => $4),
                    last_delivered_at = CASE WHEN delivered_seq < $2 THEN now() ELSE last_delivered_at END
             WHERE tenant_id = $1",
        )
        .bind(tenant_id)
        .bind(delivered_seq)
        .bind(error)
        .bind(backoff_ms as f64 / 1000.0)
        .execute(&mut **tx)
        .await?,
    };
    Ok(())
}

/// Skips events older than the bounded age: moves the cursor past them and notes what was
/// dropped for the console.
pub(crate) async fn job_audit_webhook_drop(
    tx: &mut Tx<'_>,
    tenant_id: i64,
    to_seq: i64,
    count: i64,
    note: &str,
) -> Result<()> {
    sqlx::query(
        "UPDATE audit_webhooks SET delivered_seq = $2, dropped_events = dropped_events + $3, dropped_note = $4
         WHERE tenant_id = $1",
    )
    .bind(tenant_id)
    .bind(to_seq)
    .bind(count)
    .bind(note)
    .execute(&mut **tx)
    .await?;
    Ok(())
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
