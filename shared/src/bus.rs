//! The push channel: a NATS JetStream key-value bucket holding the kill switches and
//! revocation markers (R4, R18), and a core NATS subject that carries each change the moment
//! it is made.
//!
//! Two paths, because each covers the other's weak moment: a core message reaches every
//! connected worker at once even while JetStream re-elects its leaders after a server of a
//! cluster stopped (the bucket's watchers stall until their consumer is recreated), and the
//! bucket's history gives a worker that was cut off every change when it reconnects. Each value
//! carries its publisher's timestamp, so a worker applies the newest change of a key once,
//! whichever path brought it first.
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
///
/// Events name what they concern by public handles (`ten_…`, `con_…`: random, so unique to
/// this installation), never by serial ids: a NATS that also served another database (a
/// second deployment, or this one restored from a backup) would otherwise replay one
/// installation's revocation onto another's connection that reuses the id.
pub enum Event {
    /// The global kill switch is on (`true`) or off.
    GlobalKill(bool),
    /// A tenant's agent access is on or off.
    TenantAccess { tenant: String, on: bool },
    /// A connection was revoked or ended.
    Revoked { connection: String },
    /// Something that decides what a tenant's connections may see changed: a person's role or
    /// membership, a connection's rights or toolset, the approval policy. Workers re-check the
    /// tool lists their listen streams showed.
    TenantChanged { tenant: String },
}

/// Where the fast path publishes: `gatehouse.push.<key>` on core NATS.
const PUSH_PREFIX: &str = "gatehouse.push.";

/// An event with the instant its publisher sent it (Unix nanoseconds, the publisher's clock),
/// which orders the copies that arrive over the two paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    pub event: Event,
    pub sent_ns: i128,
}

/// Now, in Unix nanoseconds.
pub fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// A value without its stamp, and the stamp (`on;1764600000000000000`); 0 when unstamped.
fn unstamp(value: &[u8]) -> (&[u8], i128) {
    match value.iter().position(|b| *b == b';') {
        Some(i) => {
            let stamp = std::str::from_utf8(&value[i + 1..]).ok().and_then(|s| s.parse().ok());
            (&value[..i], stamp.unwrap_or(0))
        }
        None => (value, 0),
    }
}

impl Pushed {
    /// Reads a bucket entry or a fast-path message back (`None` for keys that are not events).
    pub fn parse(key: &str, value: &[u8]) -> Option<Pushed> {
        let (value, sent_ns) = unstamp(value);
        Event::parse(key, value).map(|event| Pushed { event, sent_ns })
    }
}

impl Event {
    /// The bucket key, which is also what orders its copies: one switch or connection a key.
    pub fn key(&self) -> String {
        match self {
            Event::GlobalKill(_) => "switch.global".into(),
            Event::TenantAccess { tenant, .. } => format!("switch.tenant.{tenant}"),
            Event::Revoked { connection } => format!("revoked.{connection}"),
            Event::TenantChanged { tenant } => format!("changed.tenant.{tenant}"),
        }
    }

    fn value(&self) -> &'static str {
        match self {
            Event::GlobalKill(true) => "on",
            Event::GlobalKill(false) => "off",
            Event::TenantAccess { on: true, .. } => "on",
            Event::TenantAccess { on: false, .. } => "off",
            Event::Revoked { .. } => "revoked",
            Event::TenantChanged { .. } => "changed",
        }
    }

    /// Reads an entry of the bucket back into an event (stamped or not).
    pub fn parse(key: &str, value: &[u8]) -> Option<Event> {
        let (value, _) = unstamp(value);
        let on = value == b"on";
        if key == "switch.global" {
            return Some(Event::GlobalKill(on));
        }
        // Only handles are accepted: a key of the serial-id era (`revoked.42`) names nothing.
        let handle = |raw: &str, prefix: &str| {
            (raw.starts_with(prefix)
                && raw.len() <= 64
                && raw.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .then(|| raw.to_owned())
        };
        if let Some(raw) = key.strip_prefix("switch.tenant.") {
            return handle(raw, "ten_").map(|tenant| Event::TenantAccess { tenant, on });
        }
        if let Some(raw) = key.strip_prefix("changed.tenant.") {
            return handle(raw, "ten_").map(|tenant| Event::TenantChanged { tenant });
        }
        key.strip_prefix("revoked.")
            .and_then(|raw| handle(raw, "con_"))
            .map(|connection| Event::Revoked { connection })
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

/// The servers of a `NATS_URL`: one URL, or several separated by commas (seeds of a cluster;
/// the client learns the rest of the cluster from them).
pub fn servers(url: &str) -> Result<Vec<async_nats::ServerAddr>> {
    let servers: Vec<async_nats::ServerAddr> = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| u.parse().map_err(|e| Error::invalid("NATS_URL", format!("{u}: {e}"))))
        .collect::<Result<_>>()?;
    if servers.is_empty() {
        return Err(Error::invalid(
            "NATS_URL",
            "name at least one server, e.g. nats://127.0.0.1:4222",
        ));
    }
    Ok(servers)
}

async fn open(url: &str, replicas: usize) -> Result<Inner> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .max_reconnects(None)
        .connect(servers(url)?)
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
        // On a NATS cluster, copies on that many servers, so losing one loses no switch.
        num_replicas: replicas,
        ..Default::default()
    })
    .await
    .map_err(nats_error)?;
    let kv = js.get_key_value(BUCKET).await.map_err(nats_error)?;
    Ok(Inner { client, kv })
}

