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
        Some(AheadRows::Booking(row)) => row,
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
pub fn find_read_ahead(input: &FindBookingsInput) -> Option<ReadAhead> {
    search(input).ok().map(ReadAhead::Bookings)
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
    #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
    pub continue_with: Option<ContinueWith>,
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
        let continue_with =
            self.after_first.filter(|_| self.seen > 20).map(|cursor| ContinueWith {
                from: self.find.from,
                to: self.find.to,
                zone: self.zone.clone(),
                status: self.find.status,
                cursor,
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

// ------------------------------------------------------------------ writes (silent, R8–R10)

/// Create a draft booking; the customer does not see drafts until they are confirmed.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBookingInput {
    /// Customer handle (cus_…).
    pub customer: String,
    /// Service handle (svc_…), from find_services.
    pub service: String,
    /// Start: local date-time with `zone`, or ISO 8601 with offset.
    pub start: String,
    /// IANA zone of a local `start`, e.g. Europe/Berlin.
    #[serde(default)]
    pub zone: Option<String>,
    /// Technician handle (tec_…), optional.
    #[serde(default)]
    pub technician: Option<String>,
    /// Create even if this customer has a booking for this service at this start (needs `reason`).
    #[serde(default)]
    pub separate: bool,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// Change a booking's internal fields. The start, service and technician of a draft can change
/// here; a confirmed booking's time is changed with reschedule_booking.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateBookingInput {
    /// Booking handle (bkg_…).
    pub booking: String,
    /// The `version` you read.
    pub version: String,
    /// low, normal or high.
    #[serde(default)]
    pub priority: Option<String>,
    /// Internal reference; an empty string removes it.
    #[serde(default)]
    pub reference: Option<String>,
    /// Technician handle (tec_…); an empty string unassigns.
    #[serde(default)]
    pub technician: Option<String>,
    /// Drafts only: service handle (svc_…).
    #[serde(default)]
    pub service: Option<String>,
    /// Drafts only: new start, local with `zone` or ISO 8601 with offset.
    #[serde(default)]
    pub start: Option<String>,
    #[serde(default)]
    pub zone: Option<String>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// Add an internal staff note to a booking.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddBookingNoteInput {
    /// Booking handle (bkg_…).
    pub booking: String,
    /// The note, up to 2000 characters.
    pub text: String,
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

pub const PRIORITIES: &[&str] = &["low", "normal", "high"];

async fn technician_id(tx: &mut Tx<'static>, ctx: &OpCtx, raw: &str) -> Result<i64> {
    let h = TechnicianHandle::parse("technician", raw)?;
    let t = db::technician_lock(tx, ctx, h.as_str())
        .await?
        .ok_or_else(|| Error::not_found(Resource::Technician, h.as_str()))?;
    if !t.active {
        return Err(Error::invalid(
            "technician",
            format!("{} no longer takes bookings; pick another with find_technicians", t.name),
        ));
    }
    Ok(t.id)
}

async fn service(tx: &mut Tx<'static>, ctx: &OpCtx, raw: &str) -> Result<db::ServiceRow> {
    let h = ServiceHandle::parse("service", raw)?;
    db::service_get(tx, ctx, h.as_str())
        .await?
        .ok_or_else(|| Error::not_found(Resource::Service, h.as_str()))
}

async fn locked_booking(tx: &mut Tx<'static>, ctx: &OpCtx, raw: &str) -> Result<db::BookingRow> {
    let h = BookingHandle::parse("booking", raw)?;
    db::booking_lock(tx, ctx, h.as_str())
        .await?
        .ok_or_else(|| Error::not_found(Resource::Booking, h.as_str()))
}

/// Re-reads a booking with its notes for the result.
async fn present_booking(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    handle: &str,
    now: Timestamp,
) -> Result<BookingWritten> {
    let row = db::booking_lock(tx, ctx, handle)
        .await?
        .ok_or_else(|| Error::not_found(Resource::Booking, handle))?;
    Ok(BookingWritten { booking: views::booking(&row, false, now) })
}

pub async fn create_booking(
    ds: &Services,
    ctx: &OpCtx,
    input: &CreateBookingInput,
    now: Timestamp,
) -> Result<Written<BookingWritten>> {
    ctx.require(Right::BookingsWrite)?;
    let customer = CustomerHandle::parse("customer", &input.customer)?;
    let zone_name = input.zone.as_deref().map(str::trim).filter(|z| !z.is_empty());
    let start = time::parse_instant("start", &input.start, zone_name)?;
    if start <= now {
        return Err(Error::invalid(
            "start",
            "the start is in the past; bookings are made for the future",
        ));
    }
    let zone = zone_name.unwrap_or(&ctx.tenant().zone_name).to_owned();
    time::zone("zone", &zone)?;
    let reason = separate_reason(input.separate, input.reason.as_deref())?;
    rails::silent_write(
        ds,
        ctx,
        "create_booking",
        input,
        input.idempotency_key.as_deref(),
        |mut tx| async move {
            let written: Result<Wrote<BookingWritten>> = async {
                let tx = &mut tx;
                let customer = db::customer_lock(tx, ctx, customer.as_str())
                    .await?
                    .ok_or_else(|| Error::not_found(Resource::Customer, customer.as_str()))?;
                let service = service(tx, ctx, &input.service).await?;
                let technician =
                    match input.technician.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
                        Some(t) => Some(technician_id(tx, ctx, t).await?),
                        None => None,
                    };
                if reason.is_none()
                    && let Some(existing) =
                        db::booking_by_key(tx, ctx, customer.id, service.id, from_ts(start)).await?
                {
                    return Err(Error::Duplicate {
                        resource: Resource::Booking,
                        existing,
                        key: "customer, service and start".into(),
                    });
                }
                let handle = BookingHandle::generate();
                let id = db::booking_insert(
                    tx,
                    ctx,
                    NewBooking {
                        handle: handle.as_str(),
                        customer_id: customer.id,
                        technician_id: technician,
                        service_id: service.id,
                        starts_at: from_ts(start),
                        zone: &zone,
                        status: "draft",
                        currency: &ctx.tenant().currency,
                        net_minor: service.price_minor,
                        tax_minor: money::tax(service.price_minor, service.tax_rate_bp),
                        customer_note: None,
                    },
                )
                .await?;
                if let Some(r) = &reason {
                    db::booking_set_separate_reason(tx, ctx, id, r).await?;
                }
                Ok((
                    present_booking(tx, ctx, handle.as_str(), now).await?,
                    vec![handle.to_string()],
                ))
            }
            .await;
            (tx, written)
        },
    )
    .await
}

pub async fn update_booking(
    ds: &Services,
    ctx: &OpCtx,
    input: &UpdateBookingInput,
    now: Timestamp,
) -> Result<Written<BookingWritten>> {
    ctx.require(Right::BookingsWrite)?;
    let priority = match input.priority.as_deref().map(str::trim) {
        Some(p) if PRIORITIES.contains(&p) => Some(p.to_owned()),
        Some(p) => {
            return Err(Error::invalid_with_options(
                "priority",
                format!("{p:?} is not a priority"),
                PRIORITIES.iter().map(|p| (*p).to_owned()).collect(),
            ));
        }
        None => None,
    };
    if let Some(r) = &input.reference
        && (r.chars().count() > 80 || r.chars().any(char::is_control))
    {
        return Err(Error::invalid(
            "reference",
            "use at most 80 characters without control characters",
        ));
    }
    let zone_name = input.zone.as_deref().map(str::trim).filter(|z| !z.is_empty());
    let start =
        input.start.as_deref().map(|s| time::parse_instant("start", s, zone_name)).transpose()?;
    if start.is_some_and(|s| s <= now) {
        return Err(Error::invalid(
            "start",
            "the start is in the past; bookings are made for the future",
        ));
    }
    rails::silent_write(
        ds,
        ctx,
        "update_booking",
        input,
        input.idempotency_key.as_deref(),
        |mut tx| async move {
            let written: Result<Wrote<BookingWritten>> = async {
                let tx = &mut tx;
                let row = locked_booking(tx, ctx, &input.booking).await?;
                let current = views::booking_version(&row);
                if current != input.version.trim() {
                    return Err(Error::Conflict {
                        resource: Resource::Booking,
                        handle: row.handle.clone(),
                        expected: input.version.clone(),
                        current_version: current,
                        current: Box::new(presented(&views::booking(&row, false, now))?),
                    });
                }
                if row.status != "draft" && (input.start.is_some() || input.service.is_some()) {
                    return Err(Error::WrongState {
                        message: format!(
                            "booking {} is {}; its start and service are what the customer sees",
                            row.handle, row.status
                        ),
                        use_instead: Some("reschedule_booking"),
                    });
                }
                if row.status == "cancelled" || row.status == "completed" {
                    return Err(Error::WrongState {
                        message: format!(
                            "booking {} is {} and can no longer change",
                            row.handle, row.status
                        ),
                        use_instead: None,
                    });
                }
                let service = match input.service.as_deref() {
                    Some(s) => service(tx, ctx, s).await?,
                    None => db::ServiceRow {
                        id: row.service_id,
                        handle: row.service_handle.clone(),
                        name: row.service_name.clone(),
                        duration_minutes: row.duration_minutes,
                        price_minor: row.net_minor,
                        tax_rate_bp: row.tax_rate_bp,
                    },
                };
                let technician = match input.technician.as_deref().map(str::trim) {
                    Some("") => None,
                    Some(t) => Some(technician_id(tx, ctx, t).await?),
                    None => row.technician_id,
                };
                let reference = match input.reference.as_deref().map(str::trim) {
                    Some("") => None,
                    Some(r) => Some(r.to_owned()),
                    None => row.reference.clone(),
                };
                db::booking_update(
                    tx,
                    ctx,
                    row.id,
                    BookingChange {
                        technician_id: technician,
                        service_id: service.id,
                        starts_at: start.map(from_ts).unwrap_or(row.starts_at),
                        net_minor: service.price_minor,
                        tax_minor: money::tax(service.price_minor, service.tax_rate_bp),
                        priority: priority.as_deref().unwrap_or(&row.priority),
                        reference: reference.as_deref(),
                        status: &row.status,
                    },
                )
                .await?;
                Ok((present_booking(tx, ctx, &row.handle, now).await?, vec![row.handle.clone()]))
            }
            .await;
            (tx, written)
        },
    )
    .await
}

/// Who a note's text comes from, as readers are shown it: an agent's (MCP) may relay what a
/// third party planted in what it read, an integration's (REST) is another system's; both are
/// wrapped as untrusted text. A person at the console writes staff notes.
fn note_source(ctx: &OpCtx) -> &'static str {
    match ctx.channel() {
        crate::ctx::Channel::Mcp => "agent",
        crate::ctx::Channel::Api => "external",
        crate::ctx::Channel::Console | crate::ctx::Channel::Cli | crate::ctx::Channel::System => {
            "staff"
        }
    }
}

pub async fn add_booking_note(
    ds: &Services,
    ctx: &OpCtx,
    input: &AddBookingNoteInput,
    now: Timestamp,
) -> Result<Written<NoteWritten>> {
    ctx.require(Right::BookingsWrite)?;
    let text = &written_text("text", &input.text, 2000, Lines::Many)?;
    rails::silent_write(
        ds,
        ctx,
        "add_booking_note",
        input,
        input.idempotency_key.as_deref(),
        |mut tx| async move {
            let written: Result<Wrote<NoteWritten>> = async {
                let tx = &mut tx;
                // Held against deletion only: notes on one booking are written side by side.
                let h = BookingHandle::parse("booking", &input.booking)?;
                let (id, booking) = db::booking_hold(tx, ctx, h.as_str())
                    .await?
                    .ok_or_else(|| Error::not_found(Resource::Booking, h.as_str()))?;
                let note = NoteHandle::generate();
                db::booking_note_insert(tx, ctx, note.as_str(), id, note_source(ctx), text).await?;
                let written = time::present(now, &ctx.tenant().zone, &ctx.tenant().zone_name, now);
                let targets = vec![booking.clone(), note.to_string()];
                Ok((NoteWritten { note: note.to_string(), booking, written }, targets))
            }
            .await;
            (tx, written)
        },
    )
    .await
}

// ------------------------------------------------------------------ two-step operations (R7)

/// Confirm a draft booking; the customer is emailed the confirmation.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfirmBookingInput {
    /// Booking handle (bkg_…) of a draft.
    pub booking: String,
}

