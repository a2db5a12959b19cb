//! OpenTelemetry traces, exported over OTLP/HTTP (protobuf) to the tracing system an operator
//! already runs.
//!
//! Configured by the standard environment variables only: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, the sampler's `OTEL_TRACES_SAMPLER*` and the
//! batch processor's `OTEL_BSP_*`. Without an endpoint (or with `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none`) tracing is off and every function here returns at once.
//!
//! Spans leave through the SDK's batch processor, on its own thread with a bounded queue: a
//! request never waits for the exporter, and a collector that is down costs dropped spans,
//! not latency.
//!
//! What a span may carry is closed by [`Attr`]: names the code defines (methods, tools,
//! effect classes, outcome codes), public handles of the tenant and the connection, and
//! numbers. There is no variant for free text, so no argument value, personal data or
//! secret can reach a span (R14, R23), whatever a caller sends.

use std::collections::HashMap;
use std::future::Future;
use std::sync::OnceLock;
use std::time::SystemTime;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    FutureExt as _, Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};

use crate::effect::EffectClass;
use crate::error::Error;
use crate::handle::{ConnectionHandle, TenantHandle};

static TRACER: OnceLock<Tracer> = OnceLock::new();

/// Whether spans are recorded at all; false until [`init`] found an endpoint.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// The exporter of a running binary; flush it with [`Telemetry::shutdown`] before exiting.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends what is still queued and stops the exporter (blocking; call off the runtime).
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            tracing::warn!(error = %e, "trace exporter shutdown");
        }
    }
}

/// What the environment asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    Off(&'static str),
    Export,
}

/// Reads the standard variables: off without an endpoint or when disabled; an error for a
/// protocol this build does not speak, so a misconfiguration is seen at start, not as
/// silently missing traces.
pub fn plan(var: impl Fn(&str) -> Option<String>) -> Result<Plan, String> {
    let set = |name: &str| var(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(Plan::Off("OTEL_SDK_DISABLED=true"));
    }
    if let Some(exporter) = set("OTEL_TRACES_EXPORTER") {
        match exporter.as_str() {
            "none" => return Ok(Plan::Off("OTEL_TRACES_EXPORTER=none")),
            "otlp" => {}
            other => {
                return Err(format!(
                    "OTEL_TRACES_EXPORTER={other} is not supported: Gatehouse exports traces with otlp (or none)"
                ));
            }
        }
    }
    let endpoint = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .map(|e| ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", e))
        .or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT").map(|e| ("OTEL_EXPORTER_OTLP_ENDPOINT", e)));
    let Some((name, endpoint)) = endpoint else {
        return Ok(Plan::Off("no OTEL_EXPORTER_OTLP_ENDPOINT"));
    };
    // The exporter's client carries no TLS stack of its own: traces go to a collector beside
    // the service (a sidecar or an in-cluster collector), which forwards them over TLS.
    if !endpoint.to_ascii_lowercase().starts_with("http://") {
        return Err(format!(
            "{name}={endpoint} is not supported: Gatehouse sends traces over plain http to a \
             collector beside it (e.g. http://otel-collector:4318), which forwards them onward"
        ));
    }
    for name in ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"] {
        if let Some(protocol) = set(name) {
            if protocol != "http/protobuf" {
                return Err(format!(
                    "{name}={protocol} is not supported: Gatehouse exports OTLP over http/protobuf; \
                     set http/protobuf and point the endpoint at the collector's HTTP port (usually 4318)"
                ));
            }
            break;
        }
    }
    Ok(Plan::Export)
}

