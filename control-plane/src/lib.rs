//! The control plane: the product REST API (`/api/v1`, API tokens), health and metrics.
//! The console and the OAuth authorization server mount here as well.

pub mod api;
pub mod charts;
pub mod console;
pub mod jobs;
pub mod oauth;
pub mod pictures;
pub mod smtp;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use prometheus::{
    Encoder, Gauge, GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use shared::Services;

pub struct AppState {
    pub ds: Services,
    /// The control plane's public URL: the OAuth issuer and the console's origin.
    pub public_url: String,
    pub metrics: Metrics,
    /// The MCP URLs tokens may be issued for (RFC 8707 audiences).
    pub mcp_resources: Vec<String>,
    /// How client metadata documents and key sets are fetched (development relaxes it).
    pub fetch: shared::services::oauth::FetchPolicy,
    /// Whether the client's address comes from `X-Forwarded-For` (behind a proxy).
    pub trust_forwarded_for: bool,
    /// The WebAuthn relying party (the console's origin) for passkeys.
    pub passkeys: shared::services::passkeys::RelyingParty,
    /// The background jobs' state (`/jobs`).
    pub jobs: jobs::Board,
    /// Seconds between checkpoint rounds: rows uncovered for two of them are unanchored.
    pub audit_checkpoint_secs: u64,
    /// The audit states the console's banners last saw, per tenant.
    pub audit_seen: console::AuditSeen,
}

pub struct Metrics {
    registry: Registry,
    pub api_requests: IntCounterVec,
    /// Outbox delivery attempts by channel-less outcome (`sent`, `failed`).
    pub outbox_deliveries: IntCounterVec,
    /// Read from Postgres when scraped (see [`Metrics::scrape`]).
    pub outbox_queued: IntGauge,
    pub outbox_oldest: Gauge,
    pub outbox_failed: IntGauge,
    /// Audit webhook attempts by outcome (`sent`, `failed`, `dropped`).
    pub audit_webhook_deliveries: IntCounterVec,
    /// Per tenant (slug), read when scraped: audit events not yet delivered to its webhook.
    pub audit_webhook_backlog: IntGaugeVec,
    pub audit_webhook_oldest: GaugeVec,
    /// Tenants' delivery rounds running now (one task each).
    pub audit_webhook_tasks: IntGauge,
    /// Read when scraped: how long the oldest row has waited to be chained.
    pub audit_chain_lag: Gauge,
    /// Heads the signer refused because they do not extend its last checkpoint, per tenant.
    pub audit_checkpoint_refusals: IntCounterVec,
    /// Checkpoints that could not be appended to the anchor file (retried each round).
    pub audit_anchor_file_errors: IntCounter,
    /// Per background job: runs by outcome, last run, last success and last duration.
    pub job_runs: IntCounterVec,
    pub job_last_run: GaugeVec,
    pub job_last_success: GaugeVec,
    pub job_duration: GaugeVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new_custom(Some("gatehouse_control_plane".into()), None)
            .expect("valid prefix");
        let api_requests = IntCounterVec::new(
            Opts::new("api_requests_total", "REST API requests by route and status"),
            &["route", "status"],
        )
        .expect("valid metric");
        let outbox_deliveries = IntCounterVec::new(
            Opts::new(
                "outbox_deliveries_total",
                "Outbox delivery attempts by this process, by outcome (sent, failed)",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let outbox_queued =
            IntGauge::new("outbox_queued", "Messages waiting in the outbox").expect("valid metric");
        let outbox_oldest = Gauge::new(
            "outbox_oldest_queued_seconds",
            "How long the oldest queued message has waited",
        )
        .expect("valid metric");
        let outbox_failed =
            IntGauge::new("outbox_failed", "Messages given up on after five attempts")
                .expect("valid metric");
        let audit_webhook_deliveries = IntCounterVec::new(
            Opts::new(
                "audit_webhook_deliveries_total",
                "Audit webhook deliveries by this process, by outcome (sent, failed, dropped)",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let audit_webhook_backlog = IntGaugeVec::new(
            Opts::new(
                "audit_webhook_backlog",
                "Audit events chained but not yet delivered to the tenant's webhook",
            ),
            &["tenant"],
        )
        .expect("valid metric");
        let audit_webhook_oldest = GaugeVec::new(
            Opts::new(
                "audit_webhook_oldest_undelivered_seconds",
                "Age of the oldest audit event waiting for the tenant's webhook",
            ),
            &["tenant"],
        )
        .expect("valid metric");
        let audit_webhook_tasks = IntGauge::new(
            "audit_webhook_delivery_tasks",
            "Tenants' audit webhook delivery rounds running now, one task each",
        )
        .expect("valid metric");
        let audit_chain_lag = Gauge::new(
            "audit_chain_lag_seconds",
            "How long the oldest audit row has waited to be chained",
        )
        .expect("valid metric");
        let audit_checkpoint_refusals = IntCounterVec::new(
            Opts::new(
                "audit_checkpoint_refusals_total",
                "Chain heads the signer refused: they do not extend the last checkpoint it signed (tampering)",
            ),
            &["tenant"],
        )
        .expect("valid metric");
        let audit_anchor_file_errors = IntCounter::new(
            "audit_anchor_file_errors_total",
            "Rounds whose checkpoints could not be appended to GATEHOUSE_AUDIT_ANCHOR_FILE",
        )
        .expect("valid metric");
        let job_runs = IntCounterVec::new(
            Opts::new("job_runs_total", "Background job runs by job and outcome (ok, error)"),
            &["job", "outcome"],
        )
        .expect("valid metric");
        let gauge = |name: &str, help: &str| {
            GaugeVec::new(Opts::new(name, help), &["job"]).expect("valid metric")
        };
        let job_last_run =
            gauge("job_last_run_timestamp_seconds", "When the job last ran (Unix time)");
        let job_last_success = gauge(
            "job_last_success_timestamp_seconds",
            "When the job last ran without error (Unix time)",
        );
        let job_duration = gauge("job_duration_seconds", "How long the job's last run took");
        registry.register(Box::new(audit_webhook_tasks.clone())).expect("register once");
        registry.register(Box::new(audit_chain_lag.clone())).expect("register once");
        registry.register(Box::new(audit_checkpoint_refusals.clone())).expect("register once");
        registry.register(Box::new(audit_anchor_file_errors.clone())).expect("register once");
        registry.register(Box::new(job_runs.clone())).expect("register once");
        for g in [&job_last_run, &job_last_success, &job_duration] {
            registry.register(Box::new(g.clone())).expect("register once");
        }
        registry.register(Box::new(audit_webhook_deliveries.clone())).expect("register once");
        registry.register(Box::new(audit_webhook_backlog.clone())).expect("register once");
        registry.register(Box::new(audit_webhook_oldest.clone())).expect("register once");
        for c in [&api_requests, &outbox_deliveries] {
            registry.register(Box::new(c.clone())).expect("register once");
        }
        for g in [&outbox_queued, &outbox_failed] {
            registry.register(Box::new(g.clone())).expect("register once");
        }
        registry.register(Box::new(outbox_oldest.clone())).expect("register once");
        Metrics {
            registry,
            api_requests,
            outbox_deliveries,
            outbox_queued,
            outbox_oldest,
            outbox_failed,
            audit_webhook_deliveries,
            audit_webhook_backlog,
            audit_webhook_oldest,
            audit_webhook_tasks,
            audit_chain_lag,
            audit_checkpoint_refusals,
            audit_anchor_file_errors,
            job_runs,
            job_last_run,
            job_last_success,
            job_duration,
        }
    }

    /// Reads the outbox backlog (one small query on the queued index) and renders.
    async fn scrape(&self, ds: &Services) -> String {
        match shared::services::outbox::backlog(ds).await {
            Ok(b) => {
                self.outbox_queued.set(b.queued);
                self.outbox_oldest.set(b.oldest_secs);
                self.outbox_failed.set(b.failed);
            }
            Err(e) => tracing::warn!(error = %e, "outbox backlog for metrics"),
        }
        match shared::services::audit::webhook_backlog(ds).await {
            Ok(rows) => {
                self.audit_webhook_backlog.reset();
                self.audit_webhook_oldest.reset();
                for (tenant, waiting, oldest) in rows {
                    self.audit_webhook_backlog.with_label_values(&[&tenant]).set(waiting);
                    self.audit_webhook_oldest.with_label_values(&[&tenant]).set(oldest);
                }
            }
            Err(e) => tracing::warn!(error = %e, "audit webhook backlog for metrics"),
        }
        match shared::services::audit::chain_lag_secs(ds).await {
            Ok(lag) => self.audit_chain_lag.set(lag),
            Err(e) => tracing::warn!(error = %e, "audit chain lag for metrics"),
        }
        self.render()
    }

    fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).unwrap_or_default();
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Everything on one listener: the public routes and the operator routes (development, tests).
pub fn app(state: Arc<AppState>) -> Router {
    public_app(state.clone()).merge(operator_app(state))
}

/// Readiness and metrics, for probes and Prometheus; off the public listener when
/// `--operator-listen` is given.
pub fn operator_app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/jobs", get(jobs_status))
        .with_state(state)
}

/// The console, the OAuth server, the REST API and liveness.
pub fn public_app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/.well-known/gatehouse-audit-keys", get(audit_keys))
        .route("/.well-known/gatehouse-audit-checkpoints/{tenant}", get(audit_checkpoints))
        .nest("/api/v1", api::routes(state.clone()))
        .merge(
            console::routes()
                .merge(oauth::routes())
                .layer(axum::middleware::from_fn_with_state(state.clone(), console::offer_step_up))
                .layer(axum::middleware::from_fn_with_state(
                    state.clone(),
                    console::with_navigation,
                ))
                .layer(axum::middleware::map_response_with_state(state.clone(), security_headers)),
        )
        .route(
            "/static/console.css",
            get(|| async { static_file("text/css", console::layout::STYLE) }),
        )
        .route(
            "/static/console.js",
            get(|| async { static_file("text/javascript", console::layout::SCRIPT) }),
        )
        .route(
            "/static/passkeys.js",
            get(|| async { static_file("text/javascript", console::PASSKEY_SCRIPT) }),
        )
        .with_state(state)
}

fn static_file(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "public, max-age=3600")], body)
        .into_response()
}

