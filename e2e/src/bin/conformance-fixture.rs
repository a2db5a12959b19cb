//! The conformance fixture: the worker's own protocol layer (`worker::protocol_config`, the
//! same rmcp service setup and stateless handling) serving the fixture tools the MCP
//! conformance suite calls, on loopback only and without auth (the suite sends none).
//! Scenarios for capabilities Gatehouse does not offer (resources, tasks) stay failing by
//! design; see docs/conformance.md.
//!
//! The multi round-trip (`input_required`) tools seal their `requestState` with the same
//! sealing as the workers' confirmations (`shared::seal`), refuse a tampered one with -32602,
//! and use each state once (here in process memory: the fixture has no database; the workers
//! use the pending action row).

use std::sync::Arc;

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, InputRequest, InputRequiredResult, InputResponses,
    ListPromptsResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, Prompt,
    ResultType, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::StreamableHttpService;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::{ErrorData, ServerHandler};
use serde_json::Value;
use serde_json::json;
use shared::seal::SealKeys;

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

/// The multi round-trip tools of the conformance suite (SEP-2322).
const MRTR_TOOLS: &[(&str, &str)] = &[
    ("test_input_required_result_elicitation", "Asks the user's name, then greets them."),
    ("test_input_required_result_sampling", "Asks the client's model a question."),
    ("test_input_required_result_list_roots", "Asks for the client's roots."),
    ("test_input_required_result_request_state", "Confirms with a sealed request state."),
    ("test_input_required_result_multiple_inputs", "Asks for three inputs at once."),
    ("test_input_required_result_multi_round", "Asks in two rounds."),
    ("test_input_required_result_tampered_state", "Refuses a tampered request state."),
    ("test_input_required_result_capabilities", "Asks only for what the client declared."),
];

const PROMPT: &str = "test_input_required_result_prompt";

#[derive(Clone)]
struct Fixture {
    keys: Arc<SealKeys>,
    /// Request states already answered: each is used once.
    used: Arc<Mutex<HashSet<String>>>,
    /// The workers' listen-stream registry (`worker::listen::Streams`): a tool-list change
    /// wakes the streams as a NATS push wakes a worker's.
    streams: Arc<worker::listen::Streams>,
    /// Whether the diagnostic tool `test_dynamic_tool` is listed (toggled by
    /// `test_trigger_tool_change`): the tool list really changes.
    dynamic: Arc<std::sync::atomic::AtomicBool>,
}

/// The diagnostic tools of the suite's `server-stateless` scenario.
const DIAGNOSTIC_TOOLS: &[(&str, &str)] = &[
    ("test_trigger_tool_change", "Adds or removes test_dynamic_tool from the tool list."),
    ("test_missing_capability", "Needs the client's sampling capability."),
    ("test_streaming_elicitation", "Asks the user through an input_required result."),
    ("test_logging_tool", "Logs only at a level the request asked for."),
];

fn input(value: serde_json::Value) -> InputRequest {
    serde_json::from_value(value).expect("a valid input request")
}

fn elicit(message: &str, field: &str, kind: &str) -> InputRequest {
    input(json!({"method": "elicitation/create", "params": {"mode": "form", "message": message,
        "requestedSchema": {"type": "object", "properties": {field: {"type": kind}}, "required": [field]}}}))
}

fn sample(text: &str) -> InputRequest {
    input(json!({"method": "sampling/createMessage", "params": {
        "messages": [{"role": "user", "content": {"type": "text", "text": text}}], "maxTokens": 50}}))
}

fn roots() -> InputRequest {
    input(json!({"method": "roots/list", "params": {}}))
}

/// An accepted elicitation answer under `key`, with its content.
fn accepted<'a>(responses: Option<&'a InputResponses>, key: &str) -> Option<&'a Value> {
    let answer = responses?.get(key)?;
    (answer["action"] == "accept" && answer["content"].is_object()).then(|| &answer["content"])
}

fn answered(responses: Option<&InputResponses>, key: &str) -> bool {
    responses.and_then(|r| r.get(key)).is_some_and(Value::is_object)
}

fn text(t: impl Into<String>) -> CallToolResponse {
    CallToolResult::success(vec![ContentBlock::text(t.into())]).into()
}

impl Fixture {
    /// Seals the step a tool is at.
    fn seal(&self, tool: &str, step: u8) -> String {
        let nonce = SealKeys::generate("n");
        let state = json!({"tool": tool, "step": step, "nonce": nonce});
        self.keys.seal("conformance-fixture", state.to_string().as_bytes()).expect("sealing")
    }

