//! Testkit: Tenants, their settings, members and budgets, and the registry's fixtures.
//!
//! Named fixtures and probes for what no service offers a test (aging a row, tampering, reading
//! what only the database shows); raw SQL of tests lives here, never in a test.

use super::TestDb;

// ---------------------------------------------------------------- tenants, members, settings

impl TestDb {
    /// The role person `email` (any case) holds in tenant `slug`, and whether that membership
    /// is active.
    pub async fn membership_in(&self, slug: &str, email: &str) -> (String, bool) {
        sqlx::query_as::<_, (String, bool)>(
            "SELECT m.role, m.active FROM memberships m JOIN people p ON p.id = m.person_id \
             JOIN tenants t ON t.id = m.tenant_id WHERE t.slug = $1 AND lower(p.email) = lower($2)",
        )
        .bind(slug)
        .bind(email)
        .fetch_one(self.ds.pool())
        .await
        .expect("a membership")
    }

    /// The handle of the person whose email is `email` (any case).
    pub async fn handle_of_person_with_email(&self, email: &str) -> String {
        sqlx::query_scalar::<_, String>("SELECT handle FROM people WHERE lower(email) = lower($1)")
            .bind(email)
            .fetch_one(self.ds.pool())
            .await
            .expect("a person")
    }

    /// Gives tenant `slug` a SIEM webhook that has been failing for two hours with
    /// `last_error`, as no delivery a test can wait for would.
    pub async fn siem_webhook_failing(&self, slug: &str, last_error: &str) {
        sqlx::query(
            "INSERT INTO audit_webhooks (tenant_id, url, secret_sealed, delivered_seq, failing_since, last_error)
             SELECT id, 'https://siem.example/in', 'x', 0, now() - interval '2 hours', $2
             FROM tenants WHERE slug = $1",
        )
        .bind(slug)
        .bind(last_error)
        .execute(self.ds.pool())
        .await
        .expect("a failing webhook");
    }

    /// An `ok` audit row of `action` on the API channel of tenant `slug`, written at `local`
    /// (`2026-11-10 00:10:00`) on the tenant's own clock, as if it happened then.
    pub async fn audit_row_at_local_time(&self, slug: &str, local: &str, action: &str) {
        sqlx::query(
            "INSERT INTO audit_log (tenant_id, at, channel, action, outcome)
             SELECT t.id, ($2::text::timestamp AT TIME ZONE t.zone), 'api', $3, 'ok'
             FROM tenants t WHERE t.slug = $1",
        )
        .bind(slug)
        .bind(local)
        .bind(action)
        .execute(self.ds.pool())
        .await
        .expect("an audit row");
    }