/// The one layer that sets the security headers of every console and OAuth response: no
/// framing, no sniffing, no referrer, only the console's own script and style, HSTS when
/// served over https, and `no-store` (pages show tokens, codes and personal data).
async fn security_headers(State(state): State<Arc<AppState>>, mut response: Response) -> Response {
    let headers = response.headers_mut();
    let set = |headers: &mut axum::http::HeaderMap, name: &'static str, value: &'static str| {
        headers.insert(name, axum::http::HeaderValue::from_static(value));
    };
    set(
        headers,
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; frame-ancestors 'none'",
    );
    set(headers, "x-frame-options", "DENY");
    set(headers, "x-content-type-options", "nosniff");
    set(headers, "referrer-policy", "no-referrer");
    set(headers, "cache-control", "no-store");
    if state.public_url.starts_with("https://") {
        set(headers, "strict-transport-security", "max-age=31536000; includeSubDomains");
    }
    response
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    match state.ds.ping().await {
        Ok(()) => (StatusCode::OK, Json(serde_json::json!({"status": "ready"}))).into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"status": "not ready", "postgres": "unreachable"})),
        )
            .into_response(),
    }
}

async fn metrics_text(State(state): State<Arc<AppState>>) -> Response {
    let text = state.metrics.scrape(&state.ds).await;
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// Every background job's last run, duration, work and error (operators; JSON).
async fn jobs_status(State(state): State<Arc<AppState>>) -> Response {
    Json(serde_json::json!({"jobs": state.jobs.snapshot()})).into_response()
}

#[derive(serde::Deserialize)]
struct AfterQuery {
    #[serde(default)]
    after: i64,
}

/// A tenant's signed checkpoints, oldest first after `?after=SEQ`, 100 at a time: public,
/// by the tenant's handle, so auditors can keep their own copy of the anchors.
async fn audit_checkpoints(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(tenant): axum::extract::Path<String>,
    axum::extract::Query(q): axum::extract::Query<AfterQuery>,
) -> Response {
    if !tenant.starts_with("ten_") || tenant.len() > 40 {
        return (StatusCode::NOT_FOUND, Json(serde_json::json!({"error": "no such tenant"})))
            .into_response();
    }
    match shared::services::audit::published_checkpoints(&state.ds, &tenant, q.after, 100).await {
        Ok(Some(list)) => {
            let next = (list.len() == 100).then(|| list.last().map(|c| c.seq)).flatten();
            Json(serde_json::json!({
                "tenant": tenant,
                "keys": format!("{}/.well-known/gatehouse-audit-keys", state.public_url),
                "checkpoints": list,
                "next_after": next,
            }))
            .into_response()
        }
        Ok(None) => (StatusCode::NOT_FOUND, Json(serde_json::json!({"error": "no such tenant"})))
            .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "published checkpoints");
            (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "5")], "try again")
                .into_response()
        }
    }
}

/// The public keys that verify audit checkpoints, by key id (for auditors and SIEMs).
async fn audit_keys(State(state): State<Arc<AppState>>) -> Response {
    let keys = shared::services::audit::public_keys(&state.ds);
    Json(serde_json::json!({"alg": "Ed25519", "keys": keys})).into_response()
}