/// Starts the exporter when the environment names an endpoint. `service` is the default
/// `service.name` (`OTEL_SERVICE_NAME` wins). Builds its blocking HTTP client on a thread of
/// its own, so it may be called from inside the async runtime.
pub fn init(service: &'static str) -> Result<Telemetry, String> {
    match plan(|name| std::env::var(name).ok())? {
        Plan::Off(why) => {
            tracing::debug!(reason = why, "trace export off");
            return Ok(Telemetry { provider: None });
        }
        Plan::Export => {}
    }
    let provider = std::thread::spawn(move || -> Result<SdkTracerProvider, String> {
        use opentelemetry_otlp::{Protocol, WithExportConfig as _};
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build()
            .map_err(|e| format!("the OTLP trace exporter: {e}"))?;
        let mut resource = opentelemetry_sdk::Resource::builder();
        if std::env::var("OTEL_SERVICE_NAME").map_or(true, |v| v.trim().is_empty()) {
            resource = resource.with_service_name(service);
        }
        let resource = resource
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build())
    })
    .join()
    .map_err(|_| "the OTLP trace exporter failed to start".to_owned())??;
    use opentelemetry::trace::TracerProvider as _;
    let tracer = provider.tracer_with_scope(
        opentelemetry::InstrumentationScope::builder("gatehouse")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    );
    // A second init in one process (tests) keeps the first tracer.
    let _ = TRACER.set(tracer);
    tracing::info!(service, "exporting traces over OTLP/HTTP");
    Ok(Telemetry { provider: Some(provider) })
}

