//! The console's activity section: what a tenant's agents, or one connection, did over the
//! last day or week, drawn on the server (see [`crate::charts`]) with the numbers also in
//! text and tables, so it reads without colour and without a script.

use shared::services::activity::{Activity, CLASSES, Span};

use maud::{Markup, html};

use crate::charts::{self, Bar, Series};

/// The series of the stacked chart, one per effect class, in [`CLASSES`] order.
const SERIES: [Series; 6] = [
    Series { key: "read", label: "read" },
    Series { key: "silent_write", label: "silent write" },
    Series { key: "notify", label: "notify" },
    Series { key: "wake", label: "wake" },
    Series { key: "alert", label: "alert" },
    Series { key: "delete", label: "delete" },
];

/// The activity section of a page whose URL is `base` (the span links add `?span=`).
/// `per_connection` leaves out the connection column of the latest calls.
pub fn section(id: &str, base: &str, activity: &Activity, per_connection: bool) -> Markup {
    debug_assert_eq!(SERIES.len(), CLASSES.len());
    let (span_words, other, other_words) = match activity.span {
        Span::Day => ("the last 24 hours", "week", "last 7 days"),
        Span::Week => ("the last 7 days", "day", "last 24 hours"),
    };
    let bars: Vec<Bar> = activity
        .hours
        .iter()
        .map(|h| Bar { short: h.short.clone(), long: h.long.clone(), counts: h.by_class.to_vec() })
        .collect();
    let per_bar = activity.span.per_bar();
    let calls = charts::stacked_bars(
        &format!("{id}-calls"),
        &format!("Calls {per_bar} over {span_words}, by effect class"),
        &format!("calls {per_bar}"),
        &SERIES,
        &bars,
    );
    let refusal_rows: Vec<(String, u64)> = activity
        .refusals
        .iter()
        .map(|r| (format!("{} ({})", r.code, r.meaning), r.calls))
        .collect();
    let refusals = charts::horizontal_bars(
        &format!("{id}-refusals"),
        &format!("Calls that did not succeed over {span_words}, by reason"),
        &refusal_rows,
    );
    html! {
        section class="activity" id=(id) aria-labelledby={ (id) "-heading" } {
            h2 id={ (id) "-heading" } { "Activity over " (span_words) }
            p {
                (charts::plural(activity.calls, "call", "calls")) " · "
                a href={ (base) "?span=" (other) } { "Show the " (other_words) }
            }
            figure class="picture" { (calls) }
            h3 { "Calls that did not succeed" }
            figure class="picture" { (refusals) }
            h3 { "Latest calls" }
            @if activity.recent.is_empty() {
                p class="muted" { "No calls yet." }
            } @else {
                table class="recent-calls" {
                    thead {
                        tr {
                            th { "When" }
                            @if !per_connection { th { "Connection" } }
                            th { "Tool" } th { "Effect" } th { "Outcome" } th { "Time" }
                        }
                    }
                    tbody {
                        @for c in &activity.recent {
                            tr {
                                td { (c.at) }
                                @if !per_connection {
                                    td { a href={ "/connections/" (c.connection) } { (c.connection_name) } }
                                }
                                td { code { (c.tool) } }
                                td { (c.class.replace('_', " ")) }
                                td class={ "outcome-" (if c.outcome == "ok" { "ok" } else { "refused" }) } { (c.outcome) }
                                td { (format!("{:.1} ms", c.duration_ms)) }
                            }
                        }
                    }
                }
            }
        }
    }
}
