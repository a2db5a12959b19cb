//! Activity charts for the console, drawn on the server as inline SVG (maud markup).
//!
//! The pages that show what an agent connection did need two pictures: calls per time
//! bucket stacked by effect class ([`stacked_bars`]) and counts by reason, such as refusals
//! ([`horizontal_bars`]). They are drawn here, in plain Rust with maud templates, so the
//! console needs no JavaScript and no chart library, and the output is deterministic.
//!
//! The charts must be readable without colour: every series has both a colour (Okabe–Ito,
//! darkened where needed for 3:1 contrast on white) and a pattern, the legend repeats the
//! pattern next to the label and its total as text, every segment carries a `<title>` with
//! its number, and the `<desc>` summarises the data in words for screen readers. Only
//! presentation attributes are used (no `style`), as the console's Content-Security-Policy
//! allows no inline styles. All text is escaped by maud, and control characters XML cannot
//! hold are dropped ([`Chars`]).

mod horizontal;
mod stacked;
#[cfg(test)]
mod tests;

use maud::{Markup, Render, html};

pub use horizontal::horizontal_bars;
pub use stacked::stacked_bars;

/// One series of a stacked bar chart (an effect class): its key (for `data-series`) and the
/// label shown in the legend and tooltips. Its colour and pattern follow from its position.
pub struct Series {
    pub key: &'static str,
    pub label: &'static str,
}

/// One bar: the label on the x axis (e.g. "14:00" or "Mon 30"; empty for no label), a long
/// label for the tooltip (e.g. "Tue 1 Dec 14:00–15:00 UTC"), and one count per series, in
/// the order of the series slice (missing counts are zero, extra counts are ignored).
pub struct Bar {
    pub short: String,
    pub long: String,
    pub counts: Vec<u64>,
}

const FONT: &str = "system-ui, sans-serif";
/// Text: the console's ink colour.
const INK: &str = "#1d2430";
/// Secondary text and axes (6:1 on white).
const MUTED: &str = "#5b6472";
const GRID: &str = "#e3e6ea";
/// Okabe–Ito, with orange and sky blue darkened; each has at least 3:1 contrast on white.
const PALETTE: [&str; 7] = [
    "#0072B2", // blue
    "#C45500", // vermillion, darkened
    "#009E73", // bluish green
    "#9A6700", // orange, darkened
    "#CC79A7", // reddish purple
    "#444444", // dark grey
    "#2B8CC4", // sky blue, darkened
];
/// The pattern kinds, in series order.
const PATTERNS: usize = 6;

/// Width of every chart (the viewBox; the page scales it).
const WIDTH: f64 = 720.0;
/// Height of the stacked chart with one legend row.
const STACKED_HEIGHT: f64 = 220.0;
const LEGEND_ROW: f64 = 22.0;
const PLOT_LEFT: f64 = 48.0;
const PLOT_RIGHT: f64 = 712.0;
/// Rough width of one character at 11–12px, for layout without font metrics.
const CHAR_W: f64 = 7.0;
/// Space between two x labels.
const LABEL_GAP: f64 = 8.0;

/// The `<svg>` element around `content`, with its accessible name and description.
fn svg(id: &str, height: f64, title: &str, desc: &str, content: Markup) -> Markup {
    html! {
        svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img"
            aria-labelledby={ (id) "-title " (id) "-desc" }
            viewBox={ "0 0 " (px(WIDTH)) " " (px(height)) } font-family=(FONT) {
            title id={ (id) "-title" } { (Chars(title)) }
            desc id={ (id) "-desc" } { (Chars(desc)) }
            (content)
        }
    }
}

/// The fill pattern of series `i`: its colour with white marks, one kind per series.
fn pattern_def(id: &str, i: usize) -> Markup {
    html! {
        pattern id={ (id) "-s" (i) } patternUnits="userSpaceOnUse" width="8" height="8" {
            rect width="8" height="8" fill=(colour(i)) {}
            @match i % PATTERNS {
                // Solid.
                0 => {},
                // Diagonal hatch.
                1 => path d="M-1,1 l2,-2 M0,8 l8,-8 M7,9 l2,-2" stroke="#fff" stroke-width="1.5" {},
                // Dots.
                2 => {
                    circle cx="2" cy="2" r="1.3" fill="#fff" {}
                    circle cx="6" cy="6" r="1.3" fill="#fff" {}
                },
                // Cross-hatch.
                3 => path d="M-1,1 l2,-2 M0,8 l8,-8 M7,9 l2,-2 M-1,7 l2,2 M0,0 l8,8 M7,-1 l2,2"
                    stroke="#fff" stroke-width="1" {},
                // Horizontal lines.
                4 => path d="M0,2 h8 M0,6 h8" stroke="#fff" stroke-width="1.2" {},
                // Vertical lines.
                _ => path d="M2,0 v8 M6,0 v8" stroke="#fff" stroke-width="1.2" {},
            }
        }
    }
}

