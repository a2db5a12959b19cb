//! Testkit: Connections, bookings, pending actions, tasks and the worker's state.
//!
//! Named fixtures and probes for what no service offers a test (aging a row, tampering, reading
//! what only the database shows); raw SQL of tests lives here, never in a test.

use super::TestDb;

/// Asserts `name` is a plain SQL identifier (a role name built into DDL, which binds nothing).
fn plain_identifier(name: &str) -> &str {
    let ok = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    assert!(ok, "not a plain identifier: {name:?}");
    name
}

// ---------------------------------------------------------------- what the write tools change

impl TestDb {
    /// A fingerprint of everything the write tools can change (customers, bookings, notes, the
    /// outbox, pending actions, replays and mutes): equal twice when no tool wrote in between.
    pub async fn fingerprint_of_writes(&self) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT concat_ws('|',
    (SELECT count(*) FROM customers), (SELECT max(updated_at) FROM customers),
    (SELECT count(*) FROM bookings), (SELECT max(updated_at) FROM bookings),
    (SELECT string_agg(status, ',' ORDER BY id) FROM bookings),
    (SELECT count(*) FROM booking_notes), (SELECT count(*) FROM outbox),
    (SELECT count(*) FROM pending_actions), (SELECT count(*) FROM replay_entries),
    (SELECT string_agg(coalesce(muted_until::text, '-'), ',' ORDER BY id) FROM alert_rules))",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("a fingerprint of writes")
    }

    /// Every booking's handle and last change, in booking order: equal twice when no booking
    /// changed in between.
    pub async fn booking_versions(&self) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT string_agg(handle || updated_at::text, ',' ORDER BY id) FROM bookings",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("booking versions")
    }

    /// Puts `decoy` in the secret columns (customers' portal passwords, technicians' home
    /// addresses, people's password hashes) and as a refresh token of every connection (`decoy`
    /// followed by the connection's id).
    pub async fn plant_decoy_secrets(&self, decoy: &str) {
        for sql in [
            "UPDATE customers SET portal_password_hash = $1",
            "UPDATE technicians SET home_address = $1",
            "UPDATE people SET password_hash = $1",
            "INSERT INTO connection_tokens (connection_id, kind, token_hash) \
             SELECT id, 'refresh', convert_to($1::text || id, 'UTF8') FROM connections",
        ] {
            sqlx::query(sql).bind(decoy).execute(self.ds.pool()).await.expect("a planted decoy");
        }
    }
}

// ---------------------------------------------------------------- bookings and their notes

