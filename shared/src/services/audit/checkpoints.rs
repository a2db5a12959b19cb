//! Signed checkpoints of each tenant's chain head, and how they leave the database.
//!
//! A checkpoint of version 2 is a small JSON document ([`Checkpoint`]) naming the tenant by
//! handle, the chain position and head hash, when it was signed, and the previous checkpoint
//! (its position and digest), signed with Ed25519 over its RFC 8785 form. The checkpoints of a
//! tenant thus form their own chain: a missing or replaced one is named.
//!
//! Every checkpoint leaves Postgres when it is made: the control plane appends it to an
//! operator-chosen file (`GATEHOUSE_AUDIT_ANCHOR_FILE`, fsynced), the tenant's SIEM webhook
//! delivers it as an `audit.checkpoint` event, and it is published at
//! `/.well-known/gatehouse-audit-checkpoints/{tenant}`. A verifier holding any of those
//! copies ([`super::verify`]) names a tail deleted or rewritten after them.
//!
//! **The signer refuses a forged head.** Before signing, [`checkpoint_round`] checks that the
//! head extends the last checkpoint it knows, the one it signed itself (kept in memory and in
//! the anchor file, never read back from the database alone): every link since is recomputed
//! from its row. A head that does not extend it is refused, counted, logged and reported to
//! the tenant's webhook as an `audit.alert`.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::chain::{GENESIS, check_links, jcs, links_between};
use crate::datastore::{CheckpointRow, Services};
use crate::error::{Error, Result};

pub use crate::signing::{KeyStatus, PublicKey, SigningKeys};

// ---------------------------------------------------------------- the document

/// The checkpoint before this one, as this one commits to it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct PrevCheckpoint {
    pub seq: i64,
    /// SHA-256 (hex) of the previous checkpoint's RFC 8785 form, signature included.
    pub digest: String,
}

/// A signed checkpoint as it leaves the database: the anchor file's lines, the `data` of an
/// `audit.checkpoint` webhook event, the public endpoint's entries, `--anchors FILE`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Checkpoint {
    /// The document's version: 2 (version 1 checkpoints never leave the database).
    pub v: i16,
    /// The tenant's handle (`ten_…`).
    pub tenant: String,
    /// The chain position the checkpoint covers up to.
    pub seq: i64,
    /// The chain's hash at `seq` (hex).
    pub head: String,
    /// When it was signed, UTC with microseconds.
    pub signed_at: String,
    /// The tenant's previous checkpoint (none for its first).
    pub prev: Option<PrevCheckpoint>,
    /// The key that signed it.
    pub kid: String,
    /// Ed25519 over the RFC 8785 form of every other field (base64url).
    pub signature: String,
}

/// The fields a version 2 signature covers (everything but the signature).
#[derive(Serialize)]
struct Signed<'a> {
    v: i16,
    tenant: &'a str,
    seq: i64,
    head: &'a str,
    signed_at: &'a str,
    prev: &'a Option<PrevCheckpoint>,
    kid: &'a str,
}

impl Checkpoint {
    fn signed_bytes(&self) -> Vec<u8> {
        jcs(&Signed {
            v: self.v,
            tenant: &self.tenant,
            seq: self.seq,
            head: &self.head,
            signed_at: &self.signed_at,
            prev: &self.prev,
            kid: &self.kid,
        })
        .into_bytes()
    }

    /// SHA-256 (hex) of the RFC 8785 form, signature included: what the next one commits to.
    pub fn digest(&self) -> String {
        hex::encode(Sha256::digest(jcs(self).as_bytes()))
    }

    pub fn head_bytes(&self) -> Vec<u8> {
        hex::decode(&self.head).unwrap_or_default()
    }

    /// Checks the signature with `keys`; the error says why in words.
    pub fn check_signature(&self, keys: &[PublicKey]) -> std::result::Result<(), String> {
        if self.v != 2 {
            return Err(format!("checkpoint at row {} is of version {}, not 2", self.seq, self.v));
        }
        let key = keys.iter().find(|k| k.kid == self.kid).ok_or_else(|| {
            format!(
                "checkpoint at row {} is signed by key {}, which is not among the public keys given",
                self.seq, self.kid
            )
        })?;
        let signature = URL_SAFE_NO_PAD.decode(&self.signature).unwrap_or_default();
        if key.verifies(&self.signed_bytes(), &signature) {
            Ok(())
        } else {
            Err(format!(
                "checkpoint at row {} has a signature that does not verify with key {}",
                self.seq, self.kid
            ))
        }
    }
}