impl crate::services::two_step::private::Sealed for ConfirmBookingInput {}

impl TwoStep for ConfirmBookingInput {
    const OP: crate::services::two_step::Op = crate::services::two_step::Op::ConfirmBooking;
}

impl Planned for ConfirmBookingInput {
    async fn plan(self, tx: &mut Tx<'static>, ctx: &OpCtx, at: At) -> Result<Plan> {
        let (input, now) = (self, at.now);
        let b = booking(tx, ctx, &input.booking).await?;
        if b.status != "draft" {
            return Err(Error::WrongState {
                message: format!("booking {} is {}, not a draft", b.handle, b.status),
                use_instead: None,
            });
        }
        if to_ts(b.starts_at) <= now {
            return Err(Error::WrongState {
                message: format!(
                    "booking {} starts in the past; move it to a future time before confirming it",
                    b.handle
                ),
                use_instead: Some("update_booking"),
            });
        }
        let to = customer_email(&b)?;
        let at = when(&b, now);
        let msg = Message {
            channel: "email",
            recipient: to.clone(),
            subject: format!("Your booking on {} is confirmed", at.display),
            body: format!(
                "Hello {}, your {} on {} is confirmed. Total: {}.",
                b.customer_name,
                b.service_name,
                at.display,
                crate::money::present(b.total_minor, &b.currency).display
            ),
        };
        Ok(Plan {
            summary: format!(
                "Confirm booking {} and email the confirmation to {} (customer {})",
                booking_line(&b, now),
                crate::services::fields::shown_address(&to),
                crate::text::quoted(&b.customer_name)
            ),
            preview: effect(&ConfirmEffect {
                booking: views::booking(&b, false, now),
                email: EmailEffect { to: &to, subject: &msg.subject, body: &msg.body },
            })?,
            content_hash: content_hash(&BookingMessage {
                booking: &b.handle,
                version: views::booking_version(&b),
                message: &msg,
            })?,
            targets: vec![b.handle.clone()],
            apply: Apply::SetStatus { ids: vec![(b.id, b.handle.clone())], status: "confirmed" },
            messages: vec![msg],
        })
    }
}

