//! The console turned against itself: routes that cannot be misused, security headers on every
//! response, and pages that show nothing of a hostile query.

use crate::support::*;

#[tokio::test]
async fn console_routes_cannot_be_turned_against_themselves() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    // Post-sign-in targets stay on the console, however a browser would resolve them.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    for (next, lands) in [
        ("//evil.example/x", "/"),
        ("/\\evil.example/x", "/"),
        ("/\t/evil.example/x", "/"),
        ("https://evil.example/x", "/"),
        ("javascript:alert(1)", "/"),
        ("/connections?tab=all", "/connections?tab=all"),
        ("/a/../audit", "/audit"),
        ("/.//console.invalid//evil.example", "/"),
        ("//console.invalid//evil.example", "/"),
        ("/.//evil.example", "/"),
    ] {
        let fields = [
            ("email", admin.email.as_str()),
            ("password", admin.password.as_str()),
            ("next", next),
        ];
        let response = post_login(&http, &api.url, "192.0.2.50", &fields).await;
        assert_eq!(response.status(), 303, "{next:?}");
        assert_eq!(response.headers()["location"], lands, "{next:?}");
    }
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    // A path segment that is not a connection of this tenant has no confirmation page.
    let other_tenant = &api.seed.tenants[1].connections[0].connection;
    for path in [
        "/connections/..%2F..%2Fpeople%2Frole/revoke".to_owned(),
        "/connections/con_aaaaaaaaaaaaaaaa/revoke".to_owned(),
        format!("/connections/{other_tenant}/revoke"),
        "/connections/%22%3E%3Cscript%3E/revoke".to_owned(),
    ] {
        let response = browser.get(&path).await;
        assert_eq!(response.status(), 404, "{path}");
        assert!(
            !response.text().await.unwrap_or_default().contains("action=\"/connections/.."),
            "{path}"
        );
    }
    let mine = &api.seed.tenants[0].connections[0].connection;
    let page =
        browser.get(&format!("/connections/{mine}/revoke")).await.text().await.expect("html");
    assert!(page.contains(&format!("action=\"/connections/{mine}/revoke\"")), "{page}");
    // A switch form must name its direction; nothing changes otherwise.
    let settings = browser.get("/settings").await.text().await.expect("html");
    let csrf = form_fields(&settings, "/settings/agent-access")
        .into_iter()
        .find(|(k, _)| k == "csrf")
        .expect("csrf")
        .1;
    for to in [None, Some("sideways"), Some("")] {
        let mut form =
            vec![("csrf".to_owned(), csrf.clone()), ("reason".to_owned(), "test".to_owned())];
        if let Some(to) = to {
            form.push(("to".into(), to.into()));
        }
        let response = browser.post("/settings/agent-access", &form).await;
        assert_eq!(response.status(), 422, "{to:?}");
    }
    let on =
        api._db.rows("tenants").eq("slug", &api.seed.tenants[0].slug).text("agent_access").await;
    assert_eq!(on, "true", "agent access unchanged");
    let operator = browser.get("/operator").await.text().await.expect("html");
    let csrf = form_fields(&operator, "/operator/kill-switch")
        .into_iter()
        .find(|(k, _)| k == "csrf")
        .expect("csrf")
        .1;
    let response = browser
        .post("/operator/kill-switch", &[("csrf".into(), csrf), ("reason".into(), "test".into())])
        .await;
    assert_eq!(response.status(), 422, "the global switch needs a direction too");
    assert_eq!(api._db.rows("platform_state").text("global_kill").await, "false");
}

#[tokio::test]
async fn every_console_and_oauth_response_carries_the_security_headers() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let client_id = register_client(&api).await;
    let mut responses = vec![
        ("sign-in page", browser.http.get(format!("{}/login", api.url)).send().await.expect("get")),
        ("connections", browser.get("/connections").await),
        ("consent", browser.get(&authorize_path(&client_id, &[])).await),
        ("a missing page", browser.get("/connections/con_aaaaaaaaaaaaaaaa").await),
        (
            "metadata",
            api.http
                .get(format!("{}/.well-known/oauth-authorization-server", api.url))
                .send()
                .await
                .expect("get"),
        ),
        (
            "token error",
            api.http
                .post(format!("{}/oauth/token", api.url))
                .form(&[("grant_type", "password")])
                .send()
                .await
                .expect("post"),
        ),
    ];
    responses.push((
        "registration",
        api.http
            .post(format!("{}/oauth/register", api.url))
            .json(&json!({"redirect_uris": []}))
            .send()
            .await
            .expect("post"),
    ));
    for (what, r) in &responses {
        let h = r.headers();
        let csp =
            h.get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(
            csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"),
            "{what}: {csp}"
        );
        assert_eq!(h.get("x-frame-options").map(|v| v.as_bytes()), Some(&b"DENY"[..]), "{what}");
        assert_eq!(
            h.get("x-content-type-options").map(|v| v.as_bytes()),
            Some(&b"nosniff"[..]),
            "{what}"
        );
        assert!(h.contains_key("referrer-policy"), "{what}");
        assert_eq!(h.get("cache-control").map(|v| v.as_bytes()), Some(&b"no-store"[..]), "{what}");
    }
    // No inline script is needed: the page's only script is the console's own file.
    let page = browser.get("/connections").await.text().await.expect("html");
    assert!(!page.contains("onclick") && !page.contains("<script>"), "no inline script");
    let js = browser.get("/static/console.js").await;
    assert_eq!(js.status(), 200);
}

#[tokio::test]
async fn the_approvals_page_shows_nothing_of_a_hostile_query() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    // Only a pac_ handle and one of three outcomes are ever shown; anything else is ignored.
    for query in [
        "decided=%3Cscript%3Ealert(1)%3C%2Fscript%3E&outcome=executed",
        "decided=pac_abc&outcome=%3Cb%3Eexecuted",
        "decided=pac_abc&outcome=changed&replaced_by=https%3A%2F%2Fevil.example",
        "decided=pac_abc&decided=pac_def&outcome=denied",
        &format!("decided=pac_{}&outcome=executed", "a".repeat(5000)),
    ] {
        let page = browser.get(&format!("/approvals?{query}")).await;
        assert_eq!(page.status(), 200, "{query}");
        let html = page.text().await.expect("html");
        assert!(
            !html.contains("<script>alert")
                && !html.contains("<b>")
                && !html.contains("evil.example"),
            "{query}"
        );
        assert!(!html.contains(&"a".repeat(100)), "an overlong handle is not echoed");
    }
    let shown = browser
        .get("/approvals?decided=pac_abc123&outcome=denied")
        .await
        .text()
        .await
        .expect("html");
    assert!(shown.contains("Denied pac_abc123"), "a well-formed outcome is shown");
}
