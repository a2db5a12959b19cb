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

/// A schema attribute's type as an admin reads it: `String`, `Long?` (optional, test it with
/// `has`), a record's fields in braces.
fn shown_type(ty: &serde_json::Value) -> String {
    let optional = if ty["required"] == false { "?" } else { "" };
    let name = match ty["type"].as_str().unwrap_or("?") {
        "Record" => format!("{{ {} }}", fields(&ty["attributes"]).join(", ")),
        "Set" => format!("Set<{}>", shown_type(&ty["element"])),
        other => other.to_owned(),
    };
    format!("{name}{optional}")
}

/// A record's fields as `name: Type`.
fn fields(attributes: &serde_json::Value) -> Vec<String> {
    attributes
        .as_object()
        .map(|a| a.iter().map(|(k, v)| format!("{k}: {}", shown_type(v))).collect())
        .unwrap_or_default()
}

/// What a policy can read, from the schema every set is checked against (so it is never out of
/// date): the principal, the records a call names, the context, and each tool's arguments.
fn reference() -> Markup {
    let schema = policies::schema();
    let root = &schema.json[""];
    let entity = |name: &str| fields(&root["entityTypes"][name]["shape"]["attributes"]);
    let actions = root["actions"].as_object().cloned().unwrap_or_default();
    let context = actions
        .values()
        .next()
        .map(|a| {
            let mut all = fields(&a["appliesTo"]["context"]["attributes"]);
            all.retain(|f| !f.starts_with("args:"));
            all
        })
        .unwrap_or_default();
    html! {
        details class="card" id="policy-reference" {
            summary { "What a policy can read" }
            table {
                tbody {
                    tr { th { code { "principal" } } td { "the connection: " code { (entity("Connection").join(", ")) } } }
                    @for kind in ["Booking", "Customer", "Technician"] {
                        tr { th { code { "resource is " (kind) } } td { code { (entity(kind).join(", ")) } } }
                    }
                    tr { th { code { "resource is Tenant" } } td { "a call that names no record" } }
                    tr { th { code { "context" } } td { code { (context.join(", ")) } } }
                }
            }
            p class="muted" { "A field marked ? may be absent: test it with " code { "has" } " first. Each tool is an action, " code { "Action::\"send_customer_message\"" } "; its arguments are " code { "context.args" } ":" }
            table {
                thead { tr { th { "Action" } th { code { "context.args" } } } }
                tbody {
                    @for (tool, spec) in &actions {
                        @let args = fields(&spec["appliesTo"]["context"]["attributes"]["args"]["attributes"]);
                        tr {
                            td { code { (tool) } }
                            td { @if args.is_empty() { "none" } @else { code { (args.join(", ")) } } }
                        }
                    }
                }
            }
        }
    }
}

/// What the page shows below the editor after a check or a simulation.
enum Outcome {
    None,
    Problems(Vec<Problem>),
    Checked(usize),
    /// A simulation, and the window it replayed (one of [`WINDOWS`]).
    Simulated(Box<Simulation>, Window),
    Refused(String),
}

/// A window a simulation replays: its hours and how the page names it.
type Window = (i64, &'static str);

/// The windows the editor offers (the CLI takes any number of hours up to 90 days).
const WINDOWS: [Window; 5] = [
    (1, "the last hour"),
    (24, "the last 24 hours"),
    (24 * 7, "the last 7 days"),
    (24 * 30, "the last 30 days"),
    (24 * 90, "the last 90 days"),
];

/// The window the form chose: 7 days when it names none, or one not offered.
fn window_of(chosen: Option<&str>) -> Window {
    let hours: Option<i64> = chosen.and_then(|h| h.trim().parse().ok());
    WINDOWS.into_iter().find(|(h, _)| Some(*h) == hours).unwrap_or(WINDOWS[2])
}

async fn body(
    state: &AppState,
    t: &Tenant,
    draft: Option<&str>,
    note: &str,
    window: Window,
    outcome: Outcome,
) -> Answer<Markup> {
    let view: PolicyView = policies::show(&state.ds, &t.ctx).await?;
    let history = policies::history(&state.ds, &t.ctx, 10).await?;
    let source = draft.unwrap_or(&view.source);
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
        form method="post" action=(PATH) class="card" id="policy-editor" {
            (csrf_field(t.csrf()))
            input type="hidden" name="expected_version" value=(view.version);
            label for="policy-source" { "Policy set (Cedar)" }
            textarea id="policy-source" name="source" rows=(rows) spellcheck="false" maxlength="65536"
                aria-invalid=[matches!(outcome, Outcome::Problems(_)).then_some("true")]
                aria-describedby="policy-outcome" { (source) }
            label { "Note " input type="text" name="note" maxlength="300" value=(note) placeholder="why this change"; }
            p class="muted" { "A set that may widen what agents may do is a passkey decision. What a policy can read is below the editor (docs/operations.md, Policies (Cedar), teaches more)." }
            button type="submit" name="do" value="check" class="plain" { "Check" }
            " "
            button type="submit" name="do" value="simulate" class="plain" { "Simulate" }
            " "
            label class="inline" {
                "on the audited calls of "
                select name="window" {
                    @for (hours, name) in WINDOWS {
                        option value=(hours) selected[hours == window.0] { (name) }
                    }
                }
            }
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
                Outcome::Simulated(sim, (_, window)) => {
                    div class="card" id="policy-simulation" {
                        p { strong { (sim.calls) } " audited agent calls of " (window) ": " (sim.allowed) " allowed, " (sim.forbidden) " forbidden, " (sim.to_a_person) " to a person, " (sim.errors) " not evaluated." }
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
        (reference())
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
    let body = body(&state, &t, None, "", WINDOWS[2], Outcome::None).await?;
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
    let window = window_of(form.get("window"));
    // The page again with the draft kept: 422 when something was refused (the house's errors
    // in place), 200 for a check or a simulation that went through.
    let again = async |outcome: Outcome| -> Answer {
        let refused = matches!(outcome, Outcome::Problems(_) | Outcome::Refused(_));
        let body = body(&state, &t, Some(&source), &note, window, outcome).await?;
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
        "simulate" => match policies::simulate(&state.ds, &t.ctx, &source, window.0).await {
            Ok(sim) => again(Outcome::Simulated(Box::new(sim), window)).await,
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
