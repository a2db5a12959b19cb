//! The silent-write rail (R8, R19): every silent write runs through [`silent_write`] — the
//! replay check, one transaction, the write, the replay entry, exactly one audit row, commit.
//! An operation only supplies the write itself; it cannot skip a step.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canon::{canonical_json, sha256_hex};
use crate::ctx::OpCtx;
use crate::datastore::{self as db, AuditEntry, Services, Tx};
use crate::error::{Error, Result};

/// What a write hands the rail: its presented result and the public ids it touched (for the
/// audit).
pub(crate) type Wrote<T> = (T, Vec<String>);

// What a silent write answers: its result, and whether the rail answered it from the replay
// cache. The result is a presenter type: the replay cache keeps it as written and reads it back
// as the same type. (Plain comments: a doc comment would become the description models read
// in place of the result's own.)
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Written<T> {
    #[serde(flatten)]
    pub result: T,
    /// True when this identical call was answered from the replay cache and nothing executed.
    pub replayed: bool,
}

/// Runs one silent write of `tool` on the rail. `write` gets the open transaction and hands
/// it back with its outcome; what it wrote is recorded for replays, audited and committed
/// together, and a failure rolls back everything. A call identical to one this connection made
/// inside the replay window returns the first result with `replayed: true`, and `write` never
/// runs.
pub(crate) async fn silent_write<I, T, F, Fut>(
    ds: &Services,
    ctx: &OpCtx,
    tool: &'static str,
    input: &I,
    idempotency_key: Option<&str>,
    write: F,
) -> Result<Written<T>>
where
    I: Serialize,
    T: Serialize + DeserializeOwned,
    F: FnOnce(Tx<'static>) -> Fut,
    Fut: Future<Output = (Tx<'static>, Result<Wrote<T>>)>,
{
    let w = match begin(ds, ctx, tool, args_digest(input), idempotency_key).await? {
        Begun::Replayed(value) => return replayed(value),
        Begun::Fresh(w) => w,
    };
    let SilentWrite { tx, tool, digest, key, replays } = w;
    // What a policy simulation replays of an agent's call: the non-secret facts of its
    // arguments, kept beside its audit row.
    let facts = serde_json::to_value(input)
        .ok()
        .and_then(|args| crate::services::policies::call_facts(ctx, tool, &args));
    let (tx, written) = write(tx).await;
    SilentWrite { tx, tool, digest, key, replays }.finish(ctx, written, facts).await
}

/// Trims every string so that `" Anna "` and `"Anna"` are the same call.
fn normalize(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(s.trim().to_owned()),
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, v)| k.as_str() != "idempotency_key" && !v.is_null())
                .map(|(k, v)| (k.clone(), normalize(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The digest a replay fingerprint is built from: SHA-256 of the canonical JSON of the
/// normalized arguments (keys sorted at every level), without the idempotency key.
pub fn args_digest<T: Serialize>(input: &T) -> String {
    let value = serde_json::to_value(input).unwrap_or(Value::Null);
    sha256_hex(canonical_json(&normalize(&value)).as_bytes())
}

/// How a silent write begins: answered from the replay cache, or with a transaction to write in.
enum Begun {
    Replayed(Value),
    Fresh(SilentWrite),
}

/// An open silent write: its transaction and what `finish` records.
struct SilentWrite {
    tx: Tx<'static>,
    tool: &'static str,
    digest: String,
    key: Option<String>,
    replays: bool,
}

/// Starts one silent write: the replay check (R8).
///
/// A call identical to one this connection made inside the replay window returns the first
/// result with `replayed: true` and executes nothing. Identical calls racing on different
/// workers serialize on an advisory lock, so exactly one executes.
async fn begin(
    ds: &Services,
    ctx: &OpCtx,
    tool: &'static str,
    digest: String,
    key: Option<&str>,
) -> Result<Begun> {
    let key = key.map(str::trim).filter(|k| !k.is_empty());
    if let Some(k) = key
        && (k.len() > 200 || k.chars().any(char::is_control))
    {
        return Err(Error::invalid("idempotency_key", "use at most 200 printable characters"));
    }
    let mut tx = ds.begin().await?;
    // An MCP call replays within its connection, a REST call within its API token; a console
    // or CLI write has a person at the keyboard and no retrying client.
    let replays = db::ReplayScope::of(ctx).is_some();
    if replays {
        db::replay_lock(&mut tx, ctx, tool, &digest).await?;
        if let Some(k) = key {
            // Different arguments under the same key serialize on the key too.
            db::replay_lock(&mut tx, ctx, "idempotency_key", k).await?;
            if let Some((seen_tool, seen_digest, result)) =
                db::replay_find_key(&mut tx, ctx, k).await?
            {
                if seen_tool != tool || seen_digest != digest {
                    return Err(Error::invalid(
                        "idempotency_key",
                        format!(
                            "this key was used for another call ({seen_tool} with other arguments); use a new key for a new call"
                        ),
                    ));
                }
                return Ok(Begun::Replayed(result));
            }
        }
        if let Some(result) =
            db::replay_find(&mut tx, ctx, tool, &digest, ds.policy().replay_window_secs).await?
        {
            if let Some(k) = key {
                // The key now names this call too: a later call under it with other arguments
                // is refused, and a retry under it after the window is still a replay.
                db::replay_insert(&mut tx, ctx, tool, &digest, Some(k), &result).await?;
                tx.commit().await?;
            }
            return Ok(Begun::Replayed(result));
        }
    }
    Ok(Begun::Fresh(SilentWrite { tx, tool, digest, key: key.map(str::to_owned), replays }))
}

impl SilentWrite {
    /// Records the result for replays, writes the one audit row (R19) and commits.
    async fn finish<T: Serialize>(
        mut self,
        ctx: &OpCtx,
        written: Result<Wrote<T>>,
        facts: Option<Value>,
    ) -> Result<Written<T>> {
        let (result, targets) = written?;
        let written = Written { result, replayed: false };
        if self.replays {
            let value =
                serde_json::to_value(&written).map_err(|e| Error::Internal(e.to_string()))?;
            db::replay_insert(
                &mut self.tx,
                ctx,
                self.tool,
                &self.digest,
                self.key.as_deref(),
                &value,
            )
            .await?;
        }
        // An agent's write under a policy set passed the worker's gate: the set allowed it.
        let entry = AuditEntry {
            policy: crate::services::policies::allowed_record(ctx),
            call_facts: facts,
            ..AuditEntry::ok(self.tool, targets)
        };
        db::audit_insert(&mut self.tx, ctx, entry).await?;
        self.tx.commit().await?;
        Ok(written)
    }
}

/// The first result of an identical call, as its own type, marked replayed.
fn replayed<T: DeserializeOwned>(stored: Value) -> Result<Written<T>> {
    let result = serde_json::from_value(stored)
        .map_err(|e| Error::Internal(format!("a replayed result no longer reads: {e}")))?;
    Ok(Written { result, replayed: true })
}
