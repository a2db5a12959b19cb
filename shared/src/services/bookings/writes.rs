//! The silent writes on bookings: drafts, internal fields and notes, replay-safe (R8–R10).

use super::*;

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
    // Left out when false, as a caller that did not send it wrote it: the facts a policy
    // simulation keeps (from this input) then match what the worker's gate judged (the call).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(extend("default" = false))]
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

pub(super) async fn technician_id(tx: &mut Tx<'static>, ctx: &OpCtx, raw: &str) -> Result<i64> {
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

pub(super) async fn service(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    raw: &str,
) -> Result<db::ServiceRow> {
    let h = ServiceHandle::parse("service", raw)?;
    db::service_get(tx, ctx, h.as_str())
        .await?
        .ok_or_else(|| Error::not_found(Resource::Service, h.as_str()))
}

pub(super) async fn locked_booking(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    raw: &str,
) -> Result<db::BookingRow> {
    let h = BookingHandle::parse("booking", raw)?;
    db::booking_lock(tx, ctx, h.as_str())
        .await?
        .ok_or_else(|| Error::not_found(Resource::Booking, h.as_str()))
}

/// Re-reads a booking with its notes for the result.
pub(super) async fn present_booking(
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
                // The customer it is for and the technician it assigns are records it
                // touches: the audit names them, and a policy's replay judges the call on
                // them as enforcement did (the customer, `context.technician`).
                let mut targets = vec![handle.to_string(), customer.handle.clone()];
                if let Some(t) =
                    input.technician.as_deref().map(str::trim).filter(|t| !t.is_empty())
                {
                    targets.push(t.to_owned());
                }
                Ok((present_booking(tx, ctx, handle.as_str(), now).await?, targets))
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
                // The technician a change assigns is a record it touches: the audit names
                // it, and a policy's replay judges the change on it (`context.technician`).
                let mut targets = vec![row.handle.clone()];
                if let Some(t) =
                    input.technician.as_deref().map(str::trim).filter(|t| !t.is_empty())
                {
                    targets.push(t.to_owned());
                }
                Ok((present_booking(tx, ctx, &row.handle, now).await?, targets))
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
pub(super) fn note_source(ctx: &OpCtx) -> &'static str {
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
