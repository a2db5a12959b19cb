//! Call activity: hourly counts and the latest calls per connection, written in batches by the
//! workers, read by the console's pictures.

use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

/// Calls of one connection in one hour, effect class and outcome.
#[derive(Debug, Clone)]
pub struct HourCount {
    pub tenant_id: i64,
    pub connection_id: i64,
    /// The hour's start, Unix seconds.
    pub hour: i64,
    pub class: &'static str,
    pub outcome: &'static str,
    pub calls: i64,
}

/// One call as the console lists it.
#[derive(Debug, Clone)]
pub struct CallRecord {
    pub tenant_id: i64,
    pub connection_id: i64,
    /// Unix milliseconds.
    pub at_ms: i64,
    pub tool: &'static str,
    pub class: &'static str,
    pub outcome: &'static str,
    pub duration_ms: f32,
}

/// Latest calls kept per connection.
pub const RECENT_KEPT: i64 = 50;

impl Services {
    /// Adds a batch of counts and calls: one statement each, then trims every touched
    /// connection's latest calls to [`RECENT_KEPT`].
    pub(crate) async fn job_activity_write(
        &self,
        counts: &[HourCount],
        calls: &[CallRecord],
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        if !counts.is_empty() {
            sqlx::query(
                "INSERT INTO call_activity (tenant_id, connection_id, hour, effect_class, outcome, calls)
                 SELECT t, c, to_timestamp(h), k, o, n
                 FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::bigint[]) AS u(t, c, h, k, o, n)
                 WHERE EXISTS (SELECT 1 FROM connections x WHERE x.id = u.c)
                 ON CONFLICT (connection_id, hour, effect_class, outcome)
                 DO UPDATE SET calls = call_activity.calls + EXCLUDED.calls",
            )
            .bind(counts.iter().map(|c| c.tenant_id).collect::<Vec<_>>())
            .bind(counts.iter().map(|c| c.connection_id).collect::<Vec<_>>())
            .bind(counts.iter().map(|c| c.hour).collect::<Vec<_>>())
            .bind(counts.iter().map(|c| c.class).collect::<Vec<_>>())
            .bind(counts.iter().map(|c| c.outcome).collect::<Vec<_>>())
            .bind(counts.iter().map(|c| c.calls).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await?;
        }
        if !calls.is_empty() {
            sqlx::query(
                "INSERT INTO recent_calls (tenant_id, connection_id, at, tool, effect_class, outcome, duration_ms)
                 SELECT t, c, to_timestamp(a / 1000.0), tool, k, o, d
                 FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::real[]) AS u(t, c, a, tool, k, o, d)
                 WHERE EXISTS (SELECT 1 FROM connections x WHERE x.id = u.c)",
            )
            .bind(calls.iter().map(|c| c.tenant_id).collect::<Vec<_>>())
            .bind(calls.iter().map(|c| c.connection_id).collect::<Vec<_>>())
            .bind(calls.iter().map(|c| c.at_ms).collect::<Vec<_>>())
            .bind(calls.iter().map(|c| c.tool).collect::<Vec<_>>())
            .bind(calls.iter().map(|c| c.class).collect::<Vec<_>>())
            .bind(calls.iter().map(|c| c.outcome).collect::<Vec<_>>())
            .bind(calls.iter().map(|c| c.duration_ms).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await?;
            let mut touched: Vec<i64> = calls.iter().map(|c| c.connection_id).collect();
            touched.sort_unstable();
            touched.dedup();
            sqlx::query(
                "DELETE FROM recent_calls WHERE id IN (
                   SELECT r.id FROM unnest($1::bigint[]) AS t(c)
                   CROSS JOIN LATERAL (SELECT id FROM recent_calls WHERE connection_id = t.c
                                       ORDER BY at DESC, id DESC OFFSET $2) r)",
            )
            .bind(&touched)
            .bind(RECENT_KEPT)
            .execute(&mut *tx)
            .await?;
            // Each connection's last tool call, at most once a minute: stamped here rather
            // than by the context statement, so a call's read stays a plain select. A row
            // another flush or a revocation holds is skipped, never waited for (no deadlock
            // between workers flushing overlapping connections), and the lock taken does not
            // block the inserts that reference the connection (rate windows, audit rows).
            sqlx::query(
                "UPDATE connections c SET last_used_at = greatest(c.last_used_at, u.at)
                 FROM (SELECT x.c, to_timestamp(max(x.a) / 1000.0) AS at
                       FROM UNNEST($1::bigint[], $2::bigint[]) AS x(c, a) GROUP BY x.c) u
                 WHERE c.id = u.c AND c.id IN (
                     SELECT id FROM connections WHERE id = ANY($3)
                       AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')
                     ORDER BY id FOR NO KEY UPDATE SKIP LOCKED)",
            )
            .bind(calls.iter().map(|c| c.connection_id).collect::<Vec<_>>())
            .bind(calls.iter().map(|c| c.at_ms).collect::<Vec<_>>())
            .bind(&touched)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ActivityHourRow {
    pub hour: DateTime<Utc>,
    pub effect_class: String,
    pub outcome: String,
    pub calls: i64,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RecentCallRow {
    pub at: DateTime<Utc>,
    pub tool: String,
    pub effect_class: String,
    pub outcome: String,
    pub duration_ms: f32,
    pub connection_handle: String,
    pub connection_name: String,
}

impl Services {
    /// Hourly counts since `since` of the tenant, or of one of its connections.
    pub(crate) async fn activity_hours(
        &self,
        ctx: &OpCtx,
        connection: Option<&str>,
        since: DateTime<Utc>,
    ) -> Result<Vec<ActivityHourRow>> {
        Ok(sqlx::query_as::<_, ActivityHourRow>(
            "SELECT hour, effect_class, outcome, sum(calls)::bigint AS calls FROM call_activity
             WHERE tenant_id = $1 AND hour >= $3
               AND ($2::text IS NULL OR connection_id = (SELECT id FROM connections WHERE tenant_id = $1 AND handle = $2))
             GROUP BY hour, effect_class, outcome ORDER BY hour",
        )
        .bind(ctx.tenant_id())
        .bind(connection)
        .bind(since)
        .fetch_all(self.pool())
        .await?)
    }

    /// The latest calls of the tenant, or of one of its connections, newest first.
    pub(crate) async fn activity_recent(
        &self,
        ctx: &OpCtx,
        connection: Option<&str>,
        limit: i64,
    ) -> Result<Vec<RecentCallRow>> {
        Ok(sqlx::query_as::<_, RecentCallRow>(
            "SELECT r.at, r.tool, r.effect_class, r.outcome, r.duration_ms,
                    c.handle AS connection_handle, c.name AS connection_name
             FROM recent_calls r JOIN connections c ON c.id = r.connection_id
             WHERE r.tenant_id = $1 AND ($2::text IS NULL OR c.handle = $2)
             ORDER BY r.at DESC, r.id DESC LIMIT $3",
        )
        .bind(ctx.tenant_id())
        .bind(connection)
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }
}
