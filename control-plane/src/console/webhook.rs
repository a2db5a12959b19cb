//! The tenant's audit webhook (its SIEM): where every audit event goes, signed as Standard
//! Webhooks specify, how delivery stands (delivered up to, waiting, the last error, what was
//! dropped past the bounded age), and setting, rotating or removing it. The secret is shown
//! once, on the page that made it. Admins only; every change is audited by the service.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Redirect};
use maud::{Markup, html};
use shared::services::audit::{self, WebhookView};

use super::extract::{CsrfForm, Tenant};
use super::layout::csrf_field;
use super::{Answer, shown};
use crate::AppState;

fn delivery(h: &WebhookView) -> Markup {
    html! {
        div class="card" id="audit-webhook" {
            p { "Audit events go to " code { (h.url) } " (since " (h.created_at) ")." }
            p {
                "Delivered up to row " (h.delivered_seq) "; " strong { (h.backlog) } " waiting."
                @if let Some(at) = &h.last_delivered_at { " Last delivery " (at) "." }
            }
            @if let Some(e) = &h.last_error {
                p class="error" role="status" {
                    "The last attempt failed: " (e) ". Next attempt " (h.next_attempt_at)
                    " (attempt " (h.attempts) "); events wait, in order, until the endpoint answers."
                }
            }
            @if let Some(note) = &h.dropped_note {
                p class="error" role="status" { (note) }
            }
            @if let Some(at) = &h.rotated_at { p class="muted" { "Secret rotated " (at) "." } }
        }
    }
}

fn page_body(t: &Tenant, hook: Option<&WebhookView>, secret: Option<&str>) -> Markup {
    let passkey = t.session.row.passkey_policy();
    html! {
        @if let Some(s) = secret {
            div class="card ok" role="status" {
                p { strong { "The signing secret, shown this once:" } }
                pre id="webhook-secret" { (s) }
                button type="button" class="plain" data-copy="webhook-secret" { "Copy" }
                p { "Verify each delivery's " code { "webhook-signature" } " with it (Standard Webhooks: HMAC-SHA256 over id.timestamp.body); deduplicate on " code { "webhook-id" } "." }
            }
        }
        @match hook {
            Some(h) => { (delivery(h)) }
            None => { p class="card" id="no-webhook" { "No audit webhook: events stay in the log and the CSV export." } }
        }
        form method="post" action="/audit/webhook" class="card" data-passkey[passkey] {
            (csrf_field(t.csrf()))
            h2 { @if hook.is_some() { "Change the URL" } @else { "Send every audit event to your SIEM" } }
            label { "HTTPS URL " input type="url" name="url" required maxlength="2000" placeholder="https://siem.example.com/hooks/gatehouse" value=[hook.map(|h| h.url.as_str())]; }
            button type="submit" { "Save" }
        }
        @if hook.is_some() {
            form method="post" action="/audit/webhook/rotate" class="card" data-passkey[passkey] {
                (csrf_field(t.csrf()))
                p { "A new secret is shown once; the previous one keeps signing beside it for a day, so the receiver can switch." }
                button type="submit" class="plain" { "Rotate the secret" }
            }
            form method="post" action="/audit/webhook/remove" class="card" {
                (csrf_field(t.csrf()))
                p { "Undelivered events stay in the log." }
                button type="submit" class="danger" { "Stop sending events" }
            }
        }
    }
}

pub(super) async fn page(State(state): State<Arc<AppState>>, t: Tenant) -> Answer {
    let hook = audit::webhook_show(&state.ds, &t.ctx).await?;
    let body = page_body(&t, hook.as_ref(), None);
    Ok(shown("Audit webhook", &t.nav("/audit"), body))
}

pub(super) async fn set(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let url = form.get("url").unwrap_or_default().to_owned();
    let ctx = super::passkeys::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    let (hook, secret) = audit::webhook_set(&state.ds, &ctx, &url, &state.fetch).await?;
    let body = page_body(&t, Some(&hook), secret.as_deref());
    Ok(shown("Audit webhook", &t.nav("/audit"), body))
}

pub(super) async fn rotate(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let ctx = super::passkeys::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    let rotated = audit::webhook_rotate(&state.ds, &ctx).await?;
    let body = page_body(&t, Some(&rotated.webhook), Some(&rotated.secret));
    Ok(shown("Audit webhook", &t.nav("/audit"), body))
}

pub(super) async fn remove(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(_): CsrfForm,
) -> Answer {
    audit::webhook_remove(&state.ds, &t.ctx).await?;
    Ok(Redirect::to("/audit/webhook").into_response())
}
