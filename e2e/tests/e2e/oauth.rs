//! OAuth 2.1 with a real client: connecting with nothing but the MCP URL, step-up challenges for
//! a right the person can grant, and hostile requests refused.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oauth_client_connects_with_nothing_but_the_mcp_url() {
    let stack = Stack::start(Options::for_test("oauth", 2)).await.expect("stack");
    let granted = oauth_flow::connect(&stack, &["bookings:read", "bookings:notify"]).await;
    assert!(granted.access.starts_with("gh_mcp_"));
    // The narrowed rights hold through the load balancer.
    let (status, names) = tool_names(&stack.lb_url, &granted.access).await;
    assert_eq!(status, 200);
    assert!(
        names.contains(&"confirm_booking".to_owned()) && names.contains(&"get_booking".to_owned()),
        "{names:?}"
    );
    assert!(!names.contains(&"find_customers".to_owned()), "narrowed at consent: {names:?}");
    // A role removed between two calls: the next call, on the other worker, is cut.
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let email = stack.tenant(0)["admin"]["email"].as_str().expect("email").to_owned();
    assert!(
        tool_names(&stack.worker_urls[0], &granted.access)
            .await
            .1
            .contains(&"confirm_booking".to_owned())
    );
    // Another admin first: the tenant's last admin can be neither demoted nor deactivated.
    stack.add_second_admin(&slug).expect("second admin");
    stack
        .ctl(&["person", "set-role", "--tenant", &slug, "--email", &email, "--role", "viewer"])
        .expect("demote");
    let (_, after) = tool_names(&stack.worker_urls[1], &granted.access).await;
    assert!(
        !after.contains(&"confirm_booking".to_owned()) && after.contains(&"get_booking".to_owned()),
        "{after:?}"
    );
    stack
        .ctl(&["person", "set-role", "--tenant", &slug, "--email", &email, "--role", "admin"])
        .expect("restore");
    // Refresh rotates; the old refresh token used again revokes the whole connection.
    let rotated =
        oauth_flow::refresh(&stack, &granted.client_id, &granted.refresh).await.expect("refresh");
    assert_ne!(rotated.refresh, granted.refresh);
    assert_eq!(tool_names(&stack.lb_url, &rotated.access).await.0, 200);
    let reuse =
        oauth_flow::refresh(&stack, &granted.client_id, &granted.refresh).await.expect_err("reuse");
    assert!(reuse.contains("invalid_grant"), "{reuse}");
    assert_eq!(
        tool_names(&stack.lb_url, &rotated.access).await.0,
        401,
        "reuse detection revoked the connection"
    );
    assert!(oauth_flow::refresh(&stack, &granted.client_id, &rotated.refresh).await.is_err());
    // RFC 7009 revocation of a fresh grant's refresh token ends it.
    let second = oauth_flow::connect(&stack, &["bookings:read"]).await;
    assert_eq!(tool_names(&stack.lb_url, &second.access).await.0, 200);
    let revoked = reqwest::Client::new()
        .post(format!("{}/oauth/revoke", stack.control_url))
        .form(&[("token", second.refresh.as_str())])
        .send()
        .await
        .expect("revoke");
    assert_eq!(revoked.status(), 200);
    assert_eq!(tool_names(&stack.lb_url, &second.access).await.0, 401);
}

