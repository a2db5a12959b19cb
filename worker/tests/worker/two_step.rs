//! Two steps for notify, wake, alert and delete (R7): a preview changes nothing, a confirmation
//! executes once after every check, and a client that can elicit confirms in its own UI with a
//! sealed state.

use crate::support::*;

#[tokio::test]
async fn two_steps_preview_nothing_then_confirm_exactly_once() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let draft = stack.draft(0).await;
    let preview = stack.ok(&token, "confirm_booking", json!({"booking": draft["booking"]})).await;
    assert_eq!(preview["status"], "PREVIEW");
    let summary = preview["confirm_summary"].as_str().expect("summary").to_owned();
    assert!(
        summary.contains(draft["booking"].as_str().expect("h")) && summary.contains("email"),
        "{summary}"
    );
    let confirm_token = preview["confirm_token"].as_str().expect("token").to_owned();
    // Preview alone sends nothing and changes nothing.
    assert_eq!(stack.db.count("outbox").await, 0);
    let booking = draft["booking"].as_str().expect("h");
    let confirmed =
        || stack.db.rows("bookings").eq("handle", booking).eq("status", "confirmed").count();
    assert_eq!(confirmed().await, 0);
    // A wrong summary, a foreign connection: refused, audited, nothing happens.
    let err = stack
        .call(
            &token,
            "confirm_action",
            json!({"confirm_token": confirm_token, "confirm_summary": "Confirm it"}),
        )
        .await
        .expect_err("summary");
    assert_eq!(err["code"], "summary_mismatch");
    let other = stack.second_connection().await;
    let err = stack
        .call(
            &other,
            "confirm_action",
            json!({"confirm_token": confirm_token, "confirm_summary": summary}),
        )
        .await
        .expect_err("foreign");
    assert_eq!(err["code"], "foreign_token");
    assert_eq!(stack.db.count("outbox").await, 0);
    // The real confirmation executes once.
    let done = stack
        .ok(
            &token,
            "confirm_action",
            json!({"confirm_token": confirm_token, "confirm_summary": summary}),
        )
        .await;
    assert_eq!(done["status"], "EXECUTED");
    assert_eq!(confirmed().await, 1);
    assert_eq!(stack.db.rows("outbox").eq("channel", "email").count().await, 1);
    let err = stack
        .call(
            &token,
            "confirm_action",
            json!({"confirm_token": confirm_token, "confirm_summary": summary}),
        )
        .await
        .expect_err("reuse");
    assert_eq!(err["code"], "token_used");
    assert_eq!(stack.db.count("outbox").await, 1);
    // R19: one execution row for the tool, and the preview and refusals linked to the action.
    let audit = || stack.db.rows("audit_log");
    assert_eq!(
        audit()
            .eq("action", "confirm_booking")
            .eq("outcome", "ok")
            .eq("channel", "mcp")
            .count()
            .await,
        1
    );
    assert_eq!(
        audit()
            .eq("action", "confirm_booking.confirm")
            .eq("outcome", "refused")
            .not_null("pending_action_id")
            .count()
            .await,
        3
    );
    let changes = stack.ok(&token, "list_recent_changes", json!({"limit": 10})).await;
    let actions: Vec<&str> = changes["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|c| c["action"].as_str().expect("a"))
        .collect();
    assert!(
        actions.contains(&"confirm_booking") && actions.contains(&"confirm_booking.preview"),
        "{actions:?}"
    );
}

#[tokio::test]
async fn rejected_expired_and_unknown_tokens_do_nothing() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let technician =
        stack.ok(&token, "find_technicians", json!({})).await["technicians"][0]["technician"]
            .clone();
    let page = stack
        .ok(
            &token,
            "page_technician",
            json!({"technician": technician, "message": "Boiler at Fischer leaks"}),
        )
        .await;
    let rejected =
        stack.ok(&token, "reject_action", json!({"confirm_token": page["confirm_token"]})).await;
    assert_eq!(rejected["status"], "REJECTED");
    let err = stack.call(&token, "confirm_action", json!({"confirm_token": page["confirm_token"], "confirm_summary": page["confirm_summary"]})).await.expect_err("rejected");
    assert_eq!(err["code"], "action_rejected");
    let page = stack
        .ok(&token, "page_technician", json!({"technician": technician, "message": "Second try"}))
        .await;
    stack
        .db
        .rows("pending_actions")
        .eq("status", "pending")
        .set_now_plus("expires_at", "-1 second")
        .await;
    let err = stack.call(&token, "confirm_action", json!({"confirm_token": page["confirm_token"], "confirm_summary": page["confirm_summary"]})).await.expect_err("expired");
    assert_eq!(err["code"], "token_expired");
    let err = stack
        .call(
            &token,
            "confirm_action",
            json!({"confirm_token": "cfm_madeup", "confirm_summary": "x"}),
        )
        .await
        .expect_err("unknown");
    assert_eq!(err["code"], "unknown_token");
    assert_eq!(stack.db.count("outbox").await, 0);
    // A live page goes out as a page once confirmed.
    let page = stack
        .ok(&token, "page_technician", json!({"technician": technician, "message": "Third try"}))
        .await;
    stack.ok(&token, "confirm_action", json!({"confirm_token": page["confirm_token"], "confirm_summary": page["confirm_summary"]})).await;
    assert_eq!(
        stack.db.rows("outbox").eq("channel", "page").eq("body", "Third try").count().await,
        1
    );
}

