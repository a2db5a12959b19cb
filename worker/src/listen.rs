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
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use axum::body::Bytes;
use futures_util::Stream;
use futures_util::task::AtomicWaker;
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

/// The digest of the list a stream sees while its tenant's agents are turned away (a switch
/// off): empty, whatever its credential, so no read is needed to know it.
pub const TURNED_AWAY: &[u8] = b"agents turned away";

/// What wakes one stream, and whether the change may concern its credential (a revocation, a
/// tenant change such as a deleted access token, a missed push): then the stream re-reads its
/// credential even while the tenant's agents are turned away, so a credential revoked while
/// its tenant is off ends its stream at once. A switch alone needs no read: the list is empty,
/// and a stream whose task is not looking is told so at once ([`Wake::turned_away`]).
#[derive(Default)]
pub struct Wake {
    notify: Notify,
    recheck: AtomicBool,
    looked: Mutex<Looked>,
}

/// What a stream last saw, shared by its task and the switch's fan-out, so that either may
/// decide whether the list changed and never both on different grounds.
#[derive(Default)]
struct Looked {
    /// The digest of the list the stream last saw (its client was told of it, or saw it
    /// itself); `None` until the task has looked once.
    seen: Option<std::borrow::Cow<'static, [u8]>>,
    /// The task is looking now: what it finds decides, and a switch wakes it to look again.
    busy: bool,
    /// Whether the client asked to be told of a changed list.
    tells: bool,
    /// Where the stream is told without its task, when the entry point attached it to the
    /// response; a stream told through rmcp is told by its task, which alone can.
    direct: Option<Arc<Direct>>,
}

/// What a switch's fan-out did for one stream ([`Wake::turned_away`]).
#[derive(Debug, PartialEq, Eq)]
pub enum TurnedAway {
    /// Told its list is now empty, written into its response.
    Told,
    /// Its list was empty already, or its client asked not to be told: nothing sent.
    Quiet,
    /// Its task was looking (or the stream tells only through rmcp): woken to look again.
    Woken,
}

impl Wake {
    /// The stream's first look: the list its connection sees as it opens, whether its client
    /// is told of changes, and where it is told without its task.
    pub fn start(&self, seen: Vec<u8>, tells: bool, direct: Option<Arc<Direct>>) {
        let mut looked = self.looked.lock().unwrap_or_else(|p| p.into_inner());
        *looked = Looked { seen: Some(seen.into()), busy: false, tells, direct };
    }

    /// The task begins to look (it was woken).
    pub fn begin_look(&self) {
        self.looked.lock().unwrap_or_else(|p| p.into_inner()).busy = true;
    }

    /// The task found `now`: whether it differs from what the stream saw last (then the task
    /// tells its client). Either way the stream has now seen it.
    pub fn end_look(&self, now: Vec<u8>) -> bool {
        let mut looked = self.looked.lock().unwrap_or_else(|p| p.into_inner());
        looked.busy = false;
        if looked.seen.as_deref() == Some(now.as_slice()) {
            return false;
        }
        looked.seen = Some(now.into());
        true
    }

    /// The task could not look (the database was away); it will look again.
    pub fn end_look_failed(&self) {
        self.looked.lock().unwrap_or_else(|p| p.into_inner()).busy = false;
    }

    /// The stream's tenant was just turned away (a switch off, applied before this call): its
    /// list is empty whatever its credential. A stream whose task is not looking is told here,
    /// from the push, without waking its task (a switch reaches ten thousand streams at once,
    /// and a task's turn per stream doubled the fan-out's cost); one whose task is looking is
    /// woken to look again, and sees the switch itself.
    pub fn turned_away(&self) -> TurnedAway {
        let mut looked = self.looked.lock().unwrap_or_else(|p| p.into_inner());
        let through_rmcp = looked.tells && !looked.direct.as_ref().is_some_and(|d| d.attached());
        let by_task = looked.busy || looked.seen.is_none() || through_rmcp;
        if by_task {
            drop(looked);
            self.notify.notify_one();
            return TurnedAway::Woken;
        }
        // A client that left: its task ends the stream (a push was its only wake before).
        if looked.direct.as_ref().is_some_and(|d| d.closed()) {
            drop(looked);
            self.notify.notify_one();
            return TurnedAway::Woken;
        }
        if looked.seen.as_deref() == Some(TURNED_AWAY) {
            return TurnedAway::Quiet;
        }
        looked.seen = Some(std::borrow::Cow::Borrowed(TURNED_AWAY));
        if !looked.tells {
            return TurnedAway::Quiet;
        }
        let direct = looked.direct.clone();
        drop(looked);
        match direct {
            Some(direct) if direct.tell() => TurnedAway::Told,
            // Gone between the look and the tell: its task ends the stream.
            _ => {
                self.notify.notify_one();
                TurnedAway::Woken
            }
        }
    }

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
    /// Where the stream's task tells its response directly ([`Direct`]).
    pub direct: Arc<Direct>,
    /// Cancelled when the stream's connection is revoked (the request's in-flight token, set
    /// by the entry point): the task then ends the stream with its final result at once.
    pub revoked: Option<tokio_util::sync::CancellationToken>,
}

