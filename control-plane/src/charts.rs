//! Activity charts for the console, drawn on the server as inline SVG strings.
//!
//! The pages that show what an agent connection did need two pictures: calls per time
//! bucket stacked by effect class ([`stacked_bars`]) and counts by reason, such as refusals
//! ([`horizontal_bars`]). They are drawn here, in plain Rust with no dependencies, so the
//! console needs no JavaScript and no chart library, and the output is deterministic.
//!
//! The charts must be readable without colour: every series has both a colour (Okabe–Ito,
//! darkened where needed for 3:1 contrast on white) and a pattern, the legend repeats the
//! pattern next to the label and its total as text, every segment carries a `<title>` with
//! its number, and the `<desc>` summarises the data in words for screen readers. Only
//! presentation attributes are used (no `style`), as the console's Content-Security-Policy
//! allows no inline styles. All text is escaped for XML.

use std::fmt::Write;

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

/// A stacked bar chart of calls per time bucket by series, as an inline `<svg>`.
///
/// `id` prefixes the DOM ids in the output (title, desc, patterns); only `[a-z0-9-]` is kept.
pub fn stacked_bars(id: &str, title: &str, series: &[Series], bars: &[Bar]) -> String {
    let id = sanitize_id(id);
    let count = |bar: &Bar, s: usize| bar.counts.get(s).copied().unwrap_or(0);
    let series_totals: Vec<u64> = (0..series.len())
        .map(|s| bars.iter().fold(0u64, |acc, b| acc.saturating_add(count(b, s))))
        .collect();
    let bar_totals: Vec<u64> = bars
        .iter()
        .map(|b| (0..series.len()).fold(0u64, |acc, s| acc.saturating_add(count(b, s))))
        .collect();
    let total = series_totals.iter().fold(0u64, |acc, t| acc.saturating_add(*t));
    let max = bar_totals.iter().copied().max().unwrap_or(0);

    // Legend: one item per series, wrapped into rows across the width.
    let legend_texts: Vec<String> =
        series.iter().zip(&series_totals).map(|(s, t)| format!("{} · {t}", s.label)).collect();
    let mut legend_pos = Vec::with_capacity(series.len());
    let (mut lx, mut row) = (PLOT_LEFT, 0usize);
    for text in &legend_texts {
        let w = 20.0 + text_width(text) + 16.0;
        if lx + w > WIDTH && lx > PLOT_LEFT {
            lx = PLOT_LEFT;
            row += 1;
        }
        legend_pos.push((lx, 8.0 + row as f64 * LEGEND_ROW));
        lx += w;
    }
    let rows = row + 1;
    let height = STACKED_HEIGHT + (rows - 1) as f64 * LEGEND_ROW;
    let top = 8.0 + rows as f64 * LEGEND_ROW + 10.0;
    let bottom = height - 30.0;
    let plot_h = bottom - top;
    let plot_w = PLOT_RIGHT - PLOT_LEFT;

    let desc = stacked_desc(series, bars, &series_totals, &bar_totals, total);
    let mut out = String::new();
    open_svg(&mut out, &id, height, title, &desc);

    out.push_str("<defs>");
    for i in 0..series.len() {
        pattern_def(&mut out, &id, i);
    }
    out.push_str("</defs>");

    out.push_str("<g class=\"legend\">");
    for (i, ((s, text), (x, y))) in series.iter().zip(&legend_texts).zip(&legend_pos).enumerate() {
        let _ = write!(
            out,
            "<g class=\"key\" data-series=\"{}\"><rect x=\"{}\" y=\"{}\" width=\"14\" height=\"14\" \
             fill=\"url(#{id}-s{i})\" stroke=\"{}\"/><text x=\"{}\" y=\"{}\" font-size=\"12\" \
             fill=\"{INK}\">{}</text></g>",
            esc(s.key),
            px(*x),
            px(*y),
            colour(i),
            px(x + 20.0),
            px(y + 11.5),
            esc(text),
        );
    }
    out.push_str("</g>");

    // Y axis: gridlines and labels (only the zero line when there is nothing to show).
    let (scale_top, step) = nice_scale(max);
    let steps = if total == 0 { 0 } else { scale_top / step.max(1) };
    let y_of = |v: f64| bottom - v / scale_top.max(1) as f64 * plot_h;
    out.push_str("<g class=\"y-axis\">");
    for k in 0..=steps {
        let v = k.saturating_mul(step);
        let y = y_of(v as f64);
        if k > 0 {
            let _ = write!(
                out,
                "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{GRID}\"/>",
                px(PLOT_LEFT),
                px(y),
                px(PLOT_RIGHT),
                px(y),
            );
        }
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"{MUTED}\" text-anchor=\"end\">{}</text>",
            px(PLOT_LEFT - 6.0),
            px(y + 4.0),
            compact(v),
        );
    }
    out.push_str("</g>");

    // Bars: a hover target over the whole column with the breakdown, then the segments.
    let slot = if bars.is_empty() { plot_w } else { plot_w / bars.len() as f64 };
    let bar_w = (slot * 0.8).min(48.0);
    if total > 0 {
        out.push_str("<g class=\"bars\">");
        for (b, bar) in bars.iter().enumerate() {
            let x0 = PLOT_LEFT + b as f64 * slot;
            let x = x0 + (slot - bar_w) / 2.0;
            let _ = write!(
                out,
                "<g class=\"bar\" data-bar=\"{b}\" data-total=\"{}\"><rect class=\"hit\" x=\"{}\" \
                 y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#fff\" fill-opacity=\"0\"><title>{}</title></rect>",
                bar_totals[b],
                px(x0),
                px(top),
                px(slot),
                px(plot_h),
                esc(&bar_breakdown(series, bar, bar_totals[b])),
            );
            let mut below = 0u64;
            for (s, ser) in series.iter().enumerate() {
                let n = count(bar, s);
                if n == 0 {
                    continue;
                }
                let above = below.saturating_add(n);
                let (y_low, y_high) = (y_of(below as f64), y_of(above as f64));
                let _ = write!(
                    out,
                    "<rect class=\"seg\" data-series=\"{}\" data-count=\"{n}\" data-bar=\"{b}\" \
                     x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"url(#{id}-s{s})\">\
                     <title>{}</title></rect>",
                    esc(ser.key),
                    px(x),
                    px(y_high),
                    px(bar_w),
                    px(y_low - y_high),
                    esc(&format!("{} · {}: {n}", bar.long, ser.label)),
                );
                below = above;
            }
            out.push_str("</g>");
        }
        out.push_str("</g>");
    }

    // Axes, over the bars.
    let _ = write!(
        out,
        "<g class=\"axes\" stroke=\"{MUTED}\"><line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{b}\"/>\
         <line x1=\"{l}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\"/></g>",
        l = px(PLOT_LEFT),
        t = px(top),
        b = px(bottom),
        r = px(PLOT_RIGHT),
    );

    // X labels, thinned so they never overlap.
    out.push_str("<g class=\"x-axis\">");
    for i in shown_labels(bars, slot) {
        let label = bars[i].short.trim();
        let half = text_width(label) / 2.0;
        let cx = PLOT_LEFT + (i as f64 + 0.5) * slot;
        let tx = cx.clamp(half + 2.0, (WIDTH - half - 2.0).max(half + 2.0));
        let _ = write!(
            out,
            "<line x1=\"{c}\" y1=\"{}\" x2=\"{c}\" y2=\"{}\" stroke=\"{MUTED}\"/>\
             <text class=\"x-label\" x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"{MUTED}\" \
             text-anchor=\"middle\">{}</text>",
            px(bottom),
            px(bottom + 4.0),
            px(tx),
            px(bottom + 17.0),
            esc(label),
            c = px(cx),
        );
    }
    out.push_str("</g>");

    if total == 0 {
        let _ = write!(
            out,
            "<text class=\"empty\" x=\"{}\" y=\"{}\" font-size=\"13\" fill=\"{MUTED}\" \
             text-anchor=\"middle\">No calls in this period</text>",
            px(PLOT_LEFT + plot_w / 2.0),
            px(top + plot_h / 2.0),
        );
    }
    out.push_str("</svg>");
    out
}