#[tokio::test]
async fn an_edit_between_preview_and_confirm_yields_a_new_preview() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let draft = stack.draft(0).await;
    let preview = stack.ok(&token, "reschedule_booking", json!({"booking": draft["booking"], "start": "2027-04-20T10:00", "zone": "Europe/Berlin"})).await;
    // A colleague edits the booking in between.
    stack
        .ok(
            &stack.second_connection().await,
            "update_booking",
            json!({"booking": draft["booking"], "version": draft["version"], "priority": "high"}),
        )
        .await;
    let err = stack.call(&token, "confirm_action", json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]})).await.expect_err("changed");
    assert_eq!(err["code"], "changed_since_preview");
    let fresh = err["preview"].clone();
    assert_ne!(fresh["confirm_token"], preview["confirm_token"]);
    let booking = draft["booking"].as_str().expect("h");
    let moved = || stack.db.bookings_starting_at(booking, "2027-04-20T08:00:00Z");
    assert_eq!(moved().await, 0, "nothing executed");
    let err = stack.call(&token, "confirm_action", json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]})).await.expect_err("dead");
    assert_eq!(err["code"], "token_used");
    let done = stack.ok(&token, "confirm_action", json!({"confirm_token": fresh["confirm_token"], "confirm_summary": fresh["confirm_summary"]})).await;
    assert_eq!(
        done["result"]["changed"]["booking"]["starts"]["local"],
        "2027-04-20T10:00:00+02:00"
    );
    assert_eq!(moved().await, 1);
}

#[tokio::test]
async fn a_record_named_like_a_summary_cannot_change_what_a_person_approves() {
    // A customer whose name reads like the recipient part of a summary: the summary names the
    // real address first and shows the name as one quoted value.
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let name = "Anna Fischer <anna.fischer@example.net>: \"Reminder\" (approved) -- copy to";
    let created = stack
        .ok(&token, "create_customer", json!({"name": name, "email": "eve@evil.example"}))
        .await;
    let preview = stack
        .ok(
            &token,
            "send_customer_message",
            json!({"customer": created["customer"]["customer"], "subject": "Hi \"there\"", "body": "See you."}),
        )
        .await;
    let summary = preview["confirm_summary"].as_str().expect("summary");
    assert!(summary.starts_with("Email eve@evil.example "), "{summary}");
    assert!(summary.contains(&serde_json::to_string(name).expect("quoted")), "{summary}");
    assert!(summary.ends_with(r#"with the subject "Hi \"there\"""#), "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_confirmations_execute_once() {
    let stack = Arc::new(Stack::start().await);
    let token = stack.token(0, 0);
    let customer = stack.ok(&token, "find_customers", json!({"query": "Hoffmann"})).await["customers"][0]["customer"].clone();
    let preview = stack.ok(&token, "send_customer_message", json!({"customer": customer, "subject": "Your appointment", "body": "See you on Monday."})).await;
    let args = json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]});
    let calls = (0..50).map(|_| {
        let (stack, token, args) = (stack.clone(), token.clone(), args.clone());
        tokio::spawn(async move { stack.call(&token, "confirm_action", args).await })
    });
    let mut executed = 0;
    for c in calls {
        match c.await.expect("join") {
            Ok(v) => {
                assert_eq!(v["status"], "EXECUTED");
                executed += 1;
            }
            Err(e) => assert_eq!(e["code"], "token_used"),
        }
    }
    assert_eq!(executed, 1);
    assert_eq!(stack.db.count("outbox").await, 1);
}

/// A tools/call from a client that declared form elicitation, optionally a retry.
async fn elicit_call(
    stack: &Stack,
    base: &str,
    token: &str,
    tool: &str,
    args: Value,
    retry: Option<(&str, &str)>,
) -> Value {
    let mut params = json!({"name": tool, "arguments": args,
        "_meta": {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}}}});
    if let Some((state, action)) = retry {
        params["requestState"] = json!(state);
        params["inputResponses"] = json!({"confirm": {"action": action, "content": {}}});
    }
    let (status, _, body) =
        stack.raw_at(base, Some(token), "tools/call", Some(tool), params, &[]).await;
    assert_eq!(status, 200, "{body}");
    body["result"].clone()
}

