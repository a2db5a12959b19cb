//! What operators rely on: health, readiness and metrics, the per-call counts the console draws,
//! and shedding with 503 when a worker is full.

use crate::support::*;

#[tokio::test]
async fn health_readiness_and_metrics_answer() {
    let stack = Stack::start().await;
    let ready = stack.http.get(format!("{}/readyz", stack.url)).send().await.expect("readyz");
    assert_eq!(ready.status(), 200);
    assert_eq!(ready.headers()["gatehouse-worker"], "test-worker");
    stack.call(&stack.token(0, 0), "find_technicians", json!({})).await.expect("call");
    let metrics = stack
        .http
        .get(format!("{}/metrics", stack.url))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(metrics.contains("gatehouse_worker_tool_calls_total{class=\"read\",outcome=\"ok\",tool=\"find_technicians\"} 1"), "{metrics}");
    assert!(metrics.contains("gatehouse_worker_tool_call_duration_seconds_bucket"));
    // With an operator listener, the public one serves neither readiness nor metrics.
    let settings = Settings {
        public_url: stack.url.clone(),
        authorization_server: "http://127.0.0.1:1".into(),
        allowed_hosts: vec!["127.0.0.1".into()],
        allowed_origins: vec![],
        worker_id: "split".into(),
        mrtr_keys: None,
    };
    let state = Arc::new(AppState::new(stack.db.ds.clone(), settings));
    let serve = |router: axum::Router| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
        url
    };
    let public = serve(worker::public_app(state.clone())).await;
    let operator = serve(worker::operator_app(state)).await;
    for path in ["/metrics", "/readyz"] {
        let on_public = stack.http.get(format!("{public}{path}")).send().await.expect("get");
        assert_ne!(on_public.status(), 200, "{path} is not public");
        let body = on_public.text().await.expect("body");
        assert!(!body.contains("gatehouse_worker") && !body.contains("postgres"), "{path}: {body}");
        let on_operator = stack.http.get(format!("{operator}{path}")).send().await.expect("get");
        assert_eq!(on_operator.status(), 200, "{path} on the operator listener");
    }
    assert_eq!(
        stack.http.get(format!("{public}/healthz")).send().await.expect("get").status(),
        200
    );
}

#[tokio::test]
async fn every_tool_call_is_counted_for_the_console_by_outcome_without_its_arguments() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let connection = &stack.seed.tenants[0].connections[0].connection;
    let decoy = "DECOY-activity-5e1";
    for _ in 0..3 {
        stack.call(&token, "find_customers", json!({"query": decoy})).await.expect("a read");
    }
    let refused = stack.call(&token, "get_booking", json!({"booking": decoy})).await;
    assert!(refused.is_err());
    let written = stack.state.activity.flush(&stack.db.ds).await.expect("flush");
    assert_eq!(written, 4);
    let counts: Vec<String> = stack
        .db
        .call_activity_of(connection)
        .await
        .iter()
        .map(|(class, outcome, calls)| format!("{class}:{outcome}={calls}"))
        .collect();
    assert_eq!(counts.join(" "), "read:invalid_argument=1 read:ok=3");
    let recent = stack.db.recent_calls_text(connection).await;
    assert_eq!(recent.matches("find_customers").count(), 3, "{recent}");
    assert!(!recent.contains(decoy), "no argument value is kept: {recent}");
    // A second flush with nothing new writes nothing; the counts add up across flushes.
    assert_eq!(stack.state.activity.flush(&stack.db.ds).await.expect("flush"), 0);
    stack.call(&token, "find_customers", json!({"query": "a"})).await.expect("a read");
    stack.state.activity.flush(&stack.db.ds).await.expect("flush");
    let ok: i64 = stack
        .db
        .call_activity_of(connection)
        .await
        .iter()
        .filter(|(_, outcome, _)| outcome == "ok")
        .map(|(_, _, calls)| calls)
        .sum();
    assert_eq!(ok, 4);
    // A two-step action: its first step is a preview, and the confirmation counts under the
    // class of what it executed (a delete), not under confirm_action's own.
    let created = stack
        .ok(&token, "create_customer", json!({"name": "Counted", "email": "counted@example.net"}))
        .await;
    let preview = stack
        .ok(&token, "delete_customer", json!({"customer": created["customer"]["customer"]}))
        .await;
    stack.ok(&token, "confirm_action", json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]})).await;
    stack.state.activity.flush(&stack.db.ds).await.expect("flush");
    let deletes: Vec<String> = stack
        .db
        .call_activity_of(connection)
        .await
        .iter()
        .filter(|(class, _, _)| class == "delete")
        .map(|(_, outcome, calls)| format!("{outcome}={calls}"))
        .collect();
    assert_eq!(deletes.join(" "), "ok=1 previewed=1");
    // The latest calls stay bounded per connection however many there were.
    for _ in 0..3 {
        for _ in 0..25 {
            stack.call(&token, "find_customers", json!({"query": "a"})).await.expect("a read");
        }
        stack.state.activity.flush(&stack.db.ds).await.expect("flush");
    }
    let connection_id = stack.db.rows("connections").eq("handle", connection).int("id").await;
    let kept = stack.db.rows("recent_calls").eq("connection_id", connection_id).count().await;
    assert_eq!(kept, 50);
}

#[tokio::test]
async fn a_full_worker_sheds_with_503_and_retry_after_and_serves_again_when_room_frees() {
    use tokio::io::AsyncWriteExt as _;
    let stack = Stack::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let url = format!("http://{addr}");
    let settings = Settings {
        public_url: stack.url.clone(),
        authorization_server: "http://127.0.0.1:1".into(),
        allowed_hosts: vec!["127.0.0.1".into(), "localhost".into()],
        allowed_origins: Vec::new(),
        worker_id: "test-worker-small".into(),
        mrtr_keys: None,
    };
    let state = Arc::new(AppState::new(stack.db.ds.clone(), settings).with_max_inflight(1));
    tokio::spawn(async move { axum::serve(listener, app(state)).await.expect("serve") });
    let token = stack.token(0, 0);
    // One request holds the only place: its body is still arriving.
    let mut slow = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 500\r\n\r\n{{\"jsonrpc\""
    );
    slow.write_all(head.as_bytes()).await.expect("write");
    let mut shed = None;
    for _ in 0..100 {
        let (status, headers, body) =
            stack.raw_at(&url, Some(&token), "tools/list", None, json!({}), &[]).await;
        if status == 503 {
            shed = Some((headers, body));
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (headers, body) = shed.expect("a second request is shed while the first holds the place");
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(body["error"], "overloaded", "{body}");
    // The place frees when the first request ends; the next one is served.
    drop(slow);
    let mut served = 0;
    for _ in 0..100 {
        served = stack.raw_at(&url, Some(&token), "tools/list", None, json!({}), &[]).await.0;
        if served == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(served, 200);
}
