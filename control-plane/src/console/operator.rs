//! The platform operator's page: the global kill switch (R18), audited, and only for a
//! person who holds the operator role now (`operators::from_session` reads it each time).

use std::sync::Arc;

use axum::extract::State;
use maud::html;
use shared::services::{admin, operators};
use shared::time;

use super::extract::{CsrfForm, Session};
use super::layout::csrf_field;
use super::{Answer, direction, shown};
use crate::AppState;

pub(super) async fn page(State(state): State<Arc<AppState>>, s: Session) -> Answer {
    let operator = operators::from_session(&state.ds, &s.row).await?;
    let on = admin::global_kill_state(&state.ds, &operator).await?;
    let now = jiff::Timestamp::now();
    let body = html! {
        div class="card" {
            p id="global-state" {
                @if on { "The global kill switch is ON: every agent request answers 503." }
                @else { "Agents are served." }
            }
            form method="post" action="/operator/kill-switch" {
                (csrf_field(s.csrf()))
                input type="hidden" name="to" value=(if on { "off" } else { "on" });
                label { "Reason " input type="text" name="reason" required maxlength="300"; }
                button type="submit" class=(if on { "" } else { "danger" }) {
                    @if on { "Turn the kill switch off" } @else { "Turn the kill switch on" }
                }
            }
        }
        p { "Now: " (time::present(now, &jiff::tz::TimeZone::UTC, "UTC", now).display) }
    };
    Ok(shown("Operator", &s.nav("/operator"), body))
}

pub(super) async fn global_switch(
    State(state): State<Arc<AppState>>,
    s: Session,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let mut operator = operators::from_session(&state.ds, &s.row).await?;
    if let Some((ceremony, assertion)) = super::step_up::assertion(&form) {
        let proof = shared::services::passkeys::prove(
            &state.ds,
            &state.passkeys,
            &s.row,
            ceremony,
            assertion,
        )
        .await?;
        operator = operator.with_proof(proof);
    }
    // The kill switch `on` refuses every agent.
    let kill = direction(&form)?;
    let reason = form.get("reason").unwrap_or("");
    admin::kill_switch_set(&state.ds, admin::SwitchScope::Global(&operator), kill, reason).await?;
    let message = if kill {
        "The platform's kill switch is on: every agent request, in every tenant, is refused."
    } else {
        "The platform's kill switch is off: agents are let in again where their tenant allows."
    };
    Ok(super::saved("/operator", message))
}
