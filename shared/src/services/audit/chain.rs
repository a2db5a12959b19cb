//! The hash chain: each tenant's audit rows, in the order the chainer saw them commit, where
//! row *n* stores `hash_n = SHA-256(hash_{n-1} || canonical_v(row_n))` from a genesis of 32
//! zero bytes. Workers write rows as before (one INSERT; a trigger queues the row) and the
//! control plane chains them shortly after ([`chain_round`]), so no lock is taken on the
//! write path.
//!
//! Two canonical forms exist. Version 1 (rows chained before 2026-12-04) is Gatehouse's own
//! sorted-key JSON of the row's columns, internal ids included. Version 2, every new link, is
//! RFC 8785 (JCS) through `serde_json_canonicalizer`, of the row as the outside world knows
//! it: the tenant, actor, connection and pending action by public handle, and the link's own
//! position, so a row moved to another place or tenant no longer hashes to its link. A link
//! records its version; a verifier picks the form by it, and a row downgraded to version 1
//! stops hashing too.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::datastore::{self as db, AuditContent, ChainLinkRow, Services};
use crate::error::Result;

/// Rows chained in one transaction.
const CHAIN_BATCH: i64 = 1000;
/// The canonical form new links are written in.
pub const CANONICAL_VERSION: i16 = 2;

pub(super) const GENESIS: [u8; 32] = [0u8; 32];

/// Version 1: sorted keys, no white space (`shared::canon`), every column with internal ids.
pub fn canonical_v1(row: &AuditContent) -> String {
    crate::canon::canonical_json(&json!({
        "v": 1,
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

/// What a version 2 link commits to: the row by public handles, and its position.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct CanonicalRow {
    /// The form's version: 2.
    pub v: i16,
    /// The tenant's handle (`ten_…`).
    pub tenant: Option<String>,
    /// The row's position in the tenant's chain.
    pub seq: i64,
    /// When the row was written, UTC with microseconds.
    pub at: String,
    pub channel: String,
    /// The person who acted (`per_…`), when one did.
    pub actor: Option<String>,
    /// The agent connection that acted (`con_…`), when one did.
    pub connection: Option<String>,
    pub connection_name: Option<String>,
    pub client_name: Option<String>,
    pub action: String,
    pub outcome: String,
    /// Public handles of the records concerned.
    pub targets: Vec<String>,
    pub request_id: Option<String>,
    /// The two-step action this row belongs to (`pac_…`).
    pub pending_action: Option<String>,
    pub reason: Option<String>,
    /// How the person proved themselves (a passkey's handle, user verification), if asked.
    pub proof: Option<serde_json::Value>,
    /// What a settings change changed, `{field: {from, to}}`. Absent (not null) when there is
    /// none, so the form of every row written before it was kept is unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change: Option<serde_json::Value>,
    /// The tenant's policy set behind an agent's decision, `{version, decided_by}`. Absent (not
    /// null) with no set in force, so the form of every row written before it was kept is
    /// unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<serde_json::Value>,
}

impl CanonicalRow {
    pub fn of(row: &AuditContent, seq: i64) -> CanonicalRow {
        CanonicalRow {
            v: 2,
            tenant: row.tenant_handle.clone(),
            seq,
            at: row.at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
            channel: row.channel.clone(),
            actor: row.actor_handle.clone(),
            connection: row.connection_handle.clone(),
            connection_name: row.connection_name.clone(),
            client_name: row.client_name.clone(),
            action: row.action.clone(),
            outcome: row.outcome.clone(),
            targets: row.targets.clone(),
            request_id: row.request_id.clone(),
            pending_action: row.pending_handle.clone(),
            reason: row.reason.clone(),
            proof: row.proof.clone(),
            change: row.change.clone(),
            policy: row.policy.clone(),
        }
    }
}

/// RFC 8785 of `value`: the form every version 2 hash and signature covers.
pub fn jcs<T: Serialize>(value: &T) -> String {
    serde_json_canonicalizer::to_string(value).unwrap_or_default()
}

/// Version 2: RFC 8785 of [`CanonicalRow`].
pub fn canonical_v2(row: &AuditContent, seq: i64) -> String {
    jcs(&CanonicalRow::of(row, seq))
}

/// The canonical content a link of version `v` at `seq` commits to.
pub fn canonical(v: i16, row: &AuditContent, seq: i64) -> String {
    match v {
        1 => canonical_v1(row),
        _ => canonical_v2(row, seq),
    }
}

/// `SHA-256(prev_hash || canonical)`.
pub fn link_hash(prev_hash: &[u8], canonical: &str) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(prev_hash);
    h.update(canonical.as_bytes());
    h.finalize().to_vec()
}

/// Chains every tenant's queued rows (a job of the control plane). Returns rows chained.
pub async fn chain_round(ds: &Services) -> Result<usize> {
    let mut chained = 0;
    for tenant in ds.job_audit_tenants_unchained().await? {
        chained += chain_tenant(ds, tenant).await?;
    }
    Ok(chained)
}

async fn chain_tenant(ds: &Services, tenant: i64) -> Result<usize> {
    let mut chained = 0;
    loop {
        let (mut tx, head, rows) = ds.job_audit_chain_claim(tenant, CHAIN_BATCH).await?;
        if rows.is_empty() {
            return Ok(chained);
        }
        let mut prev = head.hash;
        let mut seq = head.seq;
        let links: Vec<db::NewLink> = rows
            .iter()
            .map(|r| {
                seq += 1;
                let hash = link_hash(&prev, &canonical_v2(r, seq));
                db::NewLink {
                    audit_id: r.id,
                    seq,
                    v: CANONICAL_VERSION,
                    prev_hash: std::mem::replace(&mut prev, hash.clone()),
                    hash,
                }
            })
            .collect();
        db::job_audit_chain_append(&mut tx, tenant, &links).await?;
        tx.commit().await?;
        chained += links.len();
        if (links.len() as i64) < CHAIN_BATCH {
            return Ok(chained);
        }
    }
}

/// How long the oldest queued row has waited to be chained, in seconds (a metric).
pub async fn chain_lag_secs(ds: &Services) -> Result<f64> {
    ds.job_audit_chain_lag().await
}

// ---------------------------------------------------------------- checking links

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
    /// A checkpoint's signature does not verify, its head is not the chain's, its row is gone,
    /// or the checkpoints' own chain has a gap.
    Checkpoint,
    /// An anchor held outside (a checkpoint a SIEM received) is not what the database holds.
    Anchor,
}

/// The first problem found.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Tamper {
    pub kind: TamperKind,
    /// The chain position concerned.
    pub seq: Option<i64>,
    /// The audit row concerned (its internal id: an operator's lead, never sent outside).
    pub audit_id: Option<i64>,
    pub detail: String,
}