    /// Opens a state this tool sealed, once: a tampered, foreign or reused one is an invalid
    /// request (-32602).
    fn open(&self, tool: &str, raw: &str) -> Result<u8, ErrorData> {
        let state: Value = self
            .keys
            .open("conformance-fixture", raw)
            .and_then(|p| serde_json::from_slice(&p).ok())
            .ok_or_else(|| {
                ErrorData::invalid_params("requestState integrity check failed", None)
            })?;
        if state["tool"] != tool {
            return Err(ErrorData::invalid_params("requestState belongs to another tool", None));
        }
        let nonce = state["nonce"].as_str().unwrap_or_default().to_owned();
        if !self.used.lock().unwrap_or_else(|p| p.into_inner()).insert(nonce) {
            return Err(ErrorData::invalid_params("requestState was used already", None));
        }
        Ok(state["step"].as_u64().unwrap_or_default() as u8)
    }

    fn ask(&self, requests: Vec<(&str, InputRequest)>, state: Option<String>) -> CallToolResponse {
        let map: BTreeMap<String, InputRequest> =
            requests.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        InputRequiredResult::new(Some(map), state).into()
    }

    /// The multi round-trip tools; `None` for any other name.
    fn mrtr(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Option<Result<CallToolResponse, ErrorData>> {
        let name = request.name.as_ref();
        let responses = request.input_responses.as_ref();
        let state = request.request_state.as_deref();
        let name_question = || elicit("What is your name?", "name", "string");
        Some(Ok(match name {
            "test_input_required_result_elicitation" => match accepted(responses, "user_name") {
                Some(content) => {
                    text(format!("Hello, {}!", content["name"].as_str().unwrap_or("there")))
                }
                None => self.ask(vec![("user_name", name_question())], None),
            },
            "test_input_required_result_sampling" => {
                if answered(responses, "sample_request") {
                    text("The model answered.")
                } else {
                    self.ask(
                        vec![("sample_request", sample("What is the capital of France?"))],
                        None,
                    )
                }
            }
            "test_input_required_result_list_roots" => {
                let found = responses
                    .and_then(|r| r.get("roots_request"))
                    .and_then(|r| r["roots"].as_array());
                match found {
                    Some(list) => text(format!("Found {} root(s)", list.len())),
                    None => self.ask(vec![("roots_request", roots())], None),
                }
            }
            "test_input_required_result_request_state"
            | "test_input_required_result_tampered_state" => match state {
                Some(raw) => {
                    if let Err(e) = self.open(name, raw) {
                        return Some(Err(e));
                    }
                    match accepted(responses, "confirm") {
                        Some(_) => text("state-ok: requestState validated"),
                        None => self.ask(
                            vec![("confirm", elicit("Please confirm", "ok", "boolean"))],
                            Some(self.seal(name, 1)),
                        ),
                    }
                }
                None => self.ask(
                    vec![("confirm", elicit("Please confirm", "ok", "boolean"))],
                    Some(self.seal(name, 1)),
                ),
            },
            "test_input_required_result_multiple_inputs" => {
                let all = ["user_name", "greeting", "client_roots"]
                    .iter()
                    .all(|k| answered(responses, k));
                match state {
                    Some(raw) if all => {
                        if let Err(e) = self.open(name, raw) {
                            return Some(Err(e));
                        }
                        text("All three inputs received.")
                    }
                    _ => self.ask(
                        vec![
                            ("user_name", name_question()),
                            ("greeting", sample("Generate a greeting")),
                            ("client_roots", roots()),
                        ],
                        Some(self.seal(name, 1)),
                    ),
                }
            }
            "test_input_required_result_multi_round" => {
                let step = match state {
                    Some(raw) => match self.open(name, raw) {
                        Ok(step) => step,
                        Err(e) => return Some(Err(e)),
                    },
                    None => 0,
                };
                match (step, accepted(responses, "step1"), accepted(responses, "step2")) {
                    (1, Some(_), _) => self.ask(
                        vec![(
                            "step2",
                            elicit("Step 2: What is your favorite color?", "color", "string"),
                        )],
                        Some(self.seal(name, 2)),
                    ),
                    (2, _, Some(content)) => text(format!(
                        "Favorite color: {}",
                        content["color"].as_str().unwrap_or("?")
                    )),
                    _ => self.ask(
                        vec![("step1", elicit("Step 1: What is your name?", "name", "string"))],
                        Some(self.seal(name, 1)),
                    ),
                }
            }
            "test_input_required_result_capabilities" => {
                if responses.is_some_and(|r| !r.is_empty()) {
                    text("capabilities-ok")
                } else {
                    // Only what the client declared: never an elicitation it cannot show.
                    let caps = context.client_capabilities().unwrap_or_default();
                    let mut requests = Vec::new();
                    if caps.elicitation.is_some() {
                        requests
                            .push(("elicit_input", elicit("Anything to add?", "note", "string")));
                    }
                    if caps.sampling.is_some() {
                        requests.push(("sample_input", sample("Sample request")));
                    }
                    if caps.roots.is_some() {
                        requests.push(("roots_input", roots()));
                    }
                    self.ask(requests, Some(self.seal(name, 1)))
                }
            }
            _ => return None,
        }))
    }
}

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
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_prompts()
                .build(),
        )
    }

    fn accepted_subscription_filter(
        &self,
        requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        let mut accepted = rmcp::model::SubscriptionFilter::default();
        accepted.tools_list_changed = requested.tools_list_changed.filter(|on| *on);
        Some(accepted)
    }

    /// As a worker's stream: registered with the same registry, woken by a change, and told
    /// `toolsListChanged` when the list differs from the one it saw.
    async fn listen(
        &self,
        subscription: rmcp::service::SubscriptionContext,
    ) -> Result<(), ErrorData> {
        // Registered (bounded) whatever it asked for; told only if it asked for tools.
        let registered = self
            .streams
            .open("fixture", "fixture", 0)
            .map_err(|full| ErrorData::invalid_request(full.message(), None))?;
        if subscription.accepted().tools_list_changed != Some(true) {
            subscription.cancelled().await;
            return Ok(());
        }
        let mut seen = self.dynamic.load(std::sync::atomic::Ordering::Acquire);
        loop {
            tokio::select! {
                _ = subscription.cancelled() => return Ok(()),
                _ = registered.wake.notified() => {}
            }
            let now = self.dynamic.load(std::sync::atomic::Ordering::Acquire);
            if now == seen {
                continue;
            }
            seen = now;
            let changed = rmcp::model::ServerNotification::ToolListChangedNotification(
                rmcp::model::ToolListChangedNotification::default(),
            );
            if subscription.sink().send(changed).await.is_err() {
                return Ok(());
            }
        }
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
            TOOLS
                .iter()
                .chain(MRTR_TOOLS)
                .chain(DIAGNOSTIC_TOOLS)
                .chain(
                    self.dynamic
                        .load(std::sync::atomic::Ordering::Acquire)
                        .then_some(&("test_dynamic_tool", "Listed after a tool-list change.")),
                )
                .map(|(n, d)| Tool::new(*n, *d, schema.clone()))
                .collect(),
        ))
    }

    async fn list_prompts(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let prompt: Prompt = serde_json::from_value(
            json!({"name": PROMPT, "description": "A prompt that asks for context first."}),
        )
        .expect("a prompt");
        Ok(ListPromptsResult::with_all_items(vec![prompt]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        if request.name != PROMPT {
            return Err(ErrorData::invalid_params(
                format!("unknown prompt {}", request.name),
                None,
            ));
        }
        match accepted(request.input_responses.as_ref(), "user_context") {
            Some(content) => {
                let mut result: GetPromptResult = serde_json::from_value(json!({"messages": [{"role": "user",
                    "content": {"type": "text", "text": format!("Prompt with context: {}", content["context"].as_str().unwrap_or_default())}}]}))
                .expect("a prompt result");
                result.result_type = Some(ResultType::COMPLETE);
                Ok(result.into())
            }
            None => {
                let map = BTreeMap::from([(
                    "user_context".to_owned(),
                    elicit("What context should the prompt use?", "context", "string"),
                )]);
                Ok(InputRequiredResult::new(Some(map), None).into())
            }
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if let Some(outcome) = self.mrtr(&request, &context) {
            return outcome;
        }
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
            "test_trigger_tool_change" => {
                self.dynamic.fetch_xor(true, std::sync::atomic::Ordering::AcqRel);
                self.streams.poke_all();
                CallToolResult::success(vec![ContentBlock::text("The tool list changed.")])
            }
            "test_dynamic_tool" => CallToolResult::success(vec![ContentBlock::text("Here.")]),
            "test_missing_capability" => {
                let caps = context.client_capabilities().unwrap_or_default();
                if caps.sampling.is_none() {
                    let mut required = rmcp::model::ClientCapabilities::default();
                    required.sampling = Some(Default::default());
                    return Err(ErrorData::missing_required_client_capability(required));
                }
                CallToolResult::success(vec![ContentBlock::text("sampling is declared")])
            }
            "test_streaming_elicitation" => {
                // Asked through an input_required result on the request's own stream, never
                // as an independent request.
                return Ok(self.ask(
                    vec![("name_input", elicit("What is your name?", "name", "string"))],
                    None,
                ));
            }
            // The request set no log level: nothing is logged, only the result is sent.
            "test_logging_tool" => CallToolResult::success(vec![ContentBlock::text("done")]),
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
    let fixture = Fixture {
        keys: Arc::new(SealKeys::parse(&SealKeys::generate("fx")).map_err(anyhow::Error::msg)?),
        used: Arc::default(),
        streams: Arc::new(worker::listen::Streams::default()),
        dynamic: Arc::default(),
    };
    let service = StreamableHttpService::new(
        move || Ok(fixture.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    axum::serve(tokio::net::TcpListener::bind(&listen).await?, router).await?;
    Ok(())
}
