//! Testkit: what end-to-end tests read and arrange in a running stack's database (approvals,
//! the fleet, identity, tasks), through [`TestDb::attach`].
//!
//! Named fixtures and probes for what no service offers a test; raw SQL of tests lives here,
//! never in a test.

use std::io::Write as _;
use std::process::{Command, Stdio};

use super::TestDb;

/// Runs `sql` through `psql` at `url` and returns what it printed, trimmed. Each of `vars` is
/// set as a psql variable that the statement names as `:'name'` (psql quotes it as a literal),
/// so no value is spliced into the statement.
fn psql_value(url: &str, vars: &[(&str, &str)], sql: &'static str) -> String {
    let mut command = Command::new("psql");
    command.arg(url).args(["-X", "-Atq", "-v", "ON_ERROR_STOP=1"]);
    for (name, value) in vars {
        command.arg("-v").arg(format!("{name}={value}"));
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql");
    child
        .stdin
        .take()
        .expect("psql's input")
        .write_all(sql.as_bytes())
        .expect("a statement for psql");
    let out = child.wait_with_output().expect("psql");
    assert!(out.status.success(), "psql: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

// ---------------------------------------------------------------- connections Postgres holds
//
// Read through psql from the server's `postgres` database, with no pool of the testkit open:
// a test that counts connections counts only the stack's.

impl TestDb {
    /// How many connections the workers (their pools and pipes) hold to database `database` of
    /// the server at `server`, as Postgres counts them.
    pub fn worker_connections_held(server: &str, database: &str) -> i64 {
        psql_value(
            &format!("{server}/postgres"),
            &[("database", database)],
            "SELECT count(*) FROM pg_stat_activity WHERE datname = :'database' \
             AND application_name IN ('gatehouse-worker', 'gatehouse-pipe')",
        )
        .parse()
        .expect("a count")
    }

    /// How many connections Postgres holds to database `database` of the server at `server`,
    /// whoever holds them.
    pub fn connections_postgres_holds_for(server: &str, database: &str) -> i64 {
        psql_value(
            &format!("{server}/postgres"),
            &[("database", database)],
            "SELECT count(*) FROM pg_stat_activity WHERE datname = :'database'",
        )
        .parse()
        .expect("a count")
    }

    /// How many connections Postgres holds for `database` logged in as `role`.
    pub fn connections_postgres_holds_for_role(server: &str, database: &str, role: &str) -> i64 {
        psql_value(
            &format!("{server}/postgres"),
            &[("database", database), ("role", role)],
            "SELECT count(*) FROM pg_stat_activity WHERE datname = :'database' AND usename = :'role'",
        )
        .parse()
        .expect("a count")
    }

    /// Closes the testkit's connections to the stack's database, before the test counts the
    /// connections the stack holds.
    pub async fn detach(self) {
        self.ds.pool().close().await;
    }
}

// ---------------------------------------------------------------- approvals and the outbox

impl TestDb {
    /// The handle of a technician of tenant `slug` who has a phone number (any one).
    pub async fn technician_with_phone(&self, slug: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT x.handle FROM technicians x JOIN tenants t ON t.id = x.tenant_id \
             WHERE t.slug = $1 AND x.phone IS NOT NULL LIMIT 1",
        )
        .bind(slug)
        .fetch_one(self.ds.pool())
        .await
        .expect("a technician with a phone")
    }

    /// How many messages of the outbox have subject `subject` and a body that does not
    /// mention `fragment`.
    pub async fn messages_with_subject_not_mentioning(&self, subject: &str, fragment: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM outbox WHERE subject = $1 AND strpos(body, $2) = 0",
        )
        .bind(subject)
        .bind(fragment)
        .fetch_one(self.ds.pool())
        .await
        .expect("a count of messages")
    }

    /// How many `ok` audit rows of `action` through `channel` give as their reason the
    /// decision reason of the pending action they executed.
    pub async fn audited_with_the_decisions_reason(&self, action: &str, channel: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM audit_log a JOIN pending_actions p ON p.id = a.pending_action_id \
             WHERE a.action = $1 AND a.outcome = 'ok' AND a.channel = $2 \
             AND a.reason = p.decision_reason",
        )
        .bind(action)
        .bind(channel)
        .fetch_one(self.ds.pool())
        .await
        .expect("a count of audit rows")
    }

    /// Changes customer `handle`'s email to `email` (a new version), as another user would
    /// between an agent's preparation and a person's approval.
    pub async fn customer_email_changed_elsewhere(&self, handle: &str, email: &str) {
        sqlx::query("UPDATE customers SET email = $2, updated_at = now() WHERE handle = $1")
            .bind(handle)
            .bind(email)
            .execute(self.ds.pool())
            .await
            .expect("a customer with a new email");
    }

    /// The proof (JSON text) on the `ok` audit row of `action` that executed pending action
    /// `handle`: how the person who approved it was known.
    pub async fn proof_of_executed_action(&self, handle: &str, action: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT a.proof::text FROM audit_log a JOIN pending_actions p ON p.id = a.pending_action_id \
             WHERE p.handle = $1 AND a.action = $2 AND a.outcome = 'ok'",
        )
        .bind(handle)
        .bind(action)
        .fetch_one(self.ds.pool())
        .await
        .expect("the proof of an executed action")
    }

    /// How many pending actions have more than one message in the outbox (the messages of no
    /// action counting as one group).
    pub async fn actions_with_more_than_one_message(&self) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM \
             (SELECT pending_action_id FROM outbox GROUP BY 1 HAVING count(*) > 1) d",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("a count of actions")
    }
}

