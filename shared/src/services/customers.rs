//! Customers: reading them, and their silent writes (R8–R10) with the business-key duplicate
//! guard on email and phone (R9), on the silent-write rail.

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ctx::OpCtx;
use crate::datastore::{self as db, CustomerRow, Services, Tx};
use crate::error::{Error, Resource, Result};
use crate::handle::CustomerHandle;
use crate::input::lenient_u32;
use crate::rights::Right;
use crate::services::fields::{email, name, phone, separate_reason};
use crate::services::presented;
use crate::services::rails::{self, Written, Wrote};
use crate::services::two_step::{
    Apply, At, Lines, Message, Plan, Planned, TwoStep, content_hash, effect, text,
};
use crate::services::{Found, decode_cursor, encode_cursor, limit, nonempty};
use crate::views;

/// Find customers by name, email or phone.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindCustomersInput {
    /// Part of the name, email or phone; omit to list all customers by name.
    #[serde(default)]
    pub query: Option<String>,
    /// Page size, 1 to 100 (default 25).
    #[serde(default, deserialize_with = "lenient_u32")]
    #[schemars(with = "Option<u32>")]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// One customer by handle.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetCustomerInput {
    /// Customer handle (cus_…), from find_customers.
    pub customer: String,
}

pub async fn find(
    ds: &Services,
    ctx: &OpCtx,
    input: &FindCustomersInput,
) -> Result<Found<CustomerRow>> {
    ctx.require(Right::CustomersRead)?;
    let limit = limit(input.limit)?;
    let after = input.cursor.as_deref().map(|c| decode_cursor(c, 2)).transpose()?;
    let after_ref = after.as_ref().map(|p| (p[0].as_str(), p[1].as_str()));
    let mut items = ds.customer_find(ctx, nonempty(&input.query), after_ref, limit + 1).await?;
    let next_cursor = if items.len() as i64 > limit {
        items.truncate(limit as usize);
        items.last().map(|c| encode_cursor(&[&c.name.to_lowercase(), &c.handle]))
    } else {
        None
    };
    Ok(Found { items, next_cursor })
}

pub async fn get(ds: &Services, ctx: &OpCtx, input: &GetCustomerInput) -> Result<CustomerRow> {
    ctx.require(Right::CustomersRead)?;
    let handle = CustomerHandle::parse("customer", &input.customer)?;
    ds.customer_get(ctx, &handle)
        .await?
        .ok_or_else(|| Error::not_found(Resource::Customer, handle.as_str()))
}

// ------------------------------------------------------------------ writes (silent, R8–R10)

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
    // Left out when false, as a caller that did not send it wrote it: the facts a policy
    // simulation keeps (from this input) then match what the worker's gate judged (the call).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(extend("default" = false))]
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
) -> Result<Written<CustomerWritten>> {
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
    rails::silent_write(
        ds,
        ctx,
        "create_customer",
        input,
        input.idempotency_key.as_deref(),
        |mut tx| async move {
            let written: Result<Wrote<CustomerWritten>> = async {
                let tx = &mut tx;
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
                Ok((CustomerWritten { customer: view }, vec![row.handle]))
            }
            .await;
            (tx, written)
        },
    )
    .await
}