/// A horizontal bar chart of counts by reason (e.g. refusals), one row per reason in the
/// order given (largest first, as the caller sorts), as an inline `<svg>`.
///
/// `id` prefixes the DOM ids in the output; only `[a-z0-9-]` is kept.
pub fn horizontal_bars(id: &str, title: &str, rows: &[(String, u64)]) -> String {
    const ROW_H: f64 = 26.0;
    const BAR_H: f64 = 16.0;
    const LABEL_RIGHT: f64 = 320.0;
    const BAR_LEFT: f64 = 328.0;
    /// Reasons longer than this are cut in the picture (the row's tooltip has them whole).
    const LABEL_CHARS: usize = 48;

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

    let mut out = String::new();
    if rows.is_empty() {
        open_svg(&mut out, &id, 60.0, title, &desc);
        let _ = write!(
            out,
            "<text class=\"empty\" x=\"{}\" y=\"34\" font-size=\"13\" fill=\"{MUTED}\" \
             text-anchor=\"middle\">No refusals in this period</text></svg>",
            px(WIDTH / 2.0),
        );
        return out;
    }

    let height = 8.0 + rows.len() as f64 * ROW_H + 8.0;
    open_svg(&mut out, &id, height, title, &desc);
    let number_w = text_width(&max.to_string()) + 6.0 + 8.0;
    let bar_max = WIDTH - 8.0 - BAR_LEFT - number_w;
    for (i, (reason, n)) in rows.iter().enumerate() {
        let y = 8.0 + i as f64 * ROW_H;
        let len = if max == 0 {
            0.0
        } else {
            (*n as f64 / max as f64 * bar_max).max(if *n > 0 { 1.0 } else { 0.0 })
        };
        let shown: String = if reason.chars().count() > LABEL_CHARS {
            let mut cut: String = reason.chars().take(LABEL_CHARS - 1).collect();
            cut.truncate(cut.trim_end().len());
            cut.push('…');
            cut
        } else {
            reason.clone()
        };
        let _ = write!(
            out,
            "<g class=\"row\" data-reason=\"{}\" data-count=\"{n}\"><title>{}</title>\
             <text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"{INK}\" text-anchor=\"end\">{}</text>",
            esc(reason),
            esc(&format!("{reason}: {n}")),
            px(LABEL_RIGHT),
            px(y + 13.0),
            esc(&shown),
        );
        if len > 0.0 {
            let _ = write!(
                out,
                "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>",
                px(BAR_LEFT),
                px(y + (ROW_H - BAR_H) / 2.0 - 4.0),
                px(len),
                px(BAR_H),
                // Neutral, so a refusal is not read as a call of the first series above it.
                MUTED,
            );
        }
        let _ = write!(
            out,
            "<text class=\"value\" x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"{INK}\">{n}</text></g>",
            px(BAR_LEFT + len + 6.0),
            px(y + 13.0),
        );
    }
    out.push_str("</svg>");
    out
}

