//! `control-plane --listen ADDR --public-url URL`.

use std::sync::Arc;

use clap::Parser;
use control_plane::{AppState, Metrics, app, jobs};
use shared::Services;
use shared::config::{self, Common};

#[derive(Debug, Parser)]
#[command(
    name = "control-plane",
    about = "Gatehouse control plane: REST API, console, OAuth authorization server"
)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Public base URL of the control plane.
    #[arg(long, env = "GATEHOUSE_CONTROL_URL")]
    public_url: String,
    /// The MCP URL(s) clients connect to (the load balancer's `/mcp`); OAuth tokens are bound to them.
    #[arg(long = "mcp-resource", env = "GATEHOUSE_MCP_RESOURCE", value_delimiter = ',')]
    mcp_resources: Vec<String>,
    /// Development: fetch client ID metadata documents over http and from loopback/private addresses.
    #[arg(long)]
    dev_mode: bool,
    /// Development and tests: also trust this CA certificate (PEM) when fetching client metadata
    /// documents and key sets over https, e.g. a test certificate served on loopback.
    #[arg(long, env = "GATEHOUSE_DEV_CA_CERT", requires = "dev_mode")]
    dev_ca_cert: Option<std::path::PathBuf>,
    /// Behind a proxy that sets X-Forwarded-For (nginx, an ingress): take the client's address
    /// from it for sign-in throttling. Leave off when clients reach the control plane directly.
    #[arg(long, env = "GATEHOUSE_TRUST_FORWARDED_FOR")]
    trust_forwarded_for: bool,
    /// Serve `/readyz` and `/metrics` here only, not on `--listen`.
    #[arg(long, env = "GATEHOUSE_OPERATOR_LISTEN")]
    operator_listen: Option<String>,
    /// Deliver emails through this SMTP relay (smtps://user:pass@host, smtp://host:port?tls=required);
    /// without it, deliveries are only logged.
    #[arg(long, env = "GATEHOUSE_SMTP_URL", hide_env_values = true)]
    smtp_url: Option<String>,
    /// The From address of emails.
    #[arg(
        long,
        env = "GATEHOUSE_SMTP_FROM",
        default_value = "Gatehouse <no-reply@gatehouse.invalid>"
    )]
    smtp_from: String,
    /// Do not deliver the outbox from this process (another one does); nothing else stops.
    #[arg(long)]
    no_dispatcher: bool,
    /// Do not chain the audit log, sign checkpoints or deliver audit webhooks from this
    /// process (another one does).
    #[arg(long)]
    no_audit_jobs: bool,
    /// Seconds between two checkpoint rounds (each signs every chain head that moved).
    #[arg(long, env = "GATEHOUSE_AUDIT_CHECKPOINT_SECS", default_value_t = 60)]
    audit_checkpoint_secs: u64,
    /// Audit events a tenant's webhook has not taken for this long are dropped (and the console
    /// says so).
    #[arg(long, env = "GATEHOUSE_AUDIT_WEBHOOK_MAX_AGE_SECS", default_value_t = 7 * 86_400)]
    audit_webhook_max_age_secs: i64,
    /// The longest wait between two attempts to a failing audit webhook.
    #[arg(long, env = "GATEHOUSE_AUDIT_WEBHOOK_MAX_BACKOFF_MS", default_value_t = 300_000)]
    audit_webhook_max_backoff_ms: i64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    config::init_tracing();
    let args = Args::parse();
    let telemetry =
        shared::telemetry::init("gatehouse-control-plane").map_err(|e| anyhow::anyhow!(e))?;
    let common = Common::from_env()?;
    let mut fetch =
        shared::services::oauth::FetchPolicy { dev: args.dev_mode, ..Default::default() };
    if let Some(path) = &args.dev_ca_cert {
        let pem = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("--dev-ca-cert {}: {e}", path.display()))?;
        fetch.extra_roots.push(reqwest::Certificate::from_pem(&pem)?);
    }
    let mut ds = Services::connect_idle(
        common.database_url.expose(),
        common.db_max_connections,
        std::time::Duration::from_secs(common.db_idle_secs),
    )
    .await?
    .with_bus(shared::bus::Bus::spawn(&common.nats_url, common.nats_replicas));
    if let Some(keys) = common.seal_keys()? {
        ds = ds.with_secret_keys(keys);
    }
    match common.audit_keys()? {
        Some(keys) => ds = ds.with_audit_keys(keys),
        None => tracing::warn!(
            "GATEHOUSE_AUDIT_SIGNING_KEYS is not set: audit chains are kept but no checkpoint is signed"
        ),
    }
    let passkeys = shared::services::passkeys::RelyingParty::new(&args.public_url)?;
    let state = Arc::new(AppState {
        passkeys,
        ds,
        public_url: args.public_url.trim_end_matches('/').to_owned(),
        metrics: Metrics::new(),
        mcp_resources: args
            .mcp_resources
            .iter()
            .map(|r| r.trim_end_matches('/').to_owned())
            .collect(),
        fetch,
        trust_forwarded_for: args.trust_forwarded_for,
        jobs: Default::default(),
        audit_checkpoint_secs: args.audit_checkpoint_secs.max(1),
        audit_seen: Default::default(),
    });
    // Every job runs in its own task (control_plane::jobs): none waits on another. The audit
    // jobs stop with --no-audit-jobs, the outbox with --no-dispatcher; housekeeping always runs.
    if !args.no_audit_jobs {
        let policy = shared::services::audit::WebhookPolicy {
            max_age_secs: args.audit_webhook_max_age_secs,
            max_backoff_ms: args.audit_webhook_max_backoff_ms,
            ..Default::default()
        };
        let every = std::time::Duration::from_secs(args.audit_checkpoint_secs.max(1));
        let anchors = common.audit_anchors()?;
        jobs::spawn(jobs::Chain { ds: state.ds.clone() }, state.clone());
        jobs::spawn(
            jobs::Checkpoints { state: state.clone(), every, anchors, alerted: Default::default() },
            state.clone(),
        );
        jobs::spawn(
            jobs::Webhooks { state: state.clone(), policy, running: Default::default() },
            state.clone(),
        );
    }
    jobs::spawn(jobs::Housekeeping { ds: state.ds.clone() }, state.clone());
    if !args.no_dispatcher {
        let ds = state.ds.clone();
        match &args.smtp_url {
            Some(url) => {
                let sink = control_plane::smtp::SmtpSink::new(url, &args.smtp_from)?;
                jobs::spawn(jobs::Outbox { ds, sink, state: state.clone() }, state.clone());
            }
            None => {
                let sink = shared::services::outbox::LogSink;
                jobs::spawn(jobs::Outbox { ds, sink, state: state.clone() }, state.clone());
            }
        }
    }
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    tracing::info!(listen = %args.listen, "control plane listening");
    let public = match &args.operator_listen {
        Some(addr) => {
            let operator = tokio::net::TcpListener::bind(addr).await?;
            tracing::info!(listen = %addr, "operator endpoints listening");
            let routes = control_plane::operator_app(state.clone());
            tokio::spawn(async move {
                if let Err(e) = axum::serve(operator, routes).await {
                    tracing::error!(error = %e, "operator listener failed");
                }
            });
            control_plane::public_app(state)
        }
        None => app(state),
    };
    axum::serve(listener, public.into_make_service_with_connect_info::<std::net::SocketAddr>())
        .with_graceful_shutdown(config::shutdown_signal())
        .await?;
    tokio::task::spawn_blocking(move || telemetry.shutdown()).await?;
    Ok(())
}