// ---------------------------------------------------------------- people, tenants, credentials

impl TestDb {
    /// How many memberships in role `role` the person with email `email` holds.
    pub async fn memberships_of_email_in_role(&self, email: &str, role: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM memberships m JOIN people p ON p.id = m.person_id \
             WHERE p.email = $1 AND m.role = $2",
        )
        .bind(email)
        .bind(role)
        .fetch_one(self.ds.pool())
        .await
        .expect("a count of memberships")
    }

    /// Sets every tenant's bucket of each effect class of `classes` to `per_minute` calls, as
    /// an admin raises them for a load drill.
    pub async fn set_every_tenants_rate_limits(&self, classes: &[&str], per_minute: i32) {
        let classes: Vec<String> = classes.iter().map(|c| (*c).to_owned()).collect();
        sqlx::query(
            "INSERT INTO tenant_rate_limits (tenant_id, class, per_minute) \
             SELECT t.id, u.c, $2 FROM tenants t, unnest($1::text[]) AS u(c)",
        )
        .bind(classes)
        .bind(per_minute)
        .execute(self.ds.pool())
        .await
        .expect("raised rate limits");
    }

    /// Makes the stored token `token` (found by its SHA-256) one for resource `audience`, as a
    /// token minted for another server is.
    pub async fn set_token_audience(&self, token: &str, audience: &str) {
        sqlx::query(
            "UPDATE connection_tokens SET audience = $2 \
             WHERE token_hash = sha256(convert_to($1, 'UTF8'))",
        )
        .bind(token)
        .bind(audience)
        .execute(self.ds.pool())
        .await
        .expect("a token for another audience");
    }

    /// Lets the stored token `token` (found by its SHA-256) expire, a second ago.
    pub async fn expire_token(&self, token: &str) {
        sqlx::query(
            "UPDATE connection_tokens SET expires_at = now() - interval '1 second' \
             WHERE token_hash = sha256(convert_to($1, 'UTF8'))",
        )
        .bind(token)
        .execute(self.ds.pool())
        .await
        .expect("an expired token");
    }
}

// ---------------------------------------------------------------- bookings, policies, the audit

