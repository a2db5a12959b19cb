//! Delivering the outbox: messages and pages written by confirmed actions, in the same
//! transaction as the effect. Delivery is at least once: a row is claimed with
//! `FOR UPDATE SKIP LOCKED` (several dispatchers may run), handed to a sink with its
//! idempotency key (so a sink or the provider behind it can drop a repeat), and marked sent;
//! a failed attempt stays queued and is retried, up to five attempts.

use crate::datastore::{self as db, Services};
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
    use crate::telemetry::{self, Attr, Name};
    let (mut tx, rows) = ds.job_outbox_claim(batch).await?;
    let mut done = Dispatched::default();
    for row in &rows {
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
                db::job_outbox_mark(&mut tx, row.id, true, None).await?;
                done.sent += 1;
            }
            Err(e) => {
                span.fail(&[Attr::Outcome("delivery_failed"), Attr::ErrorType("delivery_failed")]);
                tracing::warn!(outbox.id = row.id, error = %e, "delivery failed; will retry");
                db::job_outbox_mark(&mut tx, row.id, false, Some(&e)).await?;
                done.failed += 1;
            }
        }
    }
    tx.commit().await?;
    Ok(done)
}

/// How many messages wait, how long the oldest has, and how many were given up on.
pub async fn backlog(ds: &Services) -> Result<OutboxBacklog> {
    ds.platform_outbox_backlog().await
}
