//! Budgets on effects, set by operators (`gatehousectl budget`) and tenant admins (the
//! console), audited; raising one is a widening decision under the passkey policy, lowering
//! one stays one step.

use crate::support::*;

fn form(csrf: &str, fields: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut f = vec![("csrf".to_owned(), csrf.to_owned())];
    f.extend(fields.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    f
}

fn budget<'a>(shown: &'a serde_json::Value, kind: &str, scope: &str) -> &'a serde_json::Value {
    shown["budgets"]
        .as_array()
        .expect("budgets")
        .iter()
        .find(|b| b["kind"] == kind && b["scope"] == scope)
        .unwrap_or_else(|| panic!("no {scope} {kind}: {shown}"))
}

#[tokio::test]
async fn gatehousectl_shows_and_sets_budgets_audited() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let slug = t0.slug.as_str();
    let con = t0.connections[0].connection.as_str();
    let cli = |args: &[&str]| ctl_as(&api._db, Some(&t0.admin.email), args);
    let (ok, shown) = cli(&["budget", "show", "--tenant", slug, "--connection", con]);
    assert!(ok, "{shown}");
    let b = budget(&shown, "customers_messaged", "connection");
    assert_eq!(
        (b["limit"].as_i64(), b["window"].as_str(), b["default"].as_bool()),
        (Some(500), Some("1d"), Some(true))
    );
    let (ok, set) = cli(&[
        "budget",
        "set",
        "--tenant",
        slug,
        "--connection",
        con,
        "--kind",
        "customers_messaged",
        "--limit",
        "40",
        "--window",
        "1h",
    ]);
    assert!(ok, "{set}");
    let b = budget(&set, "customers_messaged", "connection");
    assert_eq!(
        (b["limit"].as_i64(), b["window_secs"].as_i64(), b["default"].as_bool()),
        (Some(40), Some(3600), Some(false))
    );
    let (ok, set) = cli(&[
        "budget",
        "set",
        "--tenant",
        slug,
        "--kind",
        "technicians_paged",
        "--limit",
        "5",
        "--window",
        "24h",
    ]);
    assert!(ok, "{set}");
    assert_eq!(budget(&set, "technicians_paged", "tenant")["limit"], 5);
    // Refusals name what is wrong and set nothing.
    let (ok, err) = cli(&["budget", "set", "--tenant", slug, "--kind", "emails", "--limit", "5"]);
    assert!(
        !ok && err["error"]["fix"].as_str().expect("fix").contains("customers_messaged"),
        "{err}"
    );
    let (ok, err) = cli(&[
        "budget",
        "set",
        "--tenant",
        slug,
        "--kind",
        "records_deleted",
        "--limit",
        "5",
        "--window",
        "1w",
    ]);
    assert!(!ok && err["error"]["code"] == "invalid_argument", "{err}");
    let t1_con = api.seed.tenants[1].connections[0].connection.as_str();
    let (ok, err) = cli(&[
        "budget",
        "set",
        "--tenant",
        slug,
        "--connection",
        t1_con,
        "--kind",
        "records_deleted",
        "--limit",
        "5",
    ]);
    assert!(!ok && err["error"]["code"] == "not_found", "another tenant's connection: {err}");
    assert_eq!(api._db.count("budgets").await, 2);
    assert_eq!(
        api._db.rows("audit_log").eq("action", "budget.set").eq("channel", "cli").count().await,
        2
    );
    // Back to the default, and no tenant-wide budget.
    let (ok, _) = cli(&[
        "budget",
        "set",
        "--tenant",
        slug,
        "--connection",
        con,
        "--kind",
        "customers_messaged",
        "--limit",
        "default",
    ]);
    assert!(ok);
    let (ok, shown) = cli(&[
        "budget",
        "set",
        "--tenant",
        slug,
        "--kind",
        "technicians_paged",
        "--limit",
        "default",
    ]);
    assert!(ok, "{shown}");
    assert_eq!(api._db.count("budgets").await, 0);
}

#[tokio::test]
async fn in_the_console_raising_a_budget_needs_the_passkey_and_lowering_is_one_step() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let slug = t0.slug.as_str();
    let con = t0.connections[0].connection.as_str();
    let db = &api._db;
    let (ok, on) = ctl_as(db, Some(&t0.admin.email), &["passkey-policy", "--tenant", slug, "on"]);
    assert!(ok, "{on}");
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let page = admin.get(&format!("/connections/{con}")).await.text().await.expect("html");
    assert!(page.contains("id=\"budgets-connection\""), "the connection page shows its budgets");
    assert!(page.contains("data-budget=\"customers_messaged\""), "{page}");
    let fields = form_fields(&page, "/budgets");
    let csrf = fields.iter().find(|(k, _)| k == "csrf").map(|(_, v)| v.clone()).expect("csrf");
    let settings = admin.get("/settings/limits").await.text().await.expect("html");
    assert!(
        settings.contains("id=\"budgets-tenant\""),
        "Limits and budgets shows the tenant-wide budgets"
    );
    let limit = move || db.rows("budgets").eq("kind", "customers_messaged").int("limit_units");
    // Lowering: one step, audited with channel console.
    // (500 a day to 50 an hour would be raising it: 1200 a day.)
    let lower =
        [("connection", con), ("kind", "customers_messaged"), ("limit", "50"), ("window", "24h")];
    let r = admin.post("/budgets", &form(&csrf, &lower)).await;
    assert_eq!(r.status(), 303, "lowering a budget is one step");
    assert_eq!(limit().await, 50);
    // Raising (a larger limit, or a shorter window): refused without a passkey, nothing changes.
    for raise in [
        [("connection", con), ("kind", "customers_messaged"), ("limit", "60"), ("window", "24h")],
        [("connection", con), ("kind", "customers_messaged"), ("limit", "50"), ("window", "12h")],
    ] {
        let r = admin.post("/budgets", &form(&csrf, &raise)).await;
        let status = r.status().as_u16();
        let body = r.text().await.expect("body");
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("needs a passkey"), "{body}");
        // The service named the decision; this admin has no passkey yet to confirm it with.
        assert!(body.contains("no passkey yet"), "{body}");
    }
    assert_eq!(limit().await, 50);
    let r = admin
        .post(
            "/budgets",
            &form(
                &csrf,
                &[("connection", con), ("kind", "customers_messaged"), ("limit", "default")],
            ),
        )
        .await;
    assert_eq!(r.status(), 403, "back to a larger default is raising it");
    assert_eq!(
        db.rows("audit_log").eq("action", "budget.set").eq("channel", "console").count().await,
        1
    );
}
