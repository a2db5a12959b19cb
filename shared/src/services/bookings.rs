//! Bookings: the date-range search and single bookings (reads), drafts and internal fields
//! (silent writes on the silent-write rail, R8–R10), and the two-step operations that reach
//! customers — confirm, reschedule, cancel (R11 batches) — or delete (R7, on the two-step rail).

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::auth::{AheadRows, ReadAhead};
use crate::ctx::OpCtx;
use crate::datastore::{
    self as db, BookingChange, BookingFilter, BookingRow, NewBooking, Services, Tx, from_ts, to_ts,
};
use crate::error::{Error, Resource, Result};
use crate::handle::{BookingHandle, CustomerHandle, NoteHandle, ServiceHandle, TechnicianHandle};
use crate::input::lenient_u32;
use crate::rights::Right;
use crate::services::fields::separate_reason;
use crate::services::presented;
use crate::services::rails::{self, Written, Wrote};
use crate::services::two_step::{
    Apply, At, Lines, Message, Plan, Planned, TwoStep, booking, booking_line, content_hash,
    customer_email, effect, text as written_text, when,
};
use crate::services::{Found, decode_cursor, encode_cursor, limit, nonempty};
use crate::{money, time, views};

mod changes;
mod export;
mod writes;
pub use changes::*;
pub use export::*;
pub use writes::*;

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
    /// `earlier_notes_cursor` of a previous result: the next page of earlier notes.
    #[serde(default)]
    pub notes_cursor: Option<String>,
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
    let filter = search(input)?;
    let page = filter.limit - 1;
    let mut items = match crate::auth::take_read_ahead(ctx, &ReadAhead::Bookings(filter.clone())) {
        Some(AheadRows::Bookings(rows)) => rows,
        _ => ds.booking_find(ctx, &filter).await?,
    };
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
    let (handle, before) = get_key(input)?;
    let key =
        ReadAhead::Booking { handle: handle.as_str().to_owned(), notes_before: before.clone() };
    let row = match crate::auth::take_read_ahead(ctx, &key) {
        Some(AheadRows::Booking(row)) => *row,
        _ => ds.booking_get(ctx, &handle, before).await?,
    };
    row.ok_or_else(|| Error::not_found(Resource::Booking, handle.as_str()))
}

/// The search a `find_bookings` input runs: its filter, the limit one more than the page (the
/// extra row tells whether another page follows).
fn search(input: &FindBookingsInput) -> Result<BookingFilter> {
    let mut filter = filter(input)?;
    filter.limit += 1;
    Ok(filter)
}

/// What a `find_bookings` call will read, when its input parses: the worker reads the page in
/// the statement that reads the call's context. `None` for an input [`find`] would refuse.
///
/// Only a search the tenant's start-time index answers by walking to the page (a range and a
/// cursor) travels with the context: one filtered by status, technician or customer may walk a
/// large tenant's whole index, and the pipe's connection is shared by every request's context
/// lookup, so such a search reads on the pool, where it holds up nobody else.
pub fn find_read_ahead(input: &FindBookingsInput) -> Option<ReadAhead> {
    let filter = search(input).ok()?;
    let bounded =
        filter.statuses.is_empty() && filter.technician.is_none() && filter.customer.is_none();
    bounded.then_some(ReadAhead::Bookings(filter))
}

/// What a `get_booking` call will read, when its input says it clearly: the worker reads it
/// in the statement that reads the call's context ([`crate::auth::ReadAhead`]). `None` for an
/// input [`get`] would refuse, which then answers as always.
pub fn read_ahead(input: &GetBookingInput) -> Option<ReadAhead> {
    let (handle, before) = get_key(input).ok()?;
    Some(ReadAhead::Booking { handle: handle.as_str().to_owned(), notes_before: before })
}

/// The booking and notes cursor a `get_booking` input names: one parse for the read and its
/// read-ahead, so both name the same row.
fn get_key(
    input: &GetBookingInput,
) -> Result<(BookingHandle, Option<crate::datastore::NotesBefore>)> {
    let handle = BookingHandle::parse("booking", &input.booking)?;
    let before = match nonempty(&input.notes_cursor) {
        Some(c) => {
            let parts = super::decode_cursor(c, 2).map_err(|_| {
                Error::invalid(
                    "notes_cursor",
                    "not a notes cursor from a previous result; call get_booking without it",
                )
            })?;
            let malformed = || Error::invalid("notes_cursor", "malformed notes cursor");
            let micros: i64 = parts[0].parse().map_err(|_| malformed())?;
            // Year 1 or later (Postgres refuses some earlier instants jiff accepts), and a
            // note handle as we write them: the cursor is bound into a statement, and a value
            // Postgres refuses must be the caller's error, not the database's.
            const YEAR_ONE_MICROS: i64 = -62_135_596_800_000_000;
            if micros < YEAR_ONE_MICROS {
                return Err(malformed());
            }
            let at = jiff::Timestamp::from_microsecond(micros).map_err(|_| malformed())?;
            let note = &parts[1];
            if note.is_empty() || note.len() > 64 || !note.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(malformed());
            }
            Some((crate::datastore::from_ts(at), note.clone()))
        }
        None => None,
    };
    Ok((handle, before))
}

#[cfg(test)]
mod read_ahead_tests;
