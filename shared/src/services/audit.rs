//! The tamper-evident audit log (R19) and its delivery to the tenant's SIEM.
//!
//! **The chain.** Each tenant's audit rows form a hash chain: row *n* stores
//! `hash_n = SHA-256(hash_{n-1} || canonical(row_n))`, the genesis `hash_0` being 32 zero bytes.
//! Workers write audit rows exactly as before (one INSERT; a trigger queues the row), and the
//! control plane chains each tenant's queued rows shortly after they commit ([`chain_round`]),
//! so no lock is taken on the write path. A row is protected once chained (about a second).
//!
//! **Checkpoints.** The control plane signs each tenant's chain head with Ed25519
//! ([`checkpoint_round`]); verifiers get the public keys by key id (`/.well-known/gatehouse-audit-keys`,
//! `gatehousectl audit keys`). A checkpoint is the anchor retention keeps when it drops older rows.
//!
//! **Verification** ([`verify`]) recomputes every hash, checks the links, the sequence and
//! every checkpoint, and names the first row that was edited, deleted, inserted or reordered.
//!
//! **The webhook** ([`deliver_round`]) sends every chained event of a tenant, in chain order, at
//! least once, signed as Standard Webhooks specify, behind the SSRF guard of client metadata
//! documents.

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use chrono::{DateTime, Utc};
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::ctx::OpCtx;
use crate::datastore::{self as db, AuditContent, ChainLinkRow, CheckpointRow, Services};
use crate::error::{Error, Result};
use crate::rights::Right;

/// Rows chained in one transaction.
const CHAIN_BATCH: i64 = 1000;
/// The format of the canonical content; part of every hash.
pub const CANONICAL_VERSION: i64 = 1;

// ---------------------------------------------------------------- canonical content and hash

/// The canonical content of an audit row: a JSON object with sorted keys and no white space
/// (`shared::canon`), of every column that matters; `at` in UTC with microseconds.
pub fn canonical(row: &AuditContent) -> String {
    crate::canon::canonical_json(&json!({
        "v": CANONICAL_VERSION,
        "id": row.id,
        "tenant_id": row.tenant_id,
        "at": row.at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        "channel": row.channel,
        "actor_id": row.actor_id,
        "connection_id": row.connection_id,
        "connection_name": row.connection_name,
        "client_name": row.client_name,
        "action": row.action,
        "outcome": row.outcome,
        "targets": row.targets,
        "request_id": row.request_id,
        "pending_action_id": row.pending_action_id,
        "reason": row.reason,
        "proof": row.proof,
    }))
}

/// `SHA-256(prev_hash || canonical)`.
pub fn link_hash(prev_hash: &[u8], canonical: &str) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(prev_hash);
    h.update(canonical.as_bytes());
    h.finalize().to_vec()
}

const GENESIS: [u8; 32] = [0u8; 32];

// ---------------------------------------------------------------- signing keys

/// The Ed25519 keys that sign checkpoints (`GATEHOUSE_AUDIT_SIGNING_KEYS`,
/// `kid:base64url-32-byte-seed[,…]`): the first signs, every one is published, so a key is
/// rotated by putting a new one first and keeping the old one listed while its checkpoints
/// are verified.
pub struct SigningKeys {
    keys: Vec<(String, Ed25519KeyPair)>,
}

impl std::fmt::Debug for SigningKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKeys")
            .field("kids", &self.keys.iter().map(|k| &k.0).collect::<Vec<_>>())
            .finish()
    }
}

/// A public key that checks checkpoints.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PublicKey {
    pub kid: String,
    /// The raw 32-byte Ed25519 public key, base64url without padding.
    pub public_key: String,
}

impl PublicKey {
    /// Parses `kid:base64url-public-key`.
    pub fn parse(spec: &str) -> std::result::Result<PublicKey, String> {
        let (kid, key) = spec.split_once(':').ok_or("write kid:base64url-public-key")?;
        let bytes = URL_SAFE_NO_PAD
            .decode(key.trim().trim_end_matches('='))
            .map_err(|_| format!("key {kid}: not base64url"))?;
        if bytes.len() != 32 {
            return Err(format!("key {kid}: an Ed25519 public key is 32 bytes"));
        }
        Ok(PublicKey { kid: kid.trim().to_owned(), public_key: URL_SAFE_NO_PAD.encode(bytes) })
    }
}

