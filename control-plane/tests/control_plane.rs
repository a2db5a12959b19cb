//! The control plane against real Postgres: the REST API through HTTP, and `gatehousectl` as
//! the real binary.

use std::sync::Arc;

// The chart drawing is pure and has its unit tests beside it; the crate's library builds no
// test binary of its own, so they run here.
#[path = "../src/charts/mod.rs"]
mod charts;

use control_plane::{AppState, Metrics, app};
use serde_json::{Value, json};
use shared::services::demo;
use shared::testing::TestDb;

struct Api {
    _db: TestDb,
    url: String,
    seed: demo::DemoSeed,
    http: reqwest::Client,
}

impl Api {
    async fn start() -> Api {
        Api::start_with(Default::default()).await
    }

    /// With a fetch policy for client documents (development's lets loopback through).
    async fn start_with(fetch: shared::services::oauth::FetchPolicy) -> Api {
        let db = TestDb::new().await;
        let seed = demo::seed(&db.ds, None, "").await.expect("seed");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(AppState {
            ds: db.ds.clone(),
            public_url: url.clone(),
            metrics: Metrics::new(),
            mcp_resources: vec!["http://127.0.0.1:9/mcp".into()],
            fetch,
            trust_forwarded_for: true,
        });
        tokio::spawn(async move {
            axum::serve(
                listener,
                app(state).into_make_service_with_connect_info::<std::net::SocketAddr>(),
            )
            .await
            .expect("serve")
        });
        Api { _db: db, url, seed, http: reqwest::Client::new() }
    }

    async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        let mut request = self.http.get(format!("{}{path}", self.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

#[tokio::test]
async fn the_api_serves_its_tenant_through_the_shared_services() {
    let api = Api::start().await;
    let token = api.seed.tenants[0].api_token.clone();
    let (status, body) = api.get("/api/v1/bookings?limit=3", Some(&token)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["count"], 3);
    let booking = body["bookings"][0]["booking"].as_str().expect("handle").to_owned();
    let (status, one) = api.get(&format!("/api/v1/bookings/{booking}"), Some(&token)).await;
    assert_eq!(status, 200);
    assert!(one["notes"].is_array());
    let (status, customers) = api.get("/api/v1/customers?query=fischer", Some(&token)).await;
    assert_eq!(status, 200);
    assert_eq!(customers["count"], 1);
}

#[tokio::test]
async fn the_api_rejects_what_the_tools_reject() {
    let api = Api::start().await;
    let token = api.seed.tenants[0].api_token.clone();
    // Same parser as the tools (R2, R12): unknown fields named, with the allowed list.
    let (status, body) = api.get("/api/v1/bookings?tenant_id=harbor-plumbing", Some(&token)).await;
    assert_eq!(status, 422);
    assert_eq!(body["error"]["unknown"], json!(["tenant_id"]));
    assert!(body["error"]["allowed"].as_array().expect("allowed").contains(&json!("from")));
    let (status, body) =
        api.get("/api/v1/bookings?from=2026-03-29T02:30&zone=Europe/Berlin", Some(&token)).await;
    assert_eq!(status, 422);
    assert_eq!(body["error"]["options"].as_array().expect("options").len(), 2);
    let (status, _) = api.get("/api/v1/bookings?limit=0", Some(&token)).await;
    assert_eq!(status, 422);
}

#[tokio::test]
async fn another_tenants_handle_is_not_found() {
    let api = Api::start().await;
    let other = api.get("/api/v1/bookings?limit=1", Some(&api.seed.tenants[1].api_token)).await.1;
    let foreign = other["bookings"][0]["booking"].as_str().expect("handle").to_owned();
    let (status, body) =
        api.get(&format!("/api/v1/bookings/{foreign}"), Some(&api.seed.tenants[0].api_token)).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
}

#[tokio::test]
async fn mcp_tokens_and_strangers_get_401_naming_the_credential_wanted() {
    let api = Api::start().await;
    let mcp = api.seed.tenants[0].connections[0].token.clone();
    for path in ["/api/v1/bookings", "/api/v1/customers"] {
        let (status, body) = api.get(path, Some(&mcp)).await;
        assert_eq!(status, 401, "{path}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains("API token") && message.contains("MCP token"), "{message}");
        let (status, _) = api.get(path, None).await;
        assert_eq!(status, 401);
        let (status, _) = api.get(path, Some("gh_api_unknownunknownunknownunknown00")).await;
        assert_eq!(status, 401);
    }
    let (status, _) = api.get("/readyz", None).await;
    assert_eq!(status, 200);
}

// ---------------------------------------------------------------- gatehousectl

/// The platform operator the CLI tests act as.
const OPS: &str = "ops@platform.example";

/// `gatehousectl` run by the operator `OPS`.
fn ctl(db: &TestDb, args: &[&str]) -> (bool, Value) {
    ctl_as(db, Some(OPS), args)
}

fn ctl_as(db: &TestDb, operator: Option<&str>, args: &[&str]) -> (bool, Value) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_gatehousectl"));
    command.args(args).arg("--json").env("DATABASE_URL", &db.url).env_remove("GATEHOUSE_OPERATOR");
    if let Some(email) = operator {
        command.env("GATEHOUSE_OPERATOR", email);
    }
    let out = command.output().expect("run gatehousectl");
    let value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(&out.stdout)}));
    (out.status.success(), value)
}

#[tokio::test]
async fn gatehousectl_manages_tenants_people_and_connections() {
    let db = TestDb::new().await;
    let (ok, migrated) = ctl_as(&db, None, &["migrate"]);
    assert!(ok, "{migrated}");
    assert_eq!(migrated["applied"], 0, "the template is migrated already");
    // A new install has no operator: the first one is granted without --as, and only once.
    let (ok, first) = ctl_as(&db, None, &["operator", "--email", OPS, "--name", "Olu Ops"]);
    assert!(ok, "{first}");
    let (ok, err) =
        ctl_as(&db, None, &["operator", "--email", "mallory@evil.example", "--name", "Mallory"]);
    assert!(!ok, "a second bootstrap is refused: {err}");
    assert_eq!(err["error"]["code"], "unauthenticated", "{err}");
    // Platform actions name who runs them: none, or a stranger, is refused before anything.
    for who in [None, Some("mallory@evil.example")] {
        let (ok, err) = ctl_as(
            &db,
            who,
            &["tenant", "create", "--slug", "evil", "--name", "Evil", "--zone", "UTC"],
        );
        assert!(!ok, "{who:?}: {err}");
        assert_eq!(err["error"]["code"], "unauthenticated", "{who:?}: {err}");
        assert!(err["error"]["message"].as_str().expect("m").contains("operator"), "{err}");
    }
    assert_eq!(db.scalar_i64("SELECT count(*) FROM tenants WHERE slug = 'evil'").await, 0);
    let (ok, t) = ctl(
        &db,
        &[
            "tenant",
            "create",
            "--slug",
            "acme-air",
            "--name",
            "Acme Air",
            "--zone",
            "Europe/Vienna",
        ],
    );
    assert!(ok, "{t}");
    // The audit names the operator who created the tenant.
    let by = db
        .scalar_string("SELECT p.email FROM audit_log a JOIN people p ON p.id = a.actor_id WHERE a.action = 'tenant.create'")
        .await;
    assert_eq!(by, OPS);
    let (ok, _) = ctl(
        &db,
        &[
            "person",
            "create",
            "--tenant",
            "acme-air",
            "--email",
            "lee@acme.example",
            "--name",
            "Lee",
            "--role",
            "dispatcher",
        ],
    );
    assert!(ok);
    // Adding someone already active would change their role unseen: refused, naming set-role.
    let (ok, err) = ctl(
        &db,
        &[
            "person",
            "create",
            "--tenant",
            "acme-air",
            "--email",
            "lee@acme.example",
            "--name",
            "Lee",
        ],
    );
    assert!(!ok, "{err}");
    assert_eq!(err["error"]["code"], "wrong_state", "{err}");
    assert!(err["error"]["message"].as_str().is_some_and(|m| m.contains("set-role")), "{err}");
    // A connection may not exceed its creator's rights.
    let (ok, err) = ctl(
        &db,
        &[
            "connection",
            "create",
            "--tenant",
            "acme-air",
            "--creator",
            "lee@acme.example",
            "--name",
            "bot",
            "--rights",
            "bookings:read,bookings:delete",
        ],
    );
    assert!(!ok);
    assert!(
        err["error"]["message"].as_str().expect("message").contains("bookings:delete"),
        "{err}"
    );
    let (ok, c) = ctl(
        &db,
        &[
            "connection",
            "create",
            "--tenant",
            "acme-air",
            "--creator",
            "lee@acme.example",
            "--name",
            "bot",
            "--rights",
            "bookings:read",
        ],
    );
    assert!(ok, "{c}");
    let token = c["token"].as_str().expect("token");
    assert!(token.starts_with("gh_mcp_"));
    let stored = db.scalar_i64(&format!("SELECT count(*) FROM connection_tokens WHERE token_hash = sha256(convert_to('{token}', 'UTF8'))")).await;
    assert_eq!(stored, 1, "only the hash is stored");
    let plain = db.scalar_i64(&format!("SELECT count(*) FROM connection_tokens WHERE encode(token_hash, 'escape') LIKE '%{token}%'")).await;
    assert_eq!(plain, 0);
    // The toolset asked for is the toolset the connection gets, and an unknown one is refused.
    let (ok, small) = ctl(
        &db,
        &[
            "connection",
            "create",
            "--tenant",
            "acme-air",
            "--creator",
            "lee@acme.example",
            "--name",
            "small bot",
            "--rights",
            "bookings:read",
            "--toolset",
            "small",
        ],
    );
    assert!(ok, "{small}");
    let toolset = db
        .scalar_string(&format!(
            "SELECT toolset FROM connections WHERE handle = '{}'",
            small["connection"].as_str().expect("handle")
        ))
        .await;
    assert_eq!(toolset, "small");
    let (ok, err) = ctl(
        &db,
        &[
            "connection",
            "create",
            "--tenant",
            "acme-air",
            "--creator",
            "lee@acme.example",
            "--name",
            "odd bot",
            "--rights",
            "bookings:read",
            "--toolset",
            "huge",
        ],
    );
    assert!(!ok, "{err}");
    assert_eq!(err["error"]["code"], "invalid_argument", "{err}");
    let (ok, api_token) = ctl(
        &db,
        &[
            "api-token",
            "create",
            "--tenant",
            "acme-air",
            "--person",
            "lee@acme.example",
            "--name",
            "lee's export",
            "--expires-in-days",
            "30",
        ],
    );
    assert!(ok, "{api_token}");
    let (ok, d) =
        ctl(&db, &["person", "deactivate", "--tenant", "acme-air", "--email", "lee@acme.example"]);
    assert!(ok);
    assert_eq!(d["revoked_api_tokens"], json!([api_token["api_token"]]), "{d}");
    // Their API tokens end with the membership, so coming back later does not revive them.
    let live_api_tokens = db
        .scalar_i64("SELECT count(*) FROM api_tokens a JOIN people p ON p.id = a.person_id WHERE p.email = 'lee@acme.example' AND a.revoked_at IS NULL")
        .await;
    assert_eq!(live_api_tokens, 0, "{api_token}");
    // A role change never brings a deactivated person back.
    let (ok, err) = ctl(
        &db,
        &[
            "person",
            "set-role",
            "--tenant",
            "acme-air",
            "--email",
            "lee@acme.example",
            "--role",
            "admin",
        ],
    );
    assert!(!ok, "{err}");
    assert_eq!(err["error"]["code"], "wrong_state", "{err}");
    let active = db
        .scalar_string("SELECT m.active::text FROM memberships m JOIN people p ON p.id = m.person_id WHERE p.email = 'lee@acme.example'")
        .await;
    assert_eq!(active, "false");
    // No new credential for them either: it would wake if they were added again.
    let (ok, err) = ctl(
        &db,
        &[
            "api-token",
            "create",
            "--tenant",
            "acme-air",
            "--person",
            "lee@acme.example",
            "--name",
            "dormant",
        ],
    );
    assert!(!ok, "{err}");
    assert_eq!(err["error"]["code"], "wrong_state", "{err}");
    // Adding them again keeps their account's password; giving one is refused, not ignored.
    let (ok, err) = ctl(
        &db,
        &[
            "person",
            "create",
            "--tenant",
            "acme-air",
            "--email",
            "lee@acme.example",
            "--name",
            "Lee",
            "--role",
            "dispatcher",
            "--password",
            "a-brand-new-password",
        ],
    );
    assert!(!ok, "{err}");
    assert_eq!(err["error"]["code"], "invalid_argument", "{err}");
    assert!(
        err["error"]["message"].as_str().is_some_and(|m| m.contains("keeps its password")),
        "{err}"
    );
    let mut revoked: Vec<String> =
        serde_json::from_value(d["revoked_connections"].clone()).expect("list");
    revoked.sort();
    let mut created: Vec<String> =
        serde_json::from_value(json!([c["connection"], small["connection"]])).expect("list");
    created.sort();
    assert_eq!(revoked, created, "deactivating a person ends every connection they created");
    let (ok, list) = ctl(&db, &["connection", "list", "--tenant", "acme-air"]);
    assert!(ok);
    assert_eq!(list["connections"][0]["status"], "revoked");
    let (ok, err) = ctl(
        &db,
        &[
            "person",
            "set-role",
            "--tenant",
            "acme-air",
            "--email",
            "lee@acme.example",
            "--role",
            "owner",
        ],
    );
    assert!(!ok);
    assert!(
        err["error"]["fix"].as_str().expect("fix").contains("admin, dispatcher, viewer"),
        "{err}"
    );
    let audited = db.scalar_i64("SELECT count(*) FROM audit_log WHERE channel = 'cli'").await;
    assert!(audited >= 4, "every CLI write is audited ({audited})");
    let (ok, op) = ctl(&db, &["operator", "--email", "lee@acme.example"]);
    assert!(ok, "{op}");
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM people WHERE email = 'lee@acme.example' AND is_operator"
        )
        .await,
        1
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM audit_log WHERE action = 'operator.grant' AND tenant_id IS NULL"
        )
        .await,
        1
    );
    let (ok, _) = ctl(&db, &["operator", "--email", "lee@acme.example", "--revoke"]);
    assert!(ok);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM people WHERE is_operator").await,
        1,
        "only the operator who ran the commands is left"
    );
    // The last operator cannot withdraw their own role and lock the platform out.
    let (ok, err) = ctl(&db, &["operator", "--email", OPS, "--revoke"]);
    assert!(!ok, "{err}");
    assert_eq!(db.scalar_i64("SELECT count(*) FROM people WHERE is_operator").await, 1);
}

