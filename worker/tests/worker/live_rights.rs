//! Rights cut live (R4): what `tools/list` shows follows the creator's current rights, and a
//! creator's lost rights, deactivation or a revocation end a connection on its next call.

use crate::support::*;

#[tokio::test]
async fn tools_list_is_deterministic_and_follows_live_rights() {
    let stack = Stack::start().await;
    let full = stack.list(&stack.token(0, 0)).await;
    let names: Vec<&str> = full.iter().map(|t| t["name"].as_str().expect("name")).collect();
    assert_eq!(names, ALL_TOOLS.map(|(n, _)| n));
    for (tool, (_, class)) in full.iter().zip(ALL_TOOLS) {
        // R6: one class per tool, hints derived from it.
        assert_eq!(tool["_meta"]["dev.gatehouse/effect_class"], json!(class), "{}", tool["name"]);
        assert_eq!(tool["annotations"]["readOnlyHint"], json!(class == "read"), "{}", tool["name"]);
        let destructive = matches!(class, "notify" | "alert" | "delete");
        assert_eq!(tool["annotations"]["destructiveHint"], json!(destructive), "{}", tool["name"]);
        assert_eq!(tool["inputSchema"]["additionalProperties"], json!(false), "{tool}");
        assert!(tool["outputSchema"]["anyOf"].is_array(), "{tool}");
        let props = tool["inputSchema"]["properties"].as_object().expect("properties");
        assert!(
            !props.keys().any(|k| k.contains("tenant") || k.contains("workspace")),
            "R3: {tool}"
        );
        assert!(!props.contains_key("notify"), "R9: edit tools have no notify parameter");
    }
    let read_only = stack.list(&stack.token(0, 1)).await;
    let names: Vec<&str> = read_only.iter().map(|t| t["name"].as_str().expect("name")).collect();
    assert_eq!(names, READ_ONLY_TOOLS);
    // A connection granted bookings:read only sees the booking tools.
    let narrow = stack
        .admin_connection(
            "narrow",
            shared::rights::RightSet::of(&[shared::rights::Right::BookingsRead]),
            "full",
        )
        .await;
    let names: Vec<String> = stack
        .list(&narrow)
        .await
        .iter()
        .map(|t| t["name"].as_str().expect("name").to_owned())
        .collect();
    assert_eq!(
        names,
        ["export_bookings", "find_bookings", "find_services", "get_booking", "list_recent_changes"]
    );
    // R15: a hidden tool called by name says which right is missing.
    let err = stack.call(&narrow, "find_customers", json!({})).await.expect_err("hidden");
    assert_eq!(err["code"], "permission_denied");
    assert_eq!(err["right"], "customers:read");
    // An unknown tool is a protocol error, not a tool result.
    let (_, _, body) = stack
        .raw(
            Some(&narrow),
            "tools/call",
            Some("drop_tables"),
            json!({"name": "drop_tables", "arguments": {}}),
            &[],
        )
        .await;
    assert_eq!(body["error"]["code"], json!(-32602), "{body}");
}

#[tokio::test]
async fn creators_lost_rights_end_their_connections_on_the_next_call() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    assert!(stack.call(&token, "find_customers", json!({})).await.is_ok());
    // Deactivating the creator ends the connection at once (R4).
    let ctx = stack.operator_in(0).await;
    // Another admin first: the tenant's last admin cannot be demoted or deactivated.
    admin::person_create(
        &stack.db.ds,
        &ctx,
        "second-admin@acme.example",
        "Second Admin",
        shared::rights::Role::Admin,
        None,
    )
    .await
    .expect("second admin");
    admin::person_set_role(
        &stack.db.ds,
        &ctx,
        &stack.seed.tenants[0].admin.email,
        shared::rights::Role::Viewer,
    )
    .await
    .expect("set role");
    // Still a viewer: reading goes on, the live rights are the viewer's.
    assert!(stack.call(&token, "find_customers", json!({})).await.is_ok());
    admin::person_deactivate(&stack.db.ds, &ctx, &stack.seed.tenants[0].admin.email)
        .await
        .expect("deactivate");
    let (status, headers, body) = stack.raw(Some(&token), "tools/list", None, json!({}), &[]).await;
    assert_eq!(status, 401, "{body}");
    assert!(headers["www-authenticate"].to_str().expect("ascii").contains("resource_metadata="));
}

#[tokio::test]
async fn a_connection_created_while_its_creator_is_deactivated_is_not_left_to_wake() {
    // The deactivation holds the membership's row while the connection is created: the create
    // waits for it and then sees it, instead of reading the membership before and inserting after.
    let stack = Stack::start().await;
    let ctx = stack.operator_in(0).await;
    let dispatcher = stack.seed.tenants[0].dispatcher.email.clone();
    // A second session (psql) deactivates in a transaction it keeps open, until the row is
    // held (else the create could pass before the deactivation began).
    let held = Held::open(
        &stack,
        // Raw SQL on purpose: the deactivation must come from a session of its own that keeps
        // its transaction open, which only SQL sent to that session can do.
        &format!("BEGIN; UPDATE memberships SET active = false WHERE person_id = (SELECT id FROM people WHERE email = '{dispatcher}');"),
        HeldLock::Written,
    )
    .await;
    let create = {
        let (ds, ctx, dispatcher) = (stack.db.ds.clone(), ctx.clone(), dispatcher.clone());
        tokio::spawn(async move {
            Connection::new(&ds, &ctx, &dispatcher)
                .name("made during a deactivation")
                .try_create()
                .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    held.end("COMMIT;").await;
    let created = create.await.expect("join");
    assert!(
        created.is_err(),
        "created for a deactivated person: {:?}",
        created.map(|c| c.connection)
    );
    assert_eq!(
        stack.db.rows("connections").eq("name", "made during a deactivation").count().await,
        0
    );
}

#[tokio::test]
async fn a_revoked_connection_is_refused_on_the_next_call() {
    let stack = Stack::start().await;
    let token = stack.token(1, 1);
    assert_eq!(stack.list(&token).await.len(), READ_ONLY_TOOLS.len());
    let ctx = stack.operator_in(1).await;
    admin::connection_revoke(
        &stack.db.ds,
        &ctx,
        &stack.seed.tenants[1].connections[1].connection,
        "test",
    )
    .await
    .expect("revoke");
    let (status, _, body) = stack.raw(Some(&token), "tools/list", None, json!({}), &[]).await;
    assert_eq!(status, 401);
    assert!(body["error_description"].as_str().expect("text").contains("not known"), "{body}");
    assert_eq!(stack.db.audited("connection.revoke").await, 1);
}

#[tokio::test]
async fn a_connection_narrowed_in_place_loses_its_tools_on_the_next_call() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let c = &stack.seed.tenants[0].connections[0];
    assert!(stack.call(&token, "find_customers", json!({})).await.is_ok());
    let ctx = stack.operator_in(0).await;
    admin::connection_edit(
        &stack.db.ds,
        &ctx,
        &c.connection,
        admin::ConnectionEdit {
            name: "Narrowed",
            rights: shared::rights::RightSet::of(&[shared::rights::Right::BookingsRead]),
            toolset: "full",
        },
    )
    .await
    .expect("narrow");
    // Same token, fewer rights: customers are out of reach from the next call on.
    let refused = stack.call(&token, "find_customers", json!({})).await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(stack.call(&token, "find_bookings", json!({})).await.is_ok(), "bookings stay readable");
}
