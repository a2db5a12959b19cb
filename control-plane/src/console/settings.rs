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
use super::layout::{Entered, RowFailed, csrf_field, in_place};
use super::{Answer, Fail, direction, segment, shown};
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
            form method="post" action="/settings/agent-access" {
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
const SECTIONS: [(&str, &str); 7] = [
    ("/settings", "Agent access"),
    ("/settings/approvals", "Approvals"),
    ("/settings/policies", "Policies"),
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
    Ok(shown("Settings: approvals", &t.nav("/settings"), approvals_body(&state, &t, None).await?))
}

async fn approvals_body(
    state: &AppState,
    t: &Tenant,
    failed: Option<&RowFailed<'_>>,
) -> Result<Markup, Fail> {
    let policy = approvals::policy(&state.ds, &t.ctx).await?;
    Ok(html! {
        (tabs("/settings/approvals"))
        (policy_form(&policy, t.csrf(), failed))
    })
}

/// Rate limits per connection and the tenant-wide budgets.
pub(super) async fn limits_page(State(state): State<Arc<AppState>>, t: Tenant) -> Answer {
    let body = limits_body(&state, &t, None, None).await?;
    Ok(shown("Settings: limits and budgets", &t.nav("/settings"), body))
}

/// The limits page; a rate-limit row (`rate`) or a budget row (`budget`) that failed shows
/// what was typed with its message.
pub(super) async fn limits_body(
    state: &AppState,
    t: &Tenant,
    rate: Option<&RowFailed<'_>>,
    budget: Option<&RowFailed<'_>>,
) -> Result<Markup, Fail> {
    let limits = rates::limits(&state.ds, &t.ctx).await?;
    let budgets = shared::services::budgets::show(&state.ds, &t.ctx, None).await?;
    Ok(html! {
        (tabs("/settings/limits"))
        (limits_form(&limits, t.csrf(), rate))
        (super::budgets::section(&budgets, None, None, t.csrf(), budget))
    })
}

/// The passkey policy, with the way to one's own passkeys and to single sign-on.
pub(super) async fn security_page(t: Tenant) -> Answer {
    let body = html! {
        (tabs("/settings/security"))
        (policy_card(t.session.row.passkey_policy(), t.csrf()))
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
    let ctx = super::step_up::proven(&state, &t.session, t.ctx, &form).await?;
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
fn policy_form(policy: &approvals::Policy, csrf: &str, failed: Option<&RowFailed<'_>>) -> Markup {
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
                @let e = RowFailed::of(failed, class);
                @let typed = e.map(|e| e.value("mode", ""));
                form method="post" action="/settings/approval-policy" class="policy-row" {
                    (csrf_field(csrf))
                    @if let Some(e) = e { (e.summary(&["mode"])) }
                    input type="hidden" name="scope" value=(class);
                    label {
                        strong { (class) } " actions: "
                        select name="mode" aria-label={ "Who completes " (class) " actions" } aria-invalid=[e.and_then(|e| e.invalid("mode"))] aria-describedby=[e.and_then(|e| e.described("mode"))] {
                            @for (m, label) in &COMPLETIONS {
                                option value=(m.as_str()) selected[typed.map_or(*m == mode, |t| t == m.as_str())] { (label) }
                            }
                        }
                        @if let Some(e) = e { (e.message("mode")) }
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
            @let e = RowFailed::of(failed, TOOL_RULE);
            @let fresh = Entered::fresh();
            @let e = e.unwrap_or(&fresh);
            form method="post" action="/settings/approval-policy" class="policy-row" {
                (csrf_field(csrf))
                h3 { "A rule for one tool" }
                (e.summary(&["scope", "mode"]))
                input type="hidden" name="row" value=(TOOL_RULE);
                label {
                    "Tool "
                    select name="scope" aria-invalid=[e.invalid("scope")] aria-describedby=[e.described("scope")] {
                        @for op in shared::services::actions::Op::ALL { option value=(op.name()) selected[e.value("scope", "") == op.name()] { (op.name()) } }
                    }
                    (e.message("scope"))
                }
                label {
                    "completed by "
                    select name="mode" aria-invalid=[e.invalid("mode")] aria-describedby=[e.described("mode")] {
                        @for (m, label) in &COMPLETIONS { option value=(m.as_str()) selected[e.value("mode", "") == m.as_str()] { (label) } }
                    }
                    (e.message("mode"))
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

/// The row key of the form that sets one tool's rule.
const TOOL_RULE: &str = "tool-rule";

/// The rate buckets as a form: one row per class.
fn limits_form(limits: &[Limit], csrf: &str, failed: Option<&RowFailed<'_>>) -> Markup {
    html! {
        div class="card" {
            h2 { "Rate limits per connection" }
            p { "Calls each agent connection may make per minute, by effect class. A connection past its limit is told which limit and when to retry." }
            table {
                thead { tr { th { "Class" } th { "Counted" } th { "Default" } th { "Per minute" } } }
                tbody {
                    @for l in limits {
                        @let e = RowFailed::of(failed, l.class);
                        tr {
                            td { code { (l.class) } }
                            td { @if l.counted == "per_worker" { "on each worker" } @else { "across all workers" } }
                            td { (l.default) }
                            td {
                                form method="post" action="/settings/rate-limit" class="inline" {
                                    (csrf_field(csrf))
                                    input type="hidden" name="class" value=(l.class);
                                    @let now = l.per_minute.to_string();
                                    input type="number" name="per_minute" min="1" max=(rates::MAX_PER_MINUTE)
                                        value=(e.map_or(now.as_str(), |e| e.value("per_minute", "")))
                                        aria-label={ "Calls per minute for " (l.class) } required
                                        aria-invalid=[e.and_then(|e| e.invalid("per_minute"))] aria-describedby=[e.and_then(|e| e.described("per_minute"))];
                                    " "
                                    button type="submit" { "Save" }
                                    @if let Some(e) = e { " " (e.message("per_minute")) (e.summary(&["per_minute"])) }
                                }
                                @if l.overridden {
                                    " "
                                    form method="post" action="/settings/rate-limit" class="inline" {
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
    let again = async |e: Error| -> Answer {
        if !in_place(&e) {
            return Err(e.into());
        }
        let row = form.get("class").unwrap_or_default().to_owned();
        let failed = RowFailed { row, entered: Entered::failed(&form, &e) };
        let body = limits_body(&state, &t, Some(&failed), None).await?;
        super::shown_again("Settings: limits and budgets", &t.nav("/settings"), body)
    };
    let (class, per_minute) = match rate_fields(&form) {
        Ok(f) => f,
        Err(e) => return again(e).await,
    };
    let ctx = super::step_up::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    if let Err(e) = rates::set_limit(&state.ds, &ctx, class, per_minute).await {
        return again(e).await;
    }
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
    let again = async |e: Error| -> Answer {
        if !in_place(&e) {
            return Err(e.into());
        }
        // The tool-rule form names itself; a class row is its scope.
        let row = form.get("row").or(form.get("scope")).unwrap_or_default().to_owned();
        let failed = RowFailed { row, entered: Entered::failed(&form, &e) };
        let body = approvals_body(&state, &t, Some(&failed)).await?;
        super::shown_again("Settings: approvals", &t.nav("/settings"), body)
    };
    let (scope, mode, not_creator) = match policy_fields(&form) {
        Ok(f) => f,
        Err(e) => return again(e).await,
    };
    let ctx = super::step_up::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    if let Err(e) = approvals::policy_set(&state.ds, &ctx, scope, Some(mode), not_creator).await {
        return again(e).await;
    }
    let who = COMPLETIONS.iter().find(|(m, _)| *m == mode).map(|(_, w)| *w).unwrap_or("saved");
    Ok(super::saved("/settings/approvals", &format!("Saved: for {scope}, {who}.")))
}

/// The policy's card on the settings page.
pub(super) fn policy_card(on: bool, csrf: &str) -> Markup {
    html! {
        div class="card" id="passkey-policy" {
            h2 { "Decisions need a passkey" }
            @if on {
                p { "On: approving an agent's action, consenting to an agent beyond reading, creating a connection, raising a role, a rate limit, a budget or the approval policy's looseness, and turning agent access back on each need a passkey confirmation made for that decision. Denying, revoking and turning things off stay one step." }
            } @else {
                p { "Off: a signed-in session decides alone. Turn it on so a stolen session or password cannot approve or widen anything." }
            }
            form method="post" action="/settings/passkey-policy" {
                (csrf_field(csrf))
                input type="hidden" name="to" value=(if on { "off" } else { "on" });
                button type="submit" class=(if on { "danger" } else { "" }) {
                    @if on { "Turn the passkey policy off" } @else { "Require a passkey for decisions" }
                }
            }
        }
    }
}

/// Sets or resets one budget (a connection's or the tenant's) from its row's form.
pub(super) async fn set_budget(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    // A mistake comes back in place: the row's form with what was typed and its message.
    let again = async |e: Error| -> Answer {
        if !in_place(&e) {
            return Err(e.into());
        }
        let row = form.get("kind").unwrap_or_default().to_owned();
        let failed = RowFailed { row, entered: Entered::failed(&form, &e) };
        match form.get("connection").map(str::trim).filter(|c| !c.is_empty()) {
            Some(c) => super::connections::detail_again(&state, &t, c, &failed).await,
            None => {
                let body = limits_body(&state, &t, None, Some(&failed)).await?;
                super::shown_again("Settings: limits and budgets", &t.nav("/settings"), body)
            }
        }
    };
    let set = match super::budgets::fields(&form) {
        Ok(set) => set,
        Err(e) => return again(e).await,
    };
    let ctx = super::step_up::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    if let Err(e) = shared::services::budgets::set(&state.ds, &ctx, &set).await {
        return again(e).await;
    }
    let back = match set.connection {
        Some(c) => format!("/connections/{}", segment(c)),
        None => "/settings/limits".to_owned(),
    };
    let message = match set.limit {
        Some(n) => format!("Budget saved: at most {n} {} per window.", set.kind),
        None => format!("The {} budget is back to its default.", set.kind),
    };
    Ok(super::saved(&back, &message))
}
