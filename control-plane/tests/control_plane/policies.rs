//! The tenant's policies from the CLI and the console: checked at their line, simulated,
//! versioned, refused on a stale version, never in force when they do not validate.

use crate::support::*;

const QUIET: &str = "@id(\"quiet-hours\")\n@reason(\"no message to a customer between 20:00 and 08:00\")\nforbid (principal, action == Action::\"send_customer_message\", resource)\nwhen { context.now.hour >= 20 || context.now.hour < 8 };\n";

#[tokio::test]
async fn policies_from_the_cli_check_set_show_simulate_and_keep_their_history() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let cli = |args: &[&str]| ctl_as(&api._db, Some(&t0.admin.email), args);
    let slug = t0.slug.as_str();
    let dir = std::env::temp_dir().join(format!("gh-policies-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let good = dir.join("good.cedar");
    std::fs::write(&good, QUIET).expect("write");
    let bad = dir.join("bad.cedar");
    std::fs::write(&bad, "@id(\"x\")\n@reason(\"r\")\nforbid (principal, action == Action::\"no_such_tool\", resource);\n").expect("write");
    let good = good.to_string_lossy().into_owned();
    let bad = bad.to_string_lossy().into_owned();
    let (ok, checked) = cli(&["policy", "check", &good]);
    assert!(ok && checked["policies"][0]["id"] == "quiet-hours", "{checked}");
    let (ok, err) = cli(&["policy", "check", &bad]);
    assert!(!ok && err["error"]["message"].as_str().expect("message").contains("line 3"), "{err}");
    // A set that does not validate changes nothing; a stale version is refused.
    let (ok, _) = cli(&["policy", "set", "--tenant", slug, "--expect-version", "0", &bad]);
    assert!(!ok);
    let (ok, shown) = cli(&["policy", "show", "--tenant", slug]);
    assert!(ok && shown["version"] == 0, "{shown}");
    let (ok, set) = cli(&[
        "policy",
        "set",
        "--tenant",
        slug,
        "--expect-version",
        "0",
        "--note",
        "quiet",
        &good,
    ]);
    assert!(ok && set["version"] == 1 && set["widens"] == false, "{set}");
    let (ok, err) = cli(&["policy", "set", "--tenant", slug, "--expect-version", "0", &good]);
    assert!(
        !ok && err["error"]["message"].as_str().expect("message").contains("version 1 is in force"),
        "{err}"
    );
    let (ok, shown) = cli(&["policy", "show", "--tenant", slug]);
    assert!(
        ok && shown["version"] == 1 && shown["policies"][0]["reason"].as_str().is_some(),
        "{shown}"
    );
    let (ok, sim) = cli(&["policy", "simulate", "--tenant", slug, &good, "--hours", "24"]);
    assert!(ok && sim["caveat"].as_str().is_some(), "{sim}");
    let (ok, history) = cli(&["policy", "history", "--tenant", slug]);
    assert!(ok && history["versions"][0]["version"] == 1, "{history}");
    let (ok, err) = cli(&["policy", "simulate", "--tenant", slug, &good, "--hours", "0"]);
    assert!(!ok && err["error"]["code"] == "invalid_argument", "{err}");
}

#[tokio::test]
async fn the_console_checks_a_draft_at_its_line_and_puts_a_valid_one_in_force() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let browser = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let page = browser.get("/settings/policies").await.text().await.expect("page");
    assert!(page.contains("No policy is in force"), "{page}");
    // What a policy can read, from the schema itself: the records' attributes, the context,
    // and every action with its arguments.
    let schema = shared::services::policies::schema();
    let actions = schema.json[""]["actions"].as_object().expect("actions");
    assert!(page.contains("What a policy can read"), "{page}");
    for shown in ["local_time: { hour: Long", "region: String?", "budgets: {", "technician: {"] {
        assert!(page.contains(shown), "{shown}");
    }
    for tool in actions.keys() {
        assert!(page.contains(&format!("<code>{tool}</code>")), "{tool}");
    }
    let fields = |extra: &[(&str, &str)]| {
        let mut f = form_fields(&page, "/settings/policies");
        f.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        f
    };
    let checked = browser
        .post(
            "/settings/policies",
            &fields(&[
                ("do", "set"),
                ("source", "forbid (principal, action, resource) when { 1 +* 2 };"),
                ("note", ""),
            ]),
        )
        .await;
    assert_eq!(checked.status(), 422, "refused in place");
    let text = checked.text().await.expect("text");
    assert!(text.contains("Nothing was saved") && text.contains("Line 1"), "{text}");
    assert!(text.contains("1 +* 2"), "the draft is kept: {text}");
    let saved = browser
        .post("/settings/policies", &fields(&[("do", "set"), ("source", QUIET), ("note", "quiet")]))
        .await;
    assert_eq!(saved.status(), 303);
    let page = browser.follow(saved).await.text().await.expect("page");
    assert!(
        page.contains("Version <strong>1</strong> is in force") && page.contains("quiet-hours"),
        "{page}"
    );
    let sim = browser
        .post("/settings/policies", &fields(&[("do", "simulate"), ("source", QUIET), ("note", "")]))
        .await;
    assert_eq!(sim.status(), 200);
    let sim = sim.text().await.expect("text");
    assert!(sim.contains("audited agent calls of the last 7 days"), "{sim}");
    // Another window, chosen beside the button: replayed and named, and chosen again on the
    // page that shows the result; one the form does not offer is the default week.
    let sim = browser
        .post(
            "/settings/policies",
            &fields(&[("do", "simulate"), ("source", QUIET), ("note", ""), ("window", "720")]),
        )
        .await;
    assert_eq!(sim.status(), 200);
    let sim = sim.text().await.expect("text");
    assert!(sim.contains("audited agent calls of the last 30 days"), "{sim}");
    assert!(sim.contains(r#"<option value="720" selected>"#), "{sim}");
    let sim = browser
        .post(
            "/settings/policies",
            &fields(&[("do", "simulate"), ("source", QUIET), ("note", ""), ("window", "5000")]),
        )
        .await;
    let sim = sim.text().await.expect("text");
    assert!(sim.contains("audited agent calls of the last 7 days"), "{sim}");
}