/// Move a booking to another start; a confirmed booking's customer is emailed.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RescheduleBookingInput {
    /// Booking handle (bkg_…).
    pub booking: String,
    /// New start: local date-time with `zone`, or ISO 8601 with offset.
    pub start: String,
    /// IANA zone of a local `start`.
    #[serde(default)]
    pub zone: Option<String>,
}

impl crate::services::two_step::private::Sealed for RescheduleBookingInput {}

impl TwoStep for RescheduleBookingInput {
    const OP: crate::services::two_step::Op = crate::services::two_step::Op::RescheduleBooking;
}

impl Planned for RescheduleBookingInput {
    async fn plan(self, tx: &mut Tx<'static>, ctx: &OpCtx, at: At) -> Result<Plan> {
        let (input, now) = (self, at.now);
        let zone = input.zone.as_deref().map(str::trim).filter(|z| !z.is_empty());
        let start = time::parse_instant("start", &input.start, zone)?;
        if start <= now {
            return Err(Error::invalid("start", "the new start is in the past"));
        }
        let b = booking(tx, ctx, &input.booking).await?;
        if b.status != "draft" && b.status != "confirmed" {
            return Err(Error::WrongState {
                message: format!("booking {} is {} and cannot move", b.handle, b.status),
                use_instead: None,
            });
        }
        let tz = jiff::tz::TimeZone::get(&b.zone).unwrap_or(jiff::tz::TimeZone::UTC);
        let new_at = time::present(start, &tz, &b.zone, now);
        let new_end = time::present(
            start
                .checked_add(jiff::SignedDuration::from_mins(i64::from(b.duration_minutes)))
                .unwrap_or(start),
            &tz,
            &b.zone,
            now,
        );
        let messages = if b.status == "confirmed" {
            let to = customer_email(&b)?;
            vec![Message {
                channel: "email",
                recipient: to,
                subject: format!("Your booking moved to {}", new_at.display),
                body: format!(
                    "Hello {}, your {} moved from {} to {}.",
                    b.customer_name,
                    b.service_name,
                    when(&b, now).display,
                    new_at.display
                ),
            }]
        } else {
            Vec::new()
        };
        let who = if messages.is_empty() {
            "no message (draft)".to_owned()
        } else {
            format!("email {}", b.customer_name)
        };
        Ok(Plan {
            summary: format!("Move booking {} to {}; {who}", booking_line(&b, now), new_at.display),
            preview: effect(&RescheduleEffect {
                booking: &b.handle,
                from: when(&b, now),
                to: &new_at,
                ends: new_end,
                emails: messages.len(),
                messages: &messages,
            })?,
            content_hash: content_hash(&RescheduleContent {
                booking: &b.handle,
                version: views::booking_version(&b),
                start: start.to_string(),
                messages: &messages,
            })?,
            targets: vec![b.handle.clone()],
            apply: Apply::Reschedule { id: b.id, handle: b.handle.clone(), starts_at: start },
            messages,
        })
    }
}

