//! Live tool lists: the `subscriptions/listen` streams a worker holds (MCP 2026-07-28,
//! SEP-2575), and what wakes them.
//!
//! A stream is one listen request's response. It is told `toolsListChanged` when, and only
//! when, the tool list its connection would see now differs from the one it saw last. What
//! wakes it is the push the worker already receives over NATS (a tenant's people, policy or
//! connections changed, a switch flipped, a connection revoked), never polling; a woken
//! stream re-reads its connection's context exactly as a new request would (the credential,
//! its rights, the creator's role, the switches) and compares digests of the list. A worker
//! that lost NATS wakes every stream when it watches again, so missed pushes are made up.
//! A credential that stopped working (revoked, expired, its creator gone) ends the stream with
//! its final result; an OAuth access token's stream ends when the token expires.
//!
//! Streams are bounded per connection and per worker; past a bound the listen request is
//! refused with a JSON-RPC error that says which bound and what to do. An idle stream is a
//! parked task and a map entry: no timer, no query.
//!
//! **One re-read per credential and push.** The streams a push wakes that present the same
//! credential share one re-read ([`Streams::reread`]): the work a change costs grows with the
//! distinct credentials it concerns, not with their streams (a client that opened eight streams,
//! or eight clients on one connection's token, make one read). Every push starts a new round,
//! so a stream woken by a later change never takes an answer read before it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use shared::bus::Event;
use tokio::sync::{Notify, OnceCell};

/// What a woken stream learns from re-reading its credential's context.
#[derive(Clone, Debug)]
pub enum Reread {
    /// The list it would see now (a digest), and when the credential expires.
    Fresh { digest: Vec<u8>, expires_at: Option<jiff::Timestamp> },
    /// The credential stopped working: the stream ends.
    Ended(shared::auth::AuthFailure),
    /// The database could not answer: look again in a moment.
    Failed,
}

/// One round's shared re-read of one credential.
pub type RereadCell = Arc<OnceCell<Reread>>;

/// Listen streams one connection may hold open at once, on one worker.
pub const MAX_PER_CONNECTION: usize = 8;
/// Streams re-reading their context at once on one worker: a push that wakes thousands makes
/// a queue, not a stampede on the database pool.
pub const RECHECKS_AT_ONCE: usize = 8;
/// Listen streams one worker holds at most unless told otherwise (`--max-listen-streams`):
/// about 1 GiB of memory at the measured 100 KiB a stream (docs/benchmarks.md).
pub const DEFAULT_MAX_PER_WORKER: usize = 10_000;

/// The streams this worker holds, by tenant and by connection (both by handle).
pub struct Streams {
    inner: Mutex<Inner>,
    max_per_worker: usize,
    next: AtomicU64,
    /// How many pushed changes that may concern a credential (a revocation, a tenant change)
    /// this worker has received: a listen request notes it before it authenticates, and a
    /// stream opened after one arrived re-reads its credential at once ([`Streams::open`]).
    rechecks: AtomicU64,
}

/// What wakes one stream, and whether the change may concern its credential (a revocation, a
/// tenant change such as a deleted access token, a missed push): then the stream re-reads its
/// credential even while the tenant's agents are turned away, so a credential revoked while
/// its tenant is off ends its stream at once. A switch alone needs no read: the list is empty.
#[derive(Default)]
pub struct Wake {
    notify: Notify,
    recheck: AtomicBool,
}

impl Wake {
    pub async fn notified(&self) {
        self.notify.notified().await;
    }

    /// Wakes the stream to look again, its credential included (after a failed re-read).
    pub fn again(&self) {
        self.recheck.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    /// Whether a change since the stream last looked may concern its credential; clears it.
    pub fn take_recheck(&self) -> bool {
        self.recheck.swap(false, Ordering::AcqRel)
    }
}

#[derive(Default)]
struct Inner {
    by_tenant: HashMap<String, HashMap<u64, Arc<Wake>>>,
    by_connection: HashMap<String, HashMap<u64, Arc<Wake>>>,
    total: usize,
    /// This round's re-reads, by credential (the SHA-256 of its `Authorization` value).
    rereads: HashMap<Vec<u8>, RereadCell>,
}

/// Why a listen request was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Full {
    Connection,
    Worker,
}

impl Full {
    pub fn message(&self) -> String {
        match self {
            Full::Connection => format!(
                "This connection holds {MAX_PER_CONNECTION} listen streams on this server already; close one (one stream per client is enough) and listen again."
            ),
            Full::Worker => {
                "This server holds as many listen streams as it takes; retry in a minute (the balancer may send you to another).".into()
            }
        }
    }
}

