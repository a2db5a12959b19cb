//! Reading bookings: the date-range search and single bookings with their notes.

use schemars::JsonSchema;
use serde::Deserialize;

use crate::ctx::OpCtx;
use crate::datastore::{BookingFilter, BookingRow, Services, to_ts};
use crate::error::{Error, Resource, Result};
use crate::handle::{BookingHandle, CustomerHandle, TechnicianHandle};
use crate::input::lenient_u32;
use crate::rights::Right;
use crate::services::{Found, decode_cursor, encode_cursor, limit, nonempty};
use crate::time;

pub const STATUSES: &[&str] = &["draft", "confirmed", "cancelled", "completed"];

/// Find bookings in a time range, optionally by status, technician or customer.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindBookingsInput {
    /// Start of the range, inclusive: a date (2026-03-29) or local date-time (2026-03-29T08:00)
    /// read in `zone`, or ISO 8601 with offset.
    #[serde(default)]
    pub from: Option<String>,
    /// End of the range: a date includes that whole day; a time is exclusive.
    #[serde(default)]
    pub to: Option<String>,
    /// IANA time zone for dates and local times in `from`/`to`, e.g. Europe/Berlin.
    #[serde(default)]
    pub zone: Option<String>,
    /// draft, confirmed, cancelled or completed.
    #[serde(default)]
    pub status: Option<String>,
    /// Only bookings of this technician (tec_…).
    #[serde(default)]
    pub technician: Option<String>,
    /// Only bookings of this customer (cus_…).
    #[serde(default)]
    pub customer: Option<String>,
    /// Page size, 1 to 100 (default 25).
    #[serde(default, deserialize_with = "lenient_u32")]
    #[schemars(with = "Option<u32>")]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// One booking by handle, with its notes.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetBookingInput {
    /// Booking handle (bkg_…), from find_bookings.
    pub booking: String,
}

pub(crate) fn filter(input: &FindBookingsInput) -> Result<BookingFilter> {
    let zone = nonempty(&input.zone);
    let from = nonempty(&input.from)
        .map(|f| time::parse_range_bound("from", f, zone, false))
        .transpose()?;
    let to =
        nonempty(&input.to).map(|t| time::parse_range_bound("to", t, zone, true)).transpose()?;
    if let (Some(from), Some(to)) = (from, to)
        && to <= from
    {
        return Err(Error::invalid("to", "`to` must be after `from`"));
    }
    let statuses = match nonempty(&input.status) {
        Some(s) if STATUSES.contains(&s) => vec![s.to_owned()],
        Some(s) => {
            return Err(Error::invalid_with_options(
                "status",
                format!("{s:?} is not a booking status"),
                STATUSES.iter().map(|s| (*s).to_owned()).collect(),
            ));
        }
        None => Vec::new(),
    };
    let technician = nonempty(&input.technician)
        .map(|t| TechnicianHandle::parse("technician", t))
        .transpose()?
        .map(|h| h.to_string());
    let customer = nonempty(&input.customer)
        .map(|c| CustomerHandle::parse("customer", c))
        .transpose()?
        .map(|h| h.to_string());
    let after = match nonempty(&input.cursor) {
        Some(c) => {
            let parts = decode_cursor(c, 2)?;
            let micros: i64 =
                parts[0].parse().map_err(|_| Error::invalid("cursor", "malformed cursor"))?;
            let at = jiff::Timestamp::from_microsecond(micros)
                .map_err(|_| Error::invalid("cursor", "malformed cursor"))?;
            Some((at, parts[1].clone()))
        }
        None => None,
    };
    Ok(BookingFilter {
        from,
        to,
        statuses,
        technician,
        customer,
        after,
        limit: limit(input.limit)?,
    })
}

pub async fn find(
    ds: &Services,
    ctx: &OpCtx,
    input: &FindBookingsInput,
) -> Result<Found<BookingRow>> {
    ctx.require(Right::BookingsRead)?;
    let mut filter = filter(input)?;
    let page = filter.limit;
    filter.limit += 1;
    let mut items = ds.booking_find(ctx, &filter).await?;
    if items.is_empty() {
        // Only an empty page pays for telling a foreign handle from a quiet one.
        crate::datastore::booking_filter_refs(ds.pool(), ctx, &filter).await?;
    }
    let next_cursor = if items.len() as i64 > page {
        items.truncate(page as usize);
        items
            .last()
            .map(|b| encode_cursor(&[&to_ts(b.starts_at).as_microsecond().to_string(), &b.handle]))
    } else {
        None
    };
    Ok(Found { items, next_cursor })
}

pub async fn get(ds: &Services, ctx: &OpCtx, input: &GetBookingInput) -> Result<BookingRow> {
    ctx.require(Right::BookingsRead)?;
    let handle = BookingHandle::parse("booking", &input.booking)?;
    ds.booking_get(ctx, &handle)
        .await?
        .ok_or_else(|| Error::not_found(Resource::Booking, handle.as_str()))
}

