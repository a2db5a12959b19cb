//! The hot path's connections: the statement every MCP request runs first (the connection
//! context, with a tool's read when it reads ahead) and the write classes' rate window, on a
//! few connections that every request of the process shares, pipelined.
//!
//! A request does not take a connection for itself: it sends its statement down one of the
//! pipe's connections, behind whatever other requests sent, and waits for its own answer
//! (tokio-postgres writes every statement queued meanwhile in one write and reads the answers
//! in order). Under load a backend so receives several statements per wake-up instead of one;
//! each still has its own `Sync`, so each is its own implicit transaction and one statement's
//! error touches no other. docs/architecture.md ("Two Postgres drivers") has the figures that
//! pay for the second driver: a statement costs Postgres and the worker about half the CPU it
//! costs with one connection per request.
//!
//! Nothing is cached: every statement is sent and answered. A connection that ends (a database
//! restart, a terminated backend) is seen as closed at once and replaced by the next request; one
//! that does not answer within [`WAIT`] is dropped and replaced, as is one older than
//! [`LIFETIME`] (so the pipe follows a failover). A request cancelled mid-statement (a client
//! hanging up) leaves nothing to settle: its answer is read and dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{Client, Config, NoTls, Row, Statement};

use crate::error::{Error, Result};

/// How long a request may wait for its statement's answer, connecting included, before it is
/// told the database is unavailable.
const WAIT: Duration = Duration::from_secs(5);
/// A connection older than this is replaced when it is next used (as the pool's
/// `max_lifetime`).
const LIFETIME: Duration = Duration::from_secs(30 * 60);

/// The statements the pipe runs, each prepared on every pipe connection when it opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sql {
    /// The connection context ($1 token hash).
    Context,
    /// The connection context and one booking of its tenant ($1 token hash, $2 handle, $3–$4
    /// the notes cursor).
    ContextAndBooking,
    /// One call counted in a connection's rate window.
    RateTake,
}

impl Sql {
    const ALL: [Sql; 3] = [Sql::Context, Sql::ContextAndBooking, Sql::RateTake];

    fn text(self) -> &'static str {
        match self {
            Sql::Context => super::CONNECTION_CONTEXT_SQL,
            Sql::ContextAndBooking => super::auth::CONTEXT_AND_BOOKING_SQL.as_str(),
            Sql::RateTake => super::rates::RATE_TAKE_SQL,
        }
    }
}

/// One statement prepared on one connection, with where each of its columns is.
struct Prepared {
    statement: Statement,
    columns: Arc<HashMap<String, usize>>,
}

/// One open connection.
struct Link {
    client: Client,
    prepared: Vec<Prepared>,
    born: Instant,
}

impl Link {
    fn usable(&self) -> bool {
        !self.client.is_closed() && self.born.elapsed() < LIFETIME
    }
}

/// One of the pipe's connections: the one open now, if any.
#[derive(Default)]
struct Slot {
    current: Mutex<Option<Arc<Link>>>,
    /// Held while this slot's connection is being opened, so requests meeting a closed one open
    /// one replacement, not one each.
    opening: tokio::sync::Mutex<()>,
}

impl Slot {
    fn usable(&self) -> Option<Arc<Link>> {
        let current = self.current.lock().ok()?;
        current.as_ref().filter(|link| link.usable()).cloned()
    }

    /// Drops `link` if it is still this slot's connection.
    fn forget(&self, link: &Arc<Link>) {
        if let Ok(mut current) = self.current.lock()
            && current.as_ref().is_some_and(|now| Arc::ptr_eq(now, link))
        {
            *current = None;
        }
    }
}

pub(crate) struct Pipe {
    config: Config,
    slots: Box<[Slot]>,
    next: AtomicUsize,
}

impl std::fmt::Debug for Pipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipe").field("connections", &self.slots.len()).finish()
    }
}

/// Why a pipe statement has no answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The server refused the statement, or the connection failed.
    Database(tokio_postgres::Error),
    /// No connection, or no answer, within [`WAIT`].
    Late(&'static str),
}

impl Failure {
    /// The server's SQLSTATE, when the server refused the statement.
    pub(crate) fn sqlstate(&self) -> Option<&str> {
        match self {
            Failure::Database(e) => e.code().map(|c| c.code()),
            Failure::Late(_) => None,
        }
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Database(e)
    }
}

