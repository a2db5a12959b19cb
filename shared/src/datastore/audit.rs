//! The audit log (R19, R23): written in each write's transaction, read by admins.

use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AuditRow {
    pub at: DateTime<Utc>,
    pub action: String,
    pub outcome: String,
    pub targets: Vec<String>,
}

impl Services {
    /// What one connection did, newest first.
    pub(crate) async fn audit_for_connection(
        &self,
        ctx: &OpCtx,
        connection_id: i64,
        limit: i64,
    ) -> Result<Vec<AuditRow>> {
        Ok(sqlx::query_as::<_, AuditRow>(
            "SELECT at, action, outcome, targets, channel, connection_name, client_name FROM audit_log
             WHERE tenant_id = $1 AND connection_id = $2 ORDER BY at DESC, id DESC LIMIT $3",
        )
        .bind(ctx.tenant_id())
        .bind(connection_id)
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AuditListRow {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub channel: String,
    pub action: String,
    pub outcome: String,
    pub targets: Vec<String>,
    pub connection_handle: Option<String>,
    pub connection_name: Option<String>,
    pub client_name: Option<String>,
    pub reason: Option<String>,
    /// How the person proved themself (passkey, or the session's sign-in).
    pub proof: Option<serde_json::Value>,
    /// The person who acted, when one did.
    pub actor_name: Option<String>,
    pub actor_email: Option<String>,
    pub actor_handle: Option<String>,
    /// Whether that person acted as a platform operator (through `gatehousectl`).
    pub actor_operator: bool,
    /// The person who created the connection that acted, when an agent did.
    pub creator_email: Option<String>,
    /// What a settings change changed: `{field: {from, to}}`.
    pub change: Option<serde_json::Value>,
    /// The policy set behind an agent's decision: `{version, decided_by}`.
    pub policy: Option<serde_json::Value>,
}

/// What an audit search asks for, already checked by the service.
#[derive(Debug, Default, Clone)]
pub struct AuditQuery<'a> {
    pub connection: Option<&'a str>,
    /// A `LIKE` pattern (prefix, escaped).
    pub action_like: Option<String>,
    pub outcome: Option<&'a str>,
    pub channel: Option<&'a str>,
    /// The acting person's email or handle, or the creator of the acting connection.
    pub actor: Option<&'a str>,
    /// A public handle among the row's records (or its connection).
    pub record: Option<&'a str>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    /// The last row of the previous page.
    pub after: Option<(DateTime<Utc>, i64)>,
}

impl Services {
    /// One page of the tenant's audit log, newest first, filtered and paged in SQL (keyset on
    /// time and id, so a page costs the same at the end of a long history).
    pub(crate) async fn audit_search(
        &self,
        ctx: &OpCtx,
        q: &AuditQuery<'_>,
        limit: i64,
    ) -> Result<Vec<AuditListRow>> {
        Ok(sqlx::query_as::<_, AuditListRow>(
            "SELECT a.id, a.at, a.channel, a.action, a.outcome, a.targets, c.handle AS connection_handle,
                    a.connection_name, a.client_name, a.reason, a.proof,
                    ap.name AS actor_name, ap.email AS actor_email, ap.handle AS actor_handle,
                    (coalesce(ap.is_operator, false) AND a.channel = 'cli') AS actor_operator,
                    cp.email AS creator_email, a.change, a.policy
             FROM audit_log a
             LEFT JOIN connections c ON c.id = a.connection_id
             LEFT JOIN people ap ON ap.id = a.actor_id
             LEFT JOIN people cp ON cp.id = c.creator_id
             WHERE a.tenant_id = $1
               AND ($2::text IS NULL OR a.connection_id = (SELECT id FROM connections WHERE tenant_id = $1 AND handle = $2))
               AND ($3::text IS NULL OR a.action LIKE $3 ESCAPE '\\')
               AND ($4::text IS NULL OR a.outcome = $4)
               AND ($5::text IS NULL OR a.channel = $5)
               AND ($6::timestamptz IS NULL OR a.at >= $6)
               AND ($7::timestamptz IS NULL OR a.at < $7)
               AND ($8::timestamptz IS NULL OR (a.at, a.id) < ($8, $9))
               AND ($11::text IS NULL OR lower(ap.email) = lower($11) OR ap.handle = $11
                    OR lower(cp.email) = lower($11) OR cp.handle = $11)
               AND ($12::text IS NULL OR $12 = ANY (a.targets) OR c.handle = $12)
             ORDER BY a.at DESC, a.id DESC LIMIT $10",
        )
        .bind(ctx.tenant_id())
        .bind(q.connection)
        .bind(q.action_like.as_deref())
        .bind(q.outcome)
        .bind(q.channel)
        .bind(q.since)
        .bind(q.until)
        .bind(q.after.map(|(at, _)| at))
        .bind(q.after.map(|(_, id)| id))
        .bind(limit)
        .bind(q.actor)
        .bind(q.record)
        .fetch_all(self.pool())
        .await?)
    }
}

/// One audit entry. Only public ids and names of things, never arguments (R14, R23).
#[derive(Debug, Clone)]
pub struct AuditEntry<'a> {
    pub action: &'a str,
    pub outcome: &'a str,
    pub targets: Vec<String>,
    /// The two-step action this row belongs to.
    pub pending_action: Option<i64>,
    /// Why, when a person says so (switch flips, revocations).
    pub reason: Option<&'a str>,
    /// What a settings change changed, from what to what ([`change`]).
    pub change: Option<serde_json::Value>,
    /// The tenant's policy set behind an agent's decision, `{version, decided_by}`: set only
    /// where a set in force decided (an allowed silent write, a judged two-step step), never on
    /// rows no policy decided (an expired token, a rejection).
    pub policy: Option<serde_json::Value>,
    /// The non-secret facts of an agent's arguments a policy simulation replays (kept apart
    /// from the chained row, in `audit_call_facts`, for 91 days); `None` for every other row.
    pub call_facts: Option<serde_json::Value>,
}

/// One field of a settings change, for [`AuditEntry::change`]: `{field: {from, to}}`.
pub fn change(
    field: &str,
    from: impl serde::Serialize,
    to: impl serde::Serialize,
) -> serde_json::Value {
    serde_json::json!({ field: { "from": from, "to": to } })
}

impl<'a> AuditEntry<'a> {
    pub(crate) fn ok(action: &'a str, targets: Vec<String>) -> Self {
        AuditEntry {
            action,
            outcome: "ok",
            targets,
            pending_action: None,
            reason: None,
            change: None,
            policy: None,
            call_facts: None,
        }
    }
}

/// Writes one audit row from the context: channel, actor, connection and client name come from
/// the entry point (R19), never from the caller's arguments. A row about a pending action
/// written outside a connection (a person approving it in the console) names the connection
/// that asked for the action, so the agent's `list_recent_changes` shows what was done for it.
///
/// The same statement keeps an agent call's argument facts ($16, for policy simulation) beside
/// the row when there are any: one round trip either way.
pub(crate) const AUDIT_INSERT_SQL: &str = "WITH row AS (
         INSERT INTO audit_log (tenant_id, channel, actor_id, connection_id, connection_name,
                                client_name, action, outcome, targets, request_id, pending_action_id, reason, proof, change, policy)
         SELECT $1, $2, $3, coalesce($4, c.id), coalesce($5, c.name), coalesce($6, c.client_name),
                $7, $8, $9, $10, $11, $12, $13, $14, $15
         FROM (SELECT 1) one
         LEFT JOIN pending_actions p ON $4::bigint IS NULL AND p.id = $11
         LEFT JOIN connections c ON c.id = p.connection_id
         RETURNING id, tenant_id)
     INSERT INTO audit_call_facts (audit_id, tenant_id, facts)
     SELECT row.id, row.tenant_id, $16::jsonb FROM row WHERE $16::jsonb IS NOT NULL";

