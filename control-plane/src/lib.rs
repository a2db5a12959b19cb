//! The control plane: the product REST API (`/api/v1`, API tokens), health and metrics.
//! The console and the OAuth authorization server mount here as well.

pub mod api;
pub mod console;
pub mod html;
pub mod oauth;
pub mod smtp;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use prometheus::{Encoder, IntCounterVec, Opts, Registry, TextEncoder};
use shared::Services;

pub struct AppState {
    pub ds: Services,
    /// The control plane's public URL: the OAuth issuer and the console's origin.
    pub public_url: String,
    pub metrics: Metrics,
    /// The MCP URLs tokens may be issued for (RFC 8707 audiences).
    pub mcp_resources: Vec<String>,
    /// Development only: fetch client metadata documents over http and from private addresses.
    pub dev_mode: bool,
    /// Whether the client's address comes from `X-Forwarded-For` (behind a proxy).
    pub trust_forwarded_for: bool,
}

pub struct Metrics {
    registry: Registry,
    pub api_requests: IntCounterVec,
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
        registry.register(Box::new(api_requests.clone())).expect("register once");
        Metrics { registry, api_requests }
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

pub fn app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .nest("/api/v1", api::routes(state.clone()))
        .merge(console::routes())
        .merge(oauth::routes())
        .with_state(state)
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
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render()).into_response()
}