/// One attribute a span may carry. Closed on purpose: see the module documentation.
#[derive(Debug, Clone, Copy)]
pub enum Attr<'a> {
    /// `mcp.method.name`: one of [`MCP_METHODS`].
    Method(&'static str),
    /// `gen_ai.tool.name`: a tool of the registry.
    Tool(&'static str),
    /// `gen_ai.operation.name`.
    Operation(&'static str),
    /// `mcp.protocol.version`: one the server speaks.
    ProtocolVersion(&'static str),
    /// `jsonrpc.request.id` of a numeric id.
    RequestNumber(i64),
    /// `jsonrpc.request.id` of a string id: a client writes it, so the span carries its
    /// SHA-256 (`sha256:` and 16 hex digits), which a client can compute to find its call
    /// but which shows no text.
    RequestText(&'a str),
    /// `gatehouse.tenant`: the tenant's public handle.
    Tenant(&'a TenantHandle),
    /// `gatehouse.connection`: the connection's public handle.
    Connection(&'a ConnectionHandle),
    /// `gatehouse.effect_class`.
    Class(EffectClass),
    /// `gatehouse.outcome`: `ok` or an error code of [`Error::code`].
    Outcome(&'static str),
    /// `error.type`: a JSON-RPC error code, or `tool_error`.
    ErrorType(&'static str),
    /// `error.type` of a JSON-RPC error code.
    ErrorCode(i32),
    /// `gatehouse.outbox.channel` of a delivery (`email` or `page`).
    OutboxChannel(&'static str),
    /// `gatehouse.outbox.attempt`.
    Attempt(i64),
    /// `db.system.name`.
    DbSystem(&'static str),
    /// `network.protocol.name`.
    NetworkProtocol(&'static str),
    /// `http.response.status_code`.
    HttpStatus(u16),
}

/// The methods of MCP a span may name; anything else is `other`.
pub const MCP_METHODS: &[&str] = &[
    "initialize",
    "server/discover",
    "ping",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "completion/complete",
    "logging/setLevel",
    "subscriptions/listen",
];

/// The method name as a span may carry it.
pub fn method_name(method: &str) -> &'static str {
    MCP_METHODS.iter().copied().find(|m| *m == method).unwrap_or("other")
}

impl Attr<'_> {
    fn key_value(self) -> Option<KeyValue> {
        Some(match self {
            Attr::Method(m) => KeyValue::new("mcp.method.name", m),
            Attr::Tool(t) => KeyValue::new("gen_ai.tool.name", t),
            Attr::Operation(o) => KeyValue::new("gen_ai.operation.name", o),
            Attr::ProtocolVersion(v) => KeyValue::new("mcp.protocol.version", v),
            Attr::RequestNumber(n) => KeyValue::new("jsonrpc.request.id", n.to_string()),
            Attr::RequestText(t) => {
                use sha2::Digest as _;
                let digest = sha2::Sha256::digest(t.as_bytes());
                KeyValue::new("jsonrpc.request.id", format!("sha256:{}", hex::encode(&digest[..8])))
            }
            Attr::Tenant(h) => KeyValue::new("gatehouse.tenant", h.as_str().to_owned()),
            Attr::Connection(h) => KeyValue::new("gatehouse.connection", h.as_str().to_owned()),
            Attr::Class(c) => KeyValue::new("gatehouse.effect_class", c.as_str()),
            Attr::Outcome(o) => KeyValue::new("gatehouse.outcome", o),
            Attr::ErrorType(e) => KeyValue::new("error.type", e),
            Attr::ErrorCode(c) => KeyValue::new("error.type", c.to_string()),
            Attr::OutboxChannel(c) => KeyValue::new("gatehouse.outbox.channel", c),
            Attr::Attempt(n) => KeyValue::new("gatehouse.outbox.attempt", n),
            Attr::DbSystem(s) => KeyValue::new("db.system.name", s),
            Attr::NetworkProtocol(p) => KeyValue::new("network.protocol.name", p),
            Attr::HttpStatus(code) => KeyValue::new("http.response.status_code", i64::from(code)),
        })
    }
}

fn key_values(attrs: &[Attr<'_>]) -> Vec<KeyValue> {
    attrs.iter().filter_map(|a| a.key_value()).collect()
}

/// A span's name: the fixed names of the code, or `{method} {tool}` of a registered tool.
#[derive(Debug, Clone, Copy)]
pub enum Name {
    Static(&'static str),
    MethodTarget(&'static str, &'static str),
}

impl Name {
    fn text(self) -> std::borrow::Cow<'static, str> {
        match self {
            Name::Static(s) => s.into(),
            Name::MethodTarget(m, t) => format!("{m} {t}").into(),
        }
    }
}

/// Where a trace comes from: a W3C `traceparent`/`tracestate` pair, read from the request's
/// `_meta` (MCP 2026-07-28) first and from its HTTP headers otherwise.
///
/// Only the trace and parent ids and the sampled flag are kept: `tracestate` is free text a
/// client writes, which would otherwise be copied onto every span of the request.
pub fn remote_parent(
    meta: Option<&serde_json::Map<String, serde_json::Value>>,
    headers: Option<&http::HeaderMap>,
) -> Context {
    let propagator = TraceContextPropagator::new();
    let mut cx = Context::new();
    if let Some(meta) = meta
        && meta.get("traceparent").is_some_and(|v| v.is_string())
    {
        cx = propagator.extract(&MetaCarrier(meta));
    }
    if !cx.span().span_context().is_valid()
        && let Some(headers) = headers
    {
        cx = propagator.extract(&HeaderCarrier(headers));
    }
    let sent = cx.span().span_context().clone();
    if !sent.is_valid() {
        return Context::new();
    }
    let ids_only = opentelemetry::trace::SpanContext::new(
        sent.trace_id(),
        sent.span_id(),
        sent.trace_flags(),
        true,
        opentelemetry::trace::TraceState::NONE,
    );
    Context::new().with_remote_span_context(ids_only)
}

struct MetaCarrier<'a>(&'a serde_json::Map<String, serde_json::Value>);

impl Extractor for MetaCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.as_str())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

struct HeaderCarrier<'a>(&'a http::HeaderMap);

impl Extractor for HeaderCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The current trace as a `traceparent` (and `tracestate`) to store with work done later (an
/// outbox message), or `None` when tracing is off or no trace is current.
pub fn current_traceparent() -> Option<String> {
    if !enabled() {
        return None;
    }
    let cx = Context::current();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// A parent context from a stored `traceparent`.
pub fn stored_parent(traceparent: Option<&str>) -> Context {
    let mut carrier = HashMap::new();
    if let Some(tp) = traceparent {
        carrier.insert("traceparent".to_owned(), tp.to_owned());
    }
    TraceContextPropagator::new().extract(&carrier)
}

/// The span of the request being served, carried in its extensions to the MCP layer (which
/// may run the handler on another task, where the ambient context does not follow).
#[derive(Clone)]
pub struct RequestTrace(pub Context);

impl RequestTrace {
    /// Adds attributes to the request's span.
    pub fn set(&self, attrs: &[Attr<'_>]) {
        self.0.span().set_attributes(key_values(attrs));
    }

    /// Marks the request's span failed, with attributes saying how.
    pub fn fail(&self, attrs: &[Attr<'_>]) {
        self.0.span().set_attributes(key_values(attrs));
        self.0.span().set_status(Status::error(""));
    }

    /// Runs `work` inside the request's span, so the spans it starts are its children.
    pub async fn run<F: Future>(&self, work: F) -> F::Output {
        work.with_context(self.0.clone()).await
    }
}

/// A span in flight. Ends when dropped; does nothing when tracing is off.
pub struct Active {
    cx: Option<Context>,
}

impl Active {
    /// The context to run the span's work in, so child spans attach to it.
    pub fn context(&self) -> Context {
        self.cx.clone().unwrap_or_else(Context::current)
    }

    /// Adds attributes.
    pub fn set(&self, attrs: &[Attr<'_>]) {
        if let Some(cx) = &self.cx {
            cx.span().set_attributes(key_values(attrs));
        }
    }

    /// Marks the span failed with `error.type` (and `gatehouse.outcome` when given).
    pub fn fail(&self, attrs: &[Attr<'_>]) {
        if let Some(cx) = &self.cx {
            cx.span().set_attributes(key_values(attrs));
            cx.span().set_status(Status::error(""));
        }
    }

    /// Records a child that already happened (the connection context looked up before the
    /// request reached the MCP layer).
    pub fn child_done(
        &self,
        name: Name,
        started: SystemTime,
        ended: SystemTime,
        attrs: &[Attr<'_>],
    ) {
        let (Some(cx), Some(tracer)) = (&self.cx, TRACER.get()) else { return };
        let mut span = tracer
            .span_builder(name.text())
            .with_kind(SpanKind::Internal)
            .with_start_time(started)
            .with_attributes(key_values(attrs))
            .start_with_context(tracer, cx);
        span.end_with_timestamp(ended);
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        if let Some(cx) = &self.cx {
            cx.span().end();
        }
    }
}

/// Starts the server span of one request under `parent`, backdated to when the request
/// arrived.
pub fn server(name: Name, parent: &Context, started: SystemTime, attrs: &[Attr<'_>]) -> Active {
    let Some(tracer) = TRACER.get() else { return Active { cx: None } };
    let span = tracer
        .span_builder(name.text())
        .with_kind(SpanKind::Server)
        .with_start_time(started)
        .with_attributes(key_values(attrs))
        .start_with_context(tracer, parent);
    Active { cx: Some(parent.with_span(span)) }
}

/// Starts a span under the current context (or `parent` when given).
pub fn start(name: Name, kind: SpanKind, parent: Option<&Context>, attrs: &[Attr<'_>]) -> Active {
    let Some(tracer) = TRACER.get() else { return Active { cx: None } };
    let parent = parent.cloned().unwrap_or_else(Context::current);
    let span = tracer
        .span_builder(name.text())
        .with_kind(kind)
        .with_attributes(key_values(attrs))
        .start_with_context(tracer, &parent);
    Active { cx: Some(parent.with_span(span)) }
}

/// Runs `work` in a child span of the current one that records its outcome: `ok`, or the
/// error's code (never its message, which can quote input).
pub async fn child<T, F>(name: Name, attrs: &[Attr<'_>], work: F) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>>,
{
    if !enabled() {
        return work.await;
    }
    let span = start(name, SpanKind::Internal, None, attrs);
    let out = work.with_context(span.context()).await;
    match &out {
        Ok(_) => span.set(&[Attr::Outcome("ok")]),
        Err(e) => span.fail(&[Attr::Outcome(e.code()), Attr::ErrorType(e.code())]),
    }
    out
}

/// Runs `work` inside `span`'s context, so the spans it starts are children.
pub async fn within<F: Future>(span: &Active, work: F) -> F::Output {
    if span.cx.is_none() {
        return work.await;
    }
    work.with_context(span.context()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn export_is_off_without_an_endpoint_and_when_disabled() {
        assert_eq!(plan(env(&[])), Ok(Plan::Off("no OTEL_EXPORTER_OTLP_ENDPOINT")));
        assert_eq!(
            plan(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "  ")])),
            Ok(Plan::Off("no OTEL_EXPORTER_OTLP_ENDPOINT"))
        );
        let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")];
        assert_eq!(plan(env(&on)), Ok(Plan::Export));
        let traces_only = [("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/v1/traces")];
        assert_eq!(plan(env(&traces_only)), Ok(Plan::Export));
        let tls = [("OTEL_EXPORTER_OTLP_ENDPOINT", "https://vendor.example:443")];
        let err = plan(env(&tls)).expect_err("https refused at start");
        assert!(err.contains("collector"), "{err}");
        let disabled = [on[0], ("OTEL_SDK_DISABLED", "TRUE")];
        assert_eq!(plan(env(&disabled)), Ok(Plan::Off("OTEL_SDK_DISABLED=true")));
        let none = [on[0], ("OTEL_TRACES_EXPORTER", "none")];
        assert_eq!(plan(env(&none)), Ok(Plan::Off("OTEL_TRACES_EXPORTER=none")));
    }

    #[test]
    fn a_protocol_this_build_does_not_speak_is_an_error_that_says_what_to_set() {
        let grpc = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ];
        let err = plan(env(&grpc)).expect_err("grpc refused");
        assert!(err.contains("http/protobuf") && err.contains("4318"), "{err}");
        // The traces-specific variable wins over the general one.
        let specific = [grpc[0], grpc[1], ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")];
        assert_eq!(plan(env(&specific)), Ok(Plan::Export));
        let zipkin = [grpc[0], ("OTEL_TRACES_EXPORTER", "zipkin")];
        assert!(plan(env(&zipkin)).is_err());
    }

    #[test]
    fn string_request_ids_are_recorded_as_a_digest_never_as_text() {
        let recorded =
            |id: &str| Attr::RequestText(id).key_value().expect("recorded").value.to_string();
        let text = recorded("Ann.Smith-4915112345678");
        assert!(text.starts_with("sha256:") && text.len() == 7 + 16, "{text}");
        assert!(!text.contains("Ann") && !text.contains("4915"));
        assert_eq!(recorded("Ann.Smith-4915112345678"), text, "the same id, the same digest");
        assert_ne!(recorded("other"), text);
        assert_eq!(method_name("tools/call"), "tools/call");
        assert_eq!(method_name("tools/call secret"), "other");
    }

    #[test]
    fn a_traceparent_in_meta_wins_over_the_header_and_a_bad_one_falls_back() {
        let meta_tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let header_tp = "00-11111111111111111111111111111111-2222222222222222-01";
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", header_tp.parse().expect("header"));
        let meta: serde_json::Map<String, serde_json::Value> =
            serde_json::from_value(serde_json::json!({"traceparent": meta_tp})).expect("map");
        let cx = remote_parent(Some(&meta), Some(&headers));
        assert_eq!(
            cx.span().span_context().trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        let bad: serde_json::Map<String, serde_json::Value> =
            serde_json::from_value(serde_json::json!({"traceparent": "garbage"})).expect("map");
        let cx = remote_parent(Some(&bad), Some(&headers));
        assert_eq!(
            cx.span().span_context().trace_id().to_string(),
            "11111111111111111111111111111111"
        );
        let cx = remote_parent(None, None);
        assert!(!cx.span().span_context().is_valid());
        // A client's tracestate is free text: it never travels on.
        let mut with_state = http::HeaderMap::new();
        with_state.insert("traceparent", header_tp.parse().expect("header"));
        with_state.insert("tracestate", "vendor=ann@example.com".parse().expect("header"));
        let cx = remote_parent(None, Some(&with_state));
        assert!(cx.span().span_context().is_valid());
        assert_eq!(cx.span().span_context().trace_state().header(), "");
        let stored = stored_parent(Some(meta_tp));
        assert_eq!(stored.span().span_context().span_id().to_string(), "b7ad6b7169203331");
    }
}
