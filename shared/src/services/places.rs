//! Where records are: a customer's region and IANA zone, a technician's region. A tenant's
//! policies read them (`Booking.region`, `Customer.local_time`, `context.technician.region`),
//! so no agent sets them: an agent that could move a customer into a daytime zone or out of a
//! region would switch off the rules written over them. The product's REST API (the tenant's
//! own systems) sets them; a region is kept lowercase, a zone by its canonical IANA name.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ctx::{Channel, OpCtx};
use crate::datastore::{self as db, Services};
use crate::error::{Error, Resource, Result};
use crate::handle::{CustomerHandle, TechnicianHandle};
use crate::rights::Right;
use crate::services::fields::label;
use crate::views;

/// A customer's place. A field left out stays as it is; an empty string removes it.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CustomerPlaceInput {
    /// Customer handle (cus_…).
    pub customer: String,
    /// Where the customer is served (their bookings' region), up to 64 characters.
    #[serde(default)]
    pub region: Option<String>,
    /// The customer's IANA time zone when it is not the tenant's (Europe/Lisbon).
    #[serde(default)]
    pub zone: Option<String>,
}

/// A technician's region. An empty string removes it.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TechnicianRegionInput {
    /// Technician handle (tec_…).
    pub technician: String,
    /// Where the technician works, up to 64 characters.
    pub region: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct CustomerPlaced {
    pub customer: views::CustomerView,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TechnicianPlaced {
    pub technician: views::TechnicianView,
}

/// Agents never set what policies read (see the module's note).
fn not_by_agents(ctx: &OpCtx, field: &str) -> Result<()> {
    if ctx.channel() == Channel::Mcp {
        return Err(Error::invalid(
            field,
            "an agent cannot set what the tenant's policies read; the tenant's systems set it through the REST API",
        ));
    }
    Ok(())
}

/// A region as kept: one line of 1 to 64 characters, lowercase (so `VIP` and `vip` are one
/// region to a policy); `None` for the empty string, which removes it.
fn region(raw: &str) -> Result<Option<String>> {
    if raw.is_empty() {
        return Ok(None);
    }
    // Lowercased first, then measured: some letters grow when lowercased.
    Ok(Some(label("region", &raw.to_lowercase(), 64)?))
}

/// A zone as kept: its canonical IANA name; `None` for the empty string.
fn zone(raw: &str) -> Result<Option<String>> {
    if raw.is_empty() {
        return Ok(None);
    }
    let tz = crate::time::zone("zone", raw)?;
    match tz.iana_name() {
        Some(name) if name != "Etc/Unknown" => Ok(Some(name.to_owned())),
        _ => Err(Error::invalid(
            "zone",
            format!("{raw:?} is not an IANA time zone such as Europe/Berlin"),
        )),
    }
}

pub async fn set_customer_place(
    ds: &Services,
    ctx: &OpCtx,
    input: &CustomerPlaceInput,
    now: jiff::Timestamp,
) -> Result<CustomerPlaced> {
    ctx.require(Right::CustomersWrite)?;
    not_by_agents(ctx, "region")?;
    let handle = CustomerHandle::parse("customer", &input.customer)?;
    let new_region = input.region.as_deref().map(region).transpose()?;
    let new_zone = input.zone.as_deref().map(zone).transpose()?;
    // Setting a place twice is the same as once, so a retry needs no replay cache (and a
    // replayed answer would lose a change set back and forth: north, south, north).
    let mut tx = ds.begin().await?;
    let row = db::customer_lock(&mut tx, ctx, handle.as_str())
        .await?
        .ok_or_else(|| Error::not_found(Resource::Customer, handle.as_str()))?;
    let region = new_region.unwrap_or(row.region.clone());
    let zone = new_zone.unwrap_or(row.zone.clone());
    db::customer_set_place(&mut tx, ctx, row.id, region.as_deref(), zone.as_deref()).await?;
    let mut change = db::change("region", &row.region, &region);
    change["zone"] = serde_json::json!({"from": row.zone, "to": zone});
    let row = db::customer_lock(&mut tx, ctx, handle.as_str())
        .await?
        .ok_or_else(|| Error::not_found(Resource::Customer, handle.as_str()))?;
    let entry = db::AuditEntry {
        change: Some(change),
        ..db::AuditEntry::ok("set_customer_place", vec![row.handle.clone()])
    };
    db::audit_insert(&mut tx, ctx, entry).await?;
    tx.commit().await?;
    let view = views::customer(&row, &ctx.tenant().zone, &ctx.tenant().zone_name, now);
    Ok(CustomerPlaced { customer: view })
}

/// A technician's region: staff data a tenant's policies read, set by whoever may set those
/// policies (`tenant:switch`).
pub async fn set_technician_region(
    ds: &Services,
    ctx: &OpCtx,
    input: &TechnicianRegionInput,
) -> Result<TechnicianPlaced> {
    ctx.require(Right::TenantSwitch)?;
    not_by_agents(ctx, "region")?;
    let handle = TechnicianHandle::parse("technician", &input.technician)?;
    let new_region = region(&input.region)?;
    let mut tx = ds.begin().await?;
    let row = db::technician_lock(&mut tx, ctx, handle.as_str())
        .await?
        .ok_or_else(|| Error::not_found(Resource::Technician, handle.as_str()))?;
    db::technician_set_region(&mut tx, ctx, row.id, new_region.as_deref()).await?;
    let change = db::change("region", &row.region, &new_region);
    let row = db::technician_lock(&mut tx, ctx, handle.as_str())
        .await?
        .ok_or_else(|| Error::not_found(Resource::Technician, handle.as_str()))?;
    let entry = db::AuditEntry {
        change: Some(change),
        ..db::AuditEntry::ok("set_technician_region", vec![row.handle.clone()])
    };
    db::audit_insert(&mut tx, ctx, entry).await?;
    tx.commit().await?;
    Ok(TechnicianPlaced { technician: views::technician(&row) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zone_is_a_known_iana_name_kept_canonical_and_a_region_one_lowercase_line() {
        assert_eq!(zone("europe/lisbon").expect("known"), Some("Europe/Lisbon".to_owned()));
        assert_eq!(zone("").expect("removes"), None);
        for bad in ["Mars/Olympus_Mons", "../../../etc/passwd", "Etc/Unknown", " ", "Europe/"] {
            assert!(zone(bad).is_err(), "{bad:?}");
        }
        assert_eq!(region(" North ").expect("kept"), Some("north".to_owned()));
        assert_eq!(region("").expect("removes"), None);
        for bad in ["  ", "a\u{7}b", "two\nlines", &"x".repeat(65), &"İ".repeat(64)] {
            assert!(region(bad).is_err(), "{bad:?}");
        }
    }
}