    /// Connection `handle`'s rights (space-separated, in their order), name and toolset,
    /// joined by `|`: `bookings:read|Narrow|read_only`.
    pub async fn connection_rights_name_toolset(&self, handle: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT array_to_string(rights, ' ') || '|' || name || '|' || toolset \
             FROM connections WHERE handle = $1",
        )
        .bind(handle)
        .fetch_one(self.ds.pool())
        .await
        .expect("a connection")
    }

    /// What the (first) audit row of `action` that names `target` says changed, as JSON text.
    pub async fn audit_change_naming(&self, action: &str, target: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT change::text FROM audit_log WHERE action = $1 AND $2 = ANY(targets)",
        )
        .bind(action)
        .bind(target)
        .fetch_one(self.ds.pool())
        .await
        .expect("an audit row with its change")
    }

    /// An agent's `send_customer_message` action `handle` that connection `connection`
    /// prepared eleven minutes ago for a person to approve, and that expired a minute ago with
    /// nobody deciding (the worker prepares these; the control plane's suites run without it).
    pub async fn action_expired_while_waiting(
        &self,
        connection: &str,
        handle: &str,
        summary: &str,
    ) {
        sqlx::query(
            "INSERT INTO pending_actions (tenant_id, handle, connection_id, tool, args, args_digest, content_hash,
                                          summary, token_hash, expires_at, completion, created_at)
             SELECT c.tenant_id, $2, c.id, 'send_customer_message', '{}', 'd', 'h',
                    $3, '\\x01', now() - interval '1 minute', 'person_approves',
                    now() - interval '11 minutes'
             FROM connections c WHERE c.handle = $1",
        )
        .bind(connection)
        .bind(handle)
        .bind(summary)
        .execute(self.ds.pool())
        .await
        .expect("an expired action");
    }

    /// How many system audit rows say pending action `handle` expired while waiting.
    pub async fn expiries_audited_for_action(&self, handle: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM audit_log a JOIN pending_actions p ON p.id = a.pending_action_id \
             WHERE p.handle = $1 AND a.channel = 'system' AND a.reason LIKE 'expired while waiting%'",
        )
        .bind(handle)
        .fetch_one(self.ds.pool())
        .await
        .expect("a count")
    }

    /// Sixty sent emails of tenant `slug`, `Reminder 00` to `Reminder 59` to `c0@example.com`
    /// and on (every tenth failed), and one `Reminder elsewhere` of tenant `other_slug`: enough
    /// messages to page through.
    pub async fn reminder_emails_for_paging(&self, slug: &str, other_slug: &str) {
        sqlx::query(
            "INSERT INTO outbox (tenant_id, channel, recipient, subject, body, idempotency_key, status)
             SELECT t.id, 'email', 'c' || i || '@example.com', 'Reminder ' || lpad(i::text, 2, '0'),
                    'b', 'paging-' || i, CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'sent' END
             FROM tenants t, generate_series(0, 59) i WHERE t.slug = $1",
        )
        .bind(slug)
        .execute(self.ds.pool())
        .await
        .expect("reminders");
        sqlx::query(
            "INSERT INTO outbox (tenant_id, channel, recipient, subject, body, idempotency_key)
             SELECT id, 'email', 'x@example.com', 'Reminder elsewhere', 'b', 'paging-other'
             FROM tenants WHERE slug = $1",
        )
        .bind(other_slug)
        .execute(self.ds.pool())
        .await
        .expect("a reminder elsewhere");
    }

    /// How many budgets there are, and the sum of their limits.
    pub async fn budgets_count_and_total(&self) -> (i64, i64) {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT count(*), coalesce(sum(limit_units), 0)::bigint FROM budgets",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("budgets")
    }
}

// ---------------------------------------------------------------- the registry's fixtures

impl TestDb {
    /// Handles of tenant `slug`'s future bookings in `status` whose customer has an email, in
    /// handle order.
    pub async fn future_bookings_of_customers_with_email(
        &self,
        slug: &str,
        status: &str,
    ) -> Vec<String> {
        sqlx::query_scalar::<_, String>(
            "SELECT b.handle FROM bookings b JOIN tenants t ON t.id = b.tenant_id AND t.slug = $1 \
             JOIN customers c ON c.id = b.customer_id \
             WHERE b.status = $2 AND b.starts_at > now() AND c.email IS NOT NULL ORDER BY b.handle",
        )
        .bind(slug)
        .bind(status)
        .fetch_all(self.ds.pool())
        .await
        .expect("bookings")
    }

    /// Handles of tenant `slug`'s bookings with a customer note and a note someone other than
    /// staff wrote, in handle order.
    pub async fn bookings_with_third_party_notes(&self, slug: &str) -> Vec<String> {
        sqlx::query_scalar::<_, String>(
            "SELECT b.handle FROM bookings b JOIN tenants t ON t.id = b.tenant_id AND t.slug = $1 \
             WHERE b.customer_note IS NOT NULL \
             AND EXISTS (SELECT 1 FROM booking_notes n WHERE n.booking_id = b.id AND n.source <> 'staff') \
             ORDER BY b.handle",
        )
        .bind(slug)
        .fetch_all(self.ds.pool())
        .await
        .expect("bookings")
    }