impl SigningKeys {
    pub fn parse(spec: &str) -> std::result::Result<SigningKeys, String> {
        let mut keys: Vec<(String, Ed25519KeyPair)> = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let n = keys.len() + 1;
            let (kid, seed) = part
                .split_once(':')
                .ok_or_else(|| format!("entry {n}: write kid:base64url-32-byte-seed"))?;
            if kid.is_empty() || kid.len() > 16 || !kid.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Err(format!("entry {n}: the key id must be 1 to 16 letters or digits"));
            }
            let seed = URL_SAFE_NO_PAD
                .decode(seed.trim_end_matches('='))
                .map_err(|_| format!("key {kid}: not base64url"))?;
            let pair = Ed25519KeyPair::from_seed_unchecked(&seed)
                .map_err(|_| format!("key {kid}: the seed must be 32 bytes"))?;
            if keys.iter().any(|(k, _)| k == kid) {
                return Err(format!("key id {kid} appears twice"));
            }
            keys.push((kid.to_owned(), pair));
        }
        if keys.is_empty() {
            return Err("no keys given".into());
        }
        Ok(SigningKeys { keys })
    }

    /// A fresh key specification (`kid:seed`), for development stacks and tests.
    pub fn generate(kid: &str) -> String {
        let mut seed = [0u8; 32];
        SystemRandom::new().fill(&mut seed).expect("the system's random source");
        format!("{kid}:{}", URL_SAFE_NO_PAD.encode(seed))
    }

    pub fn public_keys(&self) -> Vec<PublicKey> {
        self.keys
            .iter()
            .map(|(kid, pair)| PublicKey {
                kid: kid.clone(),
                public_key: URL_SAFE_NO_PAD.encode(pair.public_key().as_ref()),
            })
            .collect()
    }

    fn sign(&self, message: &[u8]) -> (String, Vec<u8>) {
        let (kid, pair) = &self.keys[0];
        (kid.clone(), pair.sign(message).as_ref().to_vec())
    }
}

/// What a checkpoint's signature covers: lines of the format, tenant id, sequence, head hash
/// (hex) and signing time (UTC, microseconds).
pub fn checkpoint_message(
    tenant_id: i64,
    seq: i64,
    head: &[u8],
    signed_at: DateTime<Utc>,
) -> String {
    format!(
        "gatehouse-audit-checkpoint/v1\n{tenant_id}\n{seq}\n{}\n{}",
        hex::encode(head),
        signed_at.format("%Y-%m-%dT%H:%M:%S%.6fZ")
    )
}

// ---------------------------------------------------------------- background work

/// Chains every tenant's queued rows (a job of the control plane). Returns rows chained.
pub async fn chain_round(ds: &Services) -> Result<usize> {
    let mut chained = 0;
    for tenant in ds.job_audit_tenants_unchained().await? {
        loop {
            let (mut tx, head, rows) = ds.job_audit_chain_claim(tenant, CHAIN_BATCH).await?;
            if rows.is_empty() {
                break;
            }
            let mut prev = head.hash;
            let mut seq = head.seq;
            let links: Vec<db::NewLink> = rows
                .iter()
                .map(|r| {
                    seq += 1;
                    let hash = link_hash(&prev, &canonical(r));
                    let link = db::NewLink {
                        audit_id: r.id,
                        seq,
                        prev_hash: prev.clone(),
                        hash: hash.clone(),
                    };
                    prev = hash;
                    link
                })
                .collect();
            db::job_audit_chain_append(&mut tx, tenant, &links).await?;
            tx.commit().await?;
            chained += links.len();
            if (links.len() as i64) < CHAIN_BATCH {
                break;
            }
        }
    }
    Ok(chained)
}

