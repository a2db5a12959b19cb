//! The stacked bar chart: calls per time bucket, one segment per series.

use std::fmt::Write;

use maud::{Markup, html};

use super::{
    Bar, Chars, GRID, INK, LEGEND_ROW, MUTED, PLOT_LEFT, PLOT_RIGHT, STACKED_HEIGHT, Series, WIDTH,
    colour, compact, nice_scale, pattern_def, plural, px, sanitize_id, shown_labels, svg,
    text_width,
};

/// One drawn segment of a bar: its series, count, top and height.
struct Segment {
    series: usize,
    count: u64,
    y: f64,
    height: f64,
}

/// A stacked bar chart of calls per time bucket by series, as an inline `<svg>`.
///
/// `id` prefixes the DOM ids in the output (title, desc, patterns); only `[a-z0-9-]` is kept.
/// `unit` names what the y axis counts (`calls per hour`), written above it.
pub fn stacked_bars(id: &str, title: &str, unit: &str, series: &[Series], bars: &[Bar]) -> Markup {
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

    // Y axis: gridlines and labels (only the zero line when there is nothing to show).
    let (scale_top, step) = nice_scale(max);
    let steps = if total == 0 { 0 } else { scale_top / step.max(1) };
    let y_of = |v: f64| bottom - v / scale_top.max(1) as f64 * plot_h;

    let slot = if bars.is_empty() { plot_w } else { plot_w / bars.len() as f64 };
    let bar_w = (slot * 0.8).min(48.0);
    // Each bar's segments, bottom up; zero counts are not drawn.
    let segments: Vec<Vec<Segment>> = bars
        .iter()
        .map(|bar| {
            let mut below = 0u64;
            (0..series.len())
                .filter_map(|s| {
                    let n = count(bar, s);
                    if n == 0 {
                        return None;
                    }
                    let above = below.saturating_add(n);
                    let (y_low, y_high) = (y_of(below as f64), y_of(above as f64));
                    below = above;
                    Some(Segment { series: s, count: n, y: y_high, height: y_low - y_high })
                })
                .collect()
        })
        .collect();

    let desc = stacked_desc(series, bars, &series_totals, &bar_totals, total);
    let content = html! {
        defs { @for i in 0..series.len() { (pattern_def(&id, i)) } }
        g class="legend" {
            @for (i, ((s, text), (x, y))) in series.iter().zip(&legend_texts).zip(&legend_pos).enumerate() {
                g class="key" data-series=(Chars(s.key)) {
                    rect x=(px(*x)) y=(px(*y)) width="14" height="14"
                        fill={ "url(#" (id) "-s" (i) ")" } stroke=(colour(i)) {}
                    text x=(px(x + 20.0)) y=(px(y + 11.5)) font-size="12" fill=(INK) { (Chars(text)) }
                }
            }
        }
        g class="y-axis" {
            text class="unit" x="4" y=(px(top - 6.0)) font-size="11" fill=(MUTED) { (Chars(unit)) }
            @for k in 0..=steps {
                @let v = k.saturating_mul(step);
                @let y = y_of(v as f64);
                @if k > 0 {
                    line x1=(px(PLOT_LEFT)) y1=(px(y)) x2=(px(PLOT_RIGHT)) y2=(px(y)) stroke=(GRID) {}
                }
                text x=(px(PLOT_LEFT - 6.0)) y=(px(y + 4.0)) font-size="11" fill=(MUTED) text-anchor="end" { (compact(v)) }
            }
        }
        // Bars: a hover target over the whole column with the breakdown, then the segments.
        @if total > 0 {
            g class="bars" {
                @for (b, (bar, segs)) in bars.iter().zip(&segments).enumerate() {
                    @let x0 = PLOT_LEFT + b as f64 * slot;
                    @let x = x0 + (slot - bar_w) / 2.0;
                    g class="bar" data-bar=(b) data-total=(bar_totals[b]) {
                        rect class="hit" x=(px(x0)) y=(px(top)) width=(px(slot)) height=(px(plot_h)) fill="#fff" fill-opacity="0" {
                            title { (Chars(&bar_breakdown(series, bar, bar_totals[b]))) }
                        }
                        @for seg in segs {
                            @let ser = &series[seg.series];
                            rect class="seg" data-series=(Chars(ser.key)) data-count=(seg.count) data-bar=(b)
                                x=(px(x)) y=(px(seg.y)) width=(px(bar_w)) height=(px(seg.height))
                                fill={ "url(#" (id) "-s" (seg.series) ")" } {
                                title { (Chars(&format!("{} · {}: {}", bar.long, ser.label, seg.count))) }
                            }
                        }
                    }
                }
            }
        }
        // Axes, over the bars.
        g class="axes" stroke=(MUTED) {
            line x1=(px(PLOT_LEFT)) y1=(px(top)) x2=(px(PLOT_LEFT)) y2=(px(bottom)) {}
            line x1=(px(PLOT_LEFT)) y1=(px(bottom)) x2=(px(PLOT_RIGHT)) y2=(px(bottom)) {}
        }
        // X labels, thinned so they never overlap.
        g class="x-axis" {
            @for i in shown_labels(bars, slot) {
                @let label = bars[i].short.trim();
                @let half = text_width(label) / 2.0;
                @let cx = PLOT_LEFT + (i as f64 + 0.5) * slot;
                @let tx = cx.clamp(half + 2.0, (WIDTH - half - 2.0).max(half + 2.0));
                line x1=(px(cx)) y1=(px(bottom)) x2=(px(cx)) y2=(px(bottom + 4.0)) stroke=(MUTED) {}
                text class="x-label" x=(px(tx)) y=(px(bottom + 17.0)) font-size="11" fill=(MUTED) text-anchor="middle" { (Chars(label)) }
            }
        }
        @if total == 0 {
            text class="empty" x=(px(PLOT_LEFT + plot_w / 2.0)) y=(px(top + plot_h / 2.0)) font-size="13" fill=(MUTED) text-anchor="middle" {
                "No calls in this period"
            }
        }
    };
    svg(&id, height, title, &desc, content)
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
