//! Time is server work (R17).
//!
//! Times arrive as an ISO 8601 instant with an offset, or as a local date-time plus an IANA
//! zone; never bare. A local time that does not exist (spring-forward gap) or exists twice
//! (fall-back fold) is rejected with the concrete options. Every time in a result is shown
//! with weekday, local time and zone, UTC, and distance from now.

use jiff::civil::{Date, DateTime};
use jiff::tz::{AmbiguousOffset, Offset, TimeZone};
use jiff::{Timestamp, ZonedDateTime};
use serde::Serialize;

use crate::error::{Error, Result};

/// Resolves an IANA zone name, rejecting names the zone database does not know.
pub fn zone(field: &str, name: &str) -> Result<TimeZone> {
    TimeZone::get(name.trim()).map_err(|_| {
        Error::invalid(field, format!("{name:?} is not an IANA time zone such as Europe/Berlin"))
    })
}

/// The time part of an ISO 8601 date-time: what follows the `T` (either case) or the space
/// after the date.
fn time_part(input: &str) -> Option<&str> {
    input.find(['T', 't', ' ']).map(|t| &input[t + 1..])
}

fn has_offset(input: &str) -> bool {
    // An offset or `Z` can only follow the time part.
    time_part(input).is_some_and(|time| {
        time.ends_with(['Z', 'z']) || time.contains(['+', '-', '\u{2212}', '['])
    })
}

/// Offsets in use on Earth lie within ±14:00; the ISO grammar allows up to ±23:59.
const MAX_OFFSET_SECONDS: i32 = 14 * 3600;

/// Parses one point in time given by a caller.
///
/// `zone` is required unless the input carries its own offset. An input that carries an
/// offset is read with it, or refused; never read in `zone` with its offset dropped.
pub fn parse_instant(field: &str, input: &str, zone_name: Option<&str>) -> Result<Timestamp> {
    let input = input.trim();
    if has_offset(input) {
        if let Some(bracket) = input.find('[') {
            // An instant with its offset and the zone it was written in (RFC 9557, as Java's
            // ZonedDateTime and Temporal write it): read when the two agree, refused when they
            // do not. Without an offset the zone alone would have to guess in a gap or a fold.
            if offset_of(&input[..bracket]).is_none() && !input[..bracket].ends_with(['Z', 'z']) {
                return Err(Error::invalid(
                    field,
                    format!(
                        "{input:?} has a [zone] but no offset; give the offset too, or the local time with `zone`"
                    ),
                ));
            }
            let zoned = input.parse::<ZonedDateTime>().map_err(|e| {
                Error::invalid(
                    field,
                    format!(
                        "{input:?} is not a time whose offset agrees with its [zone]: {e}; give the time with its offset alone, or the local time with `zone`"
                    ),
                )
            })?;
            return in_range(field, input, zoned.timestamp());
        }
        let zoned =
            jiff::fmt::temporal::DateTimeParser::new().parse_timestamp(input).map_err(|e| {
                Error::invalid(field, format!("{input:?} is not an ISO 8601 time with offset: {e}"))
            })?;
        let offset = offset_of(input);
        if offset.is_some_and(|o| o.unsigned_abs() > MAX_OFFSET_SECONDS as u32) {
            return Err(Error::invalid(
                field,
                format!("{input:?} has an offset beyond ±14:00, which no place uses"),
            ));
        }
        return in_range(field, input, zoned);
    }
    let local: DateTime = input.replacen([' ', 't'], "T", 1).parse().map_err(|_| {
        Error::invalid(
            field,
            format!("{input:?} is not a time; use 2026-03-29T14:30 with a zone, or 2026-03-29T14:30:00+02:00"),
        )
    })?;
    let Some(zone_name) = zone_name else {
        return Err(Error::invalid(
            field,
            format!(
                "{input:?} has no offset and no zone was given; add `zone` (an IANA name) or an offset"
            ),
        ));
    };
    let tz = zone("zone", zone_name)?;
    let ts = resolve_local(field, local, &tz, zone_name)?;
    in_range(field, input, ts)
}

/// The numeric offset written at the end of a time, in seconds (`Z` is none).
fn offset_of(input: &str) -> Option<i32> {
    let time = time_part(input)?;
    let at = time.rfind(['+', '-', '\u{2212}'])?;
    let (sign, rest) = time[at..].split_at(time[at..].chars().next()?.len_utf8());
    let digits: String = rest.chars().filter(char::is_ascii_digit).collect();
    let (h, m) = match digits.len() {
        2 => (digits.parse::<i32>().ok()?, 0),
        4 | 6 => (digits[..2].parse::<i32>().ok()?, digits[2..4].parse::<i32>().ok()?),
        _ => return None,
    };
    let seconds = h * 3600 + m * 60;
    Some(if sign == "+" { seconds } else { -seconds })
}

