//! Gatehouse as users meet it: real binaries, two workers behind nginx, real Postgres, and the
//! official MCP Python SDK connecting through the load balancer in both protocol eras.

use std::collections::BTreeSet;

use e2e::{Options, Stack, sdk_check};
use serde_json::{Value, json};

#[tokio::test]
async fn python_sdk_clients_work_through_the_load_balancer_in_both_eras() {
    let stack = Stack::start(Options::for_test("sdk", 2)).await.expect("stack");
    let url = format!("{}/mcp", stack.lb_url);
    let token = stack.token(0, 0);
    let mut seen = BTreeSet::new();
    for mode in ["2026-07-28", "legacy"] {
        let out = sdk_check(&url, &token, mode, 6, true).unwrap_or_else(|e| {
            panic!(
                "{e}\nworker-1:\n{}\nworker-2:\n{}",
                stack.log("worker-1"),
                stack.log("worker-2")
            )
        });
        assert_eq!(out["tools"].as_array().expect("tools").len(), 23, "{mode}: {out}");
        assert_eq!(out["found"], 5, "{mode}");
        assert_eq!(out["refused_is_error"], true, "{mode}: unknown fields are refused");
        assert_eq!(out["refused_text_starts"], "Error:");
        let w = &out["writes"];
        assert_eq!(
            (w["first_replayed"].clone(), w["again_replayed"].clone()),
            (json!(false), json!(true)),
            "{mode}: {w}"
        );
        assert_eq!(w["preview_status"], "PREVIEW");
        assert_eq!(w["executed"], "EXECUTED");
        assert_eq!(w["reuse_code"], "token_used");
        for w in out["workers"].as_array().expect("workers") {
            seen.insert(w.as_str().expect("name").to_owned());
        }
        assert!(
            out["workers"].as_array().expect("workers").len() == 2,
            "{mode}: consecutive calls land on both workers: {out}"
        );
    }
    assert_eq!(seen, BTreeSet::from(["worker-1".to_owned(), "worker-2".to_owned()]));
    // The confirmed emails leave through the control plane's dispatcher, once each.
    let mut sent = 0;
    for _ in 0..100 {
        sent = psql_count(&stack, "SELECT count(*) FROM outbox WHERE status = 'sent'");
        if sent == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(sent, 2, "one email per mode, delivered");
    assert_eq!(psql_count(&stack, "SELECT count(*) FROM outbox"), 2);
}

/// Raw tools/list through one worker.
async fn list_status(http: &reqwest::Client, base: &str, token: &str) -> u16 {
    http.post(format!("{base}/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/list")
        .bearer_auth(token)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}}}))
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

#[tokio::test]
async fn revocation_and_deactivation_hold_on_every_worker_at_the_next_call() {
    let stack = Stack::start(Options::for_test("revoke", 2)).await.expect("stack");
    let http = reqwest::Client::new();
    let tenant = stack.tenant(0).clone();
    let slug = tenant["slug"].as_str().expect("slug");
    let read_only = stack.token(0, 1);
    let full = stack.token(0, 0);
    for w in &stack.worker_urls {
        assert_eq!(list_status(&http, w, &read_only).await, 200);
        assert_eq!(list_status(&http, w, &full).await, 200);
    }
    let connection = tenant["connections"][1]["connection"].as_str().expect("handle");
    let revoked: Value = stack
        .ctl(&["connection", "revoke", "--tenant", slug, "--connection", connection])
        .expect("revoke");
    assert_eq!(revoked["revoked"], true);
    let admin = tenant["admin"]["email"].as_str().expect("email");
    stack.ctl(&["person", "deactivate", "--tenant", slug, "--email", admin]).expect("deactivate");
    for w in &stack.worker_urls {
        assert_eq!(list_status(&http, w, &read_only).await, 401, "revoked on {w}");
        assert_eq!(list_status(&http, w, &full).await, 401, "creator gone on {w}");
    }
    // The other tenant is untouched.
    assert_eq!(list_status(&http, &stack.lb_url, &stack.token(1, 0)).await, 200);
}

/// One tools/call through a given base URL, with its own HTTP client (its own connection).
async fn tool_call(base: &str, token: &str, tool: &str, args: Value) -> Value {
    let body: Value = reqwest::Client::new()
        .post(format!("{base}/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", tool)
        .bearer_auth(token)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": args,
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}}}}))
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    body["result"].clone()
}