#[tokio::test]
async fn demo_seed_prints_the_documented_shape() {
    let db = TestDb::new().await;
    let (ok, seed) = ctl_as(&db, None, &["demo", "seed"]);
    assert!(ok, "{seed}");
    // Once the platform has an operator, seeding (it creates tenants) needs one.
    let (ok, err) = ctl_as(&db, None, &["demo", "seed"]);
    assert!(!ok, "{err}");
    assert_eq!(err["error"]["code"], "unauthenticated", "{err}");
    let tenants = seed["tenants"].as_array().expect("tenants");
    assert_eq!(tenants.len(), 2);
    for t in tenants {
        assert!(
            t["slug"].is_string()
                && t["admin"]["email"].is_string()
                && t["admin"]["password"].is_string()
        );
        assert!(t["api_token"].as_str().expect("api").starts_with("gh_api_"));
        let connections = t["connections"].as_array().expect("connections");
        assert_eq!(connections.len(), 2);
        assert_eq!(
            connections[1]["rights"],
            json!(["customers:read", "technicians:read", "bookings:read"])
        );
        assert!(connections[0]["rights"].as_array().expect("rights").len() > 3);
    }
    let bookings = db
        .scalar_i64("SELECT min(n) FROM (SELECT count(*) AS n FROM bookings GROUP BY tenant_id) c")
        .await;
    assert!(bookings >= 12);
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_gatehousectl"))
        .args(["connection", "create", "--help"])
        .output()
        .expect("help");
    assert!(String::from_utf8_lossy(&help.stdout).contains("--rights"));
}

#[tokio::test]
async fn every_rest_refusal_is_a_json_error_saying_what_to_change() {
    let api = Api::start().await;
    let token = api.seed.tenants[0].api_token.clone();
    let url = |p: &str| format!("{}/api/v1{p}", api.url);
    let cases = [
        (
            "not JSON",
            api.http
                .post(url("/customers"))
                .header("content-type", "application/json")
                .body("{not json"),
            400,
        ),
        (
            "not sent as JSON",
            api.http.post(url("/customers")).header("content-type", "text/plain").body("{}"),
            415,
        ),
        ("a wrong method", api.http.delete(url("/customers")), 405),
        ("no such route", api.http.get(url("/technicians")), 404),
    ];
    for (case, request, status) in cases {
        let response = request.bearer_auth(&token).send().await.expect("request");
        assert_eq!(response.status().as_u16(), status, "{case}");
        if status == 405 {
            assert!(response.headers().contains_key("allow"), "{case}: the Allow header stays");
        }
        let body: Value = response.json().await.unwrap_or_else(|e| panic!("{case}: not JSON: {e}"));
        assert!(body["error"]["code"].is_string(), "{case}: {body}");
        assert!(body["error"]["fix"].as_str().is_some_and(|f| !f.is_empty()), "{case}: {body}");
    }
    // The services' refusals say what to change too.
    let create = |body: Value| {
        let (http, url, token) = (api.http.clone(), url("/customers"), token.clone());
        async move {
            let r = http.post(url).bearer_auth(token).json(&body).send().await.expect("post");
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, _) = create(json!({"name": "Fix Test", "email": "fix.test@example.net"})).await;
    assert_eq!(status, 201);
    for (case, body, status, says) in [
        (
            "a duplicate",
            json!({"name": "Fix Tester", "email": "fix.test@example.net"}),
            409,
            "separate",
        ),
        ("an unknown field", json!({"name": "Fix Test", "tenant_id": 1}), 422, "allowed"),
        ("a field in error", json!({"name": ""}), 422, "name"),
    ] {
        let (got, body) = create(body).await;
        assert_eq!(got, status, "{case}: {body}");
        assert!(body["error"]["fix"].as_str().is_some_and(|f| f.contains(says)), "{case}: {body}");
    }
    let anonymous = api.http.get(url("/customers")).send().await.expect("get");
    assert_eq!(anonymous.status().as_u16(), 401);
    let body: Value = anonymous.json().await.expect("json");
    assert!(body["error"]["fix"].as_str().is_some_and(|f| f.contains("Bearer")), "{body}");
}

#[tokio::test]
async fn names_and_reasons_from_the_cli_and_console_refuse_hidden_characters() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let cli = |args: &[&str]| ctl_as(&api._db, Some(&t0.admin.email), args);
    let slug = t0.slug.as_str();
    for (case, args) in [
        (
            "a connection name with a terminal escape",
            vec![
                "connection",
                "create",
                "--tenant",
                slug,
                "--creator",
                &t0.admin.email,
                "--name",
                "bot\u{1b}[31m",
                "--rights",
                "bookings:read",
            ],
        ),
        (
            "a person's name with a bidi override",
            vec![
                "person",
                "create",
                "--tenant",
                slug,
                "--email",
                "new.person@example.net",
                "--name",
                "Eve \u{202E}live",
                "--role",
                "viewer",
            ],
        ),
        (
            "an API token name with a tag character",
            vec![
                "api-token",
                "create",
                "--tenant",
                slug,
                "--person",
                &t0.admin.email,
                "--name",
                "export\u{E0041}",
            ],
        ),
        (
            "a kill-switch reason with a bidi override",
            vec!["kill-switch", "on", "--tenant", slug, "--reason", "drill \u{202E}"],
        ),
    ] {
        let (ok, err) = cli(&args);
        assert!(!ok, "{case}: {err}");
        assert_eq!(err["error"]["code"], "invalid_argument", "{case}: {err}");
    }
    let connection = t0.connections[1].connection.clone();
    let (ok, err) = cli(&[
        "connection",
        "revoke",
        "--tenant",
        slug,
        "--connection",
        &connection,
        "--reason",
        "lost \u{1b}[2J laptop",
    ]);
    assert!(!ok, "{err}");
    assert_eq!(err["error"]["code"], "invalid_argument", "{err}");
    let status = api
        ._db
        .scalar_string(&format!("SELECT status FROM connections WHERE handle = '{connection}'"))
        .await;
    assert_eq!(status, "active", "nothing was revoked");
    let agent_access = api
        ._db
        .scalar_string(&format!("SELECT agent_access::text FROM tenants WHERE slug = '{slug}'"))
        .await;
    assert_eq!(agent_access, "true", "the switch did not flip");
}

#[tokio::test]
async fn an_operator_resets_a_password_and_every_session_of_it_ends() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let dispatcher = Browser::sign_in(&api, &t0.dispatcher.email, &t0.dispatcher.password).await;
    // Only an operator: a caller who names none is refused.
    let (ok, err) = ctl_as(
        &api._db,
        None,
        &["password-reset", "--email", &t0.dispatcher.email, "--password", "a-new-long-password"],
    );
    assert!(!ok, "{err}");
    let (ok, err) = ctl_as(
        &api._db,
        Some(&t0.admin.email),
        &["password-reset", "--email", &t0.dispatcher.email, "--password", "short"],
    );
    assert!(!ok, "{err}");
    let (ok, err) = ctl_as(
        &api._db,
        Some(&t0.admin.email),
        &["password-reset", "--email", "nobody@example.net", "--password", "a-new-long-password"],
    );
    assert!(!ok, "{err}");
    assert_eq!(err["error"]["code"], "invalid_argument", "an unknown email: {err}");
    let (ok, out) = ctl_as(
        &api._db,
        Some(&t0.admin.email),
        &["password-reset", "--email", &t0.dispatcher.email, "--password", "a-new-long-password"],
    );
    assert!(ok, "{out}");
    assert_ne!(dispatcher.get("/tenants").await.status(), 200, "the old session ended");
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let login = |password: &'static str| {
        let (http, url, email) = (http.clone(), api.url.clone(), t0.dispatcher.email.clone());
        async move {
            post_login(
                &http,
                &url,
                "192.0.2.7",
                &[("email", &email), ("password", password), ("next", "/")],
            )
            .await
            .status()
            .as_u16()
        }
    };
    let old: &'static str = Box::leak(t0.dispatcher.password.clone().into_boxed_str());
    assert_ne!(login(old).await, 303, "the old password no longer signs in");
    assert_eq!(login("a-new-long-password").await, 303, "the new one does");
    let audited = api
        ._db
        .scalar_i64("SELECT count(*) FROM audit_log WHERE tenant_id IS NULL AND action = 'person.password_reset'")
        .await;
    assert_eq!(audited, 1);
}

#[tokio::test]
async fn a_viewer_is_told_their_role_has_no_console_pages() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let (ok, out) = ctl_as(
        &api._db,
        Some(&t0.admin.email),
        &[
            "person",
            "create",
            "--tenant",
            &t0.slug,
            "--email",
            "viewer@example.net",
            "--name",
            "Vera Viewer",
            "--role",
            "viewer",
            "--password",
            "a-viewer-password",
        ],
    );
    assert!(ok, "{out}");
    let viewer = Browser::sign_in(&api, "viewer@example.net", "a-viewer-password").await;
    let home = viewer.get("/").await;
    assert_eq!(home.status(), 200, "a page, not a bounce to the tenant picker");
    let html = home.text().await.expect("html");
    assert!(html.contains("no console pages") && html.contains("Vera Viewer"), "{html}");
}

