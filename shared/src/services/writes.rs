//! Silent writes: customers, draft bookings, internal booking fields, staff notes (R6 class
//! `silent_write`). Each runs in one transaction that also checks the replay cache (R8), the
//! duplicate guard (R9) or the version (R10), and writes exactly one audit row (R19).
//! None of them reaches a customer: they write no outbox row.

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::canon::{canonical_json, sha256_hex};
use crate::ctx::OpCtx;
use crate::datastore::{self as db, AuditEntry, BookingChange, NewBooking, Services, Tx, from_ts};
use crate::error::{Error, Resource, Result};
use crate::handle::{BookingHandle, CustomerHandle, NoteHandle, ServiceHandle, TechnicianHandle};
use crate::money;
use crate::rights::Right;
use crate::time;
use crate::views;

/// Trims every string so that `" Anna "` and `"Anna"` are the same call.
fn normalize(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(s.trim().to_owned()),
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, v)| k.as_str() != "idempotency_key" && !v.is_null())
                .map(|(k, v)| (k.clone(), normalize(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The digest a replay fingerprint is built from: SHA-256 of the canonical JSON of the
/// normalized arguments (keys sorted at every level), without the idempotency key.
pub fn args_digest<T: Serialize>(input: &T) -> String {
    let value = serde_json::to_value(input).unwrap_or(Value::Null);
    sha256_hex(canonical_json(&normalize(&value)).as_bytes())
}

/// How a silent write begins: answered from the replay cache, or with a transaction to write in.
enum Begun {
    Replayed(Value),
    Fresh(SilentWrite),
}

/// An open silent write: its transaction and what `finish` records.
struct SilentWrite {
    tx: Tx<'static>,
    tool: &'static str,
    digest: String,
    key: Option<String>,
    connection: Option<i64>,
}

/// Starts one silent write: the replay check (R8).
///
/// A call identical to one this connection made inside the replay window returns the first
/// result with `replayed: true` and executes nothing. Identical calls racing on different
/// workers serialize on an advisory lock, so exactly one executes.
async fn begin(
    ds: &Services,
    ctx: &OpCtx,
    tool: &'static str,
    digest: String,
    key: Option<&str>,
) -> Result<Begun> {
    let key = key.map(str::trim).filter(|k| !k.is_empty());
    if let Some(k) = key
        && (k.len() > 200 || k.chars().any(char::is_control))
    {
        return Err(Error::invalid("idempotency_key", "use at most 200 printable characters"));
    }
    let mut tx = ds.begin().await?;
    let connection = ctx.connection().map(|c| c.id);
    if let Some(connection) = connection {
        db::replay_lock(&mut tx, connection, tool, &digest).await?;
        if let Some(k) = key {
            // Different arguments under the same key serialize on the key too.
            db::replay_lock(&mut tx, connection, "idempotency_key", k).await?;
            if let Some((seen_tool, seen_digest, result)) =
                db::replay_find_key(&mut tx, connection, k).await?
            {
                if seen_tool != tool || seen_digest != digest {
                    return Err(Error::invalid(
                        "idempotency_key",
                        format!(
                            "this key was used for another call ({seen_tool} with other arguments); use a new key for a new call"
                        ),
                    ));
                }
                return Ok(Begun::Replayed(replayed(result)));
            }
        }
        if let Some(result) =
            db::replay_find(&mut tx, connection, tool, &digest, ds.policy().replay_window_secs)
                .await?
        {
            return Ok(Begun::Replayed(replayed(result)));
        }
    }
    Ok(Begun::Fresh(SilentWrite { tx, tool, digest, key: key.map(str::to_owned), connection }))
}

impl SilentWrite {
    /// Records the result for replays, writes the one audit row (R19) and commits.
    async fn finish(mut self, ctx: &OpCtx, written: Result<(Value, Vec<String>)>) -> Result<Value> {
        let (mut value, targets) = written?;
        value["replayed"] = json!(false);
        if let Some(connection) = self.connection {
            db::replay_insert(
                &mut self.tx,
                connection,
                self.tool,
                &self.digest,
                self.key.as_deref(),
                &value,
            )
            .await?;
        }
        db::audit_insert(&mut self.tx, ctx, AuditEntry::ok(self.tool, targets)).await?;
        self.tx.commit().await?;
        Ok(value)
    }
}

fn replayed(mut result: Value) -> Value {
    result["replayed"] = json!(true);
    result
}

// ------------------------------------------------------------------ validation helpers

fn name(field: &str, raw: &str) -> Result<String> {
    let n = raw.trim();
    if n.is_empty() || n.chars().count() > 120 || n.chars().any(char::is_control) {
        return Err(Error::invalid(field, "use 1 to 120 characters without control characters"));
    }
    Ok(n.to_owned())
}

/// An email, normalized to lower case; empty means "none".
fn email(raw: Option<&str>) -> Result<Option<String>> {
    let Some(e) = raw.map(str::trim).filter(|e| !e.is_empty()) else { return Ok(None) };
    let valid = e.len() <= 254
        && e.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty() && domain.contains('.') && !domain.starts_with('.')
        })
        && !e.chars().any(|c| c.is_whitespace() || c.is_control());
    if !valid {
        return Err(Error::invalid("email", format!("{e:?} is not an email address")));
    }
    Ok(Some(e.to_lowercase()))
}

/// A phone number as given, and its digits (with a leading +) for the duplicate guard.
fn phone(raw: Option<&str>) -> Result<Option<(String, String)>> {
    let Some(p) = raw.map(str::trim).filter(|p| !p.is_empty()) else { return Ok(None) };
    let digits: String = p.chars().filter(|c| c.is_ascii_digit() || *c == '+').collect();
    let allowed = p.chars().all(|c| c.is_ascii_digit() || " +-()./".contains(c));
    if !allowed || digits.chars().filter(char::is_ascii_digit).count() < 6 || p.len() > 32 {
        return Err(Error::invalid(
            "phone",
            format!("{p:?} is not a phone number; use digits, spaces, + - ( ) . /"),
        ));
    }
    Ok(Some((p.to_owned(), digits)))
}

fn separate_reason(separate: bool, reason: Option<&str>) -> Result<Option<String>> {
    match (separate, reason.map(str::trim).filter(|r| !r.is_empty())) {
        (false, _) => Ok(None),
        (true, Some(r)) if r.chars().count() <= 300 => Ok(Some(r.to_owned())),
        (true, Some(_)) => Err(Error::invalid("reason", "use at most 300 characters")),
        (true, None) => Err(Error::invalid(
            "reason",
            "`separate: true` needs a `reason` saying why a second record is right",
        )),
    }
}

// ------------------------------------------------------------------ customers

/// Takes the business-key locks of a customer's contact details, always email before phone,
/// before the duplicate guard reads (R9): two racing creates with one email serialize here,
/// and the second one's guard sees the first one's row.
async fn lock_contact_keys(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    email: Option<&str>,
    phone: Option<&(String, String)>,
) -> Result<()> {
    if let Some(e) = email {
        db::business_key_lock(tx, ctx, "customer.email", e).await?;
    }
    if let Some((_, digits)) = phone {
        db::business_key_lock(tx, ctx, "customer.phone", digits).await?;
    }
    Ok(())
}

/// Create a customer.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCustomerInput {
    /// Full name.
    pub name: String,
    /// Email address; a customer with the same email is a duplicate.
    #[serde(default)]
    pub email: Option<String>,
    /// Phone number; a customer with the same phone is a duplicate.
    #[serde(default)]
    pub phone: Option<String>,
    /// Create even though a customer with the same email or phone exists (needs `reason`).
    #[serde(default)]
    pub separate: bool,
    /// Why a separate record is right; required with `separate`.
    #[serde(default)]
    pub reason: Option<String>,
    /// Optional key for safe retries: the same key with the same arguments returns the first result.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// Change a customer's name or contact details.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateCustomerInput {
    /// Customer handle (cus_…).
    pub customer: String,
    /// The `version` you read; the update is refused if the customer changed since.
    pub version: String,
    #[serde(default)]
    pub name: Option<String>,
    /// New email; an empty string removes it.
    #[serde(default)]
    pub email: Option<String>,
    /// New phone; an empty string removes it.
    #[serde(default)]
    pub phone: Option<String>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

pub async fn create_customer(
    ds: &Services,
    ctx: &OpCtx,
    input: &CreateCustomerInput,
    now: Timestamp,
) -> Result<Value> {
    ctx.require(Right::CustomersWrite)?;
    let name = name("name", &input.name)?;
    let email = email(input.email.as_deref())?;
    let phone = phone(input.phone.as_deref())?;
    let reason = separate_reason(input.separate, input.reason.as_deref())?;
    if email.is_none() && phone.is_none() {
        return Err(Error::invalid(
            "email",
            "give an email or a phone so the customer can be told apart and reached",
        ));
    }
    let mut w = match begin(
        ds,
        ctx,
        "create_customer",
        args_digest(input),
        input.idempotency_key.as_deref(),
    )
    .await?
    {
        Begun::Replayed(value) => return Ok(value),
        Begun::Fresh(w) => w,
    };
    let written: Result<(Value, Vec<String>)> = async {
        let tx = &mut w.tx;
        lock_contact_keys(tx, ctx, email.as_deref(), phone.as_ref()).await?;
        if reason.is_none()
            && let Some((existing, key)) = db::customer_by_key(
                tx,
                ctx,
                email.as_deref(),
                phone.as_ref().map(|p| p.1.as_str()),
                None,
            )
            .await?
        {
            return Err(Error::Duplicate { resource: Resource::Customer, existing, key });
        }
        let handle = CustomerHandle::generate();
        let row = db::customer_create(
            tx,
            ctx,
            handle.as_str(),
            &name,
            email.as_deref(),
            phone.as_ref().map(|p| p.0.as_str()),
            reason.as_deref(),
        )
        .await?;
        let view = views::customer(&row, &ctx.tenant().zone, &ctx.tenant().zone_name, now);
        Ok((json!({ "customer": view }), vec![row.handle]))
    }
    .await;
    w.finish(ctx, written).await
}

pub async fn update_customer(
    ds: &Services,
    ctx: &OpCtx,
    input: &UpdateCustomerInput,
    now: Timestamp,
) -> Result<Value> {
    ctx.require(Right::CustomersWrite)?;
    let handle = CustomerHandle::parse("customer", &input.customer)?;
    let new_name = input.name.as_deref().map(|n| name("name", n)).transpose()?;
    let new_email = input.email.as_deref().map(|e| email(Some(e))).transpose()?;
    let new_phone = input.phone.as_deref().map(|p| phone(Some(p))).transpose()?;
    let mut w = match begin(
        ds,
        ctx,
        "update_customer",
        args_digest(input),
        input.idempotency_key.as_deref(),
    )
    .await?
    {
        Begun::Replayed(value) => return Ok(value),
        Begun::Fresh(w) => w,
    };
    let written: Result<(Value, Vec<String>)> = async {
        let tx = &mut w.tx;
        let row = db::customer_lock(tx, ctx, handle.as_str())
            .await?
            .ok_or_else(|| Error::not_found(Resource::Customer, handle.as_str()))?;
        let current = views::customer_version(&row);
        if current != input.version.trim() {
            let view = views::customer(&row, &ctx.tenant().zone, &ctx.tenant().zone_name, now);
            return Err(Error::Conflict {
                resource: Resource::Customer,
                handle: row.handle,
                expected: input.version.clone(),
                current_version: current,
                current: Box::new(json!(view)),
            });
        }
        let email = new_email.unwrap_or(row.email.clone());
        let phone = match new_phone {
            Some(p) => p,
            None => {
                row.phone.as_deref().map(|p| phone(Some(p))).transpose().ok().flatten().flatten()
            }
        };
        lock_contact_keys(tx, ctx, email.as_deref(), phone.as_ref()).await?;
        if let Some((existing, key)) = db::customer_by_key(
            tx,
            ctx,
            email.as_deref(),
            phone.as_ref().map(|p| p.1.as_str()),
            Some(row.id),
        )
        .await?
        {
            return Err(Error::Duplicate { resource: Resource::Customer, existing, key });
        }
        let name = new_name.unwrap_or(row.name.clone());
        let updated = db::customer_update(
            tx,
            ctx,
            row.id,
            &name,
            email.as_deref(),
            phone.as_ref().map(|p| p.0.as_str()),
        )
        .await?;
        let view = views::customer(&updated, &ctx.tenant().zone, &ctx.tenant().zone_name, now);
        Ok((json!({ "customer": view }), vec![updated.handle]))
    }
    .await;
    w.finish(ctx, written).await
}

// ------------------------------------------------------------------ bookings

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
) -> Result<Value> {
    let row = db::booking_lock(tx, ctx, handle)
        .await?
        .ok_or_else(|| Error::not_found(Resource::Booking, handle))?;
    Ok(json!({ "booking": views::booking(&row, false, now) }))
}

