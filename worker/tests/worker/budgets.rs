//! Budgets on effects, hostile: many small batches at once over two workers, the window's
//! edge, a policy changed mid-flight, a budget lowered below what is used, and another tenant's
//! actions, which never count.

use crate::support::*;

use shared::services::approvals::{self, Completion};
use shared::services::budgets::{self, BudgetSet};
use shared::testing::BulkBookings;

impl Stack {
    /// Sets a budget of tenant `t` as its operator (`connection` `None`: the tenant-wide one).
    async fn budget(
        &self,
        t: usize,
        connection: Option<&str>,
        kind: &str,
        limit: i64,
        window: &str,
    ) {
        let ctx = self.operator_in(t).await;
        let set = BudgetSet {
            connection,
            kind,
            limit: Some(limit),
            window_secs: Some(budgets::parse_window(window).expect("window")),
        };
        budgets::set(&self.db.ds, &ctx, &set).await.expect("set budget");
    }

    fn connection_of(&self, t: usize) -> String {
        self.seed.tenants[t].connections[0].connection.clone()
    }

    /// A message to a customer of tenant `t`: one customer messaged.
    async fn message(&self, token: &str, customer: &str) -> Result<Value, Value> {
        self.call(
            token,
            "send_customer_message",
            json!({"customer": customer, "subject": "Your visit", "body": "We arrive at nine."}),
        )
        .await
    }

    async fn confirm(&self, base: &str, token: &str, preview: &Value) -> Result<Value, Value> {
        self.call_at(
            base,
            token,
            "confirm_action",
            json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]}),
        )
        .await
    }

    /// The budget of `kind` as list_recent_changes shows it to this connection.
    async fn shown_budget(&self, token: &str, kind: &str, scope: &str) -> Value {
        let out = self.ok(token, "list_recent_changes", json!({"limit": 1})).await;
        out["budgets"]
            .as_array()
            .expect("budgets")
            .iter()
            .find(|b| b["kind"] == kind && b["scope"] == scope)
            .cloned()
            .unwrap_or_else(|| panic!("no {scope} budget of {kind}: {out}"))
    }
}

#[tokio::test]
async fn twenty_concurrent_small_batches_over_two_workers_pass_only_as_far_as_the_budget() {
    let stack = Arc::new(Stack::start().await);
    let second = stack.another_worker().await;
    let token = stack.token(0, 0);
    let slug = stack.seed.tenants[0].slug.clone();
    BulkBookings::new(&slug, 40).handles("bkg_").insert(&stack.db).await;
    stack.budget(0, Some(&stack.connection_of(0)), "bookings_changed", 15, "1h").await;
    // Twenty batches of two drafts each, all at once, half on each worker.
    let calls = (0..20).map(|i| {
        let (stack, token) = (stack.clone(), token.clone());
        let base = if i % 2 == 0 { stack.url.clone() } else { second.clone() };
        async move {
            let bookings: Vec<String> = (1..=2).map(|k| format!("bkg_{:016}", 2 * i + k)).collect();
            stack
                .call_at(&base, &token, "cancel_bookings", json!({ "bookings": bookings }))
                .await
                .expect("prepared")
        }
    });
    let previews = futures_util::future::join_all(calls).await;
    let (ready, waiting): (Vec<_>, Vec<_>) =
        previews.into_iter().partition(|p| p["status"] == "PREVIEW");
    // 7 × 2 = 14 fit in 15; every other batch would pass it and waits for a person.
    assert_eq!(ready.len(), 7, "7 batches of 2 fit in 15");
    assert_eq!(waiting.len(), 13);
    for w in &waiting {
        assert_eq!(w["status"], "AWAITING_APPROVAL");
        let next = w["next"].as_str().expect("next");
        assert!(next.contains("over the bookings_changed budget by"), "{next}");
    }
    // The seven confirm at once on both workers: all execute, nothing more.
    let confirms = ready.iter().enumerate().map(|(i, p)| {
        let (stack, token, p) = (stack.clone(), token.clone(), p.clone());
        let base = if i % 2 == 0 { stack.url.clone() } else { second.clone() };
        async move { stack.confirm(&base, &token, &p).await.expect("executed") }
    });
    for done in futures_util::future::join_all(confirms).await {
        assert_eq!(done["status"], "EXECUTED");
    }
    assert_eq!(
        stack
            .db
            .rows("bookings")
            .like("handle", "bkg_0000000000%")
            .eq("status", "cancelled")
            .count()
            .await,
        14
    );
    let shown = stack.shown_budget(&token, "bookings_changed", "connection").await;
    assert_eq!((shown["used"].as_i64(), shown["left"].as_i64()), (Some(14), Some(1)), "{shown}");
    // The Approvals page says which budget and by how much.
    let ctx = stack.operator_in(0).await;
    let awaiting = approvals::awaiting(&stack.db.ds, &ctx).await.expect("awaiting");
    assert_eq!(awaiting.len(), 13);
    let reason = awaiting[0].budget.as_deref().expect("a budget reason");
    assert!(reason.starts_with("over the bookings_changed budget by "), "{reason}");
    assert!(reason.contains("of 15 in the last 1h"), "{reason}");
}

