//! A failover with nothing lost: a primary with a synchronous streaming standby (initdb +
//! pg_basebackup), a fleet whose `DATABASE_URL` names both, and the standby promoted while
//! twelve clients write and confirm. Every acknowledged write survives once, no effect happens
//! twice, and calls are answered again within seconds.

use crate::support::*;
use e2e::PrivatePostgres;

/// `host:port` of a private server's URL.
fn address(pg: &PrivatePostgres) -> String {
    pg.url.rsplit('@').next().unwrap_or_default().to_owned()
}

/// Sends a call until it is answered (a 503 or a refused connection is retried with the same
/// arguments, as a client does); returns the result and how long the longest gap lasted.
async fn until_answered(
    base: &str,
    token: &str,
    tool: &str,
    args: Value,
) -> (Value, std::time::Duration) {
    let started = std::time::Instant::now();
    loop {
        let result = tool_call(base, token, tool, args.clone()).await;
        if result["isError"] == false
            || (result["isError"] == true
                && result["structuredContent"]["error"]["code"] != "unavailable"
                && result["structuredContent"]["error"]["code"] != "internal")
        {
            return (result, started.elapsed());
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "{tool} never answered: {result}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn promoting_a_synchronous_standby_under_writers_loses_and_doubles_nothing() {
    let primary = PrivatePostgres::start("failover-primary").expect("primary");
    let standby = PrivatePostgres::standby_of(&primary, "failover-standby", true).expect("standby");
    let mut opts = Options::for_test("failover", 2);
    opts.pg_server = format!("postgres://postgres@{},{}", address(&primary), address(&standby));
    let stack = Stack::start(opts).await.expect("stack on the primary");
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    stack
        .ctl(&[
            "rate-limit",
            "set",
            "--tenant",
            &slug,
            "--class",
            "silent_write",
            "--per-minute",
            "100000",
        ])
        .expect("rate limit");
    stack
        .ctl(&[
            "rate-limit",
            "set",
            "--tenant",
            &slug,
            "--class",
            "notify",
            "--per-minute",
            "100000",
        ])
        .expect("rate limit");
    for scope in ["notify", "send_customer_message"] {
        let args = [
            "approval-policy",
            "set",
            "--tenant",
            &slug,
            "--scope",
            scope,
            "--mode",
            "agent_confirms",
        ];
        stack.ctl(&args).expect("agents confirm");
    }
    let token = stack.token(0, 0);
    let lb = stack.lb_url.clone();
    let booking = tool_call(&lb, &token, "find_bookings", json!({"limit": 1})).await["structuredContent"]["bookings"][0]["booking"].clone();
    let customer =
        tool_call(&lb, &token, "find_customers", json!({"query": "a"})).await["structuredContent"]
            ["customers"][0]["customer"]
            .clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    // Ten clients add notes; two prepare and confirm messages. Each call is sent until it is
    // answered, with the same arguments, as a client retries.
    for w in 0..12 {
        let (lb, token, booking, customer, stop) =
            (lb.clone(), token.clone(), booking.clone(), customer.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            let mut confirmed = Vec::new();
            let mut longest = std::time::Duration::ZERO;
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                if w < 10 {
                    let text = format!("failover w{w} n{n}");
                    let (r, gap) = until_answered(&lb, &token, "add_booking_note", json!({"booking": booking, "text": text})).await;
                    assert_eq!(r["isError"], false, "{r}");
                    longest = longest.max(gap);
                    acknowledged.push(text);
                } else {
                    let subject = format!("failover w{w} n{n}");
                    let (preview, gap) = until_answered(&lb, &token, "send_customer_message", json!({"customer": customer, "subject": subject, "body": "On our way."})).await;
                    longest = longest.max(gap);
                    let args = json!({"confirm_token": preview["structuredContent"]["confirm_token"], "confirm_summary": preview["structuredContent"]["confirm_summary"]});
                    let (done, gap) = until_answered(&lb, &token, "confirm_action", args).await;
                    longest = longest.max(gap);
                    // A confirmation retried after its first answer was lost is told it was used.
                    let ok = done["isError"] == false
                        || done["structuredContent"]["error"]["code"] == "token_used";
                    assert!(ok, "{done}");
                    confirmed.push(subject);
                }
            }
            (acknowledged, confirmed, longest)
        }));
    }
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    primary.stop().expect("the primary fails");
    standby.promote().expect("the standby takes over");
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acknowledged = Vec::new();
    let mut confirmed = Vec::new();
    let mut longest = std::time::Duration::ZERO;
    for w in writers {
        let (a, c, l) = w.await.expect("writer");
        acknowledged.extend(a);
        confirmed.extend(c);
        longest = longest.max(l);
    }
    assert!(acknowledged.len() > 50, "the writers wrote: {}", acknowledged.len());
    // On the new primary: every acknowledged note once, every confirmed message once.
    let db = TestDb::attach(&stack.database_url).await;
    let notes = db.rows("booking_notes").like("body", "failover w%").texts("body", "id").await;
    for text in &acknowledged {
        assert_eq!(notes.iter().filter(|b| *b == text).count(), 1, "{text}: lost or doubled");
    }
    let sent = db.rows("outbox").like("subject", "failover w%").texts("subject", "id").await;
    for subject in &confirmed {
        assert_eq!(sent.iter().filter(|s| *s == subject).count(), 1, "{subject}: lost or doubled");
    }
    assert!(
        sent.len() <= confirmed.len() + 2,
        "no message went out twice: {} for {}",
        sent.len(),
        confirmed.len()
    );
    // A liveness bound, not a speed claim (the figure is printed and kept in operations.md).
    assert!(longest < std::time::Duration::from_secs(30), "answered again: {longest:?}");
    println!(
        "failover: {} notes and {} messages acknowledged, none lost or doubled; longest wait {longest:?}",
        acknowledged.len(),
        confirmed.len()
    );
}
