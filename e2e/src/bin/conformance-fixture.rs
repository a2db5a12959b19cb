//! The conformance fixture: the worker's own protocol layer (`worker::protocol_config`, the
//! same rmcp service setup and stateless handling) serving the fixture tools the MCP
//! conformance suite calls, on loopback only and without auth (the suite sends none).
//! Scenarios for capabilities Gatehouse does not offer (resources, prompts, elicitation,
//! tasks) stay failing by design; see docs/conformance.md.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::StreamableHttpService;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::{ErrorData, ServerHandler};
use serde_json::json;

/// A 1×1 red PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A 44-byte silent WAV header.
const WAV: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA=";

const TOOLS: &[(&str, &str)] = &[
    ("test_simple_text", "Returns a text block."),
    ("test_image_content", "Returns a PNG image."),
    ("test_audio_content", "Returns a WAV audio clip."),
    ("test_embedded_resource", "Returns an embedded text resource."),
    ("test_multiple_content_types", "Returns text, an image and a resource."),
    ("test_error_handling", "Always fails with a tool error."),
    ("test_tool_with_progress", "Reports progress three times."),
];

#[derive(Clone)]
struct Fixture;

/// A content block from its wire form.
fn block(value: serde_json::Value) -> ContentBlock {
    serde_json::from_value(value).expect("a valid content block")
}

fn resource() -> ContentBlock {
    block(
        json!({"type": "resource", "resource": {"uri": "test://embedded-resource", "mimeType": "text/plain",
        "text": "This is an embedded resource content."}}),
    )
}

fn image() -> ContentBlock {
    block(json!({"type": "image", "data": PNG, "mimeType": "image/png"}))
}

impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = Arc::new(
            json!({"type": "object", "properties": {}}).as_object().cloned().unwrap_or_default(),
        );
        Ok(ListToolsResult::with_all_items(
            TOOLS.iter().map(|(n, d)| Tool::new(*n, *d, schema.clone())).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let result = match request.name.as_ref() {
            "test_simple_text" => CallToolResult::success(vec![ContentBlock::text(
                "This is a simple text response for testing.",
            )]),
            "test_image_content" => CallToolResult::success(vec![image()]),
            "test_audio_content" => CallToolResult::success(vec![block(
                json!({"type": "audio", "data": WAV, "mimeType": "audio/wav"}),
            )]),
            "test_embedded_resource" => CallToolResult::success(vec![resource()]),
            "test_multiple_content_types" => CallToolResult::success(vec![
                ContentBlock::text("Multiple content types test:"),
                image(),
                resource(),
            ]),
            "test_error_handling" => CallToolResult::error(vec![ContentBlock::text(
                "This tool intentionally returns an error for testing",
            )]),
            "test_tool_with_progress" => {
                if let Some(token) = context.meta.get_progress_token() {
                    for step in [0.0, 50.0, 100.0] {
                        let _ = context
                            .peer
                            .notify_progress(
                                ProgressNotificationParam::new(token.clone(), step)
                                    .with_total(100.0),
                            )
                            .await;
                    }
                }
                CallToolResult::success(vec![ContentBlock::text("Progress complete")])
            }
            other => return Err(ErrorData::invalid_params(format!("unknown tool {other}"), None)),
        };
        Ok(result.into())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let listen = std::env::args()
        .skip_while(|a| a != "--listen")
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9400".into());
    anyhow::ensure!(
        listen.starts_with("127.0.0.1:"),
        "the fixture has no auth: it listens on loopback only"
    );
    let hosts = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), listen.clone()];
    let config = worker::protocol_config(&hosts, &[]);
    let service = StreamableHttpService::new(
        || Ok(Fixture),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    axum::serve(tokio::net::TcpListener::bind(&listen).await?, router).await?;
    Ok(())
}