    /// A customer of tenant `slug` with an email and at least one booking.
    pub async fn customer_with_email_and_bookings(&self, slug: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT c.handle FROM customers c JOIN tenants t ON t.id = c.tenant_id AND t.slug = $1 \
             WHERE c.email IS NOT NULL AND EXISTS (SELECT 1 FROM bookings b WHERE b.customer_id = c.id) \
             LIMIT 1",
        )
        .bind(slug)
        .fetch_one(self.ds.pool())
        .await
        .expect("a customer with email and bookings")
    }

    /// A fingerprint of everything any tool can change, per tenant and in total: customers,
    /// bookings, notes, the outbox, the audit, pending actions and alert state.
    pub async fn everything_tools_can_change(&self) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT concat_ws('|',
    (SELECT string_agg(handle || ':' || name || ':' || coalesce(email, '') || ':' || updated_at::text, ',' ORDER BY id) FROM customers),
    (SELECT string_agg(handle || ':' || status || ':' || starts_at::text || ':' || coalesce(technician_id::text, '') || ':' || coalesce(reference, '') || ':' || updated_at::text, ',' ORDER BY id) FROM bookings),
    (SELECT count(*) FROM booking_notes), (SELECT count(*) FROM outbox), (SELECT count(*) FROM audit_log),
    (SELECT string_agg(status, ',' ORDER BY id) FROM pending_actions),
    (SELECT string_agg(coalesce(muted_until::text, '-'), ',' ORDER BY id) FROM alert_rules))",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("a fingerprint")
    }

    /// Lifts every rate class of every tenant to 100,000,000 calls a minute, above any ceiling
    /// an operator may set, so hundreds of calls in a test meet no bucket.
    pub async fn lift_every_rate_limit(&self) {
        sqlx::query(
            "INSERT INTO tenant_rate_limits (tenant_id, class, per_minute) \
             SELECT t.id, c, 100000000 FROM tenants t, \
             unnest(ARRAY['read', 'silent_write', 'notify', 'wake', 'alert', 'delete']) c",
        )
        .execute(self.ds.pool())
        .await
        .expect("lifted rate limits");
    }

    /// The id of the newest audit row, 0 with none: a mark to read the rows added after it.
    pub async fn newest_audit_id(&self) -> i64 {
        sqlx::query_scalar::<_, i64>("SELECT coalesce(max(id), 0) FROM audit_log")
            .fetch_one(self.ds.pool())
            .await
            .expect("an audit id")
    }

    /// The audit rows after id `since`, oldest first, as (action, outcome, channel, connection
    /// name or `-`, client name or `-`).
    pub async fn audit_rows_after(
        &self,
        since: i64,
    ) -> Vec<(String, String, String, String, String)> {
        sqlx::query_as::<_, (String, String, String, String, String)>(
            "SELECT action, outcome, channel, coalesce(connection_name, '-'), coalesce(client_name, '-') \
             FROM audit_log WHERE id > $1 ORDER BY id",
        )
        .bind(since)
        .fetch_all(self.ds.pool())
        .await
        .expect("audit rows")
    }

    /// Every alert rule's muted-until time (`-` when not muted), in rule order, joined by `,`.
    pub async fn alert_mute_states(&self) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT string_agg(coalesce(muted_until::text, '-'), ',' ORDER BY id) FROM alert_rules",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("alert rules")
    }

    /// A fingerprint of the records tools write: every customer's handle and version, every
    /// booking's handle, status and version, and how many booking notes there are.
    pub async fn record_versions(&self) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT concat_ws('|', \
             (SELECT string_agg(handle || updated_at::text, ',' ORDER BY id) FROM customers), \
             (SELECT string_agg(handle || status || updated_at::text, ',' ORDER BY id) FROM bookings), \
             (SELECT count(*) FROM booking_notes))",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("records")
    }

    /// Whom the outbox holds messages to for pending action `handle`.
    pub async fn recipients_of_action(&self, handle: &str) -> Vec<String> {
        sqlx::query_scalar::<_, String>(
            "SELECT recipient FROM outbox \
             WHERE pending_action_id = (SELECT id FROM pending_actions WHERE handle = $1)",
        )
        .bind(handle)
        .fetch_all(self.ds.pool())
        .await
        .expect("recipients")
    }

    /// Takes `right` from connection `handle` behind the services' back, as a narrowing that
    /// lands between two calls.
    pub async fn connection_right_removed(&self, handle: &str, right: &str) {
        sqlx::query("UPDATE connections SET rights = array_remove(rights, $2) WHERE handle = $1")
            .bind(handle)
            .bind(right)
            .execute(self.ds.pool())
            .await
            .expect("a narrowed connection");
    }

    /// Gives `right` back to connection `handle` (appended to its rights).
    pub async fn connection_right_appended(&self, handle: &str, right: &str) {
        sqlx::query("UPDATE connections SET rights = array_append(rights, $2) WHERE handle = $1")
            .bind(handle)
            .bind(right)
            .execute(self.ds.pool())
            .await
            .expect("a widened connection");
    }

    /// Changes booking `handle`'s reference (and version), as another user would between an
    /// agent's preview and its confirmation.
    pub async fn booking_edited_elsewhere(&self, handle: &str) {
        sqlx::query(
            "UPDATE bookings SET reference = 'edited', updated_at = now() WHERE handle = $1",
        )
        .bind(handle)
        .execute(self.ds.pool())
        .await
        .expect("an edited booking");
    }

    /// Renames customer `handle` (`… (edited)`, a new version), as another user would between
    /// an agent's preview and its confirmation.
    pub async fn customer_edited_elsewhere(&self, handle: &str) {
        sqlx::query(
            "UPDATE customers SET name = name || ' (edited)', updated_at = now() WHERE handle = $1",
        )
        .bind(handle)
        .execute(self.ds.pool())
        .await
        .expect("an edited customer");
    }

    /// The budget ledger of pending action `handle`, its counted rows or its reservations, as
    /// `kind=amount` in kind order joined by `,` (empty with none).
    pub async fn budget_ledger_of_action(&self, handle: &str, counted: bool) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT coalesce(string_agg(kind || '=' || amount, ',' ORDER BY kind), '') FROM budget_usage \
             WHERE counted = $2 AND pending_action_id = (SELECT id FROM pending_actions WHERE handle = $1)",
        )
        .bind(handle)
        .bind(counted)
        .fetch_one(self.ds.pool())
        .await
        .expect("a ledger")
    }

    /// Puts `canary` in every third-party text of every tenant: each booking's customer note,
    /// and a customer, an external and an agent note on each booking.
    pub async fn canary_in_third_party_text(&self, canary: &str) {
        sqlx::query("UPDATE bookings SET customer_note = $1::text || ' (note)'")
            .bind(canary)
            .execute(self.ds.pool())
            .await
            .expect("customer notes");
        sqlx::query(
            "INSERT INTO booking_notes (tenant_id, booking_id, handle, source, body)
             SELECT b.tenant_id, b.id, 'bnt_' || substr(md5(b.handle || s), 1, 16), s,
                    $1::text || ' (' || s || ')'
             FROM bookings b CROSS JOIN (VALUES ('customer'), ('external'), ('agent')) v(s)",
        )
        .bind(canary)
        .execute(self.ds.pool())
        .await
        .expect("third-party notes");
    }

    /// Puts `decoy` in every secret column: customers' portal passwords, technicians' home
    /// addresses, people's password hashes, a refresh token of every connection and a console
    /// session of every person (the last two as `decoy` followed by the row's id).
    pub async fn decoy_in_secret_columns(&self, decoy: &str) {
        for sql in [
            "UPDATE customers SET portal_password_hash = $1",
            "UPDATE technicians SET home_address = $1",
            "UPDATE people SET password_hash = $1",
            "INSERT INTO connection_tokens (connection_id, kind, token_hash) \
             SELECT id, 'refresh', convert_to($1::text || id, 'UTF8') FROM connections",
            "INSERT INTO console_sessions (token_hash, person_id, csrf_token, expires_at) \
             SELECT convert_to($1::text || id, 'UTF8'), id, $1::text || id, now() + interval '1 hour' \
             FROM people",
        ] {
            sqlx::query(sql).bind(decoy).execute(self.ds.pool()).await.expect("a decoy");
        }
    }

    /// Every audit row's action, outcome, targets and reason, as one text to search.
    pub async fn audit_log_as_text(&self) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT coalesce(string_agg(concat_ws(' ', action, outcome, array_to_string(targets, ','), reason), ' '), '') \
             FROM audit_log",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("the audit")
    }

    /// A refresh token `token` of connection `handle`, stored by its SHA-256 as the
    /// authorization server stores one.
    pub async fn refresh_token_of_connection(&self, handle: &str, token: &str) {
        sqlx::query(
            "INSERT INTO connection_tokens (connection_id, kind, token_hash) \
             SELECT id, 'refresh', sha256(convert_to($2, 'UTF8')) FROM connections WHERE handle = $1",
        )
        .bind(handle)
        .bind(token)
        .execute(self.ds.pool())
        .await
        .expect("a refresh token");
    }

    /// A console session `token` of some person, valid for an hour, stored by its SHA-256.
    pub async fn console_session_of_someone(&self, token: &str) {
        sqlx::query(
            "INSERT INTO console_sessions (token_hash, person_id, csrf_token, expires_at) \
             SELECT sha256(convert_to($1, 'UTF8')), id, 'x', now() + interval '1 hour' FROM people LIMIT 1",
        )
        .bind(token)
        .execute(self.ds.pool())
        .await
        .expect("a console session");
    }
}
