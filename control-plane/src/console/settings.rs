//! The tenant's settings, in sections: agent access (its kill switch, R18), who completes
//! agents' actions by class and by tool (R7), rate limits and budgets, security (the passkey
//! policy); single sign-on and the SIEM webhook have their own pages under the same tabs.
//! Every switch form names its direction.

use std::sync::Arc;

use axum::extract::State;
use maud::{Markup, html};
use shared::error::Error;
use shared::services::rates::{self, Limit};
use shared::services::{admin, approvals};

use super::extract::{CsrfForm, Fields, Tenant};
use super::layout::csrf_field;
use super::{Answer, direction, shown};
use crate::AppState;

pub(super) async fn page(t: Tenant) -> Answer {
    let on = t.session.row.tenant_agent_access().unwrap_or(true);
    let body = html! {
        (tabs("/settings"))
        div class="card" {
            h2 { "Agent access" }
            p id="agent-access-state" {
                @if on { "Agents can use this tenant's connections." }
                @else { "Agent access is OFF: every agent request for this tenant is refused." }
            }
            form method="post" action="/settings/agent-access" data-passkey[t.session.row.passkey_policy()] {
                (csrf_field(t.csrf()))
                input type="hidden" name="to" value=(if on { "off" } else { "on" });
                label { "Reason " input type="text" name="reason" required maxlength="300"; }
                @if on {
                    button type="submit" class="danger" { "Turn agent access off" }
                } @else {
                    button type="submit" { "Turn agent access on" }
                }
            }
        }
        p class="muted" { "Tenant: " (t.ctx.tenant().slug) " (" (t.ctx.tenant().zone_name) "). Turning agent access off refuses every agent request at once, on every worker, and stops running tasks; turning it on again is a decision under the passkey policy." }
    };
    Ok(shown("Settings", &t.nav("/settings"), body))
}

/// The settings' sections, in the order an admin looks for them.
const SECTIONS: [(&str, &str); 6] = [
    ("/settings", "Agent access"),
    ("/settings/approvals", "Approvals"),
    ("/settings/limits", "Limits and budgets"),
    ("/settings/security", "Security: passkeys"),
    ("/settings/sso", "Single sign-on"),
    ("/audit/webhook", "Audit and SIEM"),
];

/// The settings' own navigation, on every settings page.
pub(super) fn tabs(current: &str) -> Markup {
    html! {
        nav class="tabs" aria-label="Settings sections" {
            @for (href, label) in SECTIONS {
                a href=(href) aria-current=[(href == current).then_some("page")] { (label) }
            }
        }
    }
}

/// Who completes agents' actions, by class and by tool.
pub(super) async fn approvals_page(State(state): State<Arc<AppState>>, t: Tenant) -> Answer {
    let policy = approvals::policy(&state.ds, &t.ctx).await?;
    let body = html! {
        (tabs("/settings/approvals"))
        (policy_form(&policy, t.csrf(), t.session.row.passkey_policy()))
    };
    Ok(shown("Settings: approvals", &t.nav("/settings"), body))
}

/// Rate limits per connection and the tenant-wide budgets.
pub(super) async fn limits_page(State(state): State<Arc<AppState>>, t: Tenant) -> Answer {
    let limits = rates::limits(&state.ds, &t.ctx).await?;
    let budgets = shared::services::budgets::show(&state.ds, &t.ctx, None).await?;
    let passkey_policy = t.session.row.passkey_policy();
    let body = html! {
        (tabs("/settings/limits"))
        (limits_form(&limits, t.csrf(), passkey_policy))
        (super::budgets::section(&budgets, None, None, t.csrf(), passkey_policy))
    };
    Ok(shown("Settings: limits and budgets", &t.nav("/settings"), body))
}

/// The passkey policy, with the way to one's own passkeys and to single sign-on.
pub(super) async fn security_page(t: Tenant) -> Answer {
    let body = html! {
        (tabs("/settings/security"))
        (super::passkeys::policy_card(t.session.row.passkey_policy(), t.csrf()))
        p { a href="/account/passkeys" { "Your own passkeys" } " · " a href="/settings/sso" { "Single sign-on and ID-JAG" } }
    };
    Ok(shown("Settings: security", &t.nav("/settings"), body))
}

pub(super) async fn agent_access(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    // Agent access `on` lets agents in; `off` is the kill switch for the tenant.
    let kill = !direction(&form)?;
    let reason = form.get("reason").unwrap_or_default();
    let ctx = super::passkeys::proven(&state, &t.session, t.ctx, &form).await?;
    admin::kill_switch_set(&state.ds, admin::SwitchScope::Tenant(&ctx), kill, reason).await?;
    let message = if kill {
        "Agent access is now off: every agent request for this tenant is refused."
    } else {
        "Agent access is now on: agents can use this tenant's connections again."
    };
    Ok(super::saved("/settings", message))
}

/// What completes an action of each mode, as the policy form offers it.
const COMPLETIONS: [(approvals::Completion, &str); 3] = [
    (approvals::Completion::AgentConfirms, "the agent confirms (preview, then confirm_action)"),
    (approvals::Completion::PersonApproves, "a person approves in the console"),
    (approvals::Completion::Off, "off: agents cannot prepare it"),
];