/// Signs the head of every chain that moved since its last checkpoint. Returns checkpoints
/// written; without signing keys, none.
pub async fn checkpoint_round(ds: &Services) -> Result<usize> {
    let Some(keys) = ds.audit_keys() else { return Ok(0) };
    let heads = ds.job_audit_heads_to_sign().await?;
    for (tenant_id, head) in &heads {
        // Postgres keeps microseconds: sign what will be read back.
        let now = Utc::now();
        let signed_at = DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now);
        let (kid, signature) =
            keys.sign(checkpoint_message(*tenant_id, head.seq, &head.hash, signed_at).as_bytes());
        ds.job_audit_checkpoint_insert(&CheckpointRow {
            tenant_id: *tenant_id,
            seq: head.seq,
            head_hash: head.hash.clone(),
            signed_at,
            kid,
            signature,
        })
        .await?;
    }
    Ok(heads.len())
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
    if let Some(hook) = ds.audit_webhook_get(ctx).await?
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

// ---------------------------------------------------------------- verification

/// What kind of tampering a verification found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TamperKind {
    /// The row's content no longer hashes to its link (or its link was rewritten).
    Edited,
    /// A row (or its link) is gone.
    Deleted,
    /// A row is in the log but not in the chain, or sits in the chain where it was never written.
    Inserted,
    /// Rows are in another order than they were chained in.
    Reordered,
    /// A checkpoint's signature does not verify, or its head is not the chain's.
    Checkpoint,
}

/// The first problem found.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Tamper {
    pub kind: TamperKind,
    /// The chain position concerned.
    pub seq: Option<i64>,
    /// The audit row concerned.
    pub audit_id: Option<i64>,
    pub detail: String,
}

/// A checkpoint as verifiers read it.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointView {
    pub seq: i64,
    pub head_hash: String,
    pub signed_at: String,
    pub kid: String,
    pub signature: String,
}

/// The outcome of [`verify`].
#[derive(Debug, Clone, Serialize)]
pub struct Verification {
    pub ok: bool,
    pub rows_checked: u64,
    /// The chain's first and last positions checked (after retention, the first is past 1).
    pub first_seq: Option<i64>,
    pub last_seq: Option<i64>,
    /// When the last verified row was written.
    pub verified_until: Option<String>,
    pub checkpoints_checked: u64,
    pub last_checkpoint: Option<CheckpointView>,
    /// Rows written but not yet chained (normal for a second or so).
    pub pending: i64,
    pub problem: Option<Tamper>,
}

/// One link as the checker sees it: the row's canonical content when the row is there.
#[derive(Debug, Clone)]
pub struct Link {
    pub seq: i64,
    pub audit_id: i64,
    pub prev_hash: Vec<u8>,
    pub hash: Vec<u8>,
    pub canonical: Option<String>,
}

/// Checks links in `seq` order from an anchor (`(0, genesis)`, or a checkpoint retention kept)
/// and names the first problem. The kinds are told apart from what the broken link points to.
pub fn check_links(anchor: (i64, &[u8]), links: &[Link]) -> Option<Tamper> {
    let position: HashMap<&[u8], usize> =
        links.iter().enumerate().map(|(i, l)| (l.hash.as_slice(), i)).collect();
    let mut expected_seq = anchor.0 + 1;
    let mut prev: &[u8] = anchor.1;
    let tamper = |kind, l: &Link, detail: String| {
        Some(Tamper { kind, seq: Some(l.seq), audit_id: Some(l.audit_id), detail })
    };
    for (i, l) in links.iter().enumerate() {
        let Some(canonical) = &l.canonical else {
            return tamper(
                TamperKind::Deleted,
                l,
                format!(
                    "row {} (audit id {}) is gone from the log; its link remains",
                    l.seq, l.audit_id
                ),
            );
        };
        let content_ok = link_hash(&l.prev_hash, canonical) == l.hash;
        let link_ok = l.prev_hash == prev;
        if link_ok && !content_ok {
            return tamper(
                TamperKind::Edited,
                l,
                format!(
                    "row {} (audit id {}) was edited: its content no longer hashes to its link",
                    l.seq, l.audit_id
                ),
            );
        }
        if !link_ok {
            if l.seq > expected_seq {
                return tamper(
                    TamperKind::Deleted,
                    l,
                    format!(
                        "rows {expected_seq} to {} are missing before row {} (audit id {})",
                        l.seq - 1,
                        l.seq,
                        l.audit_id
                    ),
                );
            }
            match position.get(l.prev_hash.as_slice()) {
                Some(&j) if j > i => {
                    return tamper(
                        TamperKind::Reordered,
                        l,
                        format!(
                            "row {} (audit id {}) was chained after row {} (audit id {}), which now comes later",
                            l.seq, l.audit_id, links[j].seq, links[j].audit_id
                        ),
                    );
                }
                Some(&j) => {
                    let forged = &links[j + 1];
                    return tamper(
                        TamperKind::Inserted,
                        forged,
                        format!(
                            "row {} (audit id {}) was inserted: row {} was chained right after row {}",
                            forged.seq, forged.audit_id, l.seq, links[j].seq
                        ),
                    );
                }
                None if i > 0 && l.prev_hash == anchor.1 => {
                    let forged = &links[0];
                    return tamper(
                        TamperKind::Inserted,
                        forged,
                        format!(
                            "row {} (audit id {}) was inserted at the start",
                            forged.seq, forged.audit_id
                        ),
                    );
                }
                None if i > 0 => {
                    let before = &links[i - 1];
                    return tamper(
                        TamperKind::Edited,
                        before,
                        format!(
                            "row {} (audit id {}) was rewritten: row {} committed to another hash for it",
                            before.seq, before.audit_id, l.seq
                        ),
                    );
                }
                None => {
                    return tamper(
                        TamperKind::Edited,
                        l,
                        format!(
                            "row {} (audit id {}) does not link to the anchor",
                            l.seq, l.audit_id
                        ),
                    );
                }
            }
        }
        if l.seq != expected_seq {
            return tamper(
                TamperKind::Reordered,
                l,
                format!(
                    "row {} (audit id {}) was renumbered (expected {expected_seq})",
                    l.seq, l.audit_id
                ),
            );
        }
        prev = &l.hash;
        expected_seq = l.seq + 1;
    }
    None
}

