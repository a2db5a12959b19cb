//! The hot path's own connections: the one statement every MCP request runs first (the
//! connection context, with a tool's read when it reads ahead) on connections that go back to
//! their set without a round trip.
//!
//! sqlx's pool pings every connection it takes back (a `Sync` and its answer) and offers no
//! option to skip it; for a request whose work is one statement that ping is half its round
//! trips (docs/profile-read-path.md). A lane connection is handed back at once only by
//! [`LaneConn::done`], called after a statement ran to its end, when the connection is known to
//! be idle and ready; any other way out (an error, a cancelled request, a panic) sends it to be
//! checked with a ping in the background first, as the pool checks every connection, and closed
//! if it does not answer. A connection idle for over a second is pinged before use, as
//! the pool does, and so is every connection handed back before any connection last broke, so
//! those broken by a database restart are replaced before a request meets them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};

#[cfg(test)]
use super::IDLE_BEFORE_PING;
use super::check_before_use;

/// How long a request may wait for a lane connection, connecting or checking it included,
/// before it is told the database is unavailable.
const WAIT: Duration = Duration::from_secs(5);
/// A connection older than this is replaced when it is next taken (as the pool's
/// `max_lifetime`), so the lane follows a failover or a changed DNS name.
const LIFETIME: Duration = Duration::from_secs(30 * 60);
/// An idle connection unused for this long is closed (as the pool's `idle_timeout`).
const IDLE_CLOSE: Duration = Duration::from_secs(10 * 60);
/// How long recovering a connection whose statement was cut short may take.
const RECOVER: Duration = Duration::from_secs(5);

/// A connection with when it was opened.
struct Held {
    conn: PgConnection,
    born: Instant,
}

pub(crate) struct Lane {
    options: PgConnectOptions,
    /// Connections ready for a statement, with when each was handed back.
    idle: Mutex<Vec<(Held, Instant)>>,
    /// At most this many connections are out, idle or being recovered at once.
    room: Arc<Semaphore>,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane").field("available", &self.room.available_permits()).finish()
    }
}

impl Lane {
    pub(crate) fn new(options: PgConnectOptions, size: u32) -> Self {
        // A lane statement takes milliseconds: one stuck behind a lock (a migration's, say)
        // gives up instead of holding a lane connection, and a backend whose client left
        // does not wait on.
        let options = options.options([("lock_timeout", "2s"), ("statement_timeout", "5s")]);
        Lane {
            options,
            idle: Mutex::new(Vec::new()),
            room: Arc::new(Semaphore::new(size.max(1) as usize)),
        }
    }

    /// A connection for one statement: an idle one (checked first if it sat for over a second
    /// or predates a broken connection, replaced if it is old) or a new one; within [`WAIT`].
    pub(crate) async fn checkout(self: &Arc<Self>) -> Result<LaneConn> {
        tokio::time::timeout(WAIT, self.take())
            .await
            .map_err(|_| Error::Internal("no database connection within 5 s".into()))?
    }

    async fn take(self: &Arc<Self>) -> Result<LaneConn> {
        let permit =
            self.room.clone().acquire_owned().await.map_err(|e| Error::Internal(e.to_string()))?;
        let popped = self.idle.lock().ok().and_then(|mut idle| {
            // The longest idle sit at the bottom: after a burst, those idle for long or past
            // their lifetime are closed, so the lane shrinks back as the pool would.
            while idle.first().is_some_and(|(held, since)| {
                held.born.elapsed() > LIFETIME || since.elapsed() > IDLE_CLOSE
            }) {
                close_later(idle.remove(0).0.conn);
            }
            idle.pop()
        });
        let held = match popped {
            Some((held, _)) if held.born.elapsed() > LIFETIME => {
                close_later(held.conn);
                self.connect().await?
            }
            Some((held, since)) if !check_before_use(since.elapsed()) => held,
            Some((mut held, _)) => match held.conn.ping().await {
                Ok(()) => held,
                Err(_) => {
                    super::note_broken();
                    close_later(held.conn);
                    self.connect().await?
                }
            },
            None => self.connect().await?,
        };
        Ok(LaneConn { lane: self.clone(), held: Some(held), permit: Some(permit) })
    }

    async fn connect(&self) -> Result<Held> {
        Ok(Held { conn: self.options.connect().await?, born: Instant::now() })
    }

    fn hand_back(&self, held: Held) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push((held, Instant::now()));
        }
    }

    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle.lock().map(|idle| idle.len()).unwrap_or(0)
    }
}

/// One checked-out connection; see the module's doc for how it goes back.
pub(crate) struct LaneConn {
    lane: Arc<Lane>,
    held: Option<Held>,
    permit: Option<OwnedSemaphorePermit>,
}

impl LaneConn {
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        &mut self.held.as_mut().expect("a checked-out connection until done or dropped").conn
    }

    /// Hands the connection back: call only after a statement ran to its end.
    pub(crate) fn done(mut self) {
        if let Some(held) = self.held.take() {
            self.lane.hand_back(held);
        }
    }
}

impl Drop for LaneConn {
    /// A statement that failed or was cut short (a cancelled request) leaves the connection in
    /// a state only a round trip can settle: it is checked in the background, still counting
    /// against the lane's size, and handed back if it answers, closed if not. So a client that
    /// hangs up mid-request costs a ping, not a new connection.
    fn drop(&mut self) {
        let (Some(mut held), Ok(runtime)) =
            (self.held.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let (lane, permit) = (self.lane.clone(), self.permit.take());
        runtime.spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(RECOVER, held.conn.ping()).await {
                Ok(Ok(())) => lane.hand_back(held),
                Ok(Err(_)) => {
                    super::note_broken();
                    let _ = tokio::time::timeout(RECOVER, held.conn.close_hard()).await;
                }
                // Slow, not broken (a statement still running): closed, nothing else noted.
                Err(_) => {
                    let _ = tokio::time::timeout(RECOVER, held.conn.close_hard()).await;
                }
            }
        });
    }
}

