//! The two-step rail (R7): tools of class notify, wake, alert and delete only prepare. Each
//! operation implements [`TwoStep`] next to its resource (bookings, customers, technicians,
//! alert rules) with the types of `services::two_step`; this module is the rail every one of
//! them runs on, and it reaches their plans only through `services::planners`.
//!
//! `prepare` plans the action against the current state, stores a pending action (connection,
//! tool, normalized arguments and digest, hash of exactly what will be sent or changed, a
//! server-written summary, a hashed single-use token, an expiry) and returns a preview.
//! `confirm` runs under `pg_advisory_xact_lock` on the pending action and checks: same
//! connection, unused, not rejected, unexpired, the exact summary, the live right; then it plans
//! again under row locks and compares the content hash. A different hash kills the token and
//! returns a new preview (`changed_since_preview`); the same hash executes, writing the outbox
//! rows of the effect in the same transaction. Previews, executions, rejections and refusals
//! are audited and linked to their pending action (R19).

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canon::{canonical_json, sha256_hex};
use crate::ctx::OpCtx;
use crate::datastore::{
    self as db, AuditEntry, NewMessage, NewPending, Services, Tx, from_ts, to_ts,
};
use crate::error::{ActionRefusal, Error, Resource, Result};
use crate::policies::Verdict;
use crate::secret;
use crate::services::approvals::{self, Completion, Decided};
use crate::services::budgets;
use crate::services::outcome::{
    Approval, Changed, Executed, ExecutedResult, ExecutedStatus, NothingChanged, Outcome, Preview,
    PreviewStatus, Rejected,
};
use crate::services::passkeys::Decision;
use crate::services::planners::plan;
use crate::services::policies;
use crate::services::rails::args_digest;
use crate::services::two_step::{Apply, At, Plan};
pub use crate::services::two_step::{Op, TwoStep};
use crate::time;
use crate::views;

mod mrtr;
mod person;
mod preview;

use preview::*;

pub use mrtr::{ConfirmState, confirm_sealed, confirm_state, request_digest};
pub use person::{approve, deny};

// ------------------------------------------------------------------ inputs of the rail

/// Execute a prepared action.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfirmActionInput {
    /// The confirm_token of the preview.
    pub confirm_token: String,
    /// The confirm_summary of the preview, exactly as given.
    pub confirm_summary: String,
}

/// Discard a prepared action.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectActionInput {
    /// The confirm_token of the preview.
    pub confirm_token: String,
}

async fn apply(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    plan: &Plan,
    pending: (i64, &str),
    now: Timestamp,
) -> Result<ExecutedResult> {
    for (i, m) in plan.messages.iter().enumerate() {
        let key = format!("{}:{i}", pending.1);
        db::outbox_insert(
            tx,
            ctx,
            NewMessage {
                pending_action_id: Some(pending.0),
                channel: m.channel,
                recipient: &m.recipient,
                subject: &m.subject,
                body: &m.body,
                idempotency_key: &key,
            },
        )
        .await?;
    }
    let changed = match &plan.apply {
        Apply::Nothing => Changed::Nothing(NothingChanged {}),
        Apply::SetStatus { ids, status } => {
            let mut out = Vec::new();
            for (id, handle) in ids {
                let row = db::booking_lock(tx, ctx, handle)
                    .await?
                    .ok_or_else(|| Error::not_found(Resource::Booking, handle))?;
                db::booking_update(
                    tx,
                    ctx,
                    *id,
                    db::BookingChange {
                        technician_id: row.technician_id,
                        service_id: row.service_id,
                        starts_at: row.starts_at,
                        net_minor: row.net_minor,
                        tax_minor: row.tax_minor,
                        priority: &row.priority,
                        reference: row.reference.as_deref(),
                        status,
                    },
                )
                .await?;
                let after = db::booking_lock(tx, ctx, handle)
                    .await?
                    .ok_or_else(|| Error::not_found(Resource::Booking, handle))?;
                out.push(views::booking(&after, false, now));
            }
            Changed::Bookings { bookings: out }
        }
        Apply::Reschedule { id, handle, starts_at } => {
            let row = db::booking_lock(tx, ctx, handle)
                .await?
                .ok_or_else(|| Error::not_found(Resource::Booking, handle))?;
            db::booking_update(
                tx,
                ctx,
                *id,
                db::BookingChange {
                    technician_id: row.technician_id,
                    service_id: row.service_id,
                    starts_at: from_ts(*starts_at),
                    net_minor: row.net_minor,
                    tax_minor: row.tax_minor,
                    priority: &row.priority,
                    reference: row.reference.as_deref(),
                    status: &row.status,
                },
            )
            .await?;
            let after = db::booking_lock(tx, ctx, handle)
                .await?
                .ok_or_else(|| Error::not_found(Resource::Booking, handle))?;
            Changed::Booking { booking: Box::new(views::booking(&after, false, now)) }
        }
        Apply::Mute { id, until, .. } => {
            db::alert_rule_mute(tx, ctx, *id, from_ts(*until)).await?;
            let tenant = ctx.tenant();
            Changed::Muted {
                muted_until: time::present(*until, &tenant.zone, &tenant.zone_name, now),
            }
        }
        Apply::DeleteCustomer { id } => {
            db::customer_delete(tx, ctx, *id).await?;
            Changed::Deleted { deleted: plan.targets.clone() }
        }
        Apply::DeleteBooking { id } => {
            db::booking_delete(tx, ctx, *id).await?;
            Changed::Deleted { deleted: plan.targets.clone() }
        }
    };
    Ok(ExecutedResult { changed, messages_queued: plan.messages.len() })
}

