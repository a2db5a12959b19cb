//! The datastore: every SQL statement of Gatehouse lives below this module (R2).
//!
//! Functions are named `<resource>_<verb>` (STYLE 5). Services call these; adapters (tools,
//! REST handlers, the console) never do.
//!
//! **One calling convention (STYLE 1).** Every function takes the operation context first —
//! `(&self, ctx: &OpCtx, …)` on `Services`, `(tx: &mut Tx, ctx: &OpCtx, …)` inside a
//! transaction — and filters the rows of a tenant by `ctx.tenant_id()` (R3). A function that
//! cannot have an actor says why with one prefix per reason:
//!
//! - `entry_`: reads a credential (or, for a job, an id) to *build* the context or the
//!   `Operator` it would otherwise take: `entry_connection_context*`, `entry_api_token_context`,
//!   `entry_session_get`, `entry_operator_get`.
//! - `preauth_`: steps before there is an actor in a tenant: console sign-in and its throttle,
//!   sessions before a tenant is picked, and the OAuth endpoints (clients, registration
//!   throttle, consent requests, codes, refresh and access tokens), where a code or a token is
//!   the only credential.
//! - `job_`: background work across tenants: the outbox dispatcher, activity flushes,
//!   housekeeping.
//! - `platform_`: rows that belong to no tenant (people as such, tenants, the kill switch, the
//!   operator role and its audit), read or written for an operator or across tenants.
//!
//! Plumbing is not a `<resource>_<verb>` function and keeps its name: `Services::begin` (the
//! one transaction helper), `verify_password` (the hashing slots), the pipe's `query_opt` and
//! `ready`, `ping`, `migrate`, `one_row`.

mod activity;
mod alert_rules;
mod api_tokens;
mod audit;
mod audit_chain;
mod auth;
mod bookings;
mod budgets;
mod connections;
mod customers;
mod failover;
mod held;
pub use held::SECOND_CONNECTION_LOGGED;
mod hot_path;
mod housekeeping;
mod invitations;
mod oauth;
mod outbox;
mod passkeys;
mod pending;
mod people;
mod pipe;
mod policies;
pub use pipe::PlanCount;
mod rates;
mod replay;
mod service_catalog;
mod sessions;
mod sso;
mod tasks;
mod technicians;
mod tenants;

pub use activity::*;
pub use alert_rules::*;
pub use api_tokens::*;
pub use audit::*;
pub use audit_chain::*;
pub use auth::*;
pub use bookings::*;
pub(crate) use budgets::*;
pub use connections::*;
pub use customers::*;
pub(crate) use hot_path::{CONNECTION_CONTEXT_SQL, CONTEXT_AND_BOOKING_SQL, RATE_TAKE_SQL};
pub use invitations::*;
pub use oauth::*;
pub use outbox::*;
pub use passkeys::*;
pub use pending::*;
pub use people::*;
pub use policies::*;
pub(crate) use rates::*;
pub(crate) use replay::*;
pub use service_catalog::*;
pub use sessions::*;
pub use sso::*;
pub use tasks::*;
pub use technicians::*;
pub use tenants::*;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use std::time::Duration;

use crate::error::{Error, Result};

/// The one kind of transaction services use: sqlx's, noted under its task while it is open
/// ([`held`]: a task holding one may not ask the pool for a second connection). Statements run
/// on `&mut **tx` (its connection); `commit` ends it, and dropping it uncommitted rolls back.
pub struct Tx<'c> {
    inner: sqlx::Transaction<'c, sqlx::Postgres>,
    held: held::Held,
}

impl Tx<'_> {
    pub async fn commit(self) -> std::result::Result<(), sqlx::Error> {
        let Tx { inner, held } = self;
        let done = inner.commit().await;
        drop(held);
        done
    }

    pub async fn rollback(self) -> std::result::Result<(), sqlx::Error> {
        let Tx { inner, held } = self;
        let done = inner.rollback().await;
        drop(held);
        done
    }
}

