//! People and their console sessions: sign-in and its throttle, password resets and
//! deactivations that end sessions, what a viewer is told, and housekeeping of what outlived
//! its use.

use crate::support::*;

#[tokio::test]
async fn an_operator_resets_a_password_and_every_session_of_it_ends() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let dispatcher = Browser::sign_in(&api, &t0.dispatcher.email, &t0.dispatcher.password).await;
    // Only an operator: a caller who names none is refused.
    let (ok, err) = ctl_as(
        &api._db,
        None,
        &["password-reset", "--email", &t0.dispatcher.email, "--password", "a-new-long-password"],
    );
    assert!(!ok, "{err}");
    let (ok, err) = ctl_as(
        &api._db,
        Some(&t0.admin.email),
        &["password-reset", "--email", &t0.dispatcher.email, "--password", "short"],
    );
    assert!(!ok, "{err}");
    let (ok, err) = ctl_as(
        &api._db,
        Some(&t0.admin.email),
        &["password-reset", "--email", "nobody@example.net", "--password", "a-new-long-password"],
    );
    assert!(!ok, "{err}");
    assert_eq!(err["error"]["code"], "invalid_argument", "an unknown email: {err}");
    let (ok, out) = ctl_as(
        &api._db,
        Some(&t0.admin.email),
        &["password-reset", "--email", &t0.dispatcher.email, "--password", "a-new-long-password"],
    );
    assert!(ok, "{out}");
    assert_ne!(dispatcher.get("/tenants").await.status(), 200, "the old session ended");
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let login = |password: &'static str| {
        let (http, url, email) = (http.clone(), api.url.clone(), t0.dispatcher.email.clone());
        async move {
            post_login(
                &http,
                &url,
                "192.0.2.7",
                &[("email", &email), ("password", password), ("next", "/")],
            )
            .await
            .status()
            .as_u16()
        }
    };
    let old: &'static str = Box::leak(t0.dispatcher.password.clone().into_boxed_str());
    assert_ne!(login(old).await, 303, "the old password no longer signs in");
    assert_eq!(login("a-new-long-password").await, 303, "the new one does");
    let audited = api
        ._db
        .rows("audit_log")
        .null("tenant_id")
        .eq("action", "person.password_reset")
        .count()
        .await;
    assert_eq!(audited, 1);
}

#[tokio::test]
async fn a_viewer_is_told_their_role_has_no_console_pages() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let (ok, out) = ctl_as(
        &api._db,
        Some(&t0.admin.email),
        &[
            "person",
            "create",
            "--tenant",
            &t0.slug,
            "--email",
            "viewer@example.net",
            "--name",
            "Vera Viewer",
            "--role",
            "viewer",
            "--password",
            "a-viewer-password",
        ],
    );
    assert!(ok, "{out}");
    let viewer = Browser::sign_in(&api, "viewer@example.net", "a-viewer-password").await;
    let home = viewer.get("/").await;
    assert_eq!(home.status(), 200, "a page, not a bounce to the tenant picker");
    let html = home.text().await.expect("html");
    assert!(html.contains("no console pages") && html.contains("Vera Viewer"), "{html}");
}

#[tokio::test]
async fn deactivation_ends_every_console_session_of_the_person() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let dispatcher = Browser::sign_in(&api, &t0.dispatcher.email, &t0.dispatcher.password).await;
    assert_eq!(dispatcher.get("/tenants").await.status(), 200);
    assert!(api._db.console_sessions_of_email(&t0.dispatcher.email).await >= 1);
    let (ok, out) = ctl_as(
        &api._db,
        Some(&t0.admin.email),
        &["person", "deactivate", "--tenant", &t0.slug, "--email", &t0.dispatcher.email],
    );
    assert!(ok, "{out}");
    assert_eq!(api._db.console_sessions_of_email(&t0.dispatcher.email).await, 0);
    assert_ne!(dispatcher.get("/tenants").await.status(), 200, "the cookie is dead");
}

