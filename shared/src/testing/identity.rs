//! Testkit: People, sessions, invitations, single sign-on, ID-JAG and passkeys.
//!
//! Named fixtures and probes for what no service offers a test (aging a row, tampering, reading
//! what only the database shows); raw SQL of tests lives here, never in a test.

use super::TestDb;

impl TestDb {
    /// The email of the person an IdP's `subject` is linked to.
    pub async fn email_linked_to_subject(&self, subject: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT p.email FROM person_identities i JOIN people p ON p.id = i.person_id \
             WHERE i.subject = $1",
        )
        .bind(subject)
        .fetch_one(self.ds.pool())
        .await
        .expect("the linked person's email")
    }

    /// Links person `email` to `subject` at `issuer` in tenant `slug`, as a sign-in through
    /// that tenant's IdP once did (no service links a subject outside a sign-in).
    pub async fn link_idp_subject(&self, issuer: &str, subject: &str, email: &str, slug: &str) {
        sqlx::query(
            "INSERT INTO person_identities (issuer, subject, person_id, tenant_id) \
             SELECT $1, $2, p.id, t.id FROM people p, tenants t \
             WHERE p.email = $3 AND t.slug = $4",
        )
        .bind(issuer)
        .bind(subject)
        .bind(email)
        .bind(slug)
        .execute(self.ds.pool())
        .await
        .expect("link the subject");
    }

    /// The role of the (first found) membership of person `email`, and whether it is active.
    pub async fn membership_of_email(&self, email: &str) -> (String, bool) {
        sqlx::query_as::<_, (String, bool)>(
            "SELECT m.role, m.active FROM memberships m JOIN people p ON p.id = m.person_id \
             WHERE p.email = $1",
        )
        .bind(email)
        .fetch_one(self.ds.pool())
        .await
        .expect("a membership")
    }

    /// How many memberships of tenant `slug` the person `email` (in any case) holds: 0 or 1.
    pub async fn memberships_in_tenant(&self, slug: &str, email: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM memberships m JOIN people p ON p.id = m.person_id \
             JOIN tenants t ON t.id = m.tenant_id WHERE t.slug = $1 AND lower(p.email) = lower($2)",
        )
        .bind(slug)
        .bind(email)
        .fetch_one(self.ds.pool())
        .await
        .expect("count memberships")
    }

    /// How many people have the address `email`, in any case.
    pub async fn people_with_email(&self, email: &str) -> i64 {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM people WHERE lower(email) = lower($1)")
            .bind(email)
            .fetch_one(self.ds.pool())
            .await
            .expect("count people")
    }

    /// The invitation handle and the role that the (first) `person.invite` audit row records.
    pub async fn invite_audit_handle_and_role(&self) -> (String, String) {
        sqlx::query_as::<_, (String, String)>(
            "SELECT targets[1], change->'role'->>'to' FROM audit_log \
             WHERE action = 'person.invite'",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("the invitation's audit row")
    }

    /// How many invitations keep the link's token itself (`gh_inv_…`) rather than its hash.
    pub async fn invitations_keeping_their_token(&self) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM invitations WHERE token_hash IS NOT NULL \
             AND position('gh_inv_' in encode(token_hash, 'escape')) > 0",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("count invitations")
    }

    /// The path of the invitation link (`/invitations/gh_inv_…`) in the (first) invitation
    /// email of the outbox.
    pub async fn invitation_path_in_outbox(&self) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT substring(body from '/invitations/gh_inv_[a-z2-7]+') FROM outbox \
             WHERE idempotency_key LIKE 'invitation:%'",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("an invitation email with its link")
    }

    /// How many console sessions person `email` has.
    pub async fn console_sessions_of_email(&self, email: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM console_sessions s JOIN people p ON p.id = s.person_id \
             WHERE p.email = $1",
        )
        .bind(email)
        .fetch_one(self.ds.pool())
        .await
        .expect("count sessions")
    }

    /// What housekeeping is to drop beside what it keeps: a two-day-old and a fresh login
    /// throttle, a two-day-old and a fresh replay entry, and a used refresh token expired two
    /// days ago (on the first connection), as time would leave them.
    pub async fn leave_housekeeping_leftovers(&self) {
        self.exec(
            "INSERT INTO login_throttle (key, window_start, attempts) VALUES ('account:old@example.net', now() - interval '2 days', 3), ('account:new@example.net', now(), 1);
             INSERT INTO replay_entries (connection_id, tool, args_digest, result, created_at)
             SELECT id, 'add_booking_note', 'old', '{}', now() - interval '2 days' FROM connections LIMIT 1;
             INSERT INTO replay_entries (connection_id, tool, args_digest, result)
             SELECT id, 'add_booking_note', 'new', '{}' FROM connections LIMIT 1;
             INSERT INTO connection_tokens (connection_id, kind, token_hash, expires_at, used_at)
             SELECT id, 'refresh', sha256('expired-refresh'::bytea), now() - interval '2 days', now() - interval '3 days' FROM connections LIMIT 1;",
        )
        .await;
    }

    /// How many tokens the active connections an IdP granted (by an ID-JAG) hold.
    pub async fn tokens_of_active_idp_grants(&self) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM connection_tokens t JOIN connections c ON c.id = t.connection_id \
             WHERE c.status = 'active' AND c.granted_by = 'idp'",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("count tokens")
    }

    /// How the session was proven (`proof.method`) on the latest audit row of `action`.
    pub async fn latest_proof_method_of(&self, action: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT proof->>'method' FROM audit_log WHERE action = $1 ORDER BY id DESC LIMIT 1",
        )
        .bind(action)
        .fetch_one(self.ds.pool())
        .await
        .expect("an audit row with its proof")
    }
}
