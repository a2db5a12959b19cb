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
//! pay for the second driver.
//!
//! Nothing is cached: every statement is sent and answered. How the pipe stays bounded:
//! - A connection that ends (a database restart, a terminated backend) is seen as closed and
//!   replaced by the next request; a read that met it is sent once more on the new one.
//! - One that has answered nothing for [`WAIT`] while a request waited on it (a stalled server,
//!   a partition) is dropped and replaced; TCP keepalives find one that died while idle.
//! - One older than [`LIFETIME`] is replaced (so the pipe follows a failover).
//! - A connection is opened by a task of its own, not by the request that found none, so a
//!   request that gives up does not abandon the attempt; at most one opens per slot at a time.
//! - The pipe never holds more than twice its size in connections, those being replaced
//!   included: a dropped connection keeps its room until its backend has answered what was sent.
//! - Statements give up after [`LOCK_WAIT`] behind a lock, so one blocked statement holds up
//!   those queued behind it only that long; the context and booking read then falls back to the
//!   context alone, and the tool reads its booking on the pool, where waiting blocks nobody.
//! - Each statement is prepared on a connection when first needed, so a lock on one statement's
//!   tables delays no other statement.
//! - A request cancelled mid-statement (a client hanging up) leaves nothing to settle: its answer
//!   is read and dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OnceCell, Semaphore};
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{Client, Config, NoTls, Row, Statement};

pub(crate) use super::hot_path::Sql;
use crate::error::{Error, Result};

/// How long a request may wait for its statement's answer, connecting included, before it is
/// told the database is unavailable.
const WAIT: Duration = Duration::from_secs(5);
/// A connection older than this is replaced when it is next used (as the pool's
/// `max_lifetime`).
const LIFETIME: Duration = Duration::from_secs(30 * 60);
/// How long a pipe statement waits for a lock before it gives up (`lock_timeout`).
/// Reads wait for a lock only behind DDL (a migration's), and the rate window's upsert behind
/// another worker's upsert of the same row, whose commit does not wait for the disk: 50 ms
/// covers the second, and bounds how long statements queued behind one blocked by the first
/// wait for it.
const LOCK_WAIT: &str = "50ms";

/// Behind a transaction pooler, the settings the pipe's role must carry, checked when a
/// connection opens: generic plans pinned, statements limited to 100 ms–5 s and lock waits to
/// 10 ms–1 s (the role the pipe logged in as: role defaults are the login role's). A role without them is refused (SQLSTATE 55000) with the statement that fixes it.
/// `synchronous_commit = off` is recommended (the rate window's counter) but not required.
const ROLE_SETTINGS_CHECK: &str = "DO $check$
DECLARE
    plans text := current_setting('plan_cache_mode');
    statement_ms bigint := (SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout');
    lock_ms bigint := (SELECT setting::bigint FROM pg_settings WHERE name = 'lock_timeout');
BEGIN
    IF plans <> 'force_generic_plan' OR statement_ms NOT BETWEEN 100 AND 5000
        OR lock_ms NOT BETWEEN 10 AND 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = format(
            'behind a transaction pooler the pipe''s role must carry its settings, and role %I \
has plan_cache_mode=%s, statement_timeout=%sms, lock_timeout=%sms; run ALTER ROLE %I \
SET plan_cache_mode = force_generic_plan; ALTER ROLE %I SET statement_timeout = ''5s''; \
ALTER ROLE %I SET lock_timeout = ''50ms''; ALTER ROLE %I SET synchronous_commit = off \
(docs/operations.md, \"Transaction pooling\")',
            session_user, plans, statement_ms, lock_ms,
            session_user, session_user, session_user, session_user);
    END IF;
END
$check$";

/// The SQLSTATE a pipe connection that cannot serve is reported with (object not in
/// prerequisite state), as the role check raises it.
const UNFIT: &str = "55000";

/// Behind a transaction pooler, checks that the pooler keeps each client's prepared statements
/// and prepares them under names of its own on the server that runs them (PgBouncer 1.21+ with
/// `max_prepared_statements`). One that passes the names through would let this process's
/// statement `s3` meet another client's `s3` on a shared server connection (an error at best,
/// another statement run with these parameters at worst). The probe statement looks itself up:
/// under its own client name (tokio-postgres names statements `s<n>`) the names pass through.
async fn keeps_statements_per_client(client: &Client) -> std::result::Result<(), Failure> {
    const PROBE: &str = "SELECT count(*) FROM pg_prepared_statements \
                         WHERE statement = $1 AND name ~ '^s[0-9]+$'";
    // Behind a pooler that passes names through to several server connections, the probe may
    // itself meet a server that never saw its Parse (26000) or one where another client's
    // statement has its name (42P05): the same answer.
    let shared_names = |e: tokio_postgres::Error| match e.code().map(|c| c.code()) {
        Some("26000" | "42P05") => Failure::Unfit(PASSED_THROUGH.into()),
        _ => Failure::Database(e),
    };
    let probe = client
        .prepare_typed(PROBE, &[tokio_postgres::types::Type::TEXT])
        .await
        .map_err(shared_names)?;
    let passed_through: i64 =
        client.query_one(&probe, &[&PROBE]).await.map_err(shared_names)?.get(0);
    if passed_through > 0 {
        return Err(Failure::Unfit(PASSED_THROUGH.into()));
    }
    Ok(())
}

/// Why a pipe behind a pooler that passes prepared statements' names through cannot serve.
const PASSED_THROUGH: &str = "behind a transaction pooler the pipe needs the pooler to keep prepared statements \
     per client, and this one passes their names through to the server: use PgBouncer 1.21 or \
     later with max_prepared_statements > 0 (docs/operations.md, \"Transaction pooling\"), or \
     GATEHOUSE_DB_POOLING=session with a pooler in session mode";

/// How one pipe statement was planned: executions with its generic plan and with custom ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanCount {
    pub statement: &'static str,
    pub generic: i64,
    pub custom: i64,
}