impl std::ops::Deref for Tx<'_> {
    type Target = sqlx::PgConnection;

    fn deref(&self) -> &sqlx::PgConnection {
        &self.inner
    }
}

impl std::ops::DerefMut for Tx<'_> {
    fn deref_mut(&mut self) -> &mut sqlx::PgConnection {
        &mut self.inner
    }
}

/// Password checks running at once (argon2id takes a core each).
const HASHING_AT_ONCE: usize = 2;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// The handle adapters hold to call the services (`shared::services::*`). Its pool is private
/// to this library: only the datastore functions below reach Postgres, and only services call
/// them, so an adapter that wants SQL does not compile (R2, STYLE 11). Cloning is cheap.
#[derive(Clone, Debug)]
pub struct Services {
    pool: PgPool,
    /// The shared, pipelined connections of the one statement every MCP request runs first
    /// (see `pipe`).
    pipe: std::sync::Arc<pipe::Pipe>,
    /// Password hashing runs on blocking threads, at most this many at once, so a flood of
    /// sign-ins can neither stall the async workers nor take every core.
    hashing: std::sync::Arc<tokio::sync::Semaphore>,
    policy: Policy,
    /// Where committed switch flips and revocations are pushed; `None` without NATS.
    bus: Option<crate::bus::Bus>,
    /// The keys that seal secrets kept in Postgres (a tenant IdP's client secret);
    /// `GATEHOUSE_SECRET_KEYS`. `None`: features that keep such a secret say what to set.
    secret_keys: Option<std::sync::Arc<crate::seal::SealKeys>>,
    /// The Ed25519 keys that sign audit checkpoints (`GATEHOUSE_AUDIT_SIGNING_KEYS`); `None`:
    /// the chain is kept, no checkpoint is signed.
    audit_keys: Option<std::sync::Arc<crate::signing::SigningKeys>>,
    /// Tenants' policy sets compiled by this process for this database, one version each.
    compiled_policies: std::sync::Arc<crate::policies::CompiledByTenant>,
}

/// Time windows of the write rails; defaults suit production, tests shorten them.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// How long a silent write's result is replayed for an identical call (R8).
    pub replay_window_secs: i64,
    /// How long a confirmation token stays valid (R7).
    pub action_ttl_secs: i64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy { replay_window_secs: 600, action_ttl_secs: 600 }
    }
}

/// How long a pooled connection may sit idle before it is closed.
pub const IDLE_CLOSE: Duration = Duration::from_secs(30);

/// How long a pooled connection may sit idle before it is checked with a ping on its way out.
pub(crate) const IDLE_BEFORE_PING: Duration = Duration::from_secs(1);

static EPOCH: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);
/// When (ms after `EPOCH`, plus one; 0 = never) a statement last failed because its connection
/// broke.
static LAST_BROKEN_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Records that a connection broke: a database restart breaks every connection at once, and
/// those that sat idle for less than [`IDLE_BEFORE_PING`] would otherwise each fail a request.
pub(crate) fn note_broken() {
    let now = EPOCH.elapsed().as_millis() as u64 + 1;
    LAST_BROKEN_MS.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
}

/// When a connection last broke (0: never), for the watcher that follows a failover.
pub(crate) fn broken_at() -> u64 {
    LAST_BROKEN_MS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether a connection idle for `idle` is checked with a ping before use: it sat for over a
/// second, or it was handed back no later than a connection last broke.
pub(crate) fn check_before_use(idle: Duration) -> bool {
    if idle >= IDLE_BEFORE_PING {
        return true;
    }
    let broken = LAST_BROKEN_MS.load(std::sync::atomic::Ordering::Relaxed);
    let released = EPOCH.elapsed().saturating_sub(idle).as_millis() as u64 + 1;
    broken != 0 && released <= broken
}

/// How the processes reach Postgres (`GATEHOUSE_DB_POOLING`; docs/operations.md, "Behind a
/// pooler").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooling {
    /// Postgres itself, or a pooler in session mode: a client keeps its server connection, so
    /// the pipe sets its session up itself.
    #[default]
    Session,
    /// A pooler in transaction mode (PgBouncer 1.21+ with `max_prepared_statements`): each
    /// transaction may run on another server connection, shared with other clients. The pipe
    /// sets nothing on a session (it would stay on a server connection others then use) and
    /// checks that its role carries its settings instead; migrations, which hold a session
    /// lock, go to Postgres itself.
    Transaction,
}

