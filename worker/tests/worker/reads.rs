//! The read tools: versions and full times on every result (R17), paging and filters, bounded
//! pages of a large booking, and reads that wait out a lock or run in one statement.

use crate::support::*;
use worker::tools::ToolSpec;

#[tokio::test]
async fn every_read_tool_succeeds_with_versions_and_full_times() {
    let stack = Stack::start().await;
    let token = stack.token(0, 1);
    let (booking, customer, _) = handles(&stack, 0).await;
    let b =
        stack.call(&token, "get_booking", json!({"booking": booking})).await.expect("get_booking");
    assert_eq!(b["booking"], json!(booking));
    assert!(b["version"].as_str().expect("version").starts_with("v_"));
    for key in ["weekday", "local", "zone", "display", "utc", "from_now"] {
        assert!(b["starts"][key].is_string(), "starts.{key} in {b}");
    }
    assert_eq!(b["starts"]["zone"], "Europe/Berlin");
    assert_eq!(
        b["price"]["total"]["minor"].as_i64(),
        Some(
            b["price"]["net"]["minor"].as_i64().expect("net")
                + b["price"]["tax"]["minor"].as_i64().expect("tax")
        )
    );
    let c = stack
        .call(&token, "get_customer", json!({"customer": customer}))
        .await
        .expect("get_customer");
    assert_eq!(c["customer"], json!(customer));
    assert!(c["version"].is_string());
    let found =
        stack.call(&token, "find_customers", json!({"query": "fischer"})).await.expect("find");
    assert_eq!(found["count"], 1);
    let t =
        stack.call(&token, "find_technicians", json!({"skill": "heating"})).await.expect("techs");
    assert_eq!(t["count"], 2);
}

/// A search lists each booking as a summary (the fields an agent picks and acts by); its
/// version and start are get_booking's, so a write can follow a search directly, and what it
/// leaves out (the customer's note, a third party's text) is get_booking's alone.
#[tokio::test]
async fn a_search_lists_summaries_an_agent_can_act_on() {
    let stack = Stack::start().await;
    let token = stack.token(0, 1);
    let found = stack.ok(&token, "find_bookings", json!({"limit": 100})).await;
    let items = found["bookings"].as_array().expect("bookings");
    assert!(items.len() > 4, "{found}");
    let mut left_out_a_note = false;
    for item in items {
        let keys: std::collections::BTreeSet<&str> =
            item.as_object().expect("object").keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "booking",
                "customer",
                "service",
                "starts",
                "status",
                "technician",
                "total",
                "version"
            ]
            .into_iter()
            .collect(),
            "{item}"
        );
        let full = stack.ok(&token, "get_booking", json!({"booking": item["booking"]})).await;
        assert_eq!(item["version"], full["version"], "the version a write takes");
        for key in ["weekday", "local", "zone", "display", "utc"] {
            assert_eq!(item["starts"][key], full["starts"][key], "starts.{key}");
        }
        assert!(item["starts"]["from_now"].is_string(), "{item}");
        assert_eq!(item["total"], full["price"]["total"]);
        assert_eq!(item["customer"], full["customer"]);
        assert_eq!(item["service"], full["service"]);
        assert_eq!(item["technician"], full["technician"]);
        if let Some(note) = full["customer_note"]["untrusted_text"].as_str() {
            assert!(!item.to_string().contains(note), "no third-party text in a list: {item}");
            left_out_a_note = true;
        }
    }
    assert!(left_out_a_note, "the seed has a booking with a customer's note");
}

#[tokio::test]
async fn find_bookings_pages_through_everything_once() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut args = json!({"limit": 4});
        if let Some(c) = &cursor {
            args["cursor"] = json!(c);
        }
        let page = stack.call(&token, "find_bookings", args).await.expect("page");
        seen.extend(
            page["bookings"]
                .as_array()
                .expect("list")
                .iter()
                .map(|b| b["booking"].as_str().expect("h").to_owned()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    let total = stack.db.rows("bookings").tenant(&stack.seed.tenants[0].slug).count().await;
    assert_eq!(seen.len() as i64, total);
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "no booking twice");
    let err = stack
        .call(&token, "find_bookings", json!({"cursor": "not-a-cursor"}))
        .await
        .expect_err("bad cursor");
    assert_eq!(err["field"], "cursor");
}

