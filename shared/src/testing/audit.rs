//! Testkit: The audit log, its chain and anchors, OAuth and API tokens, and what gatehousectl leaves.
//!
//! Named fixtures and probes for what no service offers a test (aging a row, tampering, reading
//! what only the database shows); raw SQL of tests lives here, never in a test.

use sqlx::{Postgres, Transaction};

use super::TestDb;

/// The append-only triggers of the audit tables, switched off as only the database's owner can.
const OWNER_TRIGGERS_OFF: &str = "ALTER TABLE audit_log DISABLE TRIGGER USER; \
     ALTER TABLE audit_chain DISABLE TRIGGER USER; \
     ALTER TABLE audit_checkpoints DISABLE TRIGGER USER;";
const OWNER_TRIGGERS_ON: &str = "ALTER TABLE audit_log ENABLE TRIGGER USER; \
     ALTER TABLE audit_chain ENABLE TRIGGER USER; \
     ALTER TABLE audit_checkpoints ENABLE TRIGGER USER;";

/// A transaction in which the audit tables' triggers are off (tampering as the owner would).
async fn owner_begin(db: &TestDb) -> Transaction<'static, Postgres> {
    let mut tx = db.ds.pool().begin().await.expect("begin the owner's transaction");
    sqlx::raw_sql(OWNER_TRIGGERS_OFF).execute(&mut *tx).await.expect("triggers off");
    tx
}

/// Switches the triggers back on and commits what the owner did.
async fn owner_commit(mut tx: Transaction<'static, Postgres>) {
    sqlx::raw_sql(OWNER_TRIGGERS_ON).execute(&mut *tx).await.expect("triggers on");
    tx.commit().await.expect("commit the owner's transaction");
}

impl TestDb {
    // ------------------------------------------------------------ audit rows the product writes

    /// Logs one `ok` audit row of `action` through `channel` in tenant `tenant_id` per target,
    /// in order, each naming its target, as the product logs what it did.
    pub async fn log_audit_events(
        &self,
        tenant_id: i64,
        channel: &str,
        action: &str,
        targets: impl IntoIterator<Item = String>,
    ) {
        let targets: Vec<String> = targets.into_iter().collect();
        sqlx::query(
            "INSERT INTO audit_log (tenant_id, channel, action, outcome, targets)
             SELECT $1, $2, $3, 'ok', ARRAY[u.target]
             FROM unnest($4::text[]) WITH ORDINALITY AS u(target, n) ORDER BY u.n",
        )
        .bind(tenant_id)
        .bind(channel)
        .bind(action)
        .bind(targets)
        .execute(self.ds.pool())
        .await
        .expect("log audit events");
    }

    /// Fills tenant `slug`'s audit log for search: 260 rows over ten days from 2026-11-01 noon
    /// UTC (mcp and api; `note_add`, `noteXadd` and `booking.confirm`; every fifth refused),
    /// with connection and client names a client chose to be spreadsheet formulas, and one
    /// `other_tenants_secret` row in another tenant.
    pub async fn fill_audit_log_for_search(&self, slug: &str) {
        sqlx::query(
            r#"INSERT INTO audit_log (tenant_id, at, channel, action, outcome, targets, connection_name, client_name)
             SELECT t.id, timestamptz '2026-11-01 12:00:00+00' + (i % 10) * interval '1 day' + i * interval '1 second',
                    CASE WHEN i % 2 = 0 THEN 'mcp' ELSE 'api' END,
                    CASE WHEN i % 3 = 0 THEN 'note_add' WHEN i % 3 = 1 THEN 'noteXadd' ELSE 'booking.confirm' END,
                    CASE WHEN i % 5 = 0 THEN 'refused' ELSE 'ok' END,
                    ARRAY['bkg_' || i], '=HYPERLINK("http://evil.example","x")', '+cmd|'' /C calc''!A0'
             FROM tenants t, generate_series(1, 260) i WHERE t.slug = $1"#,
        )
        .bind(slug)
        .execute(self.ds.pool())
        .await
        .expect("audit rows to search");
        sqlx::query(
            "INSERT INTO audit_log (tenant_id, channel, action, outcome)
             SELECT id, 'mcp', 'other_tenants_secret', 'ok' FROM tenants WHERE slug <> $1 LIMIT 1",
        )
        .bind(slug)
        .execute(self.ds.pool())
        .await
        .expect("another tenant's audit row");
    }

