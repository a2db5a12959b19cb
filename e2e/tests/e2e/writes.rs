//! Writes across workers: racing confirmations and retries take effect once, the tools reject
//! what the API rejects (R2), and confirmed emails leave through an SMTP relay with their
//! idempotency key.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confirmations_and_retries_racing_on_two_workers_take_effect_once() {
    let stack = Stack::start(Options::for_test("race", 2)).await.expect("stack");
    races_take_effect_once(&stack).await;
}

/// The same races with Debian's PgBouncer between every process and Postgres (session
/// pooling, at most 24 server connections for the database): the confirmations' advisory
/// locks are transaction-scoped, the pipe's session settings are `SET`s, and Postgres sees
/// only PgBouncer's connections, never more than it allows.
#[tokio::test]
async fn the_same_races_behind_pgbouncer_take_effect_once_within_its_connections() {
    let mut opts = Options::for_test("pooled", 2);
    opts.pgbouncer = Some(24);
    opts.db_pool = 6;
    let database = opts.database.clone();
    let server = opts.pg_server.clone();
    let stack = Stack::start(opts).await.expect("stack behind pgbouncer");
    assert!(
        !stack.database_url.contains(":5432/"),
        "the services reach Postgres through the pooler"
    );
    races_take_effect_once(&stack).await;
    let held = TestDb::connections_postgres_holds_for(&server, &database);
    assert!((1..=24).contains(&held), "Postgres holds {held} connections for the stack");
    let log = std::fs::read_to_string(stack.run_dir.join("pgbouncer/pgbouncer-own.log"))
        .unwrap_or_default();
    assert!(!log.contains("ERROR") && !log.contains("unsupported startup parameter"), "{log}");
}

/// The same races through PgBouncer in transaction pooling mode (1.24, named prepared
/// statements kept per client), where the control plane's and both workers' pools and pipes
/// (6 + 6 + 6 connections, and the pipes') share 8 server connections: the confirmations still
/// take effect once, the pipes run as their own role on pinned generic plans (their settings
/// come from the role, never a `SET` a pooled server connection would carry to another client),
/// and Postgres sees at most 8 connections.
#[tokio::test]
async fn the_same_races_behind_a_transaction_pooler_take_effect_once_on_shared_connections() {
    let mut opts = Options::for_test("txpooled", 2);
    opts.pgbouncer = Some(8);
    opts.pgbouncer_transaction = true;
    opts.db_pool = 6;
    let database = opts.database.clone();
    let server = opts.pg_server.clone();
    let stack = Stack::start(opts).await.expect("stack behind a transaction pooler");
    // A policy set in force: each confirmation is judged again inside its transaction, holding
    // its lock, through the pooler.
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let file = stack.run_dir.join("policies.cedar");
    std::fs::write(
        &file,
        "@id(\"huge-batches\") @reason(\"never this many\")\n\
         forbid (principal, action == Action::\"send_customer_message\", resource)\n\
         when { context.effects > 1000 };\n",
    )
    .expect("policy file");
    let file = file.to_string_lossy().into_owned();
    let set = stack.ctl(&["policy", "set", "--tenant", &slug, &file, "--expect-version", "0"]);
    assert_eq!(set.expect("policy set")["version"], 1);
    races_take_effect_once(&stack).await;
    // The later calls of a prepared statement run on other server connections than the one
    // that prepared it: reads through both workers still answer.
    for w in &stack.worker_urls {
        for _ in 0..20 {
            let r = tool_call(w, &stack.token(0, 0), "find_bookings", json!({"limit": 2})).await;
            assert_ne!(r["isError"], true, "{r}");
        }
    }
    let held = TestDb::connections_postgres_holds_for(&server, &database);
    assert!((1..=8).contains(&held), "Postgres holds {held} connections for the stack");
    let as_pipe = TestDb::connections_postgres_holds_for_role(&server, &database, "gatehouse_pipe");
    assert!(as_pipe >= 1, "the pipes connect as their own role");
    for w in &stack.worker_urls {
        let metrics = reqwest::get(format!("{w}/metrics")).await.expect("metrics").text().await;
        let metrics = metrics.expect("text");
        let plans = |plan: &str| -> f64 {
            metrics
                .lines()
                .filter(|l| l.starts_with("gatehouse_worker_pipe_plan_executions{"))
                .filter(|l| l.contains(&format!("plan=\"{plan}\"")))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        assert!(plans("generic") > 0.0, "the pipe's statements ran prepared:\n{metrics}");
        assert_eq!(plans("custom"), 0.0, "plans pinned by the role's settings");
    }
    let log = std::fs::read_to_string(stack.run_dir.join("pgbouncer/pgbouncer-own.log"))
        .unwrap_or_default();
    assert!(!log.contains("ERROR"), "{log}");
    for name in ["worker-1", "worker-2", "control-plane"] {
        let log =
            std::fs::read_to_string(stack.run_dir.join(format!("{name}.log"))).unwrap_or_default();
        assert!(!log.contains("prepared statement"), "{name}: {log}");
    }
}

async fn races_take_effect_once(stack: &Stack) {
    let db = TestDb::attach(&stack.database_url).await;
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
    assert_eq!(db.count("outbox").await, 1);

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
    assert_eq!(db.rows("booking_notes").eq("body", "Retry-safe note").count().await, 1);
    // Closed before a caller counts the connections the stack holds.
    db.detach().await;
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
    let db = TestDb::attach(&stack.database_url).await;
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
        sent = db.rows("outbox").eq("status", "sent").count().await;
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
