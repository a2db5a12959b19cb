//! The tamper-evident audit log (R19) and its proof outside the database.
//!
//! - [`chain`]: each tenant's rows form a hash chain, built by the control plane seconds after
//!   commit so the write path stays one INSERT.
//! - [`checkpoints`]: Ed25519-signed checkpoints of each chain's head, themselves a chain, that
//!   leave Postgres when made (anchor file, the SIEM webhook, a public endpoint); the signer
//!   refuses a head that does not extend the last checkpoint it signed.
//! - [`verify`]: recomputes everything with public keys and anchors held outside, and names
//!   what was edited, deleted, inserted, reordered or rewritten.
//! - [`webhook`]: the tenant's SIEM webhook, one tenant's delivery never waiting on another's.
//!
//! Retention ([`prune`]) and the CSV export's chain columns ([`export_links`]) live here.

pub mod chain;
pub mod checkpoints;
pub mod verify;
pub mod webhook;

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

pub use chain::{
    CANONICAL_VERSION, CanonicalRow, Link, Tamper, TamperKind, canonical, chain_lag_secs,
    chain_round, check_links, link_hash,
};
pub use checkpoints::{
    Anchors, Checkpoint, KeyStatus, PublicKey, Refusal, SignRound, SigningKeys, checkpoint_round,
    parse_anchors,
};
pub use verify::{
    Anchor, ChainState, ChainStatus, CheckpointView, Unanchored, Verification, VerifyWith,
    published_checkpoints, status, verify,
};
pub use webhook::{
    Delivered, WebhookEvent, WebhookPolicy, WebhookSecret, WebhookView, deliver_round,
    deliver_tenant, event_schema, send_alert, webhook_backlog, webhook_remove, webhook_rotate,
    webhook_set, webhook_show, webhook_signature, webhooks_due,
};

use crate::ctx::OpCtx;
use crate::datastore::{self as db, AuditContent, Services};
use crate::error::{Error, Result};
use crate::rights::Right;

/// The installation's checkpoint keys, for verifiers (signing, published and retired).
pub fn public_keys(ds: &Services) -> Vec<PublicKey> {
    ds.audit_keys().map(SigningKeys::public_keys).unwrap_or_default()
}

fn hhmm(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

// ---------------------------------------------------------------- retention

/// What a retention run removed.
#[derive(Debug, Clone, Serialize)]
pub struct Pruned {
    /// The signed checkpoint that now anchors the chain (the last removed row).
    pub through_seq: i64,
    pub checkpoint_signed_at: String,
    pub rows_removed: u64,
}

/// Drops the tenant's log rows older than `before`, up to the newest signed checkpoint whose
/// head is that old, so the rest stays verifiable from that checkpoint. Never drops an event
/// the tenant's webhook has not delivered. Audited (`audit.prune`). An operator's act.
pub async fn prune(ds: &Services, ctx: &OpCtx, before: DateTime<Utc>) -> Result<Pruned> {
    ctx.require(Right::AuditRead)?;
    ctx.require(Right::TenantSwitch)?;
    if !ctx.is_operator() {
        return Err(Error::Forbidden { right: Right::TenantSwitch });
    }
    let checkpoints = ds.audit_checkpoints(ctx).await?;
    // Read before the transaction (one never waits for a second connection); what the hook
    // has delivered only grows meanwhile.
    let hook = ds.audit_webhook_get(ctx).await?;
    let mut tx = ds.begin().await?;
    let links_before = db::audit_last_seq_before(&mut tx, ctx, before).await?.unwrap_or(0);
    let anchor = checkpoints
        .iter()
        .filter(|c| c.seq <= links_before)
        .max_by_key(|c| c.seq)
        .ok_or_else(|| {
            Error::invalid(
                "before",
                "no signed checkpoint covers rows that old yet; run gatehousectl audit checkpoint, or choose a later date",
            )
        })?;
    if let Some(hook) = hook
        && hook.delivered_seq < anchor.seq
    {
        return Err(Error::invalid(
            "before",
            format!(
                "the tenant's webhook has delivered up to row {} only; retention never drops undelivered events (wait, or remove the webhook)",
                hook.delivered_seq
            ),
        ));
    }
    let rows_removed = db::audit_prune(&mut tx, ctx, anchor.seq).await?;
    let reason = format!("{rows_removed} rows through {}", anchor.seq);
    let mut entry = db::AuditEntry::ok("audit.prune", vec![]);
    entry.reason = Some(&reason);
    db::audit_insert(&mut tx, ctx, entry).await?;
    tx.commit().await?;
    Ok(Pruned {
        through_seq: anchor.seq,
        checkpoint_signed_at: hhmm(anchor.signed_at),
        rows_removed,
    })
}

// ---------------------------------------------------------------- export

/// The chain columns of exported rows: seq, the link's version, prev_hash and hash (hex), and
/// the canonical content the hash commits to, by audit id. Unchained rows have none yet.
#[derive(Debug, Clone, Default)]
pub struct ExportLink {
    pub seq: String,
    pub v: String,
    pub prev_hash: String,
    pub hash: String,
    pub canonical: String,
}

pub async fn export_links(
    ds: &Services,
    ctx: &OpCtx,
    ids: &[i64],
) -> Result<HashMap<i64, ExportLink>> {
    ctx.require(Right::AuditRead)?;
    let contents: HashMap<i64, AuditContent> =
        ds.audit_contents_of(ctx, ids).await?.into_iter().map(|c| (c.id, c)).collect();
    Ok(ds
        .audit_links_of(ctx, ids)
        .await?
        .into_iter()
        .map(|(id, seq, v, prev, hash)| {
            let canonical = contents.get(&id).map(|c| canonical(v, c, seq)).unwrap_or_default();
            (
                id,
                ExportLink {
                    seq: seq.to_string(),
                    v: v.to_string(),
                    prev_hash: hex::encode(prev),
                    hash: hex::encode(hash),
                    canonical,
                },
            )
        })
        .collect())
}