    /// `count` mcp audit rows of tenant `slug`, a second apart from 2026-11-01 noon UTC: even
    /// ones `note_add`, odd ones `booking.confirm`.
    pub async fn fill_audit_log_alternating_note_add(&self, slug: &str, count: i64) {
        sqlx::query(
            "INSERT INTO audit_log (tenant_id, at, channel, action, outcome, targets)
             SELECT t.id, timestamptz '2026-11-01 12:00:00+00' + i * interval '1 second', 'mcp',
                    CASE WHEN i % 2 = 0 THEN 'note_add' ELSE 'booking.confirm' END, 'ok', ARRAY['bkg_' || i]
             FROM tenants t, generate_series(1, $2::int) i WHERE t.slug = $1",
        )
        .bind(slug)
        .bind(count)
        .execute(self.ds.pool())
        .await
        .expect("alternating audit rows");
    }

    /// The email of the person who took the audited `action` (its first row).
    pub async fn audit_actor_email(&self, action: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT p.email FROM audit_log a JOIN people p ON p.id = a.actor_id WHERE a.action = $1",
        )
        .bind(action)
        .fetch_one(self.ds.pool())
        .await
        .expect("the audited actor")
    }

    /// How many audit rows of `action` through `channel` with `reason` name `target`.
    pub async fn audit_rows_naming(
        &self,
        target: &str,
        action: &str,
        channel: &str,
        reason: &str,
    ) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM audit_log
             WHERE action = $1 AND channel = $2 AND reason = $3 AND $4 = ANY(targets)",
        )
        .bind(action)
        .bind(channel)
        .bind(reason)
        .bind(target)
        .fetch_one(self.ds.pool())
        .await
        .expect("count audit rows")
    }

    // ------------------------------------------------------------ the chain, read

    /// The id of the audit row at place `seq` of tenant `tenant_id`'s chain.
    pub async fn audit_id_at(&self, tenant_id: i64, seq: i64) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT audit_id FROM audit_chain WHERE tenant_id = $1 AND seq = $2",
        )
        .bind(tenant_id)
        .bind(seq)
        .fetch_one(self.ds.pool())
        .await
        .expect("a chained row")
    }

    /// The place in tenant `tenant_id`'s chain of its audit row of `action`.
    pub async fn audit_seq_of_action(&self, tenant_id: i64, action: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT c.seq FROM audit_chain c JOIN audit_log a ON a.id = c.audit_id
             WHERE c.tenant_id = $1 AND a.action = $2",
        )
        .bind(tenant_id)
        .bind(action)
        .fetch_one(self.ds.pool())
        .await
        .expect("a chained row of the action")
    }

    // ------------------------------------------------------------ tampering, as the owner

    /// Rewrites `field` (`reason`, or the JSON of `change` or `policy`) of audit row
    /// `audit_id` behind the product's back, as the database's owner could; `None` empties it.
    pub async fn rewrite_audit_row(&self, audit_id: i64, field: &'static str, value: Option<&str>) {
        let sql = match field {
            "reason" => "UPDATE audit_log SET reason = $2 WHERE id = $1",
            "change" => "UPDATE audit_log SET change = $2::jsonb WHERE id = $1",
            "policy" => "UPDATE audit_log SET policy = $2::jsonb WHERE id = $1",
            other => panic!("the testkit rewrites reason, change or policy, not {other:?}"),
        };
        let mut tx = owner_begin(self).await;
        sqlx::query(sql).bind(audit_id).bind(value).execute(&mut *tx).await.expect("rewrite");
        owner_commit(tx).await;
    }

    /// Swaps places `a` and `b` of tenant `tenant_id`'s chain (reordering its links), as the
    /// database's owner could; the same call swaps them back.
    pub async fn swap_audit_chain_links(&self, tenant_id: i64, a: i64, b: i64) {
        let mut tx = owner_begin(self).await;
        sqlx::query("UPDATE audit_chain SET seq = -seq WHERE tenant_id = $1 AND seq IN ($2, $3)")
            .bind(tenant_id)
            .bind(a)
            .bind(b)
            .execute(&mut *tx)
            .await
            .expect("move the links aside");
        sqlx::query(
            "UPDATE audit_chain SET seq = CASE seq WHEN -$2::bigint THEN $3::bigint ELSE $2::bigint END
             WHERE tenant_id = $1 AND seq IN (-$2::bigint, -$3::bigint)",
        )
        .bind(tenant_id)
        .bind(a)
        .bind(b)
        .execute(&mut *tx)
        .await
        .expect("put the links back swapped");
        owner_commit(tx).await;
    }

    /// Forges a console audit row of `action` in tenant `tenant_id`, dated three days ago,
    /// with the chain's trigger off: a row that never reaches the chain.
    pub async fn forge_backdated_audit_row(&self, tenant_id: i64, action: &str) {
        let mut tx = owner_begin(self).await;
        sqlx::query(
            "INSERT INTO audit_log (tenant_id, at, channel, action, outcome)
             VALUES ($1, now() - interval '3 days', 'console', $2, 'ok')",
        )
        .bind(tenant_id)
        .bind(action)
        .execute(&mut *tx)
        .await
        .expect("forge a row");
        owner_commit(tx).await;
    }

    /// Deletes tenant `tenant_id`'s audit rows of `action` older than a day, as the owner can
    /// (what [`TestDb::forge_backdated_audit_row`] forged).
    pub async fn remove_backdated_audit_rows(&self, tenant_id: i64, action: &str) {
        let mut tx = owner_begin(self).await;
        sqlx::query(
            "DELETE FROM audit_log
             WHERE tenant_id = $1 AND action = $2 AND at < now() - interval '1 day'",
        )
        .bind(tenant_id)
        .bind(action)
        .execute(&mut *tx)
        .await
        .expect("remove the forged rows");
        owner_commit(tx).await;
    }

    /// Deletes the audit row at place `seq` of tenant `tenant_id`'s chain and its link, as the
    /// owner can.
    pub async fn delete_audit_row_and_link(&self, tenant_id: i64, seq: i64) {
        let mut tx = owner_begin(self).await;
        sqlx::query(
            "DELETE FROM audit_log
             WHERE id = (SELECT audit_id FROM audit_chain WHERE tenant_id = $1 AND seq = $2)",
        )
        .bind(tenant_id)
        .bind(seq)
        .execute(&mut *tx)
        .await
        .expect("delete the row");
        sqlx::query("DELETE FROM audit_chain WHERE tenant_id = $1 AND seq = $2")
            .bind(tenant_id)
            .bind(seq)
            .execute(&mut *tx)
            .await
            .expect("delete its link");
        owner_commit(tx).await;
    }

    /// Deletes the newest chained audit row of tenant `tenant_id` (its link stays), as the
    /// owner can.
    pub async fn delete_newest_chained_audit_row(&self, tenant_id: i64) {
        let mut tx = owner_begin(self).await;
        sqlx::query(
            "DELETE FROM audit_log
             WHERE id = (SELECT max(audit_id) FROM audit_chain WHERE tenant_id = $1)",
        )
        .bind(tenant_id)
        .execute(&mut *tx)
        .await
        .expect("delete the newest row");
        owner_commit(tx).await;
    }

    /// Cuts tenant `tenant_id`'s chain back to place `keep`, as the owner can: the rows after
    /// it and their links deleted, every checkpoint of the tenant deleted, and the chainer's
    /// head moved back, so what is left is a consistent, shorter chain.
    pub async fn cut_audit_chain_back_to(&self, tenant_id: i64, keep: i64) {
        let mut tx = owner_begin(self).await;
        for sql in [
            "DELETE FROM audit_log WHERE id IN
                (SELECT audit_id FROM audit_chain WHERE tenant_id = $1 AND seq > $2)",
            "DELETE FROM audit_chain WHERE tenant_id = $1 AND seq > $2",
            "UPDATE audit_chain_heads h SET seq = c.seq, hash = c.hash FROM audit_chain c
             WHERE h.tenant_id = $1 AND c.tenant_id = $1 AND c.seq = $2",
        ] {
            sqlx::query(sql)
                .bind(tenant_id)
                .bind(keep)
                .execute(&mut *tx)
                .await
                .expect("cut the chain back");
        }
        sqlx::query("DELETE FROM audit_checkpoints WHERE tenant_id = $1")
            .bind(tenant_id)
            .execute(&mut *tx)
            .await
            .expect("delete the checkpoints");
        owner_commit(tx).await;
    }

    /// Dates every link of tenant `tenant_id`'s chain `ago` (`"1 hour"`) earlier than now, as
    /// the owner can: rows chained then and never checkpointed.
    pub async fn backdate_audit_chain(&self, tenant_id: i64, ago: &str) {
        let mut tx = owner_begin(self).await;
        sqlx::query(
            "UPDATE audit_chain SET chained_at = now() - $2::interval WHERE tenant_id = $1",
        )
        .bind(tenant_id)
        .bind(ago)
        .execute(&mut *tx)
        .await
        .expect("backdate the chain");
        owner_commit(tx).await;
    }

    /// Deletes tenant `tenant_id`'s checkpoint at place `seq` as the owner can, keeping a copy
    /// aside for [`TestDb::put_back_audit_checkpoint_signed_later`].
    pub async fn remove_audit_checkpoint(&self, tenant_id: i64, seq: i64) {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS kept_audit_checkpoints AS
             SELECT * FROM audit_checkpoints WITH NO DATA",
        )
        .execute(self.ds.pool())
        .await
        .expect("a table for the copy");
        sqlx::query(
            "INSERT INTO kept_audit_checkpoints
             SELECT * FROM audit_checkpoints WHERE tenant_id = $1 AND seq = $2",
        )
        .bind(tenant_id)
        .bind(seq)
        .execute(self.ds.pool())
        .await
        .expect("keep a copy");
        let mut tx = owner_begin(self).await;
        sqlx::query("DELETE FROM audit_checkpoints WHERE tenant_id = $1 AND seq = $2")
            .bind(tenant_id)
            .bind(seq)
            .execute(&mut *tx)
            .await
            .expect("delete the checkpoint");
        owner_commit(tx).await;
    }

    /// Puts back the checkpoint [`TestDb::remove_audit_checkpoint`] removed, everything the
    /// same but its signing time a second later.
    pub async fn put_back_audit_checkpoint_signed_later(&self, tenant_id: i64, seq: i64) {
        let mut tx = owner_begin(self).await;
        sqlx::query(
            "INSERT INTO audit_checkpoints (tenant_id, seq, head_hash, signed_at, kid, signature, v, prev_seq, prev_digest, digest)
             SELECT tenant_id, seq, head_hash, signed_at + interval '1 second', kid, signature, v, prev_seq, prev_digest, digest
             FROM kept_audit_checkpoints WHERE tenant_id = $1 AND seq = $2",
        )
        .bind(tenant_id)
        .bind(seq)
        .execute(&mut *tx)
        .await
        .expect("put the checkpoint back");
        owner_commit(tx).await;
    }

    // ------------------------------------------------------------ activity

    /// The counts workers would have written for connection `handle`: this hour 7 reads and
    /// 2 notifies refused for a missing right, 4 reads rate-limited three hours ago, 5 silent
    /// writes thirty hours ago, and one `find_customers` call just now.
    pub async fn record_sample_call_activity(&self, handle: &str) {
        sqlx::query(
            "INSERT INTO call_activity (tenant_id, connection_id, hour, effect_class, outcome, calls)
             SELECT c.tenant_id, c.id, date_trunc('hour', now()) - h * interval '1 hour', k, o, n
             FROM connections c,
                  (VALUES (0, 'read', 'ok', 7), (0, 'notify', 'permission_denied', 2), (3, 'read', 'rate_limited', 4),
                          (30, 'silent_write', 'ok', 5)) v(h, k, o, n)
             WHERE c.handle = $1",
        )
        .bind(handle)
        .execute(self.ds.pool())
        .await
        .expect("call counts");
        sqlx::query(
            "INSERT INTO recent_calls (tenant_id, connection_id, at, tool, effect_class, outcome, duration_ms)
             SELECT c.tenant_id, c.id, now(), 'find_customers', 'read', 'ok', 1.5
             FROM connections c WHERE c.handle = $1",
        )
        .bind(handle)
        .execute(self.ds.pool())
        .await
        .expect("a recent call");
    }

    // ------------------------------------------------------------ credentials

    /// How many connection tokens are stored under the SHA-256 of the secret `token`.
    pub async fn connection_tokens_hashing_to(&self, token: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM connection_tokens WHERE token_hash = sha256(convert_to($1, 'UTF8'))",
        )
        .bind(token)
        .fetch_one(self.ds.pool())
        .await
        .expect("count tokens")
    }

    /// How many connection tokens hold the secret `token` itself in their stored bytes.
    pub async fn connection_tokens_holding_plaintext(&self, token: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM connection_tokens
             WHERE encode(token_hash, 'escape') LIKE '%' || $1 || '%'",
        )
        .bind(token)
        .fetch_one(self.ds.pool())
        .await
        .expect("count tokens")
    }

    /// The rights of the connection OAuth client `client_id` was granted, comma-separated.
    pub async fn oauth_connection_rights(&self, client_id: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT array_to_string(rights, ',') FROM connections WHERE oauth_client_id = $1",
        )
        .bind(client_id)
        .fetch_one(self.ds.pool())
        .await
        .expect("the client's connection")
    }

    /// How many of the API tokens of the person with `email` are not revoked.
    pub async fn unrevoked_api_tokens_of(&self, email: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM api_tokens a JOIN people p ON p.id = a.person_id
             WHERE p.email = $1 AND a.revoked_at IS NULL",
        )
        .bind(email)
        .fetch_one(self.ds.pool())
        .await
        .expect("count API tokens")
    }

    /// The email of the person the API token named `name` acts for.
    pub async fn api_token_holder_email(&self, name: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT p.email FROM api_tokens a JOIN people p ON p.id = a.person_id WHERE a.name = $1",
        )
        .bind(name)
        .fetch_one(self.ds.pool())
        .await
        .expect("the token's person")
    }

    // ------------------------------------------------------------ the demo seed

    /// The number of bookings of the tenant with the fewest.
    pub async fn fewest_bookings_of_a_tenant(&self) -> i64 {
        sqlx::query_scalar::<_, i64>(
            "SELECT min(n) FROM (SELECT count(*) AS n FROM bookings GROUP BY tenant_id) c",
        )
        .fetch_one(self.ds.pool())
        .await
        .expect("bookings per tenant")
    }
}
