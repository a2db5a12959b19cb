//! Write rails for bookings, customers and alerts (R8–R11, R19): silent writes run once and
//! reach nobody, retries replay, business keys name the existing record, stale versions
//! conflict, mutes are bounded and deletes check what depends on them.

use crate::support::*;

#[tokio::test]
async fn a_repeated_silent_write_executes_once_and_reaches_nobody() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let args =
        json!({"name": "Greta Lindqvist", "email": "greta@example.net", "phone": "+49 30 5550199"});
    let first = stack.ok(&token, "create_customer", args.clone()).await;
    assert_eq!(first["replayed"], false);
    // The same call again with a new JSON-RPC id, as a client re-sends after a broken stream.
    let second = stack.ok(&token, "create_customer", json!({"phone": "+49 30 5550199 ", "email": " greta@example.net", "name": "Greta Lindqvist"})).await;
    assert_eq!(second["replayed"], true);
    assert_eq!(second["customer"], first["customer"], "the first result, replayed");
    assert_eq!(stack.db.rows("customers").eq("email", "greta@example.net").count().await, 1);
    // R19: one audit row, channel mcp, connection and client as columns.
    assert_eq!(
        stack
            .db
            .rows("audit_log")
            .eq("action", "create_customer")
            .eq("channel", "mcp")
            .not_null("connection_name")
            .eq("client_name", "demo")
            .count()
            .await,
        1
    );
    // An idempotency key is bound to its arguments.
    let keyed = json!({"booking": stack.draft(0).await["booking"], "text": "Gate code 4711", "idempotency_key": "note-1"});
    stack.ok(&token, "add_booking_note", keyed.clone()).await;
    // What an agent wrote may relay what a third party planted: the next reader gets it
    // wrapped, with its source, never as plain staff text (R13).
    let read = stack.ok(&token, "get_booking", json!({"booking": keyed["booking"]})).await;
    let note = read["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .find(|n| n["untrusted"]["untrusted_text"] == "Gate code 4711")
        .unwrap_or_else(|| panic!("the agent's note, wrapped: {read}"))
        .clone();
    assert_eq!(note["source"], "agent", "{note}");
    assert!(note.get("text").is_none(), "not shown as staff text: {note}");
    let mut other = keyed.clone();
    other["text"] = json!("Gate code 0000");
    let err = stack.call(&token, "add_booking_note", other).await.expect_err("key reuse");
    assert_eq!(err["field"], "idempotency_key");
    assert_eq!(stack.db.rows("booking_notes").like("body", "Gate code%").count().await, 1);
    // R6: silent tools dispatch nothing.
    let booking = stack.draft(0).await;
    stack.ok(&token, "update_booking", json!({"booking": booking["booking"], "version": booking["version"], "priority": "high", "reference": "WO-1"})).await;
    assert_eq!(stack.db.count("outbox").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_identical_silent_writes_execute_once() {
    let stack = Arc::new(Stack::start().await);
    let token = stack.token(0, 0);
    let booking = stack.draft(0).await["booking"].clone();
    let calls = (0..12).map(|_| {
        let (stack, token, booking) = (stack.clone(), token.clone(), booking.clone());
        tokio::spawn(async move {
            stack
                .ok(
                    &token,
                    "add_booking_note",
                    json!({"booking": booking, "text": "Customer called twice"}),
                )
                .await
        })
    });
    let mut replayed = 0;
    for c in calls {
        replayed += usize::from(c.await.expect("join")["replayed"] == true);
    }
    assert_eq!(replayed, 11);
    assert_eq!(stack.db.rows("booking_notes").eq("body", "Customer called twice").count().await, 1);
}

#[tokio::test]
async fn creating_twice_with_the_same_business_key_names_the_existing_record() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let first = stack
        .ok(&token, "create_customer", json!({"name": "Hanna Berg", "email": "hanna@example.net"}))
        .await;
    let handle = first["customer"]["customer"].as_str().expect("handle").to_owned();
    let err = stack
        .call(&token, "create_customer", json!({"name": "H. Berg", "email": "HANNA@example.net"}))
        .await
        .expect_err("duplicate");
    assert_eq!(err["code"], "duplicate");
    assert_eq!(err["existing"], json!(handle));
    assert_eq!(err["next_tool"], "update_customer");
    let err = stack
        .call(
            &token,
            "create_customer",
            json!({"name": "H. Berg", "email": "hanna@example.net", "separate": true}),
        )
        .await
        .expect_err("no reason");
    assert_eq!(err["field"], "reason");
    assert_eq!(stack.db.customers_with_email_any_case("hanna@example.net").await, 1);
    stack.ok(&token, "create_customer", json!({"name": "H. Berg", "email": "hanna@example.net", "separate": true, "reason": "Her daughter shares the address"})).await;
    assert_eq!(stack.db.customers_kept_separate_with_email("hanna@example.net").await, 1);
    // Bookings: customer + service + start.
    let service =
        stack.ok(&token, "find_services", json!({})).await["services"][0]["service"].clone();
    let args = json!({"customer": handle, "service": service, "start": "2027-02-10T09:00", "zone": "Europe/Berlin"});
    let created = stack.ok(&token, "create_booking", args.clone()).await;
    assert_eq!(created["booking"]["status"], "draft");
    assert_eq!(created["booking"]["starts"]["local"], "2027-02-10T09:00:00+01:00");
    let mut again = args.clone();
    again["start"] = json!("2027-02-10T08:00:00Z");
    again["zone"] = Value::Null;
    let err = stack.call(&token, "create_booking", again).await.expect_err("duplicate booking");
    assert_eq!(err["existing"], created["booking"]["booking"]);
    assert_eq!(err["next_tool"], "update_booking");
    // R17: a start in the spring gap is refused with the options.
    let err = stack.call(&token, "create_booking", json!({"customer": handle, "service": service, "start": "2026-03-29 02:30", "zone": "Europe/Berlin"})).await.expect_err("gap");
    assert_eq!(err["options"].as_array().expect("options").len(), 2);
}

#[tokio::test]
async fn an_update_with_a_stale_version_conflicts_and_changes_nothing() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let found = stack.ok(&token, "find_customers", json!({"query": "fischer"})).await;
    let read = found["customers"][0].clone();
    // Someone else edits the customer first.
    let edited = stack.ok(&stack.second_connection().await, "update_customer", json!({"customer": read["customer"], "version": read["version"], "phone": "+49 30 5550999"})).await;
    let err = stack
        .call(
            &token,
            "update_customer",
            json!({"customer": read["customer"], "version": read["version"], "name": "Anna F."}),
        )
        .await
        .expect_err("stale");
    assert_eq!(err["code"], "conflict");
    assert_eq!(err["current_version"], edited["customer"]["version"]);
    assert_eq!(err["current"]["phone"], "+49 30 5550999");
    assert_eq!(
        stack.db.rows("customers").eq("name", "Anna Fischer").count().await,
        1,
        "row unchanged"
    );
    // A booking's time is what the customer sees: drafts only.
    let confirmed = stack
        .ok(&token, "find_bookings", json!({"status": "confirmed", "limit": 1}))
        .await["bookings"][0]
        .clone();
    let err = stack.call(&token, "update_booking", json!({"booking": confirmed["booking"], "version": confirmed["version"], "start": "2027-01-01T10:00:00+01:00"})).await.expect_err("wrong state");
    assert_eq!(err["code"], "wrong_state");
    assert_eq!(err["next_tool"], "reschedule_booking");
}

