//! The control plane against real Postgres: the REST API through HTTP, and `gatehousectl` as
//! the real binary.

use std::sync::Arc;

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
        let db = TestDb::new().await;
        let seed = demo::seed(&db.ds, "").await.expect("seed");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(AppState {
            ds: db.ds.clone(),
            public_url: url.clone(),
            metrics: Metrics::new(),
            mcp_resources: vec!["http://127.0.0.1:9/mcp".into()],
            dev_mode: false,
        });
        tokio::spawn(async move { axum::serve(listener, app(state)).await.expect("serve") });
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
    let (ok, d) =
        ctl(&db, &["person", "deactivate", "--tenant", "acme-air", "--email", "lee@acme.example"]);
    assert!(ok);
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
    demo::seed(&db.ds, "").await.expect("seed");
    db.exec(
        "INSERT INTO login_failures (email, at) VALUES ('old@example.net', now() - interval '2 days'), ('new@example.net', now());
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
    assert_eq!(db.scalar_i64("SELECT count(*) FROM login_failures").await, 1);
    assert_eq!(
        db.scalar_string("SELECT string_agg(args_digest, ',') FROM replay_entries").await,
        "new"
    );
}
