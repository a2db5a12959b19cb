//! How the benchmark judges one answer. A call counts as a success only when it is what a
//! user wanted: HTTP 200, a JSON-RPC result, `isError` false, and for writes `replayed` false.
//! The answer is parsed, never byte-matched: a note that happens to contain `"isError":true`
//! is still a success, and a pretty-printed or streamed error is still an error.

use serde_json::Value;

/// A policy set of `n` policies like a security team's (tools, arguments, records, local
/// time, batch sizes), none of which matches the benchmark's calls, so the figures measure
/// evaluation, not refusals. Policies go to the ten tools in turn, and each round of ten takes
/// the next kind of condition, so with 50 policies or more every tool is judged by every kind
/// (the principal, the context, the clock and the records), never by one kind alone.
pub fn policy_set(n: usize) -> String {
    let tools = [
        "send_customer_message",
        "cancel_bookings",
        "delete_booking",
        "page_technician",
        "reschedule_booking",
        "get_customer",
        "find_bookings",
        "get_booking",
        "add_booking_note",
        "mute_alerts",
    ];
    (0..n)
        .map(|i| {
            let tool = tools[i % tools.len()];
            let when = match (i / tools.len()) % 5 {
                0 => format!("context.now.hour == 25 && context.effects > {i}"),
                // Over a century ago: no booking of the benchmark's data is that old.
                1 => format!("resource is Booking && resource has hours_until_start && resource.hours_until_start < -{}", 1_000_000 + i),
                2 => format!("principal.client == \"blocked-client-{i}\""),
                3 => format!("context.effects > {}", 100_000 + i),
                _ => format!("context.now.weekday == \"Someday{i}\""),
            };
            let approval = if i % 7 == 0 { "@approval\n" } else { "" };
            format!(
                "@id(\"bench-{i}\")\n{approval}@reason(\"benchmark rule {i}\")\nforbid (principal, action == Action::\"{tool}\", resource) when {{ {when} }};\n"
            )
        })
        .collect()
}

/// The page `current` with its section titled `title` (`## …`) replaced by `section`, or
/// `section` appended when it has none.
pub fn replace_section(current: &str, title: &str, section: &str) -> String {
    let heading = format!("## {title}\n");
    match current.find(&heading) {
        Some(start) => {
            let end = current[start + 3..]
                .find("\n## ")
                .map(|e| start + 3 + e + 1)
                .unwrap_or(current.len());
            // A blank line before the next section, as Markdown is written.
            let gap = if end < current.len() { "\n\n" } else { "\n" };
            format!("{}{}{gap}{}", &current[..start], section.trim_end(), &current[end..])
        }
        None => format!("{}\n\n{}\n", current.trim_end(), section.trim_end()),
    }
}

/// The report followed by the sections of the page it replaces (`old`) that it does not
/// write itself (the listen streams' section, measurements written by hand): a run
/// replaces its own figures and keeps the rest, in their order.
pub fn with_kept_sections(report: &str, old: &str) -> String {
    let written: Vec<&str> = report.lines().filter(|l| l.starts_with("## ")).collect();
    let mut kept = String::new();
    let mut keeping = false;
    for line in old.lines() {
        if line.starts_with("## ") {
            keeping = !written.contains(&line);
        }
        if keeping {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    if kept.is_empty() { report.to_owned() } else { format!("{}\n\n{kept}", report.trim_end()) }
}

/// What the read ratios say against the 95 % target: the gated rate against the bare rmcp
/// peer with sqlx's defaults (`bare`) and against the same peer without its ping before
/// each statement (`tuned`). A rate of zero (a scenario that served nothing) meets nothing.
pub fn read_verdict(gated: f64, bare: f64, tuned: f64) -> String {
    let meets = |peer: f64| gated > 0.0 && peer > 0.0 && gated >= 0.95 * peer;
    let pct = |peer: f64| if peer > 0.0 { 100.0 * gated / peer } else { 0.0 };
    match (meets(bare), meets(tuned)) {
        (true, true) => {
            "In this run the gated read meets the 95 % target against both peers.".into()
        }
        (true, false) => format!(
            "In this run the gated read meets the 95 % target against the bare rmcp peer as sqlx \
             runs it by default ({:.0} %), not against the same peer without its ping ({:.0} %).",
            pct(bare),
            pct(tuned)
        ),
        (false, true) => format!(
            "In this run the gated read meets the 95 % target only against the peer without its \
             ping ({:.0} %; {:.0} % of the peer with sqlx's defaults).",
            pct(tuned),
            pct(bare)
        ),
        (false, false) => format!(
            "In this run the gated read misses the 95 % target ({:.0} % and {:.0} % of the two peers).",
            pct(bare),
            pct(tuned)
        ),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    Ok,
    /// Any status but 200 (429, 503, 401…).
    Http(u16),
    /// A body that is not the JSON (or SSE-framed JSON) answer expected.
    Unreadable,
    /// A JSON-RPC error (unknown tool, bad params).
    Rpc(i64),
    /// A tool execution error, by its code (`rate_limited`, `conflict`…).
    Tool(String),
    /// A silent write answered from the replay cache: nothing was executed.
    Replayed,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Ok => write!(f, "ok"),
            Outcome::Http(s) => write!(f, "HTTP {s}"),
            Outcome::Unreadable => write!(f, "unreadable"),
            Outcome::Rpc(c) => write!(f, "JSON-RPC {c}"),
            Outcome::Tool(c) => write!(f, "{c}"),
            Outcome::Replayed => write!(f, "replayed"),
        }
    }
}

/// The parts of a JSON-RPC answer the judge looks at. The whole body is still parsed (a
/// body that is not JSON, or whose `result` is not an object, does not deserialize); the
/// rest of the answer is skipped without building a tree of it, so the load generator's
/// own cost does not grow with the size of the answer it checks.
#[derive(serde::Deserialize)]
struct Answer {
    result: Option<AnswerResult>,
    error: Option<RpcError>,
}

#[derive(serde::Deserialize)]
struct RpcError {
    code: Option<i64>,
}

#[derive(serde::Deserialize)]
struct AnswerResult {
    #[serde(rename = "isError")]
    is_error: Option<bool>,
    #[serde(rename = "structuredContent")]
    structured: Option<Structured>,
}

/// A result's structured content: only the error and the replay flag are read, each kept
/// as a `Value` so a result whose own fields happen to carry these names still parses.
#[derive(serde::Deserialize)]
struct Structured {
    error: Option<Value>,
    replayed: Option<Value>,
}

/// The JSON-RPC response in a body: plain JSON, or the last SSE `data:` event carrying one.
fn response(body: &[u8]) -> Option<Answer> {
    if let Ok(v) = serde_json::from_slice::<Answer>(body) {
        return Some(v);
    }
    let text = std::str::from_utf8(body).ok()?;
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Answer>(d.trim()).ok())
        .rfind(|v| v.result.is_some() || v.error.is_some())
}

