//! What a worker writes to its log per call at `RUST_LOG=info`, the level operators run: one
//! line per tool call, nothing of rmcp's per-request lines, and the bytes it costs.

use crate::support::*;

#[tokio::test]
async fn at_info_a_tool_call_writes_one_line_and_a_listing_none() {
    for format in ["text", "json"] {
        calls_at_info(format).await;
    }
}

async fn calls_at_info(format: &str) {
    let mut opts = Options::for_test(&format!("quietlogs_{format}"), 1);
    // What an operator sets, not the suite's tuned filter: the binaries keep libraries quiet.
    opts.log_level = "info".into();
    opts.env.push(("GATEHOUSE_LOG_FORMAT".into(), format.into()));
    let stack = Stack::start(opts).await.expect("stack");
    let token = stack.token(0, 0);
    let worker = &stack.worker_urls[0];
    let found = tool_call(worker, &token, "find_bookings", json!({"limit": 1})).await;
    let booking = found["structuredContent"]["bookings"][0]["booking"].clone();
    let before = stack.log("worker-1");
    let calls = 300;
    for i in 0..calls {
        let result = match i % 3 {
            0 => tool_call(worker, &token, "get_booking", json!({"booking": booking})).await,
            1 => tool_call(worker, &token, "find_customers", json!({"query": "a"})).await,
            _ => tool_call(worker, &token, "find_bookings", json!({"limit": 5})).await,
        };
        assert_eq!(result["isError"], false, "{result}");
    }
    for _ in 0..50 {
        assert_eq!(tool_names(worker, &token).await.0, 200);
    }
    let after = stack.log("worker-1");
    let added = &after[before.len()..];
    let lines: Vec<&str> = added.lines().collect();
    assert_eq!(
        lines.iter().filter(|l| l.contains("tool call")).count(),
        calls,
        "one line per tool call"
    );
    assert_eq!(
        lines.len(),
        calls,
        "nothing else per call or listing: {:?}",
        &lines[..lines.len().min(5)]
    );
    assert!(!added.contains("Service initialized") && !added.contains("rmcp"), "rmcp stays quiet");
    assert!(!added.contains('\u{1b}'), "no terminal colours in a log file");
    // The figure docs/operations.md states.
    println!("log bytes per 1000 calls at info ({format}): {}", added.len() * 1000 / calls);
}

/// What a worker holds of Postgres: its pool grows under a burst and gives back what sits idle
/// (here after 2 s, `GATEHOUSE_DB_IDLE_SECS`; 30 s by default), so an idle worker holds its pipe
/// alone, at most 3 connections; each is named for who holds it in `pg_stat_activity`.
#[tokio::test]
async fn an_idle_worker_gives_its_connections_back() {
    let mut opts = Options::for_test("idlepool", 1);
    opts.env.push(("GATEHOUSE_DB_IDLE_SECS".into(), "2".into()));
    let database = opts.database.clone();
    let server = opts.pg_server.clone();
    let stack = Stack::start(opts).await.expect("stack");
    let held = || TestDb::worker_connections_held(&server, &database);
    let token = stack.token(0, 0);
    let worker = stack.worker_urls[0].clone();
    let booking =
        tool_call(&worker, &token, "find_bookings", json!({"limit": 1})).await["structuredContent"]
            ["bookings"][0]["booking"]
            .clone();
    // A burst of concurrent writes and reads makes the pool open connections.
    let calls: Vec<_> = (0..24)
        .map(|i| {
            let (worker, token, booking) = (worker.clone(), token.clone(), booking.clone());
            tokio::spawn(async move {
                tool_call(
                    &worker,
                    &token,
                    "add_booking_note",
                    json!({"booking": booking, "text": format!("burst {i}")}),
                )
                .await
            })
        })
        .collect();
    for c in calls {
        assert_eq!(c.await.expect("join")["isError"], false);
    }
    let busy = held();
    assert!(busy > 2, "the burst opened pooled connections: {busy}");
    // Idle, the worker gives them back (with time to spare for the pool's reaper).
    let mut idle = busy;
    for _ in 0..40 {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        idle = held();
        if idle <= 3 {
            break;
        }
    }
    assert!(idle <= 3, "an idle worker holds at most 3 connections, not {idle}");
}
