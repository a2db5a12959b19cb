//! Reading technicians.

use schemars::JsonSchema;
use serde::Deserialize;

use crate::ctx::OpCtx;
use crate::datastore::{Services, TechnicianRow};
use crate::error::Result;
use crate::input::lenient_u32;
use crate::rights::Right;
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