#[tokio::test]
async fn deactivation_ends_every_console_session_of_the_person() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let dispatcher = Browser::sign_in(&api, &t0.dispatcher.email, &t0.dispatcher.password).await;
    assert_eq!(dispatcher.get("/tenants").await.status(), 200);
    let sessions = format!(
        "SELECT count(*) FROM console_sessions s JOIN people p ON p.id = s.person_id WHERE p.email = '{}'",
        t0.dispatcher.email
    );
    assert!(api._db.scalar_i64(&sessions).await >= 1);
    let (ok, out) = ctl_as(
        &api._db,
        Some(&t0.admin.email),
        &["person", "deactivate", "--tenant", &t0.slug, "--email", &t0.dispatcher.email],
    );
    assert!(ok, "{out}");
    assert_eq!(api._db.scalar_i64(&sessions).await, 0);
    assert_ne!(dispatcher.get("/tenants").await.status(), 200, "the cookie is dead");
}

#[tokio::test]
async fn a_rest_retry_with_its_key_executes_once() {
    let api = Api::start().await;
    let token = api.seed.tenants[0].api_token.clone();
    let found = api.get("/api/v1/bookings?limit=1", Some(&token)).await.1;
    let booking = found["bookings"][0]["booking"].as_str().expect("booking").to_owned();
    let post = |body: Value| {
        let (http, url, token) = (
            api.http.clone(),
            format!("{}/api/v1/bookings/{booking}/notes", api.url),
            token.clone(),
        );
        async move {
            let response =
                http.post(url).bearer_auth(token).json(&body).send().await.expect("post");
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let count = |text: &'static str| {
        let db = &api._db;
        async move {
            db.scalar_i64(&format!("SELECT count(*) FROM booking_notes WHERE body = '{text}'"))
                .await
        }
    };
    let (status, first) =
        post(json!({"text": "Gate code 4711", "idempotency_key": "rest-1"})).await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["replayed"], false, "{first}");
    // The integration's retry, and the same call without the key: answered, not executed.
    for again in [
        json!({"text": "Gate code 4711", "idempotency_key": "rest-1"}),
        json!({"text": "Gate code 4711"}),
    ] {
        let (status, body) = post(again.clone()).await;
        assert!(status == 200 || status == 201, "{again}: {status} {body}");
        assert_eq!(body["replayed"], true, "{again}: {body}");
    }
    assert_eq!(count("Gate code 4711").await, 1);
    // Another call under the same key is refused, not executed.
    let (status, body) = post(json!({"text": "Another note", "idempotency_key": "rest-1"})).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "idempotency_key", "{body}");
    assert_eq!(count("Another note").await, 0);
    // The path names the record: a body naming another one is refused, not overridden.
    let (status, body) =
        post(json!({"booking": "bkg_aaaaaaaaaaaaaaaa", "text": "Elsewhere"})).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "booking", "{body}");
    assert_eq!(count("Elsewhere").await, 0);
}

#[tokio::test]
async fn a_stale_version_through_the_api_conflicts() {
    let api = Api::start().await;
    let token = api.seed.tenants[0].api_token.clone();
    let http = &api.http;
    let found = api.get("/api/v1/customers?query=Richter", Some(&token)).await.1;
    let customer = found["customers"][0].clone();
    let url = format!("{}/api/v1/customers/{}", api.url, customer["customer"].as_str().expect("h"));
    let first = http
        .patch(&url)
        .bearer_auth(&token)
        .json(&json!({"version": customer["version"], "phone": "+49 30 5550777"}))
        .send()
        .await
        .expect("patch");
    assert_eq!(first.status(), 200);
    let stale = http
        .patch(&url)
        .bearer_auth(&token)
        .json(&json!({"version": customer["version"], "name": "E. Richter"}))
        .send()
        .await
        .expect("patch");
    assert_eq!(stale.status(), 409);
    let body: Value = stale.json().await.expect("json");
    assert_eq!(body["error"]["code"], "conflict");
    assert_eq!(body["error"]["current"]["phone"], "+49 30 5550777");
    let now = api
        .get(
            &format!("/api/v1/customers/{}", customer["customer"].as_str().expect("h")),
            Some(&token),
        )
        .await
        .1;
    assert_eq!(now["name"], "Emma Richter", "unchanged by the stale update");
    // API writes are audited with channel api and carry no connection.
    let audited = api._db.scalar_i64("SELECT count(*) FROM audit_log WHERE channel = 'api' AND action = 'update_customer' AND connection_id IS NULL").await;
    assert_eq!(audited, 1);
}

#[tokio::test]
async fn housekeeping_drops_what_outlived_its_use_and_keeps_the_rest() {
    let db = TestDb::new().await;
    demo::seed(&db.ds, None, "").await.expect("seed");
    db.exec(
        "INSERT INTO login_throttle (key, window_start, attempts) VALUES ('account:old@example.net', now() - interval '2 days', 3), ('account:new@example.net', now(), 1);
         INSERT INTO replay_entries (connection_id, tool, args_digest, result, created_at)
         SELECT id, 'add_booking_note', 'old', '{}', now() - interval '2 days' FROM connections LIMIT 1;
         INSERT INTO replay_entries (connection_id, tool, args_digest, result)
         SELECT id, 'add_booking_note', 'new', '{}' FROM connections LIMIT 1;
         INSERT INTO connection_tokens (connection_id, kind, token_hash, expires_at, used_at)
         SELECT id, 'refresh', sha256('expired-refresh'::bytea), now() - interval '2 days', now() - interval '3 days' FROM connections LIMIT 1;",
    )
    .await;
    let static_tokens =
        db.scalar_i64("SELECT count(*) FROM connection_tokens WHERE kind = 'static'").await;
    let removed = shared::services::housekeeping(&db.ds).await.expect("housekeeping");
    assert_eq!(removed, 3);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM connection_tokens").await,
        static_tokens,
        "static tokens never expire"
    );
    assert_eq!(db.scalar_i64("SELECT count(*) FROM login_throttle").await, 1);
    assert_eq!(
        db.scalar_string("SELECT string_agg(args_digest, ',') FROM replay_entries").await,
        "new"
    );
}

// ---------------------------------------------------------------- console and OAuth, as an attacker tries them

/// What a browser gets from the sign-in page: the CSRF cookie and the form's token.
async fn login_form(http: &reqwest::Client, base: &str) -> (String, String) {
    let page = http.get(format!("{base}/login")).send().await.expect("login page");
    let cookie = page.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .split(';')
        .next()
        .expect("pair")
        .to_owned();
    let html = page.text().await.expect("html");
    let token = html
        .split("name=\"login_csrf\" value=\"")
        .nth(1)
        .expect("token")
        .split('"')
        .next()
        .expect("end")
        .to_owned();
    (cookie, token)
}

/// Posts the sign-in form as a browser would, from `source`.
async fn post_login(
    http: &reqwest::Client,
    base: &str,
    source: &str,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    let (cookie, token) = login_form(http, base).await;
    let mut form: Vec<(&str, &str)> = fields.to_vec();
    form.push(("login_csrf", &token));
    http.post(format!("{base}/login"))
        .header("cookie", cookie)
        .header("x-forwarded-for", source)
        .form(&form)
        .send()
        .await
        .expect("login")
}

/// A browser of the console: one session cookie, no redirects followed.
struct Browser {
    http: reqwest::Client,
    base: String,
    cookie: String,
}

impl Browser {
    async fn sign_in(api: &Api, email: &str, password: &str) -> Browser {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        let response = post_login(
            &http,
            &api.url,
            "192.0.2.1",
            &[("email", email), ("password", password), ("next", "/")],
        )
        .await;
        assert_eq!(response.status(), 303, "signed in");
        let cookie = response.headers()["set-cookie"]
            .to_str()
            .expect("ascii")
            .split(';')
            .next()
            .expect("cookie")
            .to_owned();
        Browser { http, base: api.url.clone(), cookie }
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .send()
            .await
            .expect("get")
    }

    async fn post(&self, path: &str, form: &[(String, String)]) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .form(form)
            .send()
            .await
            .expect("post")
    }
}

/// The hidden inputs of the form posting to `action`, as a browser submits them.
fn form_fields(html: &str, action: &str) -> Vec<(String, String)> {
    let start = html.find(&format!("action=\"{action}\"")).expect("the form");
    let form = &html[start..start + html[start..].find("</form>").expect("closed")];
    form.split("<input type=\"hidden\" ")
        .skip(1)
        .filter_map(|c| {
            Some((
                c.split("name=\"").nth(1)?.split('"').next()?.to_owned(),
                c.split("value=\"").nth(1)?.split('"').next()?.replace("&amp;", "&"),
            ))
        })
        .collect()
}

async fn register_client(api: &Api) -> String {
    let registered: Value = api
        .http
        .post(format!("{}/oauth/register", api.url))
        .json(&json!({"client_name": "Hostile client", "redirect_uris": ["http://127.0.0.1:47615/callback"]}))
        .send()
        .await
        .expect("register")
        .json()
        .await
        .expect("json");
    registered["client_id"].as_str().expect("client_id").to_owned()
}

fn authorize_path(client_id: &str, extra: &[(&str, &str)]) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    q.extend_pairs([
        ("response_type", "code"),
        ("client_id", client_id),
        ("redirect_uri", "http://127.0.0.1:47615/callback"),
        ("code_challenge", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"),
        ("code_challenge_method", "S256"),
        ("resource", "http://127.0.0.1:9/mcp"),
        ("state", "s1"),
        ("scope", "bookings:read"),
    ]);
    q.extend_pairs(extra.iter().copied());
    format!("/oauth/authorize?{}", q.finish())
}

