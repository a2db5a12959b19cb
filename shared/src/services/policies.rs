//! Tenants' policies: a security team's rules over calls, in Cedar (see `crate::policies` for
//! the language's side). Set and read here, by the console, the CLI and the REST API alike;
//! enforced on every call: reads and silent writes at the worker's gate ([`check_call`]), two-
//! step actions at prepare and again at confirm, with the records the plan touches
//! ([`two_step`]).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use serde::Serialize;
use serde_json::{Value, json};

use crate::ctx::OpCtx;
use crate::datastore::{self as db, AuditEntry, Services};
use crate::effect::EffectClass;
use crate::error::{Error, Result};
use crate::policies::{
    Call, CallerFacts, Compiled, PolicyInfo, PolicySchema, Principal, Problem, Resource,
    TechnicianFacts, Verdict,
};
use crate::rights::Right;

mod enforce;
mod simulate;
pub use enforce::*;
pub use simulate::*;

/// The registry as policies see it, generated from the worker's tool registry and committed
/// (`shared/src/policies/registry.json`; the worker's test
/// `the_policy_schema_is_the_registrys` fails until a new tool is in it): each tool's class
/// and the Cedar schema.
static REGISTRY: LazyLock<Value> = LazyLock::new(|| {
    serde_json::from_str(include_str!("../policies/registry.json"))
        .expect("the committed policy registry is JSON")
});

/// The schema every policy set is validated and evaluated against.
pub fn schema() -> Arc<PolicySchema> {
    static SCHEMA: LazyLock<Arc<PolicySchema>> = LazyLock::new(|| {
        Arc::new(
            PolicySchema::new(REGISTRY["schema"].clone())
                .expect("the committed policy schema is Cedar's"),
        )
    });
    SCHEMA.clone()
}

/// Each tool's effect class, by name.
fn classes() -> &'static HashMap<String, EffectClass> {
    static CLASSES: LazyLock<HashMap<String, EffectClass>> = LazyLock::new(|| {
        REGISTRY["classes"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(tool, class)| {
                        Some((tool.clone(), EffectClass::parse(class.as_str()?)?))
                    })
                    .collect()
            })
            .unwrap_or_default()
    });
    &CLASSES
}

