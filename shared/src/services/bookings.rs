//! Reading bookings: the date-range search and single bookings with their notes.

use schemars::JsonSchema;
use serde::Deserialize;

use crate::ctx::OpCtx;
use crate::datastore::{BookingFilter, BookingRow, Datastore, to_ts};
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
    let status = match nonempty(&input.status) {
        Some(s) if STATUSES.contains(&s) => Some(s.to_owned()),
        Some(s) => {
            return Err(Error::invalid_with_options(
                "status",
                format!("{s:?} is not a booking status"),
                STATUSES.iter().map(|s| (*s).to_owned()).collect(),
            ));
        }
        None => None,
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
    Ok(BookingFilter { from, to, status, technician, customer, after, limit: limit(input.limit)? })
}

pub async fn find(
    ds: &Datastore,
    ctx: &OpCtx,
    input: &FindBookingsInput,
) -> Result<Found<BookingRow>> {
    ctx.require(Right::BookingsRead)?;
    let mut filter = filter(input)?;
    let page = filter.limit;
    filter.limit += 1;
    let mut items = ds.booking_find(ctx, &filter).await?;
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

pub async fn get(ds: &Datastore, ctx: &OpCtx, input: &GetBookingInput) -> Result<BookingRow> {
    ctx.require(Right::BookingsRead)?;
    let handle = BookingHandle::parse("booking", &input.booking)?;
    ds.booking_get(ctx, &handle)
        .await?
        .ok_or_else(|| Error::not_found(Resource::Booking, handle.as_str()))
}
