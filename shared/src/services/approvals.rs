//! Who completes a prepared action (R7, R18, R19): tenant policy, per effect class and
//! optionally per tool.
//!
//! - `agent_confirms` (the default, [`DEFAULT`]): PREVIEW, then `confirm_action` by the agent.
//! - `person_approves`: a tenant member holding the action's right approves or denies it in the
//!   console; the agent can only learn the outcome.
//! - `off`: agents cannot prepare it at all; the tool is hidden with that reason.
//!
//! The policy is enforced here and in [`crate::services::actions`], so every adapter obeys it.
//! An approval runs the same engine as `confirm_action`: the pending action's advisory lock,
//! its state and expiry, live rights and switches, a re-plan whose content hash must match, one
//! execution, one audit row (channel `console`, the approver as actor).

use serde::Serialize;
use serde_json::Value;

use crate::ctx::OpCtx;
use crate::datastore::{self as db, AuditEntry, Services};
use crate::effect::EffectClass;
use crate::error::{Error, Resource, Result};
use crate::rights::{Right, Role};
use crate::services::two_step::Op;

/// Who completes a prepared action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Completion {
    AgentConfirms,
    PersonApproves,
    Off,
}

/// What a class or tool without a rule gets: the one place the default is defined.
pub const DEFAULT: Completion = Completion::AgentConfirms;

/// The classes a policy speaks of (the two-step ones).
pub const CLASSES: &[EffectClass] =
    &[EffectClass::Notify, EffectClass::Wake, EffectClass::Alert, EffectClass::Delete];

impl Completion {
    pub fn as_str(self) -> &'static str {
        match self {
            Completion::AgentConfirms => "agent_confirms",
            Completion::PersonApproves => "person_approves",
            Completion::Off => "off",
        }
    }

    pub fn parse(field: &str, raw: &str) -> Result<Completion> {
        match raw {
            "agent_confirms" => Ok(Completion::AgentConfirms),
            "person_approves" => Ok(Completion::PersonApproves),
            "off" => Ok(Completion::Off),
            _ => Err(Error::invalid_with_options(
                field,
                format!(
                    "{:?} is not a way to complete actions",
                    raw.chars().take(40).collect::<String>()
                ),
                vec!["agent_confirms".into(), "person_approves".into(), "off".into()],
            )),
        }
    }
}

/// One rule of a tenant's policy.
#[derive(Debug, Clone, Serialize)]
pub struct Rule {
    /// `class:notify` … or `tool:<name>`.
    pub scope: String,
    pub mode: Completion,
    /// With `person_approves`: the approver may not be the person whose connection asked.
    pub approver_not_creator: bool,
}

/// A tenant's approval policy.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Policy {
    pub rules: Vec<Rule>,
}

impl Policy {
    fn from_rows(rows: Vec<(String, String, bool)>) -> Policy {
        let rules = rows
            .into_iter()
            .filter_map(|(scope, mode, approver_not_creator)| {
                Some(Rule {
                    scope,
                    mode: Completion::parse("mode", &mode).ok()?,
                    approver_not_creator,
                })
            })
            .collect();
        Policy { rules }
    }

    /// How an operation is completed in this tenant: its tool's rule, else its class's, else
    /// the default.
    pub fn for_op(&self, op: Op) -> (Completion, bool) {
        let tool = format!("tool:{}", op.name());
        let class = format!("class:{}", op.class().as_str());
        self.rules
            .iter()
            .find(|r| r.scope == tool)
            .or_else(|| self.rules.iter().find(|r| r.scope == class))
            .map(|r| (r.mode, r.approver_not_creator))
            .unwrap_or((DEFAULT, false))
    }

    /// How a scope (`class:…` or `tool:…`) is completed now: its own rule, else what it
    /// falls back to.
    pub fn for_scope(&self, scope: &str) -> (Completion, bool) {
        self.rules
            .iter()
            .find(|r| r.scope == scope)
            .map(|r| (r.mode, r.approver_not_creator))
            .unwrap_or_else(|| (self.fallback_for(scope), false))
    }

