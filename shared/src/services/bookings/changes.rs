//! The two-step operations on bookings (R7): confirm, reschedule, cancel, batches and deletion, planned as typed previews whose content hash the confirmation checks.

use super::*;

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
pub(super) const MAX_BATCH: usize = 50;
/// Bookings one filter may cancel in one call.
pub(super) const MAX_FILTER_BATCH: usize = 500;

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
pub(super) struct BookingEffect {
    booking: views::BookingView,
}

/// The email a preview shows.
#[derive(Serialize)]
pub(super) struct EmailEffect<'a> {
    to: &'a str,
    subject: &'a str,
    body: &'a str,
}

/// `confirm_booking`'s preview.
#[derive(Serialize)]
pub(super) struct ConfirmEffect<'a> {
    booking: views::BookingView,
    email: EmailEffect<'a>,
}

/// A booking at the version planned from, and the message the effect sends.
#[derive(Serialize)]
pub(super) struct BookingMessage<'a> {
    booking: &'a str,
    version: String,
    message: &'a Message,
}

/// A booking at the version planned from.
#[derive(Serialize)]
pub(super) struct BookingVersion<'a> {
    booking: &'a str,
    version: String,
}

/// `reschedule_booking`'s preview.
#[derive(Serialize)]
pub(super) struct RescheduleEffect<'a> {
    booking: &'a str,
    from: time::TimeView,
    to: &'a time::TimeView,
    ends: time::TimeView,
    emails: usize,
    messages: &'a [Message],
}

/// `reschedule_booking`'s content: the new start and the messages.
#[derive(Serialize)]
pub(super) struct RescheduleContent<'a> {
    booking: &'a str,
    version: String,
    start: String,
    messages: &'a [Message],
}

/// `cancel_bookings`' preview.
#[derive(Serialize)]
pub(super) struct CancelEffect<'a> {
    bookings: Vec<views::BookingView>,
    emails: usize,
    messages: &'a [Message],
}

/// `cancel_bookings`' content: every booking at its version, and the messages.
#[derive(Serialize)]
pub(super) struct CancelContent<'a> {
    bookings: &'a [String],
    versions: &'a [String],
    messages: &'a [Message],
}
