//! The push channel: a NATS JetStream key-value bucket holding the kill switches and
//! revocation markers (R4, R18).
//!
//! Postgres stays the truth — every MCP request re-reads the switches and the connection with
//! its context query — so NATS only makes changes arrive sooner: a worker flips its in-memory
//! kill switch before touching the database and cancels in-flight work of a revoked
//! connection. Publishing is best effort after the database commit; a NATS outage delays the
//! push, never the change.
//!
//! The bucket's stream (`KV_gatehouse`) is created explicitly with the key-value stream
//! settings, because the Debian nats-server 2.9 lacks fields `create_key_value` expects.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::RwLock;

use async_nats::jetstream::{self, kv, stream};
use futures_util::StreamExt;

use crate::error::{Error, Result};

pub const BUCKET: &str = "gatehouse";

/// One change the bucket carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The global kill switch is on (`true`) or off.
    GlobalKill(bool),
    /// A tenant's agent access is on or off.
    TenantAccess { tenant_id: i64, on: bool },
    /// A connection was revoked or ended.
    Revoked { connection_id: i64 },
}

impl Event {
    fn key(&self) -> String {
        match self {
            Event::GlobalKill(_) => "switch.global".into(),
            Event::TenantAccess { tenant_id, .. } => format!("switch.tenant.{tenant_id}"),
            Event::Revoked { connection_id } => format!("revoked.{connection_id}"),
        }
    }

    fn value(&self) -> &'static str {
        match self {
            Event::GlobalKill(true) => "on",
            Event::GlobalKill(false) => "off",
            Event::TenantAccess { on: true, .. } => "on",
            Event::TenantAccess { on: false, .. } => "off",
            Event::Revoked { .. } => "revoked",
        }
    }

    /// Reads an entry of the bucket back into an event.
    pub fn parse(key: &str, value: &[u8]) -> Option<Event> {
        let on = value == b"on";
        if key == "switch.global" {
            return Some(Event::GlobalKill(on));
        }
        if let Some(id) = key.strip_prefix("switch.tenant.") {
            return id.parse().ok().map(|tenant_id| Event::TenantAccess { tenant_id, on });
        }
        key.strip_prefix("revoked.")
            .and_then(|id| id.parse().ok())
            .map(|connection_id| Event::Revoked { connection_id })
    }
}

/// The bucket, connected in the background: processes start without waiting for NATS, keep
/// retrying, and the client reconnects by itself after an outage.
#[derive(Clone, Default)]
pub struct Bus {
    inner: Arc<RwLock<Option<Inner>>>,
}

#[derive(Clone)]
struct Inner {
    client: async_nats::Client,
    kv: kv::Store,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bus")
    }
}

fn nats_error(e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("nats: {e}"))
}

async fn open(url: &str) -> Result<Inner> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .max_reconnects(None)
        .connect(url)
        .await
        .map_err(nats_error)?;
    let js = jetstream::new(client.clone());
    js.get_or_create_stream(stream::Config {
        name: format!("KV_{BUCKET}"),
        description: Some("Gatehouse kill switches and revocations".into()),
        subjects: vec![format!("$KV.{BUCKET}.>")],
        max_messages_per_subject: 1,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    })
    .await
    .map_err(nats_error)?;
    let kv = js.get_key_value(BUCKET).await.map_err(nats_error)?;
    Ok(Inner { client, kv })
}

impl Bus {
    /// Starts connecting to `url` in the background and returns at once.
    pub fn spawn(url: &str) -> Bus {
        let bus = Bus::default();
        let (inner, url) = (bus.inner.clone(), url.to_owned());
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(200);
            loop {
                match open(&url).await {
                    Ok(opened) => {
                        *inner.write().await = Some(opened);
                        tracing::info!(nats.url = %url, "connected to NATS");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(nats.url = %url, error = %e, "NATS unreachable; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
        });
        bus
    }

    /// Connects, waiting at most `within`; for short-lived commands.
    pub async fn connect(url: &str, within: Duration) -> Result<Bus> {
        let opened = tokio::time::timeout(within, open(url))
            .await
            .map_err(|_| Error::Internal(format!("nats: {url} unreachable")))??;
        Ok(Bus { inner: Arc::new(RwLock::new(Some(opened))) })
    }

    pub async fn connected(&self) -> bool {
        self.inner.read().await.as_ref().is_some_and(|i| {
            i.client.connection_state() == async_nats::connection::State::Connected
        })
    }

    /// Publishes an event; a failure is logged and swallowed (the database already holds the change).
    pub async fn publish(&self, event: &Event) {
        let Some(inner) = self.inner.read().await.clone() else {
            tracing::warn!(bus.key = %event.key(), "NATS not connected; workers see the change on their next call");
            return;
        };
        let put = tokio::time::timeout(
            Duration::from_secs(2),
            inner.kv.put(event.key(), bytes::Bytes::from_static(event.value().as_bytes())),
        )
        .await;
        match put {
            Ok(Ok(_)) => tracing::debug!(bus.key = %event.key(), "published"),
            Ok(Err(e)) => {
                tracing::warn!(bus.key = %event.key(), error = %e, "publish failed; workers see the change on their next call")
            }
            Err(_) => {
                tracing::warn!(bus.key = %event.key(), "publish timed out; workers see the change on their next call")
            }
        }
    }

    /// Every current entry (history replay), then every change, as events with the time NATS
    /// stored them (Unix nanoseconds, the server's clock). `None` while NATS is not connected
    /// yet.
    pub async fn watch(
        &self,
    ) -> Option<Result<impl futures_util::Stream<Item = (Event, i128)> + use<>>> {
        let inner = self.inner.read().await.clone()?;
        Some(match inner.kv.watch_with_history(">").await {
            Ok(watch) => Ok(watch.filter_map(|entry| async move {
                let entry = entry.ok()?;
                Some((
                    Event::parse(&entry.key, &entry.value)?,
                    entry.created.unix_timestamp_nanos(),
                ))
            })),
            Err(e) => Err(nats_error(e)),
        })
    }
}

/// Publishes through an optional bus (a process without NATS configured skips it).
pub async fn publish(bus: Option<&Bus>, event: Event) {
    if let Some(bus) = bus {
        bus.publish(&event).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_keys_and_values() {
        for e in [
            Event::GlobalKill(true),
            Event::GlobalKill(false),
            Event::TenantAccess { tenant_id: 7, on: false },
            Event::Revoked { connection_id: 42 },
        ] {
            assert_eq!(Event::parse(&e.key(), e.value().as_bytes()), Some(e));
        }
        assert_eq!(Event::parse("switch.tenant.x", b"on"), None);
    }
}