/// Cancel bookings: explicit handles, or a filter with the number of bookings you expect it to match.
#[derive(Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBookingsInput {
    /// Booking handles (bkg_…), at most 50. Or leave out and use the filter fields.
    #[serde(default)]
    pub bookings: Option<Vec<String>>,
    /// Filter: start of the range (as in find_bookings).
    #[serde(default)]
    pub from: Option<String>,
    /// Filter: end of the range (as in find_bookings).
    #[serde(default)]
    pub to: Option<String>,
    /// Filter: IANA zone for dates and local times.
    #[serde(default)]
    pub zone: Option<String>,
    /// Filter: technician handle (tec_…).
    #[serde(default)]
    pub technician: Option<String>,
    /// Filter: customer handle (cus_…).
    #[serde(default)]
    pub customer: Option<String>,
    /// Required with a filter: how many bookings you expect it to match. Nothing happens if it differs.
    #[serde(default, deserialize_with = "lenient_u32")]
    #[schemars(with = "Option<u32>")]
    pub expected_count: Option<u32>,
}

/// Explicit handles in one batch.
const MAX_BATCH: usize = 50;
/// Bookings one filter may cancel in one call.
const MAX_FILTER_BATCH: usize = 500;

impl crate::services::two_step::private::Sealed for CancelBookingsInput {}

