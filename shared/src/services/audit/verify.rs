//! Verification: trusts nothing in the database on its own word.
//!
//! [`verify`] recomputes every link from its row (the row, its tenant and its position),
//! checks every checkpoint's signature with PUBLIC keys given by the verifier (never a private
//! seed), that each checkpoint's row is still there with the signed head, that the checkpoints'
//! own chain has no gap, and, given anchors held outside (checkpoints a SIEM received, the
//! anchor file, or `seq:hash`), that the database still holds what they saw: a tail deleted or
//! rewritten after them is named. Rows chained but covered by no checkpoint for longer than
//! two checkpoint intervals are reported as unanchored.
//!
//! [`status`] is the console's view: the tail since the last checkpoint, checked on each view
//! with the installation's public keys.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::chain::{GENESIS, Link, Tamper, TamperKind, check_links, links_between};
use super::checkpoints::{Checkpoint, PublicKey, check_checkpoint_chain};
use crate::ctx::OpCtx;
use crate::datastore::{CheckpointRow, Services};
use crate::error::{Error, Result};
use crate::rights::Right;

/// Something held outside the database that the chain must still agree with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Anchor {
    /// `--anchor seq:hash`: the chain's hash at a position, as written down somewhere.
    Head { seq: i64, head: Vec<u8> },
    /// A signed checkpoint as it left the database (webhook, anchor file, public endpoint).
    Signed(Checkpoint),
}

impl Anchor {
    /// Parses `seq:hex-hash`.
    pub fn parse_head(spec: &str) -> std::result::Result<Anchor, String> {
        let (seq, hash) = spec.split_once(':').ok_or("write seq:hash (the hash in hex)")?;
        let seq: i64 = seq.trim().parse().map_err(|_| format!("{seq}: not a chain position"))?;
        let head = hex::decode(hash.trim()).map_err(|_| format!("{hash}: not hex"))?;
        if head.len() != 32 {
            return Err(format!("{hash}: a chain hash is 32 bytes (64 hex digits)"));
        }
        Ok(Anchor::Head { seq, head })
    }

    fn seq(&self) -> i64 {
        match self {
            Anchor::Head { seq, .. } => *seq,
            Anchor::Signed(c) => c.seq,
        }
    }

    fn head(&self) -> Vec<u8> {
        match self {
            Anchor::Head { head, .. } => head.clone(),
            Anchor::Signed(c) => c.head_bytes(),
        }
    }
}

/// What a verifier brings: public keys, anchors, and how old an uncovered row may get.
#[derive(Debug, Clone)]
pub struct VerifyWith {
    pub keys: Vec<PublicKey>,
    pub anchors: Vec<Anchor>,
    /// Chained rows no checkpoint covers for longer are unanchored (two checkpoint intervals).
    pub unanchored_after_secs: i64,
}

/// Rows chained but covered by no checkpoint for too long.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Unanchored {
    pub rows: i64,
    pub from_seq: i64,
    pub oldest_chained_at: String,
}

/// A checkpoint as verifiers read it.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointView {
    pub v: i16,
    pub seq: i64,
    pub head_hash: String,
    pub signed_at: String,
    pub kid: String,
    pub digest: String,
}

pub(super) fn checkpoint_view(c: &CheckpointRow) -> CheckpointView {
    CheckpointView {
        v: c.v,
        seq: c.seq,
        head_hash: hex::encode(&c.head_hash),
        signed_at: c.signed_at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        kid: c.kid.clone(),
        digest: c.digest(),
    }
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
    pub anchors_checked: u64,
    /// Rows written but not yet chained (normal for a second or so).
    pub pending: i64,
    /// Chained rows that no checkpoint has covered for longer than two intervals.
    pub unanchored: Option<Unanchored>,
    pub problem: Option<Tamper>,
}

