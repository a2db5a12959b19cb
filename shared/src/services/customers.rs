//! Reading customers. Writes (with their duplicate guards) live here too when they arrive.

use schemars::JsonSchema;
use serde::Deserialize;

use crate::ctx::OpCtx;
use crate::datastore::{CustomerRow, Services};
use crate::error::{Error, Resource, Result};
use crate::handle::CustomerHandle;
use crate::input::lenient_u32;
use crate::rights::Right;
use crate::services::{Found, decode_cursor, encode_cursor, limit, nonempty};

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