impl TwoStep for CancelBookingsInput {
    const OP: crate::services::two_step::Op = crate::services::two_step::Op::CancelBookings;
}

impl Planned for CancelBookingsInput {
    async fn plan(self, tx: &mut Tx<'static>, ctx: &OpCtx, at: At) -> Result<Plan> {
        let (input, now) = (self, at.now);
        let has_filter = input.from.is_some()
            || input.to.is_some()
            || input.technician.is_some()
            || input.customer.is_some();
        let rows: Vec<BookingRow> = match (&input.bookings, has_filter) {
            (Some(_), true) => {
                return Err(Error::invalid(
                    "bookings",
                    "give either `bookings` or filter fields, not both",
                ));
            }
            (Some(handles), false) => {
                if handles.is_empty() || handles.len() > MAX_BATCH {
                    return Err(Error::invalid(
                        "bookings",
                        format!("give 1 to {MAX_BATCH} booking handles"),
                    ));
                }
                // A count the caller expects is checked, never ignored: listed handles are
                // counted by listing them.
                if let Some(expected) = input.expected_count
                    && expected as usize != handles.len()
                {
                    return Err(Error::invalid(
                        "expected_count",
                        format!(
                            "{} booking handles are listed but expected_count is {expected}; leave expected_count out when listing handles",
                            handles.len()
                        ),
                    ));
                }
                let mut rows: Vec<BookingRow> = Vec::with_capacity(handles.len());
                for raw in handles {
                    let row = booking(tx, ctx, raw).await?;
                    // A handle listed twice would be cancelled and emailed twice (R11).
                    if rows.iter().any(|r| r.id == row.id) {
                        return Err(Error::invalid(
                            "bookings",
                            format!(
                                "{} is listed more than once; list each booking once",
                                row.handle
                            ),
                        ));
                    }
                    rows.push(row);
                }
                rows
            }
            (None, false) => {
                return Err(Error::invalid(
                    "bookings",
                    "give booking handles, or a filter (from, to, technician, customer) with expected_count",
                ));
            }
            (None, true) => {
                let Some(expected) = input.expected_count else {
                    return Err(Error::invalid(
                        "expected_count",
                        "a filter needs expected_count: how many bookings you expect it to cancel",
                    ));
                };
                let find = FindBookingsInput {
                    from: input.from.clone(),
                    to: input.to.clone(),
                    zone: input.zone.clone(),
                    technician: input.technician.clone(),
                    customer: input.customer.clone(),
                    ..Default::default()
                };
                let mut filter: BookingFilter = crate::services::bookings::filter(&find)?;
                db::booking_filter_refs(&mut **tx, ctx, &filter).await?;
                // Only bookings that can still be cancelled count, and they are counted in SQL
                // before any limit: one more than a batch may hold tells "too many" exactly.
                filter.statuses = vec!["draft".into(), "confirmed".into()];
                filter.limit = MAX_FILTER_BATCH as i64 + 1;
                let matched: Vec<BookingRow> = db::booking_find_locked(tx, ctx, &filter).await?;
                let count = if matched.len() > MAX_FILTER_BATCH {
                    db::booking_count_in(&mut **tx, ctx, &filter).await? as usize
                } else {
                    matched.len()
                };
                if count != expected as usize {
                    return Err(Error::CountMismatch {
                        expected: expected as usize,
                        count,
                        matches: matched
                            .iter()
                            .take(crate::error::MAX_LISTED_MATCHES)
                            .map(|b| b.handle.clone())
                            .collect(),
                    });
                }
                if count == 0 {
                    return Err(Error::invalid(
                        "expected_count",
                        "the filter matches no booking that can be cancelled, so there is nothing to confirm; check it with find_bookings",
                    ));
                }
                if count > MAX_FILTER_BATCH {
                    return Err(Error::invalid(
                        "expected_count",
                        format!(
                            "the filter matches {count} bookings; one call cancels at most {MAX_FILTER_BATCH}: narrow the range"
                        ),
                    ));
                }
                matched
            }
        };
        if let Some(done) = rows.iter().find(|b| b.status != "draft" && b.status != "confirmed") {
            return Err(Error::WrongState {
                message: format!("booking {} is already {}", done.handle, done.status),
                use_instead: None,
            });
        }
        let mut messages = Vec::new();
        for b in rows.iter().filter(|b| b.status == "confirmed") {
            let at = when(b, now);
            messages.push(Message {
                channel: "email",
                recipient: customer_email(b)?,
                subject: format!("Your booking on {} is cancelled", at.display),
                body: format!(
                    "Hello {}, your {} on {} is cancelled.",
                    b.customer_name, b.service_name, at.display
                ),
            });
        }
        let handles: Vec<String> = rows.iter().map(|b| b.handle.clone()).collect();
        let versions: Vec<String> = rows.iter().map(views::booking_version).collect();
        Ok(Plan {
            summary: format!(
                "Cancel {} booking(s) ({}) and email {} customer(s)",
                rows.len(),
                handles.join(", "),
                messages.len()
            ),
            preview: effect(&CancelEffect {
                bookings: rows.iter().map(|b| views::booking(b, false, now)).collect(),
                emails: messages.len(),
                messages: &messages,
            })?,
            content_hash: content_hash(&CancelContent {
                bookings: &handles,
                versions: &versions,
                messages: &messages,
            })?,
            targets: handles,
            apply: Apply::SetStatus {
                ids: rows.iter().map(|b| (b.id, b.handle.clone())).collect(),
                status: "cancelled",
            },
            messages,
        })
    }
}

