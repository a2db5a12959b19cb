//! The horizontal bar chart: counts by reason, one row each.

use maud::{Markup, html};

use super::{Chars, INK, MUTED, WIDTH, plural, px, sanitize_id, svg, text_width};

const ROW_H: f64 = 26.0;
const BAR_H: f64 = 16.0;
const LABEL_RIGHT: f64 = 320.0;
const BAR_LEFT: f64 = 328.0;
/// Reasons longer than this are cut in the picture (the row's tooltip has them whole).
const LABEL_CHARS: usize = 48;

/// A horizontal bar chart of counts by reason (e.g. refusals), one row per reason in the
/// order given (largest first, as the caller sorts), as an inline `<svg>`.
///
/// `id` prefixes the DOM ids in the output; only `[a-z0-9-]` is kept.
pub fn horizontal_bars(id: &str, title: &str, rows: &[(String, u64)]) -> Markup {
    let id = sanitize_id(id);
    let total = rows.iter().fold(0u64, |acc, (_, n)| acc.saturating_add(*n));
    let max = rows.iter().map(|(_, n)| *n).max().unwrap_or(0);

    let desc = if rows.is_empty() || total == 0 {
        "No refusals in this period.".to_owned()
    } else {
        let list: Vec<String> = rows.iter().map(|(r, n)| format!("{r} {n}")).collect();
        format!(
            "{}; {} in all: {}.",
            plural(rows.len() as u64, "reason", "reasons"),
            plural(total, "refusal", "refusals"),
            list.join(", "),
        )
    };

    if rows.is_empty() {
        let content = html! {
            text class="empty" x=(px(WIDTH / 2.0)) y="34" font-size="13" fill=(MUTED) text-anchor="middle" {
                "No refusals in this period"
            }
        };
        return svg(&id, 60.0, title, &desc, content);
    }

    let height = 8.0 + rows.len() as f64 * ROW_H + 8.0;
    let number_w = text_width(&max.to_string()) + 6.0 + 8.0;
    let bar_max = WIDTH - 8.0 - BAR_LEFT - number_w;
    let content = html! {
        @for (i, (reason, n)) in rows.iter().enumerate() {
            @let y = 8.0 + i as f64 * ROW_H;
            @let len = bar_length(*n, max, bar_max);
            g class="row" data-reason=(Chars(reason)) data-count=(n) {
                title { (Chars(&format!("{reason}: {n}"))) }
                text x=(px(LABEL_RIGHT)) y=(px(y + 13.0)) font-size="12" fill=(INK) text-anchor="end" { (Chars(&cut(reason))) }
                @if len > 0.0 {
                    // Neutral, so a refusal is not read as a call of the first series above it.
                    rect x=(px(BAR_LEFT)) y=(px(y + (ROW_H - BAR_H) / 2.0 - 4.0)) width=(px(len)) height=(px(BAR_H)) fill=(MUTED) {}
                }
                text class="value" x=(px(BAR_LEFT + len + 6.0)) y=(px(y + 13.0)) font-size="12" fill=(INK) { (n) }
            }
        }
    };
    svg(&id, height, title, &desc, content)
}

/// A row's bar: proportional to the largest, at least a pixel for a count above zero.
fn bar_length(n: u64, max: u64, bar_max: f64) -> f64 {
    if max == 0 {
        0.0
    } else {
        (n as f64 / max as f64 * bar_max).max(if n > 0 { 1.0 } else { 0.0 })
    }
}

/// A reason as the picture shows it: cut to [`LABEL_CHARS`] with an ellipsis.
fn cut(reason: &str) -> String {
    if reason.chars().count() > LABEL_CHARS {
        let mut cut: String = reason.chars().take(LABEL_CHARS - 1).collect();
        cut.truncate(cut.trim_end().len());
        cut.push('…');
        cut
    } else {
        reason.to_owned()
    }
}