fn psql_count(stack: &Stack, sql: &str) -> i64 {
    let out = std::process::Command::new("psql")
        .arg(&stack.database_url)
        .args(["-Atqc", sql])
        .output()
        .expect("psql");
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confirmations_and_retries_racing_on_two_workers_take_effect_once() {
    let stack = Stack::start(Options::for_test("race", 2)).await.expect("stack");
    let token = stack.token(0, 0);
    let w = stack.worker_urls.clone();
    let found = tool_call(&w[0], &token, "find_customers", json!({"query": "Koch"})).await;
    let customer = found["structuredContent"]["customers"][0]["customer"].clone();
    let preview = tool_call(
        &w[0],
        &token,
        "send_customer_message",
        json!({"customer": customer, "subject": "Visit", "body": "We come at 9."}),
    )
    .await;
    let args = json!({"confirm_token": preview["structuredContent"]["confirm_token"], "confirm_summary": preview["structuredContent"]["confirm_summary"]});
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(50));
    let calls: Vec<_> = (0..50)
        .map(|i| {
            let (base, token, args, barrier) =
                (w[i % 2].clone(), token.clone(), args.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                tool_call(&base, &token, "confirm_action", args).await
            })
        })
        .collect();
    let mut executed = 0;
    for c in calls {
        let r = c.await.expect("join");
        if r["isError"] == true {
            assert_eq!(r["structuredContent"]["error"]["code"], "token_used", "{r}");
        } else {
            executed += 1;
        }
    }
    assert_eq!(executed, 1);
    assert_eq!(psql_count(&stack, "SELECT count(*) FROM outbox"), 1);

    // A silent write re-sent on the other worker (a retry after a broken stream) executes once.
    let booking = tool_call(&w[0], &token, "find_bookings", json!({"limit": 1})).await["structuredContent"]["bookings"][0]["booking"].clone();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let (base, token, booking, barrier) =
                (w[i % 2].clone(), token.clone(), booking.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                tool_call(
                    &base,
                    &token,
                    "add_booking_note",
                    json!({"booking": booking, "text": "Retry-safe note"}),
                )
                .await
            })
        })
        .collect();
    let mut replayed = 0;
    for c in calls {
        let r = c.await.expect("join");
        assert_ne!(r["isError"], true, "{r}");
        replayed += usize::from(r["structuredContent"]["replayed"] == true);
    }
    assert_eq!(replayed, 19);
    assert_eq!(
        psql_count(&stack, "SELECT count(*) FROM booking_notes WHERE body = 'Retry-safe note'"),
        1
    );
}

#[tokio::test]
async fn inputs_the_api_rejects_are_rejected_by_the_tools_too() {
    let stack = Stack::start(Options::for_test("parity", 1)).await.expect("stack");
    let token = stack.token(0, 0);
    let api_token = stack.tenant(0)["api_token"].as_str().expect("api").to_owned();
    let booking = tool_call(&stack.lb_url, &token, "find_bookings", json!({"limit": 1})).await["structuredContent"]["bookings"][0].clone();
    let customer = booking["customer"]["customer"].as_str().expect("h").to_owned();
    let handle = booking["booking"].as_str().expect("h").to_owned();
    let http = reqwest::Client::new();
    // (tool, tool arguments, API method, API path, API body, the field both must name)
    let cases = [
        (
            "create_customer",
            json!({"name": "X", "email": "not-an-email"}),
            "POST",
            "/api/v1/customers".to_owned(),
            json!({"name": "X", "email": "not-an-email"}),
            "email",
        ),
        (
            "update_customer",
            json!({"customer": customer, "version": "v", "phone": "call me"}),
            "PATCH",
            format!("/api/v1/customers/{customer}"),
            json!({"version": "v", "phone": "call me"}),
            "phone",
        ),
        (
            "create_booking",
            json!({"customer": customer, "service": "svc_0000000000000000", "start": "2027-03-28T02:30", "zone": "Europe/Berlin"}),
            "POST",
            "/api/v1/bookings".to_owned(),
            json!({"customer": customer, "service": "svc_0000000000000000", "start": "2027-03-28T02:30", "zone": "Europe/Berlin"}),
            "start",
        ),
        (
            "update_booking",
            json!({"booking": handle, "version": "v", "priority": "urgent"}),
            "PATCH",
            format!("/api/v1/bookings/{handle}"),
            json!({"version": "v", "priority": "urgent"}),
            "priority",
        ),
        (
            "add_booking_note",
            json!({"booking": handle, "text": "   "}),
            "POST",
            format!("/api/v1/bookings/{handle}/notes"),
            json!({"text": "   "}),
            "text",
        ),
    ];
    for (tool, args, method, path, body, field) in cases {
        let result = tool_call(&stack.lb_url, &token, tool, args).await;
        assert_eq!(result["isError"], true, "{tool}: {result}");
        assert_eq!(result["structuredContent"]["error"]["field"], field, "{tool}: {result}");
        let request = match method {
            "POST" => http.post(format!("{}{path}", stack.control_url)),
            _ => http.patch(format!("{}{path}", stack.control_url)),
        };
        let response = request.bearer_auth(&api_token).json(&body).send().await.expect("api");
        assert_eq!(response.status(), 422, "{tool} through the API");
        let api_body: Value = response.json().await.expect("json");
        assert_eq!(api_body["error"]["field"], field, "{tool}: {api_body}");
    }
}

/// Status of a raw create_customer call through one base URL, and its Retry-After.
async fn write_status(base: &str, token: &str, email: &str) -> (u16, Option<String>) {
    let response = reqwest::Client::new()
        .post(format!("{base}/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "create_customer")
        .bearer_auth(token)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "create_customer",
            "arguments": {"name": "Switch Test", "email": email},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}}))
        .send()
        .await
        .expect("request");
    let retry =
        response.headers().get("retry-after").map(|v| v.to_str().unwrap_or_default().to_owned());
    (response.status().as_u16(), retry)
}