impl Bus {
    /// Starts connecting to `url` in the background and returns at once.
    pub fn spawn(url: &str, replicas: usize) -> Bus {
        let bus = Bus::default();
        let (inner, url) = (bus.inner.clone(), url.to_owned());
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(200);
            loop {
                match open(&url, replicas).await {
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
    pub async fn connect(url: &str, within: Duration, replicas: usize) -> Result<Bus> {
        let opened = tokio::time::timeout(within, open(url, replicas))
            .await
            .map_err(|_| Error::Internal(format!("nats: {url} unreachable")))??;
        Ok(Bus { inner: Arc::new(RwLock::new(Some(opened))) })
    }

    pub async fn connected(&self) -> bool {
        self.inner.read().await.as_ref().is_some_and(|i| {
            i.client.connection_state() == async_nats::connection::State::Connected
        })
    }

    /// Publishes an event: first on core NATS (the fast path: every connected worker gets it at
    /// once, whatever JetStream's leaders are doing, e.g. re-electing after a server stopped),
    /// then into the bucket (the history a worker replays when it connects). A failure is
    /// logged and swallowed: the database already holds the change.
    pub async fn publish(&self, event: &Event) {
        let Some(inner) = self.inner.read().await.clone() else {
            tracing::warn!(bus.key = %event.key(), "NATS not connected; workers see the change on their next call");
            return;
        };
        let value = bytes::Bytes::from(format!("{};{}", event.value(), now_ns()));
        let fast = async {
            inner.client.publish(format!("{PUSH_PREFIX}{}", event.key()), value.clone()).await?;
            inner.client.flush().await.map_err(|e| nats_error(e).to_string())?;
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        };
        match tokio::time::timeout(Duration::from_secs(2), fast).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(bus.key = %event.key(), error = %e, "fast push failed"),
            Err(_) => tracing::warn!(bus.key = %event.key(), "fast push timed out"),
        }
        let put =
            tokio::time::timeout(Duration::from_secs(2), inner.kv.put(event.key(), value)).await;
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

    /// Whether NATS takes a write now (a cluster that lost a node has elected new leaders):
    /// writes a probe key that no process reads.
    pub async fn probe(&self) -> Result<()> {
        let inner = self.inner.read().await.clone().ok_or_else(|| nats_error("not connected"))?;
        tokio::time::timeout(
            Duration::from_secs(2),
            inner.kv.put("probe", bytes::Bytes::from_static(b"1")),
        )
        .await
        .map_err(|_| nats_error("probe timed out"))?
        .map_err(nats_error)?;
        Ok(())
    }

    /// Every current entry (history replay), then every change, merged with the fast path's
    /// messages. A change usually arrives twice; its stamp tells the copies apart. `None`
    /// while NATS is not connected yet.
    pub async fn watch(&self) -> Option<Result<impl futures_util::Stream<Item = Pushed> + use<>>> {
        let inner = self.inner.read().await.clone()?;
        let pushes = match inner.client.subscribe(format!("{PUSH_PREFIX}>")).await {
            Ok(subscription) => subscription,
            Err(e) => return Some(Err(nats_error(e))),
        };
        Some(match inner.kv.watch_with_history(">").await {
            Ok(watch) => {
                let history = watch.filter_map(|entry| async move {
                    let entry = entry.ok()?;
                    let mut pushed = Pushed::parse(&entry.key, &entry.value)?;
                    if pushed.sent_ns == 0 {
                        pushed.sent_ns = entry.created.unix_timestamp_nanos();
                    }
                    Some(pushed)
                });
                let fast = pushes.filter_map(|message| async move {
                    let key = message.subject.as_str().strip_prefix(PUSH_PREFIX)?.to_owned();
                    Pushed::parse(&key, &message.payload)
                });
                Ok(futures_util::stream::select(history, fast))
            }
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
            Event::TenantAccess { tenant: "ten_7abc".into(), on: false },
            Event::Revoked { connection: "con_42xyz".into() },
            Event::TenantChanged { tenant: "ten_7abc".into() },
        ] {
            assert_eq!(Event::parse(&e.key(), e.value().as_bytes()), Some(e.clone()));
            let stamped = format!("{};1764600000000000042", e.value());
            let pushed = Pushed::parse(&e.key(), stamped.as_bytes()).expect("stamped");
            assert_eq!((pushed.event, pushed.sent_ns), (e, 1764600000000000042));
        }
        assert_eq!(Event::parse("switch.tenant.x", b"on"), None);
        // Keys of the serial-id era name nothing: a bucket shared with another installation
        // (or restored from a backup) cannot revoke this one's connection 42.
        assert_eq!(Event::parse("revoked.42", b"revoked"), None);
        assert_eq!(Event::parse("switch.tenant.7", b"off"), None);
        assert_eq!(Event::parse("revoked.con_a.b", b"revoked"), None);
        assert_eq!(Pushed::parse("probe", b"1"), None, "the probe key is no event");
        assert_eq!(Pushed::parse("switch.global", b"on;garbage").map(|p| p.sent_ns), Some(0));
    }
}
