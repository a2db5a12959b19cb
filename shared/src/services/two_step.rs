//! What a two-step operation is (R7), apart from the rail that runs it: the operations
//! ([`Op`]: name, right, class), the plan an operation makes from the current state (what it
//! shows, the hash of what it will send or change, what it applies, its messages), and the
//! helpers plans share. Resources implement [`Planned`] for their inputs with these types
//! only; the rail (`services::actions`) takes plans through the registry
//! (`services::planners`), so it knows no resource and no resource knows the rail.

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::canon::{canonical_json, sha256_hex};
use crate::ctx::OpCtx;
use crate::datastore::{self as db, BookingRow, Tx, to_ts};
use crate::effect::EffectClass;
use crate::error::{Error, Resource, Result};
use crate::handle::BookingHandle;
use crate::rights::Right;
use crate::time::{self, TimeView};

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

    /// The operation's effect class: always one of the two-step classes.
    pub fn class(self) -> EffectClass {
        match self {
            Op::SendCustomerMessage
            | Op::ConfirmBooking
            | Op::RescheduleBooking
            | Op::CancelBookings => EffectClass::Notify,
            Op::PageTechnician => EffectClass::Wake,
            Op::MuteAlerts => EffectClass::Alert,
            Op::DeleteCustomer | Op::DeleteBooking => EffectClass::Delete,
        }
    }

    pub fn by_name(name: &str) -> Option<Op> {
        Op::ALL.iter().copied().find(|o| o.name() == name)
    }

    /// The kinds of effect the operation's plans count against budgets, its main one first.
    /// A plan reports only these ([`Plan::effects`]); a registry-generated test checks that the
    /// sample of every two-step tool counts its main kind.
    pub fn effect_kinds(self) -> &'static [EffectKind] {
        match self {
            Op::SendCustomerMessage => &[EffectKind::CustomersMessaged],
            Op::ConfirmBooking | Op::RescheduleBooking | Op::CancelBookings => {
                &[EffectKind::BookingsChanged, EffectKind::CustomersMessaged]
            }
            Op::PageTechnician => &[EffectKind::TechniciansPaged],
            Op::MuteAlerts => &[EffectKind::AlertMinutesMuted],
            Op::DeleteCustomer | Op::DeleteBooking => &[EffectKind::RecordsDeleted],
        }
    }
}

/// What budgets count: effects, not calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EffectKind {
    /// Distinct customers an action emails.
    CustomersMessaged,
    /// Bookings confirmed, moved or cancelled.
    BookingsChanged,
    /// Distinct technicians paged.
    TechniciansPaged,
    /// Alert rules muted × minutes muted.
    AlertMinutesMuted,
    /// Customers and bookings deleted.
    RecordsDeleted,
}

impl EffectKind {
    /// In a stable order: budgets are locked in this order, so two actions never wait on
    /// each other's budget locks.
    pub const ALL: &'static [EffectKind] = &[
        EffectKind::CustomersMessaged,
        EffectKind::BookingsChanged,
        EffectKind::TechniciansPaged,
        EffectKind::AlertMinutesMuted,
        EffectKind::RecordsDeleted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EffectKind::CustomersMessaged => "customers_messaged",
            EffectKind::BookingsChanged => "bookings_changed",
            EffectKind::TechniciansPaged => "technicians_paged",
            EffectKind::AlertMinutesMuted => "alert_minutes_muted",
            EffectKind::RecordsDeleted => "records_deleted",
        }
    }

    pub fn parse(field: &str, raw: &str) -> Result<EffectKind> {
        EffectKind::ALL.iter().copied().find(|k| k.as_str() == raw.trim()).ok_or_else(|| {
            Error::invalid_with_options(
                field,
                format!("{:?} is not a kind of effect", raw.chars().take(40).collect::<String>()),
                EffectKind::ALL.iter().map(|k| k.as_str().to_owned()).collect(),
            )
        })
    }

    /// The kinds some two-step tool the rights allow can count (from [`Op::ALL`], so a new
    /// tool's kinds follow it): a connection's budget forms show only these.
    pub fn caused_by(rights: crate::rights::RightSet) -> Vec<EffectKind> {
        EffectKind::ALL
            .iter()
            .copied()
            .filter(|k| {
                Op::ALL
                    .iter()
                    .any(|op| rights.contains(op.right()) && op.effect_kinds().contains(k))
            })
            .collect()
    }

    /// Its small index, for the budget's advisory lock.
    pub(crate) fn index(self) -> i32 {
        EffectKind::ALL.iter().position(|k| *k == self).unwrap_or(0) as i32
    }
}

/// One message the effect sends.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Message {
    pub(crate) channel: &'static str,
    pub(crate) recipient: String,
    pub(crate) subject: String,
    pub(crate) body: String,
}

/// What an action will do, computed from the current state.
pub(crate) struct Plan {
    pub(crate) summary: String,
    /// Shown to the caller in the preview (see [`effect`]).
    pub(crate) preview: Map<String, Value>,
    /// The hash of exactly what will be sent or changed, with the versions it was planned
    /// from (see [`content_hash`]).
    pub(crate) content_hash: String,
    pub(crate) targets: Vec<String>,
    pub(crate) apply: Apply,
    pub(crate) messages: Vec<Message>,
}

