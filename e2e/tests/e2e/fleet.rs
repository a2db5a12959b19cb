//! The fleet under failure: revocations, deactivations and kill switches reach every worker at
//! the next call, with or without NATS, through worker kills, a NATS node lost and Postgres
//! down.

use shared::testing::BulkBookings;

use crate::support::*;

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
    // Another admin first: the tenant's last admin can be neither demoted nor deactivated.
    stack.add_second_admin(slug).expect("second admin");
    let admin = tenant["admin"]["email"].as_str().expect("email");
    stack.ctl(&["person", "deactivate", "--tenant", slug, "--email", admin]).expect("deactivate");
    for w in &stack.worker_urls {
        assert_eq!(list_status(w, &read_only).await, 401, "revoked on {w}");
        assert_eq!(list_status(w, &full).await, 401, "creator gone on {w}");
    }
    // The other tenant is untouched.
    assert_eq!(list_status(&stack.lb_url, &stack.token(1, 0)).await, 200);
}

#[tokio::test]
async fn kill_switches_reach_every_worker_and_hold_without_nats() {
    let mut stack = Stack::start(Options::for_test("switch", 2)).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let token = stack.token(0, 0);
    // Global switch on: every worker answers 503 with Retry-After, nothing is written.
    let flipped = stack.ctl(&["kill-switch", "on", "--reason", "incident 42"]).expect("on");
    assert_eq!(flipped["kill"], true);
    for (status, retry) in every_worker_answers(&stack, &token, 503).await {
        assert_eq!(status, 503);
        assert_eq!(retry.as_deref(), Some("30"));
    }
    assert_eq!(db.rows("customers").eq("name", "Switch Test").count().await, 0);
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
    let mut flips = 0;
    for action in ["kill_switch.on", "kill_switch.off"] {
        flips += db.rows("audit_log").eq("action", action).not_null("reason").count().await;
    }
    assert_eq!(flips, 2);
    assert_eq!(
        db.rows("audit_log").like("action", "agent_access.%").eq("channel", "cli").count().await,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_connection_ends_its_streaming_export_on_another_worker() {
    let stack = Stack::start(Options::for_test("stream", 2)).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    // Enough bookings that the export streams for a while.
    let bulk = BulkBookings::new(&slug, 40000)
        .like_first_booking()
        .starting("2028-01-01 08:00+01", "5 minutes")
        .status("confirmed")
        .handles("bkg_");
    bulk.insert(&db).await;
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
    let db = TestDb::attach(&stack.database_url).await;
    let token = stack.token(0, 0);
    let (clients, rounds) = (6, 18);
    // A load drill: this tenant's buckets are raised for it, as an admin would.
    db.set_every_tenants_rate_limits(&["notify", "silent_write"], 10000).await;
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
    let notes = db.rows("booking_notes").like("body", "fleet note %").texts("body", "id").await;
    let distinct = notes.iter().collect::<BTreeSet<_>>().len() as i64;
    let rows = notes.len() as i64;
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
    let executed = db.rows("pending_actions").eq("status", "executed").count().await;
    assert_eq!(executed, confirms.len() as i64, "each prepared message executed exactly once");
    assert_eq!(db.count("outbox").await, executed, "one outbox row per execution");
    assert_eq!(db.actions_with_more_than_one_message().await, 0);
    assert_eq!(
        db.rows("customers").eq("email", "fleet-drill@example.net").count().await,
        0,
        "nothing ran while switched off"
    );
    eprintln!("fleet: {} retries", report["retries"]);
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
        assert_eq!(retry.as_deref(), Some("5"));
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
    // Attached once Postgres is back: no connection of the test's own lived through the outage.
    let db = TestDb::attach(&stack.database_url).await;
    assert_eq!(db.rows("booking_notes").eq("body", "written across an outage").count().await, 1);
    assert_eq!(
        db.rows("customers").eq("email", "outage@example.net").count().await,
        0,
        "nothing half-applied"
    );
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