/// The approval policy as a form: one row per effect class.
fn policy_form(policy: &approvals::Policy, csrf: &str, passkey: bool) -> Markup {
    let tools: Vec<_> = policy.rules.iter().filter(|r| r.scope.starts_with("tool:")).collect();
    html! {
        div class="card" {
            h2 { "Who completes agents' actions" }
            p {
                "Actions that reach customers (notify), page someone (wake), mute alerts (alert) or delete are prepared by agents and completed as set here. A tool's own rule comes before its class's."
            }
            @for class in approvals::CLASSES.iter() {
                @let class = class.as_str();
                @let rule = policy.rules.iter().find(|r| r.scope == format!("class:{class}"));
                @let mode = rule.map(|r| r.mode).unwrap_or(approvals::DEFAULT);
                form method="post" action="/settings/approval-policy" class="policy-row" data-passkey[passkey] {
                    (csrf_field(csrf))
                    input type="hidden" name="scope" value=(class);
                    label {
                        strong { (class) } " actions: "
                        select name="mode" aria-label={ "Who completes " (class) " actions" } {
                            @for (m, label) in &COMPLETIONS {
                                option value=(m.as_str()) selected[*m == mode] { (label) }
                            }
                        }
                    }
                    label {
                        input type="checkbox" name="approver_not_creator" value="yes" checked[rule.is_some_and(|r| r.approver_not_creator)];
                        " with a person approving: never the connection's own creator"
                    }
                    button type="submit" { "Save" }
                }
            }
            @if !tools.is_empty() {
                p { "Per tool:" }
                ul {
                    @for r in &tools {
                        li { code { (r.scope["tool:".len()..]) } ": " (r.mode.as_str()) }
                    }
                }
            }
            form method="post" action="/settings/approval-policy" class="policy-row" data-passkey[passkey] {
                (csrf_field(csrf))
                h3 { "A rule for one tool" }
                label {
                    "Tool "
                    select name="scope" {
                        @for op in shared::services::actions::Op::ALL { option value=(op.name()) { (op.name()) } }
                    }
                }
                label {
                    "completed by "
                    select name="mode" {
                        @for (m, label) in &COMPLETIONS { option value=(m.as_str()) { (label) } }
                    }
                }
                label {
                    input type="checkbox" name="approver_not_creator" value="yes";
                    " with a person approving: never the connection's own creator"
                }
                button type="submit" { "Save the tool's rule" }
            }
        }
    }
}

/// The rate buckets as a form: one row per class.
fn limits_form(limits: &[Limit], csrf: &str, passkey: bool) -> Markup {
    html! {
        div class="card" {
            h2 { "Rate limits per connection" }
            p { "Calls each agent connection may make per minute, by effect class. A connection past its limit is told which limit and when to retry." }
            table {
                thead { tr { th { "Class" } th { "Counted" } th { "Default" } th { "Per minute" } } }
                tbody {
                    @for l in limits {
                        tr {
                            td { code { (l.class) } }
                            td { @if l.counted == "per_worker" { "on each worker" } @else { "across all workers" } }
                            td { (l.default) }
                            td {
                                form method="post" action="/settings/rate-limit" class="inline" data-passkey[passkey] {
                                    (csrf_field(csrf))
                                    input type="hidden" name="class" value=(l.class);
                                    input type="number" name="per_minute" min="1" max=(rates::MAX_PER_MINUTE) value=(l.per_minute) aria-label={ "Calls per minute for " (l.class) } required;
                                    " "
                                    button type="submit" { "Save" }
                                }
                                @if l.overridden {
                                    " "
                                    form method="post" action="/settings/rate-limit" class="inline" data-passkey[passkey] {
                                        (csrf_field(csrf))
                                        input type="hidden" name="class" value=(l.class);
                                        input type="hidden" name="per_minute" value="default";
                                        button type="submit" class="plain" { "Back to default" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

pub(super) async fn set_rate_limit(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let (class, per_minute) = rate_fields(&form)?;
    let ctx = super::passkeys::proven(&state, &t.session, t.ctx, &form).await?;
    rates::set_limit(&state.ds, &ctx, class, per_minute).await?;
    let message = match per_minute {
        Some(n) => format!("Rate limit saved: {n} {class} call(s) per minute per connection."),
        None => format!("The {class} rate limit is back to its default."),
    };
    Ok(super::saved("/settings/limits", &message))
}

/// A rate-limit form's class and allowance (`None`: back to the default).
pub(super) fn rate_fields(form: &Fields) -> Result<(&str, Option<i32>), Error> {
    let per_minute = match form.get("per_minute").map(str::trim) {
        Some("default") => None,
        Some(n) => Some(
            n.parse::<i32>()
                .map_err(|_| Error::invalid("per_minute", "a whole number of calls per minute"))?,
        ),
        None => {
            return Err(Error::invalid("per_minute", "say how many calls per minute, or default"));
        }
    };
    Ok((form.get("class").unwrap_or_default(), per_minute))
}

/// A policy form's scope, mode and approver condition.
pub(super) fn policy_fields(form: &Fields) -> Result<(&str, approvals::Completion, bool), Error> {
    // A form names its mode; a missing or unknown one changes nothing.
    let mode = match form.get("mode").map(|m| approvals::Completion::parse("mode", m)) {
        Some(mode) => mode?,
        None => return Err(Error::invalid("mode", "choose who completes these actions")),
    };
    let scope = form.get("scope").unwrap_or_default();
    let not_creator = form.get("approver_not_creator") == Some("yes")
        && mode == approvals::Completion::PersonApproves;
    Ok((scope, mode, not_creator))
}

pub(super) async fn set_policy(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let (scope, mode, not_creator) = policy_fields(&form)?;
    let ctx = super::passkeys::proven(&state, &t.session, t.ctx, &form).await?;
    approvals::policy_set(&state.ds, &ctx, scope, Some(mode), not_creator).await?;
    let who = COMPLETIONS.iter().find(|(m, _)| *m == mode).map(|(_, w)| *w).unwrap_or("saved");
    Ok(super::saved("/settings/approvals", &format!("Saved: for {scope}, {who}.")))
}