/// A listen stream's `toolsListChanged` events, written by its task straight into its response.
///
/// Through rmcp, each event went from the stream's task to the request's service loop, which
/// spawned a task to hand it to the transport, whose channel fed the response body, and an
/// answer went back to the stream's task: five task hops and a spawn per stream and event, most
/// of a switch's fan-out to ten thousand streams (docs/benchmarks.md). Here the task counts the
/// event and wakes the response's body, which writes the event's bytes (the very message rmcp
/// would write, made once per stream with rmcp's types) between what rmcp sends: never before
/// rmcp's acknowledgement, and always before what rmcp sends after the event was told (the
/// stream's final result). A stream whose response the entry point did not attach (a request
/// that reached rmcp another way) tells through rmcp as before.
#[derive(Default)]
pub struct Direct {
    attached: AtomicBool,
    closed: AtomicBool,
    pending: AtomicUsize,
    event: OnceLock<Bytes>,
    waker: AtomicWaker,
}

impl Direct {
    /// Whether the response reads from here.
    pub fn attached(&self) -> bool {
        self.attached.load(Ordering::Acquire)
    }

    /// The bytes of one event (set once, by the stream's task).
    pub fn set_event(&self, event: Bytes) {
        let _ = self.event.set(event);
    }

    /// Tells nothing more, and drops what was told but not yet written: the stream is ending
    /// (its connection was revoked).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.pending.store(0, Ordering::Release);
    }

    /// Whether the response is gone (the client left), or the stream is ending.
    pub fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// One event for the response; `false` when the response is gone (the client left).
    pub fn tell(&self) -> bool {
        if self.closed.load(Ordering::Acquire) || self.event.get().is_none() {
            return false;
        }
        self.pending.fetch_add(1, Ordering::AcqRel);
        self.waker.wake();
        true
    }

    fn take(&self) -> Option<Bytes> {
        let event = self.event.get()?;
        self.pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .ok()
            .map(|_| event.clone())
    }
}

/// The listen response's body: rmcp's (its acknowledgement first, keep-alives, the final result)
/// with the stream task's events between.
pub fn attach(direct: Arc<Direct>, body: axum::body::Body) -> axum::body::Body {
    direct.attached.store(true, Ordering::Release);
    let (inner_wake, inner_waker) = WokenFlag::new();
    axum::body::Body::from_stream(Merged {
        inner: body.into_data_stream(),
        inner_waker,
        inner_wake,
        direct,
        acknowledged: false,
        stashed: None,
        done: false,
    })
}

/// Whether a future or stream polled under it woke since it was last polled: what wraps it polls
/// it only then. rmcp's part of a listen body is polled only when it woke, so an event written
/// directly does not cost a poll of rmcp's whole stream (its channel, its cancellation check)
/// for nothing; the same holds for the revocation that ends an SSE response
/// (`entry::answers::end_stream_on_revocation`).
pub(crate) struct WokenFlag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl WokenFlag {
    /// A flag that starts woken (the first poll polls), and the waker to poll under.
    pub(crate) fn new() -> (Arc<WokenFlag>, std::task::Waker) {
        let flag = Arc::new(WokenFlag { woken: AtomicBool::new(true), task: AtomicWaker::new() });
        let waker = std::task::Waker::from(flag.clone());
        (flag, waker)
    }

    /// Registers the task to wake when what it guards wakes.
    pub(crate) fn register(&self, cx: &Context<'_>) {
        self.task.register(cx.waker());
    }

    /// Takes the flag: whether to poll what it guards now.
    pub(crate) fn take(&self) -> bool {
        self.woken.swap(false, Ordering::AcqRel)
    }