fn checkpoint_view(c: &CheckpointRow) -> CheckpointView {
    CheckpointView {
        seq: c.seq,
        head_hash: hex::encode(&c.head_hash),
        signed_at: c.signed_at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        kid: c.kid.clone(),
        signature: URL_SAFE_NO_PAD.encode(&c.signature),
    }
}

fn checkpoint_signature_ok(
    c: &CheckpointRow,
    keys: &[PublicKey],
) -> std::result::Result<(), String> {
    let key = keys
        .iter()
        .find(|k| k.kid == c.kid)
        .ok_or_else(|| format!("checkpoint at row {} is signed by unknown key {}", c.seq, c.kid))?;
    let raw = URL_SAFE_NO_PAD.decode(&key.public_key).map_err(|_| "bad public key".to_owned())?;
    UnparsedPublicKey::new(&ED25519, raw)
        .verify(
            checkpoint_message(c.tenant_id, c.seq, &c.head_hash, c.signed_at).as_bytes(),
            &c.signature,
        )
        .map_err(|_| {
            format!(
                "checkpoint at row {} has a signature that does not verify with key {}",
                c.seq, c.kid
            )
        })
}

/// Verifies the tenant's whole chain and every checkpoint against `keys` (when `keys` is
/// empty, the installation's own signing keys). Needs `audit:read`.
pub async fn verify(ds: &Services, ctx: &OpCtx, keys: &[PublicKey]) -> Result<Verification> {
    ctx.require(Right::AuditRead)?;
    let own;
    let keys = if keys.is_empty() {
        own = ds.audit_keys().map(SigningKeys::public_keys).unwrap_or_default();
        &own[..]
    } else {
        keys
    };
    let checkpoints = ds.audit_checkpoints(ctx).await?;
    let mut links: Vec<Link> = Vec::new();
    let mut last_at = None;
    let mut after = 0;
    loop {
        let page = ds.audit_chain_links(ctx, after, 5000).await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        let n = page.len();
        for r in page {
            if let Some(c) = &r.content {
                last_at = Some(c.at);
            }
            links.push(link_of(r));
        }
        if n < 5000 {
            break;
        }
    }
    let mut v = Verification {
        ok: true,
        rows_checked: links.len() as u64,
        first_seq: links.first().map(|l| l.seq),
        last_seq: links.last().map(|l| l.seq),
        verified_until: last_at.map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string()),
        checkpoints_checked: checkpoints.len() as u64,
        last_checkpoint: checkpoints.last().map(checkpoint_view),
        pending: ds.audit_unchained_count(ctx).await?,
        problem: None,
    };
    // The anchor: the genesis, or the checkpoint retention kept just before the first row.
    let first = links.first().map(|l| l.seq).unwrap_or(1);
    let anchor = if first <= 1 {
        Some((0, GENESIS.to_vec()))
    } else {
        checkpoints.iter().find(|c| c.seq == first - 1).map(|c| (c.seq, c.head_hash.clone()))
    };
    let problem = match &anchor {
        None => Some(Tamper {
            kind: TamperKind::Deleted,
            seq: Some(first),
            audit_id: links.first().map(|l| l.audit_id),
            detail: format!("rows before {first} are gone and no checkpoint anchors row {first}"),
        }),
        Some((seq, hash)) => check_links((*seq, hash), &links),
    };
    let problem = problem.or_else(|| {
        checkpoints.iter().find_map(|c| {
            if let Err(detail) = checkpoint_signature_ok(c, keys) {
                return Some(Tamper {
                    kind: TamperKind::Checkpoint,
                    seq: Some(c.seq),
                    audit_id: None,
                    detail,
                });
            }
            let at = links.iter().find(|l| l.seq == c.seq)?;
            (at.hash != c.head_hash).then(|| Tamper {
                kind: TamperKind::Checkpoint,
                seq: Some(c.seq),
                audit_id: Some(at.audit_id),
                detail: format!(
                    "the chain was rewritten: row {} is not the head signed at {} by {}",
                    c.seq,
                    c.signed_at.format("%Y-%m-%dT%H:%M:%SZ"),
                    c.kid
                ),
            })
        })
    });
    let problem = match problem {
        Some(p) => Some(p),
        None => ds.audit_outside_chain(ctx, 1).await?.first().map(|r| Tamper {
            kind: TamperKind::Inserted,
            seq: None,
            audit_id: Some(r.id),
            detail: format!(
                "audit id {} ({} at {}) is in the log but was never chained: written behind the chain's back",
                r.id,
                r.action,
                r.at.format("%Y-%m-%dT%H:%M:%SZ")
            ),
        }),
    };
    v.ok = problem.is_none();
    v.problem = problem;
    Ok(v)
}