    /// What a scope falls back to without its own rule: a tool to its class's rule, a class
    /// to the default.
    pub fn fallback_for(&self, scope: &str) -> Completion {
        scope
            .strip_prefix("tool:")
            .and_then(Op::by_name)
            .map(|op| format!("class:{}", op.class().as_str()))
            .and_then(|class| self.rules.iter().find(|r| r.scope == class))
            .map(|r| r.mode)
            .unwrap_or(DEFAULT)
    }

    /// How a tool is completed, by name; `None` for tools that are not two-step.
    pub fn for_tool(&self, tool: &str) -> Option<Completion> {
        Op::by_name(tool).map(|op| self.for_op(op).0)
    }
}

/// The tenant's policy (anyone acting in the tenant may read it: it decides what they see).
pub async fn policy(ds: &Services, ctx: &OpCtx) -> Result<Policy> {
    Ok(Policy::from_rows(ds.approval_policy_rows(ctx).await?))
}

pub(crate) async fn policy_tx(tx: &mut db::Tx<'static>, ctx: &OpCtx) -> Result<Policy> {
    Ok(Policy::from_rows(db::approval_policy_rows_tx(tx, ctx).await?))
}

/// Parses a policy scope as given: an effect class (`notify`…) or a two-step tool's name.
pub fn parse_scope(raw: &str) -> Result<String> {
    let raw = raw.trim();
    if let Some(class) = CLASSES.iter().find(|c| c.as_str() == raw) {
        return Ok(format!("class:{}", class.as_str()));
    }
    if let Some(op) = Op::by_name(raw) {
        return Ok(format!("tool:{}", op.name()));
    }
    let mut options: Vec<String> = CLASSES.iter().map(|c| c.as_str().to_owned()).collect();
    options.extend(Op::ALL.iter().map(|o| o.name().to_owned()));
    Err(Error::invalid_with_options(
        "scope",
        format!(
            "{:?} is neither an effect class nor a two-step tool",
            raw.chars().take(40).collect::<String>()
        ),
        options,
    ))
}

#[derive(Debug, Serialize)]
pub struct PolicySet {
    pub scope: String,
    /// The mode now in force (`None` given: the default again).
    pub mode: Completion,
    pub approver_not_creator: bool,
}

/// Whether a rule lets agents do more than the one before: a less strict mode (off, then a
/// person approves, then the agent confirms), or the same person_approves without the
/// approver-is-not-the-creator condition.
fn looser(will: (Completion, bool), was: (Completion, bool)) -> bool {
    let strictness = |m: Completion| match m {
        Completion::Off => 2,
        Completion::PersonApproves => 1,
        Completion::AgentConfirms => 0,
    };
    strictness(will.0) < strictness(was.0)
        || (will.0 == was.0 && will.0 == Completion::PersonApproves && was.1 && !will.1)
}

async fn loosening(
    ds: &Services,
    ctx: &OpCtx,
    scope: &str,
    mode: Option<Completion>,
    approver_not_creator: bool,
) -> Result<Option<crate::services::passkeys::Decision>> {
    let before = policy(ds, ctx).await?;
    let was = before.for_scope(scope);
    let will = (mode.unwrap_or_else(|| before.fallback_for(scope)), approver_not_creator);
    Ok(looser(will, was).then(|| {
        crate::services::passkeys::Decision::loosen_approval_policy(
            scope,
            will.0.as_str(),
            approver_not_creator,
        )
    }))
}