impl TestDb {
    /// The handle of the oldest booking of the first tenant that has bookings.
    pub async fn first_tenants_oldest_booking(&self) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT b.handle FROM bookings b JOIN tenants t ON t.id = b.tenant_id \
             ORDER BY t.id, b.id LIMIT 1",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("a booking")
    }

    /// The handle of the oldest customer of the first tenant that has customers.
    pub async fn first_tenants_oldest_customer(&self) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT c.handle FROM customers c JOIN tenants t ON t.id = c.tenant_id \
             ORDER BY t.id, c.id LIMIT 1",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("a customer")
    }

    /// The handle of tenant `slug`'s oldest booking in `status`.
    pub async fn oldest_booking_with_status(&self, slug: &str, status: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT b.handle FROM bookings b JOIN tenants t ON t.id = b.tenant_id \
             WHERE t.slug = $1 AND b.status = $2 ORDER BY b.id LIMIT 1",
        )
        .bind(slug)
        .bind(status)
        .fetch_one(self.ds.pool())
        .await
        .unwrap_or_else(|_| panic!("a {status} booking of {slug}"))
    }

    /// The handle of tenant `slug`'s booking starting soonest between now plus `from` and now
    /// plus `to` (intervals such as `"1 hour"`).
    pub async fn next_booking_starting_between(&self, slug: &str, from: &str, to: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT b.handle FROM bookings b JOIN tenants t ON t.id = b.tenant_id \
             WHERE t.slug = $1 AND b.starts_at BETWEEN now() + $2::interval AND now() + $3::interval \
             ORDER BY b.starts_at LIMIT 1",
        )
        .bind(slug)
        .bind(from)
        .bind(to)
        .fetch_one(self.ds.pool())
        .await
        .unwrap_or_else(|_| panic!("a booking of {slug} starting in {from} to {to}"))
    }

    /// The handle of tenant `slug`'s booking starting soonest later than now plus `after`.
    pub async fn next_booking_starting_after(&self, slug: &str, after: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT b.handle FROM bookings b JOIN tenants t ON t.id = b.tenant_id \
             WHERE t.slug = $1 AND b.starts_at > now() + $2::interval \
             ORDER BY b.starts_at LIMIT 1",
        )
        .bind(slug)
        .bind(after)
        .fetch_one(self.ds.pool())
        .await
        .unwrap_or_else(|_| panic!("a booking of {slug} starting after {after}"))
    }

    /// How many bookings with handle `handle` start at `at` (a timestamp such as
    /// `2027-04-20T08:00:00Z`): 1 once it was moved there.
    pub async fn bookings_starting_at(&self, handle: &str, at: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM bookings WHERE handle = $1 AND starts_at = $2::timestamptz",
        )
        .bind(handle)
        .bind(at)
        .fetch_one(self.ds.pool())
        .await
        .expect("a count of bookings")
    }

    /// How many bookings whose handle matches the `LIKE` pattern `handles` start before `before`
    /// (a timestamp), counting only those in `status` and those whose handle sorts at or before
    /// `up_to` when given.
    pub async fn bookings_starting_before(
        &self,
        handles: &str,
        before: &str,
        status: Option<&str>,
        up_to: Option<&str>,
    ) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM bookings WHERE handle LIKE $1 AND starts_at < $2::timestamptz \
             AND ($3::text IS NULL OR status = $3::text) AND ($4::text IS NULL OR handle <= $4::text)",
        )
        .bind(handles)
        .bind(before)
        .bind(status)
        .bind(up_to)
        .fetch_one(self.ds.pool())
        .await
        .expect("a count of bookings")
    }

    /// Cancels, behind the services' back, every booking whose handle sorts at or before `last`.
    pub async fn cancel_bookings_with_handles_up_to(&self, last: &str) {
        sqlx::query("UPDATE bookings SET status = 'cancelled' WHERE handle <= $1")
            .bind(last)
            .execute(self.ds.pool())
            .await
            .expect("cancelled bookings");
    }

    /// Cancels, behind the services' back, the `n` draft bookings with the highest handles
    /// matching the `LIKE` pattern `handles`.
    pub async fn cancel_latest_drafts(&self, handles: &str, n: i64) {
        sqlx::query(
            "UPDATE bookings SET status = 'cancelled' WHERE handle IN \
             (SELECT handle FROM bookings WHERE handle LIKE $1 AND status = 'draft' \
              ORDER BY handle DESC LIMIT $2)",
        )
        .bind(handles)
        .bind(n)
        .execute(self.ds.pool())
        .await
        .expect("cancelled drafts");
    }

    /// `count` customer notes on booking `handle` (`bnt_bulk…`, 200-odd characters each), one
    /// a second apart from now on: a booking with a long history.
    pub async fn pile_notes_on_booking(&self, handle: &str, count: i64) {
        sqlx::query(
            "INSERT INTO booking_notes (tenant_id, handle, booking_id, source, body, created_at)
             SELECT b.tenant_id, 'bnt_bulk' || lpad(i::text, 12, '0'), b.id, 'customer',
                    'Note ' || i || ' ' || repeat('x', 200), now() + make_interval(secs => i)
             FROM bookings b, generate_series(1, $2::int) i WHERE b.handle = $1",
        )
        .bind(handle)
        .bind(count)
        .execute(self.ds.pool())
        .await
        .expect("piled notes");
    }

    /// Skewed, bloated data for the planner: `notes_each` customer notes (`bnt_skew…`) on each of
    /// the bookings `hot`, every fifth booking row rewritten, and every seventh of those notes
    /// deleted.
    pub async fn skew_notes_and_bloat_bookings(&self, hot: &[&str], notes_each: i64) {
        let hot: Vec<String> = hot.iter().map(|h| (*h).to_owned()).collect();
        sqlx::query(
            "INSERT INTO booking_notes (tenant_id, handle, booking_id, source, body)
             SELECT b.tenant_id, 'bnt_skew' || b.id || '_' || g, b.id, 'customer', 'note ' || g
             FROM bookings b, generate_series(1, $2::int) g
             WHERE b.handle = ANY($1)",
        )
        .bind(hot)
        .bind(notes_each)
        .execute(self.ds.pool())
        .await
        .expect("skewed notes");
        sqlx::query("UPDATE bookings SET net_minor = net_minor WHERE id % 5 = 0")
            .execute(self.ds.pool())
            .await
            .expect("rewritten bookings");
        sqlx::query("DELETE FROM booking_notes WHERE handle LIKE 'bnt_skew%' AND id % 7 = 0")
            .execute(self.ds.pool())
            .await
            .expect("deleted notes");
    }

    /// Holds an exclusive lock on the bookings for `secs` seconds, as a migration would; returns
    /// once it has let go.
    pub async fn lock_bookings_for(&self, secs: u32) {
        let mut tx = self.ds.pool().begin().await.expect("begin");
        sqlx::query("LOCK TABLE bookings IN ACCESS EXCLUSIVE MODE")
            .execute(&mut *tx)
            .await
            .expect("lock the bookings");
        sqlx::query("SELECT pg_sleep($1)")
            .bind(f64::from(secs))
            .execute(&mut *tx)
            .await
            .expect("hold the lock");
        tx.commit().await.expect("let go of the bookings");
    }

    /// Whether some session holds a granted exclusive lock on a table named `bookings`.
    pub async fn bookings_lock_granted(&self) -> bool {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
             WHERE c.relname = 'bookings' AND l.mode = 'AccessExclusiveLock' AND l.granted",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("locks")
            > 0
    }
}

