//! Rate buckets per connection and effect class.
//!
//! Outward and writing classes (silent_write, notify, wake, alert, delete) count in Postgres, in
//! one-minute windows shared by every worker, so a connection cannot multiply its allowance by
//! landing on more workers. Reads are counted per worker in memory: they change nothing, and a
//! database write on every read would double the hot path. A tenant can override every class,
//! reads included (the read override arrives with the connection context, in the same
//! statement); operators and tenant admins set overrides with `gatehousectl rate-limit` and in
//! the console, audited.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::Serialize;

use crate::ctx::OpCtx;
use crate::datastore::{self as db, AuditEntry, Services};
use crate::error::{Error, Result};
use crate::rights::Right;

/// The classes with a bucket, in the order they are shown.
pub const CLASSES: &[&str] = &["read", "silent_write", "notify", "wake", "alert", "delete"];
/// The largest allowance an operator may set.
pub const MAX_PER_MINUTE: i32 = 1_000_000;
/// How far above a class's default a tenant admin may raise it; beyond that the platform's
/// capacity is at stake, and an operator decides.
pub const TENANT_CEILING_FACTOR: i32 = 10;

pub use crate::effect::default_per_minute;

/// Counts one call of `class` for the context's connection in the shared window.
pub async fn take_shared(ds: &Services, ctx: &OpCtx, class: &'static str) -> Result<()> {
    let Some(connection) = ctx.connection() else { return Ok(()) };
    let (count, limit, retry) =
        ds.rate_take(ctx, connection.id, class, default_per_minute(class)).await?;
    if count > limit {
        return Err(Error::RateLimited {
            class,
            limit,
            retry_after_secs: retry.ceil().max(1.0) as u32,
        });
    }
    Ok(())
}

/// Per-worker fixed windows for reads.
#[derive(Default)]
pub struct LocalBuckets {
    windows: Mutex<Windows>,
}

/// The read windows of one worker, and the minute they were last pruned in.
#[derive(Default)]
struct Windows {
    by_connection: HashMap<i64, (i64, i32)>,
    pruned: i64,
}

impl LocalBuckets {
    /// Counts one read against `limit` (the tenant's override or the default).
    pub fn take(&self, ctx: &OpCtx, limit: i32, now_secs: i64) -> Result<()> {
        let Some(connection) = ctx.connection() else { return Ok(()) };
        let minute = now_secs.div_euclid(60);
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        // Windows of past minutes are dropped once a minute, not on every call: with many
        // connections a sweep per call would make every read pay for all of them.
        if windows.pruned != minute {
            windows.by_connection.retain(|_, (m, _)| *m == minute);
            windows.pruned = minute;
        }
        let entry = windows.by_connection.entry(connection.id).or_insert((minute, 0));
        if entry.0 != minute {
            *entry = (minute, 0);
        }
        entry.1 += 1;
        if entry.1 > limit {
            return Err(Error::RateLimited {
                class: "read",
                limit,
                retry_after_secs: (60 - now_secs.rem_euclid(60)).max(1) as u32,
            });
        }
        Ok(())
    }
}

/// One class's allowance in a tenant.
#[derive(Debug, Serialize)]
pub struct Limit {
    pub class: &'static str,
    pub per_minute: i32,
    pub default: i32,
    /// Whether the tenant set its own.
    pub overridden: bool,
    /// Where it is counted: `per_worker` (reads) or `shared` (everything else).
    pub counted: &'static str,
}

/// The tenant's allowance per connection and minute for every class.
pub async fn limits(ds: &Services, ctx: &OpCtx) -> Result<Vec<Limit>> {
    ctx.require(Right::TenantSwitch)?;
    let overrides = ds.rate_overrides(ctx).await?;
    Ok(CLASSES
        .iter()
        .map(|class| {
            let set = overrides.iter().find(|(c, _)| c == class).map(|(_, n)| *n);
            Limit {
                class,
                per_minute: set.unwrap_or_else(|| default_per_minute(class)),
                default: default_per_minute(class),
                overridden: set.is_some(),
                counted: if *class == "read" { "per_worker" } else { "shared" },
            }
        })
        .collect())
}

/// The decision setting a class's allowance is when it raises it (`None` when it keeps or
/// lowers it).
pub(crate) async fn limit_decision(
    ds: &Services,
    ctx: &OpCtx,
    class: &str,
    per_minute: Option<i32>,
) -> Result<Option<crate::services::passkeys::Decision>> {
    let now = ds
        .rate_overrides(ctx)
        .await?
        .iter()
        .find(|(c, _)| c == class)
        .map(|(_, n)| *n)
        .unwrap_or_else(|| default_per_minute(class));
    let will = per_minute.unwrap_or_else(|| default_per_minute(class));
    Ok((will > now)
        .then(|| crate::services::passkeys::Decision::raise_rate_limit(class, per_minute)))
}

/// Sets a class's allowance for the tenant (`None`: back to the default), audited. Holds from
/// the next call on every worker (read with the context, or in the shared window's statement).
pub async fn set_limit(
    ds: &Services,
    ctx: &OpCtx,
    class: &str,
    per_minute: Option<i32>,
) -> Result<Limit> {
    ctx.require(Right::TenantSwitch)?;
    let class = CLASSES.iter().copied().find(|c| *c == class).ok_or_else(|| {
        Error::invalid_with_options(
            "class",
            format!("{:?} has no bucket", class.chars().take(40).collect::<String>()),
            CLASSES.iter().map(|c| (*c).to_owned()).collect(),
        )
    })?;
    if per_minute.is_some_and(|n| !(1..=MAX_PER_MINUTE).contains(&n)) {
        return Err(Error::invalid(
            "per_minute",
            format!("give 1 to {MAX_PER_MINUTE} calls per minute, or `default`"),
        ));
    }
    let ceiling = default_per_minute(class) * TENANT_CEILING_FACTOR;
    if !ctx.is_operator() && per_minute.is_some_and(|n| n > ceiling) {
        return Err(Error::invalid(
            "per_minute",
            format!(
                "a tenant admin may set {class} up to {ceiling} calls per minute; beyond that a platform operator sets it (gatehousectl rate-limit set)"
            ),
        ));
    }
    let raise = limit_decision(ds, ctx, class, per_minute).await?;
    let was = limits(ds, ctx).await?.into_iter().find(|l| l.class == class).map(|l| l.per_minute);
    let mut tx = ds.begin().await?;
    if let Some(decision) = raise {
        crate::services::passkeys::require(&mut tx, ctx, &decision).await?;
    }
    db::rate_override_put(&mut tx, ctx, class, per_minute).await?;
    let reason = match per_minute {
        Some(n) => format!("{class}: {n} per minute"),
        None => format!("{class}: default ({})", default_per_minute(class)),
    };
    let mut entry = AuditEntry::ok("rate_limit.set", vec![class.to_owned()]);
    entry.reason = Some(&reason);
    entry.change = Some(db::change(
        "per_minute",
        was,
        per_minute.unwrap_or_else(|| default_per_minute(class)),
    ));
    db::audit_insert(&mut tx, ctx, entry).await?;
    tx.commit().await?;
    Ok(Limit {
        class,
        per_minute: per_minute.unwrap_or_else(|| default_per_minute(class)),
        default: default_per_minute(class),
        overridden: per_minute.is_some(),
        counted: if class == "read" { "per_worker" } else { "shared" },
    })
}