/// Delete a booking and its notes.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteBookingInput {
    /// Booking handle (bkg_…).
    pub booking: String,
}

impl crate::services::two_step::private::Sealed for DeleteBookingInput {}

impl TwoStep for DeleteBookingInput {
    const OP: crate::services::two_step::Op = crate::services::two_step::Op::DeleteBooking;
}

impl Planned for DeleteBookingInput {
    async fn plan(self, tx: &mut Tx<'static>, ctx: &OpCtx, at: At) -> Result<Plan> {
        let (input, now) = (self, at.now);
        let b = booking(tx, ctx, &input.booking).await?;
        Ok(Plan {
            summary: format!(
                "Delete booking {} of customer {} with its notes",
                booking_line(&b, now),
                crate::text::quoted(&b.customer_name)
            ),
            preview: effect(&BookingEffect { booking: views::booking(&b, false, now) })?,
            content_hash: content_hash(&BookingVersion {
                booking: &b.handle,
                version: views::booking_version(&b),
            })?,
            targets: vec![b.handle.clone()],
            apply: Apply::DeleteBooking { id: b.id },
            messages: Vec::new(),
        })
    }
}

/// The find_bookings arguments that continue an export after its first bookings.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ContinueWith {
    pub from: Option<String>,
    pub to: Option<String>,
    pub zone: String,
    pub status: Option<String>,
    pub cursor: String,
}

