//! Actions agents prepared that wait for a person (R7): the cards with exactly what will be
//! sent, approving or denying with a reason, and the navigation's live count.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use shared::services::approvals;

use super::extract::{CsrfForm, Session, Tenant};
use super::layout::{csrf_field, error_box};
use super::{Answer, local, segment, shown};
use crate::AppState;

/// A pending action's handle as it may appear in a URL: `pac_` and lowercase alphanumerics.
fn action_handle(raw: &str) -> Option<&str> {
    let tail = raw.strip_prefix("pac_")?;
    (!tail.is_empty()
        && tail.len() <= 40
        && tail.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()))
    .then_some(raw)
}

/// A key of an effect as people read it: `scheduled_start` → `Scheduled start`.
fn words(key: &str) -> String {
    let mut out = key.replace('_', " ");
    if let Some(first) = out.get(0..1) {
        out = first.to_uppercase() + &out[1..];
    }
    out
}

/// What an action will do, rendered as what it is: a message as a message (to, subject, the
/// body as written), a change as before and after, anything else as labelled fields.
fn effect_view(value: &serde_json::Value) -> Markup {
    use serde_json::Value;
    let scalar = |v: &Value| match v {
        Value::Null => "—".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match value {
        Value::Object(map) if map.contains_key("subject") && map.contains_key("body") => {
            let to = ["to", "recipient", "email"].iter().find_map(|k| map.get(*k));
            html! {
                div class="email" {
                    @if let Some(to) = to { p { strong { "To: " } (scalar(to)) } }
                    p { strong { "Subject: " } (scalar(&map["subject"])) }
                    div class="email-body" { (scalar(&map["body"])) }
                    @for (k, v) in map.iter().filter(|(k, _)| !["to", "recipient", "email", "subject", "body"].contains(&k.as_str())) {
                        p class="muted" { (words(k)) ": " (scalar(v)) }
                    }
                }
            }
        }
        Value::Object(map) if map.contains_key("before") && map.contains_key("after") => {
            let (before, after) = (&map["before"], &map["after"]);
            let mut keys: Vec<&String> =
                before.as_object().map(|o| o.keys().collect()).unwrap_or_default();
            for k in after.as_object().map(|o| o.keys().collect::<Vec<_>>()).unwrap_or_default() {
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
            html! {
                table class="change" {
                    thead { tr { th { "Field" } th { "Before" } th { "After" } } }
                    tbody {
                        @for k in keys {
                            @let (b, a) = (before.get(k).unwrap_or(&Value::Null), after.get(k).unwrap_or(&Value::Null));
                            tr class=[(b != a).then_some("changed")] { td { (words(k)) } td { (scalar(b)) } td { (scalar(a)) } }
                        }
                    }
                }
                @for (k, v) in map.iter().filter(|(k, _)| k.as_str() != "before" && k.as_str() != "after") {
                    p { strong { (words(k)) ": " } (effect_view(v)) }
                }
            }
        }
        Value::Object(map) => html! {
            dl {
                @for (k, v) in map { dt { (words(k)) } dd { (effect_view(v)) } }
            }
        },
        Value::Array(items) if items.is_empty() => html! { "none" },
        Value::Array(items) => html! { ul { @for v in items { li { (effect_view(v)) } } } },
        other => html! { (scalar(other)) },
    }
}

/// The outcome of the decision just made (post, redirect, get): handles parsed, the outcome
/// one of three words, nothing else of the query shown.
fn decided(q: &BTreeMap<String, String>) -> Markup {
    let decided = q.get("decided").and_then(|h| action_handle(h));
    let replaced = || q.get("replaced_by").and_then(|h| action_handle(h)).unwrap_or("(see below)");
    html! {
        @match (decided, q.get("outcome").map(String::as_str)) {
            (Some(a), Some("executed")) => p class="ok" role="status" {
                "Approved and executed " (a)
                @if q.get("with").map(String::as_str) == Some("passkey") { ", by you with a passkey" }
                "; the agent sees the result when it asks."
            },
            (Some(a), Some("denied")) => p class="ok" role="status" {
                "Denied " (a) "; the agent is told, with your comment if you gave one."
            },
            (Some(a), Some("changed")) => p class="error" role="status" {
                (a) " changed since it was prepared, so nothing was executed; the new version "
                (replaced()) " waits below."
            },
            _ => {},
        }
    }
}

pub(super) async fn page(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Query(q): Query<BTreeMap<String, String>>,
) -> Answer {
    let waiting = approvals::awaiting(&state.ds, &t.ctx).await?;
    let history = approvals::history(&state.ds, &t.ctx, 50).await?;
    let csrf = csrf_field(t.csrf());
    let body = html! {
        (decided(&q))
        @for a in &waiting {
            @let action = segment(&a.action);
            div class="card approval" data-action=(a.action) {
                p { strong { (a.summary) } }
                @if let Some(why) = &a.budget {
                    p class="budget-reason" { "Waits for a person because it is " (why) "." }
                }
                p {
                    "Asked by the connection " strong { (a.connection) } " (client " (a.client) ") of "
                    (a.asked_for_by) "; prepared " (local(&t.ctx, &a.created_at)) "; expires "
                    (local(&t.ctx, &a.expires_at)) ". Tool " code { (a.tool) } ", action " code { (a.action) } "."
                }
                div class="effect" { h3 { "Exactly what will be sent or changed" } (effect_view(&a.effect)) }
                details {
                    summary { "The same, as data" }
                    pre { (serde_json::to_string_pretty(&a.effect).unwrap_or_default()) }
                }
                p class="muted" { "A comment is optional; the agent and the audit log see it." }
                form method="post" action={ "/approvals/" (action) "/approve" } {
                    (csrf)
                    label { "Comment (optional) " input type="text" name="reason" maxlength="500" aria-label={ "Comment on approving " (a.action) }; }
                    button type="submit" { "Approve" }
                }
                form method="post" action={ "/approvals/" (action) "/deny" } {
                    (csrf)
                    label { "Comment (optional) " input type="text" name="reason" maxlength="500" aria-label={ "Comment on denying " (a.action) }; }
                    button type="submit" class="danger" { "Deny" }
                }
            }
        }
        @if waiting.is_empty() {
            p class="card" id="no-approvals" { "Nothing waits for approval. Agents' actions wait here when the tenant's policy (Settings → Approvals) says a person approves them." }
        }
        h2 { "Decided and expired" }
        @if history.is_empty() {
            p class="muted" { "No decision yet." }
        } @else {
            table id="approval-history" {
                thead { tr { th { "When" } th { "Action" } th { "What happened" } th { "Who" } th { "Proven by" } th { "Comment" } } }
                tbody {
                    @for d in &history {
                        tr class={ "decided-" (d.outcome) } {
                            td { (local(&t.ctx, &d.at)) }
                            td { (d.summary) br; small class="muted" { code { (d.tool) } " · " code { (d.action) } " · " (d.connection) } }
                            td {
                                @match d.outcome {
                                    "approved" => { "approved and executed" }
                                    "denied" => { "denied" }
                                    "changed" => { "changed before a decision; its new version waited instead" }
                                    _ => { "expired with nobody deciding; nothing was done" }
                                }
                            }
                            td { (d.by.as_deref().unwrap_or("—")) }
                            td { (d.proven.as_deref().unwrap_or("")) }
                            td { (d.comment.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
    };
    Ok(shown("Approvals", &t.nav("/approvals"), body))
}

/// The navigation's count of waiting actions, polled by the console's script.
pub(super) async fn count(State(state): State<Arc<AppState>>, s: Session) -> Answer {
    let Some(ctx) = s.ctx() else {
        return Ok(axum::Json(serde_json::json!({"count": 0})).into_response());
    };
    let n = approvals::awaiting_count(&state.ds, &ctx).await?;
    Ok(axum::Json(serde_json::json!({"count": n})).into_response())
}

pub(super) async fn decide(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Path((action, decision)): Path<(String, String)>,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let reason = form.get("reason").unwrap_or_default();
    let now = jiff::Timestamp::now();
    let ctx = super::step_up::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    let decided = match decision.as_str() {
        "approve" => {
            shared::services::actions::approve(&state.ds, &ctx, &action, reason, now).await?
        }
        "deny" => shared::services::actions::deny(&state.ds, &t.ctx, &action, reason, now).await?,
        _ => return Err(no_such_decision().into()),
    };
    // Post, redirect, get: a reload never sends the decision again.
    let target = match decided {
        approvals::Decided::Executed { action, .. } => {
            let passkey = ctx.proof().and_then(|p| p.passkey_handle()).is_some();
            format!(
                "/approvals?decided={}&outcome=executed{}",
                segment(&action),
                if passkey { "&with=passkey" } else { "" }
            )
        }
        approvals::Decided::Denied { action } => {
            format!("/approvals?decided={}&outcome=denied", segment(&action))
        }
        approvals::Decided::Changed { action, replaced_by } => format!(
            "/approvals?decided={}&outcome=changed&replaced_by={}",
            segment(&action),
            segment(&replaced_by)
        ),
    };
    Ok(Redirect::to(&target).into_response())
}

fn no_such_decision() -> Response {
    let body = super::layout::page("Not found", None, error_box("No such decision."));
    (StatusCode::NOT_FOUND, body).into_response()
}