// ---------------------------------------------------------------- customers and alerts

impl TestDb {
    /// How many customers have email `email`, whatever its case.
    pub async fn customers_with_email_any_case(&self, email: &str) -> i64 {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM customers WHERE lower(email) = $1")
            .bind(email)
            .fetch_one(self.ds.pool())
            .await
            .expect("a count of customers")
    }

    /// How many customers with email `email` (whatever its case) were kept separate with a
    /// reason.
    pub async fn customers_kept_separate_with_email(&self, email: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM customers WHERE lower(email) = $1 AND separate_reason IS NOT NULL",
        )
        .bind(email)
        .fetch_one(self.ds.pool())
        .await
        .expect("a count of customers")
    }

    /// How many customers have a phone number whose digits (and `+`) are `digits`.
    pub async fn customers_with_phone_digits(&self, digits: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM customers \
             WHERE regexp_replace(coalesce(phone, ''), '[^0-9+]', '', 'g') = $1",
        )
        .bind(digits)
        .fetch_one(self.ds.pool())
        .await
        .expect("a count of customers")
    }

    /// When alert rule `handle` is muted until, in UTC to the second (`2027-01-01T10:00:00Z`).
    pub async fn alert_rule_muted_until_utc(&self, handle: &str) -> String {
        sqlx::query_scalar::<_, String>(
            r#"SELECT to_char(muted_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') FROM alert_rules WHERE handle = $1"#,
        )
        .bind(handle)
        .fetch_one(self.ds.pool())
        .await
        .expect("a muted rule")
    }
}

// ---------------------------------------------------------------- pending actions and tasks

impl TestDb {
    /// Moves pending action `handle`'s preview back by `by` (`"6 minutes"`), as if the person
    /// had taken that long to answer.
    pub async fn age_pending_action(&self, handle: &str, by: &str) {
        sqlx::query(
            "UPDATE pending_actions SET created_at = created_at - $2::interval WHERE handle = $1",
        )
        .bind(handle)
        .bind(by)
        .execute(self.ds.pool())
        .await
        .expect("an aged action");
    }

    /// Task `handle`'s status and message, as `status: message` (the message empty when none).
    pub async fn task_outcome(&self, handle: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT status || ': ' || coalesce(status_message, '') FROM tasks WHERE handle = $1",
        )
        .bind(handle)
        .fetch_one(self.ds.pool())
        .await
        .expect("a task")
    }

    /// Leaves task `handle` as a worker that died mid-run does: working, no result, its last
    /// heartbeat `ago` old (`"31 seconds"`).
    pub async fn strand_task(&self, handle: &str, ago: &str) {
        sqlx::query(
            "UPDATE tasks SET status = 'working', result = NULL, heartbeat_at = now() - $2::interval \
             WHERE handle = $1",
        )
        .bind(handle)
        .bind(ago)
        .execute(self.ds.pool())
        .await
        .expect("a stranded task");
    }
}

