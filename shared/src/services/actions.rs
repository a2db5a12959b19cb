//! Two-step actions (R7): tools of class notify, wake, alert and delete only prepare.
//!
//! `prepare` plans the action against the current state, stores a pending action (connection,
//! tool, normalized arguments and digest, hash of exactly what will be sent or changed, a
//! server-written summary, a hashed single-use token, an expiry) and returns a preview.
//! `confirm` runs under `pg_advisory_xact_lock` on the pending action and checks: same
//! connection, unused, not rejected, unexpired, the exact summary, the live right; then it plans
//! again under row locks and compares the content hash. A different hash kills the token and
//! returns a new preview (`changed_since_preview`); the same hash executes, writing the outbox
//! rows of the effect in the same transaction. Previews, executions, rejections and refusals
//! are audited and linked to their pending action (R19).

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::canon::{canonical_json, sha256_hex};
use crate::ctx::OpCtx;
use crate::datastore::{
    self as db, AuditEntry, BookingFilter, BookingRow, NewMessage, NewPending, Services, Tx,
    from_ts, to_ts,
};
use crate::error::{ActionRefusal, Error, Resource, Result};
use crate::handle::{BookingHandle, CustomerHandle, TechnicianHandle};
use crate::input::{lenient_u32, parse_input};
use crate::rights::Right;
use crate::secret;
use crate::services::bookings::FindBookingsInput;
use crate::services::rails::args_digest;
use crate::time::{self, TimeView};
use crate::views;

/// The effect classes that need two steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TwoStepClass {
    Notify,
    Wake,
    Alert,
    Delete,
}

/// Every two-step operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    SendCustomerMessage,
    ConfirmBooking,
    RescheduleBooking,
    CancelBookings,
    PageTechnician,
    MuteAlerts,
    DeleteCustomer,
    DeleteBooking,
}

impl Op {
    pub const ALL: &'static [Op] = &[
        Op::SendCustomerMessage,
        Op::ConfirmBooking,
        Op::RescheduleBooking,
        Op::CancelBookings,
        Op::PageTechnician,
        Op::MuteAlerts,
        Op::DeleteCustomer,
        Op::DeleteBooking,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::SendCustomerMessage => "send_customer_message",
            Op::ConfirmBooking => "confirm_booking",
            Op::RescheduleBooking => "reschedule_booking",
            Op::CancelBookings => "cancel_bookings",
            Op::PageTechnician => "page_technician",
            Op::MuteAlerts => "mute_alerts",
            Op::DeleteCustomer => "delete_customer",
            Op::DeleteBooking => "delete_booking",
        }
    }

    pub fn right(self) -> Right {
        match self {
            Op::SendCustomerMessage
            | Op::ConfirmBooking
            | Op::RescheduleBooking
            | Op::CancelBookings => Right::BookingsNotify,
            Op::PageTechnician => Right::TechniciansPage,
            Op::MuteAlerts => Right::AlertsMute,
            Op::DeleteCustomer => Right::CustomersDelete,
            Op::DeleteBooking => Right::BookingsDelete,
        }
    }

    pub fn class(self) -> TwoStepClass {
        match self {
            Op::SendCustomerMessage
            | Op::ConfirmBooking
            | Op::RescheduleBooking
            | Op::CancelBookings => TwoStepClass::Notify,
            Op::PageTechnician => TwoStepClass::Wake,
            Op::MuteAlerts => TwoStepClass::Alert,
            Op::DeleteCustomer | Op::DeleteBooking => TwoStepClass::Delete,
        }
    }

    pub fn by_name(name: &str) -> Option<Op> {
        Op::ALL.iter().copied().find(|o| o.name() == name)
    }
}

// ------------------------------------------------------------------ inputs

/// Email a customer.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendCustomerMessageInput {
    /// Customer handle (cus_…).
    pub customer: String,
    /// Subject line, up to 120 characters.
    pub subject: String,
    /// Message text, up to 2000 characters.
    pub body: String,
}

/// Confirm a draft booking; the customer is emailed the confirmation.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfirmBookingInput {
    /// Booking handle (bkg_…) of a draft.
    pub booking: String,
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