impl TestDb {
    /// The handle of tenant `slug`'s confirmed booking starting soonest between now plus
    /// `from` and now plus `to` (intervals such as `"1 hour"`); empty when there is none.
    pub async fn next_confirmed_booking_starting_between(
        &self,
        slug: &str,
        from: &str,
        to: &str,
    ) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT b.handle FROM bookings b JOIN tenants t ON t.id = b.tenant_id \
             WHERE t.slug = $1 AND b.status = 'confirmed' \
             AND b.starts_at BETWEEN now() + $2::interval AND now() + $3::interval \
             ORDER BY b.starts_at LIMIT 1",
        )
        .bind(slug)
        .bind(from)
        .bind(to)
        .fetch_optional(self.ds.pool())
        .await
        .expect("bookings")
        .unwrap_or_default()
    }

    /// The handles of tenant `slug`'s `n` confirmed bookings starting soonest later than now
    /// plus `after` (an interval such as `"96 hours"`), soonest first.
    pub async fn next_confirmed_bookings_starting_after(
        &self,
        slug: &str,
        after: &str,
        n: i64,
    ) -> Vec<String> {
        sqlx::query_scalar::<_, String>(
            "SELECT b.handle FROM bookings b JOIN tenants t ON t.id = b.tenant_id \
             WHERE t.slug = $1 AND b.status = 'confirmed' AND b.starts_at > now() + $2::interval \
             ORDER BY b.starts_at LIMIT $3",
        )
        .bind(slug)
        .bind(after)
        .bind(n)
        .fetch_all(self.ds.pool())
        .await
        .expect("bookings")
    }

    /// The handle of tenant `slug`'s oldest confirmed booking of a customer of region `region`.
    pub async fn first_confirmed_booking_in_region(&self, slug: &str, region: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT b.handle FROM bookings b JOIN customers c ON c.id = b.customer_id \
             JOIN tenants t ON t.id = b.tenant_id \
             WHERE t.slug = $1 AND b.status = 'confirmed' AND c.region = $2 \
             ORDER BY b.id LIMIT 1",
        )
        .bind(slug)
        .bind(region)
        .fetch_one(self.ds.pool())
        .await
        .unwrap_or_else(|_| panic!("a confirmed booking of {slug} in region {region}"))
    }

    /// The first deciding policy of every audit row that a policy of set version `version`
    /// decided, oldest row first (empty where the row names none).
    pub async fn first_deciding_policies_of_version(&self, version: i64) -> Vec<String> {
        sqlx::query_scalar::<_, Option<String>>(
            "SELECT policy->'decided_by'->>0 FROM audit_log \
             WHERE policy->>'version' = $1 AND policy->'decided_by' <> '[]'::jsonb ORDER BY id",
        )
        .bind(version.to_string())
        .fetch_all(self.ds.pool())
        .await
        .expect("audit rows")
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect()
    }

    /// How many audit rows of tenant `slug` name first a target starting with one of
    /// `prefixes` (`"a_"`).
    pub async fn audited_with_first_target_starting(&self, slug: &str, prefixes: &[&str]) -> i64 {
        let prefixes: Vec<String> = prefixes.iter().map(|p| (*p).to_owned()).collect();
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM audit_log a JOIN tenants t ON t.id = a.tenant_id \
             WHERE t.slug = $1 AND EXISTS \
             (SELECT 1 FROM unnest($2::text[]) AS u(p) WHERE left(a.targets[1], length(u.p)) = u.p)",
        )
        .bind(slug)
        .bind(prefixes)
        .fetch_one(self.ds.pool())
        .await
        .expect("a count of audit rows")
    }
}

impl TestDb {
    /// How the newest console session of the person `email` (any case) was proven:
    /// `password`, `passkey` or `single_sign_on`.
    pub async fn latest_session_proof_of(&self, email: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT s.signed_in_with::text FROM console_sessions s \
             JOIN people p ON p.id = s.person_id WHERE lower(p.email) = lower($1) \
             ORDER BY s.id DESC LIMIT 1",
        )
        .bind(email)
        .fetch_one(self.ds.pool())
        .await
        .expect("a console session of the person")
    }

    /// How the person invited as `email` joined: `how:role:without a password:passkeys`,
    /// e.g. `passkey:dispatcher:true:1`.
    pub async fn how_an_invitee_joined(&self, email: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT i.accepted_how || ':' || m.role || ':' || (p.password_hash IS NULL) || ':' \
                    || (SELECT count(*) FROM passkeys k WHERE k.person_id = p.id) \
             FROM invitations i JOIN people p ON p.id = i.person_id \
             JOIN memberships m ON m.person_id = p.id AND m.tenant_id = i.tenant_id \
             WHERE p.email = $1",
        )
        .bind(email)
        .fetch_one(self.ds.pool())
        .await
        .expect("an accepted invitation")
    }
}
