//! The outbox as the tenant's admins see it: emails and pages that confirmed agent actions
//! and invitations sent, newest first, with their delivery state; searched, filtered and paged
//! by a cursor in SQL.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use maud::html;
use shared::services::console;

use super::extract::Tenant;
use super::layout::{pager, search_field, select_filter};
use super::{Answer, shown};
use crate::AppState;

/// Messages per page.
const PAGE: i64 = 50;

pub(super) async fn page(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Query(q): Query<BTreeMap<String, String>>,
) -> Answer {
    let get = |k: &str| q.get(k).cloned();
    let filter = console::MessagesFilter {
        q: get("q"),
        status: get("status"),
        channel: get("channel"),
        cursor: get("cursor"),
    };
    let found = console::messages_page(&state.ds, &t.ctx, &filter, PAGE).await?;
    let rows = &found.rows;
    let fmt = |at: chrono::DateTime<chrono::Utc>| {
        super::local(&t.ctx, &at.format("%Y-%m-%dT%H:%M:%SZ").to_string())
    };
    let body = html! {
        p { "Emails and pages that confirmed agent actions and invitations sent, newest first." }
        form method="get" action="/messages" class="filters" role="search" {
            (search_field(filter.q.as_deref(), "Recipient or subject"))
            (select_filter("status", "Status", &[("queued", "queued"), ("sent", "sent"), ("failed", "failed")], filter.status.as_deref()))
            (select_filter("channel", "Channel", &[("email", "email"), ("page", "page")], filter.channel.as_deref()))
            button type="submit" class="plain" { "Search" }
        }
        @if rows.is_empty() {
            p class="muted" { "No message matches this search." }
        } @else {
        table {
            thead { tr { th { "Queued" } th { "Channel" } th { "To" } th { "Subject" } th { "Status" } th { "Sent" } th { "Action" } } }
            tbody {
                @for m in rows {
                    tr {
                        td { (fmt(m.created_at)) }
                        td { (m.channel) }
                        td { (m.recipient) }
                        td { (m.subject) }
                        td { (m.status) " (attempts: " (m.attempts) ")" }
                        td { @if let Some(at) = m.sent_at { (fmt(at)) } }
                        td { code { (m.action_handle.as_deref().unwrap_or("")) } }
                    }
                }
            }
        }
        }
        (pager("/messages", &q, found.next.as_deref()))
    };
    Ok(shown("Messages", &t.nav("/messages"), body))
}
