//! A long-lived Postgres under a fleet: the hot path's plans stay pinned whatever the
//! statistics say, and a database that runs out of connections is a retryable 503 that names
//! its cause, never an `internal` tool error.

use crate::support::*;
use shared::testing::BulkBookings;

/// The value of one series of the worker's `/metrics` (0 when absent).
async fn metric(stack: &Stack, base: &str, series: &str) -> i64 {
    let text = stack
        .http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as i64)
}

fn plans(statement: &str, plan: &str) -> String {
    format!("gatehouse_worker_pipe_plan_executions{{plan=\"{plan}\",statement=\"{statement}\"}}")
}

/// Skewed, bloated, freshly analyzed data (a million bookings, three of them with ten
/// thousand notes each, a fifth of the rows rewritten): the context and booking read keeps
/// its generic plan on every call, and the metric that says so would show a custom one.
#[tokio::test]
async fn the_hot_paths_plans_stay_generic_on_skewed_bloated_analyzed_data() {
    let stack = Stack::start().await;
    let slug = stack.seed.tenants[0].slug.clone();
    BulkBookings::new(&slug, 1_000_000)
        .like_first_booking()
        .handles("bkg_skew")
        .insert(&stack.db)
        .await;
    stack
        .db
        .skew_notes_and_bloat_bookings(
            &["bkg_skew000000000001", "bkg_skew000000000002", "bkg_skew000000000003"],
            10_000,
        )
        .await;
    let token = stack.token(0, 0);
    let hot = "bkg_skew000000000001";
    let cold = "bkg_skew000000500000";
    let read = |booking: &'static str| {
        let token = token.clone();
        let stack = &stack;
        async move {
            stack
                .call(&token, "get_booking", json!({"booking": booking}))
                .await
                .expect("get_booking")
        }
    };
    let search = |args: Value| {
        let token = token.clone();
        let stack = &stack;
        async move { stack.call(&token, "find_bookings", args).await.expect("find_bookings") }
    };
    for _ in 0..20 {
        read(hot).await;
        read(cold).await;
        search(json!({"limit": 10})).await;
    }
    // Raw SQL on purpose: fresh statistics are what the plans must withstand, so the test
    // shows exactly which tables are analyzed.
    stack.db.exec("ANALYZE bookings; ANALYZE booking_notes; ANALYZE connections; ANALYZE connection_tokens").await;
    for _ in 0..60 {
        let b = read(hot).await;
        assert_eq!(b["booking"], hot);
        read(cold).await;
        let page = search(json!({"limit": 10})).await;
        assert_eq!(page["count"], 10, "{page}");
        search(json!({"from": "2026-01-01T00:00:00Z", "to": "2036-01-01T00:00:00Z", "limit": 10}))
            .await;
    }
    let custom = metric(&stack, &stack.url, &plans("context_and_bookings", "custom")).await;
    let generic = metric(&stack, &stack.url, &plans("context_and_bookings", "generic")).await;
    assert_eq!(custom, 0, "no search was planned anew");
    assert!(generic >= 80, "every search ran the one generic plan: {generic}");
    let custom = metric(&stack, &stack.url, &plans("context_and_booking", "custom")).await;
    let generic = metric(&stack, &stack.url, &plans("context_and_booking", "generic")).await;
    assert_eq!(custom, 0, "no call was planned anew");
    assert!(generic >= 160, "every call ran the one generic plan: {generic}");
    assert_eq!(metric(&stack, &stack.url, &plans("context", "custom")).await, 0);
}

/// Postgres out of connections (a role at its connection limit, SQLSTATE 53300) answers a
/// write 503 with Retry-After and the cause in words, logs the SQLSTATE and Postgres's own
/// message, and serves the retry once a connection frees; nothing is applied twice.
#[tokio::test]
async fn a_database_out_of_connections_is_a_503_that_names_53300_and_recovers() {
    let stack = Stack::start().await;
    let role = format!(
        "gh_limited_{}",
        std::process::id() ^ (NEXT_ID.fetch_add(1, Ordering::Relaxed) as u32)
    );
    stack.db.create_role_with_connection_limit(&role, 2).await;
    let mut url = url::Url::parse(&stack.db.url).expect("url");
    url.set_username(&role).expect("user");
    // A worker whose pipe takes one of the role's two connections, its pool the other.
    let ds = shared::Services::connect_worker(url.as_str(), 4, Some(1)).await.expect("connect");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let settings = Settings {
        public_url: stack.url.clone(),
        authorization_server: "http://127.0.0.1:1".into(),
        allowed_hosts: vec!["127.0.0.1".into()],
        allowed_origins: vec![],
        worker_id: "limited".into(),
        mrtr_keys: None,
    };
    let state = Arc::new(AppState::new(ds, settings));
    tokio::spawn(async move {
        worker::serve::serve(listener, app(state), HEADER_READ_TIMEOUT, std::future::pending())
            .await
            .expect("serve")
    });
    let token = stack.token(0, 0);
    let booking = stack
        .call_at(&base, &token, "find_bookings", json!({"limit": 1}))
        .await
        .expect("find")["bookings"][0]["booking"]
        .clone();
    // The pool's connection is closed, and someone else takes what is left of the role's
    // connections: the pipe still answers, the pool can open none.
    stack.db.close_sessions_of_role_but_the_pipe(&role).await;
    let mut others = Vec::new();
    for _ in 0..2 {
        if let Ok(c) = <sqlx::PgConnection as sqlx::Connection>::connect(url.as_str()).await {
            others.push(c);
        }
    }
    assert_eq!(others.len(), 1, "one connection was left to take");
    let args = json!({"booking": booking, "text": "written when a connection frees"});
    let params = json!({"name": "add_booking_note", "arguments": args});
    let mut refused = None;
    // A first attempt may meet the closed connection (57P01, also a 503); the next opens one.
    for _ in 0..3 {
        let (status, headers, body) = stack
            .raw_at(
                &base,
                Some(&token),
                "tools/call",
                Some("add_booking_note"),
                params.clone(),
                &[],
            )
            .await;
        assert_eq!(status, 503, "{body}");
        if body.to_string().contains("53300") {
            refused = Some((headers, body));
            break;
        }
    }
    let (headers, body) = refused.expect("a 503 while Postgres has no connection to give");
    assert_eq!(headers["retry-after"], "5");
    let said = body["error_description"].as_str().unwrap_or_default();
    assert!(said.contains("53300") && said.contains("Retry the very same request"), "{body}");
    let logged = String::from_utf8_lossy(&logs().lock().expect("logs")).to_string();
    assert!(
        logged
            .lines()
            .any(|l| l.contains("\"db.sqlstate\":\"53300\"") && l.contains("too many connections")),
        "the log names the SQLSTATE and Postgres's message"
    );
    let notes =
        || stack.db.rows("booking_notes").eq("body", "written when a connection frees").count();
    assert_eq!(notes().await, 0, "nothing applied");
    drop(others);
    let mut done = Value::Null;
    for _ in 0..50 {
        if let Ok(v) = stack.call_at(&base, &token, "add_booking_note", args.clone()).await {
            done = v;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(done["replayed"], false, "the retry is served: {done}");
    assert_eq!(notes().await, 1, "applied once");
}