/// One open stream's place in the maps; leaving it (the stream ended) takes it out.
pub struct Registered {
    streams: Arc<Streams>,
    id: u64,
    tenant: String,
    connection: String,
    pub wake: Arc<Wake>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut guard = self.streams.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner: &mut Inner = &mut guard;
        for (map, key) in
            [(&mut inner.by_tenant, &self.tenant), (&mut inner.by_connection, &self.connection)]
        {
            if let Some(streams) = map.get_mut(key) {
                streams.remove(&self.id);
                if streams.is_empty() {
                    map.remove(key);
                }
            }
        }
        inner.total = inner.total.saturating_sub(1);
    }
}

impl Default for Streams {
    fn default() -> Self {
        Streams::new(DEFAULT_MAX_PER_WORKER)
    }
}

impl Streams {
    pub fn new(max_per_worker: usize) -> Self {
        Streams {
            inner: Mutex::default(),
            max_per_worker: max_per_worker.max(1),
            next: AtomicU64::new(1),
            rechecks: AtomicU64::new(0),
        }
    }

    /// The count of pushed changes that may concern a credential, as a listen request notes it
    /// before it authenticates (see [`Streams::open`]).
    pub fn rechecks_seen(&self) -> u64 {
        self.rechecks.load(Ordering::SeqCst)
    }

    /// Registers a stream of a connection of a tenant, within the bounds. `seen` is
    /// [`Streams::rechecks_seen`] from before the request's credential was read: a change pushed
    /// since (a revocation committed between that read and this registration, which woke no
    /// stream of it) makes the new stream re-read its credential at once.
    pub fn open(
        self: &Arc<Self>,
        tenant: &str,
        connection: &str,
        seen: u64,
    ) -> Result<Registered, Full> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.total >= self.max_per_worker {
            return Err(Full::Worker);
        }
        if inner.by_connection.get(connection).map_or(0, HashMap::len) >= MAX_PER_CONNECTION {
            return Err(Full::Connection);
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Wake::default());
        inner.by_tenant.entry(tenant.to_owned()).or_default().insert(id, wake.clone());
        inner.by_connection.entry(connection.to_owned()).or_default().insert(id, wake.clone());
        inner.total += 1;
        drop(inner);
        // Registered first, counted after: a change counted after this read finds the stream
        // registered and wakes it; one counted before is seen here.
        if self.rechecks.load(Ordering::SeqCst) != seen {
            wake_all(vec![&wake], true);
        }
        Ok(Registered {
            streams: self.clone(),
            id,
            tenant: tenant.to_owned(),
            connection: connection.to_owned(),
            wake,
        })
    }

    /// The re-read this round shares among the streams of one credential (`key`: a digest
    /// of the credential): the first stream to ask reads, the others wait for its answer.
    pub fn reread(&self, key: Vec<u8>) -> RereadCell {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.rereads.entry(key).or_default().clone()
    }

    /// Drops this round's shared re-read of a credential when it failed, so the next try reads
    /// again instead of meeting the same failure.
    pub fn forget_reread(&self, key: &[u8], failed: &RereadCell) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.rereads.get(key).is_some_and(|c| Arc::ptr_eq(c, failed)) {
            inner.rereads.remove(key);
        }
    }

    /// How many streams this worker holds.
    pub fn open_count(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).total
    }

    /// Wakes the streams a pushed change may concern. A woken stream re-reads and compares;
    /// waking one whose list did not change sends nothing.
    pub fn poke(&self, event: &Event) {
        if matches!(event, Event::TenantChanged { .. } | Event::Revoked { .. }) {
            self.rechecks.fetch_add(1, Ordering::SeqCst);
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        // A new round: what was read before this change is not shared after it.
        inner.rereads.clear();
        let (woken, recheck) = match event {
            Event::GlobalKill(_) => {
                (inner.by_tenant.values().flat_map(HashMap::values).collect(), false)
            }
            Event::TenantAccess { tenant, .. } => (
                inner.by_tenant.get(tenant).map(|s| s.values().collect()).unwrap_or_default(),
                false,
            ),
            Event::TenantChanged { tenant } => (
                inner.by_tenant.get(tenant).map(|s| s.values().collect()).unwrap_or_default(),
                true,
            ),
            Event::Revoked { connection } => (
                inner
                    .by_connection
                    .get(connection)
                    .map(|s| s.values().collect())
                    .unwrap_or_default(),
                true,
            ),
        };
        wake_all(woken, recheck);
    }

    /// Wakes every stream (NATS came back: pushes may have been missed). A stream whose tenant
    /// is on re-reads in any case; one turned away need not: the bucket replays every key's
    /// latest change on the watch's return, and a revocation among them asks for its re-read.
    pub fn poke_all(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.rereads.clear();
        wake_all(inner.by_tenant.values().flat_map(HashMap::values).collect(), false);
    }
}