/// The `<svg>` start tag with its accessible name and description.
fn open_svg(out: &mut String, id: &str, height: f64, title: &str, desc: &str) {
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" role=\"img\" \
         aria-labelledby=\"{id}-title {id}-desc\" viewBox=\"0 0 {} {}\" font-family=\"{FONT}\">\
         <title id=\"{id}-title\">{}</title><desc id=\"{id}-desc\">{}</desc>",
        px(WIDTH),
        px(height),
        esc(title),
        esc(desc),
    );
}

/// The words for the stacked chart's `<desc>`.
fn stacked_desc(
    series: &[Series],
    bars: &[Bar],
    series_totals: &[u64],
    bar_totals: &[u64],
    total: u64,
) -> String {
    let mut d = plural(bars.len() as u64, "bar", "bars");
    match (bars.first(), bars.last()) {
        (Some(first), Some(last)) if bars.len() > 1 => {
            let _ = write!(d, " from {} to {}", first.long, last.long);
        }
        (Some(only), _) => {
            let _ = write!(d, " ({})", only.long);
        }
        _ => {}
    }
    if total == 0 {
        d.push_str("; no calls in this period.");
        return d;
    }
    let by: Vec<String> =
        series.iter().zip(series_totals).map(|(s, t)| format!("{} {t}", s.label)).collect();
    let _ = write!(d, "; {} in all: {}.", plural(total, "call", "calls"), by.join(", "));
    // The busiest bar: the first one with the highest total.
    let mut busiest: Option<usize> = None;
    for (i, t) in bar_totals.iter().enumerate() {
        if busiest.is_none_or(|b| *t > bar_totals[b]) {
            busiest = Some(i);
        }
    }
    if let Some(b) = busiest
        && bars.len() > 1
    {
        let _ =
            write!(d, " Busiest: {}, {}.", bars[b].long, plural(bar_totals[b], "call", "calls"));
    }
    d
}