/// Verifies the tenant's whole chain, its checkpoints and the anchors given. Needs
/// `audit:read` and at least one public key.
pub async fn verify(ds: &Services, ctx: &OpCtx, with: &VerifyWith) -> Result<Verification> {
    ctx.require(Right::AuditRead)?;
    if with.keys.is_empty() {
        return Err(Error::invalid(
            "public-key",
            "give the installation's public keys: --keys with the published key set (its URL /.well-known/gatehouse-audit-keys, or a file), or --public-key kid:key",
        ));
    }
    let tenant_id = ctx.tenant_id();
    // An anchor file holds every tenant's checkpoints: this tenant's are the anchors.
    let tenant = ds.audit_tenant_handle(ctx).await?;
    let anchors: Vec<Anchor> = with
        .anchors
        .iter()
        .filter(|a| !matches!(a, Anchor::Signed(c) if c.tenant != tenant))
        .cloned()
        .collect();
    if anchors.is_empty() && !with.anchors.is_empty() {
        return Err(Error::invalid(
            "anchors",
            format!("none of the anchors given is a checkpoint of tenant {tenant}"),
        ));
    }
    let checkpoints = ds.audit_checkpoints(ctx).await?;
    let (links, last_at) = links_between(ds, tenant_id, 0, None).await?;
    let first = links.first().map(|l| l.seq);
    let last = links.last().map(|l| l.seq);
    // Retention's own audit rows say how far it removed the chain.
    let pruned = ds.audit_pruned_through(ctx).await?;
    let problem = chain_problem(&checkpoints, &links)
        .or_else(|| checkpoint_problem(&checkpoints, &links, &with.keys, pruned))
        .or_else(|| anchor_problem(&checkpoints, &links, &anchors, &with.keys, pruned));
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
    let covered = checkpoints.last().map(|c| c.seq).unwrap_or(0);
    let unanchored = ds.audit_unanchored(ctx, covered, with.unanchored_after_secs).await?;
    Ok(Verification {
        ok: problem.is_none(),
        rows_checked: links.len() as u64,
        first_seq: first,
        last_seq: last,
        verified_until: last_at.map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string()),
        checkpoints_checked: checkpoints.len() as u64,
        last_checkpoint: checkpoints.last().map(checkpoint_view),
        anchors_checked: anchors.len() as u64,
        pending: ds.audit_unchained_count(ctx).await?,
        unanchored: unanchored.map(|(rows, from_seq, at)| Unanchored {
            rows,
            from_seq,
            oldest_chained_at: at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        }),
        problem,
    })
}

/// The links from their anchor: the genesis, or the checkpoint retention kept just before
/// the first row.
fn chain_problem(checkpoints: &[CheckpointRow], links: &[Link]) -> Option<Tamper> {
    let first = links.first().map(|l| l.seq).unwrap_or(1);
    if first <= 1 {
        return check_links((0, &GENESIS), links);
    }
    match checkpoints.iter().find(|c| c.seq == first - 1) {
        Some(c) => check_links((c.seq, &c.head_hash), links),
        None => Some(Tamper {
            kind: TamperKind::Deleted,
            seq: Some(first),
            audit_id: links.first().map(|l| l.audit_id),
            detail: format!("rows before {first} are gone and no checkpoint anchors row {first}"),
        }),
    }
}

/// The first and last chain positions the log should hold: its links, or after retention
/// removed every one, the position after what retention's audit row says it removed.
fn span(links: &[Link], pruned: i64) -> (i64, i64) {
    match (links.first(), links.last()) {
        (Some(f), Some(l)) => (f.seq, l.seq),
        _ => (pruned + 1, pruned),
    }
}