pub(crate) async fn audit_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    entry: AuditEntry<'_>,
) -> Result<()> {
    let connection = ctx.connection();
    sqlx::query(AUDIT_INSERT_SQL)
        .bind(ctx.tenant_id())
        .bind(ctx.channel().as_str())
        .bind(ctx.actor_person_id())
        .bind(connection.map(|c| c.id))
        .bind(connection.map(|c| c.name.as_str()))
        .bind(connection.map(|c| c.client_name.as_str()))
        .bind(entry.action)
        .bind(entry.outcome)
        .bind(&entry.targets)
        .bind(ctx.request_id())
        .bind(entry.pending_action)
        .bind(entry.reason)
        .bind(ctx.proof().map(|p| p.audit_json()))
        .bind(entry.change)
        .bind(entry.policy)
        .bind(entry.call_facts)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// An audit row of the platform (no tenant): operator grants and the like, with who did it.
pub(crate) async fn platform_audit_insert(
    tx: &mut Tx<'_>,
    channel: &str,
    actor_id: Option<i64>,
    action: &str,
    target: &str,
) -> Result<()> {
    sqlx::query("INSERT INTO audit_log (tenant_id, channel, actor_id, action, outcome, targets) VALUES (NULL, $1, $2, $3, 'ok', ARRAY[$4])")
        .bind(channel)
        .bind(actor_id)
        .bind(action)
        .bind(target)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
