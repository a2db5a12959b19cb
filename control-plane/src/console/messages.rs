//! The outbox as the tenant's admins see it: emails and pages that confirmed agent actions
//! sent, newest first, with their delivery state.

use std::sync::Arc;

use axum::extract::State;
use maud::html;
use shared::services::console;

use super::extract::Tenant;
use super::{Answer, shown};
use crate::AppState;

pub(super) async fn page(State(state): State<Arc<AppState>>, t: Tenant) -> Answer {
    let rows = console::messages(&state.ds, &t.ctx, 200).await?;
    let fmt = |at: chrono::DateTime<chrono::Utc>| {
        super::local(&t.ctx, &at.format("%Y-%m-%dT%H:%M:%SZ").to_string())
    };
    let body = html! {
        p { "Emails and pages that confirmed agent actions sent, newest first." }
        table {
            thead { tr { th { "Queued" } th { "Channel" } th { "To" } th { "Subject" } th { "Status" } th { "Sent" } th { "Action" } } }
            tbody {
                @for m in &rows {
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
    };
    Ok(shown("Messages", &t.nav("/messages"), body))
}
