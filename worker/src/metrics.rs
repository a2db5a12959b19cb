//! Prometheus metrics of a worker: requests, tool calls by tool, class and outcome, and
//! latency histograms. Labels are tool names and outcomes only, never arguments (R14).

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub http_requests: IntCounterVec,
    pub tool_calls: IntCounterVec,
    pub tool_duration: HistogramVec,
    pub auth_duration: HistogramVec,
    pub nats_connected: IntGauge,
    pub bus_events: IntCounterVec,
    pub bus_push_lag: HistogramVec,
    pub refusals: IntCounterVec,
    pub confirm_duration: HistogramVec,
    pub activity_flush_failures: prometheus::IntCounter,
    pub read_ahead: IntCounterVec,
    /// Open `subscriptions/listen` streams.
    pub listen_streams: IntGauge,
    /// What listen streams did: `opened`, `refused`, `changed` (toolsListChanged sent),
    /// `unchanged` (woken, same list), `ended` (the credential stopped working).
    pub listen_events: IntCounterVec,
    /// Contexts re-read for woken listen streams (one per credential and push).
    pub listen_rereads: prometheus::IntCounter,
    /// Executions of each hot-path statement on the pipe's open connections, by plan
    /// (`generic`, `custom`), read from `pg_prepared_statements` when metrics are scraped.
    pub pipe_plans: prometheus::IntGaugeVec,
}

/// The refusal family an outcome belongs to (the `reason` of `refusals_total`), or `None`
/// for a call that was not refused (done, or failed on its own input or data).
pub fn refusal_reason(outcome: &str) -> Option<&'static str> {
    Some(match outcome {
        "permission_denied" | "not_in_toolset" | "insufficient_scope" => "rights",
        // Anyone on the internet can send a bad token: counted apart from a known
        // connection's missing rights, so it neither hides nor fakes a rights spike.
        "unauthenticated" => "unauthenticated",
        "kill_switch" | "agent_access_off" | "turned_off_by_policy" => "switch",
        "forbidden_by_policy" => "policy",
        "rate_limited" => "rate_bucket",
        "overloaded" => "overload",
        // A browser page of another site: counted apart, it says nothing about a connection.
        "origin" => "origin",
        "token_used" | "unknown_token" | "foreign_token" | "token_expired" | "replayed" => "replay",
        "conflict"
        | "duplicate"
        | "wrong_state"
        | "count_mismatch"
        | "changed_since_preview"
        | "summary_mismatch" => "conflict",
        _ => return None,
    })
}

const BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

impl Metrics {
    pub fn new() -> Self {
        let registry =
            Registry::new_custom(Some("gatehouse_worker".into()), None).expect("valid prefix");
        let http_requests = IntCounterVec::new(
            Opts::new("mcp_http_requests_total", "HTTP requests to /mcp by status"),
            &["status"],
        )
        .expect("valid metric");
        let tool_calls = IntCounterVec::new(
            Opts::new("tool_calls_total", "Tool calls by tool, effect class and outcome"),
            &["tool", "class", "outcome"],
        )
        .expect("valid metric");
        let tool_duration = HistogramVec::new(
            HistogramOpts::new("tool_call_duration_seconds", "Tool call latency inside the worker")
                .buckets(BUCKETS.to_vec()),
            &["tool", "class"],
        )
        .expect("valid metric");
        let auth_duration = HistogramVec::new(
            HistogramOpts::new("auth_duration_seconds", "Time to resolve the connection context")
                .buckets(BUCKETS.to_vec()),
            &["outcome"],
        )
        .expect("valid metric");
        let nats_connected = IntGauge::new("nats_connected", "1 while the NATS watch is live")
            .expect("valid metric");
        let bus_events = IntCounterVec::new(
            Opts::new("bus_events_total", "Switch and revocation events applied from NATS"),
            &["kind"],
        )
        .expect("valid metric");
        let bus_push_lag = HistogramVec::new(
            HistogramOpts::new(
                "bus_push_lag_seconds",
                "From NATS storing a switch or revocation to this worker applying it",
            )
            .buckets(BUCKETS.to_vec()),
            &["kind"],
        )
        .expect("valid metric");
        let refusals = IntCounterVec::new(
            Opts::new(
                "refusals_total",
                "Requests and tool calls refused, by reason (rights, switch, rate_bucket, replay, conflict, unauthenticated, overload)",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let confirm_duration = HistogramVec::new(
            HistogramOpts::new(
                "confirm_duration_seconds",
                "Time to complete a two-step action (confirm_action or a multi round-trip answer)",
            )
            .buckets(BUCKETS.to_vec()),
            &["path", "outcome"],
        )
        .expect("valid metric");
        let activity_flush_failures = prometheus::IntCounter::new(
            "activity_flush_failures_total",
            "Failed writes of the console's call counts (retried with the next batch)",
        )
        .expect("valid metric");
        let read_ahead = IntCounterVec::new(
            Opts::new(
                "read_ahead_total",
                "Tool reads done in the statement that read the call's context (one round trip), by whether the tool used them (used) or refused the call first (unused)",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let listen_streams = IntGauge::new("listen_streams", "Open subscriptions/listen streams")
            .expect("valid metric");
        let listen_events = IntCounterVec::new(
            Opts::new(
                "listen_events_total",
                "Listen streams opened, refused past a bound, told of a changed tool list, woken with the list unchanged, or ended because their credential stopped working",
            ),
            &["event"],
        )
        .expect("valid metric");
        let pipe_plans = prometheus::IntGaugeVec::new(
            Opts::new(
                "pipe_plan_executions",
                "Executions of each hot-path statement on the pipe's open connections, by plan (generic or custom); any custom one means the plan is not pinned",
            ),
            &["statement", "plan"],
        )
        .expect("valid metric");
        registry.register(Box::new(pipe_plans.clone())).expect("register once");
        let listen_rereads = prometheus::IntCounter::new(
            "listen_rereads_total",
            "Connection contexts re-read for woken listen streams: one per credential and push, shared by its streams",
        )
        .expect("valid metric");
        registry.register(Box::new(listen_rereads.clone())).expect("register once");
        registry.register(Box::new(listen_streams.clone())).expect("register once");
        registry.register(Box::new(nats_connected.clone())).expect("register once");
        registry.register(Box::new(activity_flush_failures.clone())).expect("register once");
        for c in [&http_requests, &tool_calls, &bus_events, &refusals, &read_ahead, &listen_events]
        {
            registry.register(Box::new(c.clone())).expect("register once");
        }
        for h in [&tool_duration, &auth_duration, &bus_push_lag, &confirm_duration] {
            registry.register(Box::new(h.clone())).expect("register once");
        }
        Metrics {
            registry,
            http_requests,
            tool_calls,
            tool_duration,
            auth_duration,
            nats_connected,
            bus_events,
            bus_push_lag,
            refusals,
            confirm_duration,
            activity_flush_failures,
            read_ahead,
            listen_streams,
            listen_events,
            pipe_plans,
            listen_rereads,
        }
    }

    pub fn render(&self) -> String {
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