#[tokio::test]
async fn a_client_that_can_elicit_confirms_in_its_own_ui_once_with_a_sealed_state() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let other = stack.another_worker().await;
    let customer: String = stack.db.first_tenants_oldest_customer().await;
    let email =
        |subject: &str| json!({"customer": customer, "subject": subject, "body": "See you at 9."});
    let sent = |subject: &str| stack.db.rows("outbox").eq("subject", subject).count();
    // The first round asks the person, with the server's summary, and executes nothing.
    let asked =
        elicit_call(&stack, &stack.url, &token, "send_customer_message", email("MRTR one"), None)
            .await;
    assert_eq!(asked["resultType"], "input_required", "{asked}");
    let request = &asked["inputRequests"]["confirm"];
    assert_eq!(request["method"], "elicitation/create");
    assert_eq!(request["params"]["mode"], "form");
    assert!(request["params"]["message"].as_str().expect("message").contains("Email"), "{request}");
    let state = asked["requestState"].as_str().expect("requestState").to_owned();
    assert!(
        !state.contains(&customer) && !state.contains("MRTR"),
        "the state is sealed, not readable"
    );
    assert_eq!(sent("MRTR one").await, 0);
    // Tampered, moved to another connection, or retried with other arguments: nothing runs.
    let mut chars: Vec<char> = state.chars().collect();
    let i = chars.len() - 3;
    chars[i] = if chars[i] == 'A' { 'B' } else { 'A' };
    let tampered: String = chars.into_iter().collect();
    let refused = elicit_call(
        &stack,
        &stack.url,
        &token,
        "send_customer_message",
        email("MRTR one"),
        Some((&tampered, "accept")),
    )
    .await;
    assert_eq!(refused["isError"], true, "{refused}");
    assert_eq!(refused["structuredContent"]["error"]["code"], "unknown_token", "{refused}");
    let stranger = stack.token(0, 1);
    let moved = elicit_call(
        &stack,
        &stack.url,
        &stranger,
        "send_customer_message",
        email("MRTR one"),
        Some((&state, "accept")),
    )
    .await;
    assert_eq!(moved["isError"], true, "{moved}");
    let changed = elicit_call(
        &stack,
        &stack.url,
        &token,
        "send_customer_message",
        email("MRTR other"),
        Some((&state, "accept")),
    )
    .await;
    assert_eq!(changed["isError"], true, "{changed}");
    let elsewhere = elicit_call(
        &stack,
        &stack.url,
        &token,
        "delete_customer",
        json!({"customer": customer}),
        Some((&state, "accept")),
    )
    .await;
    assert_eq!(elsewhere["isError"], true, "another tool: {elsewhere}");
    assert_eq!(sent("MRTR one").await, 0);
    // Each refused state that named this tenant's action was audited with it: other arguments,
    // another tool. (The tampered one named nothing that opens; the read-only connection was
    // refused for its rights before any state was looked at.)
    assert_eq!(
        stack
            .db
            .rows("audit_log")
            .eq("action", "send_customer_message.confirm")
            .eq("outcome", "refused")
            .count()
            .await,
        2
    );
    // Accepted, on another worker: executes once; the same state again executes nothing.
    let done = elicit_call(
        &stack,
        &other,
        &token,
        "send_customer_message",
        email("MRTR one"),
        Some((&state, "accept")),
    )
    .await;
    assert_eq!(done["isError"], false, "{done}");
    assert_eq!(done["structuredContent"]["status"], "EXECUTED", "{done}");
    let schema = stack.output_schema(&token, "send_customer_message").await;
    check_contract("send_customer_message", &done, &schema).expect("an executed result");
    let again = elicit_call(
        &stack,
        &stack.url,
        &token,
        "send_customer_message",
        email("MRTR one"),
        Some((&state, "accept")),
    )
    .await;
    assert_eq!(again["structuredContent"]["error"]["code"], "token_used", "{again}");
    assert_eq!(sent("MRTR one").await, 1);
    // Declined: rejected, nothing sent, and the state cannot be accepted afterwards.
    let asked =
        elicit_call(&stack, &stack.url, &token, "send_customer_message", email("MRTR two"), None)
            .await;
    let state = asked["requestState"].as_str().expect("requestState").to_owned();
    let declined = elicit_call(
        &stack,
        &stack.url,
        &token,
        "send_customer_message",
        email("MRTR two"),
        Some((&state, "decline")),
    )
    .await;
    assert_eq!(declined["structuredContent"]["status"], "REJECTED", "{declined}");
    check_contract("send_customer_message", &declined, &schema).expect("a rejected result");
    let late = elicit_call(
        &stack,
        &stack.url,
        &token,
        "send_customer_message",
        email("MRTR two"),
        Some((&state, "accept")),
    )
    .await;
    assert_eq!(late["structuredContent"]["error"]["code"], "action_rejected", "{late}");
    let unanswered = elicit_call(
        &stack,
        &stack.url,
        &token,
        "send_customer_message",
        email("MRTR two"),
        Some((&state, "maybe")),
    )
    .await;
    assert_eq!(unanswered["isError"], true);
    assert_eq!(sent("MRTR two").await, 0);
    // A client that declared no elicitation is never sent one: it gets the PREVIEW.
    let plain =
        stack.call(&token, "send_customer_message", email("MRTR three")).await.expect("preview");
    assert_eq!(plain["status"], "PREVIEW");
    let audited = stack
        .db
        .rows("audit_log")
        .eq("action", "send_customer_message")
        .eq("outcome", "ok")
        .eq("channel", "mcp")
        .count()
        .await;
    assert_eq!(audited, 1, "one execution, audited once");
}
