//! Runs Gatehouse as users meet it: the real binaries, N workers behind nginx, Postgres and
//! NATS. Used by the e2e tests, `scripts/dev` (through `gatehouse-dev`) and the benchmark.
//!
//! Everything listens on loopback. Children are killed when the [`Stack`] is dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

/// The repository root (this crate lives in `e2e/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e sits in the repository")
        .to_path_buf()
}

/// Where the Gatehouse binaries are: `GATEHOUSE_BIN_DIR`, else `target/debug`.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("GATEHOUSE_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/debug"))
}

/// The Python with the MCP SDK: `GATEHOUSE_PYTHON`, else the `.venv` that `scripts/test` makes.
pub fn python() -> PathBuf {
    std::env::var_os("GATEHOUSE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/python"))
}

pub fn pg_server() -> String {
    std::env::var("GATEHOUSE_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// A free loopback port (bound, then released), never one this process handed out before: the
/// OS may return a just-released port again, and two servers of concurrent tests (or of one
/// stack, like NATS and a worker) must not be given the same one.
pub fn free_port() -> Result<u16> {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    for _ in 0..1000 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner()).insert(port) {
            return Ok(port);
        }
    }
    bail!("no free loopback port found")
}

pub struct Options {
    pub workers: usize,
    /// Database name; dropped and created afresh.
    pub database: String,
    /// Fixed ports (load balancer, control plane, first worker); free ones when `None`.
    pub ports: Option<(u16, u16, u16)>,
    pub run_dir: PathBuf,
    /// `RUST_LOG` for the services.
    pub log_level: String,
    /// Pool size per process.
    pub db_pool: u32,
    /// The Postgres server (`postgres://user@host:port`); the machine's own by default.
    pub pg_server: String,
    /// An SMTP relay for the outbox; deliveries are only logged without one.
    pub smtp_url: Option<String>,
    /// More arguments for the control plane (e.g. `--dev-mode --dev-ca-cert PEM`).
    pub control_args: Vec<String>,
    /// Environment for the control plane and every worker (e.g. `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub env: Vec<(String, String)>,
    /// NATS servers: 1, or 3 for a cluster on loopback ports (worker `i` connects to node
    /// `i % 3`, the control plane to all three, the bucket kept on all three).
    pub nats_nodes: usize,
    /// Put Debian's PgBouncer between the services and Postgres, allowing at most this many
    /// server connections for the stack's database (`None`: straight to Postgres).
    pub pgbouncer: Option<u32>,
    /// PgBouncer in transaction pooling mode (1.21+, `max_prepared_statements`) instead of
    /// session mode: the services run with `GATEHOUSE_DB_POOLING=transaction`, the workers'
    /// pipes as the role `gatehouse_pipe` carrying their settings, migrations straight to
    /// Postgres.
    pub pgbouncer_transaction: bool,
}

impl Options {
    pub fn for_test(name: &str, workers: usize) -> Options {
        let unique = format!("{name}_{}", std::process::id());
        Options {
            workers,
            database: format!("gh_e2e_{unique}"),
            ports: None,
            run_dir: std::env::temp_dir().join(format!("gatehouse-{unique}")),
            log_level: "info,sqlx=warn,rmcp=warn".into(),
            db_pool: 8,
            pg_server: pg_server(),
            smtp_url: None,
            control_args: Vec::new(),
            env: Vec::new(),
            nats_nodes: 1,
            pgbouncer: None,
            pgbouncer_transaction: false,
        }
    }
}

pub use mcp::{mcp_request, sdk_check, tool_call, tool_names};
use postgres::start_pgbouncer;
pub use postgres::{PRODUCTION_SETTINGS, PrivatePostgres};
pub mod bench;
mod mcp;
mod postgres;

struct Proc {
    name: String,
    child: Child,
}

