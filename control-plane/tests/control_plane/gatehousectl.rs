//! `gatehousectl`, run as the real binary: operators, tenants, people and connections, the
//! demo seed, and the names and reasons it refuses.

use crate::support::*;

#[tokio::test]
async fn gatehousectl_manages_tenants_people_and_connections() {
    let db = TestDb::new().await;
    let (ok, migrated) = ctl_as(&db, None, &["migrate"]);
    assert!(ok, "{migrated}");
    assert_eq!(migrated["applied"], 0, "the template is migrated already");
    // Through a transaction pooler the migrator's session lock would not hold: refused, with
    // where to run it instead; a pooling mode that does not exist is named with the options.
    for (pooling, field, says) in [
        ("transaction", "DATABASE_URL", "Postgres itself"),
        ("statement", "GATEHOUSE_DB_POOLING", "transaction"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gatehousectl"))
            .args(["migrate", "--json"])
            .env("DATABASE_URL", &db.url)
            .env("GATEHOUSE_DB_POOLING", pooling)
            .output()
            .expect("run gatehousectl");
        assert!(!out.status.success(), "{pooling}");
        let err: Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(err["error"]["code"], "invalid_argument", "{err}");
        let message = err["error"]["message"].as_str().expect("message");
        assert!(message.starts_with(&format!("{field}: ")) && message.contains(says), "{err}");
    }
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
    assert_eq!(db.rows("tenants").eq("slug", "evil").count().await, 0);
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
    let by = db.audit_actor_email("tenant.create").await;
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
    let stored = db.connection_tokens_hashing_to(token).await;
    assert_eq!(stored, 1, "only the hash is stored");
    let plain = db.connection_tokens_holding_plaintext(token).await;
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
        .rows("connections")
        .eq("handle", small["connection"].as_str().expect("handle"))
        .text("toolset")
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
    let live_api_tokens = db.unrevoked_api_tokens_of("lee@acme.example").await;
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
    let active = db.membership_of_email("lee@acme.example").await.1;
    assert!(!active, "the membership stays inactive");
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
    let audited = db.rows("audit_log").eq("channel", "cli").count().await;
    assert!(audited >= 4, "every CLI write is audited ({audited})");
    let (ok, op) = ctl(&db, &["operator", "--email", "lee@acme.example"]);
    assert!(ok, "{op}");
    assert_eq!(
        db.rows("people").eq("email", "lee@acme.example").eq("is_operator", true).count().await,
        1
    );
    assert_eq!(
        db.rows("audit_log").eq("action", "operator.grant").null("tenant_id").count().await,
        1
    );
    let (ok, _) = ctl(&db, &["operator", "--email", "lee@acme.example", "--revoke"]);
    assert!(ok);
    assert_eq!(
        db.rows("people").eq("is_operator", true).count().await,
        1,
        "only the operator who ran the commands is left"
    );
    // The last operator cannot withdraw their own role and lock the platform out.
    let (ok, err) = ctl(&db, &["operator", "--email", OPS, "--revoke"]);
    assert!(!ok, "{err}");
    assert_eq!(db.rows("people").eq("is_operator", true).count().await, 1);
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
    let bookings = db.fewest_bookings_of_a_tenant().await;
    assert!(bookings >= 12);
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_gatehousectl"))
        .args(["connection", "create", "--help"])
        .output()
        .expect("help");
    assert!(String::from_utf8_lossy(&help.stdout).contains("--rights"));
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
    let status = api._db.rows("connections").eq("handle", &connection).text("status").await;
    assert_eq!(status, "active", "nothing was revoked");
    let agent_access = api._db.rows("tenants").eq("slug", slug).text("agent_access").await;
    assert_eq!(agent_access, "true", "the switch did not flip");
}
