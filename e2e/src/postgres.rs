//! Postgres for a stack: a server of a test's own (initdb, settings for tests or production),
//! and PgBouncer in front of one.

use super::*;

/// How PgBouncer hands out server connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pooler {
    /// A client keeps one for its session (Debian 12's PgBouncer 1.18).
    Session,
    /// A client holds one for a transaction; named prepared statements are kept per client
    /// and prepared on whichever server runs them (`max_prepared_statements`, 1.21+).
    Transaction,
}

/// The PgBouncer binary for `mode`: Debian's package for session pooling; for transaction
/// pooling one of 1.21 or later, which `scripts/lib.sh` (`ensure_pgbouncer`) names in
/// `GATEHOUSE_PGBOUNCER_TXN`, building Debian 13's 1.24.1 into `.tools/` where Debian's is older.
fn pgbouncer_bin(mode: Pooler) -> Result<PathBuf> {
    let debian = PathBuf::from("/usr/sbin/pgbouncer");
    if mode == Pooler::Session {
        return Ok(debian);
    }
    let built = repo_root().join(".tools/pgbouncer-1.24.1/bin/pgbouncer");
    let named = std::env::var_os("GATEHOUSE_PGBOUNCER_TXN").map(PathBuf::from);
    // Debian's own, where it is new enough (Debian 13 ships 1.24).
    let recent = |p: &PathBuf| {
        let out = Command::new(p).arg("--version").output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let version = text.split_whitespace().nth(1)?.to_owned();
        let mut parts = version.split('.').map(|n| n.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next()?, parts.next().unwrap_or(0));
        ((major, minor) >= (1, 21)).then_some(())
    };
    let system = Some(debian).filter(|p| recent(p).is_some());
    named.into_iter().chain([built]).chain(system).find(|p| p.is_file()).ok_or_else(|| {
        anyhow::anyhow!(
            "transaction pooling needs PgBouncer 1.21+; run scripts/test (or \
             `bash -c 'source scripts/lib.sh && ensure_pgbouncer'`) to build it into .tools/"
        )
    })
}

/// The role the workers' pipes connect as behind a transaction pooler, carrying the pipe's
/// settings in `database` (docs/operations.md, "Transaction pooling"): a member of
/// `postgres`, so it reads and writes what the stack's tables' owner may.
pub(crate) fn create_pipe_role(pg_server: &str, database: &str) -> Result<()> {
    // Stacks start in parallel on one server: the role may appear between check and create.
    psql(
        pg_server,
        "DO $$ BEGIN CREATE ROLE gatehouse_pipe LOGIN IN ROLE postgres; \
         EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$",
    )?;
    psql(
        pg_server,
        &format!(
            "ALTER ROLE gatehouse_pipe IN DATABASE {database} SET plan_cache_mode = force_generic_plan; \
             ALTER ROLE gatehouse_pipe IN DATABASE {database} SET statement_timeout = '5s'; \
             ALTER ROLE gatehouse_pipe IN DATABASE {database} SET lock_timeout = '50ms'; \
             ALTER ROLE gatehouse_pipe IN DATABASE {database} SET synchronous_commit = off"
        ),
    )
}

/// PgBouncer on a free loopback port in front of `pg_server`, for one database, pooling as
/// `mode` says with at most `max_server` server connections to it. Returns its URL (user
/// `postgres`; `gatehouse_pipe` may connect too) and the process.
pub(crate) fn start_pgbouncer(
    pg_server: &str,
    database: &str,
    max_server: u32,
    mode: Pooler,
    run_dir: &Path,
) -> Result<(String, Proc)> {
    let server = url::Url::parse(pg_server)?;
    let user = if server.username().is_empty() { "postgres" } else { server.username() };
    let port = free_port()?;
    // PgBouncer refuses to run as root: it runs as `postgres` (`-u`), in a directory of its own.
    let run_dir = &run_dir.join("pgbouncer");
    std::fs::create_dir_all(run_dir)?;
    Command::new("chown").args(["postgres:postgres"]).arg(run_dir).status()?;
    let userlist = run_dir.join("pgbouncer-users.txt");
    std::fs::write(&userlist, format!("\"{user}\" \"\"\n\"gatehouse_pipe\" \"\"\n"))?;
    let pooling = match mode {
        Pooler::Session => "pool_mode = session\n",
        Pooler::Transaction => "pool_mode = transaction\nmax_prepared_statements = 200\n",
    };
    let config = format!(
        "[databases]\n\
         {database} = host={host} port={pg_port} dbname={database}\n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {port}\n\
         unix_socket_dir =\n\
         auth_type = trust\n\
         auth_file = {userlist}\n\
         {pooling}\
         max_client_conn = 1000\n\
         default_pool_size = {max_server}\n\
         max_db_connections = {max_server}\n\
         server_reset_query = DISCARD ALL\n\
         ignore_startup_parameters = extra_float_digits\n\
         query_wait_timeout = 30\n\
         logfile = {log}\n\
         pidfile = {pid}\n",
        host = server.host_str().unwrap_or("127.0.0.1"),
        pg_port = server.port().unwrap_or(5432),
        userlist = userlist.display(),
        log = run_dir.join("pgbouncer-own.log").display(),
        pid = run_dir.join("pgbouncer.pid").display(),
    );
    let ini = run_dir.join("pgbouncer.ini");
    std::fs::write(&ini, config)?;
    // Started as the child itself (PgBouncer takes the identity with `-u`), not under
    // `runuser`: killing a wrapper leaves PgBouncer running, orphaned, after the stack is gone.
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    let mut cmd = Command::new(pgbouncer_bin(mode)?);
    if root {
        cmd.args(["-u", "postgres"]);
    }
    cmd.arg(&ini);
    let proc = spawn_logged("pgbouncer", cmd, run_dir)?;
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok((format!("postgres://{user}@127.0.0.1:{port}"), proc));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("pgbouncer did not listen on {port}; see {}", run_dir.join("pgbouncer.log").display())
}