impl From<Failure> for Error {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Database(e) => {
                // Anything but a statement the server refused (a connection that failed, closed
                // or would not open), SQLSTATE class 08 (connection exception) or 57P (the server
                // shutting down or ending the session): the pool's idle connections may have
                // broken too (a restart) and are checked before use, as in `From<sqlx::Error>`.
                let code = e.code().map(|c| c.code()).unwrap_or_default();
                if e.as_db_error().is_none() || code.starts_with("08") || code.starts_with("57P") {
                    super::note_broken();
                }
                Error::Internal(format!("database: {e}"))
            }
            Failure::Late(what) => {
                super::note_broken();
                Error::Internal(format!("database: {what} within 5 s"))
            }
        }
    }
}

/// A row the pipe answered with, read by column name.
pub(crate) struct PipeRow {
    row: Row,
    columns: Arc<HashMap<String, usize>>,
}

impl PipeRow {
    /// The value of the column `name`.
    pub(crate) fn get<'a, T: FromSql<'a>>(&'a self, name: &str) -> Result<T> {
        let at = self.columns.get(name).ok_or_else(|| {
            Error::Internal(format!("database: the statement has no column {name}"))
        })?;
        self.row.try_get(*at).map_err(|e| Error::Internal(format!("database: column {name}: {e}")))
    }

    /// Whether no two columns share a name: [`PipeRow::get`] would find only the first of two.
    pub(crate) fn columns_distinct(&self) -> bool {
        self.columns.len() == self.row.len()
    }
}

impl Pipe {
    /// A pipe of `connections` connections (opened when first needed) to `config`'s server.
    pub(crate) fn new(mut config: Config, connections: usize) -> Self {
        // A pipe statement takes milliseconds: one stuck behind a lock (a migration's, say)
        // gives up instead of holding up the statements queued behind it.
        let options = match config.get_options() {
            Some(given) => format!("{given} -c lock_timeout=2s -c statement_timeout=5s"),
            None => "-c lock_timeout=2s -c statement_timeout=5s".to_owned(),
        };
        config.options(options).application_name("gatehouse");
        Pipe {
            config,
            slots: (0..connections.max(1)).map(|_| Slot::default()).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Runs `sql` with `params` and returns its row, if any (the statements return one at most).
    pub(crate) async fn query_opt(
        &self,
        sql: Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Option<PipeRow>, Failure> {
        let slot = &self.slots[self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len()];
        let deadline = tokio::time::Instant::now() + WAIT;
        let link = tokio::time::timeout_at(deadline, self.link(slot))
            .await
            .map_err(|_| Failure::Late("no connection"))??;
        let prepared = &link.prepared[Sql::ALL.iter().position(|s| *s == sql).unwrap_or(0)];
        match tokio::time::timeout_at(deadline, link.client.query_opt(&prepared.statement, params))
            .await
        {
            Ok(Ok(row)) => Ok(row.map(|row| PipeRow { row, columns: prepared.columns.clone() })),
            Ok(Err(e)) => {
                // A closed connection is replaced; so is one whose prepared statements the
                // server no longer takes (0A000: a migration changed a result type; 26000: a
                // pooler in between dropped them), else it would fail every request until its
                // lifetime ends.
                let stale = e.code().is_some_and(|c| matches!(c.code(), "0A000" | "26000"));
                if link.client.is_closed() || stale || e.as_db_error().is_none() {
                    slot.forget(&link);
                }
                Err(Failure::Database(e))
            }
            // A connection that does not answer within seconds, for statements that take
            // milliseconds, is taken for lost: the next request opens another.
            Err(_) => {
                slot.forget(&link);
                Err(Failure::Late("no answer"))
            }
        }
    }

    async fn link(&self, slot: &Slot) -> std::result::Result<Arc<Link>, Failure> {
        if let Some(link) = slot.usable() {
            return Ok(link);
        }
        let _opening = slot.opening.lock().await;
        if let Some(link) = slot.usable() {
            return Ok(link);
        }
        let link = Arc::new(self.open().await?);
        if let Ok(mut current) = slot.current.lock() {
            *current = Some(link.clone());
        }
        Ok(link)
    }

    async fn open(&self) -> std::result::Result<Link, Failure> {
        let (client, connection) = self.config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a pipe connection ended");
            }
        });
        let mut prepared = Vec::with_capacity(Sql::ALL.len());
        for sql in Sql::ALL {
            let statement = client.prepare(sql.text()).await?;
            let columns = statement
                .columns()
                .iter()
                .enumerate()
                .map(|(at, column)| (column.name().to_owned(), at))
                .collect();
            prepared.push(Prepared { statement, columns: Arc::new(columns) });
        }
        Ok(Link { client, prepared, born: Instant::now() })
    }
}

