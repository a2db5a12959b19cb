//! The stateless MCP worker: `/mcp` (rmcp Streamable HTTP), protected resource metadata,
//! health and metrics. It keeps no state of its own: every request is authenticated against
//! Postgres with one query, and any worker can answer any request.

pub mod entry;
pub mod listen;
pub mod live;
pub mod mcp;
pub mod metrics;
pub mod mrtr;
pub mod results;
pub mod serve;
pub mod tasks;
pub mod tools;
pub mod written;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use shared::Services;

/// What a worker is told at start.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The public base URL clients use (the load balancer's), without a trailing slash.
    pub public_url: String,
    /// The authorization server (the control plane's public URL).
    pub authorization_server: String,
    /// `Host` values accepted on `/mcp` (DNS-rebinding guard).
    pub allowed_hosts: Vec<String>,
    /// Browser origins accepted on `/mcp`; any other `Origin` gets 403 (R20).
    pub allowed_origins: Vec<String>,
    /// A name for this worker, sent as `Gatehouse-Worker` so tests can see the balancing.
    pub worker_id: String,
    /// Keys that seal multi round-trip `requestState` (the same on every worker); without
    /// them two-step tools answer PREVIEW to every client.
    pub mrtr_keys: Option<Arc<shared::seal::SealKeys>>,
}

impl Settings {
    pub fn mcp_url(&self) -> String {
        format!("{}/mcp", self.public_url)
    }

    pub fn resource_metadata_url(&self) -> String {
        format!("{}/.well-known/oauth-protected-resource", self.public_url)
    }
}

pub struct AppState {
    pub ds: Services,
    pub settings: Settings,
    pub metrics: Arc<metrics::Metrics>,
    pub tools: tools::Registry,
    pub live: Arc<live::Live>,
    /// Per-worker read buckets (writes count in Postgres, shared by all workers).
    pub reads: shared::services::rates::LocalBuckets,
    /// Calls counted for the console's pictures, written in batches by [`record_activity`].
    pub activity: shared::services::activity::Recorder,
    /// Requests this worker serves at once; past it, 503 with `Retry-After` at once, so
    /// overload sheds instead of queueing without bound.
    pub capacity: Arc<tokio::sync::Semaphore>,
    /// The `subscriptions/listen` streams this worker holds.
    pub streams: Arc<listen::Streams>,
    /// Listen streams re-reading their context at once (one push may wake thousands).
    pub rechecks: Arc<tokio::sync::Semaphore>,
    /// Cancelled when the worker starts to stop: listen streams end with their final result.
    pub draining: tokio_util::sync::CancellationToken,
    /// The same, as a flag a woken listen stream reads without the token's lock (one for all
    /// of the worker's streams).
    pub draining_now: std::sync::atomic::AtomicBool,
    /// Cancelled just after: rmcp ends whatever still streams, so shutdown never hangs.
    pub stopping: tokio_util::sync::CancellationToken,
}

/// How a worker stops: listen streams are told first and end with their final result (the
/// client listens again, through the balancer, on another worker), then whatever still
/// streams is ended, so a graceful shutdown finishes instead of waiting for streams that
/// would never end on their own.
pub async fn drain(state: &AppState) {
    state.draining_now.store(true, std::sync::atomic::Ordering::Release);
    state.draining.cancel();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    state.stopping.cancel();
}

/// Seconds between SSE keep-alive comments on a streamed answer that is otherwise quiet.
pub const LISTEN_KEEP_ALIVE_SECS: u64 = 20;
// Under the common balancer idle timeout (60 s), or streams are cut while they wait.
const _: () = assert!(LISTEN_KEEP_ALIVE_SECS < 60);

/// Requests a worker serves at once unless told otherwise (`--max-inflight`).
pub const DEFAULT_MAX_INFLIGHT: usize = 256;

impl AppState {
    pub fn new(ds: Services, settings: Settings) -> Self {
        AppState {
            ds,
            settings,
            metrics: Arc::new(metrics::Metrics::new()),
            tools: tools::Registry::new(),
            live: Arc::new(live::Live::default()),
            reads: Default::default(),
            activity: Default::default(),
            capacity: Arc::new(tokio::sync::Semaphore::new(DEFAULT_MAX_INFLIGHT)),
            streams: Arc::new(listen::Streams::default()),
            rechecks: Arc::new(tokio::sync::Semaphore::new(listen::RECHECKS_AT_ONCE)),
            draining: Default::default(),
            draining_now: Default::default(),
            stopping: Default::default(),
        }
    }

    /// With room for `n` listen streams at once (at least one).
    pub fn with_max_listen_streams(mut self, n: usize) -> Self {
        self.streams = Arc::new(listen::Streams::new(n));
        self
    }