/// One statement prepared on one connection, with where each of its columns is.
struct Prepared {
    statement: Statement,
    columns: Arc<HashMap<String, usize>>,
}

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn now_ms() -> u64 {
    EPOCH.elapsed().as_millis() as u64
}

/// One open connection.
struct Link {
    client: Client,
    prepared: [OnceCell<Prepared>; Sql::COUNT],
    born: Instant,
    /// When it last answered (ms after `EPOCH`), or opened.
    answered_ms: AtomicU64,
}

impl Link {
    fn open(&self) -> bool {
        !self.client.is_closed()
    }

    fn young(&self) -> bool {
        self.born.elapsed() < LIFETIME
    }

    async fn prepared(&self, sql: Sql) -> std::result::Result<&Prepared, tokio_postgres::Error> {
        self.prepared[sql as usize]
            .get_or_try_init(|| async {
                let statement = self.client.prepare_typed(sql.text(), sql.types()).await?;
                let columns = statement
                    .columns()
                    .iter()
                    .enumerate()
                    .map(|(at, column)| (column.name().to_owned(), at))
                    .collect();
                Ok(Prepared { statement, columns: Arc::new(columns) })
            })
            .await
    }

    /// Notes that the server answered on it (a row, or a refusal: either way it is alive).
    fn answered(&self) {
        self.answered_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Whether it has answered nothing for `span`.
    fn silent_for(&self, span: Duration) -> bool {
        now_ms().saturating_sub(self.answered_ms.load(Ordering::Relaxed)) >= span.as_millis() as u64
    }
}

/// One of the pipe's connections: the one open now, if any.
#[derive(Default)]
struct Slot {
    current: Mutex<Option<Arc<Link>>>,
    /// Held by the task opening this slot's connection, so requests meeting a closed one wait
    /// for one replacement instead of opening one each.
    opening: Arc<tokio::sync::Mutex<()>>,
}

impl Slot {
    /// This slot's connection, if it is open (old or not).
    fn open(&self) -> Option<Arc<Link>> {
        let current = self.current.lock().ok()?;
        current.as_ref().filter(|link| link.open()).cloned()
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
    /// The `SET`s every connection runs once it opens.
    session: String,
    slots: Box<[Slot]>,
    next: AtomicUsize,
    /// Room for twice the slots in connections, those being replaced included.
    room: Arc<Semaphore>,
    pooling: super::Pooling,
    /// Whether a connection behind a transaction pooler checks that the pooler keeps prepared
    /// statements per client (off only in tests that run "behind" one on Postgres itself).
    probe_names: bool,
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
    /// The connection opened on something the pipe cannot serve on (a transaction pooler that
    /// passes prepared statements' names through), and why.
    Unfit(String),
}

impl Failure {
    /// The server's SQLSTATE, when the server refused the statement.
    pub(crate) fn sqlstate(&self) -> Option<&str> {
        match self {
            Failure::Database(e) => e.code().map(|c| c.code()),
            Failure::Late(_) => None,
            Failure::Unfit(_) => Some(UNFIT),
        }
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Database(e)
    }
}

/// Whether `e` says the connection, not the statement, failed (it closed or would not open,
/// SQLSTATE class 08, connection exception, or 57P, the server ending the session).
fn connection_failed(e: &tokio_postgres::Error) -> bool {
    let code = e.code().map(|c| c.code()).unwrap_or_default();
    e.as_db_error().is_none() || code.starts_with("08") || code.starts_with("57P")
}

/// What Postgres said, or what the driver saw when it said nothing.
pub(crate) fn failure_of(e: &tokio_postgres::Error) -> crate::error::DbFailure {
    match e.as_db_error() {
        Some(db) => crate::error::DbFailure {
            sqlstate: Some(db.code().code().to_owned()),
            message: db.message().to_owned(),
        },
        None => crate::error::DbFailure {
            sqlstate: e.code().map(|c| c.code().to_owned()),
            message: std::error::Error::source(e)
                .map(|s| format!("{e}: {s}"))
                .unwrap_or_else(|| e.to_string()),
        },
    }
}

impl Failure {
    /// What happened, as a database failure is logged and answered: the SQLSTATE, if any, and
    /// the message.
    pub(crate) fn described(&self) -> crate::error::DbFailure {
        match self {
            Failure::Database(e) => failure_of(e),
            Failure::Late(what) => {
                crate::error::DbFailure { sqlstate: None, message: format!("{what} within 5 s") }
            }
            Failure::Unfit(why) => {
                crate::error::DbFailure { sqlstate: Some(UNFIT.into()), message: why.clone() }
            }
        }
    }
}

impl From<Failure> for Error {
    fn from(failure: Failure) -> Self {
        // The pool's idle connections may have broken too (a restart) and are checked before
        // use, as in `From<sqlx::Error>`.
        if let Failure::Database(e) = &failure
            && connection_failed(e)
        {
            super::note_broken();
        }
        failure.described().into()
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

    /// Whether no two columns share a name: of two, [`PipeRow::get`] would read only one.
    pub(crate) fn columns_distinct(&self) -> bool {
        self.columns.len() == self.row.len()
    }
}

impl Pipe {
    /// A pipe of `connections` connections (opened when first needed) to `config`'s server.
    pub(crate) fn new(config: Config, connections: usize, pooling: super::Pooling) -> Self {
        Pipe::waiting_for_locks(config, connections, LOCK_WAIT, pooling)
    }