/// The colour of series `i`. With seven colours and six patterns, the pair stays distinct
/// for up to 42 series.
fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// A rounded top for the y axis and the step between gridlines: steps of 1, 2 or 5 × 10^k,
/// with 3 to 5 steps above zero. Zero gives `(3, 1)`.
fn nice_scale(max: u64) -> (u64, u64) {
    let mut magnitude: u64 = 1;
    loop {
        for m in [1u64, 2, 5] {
            let Some(step) = magnitude.checked_mul(m) else {
                return (u64::MAX, u64::MAX);
            };
            let steps = max.div_ceil(step);
            if steps <= 5 {
                let steps = steps.max(3);
                return (step.saturating_mul(steps), step);
            }
        }
        match magnitude.checked_mul(10) {
            Some(next) => magnitude = next,
            None => return (u64::MAX, u64::MAX),
        }
    }
}

/// The indices of the bars whose short label is drawn: labels never closer than the widest
/// one needs. When every bar has a label (e.g. each hour), they are thinned to a regular
/// stride from the first (every 2nd, 3rd, 4th, 6th, 12th, 24th…). When the caller labels only
/// some bars (e.g. where the day changes), those are kept, and of two that would collide the
/// later one wins: a first label is typically a partial period, the next one a whole one.
fn shown_labels(bars: &[Bar], slot: f64) -> Vec<usize> {
    let labelled: Vec<usize> = bars
        .iter()
        .enumerate()
        .filter(|(_, b)| !b.short.trim().is_empty())
        .map(|(i, _)| i)
        .collect();
    let widest = labelled.iter().map(|&i| text_width(bars[i].short.trim())).fold(0.0, f64::max);
    if labelled.is_empty() || slot <= 0.0 {
        return Vec::new();
    }
    let raw = ((widest + LABEL_GAP) / slot).ceil().max(1.0) as usize;
    let dense = labelled.len() == bars.len();
    let stride = if dense {
        [1, 2, 3, 4, 6, 8, 12, 24, 48, 72, 168].into_iter().find(|&s| s >= raw).unwrap_or(raw)
    } else {
        raw
    };
    let mut shown = Vec::new();
    let mut last: Option<usize> = None;
    if dense {
        for i in labelled {
            if last.is_none_or(|l| i - l >= stride) {
                shown.push(i);
                last = Some(i);
            }
        }
    } else {
        for i in labelled.into_iter().rev() {
            if last.is_none_or(|l| l - i >= stride) {
                shown.push(i);
                last = Some(i);
            }
        }
        shown.reverse();
    }
    shown
}

/// The DOM id prefix: `[a-z0-9-]` kept, anything else replaced by `-`; empty becomes "chart".
fn sanitize_id(id: &str) -> String {
    if id.is_empty() {
        return "chart".to_owned();
    }
    id.chars()
        .map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' { c } else { '-' })
        .collect()
}

/// Text as XML can hold it: tabs and line breaks become spaces and other control characters
/// are dropped (XML 1.0 has no way to write them). Rendered through maud, which escapes it.
struct Chars<'a>(&'a str);

impl Render for Chars<'_> {
    fn render_to(&self, buffer: &mut String) {
        let kept: String = self
            .0
            .chars()
            .filter_map(|c| match c {
                '\t' | '\n' | '\r' => Some(' '),
                c if c.is_control() => None,
                c => Some(c),
            })
            .collect();
        kept.render_to(buffer);
    }
}

/// A coordinate with at most two decimals, without trailing zeros.
fn px(x: f64) -> String {
    if !x.is_finite() || x.abs() < 0.005 {
        return "0".to_owned();
    }
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A y-axis number: 950, 1k, 1.5k, 20k, 2M.
fn compact(n: u64) -> String {
    for (unit, suffix) in [(1_000_000_000_u64, "G"), (1_000_000, "M"), (1_000, "k")] {
        if n >= unit {
            let whole = n / unit;
            let tenth = n % unit / (unit / 10);
            return if tenth == 0 {
                format!("{whole}{suffix}")
            } else {
                format!("{whole}.{tenth}{suffix}")
            };
        }
    }
    n.to_string()
}

/// "1 call", "2 calls".
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Estimated width of a text at 11–12px.
fn text_width(s: &str) -> f64 {
    s.chars().count() as f64 * CHAR_W
}
