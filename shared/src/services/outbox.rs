//! Delivering the outbox: messages and pages written by confirmed actions, in the same
//! transaction as the effect. Delivery is at least once: a row is leased to one dispatcher
//! (several may run) in a statement of its own, handed to a sink with its idempotency key (so
//! a sink or the provider behind it can drop a repeat), and marked sent; a failed attempt stays
//! queued and is retried after a pause that doubles (30 s, 1, 2, 4 min), up to five attempts.
//! No transaction stays open while a relay answers: a slow relay holds no row lock and no
//! database connection.

use crate::datastore::Services;
pub use crate::datastore::{OutboxBacklog, OutboxRow};
use crate::error::Result;

/// Where messages go.
pub trait Sink: Send + Sync {
    fn deliver(
        &self,
        message: &OutboxRow,
    ) -> impl std::future::Future<Output = std::result::Result<(), String>> + Send;
}

/// The default sink: logs that a message was delivered, with its id, channel and idempotency
/// key, never its recipient or text (R14).
pub struct LogSink;

impl Sink for LogSink {
    async fn deliver(&self, message: &OutboxRow) -> std::result::Result<(), String> {
        tracing::info!(
            outbox.id = message.id,
            outbox.channel = %message.channel,
            outbox.key = %message.idempotency_key,
            attempt = message.attempts + 1,
            "message delivered (log sink)"
        );
        Ok(())
    }
}

/// What one dispatch round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dispatched {
    pub sent: usize,
    /// Attempts that failed (the message stays queued until its fifth).
    pub failed: usize,
}

/// Delivers up to `batch` queued messages. Each delivery is a span in the trace of the call
/// that queued the message (when traces are exported).
pub async fn dispatch_once<S: Sink>(ds: &Services, sink: &S, batch: i64) -> Result<Dispatched> {
    dispatch_within(ds, sink, batch, DELIVERY_LIMIT).await
}

/// How long one delivery may take before it counts as a failed attempt. Each message's lease
/// ([`datastore::OUTBOX_LEASE`](crate::datastore::OUTBOX_LEASE)) is renewed as its delivery
/// starts and outlasts this, so no other dispatcher takes a message while it is being sent.
const DELIVERY_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

async fn dispatch_within<S: Sink>(
    ds: &Services,
    sink: &S,
    batch: i64,
    limit: std::time::Duration,
) -> Result<Dispatched> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    let token = i64::from_ne_bytes(bytes);
    let rows = ds.job_outbox_claim(batch, token).await?;
    let mut done = Dispatched::default();
    let delivered = deliver_leased(ds, sink, token, &rows, limit, &mut done).await;
    // What the round did not attempt (it stopped on an error) goes back at once; rows it
    // attempted were released by their marks. Best effort: a lease left behind ends by itself.
    if let Err(e) = ds.job_outbox_release(token).await {
        tracing::warn!(error = %e, "the outbox round's leases were not given back; they end by themselves");
    }
    delivered.map(|()| done)
}

async fn deliver_leased<S: Sink>(
    ds: &Services,
    sink: &S,
    token: i64,
    rows: &[OutboxRow],
    limit: std::time::Duration,
    done: &mut Dispatched,
) -> Result<()> {
    use crate::telemetry::{self, Attr, Name};
    use futures_util::FutureExt;
    for row in rows {
        // The attempt is counted before it is made (a delivery that takes the process down
        // still counts towards the five), and the lease renewed; a row whose lease another
        // dispatcher took meanwhile is left to it.
        let Some(attempt) = ds.job_outbox_start(row.id, token).await? else {
            tracing::warn!(outbox.id = row.id, "another dispatcher took this message's lease");
            continue;
        };
        let channel = if row.channel == "page" { "page" } else { "email" };
        let span = telemetry::start(
            Name::Static("gatehouse.outbox.deliver"),
            opentelemetry::trace::SpanKind::Producer,
            Some(&telemetry::stored_parent(row.traceparent.as_deref())),
            &[Attr::OutboxChannel(channel), Attr::Attempt(i64::from(attempt))],
        );
        // A sink that panics on a message fails that attempt only: the round goes on, and the
        // message waits out its pause like any other failure.
        let delivery = telemetry::within(&span, sink.deliver(row));
        let delivery = std::panic::AssertUnwindSafe(delivery).catch_unwind();
        let outcome = match tokio::time::timeout(limit, delivery).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err("the delivery panicked".to_owned()),
            Err(_) => Err(format!("the delivery took over {} s", limit.as_secs_f64())),
        };
        let still_ours = match outcome {
            Ok(()) => {
                span.set(&[Attr::Outcome("ok")]);
                done.sent += 1;
                ds.job_outbox_mark(row.id, token, attempt, None).await?
            }
            Err(e) => {
                span.fail(&[Attr::Outcome("delivery_failed"), Attr::ErrorType("delivery_failed")]);
                tracing::warn!(outbox.id = row.id, attempt, error = %e, "delivery failed; will retry");
                done.failed += 1;
                ds.job_outbox_mark(row.id, token, attempt, Some(&e)).await?
            }
        };
        if !still_ours {
            tracing::warn!(
                outbox.id = row.id,
                "a message's lease ended during its delivery: another dispatcher may send it again"
            );
        }
    }
    Ok(())
}

