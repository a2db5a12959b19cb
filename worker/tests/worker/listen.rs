//! Listen streams on one worker: acknowledged first and tagged, bounded per connection with a
//! refusal that says so, and ended with their final result when the worker stops.

use serde_json::json;

use crate::support::*;

/// Opens a listen stream; returns the response to read frames from.
async fn listen(stack: &Stack, token: &str, id: i64) -> reqwest::Response {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": {
        "notifications": {"toolsListChanged": true},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}});
    stack
        .http
        .post(format!("{}/mcp", stack.url))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "subscriptions/listen")
        .bearer_auth(token)
        .body(body.to_string())
        .send()
        .await
        .expect("listen")
}

/// Reads frames until one contains `needle` (or the stream ends); returns what was read.
async fn read_until(response: &mut reqwest::Response, needle: &str) -> String {
    let mut seen = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !seen.contains(needle) && std::time::Instant::now() < deadline {
        match tokio::time::timeout(std::time::Duration::from_secs(10), response.chunk()).await {
            Ok(Ok(Some(chunk))) => seen.push_str(&String::from_utf8_lossy(&chunk)),
            _ => break,
        }
    }
    seen
}

#[tokio::test]
async fn a_stream_is_acknowledged_bounded_and_ended_with_its_result_when_the_worker_stops() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let mut first = listen(&stack, &token, 1).await;
    assert_eq!(first.status(), 200);
    let ack = read_until(&mut first, "subscriptions/acknowledged").await;
    assert!(ack.contains("io.modelcontextprotocol/subscriptionId"), "{ack}");
    // Up to the per-connection bound, then a refusal naming it.
    let mut held = Vec::new();
    for id in 2..(1 + worker::listen::MAX_PER_CONNECTION as i64) {
        let mut r = listen(&stack, &token, id).await;
        read_until(&mut r, "subscriptions/acknowledged").await;
        held.push(r);
    }
    // Refused before anything acknowledges it: the answer is the error, so a client's listen()
    // raises the bound's message instead of reporting a lost subscription.
    let refused = listen(&stack, &token, 99).await;
    let said = refused.text().await.expect("body");
    assert!(said.contains("listen streams"), "the refusal names the bound: {said}");
    assert!(!said.contains("acknowledged"), "nothing acknowledged it: {said}");
    let refusal: serde_json::Value = serde_json::from_str(&said).expect("one JSON-RPC answer");
    assert_eq!(refusal["id"], 99, "{said}");
    assert_eq!(refusal["error"]["code"], -32600, "{said}");
    // On the legacy protocol the answer says which version serves listening.
    let legacy = stack
        .http
        .post(format!("{}/mcp", stack.url))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2025-11-25")
        .bearer_auth(&token)
        .body(json!({"jsonrpc": "2.0", "id": 7, "method": "subscriptions/listen", "params": {"notifications": {"toolsListChanged": true}}}).to_string())
        .send()
        .await
        .expect("legacy listen")
        .text()
        .await
        .expect("body");
    assert!(legacy.contains("2026-07-28") && legacy.contains("2025-11-25"), "{legacy}");
    // The worker stops: every stream ends with its final result, not a cut.
    worker::drain(&stack.state).await;
    let end = read_until(&mut first, "\"result\"").await;
    assert!(end.contains("\"result\"") && end.contains("\"id\":1"), "{end}");
}

/// A push that concerns eight streams of one credential costs one re-read of its context, and
/// every stream is still told; a later push starts a new round.
#[tokio::test]
async fn streams_of_one_credential_share_one_reread_per_push() {
    let stack = Stack::start().await;
    let t0 = &stack.seed.tenants[0];
    let token = stack.token(0, 0);
    let mut streams = Vec::new();
    for id in 1..=worker::listen::MAX_PER_CONNECTION as i64 {
        let mut r = listen(&stack, &token, id).await;
        read_until(&mut r, "subscriptions/acknowledged").await;
        streams.push(r);
    }
    let rereads = || stack.state.metrics.listen_rereads.get();
    let before = rereads();
    // The connection's creator becomes a viewer: the list changes for every stream.
    stack.db.make_first_connection_creator_a_viewer().await;
    let tenant = stack.db.rows("tenants").eq("slug", &t0.slug).text("handle").await;
    stack.state.streams.poke(&shared::bus::Event::TenantChanged { tenant });
    for s in streams.iter_mut() {
        let told = read_until(s, "notifications/tools/list_changed").await;
        assert!(told.contains("notifications/tools/list_changed"), "every stream is told: {told}");
    }
    assert_eq!(rereads() - before, 1, "one re-read for eight streams of one credential");
}
