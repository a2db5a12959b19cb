//! The tenant's policies in Cedar: the set in force with its policies and who set it, an
//! editor that checks a draft against the schema (every problem at its line), simulates it
//! against the audited calls of the last week, and puts it in force as the next version; and
//! the versions with what each added and removed. Admins only (the service checks).

use std::sync::Arc;

use axum::extract::State;
use maud::{Markup, html};
use shared::policies::Problem;
use shared::services::policies::{self, PolicyView, Simulation};

use super::extract::{CsrfForm, Tenant};
use super::layout::csrf_field;
use super::{Answer, shown};
use crate::AppState;

const PATH: &str = "/settings/policies";

/// What the page shows below the editor after a check or a simulation.
enum Outcome {
    None,
    Problems(Vec<Problem>),
    Checked(usize),
    Simulated(Box<Simulation>),
    Refused(String),
}

async fn body(
    state: &AppState,
    t: &Tenant,
    draft: Option<&str>,
    note: &str,
    outcome: Outcome,
) -> Answer<Markup> {
    let view: PolicyView = policies::show(&state.ds, &t.ctx).await?;
    let history = policies::history(&state.ds, &t.ctx, 10).await?;
    let source = draft.unwrap_or(&view.source);
    let passkey = t.session.row.passkey_policy();
    let rows = source.lines().count().clamp(8, 30);
    Ok(html! {
        (super::settings::tabs(PATH))
        div class="card" id="policy-in-force" {
            @if view.version == 0 {
                p { "No policy is in force: agents may do what their rights allow. Policies only narrow: write " code { "forbid" } " rules with " code { "@id" } " and " code { "@reason" } "; " code { "@approval" } " sends an action to a person instead." }
            } @else {
                p {
                    "Version " strong { (view.version) } " is in force, set by " (view.author.as_deref().unwrap_or("?"))
                    " " (view.set_at.as_deref().map(|s| super::local(&t.ctx, s)).unwrap_or_default())
                    @if let Some(n) = view.note.as_deref().filter(|n| !n.is_empty()) { " (" (n) ")" }
                    "."
                }
                table {
                    thead { tr { th { "Policy" } th { "What it does" } th { "Reason" } } }
                    tbody {
                        @for p in &view.policies {
                            tr {
                                td { code { (p.id) } }
                                td { @if p.approval { "sends to a person" } @else { "refuses" } }
                                td { (p.reason) }
                            }
                        }
                    }
                }
            }
        }
        form method="post" action=(PATH) class="card" id="policy-editor" data-passkey[passkey] {
            (csrf_field(t.csrf()))
            input type="hidden" name="expected_version" value=(view.version);
            label for="policy-source" { "Policy set (Cedar)" }
            textarea id="policy-source" name="source" rows=(rows) spellcheck="false" maxlength="65536"
                aria-invalid=[matches!(outcome, Outcome::Problems(_)).then_some("true")]
                aria-describedby="policy-outcome" { (source) }
            label { "Note " input type="text" name="note" maxlength="300" value=(note) placeholder="why this change"; }
            p class="muted" { "The schema: docs/operations.md, Policies (Cedar). A set that may widen what agents may do is a passkey decision." }
            button type="submit" name="do" value="check" class="plain" { "Check" }
            " "
            button type="submit" name="do" value="simulate" class="plain" { "Simulate on the last 7 days" }
            " "
            button type="submit" name="do" value="set" { "Put in force as version " (view.version + 1) }
        }
        div id="policy-outcome" role="status" {
            @match &outcome {
                Outcome::None => {}
                Outcome::Checked(n) => { p class="card ok" { "The draft checks against the schema: " (n) " polic" (if *n == 1 { "y" } else { "ies" }) "." } }
                Outcome::Refused(why) => { p class="card error" { (why) } }
                Outcome::Problems(problems) => {
                    div class="card error" {
                        p { strong { "Nothing was saved: the draft has " (problems.len()) " problem(s)." } }
                        ul { @for p in problems { li { @if p.line > 0 { "Line " (p.line) ": " } (p.message) } } }
                    }
                }
                Outcome::Simulated(sim) => {
                    div class="card" id="policy-simulation" {
                        p { strong { (sim.calls) } " audited agent calls of the last 7 days: " (sim.allowed) " allowed, " (sim.forbidden) " forbidden, " (sim.to_a_person) " to a person, " (sim.errors) " not evaluated." }
                        @if !sim.by_policy.is_empty() {
                            table {
                                thead { tr { th { "Policy" } th { "Forbidden" } th { "To a person" } } }
                                tbody { @for c in &sim.by_policy { tr { td { code { (c.policy) } } td { (c.forbidden) } td { (c.to_a_person) } } } }
                            }
                        }
                        @if !sim.examples.is_empty() {
                            h3 { "Examples" }
                            ul { @for e in &sim.examples { li { (e.verdict) ": " code { (e.tool) } " by " code { (e.connection) } ", " (e.at) " (" (e.policy) ")" @if let Some(w) = &e.why { " — " (w) } } } }
                        }
                        p class="muted" { (sim.caveat) }
                    }
                }
            }
        }
        @if !history.is_empty() {
            div class="card" id="policy-history" {
                h2 { "Versions" }
                @for v in &history {
                    details {
                        summary { "Version " (v.version) " by " (v.author) ", " (super::local(&t.ctx, &v.set_at)) @if !v.note.is_empty() { " — " (v.note) } " (+" (v.added.len()) " −" (v.removed.len()) " lines)" }
                        @if !v.added.is_empty() { pre class="added" { @for l in &v.added { "+ " (l) "\n" } } }
                        @if !v.removed.is_empty() { pre class="removed" { @for l in &v.removed { "- " (l) "\n" } } }
                    }
                }
            }
        }
    })
}