/// A tool call as a raw client sends it: the HTTP status, `WWW-Authenticate`, and the body.
async fn raw_tool_call(base: &str, token: &str, tool: &str, args: Value) -> (u16, String, Value) {
    let response = e2e::mcp_request(
        base,
        token,
        "tools/call",
        Some(tool),
        json!({"name": tool, "arguments": args}),
    )
    .await;
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().expect("ascii").to_owned())
        .unwrap_or_default();
    (status, challenge, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oauth_client_is_challenged_for_a_right_its_person_can_grant() {
    let stack = Stack::start(Options::for_test("stepup", 2)).await.expect("stack");
    let granted = oauth_flow::connect(&stack, &["bookings:read"]).await;
    let find = json!({"query": "a"});
    // The person holds customers:read, the token does not: HTTP 403 with a scope challenge
    // naming what the connection holds plus what the tool needs (MCP 2026-07-28 step-up).
    let (status, challenge, body) =
        raw_tool_call(&stack.lb_url, &granted.access, "find_customers", find.clone()).await;
    assert_eq!(status, 403, "{body}");
    assert!(challenge.starts_with("Bearer error=\"insufficient_scope\""), "{challenge}");
    assert!(challenge.contains("scope=\"customers:read bookings:read\""), "{challenge}");
    assert!(
        challenge.contains(&format!(
            "resource_metadata=\"{}/.well-known/oauth-protected-resource\"",
            stack.lb_url
        )),
        "{challenge}"
    );
    assert_eq!(body["error"], "insufficient_scope");
    // A right the person lacks too is no step-up: the tool error names it, as for static tokens.
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let email = stack.tenant(0)["admin"]["email"].as_str().expect("email").to_owned();
    // Another admin first: the tenant's last admin can be neither demoted nor deactivated.
    stack.add_second_admin(&slug).expect("second admin");
    stack
        .ctl(&["person", "set-role", "--tenant", &slug, "--email", &email, "--role", "viewer"])
        .expect("demote");
    let create = json!({"name": "Step Up", "email": "step.up@example.com"});
    let (status, _, body) =
        raw_tool_call(&stack.lb_url, &granted.access, "create_customer", create.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["isError"], true);
    let text = body["result"]["content"][0]["text"].as_str().expect("text");
    assert!(text.starts_with("Error:") && text.contains("customers:write"), "{text}");
    stack
        .ctl(&["person", "set-role", "--tenant", &slug, "--email", &email, "--role", "admin"])
        .expect("restore");
    // A static token lacking a right keeps the tool error (nobody can be asked for more).
    let read_only = stack.token(0, 1);
    let (status, challenge, body) =
        raw_tool_call(&stack.lb_url, &read_only, "create_customer", create).await;
    assert_eq!((status, challenge.as_str()), (200, ""), "{body}");
    assert_eq!(body["result"]["isError"], true);
    // The client asks again for the challenged scope: the consent screen marks what is added,
    // and the new token calls the tool.
    let scope = challenge_scope(
        &raw_tool_call(&stack.lb_url, &granted.access, "find_customers", find.clone()).await.1,
    );
    let stepped = oauth_flow::connect_as(
        &stack,
        &scope.split(' ').collect::<Vec<_>>(),
        Some(&scope),
        Some(&granted.client_id),
    )
    .await;
    assert!(stepped.consent.contains("now also asks for"), "the consent says what is added");
    let added = stepped.consent.split("value=\"customers:read\"").nth(1).expect("box");
    assert!(added[..added.find("</label>").expect("label")].contains("new"), "marked new");
    let (status, _, body) =
        raw_tool_call(&stack.lb_url, &stepped.access, "find_customers", find).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["isError"], false, "{body}");
}

fn challenge_scope(challenge: &str) -> String {
    challenge.split("scope=\"").nth(1).and_then(|s| s.split('"').next()).expect("scope").to_owned()
}