#[tokio::test]
async fn consent_grants_exactly_what_the_person_approved() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let client_id = register_client(&api).await;
    // A client that smuggles rights and form fields into its authorize URL.
    let smuggled = authorize_path(
        &client_id,
        &[
            ("right", "bookings:delete"),
            ("right", "customers:delete"),
            ("decision", "approve"),
            ("request", "areq_forged"),
        ],
    );
    let consent = browser.get(&smuggled).await;
    assert_eq!(consent.status(), 200);
    let html = consent.text().await.expect("html");
    assert!(html.contains(&admin.email), "the consent screen names who is signed in");
    assert!(html.contains("Sign out"), "with a way to switch account");
    assert!(
        html.contains("This application registered itself"),
        "a self-registered client's name is not vouched for"
    );
    let fields = form_fields(&html, "/oauth/authorize");
    let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        ["csrf", "request"],
        "the form carries the request's id and nothing of the request"
    );
    assert!(!html.contains("areq_forged"), "no request parameter is echoed");
    // Approve with only what the person ticked, plus whatever the attacker adds to the post.
    let mut form = fields.clone();
    form.push(("right".into(), "bookings:read".into()));
    form.push(("decision".into(), "approve".into()));
    let approved = browser.post("/oauth/authorize", &form).await;
    assert_eq!(approved.status(), 303, "{:?}", approved.text().await);
    let location =
        url::Url::parse(approved.headers()["location"].to_str().expect("ascii")).expect("url");
    let params: std::collections::BTreeMap<String, String> =
        location.query_pairs().into_owned().collect();
    assert!(params.contains_key("code") && params["state"] == "s1", "{location}");
    let rights = api
        ._db
        .scalar_string(&format!("SELECT array_to_string(rights, ',') FROM connections WHERE oauth_client_id = '{client_id}'"))
        .await;
    assert_eq!(rights, "bookings:read", "exactly what was ticked, nothing the URL smuggled");
    // The same request cannot be answered twice, nor by another session, nor without a decision.
    let again = browser.post("/oauth/authorize", &form).await;
    assert_eq!(again.status(), 400, "a consent request works once");
    let consent = browser.get(&authorize_path(&client_id, &[])).await.text().await.expect("html");
    let fields = form_fields(&consent, "/oauth/authorize");
    let dispatcher = &api.seed.tenants[0].dispatcher;
    let other = Browser::sign_in(&api, &dispatcher.email, &dispatcher.password).await;
    let other_html = other.get(&authorize_path(&client_id, &[])).await.text().await.expect("html");
    let mut stolen = form_fields(&other_html, "/oauth/authorize");
    stolen.retain(|(k, _)| k == "csrf");
    stolen.extend(fields.iter().filter(|(k, _)| k == "request").cloned());
    stolen.push(("right".into(), "bookings:read".into()));
    stolen.push(("decision".into(), "approve".into()));
    let response = other.post("/oauth/authorize", &stolen).await;
    assert_eq!(response.status(), 400, "another session's consent request is not found");
    let mut undecided = fields.clone();
    undecided.push(("right".into(), "bookings:read".into()));
    let response = browser.post("/oauth/authorize", &undecided).await;
    assert_eq!(response.status(), 422, "a missing decision grants nothing");
    let connections = api
        ._db
        .scalar_i64(&format!(
            "SELECT count(*) FROM connections WHERE oauth_client_id = '{client_id}'"
        ))
        .await;
    assert_eq!(connections, 1);
    // A consent screen shown for one tenant cannot be answered after switching to another.
    let consent = browser.get(&authorize_path(&client_id, &[])).await.text().await.expect("html");
    let mut pending = form_fields(&consent, "/oauth/authorize");
    let other_tenant = api
        ._db
        .scalar_i64(&format!("SELECT id FROM tenants WHERE slug = '{}'", api.seed.tenants[1].slug))
        .await;
    api._db
        .exec(&format!("INSERT INTO memberships (tenant_id, person_id, role) SELECT {other_tenant}, id, 'viewer' FROM people WHERE email = '{}'", admin.email))
        .await;
    api._db.exec(&format!("UPDATE console_sessions SET tenant_id = {other_tenant}")).await;
    pending.push(("right".into(), "bookings:read".into()));
    pending.push(("decision".into(), "approve".into()));
    let response = browser.post("/oauth/authorize", &pending).await;
    assert_eq!(response.status(), 400, "the tenant switched since the consent screen");
}

#[tokio::test]
async fn a_client_that_names_no_scope_gets_read_rights_ticked_and_a_new_consent_ends_old_tokens() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let client_id = register_client(&api).await;
    let path = authorize_path(&client_id, &[]).replace("&scope=bookings%3Aread", "");
    let html = browser.get(&path).await.text().await.expect("html");
    let ticked: Vec<&str> = html
        .split("name=\"right\" value=\"")
        .skip(1)
        .filter(|c| c.split('>').next().unwrap_or_default().contains("checked"))
        .map(|c| c.split('"').next().unwrap_or_default())
        .collect();
    assert!(
        !ticked.is_empty() && ticked.iter().all(|r| r.ends_with(":read")),
        "only read rights are ticked: {ticked:?}"
    );
    // Two consents in a row: the first grant's tokens end when the second is approved.
    let mut tokens = Vec::new();
    for right in ["bookings:read", "bookings:write"] {
        let html = browser.get(&authorize_path(&client_id, &[])).await.text().await.expect("html");
        let mut form = form_fields(&html, "/oauth/authorize");
        form.push(("right".into(), right.into()));
        form.push(("decision".into(), "approve".into()));
        let approved = browser.post("/oauth/authorize", &form).await;
        let location =
            url::Url::parse(approved.headers()["location"].to_str().expect("ascii")).expect("url");
        let code = location.query_pairs().find(|(k, _)| k == "code").expect("code").1.into_owned();
        let issued: Value = api
            .http
            .post(format!("{}/oauth/token", api.url))
            .form(&[
                ("grant_type", "authorization_code"),
                ("code", code.as_str()),
                ("client_id", client_id.as_str()),
                ("redirect_uri", "http://127.0.0.1:47615/callback"),
                ("code_verifier", "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            ])
            .send()
            .await
            .expect("token")
            .json()
            .await
            .expect("json");
        tokens.push(issued["access_token"].as_str().expect("access").to_owned());
    }
    let alive = |t: &str| {
        format!(
            "SELECT count(*) FROM connection_tokens WHERE token_hash = sha256(convert_to('{t}', 'UTF8'))"
        )
    };
    assert_eq!(api._db.scalar_i64(&alive(&tokens[0])).await, 0, "the earlier grant's token ended");
    assert_eq!(api._db.scalar_i64(&alive(&tokens[1])).await, 1);
}

#[tokio::test]
async fn a_code_never_outlives_the_consent_or_the_connection_it_came_from() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let client_id = register_client(&api).await;
    let consent = |right: &'static str| {
        let browser = &browser;
        let client_id = client_id.clone();
        async move {
            let html =
                browser.get(&authorize_path(&client_id, &[])).await.text().await.expect("html");
            let mut form = form_fields(&html, "/oauth/authorize");
            form.push(("right".into(), right.into()));
            form.push(("decision".into(), "approve".into()));
            let approved = browser.post("/oauth/authorize", &form).await;
            let location = url::Url::parse(approved.headers()["location"].to_str().expect("ascii"))
                .expect("url");
            location.query_pairs().find(|(k, _)| k == "code").expect("code").1.into_owned()
        }
    };
    let exchange = |code: String| {
        let (http, url, client_id) =
            (api.http.clone(), format!("{}/oauth/token", api.url), client_id.clone());
        async move {
            let response = http
                .post(url)
                .form(&[
                    ("grant_type", "authorization_code"),
                    ("code", code.as_str()),
                    ("client_id", client_id.as_str()),
                    ("redirect_uri", "http://127.0.0.1:47615/callback"),
                    ("code_verifier", "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
                ])
                .send()
                .await
                .expect("token");
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // A wider consent's code, not yet exchanged, ends when the person consents again narrower.
    let wide = consent("bookings:write").await;
    let narrow = consent("bookings:read").await;
    let (status, body) = exchange(wide).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_grant")), "{body}");
    let (status, body) = exchange(narrow).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["scope"], "bookings:read");
    // A code approved before the connection was revoked issues nothing.
    let late = consent("bookings:read").await;
    let connection = api
        ._db
        .scalar_string(&format!(
            "SELECT handle FROM connections WHERE oauth_client_id = '{client_id}'"
        ))
        .await;
    let slug = api.seed.tenants[0].slug.clone();
    let (ok, revoked) = ctl_as(
        &api._db,
        Some(&admin.email),
        &[
            "connection",
            "revoke",
            "--tenant",
            &slug,
            "--connection",
            &connection,
            "--reason",
            "lost laptop",
        ],
    );
    assert!(ok, "{revoked}");
    let (status, body) = exchange(late).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_grant")), "{body}");
    assert!(body["error_description"].as_str().is_some_and(|d| d.contains("revoked")), "{body}");
    let live = api
        ._db
        .scalar_i64(&format!("SELECT count(*) FROM connection_tokens t JOIN connections c ON c.id = t.connection_id WHERE c.handle = '{connection}'"))
        .await;
    assert_eq!(live, 0, "no token exists for the revoked connection");
}

#[tokio::test]
async fn a_deactivation_page_exists_only_for_a_person_of_the_tenant() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let stranger = api.seed.tenants[1].admin.email.clone();
    for email in [stranger.as_str(), "nobody@example.net", "\"><script>x</script>"] {
        let q: String = url::form_urlencoded::byte_serialize(email.as_bytes()).collect();
        let response = browser.get(&format!("/people/deactivate?email={q}")).await;
        assert_eq!(response.status(), 404, "{email}");
    }
    let member = &api.seed.tenants[0].dispatcher.email;
    assert_eq!(browser.get(&format!("/people/deactivate?email={member}")).await.status(), 200);
}

#[tokio::test]
async fn registration_parses_redirect_uris_and_caps_what_it_stores() {
    let api = Api::start().await;
    let register = |body: Value| {
        let http = api.http.clone();
        let url = format!("{}/oauth/register", api.url);
        async move { http.post(url).json(&body).send().await.expect("register") }
    };
    let long = format!("https://app.example.com/{}", "a".repeat(3000));
    let many: Vec<String> = (0..11).map(|i| format!("https://app.example.com/cb{i}")).collect();
    for (case, uris) in [
        ("not a URL", json!(["::::"])),
        ("userinfo", json!(["https://user:pw@app.example.com/cb"])),
        ("fragment", json!(["https://app.example.com/cb#x"])),
        ("plain http elsewhere", json!(["http://app.example.com/cb"])),
        ("loopback look-alike", json!(["http://127.0.0.1.evil.example/cb"])),
        ("too long", json!([long])),
        ("too many", json!(many)),
        ("none", json!([])),
    ] {
        let response = register(json!({"client_name": "x", "redirect_uris": uris})).await;
        assert_eq!(response.status(), 400, "{case}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["error"], "invalid_redirect_uri", "{case}: {body}");
    }
    assert_eq!(api._db.scalar_i64("SELECT count(*) FROM oauth_clients").await, 0, "nothing stored");
    let ok = register(json!({"client_name": format!("  Claude\u{202E}\u{0007} {}", "n".repeat(200)), "redirect_uris": ["http://[::1]/cb", "http://127.0.0.1/cb"]})).await;
    assert_eq!(ok.status(), 201);
    let body: Value = ok.json().await.expect("json");
    let name = body["client_name"].as_str().expect("name");
    assert!(
        name.starts_with("Claude ")
            && name.chars().count() <= 80
            && !name.chars().any(char::is_control),
        "{name:?}"
    );
    // A loopback client may come back on any port, never on another path.
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let client_id = body["client_id"].as_str().expect("id");
    let path = |redirect: &str| {
        let q = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs([
                ("response_type", "code"),
                ("client_id", client_id),
                ("redirect_uri", redirect),
                ("code_challenge", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"),
                ("code_challenge_method", "S256"),
                ("resource", "http://127.0.0.1:9/mcp"),
            ])
            .finish();
        format!("/oauth/authorize?{q}")
    };
    assert_eq!(browser.get(&path("http://127.0.0.1:53117/cb")).await.status(), 200);
    assert_eq!(browser.get(&path("http://127.0.0.1:53117/other")).await.status(), 400);
}

#[tokio::test]
async fn sign_in_throttles_atomically_per_account_and_source() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let attempt = |password: String, source: &'static str| {
        let (http, base, email) = (http.clone(), api.url.clone(), admin.email.clone());
        async move {
            let response = post_login(
                &http,
                &base,
                source,
                &[("email", email.as_str()), ("password", password.as_str()), ("next", "/")],
            )
            .await;
            (response.status().as_u16(), response.text().await.unwrap_or_default())
        }
    };
    // Twenty wrong passwords at once from one address: exactly five are even checked.
    let tries = (0..20).map(|i| attempt(format!("wrong-password-{i}"), "203.0.113.7"));
    let outcomes = futures_util::future::join_all(tries).await;
    let checked = outcomes.iter().filter(|(_, body)| body.contains("wrong")).count();
    let throttled = outcomes.iter().filter(|(_, body)| body.contains("Too many")).count();
    assert_eq!((checked, throttled), (5, 15), "the count is taken atomically");
    // The right password from that address is refused too; from the person's own it works.
    let (status, _) = attempt(admin.password.clone(), "203.0.113.7").await;
    assert_eq!(status, 401, "the guessing address stays locked out");
    let (status, _) = attempt(admin.password.clone(), "198.51.100.20").await;
    assert_eq!(status, 303, "the person, elsewhere, is not locked out");
    // A refused source cannot push the account to its ceiling: sixty more from that address
    // leave the person able to sign in from elsewhere.
    let more = (0..60).map(|i| attempt(format!("again-{i}"), "203.0.113.7"));
    futures_util::future::join_all(more).await;
    let (status, _) = attempt(admin.password.clone(), "198.51.100.30").await;
    assert_eq!(status, 303, "the ceiling counts only attempts that were checked");
    // Overlong input is refused before any work.
    let (status, _) = attempt("p".repeat(5000), "198.51.100.21").await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn console_routes_cannot_be_turned_against_themselves() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    // Post-sign-in targets stay on the console, however a browser would resolve them.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    for (next, lands) in [
        ("//evil.example/x", "/"),
        ("/\\evil.example/x", "/"),
        ("/\t/evil.example/x", "/"),
        ("https://evil.example/x", "/"),
        ("javascript:alert(1)", "/"),
        ("/connections?tab=all", "/connections?tab=all"),
        ("/a/../audit", "/audit"),
        ("/.//console.invalid//evil.example", "/"),
        ("//console.invalid//evil.example", "/"),
        ("/.//evil.example", "/"),
    ] {
        let fields = [
            ("email", admin.email.as_str()),
            ("password", admin.password.as_str()),
            ("next", next),
        ];
        let response = post_login(&http, &api.url, "192.0.2.50", &fields).await;
        assert_eq!(response.status(), 303, "{next:?}");
        assert_eq!(response.headers()["location"], lands, "{next:?}");
    }
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    // A path segment that is not a connection of this tenant has no confirmation page.
    let other_tenant = &api.seed.tenants[1].connections[0].connection;
    for path in [
        "/connections/..%2F..%2Fpeople%2Frole/revoke".to_owned(),
        "/connections/con_aaaaaaaaaaaaaaaa/revoke".to_owned(),
        format!("/connections/{other_tenant}/revoke"),
        "/connections/%22%3E%3Cscript%3E/revoke".to_owned(),
    ] {
        let response = browser.get(&path).await;
        assert_eq!(response.status(), 404, "{path}");
        assert!(
            !response.text().await.unwrap_or_default().contains("action=\"/connections/.."),
            "{path}"
        );
    }
    let mine = &api.seed.tenants[0].connections[0].connection;
    let page =
        browser.get(&format!("/connections/{mine}/revoke")).await.text().await.expect("html");
    assert!(page.contains(&format!("action=\"/connections/{mine}/revoke\"")), "{page}");
    // A switch form must name its direction; nothing changes otherwise.
    let settings = browser.get("/settings").await.text().await.expect("html");
    let csrf = form_fields(&settings, "/settings/agent-access")
        .into_iter()
        .find(|(k, _)| k == "csrf")
        .expect("csrf")
        .1;
    for to in [None, Some("sideways"), Some("")] {
        let mut form =
            vec![("csrf".to_owned(), csrf.clone()), ("reason".to_owned(), "test".to_owned())];
        if let Some(to) = to {
            form.push(("to".into(), to.into()));
        }
        let response = browser.post("/settings/agent-access", &form).await;
        assert_eq!(response.status(), 422, "{to:?}");
    }
    let on = api
        ._db
        .scalar_string(&format!(
            "SELECT agent_access::text FROM tenants WHERE slug = '{}'",
            api.seed.tenants[0].slug
        ))
        .await;
    assert_eq!(on, "true", "agent access unchanged");
    let operator = browser.get("/operator").await.text().await.expect("html");
    let csrf = form_fields(&operator, "/operator/kill-switch")
        .into_iter()
        .find(|(k, _)| k == "csrf")
        .expect("csrf")
        .1;
    let response = browser
        .post("/operator/kill-switch", &[("csrf".into(), csrf), ("reason".into(), "test".into())])
        .await;
    assert_eq!(response.status(), 422, "the global switch needs a direction too");
    assert_eq!(
        api._db.scalar_string("SELECT global_kill::text FROM platform_state").await,
        "false"
    );
}