pub async fn create_booking(
    ds: &Services,
    ctx: &OpCtx,
    input: &CreateBookingInput,
    now: Timestamp,
) -> Result<Value> {
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
    let mut w = match begin(
        ds,
        ctx,
        "create_booking",
        args_digest(input),
        input.idempotency_key.as_deref(),
    )
    .await?
    {
        Begun::Replayed(value) => return Ok(value),
        Begun::Fresh(w) => w,
    };
    let written: Result<(Value, Vec<String>)> = async {
        let tx = &mut w.tx;
        let customer = db::customer_lock(tx, ctx, customer.as_str())
            .await?
            .ok_or_else(|| Error::not_found(Resource::Customer, customer.as_str()))?;
        let service = service(tx, ctx, &input.service).await?;
        let technician = match input.technician.as_deref().map(str::trim).filter(|t| !t.is_empty())
        {
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
        Ok((present_booking(tx, ctx, handle.as_str(), now).await?, vec![handle.to_string()]))
    }
    .await;
    w.finish(ctx, written).await
}

pub async fn update_booking(
    ds: &Services,
    ctx: &OpCtx,
    input: &UpdateBookingInput,
    now: Timestamp,
) -> Result<Value> {
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
    let mut w = match begin(
        ds,
        ctx,
        "update_booking",
        args_digest(input),
        input.idempotency_key.as_deref(),
    )
    .await?
    {
        Begun::Replayed(value) => return Ok(value),
        Begun::Fresh(w) => w,
    };
    let written: Result<(Value, Vec<String>)> = async {
        let tx = &mut w.tx;
        let row = locked_booking(tx, ctx, &input.booking).await?;
        let current = views::booking_version(&row);
        if current != input.version.trim() {
            return Err(Error::Conflict {
                resource: Resource::Booking,
                handle: row.handle.clone(),
                expected: input.version.clone(),
                current_version: current,
                current: Box::new(json!(views::booking(&row, false, now))),
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
    w.finish(ctx, written).await
}

pub async fn add_booking_note(
    ds: &Services,
    ctx: &OpCtx,
    input: &AddBookingNoteInput,
    now: Timestamp,
) -> Result<Value> {
    ctx.require(Right::BookingsWrite)?;
    let text = input.text.trim();
    if text.is_empty() || text.chars().count() > 2000 {
        return Err(Error::invalid("text", "write 1 to 2000 characters"));
    }
    let mut w = match begin(
        ds,
        ctx,
        "add_booking_note",
        args_digest(input),
        input.idempotency_key.as_deref(),
    )
    .await?
    {
        Begun::Replayed(value) => return Ok(value),
        Begun::Fresh(w) => w,
    };
    let written: Result<(Value, Vec<String>)> = async {
        let tx = &mut w.tx;
        let row = locked_booking(tx, ctx, &input.booking).await?;
        let note = NoteHandle::generate();
        db::booking_note_insert(tx, ctx, note.as_str(), row.id, "staff", text).await?;
        let written = time::present(now, &ctx.tenant().zone, &ctx.tenant().zone_name, now);
        Ok((
            json!({ "note": note.as_str(), "booking": row.handle, "written": written }),
            vec![row.handle.clone(), note.to_string()],
        ))
    }
    .await;
    w.finish(ctx, written).await
}
