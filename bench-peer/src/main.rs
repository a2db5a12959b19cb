//! Reference peers for the benchmark: the same booking lookup with no Gatehouse gates.
//!
//! - `--mode rmcp`: a bare rmcp Streamable HTTP server (stateless, JSON responses) with two tools,
//!   `get_booking`, that runs the lookup SQL and returns its fields, and `find_bookings`, that
//!   runs Gatehouse's search statement for a page of bookings — no auth, rights, switches,
//!   replay or presenters. Gatehouse's cost is the ratio against it.
//! - `--mode plain`: the same lookup as plain JSON over axum + sqlx: the floor under any MCP layer.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};

/// Gatehouse's own booking statement (customer, technician, service, the latest notes and their
/// count), so the peers differ from a gated call by the gates and the presenter only.
fn lookup_sql() -> &'static str {
    shared::services::read_path_statements().1
}

/// A booking row as the peer answers it.
fn booking(r: &sqlx::postgres::PgRow) -> Value {
    json!({
            "booking": r.get::<String, _>("handle"), "status": r.get::<String, _>("status"),
            "starts_at": r.get::<chrono::DateTime<chrono::Utc>, _>("starts_at").to_rfc3339(),
            "zone": r.get::<String, _>("zone"),
            "total_minor": r.get::<i64, _>("total_minor"), "currency": r.get::<String, _>("currency"),
            "customer": r.get::<String, _>("customer_handle"), "customer_name": r.get::<String, _>("customer_name"),
            "service": r.get::<String, _>("service_name"),
            "notes": r.get::<Value, _>("notes"), "notes_total": r.get::<i64, _>("notes_total"),
    })
}

async fn lookup(pool: &PgPool, tenant: i64, handle: &str) -> Value {
    let query = sqlx::query(lookup_sql())
        .bind(tenant)
        .bind(handle)
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .bind(None::<String>);
    match query.fetch_optional(pool).await {
        Ok(Some(r)) => booking(&r),
        Ok(None) => json!({"error": "not found"}),
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// Gatehouse's search statement for the first `limit` bookings of the tenant (one more read,
/// as Gatehouse reads, to tell whether a next page exists).
async fn search(pool: &PgPool, tenant: i64, limit: i64) -> Value {
    let none_at = None::<chrono::DateTime<chrono::Utc>>;
    let query = sqlx::query(shared::services::search_statement())
        .bind(tenant)
        .bind(none_at)
        .bind(none_at)
        .bind(Vec::<String>::new())
        .bind(None::<String>)
        .bind(None::<String>)
        .bind(none_at)
        .bind(None::<String>)
        .bind(limit + 1);
    match query.fetch_all(pool).await {
        Ok(rows) => {
            let more = rows.len() as i64 > limit;
            let bookings: Vec<Value> = rows.iter().take(limit as usize).map(booking).collect();
            json!({"count": bookings.len(), "bookings": bookings, "more": more})
        }
        Err(e) => json!({"error": e.to_string()}),
    }
}

#[derive(Clone)]
struct Bare {
    pool: PgPool,
    tenant: i64,
}

impl ServerHandler for Bare {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({"type": "object", "properties": {"booking": {"type": "string"}}});
        let search = json!({"type": "object", "properties": {"limit": {"type": "integer"}}});
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new(
                "get_booking",
                "lookup",
                Arc::new(schema.as_object().cloned().unwrap_or_default()),
            ),
            Tool::new(
                "find_bookings",
                "search",
                Arc::new(search.as_object().cloned().unwrap_or_default()),
            ),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name == "find_bookings" {
            let limit = request
                .arguments
                .as_ref()
                .and_then(|a| a.get("limit"))
                .and_then(Value::as_i64)
                .unwrap_or(25);
            return Ok(
                CallToolResult::structured(search(&self.pool, self.tenant, limit).await).into()
            );
        }
        let handle = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("booking"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        Ok(CallToolResult::structured(lookup(&self.pool, self.tenant, &handle).await).into())
    }
}

async fn plain(State(peer): State<Bare>, Json(body): Json<Value>) -> Json<Value> {
    Json(lookup(&peer.pool, peer.tenant, body["booking"].as_str().unwrap_or_default()).await)
}

/// The same allocator as the worker, so the ratio measures the gates, not the allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg =
        |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let mode = arg("--mode").unwrap_or_else(|| "rmcp".into());
    let listen = arg("--listen").unwrap_or_else(|| "127.0.0.1:9300".into());
    let tenant: i64 = arg("--tenant").and_then(|t| t.parse().ok()).unwrap_or(1);
    // `--pool sqlx` keeps sqlx's defaults (a ping before each statement and after it, as most
    // servers run); `--pool tuned` skips the ping before, as Gatehouse's pool does when busy.
    let tuned = arg("--pool").as_deref() == Some("tuned");
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .test_before_acquire(!tuned)
        // The benchmark runs several peers one after another on one Postgres: an idle peer
        // gives its connections back within seconds.
        .idle_timeout(std::time::Duration::from_secs(2))
        // The plan settings Gatehouse's pipe runs with, so the two differ by the gates only.
        .connect_with(
            std::env::var("DATABASE_URL")?
                .parse::<sqlx::postgres::PgConnectOptions>()?
                .options([("plan_cache_mode", "force_generic_plan")]),
        )
        .await?;
    let peer = Bare { pool, tenant };
    let router = if mode == "plain" {
        axum::Router::new().route("/booking", axum::routing::post(plain)).with_state(peer)
    } else {
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true)
            .with_sse_keep_alive(None);
        let service = StreamableHttpService::new(
            move || Ok(peer.clone()),
            Arc::new(NeverSessionManager::default()),
            config,
        );
        axum::Router::new().nest_service("/mcp", service)
    };
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    axum::serve(listener, router).await?;
    Ok(())
}