/// The committed registry file's content for these tools (the worker's test writes and
/// compares it).
pub fn registry_json(tools: &[crate::policies::ToolFacts<'_>]) -> Value {
    // Confirming and rejecting are decided as the action they complete, never by their own
    // name: a policy naming them would validate and never apply, so the schema leaves them out.
    let kept: Vec<crate::policies::ToolFacts<'_>> = tools
        .iter()
        .filter(|t| !matches!(t.name, "confirm_action" | "reject_action"))
        .map(|t| crate::policies::ToolFacts {
            name: t.name,
            class: t.class,
            input_schema: t.input_schema,
        })
        .collect();
    let tools = kept.as_slice();
    let classes: serde_json::Map<String, Value> =
        tools.iter().map(|t| (t.name.to_owned(), Value::from(t.class.as_str()))).collect();
    serde_json::json!({"classes": classes, "schema": crate::policies::schema_json(tools)})
}

/// The tenant's set at `version`, compiled once per process and version (`None` for version
/// 0: no policy). A version that no longer compiles (the schema lost a tool it names) is an
/// error, and calls are refused with it, never allowed.
pub async fn compiled(ds: &Services, ctx: &OpCtx, version: i32) -> Result<Option<Arc<Compiled>>> {
    compiled_on(ds, None, ctx, version).await
}

/// [`compiled`], reading a source it has not compiled yet in `tx` when one is open (so a
/// transaction never waits for a second connection), else on the pool.
pub(crate) async fn compiled_on(
    ds: &Services,
    tx: Option<&mut db::Tx<'static>>,
    ctx: &OpCtx,
    version: i32,
) -> Result<Option<Arc<Compiled>>> {
    if version <= 0 {
        return Ok(None);
    }
    let tenant = ctx.tenant_id();
    let cache = &ds.compiled_policies().0;
    // A version that no longer compiles is kept as its refusal: each call is refused at once,
    // not after compiling it again.
    let refused = |reason: String| Error::PolicyRefused {
        policy: format!("version {version}"),
        reason: format!("the tenant's policy set no longer compiles: {reason}"),
        approval: false,
    };
    let kept =
        || cache.lock().ok().and_then(|m| m.get(&tenant).cloned()).filter(|(v, _)| *v == version);
    if let Some((_, set)) = kept() {
        return set.map(Some).map_err(refused);
    }
    // The source is read before waiting for another call's compilation, never while waiting:
    // a call inside a transaction holds a connection, and the one compiling may need one.
    let source = match tx {
        Some(tx) => db::policy_source(&mut **tx, ctx, version).await?,
        None => ds.policy_at(ctx, version).await?,
    };
    let source = source.ok_or_else(|| {
        Error::Internal(format!("policy version {version} of the tenant is missing"))
    })?;
    let turn = {
        let mut compiling = ds.compiled_policies().1.lock().unwrap_or_else(|p| p.into_inner());
        compiling.entry(tenant).or_default().clone()
    };
    let _turn = turn.lock().await;
    // Compiled meanwhile by the call this one waited for.
    if let Some((_, set)) = kept() {
        return set.map(Some).map_err(refused);
    }
    // A compilation that could not run (no thread) is not the version's answer: not kept.
    let compiled = on_large_stack(move || Compiled::compile(&source, schema()))
        .ok_or_else(|| refused("the policy set could not be compiled".into()))?
        .map(Arc::new)
        .map_err(|problems| join(&problems));
    if let Ok(mut map) = cache.lock() {
        map.insert(tenant, (version, compiled.clone()));
    }
    compiled.map(Some).map_err(refused)
}

/// Compiles on a thread of its own with a large stack: Cedar's parser recurses on the source's
/// nesting, and a tenant's set must never take a worker down.
fn compile_guarded(source: &str) -> std::result::Result<Compiled, Vec<Problem>> {
    let (owned, schema) = (source.to_owned(), schema());
    on_large_stack(move || Compiled::compile(&owned, schema)).unwrap_or_else(|| {
        Err(vec![Problem { line: 0, message: "the policy set could not be compiled".into() }])
    })
}

/// [`compile_guarded`] for a draft about to be checked, simulated or put in force: also held
/// to the bounds on what evaluating it may cost ([`Compiled::compile_draft`]).
fn draft_guarded(source: &str) -> std::result::Result<Compiled, Vec<Problem>> {
    let (owned, schema) = (source.to_owned(), schema());
    on_large_stack(move || Compiled::compile_draft(&owned, schema)).unwrap_or_else(|| {
        Err(vec![Problem { line: 0, message: "the policy set could not be compiled".into() }])
    })
}

/// Runs `work` on a thread of its own with a 256 MiB stack and waits for it (`None` when the
/// thread could not start or panicked). On the async runtime the wait does not stall other
/// requests.
fn on_large_stack<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let run = move || {
        std::thread::Builder::new()
            .name("policy-compile".into())
            .stack_size(256 * 1024 * 1024)
            .spawn(work)
            .ok()?
            .join()
            .ok()
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(run)
        }
        _ => run(),
    }
}