impl Pooling {
    /// `session` or `transaction`, as `GATEHOUSE_DB_POOLING` spells them.
    pub fn parse(given: &str) -> Option<Pooling> {
        match given.trim() {
            "session" => Some(Pooling::Session),
            "transaction" => Some(Pooling::Transaction),
            _ => None,
        }
    }
}

/// Behind a transaction pooler the pipe's settings come from its role, so it must have one of
/// its own (`GATEHOUSE_DB_PIPE_URL`): on `DATABASE_URL`'s role they would reach every other
/// transaction (5 s statements, 50 ms lock waits, commits that do not wait for the disk).
pub(crate) fn pipe_role_fits(pooling: Pooling, url: &str, pipe_url: Option<&str>) -> Result<()> {
    if pooling == Pooling::Session {
        return Ok(());
    }
    let fix = "docs/operations.md, \"Transaction pooling\"";
    let Some(pipe_url) = pipe_url else {
        return Err(Error::invalid(
            "GATEHOUSE_DB_PIPE_URL",
            format!(
                "behind a transaction pooler (GATEHOUSE_DB_POOLING=transaction) the worker's pipe \
                 connects as a role of its own that carries its settings: set \
                 GATEHOUSE_DB_PIPE_URL to that role's URL ({fix})"
            ),
        ));
    };
    let first = |var: &str, url: &str| -> Result<sqlx::postgres::PgConnectOptions> {
        let servers = failover::servers_of(var, url)?;
        Ok(failover::options_of_var(var, &servers)?.swap_remove(0))
    };
    let (pipe, pool) = (first("GATEHOUSE_DB_PIPE_URL", pipe_url)?, first("DATABASE_URL", url)?);
    if pipe.get_database() != pool.get_database() {
        return Err(Error::invalid(
            "GATEHOUSE_DB_PIPE_URL",
            format!(
                "names the database {:?} and DATABASE_URL {:?}: the pipe reads the same database \
                 as the pool (its connections' rights, switches and records), as another role",
                pipe.get_database().unwrap_or_default(),
                pool.get_database().unwrap_or_default()
            ),
        ));
    }
    let role = pipe.get_username().to_owned();
    if role == pool.get_username() {
        return Err(Error::invalid(
            "GATEHOUSE_DB_PIPE_URL",
            format!(
                "names the role DATABASE_URL does ({role}); the pipe's settings (5 s statements, \
                 50 ms lock waits, commits that do not wait for the disk) would reach every other \
                 transaction of that role: give the pipe a role of its own ({fix})"
            ),
        ));
    }
    Ok(())
}