fn link_of(r: ChainLinkRow) -> Link {
    Link {
        seq: r.seq,
        audit_id: r.audit_id,
        canonical: r.content.as_ref().map(canonical),
        prev_hash: r.prev_hash,
        hash: r.hash,
    }
}

/// What the console's Audit page says about the chain: the tail since the last checkpoint is
/// verified on each view (the checkpoint's signature with the installation's keys).
#[derive(Debug, Clone, Serialize)]
pub struct ChainStatus {
    pub ok: bool,
    pub verified_until: Option<String>,
    pub last_seq: Option<i64>,
    pub checkpoint: Option<CheckpointView>,
    pub pending: i64,
    pub problem: Option<Tamper>,
}

pub async fn status(ds: &Services, ctx: &OpCtx) -> Result<ChainStatus> {
    ctx.require(Right::AuditRead)?;
    let checkpoints = ds.audit_checkpoints(ctx).await?;
    let keys = ds.audit_keys().map(SigningKeys::public_keys).unwrap_or_default();
    let last = checkpoints.last();
    let mut problem = None;
    let (anchor_seq, anchor_hash) = match last {
        Some(c) => {
            if let Err(detail) = checkpoint_signature_ok(c, &keys) {
                problem = Some(Tamper {
                    kind: TamperKind::Checkpoint,
                    seq: Some(c.seq),
                    audit_id: None,
                    detail,
                });
            }
            (c.seq, c.head_hash.clone())
        }
        None => (0, GENESIS.to_vec()),
    };
    // The checkpoint's own row, then the tail after it.
    let from = anchor_seq.saturating_sub(1);
    let rows = ds.audit_chain_links(ctx, from, 100_000).await?;
    let mut links: Vec<Link> = Vec::new();
    let mut last_at = None;
    for r in rows {
        if r.seq == anchor_seq {
            if r.hash != anchor_hash && problem.is_none() {
                problem = Some(Tamper {
                    kind: TamperKind::Checkpoint,
                    seq: Some(r.seq),
                    audit_id: Some(r.audit_id),
                    detail: format!("row {} is not the head the last checkpoint signed", r.seq),
                });
            }
            continue;
        }
        if let Some(c) = &r.content {
            last_at = Some(c.at);
        }
        links.push(link_of(r));
    }
    if problem.is_none() {
        problem = check_links((anchor_seq, &anchor_hash), &links);
    }
    Ok(ChainStatus {
        ok: problem.is_none(),
        verified_until: last_at.map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string()),
        last_seq: links.last().map(|l| l.seq).or(last.map(|c| c.seq)),
        checkpoint: last.map(checkpoint_view),
        pending: ds.audit_unchained_count(ctx).await?,
        problem,
    })
}