/// What a version 1 checkpoint's signature covers: tenant id, sequence, head (hex) and time.
pub fn checkpoint_message_v1(
    tenant_id: i64,
    seq: i64,
    head: &[u8],
    signed_at: DateTime<Utc>,
) -> String {
    format!(
        "gatehouse-audit-checkpoint/v1\n{tenant_id}\n{seq}\n{}\n{}",
        hex::encode(head),
        micros(signed_at)
    )
}

pub(super) fn micros(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// A checkpoint as the database holds it, either version.
impl CheckpointRow {
    /// The document of a version 2 row (what left the database when it was made).
    pub fn document(&self) -> Checkpoint {
        Checkpoint {
            v: self.v,
            tenant: self.tenant_handle.clone(),
            seq: self.seq,
            head: hex::encode(&self.head_hash),
            signed_at: micros(self.signed_at),
            prev: match (self.prev_seq, &self.prev_digest) {
                (Some(seq), Some(d)) => Some(PrevCheckpoint { seq, digest: hex::encode(d) }),
                _ => None,
            },
            kid: self.kid.clone(),
            signature: URL_SAFE_NO_PAD.encode(&self.signature),
        }
    }

    /// The digest the next checkpoint commits to: of the document (version 2), or of the
    /// version 1 message and its signature.
    pub fn digest(&self) -> String {
        match self.v {
            1 => {
                let mut h = Sha256::new();
                h.update(
                    checkpoint_message_v1(
                        self.tenant_id,
                        self.seq,
                        &self.head_hash,
                        self.signed_at,
                    )
                    .as_bytes(),
                );
                h.update(&self.signature);
                hex::encode(h.finalize())
            }
            _ => self.document().digest(),
        }
    }

    /// Checks the signature of either version with `keys`.
    pub fn check_signature(&self, keys: &[PublicKey]) -> std::result::Result<(), String> {
        match self.v {
            1 => {
                let key = keys.iter().find(|k| k.kid == self.kid).ok_or_else(|| {
                    format!(
                        "checkpoint at row {} is signed by key {}, which is not among the public keys given",
                        self.seq, self.kid
                    )
                })?;
                let message = checkpoint_message_v1(
                    self.tenant_id,
                    self.seq,
                    &self.head_hash,
                    self.signed_at,
                );
                if key.verifies(message.as_bytes(), &self.signature) {
                    Ok(())
                } else {
                    Err(format!(
                        "checkpoint at row {} has a signature that does not verify with key {}",
                        self.seq, self.kid
                    ))
                }
            }
            _ => self.document().check_signature(keys),
        }
    }
}

/// Checks that each checkpoint commits to the one before it (version 2 on), naming the first
/// gap or replacement.
pub fn check_checkpoint_chain(
    checkpoints: &[CheckpointRow],
) -> std::result::Result<(), (i64, String)> {
    let mut before: Option<&CheckpointRow> = None;
    for c in checkpoints {
        if c.v >= 2 {
            let stored = c.digest.as_ref().map(hex::encode);
            if stored.as_ref().is_some_and(|d| *d != c.digest()) {
                return Err((
                    c.seq,
                    format!(
                        "checkpoint at row {} was replaced: its stored digest is not its own",
                        c.seq
                    ),
                ));
            }
            match (before, c.prev_seq, &c.prev_digest) {
                (None, None, _) => {}
                (Some(b), Some(seq), Some(d)) if b.seq == seq && hex::encode(d) == b.digest() => {}
                (Some(b), Some(seq), _) if b.seq < seq => {
                    return Err((
                        c.seq,
                        format!(
                            "the checkpoint at row {seq} is missing: the checkpoint at row {} commits to it, and the one before it in the database is at row {}",
                            c.seq, b.seq
                        ),
                    ));
                }
                (None, Some(seq), _) => {
                    return Err((
                        c.seq,
                        format!(
                            "the checkpoint at row {seq} is missing: the checkpoint at row {} commits to it",
                            c.seq
                        ),
                    ));
                }
                (Some(b), _, _) => {
                    return Err((
                        c.seq,
                        format!(
                            "the checkpoint at row {} was replaced: the checkpoint at row {} does not commit to it",
                            b.seq, c.seq
                        ),
                    ));
                }
            }
        }
        before = Some(c);
    }
    Ok(())
}

// ---------------------------------------------------------------- what the signer remembers

/// The last checkpoint the signer made or accepted for each tenant, held outside Postgres:
/// in memory, and in the anchor file when one is configured (read back at start). The
/// database owner can delete or rewrite checkpoints; they cannot make the signer forget.
#[derive(Debug, Default)]
pub struct Anchors {
    last: HashMap<String, Checkpoint>,
    file: Option<PathBuf>,
    /// Signed and stored, not yet in the file (its write failed); retried each round.
    unwritten: Vec<Checkpoint>,
}

impl Anchors {
    /// Remembers in memory only (tests; installations that accept forgetting at restart).
    pub fn in_memory() -> Anchors {
        Anchors::default()
    }

    /// Appends every checkpoint to `path` (JSON lines, fsynced) and starts from what it holds.
    pub fn with_file(path: impl Into<PathBuf>) -> Result<Anchors> {
        let file = path.into();
        let mut anchors = Anchors { file: Some(file.clone()), ..Anchors::default() };
        match std::fs::read_to_string(&file) {
            Ok(text) => {
                for c in parse_anchors(&text).map_err(|e| {
                    Error::invalid(
                        "GATEHOUSE_AUDIT_ANCHOR_FILE",
                        format!("{}: {e}", file.display()),
                    )
                })? {
                    anchors.remember(c);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Error::invalid(
                    "GATEHOUSE_AUDIT_ANCHOR_FILE",
                    format!("{} cannot be read: {e}", file.display()),
                ));
            }
        }
        Ok(anchors)
    }

    fn remember(&mut self, c: Checkpoint) {
        let newer = self.last.get(&c.tenant).is_none_or(|l| l.seq < c.seq);
        if newer {
            self.last.insert(c.tenant.clone(), c);
        }
    }

    pub fn last(&self, tenant: &str) -> Option<&Checkpoint> {
        self.last.get(tenant)
    }

    /// Appends to the file (and fsyncs); on failure keeps them for the next round.
    fn write(&mut self, new: Vec<Checkpoint>) -> std::result::Result<(), String> {
        self.unwritten.extend(new);
        let Some(path) = &self.file else {
            self.unwritten.clear();
            return Ok(());
        };
        if self.unwritten.is_empty() {
            return Ok(());
        }
        let mut text = String::new();
        for c in &self.unwritten {
            text.push_str(&serde_json::to_string(c).unwrap_or_default());
            text.push('\n');
        }
        let written =
            std::fs::OpenOptions::new().create(true).append(true).open(path).and_then(|mut f| {
                f.write_all(text.as_bytes())?;
                f.sync_data()
            });
        match written {
            Ok(()) => {
                self.unwritten.clear();
                Ok(())
            }
            Err(e) => Err(format!("the anchor file {} was not written: {e}", path.display())),
        }
    }
}

/// Reads checkpoints held outside: JSON lines, a JSON array, or the public endpoint's page,
/// each a checkpoint document or a webhook event whose `data` is one (`audit.checkpoint`);
/// other events are skipped.
pub fn parse_anchors(text: &str) -> std::result::Result<Vec<Checkpoint>, String> {
    let values: Vec<serde_json::Value> = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Array(items)) => items,
        // The public endpoint's page: {"tenant", "checkpoints": [...]}.
        Ok(serde_json::Value::Object(page))
            if page.get("checkpoints").is_some_and(|c| c.is_array()) =>
        {
            page.get("checkpoints").and_then(|c| c.as_array()).cloned().unwrap_or_default()
        }
        Ok(one @ serde_json::Value::Object(_)) => vec![one],
        _ => text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l).map_err(|e| format!("line {}: not JSON ({e})", i + 1))
            })
            .collect::<std::result::Result<_, _>>()?,
    };
    let mut out = Vec::new();
    for (i, v) in values.into_iter().enumerate() {
        let doc = match v.get("type").and_then(|t| t.as_str()) {
            Some("audit.checkpoint") => v.get("data").cloned().unwrap_or_default(),
            Some(_) => continue,
            None => v,
        };
        out.push(
            serde_json::from_value::<Checkpoint>(doc)
                .map_err(|e| format!("entry {}: not a checkpoint ({e})", i + 1))?,
        );
    }
    Ok(out)
}