/// Times Gatehouse works with: years 1 to 9998, so every time can be shown in every zone and a
/// day after it still exists.
fn in_range(field: &str, input: &str, ts: Timestamp) -> Result<Timestamp> {
    let year = ts.to_zoned_datetime(TimeZone::UTC).year();
    if !(1..=9998).contains(&year) {
        return Err(out_of_range(field, input));
    }
    Ok(ts)
}

fn out_of_range(field: &str, input: &str) -> Error {
    Error::invalid(field, format!("{input:?} is outside the years 1 to 9998"))
}

/// Resolves a local date-time in a zone, refusing gaps and folds with the options.
pub fn resolve_local(
    field: &str,
    local: DateTime,
    tz: &TimeZone,
    zone_name: &str,
) -> Result<Timestamp> {
    let ambiguous = tz.to_ambiguous_timestamp(local);
    let render = |offset: jiff::tz::Offset| -> Result<String> {
        let ts = local.to_zoned_datetime(TimeZone::fixed(offset)).map_err(internal)?.timestamp();
        Ok(ts.to_zoned_datetime(tz.clone()).strftime("%Y-%m-%dT%H:%M:%S%:z").to_string())
    };
    match ambiguous.offset() {
        AmbiguousOffset::Unambiguous { offset } => Ok(local
            .to_zoned_datetime(TimeZone::fixed(offset))
            .map_err(|_| out_of_range(field, &local.to_string()))?
            .timestamp()),
        AmbiguousOffset::Gap { before, after } => Err(Error::invalid_with_options(
            field,
            format!(
                "{local} does not exist in {zone_name}: the clocks skip that hour; pick one of the options"
            ),
            vec![render(before)?, render(after)?],
        )),
        AmbiguousOffset::Fold { before, after } => Err(Error::invalid_with_options(
            field,
            format!(
                "{local} happens twice in {zone_name}: the clocks go back; pick one of the options (they differ by offset)"
            ),
            vec![
                local
                    .to_zoned_datetime(TimeZone::fixed(before))
                    .map_err(internal)?
                    .strftime("%Y-%m-%dT%H:%M:%S%:z")
                    .to_string(),
                local
                    .to_zoned_datetime(TimeZone::fixed(after))
                    .map_err(internal)?
                    .strftime("%Y-%m-%dT%H:%M:%S%:z")
                    .to_string(),
            ],
        )),
    }
}

fn internal(e: jiff::Error) -> Error {
    Error::Internal(format!("time arithmetic: {e}"))
}

/// Parses the bound of a range: a date (`2026-03-29`, meaning the start of that day in the
/// zone; with `end_of_day`, the start of the next day) or a full instant.
pub fn parse_range_bound(
    field: &str,
    input: &str,
    zone_name: Option<&str>,
    end_of_day: bool,
) -> Result<Timestamp> {
    let trimmed = input.trim();
    if trimmed.len() == 10
        && let Ok(date) = trimmed.parse::<Date>()
    {
        let Some(zone_name) = zone_name else {
            return Err(Error::invalid(
                field,
                format!("{trimmed:?} is a date; add `zone` (an IANA name) so the day has edges"),
            ));
        };
        let tz = zone("zone", zone_name)?;
        if !(1..=9998).contains(&date.year()) {
            return Err(out_of_range(field, trimmed));
        }
        let day = if end_of_day { date.tomorrow().map_err(internal)? } else { date };
        // The start of a day exists in every zone (jiff picks the first instant after a gap).
        let start =
            day.to_zoned_datetime(tz).map_err(internal)?.start_of_day().map_err(internal)?;
        return Ok(start.timestamp());
    }
    parse_instant(field, trimmed, zone_name)
}

/// How a time is shown in every result.
#[derive(Debug, Clone, Serialize, serde::Deserialize, schemars::JsonSchema, PartialEq)]
pub struct TimeView {
    /// Day of the week in the local zone.
    pub weekday: String,
    /// Local time with offset, ISO 8601.
    pub local: String,
    /// IANA zone of `local`.
    pub zone: String,
    /// Local time for people, with the zone abbreviation.
    pub display: String,
    /// The same instant in UTC, ISO 8601.
    pub utc: String,
    /// Distance from the time the result was made, e.g. "in 3 days", "2 hours ago".
    pub from_now: String,
}