impl Tamper {
    pub(super) fn at(kind: TamperKind, seq: i64, detail: String) -> Tamper {
        Tamper { kind, seq: Some(seq), audit_id: None, detail }
    }
}

/// One link as the checker sees it: the row's canonical content when the row is there.
#[derive(Debug, Clone)]
pub struct Link {
    pub seq: i64,
    pub audit_id: i64,
    pub prev_hash: Vec<u8>,
    pub hash: Vec<u8>,
    pub canonical: Option<String>,
    /// The row's tenant differs from the link's.
    pub foreign: bool,
}

pub(super) fn link_of(r: &ChainLinkRow, tenant_id: i64) -> Link {
    Link {
        seq: r.seq,
        audit_id: r.audit_id,
        canonical: r.content.as_ref().map(|c| canonical(r.v, c, r.seq)),
        prev_hash: r.prev_hash.clone(),
        hash: r.hash.clone(),
        foreign: r.content.as_ref().is_some_and(|c| c.tenant_id != tenant_id),
    }
}

/// Checks links in `seq` order from an anchor (`(0, genesis)`, or a checkpoint) and names the
/// first problem. The kinds are told apart from what the broken link points to.
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
        if l.foreign {
            return tamper(
                TamperKind::Edited,
                l,
                format!(
                    "row {} (audit id {}) now belongs to another tenant than its link",
                    l.seq, l.audit_id
                ),
            );
        }
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
            return Some(misplaced(anchor.1, links, &position, i));
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

/// Names what happened when link `i` does not follow the link before it.
fn misplaced(anchor: &[u8], links: &[Link], position: &HashMap<&[u8], usize>, i: usize) -> Tamper {
    let l = &links[i];
    let tamper = |kind, l: &Link, detail: String| Tamper {
        kind,
        seq: Some(l.seq),
        audit_id: Some(l.audit_id),
        detail,
    };
    match position.get(l.prev_hash.as_slice()) {
        Some(&j) if j > i => tamper(
            TamperKind::Reordered,
            l,
            format!(
                "row {} (audit id {}) was chained after row {} (audit id {}), which now comes later",
                l.seq, l.audit_id, links[j].seq, links[j].audit_id
            ),
        ),
        Some(&j) => {
            let forged = &links[j + 1];
            tamper(
                TamperKind::Inserted,
                forged,
                format!(
                    "row {} (audit id {}) was inserted: row {} was chained right after row {}",
                    forged.seq, forged.audit_id, l.seq, links[j].seq
                ),
            )
        }
        None if i > 0 && l.prev_hash == anchor => {
            let forged = &links[0];
            tamper(
                TamperKind::Inserted,
                forged,
                format!(
                    "row {} (audit id {}) was inserted at the start",
                    forged.seq, forged.audit_id
                ),
            )
        }
        None if i > 0 => {
            let before = &links[i - 1];
            tamper(
                TamperKind::Edited,
                before,
                format!(
                    "row {} (audit id {}) was rewritten: row {} committed to another hash for it",
                    before.seq, before.audit_id, l.seq
                ),
            )
        }
        None => tamper(
            TamperKind::Edited,
            l,
            format!(
                "row {} (audit id {}) does not link to the anchor: it, or the rows before it, were rewritten",
                l.seq, l.audit_id
            ),
        ),
    }
}