#[tokio::test]
async fn a_person_approves_past_the_budget_once_and_what_they_approved_counts() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let fixture = stack.fixture(0).await;
    stack.budget(0, Some(&stack.connection_of(0)), "customers_messaged", 1, "1h").await;
    let first = stack.message(&token, &fixture.customer).await.expect("first");
    assert_eq!(first["status"], "PREVIEW");
    stack.confirm(&stack.url, &token, &first).await.expect("executed");
    let second = stack.message(&token, &fixture.customer).await.expect("second");
    assert_eq!(second["status"], "AWAITING_APPROVAL");
    assert!(
        second["next"]
            .as_str()
            .expect("next")
            .contains("over the customers_messaged budget by 1 (used 1 of 1 in the last 1h)"),
        "{second}"
    );
    // The agent cannot complete it; a person can, once, with no second approval.
    let err = stack.confirm(&stack.url, &token, &second).await.expect_err("waits");
    assert_eq!(err["code"], "awaiting_approval", "{err}");
    let ctx = stack.operator_in(0).await;
    let handle = second["action"].as_str().expect("handle");
    let decided = shared::services::actions::approve(
        &stack.db.ds,
        &ctx,
        handle,
        "expected",
        jiff::Timestamp::now(),
    )
    .await;
    assert!(matches!(decided, Ok(approvals::Decided::Executed { .. })), "{decided:?}");
    let done = stack.confirm(&stack.url, &token, &second).await.expect("the outcome");
    assert_eq!(done["status"], "EXECUTED");
    assert_eq!(stack.db.rows("outbox").eq("subject", "Your visit").count().await, 2);
    let shown = stack.shown_budget(&token, "customers_messaged", "connection").await;
    assert_eq!((shown["used"].as_i64(), shown["left"].as_i64()), (Some(2), Some(0)), "{shown}");
}

#[tokio::test]
async fn usage_older_than_the_window_no_longer_counts() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let fixture = stack.fixture(0).await;
    stack.budget(0, Some(&stack.connection_of(0)), "customers_messaged", 1, "1h").await;
    let p = stack.message(&token, &fixture.customer).await.expect("first");
    stack.confirm(&stack.url, &token, &p).await.expect("executed");
    // Just inside the window: it counts.
    stack.db.rows("budget_usage").set_now_plus("at", "-59 minutes").await;
    let inside = stack.message(&token, &fixture.customer).await.expect("inside");
    assert_eq!(inside["status"], "AWAITING_APPROVAL");
    // Just past it: it does not.
    stack.db.rows("budget_usage").set_now_plus("at", "-61 minutes").await;
    let past = stack.message(&token, &fixture.customer).await.expect("past");
    assert_eq!(past["status"], "PREVIEW", "{past}");
}

#[tokio::test]
async fn a_policy_changed_mid_flight_is_obeyed_and_off_stays_off() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let fixture = stack.fixture(0).await;
    let ctx = stack.operator_in(0).await;
    let ds = &stack.db.ds;
    stack.budget(0, Some(&stack.connection_of(0)), "customers_messaged", 1, "1h").await;
    // Within budget, reserved for the agent; then the policy says a person approves: the
    // action goes to a person and stops holding the budget.
    let within = stack.message(&token, &fixture.customer).await.expect("within");
    assert_eq!(within["status"], "PREVIEW");
    let held = stack.message(&token, &fixture.customer).await.expect("held");
    assert_eq!(held["status"], "AWAITING_APPROVAL", "the first one's reservation counts");
    approvals::policy_set(ds, &ctx, "notify", Some(Completion::PersonApproves), false)
        .await
        .expect("policy");
    let err = stack.confirm(&stack.url, &token, &within).await.expect_err("to a person");
    assert_eq!(err["code"], "awaiting_approval");
    // Over budget while off: refused as off, never a person's to approve.
    approvals::policy_set(ds, &ctx, "notify", Some(Completion::Off), false).await.expect("off");
    let err = stack.message(&token, &fixture.customer).await.expect_err("off");
    assert_eq!(err["code"], "turned_off_by_policy", "{err}");
    let handle = held["action"].as_str().expect("handle");
    let refused =
        shared::services::actions::approve(ds, &ctx, handle, "go", jiff::Timestamp::now()).await;
    assert!(refused.is_err(), "an action of a class turned off is not approved: {refused:?}");
    assert_eq!(stack.db.rows("outbox").eq("subject", "Your visit").count().await, 0);
    // Back to the agent confirming: nothing was executed, so the budget is whole again.
    approvals::policy_set(ds, &ctx, "notify", None, false).await.expect("default");
    let again = stack.message(&token, &fixture.customer).await.expect("again");
    assert_eq!(again["status"], "PREVIEW", "{again}");
}

