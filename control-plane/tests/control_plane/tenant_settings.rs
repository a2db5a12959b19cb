//! A tenant's settings, rate limits and approval policy, from the CLI and the console.

use crate::support::*;

#[tokio::test]
async fn tenant_settings_rate_limits_and_approval_policy_from_the_cli_and_the_console() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let cli = |args: &[&str]| ctl_as(&api._db, Some(&t0.admin.email), args);
    let slug = t0.slug.as_str();
    let (ok, shown) = cli(&["rate-limit", "show", "--tenant", slug]);
    assert!(ok, "{shown}");
    let read = shown["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .find(|l| l["class"] == "read")
        .expect("read")
        .clone();
    assert_eq!(
        (read["per_minute"].as_i64(), read["overridden"].as_bool()),
        (Some(600), Some(false))
    );
    let (ok, set) =
        cli(&["rate-limit", "set", "--tenant", slug, "--class", "read", "--per-minute", "900"]);
    assert!(ok, "{set}");
    let (ok, err) =
        cli(&["rate-limit", "set", "--tenant", slug, "--class", "read", "--per-minute", "lots"]);
    assert!(!ok && err["error"]["code"] == "invalid_argument", "{err}");
    let (ok, err) =
        cli(&["rate-limit", "set", "--tenant", slug, "--class", "reads", "--per-minute", "5"]);
    assert!(
        !ok && err["error"]["fix"].as_str().expect("fix").contains("silent_write"),
        "the classes are listed: {err}"
    );
    assert_eq!(
        api._db.rows("tenant_rate_limits").tenant(slug).eq("class", "read").int("per_minute").await,
        900,
        "refused changes changed nothing"
    );
    // Approval policy: unknown scope or mode refused with the options; a rule shows per tool.
    let (ok, err) = cli(&[
        "approval-policy",
        "set",
        "--tenant",
        slug,
        "--scope",
        "everything",
        "--mode",
        "off",
    ]);
    assert!(
        !ok && err["error"]["fix"].as_str().expect("fix").contains("send_customer_message"),
        "{err}"
    );
    let (ok, err) =
        cli(&["approval-policy", "set", "--tenant", slug, "--scope", "notify", "--mode", "maybe"]);
    assert!(!ok && err["error"]["code"] == "invalid_argument", "{err}");
    let (ok, err) = cli(&[
        "approval-policy",
        "set",
        "--tenant",
        slug,
        "--scope",
        "notify",
        "--mode",
        "off",
        "--approver-not-creator",
    ]);
    assert!(!ok, "approver rules only go with person_approves: {err}");
    let (ok, shown) = cli(&[
        "approval-policy",
        "set",
        "--tenant",
        slug,
        "--scope",
        "page_technician",
        "--mode",
        "person_approves",
    ]);
    assert!(ok, "{shown}");
    let mode_of = |shown: &Value, tool: &str| {
        shown["tools"].as_array().expect("tools").iter().find(|t| t["tool"] == tool).expect("tool")
            ["mode"]
            .clone()
    };
    assert_eq!(mode_of(&shown, "page_technician"), "person_approves");
    assert_eq!(mode_of(&shown, "send_customer_message"), "agent_confirms", "the default");
    // The console: the Agent access page shows both and changes them, with CSRF.
    let browser = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let html = browser.get("/settings/limits").await.text().await.expect("html");
    assert!(
        html.contains("Rate limits per connection") && html.contains("value=\"900\""),
        "the override shows"
    );
    let mut form = form_fields(&html, "/settings/rate-limit");
    form.retain(|(k, _)| k == "csrf");
    form.extend([("class".into(), "notify".into()), ("per_minute".into(), "12".into())]);
    assert_eq!(browser.post("/settings/rate-limit", &form).await.status(), 303);
    // Above ten times the default only an operator may go.
    let mut too_many = form.clone();
    too_many.retain(|(k, _)| k != "per_minute");
    too_many.push(("per_minute".into(), "301".into()));
    assert_eq!(
        browser.post("/settings/rate-limit", &too_many).await.status(),
        422,
        "notify's default is 30"
    );
    let (ok, raised) =
        cli(&["rate-limit", "set", "--tenant", slug, "--class", "notify", "--per-minute", "5000"]);
    assert!(ok, "an operator may go above the tenant ceiling: {raised}");
    let (ok, _) =
        cli(&["rate-limit", "set", "--tenant", slug, "--class", "notify", "--per-minute", "12"]);
    assert!(ok);
    let forged =
        vec![("class".to_owned(), "notify".to_owned()), ("per_minute".to_owned(), "99".to_owned())];
    assert_eq!(browser.post("/settings/rate-limit", &forged).await.status(), 403);
    let approvals = browser.get("/settings/approvals").await.text().await.expect("html");
    assert!(approvals.contains("A rule for one tool"), "a tool's own rule is set in the console");
    let mut policy = form_fields(&approvals, "/settings/approval-policy");
    policy.retain(|(k, _)| k == "csrf");
    let mut no_mode = policy.clone();
    no_mode.push(("scope".into(), "delete".into()));
    assert_eq!(
        browser.post("/settings/approval-policy", &no_mode).await.status(),
        422,
        "a form names its mode"
    );
    let mut tool_rule = policy.clone();
    policy.extend([("scope".into(), "delete".into()), ("mode".into(), "off".into())]);
    assert_eq!(browser.post("/settings/approval-policy", &policy).await.status(), 303);
    tool_rule.extend([
        ("scope".into(), "page_technician".into()),
        ("mode".into(), "person_approves".into()),
    ]);
    assert_eq!(browser.post("/settings/approval-policy", &tool_rule).await.status(), 303);
    assert_eq!(
        api._db
            .rows("approval_policies")
            .tenant(slug)
            .eq("scope", "tool:page_technician")
            .text("mode")
            .await,
        "person_approves"
    );
    assert_eq!(
        api._db
            .rows("tenant_rate_limits")
            .tenant(slug)
            .eq("class", "notify")
            .int("per_minute")
            .await,
        12
    );
    assert_eq!(
        api._db
            .rows("approval_policies")
            .tenant(slug)
            .eq("scope", "class:delete")
            .text("mode")
            .await,
        "off"
    );
    let console_saves = |action: &'static str| {
        api._db.rows("audit_log").eq("action", action).eq("channel", "console").count()
    };
    assert_eq!(
        console_saves("rate_limit.set").await + console_saves("approval_policy.set").await,
        3,
        "one rate limit, a class's rule and a tool's rule"
    );
    // A dispatcher holds no tenant settings right: refused, nothing changes.
    let dispatcher = Browser::sign_in(&api, &t0.dispatcher.email, &t0.dispatcher.password).await;
    let page = dispatcher.get("/approvals").await.text().await.expect("html");
    let mut theirs = form_fields(&page, "/logout");
    theirs.retain(|(k, _)| k == "csrf");
    theirs.extend([("class".into(), "read".into()), ("per_minute".into(), "1".into())]);
    assert_eq!(dispatcher.post("/settings/rate-limit", &theirs).await.status(), 403);
    assert_eq!(
        api._db.rows("tenant_rate_limits").tenant(slug).eq("class", "read").int("per_minute").await,
        900
    );
}