/// Page a technician (phone alert).
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PageTechnicianInput {
    /// Technician handle (tec_…).
    pub technician: String,
    /// What the page says, up to 300 characters.
    pub message: String,
    /// The booking it is about (bkg_…), optional.
    #[serde(default)]
    pub booking: Option<String>,
}

/// Silence an alert rule for a bounded time.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MuteAlertsInput {
    /// Alert rule handle (alr_…), from find_alert_rules.
    pub rule: String,
    /// Minutes to mute, 5 to 240.
    #[serde(deserialize_with = "lenient_u32")]
    #[schemars(with = "u32")]
    pub minutes: Option<u32>,
}

/// Delete a customer who has no bookings.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteCustomerInput {
    /// Customer handle (cus_…).
    pub customer: String,
}

/// Delete a booking and its notes.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteBookingInput {
    /// Booking handle (bkg_…).
    pub booking: String,
}

/// Execute a prepared action.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfirmActionInput {
    /// The confirm_token of the preview.
    pub confirm_token: String,
    /// The confirm_summary of the preview, exactly as given.
    pub confirm_summary: String,
}

/// Discard a prepared action.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectActionInput {
    /// The confirm_token of the preview.
    pub confirm_token: String,
}

// ------------------------------------------------------------------ plans

/// One message the effect sends.
#[derive(Debug, Clone, Serialize)]
struct Message {
    channel: &'static str,
    recipient: String,
    subject: String,
    body: String,
}

/// What an action will do, computed from the current state.
struct Plan {
    summary: String,
    /// Shown to the caller in the preview.
    preview: Value,
    /// Hashed: exactly what will be sent or changed, with the versions it was planned from.
    content: Value,
    targets: Vec<String>,
    apply: Apply,
    messages: Vec<Message>,
}