pub(super) async fn page(State(state): State<Arc<AppState>>, t: Tenant) -> Answer {
    let body = body(&state, &t, None, "", Outcome::None).await?;
    Ok(shown("Settings: policies", &t.nav("/settings"), body))
}

/// Check, simulate or put in force the posted draft; anything short of saving shows the page
/// again with the draft kept.
pub(super) async fn post(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let source = form.get("source").unwrap_or_default().replace("\r\n", "\n");
    let note = form.get("note").unwrap_or_default().to_owned();
    // The page again with the draft kept: 422 when something was refused (the house's errors
    // in place), 200 for a check or a simulation that went through.
    let again = async |outcome: Outcome| -> Answer {
        let refused = matches!(outcome, Outcome::Problems(_) | Outcome::Refused(_));
        let body = body(&state, &t, Some(&source), &note, outcome).await?;
        if refused {
            super::shown_again("Settings: policies", &t.nav("/settings"), body)
        } else {
            Ok(shown("Settings: policies", &t.nav("/settings"), body))
        }
    };
    let checked = match policies::check(&source) {
        Ok(found) => found,
        Err(problems) => return again(Outcome::Problems(problems)).await,
    };
    match form.get("do").unwrap_or("check") {
        "simulate" => match policies::simulate(&state.ds, &t.ctx, &source, 24 * 7).await {
            Ok(sim) => again(Outcome::Simulated(Box::new(sim))).await,
            Err(e) => again(Outcome::Refused(e.to_string())).await,
        },
        "set" => {
            let expected: i32 =
                form.get("expected_version").and_then(|v| v.parse().ok()).unwrap_or(-1);
            let ctx = super::step_up::proven(&state, &t.session, t.ctx.clone(), &form).await?;
            match policies::set(&state.ds, &ctx, &source, expected, &note).await {
                Ok(done) => Ok(super::saved(
                    PATH,
                    &format!(
                        "Version {} is in force ({} policies).",
                        done.version,
                        done.policies.len()
                    ),
                )),
                Err(e @ shared::Error::WrongState { .. }) => {
                    again(Outcome::Refused(e.to_string())).await
                }
                Err(e) => Err(e.into()),
            }
        }
        _ => again(Outcome::Checked(checked.len())).await,
    }
}