/// Sets the rule of one scope (`mode: None` removes it, so the default applies), audited. The
/// change holds from the next call on every worker: the policy is read on every prepare.
pub async fn policy_set(
    ds: &Services,
    ctx: &OpCtx,
    scope: &str,
    mode: Option<Completion>,
    approver_not_creator: bool,
) -> Result<PolicySet> {
    ctx.require(Right::TenantSwitch)?;
    let scope = parse_scope(scope)?;
    if approver_not_creator && mode != Some(Completion::PersonApproves) {
        return Err(Error::invalid(
            "approver_not_creator",
            "only a person_approves rule names who may approve",
        ));
    }
    let loosen = loosening(ds, ctx, &scope, mode, approver_not_creator).await?;
    let was = policy(ds, ctx)
        .await?
        .rules
        .iter()
        .find(|r| r.scope == scope)
        .map(|r| r.mode.as_str())
        .unwrap_or(DEFAULT.as_str());
    let mut tx = ds.begin().await?;
    if let Some(decision) = loosen {
        crate::services::passkeys::require(&mut tx, ctx, &decision).await?;
    }
    db::approval_policy_put(&mut tx, ctx, &scope, mode.map(|m| (m.as_str(), approver_not_creator)))
        .await?;
    let mode = mode.unwrap_or(DEFAULT);
    let mut entry = AuditEntry::ok("approval_policy.set", vec![scope.clone()]);
    let reason = format!(
        "{}{}",
        mode.as_str(),
        if approver_not_creator { ", approver is not the creator" } else { "" }
    );
    entry.reason = Some(&reason);
    entry.change = Some(db::change("mode", was, mode.as_str()));
    db::audit_insert(&mut tx, ctx, entry).await?;
    tx.commit().await?;
    // Tools turned off leave the lists, and descriptions say who completes the rest.
    crate::bus::publish(
        ds.bus(),
        crate::bus::Event::TenantChanged { tenant: ctx.tenant().handle.to_string() },
    )
    .await;
    Ok(PolicySet { scope, mode, approver_not_creator })
}

/// The roles that hold `right`: whom to tell that an action waits for them.
pub(crate) fn roles_holding(right: Right) -> Vec<String> {
    Role::ALL.iter().filter(|r| r.rights().contains(right)).map(|r| r.as_str().to_owned()).collect()
}

// ------------------------------------------------------------------ the console's side

/// An action waiting for a person, as the console shows it.
#[derive(Debug, Serialize)]
pub struct Awaiting {
    pub action: String,
    pub tool: String,
    pub summary: String,
    /// Exactly what will be sent or changed.
    pub effect: Value,
    pub connection: String,
    pub client: String,
    pub asked_for_by: String,
    pub created_at: String,
    pub expires_at: String,
    /// Why it waits for a person although the policy lets the agent confirm: the budget it
    /// would pass and by how much ("over the customers_messaged budget by 3 (used 48 of 50 in
    /// the last 1h)").
    pub budget: Option<String>,
}

/// An action that waited for a person, done: what happened, who decided, proven how.
#[derive(Debug, Serialize)]
pub struct PastDecision {
    pub action: String,
    pub tool: String,
    pub summary: String,
    /// `approved`, `denied`, `changed` (superseded before a decision) or `expired`.
    pub outcome: &'static str,
    /// When it was decided, or when it expired.
    pub at: String,
    pub connection: String,
    /// The person who decided, by name and email.
    pub by: Option<String>,
    pub proven: Option<String>,
    pub comment: Option<String>,
}

/// The latest decisions on actions that waited for a person (and those that expired).
pub async fn history(ds: &Services, ctx: &OpCtx, limit: i64) -> Result<Vec<PastDecision>> {
    let tools = approvable(ctx);
    if tools.is_empty() {
        return Err(Error::Forbidden { right: Right::BookingsNotify });
    }
    Ok(ds
        .pending_decided(ctx, &tools, limit)
        .await?
        .into_iter()
        .map(|r| PastDecision {
            action: r.handle,
            tool: r.tool,
            summary: r.summary,
            outcome: match (r.status, r.expired) {
                (db::PendingStatus::Executed, _) => "approved",
                (db::PendingStatus::Rejected, _) => "denied",
                (db::PendingStatus::Superseded, _) => "changed",
                _ => "expired",
            },
            at: utc(r.at),
            connection: r.connection_name,
            by: r.decider_email.map(|e| format!("{} <{e}>", r.decider_name.unwrap_or_default())),
            proven: crate::services::admin::proven(r.proof.as_ref()),
            comment: r.decision_reason,
        })
        .collect())
}

