//! The tenant's SIEM webhook: every chained event, and every checkpoint after the events it
//! covers, in order, at least once, signed as Standard Webhooks specify, behind the SSRF
//! guard; and alerts when the signer refuses a head.
//!
//! Each tenant's delivery runs on its own ([`deliver_tenant`]; the control plane's driver
//! starts one task per tenant), holding a lease on its webhook row rather than a transaction:
//! no transaction stays open across an HTTP call, and a slow or dead endpoint delays only its
//! own tenant. The cursor moves after each event the endpoint took.
//!
//! Bodies are the typed [`WebhookEvent`] (its JSON Schema is docs/audit-webhook.schema.json)
//! and name everything by public handle, never by internal id.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chrono::{DateTime, Utc};
use ring::rand::{SecureRandom, SystemRandom};
use serde::Serialize;

use super::chain::{CanonicalRow, canonical_v2};
use super::checkpoints::{Checkpoint, Refusal};
use crate::ctx::OpCtx;
use crate::datastore::{self as db, ChainLinkRow, Services};
use crate::error::{Error, Result};
use crate::rights::Right;
use crate::services::oauth::FetchPolicy;

/// How the webhook dispatcher retries and how long events wait for a dead endpoint.
#[derive(Debug, Clone, Copy)]
pub struct WebhookPolicy {
    /// Events undelivered for longer are dropped (and the console says so).
    pub max_age_secs: i64,
    /// The longest wait between two attempts (doubling from one second).
    pub max_backoff_ms: i64,
    /// Events sent in one round, one at a time, in order.
    pub batch: i64,
    /// How long a delivery holds its tenant's webhook without progress before another
    /// dispatcher may take it over (a killed process). Each call is bounded at five seconds
    /// by the guard and each event taken extends the lease, so 15 s never cuts a live round.
    pub lease_secs: i64,
}

impl Default for WebhookPolicy {
    fn default() -> Self {
        WebhookPolicy {
            max_age_secs: 7 * 86_400,
            max_backoff_ms: 300_000,
            batch: 50,
            lease_secs: 60,
        }
    }
}

const WEBHOOK_PURPOSE: &str = "audit-webhook-secret";
/// How long the previous secret keeps signing beside the new one after a rotation.
const ROTATION_OVERLAP_SECS: i64 = 86_400;

// ---------------------------------------------------------------- the events

/// One webhook delivery's body. `type` tells the kind; `data` its content.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[serde(tag = "type")]
pub enum WebhookEvent {
    /// An audit row, with its chain position and hashes so the SIEM can check the chain.
    #[serde(rename = "audit.event")]
    Event { timestamp: String, data: Box<EventData> },
    /// A chain position whose row is gone from the log (its link remains).
    #[serde(rename = "audit.gap")]
    Gap { timestamp: String, data: GapData },
    /// A signed checkpoint: keep these; `gatehousectl audit verify --anchors` takes them.
    #[serde(rename = "audit.checkpoint")]
    Checkpoint { timestamp: String, data: Checkpoint },
    /// The signer refused to sign the tenant's chain head: the log was tampered with.
    #[serde(rename = "audit.alert")]
    Alert { timestamp: String, data: AlertData },
}

/// An audit row as the SIEM gets it: what the Audit page shows (R23: public handles, never
/// arguments).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct EventData {
    /// The event's id, stable across redeliveries (also the `webhook-id` header).
    pub id: String,
    /// The row as its link commits to it. For rows chained in version 2,
    /// `hash = SHA-256(prev_hash || RFC 8785(row))`; `row.seq` is the chain position.
    pub row: CanonicalRow,
    /// The version of the canonical form the link hashes (1 for rows chained before
    /// version 2; their hash covers a form with internal ids and cannot be recomputed here).
    pub v: i16,
    /// The RFC 8785 text the hash covers (version 2 only).
    pub canonical: Option<String>,
    pub prev_hash: String,
    pub hash: String,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct GapData {
    pub id: String,
    pub tenant: String,
    pub seq: i64,
    pub hash: String,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct AlertData {
    pub id: String,
    pub tenant: String,
    /// `checkpoint_refused`.
    pub kind: String,
    pub detail: String,
}

/// The JSON Schema of every webhook body (docs/audit-webhook.schema.json is this, and a test
/// keeps it so).
pub fn event_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(WebhookEvent)).unwrap_or_default()
}