impl Plan {
    /// What the plan does, counted for budgets: derived here from what it sends and changes
    /// (its messages and its `apply`), never reported by an operation on its own, so a new
    /// operation cannot forget to count. Kinds without effect are left out.
    pub(crate) fn effects(&self) -> Vec<(EffectKind, i64)> {
        let distinct = |channel: &str| {
            let mut to: Vec<&str> = self
                .messages
                .iter()
                .filter(|m| m.channel == channel)
                .map(|m| m.recipient.as_str())
                .collect();
            to.sort_unstable();
            to.dedup();
            to.len() as i64
        };
        let (changed, muted, deleted) = match &self.apply {
            Apply::Nothing => (0, 0, 0),
            Apply::SetStatus { ids, .. } => (ids.len() as i64, 0, 0),
            Apply::Reschedule { .. } => (1, 0, 0),
            Apply::Mute { minutes, .. } => (0, i64::from(*minutes), 0),
            Apply::DeleteCustomer { .. } | Apply::DeleteBooking { .. } => (0, 0, 1),
        };
        [
            (EffectKind::CustomersMessaged, distinct("email")),
            (EffectKind::BookingsChanged, changed),
            (EffectKind::TechniciansPaged, distinct("page")),
            (EffectKind::AlertMinutesMuted, muted),
            (EffectKind::RecordsDeleted, deleted),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect()
    }
}

/// A plan's typed preview, as the object the caller is shown under `effect`.
pub(crate) fn effect<T: Serialize>(preview: &T) -> Result<Map<String, Value>> {
    match serde_json::to_value(preview) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Error::Internal("a preview must be an object".into())),
        Err(e) => Err(Error::Internal(format!("preview: {e}"))),
    }
}

/// The hash a pending action keeps of a plan's typed content: SHA-256 of its canonical JSON.
pub(crate) fn content_hash<T: Serialize>(content: &T) -> Result<String> {
    let value = serde_json::to_value(content).map_err(|e| Error::Internal(e.to_string()))?;
    Ok(sha256_hex(canonical_json(&value).as_bytes()))
}

pub(crate) enum Apply {
    Nothing,
    SetStatus { ids: Vec<(i64, String)>, status: &'static str },
    Reschedule { id: i64, handle: String, starts_at: Timestamp },
    Mute { id: i64, until: Timestamp, minutes: u32 },
    DeleteCustomer { id: i64 },
    DeleteBooking { id: i64 },
}

/// How many lines a written field may have.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lines {
    /// A subject, a page: one line, as it shows in a summary or on a pager.
    One,
    /// A message body, a note.
    Many,
}

pub(crate) fn text(field: &str, raw: &str, max: usize, lines: Lines) -> Result<String> {
    // Windows line breaks are line breaks.
    let normalized = raw.replace("\r\n", "\n");
    let t = normalized.trim();
    let allowed = |c: char| !c.is_control() || (lines == Lines::Many && matches!(c, '\n' | '\t'));
    if t.is_empty() || t.chars().count() > max || !t.chars().all(allowed) {
        let what = match lines {
            Lines::One => "on one line without control characters",
            Lines::Many => "without control characters other than line breaks and tabs",
        };
        return Err(Error::invalid(field, format!("write 1 to {max} characters {what}")));
    }
    if let Some(why) = crate::text::refusal(t) {
        return Err(Error::invalid(field, format!("the text {why}")));
    }
    Ok(t.to_owned())
}

pub(crate) fn when(row: &BookingRow, now: Timestamp) -> TimeView {
    let tz = jiff::tz::TimeZone::get(&row.zone).unwrap_or(jiff::tz::TimeZone::UTC);
    time::present(to_ts(row.starts_at), &tz, &row.zone, now)
}

pub(crate) async fn booking(tx: &mut Tx<'static>, ctx: &OpCtx, raw: &str) -> Result<BookingRow> {
    let h = BookingHandle::parse("booking", raw)?;
    db::booking_lock(tx, ctx, h.as_str())
        .await?
        .ok_or_else(|| Error::not_found(Resource::Booking, h.as_str()))
}

pub(crate) fn customer_email(row: &BookingRow) -> Result<String> {
    row.customer_email.clone().ok_or_else(|| Error::WrongState {
        message: format!(
            "customer {} has no email address, so they cannot be told",
            row.customer_handle
        ),
        use_instead: Some("update_customer"),
    })
}

pub(crate) fn booking_line(row: &BookingRow, now: Timestamp) -> String {
    format!(
        "{} ({}, {})",
        row.handle,
        crate::text::quoted(&row.service_name),
        when(row, now).display
    )
}

/// The instants a plan is made at: `now` for what is shown and checked, `previewed` for what
/// the preview promised (a mute "for 30 minutes" ends 30 minutes after the preview, so the end
/// time that executes is the one the preview showed).
#[derive(Clone, Copy)]
pub(crate) struct At {
    pub(crate) now: Timestamp,
    pub(crate) previewed: Timestamp,
}

impl At {
    /// A plan for a new preview. Whole seconds, so that the instant stored with the pending
    /// action is exactly the one planned from.
    pub(crate) fn fresh(now: Timestamp) -> At {
        At { now, previewed: Timestamp::from_second(now.as_second()).unwrap_or(now) }
    }
}

/// One two-step operation (R7, STYLE 13): it plans, from the current state, exactly what it
/// will send or change. The rail does everything else: `actions::prepare` hashes the plan's
/// content and stores the pending action; `actions::confirm` plans again under the lock, compares the hashes
/// and executes the plan's `apply` and messages once. Each operation lives with its resource.
pub trait TwoStep: DeserializeOwned + private::Sealed {
    /// The operation this input prepares.
    const OP: Op;
}

/// How a two-step operation plans (the library's side of [`TwoStep`]).
pub(crate) trait Planned: TwoStep {
    fn plan(
        self,
        tx: &mut Tx<'static>,
        ctx: &OpCtx,
        at: At,
    ) -> impl Future<Output = Result<Plan>> + Send;
}

/// Only the library's inputs are two-step operations.
pub(crate) mod private {
    pub trait Sealed {}
}