pub fn present(ts: Timestamp, tz: &TimeZone, zone_name: &str, now: Timestamp) -> TimeView {
    let info = tz.to_offset_info(ts);
    let local = info.offset().to_datetime(ts);
    let utc = Offset::UTC.to_datetime(ts);
    // Every result shows several times: written field by field rather than through
    // `strftime`, which parses its format on each call. Years outside 0..=9999 (which the
    // fixed widths below cannot show) and abbreviations that are not plain letters take the
    // `strftime` path; a test holds both paths to the same text in every zone.
    let abbreviation = info.abbreviation();
    let plain = (0..=9999).contains(&local.year())
        && (0..=9999).contains(&utc.year())
        && !abbreviation.is_empty()
        && abbreviation.bytes().all(|b| b.is_ascii_alphabetic());
    if !plain {
        return present_strftime(ts, tz, zone_name, now);
    }
    let weekday = WEEKDAYS[local.weekday().to_monday_zero_offset() as usize];
    let month = MONTHS[local.month() as usize - 1];
    let offset = info.offset().seconds();
    let (sign, offset) = if offset < 0 { ('-', -offset) } else { ('+', offset) };
    let (oh, om) = (offset / 3600, offset / 60 % 60);
    let (y, mo, d, h, mi, se) =
        (local.year(), local.month(), local.day(), local.hour(), local.minute(), local.second());
    // Written digit by digit into strings of their final size: a search shows two times per
    // record, and `format!` grew each string several times.
    let local = if offset % 60 == 0 {
        let mut local = String::with_capacity(25);
        push_date_time(&mut local, [y, mo.into(), d.into(), h.into(), mi.into(), se.into()]);
        local.push(sign);
        push_digits(&mut local, oh, 2);
        local.push(':');
        push_digits(&mut local, om, 2);
        local
    } else {
        // An offset with seconds (some historical zones): `%:z` shows it as `strftime` does.
        local_of(ts, tz)
    };
    // `%Z` shows abbreviations in capitals (Guam's `ChST` as `CHST`).
    let mut display = String::with_capacity(24 + abbreviation.len());
    display.push_str(&weekday[..3]);
    display.push(' ');
    push_digits(&mut display, d.into(), 1);
    display.push(' ');
    display.push_str(month);
    display.push(' ');
    push_digits(&mut display, y.into(), 4);
    display.push_str(", ");
    push_digits(&mut display, h.into(), 2);
    display.push(':');
    push_digits(&mut display, mi.into(), 2);
    display.push(' ');
    display.extend(abbreviation.chars().map(|c| c.to_ascii_uppercase()));
    let mut utc_text = String::with_capacity(20);
    push_date_time(
        &mut utc_text,
        [
            utc.year(),
            utc.month().into(),
            utc.day().into(),
            utc.hour().into(),
            utc.minute().into(),
            utc.second().into(),
        ],
    );
    utc_text.push('Z');
    TimeView {
        weekday: weekday.to_owned(),
        local,
        zone: zone_name.to_owned(),
        display,
        utc: utc_text,
        from_now: distance(ts, now),
    }
}

/// `YYYY-MM-DDTHH:MM:SS` from year, month, day, hour, minute and second (the year in
/// 0..=9999, as the plain path checks).
fn push_date_time(out: &mut String, [y, mo, d, h, mi, se]: [i16; 6]) {
    push_digits(out, y.into(), 4);
    for (separator, part) in [('-', mo), ('-', d), ('T', h), (':', mi), (':', se)] {
        out.push(separator);
        push_digits(out, part.into(), 2);
    }
}