    fn waiting_for_locks(
        mut config: Config,
        connections: usize,
        lock_wait: &str,
        pooling: super::Pooling,
    ) -> Self {
        // The session as sqlx sets up the pool's (times read back in UTC), and limits that
        // keep one statement from holding up those queued behind it. The pipe's one write is
        // the rate window's counter: its commit does not wait for the WAL to reach the disk
        // (`synchronous_commit=off`), else every read queued behind a write would wait for a
        // disk flush. A database crash can lose the last moments' counts, so a connection may
        // once exceed its minute's limit by those calls; nothing else is written here.
        //
        // Its statements keep one plan whatever the statistics say (`plan_cache_mode =
        // force_generic_plan`): planned once per connection, never again per call, so a routine
        // ANALYZE cannot turn them into custom plans that cost more to plan than to run
        // (docs/architecture.md, "Plans that cannot flip"). The settings are sent as `SET`
        // once a connection opens, not as startup options, which a pooler such as PgBouncer
        // refuses.
        //
        // Behind a transaction pooler a `SET` would stay on whichever server connection ran
        // it, and reach the transactions of every client that pooler later hands it to (the
        // control plane's confirmations would then commit without waiting for the WAL). There
        // the pipe connects as a role of its own that carries these settings (`ALTER ROLE …
        // SET`, so every server connection the pooler opens for it has them), sets only what
        // the pooler itself tracks per client (TimeZone, DateStyle), and checks the rest,
        // refusing to serve on a role without them: plans that could flip and statements
        // without limits are not a fallback.
        let session = match pooling {
            super::Pooling::Session => format!(
                "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, MDY'; SET lock_timeout = '{lock_wait}'; \
                 SET statement_timeout = '5s'; SET synchronous_commit = off; \
                 SET plan_cache_mode = force_generic_plan"
            ),
            super::Pooling::Transaction => {
                format!("SET TimeZone = 'UTC'; SET DateStyle = 'ISO, MDY'; {ROLE_SETTINGS_CHECK}")
            }
        };
        config
            .application_name("gatehouse-pipe")
            .ssl_mode(tokio_postgres::config::SslMode::Disable)
            .connect_timeout(WAIT)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30))
            .keepalives_interval(Duration::from_secs(10))
            .keepalives_retries(3)
            // Data sent and not acknowledged for this long ends the connection (a partition
            // or a failover without a reset), as keepalives do for an idle one.
            .tcp_user_timeout(Duration::from_secs(10));
        let connections = connections.max(1);
        Pipe {
            config,
            session,
            slots: (0..connections).map(|_| Slot::default()).collect(),
            next: AtomicUsize::new(0),
            room: Arc::new(Semaphore::new(2 * connections)),
            pooling,
            probe_names: true,
        }
    }

