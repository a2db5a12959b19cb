//! One connection, one tenant (R3), and what must never cross into a result or a log:
//! unknown fields, another tenant's handles, third-party text outside `untrusted_text`, secrets
//! (R13, R14).

use crate::support::*;

#[tokio::test]
async fn unknown_fields_are_rejected_with_the_allowed_list_on_every_tool() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let other = stack.seed.tenants[1].slug.clone();
    let before = stack.db.fingerprint_of_writes().await;
    for (tool, _) in ALL_TOOLS {
        let err = stack
            .call(&token, tool, json!({"tenant_id": other, "workspace_id": 1}))
            .await
            .expect_err("unknown fields");
        assert_eq!(err["code"], "unknown_field", "{tool}");
        assert_eq!(err["unknown"], json!(["tenant_id", "workspace_id"]), "{tool}");
        let allowed = err["allowed"].as_array().expect("allowed");
        assert!(!allowed.contains(&json!("tenant_id")));
        assert_eq!(err["next_tool"], json!(tool));
    }
    let err = stack.call(&token, "get_booking", json!({})).await.expect_err("missing");
    assert_eq!(err["code"], "invalid_argument");
    assert_eq!(stack.db.fingerprint_of_writes().await, before, "nothing was written");
}

#[tokio::test]
async fn another_tenants_handles_are_not_found_and_nothing_changes() {
    let stack = Stack::start().await;
    let (booking_b, customer_b, technician_b) = handles(&stack, 1).await;
    let before = stack.db.booking_versions().await;
    let token_a = stack.token(0, 0);
    let err = stack
        .call(&token_a, "get_booking", json!({"booking": booking_b}))
        .await
        .expect_err("foreign booking");
    assert_eq!(err["code"], "not_found");
    assert_eq!(err["next_tool"], "find_bookings", "not found points to find_, never create");
    let err = stack
        .call(&token_a, "get_customer", json!({"customer": customer_b}))
        .await
        .expect_err("foreign customer");
    assert_eq!(err["next_tool"], "find_customers");
    let err = stack
        .call(&token_a, "find_bookings", json!({"customer": customer_b}))
        .await
        .expect_err("foreign filter");
    assert_eq!(err["code"], "not_found");
    let err = stack
        .call(&token_a, "find_bookings", json!({"technician": technician_b}))
        .await
        .expect_err("foreign filter");
    assert_eq!(err["next_tool"], "find_technicians");
    let err = stack
        .call(&token_a, "get_booking", json!({"booking": customer_b}))
        .await
        .expect_err("wrong kind");
    assert_eq!(err["field"], "booking");
    let after = stack.db.booking_versions().await;
    assert_eq!(before, after);
}

#[tokio::test]
async fn third_party_text_appears_only_inside_untrusted_text() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let all = stack.call(&token, "find_bookings", json!({"limit": 100})).await.expect("find");
    let mut checked = 0;
    for b in all["bookings"].as_array().expect("list") {
        let one =
            stack.call(&token, "get_booking", json!({"booking": b["booking"]})).await.expect("get");
        checked += assert_canary_wrapped(&one, "");
    }
    checked += assert_canary_wrapped(&all, "");
    assert!(checked >= 4, "the canary was planted in several fields and seen {checked} times");
}

