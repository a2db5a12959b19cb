//! Delivering the outbox: messages and pages written by confirmed actions, in the same
//! transaction as the effect. Delivery is at least once: a row is leased to one dispatcher
//! (several may run) in a statement of its own, handed to a sink with its idempotency key (so
//! a sink or the provider behind it can drop a repeat), and marked sent; a failed attempt stays
//! queued and is retried, up to five attempts. No transaction stays open while a relay
//! answers: a slow relay holds no row lock and no database connection.

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
    dispatch_leased(ds, sink, batch, LEASE).await
}

/// How long a round's messages are leased to it. A round stops starting deliveries once a
/// fifth of it is left (the rest are released for the next round), so a delivery under way
/// when the lease ends is one the relay held for over a minute; a dispatcher that stopped
/// mid-round leaves its messages to others after this long.
const LEASE: std::time::Duration = std::time::Duration::from_secs(300);

async fn dispatch_leased<S: Sink>(
    ds: &Services,
    sink: &S,
    batch: i64,
    lease: std::time::Duration,
) -> Result<Dispatched> {
    use crate::telemetry::{self, Attr, Name};
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    let token = i64::from_ne_bytes(bytes);
    let started = std::time::Instant::now();
    let rows = ds.job_outbox_claim(batch, token, lease).await?;
    let mut done = Dispatched::default();
    for row in &rows {
        if started.elapsed() > lease.mul_f64(0.8) {
            break;
        }
        let channel = if row.channel == "page" { "page" } else { "email" };
        let span = telemetry::start(
            Name::Static("gatehouse.outbox.deliver"),
            opentelemetry::trace::SpanKind::Producer,
            Some(&telemetry::stored_parent(row.traceparent.as_deref())),
            &[Attr::OutboxChannel(channel), Attr::Attempt(i64::from(row.attempts) + 1)],
        );
        match telemetry::within(&span, sink.deliver(row)).await {
            Ok(()) => {
                span.set(&[Attr::Outcome("ok")]);
                ds.job_outbox_mark(row.id, token, true, None).await?;
                done.sent += 1;
            }
            Err(e) => {
                span.fail(&[Attr::Outcome("delivery_failed"), Attr::ErrorType("delivery_failed")]);
                tracing::warn!(outbox.id = row.id, error = %e, "delivery failed; will retry");
                ds.job_outbox_mark(row.id, token, false, Some(&e)).await?;
                done.failed += 1;
            }
        }
    }
    if done.sent + done.failed < rows.len() {
        ds.job_outbox_release(token).await?;
    }
    Ok(done)
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
        // A dispatcher leased them and stopped (its lease is already over).
        let lost = db.ds.job_outbox_claim(10, 7, Duration::ZERO).await.expect("claim");
        assert_eq!(lost.len(), 3);
        let done = dispatch_once(&db.ds, &LogSink, 10).await.expect("the next round");
        assert_eq!(done.sent, 3);
        // The stopped one's late mark changes nothing: the rows were another round's.
        assert!(!db.ds.job_outbox_mark(lost[0].id, 7, false, Some("late")).await.expect("mark"));
        let sent = "SELECT count(*) FROM outbox WHERE status = 'sent' AND last_error IS NULL";
        assert_eq!(db.scalar_i64(sent).await, 3);
        // A lease still running is left alone.
        db.exec("UPDATE outbox SET status = 'queued'").await;
        db.ds.job_outbox_claim(10, 8, Duration::from_secs(60)).await.expect("claim");
        assert_eq!(dispatch_once(&db.ds, &LogSink, 10).await.expect("a round").sent, 0);
    }

    #[tokio::test]
    async fn a_round_near_its_lease_end_starts_no_more_and_releases_the_rest() {
        let db = TestDb::new().await;
        queued(&db).await;
        // Each delivery outlasts the whole lease: the round delivers the first and gives the
        // other two back at once rather than when the lease would end. (A second apart, so a
        // slow machine cannot blur which is which.)
        struct Slow;
        impl Sink for Slow {
            async fn deliver(&self, _: &OutboxRow) -> std::result::Result<(), String> {
                tokio::time::sleep(Duration::from_millis(1200)).await;
                Ok(())
            }
        }
        let lease = Duration::from_secs(1);
        let done = dispatch_leased(&db.ds, &Slow, 10, lease).await.expect("a round");
        assert_eq!(done, Dispatched { sent: 1, failed: 0 });
        let free = "SELECT count(*) FROM outbox WHERE status = 'queued' AND lease_token IS NULL";
        assert_eq!(db.scalar_i64(free).await, 2);
        assert_eq!(dispatch_once(&db.ds, &LogSink, 10).await.expect("the next").sent, 2);
    }
}