/// Closes a connection without making anyone wait for it.
fn close_later(conn: PgConnection) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = tokio::time::timeout(RECOVER, conn.close_hard()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    /// The lane tests share the process-wide "a connection broke" mark: one at a time.
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    fn lane(size: u32) -> Arc<Lane> {
        let server = std::env::var("GATEHOUSE_TEST_PG")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
        let options = PgConnectOptions::from_str(&format!("{server}/postgres")).expect("url");
        Arc::new(Lane::new(options, size))
    }

    /// Waits until `n` connections are idle (a background check finished).
    async fn until_idle(lane: &Lane, n: usize) {
        for _ in 0..100 {
            if lane.idle_count() == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{} idle, expected {n}", lane.idle_count());
    }

    /// Ends a lane connection's backend from outside, as a database restart would.
    async fn terminate(lane: &Lane, pids: &[i32]) {
        let mut admin = PgConnection::connect_with(&lane.options).await.expect("admin");
        for pid in pids {
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .execute(&mut admin)
                .await
                .expect("terminate");
        }
    }

    async fn backend(lane: &Arc<Lane>) -> i32 {
        let mut c = lane.checkout().await.expect("checkout");
        let pid: i32 =
            sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(c.conn()).await.expect("pid");
        c.done();
        pid
    }

    #[tokio::test]
    async fn a_finished_statement_goes_back_at_once_and_any_other_only_after_a_check() {
        let _serial = SERIAL.lock().await;
        let lane = lane(2);
        let first = backend(&lane).await;
        assert_eq!(backend(&lane).await, first, "handed back, reused without reconnecting");
        assert_eq!(lane.idle_count(), 1);
        // A statement cut short (a client hung up) is not handed to the next request as is: it
        // is checked in the background (the check waits for the cut statement to end) and
        // then reused, so hanging up costs no new connection.
        let mut c = lane.checkout().await.expect("checkout");
        let cut = tokio::time::timeout(
            Duration::from_millis(100),
            sqlx::query("SELECT pg_sleep(0.5)").execute(c.conn()),
        )
        .await;
        assert!(cut.is_err(), "cut short");
        drop(c);
        assert_eq!(lane.idle_count(), 0, "not handed back before the check");
        until_idle(&lane, 1).await;
        assert_eq!(backend(&lane).await, first, "checked and reused");
        // A statement that failed: the same.
        let mut c = lane.checkout().await.expect("checkout");
        assert!(sqlx::query("SELECT 1/0").execute(c.conn()).await.is_err());
        drop(c);
        until_idle(&lane, 1).await;
        assert_eq!(backend(&lane).await, first);
        // A connection that does not answer the check is closed, never handed back.
        let mut c = lane.checkout().await.expect("checkout");
        terminate(&lane, &[first]).await;
        assert!(sqlx::query("SELECT 1").execute(c.conn()).await.is_err());
        drop(c);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(lane.idle_count(), 0);
        assert_ne!(backend(&lane).await, first, "a new connection");
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_replaced_before_use() {
        let _serial = SERIAL.lock().await;
        let lane = lane(1);
        let first = backend(&lane).await;
        terminate(&lane, &[first]).await;
        tokio::time::sleep(IDLE_BEFORE_PING + Duration::from_millis(100)).await;
        let next = backend(&lane).await;
        assert_ne!(next, first, "pinged, found closed, replaced");
    }

    #[tokio::test]
    async fn after_one_connection_breaks_the_others_are_checked_however_briefly_idle() {
        let _serial = SERIAL.lock().await;
        let lane = lane(2);
        let (mut a, mut b) = (lane.checkout().await.expect("a"), lane.checkout().await.expect("b"));
        let sql = "SELECT pg_backend_pid()";
        let pids = [
            sqlx::query_scalar::<_, i32>(sql).fetch_one(a.conn()).await.expect("pid"),
            sqlx::query_scalar::<_, i32>(sql).fetch_one(b.conn()).await.expect("pid"),
        ];
        a.done();
        b.done();
        // A restart breaks both while they sit idle for well under a second.
        terminate(&lane, &pids).await;
        // The first request meets a broken one: its statement fails, and that is noted.
        let mut first = lane.checkout().await.expect("checkout");
        let failed: Result<i32> =
            sqlx::query_scalar(sql).fetch_one(first.conn()).await.map_err(Error::from);
        assert!(failed.is_err(), "the connection was broken");
        drop(first);
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The next is checked before use and replaced, so no second request fails.
        let next = backend(&lane).await;
        assert!(!pids.contains(&next), "a new connection");
    }

    #[tokio::test]
    async fn the_lane_never_opens_more_than_its_size() {
        let _serial = SERIAL.lock().await;
        let lane = lane(1);
        let held = lane.checkout().await.expect("checkout");
        let waiting = tokio::time::timeout(Duration::from_millis(200), lane.checkout()).await;
        assert!(waiting.is_err(), "the second waits while the only connection is out");
        held.done();
        let next = tokio::time::timeout(Duration::from_secs(2), lane.checkout()).await;
        assert!(next.is_ok(), "served once it is back");
    }
}