/// How many messages wait, how long the oldest has, and how many were given up on.
pub async fn backlog(ds: &Services) -> Result<OutboxBacklog> {
    ds.platform_outbox_backlog().await
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::testing::TestDb;

    /// Three queued emails of a tenant of their own.
    async fn queued(db: &TestDb) {
        db.exec(
            "INSERT INTO tenants (handle, slug, name, currency, zone)
             VALUES ('ten_outboxtest01', 'outbox', 'Outbox', 'EUR', 'UTC')",
        )
        .await;
        db.exec(
            "INSERT INTO outbox (tenant_id, channel, recipient, subject, body, idempotency_key)
             SELECT t.id, 'email', 'c' || i || '@example.com', 'Visit ' || i, 'b', 'lease-' || i
             FROM tenants t, generate_series(1, 3) i WHERE t.slug = 'outbox'",
        )
        .await;
    }

    /// A sink that, at each delivery, looks at the database from outside: whether any session
    /// sits in an open transaction, and what a second dispatcher would claim meanwhile.
    struct Watching<'a> {
        db: &'a TestDb,
        seen: Mutex<Vec<(i64, usize)>>,
        pause: Duration,
    }

    impl Sink for Watching<'_> {
        async fn deliver(&self, message: &OutboxRow) -> std::result::Result<(), String> {
            let in_transaction = self
                .db
                .scalar_i64(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
                )
                .await;
            let other = dispatch_once(&self.db.ds, &LogSink, 10).await.expect("a second round");
            self.seen.lock().expect("seen").push((in_transaction, other.sent));
            tokio::time::sleep(self.pause).await;
            let _ = message;
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_delivery_holds_no_transaction_and_its_messages_are_leased_to_one_round() {
        let db = TestDb::new().await;
        queued(&db).await;
        let sink = Watching { db: &db, seen: Mutex::new(Vec::new()), pause: Duration::ZERO };
        let done = dispatch_once(&db.ds, &sink, 10).await.expect("a round");
        assert_eq!(done, Dispatched { sent: 3, failed: 0 });
        // While the relay answered, no session sat in a transaction, and a second dispatcher
        // found every message of the round leased (it sent none twice).
        assert_eq!(*sink.seen.lock().expect("seen"), [(0, 0), (0, 0), (0, 0)]);
        let left = "SELECT count(*) FROM outbox WHERE status <> 'sent' OR lease_token IS NOT NULL";
        assert_eq!(db.scalar_i64(left).await, 0, "all sent, no lease left");
    }

    #[tokio::test]
    async fn a_round_that_stopped_leaves_its_messages_to_the_next_once_the_lease_ends() {
        let db = TestDb::new().await;
        queued(&db).await;
        // A dispatcher leased them and stopped; while its lease runs they are left alone.
        let lost = db.ds.job_outbox_claim(10, 7).await.expect("claim");
        assert_eq!(lost.len(), 3);
        assert_eq!(dispatch_once(&db.ds, &LogSink, 10).await.expect("a round").sent, 0);
        // Once it ends, the next round delivers them.
        db.exec("UPDATE outbox SET due_at = now() - interval '1 second'").await;
        let done = dispatch_once(&db.ds, &LogSink, 10).await.expect("the next round");
        assert_eq!(done.sent, 3);
        // The stopped one's late attempt and mark change nothing: the rows were another round's.
        assert_eq!(db.ds.job_outbox_start(lost[0].id, 7).await.expect("start"), None);
        assert!(!db.ds.job_outbox_mark(lost[0].id, 7, 1, Some("late")).await.expect("mark"));
        let sent = "SELECT count(*) FROM outbox WHERE status = 'sent' AND last_error IS NULL AND attempts = 1";
        assert_eq!(db.scalar_i64(sent).await, 3);
    }

    #[tokio::test]
    async fn racing_claims_never_lease_one_message_twice() {
        let db = TestDb::new().await;
        queued(&db).await;
        db.exec(
            "INSERT INTO outbox (tenant_id, channel, recipient, subject, body, idempotency_key)
             SELECT t.id, 'email', 'r' || i || '@example.com', 'Race', 'b', 'race-' || i
             FROM tenants t, generate_series(1, 200) i WHERE t.slug = 'outbox'",
        )
        .await;
        let claims = (1..=8).map(|token| db.ds.job_outbox_claim(40, token));
        let claimed: Vec<Vec<OutboxRow>> =
            futures_util::future::try_join_all(claims).await.expect("claims");
        let mut ids: Vec<i64> = claimed.iter().flatten().map(|r| r.id).collect();
        let total = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), total, "a message leased to two claims");
        assert_eq!(total, 203, "every message leased once");
    }

    /// A relay that refuses every message.
    struct Refusing;
    impl Sink for Refusing {
        async fn deliver(&self, _: &OutboxRow) -> std::result::Result<(), String> {
            Err("550 mailbox unavailable".into())
        }
    }

    #[tokio::test]
    async fn a_failed_attempt_waits_longer_each_time_and_the_fifth_gives_up() {
        let db = TestDb::new().await;
        queued(&db).await;
        db.exec("DELETE FROM outbox WHERE idempotency_key <> 'lease-1'").await;
        let waits = "SELECT round(extract(epoch FROM due_at - now()))::bigint FROM outbox";
        for attempt in 1..=5i64 {
            let done = dispatch_once(&db.ds, &Refusing, 10).await.expect("a round");
            assert_eq!(done, Dispatched { sent: 0, failed: 1 }, "attempt {attempt}");
            let row = "SELECT attempts::bigint FROM outbox WHERE lease_token IS NULL";
            assert_eq!(db.scalar_i64(row).await, attempt);
            if attempt < 5 {
                // Retried after 30 s, 60 s, 120 s, 240 s: the next round takes nothing sooner.
                let wait = db.scalar_i64(waits).await;
                assert!((30 << (attempt - 1)) - wait <= 2, "attempt {attempt} waits {wait} s");
                assert_eq!(
                    dispatch_once(&db.ds, &Refusing, 10).await.expect("early"),
                    Dispatched::default()
                );
                db.exec("UPDATE outbox SET due_at = now() - interval '1 second'").await;
            }
        }
        let gave_up =
            "SELECT count(*) FROM outbox WHERE status = 'failed' AND last_error LIKE '550%'";
        assert_eq!(db.scalar_i64(gave_up).await, 1);
    }

    #[tokio::test]
    async fn a_delivery_that_hangs_is_a_failed_attempt_and_one_that_never_ends_is_given_up() {
        let db = TestDb::new().await;
        queued(&db).await;
        db.exec("DELETE FROM outbox WHERE idempotency_key <> 'lease-1'").await;
        // A relay that never answers: the attempt ends at the limit, as a failure.
        struct Hanging;
        impl Sink for Hanging {
            async fn deliver(&self, _: &OutboxRow) -> std::result::Result<(), String> {
                std::future::pending().await
            }
        }
        let limit = std::time::Duration::from_millis(100);
        let done = dispatch_within(&db.ds, &Hanging, 10, limit).await.expect("a round");
        assert_eq!(done, Dispatched { sent: 0, failed: 1 });
        let error = db.scalar_string("SELECT last_error FROM outbox").await;
        assert!(error.contains("took over"), "{error}");
        // A fifth attempt that started and never finished (the process went down in it):
        // given up by the next claim, never leased again.
        db.exec(
            "UPDATE outbox SET attempts = 5, lease_token = 9, due_at = now() - interval '1 second'",
        )
        .await;
        assert_eq!(
            dispatch_once(&db.ds, &LogSink, 10).await.expect("a round"),
            Dispatched::default()
        );
        let gave_up = "SELECT count(*) FROM outbox WHERE status = 'failed' AND last_error LIKE '%its fifth attempt never finished'";
        assert_eq!(db.scalar_i64(gave_up).await, 1);
    }

    #[tokio::test]
    async fn a_message_the_sink_panics_on_fails_alone_and_the_round_goes_on() {
        let db = TestDb::new().await;
        queued(&db).await;
        struct Fragile;
        impl Sink for Fragile {
            async fn deliver(&self, message: &OutboxRow) -> std::result::Result<(), String> {
                if message.idempotency_key == "lease-2" {
                    panic!("a message the relay library cannot take");
                }
                Ok(())
            }
        }
        let done = dispatch_once(&db.ds, &Fragile, 10).await.expect("a round");
        assert_eq!(done, Dispatched { sent: 2, failed: 1 });
        let waiting = "SELECT count(*) FROM outbox WHERE idempotency_key = 'lease-2'
                       AND status = 'queued' AND last_error = 'the delivery panicked'
                       AND lease_token IS NULL AND due_at > now() + interval '20 seconds'";
        assert_eq!(db.scalar_i64(waiting).await, 1, "it waits out its pause like any failure");
    }
}
