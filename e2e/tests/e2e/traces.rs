//! Traces: an agent's tool calls are traced under the client's trace, with no argument values
//! (R14).

use crate::support::*;

/// One 2026-07-28 tools/call with the trace context in `_meta` and/or in the HTTP headers.
async fn traced_call(
    base: &str,
    token: &str,
    id: Value,
    tool: &str,
    args: Value,
    meta_traceparent: Option<&str>,
    header_traceparent: Option<&str>,
) -> (u16, Value) {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    });
    if let Some(tp) = meta_traceparent {
        meta["traceparent"] = json!(tp);
        meta["tracestate"] = json!("vendor=DECOYSTATE");
    }
    let mut request = reqwest::Client::new()
        .post(format!("{base}/mcp"))
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", tool)
        .bearer_auth(token)
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                      "params": {"name": tool, "arguments": args, "_meta": meta}}));
    if let Some(tp) = header_traceparent {
        request = request.header("traceparent", tp);
    }
    let response = request.send().await.expect("an MCP request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The spans an OTLP receiver has written so far (complete lines only).
fn received_spans(dir: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("spans.jsonl")).unwrap_or_default();
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .filter_map(|l| serde_json::from_str(l.trim()).ok())
        .collect()
}

#[tokio::test]
async fn an_agents_tool_calls_are_traced_under_the_clients_trace_with_no_argument_values() {
    use tokio::io::AsyncBufReadExt as _;
    let dir = std::env::temp_dir().join(format!("gatehouse-otlp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("receiver dir");
    let script = e2e::repo_root().join("e2e/py/otlp_receiver.py");
    let mut receiver = tokio::process::Command::new(e2e::python())
        .arg("-u")
        .arg(&script)
        .arg("--out")
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the OTLP receiver (scripts/test installs opentelemetry-proto)");
    let mut lines = tokio::io::BufReader::new(receiver.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
        .await
        .expect("the receiver starts")
        .expect("its first line")
        .expect("a line");
    let port = first.trim().strip_prefix("listening on ").expect("listening on PORT").to_owned();

    let mut opts = Options::for_test("traces", 2);
    opts.env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), format!("http://127.0.0.1:{port}")),
        ("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()),
    ];
    let stack = Stack::start(opts).await.expect("stack");
    let token = stack.token(0, 0);
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let tp = |span: &str| format!("00-{client_trace}-{span}-01");
    // Decoys in every argument: none may reach a span.
    let (subject, body) = ("DECOY-subject-9f2c", "DECOY-body-41aa");
    let (status, found) = traced_call(
        &stack.lb_url,
        &token,
        json!(11),
        "find_customers",
        json!({"query": "Fischer"}),
        Some(&tp("00f067aa0ba90201")),
        None,
    )
    .await;
    assert_eq!(status, 200, "{found}");
    let customer = found["result"]["structuredContent"]["customers"][0]["customer"].clone();
    let (_, preview) = traced_call(
        &stack.lb_url,
        &token,
        json!(12),
        "send_customer_message",
        json!({"customer": customer, "subject": subject, "body": body}),
        Some(&tp("00f067aa0ba90202")),
        None,
    )
    .await;
    let p = preview["result"]["structuredContent"].clone();
    let (_, done) = traced_call(
        &stack.lb_url,
        &token,
        json!(13),
        "confirm_action",
        json!({"confirm_token": p["confirm_token"], "confirm_summary": p["confirm_summary"]}),
        Some(&tp("00f067aa0ba90203")),
        None,
    )
    .await;
    assert_eq!(done["result"]["structuredContent"]["status"], "EXECUTED", "{done}");
    // The trace in the headers only (a client that does not set `_meta`), on a failing call.
    let header_trace = "0af7651916cd43dd8448eb211c80319c";
    let (_, bad) = traced_call(
        &stack.lb_url,
        &token,
        json!("Ann.Smith-DECOYID"),
        "get_booking",
        json!({"booking": "bkg_DECOY-handle"}),
        None,
        Some(&format!("00-{header_trace}-b7ad6b7169203331-01")),
    )
    .await;
    assert_eq!(bad["result"]["isError"], true, "{bad}");
    // A request refused before any tool: no valid token.
    let refused_trace = "11111111111111111111111111111111";
    let (status, _) = traced_call(
        &stack.lb_url,
        "gh_mcp_DECOYTOKEN",
        json!(15),
        "find_customers",
        json!({}),
        None,
        Some(&format!("00-{refused_trace}-2222222222222222-01")),
    )
    .await;
    assert_eq!(status, 401);

    let named = |spans: &[Value], name: &str, trace: &str| -> Option<Value> {
        spans.iter().find(|s| s["name"] == name && s["trace_id"] == trace).cloned()
    };
    let mut spans = Vec::new();
    for _ in 0..300 {
        spans = received_spans(&dir);
        let all = named(&spans, "tools/call find_customers", client_trace).is_some()
            && named(&spans, "tools/call confirm_action", client_trace).is_some()
            && named(&spans, "gatehouse.outbox.deliver", client_trace).is_some()
            && named(&spans, "tools/call get_booking", header_trace).is_some()
            && named(&spans, "mcp.request", refused_trace).is_some();
        if all {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let find = named(&spans, "tools/call find_customers", client_trace)
        .unwrap_or_else(|| panic!("the read's span under the client's trace: {spans:#?}"));
    assert_eq!(find["kind"], "SPAN_KIND_SERVER");
    assert_eq!(find["parent_span_id"], "00f067aa0ba90201", "continues the client's span");
    let a = &find["attributes"];
    assert_eq!(a["mcp.method.name"], "tools/call");
    assert_eq!(a["gen_ai.tool.name"], "find_customers");
    assert_eq!(a["gen_ai.operation.name"], "execute_tool");
    assert_eq!(a["mcp.protocol.version"], "2026-07-28");
    assert_eq!(a["jsonrpc.request.id"], "11");
    assert_eq!(a["gatehouse.effect_class"], "read");
    assert_eq!(a["gatehouse.outcome"], "ok");
    assert!(a["gatehouse.tenant"].as_str().is_some_and(|t| t.starts_with("ten_")), "{a}");
    assert!(a["gatehouse.connection"].as_str().is_some_and(|c| c.starts_with("con_")), "{a}");
    assert_eq!(find["resource"]["service.name"], "gatehouse-worker");
    let children: Vec<&Value> =
        spans.iter().filter(|s| s["parent_span_id"] == find["span_id"]).collect();
    let child_names: Vec<&str> = children.iter().filter_map(|s| s["name"].as_str()).collect();
    assert!(child_names.contains(&"gatehouse.connection_context"), "{child_names:?}");
    assert!(child_names.contains(&"gatehouse.service find_customers"), "{child_names:?}");

    // The confirmation: its execution is a span under the call, and the email it queued is
    // delivered by the control plane in the same trace, under that execution.
    let confirm = named(&spans, "tools/call confirm_action", client_trace).expect("confirm span");
    let execute = named(&spans, "gatehouse.confirm.execute send_customer_message", client_trace)
        .unwrap_or_else(|| panic!("the confirm execution: {spans:#?}"));
    let service = spans
        .iter()
        .find(|s| s["span_id"] == execute["parent_span_id"])
        .expect("the execution's parent");
    assert_eq!(
        service["parent_span_id"], confirm["span_id"],
        "execution under the call's service span"
    );
    assert_eq!(
        confirm["attributes"]["gatehouse.effect_class"], "notify",
        "the executed action's class"
    );
    let delivery = named(&spans, "gatehouse.outbox.deliver", client_trace).expect("delivery");
    assert_eq!(
        delivery["parent_span_id"], execute["span_id"],
        "the delivery joins the trace that queued it"
    );
    assert_eq!(delivery["resource"]["service.name"], "gatehouse-control-plane");
    assert_eq!(delivery["attributes"]["gatehouse.outbox.channel"], "email");
    assert_eq!(delivery["attributes"]["gatehouse.outcome"], "ok");

    // Failure: the error type, the outcome code, never the message (which quotes the input).
    let failed = named(&spans, "tools/call get_booking", header_trace).expect("header-traced span");
    assert_eq!(failed["parent_span_id"], "b7ad6b7169203331");
    assert_eq!(failed["status"]["code"], "STATUS_CODE_ERROR");
    assert_eq!(failed["attributes"]["error.type"], "tool_error");
    assert_eq!(failed["attributes"]["gatehouse.outcome"], "invalid_argument");
    let id = failed["attributes"]["jsonrpc.request.id"].as_str().unwrap_or_default();
    assert!(id.starts_with("sha256:") && id.len() == 23, "a string id travels as its digest: {id}");
    let refused = named(&spans, "mcp.request", refused_trace).expect("refused span");
    assert_eq!(refused["attributes"]["error.type"], "unauthenticated");

    // No argument value, personal data or secret in anything the receiver got.
    let raw = std::fs::read(dir.join("raw.bin")).expect("raw bodies");
    let jsonl = std::fs::read(dir.join("spans.jsonl")).expect("spans");
    for decoy in [
        subject,
        body,
        "DECOY-handle",
        "DECOYTOKEN",
        "DECOYSTATE",
        "DECOYID",
        "Fischer",
        "anna.fischer",
        token.as_str(),
    ] {
        for (what, bytes) in [("raw OTLP", &raw), ("decoded spans", &jsonl)] {
            let found = bytes.windows(decoy.len()).any(|w| w == decoy.as_bytes());
            assert!(!found, "{decoy:?} reached the {what}");
        }
    }
    receiver.start_kill().expect("stop the receiver");
    let _ = std::fs::remove_dir_all(&dir);
}