// ---------------------------------------------------------------- connections and switches

impl TestDb {
    /// Makes the creator of connection `handle` an active (`true`) or a former (`false`) member
    /// of the connection's tenant, behind the console's back.
    pub async fn set_connection_creator_membership(&self, handle: &str, active: bool) {
        sqlx::query(
            "UPDATE memberships SET active = $2 \
             WHERE person_id = (SELECT creator_id FROM connections WHERE handle = $1) \
               AND tenant_id = (SELECT tenant_id FROM connections WHERE handle = $1)",
        )
        .bind(handle)
        .bind(active)
        .execute(self.ds.pool())
        .await
        .expect("a membership");
    }

    /// Makes the creator of the oldest connection a viewer wherever they are an admin, behind
    /// the console's back (no event announces it).
    pub async fn make_first_connection_creator_a_viewer(&self) {
        sqlx::query(
            "UPDATE memberships SET role = 'viewer' WHERE role = 'admin' \
             AND person_id = (SELECT creator_id FROM connections ORDER BY id LIMIT 1)",
        )
        .execute(self.ds.pool())
        .await
        .expect("a demoted creator");
    }

    /// The handle of the person who created tenant `slug`'s oldest connection.
    pub async fn first_connection_creator(&self, slug: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT p.handle FROM connections c JOIN people p ON p.id = c.creator_id \
             JOIN tenants t ON t.id = c.tenant_id WHERE t.slug = $1 ORDER BY c.id LIMIT 1",
        )
        .bind(slug)
        .fetch_one(self.ds.pool())
        .await
        .expect("a connection's creator")
    }

    /// Stores access token `token` of connection `connection` for resource `audience`, expiring
    /// `lifetime` from now (`"1 hour"`; `"-1 second"` is already expired), by its SHA-256 as the
    /// authorization server stores one.
    pub async fn store_access_token(
        &self,
        connection: &str,
        token: &str,
        audience: &str,
        lifetime: &str,
    ) {
        sqlx::query(
            "INSERT INTO connection_tokens (connection_id, kind, token_hash, audience, expires_at) \
             SELECT id, 'access', sha256(convert_to($2, 'UTF8')), $3, now() + $4::interval \
             FROM connections WHERE handle = $1",
        )
        .bind(connection)
        .bind(token)
        .bind(audience)
        .bind(lifetime)
        .execute(self.ds.pool())
        .await
        .expect("an access token");
    }

    /// Sets tenant `slug`'s bucket of effect class `class` to `per_minute` calls, as a row no
    /// operator command wrote.
    pub async fn insert_tenant_rate_limit(&self, slug: &str, class: &str, per_minute: i32) {
        sqlx::query(
            "INSERT INTO tenant_rate_limits (tenant_id, class, per_minute) \
             SELECT id, $2, $3 FROM tenants WHERE slug = $1",
        )
        .bind(slug)
        .bind(class)
        .bind(per_minute)
        .execute(self.ds.pool())
        .await
        .expect("a rate limit");
    }
}

// ---------------------------------------------------------------- the worker's counts

impl TestDb {
    /// The call counts flushed for connection `handle`, as (effect class, outcome, calls) rows
    /// in outcome order.
    pub async fn call_activity_of(&self, handle: &str) -> Vec<(String, String, i64)> {
        sqlx::query_as::<_, (String, String, i64)>(
            "SELECT a.effect_class, a.outcome, a.calls FROM call_activity a \
             JOIN connections c ON c.id = a.connection_id WHERE c.handle = $1 ORDER BY a.outcome",
        )
        .bind(handle)
        .fetch_all(self.ds.pool())
        .await
        .expect("call activity")
    }

    /// Every recent call kept for connection `handle`, each row as text, joined by spaces.
    pub async fn recent_calls_text(&self, handle: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT string_agg(r::text, ' ') FROM recent_calls r \
             JOIN connections c ON c.id = r.connection_id WHERE c.handle = $1",
        )
        .bind(handle)
        .fetch_one(self.ds.pool())
        .await
        .expect("recent calls")
    }
}