pub struct Stack {
    procs: Vec<Proc>,
    pub database_url: String,
    /// Postgres itself, past any pooler (the benchmark's bare peers connect here).
    pub direct_url: String,
    /// This stack's own NATS server (JetStream, its own store), so tests can stop and start it;
    /// with a cluster, every node's URL, comma-separated.
    pub nats_url: String,
    /// Client and cluster-route ports of each NATS node.
    nats_ports: Vec<(u16, u16)>,
    pub lb_url: String,
    pub control_url: String,
    pub worker_urls: Vec<String>,
    pub seed: Value,
    pub run_dir: PathBuf,
    worker_ports: Vec<u16>,
    opts_log: String,
    db_pool: u32,
    /// The key specification every worker seals multi round-trip state with.
    mrtr_keys: String,
    env: Vec<(String, String)>,
    control_port: u16,
    control_args: Vec<String>,
    smtp_url: Option<String>,
}

fn spawn_logged(name: &str, mut cmd: Command, run_dir: &Path) -> Result<Proc> {
    let log = std::fs::File::create(run_dir.join(format!("{name}.log")))?;
    cmd.stdout(log.try_clone()?).stderr(log).stdin(Stdio::null());
    let child = cmd.spawn().with_context(|| format!("start {name}"))?;
    Ok(Proc { name: name.to_owned(), child })
}

pub fn bin(name: &str) -> Result<PathBuf> {
    let path = bin_dir().join(name);
    if !path.exists() {
        bail!("{} is missing; build it first: cargo build --workspace --bins", path.display());
    }
    Ok(path)
}

