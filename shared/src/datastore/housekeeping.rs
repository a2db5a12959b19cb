//! Dropping what outlived its use.

use crate::datastore::*;
use crate::error::Result;

impl Services {
    /// Drops what has outlived its use: rate windows older than an hour, replay entries older
    /// than a day (the replay window is minutes), expired console sessions, sign-in failures
    /// older than a day, consent requests, registrations never used for a day, expired authorization codes and tokens expired for a day. Returns the
    /// rows removed.
    pub(crate) async fn job_housekeeping(&self) -> Result<u64> {
        let mut removed = 0;
        for sql in [
            "DELETE FROM rate_windows WHERE window_start < now() - interval '1 hour'",
            "DELETE FROM replay_entries WHERE created_at < now() - interval '1 day'",
            // Budget ledger rows past the longest window (30 days) count for nothing.
            "DELETE FROM budget_usage WHERE at < now() - interval '31 days'",
            "DELETE FROM console_sessions WHERE expires_at < now()",
            "DELETE FROM login_throttle WHERE window_start < now() - interval '1 day'",
            "DELETE FROM oauth_requests WHERE expires_at < now() - interval '1 hour'",
            // Dynamic registrations that never led to a connection expire after a day.
            "DELETE FROM oauth_clients c WHERE c.kind = 'registered' AND c.created_at < now() - interval '1 day'
               AND NOT EXISTS (SELECT 1 FROM connections x WHERE x.oauth_client_id = c.client_id)",
            "DELETE FROM oauth_codes WHERE expires_at < now() - interval '1 hour'",
            "DELETE FROM oauth_client_assertions WHERE expires_at < now() - interval '1 hour'",
            "DELETE FROM idp_jtis WHERE expires_at < now() - interval '1 hour'",
            "DELETE FROM sso_sign_ins WHERE expires_at < now() - interval '1 hour'",
            "DELETE FROM webauthn_ceremonies WHERE expires_at < now() - interval '1 hour'",
            // Expired access and refresh tokens (a used refresh token is kept until it expires,
            // to detect reuse).
            "DELETE FROM connection_tokens WHERE expires_at < now() - interval '1 day'",
            // Tasks past their TTL go with their results (the TTL each task announced).
            "DELETE FROM tasks WHERE expires_at < now()",
            // A working task whose worker stopped heartbeating fails (tasks/get does the same
            // for the task it reads), so no task stays working forever.
            "UPDATE tasks SET status = 'failed', status_message = NULL, updated_at = now(),
                    error = '{\"code\": -32603, \"message\": \"The worker running this task stopped; call the tool again.\"}'
             WHERE status = 'working' AND heartbeat_at < now() - interval '60 seconds'",
            // A simulation replays 90 days at most.
            "DELETE FROM audit_call_facts WHERE at < now() - interval '91 days'",
            // The console pictures go back a week.
            "DELETE FROM call_activity WHERE hour < now() - interval '8 days'",
            // An action that waited for a person and expired undecided: one audit row, once.
            "WITH gone AS (
                 UPDATE pending_actions SET expiry_audited_at = now()
                 WHERE status = 'pending' AND completion = 'person_approves'
                   AND expires_at <= now() AND expiry_audited_at IS NULL
                 RETURNING id, tenant_id, connection_id, tool)
             INSERT INTO audit_log (tenant_id, channel, connection_id, connection_name, client_name,
                                    action, outcome, targets, pending_action_id, reason)
             SELECT g.tenant_id, 'system', g.connection_id, c.name, c.client_name, g.tool, 'failed',
                    ARRAY[]::text[], g.id, 'expired while waiting for a person; nothing was done'
             FROM gone g JOIN connections c ON c.id = g.connection_id",
        ] {
            removed += sqlx::query(sql).execute(self.pool()).await?.rows_affected();
        }
        Ok(removed)
    }
}
