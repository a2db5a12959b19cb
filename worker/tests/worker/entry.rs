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
    stack.set_kill_switch(true).await;
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
    stack.set_kill_switch(false).await;
    stack.set_agent_access(&stack.seed.tenants[0].slug, false).await;
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
    for (token, audience, lifetime) in [
        ("gh_mcp_accessvalidvalidvalidvalidvalidvalid01", mcp.as_str(), "1 hour"),
        ("gh_mcp_accessexpiredexpiredexpiredexpired0002", mcp.as_str(), "-1 second"),
        (
            "gh_mcp_accesselsewhereelsewhereelsewhere00003",
            "https://elsewhere.example/mcp",
            "1 hour",
        ),
    ] {
        stack.db.store_access_token(&connection, token, audience, lifetime).await;
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

#[tokio::test]
async fn a_foreign_origin_is_refused_before_its_credentials_are_looked_at() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let api = stack.seed.tenants[0].api_token.clone();
    // Whatever the request carries, a foreign browser origin is 403, never 401 first.
    for (who, credential) in [
        ("none", None),
        ("unknown", Some("gh_mcp_notknownnotknownnotknownnotknown00")),
        ("api token", Some(api.as_str())),
        ("valid", Some(token.as_str())),
    ] {
        for origin in
            ["https://evil.example", "http://console.gatehouse.test", "null", "not an origin"]
        {
            let (status, _, body) =
                stack.raw(credential, "tools/list", None, json!({}), &[("Origin", origin)]).await;
            assert_eq!(status, 403, "{who} from {origin}: {body}");
        }
    }
    // The allowed origin (its default port spelled or not) reaches authentication as before.
    for origin in ["https://console.gatehouse.test", "https://console.gatehouse.test:443"] {
        let (status, _, _) =
            stack.raw(None, "tools/list", None, json!({}), &[("Origin", origin)]).await;
        assert_eq!(status, 401, "{origin}");
        let (status, _, _) =
            stack.raw(Some(&token), "tools/list", None, json!({}), &[("Origin", origin)]).await;
        assert_eq!(status, 200, "{origin}");
    }
}

/// Sends `head` and the first part of a body, reads the answer, then sends the rest of the
/// body and a second request on the same connection. Returns the first answer's head and, when
/// it did not say `Connection: close`, the second answer's status line (empty when the worker
/// closed the connection instead of answering).
async fn refuse_then_reuse(
    addr: &str,
    head: &str,
    sent: &[u8],
    rest: &[u8],
    next: &str,
) -> (String, Option<String>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    socket.write_all(head.as_bytes()).await.expect("write head");
    socket.write_all(sent).await.expect("write body");
    let (mut reader, mut writer) = socket.into_split();
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let answer_head = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
            let length: usize = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().expect("length"));
            while buffer.len() < end + 4 + length {
                let n = reader.read(&mut chunk).await.expect("read body");
                assert!(n > 0, "the answer was cut: {text}");
                buffer.extend_from_slice(&chunk[..n]);
            }
            buffer.drain(..end + 4 + length);
            break text;
        }
        let n = reader.read(&mut chunk).await.expect("read head");
        assert!(n > 0, "no answer at all");
        buffer.extend_from_slice(&chunk[..n]);
    };
    if answer_head.contains("\nconnection: close") {
        return (answer_head, None);
    }
    // The rest of the body and the next request; a closed connection may refuse the write.
    let _ = writer.write_all(rest).await;
    let _ = writer.write_all(next.as_bytes()).await;
    let mut second = buffer;
    let read = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while !second.windows(2).any(|w| w == b"\r\n") {
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => second.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the worker neither answered nor closed");
    let line = String::from_utf8_lossy(&second).lines().next().unwrap_or_default().to_owned();
    (answer_head, Some(line))
}