#[tokio::test]
async fn find_bookings_filters_by_local_day_and_refuses_bad_times() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    // The spring-forward Sunday in Berlin has one demo booking.
    let day = stack
        .call(
            &token,
            "find_bookings",
            json!({"from": "2026-03-29", "to": "2026-03-29", "zone": "Europe/Berlin"}),
        )
        .await
        .expect("day");
    assert_eq!(day["count"], 1, "{day}");
    assert_eq!(day["bookings"][0]["starts"]["weekday"], "Sunday");
    // R17: a time in the gap is rejected with the options; one in the fold returns both offsets.
    let gap = stack
        .call(&token, "find_bookings", json!({"from": "2026-03-29T02:30", "zone": "Europe/Berlin"}))
        .await
        .expect_err("gap");
    assert_eq!(gap["code"], "invalid_argument");
    assert_eq!(gap["options"].as_array().expect("options").len(), 2);
    let fold = stack
        .call(&token, "find_bookings", json!({"from": "2026-10-25T02:30", "zone": "Europe/Berlin"}))
        .await
        .expect_err("fold");
    assert_eq!(fold["options"], json!(["2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00+01:00"]));
    let bare = stack
        .call(&token, "find_bookings", json!({"from": "2026-05-01T10:00"}))
        .await
        .expect_err("bare");
    assert_eq!(bare["field"], "from");
    let status = stack
        .call(&token, "find_bookings", json!({"status": "pending"}))
        .await
        .expect_err("status");
    assert_eq!(status["options"], json!(["draft", "confirmed", "cancelled", "completed"]));
    let limit =
        stack.call(&token, "find_bookings", json!({"limit": 1000})).await.expect_err("limit");
    assert_eq!(limit["field"], "limit");
}

#[tokio::test]
async fn a_booking_with_ten_thousand_notes_answers_with_a_bounded_page() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let booking: String = stack.db.first_tenants_oldest_booking().await;
    stack.db.pile_notes_on_booking(&booking, 10_000).await;
    let booking_id = stack.db.rows("bookings").eq("handle", &booking).int("id").await;
    let total = stack.db.rows("booking_notes").eq("booking_id", booking_id).count().await;
    let first = stack.ok(&token, "get_booking", json!({"booking": booking})).await;
    let notes = first["notes"].as_array().expect("notes");
    assert_eq!(notes.len(), 20, "a page, not the history");
    assert_eq!(first["notes_total"], total, "with the count of all");
    assert!(
        first.to_string().len() < 64 * 1024,
        "the result stays small: {} bytes",
        first.to_string().len()
    );
    // Newest last within the page; the cursor pages backwards with no overlap and no gap.
    let texts = |page: &Value| -> Vec<String> {
        page["notes"]
            .as_array()
            .expect("notes")
            .iter()
            .map(|n| {
                n["untrusted"]["untrusted_text"]
                    .as_str()
                    .unwrap_or_default()
                    .chars()
                    .take(12)
                    .collect()
            })
            .collect()
    };
    assert!(texts(&first).last().expect("last").starts_with("Note 10000"), "{:?}", texts(&first));
    let cursor =
        first["earlier_notes_cursor"].as_str().expect("a cursor to earlier notes").to_owned();
    let second =
        stack.ok(&token, "get_booking", json!({"booking": booking, "notes_cursor": cursor})).await;
    assert!(texts(&second).last().expect("last").starts_with("Note 9980 "), "{:?}", texts(&second));
    assert!(
        texts(&second).first().expect("first").starts_with("Note 9961 "),
        "{:?}",
        texts(&second)
    );
    // A cursor that is not one is refused with the field named, and nothing else happens.
    let err = stack
        .call(&token, "get_booking", json!({"booking": booking, "notes_cursor": "garbage"}))
        .await
        .expect_err("refused");
    assert_eq!(err["field"], "notes_cursor", "{err}");
}

/// Drops every `from_now` (a distance from the moment the result was made).
fn strip_from_now(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("from_now");
            map.values_mut().for_each(strip_from_now);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_from_now),
        _ => {}
    }
}

