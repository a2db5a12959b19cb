//! The tenant's audit webhook (its SIEM): where every audit event goes, signed as Standard
//! Webhooks specify, how delivery stands (delivered up to, waiting, the last error, what was
//! dropped past the bounded age), and setting, rotating or removing it. The secret is shown
//! once, on the page that made it. Admins only; every change is audited by the service.

use std::sync::Arc;

use axum::extract::State;
use maud::{Markup, html};
use shared::services::audit::{self, WebhookView};

use super::extract::{CsrfForm, Tenant};
use super::layout::csrf_field;
use super::{Answer, shown};
use crate::AppState;

fn delivery(t: &Tenant, h: &WebhookView) -> Markup {
    let at = |iso: &str| super::local(&t.ctx, iso);
    html! {
        div class="card" id="audit-webhook" {
            p { "Audit events go to " code { (h.url) } " (since " (at(&h.created_at)) ")." }
            p {
                "Delivered up to row " (h.delivered_seq) "; " strong { (h.backlog) } " waiting."
                @if let Some(t) = &h.last_delivered_at { " Last delivery " (at(t)) "." }
            }
            @if let Some(e) = &h.last_error {
                p class="error" role="status" {
                    "The last attempt failed: " (e) ". Next attempt " (at(&h.next_attempt_at))
                    " (attempt " (h.attempts) "); events wait, in order, until the endpoint answers."
                }
            }
            @if let Some(note) = &h.dropped_note {
                p class="error" role="status" { (note) }
            }
            @if let Some(t) = &h.rotated_at { p class="muted" { "Secret rotated " (at(t)) "." } }
        }
    }
}

/// What a new signing secret is sealed for on its way to the page after the save.
fn once_key(t: &Tenant) -> String {
    format!("webhook:{}", t.ctx.tenant().handle)
}

/// The path the webhook's pages live under (the secret's cookie goes there only).
const PATH: &str = "/audit/webhook";

fn page_body(t: &Tenant, hook: Option<&WebhookView>, secret: Option<&str>) -> Markup {
    html! {
        (super::settings::tabs("/audit/webhook"))
        @if let Some(s) = secret {
            div class="card ok" role="status" {
                p { strong { "The signing secret, shown this once:" } }
                pre id="webhook-secret" { (s) }
                button type="button" class="plain" data-copy="webhook-secret" { "Copy" }
                p { "Verify each delivery's " code { "webhook-signature" } " with it (Standard Webhooks: HMAC-SHA256 over id.timestamp.body); deduplicate on " code { "webhook-id" } "." }
            }
        }
        @match hook {
            Some(h) => { (delivery(t, h)) }
            None => { p class="card" id="no-webhook" { "No audit webhook: events stay in the log and the CSV export." } }
        }
        form method="post" action="/audit/webhook" class="card" {
            (csrf_field(t.csrf()))
            h2 { @if hook.is_some() { "Change the URL" } @else { "Send every audit event to your SIEM" } }
            label { "HTTPS URL " input type="url" name="url" required maxlength="2000" placeholder="https://siem.example.com/hooks/gatehouse" value=[hook.map(|h| h.url.as_str())]; }
            button type="submit" { "Save" }
        }
        @if hook.is_some() {
            form method="post" action="/audit/webhook/rotate" class="card" {
                (csrf_field(t.csrf()))
                p { "A new secret is shown once; the previous one keeps signing beside it for a day, so the receiver can switch." }
                button type="submit" class="plain" { "Rotate the secret" }
            }
            div class="card" {
                p { "Undelivered events stay in the log." }
                a href="/audit/webhook/remove" { "Stop sending events…" }
            }
        }
    }
}

pub(super) async fn page(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    headers: axum::http::HeaderMap,
) -> Answer {
    let hook = audit::webhook_show(&state.ds, &t.ctx).await?;
    // A secret made by the save before the redirect, shown this once.
    let (secret, clear) = super::once_secret(&state, &t.session, &headers, PATH, &once_key(&t));
    let body = page_body(&t, hook.as_ref(), secret.as_deref());
    super::shown_once("Audit webhook", &t.nav("/audit"), body, clear)
}

pub(super) async fn set(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let url = form.get("url").unwrap_or_default().to_owned();
    let ctx = super::step_up::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    let (hook, secret) = audit::webhook_set(&state.ds, &ctx, &url, &state.fetch).await?;
    match secret {
        Some(secret) => super::created_once(&state, &t.session, PATH, PATH, &once_key(&t), &secret),
        None => Ok(super::saved(PATH, &format!("Audit events now go to {}.", hook.url))),
    }
}

pub(super) async fn rotate(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let ctx = super::step_up::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    let rotated = audit::webhook_rotate(&state.ds, &ctx).await?;
    super::created_once(&state, &t.session, PATH, PATH, &once_key(&t), &rotated.secret)
}

/// Stopping the webhook is confirmed, saying what stops and what stays.
pub(super) async fn remove_confirm(State(state): State<Arc<AppState>>, t: Tenant) -> Answer {
    let Some(hook) = audit::webhook_show(&state.ds, &t.ctx).await? else {
        return Ok(super::saved(PATH, "No audit webhook is set; nothing to stop."));
    };
    let body = html! {
        form method="post" action="/audit/webhook/remove" class="card" {
            (csrf_field(t.csrf()))
            p { "Stop sending audit events to " code { (hook.url) } "? Your SIEM receives nothing more, including the " strong { (hook.backlog) } " event(s) still waiting, and no more checkpoints. The audit log itself keeps everything." }
            button type="submit" class="danger" { "Stop sending events" }
            " "
            a href=(PATH) { "Cancel" }
        }
    };
    Ok(shown("Stop the audit webhook", &t.nav("/audit"), body))
}

pub(super) async fn remove(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(_): CsrfForm,
) -> Answer {
    audit::webhook_remove(&state.ds, &t.ctx).await?;
    Ok(super::saved(
        PATH,
        "The audit webhook is stopped; events stay in the log and the CSV export.",
    ))
}