impl Services {
    /// Connects a pool of at most `max_connections` to `url` (the control plane, the CLI: the
    /// hot path's pipe is never used there and opens nothing).
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        Services::connect_idle(url, max_connections, IDLE_CLOSE).await
    }

    /// [`Services::connect`], closing pooled connections idle for `idle`
    /// (`GATEHOUSE_DB_IDLE_SECS`; the control plane).
    pub async fn connect_idle(url: &str, max_connections: u32, idle: Duration) -> Result<Self> {
        let (pool, pipe) = (max_connections, max_connections.max(1));
        Services::connect_split(url, None, Pooling::Session, pool, pipe, "gatehouse", idle).await
    }

    /// Connects a worker with at most `max_connections` in all: the hot path's pipe (`pipe`
    /// shared connections, or one per four cores; at most a third of the total, as it may hold
    /// twice its size while replacing connections, see `pipe`) and the pool, the rest.
    ///
    /// One connection per four cores: the fewer connections the requests share, the more
    /// statements a backend takes per wake-up. On a two-core worker one connection served
    /// `get_booking` 20 % faster than two, at a fifth less worker CPU a call
    /// (docs/profile-read-path.md, "Third step"); a backend answers far more context statements
    /// a second than four worker cores ask of it.
    pub async fn connect_worker(
        url: &str,
        max_connections: u32,
        pipe: Option<u32>,
    ) -> Result<Self> {
        Services::connect_worker_idle(url, max_connections, pipe, IDLE_CLOSE).await
    }

    /// [`Services::connect_worker`], closing pooled connections idle for `idle`
    /// (`GATEHOUSE_DB_IDLE_SECS`). Its pool's connections are named `gatehouse-worker` in
    /// `pg_stat_activity`, the pipe's `gatehouse-pipe`, the control plane's and the CLI's
    /// `gatehouse`, so an operator sees who holds what.
    pub async fn connect_worker_idle(
        url: &str,
        max_connections: u32,
        pipe: Option<u32>,
        idle: Duration,
    ) -> Result<Self> {
        Services::connect_worker_pooled(url, None, Pooling::Session, max_connections, pipe, idle)
            .await
    }

    /// [`Services::connect_worker_idle`], with the pipe at `pipe_url` when given
    /// (`GATEHOUSE_DB_PIPE_URL`) and set up for `pooling` (`GATEHOUSE_DB_POOLING`).
    pub async fn connect_worker_pooled(
        url: &str,
        pipe_url: Option<&str>,
        pooling: Pooling,
        max_connections: u32,
        pipe: Option<u32>,
        idle: Duration,
    ) -> Result<Self> {
        pipe_role_fits(pooling, url, pipe_url)?;
        let (pool_size, pipe_size) = Services::worker_split(max_connections, pipe);
        let name = "gatehouse-worker";
        Services::connect_split(url, pipe_url, pooling, pool_size, pipe_size, name, idle).await
    }

    /// The pool's and the pipe's shares of a worker's `max_connections`.
    fn worker_split(max_connections: u32, pipe: Option<u32>) -> (u32, u32) {
        let total = max_connections.max(3);
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u32;
        let pipe_size = pipe.unwrap_or(cores.div_ceil(4)).min(total / 3).max(1);
        (total - 2 * pipe_size, pipe_size)
    }

    async fn connect_split(
        url: &str,
        pipe_url: Option<&str>,
        pooling: Pooling,
        pool_size: u32,
        pipe_size: u32,
        name: &'static str,
        idle: Duration,
    ) -> Result<Self> {
        // One server, or several of which the primary is used (see `failover`).
        let servers = failover::servers(url)?;
        let all: Vec<_> =
            failover::options_of(&servers)?.into_iter().map(|o| o.application_name(name)).collect();
        // The pipe's servers: `pipe_url`'s (its own role, behind a transaction pooler), or
        // the pool's.
        let (pipe_servers, pipe_all) = match pipe_url {
            Some(pipe_url) => {
                let servers = failover::servers_of("GATEHOUSE_DB_PIPE_URL", pipe_url)?;
                let all = failover::options_of_var("GATEHOUSE_DB_PIPE_URL", &servers)?;
                (servers, all)
            }
            None => (servers.clone(), all.clone()),
        };
        // Neither driver is built with TLS: a URL that insists on it is refused here, by name,
        // rather than met by sqlx's refusal for one and a plain connection for the other.
        let insists = |o: &sqlx::postgres::PgConnectOptions| {
            use sqlx::postgres::PgSslMode;
            matches!(
                o.get_ssl_mode(),
                PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull
            )
        };
        for (field, options) in [("DATABASE_URL", &all), ("GATEHOUSE_DB_PIPE_URL", &pipe_all)] {
            if options.iter().any(insists) {
                return Err(Error::invalid(
                    field,
                    "asks for TLS (sslmode=require or verify-*, in the URL or PGSSLMODE), which \
                     Gatehouse's Postgres drivers are not built with: reach Postgres (or its \
                     pooler) over a private network or a local TLS proxy, with sslmode=prefer or \
                     disable",
                ));
            }
        }
        let found = if all.len() > 1 { failover::primary(&all).await } else { Some(0) };
        let at = found.unwrap_or(0);
        let options = all[at].clone();
        let mut pipe_config = pipe::config_for(&pipe_servers[0], &pipe_all[0]);
        if pipe_all.len() > 1 {
            for other in &pipe_all[1..] {
                pipe_config.host(pipe::bare_host(other.get_host())).port(other.get_port());
            }
            pipe_config.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
        }
        let pool = PgPoolOptions::new()
            .max_connections(pool_size)
            // Bounded and shrinking: a connection idle for IDLE_CLOSE is closed, none is kept
            // open for nothing, so an idle process holds (nearly) none and a fleet's sum stays
            // within what Postgres (or its pooler) allows (docs/operations.md, "Connections").
            .min_connections(0)
            .idle_timeout(Some(idle))
            .acquire_timeout(Duration::from_secs(5))
            // sqlx pings every connection it hands out by default: a round trip per statement
            // (docs/profile-read-path.md measured it at a tenth of a read's CPU). Only a
            // connection that sat idle is pinged, so one left broken by a database restart is
            // still dropped before a request meets it, and a busy pool pays nothing.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if !check_before_use(meta.idle_for) {
                        return Ok(true);
                    }
                    sqlx::Connection::ping(conn).await.map(|()| true)
                })
            })
            .connect_with(options)
            .await?;
        if all.len() > 1 {
            tokio::spawn(failover::follow(pool.clone(), all, at, found.is_some()));
        }
        Ok(Services::with_pipe(pool, pipe::Pipe::new(pipe_config, pipe_size as usize, pooling)))
    }

    /// Services on `pool`, with a pipe of two connections to the same database (tests).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn with_pool(pool: PgPool) -> Self {
        let config = pipe::config_from(&pool.connect_options());
        Services::with_pipe(pool, pipe::Pipe::new(config, 2, Pooling::Session))
    }

    /// The pool for the tools' work and transactions, and the pipe (opened as needed) for the
    /// statement every request runs first.
    fn with_pipe(pool: PgPool, pipe: pipe::Pipe) -> Self {
        let hashing = std::sync::Arc::new(tokio::sync::Semaphore::new(HASHING_AT_ONCE));
        Services {
            pool,
            pipe: std::sync::Arc::new(pipe),
            hashing,
            policy: Policy::default(),
            bus: None,
            secret_keys: None,
            audit_keys: None,
            compiled_policies: Default::default(),
        }
    }

    /// The policy sets this process compiled for this database.
    pub(crate) fn compiled_policies(&self) -> &crate::policies::CompiledByTenant {
        &self.compiled_policies
    }

    pub(crate) fn pipe(&self) -> &std::sync::Arc<pipe::Pipe> {
        &self.pipe
    }

    /// An error with its cause found: a pool's wait that ended without a connection says
    /// nothing of why (sqlx retries a refused connect until the wait ends), so one connect is
    /// tried here and what Postgres answers is the cause (logged with its SQLSTATE). A
    /// connect that works means every pooled connection was busy.
    pub async fn explain(&self, error: Error) -> Error {
        match &error {
            Error::Unavailable { cause } if cause.contains(crate::error::POOL_TIMED_OUT) => {}
            _ => return error,
        }
        // One probe at a time per process: a flood of timed-out calls must not become a flood
        // of connections beyond the pool's bound.
        static PROBING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
        let Ok(_probe) = PROBING.try_acquire() else { return error };
        let options = self.pool.connect_options();
        let tried = tokio::time::timeout(
            Duration::from_secs(2),
            <sqlx::PgConnection as sqlx::Connection>::connect_with(&*options),
        )
        .await;
        match tried {
            Ok(Ok(conn)) => {
                let _ = sqlx::Connection::close(conn).await;
                let busy = crate::error::DbFailure {
                    sqlstate: None,
                    message: format!(
                        "every one of this process's {} pooled connections was busy for 5 s",
                        self.pool.options().get_max_connections()
                    ),
                };
                busy.log();
                Error::Unavailable { cause: busy.cause() }
            }
            Ok(Err(e)) => Error::from(e),
            Err(_) => error,
        }
    }

    /// How the hot path's statements were planned on this process's pipe connections (for
    /// the worker's metrics): custom plans mean a statement's plan is no longer pinned.
    pub async fn pipe_plans(&self) -> Vec<PlanCount> {
        self.pipe.plans().await
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn from_pool(pool: PgPool) -> Self {
        Services::with_pool(pool)
    }

    /// Checks a password against its argon2id hash (or a dummy one when there is none, so the
    /// work is the same) on a blocking thread, waiting for a hashing slot.
    pub(crate) async fn verify_password(
        &self,
        password: &str,
        hash: Option<String>,
    ) -> Result<bool> {
        let _slot = self.hashing.acquire().await.map_err(|e| Error::Internal(e.to_string()))?;
        let password = password.to_owned();
        tokio::task::spawn_blocking(move || {
            const DUMMY: &str = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHRzYWx0$0000000000000000000000000000000000000000000";
            let ok = crate::secret::verify_password(&password, hash.as_deref().unwrap_or(DUMMY));
            ok && hash.is_some()
        })
        .await
        .map_err(|e| Error::Internal(e.to_string()))
    }

    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    pub(crate) fn policy(&self) -> Policy {
        self.policy
    }

    pub fn with_bus(mut self, bus: crate::bus::Bus) -> Self {
        self.bus = Some(bus);
        self
    }

    pub(crate) fn bus(&self) -> Option<&crate::bus::Bus> {
        self.bus.as_ref()
    }

    /// With the keys that seal secrets kept in Postgres (`GATEHOUSE_SECRET_KEYS`).
    pub fn with_secret_keys(mut self, keys: std::sync::Arc<crate::seal::SealKeys>) -> Self {
        self.secret_keys = Some(keys);
        self
    }

    pub(crate) fn secret_keys(&self) -> Option<&crate::seal::SealKeys> {
        self.secret_keys.as_deref()
    }

    /// With the keys that sign audit checkpoints (`GATEHOUSE_AUDIT_SIGNING_KEYS`).
    pub fn with_audit_keys(mut self, keys: std::sync::Arc<crate::signing::SigningKeys>) -> Self {
        self.audit_keys = Some(keys);
        self
    }

    pub(crate) fn audit_keys(&self) -> Option<&crate::signing::SigningKeys> {
        self.audit_keys.as_deref()
    }

    /// Applies every pending migration from `migrations/`.
    pub async fn migrate(&self) -> Result<usize> {
        let before: i64 = applied_count(&self.pool).await;
        MIGRATOR.run(&self.pool).await?;
        let after: i64 = applied_count(&self.pool).await;
        Ok(usize::try_from(after - before).unwrap_or(0))
    }

    /// Readiness: one trivial round trip.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// A worker's readiness: the pool answers, and so does the hot path's pipe (the statement
    /// every MCP request starts with, for no token).
    pub async fn ping_hot_path(&self) -> Result<()> {
        self.ping().await?;
        Ok(self.pipe.ready().await?)
    }

    /// The pool, lent to a task that holds no transaction (checked in debug builds: [`held`]).
    #[track_caller]
    pub(crate) fn pool(&self) -> &PgPool {
        held::check_lend();
        &self.pool
    }
}