    /// With room for `n` requests at once (at least one).
    pub fn with_max_inflight(mut self, n: usize) -> Self {
        self.capacity = Arc::new(tokio::sync::Semaphore::new(n.max(1)));
        self
    }
}

/// The Streamable HTTP protocol layer every worker serves: stateless for every protocol era,
/// JSON unless a notification must stream, `Host` and `Origin` allow-lists. The conformance
/// fixture (`e2e`) is served with the same configuration.
pub fn protocol_config(
    allowed_hosts: &[String],
    allowed_origins: &[String],
) -> StreamableHttpServerConfig {
    StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        // A streamed answer (a listen stream, a long tool's progress) carries an SSE comment
        // every 20 s while nothing else is sent: balancers with idle timeouts (60 s is common)
        // keep it open, and a client that went away is noticed when the write fails, so its
        // listen stream frees its place.
        .with_sse_keep_alive(Some(std::time::Duration::from_secs(LISTEN_KEEP_ALIVE_SECS)))
        .with_allowed_hosts(allowed_hosts.to_vec())
        .with_allowed_origins(allowed_origins.to_vec())
        .enforce_origin_validation()
}

/// Everything on one listener: the public routes and the operator routes (development, tests).
pub fn app(state: Arc<AppState>) -> Router {
    public_app(state.clone()).merge(operator_app(state))
}

/// The operator routes: readiness and metrics, for probes and Prometheus, never for the
/// public listener when `--operator-listen` is given.
pub fn operator_app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .layer(axum::middleware::from_fn_with_state(state.clone(), entry::tag_worker))
        .with_state(state)
}

/// The public routes: `/mcp`, protected resource metadata and liveness.
pub fn public_app(state: Arc<AppState>) -> Router {
    let handler_state = state.clone();
    let config = protocol_config(&state.settings.allowed_hosts, &state.settings.allowed_origins)
        .with_cancellation_token(state.stopping.clone());
    let mcp = StreamableHttpService::new(
        move || Ok(mcp::Server::new(handler_state.clone())),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let mcp_routes = Router::new()
        .nest_service("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(state.clone(), entry::authenticate));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/.well-known/oauth-protected-resource", get(protected_resource))
        .route("/.well-known/oauth-protected-resource/mcp", get(protected_resource))
        .merge(mcp_routes)
        .layer(axum::middleware::from_fn_with_state(state.clone(), entry::tag_worker))
        .with_state(state)
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let nats = if state.live.nats_connected() { "connected" } else { "disconnected" };
    match state.ds.ping_hot_path().await {
        Ok(()) => (
            StatusCode::OK,
            Json(serde_json::json!({"status": "ready", "postgres": "ok", "nats": nats})),
        )
            .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "readiness: postgres unreachable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({"status": "not ready", "postgres": "unreachable", "nats": nats})),
            )
                .into_response()
        }
    }
}

async fn metrics_text(State(state): State<Arc<AppState>>) -> Response {
    for count in state.ds.pipe_plans().await {
        let plans = &state.metrics.pipe_plans;
        plans.with_label_values(&[count.statement, "generic"]).set(count.generic);
        plans.with_label_values(&[count.statement, "custom"]).set(count.custom);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render()).into_response()
}

/// RFC 9728 protected resource metadata.
async fn protected_resource(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "resource": state.settings.mcp_url(),
        "authorization_servers": [state.settings.authorization_server],
        "bearer_methods_supported": ["header"],
        "scopes_supported": shared::rights::Right::ALL.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
        "resource_name": "Gatehouse bookings",
    }))
}

/// How often a worker writes the calls it counted.
pub const ACTIVITY_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

/// Writes the counted calls every [`ACTIVITY_FLUSH`] for the life of the worker; a failed
/// write keeps the counts for the next one.
pub async fn record_activity(state: Arc<AppState>) {
    let mut tick = tokio::time::interval(ACTIVITY_FLUSH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = state.activity.flush(&state.ds).await {
            state.metrics.activity_flush_failures.inc();
            tracing::warn!(error = %e, "writing call activity failed; keeping it for the next write");
        }
    }
}

#[cfg(test)]
mod keep_alive {
    /// Quiet streamed answers carry keep-alive comments, so a balancer's idle timeout does not
    /// cut a listen stream and a vanished client is noticed.
    #[test]
    fn streamed_answers_keep_alive() {
        let config = super::protocol_config(&[], &[]);
        assert_eq!(
            config.sse_keep_alive,
            Some(std::time::Duration::from_secs(super::LISTEN_KEEP_ALIVE_SECS))
        );
    }
}