#[tokio::test]
async fn every_console_and_oauth_response_carries_the_security_headers() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let client_id = register_client(&api).await;
    let mut responses = vec![
        ("sign-in page", browser.http.get(format!("{}/login", api.url)).send().await.expect("get")),
        ("connections", browser.get("/connections").await),
        ("consent", browser.get(&authorize_path(&client_id, &[])).await),
        ("a missing page", browser.get("/connections/con_aaaaaaaaaaaaaaaa").await),
        (
            "metadata",
            api.http
                .get(format!("{}/.well-known/oauth-authorization-server", api.url))
                .send()
                .await
                .expect("get"),
        ),
        (
            "token error",
            api.http
                .post(format!("{}/oauth/token", api.url))
                .form(&[("grant_type", "password")])
                .send()
                .await
                .expect("post"),
        ),
    ];
    responses.push((
        "registration",
        api.http
            .post(format!("{}/oauth/register", api.url))
            .json(&json!({"redirect_uris": []}))
            .send()
            .await
            .expect("post"),
    ));
    for (what, r) in &responses {
        let h = r.headers();
        let csp =
            h.get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(
            csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"),
            "{what}: {csp}"
        );
        assert_eq!(h.get("x-frame-options").map(|v| v.as_bytes()), Some(&b"DENY"[..]), "{what}");
        assert_eq!(
            h.get("x-content-type-options").map(|v| v.as_bytes()),
            Some(&b"nosniff"[..]),
            "{what}"
        );
        assert!(h.contains_key("referrer-policy"), "{what}");
        assert_eq!(h.get("cache-control").map(|v| v.as_bytes()), Some(&b"no-store"[..]), "{what}");
    }
    // No inline script is needed: the page's only script is the console's own file.
    let page = browser.get("/connections").await.text().await.expect("html");
    assert!(!page.contains("onclick") && !page.contains("<script>"), "no inline script");
    let js = browser.get("/static/console.js").await;
    assert_eq!(js.status(), 200);
}

#[tokio::test]
async fn the_sign_in_form_needs_its_own_token() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let fields =
        [("email", admin.email.as_str()), ("password", admin.password.as_str()), ("next", "/")];
    // Another site posting the form: no cookie, a cookie without the field, a mismatch.
    let (cookie, token) = login_form(&http, &api.url).await;
    for (case, with_cookie, field) in [
        ("no cookie", false, Some(token.as_str())),
        ("no field", true, None),
        ("wrong field", true, Some("forged")),
    ] {
        let mut form: Vec<(&str, &str)> = fields.to_vec();
        if let Some(f) = field {
            form.push(("login_csrf", f));
        }
        let mut request = http.post(format!("{}/login", api.url)).form(&form);
        if with_cookie {
            request = request.header("cookie", &cookie);
        }
        let response = request.send().await.expect("login");
        assert_eq!(response.status(), 403, "{case}");
        assert!(
            response
                .headers()
                .get_all("set-cookie")
                .iter()
                .all(|c| !c.to_str().unwrap_or_default().starts_with("gh_session=")),
            "{case}: no session"
        );
    }
    let response = post_login(&http, &api.url, "192.0.2.9", &fields).await;
    assert_eq!(response.status(), 303);
}

// ---------------------------------------------------------------- API tokens

/// The `<pre id="token">` secret a page shows once.
fn shown_token(html: &str) -> String {
    html.split("<pre id=\"token\">")
        .nth(1)
        .and_then(|t| t.split('<').next())
        .expect("a token")
        .to_owned()
}