/// The tooltip for a whole column: its long label, total and breakdown.
fn bar_breakdown(series: &[Series], bar: &Bar, total: u64) -> String {
    if total == 0 {
        return format!("{}: no calls", bar.long);
    }
    let parts: Vec<String> = series
        .iter()
        .enumerate()
        .filter_map(|(s, ser)| match bar.counts.get(s) {
            Some(n) if *n > 0 => Some(format!("{} {n}", ser.label)),
            _ => None,
        })
        .collect();
    format!("{}: {} ({})", bar.long, plural(total, "call", "calls"), parts.join(", "))
}

/// The fill pattern of series `i`: its colour with white marks, one kind per series.
fn pattern_def(out: &mut String, id: &str, i: usize) {
    let marks = match i % PATTERNS {
        // Solid.
        0 => "",
        // Diagonal hatch.
        1 => "<path d=\"M-1,1 l2,-2 M0,8 l8,-8 M7,9 l2,-2\" stroke=\"#fff\" stroke-width=\"1.5\"/>",
        // Dots.
        2 => {
            "<circle cx=\"2\" cy=\"2\" r=\"1.3\" fill=\"#fff\"/><circle cx=\"6\" cy=\"6\" r=\"1.3\" fill=\"#fff\"/>"
        }
        // Cross-hatch.
        3 => {
            "<path d=\"M-1,1 l2,-2 M0,8 l8,-8 M7,9 l2,-2 M-1,7 l2,2 M0,0 l8,8 M7,-1 l2,2\" \
             stroke=\"#fff\" stroke-width=\"1\"/>"
        }
        // Horizontal lines.
        4 => "<path d=\"M0,2 h8 M0,6 h8\" stroke=\"#fff\" stroke-width=\"1.2\"/>",
        // Vertical lines.
        _ => "<path d=\"M2,0 v8 M6,0 v8\" stroke=\"#fff\" stroke-width=\"1.2\"/>",
    };
    let _ = write!(
        out,
        "<pattern id=\"{id}-s{i}\" patternUnits=\"userSpaceOnUse\" width=\"8\" height=\"8\">\
         <rect width=\"8\" height=\"8\" fill=\"{}\"/>{marks}</pattern>",
        colour(i),
    );
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

/// Escapes text for XML content and attributes; drops control characters XML cannot hold.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' | '\r' => out.push(' '),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    const SERIES: [Series; 3] = [
        Series { key: "read", label: "read" },
        Series { key: "silent-write", label: "silent write" },
        Series { key: "write", label: "write" },
    ];

    fn bar(short: &str, long: &str, counts: &[u64]) -> Bar {
        Bar { short: short.to_owned(), long: long.to_owned(), counts: counts.to_vec() }
    }

    /// The hourly bars of `hours` hours, every bar labelled "HH:00", counts from `f`.
    fn hourly(hours: usize, f: impl Fn(usize) -> Vec<u64>) -> Vec<Bar> {
        (0..hours)
            .map(|h| Bar {
                short: format!("{:02}:00", h % 24),
                long: format!("day {} {:02}:00–{:02}:00 UTC", h / 24, h % 24, (h + 1) % 24),
                counts: f(h),
            })
            .collect()
    }

    /// Every tag opened is closed in order, attribute values are quoted, and every `&`
    /// starts an entity: the output is well-formed enough to be parsed as XML.
    fn assert_well_formed(svg: &str) {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = svg;
        while let Some(start) = rest.find('<') {
            assert!(!rest[..start].contains('>'), "stray > in text: {}", &rest[..start]);
            let end = rest[start..].find('>').expect("tag closes") + start;
            let tag = &rest[start + 1..end];
            assert!(!tag.contains('<'), "< inside a tag: {tag}");
            assert_eq!(tag.matches('"').count() % 2, 0, "unbalanced quotes in {tag}");
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop().as_deref(), Some(name), "mismatched </{name}>");
            } else if !tag.ends_with('/') {
                let name = tag.split_whitespace().next().expect("tag name");
                stack.push(name.to_owned());
            }
            rest = &rest[end + 1..];
        }
        assert!(stack.is_empty(), "unclosed: {stack:?}");
        for (i, _) in svg.match_indices('&') {
            let entity = &svg[i..svg[i..].find(';').map_or(svg.len(), |e| i + e + 1)];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"].contains(&entity),
                "bare & at {i}: {entity}"
            );
        }
    }

    fn occurrences(haystack: &str, needle: &str) -> usize {
        haystack.matches(needle).count()
    }

    #[test]
    fn segments_match_the_input_and_zeros_are_not_drawn() {
        let bars = vec![
            bar("00:00", "Tue 1 Dec 00:00–01:00 UTC", &[5, 0, 2]),
            bar("01:00", "Tue 1 Dec 01:00–02:00 UTC", &[0, 0, 0]),
            bar("02:00", "Tue 1 Dec 02:00–03:00 UTC", &[7, 3, 0]),
            bar("03:00", "Tue 1 Dec 03:00–04:00 UTC", &[1]),
        ];
        let svg = stacked_bars("conn-7", "Calls by hour", &SERIES, &bars);
        assert_well_formed(&svg);
        assert_eq!(occurrences(&svg, "class=\"seg\""), 5);
        for (series, n, b) in [
            ("read", 5, 0),
            ("write", 2, 0),
            ("read", 7, 2),
            ("silent-write", 3, 2),
            ("read", 1, 3),
        ] {
            let attrs = format!("data-series=\"{series}\" data-count=\"{n}\" data-bar=\"{b}\"");
            assert_eq!(occurrences(&svg, &attrs), 1, "{attrs}");
        }
        assert!(!svg.contains("data-count=\"0\""));
        for (b, t) in [(0, 7), (1, 0), (2, 10), (3, 1)] {
            assert!(
                svg.contains(&format!("<g class=\"bar\" data-bar=\"{b}\" data-total=\"{t}\">"))
            );
        }
        assert!(svg.contains("<title>Tue 1 Dec 02:00–03:00 UTC · silent write: 3</title>"));
        // The bar with 10 calls is the tallest: the scale is 0..10 in steps of 2.
        assert!(svg.contains(">10</text>"));
        assert!(!svg.contains("No calls in this period"));
    }

    #[test]
    fn segment_heights_stack_to_the_bar_total() {
        // One bar of 10 on a 0..10 scale fills the plot: segments 6 and 4 touch.
        let bars = vec![bar("a", "A", &[6, 4, 0]), bar("b", "B", &[1, 0, 0])];
        let svg = stacked_bars("x", "t", &SERIES, &bars);
        let heights: Vec<f64> = svg
            .match_indices("class=\"seg\"")
            .map(|(i, _)| {
                let h = &svg[i..];
                let v = &h[h.find("height=\"").expect("height") + 8..];
                v[..v.find('"').expect("quote")].parse::<f64>().expect("number")
            })
            .collect();
        assert_eq!(heights.len(), 3);
        let plot_h = STACKED_HEIGHT - 30.0 - (8.0 + LEGEND_ROW + 10.0);
        assert!((heights[0] + heights[1] - plot_h).abs() < 0.02, "{heights:?}");
        assert!((heights[0] / heights[1] - 1.5).abs() < 0.01, "{heights:?}");
        assert!((heights[2] - plot_h / 10.0).abs() < 0.02, "{heights:?}");
    }

    #[test]
    fn legend_and_desc_carry_the_totals() {
        let bars = hourly(24, |h| {
            if h == 14 {
                vec![40, 2, 0]
            } else if h < 10 {
                vec![8, 1, 0]
            } else {
                vec![0, 0, 0]
            }
        });
        let svg = stacked_bars("c", "Calls, last 24 hours", &SERIES, &bars);
        assert_well_formed(&svg);
        assert!(svg.contains(">read · 120</text>"), "{svg}");
        assert!(svg.contains(">silent write · 12</text>"));
        assert!(svg.contains(">write · 0</text>"));
        assert!(svg.contains(
            "<desc id=\"c-desc\">24 bars from day 0 00:00–01:00 UTC to day 0 23:00–00:00 UTC; \
             132 calls in all: read 120, silent write 12, write 0. Busiest: day 0 14:00–15:00 UTC, 42 calls.</desc>"
        ), "{svg}");
        assert!(svg.contains("<title id=\"c-title\">Calls, last 24 hours</title>"));
        assert!(svg.contains("aria-labelledby=\"c-title c-desc\""));
        assert!(svg.contains("role=\"img\""));
        assert!(svg.contains("viewBox=\"0 0 720 220\""));
        // Each series has its own pattern, and the swatch uses it.
        for (i, c) in PALETTE.iter().enumerate().take(3) {
            assert_eq!(occurrences(&svg, &format!("<pattern id=\"c-s{i}\"")), 1);
            assert!(svg.contains(&format!("fill=\"url(#c-s{i})\" stroke=\"{}\"", c)));
        }
        assert_eq!(occurrences(&svg, "<pattern "), 3);
    }

    #[test]
    fn six_series_get_six_distinct_colour_and_pattern_pairs() {
        let mut defs = Vec::new();
        for i in 0..6 {
            let mut s = String::new();
            pattern_def(&mut s, "p", i);
            let body = s[s.find('>').expect("open") + 1..].to_owned();
            defs.push(body);
        }
        for i in 0..6 {
            for j in 0..i {
                assert_ne!(defs[i], defs[j]);
                assert_ne!(colour(i), colour(j));
            }
        }
        // Marks differ too, not only colours: strip the colour and compare again.
        let marks: Vec<String> =
            defs.iter().enumerate().map(|(i, d)| d.replace(colour(i), "")).collect();
        for i in 0..6 {
            for j in 0..i {
                assert_ne!(marks[i], marks[j], "patterns {i} and {j}");
            }
        }
    }

    #[test]
    fn palette_has_three_to_one_contrast_on_white() {
        fn luminance(hex: &str) -> f64 {
            let channel = |i: usize| {
                let v = f64::from(u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")) / 255.0;
                if v <= 0.04045 { v / 12.92 } else { ((v + 0.055) / 1.055).powf(2.4) }
            };
            0.2126 * channel(1) + 0.7152 * channel(3) + 0.0722 * channel(5)
        }
        for c in PALETTE.iter().chain([INK, MUTED].iter()) {
            let ratio = 1.05 / (luminance(c) + 0.05);
            assert!(ratio >= 3.0, "{c}: {ratio:.2}");
        }
        assert!(1.05 / (luminance(MUTED) + 0.05) >= 4.5, "axis text needs 4.5:1");
    }

    #[test]
    fn hostile_text_is_escaped() {
        let series = [Series { key: "r\"><script>", label: "<b>read</b> & 'co'" }];
        let bars = vec![bar("<i>", "\"onmouseover=\"x", &[3]), bar("</svg>", "a\u{0}b", &[1])];
        let svg = stacked_bars("h", "<script>alert(1)</script>", &series, &bars);
        assert_well_formed(&svg);
        assert!(!svg.contains("<script"));
        assert!(!svg.contains("<b>"));
        assert!(!svg.contains("<i>"));
        assert_eq!(occurrences(&svg, "</svg>"), 1);
        assert!(!svg.contains('\u{0}'));
        assert!(
            svg.contains("<title id=\"h-title\">&lt;script&gt;alert(1)&lt;/script&gt;</title>")
        );
        assert!(svg.contains("data-series=\"r&quot;&gt;&lt;script&gt;\""));
        assert!(svg.contains("&lt;b&gt;read&lt;/b&gt; &amp; &#39;co&#39; · 4"));
        assert!(
            svg.contains(
                "&quot;onmouseover=&quot;x · &lt;b&gt;read&lt;/b&gt; &amp; &#39;co&#39;: 3"
            )
        );

        let rows = vec![("<script>alert('x')</script>".to_owned(), 3), ("a & \"b\"".to_owned(), 1)];
        let svg = horizontal_bars("r", "Refusals & <more>", &rows);
        assert_well_formed(&svg);
        assert!(!svg.contains("<script"));
        assert!(svg.contains("data-reason=\"&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;\""));
        assert!(svg.contains("data-reason=\"a &amp; &quot;b&quot;\""));
        assert!(svg.contains("<title id=\"r-title\">Refusals &amp; &lt;more&gt;</title>"));
    }

    #[test]
    fn ids_are_sanitised() {
        assert_eq!(sanitize_id("agent-conn-42"), "agent-conn-42");
        assert_eq!(sanitize_id("Conn 7/\"x\"<é>"), "-onn-7--x----");
        assert_eq!(sanitize_id(""), "chart");
        let svg = stacked_bars("a\"b c", "t", &SERIES, &[bar("x", "X", &[1, 1, 1])]);
        assert_well_formed(&svg);
        assert!(svg.contains("aria-labelledby=\"a-b-c-title a-b-c-desc\""));
        assert!(svg.contains("<pattern id=\"a-b-c-s1\""));
        assert!(svg.contains("fill=\"url(#a-b-c-s2)\""));
        assert!(!svg.contains("a\"b"));
        let svg = horizontal_bars("R<1>", "t", &[("x".to_owned(), 1)]);
        assert!(svg.contains("<desc id=\"--1--desc\">"));
    }

    #[test]
    fn empty_charts_say_so() {
        for bars in [Vec::new(), hourly(24, |_| vec![0, 0, 0]), hourly(3, |_| Vec::new())] {
            let svg = stacked_bars("e", "Calls", &SERIES, &bars);
            assert_well_formed(&svg);
            assert!(svg.contains(">No calls in this period</text>"), "{svg}");
            assert!(svg.contains("no calls in this period.</desc>"), "{svg}");
            assert!(!svg.contains("class=\"seg\""));
            assert!(!svg.contains("class=\"bar\""));
            // The axes are still drawn, with the zero label.
            assert!(svg.contains("<g class=\"axes\""));
            assert!(svg.contains(">0</text>"));
            assert!(svg.contains(">read · 0</text>"));
        }
        let svg = stacked_bars("e", "Calls", &SERIES, &hourly(24, |_| vec![0, 0, 0]));
        assert!(svg.contains("<desc id=\"e-desc\">24 bars from day 0 00:00–01:00 UTC to day 0 23:00–00:00 UTC; no calls in this period.</desc>"));
        assert_eq!(occurrences(&svg, "class=\"x-label\""), 12);

        let svg = horizontal_bars("e", "Refusals", &[]);
        assert_well_formed(&svg);
        assert!(svg.contains(">No refusals in this period</text>"));
        assert!(svg.contains("<desc id=\"e-desc\">No refusals in this period.</desc>"));
        assert!(!svg.contains("class=\"row\""));
    }

    #[test]
    fn nice_scale_rounds_up_to_one_two_five_steps() {
        for (max, expected) in [
            (0, (3, 1)),
            (1, (3, 1)),
            (3, (3, 1)),
            (5, (5, 1)),
            (6, (6, 2)),
            (7, (8, 2)),
            (10, (10, 2)),
            (11, (15, 5)),
            (25, (25, 5)),
            (26, (30, 10)),
            (42, (50, 10)),
            (99, (100, 20)),
            (101, (150, 50)),
            (132, (150, 50)),
            (980, (1000, 200)),
            (12_345, (15_000, 5_000)),
            // Saturates rather than overflows.
            (u64::MAX, (u64::MAX, 5_000_000_000_000_000_000)),
        ] {
            assert_eq!(nice_scale(max), expected, "max {max}");
        }
        for max in 1..5000u64 {
            let (top, step) = nice_scale(max);
            assert!(top >= max, "{max}");
            assert!((3..=5).contains(&(top / step)), "{max}: {top}/{step}");
            let mantissa = (0..19).map(|k| 10u64.pow(k)).find_map(|p| {
                (step % p == 0 && [1, 2, 5].contains(&(step / p))).then_some(step / p)
            });
            assert!(mantissa.is_some(), "{max}: step {step}");
        }
    }

    #[test]
    fn labels_of_a_week_of_hours_are_thinned() {
        let bars = hourly(168, |h| vec![h as u64 % 5, 1, 0]);
        let svg = stacked_bars("w", "Calls, last 7 days", &SERIES, &bars);
        assert_well_formed(&svg);
        let labels = occurrences(&svg, "class=\"x-label\"");
        assert!((7..=14).contains(&labels), "{labels} labels");
        // A regular stride: every 12th hour, so 00:00 and 12:00 only.
        let slot = (PLOT_RIGHT - PLOT_LEFT) / 168.0;
        let shown = shown_labels(&bars, slot);
        assert_eq!(shown, (0..168).step_by(12).collect::<Vec<_>>());
        assert_eq!(occurrences(&svg, ">12:00</text>"), 7);
        assert_eq!(occurrences(&svg, ">00:00</text>"), 7);
        assert_eq!(occurrences(&svg, "class=\"seg\""), 168 + 134);

        // The caller labels only where the day changes; the partial first day's label is too
        // close to the next one and gives way to it.
        let mut bars = hourly(168, |_| vec![1, 0, 0]);
        for (i, b) in bars.iter_mut().enumerate() {
            b.short = match i {
                0 => "Mon 30".to_owned(),
                i if (i + 14) % 24 == 0 => format!("day {}", (i + 14) / 24),
                _ => String::new(),
            };
        }
        let shown = shown_labels(&bars, slot);
        assert_eq!(shown, vec![10, 34, 58, 82, 106, 130, 154]);
        // With room enough, every label the caller gave is drawn.
        bars[0].short = "M".to_owned();
        bars[10].short = String::new();
        assert_eq!(shown_labels(&bars, slot), vec![0, 34, 58, 82, 106, 130, 154]);

        // Labels never overlap, whatever the count.
        for n in [1, 2, 7, 12, 24, 30, 31, 48, 90, 168, 500] {
            let bars = hourly(n, |_| vec![1]);
            let slot = (PLOT_RIGHT - PLOT_LEFT) / n as f64;
            let shown = shown_labels(&bars, slot);
            assert!(!shown.is_empty());
            for w in shown.windows(2) {
                let apart = (w[1] - w[0]) as f64 * slot;
                assert!(apart >= text_width("00:00") + LABEL_GAP, "{n} bars: {w:?}");
            }
        }
        assert_eq!(shown_labels(&hourly(7, |_| vec![1]), (PLOT_RIGHT - PLOT_LEFT) / 7.0).len(), 7);
    }

    #[test]
    fn horizontal_rows_carry_reason_bar_and_number() {
        let rows = vec![
            ("policy denied".to_owned(), 20),
            ("rate limited".to_owned(), 10),
            ("no consent".to_owned(), 0),
            ("a reason so long that it cannot fit in the column".to_owned(), 5),
        ];
        let svg = horizontal_bars("ref", "Refusals by reason", &rows);
        assert_well_formed(&svg);
        assert_eq!(occurrences(&svg, "<g class=\"row\""), 4);
        assert!(svg.contains("<g class=\"row\" data-reason=\"policy denied\" data-count=\"20\">"));
        assert!(svg.contains("<g class=\"row\" data-reason=\"no consent\" data-count=\"0\">"));
        assert!(svg.contains(">policy denied</text>"));
        // The number is text after the bar, not only a length.
        for n in [20, 10, 0, 5] {
            assert!(svg.contains(&format!("fill=\"{INK}\">{n}</text></g>")), "{n}");
        }
        // Bars are proportional to the largest; zero draws no bar.
        let widths: Vec<f64> = svg
            .match_indices("<rect ")
            .map(|(i, _)| {
                let r = &svg[i..];
                let v = &r[r.find("width=\"").expect("width") + 7..];
                v[..v.find('"').expect("quote")].parse::<f64>().expect("number")
            })
            .collect();
        assert_eq!(widths.len(), 3);
        assert!((widths[0] / widths[1] - 2.0).abs() < 0.01, "{widths:?}");
        assert!((widths[0] / widths[2] - 4.0).abs() < 0.01, "{widths:?}");
        assert!(widths[0] + 328.0 <= WIDTH - 8.0);
        // Long reasons are cut in the picture but whole in the tooltip and data.
        assert!(svg.contains(">a reason so long that it cannot fit in the colu…</text>"), "{svg}");
        assert!(
            svg.contains("<title>a reason so long that it cannot fit in the column: 5</title>")
        );
        assert!(svg.contains(
            "4 reasons; 35 refusals in all: policy denied 20, rate limited 10, no consent 0, \
             a reason so long that it cannot fit in the column 5.</desc>"
        ));
        assert!(svg.contains("viewBox=\"0 0 720 120\""));
    }

    #[test]
    fn output_is_deterministic_and_uses_readable_fonts() {
        let bars = hourly(48, |h| vec![h as u64, (h % 3) as u64, 1]);
        let a = stacked_bars("d", "t", &SERIES, &bars);
        assert_eq!(a, stacked_bars("d", "t", &SERIES, &bars));
        let rows = vec![("x".to_owned(), 2)];
        let b = horizontal_bars("d", "t", &rows);
        assert_eq!(b, horizontal_bars("d", "t", &rows));
        for svg in [&a, &b] {
            assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
            assert!(svg.contains("font-family=\"system-ui, sans-serif\""));
            assert!(!svg.contains("style="), "the CSP forbids inline styles");
            for (i, _) in svg.match_indices("font-size=\"") {
                let v = &svg[i + 11..];
                let size: u32 = v[..v.find('"').expect("quote")].parse().expect("size");
                assert!(size >= 11);
            }
        }
    }

    #[test]
    fn helpers_format_numbers() {
        assert_eq!(px(12.0), "12");
        assert_eq!(px(12.5), "12.5");
        assert_eq!(px(1.0 / 3.0), "0.33");
        assert_eq!(px(-0.001), "0");
        assert_eq!(compact(950), "950");
        assert_eq!(compact(1000), "1k");
        assert_eq!(compact(1500), "1.5k");
        assert_eq!(compact(20_000), "20k");
        assert_eq!(compact(2_500_000), "2.5M");
        assert_eq!(plural(1, "call", "calls"), "1 call");
        assert_eq!(plural(0, "call", "calls"), "0 calls");
    }
}