    /// Runs `sql` with `params` and returns its row, if any (the statements return one at most).
    pub(crate) async fn query_opt(
        self: &Arc<Self>,
        sql: Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Option<PipeRow>, Failure> {
        Ok(self.query(sql, params).await?.into_iter().next())
    }

    /// Runs `sql` on the next connection and answers its rows.
    pub(crate) async fn query(
        self: &Arc<Self>,
        sql: Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Vec<PipeRow>, Failure> {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        self.query_on(index, sql, params).await
    }

    /// Runs `sql` on slot `index`; a statement sent again goes to the same slot, whose
    /// connection was just replaced.
    async fn query_on(
        self: &Arc<Self>,
        index: usize,
        sql: Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Vec<PipeRow>, Failure> {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut again = true;
        loop {
            let link = tokio::time::timeout_at(deadline, self.link(index))
                .await
                .map_err(|_| Failure::Late("no connection"))??;
            let answer = tokio::time::timeout_at(deadline, async {
                let prepared = link.prepared(sql).await?;
                let rows = link.client.query(&prepared.statement, params).await?;
                Ok::<_, tokio_postgres::Error>((rows, prepared.columns.clone()))
            })
            .await;
            let slot = &self.slots[index];
            match answer {
                Ok(Ok((rows, columns))) => {
                    link.answered();
                    return Ok(rows
                        .into_iter()
                        .map(|row| PipeRow { row, columns: columns.clone() })
                        .collect());
                }
                Ok(Err(e)) => {
                    if e.as_db_error().is_some() {
                        link.answered();
                    }
                    // A connection that failed is replaced; so is one whose prepared
                    // statements the server no longer takes (0A000: a migration changed a
                    // result type; 26000: a pooler in between dropped them), else it would
                    // fail every request until its lifetime ends. The statement did not run
                    // where they went stale, and a read may run twice: either is sent once
                    // more, on a new connection.
                    let stale = e.code().is_some_and(|c| matches!(c.code(), "0A000" | "26000"));
                    let lost = connection_failed(&e) || link.client.is_closed();
                    if stale || lost {
                        slot.forget(&link);
                    }
                    if again && (stale || (lost && sql.reads_only())) {
                        again = false;
                        continue;
                    }
                    return Err(Failure::Database(e));
                }
                // A connection that answered nothing, to anyone, for as long as this request
                // waited is taken for lost (a stalled server, a partition): the next request
                // opens another. One that is answering others is only busy, and stays.
                Err(_) => {
                    if link.silent_for(WAIT) {
                        slot.forget(&link);
                        super::note_broken();
                    }
                    return Err(Failure::Late("no answer"));
                }
            }
        }
    }

    /// The connection of slot `index`, opened by a task of its own if it has none. One past
    /// its lifetime serves on while its replacement opens, and stays if that fails.
    async fn link(self: &Arc<Self>, index: usize) -> std::result::Result<Arc<Link>, Failure> {
        let slot = &self.slots[index];
        if let Some(link) = slot.open() {
            if !link.young()
                && let Ok(opening) = slot.opening.clone().try_lock_owned()
            {
                drop(self.replace(index, opening));
            }
            return Ok(link);
        }
        let opening = slot.opening.clone().lock_owned().await;
        if let Some(link) = slot.open() {
            return Ok(link);
        }
        self.replace(index, opening).await.map_err(|_| Failure::Late("no connection"))?
    }

    /// Opens a connection for slot `index` in a task of its own (holding `opening`), so a
    /// request that gives up does not abandon the attempt. A failed attempt is followed by a
    /// pause before the next, so a restarting or full server is not met with a storm.
    fn replace(
        self: &Arc<Self>,
        index: usize,
        opening: tokio::sync::OwnedMutexGuard<()>,
    ) -> tokio::task::JoinHandle<std::result::Result<Arc<Link>, Failure>> {
        let pipe = self.clone();
        tokio::spawn(async move {
            let _opening = opening;
            let failed = match tokio::time::timeout(2 * WAIT, pipe.open()).await {
                Ok(Ok(link)) => {
                    let link = Arc::new(link);
                    if let Ok(mut current) = pipe.slots[index].current.lock() {
                        *current = Some(link.clone());
                    }
                    return Ok(link);
                }
                Ok(Err(failure)) => {
                    let why = failure.described();
                    tracing::warn!(
                        db.sqlstate = why.sqlstate.as_deref().unwrap_or("none"),
                        db.message = %why.message,
                        "a pipe connection did not open"
                    );
                    failure
                }
                Err(_) => Failure::Late("no connection"),
            };
            super::note_broken();
            tokio::time::sleep(Duration::from_millis(250)).await;
            Err(failed)
        })
    }

    async fn open(&self) -> std::result::Result<Link, Failure> {
        // Room first: a connection dropped for not answering keeps its room until its backend
        // answered what was sent to it, so a stalled server is not met with ever more.
        let room = self.room.clone().acquire_owned().await;
        let (client, connection) = self.config.connect(NoTls).await?;
        tokio::spawn(async move {
            let _room = room;
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a pipe connection ended");
            }
        });
        client.batch_execute(&self.session).await?;
        if self.pooling == super::Pooling::Transaction && self.probe_names {
            keeps_statements_per_client(&client).await?;
        }
        Ok(Link {
            client,
            prepared: Default::default(),
            born: Instant::now(),
            answered_ms: AtomicU64::new(now_ms()),
        })
    }

    /// How each statement was planned on the pipe's open connections, summed: executions with
    /// the generic plan and with a custom one (`pg_prepared_statements`). A custom plan here
    /// means the plan is no longer pinned.
    pub(crate) async fn plans(&self) -> Vec<PlanCount> {
        let mut counts: Vec<PlanCount> = Sql::ALL
            .iter()
            .map(|s| PlanCount { statement: s.name(), generic: 0, custom: 0 })
            .collect();
        for slot in self.slots.iter() {
            let Some(link) = slot.open() else { continue };
            let rows = match link
                .client
                .query(
                    "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements",
                    &[],
                )
                .await
            {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::debug!(error = %e, "reading the pipe's plans failed");
                    continue;
                }
            };
            for row in rows {
                let text: String = row.get(0);
                if let Some(at) = Sql::ALL.iter().position(|s| s.text() == text) {
                    counts[at].generic += row.get::<_, i64>(1);
                    counts[at].custom += row.get::<_, i64>(2);
                }
            }
        }
        counts
    }

    /// Readiness of the hot path: the context statement answers (for no token) on every one
    /// of the pipe's connections.
    pub(crate) async fn ready(self: &Arc<Self>) -> std::result::Result<(), Failure> {
        for index in 0..self.slots.len() {
            self.query_on(index, Sql::Context, &[&b"readiness".as_slice()]).await?;
        }
        Ok(())
    }
}

/// The pipe's settings: the server, user, database and options sqlx read from `DATABASE_URL`
/// (so both drivers read it one way), and the password from the URL or `PGPASSWORD`.
pub(crate) fn config_for(url: &str, options: &sqlx::postgres::PgConnectOptions) -> Config {
    let mut config = config_from(options);
    if let Some(given) = options.get_options() {
        config.options(given);
    }
    // As sqlx reads it: the URL's password, or its `password` parameter, which wins.
    let from_url = url::Url::parse(url).ok().and_then(|u| {
        let param = u.query_pairs().find(|(k, _)| k == "password").map(|(_, v)| v.into_owned());
        param.or_else(|| {
            u.password()
                .map(|p| percent_encoding::percent_decode_str(p).decode_utf8_lossy().into_owned())
        })
    });
    if let Some(password) = from_url.or_else(|| std::env::var("PGPASSWORD").ok()) {
        config.password(password);
    }
    config
}

/// A host as tokio-postgres takes it: an IPv6 address without the URL's brackets.
pub(crate) fn bare_host(host: &str) -> &str {
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

/// The server, port, user and database of `options`.
pub(crate) fn config_from(options: &sqlx::postgres::PgConnectOptions) -> Config {
    let mut config = Config::new();
    match options.get_socket() {
        Some(socket) => config.host_path(socket),
        None => config.host(bare_host(options.get_host())),
    };
    config.port(options.get_port()).user(options.get_username());
    if let Some(database) = options.get_database() {
        config.dbname(database);
    }
    config
}

#[cfg(test)]
mod tests;