/// A booking after a write.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BookingWritten {
    pub booking: views::BookingView,
}

/// A note after it was added.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct NoteWritten {
    /// The note's handle (bnt_…).
    pub note: String,
    pub booking: String,
    pub written: time::TimeView,
}

// ------------------------------------------------------------------ what the two-step plans show and hash

/// A preview that shows one booking.
#[derive(Serialize)]
struct BookingEffect {
    booking: views::BookingView,
}

/// The email a preview shows.
#[derive(Serialize)]
struct EmailEffect<'a> {
    to: &'a str,
    subject: &'a str,
    body: &'a str,
}

/// `confirm_booking`'s preview.
#[derive(Serialize)]
struct ConfirmEffect<'a> {
    booking: views::BookingView,
    email: EmailEffect<'a>,
}

/// A booking at the version planned from, and the message the effect sends.
#[derive(Serialize)]
struct BookingMessage<'a> {
    booking: &'a str,
    version: String,
    message: &'a Message,
}

/// A booking at the version planned from.
#[derive(Serialize)]
struct BookingVersion<'a> {
    booking: &'a str,
    version: String,
}

/// `reschedule_booking`'s preview.
#[derive(Serialize)]
struct RescheduleEffect<'a> {
    booking: &'a str,
    from: time::TimeView,
    to: &'a time::TimeView,
    ends: time::TimeView,
    emails: usize,
    messages: &'a [Message],
}

/// `reschedule_booking`'s content: the new start and the messages.
#[derive(Serialize)]
struct RescheduleContent<'a> {
    booking: &'a str,
    version: String,
    start: String,
    messages: &'a [Message],
}

/// `cancel_bookings`' preview.
#[derive(Serialize)]
struct CancelEffect<'a> {
    bookings: Vec<views::BookingView>,
    emails: usize,
    messages: &'a [Message],
}

/// `cancel_bookings`' content: every booking at its version, and the messages.
#[derive(Serialize)]
struct CancelContent<'a> {
    bookings: &'a [String],
    versions: &'a [String],
    messages: &'a [Message],
}

#[cfg(test)]
mod read_ahead_tests {
    use super::*;
    use crate::auth::ReadAheadRow;
    use crate::ctx::{ConnectionRef, TenantRef};
    use crate::handle::{ConnectionHandle, PersonHandle, TenantHandle};
    use crate::rights::RightSet;

    const HANDLE: &str = "bkg_aaaaaaaaaaaaaaaa";

    fn row() -> BookingRow {
        let at = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("time");
        BookingRow {
            id: 1,
            customer_id: 1,
            service_id: 1,
            technician_id: None,
            handle: HANDLE.into(),
            status: "confirmed".into(),
            starts_at: at,
            zone: "Europe/Berlin".into(),
            currency: "EUR".into(),
            net_minor: 100,
            tax_minor: 19,
            total_minor: 119,
            customer_note: None,
            customer_handle: "cus_aaaaaaaaaaaaaaaa".into(),
            customer_name: "Read Ahead Canary".into(),
            customer_email: None,
            technician_handle: None,
            technician_name: None,
            service_handle: "srv_aaaaaaaaaaaaaaaa".into(),
            service_name: "Service".into(),
            duration_minutes: 60,
            tax_rate_bp: 1900,
            priority: "normal".into(),
            reference: None,
            updated_at: at,
            notes: sqlx::types::Json(Vec::new()),
            notes_total: 0,
        }
    }