fn stamp(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn event_of(tenant: &str, link: &ChainLinkRow) -> WebhookEvent {
    let id = format!("{tenant}.{}", link.seq);
    match &link.content {
        Some(c) => WebhookEvent::Event {
            timestamp: stamp(c.at),
            data: Box::new(EventData {
                id,
                row: CanonicalRow::of(c, link.seq),
                v: link.v,
                canonical: (link.v >= 2).then(|| canonical_v2(c, link.seq)),
                prev_hash: hex::encode(&link.prev_hash),
                hash: hex::encode(&link.hash),
            }),
        },
        None => WebhookEvent::Gap {
            timestamp: stamp(Utc::now()),
            data: GapData {
                id,
                tenant: tenant.to_owned(),
                seq: link.seq,
                hash: hex::encode(&link.hash),
            },
        },
    }
}

fn checkpoint_event(c: &Checkpoint) -> (String, WebhookEvent) {
    (
        format!("{}.checkpoint.{}", c.tenant, c.seq),
        WebhookEvent::Checkpoint { timestamp: c.signed_at.clone(), data: c.clone() },
    )
}

// ---------------------------------------------------------------- configuring

/// The tenant's webhook as the console and the CLI show it (never the secret).
#[derive(Debug, Clone, Serialize)]
pub struct WebhookView {
    pub url: String,
    pub created_at: String,
    pub rotated_at: Option<String>,
    /// The last chain position delivered.
    pub delivered_seq: i64,
    /// The last checkpoint delivered.
    pub delivered_checkpoint_seq: i64,
    /// Events chained but not yet delivered.
    pub backlog: i64,
    pub attempts: i32,
    pub last_error: Option<String>,
    /// Since when deliveries fail (none while they succeed).
    pub failing_since: Option<String>,
    pub last_delivered_at: Option<String>,
    pub next_attempt_at: String,
    pub dropped_events: i64,
    pub dropped_note: Option<String>,
}

/// A webhook just configured or rotated: the secret, shown this once.
#[derive(Debug, Clone, Serialize)]
pub struct WebhookSecret {
    pub webhook: WebhookView,
    pub secret: String,
}

fn new_secret() -> String {
    let mut key = [0u8; 24];
    SystemRandom::new().fill(&mut key).expect("the system's random source");
    format!("whsec_{}", STANDARD.encode(key))
}

fn seal_keys(ds: &Services) -> Result<&crate::seal::SealKeys> {
    ds.secret_keys().ok_or_else(|| {
        Error::invalid(
            "GATEHOUSE_SECRET_KEYS",
            "set GATEHOUSE_SECRET_KEYS to keep a webhook secret (see docs/operations.md)",
        )
    })
}

/// Admins configure the webhook (the tenant-settings right, and reading the audit).
fn require_admin(ctx: &OpCtx) -> Result<()> {
    ctx.require(Right::AuditRead)?;
    ctx.require(Right::TenantSwitch)
}

pub async fn webhook_show(ds: &Services, ctx: &OpCtx) -> Result<Option<WebhookView>> {
    ctx.require(Right::AuditRead)?;
    let head = ds.audit_head_seq(ctx).await?;
    Ok(ds.audit_webhook_get(ctx).await?.map(|w| view(&w, head)))
}

fn view(w: &db::AuditWebhookRow, head: i64) -> WebhookView {
    WebhookView {
        url: w.url.clone(),
        created_at: stamp(w.created_at),
        rotated_at: w.rotated_at.map(stamp),
        delivered_seq: w.delivered_seq,
        delivered_checkpoint_seq: w.delivered_checkpoint_seq,
        backlog: (head - w.delivered_seq).max(0),
        attempts: w.attempts,
        last_error: w.last_error.clone(),
        failing_since: w.failing_since.map(stamp),
        last_delivered_at: w.last_delivered_at.map(stamp),
        next_attempt_at: stamp(w.next_attempt_at),
        dropped_events: w.dropped_events,
        dropped_note: w.dropped_note.clone(),
    }
}

/// Sets the tenant's webhook URL (checked behind the SSRF guard now, and again on every
/// delivery). A new webhook gets a secret, returned this once; changing the URL keeps it.
/// Deliveries start with the events and checkpoints after the current ones. Audited.
pub async fn webhook_set(
    ds: &Services,
    ctx: &OpCtx,
    url: &str,
    policy: &FetchPolicy,
) -> Result<(WebhookView, Option<String>)> {
    require_admin(ctx)?;
    let url = url.trim();
    if url.len() > 2000 {
        return Err(Error::invalid("url", "the webhook URL is longer than 2000 characters"));
    }
    crate::services::oauth::guarded_target(url, policy)
        .await
        .map_err(|why| Error::invalid("url", format!("the webhook URL is refused: {why}")))?;
    let existing = ds.audit_webhook_get(ctx).await?;
    let secret = existing.is_none().then(new_secret);
    let sealed = match &secret {
        Some(s) => seal_keys(ds)?.seal(WEBHOOK_PURPOSE, s.as_bytes()).map_err(Error::Internal)?,
        None => String::new(),
    };
    let mut tx = ds.begin().await?;
    // Where the tenant's log goes is a widening decision: under the passkey policy it needs
    // a passkey made for this URL.
    crate::services::passkeys::require(
        &mut tx,
        ctx,
        &crate::services::passkeys::Decision::audit_webhook("set", url),
    )
    .await?;
    db::audit_webhook_put(&mut tx, ctx, url, &sealed).await?;
    db::audit_insert(&mut tx, ctx, db::AuditEntry::ok("audit_webhook.set", vec![url.to_owned()]))
        .await?;
    tx.commit().await?;
    let shown =
        webhook_show(ds, ctx).await?.ok_or_else(|| Error::Internal("webhook vanished".into()))?;
    Ok((shown, secret))
}

/// A new secret, shown once; the previous one keeps signing beside it for a day. Audited.
pub async fn webhook_rotate(ds: &Services, ctx: &OpCtx) -> Result<WebhookSecret> {
    require_admin(ctx)?;
    let secret = new_secret();
    let sealed =
        seal_keys(ds)?.seal(WEBHOOK_PURPOSE, secret.as_bytes()).map_err(Error::Internal)?;
    // Read before the transaction: one never waits for a second connection.
    let url = ds.audit_webhook_get(ctx).await?.map(|w| w.url).unwrap_or_default();
    let mut tx = ds.begin().await?;
    crate::services::passkeys::require(
        &mut tx,
        ctx,
        &crate::services::passkeys::Decision::audit_webhook("rotate", &url),
    )
    .await?;
    if !db::audit_webhook_rotate(&mut tx, ctx, &sealed, ROTATION_OVERLAP_SECS).await? {
        return Err(Error::invalid("webhook", "no audit webhook is configured; set one first"));
    }
    db::audit_insert(&mut tx, ctx, db::AuditEntry::ok("audit_webhook.rotate", vec![])).await?;
    tx.commit().await?;
    let webhook =
        webhook_show(ds, ctx).await?.ok_or_else(|| Error::Internal("webhook vanished".into()))?;
    Ok(WebhookSecret { webhook, secret })
}

/// Removes the webhook (undelivered events stay in the log). Audited.
pub async fn webhook_remove(ds: &Services, ctx: &OpCtx) -> Result<bool> {
    require_admin(ctx)?;
    let mut tx = ds.begin().await?;
    let removed = db::audit_webhook_delete(&mut tx, ctx).await?;
    if removed {
        db::audit_insert(&mut tx, ctx, db::AuditEntry::ok("audit_webhook.remove", vec![])).await?;
    }
    tx.commit().await?;
    Ok(removed)
}

/// The Standard Webhooks signature header value: `v1,<base64 HMAC-SHA256(id.timestamp.body)>`
/// for each secret (`whsec_<base64 key>`), space-separated.
pub fn webhook_signature(secrets: &[&str], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .filter_map(|s| {
            let key = STANDARD.decode(s.strip_prefix("whsec_").unwrap_or(s)).ok()?;
            let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
            let mut ctx = ring::hmac::Context::with_key(&key);
            ctx.update(id.as_bytes());
            ctx.update(b".");
            ctx.update(timestamp.to_string().as_bytes());
            ctx.update(b".");
            ctx.update(body);
            Some(format!("v1,{}", STANDARD.encode(ctx.sign().as_ref())))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

// ---------------------------------------------------------------- delivering

/// What one delivery round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delivered {
    pub sent: usize,
    pub failed: usize,
    pub dropped: usize,
}

impl Delivered {
    fn add(&mut self, d: Delivered) {
        self.sent += d.sent;
        self.failed += d.failed;
        self.dropped += d.dropped;
    }
}

/// Tenants whose webhook has something to deliver and is due (not held by a delivery).
pub async fn webhooks_due(ds: &Services) -> Result<Vec<i64>> {
    ds.job_audit_webhooks_due().await
}

/// Delivers every due webhook, each tenant concurrently (tests and `gatehousectl`; the
/// control plane runs [`deliver_tenant`] per tenant in tasks of their own).
pub async fn deliver_round(
    ds: &Services,
    fetch: &FetchPolicy,
    policy: WebhookPolicy,
) -> Result<Delivered> {
    let due = webhooks_due(ds).await?;
    let rounds = due.into_iter().map(|tenant| deliver_tenant(ds, fetch, policy, tenant));
    let mut total = Delivered::default();
    for r in futures_util::future::join_all(rounds).await {
        match r {
            Ok(d) => total.add(d),
            Err(e) => tracing::warn!(error = %e, "audit webhook round failed; retrying"),
        }
    }
    Ok(total)
}

fn lease_token() -> String {
    let mut b = [0u8; 12];
    SystemRandom::new().fill(&mut b).expect("the system's random source");
    hex::encode(b)
}

/// One tenant's round: takes the lease, sends events then checkpoints in chain order, moves
/// the cursor after each one taken, and on failure backs off. No transaction is open while a
/// request is in flight.
pub async fn deliver_tenant(
    ds: &Services,
    fetch: &FetchPolicy,
    policy: WebhookPolicy,
    tenant: i64,
) -> Result<Delivered> {
    let mut done = Delivered::default();
    let token = lease_token();
    let Some((hook, tenant_handle)) =
        ds.job_audit_webhook_lease(tenant, &token, policy.lease_secs).await?
    else {
        return Ok(done);
    };
    let outcome =
        deliver_leased(ds, fetch, policy, tenant, &tenant_handle, &hook, &token, &mut done).await;
    let failure = match &outcome {
        Ok(f) => f.clone(),
        Err(e) => Some(format!("delivery stopped: {e}")),
    };
    let backoff = failure.as_ref().map(|_| {
        let exp = 1000i64.saturating_mul(1i64 << hook.attempts.clamp(0, 20));
        exp.min(policy.max_backoff_ms)
    });
    if failure.is_some() {
        done.failed = 1;
        tracing::warn!(
            tenant.id = tenant,
            attempt = hook.attempts + 1,
            "audit webhook delivery failed; will retry"
        );
    }
    ds.job_audit_webhook_release(tenant, &token, failure.as_deref().zip(backoff)).await?;
    outcome.map(|_| done)
}

#[expect(clippy::too_many_arguments, reason = "one round's parts, named")]
async fn deliver_leased(
    ds: &Services,
    fetch: &FetchPolicy,
    policy: WebhookPolicy,
    tenant: i64,
    tenant_handle: &str,
    hook: &db::AuditWebhookRow,
    token: &str,
    done: &mut Delivered,
) -> Result<Option<String>> {
    let keys = seal_keys(ds)?;
    let open =
        |sealed: &str| keys.open(WEBHOOK_PURPOSE, sealed).and_then(|b| String::from_utf8(b).ok());
    let mut secrets = vec![open(&hook.secret_sealed).ok_or_else(|| {
        Error::Internal("the audit webhook secret does not open with GATEHOUSE_SECRET_KEYS".into())
    })?];
    if let (Some(prev), Some(until)) = (&hook.previous_sealed, hook.previous_until)
        && until > Utc::now()
        && let Some(p) = open(prev)
    {
        secrets.push(p);
    }
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
    let events = ds.job_audit_webhook_events(tenant, hook.delivered_seq, policy.batch).await?;
    // Events past the bounded age are dropped, and the console says which.
    let cutoff = Utc::now() - chrono::Duration::seconds(policy.max_age_secs);
    let stale: Vec<&ChainLinkRow> =
        events.iter().take_while(|e| e.content.as_ref().is_some_and(|c| c.at < cutoff)).collect();
    let mut cursor = hook.delivered_seq;
    if let (Some(first), Some(last)) = (stale.first(), stale.last()) {
        let at = |l: &ChainLinkRow| l.content.as_ref().map(|c| stamp(c.at)).unwrap_or_default();
        let note = format!(
            "dropped {} undelivered events (rows {} to {}, written {} to {}), older than {} days",
            stale.len(),
            first.seq,
            last.seq,
            at(first),
            at(last),
            policy.max_age_secs / 86_400
        );
        tracing::warn!(
            tenant.id = tenant,
            dropped = stale.len(),
            "audit webhook dropped old events"
        );
        ds.job_audit_webhook_drop(tenant, token, last.seq, stale.len() as i64, &note).await?;
        cursor = last.seq;
        done.dropped = stale.len();
    }
    let mut checkpoint_cursor = hook.delivered_checkpoint_seq;
    let mut checkpoints =
        ds.job_audit_checkpoints_after(tenant, checkpoint_cursor).await?.into_iter().peekable();
    let send = |id: String, event: WebhookEvent| {
        let body = serde_json::to_vec(&event).unwrap_or_default();
        let ts = Utc::now().timestamp();
        let headers = [
            ("webhook-id", id.clone()),
            ("webhook-timestamp", ts.to_string()),
            ("webhook-signature", webhook_signature(&secrets, &id, ts, &body)),
        ];
        async move {
            match crate::services::oauth::guarded_post_json(&hook.url, fetch, &body, &headers).await
            {
                Ok(status) if (200..300).contains(&status) => None,
                Ok(status) => Some(format!("the endpoint answered {status}")),
                Err(why) => Some(why),
            }
        }
    };
    for e in events.iter().skip(stale.len()) {
        // A checkpoint goes right after the last event it covers.
        while let Some(c) = checkpoints.next_if(|c| c.seq <= cursor) {
            let (id, event) = checkpoint_event(&c.document());
            if let Some(why) = send(id, event).await {
                return Ok(Some(why));
            }
            checkpoint_cursor = c.seq;
            ds.job_audit_webhook_advance(
                tenant,
                token,
                cursor,
                checkpoint_cursor,
                policy.lease_secs,
            )
            .await?;
            done.sent += 1;
        }
        if let Some(why) =
            send(format!("{tenant_handle}.{}", e.seq), event_of(tenant_handle, e)).await
        {
            return Ok(Some(why));
        }
        cursor = e.seq;
        ds.job_audit_webhook_advance(tenant, token, cursor, checkpoint_cursor, policy.lease_secs)
            .await?;
        done.sent += 1;
    }
    for c in checkpoints.filter(|c| c.seq <= cursor) {
        let (id, event) = checkpoint_event(&c.document());
        if let Some(why) = send(id, event).await {
            return Ok(Some(why));
        }
        checkpoint_cursor = c.seq;
        ds.job_audit_webhook_advance(tenant, token, cursor, checkpoint_cursor, policy.lease_secs)
            .await?;
        done.sent += 1;
    }
    Ok(None)
}

/// Tells the tenant's webhook that the signer refused its chain head (best effort, outside
/// any transaction; the metric and the log are the operator's record).
pub async fn send_alert(ds: &Services, fetch: &FetchPolicy, refusal: &Refusal) -> Result<bool> {
    let Some(hook) = ds.job_audit_webhook_of(refusal.tenant_id).await? else { return Ok(false) };
    let keys = seal_keys(ds)?;
    let Some(secret) =
        keys.open(WEBHOOK_PURPOSE, &hook.secret_sealed).and_then(|b| String::from_utf8(b).ok())
    else {
        return Ok(false);
    };
    let now = Utc::now();
    let id = format!("{}.alert.{}", refusal.tenant, now.timestamp_millis());
    let event = WebhookEvent::Alert {
        timestamp: stamp(now),
        data: AlertData {
            id: id.clone(),
            tenant: refusal.tenant.clone(),
            kind: "checkpoint_refused".into(),
            detail: refusal.reason.clone(),
        },
    };
    let body = serde_json::to_vec(&event).unwrap_or_default();
    let ts = now.timestamp();
    let headers = [
        ("webhook-id", id.clone()),
        ("webhook-timestamp", ts.to_string()),
        ("webhook-signature", webhook_signature(&[&secret], &id, ts, &body)),
    ];
    Ok(matches!(
        crate::services::oauth::guarded_post_json(&hook.url, fetch, &body, &headers).await,
        Ok(s) if (200..300).contains(&s)
    ))
}

/// Per tenant with a webhook: its slug, events waiting and the age of the oldest (metrics).
pub async fn webhook_backlog(ds: &Services) -> Result<Vec<(String, i64, f64)>> {
    ds.platform_audit_webhook_backlog().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_webhook_signature_is_the_standard_webhooks_example() {
        // The example of the Standard Webhooks specification.
        let sig = webhook_signature(
            &["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn the_documented_schema_is_the_events_schema() {
        let documented: serde_json::Value =
            serde_json::from_str(include_str!("../../../../docs/audit-webhook.schema.json"))
                .expect("docs/audit-webhook.schema.json is JSON");
        assert_eq!(
            documented,
            event_schema(),
            "regenerate docs/audit-webhook.schema.json: cargo run -p control-plane --bin gatehousectl -- audit webhook-schema > docs/audit-webhook.schema.json"
        );
        let text = event_schema().to_string();
        assert!(!text.contains("tenant_id") && !text.contains("audit_id"), "no internal ids");
    }
}