#[tokio::test]
async fn api_tokens_expire_and_are_revoked_from_the_cli_and_the_console() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    // The demo seed made the first tenant's admin the platform's operator.
    let cli = |args: &[&str]| ctl_as(&api._db, Some(&t0.admin.email), args);
    let slug = t0.slug.as_str();
    let (ok, created) = cli(&[
        "api-token",
        "create",
        "--tenant",
        slug,
        "--person",
        &t0.dispatcher.email,
        "--name",
        "Nightly export",
        "--expires-in-days",
        "30",
    ]);
    assert!(ok, "{created}");
    let token = created["token"].as_str().expect("token").to_owned();
    let handle = created["api_token"].as_str().expect("handle").to_owned();
    assert!(token.starts_with("gh_api_") && handle.starts_with("apt_"), "{created}");
    let expires: jiff::Timestamp = created["expires_at"].as_str().expect("at").parse().expect("ts");
    let days = (expires.as_second() - jiff::Timestamp::now().as_second()) / 86_400;
    assert!((29..=30).contains(&days), "expires in 30 days: {expires}");
    assert_eq!(api.get("/api/v1/bookings?limit=1", Some(&token)).await.0, 200);
    // Lifetimes and names out of range are refused and create nothing.
    for (flag, value) in [
        ("--expires-in-days", "0"),
        ("--expires-in-days", "366"),
        ("--name", " "),
        ("--name", &"n".repeat(81)),
    ] {
        let mut args =
            vec!["api-token", "create", "--tenant", slug, "--person", &t0.dispatcher.email];
        if flag == "--name" {
            args.extend([flag, value]);
        } else {
            args.extend(["--name", "Refused", flag, value]);
        }
        let (ok, err) = cli(&args);
        assert!(!ok && err["error"]["code"] == "invalid_argument", "{flag} {value:?}: {err}");
    }
    let (ok, err) = cli(&[
        "api-token",
        "create",
        "--tenant",
        slug,
        "--person",
        &api.seed.tenants[1].admin.email,
        "--name",
        "Stranger",
    ]);
    assert!(!ok && err["error"]["code"] == "not_found", "a person of another tenant: {err}");
    assert_eq!(
        api._db.scalar_i64("SELECT count(*) FROM api_tokens").await,
        3,
        "two demo tokens and one new"
    );
    // The list shows status and expiry, never a secret.
    let (ok, list) = cli(&["api-token", "list", "--tenant", slug]);
    assert!(ok, "{list}");
    assert!(!list.to_string().contains("gh_api_"), "no secret in the list: {list}");
    let row = list["api_tokens"]
        .as_array()
        .expect("list")
        .iter()
        .find(|t| t["api_token"] == handle.as_str())
        .expect("listed")
        .clone();
    assert_eq!(
        (row["status"].as_str(), row["person"].as_str()),
        (Some("active"), Some(t0.dispatcher.email.as_str()))
    );
    // Another tenant's token, or no token at all, is not found, and the other token still works.
    let foreign = api._db.scalar_string(&format!("SELECT a.handle FROM api_tokens a JOIN tenants t ON t.id = a.tenant_id WHERE t.slug = '{}'", api.seed.tenants[1].slug)).await;
    for other in [foreign.as_str(), "apt_nonexistentnonexistent00", "con_x", "../../x"] {
        let (ok, err) =
            cli(&["api-token", "revoke", "--tenant", slug, "--token", other, "--reason", "x"]);
        assert!(!ok && err["error"]["code"] == "not_found", "{other}: {err}");
    }
    assert_eq!(
        api.get("/api/v1/bookings?limit=1", Some(&api.seed.tenants[1].api_token)).await.0,
        200
    );
    // Revoked: refused from the next request on, audited once with its reason.
    let (ok, revoked) =
        cli(&["api-token", "revoke", "--tenant", slug, "--token", &handle, "--reason", "rotated"]);
    assert!(ok && revoked["revoked"] == true, "{revoked}");
    assert_eq!(api.get("/api/v1/bookings?limit=1", Some(&token)).await.0, 401);
    let (ok, again) =
        cli(&["api-token", "revoke", "--tenant", slug, "--token", &handle, "--reason", "again"]);
    assert!(ok && again["revoked"] == false, "{again}");
    assert_eq!(
        api._db.scalar_i64(&format!("SELECT count(*) FROM audit_log WHERE action = 'api_token.revoke' AND channel = 'cli' AND reason = 'rotated' AND '{handle}' = ANY(targets)")).await,
        1
    );
    // Past its expiry a token is refused, and the refusal says it expired.
    let (_, short) = cli(&[
        "api-token",
        "create",
        "--tenant",
        slug,
        "--person",
        &t0.admin.email,
        "--name",
        "Short",
        "--expires-in-days",
        "1",
    ]);
    let short_token = short["token"].as_str().expect("token").to_owned();
    assert_eq!(api.get("/api/v1/bookings?limit=1", Some(&short_token)).await.0, 200);
    api._db
        .exec(&format!(
            "UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE handle = '{}'",
            short["api_token"].as_str().expect("h")
        ))
        .await;
    let (status, body) = api.get("/api/v1/bookings?limit=1", Some(&short_token)).await;
    assert_eq!(status, 401);
    assert!(body["error"]["message"].as_str().expect("m").contains("expired"), "{body}");

    // The console: an admin creates one (shown once, never cached), then revokes it.
    let browser = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let page = browser.get("/api-tokens").await;
    assert_eq!(page.status(), 200);
    let html = page.text().await.expect("html");
    assert!(
        html.contains(&handle) && html.contains("revoked") && html.contains("expired"),
        "the list shows each status"
    );
    assert!(!html.contains("gh_api_"), "no secret in the list");
    let mut form = form_fields(&html, "/api-tokens");
    form.extend([
        ("name".into(), "Console token".into()),
        ("person".into(), t0.admin.email.clone()),
        ("expires_in_days".into(), "7".into()),
    ]);
    let created = browser.post("/api-tokens", &form).await;
    assert_eq!(created.status(), 200);
    assert_eq!(
        created.headers()["cache-control"],
        "no-store",
        "a page with a secret is never cached"
    );
    let console_token = shown_token(&created.text().await.expect("html"));
    // The console ignores a person smuggled into the form: a token acts for whoever creates it.
    let mut smuggled = form.clone();
    smuggled.retain(|(k, _)| k != "name");
    smuggled.extend([
        ("name".into(), "Smuggled".into()),
        ("person".into(), t0.dispatcher.email.clone()),
    ]);
    assert_eq!(browser.post("/api-tokens", &smuggled).await.status(), 200);
    assert_eq!(
        api._db.scalar_string("SELECT p.email FROM api_tokens a JOIN people p ON p.id = a.person_id WHERE a.name = 'Smuggled'").await,
        t0.admin.email
    );
    assert_eq!(api.get("/api/v1/bookings?limit=1", Some(&console_token)).await.0, 200);
    let mut bad = form.clone();
    bad.retain(|(k, _)| k != "expires_in_days");
    bad.push(("expires_in_days".into(), "forever".into()));
    assert_eq!(browser.post("/api-tokens", &bad).await.status(), 422);
    let console_handle =
        api._db.scalar_string("SELECT handle FROM api_tokens WHERE name = 'Console token'").await;
    // A confirmation page exists only for a token of this tenant.
    for other in [
        foreign.as_str(),
        "apt_nonexistentnonexistent00",
        "..%2F..%2Fconnections",
        "%22%3E%3Cscript%3E",
    ] {
        assert_eq!(
            browser.get(&format!("/api-tokens/{other}/revoke")).await.status(),
            404,
            "{other}"
        );
    }
    let action = format!("/api-tokens/{console_handle}/revoke");
    let confirm = browser.get(&action).await.text().await.expect("html");
    let mut fields = form_fields(&confirm, &action);
    let forged: Vec<(String, String)> = vec![("reason".into(), "no csrf".into())];
    assert_eq!(browser.post(&action, &forged).await.status(), 403);
    assert_eq!(
        api.get("/api/v1/bookings?limit=1", Some(&console_token)).await.0,
        200,
        "a forged form revokes nothing"
    );
    fields.push(("reason".into(), "laptop lost".into()));
    assert_eq!(browser.post(&action, &fields).await.status(), 303);
    assert_eq!(api.get("/api/v1/bookings?limit=1", Some(&console_token)).await.0, 401);
    assert_eq!(
        api._db.scalar_i64("SELECT count(*) FROM audit_log WHERE action IN ('api_token.create', 'api_token.revoke') AND channel = 'console'").await,
        3,
        "two creations and one revocation"
    );
    // Another tenant's admin cannot revoke it through their own console either.
    let t1 = &api.seed.tenants[1];
    let stranger = Browser::sign_in(&api, &t1.admin.email, &t1.admin.password).await;
    let mut theirs =
        form_fields(&stranger.get("/api-tokens").await.text().await.expect("html"), "/api-tokens");
    theirs.retain(|(k, _)| k == "csrf");
    theirs.push(("reason".into(), "cross-tenant".into()));
    assert_eq!(stranger.post(&format!("/api-tokens/{handle}/revoke"), &theirs).await.status(), 404);
}

// ---------------------------------------------------------------- registration floods

