//! The charts' unit tests (run from the crate's integration-test binary).

use super::*;

/// The charts as the page receives them.
fn stacked_bars(id: &str, title: &str, series: &[Series], bars: &[Bar]) -> String {
    super::stacked_bars(id, title, "calls per hour", series, bars).into_string()
}

fn horizontal_bars(id: &str, title: &str, rows: &[(String, u64)]) -> String {
    super::horizontal_bars(id, title, rows).into_string()
}

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
        assert!(["&amp;", "&lt;", "&gt;", "&quot;"].contains(&entity), "bare & at {i}: {entity}");
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
    for (series, n, b) in
        [("read", 5, 0), ("write", 2, 0), ("read", 7, 2), ("silent-write", 3, 2), ("read", 1, 3)]
    {
        let attrs = format!("data-series=\"{series}\" data-count=\"{n}\" data-bar=\"{b}\"");
        assert_eq!(occurrences(&svg, &attrs), 1, "{attrs}");
    }
    assert!(!svg.contains("data-count=\"0\""));
    for (b, t) in [(0, 7), (1, 0), (2, 10), (3, 1)] {
        assert!(svg.contains(&format!("<g class=\"bar\" data-bar=\"{b}\" data-total=\"{t}\">")));
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
        let s = pattern_def("p", i).into_string();
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
    assert!(svg.contains("<title id=\"h-title\">&lt;script&gt;alert(1)&lt;/script&gt;</title>"));
    assert!(svg.contains("data-series=\"r&quot;&gt;&lt;script&gt;\""));
    assert!(svg.contains("&lt;b&gt;read&lt;/b&gt; &amp; 'co' · 4"));
    assert!(svg.contains("&quot;onmouseover=&quot;x · &lt;b&gt;read&lt;/b&gt; &amp; 'co': 3"));

    let rows = vec![("<script>alert('x')</script>".to_owned(), 3), ("a & \"b\"".to_owned(), 1)];
    let svg = horizontal_bars("r", "Refusals & <more>", &rows);
    assert_well_formed(&svg);
    assert!(!svg.contains("<script"));
    assert!(svg.contains("data-reason=\"&lt;script&gt;alert('x')&lt;/script&gt;\""));
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
        let mantissa = (0..19)
            .map(|k| 10u64.pow(k))
            .find_map(|p| (step % p == 0 && [1, 2, 5].contains(&(step / p))).then_some(step / p));
        assert!(mantissa.is_some(), "{max}: step {step}");
    }
}

#[test]
fn the_y_axis_says_what_it_counts() {
    let svg = stacked_bars("u", "Calls", &SERIES, &hourly(24, |h| vec![h as u64, 0, 0]));
    assert_well_formed(&svg);
    assert!(svg.contains("class=\"unit\""), "{svg}");
    assert_eq!(occurrences(&svg, ">calls per hour</text>"), 1);
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
    assert!(svg.contains("<title>a reason so long that it cannot fit in the column: 5</title>"));
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
