//! Technicians: searched by name or skill, and paged as a two-step `wake` operation (R7).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ctx::OpCtx;
use crate::datastore::{self as db, Services, TechnicianRow, Tx};
use crate::error::{Error, Resource, Result};
use crate::handle::TechnicianHandle;
use crate::input::lenient_u32;
use crate::rights::Right;
use crate::services::two_step::{
    Apply, At, Lines, Message, Plan, Planned, TwoStep, booking, content_hash, effect, text,
};
use crate::services::{limit, nonempty};

/// Find technicians by name or skill.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindTechniciansInput {
    /// Part of the name.
    #[serde(default)]
    pub query: Option<String>,
    /// A skill the technician must have, e.g. "heating".
    #[serde(default)]
    pub skill: Option<String>,
    /// Include technicians who no longer take bookings (default false).
    #[serde(default)]
    pub include_inactive: bool,
    /// At most this many, 1 to 100 (default 25).
    #[serde(default, deserialize_with = "lenient_u32")]
    #[schemars(with = "Option<u32>")]
    pub limit: Option<u32>,
}

pub async fn find(
    ds: &Services,
    ctx: &OpCtx,
    input: &FindTechniciansInput,
) -> Result<Vec<TechnicianRow>> {
    ctx.require(Right::TechniciansRead)?;
    let limit = limit(input.limit)?;
    ds.technician_find(
        ctx,
        nonempty(&input.query),
        nonempty(&input.skill),
        input.include_inactive,
        limit,
    )
    .await
}

// ------------------------------------------------------------------ two-step operations (R7)

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

impl crate::services::two_step::private::Sealed for PageTechnicianInput {}

impl TwoStep for PageTechnicianInput {
    const OP: crate::services::two_step::Op = crate::services::two_step::Op::PageTechnician;
}

impl Planned for PageTechnicianInput {
    async fn plan(self, tx: &mut Tx<'static>, ctx: &OpCtx, at: At) -> Result<Plan> {
        let (input, _now) = (self, at.now);
        let h = TechnicianHandle::parse("technician", &input.technician)?;
        let message = text("message", &input.message, 300, Lines::One)?;
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
            summary: format!(
                "Page {phone} (technician {}, {}) with the message {}",
                crate::text::quoted(&t.name),
                t.handle,
                crate::text::quoted(&message)
            ),
            preview: effect(&PageEffect {
                technician: &t.handle,
                phone: &phone,
                message: &message,
                booking: about.as_deref(),
            })?,
            content_hash: content_hash(&PageContent {
                technician: &t.handle,
                message: &msg,
                booking: about.as_deref(),
            })?,
            targets: std::iter::once(t.handle.clone()).chain(about).collect(),
            apply: Apply::Nothing,
            messages: vec![msg],
        })
    }
}

/// `page_technician`'s preview.
#[derive(Serialize)]
struct PageEffect<'a> {
    technician: &'a str,
    phone: &'a str,
    message: &'a str,
    booking: Option<&'a str>,
}

/// `page_technician`'s content: the page and the booking it is about.
#[derive(Serialize)]
struct PageContent<'a> {
    technician: &'a str,
    message: &'a Message,
    booking: Option<&'a str>,
}