async fn applied_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(pool)
        .await
        .unwrap_or(0)
}

/// A statement meant to touch exactly one of the tenant's rows touched none: the row belongs to
/// another tenant, which the caller's own lookups rule out (R3). Loud, never a silent no-op.
pub(crate) fn one_row(rows: u64, what: &str) -> Result<()> {
    if rows == 1 { Ok(()) } else { Err(Error::Internal(what.into())) }
}

pub(crate) fn to_ts(t: chrono::DateTime<chrono::Utc>) -> jiff::Timestamp {
    jiff::Timestamp::from_microsecond(t.timestamp_micros()).unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

pub(crate) fn from_ts(t: jiff::Timestamp) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_micros(t.as_microsecond()).unwrap_or_default()
}

impl Services {
    /// Starts the one kind of transaction services use; dropping it uncommitted rolls back.
    /// (Checked as it is called, so a refusal names the caller's line.)
    #[track_caller]
    pub(crate) fn begin(&self) -> impl Future<Output = Result<Tx<'static>>> + Send + '_ {
        let pool = self.pool();
        let begun = std::panic::Location::caller();
        async move {
            let inner = pool.begin().await?;
            Ok(Tx { inner, held: held::Held::note(begun) })
        }
    }
}

// The driver's errors become the kernel's here, beside the connection bookkeeping they feed
// (`note_broken`), so the error module needs nothing of the store.
impl From<sqlx::Error> for crate::error::Error {
    fn from(e: sqlx::Error) -> Self {
        // SQLSTATE class 08 (connection exception) and 57P (the server shutting down or
        // terminating the session) end a connection as surely as a broken socket.
        let ended = match &e {
            sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Tls(_) => true,
            // 25006: a read-only server (a standby): the failover watcher looks for the primary.
            sqlx::Error::Database(db) => db
                .code()
                .is_some_and(|c| c.starts_with("08") || c.starts_with("57P") || c == "25006"),
            _ => false,
        };
        if ended {
            // The connection broke: every other idle connection may have too (a restart).
            note_broken();
        }
        let failure = match &e {
            sqlx::Error::Database(db) => crate::error::DbFailure {
                sqlstate: db.code().map(|c| c.into_owned()),
                message: db.message().to_owned(),
            },
            sqlx::Error::PoolTimedOut => crate::error::DbFailure {
                sqlstate: None,
                message: crate::error::POOL_TIMED_OUT.into(),
            },
            // Not the database's doing: a row that does not decode, a missing row.
            sqlx::Error::RowNotFound
            | sqlx::Error::ColumnNotFound(_)
            | sqlx::Error::ColumnDecode { .. }
            | sqlx::Error::Decode(_)
            | sqlx::Error::TypeNotFound { .. }
            | sqlx::Error::ColumnIndexOutOfBounds { .. }
            | sqlx::Error::Encode(_) => {
                return crate::error::Error::Internal(format!("database: {e}"));
            }
            other => crate::error::DbFailure { sqlstate: None, message: other.to_string() },
        };
        failure.into_error()
    }
}

