//! Knowing the person: passkeys driven through Chromium's virtual authenticator, from adding
//! one to approving an agent's action under the tenant's policy, with every hostile case the
//! policy must refuse.

use crate::approvals::notify_waits_for_a_person;
use crate::support::*;

#[tokio::test]
async fn a_passkey_approves_under_the_policy_and_nothing_else_does() {
    let stack = Stack::start(Options::for_test("passkeys", 1)).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let tenant = stack.tenant(0).clone();
    let other = stack.tenant(1).clone();
    let slug = tenant["slug"].as_str().expect("slug").to_owned();
    let (agent_token, customer, customer_email) =
        notify_waits_for_a_person(&stack, &db, &slug).await;
    let out = std::process::Command::new("node")
        .arg(e2e::repo_root().join("e2e/browser/passkeys.mjs"))
        .args(["--control", &stack.control_url, "--mcp", &format!("{}/mcp", stack.lb_url)])
        .args(["--token", &agent_token, "--customer", &customer])
        .args(["--email", tenant["admin"]["email"].as_str().expect("email")])
        .args(["--password", tenant["admin"]["password"].as_str().expect("password")])
        .args(["--dispatcher-email", tenant["dispatcher"]["email"].as_str().expect("email")])
        .args(["--other-email", other["admin"]["email"].as_str().expect("email")])
        .args(["--other-password", other["admin"]["password"].as_str().expect("password")])
        .args(["--db", &stack.database_url])
        .arg("--shots")
        .arg(stack.run_dir.join("passkey-shots"))
        .output()
        .expect("node (scripts/test installs playwright-core and Chromium)");
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "browser passkeys failed:\n{line}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: serde_json::Value =
        serde_json::from_str(line.trim().lines().last().unwrap_or_default()).expect("json");
    // The ceremony as people meet it.
    assert_eq!(seen["registered"], true, "{seen}");
    let admin = tenant["admin"]["email"].as_str().expect("email");
    assert_eq!(
        db.latest_session_proof_of(admin).await,
        "passkey",
        "the admin's last session began with the passkey"
    );
    assert_eq!(seen["approved_status"], "gone", "no longer waiting: {seen}");
    let approved = seen["approved_action"].as_str().expect("action");
    assert_eq!(db.rows("pending_actions").eq("handle", approved).text("status").await, "executed");
    assert!(
        seen["approved_flash"].as_str().unwrap_or_default().contains("with a passkey"),
        "the Approvals page says how it was approved: {seen}"
    );
    assert_eq!(seen["agent_status"], "EXECUTED", "{seen}");
    assert_eq!(seen["agent_sees_proof"], "with a passkey", "{seen}");
    // Inviting under the policy took the admin's passkey; the invited person joined with a
    // passkey of their own (no password), in the invitation's role, and signs in with it.
    assert_eq!(
        db.how_an_invitee_joined("passkey.joiner@example.com").await,
        "passkey:dispatcher:true:1",
        "joined by passkey, as a dispatcher, without a password, with one passkey"
    );
    assert_eq!(db.latest_session_proof_of("passkey.joiner@example.com").await, "passkey");
    assert_eq!(seen["link_again"], 404, "an invitation's link works once: {seen}");
    // Every hostile case refused, with the target still waiting.
    for case in [
        "replayed_other",
        "forged",
        "expired",
        "unverified",
        "counter_backwards",
        "foreign_credential",
    ] {
        assert_eq!(seen[case]["status"], 403, "{case} must be refused: {seen}");
        assert_eq!(seen[case]["target"], "waiting", "{case} executed nothing: {seen}");
    }
    assert_eq!(seen["replayed_same"]["status"], 403, "a used ceremony is refused: {seen}");
    assert_eq!(seen["replayed_same"]["source"], "waiting", "{seen}");
    let source = seen["source_action"].as_str().expect("source");
    assert_eq!(db.rows("pending_actions").eq("handle", source).text("status").await, "pending");
    assert_eq!(seen["forged"]["says"], true, "the refusal names the passkey: {seen}");
    assert_eq!(seen["policy_off_without_passkey"]["status"], 403, "{seen}");
    assert_eq!(seen["policy_off_without_passkey"]["still_on"], true, "{seen}");
    // Every other widening decision went through its own form with the passkey: the form
    // posted, its service named the decision, the console showed it to confirm.
    assert_eq!(seen["confirmation_names_action"], true, "{seen}");
    assert_eq!(
        seen["connection_decision"], "Creating the connection “Made with a passkey”",
        "the confirmation names what the service will decide: {seen}"
    );
    let facts = seen["connection_facts"].to_string();
    assert!(
        facts.contains("rights") && facts.contains("bookings:read") && facts.contains("toolset"),
        "and shows what it sets: {seen}"
    );
    assert_eq!(db.rows("connections").eq("name", "Made with a passkey").count().await, 1);
    let dispatcher = tenant["dispatcher"]["email"].as_str().expect("email");
    assert_eq!(db.membership_in(&slug, dispatcher).await.0, "admin", "the role was raised");
    let notify = db.rows("tenant_rate_limits").tenant(&slug).eq("class", "notify");
    assert_eq!(notify.int("per_minute").await, 60, "the rate limit was raised");
    let loosened = db.rows("approval_policies").tenant(&slug).eq("scope", "class:notify");
    assert_eq!(loosened.eq("mode", "agent_confirms").count().await, 1, "the policy was loosened");
    assert!(seen["access_off"].as_str().unwrap_or_default().contains("OFF"), "{seen}");
    assert!(seen["access_on"].as_str().unwrap_or_default().contains("can use"), "{seen}");
    assert!(!db.rows("tenants").eq("slug", &slug).flag("decisions_need_passkey").await);
    // Narrowing stays one step: a deny without a passkey goes through.
    assert_eq!(seen["deny_without_passkey"]["target"], "gone", "{seen}");
    let target = seen["target_action"].as_str().expect("target");
    assert_eq!(db.rows("pending_actions").eq("handle", target).text("status").await, "rejected");
    // Exactly one email reached the customer: the approved one.
    assert_eq!(db.rows("outbox").eq("recipient", &customer_email).count().await, 1);
    // The audit row of the approval records the passkey and user verification.
    let proof = db.proof_of_executed_action(approved, "send_customer_message").await;
    let proof: serde_json::Value = serde_json::from_str(&proof).expect("proof json");
    assert_eq!(proof["method"], "passkey", "{proof}");
    assert_eq!(proof["user_verified"], true, "{proof}");
    assert!(proof["passkey"].as_str().unwrap_or_default().starts_with("pky_"), "{proof}");
}