/// The pipe's settings from the pool's (tests, where the pool is all there is: no password).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn config_from(options: &sqlx::postgres::PgConnectOptions) -> Config {
    let mut config = Config::new();
    match options.get_socket() {
        Some(socket) => config.host_path(socket),
        None => config.host(options.get_host()),
    };
    config.port(options.get_port()).user(options.get_username());
    if let Some(database) = options.get_database() {
        config.dbname(database);
    }
    config
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;
    use crate::testing::TestDb;

    fn pipe(db: &TestDb, connections: usize) -> Pipe {
        Pipe::new(Config::from_str(&db.url).expect("url"), connections)
    }

    async fn pids(pipe: &Pipe) -> Vec<i32> {
        let mut pids = Vec::new();
        for slot in pipe.slots.iter() {
            let link = pipe.link(slot).await.expect("link");
            let row = link.client.query_one("SELECT pg_backend_pid()", &[]).await.expect("pid");
            pids.push(row.get(0));
        }
        pids
    }

    async fn terminate(db: &TestDb, pids: &[i32]) {
        for pid in pids {
            db.exec(&format!("SELECT pg_terminate_backend({pid})")).await;
        }
    }

    /// A token hash no token has: the context statements answer with no row.
    const NO_TOKEN: &[u8] = b"no such token";
    const NO_CURSOR: (Option<chrono::DateTime<chrono::Utc>>, Option<String>) = (None, None);

    #[tokio::test]
    async fn concurrent_requests_share_the_pipes_connections_and_each_gets_its_own_answer() {
        let db = TestDb::new().await;
        let seed = crate::services::demo::seed(&db.ds, None, "").await.expect("seed");
        let tokens: Vec<(String, String)> = seed
            .tenants
            .iter()
            .flat_map(|t| t.connections.iter().map(|c| (c.token.clone(), c.connection.clone())))
            .collect();
        assert!(tokens.len() >= 4);
        let pipe = Arc::new(pipe(&db, 2));
        // 96 statements in flight on two connections, for different tokens and for none: each
        // answer is the one its own statement asked for.
        let mut calls = Vec::new();
        for n in 0..96 {
            let pipe = pipe.clone();
            let (token, connection) = tokens[n % tokens.len()].clone();
            calls.push(tokio::spawn(async move {
                let hash =
                    if n % 3 == 0 { NO_TOKEN.to_vec() } else { crate::secret::hash_token(&token) };
                let (at, note) = NO_CURSOR;
                let row = pipe
                    .query_opt(Sql::ContextAndBooking, &[&hash, &"bkg_none", &at, &note])
                    .await
                    .expect("answered");
                let got = row.map(|row| row.get::<String>("connection_handle").expect("handle"));
                (n, connection, got)
            }));
        }
        for call in calls {
            let (n, connection, got) = call.await.expect("joined");
            if n % 3 == 0 {
                assert_eq!(got, None, "call {n}: no such token, no row");
            } else {
                assert_eq!(got, Some(connection), "call {n}: its own token's connection");
            }
        }
        let backends = pids(&pipe).await;
        assert_eq!(backends.len(), 2);
        assert_ne!(backends[0], backends[1], "two connections, no more");
    }

    #[tokio::test]
    async fn a_connection_the_server_ends_is_replaced_and_a_refused_statement_harms_no_other() {
        let db = TestDb::new().await;
        let pipe = pipe(&db, 1);
        let first = pids(&pipe).await;
        // A statement the server refuses (a NUL in a handle) fails alone, with its SQLSTATE:
        // the connection stays and serves the next.
        let (at, note) = NO_CURSOR;
        let refused =
            pipe.query_opt(Sql::ContextAndBooking, &[&NO_TOKEN, &"bkg\0", &at, &note]).await;
        let Err(failure) = refused else { panic!("refused: {:?}", refused.is_ok()) };
        assert!(failure.sqlstate().is_some_and(|c| c.starts_with("22")), "{failure:?}");
        assert!(pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await.expect("answered").is_none());
        assert_eq!(pids(&pipe).await, first, "same backend");
        // A restart ends the backend: the closed connection is seen and replaced, and the
        // statement after it is answered by a new backend.
        terminate(&db, &first).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await.expect("answered").is_none());
        assert_ne!(pids(&pipe).await, first, "a new backend");
    }

    #[tokio::test]
    async fn a_connection_whose_prepared_statements_went_stale_is_replaced() {
        let db = TestDb::new().await;
        let pipe = pipe(&db, 1);
        let first = pids(&pipe).await;
        assert!(pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await.expect("answered").is_none());
        // A migration changes the type of a column the context returns: the statement
        // prepared before it is refused once, and the next request prepares it again on a
        // new connection instead of meeting the same refusal until the connection ages out.
        db.exec("ALTER TABLE tenants ALTER COLUMN slug TYPE varchar(200)").await;
        let refused = pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await;
        let Err(failure) = refused else { panic!("the old plan was used") };
        assert_eq!(failure.sqlstate(), Some("0A000"), "{failure:?}");
        assert!(pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await.expect("answered").is_none());
        assert_ne!(pids(&pipe).await, first, "a new connection");
    }

    #[tokio::test]
    async fn a_request_cancelled_mid_statement_leaves_the_connection_serving_others() {
        let db = TestDb::new().await;
        let pipe = pipe(&db, 1);
        let first = pids(&pipe).await;
        let link = pipe.link(&pipe.slots[0]).await.expect("link");
        // A statement whose caller gives up before it ends (a client hanging up).
        let slow = tokio::time::timeout(
            Duration::from_millis(50),
            link.client.query_one("SELECT pg_sleep(0.3)::text", &[]),
        )
        .await;
        assert!(slow.is_err(), "cut short");
        // The next statement waits behind it, is answered, and on the same backend.
        assert!(pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await.expect("answered").is_none());
        assert_eq!(pids(&pipe).await, first);
    }

    #[tokio::test]
    async fn a_statement_stuck_behind_a_lock_is_bounded_and_the_pipe_serves_after_it() {
        use sqlx::Connection as _;
        let db = TestDb::new().await;
        let pipe = pipe(&db, 1);
        // The context statement waits behind a migration's lock on the tokens: it gives up
        // within the pipe's lock timeout instead of holding up the statements behind it.
        let mut holder = sqlx::PgConnection::connect(&db.url).await.expect("connect");
        sqlx::raw_sql("BEGIN; LOCK TABLE connection_tokens IN ACCESS EXCLUSIVE MODE")
            .execute(&mut holder)
            .await
            .expect("lock");
        let late = pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await;
        let Err(failure) = late else { panic!("answered behind the lock") };
        assert_eq!(failure.sqlstate(), Some("55P03"), "lock_timeout: {failure:?}");
        sqlx::raw_sql("ROLLBACK").execute(&mut holder).await.expect("unlock");
        assert!(pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await.expect("answered").is_none());
    }

    #[tokio::test]
    async fn the_pipe_reads_every_context_as_the_pool_reads_it() {
        let db = TestDb::new().await;
        let seed = crate::services::demo::seed(&db.ds, None, "").await.expect("seed");
        // Vary what may be absent or false: one creator without a membership, one tenant
        // switched off, one token with an expiry and an audience, one override.
        db.exec(
            "DELETE FROM memberships WHERE (tenant_id, person_id) IN
               (SELECT tenant_id, creator_id FROM connections ORDER BY id LIMIT 1);
             UPDATE tenants SET agent_access = false, read_per_minute = 77
               WHERE id = (SELECT max(id) FROM tenants);
             UPDATE connection_tokens SET expires_at = now() + interval '1 hour',
                    audience = 'https://mcp.example/mcp'
               WHERE id = (SELECT max(id) FROM connection_tokens)",
        )
        .await;
        let mut seen = 0;
        for tenant in &seed.tenants {
            for connection in &tenant.connections {
                let hash = crate::secret::hash_token(&connection.token);
                let pooled = sqlx::query_as::<_, super::super::ConnectionContextRow>(
                    super::super::CONNECTION_CONTEXT_SQL,
                )
                .bind(&hash)
                .fetch_optional(db.ds.pool())
                .await
                .expect("pool");
                let piped = db.ds.connection_context(&hash).await.expect("pipe");
                assert_eq!(format!("{piped:?}"), format!("{pooled:?}"), "{}", connection.name);
                assert!(piped.is_some());
                seen += 1;
            }
        }
        assert!(seen >= 4);
    }

    #[tokio::test]
    async fn rows_are_read_by_column_name_and_a_missing_or_mistyped_column_is_an_error() {
        let db = TestDb::new().await;
        let seed = crate::services::demo::seed(&db.ds, None, "").await.expect("seed");
        let token = &seed.tenants[0].connections[0].token;
        let pipe = pipe(&db, 1);
        let row = pipe
            .query_opt(Sql::Context, &[&crate::secret::hash_token(token)])
            .await
            .expect("answered")
            .expect("a row");
        assert!(row.columns_distinct());
        assert_eq!(row.get::<String>("tenant_slug").expect("slug"), seed.tenants[0].slug);
        assert!(row.get::<i32>("no_such_column").is_err());
        assert!(row.get::<String>("tenant_id").is_err(), "a wrong type is an error, not a guess");
    }
}