// ------------------------------------------------------------------ the two steps

fn connection_id(ctx: &OpCtx) -> Result<i64> {
    ctx.connection().map(|c| c.id).ok_or_else(|| {
        Error::invalid("connection", "two-step actions are taken through an agent connection")
    })
}

/// Step one: plan the action and return a preview. Executes nothing.
pub async fn prepare<T: TwoStep + Serialize>(
    ds: &Services,
    ctx: &OpCtx,
    input: &T,
    now: Timestamp,
) -> Result<Preview> {
    // The operation is the input's own: a tool cannot pair one operation with another's input.
    let op = T::OP;
    ctx.require(op.right())?;
    connection_id(ctx)?;
    let args = serde_json::to_value(input).map_err(|e| Error::Internal(e.to_string()))?;
    let args = Value::Object(
        args.as_object()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .collect(),
    );
    let mut tx = ds.begin().await?;
    // The tenant's policy decides who completes it, read in the same transaction.
    let (mode, approver_not_creator) = approvals::policy_tx(&mut tx, ctx).await?.for_op(op);
    if mode == Completion::Off {
        return Err(Error::TurnedOff { tool: op.name().to_owned(), class: op.class().as_str() });
    }
    let plan = plan(&mut tx, ctx, op, &args, At::fresh(now)).await?;
    // The tenant's policies, with what the plan touches: a `forbid` refuses (audited), an
    // `@approval` one sends the action to a person.
    let asked = policies::TwoStepCall {
        connection_id: connection_id(ctx)?,
        tool: op.name(),
        class: op.class(),
        args: &args,
        targets: &plan.targets,
        effects: plan.effects(),
        pending: None,
        phase: "prepare",
        now,
    };
    let policies::Judged { verdict, record } = policies::two_step(ds, &mut tx, ctx, &asked).await?;
    if let Some(error) = policies::refused_by(&verdict) {
        let action = format!("{}.preview", op.name());
        let why = error.to_string();
        let entry = AuditEntry {
            action: &action,
            outcome: "refused",
            targets: plan.targets.clone(),
            pending_action: None,
            reason: Some(&why),
            change: None,
            policy: record,
            call_facts: policies::call_facts(ctx, op.name(), &args),
        };
        db::audit_insert(&mut tx, ctx, entry).await?;
        tx.commit().await?;
        return Err(error);
    }
    let policy = match verdict {
        Verdict::Approval(p) => Some(p),
        _ => None,
    };
    let completes = Completes {
        connection_id: connection_id(ctx)?,
        mode,
        approver_not_creator,
        policy,
        decided: record,
    };
    let preview = store_preview(&mut tx, ctx, ds, op, &args, &plan, now, completes).await?;
    tx.commit().await?;
    Ok(preview)
}

/// Hands an action that was the agent's to confirm to a person, saying why (a budget, a
/// policy), audited as `action` (with what it records of the policy set that judged it) and
/// committed.
#[expect(clippy::too_many_arguments, reason = "one step of the confirm engine")]
async fn wait_for_person(
    mut tx: Tx<'static>,
    ctx: &OpCtx,
    op: Op,
    p: &db::PendingRow,
    action: &str,
    why: &str,
    record: Option<Value>,
    now: Timestamp,
) -> Result<()> {
    to_person(&mut tx, ctx, op, p, false, now).await?;
    budgets::note(&mut tx, ctx, p.id, why).await?;
    let entry = AuditEntry {
        action,
        outcome: "awaiting_approval",
        targets: Vec::new(),
        pending_action: Some(p.id),
        reason: Some(why),
        change: None,
        policy: record,
        call_facts: None,
    };
    db::audit_insert(&mut tx, ctx, entry).await?;
    tx.commit().await?;
    Ok(())
}