    /// Polls again without a wake (what it guards answered and may have more at once).
    pub(crate) fn rearm(&self) {
        self.woken.store(true, Ordering::Release);
    }
}

impl std::task::Wake for WokenFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

struct Merged {
    inner: axum::body::BodyDataStream,
    inner_wake: Arc<WokenFlag>,
    inner_waker: std::task::Waker,
    direct: Arc<Direct>,
    /// rmcp's first message (the acknowledgement) went out: events may follow.
    acknowledged: bool,
    /// rmcp's chunk held back behind an event told before it was sent.
    stashed: Option<Bytes>,
    done: bool,
}

impl Stream for Merged {
    type Item = Result<Bytes, axum::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        this.inner_wake.register(cx);
        if this.acknowledged {
            this.direct.waker.register(cx.waker());
            if let Some(event) = this.direct.take() {
                return Poll::Ready(Some(Ok(event)));
            }
        }
        if let Some(chunk) = this.stashed.take() {
            return Poll::Ready(Some(Ok(chunk)));
        }
        if this.done {
            return Poll::Ready(None);
        }
        if !this.inner_wake.take() {
            return Poll::Pending;
        }
        let polled =
            Pin::new(&mut this.inner).poll_next(&mut Context::from_waker(&this.inner_waker));
        if polled.is_ready() {
            // A stream that answered may have more at once, without waking again.
            this.inner_wake.rearm();
        }
        match polled {
            Poll::Ready(Some(Ok(chunk))) => {
                // An event told before rmcp sent this (the final result comes after the task
                // told its last event) goes first.
                if this.acknowledged
                    && let Some(event) = this.direct.take()
                {
                    this.stashed = Some(chunk);
                    return Poll::Ready(Some(Ok(event)));
                }
                this.acknowledged = true;
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(None) => {
                this.done = true;
                Poll::Ready(this.direct.take().map(Ok))
            }
            other => other,
        }
    }
}

impl Drop for Merged {
    fn drop(&mut self) {
        self.direct.closed.store(true, Ordering::Release);
    }
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
        let direct = Arc::new(Direct::default());
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
            direct,
            revoked: None,
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