#[tokio::test]
async fn alerts_mute_for_a_bounded_time_and_deletes_check_what_depends_on_them() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let rule = stack.ok(&token, "find_alert_rules", json!({})).await["rules"][0].clone();
    assert!(rule["muted_until"].is_null());
    let err = stack
        .call(&token, "mute_alerts", json!({"rule": rule["rule"], "minutes": 600}))
        .await
        .expect_err("too long");
    assert_eq!(err["field"], "minutes");
    let preview =
        stack.ok(&token, "mute_alerts", json!({"rule": rule["rule"], "minutes": 30})).await;
    stack.ok(&token, "confirm_action", json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]})).await;
    let muted = stack.ok(&token, "find_alert_rules", json!({})).await["rules"][0].clone();
    assert!(muted["muted_until"]["from_now"].as_str().expect("from_now").starts_with("in "));
    // A customer with bookings cannot be deleted; a new one can.
    let with_bookings = stack.ok(&token, "find_customers", json!({"query": "Fischer"})).await["customers"][0]["customer"].clone();
    let err = stack
        .call(&token, "delete_customer", json!({"customer": with_bookings}))
        .await
        .expect_err("has bookings");
    assert_eq!(err["code"], "wrong_state");
    let created = stack
        .ok(&token, "create_customer", json!({"name": "Temp", "email": "temp@example.net"}))
        .await;
    let preview = stack
        .ok(&token, "delete_customer", json!({"customer": created["customer"]["customer"]}))
        .await;
    stack.ok(&token, "confirm_action", json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]})).await;
    assert_eq!(stack.db.rows("customers").eq("email", "temp@example.net").count().await, 0);
    // A read-only connection cannot prepare or confirm anything.
    let err = stack
        .call(&stack.token(0, 1), "delete_booking", json!({"booking": "bkg_0000000000000000"}))
        .await
        .expect_err("hidden");
    assert_eq!(err["code"], "permission_denied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_creates_with_one_business_key_make_one_record() {
    let stack = Arc::new(Stack::start().await);
    let token = stack.token(0, 0);
    // Each key with the form its rows are counted by: the email in lower case, the phone's
    // digits.
    for (field, value, key) in [
        ("email", "race@example.net", "race@example.net"),
        ("phone", "+49 30 5550 1234", "+493055501234"),
    ] {
        let calls = (0..20).map(|i| {
            let stack = stack.clone();
            let token = token.clone();
            let args = json!({"name": format!("Racer {i}"), field: value});
            tokio::spawn(async move { stack.call(&token, "create_customer", args).await })
        });
        let mut created = 0;
        for call in futures_util::future::join_all(calls).await {
            match call.expect("task") {
                Ok(_) => created += 1,
                Err(e) => assert_eq!(e["code"], "duplicate", "{field}: {e}"),
            }
        }
        assert_eq!(created, 1, "{field}: exactly one call creates");
        let rows = if field == "email" {
            stack.db.customers_with_email_any_case(key).await
        } else {
            stack.db.customers_with_phone_digits(key).await
        };
        assert_eq!(rows, 1, "{field}: one row");
    }
}