/// Every checkpoint: its signature, its place in the checkpoints' chain, and its row.
fn checkpoint_problem(
    checkpoints: &[CheckpointRow],
    links: &[Link],
    keys: &[PublicKey],
    pruned: i64,
) -> Option<Tamper> {
    for c in checkpoints {
        if let Err(detail) = c.check_signature(keys) {
            return Some(Tamper::at(TamperKind::Checkpoint, c.seq, detail));
        }
    }
    if let Err((seq, detail)) = check_checkpoint_chain(checkpoints) {
        return Some(Tamper::at(TamperKind::Checkpoint, seq, detail));
    }
    let (first, last) = span(links, pruned);
    for c in checkpoints {
        if c.seq > last {
            return Some(Tamper::at(
                TamperKind::Deleted,
                last + 1,
                format!(
                    "rows {} to {} are gone: the checkpoint signed {} by {} covers the chain up to row {}, which now ends at row {last}",
                    last + 1,
                    c.seq,
                    c.signed_at.format("%Y-%m-%dT%H:%M:%SZ"),
                    c.kid,
                    c.seq
                ),
            ));
        }
        if c.seq < first {
            continue; // Before retention's anchor: those rows were pruned.
        }
        let at = links.iter().find(|l| l.seq == c.seq)?;
        if at.hash != c.head_hash {
            return Some(Tamper {
                kind: TamperKind::Checkpoint,
                seq: Some(c.seq),
                audit_id: Some(at.audit_id),
                detail: format!(
                    "the chain was rewritten: row {} is not the head signed at {} by {}",
                    c.seq,
                    c.signed_at.format("%Y-%m-%dT%H:%M:%SZ"),
                    c.kid
                ),
            });
        }
    }
    None
}