/// Polls until every worker answers `want`, at most one second (the switch must reach all).
async fn every_worker_answers(stack: &Stack, token: &str, want: u16) -> Vec<(u16, Option<String>)> {
    let start = std::time::Instant::now();
    loop {
        let mut seen = Vec::new();
        for (i, w) in stack.worker_urls.iter().enumerate() {
            seen.push(
                write_status(
                    w,
                    token,
                    &format!("switch-{i}-{}@example.net", start.elapsed().as_nanos()),
                )
                .await,
            );
        }
        if seen.iter().all(|(s, _)| *s == want)
            || start.elapsed() > std::time::Duration::from_secs(1)
        {
            return seen;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn kill_switches_reach_every_worker_and_hold_without_nats() {
    let mut stack = Stack::start(Options::for_test("switch", 2)).await.expect("stack");
    let token = stack.token(0, 0);
    let customers = "SELECT count(*) FROM customers WHERE name = 'Switch Test'";
    // Global switch on: every worker answers 503 with Retry-After, nothing is written.
    let flipped = stack.ctl(&["kill-switch", "on", "--reason", "incident 42"]).expect("on");
    assert_eq!(flipped["kill"], true);
    for (status, retry) in every_worker_answers(&stack, &token, 503).await {
        assert_eq!(status, 503);
        assert_eq!(retry.as_deref(), Some("30"));
    }
    assert_eq!(psql_count(&stack, customers), 0);
    // The flip arrived over NATS on every worker, not only through Postgres.
    for w in &stack.worker_urls {
        let mut pushed = false;
        for _ in 0..50 {
            let metrics = reqwest::get(format!("{w}/metrics"))
                .await
                .expect("metrics")
                .text()
                .await
                .expect("text");
            pushed = metrics.lines().any(|l| {
                l.starts_with("gatehouse_worker_bus_events_total{kind=\"global_kill\"}")
                    && !l.ends_with(" 0")
            });
            if pushed {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(pushed, "{w} applied the switch from NATS");
    }
    stack.ctl(&["kill-switch", "off", "--reason", "resolved"]).expect("off");
    assert!(every_worker_answers(&stack, &token, 200).await.iter().all(|(s, _)| *s == 200));
    // A tenant switch refuses that tenant only.
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    stack
        .ctl(&["kill-switch", "on", "--tenant", &slug, "--reason", "admin asked"])
        .expect("tenant on");
    assert!(every_worker_answers(&stack, &token, 403).await.iter().all(|(s, _)| *s == 403));
    assert!(
        every_worker_answers(&stack, &stack.token(1, 0), 200).await.iter().all(|(s, _)| *s == 200)
    );
    stack.ctl(&["kill-switch", "off", "--tenant", &slug, "--reason", "back"]).expect("tenant off");
    // Each flip is one audit row, with its reason.
    assert_eq!(
        psql_count(
            &stack,
            "SELECT count(*) FROM audit_log WHERE action IN ('kill_switch.on', 'kill_switch.off') AND reason IS NOT NULL"
        ),
        2
    );
    assert_eq!(
        psql_count(
            &stack,
            "SELECT count(*) FROM audit_log WHERE action LIKE 'agent_access.%' AND channel = 'cli'"
        ),
        2
    );

    // NATS down: the switch still holds on the next call, from Postgres; and off really is off.
    stack.stop_nats().expect("stop nats");
    stack.ctl(&["kill-switch", "on", "--reason", "NATS is down"]).expect("on without nats");
    assert!(every_worker_answers(&stack, &token, 503).await.iter().all(|(s, _)| *s == 503));
    stack.ctl(&["kill-switch", "off", "--reason", "still down"]).expect("off without nats");
    assert!(every_worker_answers(&stack, &token, 200).await.iter().all(|(s, _)| *s == 200));
    // NATS back: workers reconnect and report it.
    stack.start_nats().expect("start nats");
    let http = reqwest::Client::new();
    for w in &stack.worker_urls {
        let mut nats = String::new();
        for _ in 0..150 {
            let ready: Value = http
                .get(format!("{w}/readyz"))
                .send()
                .await
                .expect("readyz")
                .json()
                .await
                .expect("json");
            nats = ready["nats"].as_str().unwrap_or_default().to_owned();
            if nats == "connected" {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(nats, "connected", "{w} reconnected to NATS");
    }
    stack.ctl(&["kill-switch", "on", "--reason", "after restart"]).expect("on");
    assert!(every_worker_answers(&stack, &token, 503).await.iter().all(|(s, _)| *s == 503));
    stack.ctl(&["kill-switch", "off", "--reason", "done"]).expect("off");
    let audit = stack.ctl(&["audit", "--tenant", &slug, "--limit", "10"]).expect("audit");
    assert!(
        audit["audit"]
            .as_array()
            .expect("rows")
            .iter()
            .any(|r| r["action"] == "agent_access.off" && r["reason"] == "admin asked")
    );
}