/// Judges an MCP `tools/call` answer.
pub fn judge_mcp(status: u16, body: &[u8], write: bool) -> Outcome {
    if status != 200 {
        return Outcome::Http(status);
    }
    let Some(answer) = response(body) else { return Outcome::Unreadable };
    if let Some(e) = answer.error {
        return Outcome::Rpc(e.code.unwrap_or_default());
    }
    let Some(result) = answer.result else {
        return Outcome::Unreadable;
    };
    let structured = result.structured;
    if result.is_error == Some(true) {
        let code = structured
            .as_ref()
            .and_then(|s| s.error.as_ref())
            .and_then(|e| e["code"].as_str())
            .unwrap_or("tool_error")
            .to_owned();
        return Outcome::Tool(code);
    }
    if write && structured.and_then(|s| s.replayed) == Some(Value::Bool(true)) {
        return Outcome::Replayed;
    }
    Outcome::Ok
}

/// Judges a plain JSON answer (the axum + sqlx peer): 200 with a JSON object that is not
/// an error.
pub fn judge_plain(status: u16, body: &[u8]) -> Outcome {
    if status != 200 {
        return Outcome::Http(status);
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(v) if v.get("error").is_some() => Outcome::Tool("error".into()),
        Ok(v) if v.is_object() => Outcome::Ok,
        _ => Outcome::Unreadable,
    }
}

/// What a listen stream's reader sees in the bytes of its response: the frames the benchmark
/// times, found by their method names however the bytes are split into reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenFrame {
    Ack,
    Changed,
    Error,
}

/// Finds [`ListenFrame`]s in a response read in pieces (headers, chunk sizes and all), without
/// decoding it: each frame's name is counted once, also when a read ends inside it. The reader
/// of the listen benchmark, kept small so the load generator's own work per event does not
/// weigh on the cores it shares with the worker it measures.
#[derive(Debug, Default)]
pub struct ListenScanner {
    /// The end of the bytes seen so far, shorter than any name, so a name split across two
    /// reads is found in the second.
    carry: Vec<u8>,
}

impl ListenScanner {
    const NAMES: [(&'static [u8], ListenFrame); 3] = [
        (b"notifications/subscriptions/acknowledged", ListenFrame::Ack),
        (b"notifications/tools/list_changed", ListenFrame::Changed),
        (b"\"error\"", ListenFrame::Error),
    ];

    /// The frames that `bytes`, the next read, completes, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<ListenFrame> {
        let mut seen = std::mem::take(&mut self.carry);
        let carried = seen.len();
        seen.extend_from_slice(bytes);
        let mut found: Vec<(usize, ListenFrame)> = Vec::new();
        for (name, frame) in Self::NAMES {
            let mut at = 0;
            while let Some(i) = seen[at..].windows(name.len()).position(|w| w == name) {
                // A name that ends inside the carried bytes was counted with the last read.
                if at + i + name.len() > carried {
                    found.push((at + i, frame));
                }
                at += i + name.len();
            }
        }
        found.sort_by_key(|(i, _)| *i);
        let longest = Self::NAMES.iter().map(|(n, _)| n.len()).max().unwrap_or(1);
        let keep = seen.len().min(longest - 1);
        self.carry = seen[seen.len() - keep..].to_vec();
        found.into_iter().map(|(_, f)| f).collect()
    }
}