fn join(problems: &[Problem]) -> String {
    problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

// ------------------------------------------------------------------ reading and setting

/// The set in force.
#[derive(Debug, Serialize)]
pub struct PolicyView {
    /// 0 when the tenant has none.
    pub version: i32,
    pub source: String,
    pub policies: Vec<PolicyInfo>,
    pub author: Option<String>,
    pub note: Option<String>,
    pub set_at: Option<String>,
}

pub async fn show(ds: &Services, ctx: &OpCtx) -> Result<PolicyView> {
    ctx.require(Right::TenantSwitch)?;
    let Some(row) = ds.policy_current(ctx).await? else {
        return Ok(PolicyView {
            version: 0,
            source: String::new(),
            policies: Vec::new(),
            author: None,
            note: None,
            set_at: None,
        });
    };
    let policies =
        compile_guarded(&row.source).map(|c| c.policies().cloned().collect()).unwrap_or_default();
    Ok(PolicyView {
        version: row.version,
        source: row.source,
        policies,
        author: Some(row.author),
        note: Some(row.note),
        set_at: Some(row.created_at.to_rfc3339()),
    })
}

/// Checks a draft against the schema: every problem at its line, or the policies it holds.
pub fn check(source: &str) -> std::result::Result<Vec<PolicyInfo>, Vec<Problem>> {
    draft_guarded(source).map(|c| c.policies().cloned().collect())
}

/// What setting a set came to.
#[derive(Debug, Serialize)]
pub struct PolicySetOutcome {
    pub version: i32,
    pub previous: i32,
    /// Whether it may widen what agents may do (then it was a passkey decision).
    pub widens: bool,
    pub policies: Vec<PolicyInfo>,
}

/// Puts `source` in force as the next version, when `expected` is the version in force (two
/// admins editing at once: the second is told, nothing is lost). A set that does not parse or
/// validate is refused with every problem at its line, and the set in force stays.
pub async fn set(
    ds: &Services,
    ctx: &OpCtx,
    source: &str,
    expected: i32,
    note: &str,
) -> Result<PolicySetOutcome> {
    ctx.require(Right::TenantSwitch)?;
    let note = note.trim();
    if note.chars().count() > 300 {
        return Err(Error::invalid("note", "at most 300 characters"));
    }
    let compiled =
        draft_guarded(source).map_err(|problems| Error::invalid("policy", join(&problems)))?;
    let mut tx = ds.begin().await?;
    let current = db::policy_version_locked(&mut tx, ctx).await?;
    if current != expected {
        return Err(Error::WrongState {
            message: format!(
                "the policy set changed while you edited it: version {current} is in force, your edit started from version {expected}; nothing was saved. Read version {current}, apply your change to it and set it again"
            ),
            use_instead: None,
        });
    }
    let old = match current {
        0 => String::new(),
        v => db::policy_source(&mut *tx, ctx, v).await?.unwrap_or_default(),
    };
    // Parsed again to compare, so on the large stack as well; a comparison that could not run
    // counts as widening.
    let new = source.to_owned();
    let widens = on_large_stack(move || crate::policies::widens(&old, &new)).unwrap_or(true);
    let version = current + 1;
    if widens {
        let digest = crate::canon::sha256_hex(source.as_bytes());
        let decision = crate::services::passkeys::Decision::policy_widen(version, &digest);
        crate::services::passkeys::require(&mut tx, ctx, &decision).await?;
    }
    let author = ctx.actor_handle().unwrap_or("operator").to_owned();
    db::policy_insert(&mut tx, ctx, version, source, &author, note).await?;
    let change = db::change("policy_version", current.to_string(), version.to_string());
    db::audit_insert(
        &mut tx,
        ctx,
        AuditEntry {
            action: "policy.set",
            outcome: "ok",
            targets: Vec::new(),
            pending_action: None,
            reason: Some(note).filter(|n| !n.is_empty()),
            change: Some(change),
            policy: None,
            call_facts: None,
        },
    )
    .await?;
    tx.commit().await?;
    Ok(PolicySetOutcome {
        version,
        previous: current,
        widens,
        policies: compiled.policies().cloned().collect(),
    })
}

/// One version in the history, with what it changed from the one before.
#[derive(Debug, Serialize)]
pub struct PolicyVersion {
    pub version: i32,
    pub author: String,
    pub note: String,
    pub set_at: String,
    /// Lines added since the previous version.
    pub added: Vec<String>,
    /// Lines removed since the previous version.
    pub removed: Vec<String>,
}

pub async fn history(ds: &Services, ctx: &OpCtx, limit: i64) -> Result<Vec<PolicyVersion>> {
    ctx.require(Right::TenantSwitch)?;
    let rows = ds.policy_history(ctx, limit.clamp(1, 100) + 1).await?;
    let mut out = Vec::new();
    for (i, row) in rows.iter().enumerate().take(limit.clamp(1, 100) as usize) {
        let before = rows.get(i + 1).map(|r| r.source.as_str()).unwrap_or_default();
        let (added, removed) = diff(before, &row.source);
        out.push(PolicyVersion {
            version: row.version,
            author: row.author.clone(),
            note: row.note.clone(),
            set_at: row.created_at.to_rfc3339(),
            added,
            removed,
        });
    }
    Ok(out)
}

/// The lines of `after` not in `before`, and of `before` not in `after`.
fn diff(before: &str, after: &str) -> (Vec<String>, Vec<String>) {
    let lines = |s: &str| -> Vec<String> {
        s.lines().map(str::trim_end).filter(|l| !l.trim().is_empty()).map(str::to_owned).collect()
    };
    let (b, a) = (lines(before), lines(after));
    let added = a.iter().filter(|l| !b.contains(l)).cloned().collect();
    let removed = b.iter().filter(|l| !a.contains(l)).cloned().collect();
    (added, removed)
}