/// `n` (not negative) in decimal, zero-padded to at least `width` digits.
fn push_digits(out: &mut String, n: i32, width: usize) {
    let mut digits = [b'0'; 10];
    let mut at = digits.len();
    let mut rest = n.unsigned_abs();
    while rest > 0 || digits.len() - at < width.max(1) {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    // ASCII digits only.
    out.push_str(std::str::from_utf8(&digits[at..]).unwrap_or_default());
}

const WEEKDAYS: [&str; 7] =
    ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
const MONTHS: [&str; 12] =
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

fn local_of(ts: Timestamp, tz: &TimeZone) -> String {
    ts.to_zoned_datetime(tz.clone()).strftime("%Y-%m-%dT%H:%M:%S%:z").to_string()
}

/// The same view through `strftime`: the reference the field-by-field path is tested against,
/// and the path for what that one does not show.
fn present_strftime(ts: Timestamp, tz: &TimeZone, zone_name: &str, now: Timestamp) -> TimeView {
    let local: ZonedDateTime = ts.to_zoned_datetime(tz.clone());
    TimeView {
        weekday: local.strftime("%A").to_string(),
        local: local_of(ts, tz),
        zone: zone_name.to_owned(),
        display: local.strftime("%a %-d %b %Y, %H:%M %Z").to_string(),
        utc: ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        from_now: distance(ts, now),
    }
}

/// A coarse human distance between two instants.
pub fn distance(ts: Timestamp, now: Timestamp) -> String {
    let secs = ts.as_second() - now.as_second();
    let abs = secs.unsigned_abs();
    let (n, unit) = match abs {
        0..=59 => return "now".to_owned(),
        60..=3599 => (abs / 60, "minute"),
        3600..=86_399 => (abs / 3600, "hour"),
        86_400..=2_591_999 => (abs / 86_400, "day"),
        2_592_000..=31_535_999 => (abs / 2_592_000, "month"),
        _ => (abs / 31_536_000, "year"),
    };
    let mut out = String::with_capacity(18);
    if secs > 0 {
        out.push_str("in ");
    }
    // At most some thousands of years: well inside an i32.
    push_digits(&mut out, i32::try_from(n).unwrap_or(i32::MAX), 1);
    out.push(' ');
    out.push_str(unit);
    if n != 1 {
        out.push('s');
    }
    if secs <= 0 {
        out.push_str(" ago");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(err: Error) -> Vec<String> {
        match err {
            Error::Invalid { options, .. } => options,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_distance_reads_as_words_in_both_directions() {
        let now = Timestamp::from_second(1_790_000_000).expect("now");
        let cases = [
            (0, "now"),
            (59, "now"),
            (-59, "now"),
            (60, "in 1 minute"),
            (-60, "1 minute ago"),
            (119, "in 1 minute"),
            (120, "in 2 minutes"),
            (3599, "in 59 minutes"),
            (3600, "in 1 hour"),
            (-7200, "2 hours ago"),
            (86_399, "in 23 hours"),
            (86_400, "in 1 day"),
            (-172_800, "2 days ago"),
            (2_591_999, "in 29 days"),
            (2_592_000, "in 1 month"),
            (-5_184_000, "2 months ago"),
            (31_535_999, "in 12 months"),
            (31_536_000, "in 1 year"),
            (-63_072_000, "2 years ago"),
            (200_000_000_000, "in 6341 years"),
            (-200_000_000_000, "6341 years ago"),
        ];
        for (secs, words) in cases {
            let ts = Timestamp::from_second(now.as_second() + secs).expect("in range");
            assert_eq!(distance(ts, now), words, "{secs}");
        }
    }

    #[test]
    fn times_are_shown_the_same_as_strftime_shows_them_in_every_zone() {
        // Instants around every transition a zone has had or will have, and plain ones, in
        // every zone the database knows: the field-by-field path and `strftime` agree.
        let now = Timestamp::from_second(1_790_000_000).expect("now");
        let mut instants: Vec<Timestamp> = [
            -62_135_596_800, // 0001-01-01
            -2_208_988_800,  // 1900-01-01
            0,
            951_782_400, // 2000-02-29
            1_774_746_000,
            1_792_890_000,
            253_402_207_200, // the last second jiff shows
        ]
        .iter()
        .map(|s| Timestamp::from_second(*s).expect("instant"))
        .collect();
        instants.push(Timestamp::MIN);
        instants.push(Timestamp::MAX);
        let mut checked = 0;
        for name in jiff::tz::db().available() {
            let name = name.as_str().to_owned();
            let tz = TimeZone::get(&name).expect("zone");
            let mut times = instants.clone();
            let mut at = Timestamp::from_second(-2_208_988_800).expect("1900");
            for _ in 0..400 {
                let Some(t) = tz.following(at).next() else { break };
                let ts = t.timestamp();
                for delta in [-1, 0, 1, 1800] {
                    if let Ok(x) = ts.checked_add(jiff::SignedDuration::from_secs(delta)) {
                        times.push(x);
                    }
                }
                at = ts;
                if ts.as_second() > 2_200_000_000 {
                    break;
                }
            }
            for ts in times {
                assert_eq!(
                    present(ts, &tz, &name, now),
                    present_strftime(ts, &tz, &name, now),
                    "{name} at {ts}"
                );
                checked += 1;
            }
        }
        assert!(checked > 100_000, "only {checked} instants were compared");
    }

    #[test]
    fn a_time_in_the_spring_gap_is_rejected_with_options() {
        let err = parse_instant("start", "2026-03-29 02:30", Some("Europe/Berlin")).unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
        let opts = options(err);
        assert_eq!(opts.len(), 2);
        assert!(opts.iter().all(|o| o.starts_with("2026-03-29T")), "{opts:?}");
    }

    #[test]
    fn a_time_in_the_autumn_fold_returns_both_offsets() {
        let err = parse_instant("start", "2026-10-25 02:30", Some("Europe/Berlin")).unwrap_err();
        assert!(err.to_string().contains("happens twice"), "{err}");
        assert_eq!(
            options(err),
            vec!["2026-10-25T02:30:00+02:00".to_owned(), "2026-10-25T02:30:00+01:00".to_owned()]
        );
    }

    #[test]
    fn an_offset_is_read_whatever_the_case_of_the_separator_or_refused() {
        let upper =
            parse_instant("start", "2027-01-05T10:00-05:00", Some("Europe/Berlin")).unwrap();
        assert_eq!(upper.to_string(), "2027-01-05T15:00:00Z");
        for same in ["2027-01-05t10:00-05:00", "2027-01-05 10:00-05:00", "2027-01-05t15:00z"] {
            let ts = parse_instant("start", same, Some("Europe/Berlin")).unwrap();
            assert_eq!(ts, upper, "{same}");
            assert_eq!(parse_instant("start", same, None).unwrap(), upper, "{same}");
        }
        // With the zone it was written in (RFC 9557), when offset and zone agree.
        let annotated =
            parse_instant("start", "2027-01-05T16:00+01:00[Europe/Berlin]", None).unwrap();
        assert_eq!(annotated, upper);
        for refused in [
            "2027-01-05T10:00+25:00",
            "2027-01-05T10:00+14:30",
            "2027-01-05T10:00+05:00[Asia/Tokyo]",
            "2027-01-05T10:00[Europe/Berlin]",
            "2026-03-29T02:30[Europe/Berlin]",
            "2027-01-05T10:00+01:00[Not/AZone]",
        ] {
            let err = parse_instant("start", refused, Some("Europe/Berlin")).unwrap_err();
            assert!(matches!(err, Error::Invalid { .. }), "{refused}: {err:?}");
        }
        assert!(parse_instant("start", "2027-01-05T10:00+14:00", None).is_ok());
    }

    #[test]
    fn times_at_the_edges_of_the_calendar_are_the_caller_s_to_correct() {
        for (input, zone) in [
            ("9999-12-31", Some("UTC")),
            ("-009999-01-01", Some("UTC")),
            ("0000-06-01", Some("Pacific/Kiritimati")),
            ("9999-12-31T23:00", Some("Pacific/Kiritimati")),
            ("-009999-01-01T00:00Z", None),
        ] {
            for end in [false, true] {
                let err = parse_range_bound("to", input, zone, end).unwrap_err();
                assert!(matches!(err, Error::Invalid { .. }), "{input} {zone:?}: {err:?}");
            }
        }
        assert!(parse_range_bound("to", "9998-12-31", Some("UTC"), true).is_ok());
    }

    #[test]
    fn bare_local_times_are_refused() {
        let err = parse_instant("start", "2026-05-01T10:00", None).unwrap_err();
        assert!(err.to_string().contains("no offset and no zone"), "{err}");
    }

    #[test]
    fn offsets_and_zones_resolve_to_the_same_instant() {
        let a = parse_instant("start", "2026-05-01T10:00:00+02:00", None).unwrap();
        let b = parse_instant("start", "2026-05-01T10:00", Some("Europe/Berlin")).unwrap();
        assert_eq!(a, b);
        assert!(parse_instant("start", "2026-05-01T10:00", Some("Mars/Olympus")).is_err());
    }

    #[test]
    fn presented_times_carry_weekday_zone_utc_and_distance() {
        let tz = zone("zone", "Europe/Berlin").unwrap();
        let ts: Timestamp = "2026-03-29T01:30:00Z".parse().unwrap();
        let now: Timestamp = "2026-03-26T01:30:00Z".parse().unwrap();
        let view = present(ts, &tz, "Europe/Berlin", now);
        assert_eq!(view.weekday, "Sunday");
        assert_eq!(view.local, "2026-03-29T03:30:00+02:00");
        assert_eq!(view.utc, "2026-03-29T01:30:00Z");
        assert_eq!(view.from_now, "in 3 days");
        assert!(view.display.contains("CEST"), "{}", view.display);
    }

    #[test]
    fn a_day_bound_covers_the_whole_local_day() {
        let from = parse_range_bound("from", "2026-10-25", Some("Europe/Berlin"), false).unwrap();
        let to = parse_range_bound("to", "2026-10-25", Some("Europe/Berlin"), true).unwrap();
        // The fall-back day is 25 hours long.
        assert_eq!(to.as_second() - from.as_second(), 25 * 3600);
    }
}