/// Refuses an action by the tenant's policy (at confirm, or a person's approval): audited as
/// `action` with the policy named, linked to the action, and committed; then the error.
pub(super) async fn refuse_naming(
    mut tx: Tx<'static>,
    ctx: &OpCtx,
    action: &str,
    pending: i64,
    error: Error,
    record: Option<Value>,
) -> Error {
    let why = error.to_string();
    let entry = AuditEntry {
        action,
        outcome: "refused",
        targets: Vec::new(),
        pending_action: Some(pending),
        reason: Some(&why),
        change: None,
        policy: record,
        call_facts: None,
    };
    if let Err(e) = db::audit_insert(&mut tx, ctx, entry).await {
        return e;
    }
    if let Err(e) = tx.commit().await {
        return e.into();
    }
    error
}

/// Refuses a token: audited (linked to its action) and committed, then the error.
async fn refuse(mut tx: Tx<'static>, ctx: &OpCtx, tool: &str, pending: i64, error: Error) -> Error {
    let action = format!("{tool}.confirm");
    let entry = AuditEntry {
        action: &action,
        outcome: "refused",
        targets: Vec::new(),
        pending_action: Some(pending),
        reason: None,
        change: None,
        policy: None,
        call_facts: None,
    };
    if let Err(e) = db::audit_insert(&mut tx, ctx, entry).await {
        return e;
    }
    match tx.commit().await {
        Ok(()) => error,
        Err(e) => e.into(),
    }
}

fn refused(reason: ActionRefusal, message: impl Into<String>) -> Error {
    Error::ActionRefused { reason, message: message.into() }
}