impl From<sqlx::migrate::MigrateError> for crate::error::Error {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        crate::error::Error::Internal(format!("migration: {e}"))
    }
}

#[cfg(test)]
mod convention {
    /// Every query function takes the operation context, or its name says why it cannot
    /// (`entry_`, `preauth_`, `job_`, `platform_`); plumbing lives in `mod.rs`, the pipe and
    /// `failover` (which server to connect to).
    #[test]
    fn every_query_takes_the_context_or_says_why_not() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/datastore");
        let mut checked = 0;
        let mut unexplained = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("the datastore's sources") {
            let path = entry.expect("a source").path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue; // a module's folder of tests (pipe/tests.rs)
            }
            let file = path.file_name().and_then(|f| f.to_str()).unwrap_or_default().to_owned();
            if file == "mod.rs" || file == "pipe.rs" || file == "failover.rs" {
                continue;
            }
            let source = std::fs::read_to_string(&path).expect("readable");
            for function in source.split("pub(crate) async fn ").skip(1) {
                let name: String = function
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let signature = function.split('{').next().unwrap_or_default();
                checked += 1;
                let says_why = ["entry_", "preauth_", "job_", "platform_"]
                    .iter()
                    .any(|prefix| name.starts_with(prefix));
                if !signature.contains("ctx: &OpCtx") && !says_why {
                    unexplained.push(format!("{file}: {name}"));
                }
            }
        }
        assert!(checked > 100, "only {checked} query functions found");
        assert!(unexplained.is_empty(), "no context and no reason: {unexplained:?}");
    }
}