#[tokio::test]
async fn the_mute_that_executes_ends_when_its_preview_said() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let rule = stack.ok(&token, "find_alert_rules", json!({})).await["rules"][0]["rule"].clone();
    let preview = stack.ok(&token, "mute_alerts", json!({"rule": rule, "minutes": 30})).await;
    let promised = preview["effect"]["until"]["utc"].clone();
    // The person takes a while to agree: the end time stays the one shown.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let done = stack.ok(&token, "confirm_action", json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]})).await;
    assert_eq!(done["result"]["changed"]["muted_until"]["utc"], promised, "{done}");
    let stored = stack.db.alert_rule_muted_until_utc(rule.as_str().expect("h")).await;
    assert_eq!(json!(stored), promised);
    // A preview whose window has passed executes nothing.
    let rule2 = stack.ok(&token, "find_alert_rules", json!({})).await["rules"][1]["rule"].clone();
    let preview = stack.ok(&token, "mute_alerts", json!({"rule": rule2, "minutes": 5})).await;
    stack.db.age_pending_action(preview["action"].as_str().expect("h"), "6 minutes").await;
    let err = stack
        .call(&token, "confirm_action", json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]}))
        .await
        .expect_err("window passed");
    assert_eq!(err["code"], "wrong_state", "{err}");
    let muted = stack
        .db
        .rows("alert_rules")
        .eq("handle", rule2.as_str().expect("h"))
        .not_null("muted_until")
        .count()
        .await;
    assert_eq!(muted, 0);
}