#[tokio::test]
async fn registration_is_throttled_per_source_address() {
    let api = Api::start().await;
    let register = |source: String| {
        let (http, url) = (api.http.clone(), format!("{}/oauth/register", api.url));
        async move {
            let response = http
                .post(url)
                .header("x-forwarded-for", source)
                .json(&json!({"client_name": "Flood", "redirect_uris": ["http://127.0.0.1:40000/cb"]}))
                .send()
                .await
                .expect("register");
            let retry = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()?.parse::<i64>().ok());
            (
                response.status().as_u16(),
                retry,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    // Thirty at once from one address: exactly the limit gets through (counted atomically).
    let results =
        futures_util::future::join_all((0..30).map(|_| register("198.51.100.7".into()))).await;
    let created = results.iter().filter(|r| r.0 == 201).count();
    let limited: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    assert_eq!((created, limited.len()), (20, 10), "{results:?}");
    let (_, retry, body) = limited[0];
    assert!(retry.is_some_and(|s| (1..=3600).contains(&s)), "Retry-After: {retry:?}");
    assert_eq!(body["error"], "too_many_requests");
    assert!(body["error_description"].as_str().expect("d").contains("retry in"), "{body}");
    assert_eq!(
        api._db.scalar_i64("SELECT count(*) FROM oauth_clients WHERE client_name = 'Flood'").await,
        20
    );
    // Another address is unaffected; IPv6 addresses count by their /64.
    assert_eq!(register("198.51.100.8".into()).await.0, 201);
    for i in 0..20 {
        assert_eq!(register(format!("2001:db8:1:2::{i:x}")).await.0, 201);
    }
    assert_eq!(register("2001:db8:1:2:ffff::1".into()).await.0, 429, "the same /64");
    assert_eq!(register("2001:db8:1:3::1".into()).await.0, 201, "another /64");
    // Every IPv6 form of an exhausted IPv4 address counts as that address: mapped, 6to4 (any
    // of its 65,536 subnets) and Teredo (the client's address inverted in the last 32 bits).
    for form in [
        "::ffff:198.51.100.7",
        "2002:c633:6407::1",
        "2002:c633:6407:ffff::2",
        "2001:0:4136:e378:8000:63bf:39cc:9bf8",
    ] {
        assert_eq!(register(form.into()).await.0, 429, "{form}");
    }
    assert_eq!(register("2002:c633:6408::1".into()).await.0, 201, "6to4 of another address");
    // A /48 holds 65,536 /64s: it has a ceiling of its own.
    let mut site = Vec::new();
    for i in 0..110 {
        site.push(register(format!("2001:db8:9:{i:x}::1")).await.0);
    }
    assert_eq!(site.iter().filter(|s| **s == 201).count(), 100, "{site:?}");
    // A body that is not client metadata is an OAuth error, not a bare 422.
    let response = api
        .http
        .post(format!("{}/oauth/register", api.url))
        .header("x-forwarded-for", "198.51.100.9")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("register");
    assert_eq!(response.status(), 400);
    assert_eq!(response.json::<Value>().await.expect("json")["error"], "invalid_client_metadata");
}

// ---------------------------------------------------------------- private_key_jwt clients

mod signing {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    use serde_json::{Value, json};

    /// A client's P-256 signing key and its public JWK.
    pub struct Key {
        pair: EcdsaKeyPair,
        pub jwk: Value,
    }

    impl Key {
        pub fn new(kid: &str) -> Key {
            let rng = SystemRandom::new();
            let pkcs8 =
                EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
            let pair =
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
                    .expect("pair");
            let point = pair.public_key().as_ref().to_vec();
            let jwk = json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
                "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65])});
            Key { pair, jwk }
        }

        /// A client assertion for `client` to `aud`, with these claims changed.
        pub fn assertion(&self, client: &str, aud: &str, change: Value) -> String {
            let now = jiff::Timestamp::now().as_second();
            let mut claims = json!({"iss": client, "sub": client, "aud": aud, "iat": now, "exp": now + 120,
                "jti": format!("jti-{}", ring::rand::generate::<[u8; 8]>(&SystemRandom::new()).expect("rng").expose().iter().map(|b| format!("{b:02x}")).collect::<String>())});
            for (k, v) in change.as_object().expect("object") {
                claims[k] = v.clone();
            }
            let header = json!({"alg": "ES256", "kid": self.jwk["kid"], "typ": "JWT"});
            let h = URL_SAFE_NO_PAD.encode(header.to_string());
            let p = URL_SAFE_NO_PAD.encode(claims.to_string());
            let sig =
                self.pair.sign(&SystemRandom::new(), format!("{h}.{p}").as_bytes()).expect("sign");
            format!("{h}.{p}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
        }
    }
}

#[tokio::test]
async fn a_private_key_jwt_client_authenticates_with_a_fresh_signed_assertion() {
    let api =
        Api::start_with(shared::services::oauth::FetchPolicy { dev: true, ..Default::default() })
            .await;
    let meta: Value = api
        .http
        .get(format!("{}/.well-known/oauth-authorization-server", api.url))
        .send()
        .await
        .expect("meta")
        .json()
        .await
        .expect("json");
    assert!(
        meta["token_endpoint_auth_methods_supported"]
            .as_array()
            .expect("m")
            .contains(&json!("private_key_jwt")),
        "{meta}"
    );
    assert!(
        meta["token_endpoint_auth_methods_supported"]
            .as_array()
            .expect("m")
            .contains(&json!("none")),
        "Claude checks for none"
    );
    assert_eq!(meta["client_id_metadata_document_supported"], true);
    // The client publishes its metadata document and key set, as ChatGPT does.
    let key = signing::Key::new("k1");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let docs = format!("http://{}", listener.local_addr().expect("addr"));
    let client_id = format!("{docs}/oauth/client.json");
    let document = json!({"client_id": client_id, "client_name": "Signed client", "redirect_uris": ["http://127.0.0.1:47615/callback"],
        "token_endpoint_auth_method": "private_key_jwt", "jwks_uri": format!("{docs}/oauth/jwks.json")});
    let jwks = json!({"keys": [key.jwk.clone()]});
    let routes = axum::Router::new()
        .route(
            "/oauth/client.json",
            axum::routing::get(move || async move { axum::Json(document) }),
        )
        .route("/oauth/jwks.json", axum::routing::get(move || async move { axum::Json(jwks) }));
    tokio::spawn(async move { axum::serve(listener, routes).await.expect("serve") });
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let html = browser.get(&authorize_path(&client_id, &[])).await.text().await.expect("consent");
    assert!(html.contains("Signed client"), "the document was fetched");
    assert!(html.contains("a page on its own domain"), "named by its own domain");
    assert!(!html.contains("registered itself"));
    let mut form = form_fields(&html, "/oauth/authorize");
    form.extend([("right".into(), "bookings:read".into()), ("decision".into(), "approve".into())]);
    let approved = browser.post("/oauth/authorize", &form).await;
    let location =
        url::Url::parse(approved.headers()["location"].to_str().expect("ascii")).expect("url");
    let code = location.query_pairs().find(|(k, _)| k == "code").expect("code").1.into_owned();
    let token_url = format!("{}/oauth/token", api.url);
    let post = |fields: Vec<(&'static str, String)>| {
        let (http, url) = (api.http.clone(), token_url.clone());
        async move {
            let response = http.post(url).form(&fields).send().await.expect("token");
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let exchange = |assertion: Option<String>, kind: &str| {
        let mut fields = vec![
            ("grant_type", "authorization_code".to_owned()),
            ("code", code.clone()),
            ("client_id", client_id.clone()),
            ("redirect_uri", "http://127.0.0.1:47615/callback".to_owned()),
            ("code_verifier", "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk".to_owned()),
        ];
        if let Some(a) = assertion {
            fields.push(("client_assertion_type", kind.to_owned()));
            fields.push(("client_assertion", a));
        }
        fields
    };
    const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
    let stranger = signing::Key::new("k1");
    let hostile = [
        ("no assertion", None, JWT_BEARER),
        ("another key", Some(stranger.assertion(&client_id, &token_url, json!({}))), JWT_BEARER),
        (
            "another audience",
            Some(key.assertion(&client_id, "https://evil.example/token", json!({}))),
            JWT_BEARER,
        ),
        (
            "another issuer",
            Some(key.assertion(&client_id, &token_url, json!({"iss": "https://evil.example/c"}))),
            JWT_BEARER,
        ),
        (
            "expired",
            Some(key.assertion(
                &client_id,
                &token_url,
                json!({"exp": jiff::Timestamp::now().as_second() - 300}),
            )),
            JWT_BEARER,
        ),
        (
            "a year long",
            Some(key.assertion(
                &client_id,
                &token_url,
                json!({"exp": jiff::Timestamp::now().as_second() + 31_536_000}),
            )),
            JWT_BEARER,
        ),
        (
            "wrong type",
            Some(key.assertion(&client_id, &token_url, json!({}))),
            "urn:ietf:params:oauth:client-assertion-type:saml2-bearer",
        ),
        ("not a JWT", Some("not.a.jwt".to_owned()), JWT_BEARER),
    ];
    for (name, assertion, kind) in hostile {
        let (status, body) = post(exchange(assertion, kind)).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (401, Some("invalid_client")),
            "{name}: {body}"
        );
    }
    // The code survived every refused attempt: the signed exchange succeeds.
    let (status, tokens) =
        post(exchange(Some(key.assertion(&client_id, &token_url, json!({}))), JWT_BEARER)).await;
    assert_eq!(status, 200, "{tokens}");
    assert_eq!(tokens["scope"], "bookings:read");
    // Refresh needs a fresh assertion too: a replayed one is refused, a new one works.
    let used = key.assertion(&client_id, &token_url, json!({}));
    let refresh = |assertion: Option<String>, token: String| {
        let mut fields = vec![
            ("grant_type", "refresh_token".to_owned()),
            ("refresh_token", token),
            ("client_id", client_id.clone()),
        ];
        if let Some(a) = assertion {
            fields.push(("client_assertion_type", JWT_BEARER.to_owned()));
            fields.push(("client_assertion", a));
        }
        fields
    };
    let refresh_token = tokens["refresh_token"].as_str().expect("refresh").to_owned();
    assert_eq!(post(refresh(None, refresh_token.clone())).await.0, 401);
    let (status, rotated) = post(refresh(Some(used.clone()), refresh_token.clone())).await;
    assert_eq!(status, 200, "{rotated}");
    let (status, body) =
        post(refresh(Some(used), rotated["refresh_token"].as_str().expect("r").to_owned())).await;
    assert_eq!(status, 401, "a replayed assertion: {body}");
    assert!(body["error_description"].as_str().expect("d").contains("used already"), "{body}");
    // Revocation needs the client's assertion too (RFC 7009 §2.1): a stolen refresh token
    // alone cannot end the grant.
    let live = rotated["refresh_token"].as_str().expect("r").to_owned();
    let revoke_url = format!("{}/oauth/revoke", api.url);
    let revoke = |fields: Vec<(&'static str, String)>| {
        let (http, url) = (api.http.clone(), revoke_url.clone());
        async move { http.post(url).form(&fields).send().await.expect("revoke").status().as_u16() }
    };
    assert_eq!(revoke(vec![("token", live.clone())]).await, 401);
    // The issuer URL is accepted as audience too (RFC 7523 lets servers take either).
    let latest = post(refresh(Some(key.assertion(&client_id, &api.url, json!({}))), live)).await;
    assert_eq!(latest.0, 200, "{}", latest.1);
    let newest = latest.1["refresh_token"].as_str().expect("r").to_owned();
    let signed = vec![
        ("token", newest.clone()),
        ("client_id", client_id.clone()),
        ("client_assertion_type", JWT_BEARER.to_owned()),
        ("client_assertion", key.assertion(&client_id, &revoke_url, json!({}))),
    ];
    assert_eq!(revoke(signed).await, 200);
    assert_eq!(
        post(refresh(Some(key.assertion(&client_id, &token_url, json!({}))), newest)).await.0,
        400,
        "revoked"
    );
    // A public client cannot present an assertion (nor choose the method for itself).
    let public = register_client(&api).await;
    let mut fields = vec![
        ("grant_type", "refresh_token".to_owned()),
        ("refresh_token", "gh_mcp_x".to_owned()),
        ("client_id", public.clone()),
    ];
    fields.push(("client_assertion_type", JWT_BEARER.to_owned()));
    fields.push(("client_assertion", key.assertion(&public, &token_url, json!({}))));
    let (status, body) = post(fields).await;
    assert_eq!((status, body["error"].as_str()), (401, Some("invalid_client")), "{body}");
}

#[tokio::test]
async fn tenant_settings_rate_limits_and_approval_policy_from_the_cli_and_the_console() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let cli = |args: &[&str]| ctl_as(&api._db, Some(&t0.admin.email), args);
    let slug = t0.slug.as_str();
    let (ok, shown) = cli(&["rate-limit", "show", "--tenant", slug]);
    assert!(ok, "{shown}");
    let read = shown["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .find(|l| l["class"] == "read")
        .expect("read")
        .clone();
    assert_eq!(
        (read["per_minute"].as_i64(), read["overridden"].as_bool()),
        (Some(600), Some(false))
    );
    let (ok, set) =
        cli(&["rate-limit", "set", "--tenant", slug, "--class", "read", "--per-minute", "900"]);
    assert!(ok, "{set}");
    let (ok, err) =
        cli(&["rate-limit", "set", "--tenant", slug, "--class", "read", "--per-minute", "lots"]);
    assert!(!ok && err["error"]["code"] == "invalid_argument", "{err}");
    let (ok, err) =
        cli(&["rate-limit", "set", "--tenant", slug, "--class", "reads", "--per-minute", "5"]);
    assert!(
        !ok && err["error"]["fix"].as_str().expect("fix").contains("silent_write"),
        "the classes are listed: {err}"
    );
    assert_eq!(
        api._db
            .scalar_i64("SELECT per_minute::bigint FROM tenant_rate_limits WHERE class = 'read'")
            .await,
        900,
        "refused changes changed nothing"
    );
    // Approval policy: unknown scope or mode refused with the options; a rule shows per tool.
    let (ok, err) = cli(&[
        "approval-policy",
        "set",
        "--tenant",
        slug,
        "--scope",
        "everything",
        "--mode",
        "off",
    ]);
    assert!(
        !ok && err["error"]["fix"].as_str().expect("fix").contains("send_customer_message"),
        "{err}"
    );
    let (ok, err) =
        cli(&["approval-policy", "set", "--tenant", slug, "--scope", "notify", "--mode", "maybe"]);
    assert!(!ok && err["error"]["code"] == "invalid_argument", "{err}");
    let (ok, err) = cli(&[
        "approval-policy",
        "set",
        "--tenant",
        slug,
        "--scope",
        "notify",
        "--mode",
        "off",
        "--approver-not-creator",
    ]);
    assert!(!ok, "approver rules only go with person_approves: {err}");
    let (ok, shown) = cli(&[
        "approval-policy",
        "set",
        "--tenant",
        slug,
        "--scope",
        "page_technician",
        "--mode",
        "person_approves",
    ]);
    assert!(ok, "{shown}");
    let mode_of = |shown: &Value, tool: &str| {
        shown["tools"].as_array().expect("tools").iter().find(|t| t["tool"] == tool).expect("tool")
            ["mode"]
            .clone()
    };
    assert_eq!(mode_of(&shown, "page_technician"), "person_approves");
    assert_eq!(mode_of(&shown, "send_customer_message"), "agent_confirms", "the default");
    // The console: the Agent access page shows both and changes them, with CSRF.
    let browser = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let html = browser.get("/settings").await.text().await.expect("html");
    assert!(
        html.contains("Rate limits per connection") && html.contains("value=\"900\""),
        "the override shows"
    );
    let mut form = form_fields(&html, "/settings/rate-limit");
    form.retain(|(k, _)| k == "csrf");
    form.extend([("class".into(), "notify".into()), ("per_minute".into(), "12".into())]);
    assert_eq!(browser.post("/settings/rate-limit", &form).await.status(), 303);
    // Above ten times the default only an operator may go.
    let mut too_many = form.clone();
    too_many.retain(|(k, _)| k != "per_minute");
    too_many.push(("per_minute".into(), "301".into()));
    assert_eq!(
        browser.post("/settings/rate-limit", &too_many).await.status(),
        422,
        "notify's default is 30"
    );
    let (ok, raised) =
        cli(&["rate-limit", "set", "--tenant", slug, "--class", "notify", "--per-minute", "5000"]);
    assert!(ok, "an operator may go above the tenant ceiling: {raised}");
    let (ok, _) =
        cli(&["rate-limit", "set", "--tenant", slug, "--class", "notify", "--per-minute", "12"]);
    assert!(ok);
    let forged =
        vec![("class".to_owned(), "notify".to_owned()), ("per_minute".to_owned(), "99".to_owned())];
    assert_eq!(browser.post("/settings/rate-limit", &forged).await.status(), 403);
    let mut policy = form_fields(&html, "/settings/approval-policy");
    policy.retain(|(k, _)| k == "csrf");
    let mut no_mode = policy.clone();
    no_mode.push(("scope".into(), "delete".into()));
    assert_eq!(
        browser.post("/settings/approval-policy", &no_mode).await.status(),
        422,
        "a form names its mode"
    );
    policy.extend([("scope".into(), "delete".into()), ("mode".into(), "off".into())]);
    assert_eq!(browser.post("/settings/approval-policy", &policy).await.status(), 303);
    assert_eq!(
        api._db
            .scalar_i64("SELECT per_minute::bigint FROM tenant_rate_limits WHERE class = 'notify'")
            .await,
        12
    );
    assert_eq!(
        api._db
            .scalar_string("SELECT mode FROM approval_policies WHERE scope = 'class:delete'")
            .await,
        "off"
    );
    assert_eq!(
        api._db.scalar_i64("SELECT count(*) FROM audit_log WHERE action IN ('rate_limit.set', 'approval_policy.set') AND channel = 'console'").await,
        2
    );
    // A dispatcher holds no tenant settings right: refused, nothing changes.
    let dispatcher = Browser::sign_in(&api, &t0.dispatcher.email, &t0.dispatcher.password).await;
    let page = dispatcher.get("/approvals").await.text().await.expect("html");
    let mut theirs = form_fields(&page, "/logout");
    theirs.retain(|(k, _)| k == "csrf");
    theirs.extend([("class".into(), "read".into()), ("per_minute".into(), "1".into())]);
    assert_eq!(dispatcher.post("/settings/rate-limit", &theirs).await.status(), 403);
    assert_eq!(
        api._db
            .scalar_i64("SELECT per_minute::bigint FROM tenant_rate_limits WHERE class = 'read'")
            .await,
        900
    );
}

#[tokio::test]
async fn the_approvals_page_shows_nothing_of_a_hostile_query() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    // Only a pac_ handle and one of three outcomes are ever shown; anything else is ignored.
    for query in [
        "decided=%3Cscript%3Ealert(1)%3C%2Fscript%3E&outcome=executed",
        "decided=pac_abc&outcome=%3Cb%3Eexecuted",
        "decided=pac_abc&outcome=changed&replaced_by=https%3A%2F%2Fevil.example",
        "decided=pac_abc&decided=pac_def&outcome=denied",
        &format!("decided=pac_{}&outcome=executed", "a".repeat(5000)),
    ] {
        let page = browser.get(&format!("/approvals?{query}")).await;
        assert_eq!(page.status(), 200, "{query}");
        let html = page.text().await.expect("html");
        assert!(
            !html.contains("<script>alert")
                && !html.contains("<b>")
                && !html.contains("evil.example"),
            "{query}"
        );
        assert!(!html.contains(&"a".repeat(100)), "an overlong handle is not echoed");
    }
    let shown = browser
        .get("/approvals?decided=pac_abc123&outcome=denied")
        .await
        .text()
        .await
        .expect("html");
    assert!(shown.contains("Denied pac_abc123"), "a well-formed outcome is shown");
}

// ---------------------------------------------------------------- audit search and activity pictures

/// Rows of the first table body of a console page.
fn table_rows(html: &str) -> usize {
    html.split("<tbody>")
        .nth(1)
        .map_or(0, |body| body.split("</tbody>").next().unwrap_or_default().matches("<tr>").count())
}

#[tokio::test]
async fn the_audit_log_is_searched_and_paged_in_sql_and_exported_as_csv_no_spreadsheet_runs() {
    let api = Api::start().await;
    let t = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t.admin.email, &t.admin.password).await;
    let slug = &t.slug;
    // 260 rows over ten days in this tenant, with names a client chose to be formulas, and one
    // row in another tenant that must never show.
    api._db
        .exec(&format!(
            "INSERT INTO audit_log (tenant_id, at, channel, action, outcome, targets, connection_name, client_name)
             SELECT t.id, timestamptz '2026-11-01 12:00:00+00' + (i % 10) * interval '1 day' + i * interval '1 second',
                    CASE WHEN i % 2 = 0 THEN 'mcp' ELSE 'api' END,
                    CASE WHEN i % 3 = 0 THEN 'note_add' WHEN i % 3 = 1 THEN 'noteXadd' ELSE 'booking.confirm' END,
                    CASE WHEN i % 5 = 0 THEN 'refused' ELSE 'ok' END,
                    ARRAY['bkg_' || i], '=HYPERLINK(\"http://evil.example\",\"x\")', '+cmd|'' /C calc''!A0'
             FROM tenants t, generate_series(1, 260) i WHERE t.slug = '{slug}';
             INSERT INTO audit_log (tenant_id, channel, action, outcome)
             SELECT id, 'mcp', 'other_tenants_secret', 'ok' FROM tenants WHERE slug <> '{slug}' LIMIT 1;"
        ))
        .await;
    let in_tenant = api
        ._db
        .scalar_i64(&format!(
            "SELECT count(*) FROM audit_log a JOIN tenants t ON t.id = a.tenant_id WHERE t.slug = '{slug}'"
        ))
        .await;

    // Paging: 100 a page, following `next` until the end, visits every row once.
    let mut path = "/audit".to_owned();
    let mut seen = 0;
    let mut pages = 0;
    loop {
        let html = admin.get(&path).await.text().await.expect("page");
        seen += table_rows(&html);
        pages += 1;
        assert!(!html.contains("other_tenants_secret"));
        match html.split("rel=\"next\" href=\"").nth(1) {
            Some(rest) => path = rest.split('"').next().expect("href").replace("&amp;", "&"),
            None => break,
        }
    }
    assert_eq!(seen as i64, in_tenant, "every row once, over {pages} pages");
    assert!(pages >= 3);

    // Filters run in SQL: `_` in an action is a letter, not a wildcard; days are UTC days.
    let html = admin.get("/audit?action=note_&outcome=refused").await.text().await.expect("page");
    let want = (1..=260).filter(|i| i % 3 == 0 && i % 5 == 0).count();
    assert_eq!(table_rows(&html), want, "note_add refused only");
    assert!(!html.contains("noteXadd"));
    let html = admin
        .get("/audit?since=2026-11-04&until=2026-11-04&channel=api")
        .await
        .text()
        .await
        .expect("page");
    let want = (1..=260).filter(|i| i % 10 == 3 && i % 2 == 1).count();
    assert_eq!(table_rows(&html), want, "one UTC day, one channel");

    // Hostile or mistaken filters: a 400 that says what to write, nothing else.
    for (query, says) in [
        ("outcome=bogus", "ok, refused, failed, previewed"),
        ("since=-5000-01-01", "2026-11-30"),
        ("until=20000-01-01T00:00:00Z", "2026-11-30"),
        ("channel=email", "mcp, api"),
        ("since=yesterday", "2026-11-30"),
        ("cursor=AAAA", "previous page"),
        ("connection=bkg_1", "connection"),
    ] {
        let response = admin.get(&format!("/audit?{query}")).await;
        assert_eq!(response.status(), 400, "{query}");
        let html = response.text().await.expect("page");
        assert!(html.contains(says), "{query}: {html}");
    }

    // CSV: every matching row, and no cell a spreadsheet would run as a formula.
    let response = admin.get("/audit.csv?action=note_").await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"].to_str().expect("ct").starts_with("text/csv"));
    assert!(response.headers()["content-disposition"].to_str().expect("cd").contains("attachment"));
    let csv = response.text().await.expect("csv");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "at,channel,action,outcome,records,connection,connection_name,client_name,reason"
    );
    assert_eq!(lines.len() - 1, (1..=260).filter(|i| i % 3 == 0).count());
    assert!(
        lines[1].contains("\"'=HYPERLINK(\"\"http://evil.example\"\",\"\"x\"\")\""),
        "{}",
        lines[1]
    );
    assert!(lines[1].contains("\"'+cmd|"), "{}", lines[1]);
    let all = admin.get("/audit.csv").await.text().await.expect("csv");
    assert_eq!(all.lines().count() as i64 - 1, in_tenant, "the export pages through everything");
    assert!(!all.contains("other_tenants_secret"));
    assert_eq!(admin.get("/audit.csv?outcome=bogus").await.status(), 400);
    // A person without the audit right sees none of it.
    let dispatcher = Browser::sign_in(&api, &t.dispatcher.email, &t.dispatcher.password).await;
    assert_ne!(dispatcher.get("/audit.csv").await.status(), 200);
}

#[tokio::test]
async fn an_audit_filter_given_as_tool_narrows_the_next_page_and_the_export_too() {
    let api = Api::start().await;
    let t = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t.admin.email, &t.admin.password).await;
    let slug = &t.slug;
    // 150 rows the filter matches (two pages) and 150 it does not.
    api._db
        .exec(&format!(
            "INSERT INTO audit_log (tenant_id, at, channel, action, outcome, targets)
             SELECT t.id, timestamptz '2026-11-01 12:00:00+00' + i * interval '1 second', 'mcp',
                    CASE WHEN i % 2 = 0 THEN 'note_add' ELSE 'booking.confirm' END, 'ok', ARRAY['bkg_' || i]
             FROM tenants t, generate_series(1, 300) i WHERE t.slug = '{slug}';"
        ))
        .await;
    let matching = api
        ._db
        .scalar_i64(&format!(
            "SELECT count(*) FROM audit_log a JOIN tenants t ON t.id = a.tenant_id
             WHERE t.slug = '{slug}' AND a.action LIKE 'note\\_%'"
        ))
        .await as usize;
    assert!(matching > 100, "two pages of matches");
    let href = |html: &str, marker: &str| {
        html.split(marker)
            .nth(1)
            .map(|rest| rest.split('"').next().expect("href").replace("&amp;", "&"))
    };
    let first = admin.get("/audit?tool=note_").await.text().await.expect("page");
    assert_eq!(table_rows(&first), 100, "the filter narrows the first page");
    assert!(!first.contains("booking.confirm"));
    let next = href(&first, "rel=\"next\" href=\"").expect("a second page");
    assert!(next.contains("action=note_"), "the next page keeps the filter: {next}");
    let export = href(&first, "<a href=\"/audit.csv").expect("the export link");
    assert!(export.contains("action=note_"), "the export keeps the filter: {export}");

    let second = admin.get(&next).await.text().await.expect("page");
    assert_eq!(table_rows(&second), (matching - 100).min(100), "more matches, nothing else");
    assert!(!second.contains("booking.confirm"), "the second page is still filtered");
    let csv = admin.get(&format!("/audit.csv{export}")).await.text().await.expect("csv");
    assert_eq!(csv.lines().count() - 1, matching, "the export holds the matches only");
    assert!(!csv.contains("booking.confirm"));
}