/// The installation's checkpoint keys, for verifiers.
pub fn public_keys(ds: &Services) -> Vec<PublicKey> {
    ds.audit_keys().map(SigningKeys::public_keys).unwrap_or_default()
}

/// The chain columns of exported rows: seq, prev_hash and hash (hex), and the canonical
/// content the hash commits to, by audit id. Unchained rows have none yet.
#[derive(Debug, Clone, Default)]
pub struct ExportLink {
    pub seq: String,
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
        .map(|(id, seq, prev, hash)| {
            let canonical = contents.get(&id).map(canonical).unwrap_or_default();
            (
                id,
                ExportLink {
                    seq: seq.to_string(),
                    prev_hash: hex::encode(prev),
                    hash: hex::encode(hash),
                    canonical,
                },
            )
        })
        .collect())
}

// ---------------------------------------------------------------- the SIEM webhook

/// How the webhook dispatcher retries and how long events wait for a dead endpoint.
#[derive(Debug, Clone, Copy)]
pub struct WebhookPolicy {
    /// Events undelivered for longer are dropped (and the console says so).
    pub max_age_secs: i64,
    /// The longest wait between two attempts (doubling from one second).
    pub max_backoff_ms: i64,
    /// Events sent in one round, one at a time, in order.
    pub batch: i64,
}

impl Default for WebhookPolicy {
    fn default() -> Self {
        WebhookPolicy { max_age_secs: 7 * 86_400, max_backoff_ms: 300_000, batch: 50 }
    }
}

const WEBHOOK_PURPOSE: &str = "audit-webhook-secret";
/// How long the previous secret keeps signing beside the new one after a rotation.
const ROTATION_OVERLAP_SECS: i64 = 86_400;

/// The tenant's webhook as the console and the CLI show it (never the secret).
#[derive(Debug, Clone, Serialize)]
pub struct WebhookView {
    pub url: String,
    pub created_at: String,
    pub rotated_at: Option<String>,
    /// The last chain position delivered.
    pub delivered_seq: i64,
    /// Events chained but not yet delivered.
    pub backlog: i64,
    pub attempts: i32,
    pub last_error: Option<String>,
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

fn hhmm(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
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
        created_at: hhmm(w.created_at),
        rotated_at: w.rotated_at.map(hhmm),
        delivered_seq: w.delivered_seq,
        backlog: (head - w.delivered_seq).max(0),
        attempts: w.attempts,
        last_error: w.last_error.clone(),
        last_delivered_at: w.last_delivered_at.map(hhmm),
        next_attempt_at: hhmm(w.next_attempt_at),
        dropped_events: w.dropped_events,
        dropped_note: w.dropped_note.clone(),
    }
}