#[tokio::test]
async fn a_booking_locked_by_a_migration_is_read_once_the_lock_is_gone() {
    // The statement that reads the context and the booking waits for a lock only briefly (it
    // shares a connection with other requests' statements); when the bookings are locked it
    // gives up, the context is read alone, and the tool reads its booking on the pool, where
    // it waits for the lock and then answers, instead of the call failing.
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let booking = stack.db.first_tenants_oldest_booking().await;
    let mut held = Held::open(
        &stack,
        // Raw SQL on purpose: what a migration sends from its own session is this test's subject.
        "BEGIN; LOCK TABLE bookings IN ACCESS EXCLUSIVE MODE;",
        HeldLock::Table("bookings", "AccessExclusiveLock"),
    )
    .await;
    let (read, ()) =
        tokio::join!(stack.ok(&token, "get_booking", json!({"booking": booking})), async {
            // Far longer than the pipe's lock wait (50 ms), so the read-ahead has given up.
            tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
            held.send("ROLLBACK;").await;
        });
    assert_eq!(read["booking"], booking.as_str(), "{read}");
    held.end("").await;
}

#[tokio::test]
async fn a_read_with_its_context_in_one_statement_holds_every_gate() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let stack = Stack::start().await;
    let counted =
        |outcome: &str| stack.state.metrics.read_ahead.with_label_values(&[outcome]).get();
    let token = stack.token(0, 0);
    let booking: String = stack.db.first_tenants_oldest_booking().await;
    // Every tool that declares a read-ahead: a call whose body came with its headers is
    // answered from the row read with its context; a body still arriving after the headers is
    // read after authentication, as any body, and the tool reads for itself. Same answer.
    let registry = Registry::new();
    let ahead: Vec<&ToolSpec> = registry.all().iter().filter(|t| t.reads_ahead_any()).collect();
    assert!(ahead.len() >= 3, "get_booking, booking_brief and find_bookings at least");
    let small = stack.connection_with("small").await;
    let mut fast = Value::Null;
    for spec in ahead {
        // Arguments that read something: every read-ahead tool is named here, so a new one
        // cannot join the registry without this test calling it.
        let args = if spec.refs.iter().any(|r| r.field == "booking") {
            json!({"booking": booking})
        } else if spec.name == "find_bookings" {
            json!({"limit": 3})
        } else {
            panic!("{}: a read-ahead tool this test has no arguments for", spec.name)
        };
        let caller = if spec.toolsets.contains(&"full") { token.clone() } else { small.clone() };
        let (used, unused) = (counted("used"), counted("unused"));
        let quick = stack.ok(&caller, spec.name, args.clone()).await;
        assert_eq!((counted("used"), counted("unused")), (used + 1, unused), "{}", spec.name);
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": spec.name, "arguments": args,
            "_meta": {"io.modelcontextprotocol/protocolVersion": PROTOCOL, "io.modelcontextprotocol/clientCapabilities": {}}}})
        .to_string()
        .into_bytes();
        let (head, tail) = body.split_at(20);
        let addr = stack.url.trim_start_matches("http://").to_owned();
        let mut socket = tokio::net::TcpStream::connect(&addr).await.expect("connect");
        let headers = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {caller}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: {PROTOCOL}\r\nMcp-Method: tools/call\r\nMcp-Name: {}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            spec.name,
            body.len()
        );
        socket.write_all(headers.as_bytes()).await.expect("write");
        socket.write_all(head).await.expect("write");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        socket.write_all(tail).await.expect("write");
        let mut answer = Vec::new();
        socket.read_to_end(&mut answer).await.expect("read");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let json_text = &answer[answer.find("\r\n\r\n").expect("head") + 4..];
        let json_text =
            &json_text[json_text.find('{').expect("json")..=json_text.rfind('}').expect("json")];
        let slow: Value = serde_json::from_str(json_text).expect("json answer");
        let mut slow = slow["result"]["structuredContent"].clone();
        if spec.name == "find_bookings" {
            assert_eq!(slow["count"], 3, "{slow}");
        } else {
            assert_eq!(slow["booking"], booking.as_str(), "{}: {slow}", spec.name);
        }
        // Relative times ("in 3 days") may tick between the two calls; the rest is equal.
        let mut quick_cmp = quick.clone();
        for v in [&mut slow, &mut quick_cmp] {
            strip_from_now(v);
        }
        assert_eq!(slow, quick_cmp, "{}: the same answer either way", spec.name);
        assert_eq!((counted("used"), counted("unused")), (used + 1, unused), "no read-ahead");
        if spec.name == "get_booking" {
            fast = quick;
        }
    }
    // A body over 64 KiB is not parsed before authentication: served as any call, the tool
    // reading for itself.
    let (used, unused) = (counted("used"), counted("unused"));
    let padded = json!({"name": "get_booking", "arguments": {"booking": booking},
        "_meta": {"io.modelcontextprotocol/clientCapabilities": {"experimental": {"dev.example/pad": {"pad": "x".repeat(70_000)}}}}});
    let (status, _, answer) =
        stack.raw(Some(&token), "tools/call", Some("get_booking"), padded, &[]).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["structuredContent"]["booking"], booking.as_str());
    assert_eq!((counted("used"), counted("unused")), (used, unused), "no read-ahead");
    // A connection without bookings:read is refused naming the right; the row read with its
    // context is dropped unused and nothing of it reaches the answer.
    let unused = counted("unused");
    let narrow = stack
        .admin_connection(
            "customers only",
            shared::rights::RightSet::of(&[shared::rights::Right::CustomersRead]),
            "full",
        )
        .await;
    let (status, _, answer) = stack
        .raw(
            Some(&narrow),
            "tools/call",
            Some("get_booking"),
            json!({"name": "get_booking", "arguments": {"booking": booking}}),
            &[],
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert!(answer.to_string().contains("bookings:read"), "{answer}");
    let customer = fast["customer"]["name"].as_str().expect("customer name");
    assert!(!answer.to_string().contains(customer), "no booking data: {answer}");
    assert_eq!(counted("unused"), unused + 1);
    // Another tenant's booking is not found through the read-ahead either (R3): the statement
    // looked in the token's tenant only, and the tool used that answer.
    let foreign = stack.token(1, 0);
    let used = counted("used");
    let err = stack
        .call(&foreign, "get_booking", json!({"booking": booking}))
        .await
        .expect_err("foreign");
    assert_eq!(err["code"], "not_found", "{err}");
    assert_eq!(counted("used"), used + 1, "answered from the read-ahead");
    // A cursor Postgres would refuse (a NUL byte, an instant before year 1) is the caller's
    // error naming the field, never a database error or a 503 before authentication.
    use base64::Engine as _;
    for parts in [json!(["1800000000000000", "bnt_\u{0}x"]), json!(["-99999999999999999", "bnt_x"])]
    {
        let cursor = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(parts.to_string());
        let (status, _, answer) = stack
            .raw(
                Some(&token),
                "tools/call",
                Some("get_booking"),
                json!({"name": "get_booking", "arguments": {"booking": booking, "notes_cursor": cursor}}),
                &[],
            )
            .await;
        assert_eq!(status, 200, "{answer}");
        let error = &answer["result"]["structuredContent"]["error"];
        assert_eq!(error["field"], "notes_cursor", "{answer}");
    }
    // With the kill switch or the tenant's switch off, the call is refused before any tool
    // runs and nothing of the booking reaches the answer.
    let call_booking = || {
        stack.raw(
            Some(&token),
            "tools/call",
            Some("get_booking"),
            json!({"name": "get_booking", "arguments": {"booking": booking}}),
            &[],
        )
    };
    let slug = &stack.seed.tenants[0].slug;
    // The kill switch (503), then the tenant's switch (403).
    for (kill_switch, status) in [(true, 503), (false, 403)] {
        let used = counted("used");
        if kill_switch {
            stack.set_kill_switch(true).await;
        } else {
            stack.set_agent_access(slug, false).await;
        }
        let (got, _, answer) = call_booking().await;
        if kill_switch {
            stack.set_kill_switch(false).await;
        } else {
            stack.set_agent_access(slug, true).await;
        }
        assert_eq!(got, status, "{answer}");
        assert!(!answer.to_string().contains(customer), "{answer}");
        assert_eq!(counted("used"), used, "no tool ran");
    }
    // A revoked connection is refused before any tool runs, read-ahead or not.
    let ctx = stack.operator_in(0).await;
    admin::connection_revoke(
        &stack.db.ds,
        &ctx,
        &stack.seed.tenants[0].connections[0].connection,
        "test",
    )
    .await
    .expect("revoke");
    let (status, _, answer) = call_booking().await;
    assert_eq!(status, 401, "{answer}");
    assert!(!answer.to_string().contains(customer), "{answer}");
}