// ---------------------------------------------------------------- the signing round

/// A head the signer would not sign, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Refusal {
    pub tenant_id: i64,
    pub tenant: String,
    pub reason: String,
}

/// What one signing round did.
#[derive(Debug, Default)]
pub struct SignRound {
    pub signed: Vec<Checkpoint>,
    pub refused: Vec<Refusal>,
    /// The anchor file could not be written (the checkpoints wait in memory).
    pub file_error: Option<String>,
}

/// Signs the head of every chain that moved, after checking that it extends the last
/// checkpoint the signer knows. Without signing keys, does nothing.
pub async fn checkpoint_round(ds: &Services, anchors: &mut Anchors) -> Result<SignRound> {
    let mut round = SignRound::default();
    let Some(keys) = ds.audit_keys() else { return Ok(round) };
    let public = keys.public_keys();
    let mut to_write = Vec::new();
    for cand in ds.job_audit_checkpoint_candidates().await? {
        let remembered = anchors.last(&cand.tenant_handle).cloned();
        let up_to_date = cand.head_seq <= cand.last_seq.unwrap_or(0)
            && remembered.as_ref().is_none_or(|r| {
                Some(r.seq) == cand.last_seq
                    && Some(r.digest()) == cand.last_digest.as_ref().map(hex::encode)
            });
        if up_to_date {
            continue;
        }
        match sign_tenant(ds, keys, &public, &cand, remembered.as_ref()).await? {
            Ok((accepted, signed)) => {
                for c in accepted.iter().chain(&signed) {
                    anchors.remember(c.clone());
                }
                to_write.extend(accepted);
                to_write.extend(signed.iter().cloned());
                round.signed.extend(signed);
            }
            Err(reason) => {
                tracing::error!(
                    tenant.slug = %cand.tenant_slug,
                    reason = %reason,
                    "audit checkpoint refused: the chain does not extend the last signed checkpoint"
                );
                round.refused.push(Refusal {
                    tenant_id: cand.tenant_id,
                    tenant: cand.tenant_handle.clone(),
                    reason,
                });
            }
        }
    }
    // Checkpoints made elsewhere (gatehousectl audit checkpoint) and accepted go to the file
    // too, so it holds every checkpoint (a repeated line is harmless to a verifier).
    if let Err(e) = anchors.write(to_write) {
        tracing::error!(error = %e, "audit anchor file");
        round.file_error = Some(e);
    }
    Ok(round)
}