#[tokio::test]
async fn hostile_oauth_requests_are_refused() {
    let stack = Stack::start(Options::for_test("oauth_hostile", 1)).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let mcp = format!("{}/mcp", stack.lb_url);
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let reg: Value = http
        .post(format!("{}/oauth/register", stack.control_url))
        .json(&json!({"redirect_uris": ["http://127.0.0.1:47615/callback"], "client_name": "hostile"}))
        .send()
        .await
        .expect("register")
        .json()
        .await
        .expect("json");
    let client_id = reg["client_id"].as_str().expect("id").to_owned();
    let bad = http
        .post(format!("{}/oauth/register", stack.control_url))
        .json(&json!({"redirect_uris": ["http://evil.example/cb"]}))
        .send()
        .await
        .expect("register");
    assert_eq!(bad.status(), 400, "plain-http non-loopback redirect URIs are refused");
    // Sign in once; every hostile authorize request below runs with this session.
    let tenant = stack.tenant(0);
    let mut browser = oauth_flow::Browser::new();
    browser
        .sign_in(
            &stack.control_url,
            tenant["admin"]["email"].as_str().expect("e"),
            tenant["admin"]["password"].as_str().expect("p"),
            "/",
        )
        .await;
    let authorize = |params: &[(&str, &str)]| {
        let q = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(params).finish();
        format!("{}/oauth/authorize?{q}", stack.control_url)
    };
    let challenge = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";
    let base = [
        ("response_type", "code"),
        ("client_id", client_id.as_str()),
        ("redirect_uri", "http://127.0.0.1:47615/callback"),
        ("code_challenge", challenge),
        ("code_challenge_method", "S256"),
        ("resource", mcp.as_str()),
        ("state", "s"),
    ];
    fn with<'a>(base: &[(&'a str, &'a str)], k: &str, v: &'a str) -> Vec<(&'a str, &'a str)> {
        base.iter().map(|(a, b)| if *a == k { (*a, v) } else { (*a, *b) }).collect()
    }
    // Once the client and its loopback redirect URI are known, errors go back to the native
    // app with `state` and `iss` (RFC 6749 §4.1.2.1, RFC 9207).
    for (case, params, error) in [
        ("plain PKCE", with(&base, "code_challenge_method", "plain"), "invalid_request"),
        (
            "another audience",
            with(&base, "resource", "https://elsewhere.example/mcp"),
            "invalid_target",
        ),
        (
            "an unknown scope",
            [base.as_slice(), &[("scope", "bookings:read admin:all")]].concat(),
            "invalid_scope",
        ),
    ] {
        let response = browser.get(&authorize(&params)).await;
        assert_eq!(response.status(), 303, "{case}");
        let location =
            url::Url::parse(response.headers()["location"].to_str().expect("ascii")).expect("url");
        assert!(
            location.as_str().starts_with("http://127.0.0.1:47615/callback?"),
            "{case}: {location}"
        );
        let got: BTreeMap<String, String> = location.query_pairs().into_owned().collect();
        assert_eq!(got.get("error").map(String::as_str), Some(error), "{case}");
        assert_eq!(got.get("state").map(String::as_str), Some("s"), "{case}");
        assert!(got.contains_key("iss"), "{case}");
    }
    for (case, params) in [
        ("wrong redirect URI", with(&base, "redirect_uri", "http://127.0.0.1:47615/other")),
        (
            "metadata document on loopback",
            with(&base, "client_id", "https://127.0.0.1/client.json"),
        ),
        (
            "metadata document on the cloud metadata address",
            with(&base, "client_id", "https://169.254.169.254/latest/meta-data"),
        ),
    ] {
        let response = browser.get(&authorize(&params)).await;
        assert_eq!(response.status(), 400, "{case}");
        assert!(
            response.headers().get("location").is_none(),
            "{case}: errors are shown, never redirected"
        );
    }
    // A client anyone registered with an https redirect URI is not sent its errors before the
    // person decided anything: that would make this server an open redirector for whoever
    // registered it (RFC 9700 §4.11.2). The person sees the error here.
    let remote: Value = http
        .post(format!("{}/oauth/register", stack.control_url))
        .json(&json!({"client_name": "Remote", "redirect_uris": ["https://evil.example/landing"]}))
        .send()
        .await
        .expect("register")
        .json()
        .await
        .expect("json");
    let remote_id = remote["client_id"].as_str().expect("id");
    let remote_base =
        with(&with(&base, "client_id", remote_id), "redirect_uri", "https://evil.example/landing");
    for (case, params) in [
        ("an unknown response type", with(&remote_base, "response_type", "x")),
        ("plain PKCE", with(&remote_base, "code_challenge_method", "plain")),
        ("an unknown scope", [remote_base.as_slice(), &[("scope", "admin:all")]].concat()),
    ] {
        let response = browser.get(&authorize(&params)).await;
        assert_eq!(response.status(), 400, "{case}");
        assert!(response.headers().get("location").is_none(), "{case}: not redirected");
    }
    let private = browser
        .get(&authorize(&with(&base, "client_id", "https://127.0.0.1/client.json")))
        .await
        .text()
        .await
        .expect("text");
    assert!(private.contains("private, loopback or link-local"), "{private}");
    // A code: exchanged with a wrong verifier fails; reused after success revokes the grant.
    let consent = browser.get(&authorize(&base)).await.text().await.expect("consent");
    let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    let mut form = oauth_flow::hidden_fields(&consent);
    form.push(("right".into(), "bookings:read".into()));
    form.push(("decision".into(), "approve".into()));
    let approved =
        browser.post_form(&format!("{}/oauth/authorize", stack.control_url), &form).await;
    let location =
        url::Url::parse(approved.headers()["location"].to_str().expect("ascii")).expect("url");
    let code = location.query_pairs().find(|(k, _)| k == "code").expect("code").1.into_owned();
    let exchange = |code: &str, verifier: &str| {
        let form = [
            ("grant_type", "authorization_code"),
            ("code", code),
            ("client_id", client_id.as_str()),
            ("redirect_uri", "http://127.0.0.1:47615/callback"),
            ("code_verifier", verifier),
            ("resource", mcp.as_str()),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let http = http.clone();
        let url = format!("{}/oauth/token", stack.control_url);
        async move { http.post(url).form(&form).send().await.expect("token") }
    };
    let wrong = exchange(&code, "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXX").await;
    assert_eq!(wrong.status(), 400, "PKCE mismatch");
    let ok: Value = exchange(&code, verifier).await.json().await.expect("json");
    let access = ok["access_token"].as_str().expect("access").to_owned();
    assert_eq!(tool_names(&stack.lb_url, &access).await.0, 200);
    let reused = exchange(&code, verifier).await;
    assert_eq!(reused.status(), 400, "a reused code");
    assert_eq!(
        tool_names(&stack.lb_url, &access).await.0,
        401,
        "a reused code revokes what it granted"
    );
    // Expired and foreign-audience tokens are refused by the worker.
    let second = oauth_flow::connect(&stack, &["bookings:read"]).await;
    db.set_token_audience(&second.access, "https://elsewhere.example/mcp").await;
    assert_eq!(tool_names(&stack.lb_url, &second.access).await.0, 401, "another audience");
    let third = oauth_flow::connect(&stack, &["bookings:read"]).await;
    db.expire_token(&third.access).await;
    assert_eq!(tool_names(&stack.lb_url, &third.access).await.0, 401, "expired");
    // Credentials never cross: an MCP token at the console, a session cookie at /mcp.
    let console = reqwest::Client::new()
        .get(format!("{}/connections", stack.control_url))
        .bearer_auth(&third.refresh)
        .send()
        .await
        .expect("console");
    assert_eq!(console.status(), 401);
    let cookie_at_mcp = reqwest::Client::new()
        .post(format!("{}/mcp", stack.lb_url))
        .header("Cookie", "gh_session=gh_ses_whatever")
        .json(&json!({}))
        .send()
        .await
        .expect("mcp");
    assert_eq!(cookie_at_mcp.status(), 401);
}