/// A Postgres server of a test's own (initdb'd as the `postgres` user on a free port), so a
/// test can stop and start it without disturbing anything else. Stopped on drop.
pub struct PrivatePostgres {
    dir: PathBuf,
    pub url: String,
}

fn pg_bin(tool: &str) -> Result<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|v| v.join("bin").join(tool))
        .context("no Postgres server binaries under /usr/lib/postgresql")
}

fn as_postgres(args: &[&str]) -> Result<()> {
    let out = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .args(args)
        .output()
        .context("runuser")?;
    if !out.status.success() {
        bail!(
            "{args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Settings of a private Postgres for tests: nothing waits for the disk.
const TEST_SETTINGS: &str = "-c fsync=off";

/// Settings of a private Postgres that claims production conditions (the benchmark): commits
/// reach the disk, autovacuum runs (with the aggressive thresholds managed services use, so a
/// run of minutes sees it work), memory as on a small dedicated server.
pub const PRODUCTION_SETTINGS: &str = "-c fsync=on -c synchronous_commit=on -c autovacuum=on \
     -c autovacuum_naptime=10s -c autovacuum_vacuum_scale_factor=0.05 \
     -c autovacuum_analyze_scale_factor=0.02 -c shared_buffers=1GB -c effective_cache_size=4GB \
     -c work_mem=16MB -c max_connections=200 -c random_page_cost=1.1";

impl PrivatePostgres {
    pub fn start(name: &str) -> Result<PrivatePostgres> {
        PrivatePostgres::start_with(name, TEST_SETTINGS)
    }

    /// A private Postgres with these server settings (`-c name=value …`), kept for every
    /// restart.
    pub fn start_with(name: &str, settings: &str) -> Result<PrivatePostgres> {
        let dir = std::env::temp_dir().join(format!("gatehouse-pg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Command::new("chown").args(["postgres:postgres"]).arg(&dir).status()?;
        let data = dir.join("data");
        as_postgres(&[
            &pg_bin("initdb")?.to_string_lossy(),
            "-D",
            &data.to_string_lossy(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ])?;
        let port = free_port()?;
        let pg = PrivatePostgres { dir, url: format!("postgres://postgres@127.0.0.1:{port}") };
        std::fs::write(pg.dir.join("port"), port.to_string())?;
        std::fs::write(pg.dir.join("settings"), settings)?;
        pg.resume()?;
        Ok(pg)
    }

    fn port(&self) -> String {
        std::fs::read_to_string(self.dir.join("port")).unwrap_or_default()
    }

    /// A streaming standby of `primary` (pg_basebackup: a copy of its data directory that
    /// follows its WAL), started on a port of its own. `synchronous` makes the primary wait for
    /// it before acknowledging a commit, so no acknowledged commit is lost when it is promoted.
    pub fn standby_of(
        primary: &PrivatePostgres,
        name: &str,
        synchronous: bool,
    ) -> Result<PrivatePostgres> {
        let dir = std::env::temp_dir().join(format!("gatehouse-pg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Command::new("chown").args(["postgres:postgres"]).arg(&dir).status()?;
        as_postgres(&[
            &pg_bin("pg_basebackup")?.to_string_lossy(),
            "-D",
            &dir.join("data").to_string_lossy(),
            "-h",
            "127.0.0.1",
            "-p",
            primary.port().trim(),
            "-U",
            "postgres",
            "-X",
            "stream",
            "-R",
            "--no-sync",
        ])?;
        let port = free_port()?;
        let standby = PrivatePostgres { dir, url: format!("postgres://postgres@127.0.0.1:{port}") };
        std::fs::write(standby.dir.join("port"), port.to_string())?;
        standby.resume()?;
        if synchronous {
            let out = Command::new("psql")
                .arg(format!("{}/postgres", primary.url))
                .args(["-Atqc", "ALTER SYSTEM SET synchronous_standby_names = '*'"])
                .output()?;
            if !out.status.success() {
                bail!("synchronous_standby_names: {}", String::from_utf8_lossy(&out.stderr));
            }
            psql(&primary.url, "SELECT pg_reload_conf()")?;
        }
        Ok(standby)
    }

    /// Promotes a standby to primary and waits until it takes writes.
    pub fn promote(&self) -> Result<()> {
        as_postgres(&[
            &pg_bin("pg_ctl")?.to_string_lossy(),
            "-D",
            &self.dir.join("data").to_string_lossy(),
            "-w",
            "promote",
        ])
    }

    /// Starts the server (again) and waits until it accepts connections.
    pub fn resume(&self) -> Result<()> {
        let settings = std::fs::read_to_string(self.dir.join("settings"))
            .unwrap_or_else(|_| TEST_SETTINGS.to_owned());
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 {settings}",
            self.port(),
            self.dir.display()
        );
        as_postgres(&[
            &pg_bin("pg_ctl")?.to_string_lossy(),
            "-D",
            &self.dir.join("data").to_string_lossy(),
            "-o",
            &options,
            "-l",
            &self.dir.join("log").to_string_lossy(),
            "-w",
            "start",
        ])
    }

    /// Stops the server at once, as an outage would.
    pub fn stop(&self) -> Result<()> {
        as_postgres(&[
            &pg_bin("pg_ctl")?.to_string_lossy(),
            "-D",
            &self.dir.join("data").to_string_lossy(),
            "-m",
            "immediate",
            "-w",
            "stop",
        ])
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