pub async fn update_customer(
    ds: &Services,
    ctx: &OpCtx,
    input: &UpdateCustomerInput,
    now: Timestamp,
) -> Result<Written<CustomerWritten>> {
    ctx.require(Right::CustomersWrite)?;
    let handle = CustomerHandle::parse("customer", &input.customer)?;
    let new_name = input.name.as_deref().map(|n| name("name", n)).transpose()?;
    let new_email = input.email.as_deref().map(|e| email(Some(e))).transpose()?;
    let new_phone = input.phone.as_deref().map(|p| phone(Some(p))).transpose()?;
    rails::silent_write(
        ds,
        ctx,
        "update_customer",
        input,
        input.idempotency_key.as_deref(),
        |mut tx| async move {
            let written: Result<Wrote<CustomerWritten>> = async {
                let tx = &mut tx;
                let row = db::customer_lock(tx, ctx, handle.as_str())
                    .await?
                    .ok_or_else(|| Error::not_found(Resource::Customer, handle.as_str()))?;
                let current = views::customer_version(&row);
                if current != input.version.trim() {
                    let view =
                        views::customer(&row, &ctx.tenant().zone, &ctx.tenant().zone_name, now);
                    return Err(Error::Conflict {
                        resource: Resource::Customer,
                        handle: row.handle,
                        expected: input.version.clone(),
                        current_version: current,
                        current: Box::new(presented(&view)?),
                    });
                }
                let email = new_email.unwrap_or(row.email.clone());
                let phone = match new_phone {
                    Some(p) => p,
                    None => row
                        .phone
                        .as_deref()
                        .map(|p| phone(Some(p)))
                        .transpose()
                        .ok()
                        .flatten()
                        .flatten(),
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

                let view =
                    views::customer(&updated, &ctx.tenant().zone, &ctx.tenant().zone_name, now);
                Ok((CustomerWritten { customer: view }, vec![updated.handle]))
            }
            .await;
            (tx, written)
        },
    )
    .await
}

// ------------------------------------------------------------------ two-step operations (R7)

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

impl crate::services::two_step::private::Sealed for SendCustomerMessageInput {}

impl TwoStep for SendCustomerMessageInput {
    const OP: crate::services::two_step::Op = crate::services::two_step::Op::SendCustomerMessage;
}

impl Planned for SendCustomerMessageInput {
    async fn plan(self, tx: &mut Tx<'static>, ctx: &OpCtx, at: At) -> Result<Plan> {
        let (input, _now) = (self, at.now);
        let h = CustomerHandle::parse("customer", &input.customer)?;
        let subject = text("subject", &input.subject, 120, Lines::One)?;
        let body = text("body", &input.body, 2000, Lines::Many)?;
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
            // The address first, record text quoted: what the person approves is where it goes.
            summary: format!(
                "Email {} (customer {}, {}) with the subject {}",
                crate::services::fields::shown_address(&to),
                crate::text::quoted(&c.name),
                c.handle,
                crate::text::quoted(&subject)
            ),
            preview: effect(&MessageEffect {
                customer: &c.handle,
                to: &to,
                subject: &subject,
                body: &msg.body,
            })?,
            content_hash: content_hash(&CustomerMessage {
                customer: &c.handle,
                version: views::customer_version(&c),
                message: &msg,
            })?,
            targets: vec![c.handle.clone()],
            apply: Apply::Nothing,
            messages: vec![msg],
        })
    }
}

/// Delete a customer who has no bookings.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteCustomerInput {
    /// Customer handle (cus_…).
    pub customer: String,
}

impl crate::services::two_step::private::Sealed for DeleteCustomerInput {}

impl TwoStep for DeleteCustomerInput {
    const OP: crate::services::two_step::Op = crate::services::two_step::Op::DeleteCustomer;
}

impl Planned for DeleteCustomerInput {
    async fn plan(self, tx: &mut Tx<'static>, ctx: &OpCtx, at: At) -> Result<Plan> {
        let (input, now) = (self, at.now);
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
            summary: format!("Delete customer {} named {}", c.handle, crate::text::quoted(&c.name)),
            preview: effect(&CustomerWritten {
                customer: views::customer(&c, &ctx.tenant().zone, &ctx.tenant().zone_name, now),
            })?,
            content_hash: content_hash(&CustomerVersion {
                customer: &c.handle,
                version: views::customer_version(&c),
            })?,
            targets: vec![c.handle.clone()],
            apply: Apply::DeleteCustomer { id: c.id },
            messages: Vec::new(),
        })
    }
}

/// A customer after a write.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CustomerWritten {
    pub customer: views::CustomerView,
}

// ------------------------------------------------------------------ what the two-step plans show and hash

/// `send_customer_message`'s preview.
#[derive(Serialize)]
struct MessageEffect<'a> {
    customer: &'a str,
    to: &'a str,
    subject: &'a str,
    body: &'a str,
}

/// A customer at the version planned from, and the message the effect sends.
#[derive(Serialize)]
struct CustomerMessage<'a> {
    customer: &'a str,
    version: String,
    message: &'a Message,
}

/// A customer at the version planned from.
#[derive(Serialize)]
struct CustomerVersion<'a> {
    customer: &'a str,
    version: String,
}