#[tokio::test]
async fn the_console_draws_each_connections_activity_from_the_counted_calls() {
    let api = Api::start().await;
    let t = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t.admin.email, &t.admin.password).await;
    let con = t.connections[0].connection.clone();
    let other = api.seed.tenants[1].connections[0].connection.clone();
    // Counts as workers write them: this hour and three hours ago, reads and refused notifies.
    api._db
        .exec(&format!(
            "INSERT INTO call_activity (tenant_id, connection_id, hour, effect_class, outcome, calls)
             SELECT c.tenant_id, c.id, date_trunc('hour', now()) - h * interval '1 hour', k, o, n
             FROM connections c,
                  (VALUES (0, 'read', 'ok', 7), (0, 'notify', 'permission_denied', 2), (3, 'read', 'rate_limited', 4),
                          (30, 'silent_write', 'ok', 5)) v(h, k, o, n)
             WHERE c.handle = '{con}';
             INSERT INTO recent_calls (tenant_id, connection_id, at, tool, effect_class, outcome, duration_ms)
             SELECT c.tenant_id, c.id, now(), 'find_customers', 'read', 'ok', 1.5 FROM connections c WHERE c.handle = '{con}';"
        ))
        .await;
    let html = admin.get(&format!("/connections/{con}")).await.text().await.expect("page");
    let section = html.split("id=\"connection-activity\"").nth(1).expect("the activity section");
    let sum = |series: &str| -> u64 {
        section
            .split(&format!("data-series=\"{series}\" data-count=\""))
            .skip(1)
            .map(|rest| rest.split('"').next().unwrap_or("0").parse::<u64>().unwrap_or(0))
            .sum()
    };
    assert_eq!(sum("read"), 11, "the last day's reads, refused ones included");
    assert_eq!(sum("notify"), 2);
    assert_eq!(sum("silent_write"), 0, "thirty hours ago is outside the day");
    assert!(section.contains("role=\"img\""));
    assert!(section.contains("data-reason=\"rate_limited (rate bucket empty)\""), "{section}");
    assert!(section.contains("data-reason=\"permission_denied (lacks the right)\""));
    assert!(section.contains("<code>find_customers</code>"), "the latest calls");
    let week =
        admin.get(&format!("/connections/{con}?span=week")).await.text().await.expect("page");
    assert_eq!(week.matches("class=\"bar\"").count(), 168);
    assert!(week.contains("data-series=\"silent_write\" data-count=\"5\""));
    // The tenant's page adds up its connections; another tenant's connection is not found.
    let tenant = admin.get("/activity").await.text().await.expect("page");
    assert!(tenant.contains("13 calls"), "7 + 2 + 4");
    assert_eq!(admin.get(&format!("/connections/{other}")).await.status(), 404);
    let dispatcher = Browser::sign_in(&api, &t.dispatcher.email, &t.dispatcher.password).await;
    assert_ne!(dispatcher.get("/activity").await.status(), 200, "admins only");
}