fn utc(t: chrono::DateTime<chrono::Utc>) -> String {
    crate::datastore::to_ts(t).strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The tools whose actions this person could approve: only those are shown to them (a person
/// who may page technicians does not read customer emails waiting for someone else).
fn approvable(ctx: &OpCtx) -> Vec<String> {
    Op::ALL
        .iter()
        .filter(|op| ctx.rights().contains(op.right()))
        .map(|op| op.name().to_owned())
        .collect()
}

/// The actions waiting for a person in the tenant that this person could approve, oldest first.
pub async fn awaiting(ds: &Services, ctx: &OpCtx) -> Result<Vec<Awaiting>> {
    let tools = approvable(ctx);
    if tools.is_empty() {
        return Err(Error::Forbidden { right: Right::BookingsNotify });
    }
    Ok(ds
        .pending_awaiting(ctx, &tools, 200)
        .await?
        .into_iter()
        .map(|r| Awaiting {
            action: r.handle,
            tool: r.tool,
            summary: r.summary,
            effect: r.preview.unwrap_or(Value::Null),
            connection: r.connection_name,
            client: r.client_name,
            asked_for_by: r.creator_email,
            created_at: utc(r.created_at),
            expires_at: utc(r.expires_at),
            budget: r.budget_reason,
        })
        .collect())
}

/// How many actions wait for a person (the console's navigation count).
pub async fn awaiting_count(ds: &Services, ctx: &OpCtx) -> Result<i64> {
    let tools = approvable(ctx);
    if tools.is_empty() {
        return Ok(0);
    }
    ds.pending_awaiting_count(ctx, &tools).await
}

/// What a person's decision came to.
#[derive(Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Decided {
    /// Executed once; the result the agent will also see.
    Executed {
        action: String,
        result: Box<crate::services::outcome::Executed>,
    },
    Denied {
        action: String,
    },
    /// What it would do changed since it was prepared: nothing executed, and the new version
    /// waits for a decision under a new handle.
    Changed {
        action: String,
        replaced_by: String,
    },
}

/// The comment a person gives with a decision: optional (empty when none), bounded, plain
/// text; the agent and the audit row see it.
pub(crate) fn decision_reason(raw: &str) -> Result<String> {
    let t = raw.trim();
    if t.chars().count() > 500 || t.chars().any(char::is_control) {
        return Err(Error::invalid(
            "reason",
            "a comment is at most 500 characters of plain text; the agent and the audit see it",
        ));
    }
    if let Some(why) = crate::text::refusal(t) {
        return Err(Error::invalid("reason", format!("the reason {why}")));
    }
    Ok(t.to_owned())
}

/// Not found, for a handle that names no waiting action of this tenant.
pub(crate) fn no_such_action(raw: &str) -> Error {
    Error::not_found(Resource::Action, raw.chars().take(40).collect::<String>())
}

/// The preview shown when a policy of the tenant sends an action to a person.
pub(crate) fn policy_note(why: &str) -> String {
    format!(
        "Waiting for a person: {why}. A person in this tenant approves or denies it in the Gatehouse console (Approvals); the agent cannot complete it. Nothing has happened yet. Call confirm_action with confirm_token and confirm_summary later to learn whether it was approved, denied or expired."
    )
}

/// The preview shown when an action waits for a person because of a budget.
pub(crate) fn over_budget_note(why: &str) -> String {
    format!(
        "This action would go {why}, so a person in this tenant must approve it in the Gatehouse console (Approvals); the agent cannot complete it. Nothing has happened yet. Call confirm_action with confirm_token and confirm_summary later to learn whether it was approved, denied or expired."
    )
}

/// The preview shown when an action waits for a person.
pub(crate) fn awaiting_note(approver_not_creator: bool) -> &'static str {
    if approver_not_creator {
        "A person in this tenant other than the connection's creator must approve this in the Gatehouse console (Approvals); the agent cannot complete it. Nothing has happened yet. Call confirm_action with confirm_token and confirm_summary later to learn whether it was approved, denied or expired."
    } else {
        "A person in this tenant must approve this in the Gatehouse console (Approvals); the agent cannot complete it. Nothing has happened yet. Call confirm_action with confirm_token and confirm_summary later to learn whether it was approved, denied or expired."
    }
}