enum Opened {
    /// This connection's pending action, locked for the rest of the transaction.
    Mine(Tx<'static>, Box<db::PendingRow>),
    /// Unknown, or another connection's (refusal audited).
    Refused(Error),
}

/// Finds the pending action of a token under its advisory lock and checks that it belongs to
/// this connection; both steps start here.
async fn open_pending(ds: &Services, ctx: &OpCtx, token: &str) -> Result<Opened> {
    let mut tx = ds.begin().await?;
    let Some(p) =
        db::pending_lock_by_token(&mut tx, ctx, &secret::hash_token(token.trim())).await?
    else {
        return Ok(Opened::Refused(refused(
            ActionRefusal::Unknown,
            "this confirm_token is not known; prepare the action again",
        )));
    };
    if Some(p.connection_id) != ctx.connection().map(|c| c.id) {
        let error = refused(
            ActionRefusal::OtherConnection,
            "this confirm_token belongs to another connection; prepare the action on this one",
        );
        return Ok(Opened::Refused(refuse(tx, ctx, &p.tool, p.id, error).await));
    }
    Ok(Opened::Mine(tx, Box::new(p)))
}

/// Step two: execute a previewed action after every check.
pub async fn confirm(
    ds: &Services,
    ctx: &OpCtx,
    input: &ConfirmActionInput,
    now: Timestamp,
) -> Result<Executed> {
    let (tx, p) = match open_pending(ds, ctx, &input.confirm_token).await? {
        Opened::Mine(tx, p) => (tx, *p),
        Opened::Refused(error) => return Err(error),
    };
    if p.completion == db::PendingCompletion::PersonApproves {
        // A person decides this one: the agent learns the outcome and can never complete it.
        drop(tx);
        return match p.status {
            db::PendingStatus::Executed => p
                .result
                .and_then(|r| serde_json::from_value(r).ok())
                .ok_or_else(|| Error::Internal(format!("action {} has no result", p.handle))),
            db::PendingStatus::Rejected => Err(refused(
                ActionRefusal::Denied,
                format!(
                    "a person denied action {}: {}",
                    p.handle,
                    p.decision_reason.as_deref().unwrap_or("no reason given")
                ),
            )),
            db::PendingStatus::Superseded => match p.replaced_by.as_deref() {
                Some(newer) => Err(refused(
                    ActionRefusal::AwaitingApproval,
                    format!(
                        "action {} changed before it was approved; its new version {newer} waits for a person (this token follows it)",
                        p.handle
                    ),
                )),
                None => Err(refused(
                    ActionRefusal::Used,
                    format!("action {} no longer applies and was dropped", p.handle),
                )),
            },
            _ if p.expired => Err(refused(
                ActionRefusal::Expired,
                format!("action {} expired before anyone approved it", p.handle),
            )),
            _ => Err(refused(
                ActionRefusal::AwaitingApproval,
                format!("action {} waits for a person's approval in the console", p.handle),
            )),
        };
    }
    // Every reason this token cannot execute, checked in order; each refusal is audited.
    let refusal = state_refusal(&p).or_else(|| {
        (input.confirm_summary != p.summary).then(|| {
            refused(
                ActionRefusal::SummaryMismatch,
                "confirm_summary differs from the one issued; pass it exactly as the preview gave it",
            )
        })
    });
    if let Some(error) = refusal {
        return Err(refuse(tx, ctx, &p.tool, p.id, error).await);
    }
    execute(ds, tx, ctx, p, now).await
}

/// Why a pending action's state refuses it, whichever way it is confirmed.
fn state_refusal(p: &db::PendingRow) -> Option<Error> {
    match p.status {
        db::PendingStatus::Executed => Some(refused(
            ActionRefusal::AlreadyExecuted,
            format!(
                "action {} ran once already (an earlier confirm_action, possibly one whose answer was lost) and does not run again",
                p.handle
            ),
        )),
        db::PendingStatus::Rejected => {
            Some(refused(ActionRefusal::Rejected, format!("action {} was rejected", p.handle)))
        }
        db::PendingStatus::Superseded => Some(refused(
            ActionRefusal::Used,
            format!("action {} was replaced by a newer preview; use its token", p.handle),
        )),
        _ if p.expired => Some(refused(
            ActionRefusal::Expired,
            format!("action {} expired; prepare it again", p.handle),
        )),
        _ => None,
    }
}

/// The confirm engine once a pending action is locked and its token accepted: the live right,
/// a re-plan under row locks and the content-hash compare, then one execution, audited.
async fn execute(
    ds: &Services,
    mut tx: Tx<'static>,
    ctx: &OpCtx,
    p: db::PendingRow,
    now: Timestamp,
) -> Result<Executed> {
    let op = Op::by_name(&p.tool)
        .ok_or_else(|| Error::Internal(format!("unknown pending tool {}", p.tool)))?;
    if let Err(e) = ctx.require(op.right()) {
        return Err(refuse(tx, ctx, &p.tool, p.id, e).await);
    }
    // The policy as it is now, not as it was at the preview: an action the tenant has since
    // turned off dies, and one a person must now approve goes to them instead.
    let (mode, approver_not_creator) = approvals::policy_tx(&mut tx, ctx).await?.for_op(op);
    match mode {
        Completion::AgentConfirms => {}
        Completion::Off => {
            db::pending_decide(&mut tx, ctx, p.id, db::PendingStatus::Superseded, None).await?;
            let error = Error::TurnedOff { tool: op.name().to_owned(), class: op.class().as_str() };
            return Err(refuse(tx, ctx, &p.tool, p.id, error).await);
        }
        Completion::PersonApproves => {
            to_person(&mut tx, ctx, op, &p, approver_not_creator, now).await?;
            tx.commit().await?;
            return Err(refused(
                ActionRefusal::AwaitingApproval,
                format!(
                    "the tenant now requires a person's approval: action {} waits in the console",
                    p.handle
                ),
            ));
        }
    }
    let action = format!("{}.confirm", p.tool);
    let completes = Completes {
        connection_id: p.connection_id,
        mode: Completion::AgentConfirms,
        approver_not_creator: false,
        policy: None,
        decided: None,
    };
    let plan = match replan(ds, &mut tx, ctx, op, &p, now, &action, completes).await? {
        Replanned::Same(plan) => plan,
        Replanned::Failed(e) => {
            tx.commit().await?;
            return Err(e);
        }
        Replanned::Changed(preview) => {
            tx.commit().await?;
            return Err(Error::ChangedSincePreview {
                preview: Box::new(super::presented(&preview)?),
            });
        }
    };
    // The tenant's policies again, as they are now and with what the plan touches now.
    let asked = pending_call(&p, op, &plan, "confirm", now);
    let policies::Judged { verdict, record } = policies::two_step(ds, &mut tx, ctx, &asked).await?;
    if let Some(error) = policies::refused_by(&verdict) {
        db::pending_decide(&mut tx, ctx, p.id, db::PendingStatus::Superseded, None).await?;
        return Err(refuse_naming(tx, ctx, &action, p.id, error, record).await);
    }
    if let Verdict::Approval(policy) = verdict {
        let why = format!("named by the tenant's policy `{}` ({})", policy.id, policy.reason);
        wait_for_person(tx, ctx, op, &p, &action, &why, record, now).await?;
        return Err(refused(
            ActionRefusal::AwaitingApproval,
            format!("{why}; action {} now waits for a person's approval in the console", p.handle),
        ));
    }
    // The budgets again, under the action's lock and theirs: lowered since the preview, or
    // used up by actions executed meanwhile, it goes to a person instead.
    let over = budgets::check(&mut tx, ctx, p.connection_id, Some(p.id), &plan.effects()).await?;
    if let Some(why) = budgets::reason(&over) {
        wait_for_person(tx, ctx, op, &p, &action, &why, record, now).await?;
        return Err(refused(
            ActionRefusal::AwaitingApproval,
            format!(
                "this action would go {why}: action {} now waits for a person's approval in the console",
                p.handle
            ),
        ));
    }
    run_once(tx, ctx, op, &p, &plan, None, record, now).await
}

/// A pending action as the tenant's policies are asked about it: the connection that asked
/// for it, its tool and arguments, and the records its plan touches now.
fn pending_call<'a>(
    p: &'a db::PendingRow,
    op: Op,
    plan: &'a Plan,
    phase: &'static str,
    now: Timestamp,
) -> policies::TwoStepCall<'a> {
    policies::TwoStepCall {
        connection_id: p.connection_id,
        tool: op.name(),
        class: op.class(),
        args: &p.args,
        targets: &plan.targets,
        effects: plan.effects(),
        // A confirmation's own reservation is not counted against it; a fresh preview has
        // none yet.
        pending: (phase == "confirm").then_some(p.id),
        phase,
        now,
    }
}