/// Every anchor held outside: signed by these keys, still in the database unchanged, and the
/// chain still passing through it.
fn anchor_problem(
    checkpoints: &[CheckpointRow],
    links: &[Link],
    anchors: &[Anchor],
    keys: &[PublicKey],
    pruned: i64,
) -> Option<Tamper> {
    let (first, last) = span(links, pruned);
    let mut sorted: Vec<&Anchor> = anchors.iter().collect();
    sorted.sort_by_key(|a| a.seq());
    for a in sorted {
        let seq = a.seq();
        if let Anchor::Signed(doc) = a
            && let Err(why) = doc.check_signature(keys)
        {
            return Some(Tamper::at(
                TamperKind::Anchor,
                seq,
                format!("the anchor at row {seq} is not a checkpoint of these keys: {why}"),
            ));
        }
        if seq > last {
            return Some(Tamper::at(
                TamperKind::Deleted,
                last + 1,
                format!(
                    "rows {} to {seq} are gone: an anchor held outside shows the chain reached row {seq}, and it now ends at row {last}",
                    last + 1
                ),
            ));
        }
        if seq < first {
            // Pruned: the checkpoint (kept by retention) is what is left of those rows.
            if matches!(a, Anchor::Head { .. })
                && !checkpoints.iter().any(|c| c.seq == seq && c.head_hash == a.head())
            {
                return Some(Tamper::at(
                    TamperKind::Anchor,
                    seq,
                    format!(
                        "row {seq} was pruned and no checkpoint in the database holds the anchored hash"
                    ),
                ));
            }
        } else if let Some(l) = links.iter().find(|l| l.seq == seq)
            && l.hash != a.head()
        {
            return Some(Tamper {
                kind: TamperKind::Edited,
                seq: Some(seq),
                audit_id: Some(l.audit_id),
                detail: format!(
                    "the chain was rewritten up to row {seq}: its hash is not the one anchored outside ({})",
                    hex::encode(a.head())
                ),
            });
        } else if !links.iter().any(|l| l.seq == seq) && seq >= first {
            return Some(Tamper::at(
                TamperKind::Deleted,
                seq,
                format!("row {seq}, which an anchor holds, is gone"),
            ));
        }
        if let Anchor::Signed(doc) = a {
            match checkpoints.iter().find(|c| c.seq == seq) {
                None => {
                    return Some(Tamper::at(
                        TamperKind::Checkpoint,
                        seq,
                        format!(
                            "the checkpoint at row {seq} (signed {}), which the anchors hold, is gone from the database",
                            doc.signed_at
                        ),
                    ));
                }
                Some(c) if c.document() != *doc => {
                    return Some(Tamper::at(
                        TamperKind::Checkpoint,
                        seq,
                        format!(
                            "the checkpoint at row {seq} in the database is not the one the anchors hold (signed {}): it was replaced",
                            doc.signed_at
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
    }
    None
}

/// What the console's Audit page says about the chain.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ChainState {
    /// Nothing written yet.
    Empty,
    /// Rows are written but none is chained yet.
    Chaining,
    /// Verified up to the last row; a checkpoint covers it or the tail is young.
    Verified,
    /// Verified, but rows chained too long ago are covered by no checkpoint.
    Unanchored,
    /// Something does not verify.
    Tampered,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChainStatus {
    pub state: ChainState,
    pub ok: bool,
    pub verified_until: Option<String>,
    pub last_seq: Option<i64>,
    pub checkpoint: Option<CheckpointView>,
    pub pending: i64,
    pub unanchored: Option<Unanchored>,
    pub problem: Option<Tamper>,
}

/// The tail since the last checkpoint, checked on each view with the installation's keys, and
/// the checkpoints' own chain.
pub async fn status(ds: &Services, ctx: &OpCtx, unanchored_after_secs: i64) -> Result<ChainStatus> {
    ctx.require(Right::AuditRead)?;
    let checkpoints = ds.audit_checkpoints(ctx).await?;
    let keys = super::public_keys(ds);
    let last = checkpoints.last();
    let mut problem = None;
    if let Err((seq, detail)) = check_checkpoint_chain(&checkpoints) {
        problem = Some(Tamper::at(TamperKind::Checkpoint, seq, detail));
    }
    let (anchor_seq, anchor_hash) = match last {
        Some(c) => {
            if let Err(detail) = c.check_signature(&keys) {
                problem = problem.or(Some(Tamper::at(TamperKind::Checkpoint, c.seq, detail)));
            }
            (c.seq, c.head_hash.clone())
        }
        None => (0, GENESIS.to_vec()),
    };
    // The checkpoint's own row (unless pruned), then the tail after it.
    let (mut links, last_at) =
        links_between(ds, ctx.tenant_id(), anchor_seq.saturating_sub(1), None).await?;
    let head_row = links.first().filter(|l| l.seq == anchor_seq).cloned();
    if head_row.is_some() {
        links.remove(0);
    }
    if let Some(r) = &head_row
        && r.hash != anchor_hash
    {
        problem = problem.or(Some(Tamper::at(
            TamperKind::Checkpoint,
            r.seq,
            format!("row {} is not the head the last checkpoint signed", r.seq),
        )));
    }
    if let Some(c) = last
        && head_row.is_none()
        && links.first().is_none_or(|l| l.seq != c.seq + 1)
        && ds.audit_head_seq(ctx).await? < c.seq
    {
        problem = problem.or(Some(Tamper::at(
            TamperKind::Deleted,
            c.seq,
            format!("rows up to {} that the last checkpoint covers are gone", c.seq),
        )));
    }
    if problem.is_none() {
        problem = check_links((anchor_seq, &anchor_hash), &links);
    }
    let pending = ds.audit_unchained_count(ctx).await?;
    let unanchored = ds.audit_unanchored(ctx, anchor_seq, unanchored_after_secs).await?.map(
        |(rows, from_seq, at)| Unanchored {
            rows,
            from_seq,
            oldest_chained_at: at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        },
    );
    let last_seq = links.last().map(|l| l.seq).or(last.map(|c| c.seq));
    let state = match (&problem, &unanchored, last_seq) {
        (Some(_), _, _) => ChainState::Tampered,
        (None, Some(_), _) => ChainState::Unanchored,
        (None, None, Some(_)) => ChainState::Verified,
        (None, None, None) if pending > 0 => ChainState::Chaining,
        (None, None, None) => ChainState::Empty,
    };
    let verified_until = last_at
        .or_else(|| last.map(|c| c.signed_at))
        .map(|t: DateTime<Utc>| t.format("%Y-%m-%dT%H:%M:%SZ").to_string());
    Ok(ChainStatus {
        state,
        ok: problem.is_none(),
        verified_until,
        last_seq,
        checkpoint: last.map(checkpoint_view),
        pending,
        unanchored,
        problem,
    })
}

/// The tenant's checkpoints as they left the database (the public endpoint), after `after`,
/// oldest first, at most `limit`.
pub async fn published_checkpoints(
    ds: &Services,
    tenant_handle: &str,
    after: i64,
    limit: i64,
) -> Result<Option<Vec<Checkpoint>>> {
    let Some(rows) = ds.platform_audit_checkpoints_published(tenant_handle, after, limit).await?
    else {
        return Ok(None);
    };
    Ok(Some(rows.iter().map(CheckpointRow::document).collect()))
}