#[tokio::test]
async fn a_refusal_before_the_body_is_read_leaves_the_connection_usable_or_says_it_closes() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let addr = stack.url.trim_start_matches("http://").to_owned();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL, "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string();
    let request = |auth: &str, extra: &str, length: usize| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: {PROTOCOL}\r\nMcp-Method: tools/list\r\n{extra}Content-Length: {length}\r\n\r\n"
        )
    };
    let bearer = format!("Authorization: Bearer {token}\r\n");
    let next = format!("{}{body}", request(&bearer, "", body.len()));
    let (sent, rest) = body.as_bytes().split_at(10);
    let big = vec![b' '; 4 * 1024 * 1024 + 100_000];
    let cases: Vec<(&str, String, &[u8], &[u8])> = vec![
        ("401", request("", "", body.len()), sent, rest),
        (
            "401",
            request(
                "Authorization: Bearer gh_mcp_notknownnotknownnotknownnotknown00\r\n",
                "",
                body.len(),
            ),
            sent,
            rest,
        ),
        ("403", request(&bearer, "Origin: https://evil.example\r\n", body.len()), sent, rest),
        ("403", request("", "Origin: https://evil.example\r\n", body.len()), sent, rest),
        ("413", request(&bearer, "", big.len()), &big[..big.len() - 10], &big[big.len() - 10..]),
    ];
    for (status, head, sent, rest) in cases {
        for _ in 0..5 {
            let (answer, second) = refuse_then_reuse(&addr, &head, sent, rest, &next).await;
            assert!(answer.starts_with(&format!("http/1.1 {status}")), "{answer}");
            if let Some(second) = second {
                assert!(
                    second.starts_with("HTTP/1.1 200"),
                    "{status} kept the connection open, but the next request on it got {second:?}"
                );
            }
        }
    }
    // Shed at capacity: a worker with room for one request, held by a body still arriving.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let small = listener.local_addr().expect("addr").to_string();
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
    let mut holder = tokio::net::TcpStream::connect(&small).await.expect("connect");
    tokio::io::AsyncWriteExt::write_all(&mut holder, request(&bearer, "", 500).as_bytes())
        .await
        .expect("write");
    let mut shed = 0;
    for _ in 0..100 {
        let (answer, second) =
            refuse_then_reuse(&small, &request(&bearer, "", body.len()), sent, rest, &next).await;
        if answer.starts_with("http/1.1 503") {
            shed += 1;
            // Still full: the next request on the connection is answered (shed again).
            if let Some(second) = second {
                assert!(second.starts_with("HTTP/1.1 503"), "{second:?}");
            }
            if shed == 5 {
                break;
            }
        } else {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    assert_eq!(shed, 5, "requests are shed while the only place is held");
}

#[tokio::test]
async fn legacy_requests_whose_mcp_headers_contradict_the_body_are_refused() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let send = |headers: Vec<(&'static str, &'static str)>, body: Value| {
        let mut request = stack
            .http
            .post(format!("{}/mcp", stack.url))
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2025-11-25")
            .bearer_auth(&token)
            .json(&body);
        for (k, v) in headers {
            request = request.header(k, v);
        }
        async move {
            let response = request.send().await.expect("send");
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let list = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {}});
    let call = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "find_customers", "arguments": {}}});
    // Headers that agree, or none at all, are served as the older revision serves them.
    assert_eq!(send(vec![], list.clone()).await.0, 200);
    assert_eq!(send(vec![("Mcp-Method", "tools/list")], list.clone()).await.0, 200);
    assert_eq!(
        send(vec![("Mcp-Method", "tools/call"), ("Mcp-Name", "find_customers")], call.clone())
            .await
            .0,
        200
    );
    // Headers an intermediary would route on, contradicting the body: refused.
    for (headers, body) in [
        (vec![("Mcp-Method", "tools/list")], call.clone()),
        (vec![("Mcp-Method", "tools/call"), ("Mcp-Name", "get_booking")], call.clone()),
        (vec![("Mcp-Name", "find_customers")], list.clone()),
        (vec![("Mcp-Method", "tools/list"), ("Mcp-Method", "tools/list")], list.clone()),
    ] {
        let (status, answer) = send(headers.clone(), body).await;
        assert_eq!(status, 400, "{headers:?}: {answer}");
        assert_eq!(answer["error"]["code"], -32020, "{answer}");
        assert!(answer["id"].is_number(), "{answer}");
    }
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_disconnected_and_others_are_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stack = Stack::start().await;
    let addr = stack.url.trim_start_matches("http://").to_owned();
    // A slowloris client: the request line and one header, then nothing more.
    let mut slow = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    slow.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1").await.expect("write");
    // An idle keep-alive connection that never starts a request is closed the same way.
    let mut idle = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    // Meanwhile the worker serves everyone else.
    let (status, _, answer) =
        stack.raw(Some(&stack.token(0, 0)), "tools/list", None, json!({}), &[]).await;
    assert_eq!(status, 200, "{answer}");
    // The bound is 2 s here; waiting up to 60 s keeps the test about closing, not about speed.
    for (what, stream) in [("half-sent headers", &mut slow), ("no request", &mut idle)] {
        let mut buf = Vec::new();
        let read =
            tokio::time::timeout(std::time::Duration::from_secs(60), stream.read_to_end(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("{what}: the worker kept the connection open"));
        // Closed, possibly after a 408; never a served request.
        let text = String::from_utf8_lossy(&buf);
        assert!(
            read.is_err() || buf.is_empty() || text.starts_with("HTTP/1.1 408"),
            "{what}: {text}"
        );
    }
}
