//! Rate buckets per connection and effect class.
//!
//! Outward and writing classes (silent_write, notify, wake, alert, delete) count in Postgres, in
//! one-minute windows shared by every worker, so a connection cannot multiply its allowance by
//! landing on more workers; a tenant can override each default. Reads are counted per worker in
//! memory: they change nothing, and a database write on every read would double the hot path.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::ctx::OpCtx;
use crate::datastore::Services;
use crate::error::{Error, Result};

/// The default allowance per connection and minute, defined once.
pub fn default_per_minute(class: &str) -> i32 {
    match class {
        "read" => 600,
        "silent_write" => 120,
        "notify" => 30,
        "wake" => 10,
        "alert" => 10,
        "delete" => 20,
        _ => 60,
    }
}

/// Counts one call of `class` for the context's connection in the shared window.
pub async fn take_shared(ds: &Services, ctx: &OpCtx, class: &'static str) -> Result<()> {
    let Some(connection) = ctx.connection() else { return Ok(()) };
    let (count, limit, retry) =
        ds.rate_take(connection.id, ctx.tenant_id(), class, default_per_minute(class)).await?;
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
    windows: Mutex<HashMap<i64, (i64, i32)>>,
}

impl LocalBuckets {
    pub fn take(&self, ctx: &OpCtx, now_secs: i64) -> Result<()> {
        let Some(connection) = ctx.connection() else { return Ok(()) };
        let minute = now_secs.div_euclid(60);
        let limit = default_per_minute("read");
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if windows.len() > 10_000 {
            windows.retain(|_, (m, _)| *m == minute);
        }
        let entry = windows.entry(connection.id).or_insert((minute, 0));
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