enum Apply {
    Nothing,
    SetStatus { ids: Vec<(i64, String)>, status: &'static str },
    Reschedule { id: i64, handle: String, starts_at: Timestamp },
    Mute { id: i64, until: Timestamp },
    DeleteCustomer { id: i64 },
    DeleteBooking { id: i64 },
}

fn text(field: &str, raw: &str, max: usize) -> Result<String> {
    let t = raw.trim();
    if t.is_empty() || t.chars().count() > max || t.chars().any(|c| c.is_control() && c != '\n') {
        return Err(Error::invalid(
            field,
            format!("write 1 to {max} characters without control characters"),
        ));
    }
    Ok(t.to_owned())
}

fn when(row: &BookingRow, now: Timestamp) -> TimeView {
    let tz = jiff::tz::TimeZone::get(&row.zone).unwrap_or(jiff::tz::TimeZone::UTC);
    time::present(to_ts(row.starts_at), &tz, &row.zone, now)
}

async fn booking(tx: &mut Tx<'static>, ctx: &OpCtx, raw: &str) -> Result<BookingRow> {
    let h = BookingHandle::parse("booking", raw)?;
    db::booking_lock(tx, ctx, h.as_str())
        .await?
        .ok_or_else(|| Error::not_found(Resource::Booking, h.as_str()))
}

fn customer_email(row: &BookingRow) -> Result<String> {
    row.customer_email.clone().ok_or_else(|| Error::WrongState {
        message: format!(
            "customer {} has no email address, so they cannot be told",
            row.customer_handle
        ),
        use_instead: Some("update_customer"),
    })
}

fn booking_line(row: &BookingRow, now: Timestamp) -> String {
    format!("{} ({}, {})", row.handle, row.service_name, when(row, now).display)
}

/// The instants a plan is made at: `now` for what is shown and checked, `previewed` for what
/// the preview promised (a mute "for 30 minutes" ends 30 minutes after the preview, so the end
/// time that executes is the one the preview showed).
#[derive(Clone, Copy)]
struct At {
    now: Timestamp,
    previewed: Timestamp,
}

impl At {
    /// A plan for a new preview. Whole seconds, so that the instant stored with the pending
    /// action is exactly the one planned from.
    fn fresh(now: Timestamp) -> At {
        At { now, previewed: Timestamp::from_second(now.as_second()).unwrap_or(now) }
    }
}

async fn plan(tx: &mut Tx<'static>, ctx: &OpCtx, op: Op, args: &Value, at: At) -> Result<Plan> {
    let now = at.now;
    match op {
        Op::SendCustomerMessage => {
            let input: SendCustomerMessageInput = parse_input(args.clone())?;
            let h = CustomerHandle::parse("customer", &input.customer)?;
            let subject = text("subject", &input.subject, 120)?;
            let body = text("body", &input.body, 2000)?;
            let c = db::customer_lock(tx, ctx, h.as_str())
                .await?
                .ok_or_else(|| Error::not_found(Resource::Customer, h.as_str()))?;
            let to = c.email.clone().ok_or_else(|| Error::WrongState {
                message: format!("customer {} has no email address", c.handle),
                use_instead: Some("update_customer"),
            })?;
            let msg =
                Message { channel: "email", recipient: to.clone(), subject: subject.clone(), body };
            Ok(Plan {
                summary: format!("Email {} <{to}>: \"{subject}\"", c.name),
                preview: json!({"customer": c.handle, "to": to, "subject": subject, "body": msg.body}),
                content: json!({"customer": c.handle, "version": views::customer_version(&c), "message": msg}),
                targets: vec![c.handle.clone()],
                apply: Apply::Nothing,
                messages: vec![msg],
            })
        }
        Op::ConfirmBooking => {
            let input: ConfirmBookingInput = parse_input(args.clone())?;
            let b = booking(tx, ctx, &input.booking).await?;
            if b.status != "draft" {
                return Err(Error::WrongState {
                    message: format!("booking {} is {}, not a draft", b.handle, b.status),
                    use_instead: None,
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
                    "Confirm booking {} and email the confirmation to {} <{to}>",
                    booking_line(&b, now),
                    b.customer_name
                ),
                preview: json!({"booking": views::booking(&b, false, now), "email": {"to": to, "subject": msg.subject, "body": msg.body}}),
                content: json!({"booking": b.handle, "version": views::booking_version(&b), "message": msg}),
                targets: vec![b.handle.clone()],
                apply: Apply::SetStatus {
                    ids: vec![(b.id, b.handle.clone())],
                    status: "confirmed",
                },
                messages: vec![msg],
            })
        }
        Op::RescheduleBooking => {
            let input: RescheduleBookingInput = parse_input(args.clone())?;
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
                summary: format!(
                    "Move booking {} to {}; {who}",
                    booking_line(&b, now),
                    new_at.display
                ),
                preview: json!({"booking": b.handle, "from": when(&b, now), "to": new_at, "ends": new_end, "emails": messages.len()}),
                content: json!({"booking": b.handle, "version": views::booking_version(&b), "start": start.to_string(), "messages": messages}),
                targets: vec![b.handle.clone()],
                apply: Apply::Reschedule { id: b.id, handle: b.handle.clone(), starts_at: start },
                messages,
            })
        }
        Op::CancelBookings => plan_cancel(tx, ctx, args, now).await,
        Op::PageTechnician => {
            let input: PageTechnicianInput = parse_input(args.clone())?;
            let h = TechnicianHandle::parse("technician", &input.technician)?;
            let message = text("message", &input.message, 300)?;
            let t = db::technician_lock(tx, ctx, h.as_str())
                .await?
                .ok_or_else(|| Error::not_found(Resource::Technician, h.as_str()))?;
            let phone = t.phone.clone().ok_or_else(|| Error::WrongState {
                message: format!("{} has no phone to page", t.name),
                use_instead: None,
            })?;
            let about = match input.booking.as_deref() {
                Some(b) => Some(booking(tx, ctx, b).await?.handle),
                None => None,
            };
            let msg = Message {
                channel: "page",
                recipient: phone.clone(),
                subject: format!("Page for {}", t.name),
                body: message.clone(),
            };
            Ok(Plan {
                summary: format!("Page {} on {phone}: \"{message}\"", t.name),
                preview: json!({"technician": t.handle, "phone": phone, "message": message, "booking": about}),
                content: json!({"technician": t.handle, "message": msg, "booking": about}),
                targets: std::iter::once(t.handle.clone()).chain(about).collect(),
                apply: Apply::Nothing,
                messages: vec![msg],
            })
        }
        Op::MuteAlerts => {
            let input: MuteAlertsInput = parse_input(args.clone())?;
            let minutes = input.minutes.unwrap_or(0);
            if !(5..=240).contains(&minutes) {
                return Err(Error::invalid("minutes", "mute for 5 to 240 minutes"));
            }
            let rule = input.rule.trim();
            let r = db::alert_rule_lock(tx, ctx, rule)
                .await?
                .ok_or_else(|| Error::not_found(Resource::AlertRule, rule))?;
            let until = at
                .previewed
                .checked_add(jiff::SignedDuration::from_mins(i64::from(minutes)))
                .map_err(|e| Error::Internal(e.to_string()))?;
            if until <= now {
                return Err(Error::WrongState {
                    message: format!(
                        "the mute this preview showed would have ended at {}; prepare it again",
                        time::present(until, &ctx.tenant().zone, &ctx.tenant().zone_name, now)
                            .display
                    ),
                    use_instead: Some("mute_alerts"),
                });
            }
            let until_view = time::present(until, &ctx.tenant().zone, &ctx.tenant().zone_name, now);
            Ok(Plan {
                summary: format!(
                    "Mute alert rule \"{}\" for {minutes} minutes, until {}",
                    r.name, until_view.display
                ),
                preview: json!({"rule": r.handle, "name": r.name, "until": until_view}),
                content: json!({"rule": r.handle, "minutes": minutes, "until": until.to_string(), "muted_until": r.muted_until.map(|m| m.timestamp())}),
                targets: vec![r.handle.clone()],
                apply: Apply::Mute { id: r.id, until },
                messages: Vec::new(),
            })
        }
        Op::DeleteCustomer => {
            let input: DeleteCustomerInput = parse_input(args.clone())?;
            let h = CustomerHandle::parse("customer", &input.customer)?;
            let c = db::customer_lock(tx, ctx, h.as_str())
                .await?
                .ok_or_else(|| Error::not_found(Resource::Customer, h.as_str()))?;
            let bookings = db::customer_booking_handles(tx, ctx, c.id).await?;
            if !bookings.is_empty() {
                return Err(Error::WrongState {
                    message: format!(
                        "customer {} has {} booking(s) ({}); delete those first",
                        c.handle,
                        bookings.len(),
                        bookings.join(", ")
                    ),
                    use_instead: Some("delete_booking"),
                });
            }
            Ok(Plan {
                summary: format!("Delete customer {} ({})", c.name, c.handle),
                preview: json!({"customer": views::customer(&c, &ctx.tenant().zone, &ctx.tenant().zone_name, now)}),
                content: json!({"customer": c.handle, "version": views::customer_version(&c)}),
                targets: vec![c.handle.clone()],
                apply: Apply::DeleteCustomer { id: c.id },
                messages: Vec::new(),
            })
        }
        Op::DeleteBooking => {
            let input: DeleteBookingInput = parse_input(args.clone())?;
            let b = booking(tx, ctx, &input.booking).await?;
            Ok(Plan {
                summary: format!(
                    "Delete booking {} of {} with its notes",
                    booking_line(&b, now),
                    b.customer_name
                ),
                preview: json!({"booking": views::booking(&b, false, now)}),
                content: json!({"booking": b.handle, "version": views::booking_version(&b)}),
                targets: vec![b.handle.clone()],
                apply: Apply::DeleteBooking { id: b.id },
                messages: Vec::new(),
            })
        }
    }
}