#[tokio::test]
async fn replay_ignores_nulls_and_keys_and_bounds_its_keys() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let (booking, _, _) = handles(&stack, 0).await;
    let booking_id = stack.db.rows("bookings").eq("handle", &booking).int("id").await;
    let notes = |body: &str| {
        stack.db.rows("booking_notes").eq("booking_id", booking_id).eq("body", body).count()
    };
    // An optional field sent as null is the same call as one that leaves it out, and so is
    // the same call under another idempotency key.
    stack.ok(&token, "add_booking_note", json!({"booking": booking, "text": "Same note"})).await;
    for again in [
        json!({"booking": booking, "text": "Same note", "idempotency_key": null}),
        json!({"booking": booking, "text": "Same note", "idempotency_key": "another-key"}),
    ] {
        let second = stack.ok(&token, "add_booking_note", again.clone()).await;
        assert_eq!(second["replayed"], true, "{again}");
    }
    assert_eq!(notes("Same note").await, 1);
    // The key of a call answered from the replay cache now names that call: other arguments
    // under it are refused, not executed.
    let err = stack
        .call(
            &token,
            "add_booking_note",
            json!({"booking": booking, "text": "A different note", "idempotency_key": "another-key"}),
        )
        .await
        .expect_err("a key names one call");
    assert_eq!(err["field"], "idempotency_key", "{err}");
    assert_eq!(notes("A different note").await, 0);
    // Keys are at most 200 printable characters.
    for key in ["k".repeat(201), "bad\u{0007}key".to_owned()] {
        let err = stack
            .call(
                &token,
                "add_booking_note",
                json!({"booking": booking, "text": "Other note", "idempotency_key": key}),
            )
            .await
            .expect_err("key");
        assert_eq!(err["field"], "idempotency_key", "{err}");
    }
    let ok = stack
        .ok(
            &token,
            "add_booking_note",
            json!({"booking": booking, "text": "Other note", "idempotency_key": "k".repeat(200)}),
        )
        .await;
    assert_eq!(ok["replayed"], false);
}

/// Notes on one busy booking are written side by side: twenty at once all land, the count read
/// with the booking says so, and the booking's own row is never rewritten for them (the count
/// lives in sharded rows beside it, and adding a note holds the booking against deletion only).
#[tokio::test]
async fn notes_added_at_once_to_one_booking_all_land_without_rewriting_it() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let (booking, _, _) = handles(&stack, 0).await;
    let before = stack.call(&token, "get_booking", json!({"booking": booking})).await.expect("get");
    let total_before = before["notes_total"].as_i64().expect("total");
    let row_version = || stack.db.rows("bookings").eq("handle", &booking).text("xmin");
    let xmin = row_version().await;
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let (stack_url, token, booking) = (stack.url.clone(), token.clone(), booking.clone());
            let http = stack.http.clone();
            tokio::spawn(async move {
                let body = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
                    "name": "add_booking_note", "arguments": {"booking": booking, "text": format!("side by side {i}")},
                    "_meta": {"io.modelcontextprotocol/protocolVersion": PROTOCOL, "io.modelcontextprotocol/clientCapabilities": {}}}});
                http.post(format!("{stack_url}/mcp"))
                    .header("Content-Type", "application/json")
                    .header("Accept", "application/json, text/event-stream")
                    .header("MCP-Protocol-Version", PROTOCOL)
                    .header("Mcp-Method", "tools/call")
                    .header("Mcp-Name", "add_booking_note")
                    .bearer_auth(token)
                    .body(body.to_string())
                    .send()
                    .await
                    .expect("call")
                    .json::<Value>()
                    .await
                    .expect("json")
            })
        })
        .collect();
    for c in calls {
        let r = c.await.expect("join");
        assert_eq!(r["result"]["isError"], false, "{r}");
    }
    let after = stack.call(&token, "get_booking", json!({"booking": booking})).await.expect("get");
    assert_eq!(after["notes_total"].as_i64(), Some(total_before + 20));
    assert_eq!(row_version().await, xmin, "the booking's row was not rewritten");
    // Deleting a note counts down; the sum over the shards stays the truth.
    stack.db.rows("booking_notes").eq("body", "side by side 3").delete().await;
    let after = stack.call(&token, "get_booking", json!({"booking": booking})).await.expect("get");
    assert_eq!(after["notes_total"].as_i64(), Some(total_before + 19));
}
