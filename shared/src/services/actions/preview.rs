//! Storing a preview and handing an action to a person: who completes it, the pending row,
//! its budget reservation or note, its audit row, and the approvers told through the outbox.

use super::*;

/// Who completes a pending action, fixed when it is stored.
#[derive(Clone)]
pub(super) struct Completes {
    pub(super) connection_id: i64,
    pub(super) mode: Completion,
    pub(super) approver_not_creator: bool,
    /// The tenant's `@approval` policy that sends this action to a person, when one does.
    pub(super) policy: Option<crate::policies::PolicyInfo>,
    /// What the preview's audit row records of the policy set that judged it.
    pub(super) decided: Option<Value>,
}

/// Stores a pending action for `plan` and returns the preview. An action a person must
/// approve says so, and the members who could approve it are told through the outbox.
///
/// Budgets are checked here, under their locks: an action that would pass one waits for a
/// person whatever the policy; one the agent may confirm reserves its effects, so the next
/// preview on any worker counts it.
#[expect(clippy::too_many_arguments, reason = "the rail's one storing step")]
pub(super) async fn store_preview(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    ds: &Services,
    op: Op,
    args: &Value,
    plan: &Plan,
    now: Timestamp,
    completes: Completes,
) -> Result<Preview> {
    let effects = plan.effects();
    let over = budgets::check(tx, ctx, completes.connection_id, None, &effects).await?;
    let policy_note = completes
        .policy
        .as_ref()
        .map(|p| format!("named by the tenant's policy `{}` ({})", p.id, p.reason));
    let over_budget = budgets::reason(&over);
    let budget = over_budget.clone().or(policy_note);
    let mut completes = completes;
    if budget.is_some() && completes.mode == Completion::AgentConfirms {
        completes.mode = Completion::PersonApproves;
        completes.approver_not_creator = false;
    }
    let previewed = At::fresh(now).previewed;
    let token =
        format!("cfm_{}", &secret::generate(secret::CredentialKind::Session)["gh_ses_".len()..]);
    let handle = format!("pac_{}", &crate::handle::NoteHandle::generate().as_str()[4..]);
    let content_hash = plan.content_hash.clone();
    let person = completes.mode == Completion::PersonApproves;
    // The line a person approves shows all it says: record text written before names were
    // checked (or by another channel) cannot reorder it, hide part of it or start a new line.
    let summary = crate::text::one_line(&plan.summary);
    let (id, expires_at) = db::pending_insert(
        tx,
        ctx,
        NewPending {
            handle: &handle,
            connection_id: completes.connection_id,
            tool: op.name(),
            args,
            args_digest: &args_digest(args),
            content_hash: &content_hash,
            summary: &summary,
            token_hash: &secret::hash_token(&token),
            ttl_seconds: ds.policy().action_ttl_secs,
            previewed_at: from_ts(previewed),
            completion: completes.mode.as_str(),
            approver_not_creator: completes.approver_not_creator,
            preview: &Value::Object(plan.preview.clone()),
        },
    )
    .await?;
    match &budget {
        Some(why) => budgets::note(tx, ctx, id, why).await?,
        None if !person => {
            budgets::reserve(tx, ctx, completes.connection_id, id, &effects).await?;
        }
        None => {}
    }
    let action = format!("{}.preview", op.name());
    db::audit_insert(
        tx,
        ctx,
        AuditEntry {
            action: &action,
            outcome: if person { "awaiting_approval" } else { "previewed" },
            targets: plan.targets.clone(),
            pending_action: Some(id),
            reason: budget.as_deref(),
            change: None,
            policy: completes.decided.clone(),
            call_facts: crate::services::policies::call_facts(ctx, op.name(), args),
        },
    )
    .await?;
    let expires =
        time::present(to_ts(expires_at), &ctx.tenant().zone, &ctx.tenant().zone_name, now);
    if person {
        tell_approvers(tx, ctx, op, (id, &handle), completes.clone(), &expires.display).await?;
    }
    Ok(Preview {
        status: if person { PreviewStatus::AwaitingApproval } else { PreviewStatus::Preview },
        action: handle,
        tool: op.name().to_owned(),
        confirm_token: token,
        confirm_summary: summary,
        expires,
        effect: plan.preview.clone(),
        next: match (&budget, person) {
            (Some(why), _) if over_budget.is_none() => approvals::policy_note(why),
            (Some(why), _) => approvals::over_budget_note(why),
            (None, true) => approvals::awaiting_note(completes.approver_not_creator).to_owned(),
            (None, false) => "Nothing has happened yet. Show confirm_summary to the user; if they agree, call confirm_action with confirm_token and confirm_summary exactly as given, otherwise reject_action.".to_owned(),
        },
        content_hash,
        expires_at: expires_at.timestamp(),
    })
}

/// Emails the members whose role holds the action's right that it waits for them.
pub(super) async fn tell_approvers(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    op: Op,
    pending: (i64, &str),
    completes: Completes,
    expires: &str,
) -> Result<()> {
    let creator = db::connection_creator(tx, ctx, completes.connection_id).await?;
    let members = db::members_with_roles(tx, ctx, &approvals::roles_holding(op.right())).await?;
    let asker = ctx.connection().map(|c| c.name.clone()).unwrap_or_else(|| "an agent".into());
    for (person_id, email) in members {
        if completes.approver_not_creator && Some(person_id) == creator {
            continue;
        }
        let key = format!("{}:approval:{person_id}", pending.1);
        // Tool, connection, action and expiry only: no customer data and no text the agent
        // wrote reaches the approvers' inboxes; the console shows the rest to who may see it.
        let body = format!(
            "The agent connection \"{asker}\" prepared {} (action {}). Nothing happens unless someone approves it in the Gatehouse console under Approvals, before {expires}.",
            op.name(),
            pending.1
        );
        db::outbox_insert(
            tx,
            ctx,
            NewMessage {
                pending_action_id: Some(pending.0),
                channel: "email",
                recipient: &email,
                subject: &format!("Approval needed: {} from {asker}", op.name()),
                body: &body,
                idempotency_key: &key,
            },
        )
        .await?;
    }
    Ok(())
}

/// Hands an action the agent was to confirm to a person, and tells who could approve it.
pub(super) async fn to_person(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    op: Op,
    p: &db::PendingRow,
    approver_not_creator: bool,
    now: Timestamp,
) -> Result<()> {
    db::pending_to_person(tx, ctx, p.id, approver_not_creator).await?;
    let completes = Completes {
        connection_id: p.connection_id,
        mode: Completion::PersonApproves,
        approver_not_creator,
        policy: None,
        decided: None,
    };
    let expires = db::pending_expiry(tx, ctx, p.id).await?;
    let expires = jiff::Timestamp::from_second(expires).unwrap_or(now);
    let expires = time::present(expires, &ctx.tenant().zone, &ctx.tenant().zone_name, now).display;
    tell_approvers(tx, ctx, op, (p.id, &p.handle), completes, &expires).await
}
