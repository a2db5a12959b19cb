//! Presenters: what results say about each object (R14, R13, R10, R17).
//!
//! Each view is a struct with an explicit field list; no record is ever serialized whole, so
//! a column added to a table (a secret, a private note) cannot leak by accident. Customer- and
//! third-party-written text is only ever placed in [`UntrustedText`]. Every object carries its
//! `version`, and every time is a [`TimeView`]. The MCP tools and the REST API use the same
//! presenters.

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::canon::version_of_fields;
use crate::datastore::{BookingRow, CustomerRow, TechnicianRow, to_ts};
use crate::money::{self, MoneyView};
use crate::text::{UntrustedText, untrusted};
use crate::time::{self, TimeView};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CustomerView {
    /// The customer's handle.
    pub customer: String,
    /// Content hash; pass it back to update tools.
    pub version: String,
    pub name: String,
    pub email: Option<String>,
    pub phone: Option<String>,
    /// Where the customer is served (their bookings' region).
    pub region: Option<String>,
    /// The customer's own IANA zone, when they keep one; else the tenant's stands for it.
    pub zone: Option<String>,
    pub created: TimeView,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TechnicianView {
    /// The technician's handle.
    pub technician: String,
    pub version: String,
    pub name: String,
    pub phone: Option<String>,
    pub skills: Vec<String>,
    pub active: bool,
    /// Where the technician works.
    pub region: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CustomerRef {
    pub customer: String,
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TechnicianRef {
    pub technician: String,
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ServiceRef {
    pub service: String,
    pub name: String,
    pub duration_minutes: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PriceView {
    pub net: MoneyView,
    pub tax: MoneyView,
    pub total: MoneyView,
    /// Tax rate as a decimal percentage string, e.g. "19.00".
    pub tax_rate_percent: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct NoteView {
    pub note: String,
    /// staff, customer, external (another system, the REST API) or agent (written over MCP).
    pub source: String,
    pub written: TimeView,
    /// Staff-written text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Text written by a customer, another system or an agent, wrapped (R13).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub untrusted: Option<UntrustedText>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BookingView {
    /// The booking's handle.
    pub booking: String,
    pub version: String,
    /// draft, confirmed, cancelled or completed.
    pub status: String,
    pub starts: TimeView,
    pub ends: TimeView,
    pub customer: CustomerRef,
    pub technician: Option<TechnicianRef>,
    pub service: ServiceRef,
    pub price: PriceView,
    /// Internal dispatch priority: low, normal or high (never shown to the customer).
    pub priority: String,
    /// Internal reference, e.g. a work order number (never shown to the customer).
    pub reference: Option<String>,
    /// What the customer wrote when booking (R13).
    pub customer_note: Option<UntrustedText>,
    /// The latest notes on the booking (at most 20), oldest first; present on single-booking
    /// results.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notes: Option<Vec<NoteView>>,
    /// How many notes the booking has in all; present on single-booking results.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notes_total: Option<i64>,
    /// Pass as `notes_cursor` to get_booking for the notes before these; absent when there are
    /// none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub earlier_notes_cursor: Option<String>,
}

/// A booking as a search lists it: what an agent needs to pick one and act on it (its handle,
/// version, status, start, who, what and the total). The rest (the end, the price's parts,
/// priority, reference, the customer's note and the notes) is `get_booking`'s: a list stays
/// small, and carries no third-party text.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BookingSummary {
    /// The booking's handle.
    pub booking: String,
    /// Content hash; pass it back to update tools.
    pub version: String,
    /// draft, confirmed, cancelled or completed.
    pub status: String,
    pub starts: TimeView,
    pub customer: CustomerRef,
    pub technician: Option<TechnicianRef>,
    pub service: ServiceRef,
    /// The price with tax.
    pub total: MoneyView,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// How many items this page holds.
    pub count: usize,
    /// Pass as `cursor` to get the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

pub fn customer_version(row: &CustomerRow) -> String {
    version_of_fields(&(
        &row.handle,
        &row.name,
        &row.email,
        &row.phone,
        &row.region,
        &row.zone,
        row.updated_at.timestamp_micros(),
    ))
}

pub fn booking_version(row: &BookingRow) -> String {
    version_of_fields(&(
        &row.handle,
        &row.status,
        row.starts_at.timestamp_micros(),
        &row.technician_handle,
        &row.service_handle,
        row.total_minor,
        &row.customer_note,
        &row.priority,
        &row.reference,
        row.updated_at.timestamp_micros(),
    ))
}

pub fn customer(
    row: &CustomerRow,
    tz: &jiff::tz::TimeZone,
    zone: &str,
    now: Timestamp,
) -> CustomerView {
    CustomerView {
        customer: row.handle.clone(),
        version: customer_version(row),
        name: row.name.clone(),
        email: row.email.clone(),
        phone: row.phone.clone(),
        region: row.region.clone(),
        zone: row.zone.clone(),
        created: time::present(to_ts(row.created_at), tz, zone, now),
    }
}

pub fn technician(row: &TechnicianRow) -> TechnicianView {
    TechnicianView {
        technician: row.handle.clone(),
        version: version_of_fields(&(
            &row.handle,
            &row.name,
            &row.phone,
            &row.skills,
            row.active,
            row.updated_at.timestamp_micros(),
        )),
        name: row.name.clone(),
        phone: row.phone.clone(),
        skills: row.skills.clone(),
        active: row.active,
        region: row.region.clone(),
    }
}

pub fn booking(row: &BookingRow, with_notes: bool, now: Timestamp) -> BookingView {
    // A booking is shown in the zone it was made in.
    let tz = jiff::tz::TimeZone::get(&row.zone).unwrap_or(jiff::tz::TimeZone::UTC);
    let starts = to_ts(row.starts_at);
    let ends = starts
        .checked_add(jiff::SignedDuration::from_mins(i64::from(row.duration_minutes)))
        .unwrap_or(starts);
    // The query returns one note more than a page, newest first: whether earlier notes exist,
    // and where the next page starts.
    let page = crate::datastore::NOTES_PAGE as usize;
    let shown = &row.notes.0[..row.notes.0.len().min(page)];
    let earlier_notes_cursor =
        (with_notes && row.notes.0.len() > page).then(|| shown.last()).flatten().and_then(|n| {
            let at = n.created_at.parse::<Timestamp>().ok()?;
            Some(crate::cursor::encode_cursor(&[&at.as_microsecond().to_string(), &n.handle]))
        });
    let notes = with_notes.then(|| {
        shown
            .iter()
            .rev()
            .map(|n| {
                let written = n.created_at.parse::<Timestamp>().unwrap_or(starts);
                let trusted = n.source == "staff";
                NoteView {
                    note: n.handle.clone(),
                    source: n.source.clone(),
                    written: time::present(written, &tz, &row.zone, now),
                    text: trusted.then(|| n.body.clone()),
                    untrusted: (!trusted).then(|| untrusted(&n.body, &n.source)),
                }
            })
            .collect()
    });
    BookingView {
        booking: row.handle.clone(),
        version: booking_version(row),
        status: row.status.clone(),
        starts: time::present(starts, &tz, &row.zone, now),
        ends: time::present(ends, &tz, &row.zone, now),
        customer: customer_ref(row),
        technician: technician_ref(row),
        service: service_ref(row),
        price: PriceView {
            net: money::present(row.net_minor, &row.currency),
            tax: money::present(row.tax_minor, &row.currency),
            total: money::present(row.total_minor, &row.currency),
            tax_rate_percent: format!("{}.{:02}", row.tax_rate_bp / 100, row.tax_rate_bp % 100),
        },
        priority: row.priority.clone(),
        reference: row.reference.clone(),
        customer_note: row.customer_note.as_deref().map(|n| untrusted(n, "customer")),
        notes,
        notes_total: with_notes.then_some(row.notes_total),
        earlier_notes_cursor,
    }
}

/// A booking as a search lists it ([`BookingSummary`]).
pub fn booking_summary(row: &BookingRow, now: Timestamp) -> BookingSummary {
    let tz = jiff::tz::TimeZone::get(&row.zone).unwrap_or(jiff::tz::TimeZone::UTC);
    BookingSummary {
        booking: row.handle.clone(),
        version: booking_version(row),
        status: row.status.clone(),
        starts: time::present(to_ts(row.starts_at), &tz, &row.zone, now),
        customer: customer_ref(row),
        technician: technician_ref(row),
        service: service_ref(row),
        total: money::present(row.total_minor, &row.currency),
    }
}

fn customer_ref(row: &BookingRow) -> CustomerRef {
    CustomerRef { customer: row.customer_handle.clone(), name: row.customer_name.clone() }
}

fn technician_ref(row: &BookingRow) -> Option<TechnicianRef> {
    row.technician_handle.as_ref().map(|h| TechnicianRef {
        technician: h.clone(),
        name: row.technician_name.clone().unwrap_or_default(),
    })
}

fn service_ref(row: &BookingRow) -> ServiceRef {
    ServiceRef {
        service: row.service_handle.clone(),
        name: row.service_name.clone(),
        duration_minutes: row.duration_minutes,
    }
}
