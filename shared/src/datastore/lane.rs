//! The hot path's own connections: the one statement every MCP request runs first (the
//! connection context, with a tool's read when it reads ahead) on connections that go back to
//! their set without a round trip.
//!
//! sqlx's pool pings every connection it takes back (a `Sync` and its answer) and offers no
//! option to skip it; for a request whose work is one statement that ping is half its round
//! trips (docs/profile-read-path.md). A lane connection is handed back only by
//! [`LaneConn::done`], called after a statement ran to its end, when the connection is known to
//! be idle and ready; any other way out (an error, a cancelled request, a panic) drops it, and
//! it is closed in the background. A connection idle for over a second is pinged before use, as
//! the pool does, and so is every connection handed back before any connection last broke, so
//! those broken by a database restart are replaced before a request meets them.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::error::{Error, Result};

#[cfg(test)]
use super::IDLE_BEFORE_PING;
use super::check_before_use;
/// How long a request waits for a lane connection before it is told the database is busy.
const WAIT: Duration = Duration::from_secs(5);

pub(crate) struct Lane {
    options: PgConnectOptions,
    /// Connections ready for a statement, with when each was handed back.
    idle: Mutex<Vec<(PgConnection, Instant)>>,
    /// At most this many connections are out or idle at once.
    room: Semaphore,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane").field("available", &self.room.available_permits()).finish()
    }
}

impl Lane {
    pub(crate) fn new(options: PgConnectOptions, size: u32) -> Self {
        Lane { options, idle: Mutex::new(Vec::new()), room: Semaphore::new(size.max(1) as usize) }
    }

    /// A connection for one statement: an idle one (pinged if it sat for over a second) or a
    /// new one.
    pub(crate) async fn checkout(&self) -> Result<LaneConn<'_>> {
        let permit = tokio::time::timeout(WAIT, self.room.acquire())
            .await
            .map_err(|_| Error::Internal("no database connection free within 5 s".into()))?
            .map_err(|e| Error::Internal(e.to_string()))?;
        let popped = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let conn = match popped {
            Some((conn, since)) if !check_before_use(since.elapsed()) => conn,
            Some((mut conn, _)) => match conn.ping().await {
                Ok(()) => conn,
                Err(_) => {
                    super::note_broken();
                    close_later(conn);
                    self.options.connect().await?
                }
            },
            None => self.options.connect().await?,
        };
        Ok(LaneConn { lane: self, conn: Some(conn), _permit: permit })
    }

    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle.lock().map(|idle| idle.len()).unwrap_or(0)
    }
}

/// One checked-out connection; see the module's doc for how it goes back.
pub(crate) struct LaneConn<'a> {
    lane: &'a Lane,
    conn: Option<PgConnection>,
    _permit: SemaphorePermit<'a>,
}

impl LaneConn<'_> {
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("a checked-out connection until done or dropped")
    }

    /// Hands the connection back: call only after a statement ran to its end.
    pub(crate) fn done(mut self) {
        if let (Some(conn), Ok(mut idle)) = (self.conn.take(), self.lane.idle.lock()) {
            idle.push((conn, Instant::now()));
        }
    }
}

impl Drop for LaneConn<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            close_later(conn);
        }
    }
}

/// Closes a connection whose state is unknown (a statement cut short) without making anyone
/// wait for it.
fn close_later(conn: PgConnection) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), conn.close_hard()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn lane(size: u32) -> Lane {
        let server = std::env::var("GATEHOUSE_TEST_PG")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
        let options = PgConnectOptions::from_str(&format!("{server}/postgres")).expect("url");
        Lane::new(options, size)
    }

    async fn backend(lane: &Lane) -> i32 {
        let mut c = lane.checkout().await.expect("checkout");
        let pid: i32 =
            sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(c.conn()).await.expect("pid");
        c.done();
        pid
    }

    #[tokio::test]
    async fn a_finished_statement_hands_its_connection_back_and_anything_else_drops_it() {
        let lane = lane(2);
        let first = backend(&lane).await;
        assert_eq!(backend(&lane).await, first, "handed back, reused without reconnecting");
        assert_eq!(lane.idle_count(), 1);
        // A statement cut short (a cancelled request) leaves the connection in an unknown
        // state: it is dropped, never handed to the next request.
        let mut c = lane.checkout().await.expect("checkout");
        let cut = tokio::time::timeout(
            Duration::from_millis(200),
            sqlx::query("SELECT pg_sleep(5)").execute(c.conn()),
        )
        .await;
        assert!(cut.is_err(), "cut short");
        drop(c);
        assert_eq!(lane.idle_count(), 0);
        let after_cut = backend(&lane).await;
        assert_ne!(after_cut, first, "a new connection");
        // A statement that failed is not handed back either; the next one is served.
        let mut c = lane.checkout().await.expect("checkout");
        assert!(sqlx::query("SELECT 1/0").execute(c.conn()).await.is_err());
        drop(c);
        assert_eq!(lane.idle_count(), 0);
        assert_ne!(backend(&lane).await, after_cut);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_replaced_before_use() {
        let lane = lane(1);
        let first = backend(&lane).await;
        let mut admin = PgConnection::connect_with(&lane.options).await.expect("admin");
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(first)
            .execute(&mut admin)
            .await
            .expect("terminate");
        tokio::time::sleep(IDLE_BEFORE_PING + Duration::from_millis(100)).await;
        let next = backend(&lane).await;
        assert_ne!(next, first, "pinged, found closed, replaced");
    }

    #[tokio::test]
    async fn after_one_connection_breaks_the_others_are_checked_however_briefly_idle() {
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
        let mut admin = PgConnection::connect_with(&lane.options).await.expect("admin");
        for p in pids {
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(p)
                .execute(&mut admin)
                .await
                .expect("terminate");
        }
        // The first request meets a broken one: its statement fails, and that is noted.
        let mut first = lane.checkout().await.expect("checkout");
        let failed: Result<i32> =
            sqlx::query_scalar(sql).fetch_one(first.conn()).await.map_err(Error::from);
        assert!(failed.is_err(), "the connection was broken");
        drop(first);
        // The next is checked before use and replaced, so no second request fails.
        let next = backend(&lane).await;
        assert!(!pids.contains(&next), "a new connection");
    }

    #[tokio::test]
    async fn the_lane_never_opens_more_than_its_size() {
        let lane = lane(1);
        let held = lane.checkout().await.expect("checkout");
        let waiting = tokio::time::timeout(Duration::from_millis(200), lane.checkout()).await;
        assert!(waiting.is_err(), "the second waits while the only connection is out");
        held.done();
        let next = tokio::time::timeout(Duration::from_secs(2), lane.checkout()).await;
        assert!(next.is_ok(), "served once it is back");
    }
}