/// `find_bookings` reads its page in the statement that reads the call's context: every page
/// of a walk is served that way and equals the page the pool reads for a call whose body came
/// late; a search only ever sees its token's tenant (R3); a caller without `bookings:read` is
/// refused naming the right and nothing of the page reaches it; an empty page, a foreign filter
/// handle and a bad argument are answered by the tool's own read, as before.
#[tokio::test]
async fn a_search_with_its_context_in_one_statement_pages_as_the_pool_does() {
    let stack = Stack::start().await;
    let counted =
        |outcome: &str| stack.state.metrics.read_ahead.with_label_values(&[outcome]).get();
    let token = stack.token(0, 0);
    let own: std::collections::HashSet<String> = stack
        .db
        .rows("bookings")
        .tenant(&stack.seed.tenants[0].slug)
        .texts("handle", "id")
        .await
        .into_iter()
        .collect();
    assert!(own.len() > 4, "the seed has bookings to page through");
    // Walk every page three at a time: each page from the read-ahead.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut args = json!({"limit": 3});
        if let Some(c) = &cursor {
            args["cursor"] = json!(c);
        }
        let used = counted("used");
        let page = stack.ok(&token, "find_bookings", args.clone()).await;
        assert_eq!(counted("used"), used + 1, "page served from the read-ahead: {page}");
        for b in page["bookings"].as_array().expect("bookings") {
            seen.push(b["booking"].as_str().expect("handle").to_owned());
        }
        // The same page read by the tool itself (the service, without a read-ahead).
        let ctx = stack.connection_ctx(&token).await;
        let input: shared::services::bookings::FindBookingsInput =
            serde_json::from_value(args).expect("input");
        let found =
            shared::services::bookings::find(&stack.db.ds, &ctx, &input).await.expect("find");
        let handles: Vec<&str> = found.items.iter().map(|b| b.handle.as_str()).collect();
        let served: Vec<&str> = page["bookings"]
            .as_array()
            .expect("bookings")
            .iter()
            .map(|b| b["booking"].as_str().expect("handle"))
            .collect();
        assert_eq!(served, handles, "the same page either way");
        assert_eq!(page["next_cursor"].as_str(), found.next_cursor.as_deref());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let distinct: std::collections::HashSet<String> = seen.iter().cloned().collect();
    assert_eq!(distinct.len(), seen.len(), "no booking twice: {seen:?}");
    assert_eq!(distinct, own, "every booking of the tenant, and only those (R3)");
    // Another tenant's token searches its own tenant only.
    let foreign = stack.ok(&stack.token(1, 0), "find_bookings", json!({"limit": 100})).await;
    for b in foreign["bookings"].as_array().expect("bookings") {
        assert!(!own.contains(b["booking"].as_str().expect("handle")), "{b}");
    }
    // A search filtered by status, technician or customer may walk a large tenant's whole
    // index: it reads on the pool, never on the pipe every context lookup shares.
    let used = counted("used");
    let filtered =
        stack.ok(&token, "find_bookings", json!({"status": "confirmed", "limit": 3})).await;
    assert!(filtered["count"].as_u64().is_some(), "{filtered}");
    assert_eq!(counted("used"), used, "no read-ahead for a filtered search");
    // An empty page is not answered from the read-ahead (a gate may have emptied it).
    let used = counted("used");
    let empty = stack
        .ok(
            &token,
            "find_bookings",
            json!({"from": "1990-01-01", "to": "1990-01-02", "zone": "UTC"}),
        )
        .await;
    assert_eq!(empty["count"], 0, "{empty}");
    assert_eq!(counted("used"), used, "the tool searched for itself");
    // Another tenant's technician as a filter: not found, as before.
    let other_tech = stack
        .db
        .rows("technicians")
        .tenant(&stack.seed.tenants[1].slug)
        .texts("handle", "id")
        .await
        .into_iter()
        .next()
        .expect("a technician of the other tenant");
    let err = stack
        .call(&token, "find_bookings", json!({"technician": other_tech}))
        .await
        .expect_err("foreign technician");
    assert_eq!(err["code"], "not_found", "{err}");
    // A bad argument is the caller's error naming the field; nothing was read ahead.
    let err = stack
        .call(&token, "find_bookings", json!({"status": "lost"}))
        .await
        .expect_err("bad status");
    assert_eq!(err["field"], "status", "{err}");
    // Without bookings:read: refused naming the right, the page dropped unused.
    let narrow = stack
        .admin_connection(
            "customers only",
            shared::rights::RightSet::of(&[shared::rights::Right::CustomersRead]),
            "full",
        )
        .await;
    let unused = counted("unused");
    let (status, _, answer) = stack
        .raw(
            Some(&narrow),
            "tools/call",
            Some("find_bookings"),
            json!({"name": "find_bookings", "arguments": {"limit": 3}}),
            &[],
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert!(answer.to_string().contains("bookings:read"), "{answer}");
    assert!(!own.iter().any(|h| answer.to_string().contains(h.as_str())), "{answer}");
    assert_eq!(counted("unused"), unused + 1);
}