fn psql(server: &str, sql: &str) -> Result<()> {
    let out = Command::new("psql")
        .arg(format!("{server}/postgres"))
        .args(["-v", "ON_ERROR_STOP=1", "-qc", sql])
        .output()
        .context("run psql (apt-get install postgresql-client)")?;
    if !out.status.success() {
        bail!("psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

pub fn gatehousectl(database_url: &str, args: &[&str]) -> Result<Value> {
    gatehousectl_with(database_url, "nats://127.0.0.1:4222", args)
}

/// The keys every stack's control plane and `gatehousectl` seal kept secrets with (a tenant
/// IdP's client secret): fixed and public, for test stacks only.
pub const SECRET_KEYS: &str = "e2e1:ZTJlLW9ubHktc2VhbC1rZXktZm9yLWdhdGVob3VzZSE";
/// The stack's audit checkpoint signing key (`GATEHOUSE_AUDIT_SIGNING_KEYS`).
pub const AUDIT_SIGNING_KEYS: &str = "e2e1:dGVzdC1vbmx5LWF1ZGl0LXNpZ25pbmcta2V5LTMyYnk";

pub fn gatehousectl_with(database_url: &str, nats_url: &str, args: &[&str]) -> Result<Value> {
    let out = Command::new(bin("gatehousectl")?)
        .args(args)
        .arg("--json")
        .env("DATABASE_URL", database_url)
        .env("NATS_URL", nats_url)
        .env("GATEHOUSE_SECRET_KEYS", SECRET_KEYS)
        .env("GATEHOUSE_AUDIT_SIGNING_KEYS", AUDIT_SIGNING_KEYS)
        .output()?;
    let value: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!("gatehousectl {args:?}: {}", String::from_utf8_lossy(&out.stderr))
    })?;
    if !out.status.success() {
        bail!("gatehousectl {args:?} failed: {value}");
    }
    Ok(value)
}

/// Waits until `url` answers 200.
pub async fn wait_ready(url: &str, within: Duration) -> Result<()> {
    let http = reqwest::Client::new();
    let start = Instant::now();
    loop {
        if let Ok(r) = http.get(url).timeout(Duration::from_secs(2)).send().await
            && r.status().is_success()
        {
            return Ok(());
        }
        if start.elapsed() > within {
            bail!("{url} not ready after {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Stack {
    pub async fn start(opts: Options) -> Result<Stack> {
        std::fs::create_dir_all(opts.run_dir.join("nginx-tmp"))?;
        psql(&opts.pg_server, &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", opts.database))?;
        psql(&opts.pg_server, &format!("CREATE DATABASE {}", opts.database))?;
        let mut pooler = None;
        let mut env = opts.env.clone();
        let direct_url = format!("{}/{}", opts.pg_server, opts.database);
        let database_url = match opts.pgbouncer {
            None => direct_url.clone(),
            Some(max_server) => {
                let mode = if opts.pgbouncer_transaction {
                    postgres::Pooler::Transaction
                } else {
                    postgres::Pooler::Session
                };
                let (url, proc) = start_pgbouncer(
                    &opts.pg_server,
                    &opts.database,
                    max_server,
                    mode,
                    &opts.run_dir,
                )?;
                pooler = Some(proc);
                if opts.pgbouncer_transaction {
                    postgres::create_pipe_role(&opts.pg_server, &opts.database)?;
                    let mut pipe_url = url::Url::parse(&format!("{url}/{}", opts.database))?;
                    pipe_url
                        .set_username("gatehouse_pipe")
                        .map_err(|()| anyhow::anyhow!("the pooler's URL takes no user"))?;
                    env.push(("GATEHOUSE_DB_POOLING".into(), "transaction".into()));
                    env.push(("GATEHOUSE_DB_PIPE_URL".into(), pipe_url.to_string()));
                }
                format!("{url}/{}", opts.database)
            }
        };
        // Migrations hold a session lock, which a transaction pooler cannot keep: they go to
        // Postgres itself, as docs/operations.md tells operators.
        let migrate_url = if opts.pgbouncer_transaction { &direct_url } else { &database_url };
        gatehousectl(migrate_url, &["migrate"])?;
        let seed = gatehousectl(&database_url, &["demo", "seed"])?;

        let nats_ports: Vec<(u16, u16)> = (0..opts.nats_nodes.max(1))
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<Result<_>>()?;
        let nats_url = nats_ports
            .iter()
            .map(|(p, _)| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        if nats_ports.len() > 1 {
            env.push(("GATEHOUSE_NATS_REPLICAS".into(), nats_ports.len().min(5).to_string()));
        }
        let (lb_port, control_port, first_worker) = match opts.ports {
            Some(p) => p,
            None => (free_port()?, free_port()?, 0),
        };
        let worker_ports: Vec<u16> = (0..opts.workers)
            .map(|i| if first_worker == 0 { free_port() } else { Ok(first_worker + i as u16) })
            .collect::<Result<_>>()?;
        let lb_url = format!("http://127.0.0.1:{lb_port}");
        let control_url = format!("http://127.0.0.1:{control_port}");
        let mut stack = Stack {
            procs: pooler.into_iter().collect(),
            database_url: database_url.clone(),
            direct_url: direct_url.clone(),
            nats_url: nats_url.clone(),
            nats_ports,
            lb_url: lb_url.clone(),
            control_url: control_url.clone(),
            worker_urls: worker_ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect(),
            seed,
            run_dir: opts.run_dir.clone(),
            worker_ports: worker_ports.clone(),
            opts_log: opts.log_level.clone(),
            db_pool: opts.db_pool,
            mrtr_keys: shared::seal::SealKeys::generate("dev1"),
            env: env.clone(),
            control_port,
            control_args: opts.control_args.clone(),
            smtp_url: opts.smtp_url.clone(),
        };

        stack.start_nats()?;
        stack.start_control_plane()?;
        for i in 0..opts.workers {
            stack.start_worker(i)?;
        }
        stack.write_nginx_conf(lb_port)?;
        let mut nginx = Command::new(nginx_bin()?);
        nginx.args([
            "-p",
            &opts.run_dir.to_string_lossy(),
            "-c",
            &opts.run_dir.join("nginx.conf").to_string_lossy(),
        ]);
        stack.procs.push(spawn_logged("nginx", nginx, &opts.run_dir)?);

        wait_ready(&format!("{control_url}/readyz"), Duration::from_secs(30)).await?;
        for url in &stack.worker_urls {
            wait_ready(&format!("{url}/readyz"), Duration::from_secs(30)).await?;
        }
        wait_ready(&format!("{lb_url}/readyz"), Duration::from_secs(30)).await?;
        Ok(stack)
    }

    /// Starts (or restarts) the control plane on its port.
    pub fn start_control_plane(&mut self) -> Result<()> {
        let mut cp = Command::new(bin("control-plane")?);
        cp.args([
            "--listen",
            &format!("127.0.0.1:{}", self.control_port),
            "--public-url",
            &self.control_url,
        ])
        .args(["--mcp-resource", &format!("{}/mcp", self.lb_url)])
        .args(self.smtp_url.iter().flat_map(|u| ["--smtp-url", u.as_str()]))
        .args(&self.control_args)
        .env("DATABASE_URL", &self.database_url)
        .env("NATS_URL", &self.nats_url)
        .env("RUST_LOG", &self.opts_log)
        .env("GATEHOUSE_DB_POOL", self.db_pool.to_string())
        .env("GATEHOUSE_SECRET_KEYS", SECRET_KEYS)
        .env("GATEHOUSE_AUDIT_SIGNING_KEYS", AUDIT_SIGNING_KEYS)
        .env("GATEHOUSE_AUDIT_ANCHOR_FILE", self.anchor_file())
        .envs(self.env.iter().map(|(k, v)| (k, v)));
        self.procs.retain(|p| p.name != "control-plane");
        self.procs.push(spawn_logged("control-plane", cp, &self.run_dir)?);
        Ok(())
    }

    /// Where the control plane appends every audit checkpoint it signs, outside Postgres.
    pub fn anchor_file(&self) -> PathBuf {
        self.run_dir.join("audit-anchors.jsonl")
    }

    /// What `gatehousectl` needs to act on this stack, as `KEY=value` lines (`.run/env`):
    /// its database and NATS, the keys it seals with, the published audit keys it verifies
    /// with, the anchor file, and the operator it acts as.
    pub fn cli_env(&self, operator: &str) -> String {
        [
            ("DATABASE_URL", self.database_url.clone()),
            ("NATS_URL", self.nats_url.clone()),
            ("GATEHOUSE_OPERATOR", operator.to_owned()),
            ("GATEHOUSE_SECRET_KEYS", SECRET_KEYS.to_owned()),
            ("GATEHOUSE_AUDIT_SIGNING_KEYS", AUDIT_SIGNING_KEYS.to_owned()),
            (
                "GATEHOUSE_AUDIT_KEYS",
                format!("{}/.well-known/gatehouse-audit-keys", self.control_url),
            ),
            ("GATEHOUSE_AUDIT_ANCHOR_FILE", self.anchor_file().to_string_lossy().into_owned()),
        ]
        .iter()
        .map(|(k, v)| format!("export {k}='{v}'\n"))
        .collect()
    }

    /// Kills the control plane (SIGKILL), as a crashed pod would die.
    pub fn kill_control_plane(&mut self) -> Result<()> {
        let p = self
            .procs
            .iter_mut()
            .find(|p| p.name == "control-plane")
            .ok_or_else(|| anyhow!("no control plane"))?;
        p.child.kill()?;
        p.child.wait()?;
        Ok(())
    }

    /// Starts (or restarts) worker `i` on its port.
    pub fn start_worker(&mut self, i: usize) -> Result<()> {
        let port = self.worker_ports[i];
        let mut w = Command::new(bin("worker")?);
        w.args(["--listen", &format!("127.0.0.1:{port}"), "--public-url", &self.lb_url])
            .args(["--authorization-server", &self.control_url])
            .args(["--worker-id", &format!("worker-{}", i + 1)])
            .env("DATABASE_URL", &self.database_url)
            .env("NATS_URL", self.worker_nats_url(i))
            .env("RUST_LOG", &self.opts_log)
            .env("GATEHOUSE_DB_POOL", self.db_pool.to_string())
            // Every worker of the stack seals multi round-trip state with the same key.
            .env("GATEHOUSE_MRTR_KEYS", &self.mrtr_keys)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        let name = format!("worker-{}", i + 1);
        self.procs.retain(|p| p.name != name);
        self.procs.push(spawn_logged(&name, w, &self.run_dir)?);
        Ok(())
    }

    fn write_nginx_conf(&self, lb_port: u16) -> Result<()> {
        let conf = self.nginx_conf(lb_port, &self.worker_ports, "nginx")?;
        std::fs::write(self.run_dir.join("nginx.conf"), conf)?;
        Ok(())
    }

    /// Another nginx in front of only the given workers (0-based); returns its URL.
    pub fn start_balancer(&mut self, workers: &[usize]) -> Result<String> {
        let port = free_port()?;
        let ports: Vec<u16> = workers.iter().map(|i| self.worker_ports[*i]).collect();
        let name = format!("nginx-{port}");
        let conf = self.nginx_conf(port, &ports, &name)?;
        let path = self.run_dir.join(format!("{name}.conf"));
        std::fs::write(&path, conf)?;
        let mut nginx = Command::new(nginx_bin()?);
        nginx.args(["-p", &self.run_dir.to_string_lossy(), "-c", &path.to_string_lossy()]);
        self.procs.push(spawn_logged(&name, nginx, &self.run_dir)?);
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if start.elapsed() > Duration::from_secs(10) {
                bail!("{name} did not start");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(format!("http://127.0.0.1:{port}"))
    }

    /// Starts a named helper process with this stack's database and NATS in its environment.
    pub fn spawn_helper(&mut self, name: &str, binary: &str, args: &[&str]) -> Result<()> {
        let mut cmd = Command::new(bin(binary)?);
        cmd.args(args)
            .env("DATABASE_URL", &self.direct_url)
            .env("NATS_URL", &self.nats_url)
            .env("RUST_LOG", &self.opts_log);
        self.procs.push(spawn_logged(name, cmd, &self.run_dir)?);
        Ok(())
    }

    fn nginx_conf(&self, lb_port: u16, worker_ports: &[u16], name: &str) -> Result<String> {
        let dir = self.run_dir.to_string_lossy();
        let servers: String = worker_ports
            .iter()
            .map(|p| format!("        server 127.0.0.1:{p} max_fails=1 fail_timeout=2s;\n"))
            .collect();
        Ok(format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {dir}/{name}.pid;\nerror_log {dir}/{name}-error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n    access_log off;\n    client_body_temp_path {dir}/nginx-tmp/body;\n    proxy_temp_path {dir}/nginx-tmp/proxy;\n\
             fastcgi_temp_path {dir}/nginx-tmp/fastcgi;\n    uwsgi_temp_path {dir}/nginx-tmp/uwsgi;\n    scgi_temp_path {dir}/nginx-tmp/scgi;\n\
             upstream gatehouse_workers {{\n{servers}        keepalive 64;\n        keepalive_timeout 5s;\n    }}\n\
             server {{\n        listen 127.0.0.1:{lb_port};\n        location / {{\n            proxy_pass http://gatehouse_workers;\n\
             proxy_http_version 1.1;\n            proxy_set_header Connection \"\";\n            proxy_set_header Host $http_host;\n\
             proxy_buffering off;\n            proxy_read_timeout 300s;\n            proxy_next_upstream error timeout http_502;\n        }}\n    }}\n}}\n"
        ))
    }

    /// The NATS URL worker `i` is given: its own node of a cluster.
    pub fn worker_nats_url(&self, i: usize) -> String {
        let (port, _) = self.nats_ports[i % self.nats_ports.len()];
        format!("nats://127.0.0.1:{port}")
    }

    fn nats_name(&self, node: usize) -> String {
        if self.nats_ports.len() == 1 { "nats".to_owned() } else { format!("nats-{}", node + 1) }
    }

    /// Starts (or restarts) this stack's NATS servers and waits until they accept connections.
    pub fn start_nats(&mut self) -> Result<()> {
        for node in 0..self.nats_ports.len() {
            self.start_nats_node(node)?;
        }
        Ok(())
    }

    /// Starts (or restarts) one NATS node, with its own JetStream store; in a cluster it
    /// routes to the other nodes.
    pub fn start_nats_node(&mut self, node: usize) -> Result<()> {
        let name = self.nats_name(node);
        let store = self.run_dir.join(format!("{name}-store"));
        std::fs::create_dir_all(&store)?;
        let (port, route) = self.nats_ports[node];
        let mut nats = Command::new(nats_bin()?);
        nats.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"]).arg(&store);
        if self.nats_ports.len() > 1 {
            let routes: Vec<String> = self
                .nats_ports
                .iter()
                .enumerate()
                .filter(|(k, _)| *k != node)
                .map(|(_, (_, r))| format!("nats://127.0.0.1:{r}"))
                .collect();
            nats.args(["-n", &name, "--cluster_name", "gatehouse"])
                .args(["--cluster", &format!("nats://127.0.0.1:{route}")])
                .args(["--routes", &routes.join(",")]);
        }
        self.procs.retain(|p| p.name != name);
        self.procs.push(spawn_logged(&name, nats, &self.run_dir)?);
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if start.elapsed() > Duration::from_secs(10) {
                bail!("nats-server did not start: {}", self.log(&name));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Stops this stack's NATS servers, as an outage would.
    pub fn stop_nats(&mut self) -> Result<()> {
        for node in 0..self.nats_ports.len() {
            self.stop_nats_node(node)?;
        }
        Ok(())
    }

    /// Stops one NATS node (SIGKILL), as a crashed server would stop.
    pub fn stop_nats_node(&mut self, node: usize) -> Result<()> {
        let name = self.nats_name(node);
        if let Some(p) = self.procs.iter_mut().find(|p| p.name == name) {
            p.child.kill()?;
            p.child.wait()?;
        }
        self.procs.retain(|p| p.name != name);
        Ok(())
    }

    /// `gatehousectl` against this stack's database and NATS, run by the platform operator the
    /// demo seed made (the first tenant's admin).
    pub fn ctl(&self, args: &[&str]) -> Result<Value> {
        let operator = self.tenant(0)["admin"]["email"].as_str().unwrap_or_default().to_owned();
        let mut with = vec!["--as", operator.as_str()];
        with.extend_from_slice(args);
        gatehousectl_with(&self.database_url, &self.nats_url, &with)
    }

    /// Adds a second admin to tenant `slug`: the tenant's last admin can be neither demoted nor
    /// deactivated, so a test that takes the first admin's role away adds one first.
    pub fn add_second_admin(&self, slug: &str) -> Result<Value> {
        self.ctl(&[
            "person",
            "create",
            "--tenant",
            slug,
            "--email",
            "second.admin@example.com",
            "--name",
            "Second Admin",
            "--role",
            "admin",
        ])
    }

    /// Kills worker `i` (SIGKILL), as a crashed pod would die.
    pub fn kill_worker(&mut self, i: usize) -> Result<()> {
        let name = format!("worker-{}", i + 1);
        let p =
            self.procs.iter_mut().find(|p| p.name == name).ok_or_else(|| anyhow!("no {name}"))?;
        p.child.kill()?;
        p.child.wait()?;
        Ok(())
    }

    pub fn tenant(&self, i: usize) -> &Value {
        &self.seed["tenants"][i]
    }

    pub fn token(&self, tenant: usize, connection: usize) -> String {
        self.tenant(tenant)["connections"][connection]["token"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The process id of a running child (`worker-1`, `nginx`, …).
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.procs.iter().find(|p| p.name == name).map(|p| p.child.id())
    }

    /// A log file of one process, for failure messages.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.run_dir.join(format!("{name}.log"))).unwrap_or_default()
    }
}

fn nats_bin() -> Result<PathBuf> {
    for candidate in ["/usr/sbin/nats-server", "/usr/bin/nats-server"] {
        if Path::new(candidate).exists() {
            return Ok(PathBuf::from(candidate));
        }
    }
    bail!(
        "nats-server is not installed; scripts/test and scripts/dev install it (apt-get install nats-server)"
    )
}

fn nginx_bin() -> Result<PathBuf> {
    for candidate in ["/usr/sbin/nginx", "/usr/bin/nginx"] {
        if Path::new(candidate).exists() {
            return Ok(PathBuf::from(candidate));
        }
    }
    bail!(
        "nginx is not installed; scripts/test and scripts/dev install it (apt-get install nginx-light)"
    )
}

impl Drop for Stack {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        // The services run as debug builds, where a transaction that asks the pool for a second
        // connection panics; a background job's run survives that as a failed run, so every
        // stack's logs are read for its line once the test is over (a test that already failed
        // keeps its own message).
        if !std::thread::panicking() {
            for p in &self.procs {
                let log = self.log(&p.name);
                if let Some(line) =
                    log.lines().find(|l| l.contains(shared::SECOND_CONNECTION_LOGGED))
                {
                    panic!("{} broke the transaction rule: {line}", p.name);
                }
            }
        }
    }
}