/// What re-planning a locked pending action found.
enum Replanned {
    /// It would do exactly what was previewed: run this plan.
    Same(Plan),
    /// It no longer applies (the booking was deleted, confirmed elsewhere…): the action is
    /// dropped and the failure audited; commit and answer the error.
    Failed(Error),
    /// What it would do changed: the action is dropped and a new preview stored (completed as
    /// `completes` says); commit and show it.
    Changed(Preview),
}

/// The confirm engine's one re-plan, whoever completes the action (the agent's
/// `confirm_action`, a person's approval, the multi round-trip retry): plan again under row
/// locks, at the preview's instant, and compare content hashes. Only a plan that hashes the
/// same may run; anything else drops the action in `tx`, so no decision ever runs a version
/// nobody saw.
#[expect(clippy::too_many_arguments, reason = "the engine's one re-plan step")]
async fn replan(
    ds: &Services,
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    op: Op,
    p: &db::PendingRow,
    now: Timestamp,
    action: &str,
    completes: Completes,
) -> Result<Replanned> {
    let at = At { now, previewed: to_ts(p.created_at) };
    let plan = match plan(tx, ctx, op, &p.args, at).await {
        Ok(plan) => plan,
        Err(e) => {
            db::pending_decide(tx, ctx, p.id, db::PendingStatus::Superseded, None).await?;
            let entry = AuditEntry {
                action,
                outcome: "failed",
                targets: Vec::new(),
                pending_action: Some(p.id),
                reason: None,
                change: None,
                policy: None,
                call_facts: None,
            };
            db::audit_insert(tx, ctx, entry).await?;
            return Ok(Replanned::Failed(e));
        }
    };
    if plan.content_hash == p.content_hash {
        return Ok(Replanned::Same(plan));
    }
    db::pending_decide(tx, ctx, p.id, db::PendingStatus::Superseded, None).await?;
    // The new preview promises what holds from now on, and is a new preparation: the tenant's
    // policies decide it as they decide any.
    let fresh = self::plan(tx, ctx, op, &p.args, At::fresh(now)).await?;
    let asked = pending_call(p, op, &fresh, "prepare", now);
    let mut completes = completes;
    let policies::Judged { verdict, record } = policies::two_step(ds, tx, ctx, &asked).await?;
    match verdict {
        Verdict::Allow => completes.decided = record,
        Verdict::Approval(policy) => {
            completes.policy = Some(policy);
            completes.decided = record;
        }
        refused => {
            let error = policies::refused_by(&refused)
                .unwrap_or_else(|| Error::Internal("a refusal without an error".into()));
            let why = error.to_string();
            let entry = AuditEntry {
                action,
                outcome: "refused",
                targets: fresh.targets.clone(),
                pending_action: Some(p.id),
                reason: Some(&why),
                change: None,
                policy: record,
                call_facts: None,
            };
            db::audit_insert(tx, ctx, entry).await?;
            return Ok(Replanned::Failed(error));
        }
    }
    Ok(Replanned::Changed(store_preview(tx, ctx, ds, op, &p.args, &fresh, now, completes).await?))
}