    /// A connection's context with `rights`, carrying a read-ahead of `HANDLE` (first page).
    fn context(rights: &[Right]) -> OpCtx {
        let tenant = TenantRef {
            id: 1,
            handle: TenantHandle::from_db("ten_aaaaaaaaaaaaaaaa".into()),
            slug: "t".into(),
            zone: jiff::tz::TimeZone::UTC,
            zone_name: "UTC".into(),
            currency: "EUR".into(),
        };
        let connection = ConnectionRef {
            id: 1,
            handle: ConnectionHandle::from_db("con_aaaaaaaaaaaaaaaa".into()),
            name: "c".into(),
            client_name: "c".into(),
            toolset: "full".into(),
        };
        let all = RightSet::of(&[Right::BookingsRead, Right::CustomersRead]);
        let key = ReadAhead::Booking { handle: HANDLE.into(), notes_before: None };
        OpCtx::for_connection(
            (1, PersonHandle::from_db("per_aaaaaaaaaaaaaaaa".into())),
            tenant,
            RightSet::of(rights),
            all,
            connection,
        )
        .with_read_ahead(ReadAheadRow::new(key, AheadRows::Booking(Some(row()))))
    }

    /// Services whose database is never reached: a read that is not served from the
    /// read-ahead fails to connect.
    fn unreachable() -> Services {
        Services::with_pool(
            sqlx::postgres::PgPoolOptions::new()
                .acquire_timeout(std::time::Duration::from_millis(200))
                .connect_lazy("postgres://nobody@127.0.0.1:1/none")
                .expect("lazy pool"),
        )
    }

    fn input(booking: &str, cursor: Option<&str>) -> GetBookingInput {
        GetBookingInput { booking: booking.into(), notes_cursor: cursor.map(str::to_owned) }
    }

    #[tokio::test]
    async fn the_row_read_ahead_serves_only_its_own_read_and_only_after_the_rights_check() {
        let ds = unreachable();
        // Served from the row, no database needed; a log of the context never shows the row's
        // customer data (R14).
        let ctx = context(&[Right::BookingsRead]);
        assert!(!format!("{ctx:?}").contains("Read Ahead Canary"), "{ctx:?}");
        let got = get(&ds, &ctx, &input(HANDLE, None)).await.expect("served from the read-ahead");
        assert_eq!(got.customer_name, "Read Ahead Canary");
        assert_eq!(ctx.read_ahead_used(), Some(true));
        // Taken once: a second read goes to the database.
        assert!(get(&ds, &ctx, &input(HANDLE, None)).await.is_err());
        // Without bookings:read the call is refused and the row stays untaken.
        let ctx = context(&[Right::CustomersRead]);
        let refused = get(&ds, &ctx, &input(HANDLE, None)).await.expect_err("refused");
        assert!(matches!(refused, Error::Forbidden { right: Right::BookingsRead }), "{refused:?}");
        assert_eq!(ctx.read_ahead_used(), Some(false));
        // Another booking, or the same one with a notes cursor, is not that row.
        let ctx = context(&[Right::BookingsRead]);
        let other = get(&ds, &ctx, &input("bkg_bbbbbbbbbbbbbbbb", None)).await;
        assert!(other.is_err(), "read from the database, which is unreachable here");
        let cursor = encode_cursor(&["1800000000000000", "bnt_aaaaaaaaaaaaaaaa"]);
        let paged = get(&ds, &ctx, &input(HANDLE, Some(&cursor))).await;
        assert!(paged.is_err(), "read from the database, which is unreachable here");
        assert_eq!(ctx.read_ahead_used(), Some(false));
    }

    #[tokio::test]
    async fn a_cursor_postgres_would_refuse_is_the_callers_error() {
        let ds = unreachable();
        let ctx = context(&[Right::BookingsRead]);
        for parts in [
            ["-99999999999999999".to_owned(), "bnt_aaaaaaaaaaaaaaaa".to_owned()],
            ["1800000000000000".to_owned(), "bnt_\u{0}aaaaaaaaaaaaaaa".to_owned()],
            ["1800000000000000".to_owned(), String::new()],
            ["1800000000000000".to_owned(), "x".repeat(65)],
        ] {
            let cursor = encode_cursor(&[parts[0].as_str(), parts[1].as_str()]);
            let err = get(&ds, &ctx, &input(HANDLE, Some(&cursor))).await.expect_err("refused");
            assert!(
                matches!(&err, Error::Invalid { field, .. } if field == "notes_cursor"),
                "{parts:?}: {err:?}"
            );
            assert!(read_ahead(&input(HANDLE, Some(&cursor))).is_none(), "{parts:?}");
        }
    }
}
