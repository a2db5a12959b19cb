//! The tenant's activity page: what every agent connection did, drawn by
//! [`crate::pictures`] (one connection's picture is on its own page).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use maud::html;
use shared::services::activity;

use super::extract::Tenant;
use super::{Answer, shown};
use crate::AppState;

pub(super) async fn page(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Query(q): Query<BTreeMap<String, String>>,
) -> Answer {
    let span = activity::Span::parse(q.get("span").map(String::as_str));
    let found = activity::activity(&state.ds, &t.ctx, None, span, jiff::Timestamp::now()).await?;
    let body = html! {
        p { "What every agent connection of this tenant did. Open a connection for its own picture." }
        (crate::pictures::section("tenant-activity", "/activity", &found, false))
    };
    Ok(shown("Activity", &t.nav("/activity"), body))
}
