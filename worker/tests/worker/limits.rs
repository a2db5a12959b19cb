//! Toolsets (R21) and rate buckets: what a connection sees and where a tool lives, and buckets
//! per effect class that name the class, the limit and when to retry, on every worker.

use crate::support::*;

#[tokio::test]
async fn toolsets_decide_what_a_connection_sees_and_name_where_a_tool_lives() {
    let stack = Stack::start().await;
    let small = stack.connection_with("small").await;
    let names: Vec<String> = stack
        .list(&small)
        .await
        .iter()
        .map(|t| t["name"].as_str().expect("n").to_owned())
        .collect();
    assert_eq!(names, ["booking_brief", "day_schedule", "list_recent_changes", "lookup"]);
    let err = stack.call(&small, "find_bookings", json!({})).await.expect_err("not in toolset");
    assert_eq!(err["code"], "not_in_toolset");
    assert_eq!(err["toolset"], "small");
    assert_eq!(err["available_in"], json!(["full", "read_only"]));
    let found = stack.ok(&small, "lookup", json!({"query": "a"})).await;
    assert!(found["customers"].as_array().expect("c").len() <= 5);
    let day = stack.ok(&small, "day_schedule", json!({"date": "2026-03-29"})).await;
    assert_eq!(day["bookings"].as_array().expect("b").len(), 1, "{day}");
    let err =
        stack.call(&small, "day_schedule", json!({"date": "2026-13-45"})).await.expect_err("date");
    assert_eq!(err["field"], "date", "the error names this tool's argument: {err}");
    let brief =
        stack.ok(&small, "booking_brief", json!({"booking": day["bookings"][0]["booking"]})).await;
    assert!(brief["total"].as_str().expect("total").ends_with("EUR"));
    // read_only: the read tools of the full set, whatever the rights.
    let read_only = stack.connection_with("read_only").await;
    let names: Vec<String> = stack
        .list(&read_only)
        .await
        .iter()
        .map(|t| t["name"].as_str().expect("n").to_owned())
        .collect();
    assert!(
        names.contains(&"find_alert_rules".to_owned())
            && !names.contains(&"create_customer".to_owned()),
        "{names:?}"
    );
    let err = stack
        .call(&read_only, "create_customer", json!({"name": "X", "email": "x@example.net"}))
        .await
        .expect_err("write");
    assert_eq!(err["available_in"], json!(["full"]));
    assert_eq!(stack.db.rows("customers").eq("email", "x@example.net").count().await, 0);
}

#[tokio::test]
async fn an_exceeded_bucket_names_the_class_the_limit_and_when_to_retry() {
    let stack = Stack::start().await;
    early_in_a_minute().await;
    let token = stack.token(0, 0);
    stack.db.insert_tenant_rate_limit(&stack.seed.tenants[0].slug, "notify", 2).await;
    let customer = stack.ok(&token, "find_customers", json!({"query": "Koch"})).await["customers"]
        [0]["customer"]
        .clone();
    let args = json!({"customer": customer, "subject": "Hello", "body": "Just checking in."});
    stack.ok(&token, "send_customer_message", args.clone()).await;
    stack.ok(&token, "send_customer_message", args.clone()).await;
    let err = stack.call(&token, "send_customer_message", args.clone()).await.expect_err("limited");
    assert_eq!(err["code"], "rate_limited");
    assert_eq!(err["class"], "notify");
    assert_eq!(err["limit"], 2);
    let retry = err["retry_after_secs"].as_u64().expect("retry");
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(stack.db.count("pending_actions").await, 2, "the refused preview stored nothing");
    // Other classes and other tenants keep their own buckets.
    stack
        .ok(
            &token,
            "add_booking_note",
            json!({"booking": stack.draft(0).await["booking"], "text": "still fine"}),
        )
        .await;
    let other = stack.token(1, 0);
    let c = stack.ok(&other, "find_customers", json!({})).await["customers"][0]["customer"].clone();
    stack
        .ok(&other, "send_customer_message", json!({"customer": c, "subject": "Hi", "body": "x"}))
        .await;
}

#[tokio::test]
async fn a_tenants_read_override_holds_on_every_worker_and_names_its_limit() {
    let stack = Stack::start().await;
    let ds = &stack.db.ds;
    let tenant = &stack.seed.tenants[0];
    let operator = shared::services::operators::authenticate(
        ds,
        &tenant.admin.email,
        shared::ctx::Channel::Cli,
    )
    .await
    .expect("the demo's operator");
    let row = admin::tenant_by_slug(ds, &tenant.slug).await.expect("tenant");
    let ctx = shared::OpCtx::for_operator(&operator, admin::tenant_ref(&row).expect("ref"));
    // Out of range, or a class with no bucket: refused, nothing set.
    for (class, n) in
        [("read", Some(0)), ("read", Some(-5)), ("read", Some(1_000_001)), ("everything", Some(5))]
    {
        let err =
            shared::services::rates::set_limit(ds, &ctx, class, n).await.expect_err("refused");
        assert_eq!(err.code(), "invalid_argument", "{class} {n:?}");
    }
    assert_eq!(stack.db.count("tenant_rate_limits").await, 0);
    let set = shared::services::rates::set_limit(ds, &ctx, "read", Some(3)).await.expect("set");
    assert_eq!((set.per_minute, set.overridden), (3, true));
    // The override arrives with the connection context: three reads, then the fourth is
    // refused naming the class, the tenant's limit and when to retry, on either worker.
    let token = stack.token(0, 1);
    let other = stack.another_worker().await;
    early_in_a_minute().await;
    for _ in 0..3 {
        stack.call(&token, "find_technicians", json!({})).await.expect("within the limit");
    }
    let refused = stack.call(&token, "find_technicians", json!({})).await.expect_err("over");
    assert_eq!(
        (refused["code"].as_str(), refused["class"].as_str()),
        (Some("rate_limited"), Some("read")),
        "{refused}"
    );
    assert!(refused["message"].as_str().expect("m").contains("3 calls per minute"), "{refused}");
    assert!(refused["fix"].as_str().expect("fix").contains("seconds"), "{refused}");
    // Each worker counts its own reads (per worker, as documented), with the same limit.
    for _ in 0..3 {
        stack.call_at(&other, &token, "find_technicians", json!({})).await.expect("another worker");
    }
    assert!(stack.call_at(&other, &token, "find_technicians", json!({})).await.is_err());
    // Back to the default: the next call passes again; every change is audited.
    shared::services::rates::set_limit(ds, &ctx, "read", None).await.expect("default");
    stack.call(&token, "find_technicians", json!({})).await.expect("default again");
    // Another class's override never becomes the read limit (the tenant row carries only the
    // read class's).
    shared::services::rates::set_limit(ds, &ctx, "silent_write", Some(1)).await.expect("writes");
    for _ in 0..4 {
        stack.call(&token, "find_technicians", json!({})).await.expect("reads unaffected");
    }
    shared::services::rates::set_limit(ds, &ctx, "silent_write", None).await.expect("writes");
    assert_eq!(stack.db.audited("rate_limit.set").await, 4);
}
