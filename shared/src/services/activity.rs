//! What agents did, for people: every MCP tool call counted by hour, effect class and outcome,
//! and the latest calls of each connection.
//!
//! Workers count calls in memory ([`Recorder::record`], a lock and a map update) and write
//! them in one batch every few seconds ([`Recorder::flush`]), so no call waits for it. A
//! worker that dies loses at most its last few seconds of counts: these are pictures, not
//! the audit log (which every write still gets in its own transaction, R19). Only tool
//! names, effect classes and outcome codes are kept, never arguments (R14, R23).

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use jiff::Timestamp;

use crate::ctx::OpCtx;
use crate::datastore::{CallRecord, HourCount, RECENT_KEPT, Services};
use crate::effect::EffectClass;
use crate::error::{Error, Result};
use crate::handle::ConnectionHandle;
use crate::rights::Right;

/// Latest calls a worker keeps per connection between two flushes.
const RECENT_PER_FLUSH: usize = 20;

#[derive(Default)]
struct Batch {
    counts: HashMap<(i64, i64, i64, &'static str, &'static str), i64>,
    calls: HashMap<i64, Vec<CallRecord>>,
}

/// A worker's calls not yet written.
#[derive(Default)]
pub struct Recorder {
    batch: Mutex<Batch>,
}

impl Recorder {
    /// Counts one tool call of an MCP connection; `outcome` is `ok` or an error code.
    pub fn record(
        &self,
        ctx: &OpCtx,
        tool: &'static str,
        class: EffectClass,
        outcome: &'static str,
        at: Timestamp,
        duration_ms: f32,
    ) {
        let Some(connection) = ctx.connection() else { return };
        let tenant_id = ctx.tenant_id();
        let hour = at.as_second().div_euclid(3600) * 3600;
        let Ok(mut batch) = self.batch.lock() else { return };
        *batch
            .counts
            .entry((tenant_id, connection.id, hour, class.as_str(), outcome))
            .or_default() += 1;
        let calls = batch.calls.entry(connection.id).or_default();
        if calls.len() == RECENT_PER_FLUSH {
            calls.remove(0);
        }
        calls.push(CallRecord {
            tenant_id,
            connection_id: connection.id,
            at_ms: at.as_millisecond(),
            tool,
            class: class.as_str(),
            outcome,
            duration_ms,
        });
    }

    /// Writes what was counted since the last flush; returns the calls written. On a database
    /// error the batch is put back, to go with the next flush.
    pub async fn flush(&self, ds: &Services) -> Result<i64> {
        let taken = match self.batch.lock() {
            Ok(mut batch) => std::mem::take(&mut *batch),
            Err(_) => return Ok(0),
        };
        if taken.counts.is_empty() {
            return Ok(0);
        }
        let counts: Vec<HourCount> = taken
            .counts
            .iter()
            .map(|(&(tenant_id, connection_id, hour, class, outcome), &calls)| HourCount {
                tenant_id,
                connection_id,
                hour,
                class,
                outcome,
                calls,
            })
            .collect();
        let calls: Vec<CallRecord> = taken.calls.values().flatten().cloned().collect();
        let total = counts.iter().map(|c| c.calls).sum();
        if let Err(e) = ds.job_activity_write(&counts, &calls).await {
            if let Ok(mut batch) = self.batch.lock() {
                for (key, n) in taken.counts {
                    *batch.counts.entry(key).or_default() += n;
                }
            }
            return Err(e);
        }
        Ok(total)
    }
}

/// The span a picture covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    Day,
    Week,
}

impl Span {
    pub fn hours(self) -> i64 {
        match self {
            Span::Day => 24,
            Span::Week => 168,
        }
    }

    /// Hours per bar: a day shows each hour; a week shows quarters of days (28 bars a reader
    /// can tell apart, where 168 hourly ones are slivers).
    pub fn bucket_hours(self) -> i64 {
        match self {
            Span::Day => 1,
            Span::Week => 6,
        }
    }

    /// What one bar counts, in words.
    pub fn per_bar(self) -> &'static str {
        match self {
            Span::Day => "per hour",
            Span::Week => "per 6 hours",
        }
    }

    /// From a query parameter: `week`, anything else the day.
    pub fn parse(raw: Option<&str>) -> Span {
        if raw == Some("week") { Span::Week } else { Span::Day }
    }
}

/// One bar's calls: an hour of a day, a quarter day of a week ([`Span::bucket_hours`]).
#[derive(Debug, Clone)]
pub struct Hour {
    /// Short axis label in the tenant's zone (`14:00`, or `Mon 30` at midnight of a week),
    /// empty where the axis shows none.
    pub short: String,
    /// The bar's time in words: `Tue 1 Dec 14:00–15:00 CET`.
    pub long: String,
    /// Calls per effect class, in the order of [`CLASSES`].
    pub by_class: [u64; 6],
}

/// The effect classes in the order pictures stack them.
pub const CLASSES: [EffectClass; 6] = [
    EffectClass::Read,
    EffectClass::SilentWrite,
    EffectClass::Notify,
    EffectClass::Wake,
    EffectClass::Alert,
    EffectClass::Delete,
];

/// A call that did not succeed, by its outcome code, with what it means for a person.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub code: String,
    pub meaning: &'static str,
    pub calls: u64,
}

