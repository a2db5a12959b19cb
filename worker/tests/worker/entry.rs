//! The entry path: which credentials, origins, protocol versions and switches reach a tool at
//! all, before any tool runs.

use crate::support::*;

#[tokio::test]
async fn credentials_of_other_kinds_and_bad_origins_are_refused() {
    let stack = Stack::start().await;
    let (status, headers, body) = stack.raw(None, "tools/list", None, json!({}), &[]).await;
    assert_eq!(status, 401);
    let challenge = headers["www-authenticate"].to_str().expect("ascii");
    assert!(
        !challenge.contains("error="),
        "no credential, no error code (RFC 6750 §3.1): {challenge}"
    );
    // The scope a client knowing nothing should ask for is the read rights (least privilege).
    assert!(
        challenge.contains("scope=\"customers:read technicians:read bookings:read\""),
        "{challenge}"
    );
    let (_, bad, _) = stack
        .raw(Some("gh_mcp_notknownnotknownnotknownnotknown00"), "tools/list", None, json!({}), &[])
        .await;
    assert!(bad["www-authenticate"].to_str().expect("ascii").contains("error=\"invalid_token\""));
    assert!(
        challenge.contains(&format!(
            "resource_metadata=\"{}/.well-known/oauth-protected-resource\"",
            stack.url
        )),
        "{challenge}"
    );
    assert!(body["error_description"].as_str().expect("text").contains("gh_mcp_"));
    // R20: an API token is not an MCP credential.
    let api = stack.seed.tenants[0].api_token.clone();
    let (status, _, body) = stack.raw(Some(&api), "tools/list", None, json!({}), &[]).await;
    assert_eq!(status, 401);
    assert!(body["error_description"].as_str().expect("text").contains("API token"), "{body}");
    let (status, _, _) = stack
        .raw(Some("gh_mcp_notarealtokennotarealtokennotareal"), "tools/list", None, json!({}), &[])
        .await;
    assert_eq!(status, 401);
    // R20: a browser Origin not on the allow-list is 403; an allowed one passes.
    let token = stack.token(0, 0);
    let (status, _, _) = stack
        .raw(Some(&token), "tools/list", None, json!({}), &[("Origin", "https://evil.example")])
        .await;
    assert_eq!(status, 403);
    let (status, _, _) = stack
        .raw(
            Some(&token),
            "tools/list",
            None,
            json!({}),
            &[("Origin", "https://console.gatehouse.test")],
        )
        .await;
    assert_eq!(status, 200);
    // Protected resource metadata names the authorization server.
    let meta: Value = stack
        .http
        .get(format!("{}/.well-known/oauth-protected-resource", stack.url))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(meta["resource"], json!(format!("{}/mcp", stack.url)));
    assert_eq!(meta["authorization_servers"][0], "http://127.0.0.1:1");
}

#[tokio::test]
async fn switches_refuse_before_any_tool_runs() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    stack.db.exec("UPDATE platform_state SET global_kill = true").await;
    let (status, headers, _) = stack
        .raw(
            Some(&token),
            "tools/call",
            Some("find_bookings"),
            json!({"name": "find_bookings", "arguments": {}}),
            &[],
        )
        .await;
    assert_eq!(status, 503);
    assert_eq!(headers["retry-after"], "30");
    stack.db.exec("UPDATE platform_state SET global_kill = false").await;
    stack
        .db
        .exec(&format!(
            "UPDATE tenants SET agent_access = false WHERE slug = '{}'",
            stack.seed.tenants[0].slug
        ))
        .await;
    let (status, _, body) = stack.raw(Some(&token), "tools/list", None, json!({}), &[]).await;
    assert_eq!(status, 403);
    assert!(
        body["error_description"]
            .as_str()
            .expect("text")
            .contains("a tenant admin can turn it back on")
    );
    // The other tenant is unaffected.
    assert_eq!(stack.list(&stack.token(1, 0)).await.len(), ALL_TOOLS.len());
}

#[tokio::test]
async fn older_clients_are_served_without_sessions() {
    let stack = Stack::start().await;
    let response = stack
        .http
        .post(format!("{}/mcp", stack.url))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .bearer_auth(stack.token(0, 0))
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "legacy", "version": "1"}}}))
        .send()
        .await
        .expect("initialize");
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("mcp-session-id").is_none(), "no session is kept");
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["result"]["protocolVersion"], "2025-11-25");
    let response = stack
        .http
        .post(format!("{}/mcp", stack.url))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2025-11-25")
        .bearer_auth(stack.token(0, 0))
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}))
        .send()
        .await
        .expect("tools/list");
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["result"]["tools"].as_array().expect("tools").len(), ALL_TOOLS.len());
}

#[tokio::test]
async fn access_tokens_hold_only_for_their_audience_and_until_they_expire() {
    let stack = Stack::start().await;
    let connection = stack.seed.tenants[0].connections[0].connection.clone();
    let mcp = format!("{}/mcp", stack.url);
    for (token, audience, expires) in [
        (
            "gh_mcp_accessvalidvalidvalidvalidvalidvalid01",
            mcp.as_str(),
            "now() + interval '1 hour'",
        ),
        (
            "gh_mcp_accessexpiredexpiredexpiredexpired0002",
            mcp.as_str(),
            "now() - interval '1 second'",
        ),
        (
            "gh_mcp_accesselsewhereelsewhereelsewhere00003",
            "https://elsewhere.example/mcp",
            "now() + interval '1 hour'",
        ),
    ] {
        stack
            .db
            .exec(&format!(
                "INSERT INTO connection_tokens (connection_id, kind, token_hash, audience, expires_at)
                 SELECT id, 'access', sha256(convert_to('{token}', 'UTF8')), '{audience}', {expires} FROM connections WHERE handle = '{connection}'"
            ))
            .await;
    }
    let status = |token: &'static str| async {
        stack.raw(Some(token), "tools/list", None, json!({}), &[]).await.0
    };
    assert_eq!(status("gh_mcp_accessvalidvalidvalidvalidvalidvalid01").await, 200);
    assert_eq!(status("gh_mcp_accessexpiredexpiredexpiredexpired0002").await, 401, "expired");
    assert_eq!(
        status("gh_mcp_accesselsewhereelsewhereelsewhere00003").await,
        401,
        "issued for another resource"
    );
}
