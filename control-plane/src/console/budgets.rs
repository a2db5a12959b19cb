//! Budgets on effects in the console: a connection's (on its page) and the tenant-wide ones
//! (on Agent access), used and left, and the forms that set them. Raising one is a widening
//! decision: its service names it when it asks for a passkey (`console::step_up`).
//! The form posts to `settings::set_budget`, which shows the page it came from again on a mistake.

use maud::{Markup, html};
use shared::error::Error;
use shared::services::budgets::{self, BudgetSet, BudgetView, Scope};

use super::extract::Fields;
use super::layout::{Entered, RowFailed, csrf_field};

/// The budgets as a table with a form per row: a connection's (`connection` given) or the
/// tenant's. A tenant-wide budget not set yet gets a row to set it.
/// A connection's section shows only the kinds of effect its rights let it cause (`can`).
pub(super) fn section(
    shown: &[BudgetView],
    connection: Option<&str>,
    can: Option<&[budgets::EffectKind]>,
    csrf: &str,
    failed: Option<&RowFailed<'_>>,
) -> Markup {
    let scope = if connection.is_some() { Scope::Connection } else { Scope::Tenant };
    let rows: Vec<&BudgetView> = shown
        .iter()
        .filter(|b| b.scope == scope && can.is_none_or(|can| can.contains(&b.kind)))
        .collect();
    if rows.is_empty() && connection.is_some() {
        return html! {
            div class="card" id="budgets-connection" {
                h2 { "Budgets" }
                p class="muted" { "This connection's rights let it cause no effect that budgets count (messages, booking changes, pages, mutes, deletions)." }
            }
        };
    }
    let unset: Vec<&budgets::EffectKind> = budgets::EffectKind::ALL
        .iter()
        .filter(|k| scope == Scope::Tenant && !rows.iter().any(|b| b.kind == **k))
        .collect();
    html! {
        div class="card" id={ "budgets-" (if connection.is_some() { "connection" } else { "tenant" }) } {
            @if connection.is_some() {
                h2 { "Budgets" }
                p { "How much this connection may do in a rolling window, counted in effects (customers messaged, bookings confirmed, moved or cancelled, technicians paged, alert-minutes muted, records deleted). An action that would pass a budget waits for a person under Approvals, whatever the approval policy." }
            } @else {
                h2 { "Tenant-wide budgets" }
                p { "Optional: how much all of this tenant's connections together may do in a rolling window. Each connection also has its own budget (on its page)." }
            }
            table {
                thead { tr { th { "Effect" } th { "Used" } th { "Left" } th { "Budget" } } }
                tbody {
                    @for b in &rows {
                        tr data-budget=(b.kind.as_str()) {
                            td { code { (b.kind.as_str()) } }
                            td { (b.used) }
                            td { (b.left) }
                            td {
                                (form(connection, b.kind.as_str(), Some((b.limit, &b.window)), csrf, RowFailed::of(failed, b.kind.as_str())))
                                @if b.default { " " small { "(default)" } }
                                @else {
                                    " "
                                    form method="post" action="/budgets" class="inline" {
                                        (csrf_field(csrf))
                                        @if let Some(c) = connection { input type="hidden" name="connection" value=(c); }
                                        input type="hidden" name="kind" value=(b.kind.as_str());
                                        input type="hidden" name="limit" value="default";
                                        button type="submit" class="plain" {
                                            @if connection.is_some() { "Back to default" } @else { "Remove" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                    @for k in &unset {
                        tr data-budget=(k.as_str()) {
                            td { code { (k.as_str()) } }
                            td { "—" } td { "no limit" }
                            td { (form(None, k.as_str(), None, csrf, RowFailed::of(failed, k.as_str()))) }
                        }
                    }
                }
            }
        }
    }
}

fn form(
    connection: Option<&str>,
    kind: &str,
    now: Option<(i64, &str)>,
    csrf: &str,
    entered: Option<&Entered<'_>>,
) -> Markup {
    let limit = now.map(|n| n.0.to_string()).unwrap_or_default();
    let limit = entered.map_or(limit.as_str(), |e| e.value("limit", ""));
    let window = entered.map_or(now.map(|n| n.1).unwrap_or("24h"), |e| e.value("window", ""));
    let invalid = |f: &str| entered.and_then(|e| e.invalid(f));
    let described = |f: &str| entered.and_then(|e| e.described(f));
    html! {
        form method="post" action="/budgets" class="inline" {
            (csrf_field(csrf))
            @if let Some(c) = connection { input type="hidden" name="connection" value=(c); }
            input type="hidden" name="kind" value=(kind);
            input type="number" name="limit" min="0" max=(budgets::MAX_LIMIT) value=(limit) aria-label={ "Budget of " (kind) } required
                aria-invalid=[invalid("limit")] aria-describedby=[described("limit")];
            " per "
            input type="text" name="window" size="4" maxlength="6" value=(window) aria-label={ "Window of " (kind) } required
                aria-invalid=[invalid("window")] aria-describedby=[described("window")];
            " "
            button type="submit" { "Save" }
            @if let Some(e) = entered {
                " " (e.message("limit")) (e.message("window")) (e.summary(&["limit", "window"]))
            }
        }
    }
}

/// A budget form's fields: a missing limit is an error, never a default.
pub(super) fn fields(form: &Fields) -> Result<BudgetSet<'_>, Error> {
    let limit = match form.get("limit").map(str::trim) {
        Some("default") => None,
        Some(n) => {
            Some(n.parse::<i64>().map_err(|_| Error::invalid("limit", "a whole number of units"))?)
        }
        None => return Err(Error::invalid("limit", "say how many units, or default")),
    };
    // A form that shows the window must say one: an empty box is an error, never the default.
    let window_secs = match form.get("window").map(str::trim) {
        Some("") => {
            return Err(Error::invalid("window", "say how long the window is, like 1h, 1d or 7d"));
        }
        Some("default") | None => None,
        Some(w) => Some(budgets::parse_window(w)?),
    };
    Ok(BudgetSet {
        connection: form.get("connection").map(str::trim).filter(|c| !c.is_empty()),
        kind: form.get("kind").unwrap_or_default(),
        limit,
        window_secs,
    })
}