    /// A switch just turned the agents of `tenant` away (`None`: of every tenant, the global
    /// switch): each of its streams is told its list is empty, from here, or has its task woken
    /// to look (see [`Wake::turned_away`]). How many were told.
    pub fn turn_away(&self, tenant: Option<&str>) -> usize {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.rereads.clear();
        let streams: Vec<&Arc<Wake>> = match tenant {
            Some(tenant) => {
                inner.by_tenant.get(tenant).map(|s| s.values().collect()).unwrap_or_default()
            }
            None => inner.by_tenant.values().flat_map(HashMap::values).collect(),
        };
        streams.into_iter().filter(|s| s.turned_away() == TurnedAway::Told).count()
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
    use futures_util::StreamExt;

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

    /// What a stream's task tells goes into its response after rmcp's acknowledgement, in the
    /// order told and before what rmcp sends after it (the final result); a response that is
    /// gone is told nothing more.
    async fn next(body: &mut axum::body::BodyDataStream) -> Option<String> {
        tokio::time::timeout(std::time::Duration::from_millis(100), body.next())
            .await
            .ok()
            .flatten()
            .map(|chunk| String::from_utf8_lossy(&chunk.expect("chunk")).into_owned())
    }

    #[tokio::test]
    async fn a_streams_events_are_written_between_rmcps_messages_in_order() {
        let direct = Arc::new(Direct::default());
        assert!(!direct.tell(), "no event made yet: nothing to tell");
        direct.set_event(Bytes::from_static(b"data: changed\n\n"));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Result<Bytes, std::io::Error>>();
        let rmcp = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
        assert!(!direct.attached());
        let mut body =
            attach(direct.clone(), axum::body::Body::from_stream(rmcp)).into_data_stream();
        assert!(direct.attached());
        // Told before the acknowledgement: held until it went.
        assert!(direct.tell());
        assert_eq!(next(&mut body).await, None, "nothing before the acknowledgement");
        tx.send(Ok(Bytes::from_static(b"data: ack\n\n"))).expect("send");
        assert_eq!(next(&mut body).await.as_deref(), Some("data: ack\n\n"));
        assert_eq!(next(&mut body).await.as_deref(), Some("data: changed\n\n"));
        // Two told, then rmcp's final result: both events first.
        assert!(direct.tell());
        assert!(direct.tell());
        tx.send(Ok(Bytes::from_static(b"data: result\n\n"))).expect("send");
        drop(tx);
        assert_eq!(next(&mut body).await.as_deref(), Some("data: changed\n\n"));
        assert_eq!(next(&mut body).await.as_deref(), Some("data: changed\n\n"));
        assert_eq!(next(&mut body).await.as_deref(), Some("data: result\n\n"));
        let end = tokio::time::timeout(std::time::Duration::from_secs(5), body.next()).await;
        assert!(matches!(end, Ok(None)), "the body ends with rmcp's stream");
        assert!(!direct.closed());
        drop(body);
        assert!(direct.closed());
        assert!(!direct.tell(), "the response is gone");
    }

    /// A body already waiting is woken by a tell from another task, and by rmcp's next chunk.
    #[tokio::test]
    async fn a_waiting_response_is_woken_by_a_tell_and_by_rmcp() {
        let direct = Arc::new(Direct::default());
        direct.set_event(Bytes::from_static(b"data: changed\n\n"));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Result<Bytes, std::io::Error>>();
        let rmcp = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let mut body =
            attach(direct.clone(), axum::body::Body::from_stream(rmcp)).into_data_stream();
        tx.send(Ok(Bytes::from_static(b"data: ack\n\n"))).expect("send");
        assert_eq!(next(&mut body).await.as_deref(), Some("data: ack\n\n"));
        // The body waits in a task of its own and hands on each chunk as it comes.
        let (got, mut chunks) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(chunk) = body.next().await {
                let _ = got.send(chunk.expect("chunk"));
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(chunks.try_recv().is_err(), "nothing to write yet");
        // A tell from another thread wakes it: the event arrives with nothing else sent.
        let teller = direct.clone();
        std::thread::spawn(move || assert!(teller.tell())).join().expect("tell");
        let first = tokio::time::timeout(std::time::Duration::from_secs(5), chunks.recv())
            .await
            .expect("woken by the tell");
        assert_eq!(first.as_deref(), Some(&b"data: changed\n\n"[..]));
        // rmcp's next chunk wakes it too.
        tx.send(Ok(Bytes::from_static(b"data: keep-alive\n\n"))).expect("send");
        let second = tokio::time::timeout(std::time::Duration::from_secs(5), chunks.recv())
            .await
            .expect("woken by rmcp");
        assert_eq!(second.as_deref(), Some(&b"data: keep-alive\n\n"[..]));
    }

    /// The event is the message rmcp's subscription sink sends: `toolsListChanged` with the
    /// listen request's id as its subscription id, one SSE `data` line.
    #[test]
    fn the_event_is_the_notification_rmcp_sends() {
        let id = rmcp::model::NumberOrString::String("listen-7".into());
        let event = crate::mcp::tools_changed_event(&id);
        let text = String::from_utf8(event.to_vec()).expect("utf-8");
        let json = text
            .strip_prefix("data: ")
            .and_then(|t| t.strip_suffix("\n\n"))
            .expect("one data line");
        assert!(!json.contains('\n'), "{text}");
        let message: serde_json::Value = serde_json::from_str(json).expect("json");
        assert_eq!(message["jsonrpc"], "2.0", "{message}");
        assert_eq!(message["method"], "notifications/tools/list_changed", "{message}");
        assert_eq!(
            message["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "listen-7",
            "{message}"
        );
        // rmcp reads it back as the notification it is, with its subscription.
        let parsed: rmcp::model::ServerJsonRpcMessage =
            serde_json::from_str(json).expect("rmcp's message");
        let rmcp::model::ServerJsonRpcMessage::Notification(n) = parsed else {
            panic!("a notification: {json}")
        };
        assert!(matches!(
            n.notification,
            rmcp::model::ServerNotification::ToolListChangedNotification(_)
        ));
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

    /// Whether a permit is waiting for the stream's task (it was woken).
    async fn woken(wake: &Wake) -> bool {
        tokio::time::timeout(std::time::Duration::from_millis(20), wake.notified()).await.is_ok()
    }

    #[tokio::test]
    async fn a_switch_tells_an_idle_stream_itself_and_wakes_a_looking_one() {
        let streams = Arc::new(Streams::new(10));
        let told = |r: &Registered| {
            let mut n = 0;
            while r.direct.take().is_some() {
                n += 1;
            }
            n
        };
        let attached = |r: &Registered| {
            r.direct.attached.store(true, Ordering::Release);
            r.direct.set_event(Bytes::from_static(b"data: changed\n\n"));
            r.direct.clone()
        };
        // Not looked yet: its task decides.
        let fresh = streams.open("ten_a", "con_a", 0).expect("room");
        assert_eq!(fresh.wake.turned_away(), TurnedAway::Woken);
        assert!(woken(&fresh.wake).await);
        // Idle, told through its response: told here, once, without its task.
        let idle = streams.open("ten_a", "con_b", 0).expect("room");
        idle.wake.start(b"list".to_vec(), true, Some(attached(&idle)));
        assert_eq!(idle.wake.turned_away(), TurnedAway::Told);
        assert_eq!(told(&idle), 1);
        assert!(!woken(&idle.wake).await, "its task sleeps on");
        assert_eq!(idle.wake.turned_away(), TurnedAway::Quiet, "empty already");
        assert_eq!(told(&idle), 0);
        // Its task, woken later by something else, finds the same empty list: nothing to tell;
        // the switch back on gives it a list again, which it tells.
        idle.wake.begin_look();
        assert!(!idle.wake.end_look(TURNED_AWAY.to_vec()));
        idle.wake.begin_look();
        assert!(idle.wake.end_look(b"list".to_vec()));
        // Looking (a re-read begun before the switch): woken to look again; what it read
        // before is stale, and the next look sees the switch and tells.
        let busy = streams.open("ten_a", "con_c", 0).expect("room");
        busy.wake.start(b"list".to_vec(), true, Some(attached(&busy)));
        busy.wake.begin_look();
        assert_eq!(busy.wake.turned_away(), TurnedAway::Woken);
        assert_eq!(told(&busy), 0, "not told behind its task's back");
        assert!(!busy.wake.end_look(b"list".to_vec()), "the stale read changes nothing");
        assert!(woken(&busy.wake).await, "and it looks again");
        busy.wake.begin_look();
        assert!(busy.wake.end_look(TURNED_AWAY.to_vec()), "then it tells");
        // Told through rmcp (its response not attached): its task tells. Not asking to be told: nothing sent, and
        // its task later finds nothing new.
        let through_rmcp = streams.open("ten_a", "con_d", 0).expect("room");
        through_rmcp.wake.start(b"list".to_vec(), true, Some(through_rmcp.direct.clone()));
        assert_eq!(through_rmcp.wake.turned_away(), TurnedAway::Woken);
        let silent = streams.open("ten_a", "con_e", 0).expect("room");
        silent.wake.start(b"list".to_vec(), false, Some(silent.direct.clone()));
        assert_eq!(silent.wake.turned_away(), TurnedAway::Quiet);
        assert!(!woken(&silent.wake).await);
        silent.wake.begin_look();
        assert!(!silent.wake.end_look(TURNED_AWAY.to_vec()));
        // A client that left: its task is woken to end the stream.
        let gone = streams.open("ten_a", "con_f", 0).expect("room");
        gone.wake.start(b"list".to_vec(), true, Some(attached(&gone)));
        gone.direct.closed.store(true, Ordering::Release);
        assert_eq!(gone.wake.turned_away(), TurnedAway::Woken);
        assert!(woken(&gone.wake).await);
        // Also when its list was empty already (a second switch): its task still ends it.
        let left = streams.open("ten_a", "con_i", 0).expect("room");
        left.wake.start(TURNED_AWAY.to_vec(), true, Some(attached(&left)));
        left.direct.closed.store(true, Ordering::Release);
        assert_eq!(left.wake.turned_away(), TurnedAway::Woken);
        drop(left);
        // The fan-out: the tenant's streams only, counting those told.
        let a = streams.open("ten_a", "con_g", 0).expect("room");
        a.wake.start(b"list".to_vec(), true, Some(attached(&a)));
        let b = streams.open("ten_b", "con_h", 0).expect("room");
        b.wake.start(b"list".to_vec(), true, Some(attached(&b)));
        // ten_a's streams with a list to lose: con_g's and con_b's (which had one again).
        assert_eq!(streams.turn_away(Some("ten_a")), 2);
        assert_eq!((told(&a), told(&idle), told(&b)), (1, 1, 0));
        assert_eq!(streams.turn_away(None), 1, "the global switch: ten_b's too");
        assert_eq!(told(&b), 1);
    }
}