/// Executes a re-planned action once and commits: its changes and messages, the action marked
/// executed with what it returned (and who approved it, if a person did), one audit row that
/// keeps tool, outcome and public ids (R19, R23; a person's reason stays on the action).
#[expect(clippy::too_many_arguments, reason = "one step of the confirm engine")]
async fn run_once(
    mut tx: Tx<'static>,
    ctx: &OpCtx,
    op: Op,
    p: &db::PendingRow,
    plan: &Plan,
    approved: Option<(i64, &str)>,
    record: Option<Value>,
    now: Timestamp,
) -> Result<Executed> {
    use crate::telemetry::{self, Attr, Name};
    let attrs = [Attr::Tool(op.name()), Attr::Class(op.class())];
    let work = async move {
        // What it does counts against its connection's budgets, whoever completes it (in the
        // same transaction: a failed apply counts nothing).
        budgets::count(&mut tx, ctx, p.connection_id, p.id, &plan.effects()).await?;
        let result = apply(&mut tx, ctx, plan, (p.id, &p.handle), now).await?;
        let out = Executed {
            status: ExecutedStatus::Executed,
            action: p.handle.clone(),
            tool: op.name().to_owned(),
            summary: p.summary.clone(),
            result,
            approved: approved.map(|(_, reason)| Approval {
                by: ctx.actor_handle().map(str::to_owned),
                reason: reason.to_owned(),
                proven: ctx.proof().map(|p| p.phrase().to_owned()),
            }),
        };
        if let Some((person, reason)) = approved {
            db::pending_decided_by(&mut tx, ctx, p.id, Some(person), reason).await?;
        }
        let stored = serde_json::to_value(&out).map_err(|e| Error::Internal(e.to_string()))?;
        db::pending_decide(&mut tx, ctx, p.id, db::PendingStatus::Executed, Some(&stored)).await?;
        db::audit_insert(
            &mut tx,
            ctx,
            AuditEntry {
                action: op.name(),
                outcome: "ok",
                targets: plan.targets.clone(),
                pending_action: Some(p.id),
                // The approver's comment, when they gave one.
                reason: approved.map(|(_, r)| r).filter(|r| !r.is_empty()),
                change: None,
                policy: record,
                call_facts: None,
            },
        )
        .await?;
        tx.commit().await?;
        Ok(out)
    };
    telemetry::child(Name::MethodTarget("gatehouse.confirm.execute", op.name()), &attrs, work).await
}

pub async fn reject(ds: &Services, ctx: &OpCtx, input: &RejectActionInput) -> Result<Rejected> {
    let (mut tx, p) = match open_pending(ds, ctx, &input.confirm_token).await? {
        Opened::Mine(tx, p) => (tx, *p),
        Opened::Refused(error) => return Err(error),
    };
    if p.completion == db::PendingCompletion::PersonApproves {
        return Err(refused(
            ActionRefusal::AwaitingApproval,
            format!(
                "action {} is a person's to approve or deny in the console, not the agent's",
                p.handle
            ),
        ));
    }
    if p.status != db::PendingStatus::Pending {
        return Err(refuse(
            tx,
            ctx,
            &p.tool,
            p.id,
            refused(ActionRefusal::Used, format!("action {} is {} already", p.handle, p.status)),
        )
        .await);
    }
    db::pending_decide(&mut tx, ctx, p.id, db::PendingStatus::Rejected, None).await?;
    let action = format!("{}.reject", p.tool);
    db::audit_insert(
        &mut tx,
        ctx,
        AuditEntry {
            action: &action,
            outcome: "rejected",
            targets: Vec::new(),
            pending_action: Some(p.id),
            reason: None,
            change: None,
            policy: None,
            call_facts: None,
        },
    )
    .await?;
    tx.commit().await?;
    Ok(Rejected::new(p.handle, p.tool))
}