#[tokio::test]
async fn no_secret_reaches_a_result_or_a_log() {
    let stack = Stack::start().await;
    stack.db.plant_decoy_secrets(DECOY).await;
    let token = stack.token(0, 0);
    let (booking, customer, _) = handles(&stack, 0).await;
    let mut outputs = Vec::new();
    for (tool, args) in [
        ("find_bookings", json!({"limit": 100})),
        ("get_booking", json!({"booking": booking})),
        ("find_customers", json!({"limit": 100})),
        ("get_customer", json!({"customer": customer})),
        ("find_technicians", json!({"include_inactive": true})),
    ] {
        outputs.push(stack.call(&token, tool, args).await.expect("read").to_string());
    }
    for out in &outputs {
        assert!(!out.contains(DECOY), "decoy in a result: {out}");
        assert!(
            !out.contains("portal_password") && !out.contains("home_address"),
            "a secret column leaked: {out}"
        );
    }
    // Arguments never reach a log or the audit either.
    let planted = "DECOY-ARGUMENT-51c2";
    stack.ok(&token, "add_booking_note", json!({"booking": booking, "text": planted})).await;
    stack.call(&token, "find_customers", json!({"query": planted})).await.expect("search");
    let audit = stack.db.audit_log_as_text().await;
    assert!(!audit.contains(planted), "the audit holds no arguments");
    let logs = String::from_utf8(logs().lock().expect("logs").clone()).expect("utf8");
    assert!(!logs.contains(planted), "logs hold no arguments");
    assert!(logs.contains("\"tool.name\":\"get_booking\""), "tool calls are logged with fields");
    assert!(!logs.contains(DECOY));
    assert!(!logs.contains(&token), "tokens never reach a log");
    assert!(!logs.contains("Anna Fischer"), "personal data never reaches a log");
}

#[tokio::test]
async fn write_tools_never_touch_another_tenants_records() {
    let stack = Stack::start().await;
    let (booking_b, customer_b, technician_b) = handles(&stack, 1).await;
    let token = stack.token(0, 0);
    let before = stack.db.fingerprint_of_writes().await;
    let version = "v_0000000000000000";
    for (tool, args) in [
        ("update_customer", json!({"customer": customer_b, "version": version, "name": "X"})),
        ("update_booking", json!({"booking": booking_b, "version": version, "priority": "high"})),
        ("add_booking_note", json!({"booking": booking_b, "text": "x"})),
        (
            "create_booking",
            json!({"customer": customer_b, "service": "svc_0000000000000000", "start": "2027-01-01T10:00:00Z"}),
        ),
        ("send_customer_message", json!({"customer": customer_b, "subject": "x", "body": "x"})),
        ("confirm_booking", json!({"booking": booking_b})),
        ("reschedule_booking", json!({"booking": booking_b, "start": "2027-01-01T10:00:00Z"})),
        ("cancel_bookings", json!({"bookings": [booking_b]})),
        ("page_technician", json!({"technician": technician_b, "message": "x"})),
        ("delete_customer", json!({"customer": customer_b})),
        ("delete_booking", json!({"booking": booking_b})),
    ] {
        let err = stack.call(&token, tool, args).await.expect_err(tool);
        assert_eq!(err["code"], "not_found", "{tool}: {err}");
    }
    let rule_b =
        stack.ok(&stack.token(1, 0), "find_alert_rules", json!({})).await["rules"][0]["rule"]
            .clone();
    let err = stack
        .call(&token, "mute_alerts", json!({"rule": rule_b, "minutes": 30}))
        .await
        .expect_err("rule");
    assert_eq!(err["code"], "not_found");
    assert_eq!(stack.db.fingerprint_of_writes().await, before);
}

#[tokio::test]
async fn filter_handles_that_name_nothing_in_the_tenant_are_not_found() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let (_, customer_b, technician_b) = handles(&stack, 1).await;
    let before = stack.db.fingerprint_of_writes().await;
    for (tool, args, next) in [
        ("find_bookings", json!({"customer": customer_b}), "find_customers"),
        ("find_bookings", json!({"technician": technician_b}), "find_technicians"),
        ("cancel_bookings", json!({"customer": customer_b, "expected_count": 0}), "find_customers"),
        (
            "cancel_bookings",
            json!({"technician": technician_b, "expected_count": 0}),
            "find_technicians",
        ),
    ] {
        let err = stack.call(&token, tool, args).await.expect_err(tool);
        assert_eq!(err["code"], "not_found", "{tool}: {err}");
        assert_eq!(err["next_tool"], next, "{tool}: {err}");
    }
    assert_eq!(stack.db.fingerprint_of_writes().await, before);
}