/// One of the latest calls.
#[derive(Debug, Clone)]
pub struct RecentCall {
    pub at: String,
    pub tool: String,
    pub class: String,
    pub outcome: String,
    pub duration_ms: f32,
    pub connection: String,
    pub connection_name: String,
}

/// What the console draws for a tenant or one connection.
#[derive(Debug, Clone)]
pub struct Activity {
    pub span: Span,
    pub hours: Vec<Hour>,
    pub calls: u64,
    pub refusals: Vec<Refusal>,
    pub recent: Vec<RecentCall>,
}

/// What an outcome code means, in a few words.
pub fn meaning(code: &str) -> &'static str {
    match code {
        "permission_denied" => "lacks the right",
        "not_in_toolset" => "outside the toolset",
        "turned_off_by_policy" => "turned off by policy",
        "rate_limited" => "rate bucket empty",
        "token_used" | "unknown_token" | "foreign_token" | "token_expired" => {
            "replayed, foreign or expired"
        }
        "summary_mismatch" | "changed_since_preview" => "changed since the preview",
        "conflict" | "duplicate" | "wrong_state" | "count_mismatch" => "conflicts with the data",
        "awaiting_approval" => "awaits a person's approval",
        "action_denied" | "action_rejected" => "denied or rejected",
        "invalid_argument" | "unknown_field" => "invalid arguments",
        "not_found" => "not found",
        "internal" => "server error",
        _ => "other",
    }
}

/// Calls per hour by effect class over the last day or week, the calls that did not succeed
/// by reason, and the latest calls: of the whole tenant, or of one connection (a handle as it
/// came from outside; one that is not this tenant's is not found). Admins only.
pub async fn activity(
    ds: &Services,
    ctx: &OpCtx,
    connection: Option<&str>,
    span: Span,
    now: Timestamp,
) -> Result<Activity> {
    ctx.require(Right::AuditRead)?;
    let connection = match connection {
        Some(raw) => Some(ConnectionHandle::parse("connection", raw).map_err(|_| {
            Error::not_found(
                crate::error::Resource::Connection,
                raw.chars().take(40).collect::<String>(),
            )
        })?),
        None => None,
    };
    let handle = connection.as_ref().map(|c| c.as_str());
    let zone = &ctx.tenant().zone;
    let this_hour = now.as_second().div_euclid(3600) * 3600;
    // Bars of several hours start at local hours divisible by their length (00, 06, 12, 18).
    let bucket = span.bucket_hours() * 3600;
    let local_hour =
        Timestamp::from_second(this_hour).unwrap_or(now).to_zoned_datetime(zone.clone()).hour()
            as i64;
    let this_bar = this_hour - local_hour.rem_euclid(span.bucket_hours()) * 3600;
    let bars = span.hours() / span.bucket_hours();
    let first = this_bar - (bars - 1) * bucket;
    let since = DateTime::<Utc>::from_timestamp(first, 0).unwrap_or_default();
    let rows = ds.activity_hours(ctx, handle, since).await?;
    let mut hours: Vec<Hour> = (0..bars)
        .map(|i| {
            let start = Timestamp::from_second(first + i * bucket).unwrap_or(now);
            let local = start.to_zoned_datetime(zone.clone());
            let end = Timestamp::from_second(first + (i + 1) * bucket)
                .unwrap_or(now)
                .to_zoned_datetime(zone.clone());
            let short = match span {
                Span::Day if local.hour() % 3 == 0 => local.strftime("%H:%M").to_string(),
                Span::Week if local.hour() < 6 => local.strftime("%a %-d").to_string(),
                _ => String::new(),
            };
            Hour {
                short,
                long: format!(
                    "{}–{} {}",
                    local.strftime("%a %-d %b %H:%M"),
                    end.strftime("%H:%M"),
                    local.strftime("%Z")
                ),
                by_class: [0; 6],
            }
        })
        .collect();
    let mut refusals: HashMap<String, u64> = HashMap::new();
    let mut calls = 0;
    for row in rows {
        let index = (row.hour.timestamp() - first).div_euclid(bucket);
        let n = u64::try_from(row.calls).unwrap_or(0);
        calls += n;
        if let (Ok(index), Some(class)) =
            (usize::try_from(index), CLASSES.iter().position(|c| c.as_str() == row.effect_class))
            && let Some(hour) = hours.get_mut(index)
        {
            hour.by_class[class] += n;
        }
        // Previews and questions to the person are steps of a call that went as meant.
        if !matches!(row.outcome.as_str(), "ok" | "previewed" | "input_required") {
            *refusals.entry(row.outcome).or_default() += n;
        }
    }
    let mut refusals: Vec<Refusal> = refusals
        .into_iter()
        .map(|(code, calls)| Refusal { meaning: meaning(&code), code, calls })
        .collect();
    refusals.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| a.code.cmp(&b.code)));
    let recent = ds
        .activity_recent(ctx, handle, if handle.is_some() { RECENT_KEPT } else { 25 })
        .await?
        .into_iter()
        .map(|r| RecentCall {
            at: crate::datastore::to_ts(r.at)
                .to_zoned_datetime(zone.clone())
                .strftime("%a %-d %b %H:%M:%S %Z")
                .to_string(),
            tool: r.tool,
            class: r.effect_class,
            outcome: r.outcome,
            duration_ms: r.duration_ms,
            connection: r.connection_handle,
            connection_name: r.connection_name,
        })
        .collect();
    Ok(Activity { span, hours, calls, refusals, recent })
}
