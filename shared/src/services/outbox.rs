//! Delivering the outbox: messages and pages written by confirmed actions, in the same
//! transaction as the effect. Delivery is at least once: a row is claimed with
//! `FOR UPDATE SKIP LOCKED` (several dispatchers may run), handed to a sink with its
//! idempotency key (so a sink or the provider behind it can drop a repeat), and marked sent;
//! a failed attempt stays queued and is retried, up to five attempts.

pub use crate::datastore::OutboxRow;
use crate::datastore::{self as db, Services};
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

/// Delivers up to `batch` queued messages; returns how many were sent.
pub async fn dispatch_once<S: Sink>(ds: &Services, sink: &S, batch: i64) -> Result<usize> {
    let (mut tx, rows) = ds.outbox_claim(batch).await?;
    let mut sent = 0;
    for row in &rows {
        match sink.deliver(row).await {
            Ok(()) => {
                db::outbox_mark(&mut tx, row.id, true, None).await?;
                sent += 1;
            }
            Err(e) => {
                tracing::warn!(outbox.id = row.id, error = %e, "delivery failed; will retry");
                db::outbox_mark(&mut tx, row.id, false, Some(&e)).await?;
            }
        }
    }
    tx.commit().await?;
    Ok(sent)
}