/// Sets the tenant's webhook URL (checked behind the SSRF guard now, and again on every
/// delivery). A new webhook gets a secret, returned this once; changing the URL keeps it.
/// Deliveries start with the events after the chain's current head. Audited.
pub async fn webhook_set(
    ds: &Services,
    ctx: &OpCtx,
    url: &str,
    policy: &super::oauth::FetchPolicy,
) -> Result<(WebhookView, Option<String>)> {
    require_admin(ctx)?;
    let url = url.trim();
    if url.len() > 2000 {
        return Err(Error::invalid("url", "the webhook URL is longer than 2000 characters"));
    }
    super::oauth::guarded_target(url, policy)
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
    let mut tx = ds.begin().await?;
    let url = ds.audit_webhook_get(ctx).await?.map(|w| w.url).unwrap_or_default();
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

/// The body of one event: what the Audit page shows of the row (R23: public ids, never
/// arguments), with its chain position and hashes so the SIEM can check the chain too.
fn event_body(link: &ChainLinkRow, handles: &HashMap<i64, String>) -> serde_json::Value {
    let id = format!("aud_{}", link.audit_id);
    match &link.content {
        Some(c) => json!({
            "type": "audit.event",
            "timestamp": hhmm(c.at),
            "data": {
                "id": id,
                "seq": link.seq,
                "at": c.at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
                "channel": c.channel,
                "action": c.action,
                "outcome": c.outcome,
                "targets": c.targets,
                "connection": c.connection_id.and_then(|i| handles.get(&i)),
                "connection_name": c.connection_name,
                "client_name": c.client_name,
                "reason": c.reason,
                "canonical": canonical(c),
                "prev_hash": hex::encode(&link.prev_hash),
                "hash": hex::encode(&link.hash),
            }
        }),
        None => json!({
            "type": "audit.gap",
            "timestamp": hhmm(Utc::now()),
            "data": {"id": id, "seq": link.seq, "hash": hex::encode(&link.hash)}
        }),
    }
}

/// What one delivery round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delivered {
    pub sent: usize,
    pub failed: usize,
    pub dropped: usize,
}

/// Delivers due webhooks, each tenant in its own task (a dead endpoint holds only its own
/// tenant's cursor), each in order, one event at a time, at least once.
pub async fn deliver_round(
    ds: &Services,
    fetch: &super::oauth::FetchPolicy,
    policy: WebhookPolicy,
) -> Result<Delivered> {
    let due = ds.job_audit_webhooks_due().await?;
    let rounds = due.into_iter().map(|tenant| deliver_tenant(ds, fetch, policy, tenant));
    let mut total = Delivered::default();
    for r in futures_util::future::join_all(rounds).await {
        match r {
            Ok(d) => {
                total.sent += d.sent;
                total.failed += d.failed;
                total.dropped += d.dropped;
            }
            Err(e) => tracing::warn!(error = %e, "audit webhook round failed; retrying"),
        }
    }
    Ok(total)
}

async fn deliver_tenant(
    ds: &Services,
    fetch: &super::oauth::FetchPolicy,
    policy: WebhookPolicy,
    tenant: i64,
) -> Result<Delivered> {
    let mut done = Delivered::default();
    let Some((mut tx, hook, events)) = ds.job_audit_webhook_claim(tenant, policy.batch).await?
    else {
        return Ok(done);
    };
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
    // Events past the bounded age are dropped, and the console says which.
    let cutoff = Utc::now() - chrono::Duration::seconds(policy.max_age_secs);
    let stale: Vec<&ChainLinkRow> =
        events.iter().take_while(|e| e.content.as_ref().is_some_and(|c| c.at < cutoff)).collect();
    let mut cursor = hook.delivered_seq;
    if let (Some(first), Some(last)) = (stale.first(), stale.last()) {
        let at = |l: &ChainLinkRow| l.content.as_ref().map(|c| hhmm(c.at)).unwrap_or_default();
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
        db::job_audit_webhook_drop(&mut tx, tenant, last.seq, stale.len() as i64, &note).await?;
        cursor = last.seq;
        done.dropped = stale.len();
    }
    let conn_ids: Vec<i64> =
        events.iter().filter_map(|e| e.content.as_ref()?.connection_id).collect();
    let handles: HashMap<i64, String> =
        ds.job_connection_handles(&conn_ids).await?.into_iter().collect();
    let mut failure: Option<String> = None;
    for e in events.iter().skip(stale.len()) {
        let body = serde_json::to_vec(&event_body(e, &handles)).unwrap_or_default();
        let id = format!("aud_{}", e.audit_id);
        let ts = Utc::now().timestamp();
        let headers = [
            ("webhook-id", id.clone()),
            ("webhook-timestamp", ts.to_string()),
            ("webhook-signature", webhook_signature(&secrets, &id, ts, &body)),
        ];
        match super::oauth::guarded_post_json(&hook.url, fetch, &body, &headers).await {
            Ok(status) if (200..300).contains(&status) => {
                cursor = e.seq;
                done.sent += 1;
            }
            Ok(status) => {
                failure = Some(format!("the endpoint answered {status}"));
                break;
            }
            Err(why) => {
                failure = Some(why);
                break;
            }
        }
    }
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
    db::job_audit_webhook_mark(&mut tx, tenant, cursor, failure.as_deref().zip(backoff)).await?;
    tx.commit().await?;
    Ok(done)
}