#[tokio::test]
async fn housekeeping_drops_what_outlived_its_use_and_keeps_the_rest() {
    let db = TestDb::new().await;
    demo::seed(&db.ds, None, "").await.expect("seed");
    db.leave_housekeeping_leftovers().await;
    let static_tokens = db.rows("connection_tokens").eq("kind", "static").count().await;
    let removed = shared::services::housekeeping(&db.ds).await.expect("housekeeping");
    assert_eq!(removed, 3);
    assert_eq!(db.count("connection_tokens").await, static_tokens, "static tokens never expire");
    assert_eq!(db.count("login_throttle").await, 1);
    assert_eq!(db.rows("replay_entries").texts("args_digest", "id").await.join(","), "new");
}

#[tokio::test]
async fn a_deactivation_page_exists_only_for_a_person_of_the_tenant() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let stranger = api.seed.tenants[1].admin.email.clone();
    for email in [stranger.as_str(), "nobody@example.net", "\"><script>x</script>"] {
        let q: String = url::form_urlencoded::byte_serialize(email.as_bytes()).collect();
        let response = browser.get(&format!("/people/deactivate?email={q}")).await;
        assert_eq!(response.status(), 404, "{email}");
    }
    let member = &api.seed.tenants[0].dispatcher.email;
    assert_eq!(browser.get(&format!("/people/deactivate?email={member}")).await.status(), 200);
}

#[tokio::test]
async fn sign_in_throttles_atomically_per_account_and_source() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let attempt = |password: String, source: &'static str| {
        let (http, base, email) = (http.clone(), api.url.clone(), admin.email.clone());
        async move {
            let response = post_login(
                &http,
                &base,
                source,
                &[("email", email.as_str()), ("password", password.as_str()), ("next", "/")],
            )
            .await;
            (response.status().as_u16(), response.text().await.unwrap_or_default())
        }
    };
    // Twenty wrong passwords at once from one address: exactly five are even checked.
    let tries = (0..20).map(|i| attempt(format!("wrong-password-{i}"), "203.0.113.7"));
    let outcomes = futures_util::future::join_all(tries).await;
    let checked = outcomes.iter().filter(|(_, body)| body.contains("wrong")).count();
    let throttled = outcomes.iter().filter(|(_, body)| body.contains("Too many")).count();
    assert_eq!((checked, throttled), (5, 15), "the count is taken atomically");
    // The right password from that address is refused too; from the person's own it works.
    let (status, _) = attempt(admin.password.clone(), "203.0.113.7").await;
    assert_eq!(status, 401, "the guessing address stays locked out");
    let (status, _) = attempt(admin.password.clone(), "198.51.100.20").await;
    assert_eq!(status, 303, "the person, elsewhere, is not locked out");
    // A refused source cannot push the account to its ceiling: sixty more from that address
    // leave the person able to sign in from elsewhere.
    let more = (0..60).map(|i| attempt(format!("again-{i}"), "203.0.113.7"));
    futures_util::future::join_all(more).await;
    let (status, _) = attempt(admin.password.clone(), "198.51.100.30").await;
    assert_eq!(status, 303, "the ceiling counts only attempts that were checked");
    // Overlong input is refused before any work.
    let (status, _) = attempt("p".repeat(5000), "198.51.100.21").await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn the_sign_in_form_needs_its_own_token() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let fields =
        [("email", admin.email.as_str()), ("password", admin.password.as_str()), ("next", "/")];
    // Another site posting the form: no cookie, a cookie without the field, a mismatch.
    let (cookie, token) = login_form(&http, &api.url).await;
    for (case, with_cookie, field) in [
        ("no cookie", false, Some(token.as_str())),
        ("no field", true, None),
        ("wrong field", true, Some("forged")),
    ] {
        let mut form: Vec<(&str, &str)> = fields.to_vec();
        if let Some(f) = field {
            form.push(("login_csrf", f));
        }
        let mut request = http.post(format!("{}/login", api.url)).form(&form);
        if with_cookie {
            request = request.header("cookie", &cookie);
        }
        let response = request.send().await.expect("login");
        assert_eq!(response.status(), 403, "{case}");
        assert!(
            response
                .headers()
                .get_all("set-cookie")
                .iter()
                .all(|c| !c.to_str().unwrap_or_default().starts_with("gh_session=")),
            "{case}: no session"
        );
    }
    let response = post_login(&http, &api.url, "192.0.2.9", &fields).await;
    assert_eq!(response.status(), 303);
}