// ---------------------------------------------------------------- export (a long read, R22)

/// Summarize every booking in a time range (possibly thousands), page by page.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportBookingsInput {
    /// Start of the range, inclusive (as in find_bookings).
    pub from: String,
    /// End of the range (as in find_bookings).
    pub to: String,
    /// IANA zone for dates and local times.
    #[serde(default)]
    pub zone: Option<String>,
    /// Only this status.
    #[serde(default)]
    pub status: Option<String>,
}

#[derive(Debug, serde::Serialize, JsonSchema)]
pub struct StatusCount {
    pub status: String,
    pub count: i64,
}

#[derive(Debug, serde::Serialize, JsonSchema)]
pub struct ExportSummary {
    pub from: crate::time::TimeView,
    pub to: crate::time::TimeView,
    pub count: i64,
    pub by_status: Vec<StatusCount>,
    /// Sum of booking totals per currency.
    pub totals: Vec<crate::money::MoneyView>,
    /// The first bookings of the range; page through the rest with find_bookings.
    pub first: Vec<String>,
    /// Arguments for find_bookings that continue after `first`.
    pub continue_with: Option<serde_json::Value>,
}

/// An export in progress: one page of 200 bookings per step.
pub struct Export {
    find: FindBookingsInput,
    from: jiff::Timestamp,
    to: jiff::Timestamp,
    zone: String,
    pub total: i64,
    pub seen: i64,
    by_status: std::collections::BTreeMap<String, i64>,
    totals: std::collections::BTreeMap<String, i64>,
    first: Vec<String>,
    after_first: Option<String>,
    done: bool,
}

const EXPORT_PAGE: u32 = 100;

pub async fn export_start(
    ds: &Services,
    ctx: &OpCtx,
    input: &ExportBookingsInput,
) -> Result<Export> {
    ctx.require(Right::BookingsRead)?;
    let zone = nonempty(&input.zone).unwrap_or(&ctx.tenant().zone_name).to_owned();
    let find = FindBookingsInput {
        from: Some(input.from.clone()),
        to: Some(input.to.clone()),
        zone: Some(zone.clone()),
        status: input.status.clone(),
        limit: Some(EXPORT_PAGE),
        ..Default::default()
    };
    let mut f = filter(&find)?;
    let (Some(from), Some(to)) = (f.from, f.to) else {
        return Err(Error::invalid("from", "an export needs both `from` and `to`"));
    };
    f.limit = i64::MAX;
    crate::datastore::booking_filter_refs(ds.pool(), ctx, &f).await?;
    let total = ds.booking_count(ctx, &f).await?;
    Ok(Export {
        find,
        from,
        to,
        zone,
        total,
        seen: 0,
        by_status: Default::default(),
        totals: Default::default(),
        first: Vec::new(),
        after_first: None,
        done: false,
    })
}

impl Export {
    /// Reads the next page; false when the range is exhausted.
    pub async fn step(&mut self, ds: &Services, ctx: &OpCtx) -> Result<bool> {
        if self.done {
            return Ok(false);
        }
        let page = find(ds, ctx, &self.find).await?;
        for b in &page.items {
            self.seen += 1;
            *self.by_status.entry(b.status.clone()).or_default() += 1;
            *self.totals.entry(b.currency.clone()).or_default() += b.total_minor;
            if self.first.len() < 20 {
                self.first.push(b.handle.clone());
                if self.first.len() == 20 {
                    self.after_first = Some(encode_cursor(&[
                        &to_ts(b.starts_at).as_microsecond().to_string(),
                        &b.handle,
                    ]));
                }
            }
        }
        self.find.cursor = page.next_cursor.clone();
        self.done = page.next_cursor.is_none();
        Ok(!self.done)
    }

    pub fn finish(self, ctx: &OpCtx, now: jiff::Timestamp) -> ExportSummary {
        let tz = time::zone("zone", &self.zone).unwrap_or(ctx.tenant().zone.clone());
        let continue_with = self.after_first.filter(|_| self.seen > 20).map(|cursor| {
            serde_json::json!({"from": self.find.from, "to": self.find.to, "zone": self.zone, "status": self.find.status, "cursor": cursor})
        });
        ExportSummary {
            from: time::present(self.from, &tz, &self.zone, now),
            to: time::present(self.to, &tz, &self.zone, now),
            count: self.seen,
            by_status: self
                .by_status
                .into_iter()
                .map(|(status, count)| StatusCount { status, count })
                .collect(),
            totals: self
                .totals
                .into_iter()
                .map(|(c, minor)| crate::money::present(minor, &c))
                .collect(),
            first: self.first,
            continue_with,
        }
    }
}