/// `notify_one` keeps a permit for a stream busy re-reading, so a change arriving meanwhile
/// is never lost; many changes before it looks again make one re-read. `recheck` is set before
/// the permit, so the stream that wakes sees it.
fn wake_all(streams: Vec<&Arc<Wake>>, recheck: bool) {
    for s in streams {
        if recheck {
            s.recheck.store(true, Ordering::Release);
        }
        s.notify.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn streams_are_bounded_and_woken_by_what_concerns_them() {
        let streams = Arc::new(Streams::new(10));
        let a: Vec<_> = (0..MAX_PER_CONNECTION)
            .map(|_| streams.open("ten_a", "con_a", 0).expect("room"))
            .collect();
        assert_eq!(streams.open("ten_a", "con_a", 0).err(), Some(Full::Connection));
        let b = streams.open("ten_b", "con_b", 0).expect("another connection");
        let _c = streams.open("ten_b", "con_c", 0).expect("room");
        assert_eq!(streams.open("ten_b", "con_d", 0).err(), Some(Full::Worker));
        // A change of tenant b wakes b's streams only.
        streams.poke(&Event::TenantChanged { tenant: "ten_b".into() });
        tokio::time::timeout(std::time::Duration::from_millis(100), b.wake.notified())
            .await
            .expect("b woken");
        let quiet =
            tokio::time::timeout(std::time::Duration::from_millis(50), a[0].wake.notified()).await;
        assert!(quiet.is_err(), "a's streams stay asleep");
        // A revocation wakes its connection's streams; the global switch wakes all.
        streams.poke(&Event::Revoked { connection: "con_a".into() });
        tokio::time::timeout(std::time::Duration::from_millis(100), a[3].wake.notified())
            .await
            .expect("a woken");
        // What may concern a credential asks for a re-read of it; a switch alone does not.
        assert!(a[3].wake.take_recheck(), "a revocation re-reads the credential");
        assert!(b.wake.take_recheck(), "a tenant change re-reads the credential");
        assert!(!b.wake.take_recheck(), "taken once");
        streams.poke(&Event::GlobalKill(true));
        tokio::time::timeout(std::time::Duration::from_millis(100), b.wake.notified())
            .await
            .expect("b woken again");
        assert!(!b.wake.take_recheck(), "the global switch needs no read");
        streams.poke(&Event::TenantAccess { tenant: "ten_b".into(), on: false });
        assert!(!b.wake.take_recheck(), "a tenant switch needs no read");
        streams.poke_all();
        assert!(!b.wake.take_recheck(), "the bucket's replay asks for what concerns it");
        // Ending streams frees their room.
        drop(a);
        assert_eq!(streams.open_count(), 2);
        streams.open("ten_a", "con_a", 0).expect("room again");
    }

    #[tokio::test]
    async fn a_stream_opened_after_a_change_it_could_not_hear_rereads_its_credential() {
        let streams = Arc::new(Streams::new(10));
        // Noted before the credential is read; nothing changed by the time it registers.
        let seen = streams.rechecks_seen();
        let quiet = streams.open("ten_a", "con_a", seen).expect("room");
        assert!(!quiet.wake.take_recheck(), "nothing to re-read");
        // A revocation pushed between the read and the registration woke no stream of it.
        let seen = streams.rechecks_seen();
        streams.poke(&Event::Revoked { connection: "con_b".into() });
        let late = streams.open("ten_a", "con_b", seen).expect("room");
        tokio::time::timeout(std::time::Duration::from_millis(100), late.wake.notified())
            .await
            .expect("woken at once");
        assert!(late.wake.take_recheck(), "it re-reads its credential");
        // A switch alone is no such change.
        let seen = streams.rechecks_seen();
        streams.poke(&Event::GlobalKill(true));
        let after_switch = streams.open("ten_a", "con_c", seen).expect("room");
        assert!(!after_switch.wake.take_recheck());
    }
}