/// Explicit handles in one batch.
const MAX_BATCH: usize = 50;
/// Bookings one filter may cancel in one call.
const MAX_FILTER_BATCH: usize = 500;

async fn plan_cancel(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    args: &Value,
    now: Timestamp,
) -> Result<Plan> {
    let input: CancelBookingsInput = parse_input(args.clone())?;
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
            let mut rows: Vec<BookingRow> = Vec::with_capacity(handles.len());
            for raw in handles {
                let row = booking(tx, ctx, raw).await?;
                // A handle listed twice would be cancelled and emailed twice (R11).
                if rows.iter().any(|r| r.id == row.id) {
                    return Err(Error::invalid(
                        "bookings",
                        format!("{} is listed more than once; list each booking once", row.handle),
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
        preview: json!({"bookings": rows.iter().map(|b| views::booking(b, false, now)).collect::<Vec<_>>(), "emails": messages.len()}),
        content: json!({"bookings": handles, "versions": versions, "messages": messages}),
        targets: handles,
        apply: Apply::SetStatus {
            ids: rows.iter().map(|b| (b.id, b.handle.clone())).collect(),
            status: "cancelled",
        },
        messages,
    })
}

async fn apply(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    plan: &Plan,
    pending: (i64, &str),
    now: Timestamp,
) -> Result<Value> {
    for (i, m) in plan.messages.iter().enumerate() {
        let key = format!("{}:{i}", pending.1);
        db::outbox_insert(
            tx,
            ctx,
            NewMessage {
                pending_action_id: Some(pending.0),
                channel: m.channel,
                recipient: &m.recipient,
                subject: &m.subject,
                body: &m.body,
                idempotency_key: &key,
            },
        )
        .await?;
    }
    let changed = match &plan.apply {
        Apply::Nothing => json!({}),
        Apply::SetStatus { ids, status } => {
            let mut out = Vec::new();
            for (id, handle) in ids {
                let row = db::booking_lock(tx, ctx, handle)
                    .await?
                    .ok_or_else(|| Error::not_found(Resource::Booking, handle))?;
                db::booking_update(
                    tx,
                    ctx,
                    *id,
                    db::BookingChange {
                        technician_id: row.technician_id,
                        service_id: row.service_id,
                        starts_at: row.starts_at,
                        net_minor: row.net_minor,
                        tax_minor: row.tax_minor,
                        priority: &row.priority,
                        reference: row.reference.as_deref(),
                        status,
                    },
                )
                .await?;
                let after = db::booking_lock(tx, ctx, handle)
                    .await?
                    .ok_or_else(|| Error::not_found(Resource::Booking, handle))?;
                out.push(views::booking(&after, false, now));
            }
            json!({ "bookings": out })
        }
        Apply::Reschedule { id, handle, starts_at } => {
            let row = db::booking_lock(tx, ctx, handle)
                .await?
                .ok_or_else(|| Error::not_found(Resource::Booking, handle))?;
            db::booking_update(
                tx,
                ctx,
                *id,
                db::BookingChange {
                    technician_id: row.technician_id,
                    service_id: row.service_id,
                    starts_at: from_ts(*starts_at),
                    net_minor: row.net_minor,
                    tax_minor: row.tax_minor,
                    priority: &row.priority,
                    reference: row.reference.as_deref(),
                    status: &row.status,
                },
            )
            .await?;
            let after = db::booking_lock(tx, ctx, handle)
                .await?
                .ok_or_else(|| Error::not_found(Resource::Booking, handle))?;
            json!({ "booking": views::booking(&after, false, now) })
        }
        Apply::Mute { id, until } => {
            db::alert_rule_mute(tx, ctx, *id, from_ts(*until)).await?;
            json!({ "muted_until": time::present(*until, &ctx.tenant().zone, &ctx.tenant().zone_name, now) })
        }
        Apply::DeleteCustomer { id } => {
            db::customer_delete(tx, ctx, *id).await?;
            json!({ "deleted": plan.targets })
        }
        Apply::DeleteBooking { id } => {
            db::booking_delete(tx, ctx, *id).await?;
            json!({ "deleted": plan.targets })
        }
    };
    Ok(json!({ "changed": changed, "messages_queued": plan.messages.len() }))
}

// ------------------------------------------------------------------ the two steps

fn connection_id(ctx: &OpCtx) -> Result<i64> {
    ctx.connection().map(|c| c.id).ok_or_else(|| {
        Error::invalid("connection", "two-step actions are taken through an agent connection")
    })
}

/// Stores a pending action for `plan` and returns the preview.
async fn store_preview(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    ds: &Services,
    op: Op,
    args: &Value,
    plan: &Plan,
    now: Timestamp,
) -> Result<Value> {
    let previewed = At::fresh(now).previewed;
    let token =
        format!("cfm_{}", &secret::generate(secret::CredentialKind::Session)["gh_ses_".len()..]);
    let handle = format!("pac_{}", &crate::handle::NoteHandle::generate().as_str()[4..]);
    let content_hash = sha256_hex(canonical_json(&plan.content).as_bytes());
    let (id, expires_at) = db::pending_insert(
        tx,
        ctx,
        NewPending {
            handle: &handle,
            connection_id: connection_id(ctx)?,
            tool: op.name(),
            args,
            args_digest: &args_digest(args),
            content_hash: &content_hash,
            summary: &plan.summary,
            token_hash: &secret::hash_token(&token),
            ttl_seconds: ds.policy().action_ttl_secs,
            previewed_at: from_ts(previewed),
        },
    )
    .await?;
    let action = format!("{}.preview", op.name());
    db::audit_insert(
        tx,
        ctx,
        AuditEntry {
            action: &action,
            outcome: "previewed",
            targets: plan.targets.clone(),
            pending_action: Some(id),
            reason: None,
        },
    )
    .await?;
    Ok(json!({
        "status": "PREVIEW",
        "action": handle,
        "tool": op.name(),
        "confirm_token": token,
        "confirm_summary": plan.summary,
        "expires": time::present(to_ts(expires_at), &ctx.tenant().zone, &ctx.tenant().zone_name, now),
        "effect": plan.preview,
        "next": "Nothing has happened yet. Show confirm_summary to the user; if they agree, call confirm_action with confirm_token and confirm_summary exactly as given, otherwise reject_action.",
    }))
}

/// Step one: plan the action and return a preview. Executes nothing.
pub async fn prepare<T: Serialize>(
    ds: &Services,
    ctx: &OpCtx,
    op: Op,
    input: &T,
    now: Timestamp,
) -> Result<Value> {
    ctx.require(op.right())?;
    connection_id(ctx)?;
    let args = serde_json::to_value(input).map_err(|e| Error::Internal(e.to_string()))?;
    let args = Value::Object(
        args.as_object()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .collect(),
    );
    let mut tx = ds.begin().await?;
    let plan = plan(&mut tx, ctx, op, &args, At::fresh(now)).await?;
    let preview = store_preview(&mut tx, ctx, ds, op, &args, &plan, now).await?;
    tx.commit().await?;
    Ok(preview)
}

/// Refuses a token: audited (linked to its action) and committed, then the error.
async fn refuse(mut tx: Tx<'static>, ctx: &OpCtx, tool: &str, pending: i64, error: Error) -> Error {
    let action = format!("{tool}.confirm");
    let entry = AuditEntry {
        action: &action,
        outcome: "refused",
        targets: Vec::new(),
        pending_action: Some(pending),
        reason: None,
    };
    if let Err(e) = db::audit_insert(&mut tx, ctx, entry).await {
        return e;
    }
    match tx.commit().await {
        Ok(()) => error,
        Err(e) => e.into(),
    }
}

fn refused(reason: ActionRefusal, message: impl Into<String>) -> Error {
    Error::ActionRefused { reason, message: message.into() }
}

enum Opened {
    /// This connection's pending action, locked for the rest of the transaction.
    Mine(Tx<'static>, db::PendingRow),
    /// Unknown, or another connection's (refusal audited).
    Refused(Error),
}

/// Finds the pending action of a token under its advisory lock and checks that it belongs to
/// this connection; both steps start here.
async fn open_pending(ds: &Services, ctx: &OpCtx, token: &str) -> Result<Opened> {
    let mut tx = ds.begin().await?;
    let Some(p) =
        db::pending_lock_by_token(&mut tx, ctx, &secret::hash_token(token.trim())).await?
    else {
        return Ok(Opened::Refused(refused(
            ActionRefusal::Unknown,
            "this confirm_token is not known; prepare the action again",
        )));
    };
    if Some(p.connection_id) != ctx.connection().map(|c| c.id) {
        let error = refused(
            ActionRefusal::OtherConnection,
            "this confirm_token belongs to another connection; prepare the action on this one",
        );
        return Ok(Opened::Refused(refuse(tx, ctx, &p.tool, p.id, error).await));
    }
    Ok(Opened::Mine(tx, p))
}

/// Step two: execute a previewed action after every check.
pub async fn confirm(
    ds: &Services,
    ctx: &OpCtx,
    input: &ConfirmActionInput,
    now: Timestamp,
) -> Result<Value> {
    let (mut tx, p) = match open_pending(ds, ctx, &input.confirm_token).await? {
        Opened::Mine(tx, p) => (tx, p),
        Opened::Refused(error) => return Err(error),
    };
    // Every reason this token cannot execute, checked in order; each refusal is audited.
    let refusal = match p.status.as_str() {
        "executed" => Some(refused(
            ActionRefusal::Used,
            format!("action {} was executed already; a token works once", p.handle),
        )),
        "rejected" => {
            Some(refused(ActionRefusal::Rejected, format!("action {} was rejected", p.handle)))
        }
        "superseded" => Some(refused(
            ActionRefusal::Used,
            format!("action {} was replaced by a newer preview; use its token", p.handle),
        )),
        _ if p.expired => Some(refused(
            ActionRefusal::Expired,
            format!("action {} expired; prepare it again", p.handle),
        )),
        _ if input.confirm_summary != p.summary => Some(refused(
            ActionRefusal::SummaryMismatch,
            "confirm_summary differs from the one issued; pass it exactly as the preview gave it",
        )),
        _ => None,
    };
    if let Some(error) = refusal {
        return Err(refuse(tx, ctx, &p.tool, p.id, error).await);
    }
    let op = Op::by_name(&p.tool)
        .ok_or_else(|| Error::Internal(format!("unknown pending tool {}", p.tool)))?;
    if let Err(e) = ctx.require(op.right()) {
        return Err(refuse(tx, ctx, &p.tool, p.id, e).await);
    }
    let at = At { now, previewed: to_ts(p.created_at) };
    let plan = match plan(&mut tx, ctx, op, &p.args, at).await {
        Ok(plan) => plan,
        Err(e) => {
            // The action no longer applies (the booking was deleted, confirmed elsewhere…): the token dies.
            db::pending_decide(&mut tx, p.id, "superseded", None).await?;
            let action = format!("{}.confirm", p.tool);
            db::audit_insert(
                &mut tx,
                ctx,
                AuditEntry {
                    action: &action,
                    outcome: "failed",
                    targets: Vec::new(),
                    pending_action: Some(p.id),
                    reason: None,
                },
            )
            .await?;
            tx.commit().await?;
            return Err(e);
        }
    };
    let content_hash = sha256_hex(canonical_json(&plan.content).as_bytes());
    if content_hash != p.content_hash {
        db::pending_decide(&mut tx, p.id, "superseded", None).await?;
        // The new preview promises what holds from now on.
        let fresh = self::plan(&mut tx, ctx, op, &p.args, At::fresh(now)).await?;
        let preview = store_preview(&mut tx, ctx, ds, op, &p.args, &fresh, now).await?;
        tx.commit().await?;
        return Err(Error::ChangedSincePreview { preview: Box::new(preview) });
    }
    let result = apply(&mut tx, ctx, &plan, (p.id, &p.handle), now).await?;
    let out = json!({"status": "EXECUTED", "action": p.handle, "tool": op.name(), "summary": p.summary, "result": result});
    db::pending_decide(&mut tx, p.id, "executed", Some(&out)).await?;
    db::audit_insert(
        &mut tx,
        ctx,
        AuditEntry {
            action: op.name(),
            outcome: "ok",
            targets: plan.targets.clone(),
            pending_action: Some(p.id),
            reason: None,
        },
    )
    .await?;
    tx.commit().await?;
    Ok(out)
}

pub async fn reject(ds: &Services, ctx: &OpCtx, input: &RejectActionInput) -> Result<Value> {
    let (mut tx, p) = match open_pending(ds, ctx, &input.confirm_token).await? {
        Opened::Mine(tx, p) => (tx, p),
        Opened::Refused(error) => return Err(error),
    };
    if p.status != "pending" {
        return Err(refuse(
            tx,
            ctx,
            &p.tool,
            p.id,
            refused(ActionRefusal::Used, format!("action {} is {} already", p.handle, p.status)),
        )
        .await);
    }
    db::pending_decide(&mut tx, p.id, "rejected", None).await?;
    let action = format!("{}.reject", p.tool);
    db::audit_insert(
        &mut tx,
        ctx,
        AuditEntry {
            action: &action,
            outcome: "rejected",
            targets: Vec::new(),
            pending_action: Some(p.id),
            reason: None,
        },
    )
    .await?;
    tx.commit().await?;
    Ok(json!({"status": "REJECTED", "action": p.handle, "tool": p.tool}))
}