/// Reads the tenant's links after `after` up to `through` (inclusive), every page.
pub(super) async fn links_between(
    ds: &Services,
    tenant_id: i64,
    after: i64,
    through: Option<i64>,
) -> Result<(Vec<Link>, Option<chrono::DateTime<chrono::Utc>>)> {
    let mut links = Vec::new();
    let mut last_at = None;
    let mut from = after;
    loop {
        let page = ds.job_audit_chain_links(tenant_id, from, through, 5000).await?;
        let Some(last) = page.last() else { break };
        from = last.seq;
        let n = page.len();
        for r in &page {
            if let Some(c) = &r.content {
                last_at = Some(c.at);
            }
            links.push(link_of(r, tenant_id));
        }
        if n < 5000 {
            break;
        }
    }
    Ok((links, last_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn chain(n: usize) -> Vec<Link> {
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
                    foreign: false,
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

        let mut moved = chain(5);
        moved[3].foreign = true;
        assert_eq!(kind(&moved), Some((TamperKind::Edited, Some(4))));

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
                foreign: false,
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

        // From a later anchor, a chain rewritten from the anchor on does not link to it.
        let honest = chain(5);
        let anchor = honest[1].hash.clone();
        let mut rewritten = chain(5);
        rewritten[2].canonical = Some("{\"row\":\"x\"}".into());
        let mut prev = rewritten[1].hash.clone();
        prev[0] ^= 1;
        for l in rewritten.iter_mut().skip(2) {
            l.prev_hash = prev.clone();
            l.hash = link_hash(&prev, l.canonical.as_deref().unwrap_or_default());
            prev = l.hash.clone();
        }
        assert_eq!(
            check_links((2, &anchor), &rewritten[2..]).map(|t| (t.kind, t.seq)),
            Some((TamperKind::Edited, Some(3)))
        );
    }

    #[test]
    fn the_version_2_form_is_rfc_8785_and_names_its_position() {
        // RFC 8785 sorts by UTF-16 code units and writes numbers the ECMAScript way.
        assert_eq!(
            jcs(&json!({"b": 1.0, "a": [1e21, "é"], "\u{20ac}": 0})),
            "{\"a\":[1e+21,\"é\"],\"b\":1,\"€\":0}"
        );
        let row = AuditContent {
            id: 7,
            tenant_id: 1,
            tenant_handle: Some("ten_a".into()),
            at: chrono::DateTime::from_timestamp_micros(1_800_000_000_000_001).expect("time"),
            channel: "mcp".into(),
            actor_id: Some(3),
            actor_handle: Some("per_b".into()),
            connection_id: Some(4),
            connection_handle: Some("con_c".into()),
            connection_name: Some("n".into()),
            client_name: None,
            action: "add_booking_note".into(),
            outcome: "ok".into(),
            targets: vec!["bkg_d".into()],
            request_id: None,
            pending_action_id: None,
            pending_handle: None,
            reason: None,
            proof: None,
            change: None,
            policy: None,
        };
        let c = canonical_v2(&row, 12);
        assert!(c.starts_with("{\"action\":\"add_booking_note\",\"actor\":\"per_b\""), "{c}");
        assert!(c.contains("\"seq\":12") && c.contains("\"tenant\":\"ten_a\""), "{c}");
        assert!(!c.contains("\"id\"") && !c.contains("tenant_id"), "no internal ids: {c}");
        assert_ne!(canonical_v2(&row, 12), canonical_v2(&row, 13), "the position is hashed");
        assert_ne!(canonical(1, &row, 12), c, "version 1 is the old form");
        // The policy behind a decision is hashed when present, and absent (not null) when not:
        // a row without it keeps the form it had before the field was kept.
        assert!(!c.contains("policy"), "{c}");
        let mut decided = row.clone();
        decided.policy = Some(json!({"version": 3, "decided_by": ["quiet-hours"]}));
        let d = canonical_v2(&decided, 12);
        assert!(d.contains("\"policy\":{\"decided_by\":[\"quiet-hours\"],\"version\":3}"), "{d}");
        assert_ne!(d, c);
    }
}
