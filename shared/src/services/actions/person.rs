//! A person decides an action that waits for them (`person_approves`): approve or deny in the
//! console. Approving runs the same engine an agent's confirmation runs (the
//! re-plan, the content-hash compare, one execution), with the approver as the actor.

use jiff::Timestamp;

use super::*;

/// A person approves a waiting action in the console (or the REST API): the action runs once, through the same engine an
/// agent's confirmation uses.
pub async fn approve(
    ds: &Services,
    ctx: &OpCtx,
    handle: &str,
    reason: &str,
    now: jiff::Timestamp,
) -> Result<Decided> {
    decide(ds, ctx, handle, reason, true, now).await
}

/// A person denies a waiting action; the agent is told, with the reason.
pub async fn deny(
    ds: &Services,
    ctx: &OpCtx,
    handle: &str,
    reason: &str,
    now: jiff::Timestamp,
) -> Result<Decided> {
    decide(ds, ctx, handle, reason, false, now).await
}

/// A person approves or denies an action that waits for them (`person_approves`), under the
/// same lock and checks as `confirm_action`: the action's state and expiry, the approver's
/// live right, the policy's rule on who may approve, the connection still active, the switches,
/// and a re-plan whose content hash must match. Executes at most once.
pub(crate) async fn decide(
    ds: &Services,
    ctx: &OpCtx,
    raw: &str,
    reason: &str,
    approve: bool,
    now: Timestamp,
) -> Result<Decided> {
    let person = ctx.actor_person_id().ok_or(Error::NoActor)?;
    let handle = raw.trim();
    if !handle.starts_with("pac_") || handle.len() > 64 {
        return Err(approvals::no_such_action(raw));
    }
    let reason = approvals::decision_reason(reason)?;
    let mut tx = ds.begin().await?;
    let Some(p) = db::pending_lock_by_handle(&mut tx, ctx, handle).await? else {
        return Err(approvals::no_such_action(raw));
    };
    // Actions the agent completes are not the console's to decide.
    if p.completion != db::PendingCompletion::PersonApproves {
        return Err(approvals::no_such_action(raw));
    }
    let op = Op::by_name(&p.tool)
        .ok_or_else(|| Error::Internal(format!("unknown pending tool {}", p.tool)))?;
    ctx.require(op.right())?;
    // The rule on who may approve is the stricter of the one stored and the one now in force.
    let (now_mode, now_not_creator) = approvals::policy_tx(&mut tx, ctx).await?.for_op(op);
    let not_creator = p.approver_not_creator || now_not_creator;
    // The connection that asked must still hold the right: its creator may have been demoted.
    let asker_holds = db::connection_live_rights(&mut tx, ctx, p.connection_id)
        .await?
        .is_some_and(|rights| rights.contains(op.right()));
    let refusal = match p.status {
        db::PendingStatus::Executed | db::PendingStatus::Rejected | db::PendingStatus::Superseded => Some(refused(
            ActionRefusal::Used,
            format!("action {} was decided already ({})", p.handle, p.status),
        )),
        _ if p.expired => {
            Some(refused(ActionRefusal::Expired, format!("action {} expired", p.handle)))
        }
        _ if p.connection_status != "active" => Some(Error::WrongState {
            message: format!("the connection that asked for action {} was revoked", p.handle),
            use_instead: None,
        }),
        _ if approve && now_mode == Completion::Off => Some(Error::TurnedOff {
            tool: op.name().to_owned(),
            class: op.class().as_str(),
        }),
        _ if approve && !asker_holds => Some(Error::WrongState {
            message: format!(
                "the connection that asked for action {} no longer holds {} (its creator's role changed)",
                p.handle,
                op.right().as_str()
            ),
            use_instead: None,
        }),
        _ if approve && not_creator && p.creator_id == person => Some(Error::WrongState {
            message: "this tenant's policy needs someone other than the connection's creator to approve it".into(),
            use_instead: None,
        }),
        _ => None,
    };
    if let Some(error) = refusal {
        return Err(error);
    }
    let action = format!("{}.{}", p.tool, if approve { "approve" } else { "deny" });
    if approve {
        // Under the passkey policy, an assertion made for this action as it is now.
        let decision = Decision::approve_action(&p.handle, &p.content_hash);
        crate::services::passkeys::require(&mut tx, ctx, &decision).await?;
    }
    if !approve {
        db::pending_decide(&mut tx, ctx, p.id, db::PendingStatus::Rejected, None).await?;
        db::pending_decided_by(&mut tx, ctx, p.id, Some(person), &reason).await?;
        let entry = AuditEntry {
            action: &action,
            outcome: "denied",
            targets: Vec::new(),
            pending_action: Some(p.id),
            reason: Some(reason.as_str()).filter(|r| !r.is_empty()),
            change: None,
            policy: None,
            call_facts: None,
        };
        db::audit_insert(&mut tx, ctx, entry).await?;
        tx.commit().await?;
        return Ok(Decided::Denied { action: p.handle });
    }
    let (agent_access, killed) = db::switches(&mut tx, ctx).await?;
    if killed || !agent_access {
        return Err(Error::WrongState {
            message:
                "agent access is turned off, so agents' actions wait; turn it back on to approve"
                    .into(),
            use_instead: None,
        });
    }
    // The person is shown a changed action's new version; this one can never execute.
    let completes = Completes {
        connection_id: p.connection_id,
        mode: Completion::PersonApproves,
        approver_not_creator: p.approver_not_creator,
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
            let replaced_by = preview.action;
            // The agent's token follows the action to its new version.
            db::pending_replaced(&mut tx, ctx, p.id, &replaced_by).await?;
            tx.commit().await?;
            return Ok(Decided::Changed { action: p.handle, replaced_by });
        }
    };
    // A person's approval answers an `@approval` policy; a `forbid` refuses even them.
    let asked = pending_call(&p, op, &plan, "confirm", now);
    let policies::Judged { verdict, record } = policies::two_step(ds, &mut tx, ctx, &asked).await?;
    if let Some(error) = policies::refused_by(&verdict) {
        // As on the agent's path: the action can never run, so it leaves the queue.
        db::pending_decide(&mut tx, ctx, p.id, db::PendingStatus::Superseded, None).await?;
        return Err(refuse_naming(tx, ctx, &action, p.id, error, record).await);
    }
    let out = run_once(tx, ctx, op, &p, &plan, Some((person, &reason)), record, now).await?;
    Ok(Decided::Executed { action: p.handle, result: Box::new(out) })
}
