//! The `small` toolset (R21): three combined tools for small models. Each answers in a few
//! compact lines with the handles a next call needs, and calls the same services as the
//! full tools.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use shared::rights::Right;
use shared::services::bookings::{self, FindBookingsInput, GetBookingInput};
use shared::services::customers::{self, FindCustomersInput};
use shared::services::technicians::{self, FindTechniciansInput};
use shared::time::TimeView;
use shared::views;

use super::{Access, Def, EffectClass, Env, Ref, RefKind, Shape, ToolSpec, tool};

pub const NAMES: &[&str] = &["booking_brief", "day_schedule", "lookup"];

/// Find customers and technicians by one search text.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LookupInput {
    /// Part of a name, email or phone.
    pub query: String,
}

#[derive(Serialize, JsonSchema)]
pub struct Named {
    /// Handle (cus_… or tec_…).
    pub handle: String,
    pub name: String,
}

#[derive(Serialize, JsonSchema)]
pub struct LookupOut {
    pub customers: Vec<Named>,
    pub technicians: Vec<Named>,
}

/// The bookings of one local day.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DayScheduleInput {
    /// The day, e.g. 2026-12-01.
    pub date: String,
    /// IANA zone; the tenant's zone when absent.
    #[serde(default)]
    pub zone: Option<String>,
}

#[derive(Serialize, JsonSchema)]
pub struct Line {
    pub booking: String,
    /// When it starts: weekday, local time with zone, UTC and distance from now (R17).
    pub at: TimeView,
    pub status: String,
    pub customer: String,
    pub technician: Option<String>,
}

#[derive(Serialize, JsonSchema)]
pub struct DayOut {
    pub date: String,
    pub zone: String,
    pub bookings: Vec<Line>,
    /// True when the day has more than the 20 bookings shown.
    pub more: bool,
}

/// One booking in a few fields.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BookingBriefInput {
    /// Booking handle (bkg_…).
    pub booking: String,
}

#[derive(Serialize, JsonSchema)]
pub struct Brief {
    pub booking: String,
    pub version: String,
    pub status: String,
    /// When it starts: weekday, local time with zone, UTC and distance from now (R17).
    pub at: TimeView,
    pub customer: String,
    pub technician: Option<String>,
    pub service: String,
    pub total: String,
}

pub fn tools() -> Vec<ToolSpec> {
    vec![
        tool(
            Def {
                name: "lookup",
                title: "Look up",
                description: "Customers and technicians whose name, email or phone contains the text: at most five of each, with handles.",
                class: EffectClass::Read,
                access: Access::Right(Right::CustomersRead),
                refs: &[],
                untrusted: &[],
            },
            async |env: Env, input: LookupInput| {
                let found = customers::find(
                    &env.ds,
                    &env.ctx,
                    &FindCustomersInput {
                        query: Some(input.query.clone()),
                        limit: Some(5),
                        cursor: None,
                    },
                )
                .await?;
                let techs = if env.ctx.rights().contains(Right::TechniciansRead) {
                    technicians::find(
                        &env.ds,
                        &env.ctx,
                        &FindTechniciansInput {
                            query: Some(input.query),
                            limit: Some(5),
                            ..Default::default()
                        },
                    )
                    .await?
                } else {
                    Vec::new()
                };
                Ok(LookupOut {
                    customers: found
                        .items
                        .into_iter()
                        .map(|c| Named { handle: c.handle, name: c.name })
                        .collect(),
                    technicians: techs
                        .into_iter()
                        .map(|t| Named { handle: t.handle, name: t.name })
                        .collect(),
                })
            },
        ),
        tool(
            Def {
                name: "day_schedule",
                title: "Day schedule",
                description: "The bookings of one local day, one line each: handle, time, status, customer, technician.",
                class: EffectClass::Read,
                access: Access::Right(Right::BookingsRead),
                refs: &[],
                untrusted: &[],
            },
            async |env: Env, input: DayScheduleInput| {
                let zone = input.zone.clone().unwrap_or_else(|| env.ctx.tenant().zone_name.clone());
                let found = bookings::find(
                    &env.ds,
                    &env.ctx,
                    &FindBookingsInput {
                        from: Some(input.date.clone()),
                        to: Some(input.date.clone()),
                        zone: Some(zone.clone()),
                        limit: Some(20),
                        ..Default::default()
                    },
                )
                .await
                // The day is this tool's `date`, whatever the search calls its bounds.
                .map_err(|e| match e {
                    shared::Error::Invalid { field, problem, options }
                        if field == "from" || field == "to" =>
                    {
                        shared::Error::Invalid { field: "date".into(), problem, options }
                    }
                    other => other,
                })?;
                let lines = found
                    .items
                    .iter()
                    .map(|b| {
                        let v = views::booking(b, false, env.now);
                        Line {
                            booking: v.booking,
                            at: v.starts,
                            status: v.status,
                            customer: v.customer.name,
                            technician: v.technician.map(|t| t.name),
                        }
                    })
                    .collect();
                Ok(DayOut {
                    date: input.date,
                    zone,
                    bookings: lines,
                    more: found.next_cursor.is_some(),
                })
            },
        ),
        tool(
            Def {
                name: "booking_brief",
                title: "Booking brief",
                description: "One booking in a few fields: status, time, customer, technician, service, total and version.",
                class: EffectClass::Read,
                access: Access::Right(Right::BookingsRead),
                refs: &[Ref { field: "booking", kind: RefKind::Booking, shape: Shape::Single }],
                untrusted: &[],
            },
            async |env: Env, input: BookingBriefInput| {
                let row = bookings::get(
                    &env.ds,
                    &env.ctx,
                    &GetBookingInput { booking: input.booking, notes_cursor: None },
                )
                .await?;
                let v = views::booking(&row, false, env.now);
                Ok(Brief {
                    booking: v.booking,
                    version: v.version,
                    status: v.status,
                    at: v.starts,
                    customer: v.customer.name,
                    technician: v.technician.map(|t| t.name),
                    service: v.service.name,
                    total: v.price.total.display,
                })
            },
        )
        .reads_ahead(|input: &BookingBriefInput| {
            bookings::read_ahead(&GetBookingInput {
                booking: input.booking.clone(),
                notes_cursor: None,
            })
        }),
    ]
}