#[tokio::test]
async fn a_budget_lowered_below_what_is_used_makes_the_next_action_wait() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let fixture = stack.fixture(0).await;
    let connection = stack.connection_of(0);
    stack.budget(0, Some(&connection), "customers_messaged", 5, "1h").await;
    for _ in 0..3 {
        let p = stack.message(&token, &fixture.customer).await.expect("prepared");
        stack.confirm(&stack.url, &token, &p).await.expect("executed");
    }
    // Prepared within the budget, then the budget is lowered: the confirmation checks again.
    let prepared = stack.message(&token, &fixture.customer).await.expect("prepared");
    assert_eq!(prepared["status"], "PREVIEW");
    let ctx = stack.operator_in(0).await;
    let lower = BudgetSet {
        connection: Some(&connection),
        kind: "customers_messaged",
        limit: Some(2),
        window_secs: None,
    };
    // (Lowering is one step and raising a passkey decision in the console: the control
    // plane's budgets test.)
    budgets::set(&stack.db.ds, &ctx, &lower).await.expect("lowered");
    let err = stack.confirm(&stack.url, &token, &prepared).await.expect_err("waits");
    assert_eq!(err["code"], "awaiting_approval", "{err}");
    assert!(err.to_string().contains("over the customers_messaged budget by 2"), "{err}");
    let next = stack.message(&token, &fixture.customer).await.expect("next");
    assert_eq!(next["status"], "AWAITING_APPROVAL");
    let shown = stack.shown_budget(&token, "customers_messaged", "connection").await;
    assert_eq!((shown["used"].as_i64(), shown["left"].as_i64()), (Some(3), Some(0)), "{shown}");
    // Raised again (the operator's CLI is its own proof), the waiting action may go ahead.
    let raise = BudgetSet { limit: Some(10), ..lower };
    budgets::set(&stack.db.ds, &ctx, &raise).await.expect("raised");
    let shown = stack.shown_budget(&token, "customers_messaged", "connection").await;
    assert_eq!((shown["used"].as_i64(), shown["left"].as_i64()), (Some(3), Some(7)), "{shown}");
    assert_eq!(stack.db.audited("budget.set").await, 3, "every setting is audited");
}

#[tokio::test]
async fn another_tenants_actions_never_count_and_a_tenant_budget_sums_its_connections() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let other_tenant = stack.token(1, 0);
    let mine = stack.fixture(0).await;
    let theirs = stack.fixture(1).await;
    stack.budget(0, Some(&stack.connection_of(0)), "customers_messaged", 2, "1h").await;
    stack.budget(0, None, "customers_messaged", 3, "1h").await;
    // Tenant 1 messages freely; tenant 0's budgets see none of it.
    for _ in 0..4 {
        let p = stack.message(&other_tenant, &theirs.customer).await.expect("theirs");
        stack.confirm(&stack.url, &other_tenant, &p).await.expect("executed");
    }
    let shown = stack.shown_budget(&token, "customers_messaged", "tenant").await;
    assert_eq!(shown["used"].as_i64(), Some(0), "{shown}");
    for _ in 0..2 {
        let p = stack.message(&token, &mine.customer).await.expect("mine");
        assert_eq!(p["status"], "PREVIEW");
        stack.confirm(&stack.url, &token, &p).await.expect("executed");
    }
    // A second connection of the tenant has its own budget, but the tenant's is shared.
    let second = stack.second_connection().await;
    let p = stack.message(&second, &mine.customer).await.expect("second");
    assert_eq!(p["status"], "PREVIEW", "{p}");
    stack.confirm(&stack.url, &second, &p).await.expect("executed");
    let over = stack.message(&second, &mine.customer).await.expect("over");
    assert_eq!(over["status"], "AWAITING_APPROVAL");
    let next = over["next"].as_str().expect("next");
    assert!(next.contains("over the tenant-wide customers_messaged budget by 1"), "{next}");
    assert!(!next.contains("over the customers_messaged"), "its own budget has room: {next}");
}