// ---------------------------------------------------------------- the audit of agents' calls

impl TestDb {
    /// The policy decision (set version and deciding policies, as JSON text) of the newest audit
    /// row of `action` with `outcome`; `none` when there is no such row or it records none.
    pub async fn latest_audited_policy(&self, action: &str, outcome: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT coalesce((SELECT policy::text FROM audit_log \
             WHERE action = $1 AND outcome = $2 ORDER BY id DESC LIMIT 1), 'none')",
        )
        .bind(action)
        .bind(outcome)
        .fetch_one(self.ds.pool())
        .await
        .expect("an audited policy")
    }

    /// Audit rows of `action` in tenants with no policy set in force: how many, and how many of
    /// them record a policy decision.
    pub async fn audited_in_tenants_without_policies(&self, action: &str) -> (i64, i64) {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT count(*), count(a.policy) FROM audit_log a JOIN tenants t ON t.id = a.tenant_id \
             WHERE t.policy_version = 0 AND a.action = $1",
        )
        .bind(action)
        .fetch_one(self.ds.pool())
        .await
        .expect("audit rows")
    }

    /// How many audit rows of `action` name exactly `targets`, in that order.
    pub async fn audited_with_targets(&self, action: &str, targets: &[&str]) -> i64 {
        let targets: Vec<String> = targets.iter().map(|t| (*t).to_owned()).collect();
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM audit_log WHERE action = $1 AND targets = $2",
        )
        .bind(action)
        .bind(targets)
        .fetch_one(self.ds.pool())
        .await
        .expect("audit rows")
    }

    /// How many audited calls kept an argument `key`, or kept `fragment` anywhere in their facts.
    pub async fn call_facts_with_key_or_text(&self, key: &str, fragment: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM audit_call_facts \
             WHERE facts ? $1 OR facts::text LIKE '%' || $2 || '%'",
        )
        .bind(key)
        .bind(fragment)
        .fetch_one(self.ds.pool())
        .await
        .expect("call facts")
    }

    /// How many audited calls kept the whole number `value` as argument `key`.
    pub async fn call_facts_with_number(&self, key: &str, value: i64) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM audit_call_facts WHERE (facts->>$1)::int = $2",
        )
        .bind(key)
        .bind(value)
        .fetch_one(self.ds.pool())
        .await
        .expect("call facts")
    }
}

// ---------------------------------------------------------------- the database server itself

impl TestDb {
    /// A login role `role` of at most `limit` connections that acts as the database's owner
    /// (a member of the current user).
    pub async fn create_role_with_connection_limit(&self, role: &str, limit: u32) {
        let role = plain_identifier(role);
        let owner = self.scalar_string("SELECT current_user::text").await;
        self.exec(&format!(
            "CREATE ROLE {role} LOGIN CONNECTION LIMIT {limit}; GRANT {owner} TO {role}"
        ))
        .await;
    }

    /// Closes every session of login role `role` but the worker's pipe (and this one's), as a
    /// backend that went away would.
    pub async fn close_sessions_of_role_but_the_pipe(&self, role: &str) {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename::text = $1 \
             AND application_name <> 'gatehouse-pipe' AND pid <> pg_backend_pid()",
        )
        .bind(role)
        .execute(self.ds.pool())
        .await
        .expect("closed sessions");
    }

    /// Whether a psql session of this database holds lock `mode` (`AccessExclusiveLock`) on
    /// table `table`.
    pub async fn psql_holds_table_lock(&self, table: &str, mode: &str) -> bool {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE a.datname = current_database() AND a.application_name = 'psql' \
             AND l.mode = $2 AND l.relation = $1::regclass",
        )
        .bind(table)
        .bind(mode)
        .fetch_one(self.ds.pool())
        .await
        .expect("locks")
            > 0
    }

    /// Whether a psql session of this database holds its transaction's id: it has written in
    /// a transaction still open.
    pub async fn psql_has_written(&self) -> bool {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE a.datname = current_database() AND a.application_name = 'psql' \
             AND l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock'",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("locks")
            > 0
    }
}
