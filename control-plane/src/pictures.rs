//! The console's activity section: what a tenant's agents, or one connection, did over the
//! last day or week, drawn on the server (see [`crate::charts`]) with the numbers also in
//! text and tables, so it reads without colour and without a script.

use shared::services::activity::{Activity, CLASSES, Span};

use crate::charts::{self, Bar, Series};
use crate::html::esc;

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
pub fn section(id: &str, base: &str, activity: &Activity, per_connection: bool) -> String {
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
    let calls = charts::stacked_bars(
        &format!("{id}-calls"),
        &format!("Calls per hour over {span_words}, by effect class"),
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
    let recent: String = activity
        .recent
        .iter()
        .map(|c| {
            let connection = if per_connection {
                String::new()
            } else {
                format!(
                    "<td><a href=\"/connections/{}\">{}</a></td>",
                    esc(&c.connection),
                    esc(&c.connection_name)
                )
            };
            format!(
                "<tr><td>{}</td>{connection}<td><code>{}</code></td><td>{}</td><td class=\"outcome-{}\">{}</td><td>{:.1} ms</td></tr>",
                esc(&c.at),
                esc(&c.tool),
                esc(&c.class.replace('_', " ")),
                if c.outcome == "ok" { "ok" } else { "refused" },
                esc(&c.outcome),
                c.duration_ms
            )
        })
        .collect();
    let recent = if recent.is_empty() {
        "<p class=\"muted\">No calls yet.</p>".to_owned()
    } else {
        let connection_head = if per_connection { "" } else { "<th>Connection</th>" };
        format!(
            "<table class=\"recent-calls\"><thead><tr><th>When</th>{connection_head}<th>Tool</th><th>Effect</th><th>Outcome</th><th>Time</th></tr></thead><tbody>{recent}</tbody></table>"
        )
    };
    format!(
        "<section class=\"activity\" id=\"{id}\" aria-labelledby=\"{id}-heading\">\
         <h2 id=\"{id}-heading\">Activity over {span_words}</h2>\
         <p>{calls_total} · <a href=\"{base}?span={other}\">Show the {other_words}</a></p>\
         <figure class=\"picture\">{calls}</figure>\
         <h3>Calls that did not succeed</h3><figure class=\"picture\">{refusals}</figure>\
         <h3>Latest calls</h3>{recent}</section>",
        id = esc(id),
        calls_total = charts::plural(activity.calls, "call", "calls"),
        base = esc(base),
    )
}
