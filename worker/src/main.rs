//! `worker --listen ADDR --public-url URL`: one stateless MCP worker.

use std::sync::Arc;

use clap::Parser;
use shared::Services;
use shared::config::{self, Common};
use worker::{AppState, Settings, app};

/// mimalloc instead of glibc's malloc: a profile of the read path put a fifth of the worker's
/// CPU in glibc's allocator, part of it waiting on its arena locks across tokio's threads
/// (docs/profile-read-path.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "worker",
    about = "Gatehouse MCP worker (stateless; run several behind a load balancer)"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8081")]
    listen: String,
    /// Serve `/readyz` and `/metrics` here only, not on `--listen` (production: keep them off
    /// the public listener). Without it both are on `--listen`.
    #[arg(long, env = "GATEHOUSE_OPERATOR_LISTEN")]
    operator_listen: Option<String>,
    /// Public base URL clients use (the load balancer's), e.g. https://mcp.example.com.
    #[arg(long, env = "GATEHOUSE_PUBLIC_URL")]
    public_url: String,
    /// The authorization server (control plane) URL published in resource metadata.
    #[arg(long, env = "GATEHOUSE_AUTH_SERVER", default_value = "http://127.0.0.1:8080")]
    authorization_server: String,
    /// Extra accepted `Host` values (comma-separated); the public URL's host and loopback are
    /// always accepted.
    #[arg(long, env = "GATEHOUSE_ALLOWED_HOSTS", value_delimiter = ',')]
    allowed_hosts: Vec<String>,
    /// Browser origins accepted on /mcp (comma-separated, with scheme); others get 403.
    #[arg(long, env = "GATEHOUSE_ALLOWED_ORIGINS", value_delimiter = ',')]
    allowed_origins: Vec<String>,
    /// A name for this worker in the `Gatehouse-Worker` response header and logs.
    #[arg(long, env = "GATEHOUSE_WORKER_ID")]
    worker_id: Option<String>,
    /// Seconds a request's headers may take to arrive before the connection is closed, so a
    /// directly exposed worker cannot be held by half-sent requests.
    #[arg(long, env = "GATEHOUSE_HEADER_READ_TIMEOUT_SECS", default_value_t = 10)]
    header_read_timeout_secs: u64,
    /// Requests served at once; past it a request is answered 503 with Retry-After at once
    /// (load shedding), so overload costs retries, not unbounded queues and latency.
    #[arg(long, env = "GATEHOUSE_MAX_INFLIGHT", default_value_t = worker::DEFAULT_MAX_INFLIGHT)]
    max_inflight: usize,
    /// `subscriptions/listen` streams this worker holds at once (each an idle task until a
    /// change concerns it); past it a listen request is refused with a JSON-RPC error.
    #[arg(long, env = "GATEHOUSE_MAX_LISTEN_STREAMS", default_value_t = worker::listen::DEFAULT_MAX_PER_WORKER)]
    max_listen_streams: usize,
    /// Keys sealing multi round-trip confirmation state: `kid:base64url-32-bytes[,…]`, the
    /// first sealing; the same on every worker. Without them clients confirm with confirm_action.
    #[arg(long, env = "GATEHOUSE_MRTR_KEYS", hide_env_values = true)]
    mrtr_keys: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    config::init_tracing();
    let args = Args::parse();
    let telemetry = shared::telemetry::init("gatehouse-worker").map_err(|e| anyhow::anyhow!(e))?;
    let common = Common::from_env()?;
    let ds = Services::connect_worker_pooled(
        common.database_url.expose(),
        common.db_pipe_url.as_ref().map(|u| u.expose()),
        common.db_pooling,
        common.db_max_connections,
        common.db_pipe,
        std::time::Duration::from_secs(common.db_idle_secs),
    )
    .await?;
    let public_url = args.public_url.trim_end_matches('/').to_owned();
    let mut allowed_hosts = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()];
    if let Some(authority) =
        public_url.split("://").nth(1).map(|rest| rest.split('/').next().unwrap_or(rest))
    {
        allowed_hosts.push(authority.to_owned());
        allowed_hosts.push(authority.split(':').next().unwrap_or(authority).to_owned());
    }
    allowed_hosts.extend(args.allowed_hosts.into_iter().filter(|h| !h.is_empty()));
    let worker_id = args.worker_id.unwrap_or_else(|| args.listen.clone());
    let settings = Settings {
        public_url,
        authorization_server: args.authorization_server.trim_end_matches('/').to_owned(),
        allowed_hosts,
        allowed_origins: args.allowed_origins.into_iter().filter(|o| !o.is_empty()).collect(),
        worker_id,
        mrtr_keys: match &args.mrtr_keys {
            Some(spec) => Some(Arc::new(
                shared::seal::SealKeys::parse(spec)
                    .map_err(|e| anyhow::anyhow!("GATEHOUSE_MRTR_KEYS: {e}"))?,
            )),
            None => None,
        },
    };
    let bus = shared::bus::Bus::spawn(&common.nats_url, common.nats_replicas);
    let state = Arc::new(
        AppState::new(ds, settings)
            .with_max_inflight(args.max_inflight)
            .with_max_listen_streams(args.max_listen_streams),
    );
    tokio::spawn(worker::live::follow(
        bus,
        state.live.clone(),
        state.metrics.clone(),
        state.streams.clone(),
    ));
    tokio::spawn(worker::record_activity(state.clone()));
    let last_flush = state.clone();
    let stopping = state.clone();
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    tracing::info!(listen = %args.listen, worker.id = %state.settings.worker_id, "worker listening");
    let public = match &args.operator_listen {
        Some(addr) => {
            let operator = tokio::net::TcpListener::bind(addr).await?;
            tracing::info!(listen = %addr, "operator endpoints listening");
            let routes = worker::operator_app(state.clone());
            tokio::spawn(async move {
                if let Err(e) = axum::serve(operator, routes).await {
                    tracing::error!(error = %e, "operator listener failed");
                }
            });
            worker::public_app(state)
        }
        None => app(state),
    };
    worker::serve::serve(
        listener,
        public,
        std::time::Duration::from_secs(args.header_read_timeout_secs.max(1)),
        async move {
            config::shutdown_signal().await;
            worker::drain(&stopping).await;
        },
    )
    .await?;
    // What was counted since the last write, and the spans still queued, before exiting.
    if let Err(e) = last_flush.activity.flush(&last_flush.ds).await {
        tracing::warn!(error = %e, "writing call activity at shutdown failed");
    }
    tokio::task::spawn_blocking(move || telemetry.shutdown()).await?;
    Ok(())
}