/// Per tenant with a webhook: its slug, events waiting and the age of the oldest (metrics).
pub async fn webhook_backlog(ds: &Services) -> Result<Vec<(String, i64, f64)>> {
    ds.platform_audit_webhook_backlog().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: usize) -> Vec<Link> {
        let mut prev = GENESIS.to_vec();
        (1..=n as i64)
            .map(|seq| {
                let canonical = format!("{{\"row\":{seq}}}");
                let hash = link_hash(&prev, &canonical);
                let l = Link {
                    seq,
                    audit_id: seq * 10,
                    prev_hash: prev.clone(),
                    hash: hash.clone(),
                    canonical: Some(canonical),
                };
                prev = hash;
                l
            })
            .collect()
    }

    #[test]
    fn every_kind_of_tampering_is_named_at_its_row() {
        let g = GENESIS;
        assert_eq!(check_links((0, &g), &chain(5)), None);
        let kind = |links: &[Link]| check_links((0, &g), links).map(|t| (t.kind, t.seq));

        let mut edited = chain(5);
        edited[2].canonical = Some("{\"row\":99}".into());
        assert_eq!(kind(&edited), Some((TamperKind::Edited, Some(3))));

        let mut deleted = chain(5);
        deleted.remove(2);
        assert_eq!(kind(&deleted), Some((TamperKind::Deleted, Some(4))));

        let mut gone = chain(5);
        gone[1].canonical = None;
        assert_eq!(kind(&gone), Some((TamperKind::Deleted, Some(2))));

        // A forged row with a correct hash placed after row 2, the rest renumbered.
        let mut inserted = chain(5);
        let canonical = "{\"row\":\"forged\"}".to_owned();
        let hash = link_hash(&inserted[1].hash, &canonical);
        inserted.insert(
            2,
            Link {
                seq: 3,
                audit_id: 999,
                prev_hash: inserted[1].hash.clone(),
                hash,
                canonical: Some(canonical),
            },
        );
        for (i, l) in inserted.iter_mut().enumerate() {
            l.seq = i as i64 + 1;
        }
        assert_eq!(kind(&inserted), Some((TamperKind::Inserted, Some(3))));

        let mut swapped = chain(5);
        swapped.swap(1, 2);
        swapped[1].seq = 2;
        swapped[2].seq = 3;
        assert_eq!(kind(&swapped), Some((TamperKind::Reordered, Some(2))));

        // Rewritten with a recomputed hash: the next row committed to another one.
        let mut rehashed = chain(5);
        rehashed[2].canonical = Some("{\"row\":77}".into());
        rehashed[2].hash = link_hash(&rehashed[2].prev_hash, "{\"row\":77}");
        assert_eq!(kind(&rehashed), Some((TamperKind::Edited, Some(3))));
    }

    #[test]
    fn a_checkpoint_signature_verifies_with_its_public_key_only() {
        let keys = SigningKeys::parse(&SigningKeys::generate("a1")).expect("keys");
        let at = DateTime::from_timestamp_micros(1_800_000_000_123_456).expect("time");
        let (kid, signature) = keys.sign(checkpoint_message(7, 3, &[1u8; 32], at).as_bytes());
        let c = CheckpointRow {
            tenant_id: 7,
            seq: 3,
            head_hash: vec![1u8; 32],
            signed_at: at,
            kid,
            signature,
        };
        assert!(checkpoint_signature_ok(&c, &keys.public_keys()).is_ok());
        let other = SigningKeys::parse(&SigningKeys::generate("a1")).expect("keys");
        assert!(checkpoint_signature_ok(&c, &other.public_keys()).is_err());
        let moved = CheckpointRow { seq: 4, ..c };
        assert!(checkpoint_signature_ok(&moved, &keys.public_keys()).is_err());
    }

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
}