/// One tenant: the checkpoints accepted since the remembered one, and the new one signed; or
/// why the head is refused.
async fn sign_tenant(
    ds: &Services,
    keys: &SigningKeys,
    public: &[crate::services::audit::PublicKey],
    cand: &crate::datastore::CheckpointCandidate,
    remembered: Option<&Checkpoint>,
) -> Result<std::result::Result<(Vec<Checkpoint>, Vec<Checkpoint>), String>> {
    // Without a memory (a first start without an anchor file) the database's last checkpoint
    // is the anchor: its signature must verify, and nothing older is read.
    let from = remembered.map(|r| r.seq).or(cand.last_seq).unwrap_or(0);
    let stored = ds.job_audit_checkpoints_from(cand.tenant_id, from).await?;
    // The anchor: what the signer remembers, which the database must still hold unchanged,
    // then whatever was signed since with these keys, each committing to the one before.
    let mut accepted = Vec::new();
    let mut anchor: Option<CheckpointRow> = None;
    if let Some(r) = remembered {
        match stored.iter().find(|c| c.seq == r.seq) {
            Some(c) if c.v >= 2 && c.document() == *r => anchor = Some(c.clone()),
            Some(_) => {
                return Ok(Err(format!(
                    "the checkpoint at row {} that this control plane signed was replaced in the database",
                    r.seq
                )));
            }
            None => {
                return Ok(Err(format!(
                    "the checkpoint at row {} that this control plane signed is gone from the database",
                    r.seq
                )));
            }
        }
    }
    let after = anchor.as_ref().map(|a| a.seq);
    for c in stored.iter().filter(|c| after.is_none_or(|a| c.seq > a)) {
        if let Err(why) = c.check_signature(public) {
            return Ok(Err(why));
        }
        if let Some(a) = &anchor
            && c.v >= 2
            && (c.prev_seq != Some(a.seq)
                || c.prev_digest.as_ref().map(hex::encode) != Some(a.digest()))
        {
            return Ok(Err(format!(
                "the checkpoint at row {} does not commit to the checkpoint at row {}",
                c.seq, a.seq
            )));
        }
        if c.v >= 2 {
            accepted.push(c.document());
        }
        anchor = Some(c.clone());
    }
    let (anchor_seq, anchor_head) = match &anchor {
        Some(a) => (a.seq, a.head_hash.clone()),
        None => (0, GENESIS.to_vec()),
    };
    let (links, _) = links_between(ds, cand.tenant_id, anchor_seq, None).await?;
    if let Some(t) = check_links((anchor_seq, &anchor_head), &links) {
        return Ok(Err(format!(
            "the chain after the checkpoint at row {anchor_seq} does not extend it: {}",
            t.detail
        )));
    }
    let Some(last) = links.last() else { return Ok(Ok((accepted, Vec::new()))) };
    // Postgres keeps microseconds: sign what will be read back.
    let now = Utc::now();
    let signed_at = DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now);
    let mut doc = Checkpoint {
        v: 2,
        tenant: cand.tenant_handle.clone(),
        seq: last.seq,
        head: hex::encode(&last.hash),
        signed_at: micros(signed_at),
        prev: anchor.as_ref().map(|a| PrevCheckpoint { seq: a.seq, digest: a.digest() }),
        kid: String::new(),
        signature: String::new(),
    };
    doc.kid = keys.signing_kid().to_owned();
    let (kid, signature) = keys.sign(&doc.signed_bytes());
    doc.kid = kid;
    doc.signature = URL_SAFE_NO_PAD.encode(signature);
    let row = CheckpointRow {
        tenant_id: cand.tenant_id,
        tenant_handle: cand.tenant_handle.clone(),
        seq: doc.seq,
        head_hash: last.hash.clone(),
        signed_at,
        kid: doc.kid.clone(),
        signature: URL_SAFE_NO_PAD.decode(&doc.signature).unwrap_or_default(),
        v: 2,
        prev_seq: doc.prev.as_ref().map(|p| p.seq),
        prev_digest: doc.prev.as_ref().and_then(|p| hex::decode(&p.digest).ok()),
        digest: hex::decode(doc.digest()).ok(),
    };
    if !ds.job_audit_checkpoint_insert(&row).await? {
        // Another signer got there first: the next round checks its checkpoint like any other.
        return Ok(Ok((accepted, Vec::new())));
    }
    Ok(Ok((accepted, vec![doc])))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(keys: &SigningKeys, seq: i64, prev: Option<&Checkpoint>) -> Checkpoint {
        let mut d = Checkpoint {
            v: 2,
            tenant: "ten_x".into(),
            seq,
            head: hex::encode([seq as u8; 32]),
            signed_at: "2026-12-04T10:00:00.000001Z".into(),
            prev: prev.map(|p| PrevCheckpoint { seq: p.seq, digest: p.digest() }),
            kid: "a1".into(),
            signature: String::new(),
        };
        d.signature = URL_SAFE_NO_PAD.encode(keys.sign(&d.signed_bytes()).1);
        d
    }

    #[test]
    fn a_checkpoint_verifies_with_its_public_key_only_and_retired_keys_keep_verifying() {
        let keys = SigningKeys::parse(&SigningKeys::generate("a1")).expect("keys");
        let c = doc(&keys, 3, None);
        assert!(c.check_signature(&keys.public_keys()).is_ok());
        // The same key, published later as retired (public half only), still verifies.
        let public = keys.public_keys()[0].public_key.clone();
        let later = SigningKeys::parse(&SigningKeys::generate("b2"))
            .expect("keys")
            .with_retired(&format!("a1:{public}"))
            .expect("retired");
        let set = later.public_keys();
        assert_eq!(set[1].status, KeyStatus::Retired);
        assert!(c.check_signature(&set).is_ok());
        let other = SigningKeys::parse(&SigningKeys::generate("a1")).expect("keys");
        assert!(c.check_signature(&other.public_keys()).is_err());
        let moved = Checkpoint { seq: 4, ..c.clone() };
        assert!(moved.check_signature(&keys.public_keys()).is_err());
        let unlinked = Checkpoint { prev: None, ..doc(&keys, 5, Some(&c)) };
        assert!(unlinked.check_signature(&keys.public_keys()).is_err(), "prev is signed");
    }

    #[test]
    fn anchors_parse_from_json_lines_arrays_and_webhook_events() {
        let keys = SigningKeys::parse(&SigningKeys::generate("a1")).expect("keys");
        let a = doc(&keys, 3, None);
        let b = doc(&keys, 9, Some(&a));
        let lines = format!(
            "{}\n\n{}\n{}\n",
            serde_json::to_string(&a).expect("json"),
            serde_json::json!({"type": "audit.event", "data": {"seq": 4}}),
            serde_json::json!({"type": "audit.checkpoint", "data": b}),
        );
        assert_eq!(parse_anchors(&lines).expect("lines"), vec![a.clone(), b.clone()]);
        let array = serde_json::to_string(&vec![&a, &b]).expect("json");
        assert_eq!(parse_anchors(&array).expect("array"), vec![a, b]);
        assert!(parse_anchors("{\"seq\": \"x\"}").is_err());
        assert!(parse_anchors("not json\n").unwrap_err().contains("line 1"));
    }
}
