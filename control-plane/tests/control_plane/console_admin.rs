//! The console as a busy admin meets it: no lock-out of the tenant's last admin (console and
//! CLI), role changes confirmed with what they give and take, credentials created once however
//! often the page is reloaded, lists that page and filter, saves that say what they saved, and
//! banners while agents are blocked or the SIEM webhook fails.

use crate::support::*;

/// The CSRF token of the signed-in session, from any page's sign-out form.
async fn csrf(browser: &Browser) -> String {
    let html = browser.get("/people").await.text().await.expect("html");
    form_fields(&html, "/logout").into_iter().find(|(k, _)| k == "csrf").expect("csrf").1
}

/// Makes `OPS` an operator, granted by the demo's first one (the first tenant's admin).
fn grant_operator(api: &Api) {
    let first = api.seed.tenants[0].admin.email.as_str();
    let (ok, out) =
        ctl_as(&api._db, Some(first), &["operator", "--email", OPS, "--name", "Olu Ops"]);
    assert!(ok, "{out}");
}

/// The cells of one CSV line whose every cell is quoted (as the export writes them).
fn csv_cells(line: &str) -> Vec<String> {
    let (mut cells, mut cell, mut quoted, mut chars) =
        (Vec::new(), String::new(), false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                cell.push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => cells.push(std::mem::take(&mut cell)),
            (c, _) => cell.push(c),
        }
    }
    cells.push(cell);
    cells
}

fn form(csrf: &str, fields: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut out = vec![("csrf".to_owned(), csrf.to_owned())];
    out.extend(fields.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    out
}

#[tokio::test]
async fn the_last_active_admin_cannot_be_demoted_or_deactivated_anywhere() {
    let api = Api::start().await;
    grant_operator(&api);
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    // The console: demoting oneself, the only admin, is refused in words and changes nothing.
    let r = admin
        .post("/people/role", &form(&csrf, &[("email", &t0.admin.email), ("role", "viewer")]))
        .await;
    assert_eq!(r.status(), 409, "refused as a state, not a fault");
    let text = r.text().await.expect("html");
    assert!(
        text.contains("last active admin") && text.contains("make another person an admin first"),
        "{text}"
    );
    let r = admin.post("/people/deactivate", &form(&csrf, &[("email", &t0.admin.email)])).await;
    assert_eq!(r.status(), 409);
    assert_eq!(api._db.membership_in(&t0.slug, &t0.admin.email).await, ("admin".to_owned(), true));
    // The CLI (an operator): the same rule.
    for args in [
        vec![
            "person",
            "set-role",
            "--tenant",
            &t0.slug,
            "--email",
            &t0.admin.email,
            "--role",
            "dispatcher",
        ],
        vec!["person", "deactivate", "--tenant", &t0.slug, "--email", &t0.admin.email],
    ] {
        let (ok, err) = ctl(&api._db, &args);
        assert!(!ok, "{err}");
        assert!(
            err["error"]["message"].as_str().expect("message").contains("last active admin"),
            "{err}"
        );
    }
    assert_eq!(api._db.membership_in(&t0.slug, &t0.admin.email).await, ("admin".to_owned(), true));

    // With a second admin, the first may step down; then the second is the last one.
    let r = admin
        .post("/people/role", &form(&csrf, &[("email", &t0.dispatcher.email), ("role", "admin")]))
        .await;
    assert_eq!(r.status(), 303, "raising needs no passkey here (the policy is off)");
    let r = admin
        .post("/people/role", &form(&csrf, &[("email", &t0.admin.email), ("role", "dispatcher")]))
        .await;
    assert_eq!(r.status(), 303);
    assert_eq!(
        api._db.membership_in(&t0.slug, &t0.admin.email).await,
        ("dispatcher".to_owned(), true)
    );
    let (ok, err) = ctl(
        &api._db,
        &["person", "deactivate", "--tenant", &t0.slug, "--email", &t0.dispatcher.email],
    );
    assert!(!ok && err.to_string().contains("last active admin"), "{err}");
}

#[tokio::test]
async fn two_admins_demoting_each_other_at_once_leave_one_admin() {
    let api = Api::start().await;
    grant_operator(&api);
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    let r = admin
        .post("/people/role", &form(&csrf, &[("email", &t0.dispatcher.email), ("role", "admin")]))
        .await;
    assert_eq!(r.status(), 303);
    for round in 0..5 {
        let (a, b) = tokio::join!(
            async {
                ctl(
                    &api._db,
                    &[
                        "person",
                        "set-role",
                        "--tenant",
                        &t0.slug,
                        "--email",
                        &t0.admin.email,
                        "--role",
                        "viewer",
                    ],
                )
            },
            async {
                ctl(
                    &api._db,
                    &[
                        "person",
                        "set-role",
                        "--tenant",
                        &t0.slug,
                        "--email",
                        &t0.dispatcher.email,
                        "--role",
                        "viewer",
                    ],
                )
            },
        );
        let admins = api
            ._db
            .rows("memberships")
            .tenant(&t0.slug)
            .eq("role", "admin")
            .eq("active", true)
            .count()
            .await;
        assert_eq!(admins, 1, "round {round}: one admin remains ({a:?}, {b:?})");
        assert!(a.0 != b.0, "round {round}: exactly one of the two demotions passed");
        // Make both admins again for the next round.
        let lowered = if a.0 { &t0.admin.email } else { &t0.dispatcher.email };
        let (ok, out) = ctl(
            &api._db,
            &["person", "set-role", "--tenant", &t0.slug, "--email", lowered, "--role", "admin"],
        );
        assert!(ok, "{out}");
    }
}

#[tokio::test]
async fn a_role_change_is_confirmed_with_what_it_gives_and_takes() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let path = format!("/people/role?email={}&role=viewer", t0.dispatcher.email);
    let page = admin.get(&path).await;
    assert_eq!(page.status(), 200);
    let html = page.text().await.expect("html");
    assert!(html.contains("from <strong>dispatcher</strong> to <strong>viewer</strong>"), "{html}");
    assert!(html.contains("They lose: ") && html.contains("bookings:write"), "{html}");
    assert!(
        html.contains("active connection(s)") || html.contains("no active connections"),
        "{html}"
    );
    // Nothing changed yet: the page is only the question.
    assert_eq!(api._db.membership_in(&t0.slug, &t0.dispatcher.email).await.0, "dispatcher");
    // Confirming saves and says what it saved, once.
    let fields = form_fields(&html, "/people/role");
    let done = admin.post("/people/role", &fields).await;
    let after = admin.follow(done).await.text().await.expect("html");
    assert!(after.contains(&format!("{} is now viewer.", t0.dispatcher.email)), "{after}");
    assert_eq!(api._db.membership_in(&t0.slug, &t0.dispatcher.email).await.0, "viewer");
    let again = admin.get("/people").await.text().await.expect("html");
    assert!(!again.contains("is now viewer."), "the notice is shown once");
    // An unknown person or role gets no confirmation page.
    assert_eq!(admin.get("/people/role?email=nobody@example.net&role=viewer").await.status(), 404);
    let bad = format!("/people/role?email={}&role=owner", t0.dispatcher.email);
    assert_eq!(admin.get(&bad).await.status(), 422);
}

#[tokio::test]
async fn reloading_the_page_after_creating_a_connection_creates_nothing() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    let r = admin
        .post(
            "/connections",
            &form(
                &csrf,
                &[("name", "Reloaded agent"), ("toolset", "full"), ("right", "bookings:read")],
            ),
        )
        .await;
    assert_eq!(r.status(), 303);
    let location = r.headers()["location"].to_str().expect("ascii").to_owned();
    assert!(location.ends_with("/created"), "{location}");
    let shown = admin.follow(r).await.text().await.expect("html");
    assert!(
        shown.contains("gh_mcp_") && shown.contains("claude mcp add --transport http"),
        "{shown}"
    );
    for _ in 0..3 {
        let reloaded = admin.get(&location).await.text().await.expect("html");
        assert!(!reloaded.contains("gh_mcp_"), "the token is never shown again");
        assert!(reloaded.contains("was shown once"), "{reloaded}");
    }
    assert_eq!(
        api._db.rows("connections").eq("name", "Reloaded agent").count().await,
        1,
        "one connection, however often the page reloads"
    );
}

#[tokio::test]
async fn connections_page_search_and_filter_in_sql_with_new_at_the_top() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    // 60 read-only agents and one dangerous one.
    for i in 0..60 {
        let name = format!("Reader {i:02}");
        let r = admin
            .post(
                "/connections",
                &form(
                    &csrf,
                    &[("name", &name), ("toolset", "read_only"), ("right", "bookings:read")],
                ),
            )
            .await;
        assert_eq!(r.status(), 303);
    }
    let r = admin
        .post(
            "/connections",
            &form(
                &csrf,
                &[
                    ("name", "Overreach"),
                    ("toolset", "full"),
                    ("right", "bookings:read"),
                    ("right", "people:manage"),
                ],
            ),
        )
        .await;
    assert_eq!(r.status(), 303);

    let first = admin.get("/connections").await.text().await.expect("html");
    let new_at = first.find("href=\"/connections/new\"").expect("a New connection button");
    assert!(new_at < first.find("<table").expect("the list"), "New comes before the list");
    assert!(
        !first.contains("action=\"/connections\" class=\"card\""),
        "no create form under the list"
    );
    let rows = |html: &str| html.matches("<tr><td><a href=\"/connections/con_").count();
    assert_eq!(rows(&first), 50, "a page holds 50");
    // Newest first: the dangerous one leads, marked.
    let overreach = first.find("Overreach").expect("the newest first");
    assert!(overreach < first.find("Reader 59").expect("then the readers"));
    assert!(first.contains("dangerous: people:manage"), "the dangerous right is named");
    // The next page continues where the first ended, without repeats.
    let next = first
        .split("rel=\"next\" href=\"")
        .nth(1)
        .expect("a next page")
        .split('"')
        .next()
        .expect("href");
    let second = admin.get(&next.replace("&amp;", "&")).await.text().await.expect("html");
    assert!(second.contains("First page"));
    assert!(
        !second.contains("Overreach") && second.contains("Reader 00"),
        "the oldest on the later page"
    );
    // Filters: the level, a search, the status.
    let dangerous = admin.get("/connections?level=dangerous").await.text().await.expect("html");
    assert!(
        dangerous.contains("Overreach") && !dangerous.contains("Reader "),
        "only over-privileged agents"
    );
    let reading = admin.get("/connections?level=read&q=reader").await.text().await.expect("html");
    assert_eq!(rows(&reading), 50, "the readers are read-level (a full first page)");
    let found = admin.get("/connections?q=reader%2007").await.text().await.expect("html");
    assert_eq!(rows(&found), 1);
    let revoked =
        admin.get("/connections?status=revoked&q=reader").await.text().await.expect("html");
    assert_eq!(rows(&revoked), 0);
    // Hostile input is refused in words and changes nothing.
    assert_eq!(admin.get("/connections?level=root").await.status(), 422);
    assert_eq!(admin.get("/connections?cursor=not-a-cursor").await.status(), 422);
    assert_eq!(admin.get("/connections?granted=magic").await.status(), 422);
}

#[tokio::test]
async fn every_page_says_when_agents_are_blocked_or_the_siem_fails() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    for page in ["/connections", "/people", "/audit", "/settings"] {
        let html = admin.get(page).await.text().await.expect("html");
        assert!(!html.contains("class=\"banner"), "{page}: no banner while all is well");
    }
    let r = admin
        .post("/settings/agent-access", &form(&csrf, &[("to", "off"), ("reason", "drill")]))
        .await;
    let after = admin.follow(r).await.text().await.expect("html");
    assert!(after.contains("Agent access is now off"), "the save says what it saved: {after}");
    for page in ["/connections", "/people", "/audit", "/activity", "/api-tokens", "/messages"] {
        let html = admin.get(page).await.text().await.expect("html");
        assert!(html.contains("Agent access is off for this tenant"), "{page}");
    }
    let list = admin.get("/connections").await.text().await.expect("html");
    assert!(list.contains("blocked: agent access off"), "connections show their effective state");
    assert!(!list.contains(">active</td>"), "none shows active while blocked");
    let r = admin
        .post("/settings/agent-access", &form(&csrf, &[("to", "on"), ("reason", "over")]))
        .await;
    assert_eq!(r.status(), 303);
    let html = admin.get("/people").await.text().await.expect("html");
    assert!(!html.contains("Agent access is off for this tenant"), "gone once it is on");

    // A failing SIEM webhook shows on every page, since when and why.
    api._db.siem_webhook_failing(&t0.slug, "connection refused").await;
    let html = admin.get("/connections").await.text().await.expect("html");
    assert!(
        html.contains("The SIEM webhook has been failing since")
            && html.contains("connection refused"),
        "{html}"
    );
    // Another tenant's admin sees none of it.
    let t1 = &api.seed.tenants[1];
    let other = Browser::sign_in(&api, &t1.admin.email, &t1.admin.password).await;
    let theirs = other.get("/connections").await.text().await.expect("html");
    assert!(!theirs.contains("class=\"banner"), "banners are the tenant's own");
}

#[tokio::test]
async fn budget_forms_show_only_what_a_connection_can_cause_and_none_once_revoked() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    let create = |name: &'static str, rights: &'static [&'static str]| {
        let mut fields = form(&csrf, &[("name", name), ("toolset", "full")]);
        fields.extend(rights.iter().map(|r| ("right".to_owned(), (*r).to_owned())));
        let admin = &admin;
        async move {
            let r = admin.post("/connections", &fields).await;
            let to = r.headers()["location"].to_str().expect("ascii").to_owned();
            to.trim_end_matches("/created").to_owned()
        }
    };
    let reader = create("Reader", &["bookings:read"]).await;
    let page = admin.get(&reader).await.text().await.expect("html");
    assert!(!page.contains("action=\"/budgets\""), "a reader can cause nothing budgets count");
    assert!(page.contains("cause no effect"), "{page}");
    let notifier = create("Notifier", &["bookings:read", "bookings:notify"]).await;
    let page = admin.get(&notifier).await.text().await.expect("html");
    for kind in ["customers_messaged", "bookings_changed"] {
        assert!(page.contains(&format!("data-budget=\"{kind}\"")), "{kind}");
    }
    for kind in ["technicians_paged", "alert_minutes_muted", "records_deleted"] {
        assert!(
            !page.contains(&format!("data-budget=\"{kind}\"")),
            "{kind} is not this connection's"
        );
    }
    // Revoked: read-only, no form of any kind but sign-out.
    let revoke = format!("{notifier}/revoke");
    let confirm = admin.get(&revoke).await.text().await.expect("html");
    let mut fields = form_fields(&confirm, &revoke);
    fields.push(("reason".into(), "done".into()));
    let done = admin.post(&revoke, &fields).await;
    let page = admin.follow(done).await.text().await.expect("html");
    assert!(page.contains("is revoked"), "the save says what it did: {page}");
    assert!(
        !page.contains("action=\"/budgets\"") && !page.contains("/revoke\""),
        "read-only once revoked"
    );
}

#[tokio::test]
async fn the_audit_names_who_acted_and_what_changed_and_filters_by_both() {
    let api = Api::start().await;
    grant_operator(&api);
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    let r = admin
        .post("/people/role", &form(&csrf, &[("email", &t0.dispatcher.email), ("role", "viewer")]))
        .await;
    assert_eq!(r.status(), 303);
    let r = admin
        .post("/settings/rate-limit", &form(&csrf, &[("class", "notify"), ("per_minute", "5")]))
        .await;
    assert_eq!(r.status(), 303);
    let (ok, out) = ctl(
        &api._db,
        &[
            "person",
            "set-role",
            "--tenant",
            &t0.slug,
            "--email",
            &t0.dispatcher.email,
            "--role",
            "dispatcher",
        ],
    );
    assert!(ok, "{out}");

    let page = admin.get("/audit?action=person.set_role").await.text().await.expect("html");
    assert!(
        page.contains(&format!("Avery Admin &lt;{}&gt;", t0.admin.email)),
        "a person by name and email: {page}"
    );
    assert!(page.contains("role: dispatcher → viewer"), "what changed, from what to what");
    assert!(
        page.contains("· platform operator") && page.contains("role: viewer → dispatcher"),
        "an operator marked as such"
    );
    let limits = admin.get("/audit?action=rate_limit.set").await.text().await.expect("html");
    assert!(limits.contains("per minute: ") && limits.contains("→ 5"), "{limits}");

    // By actor: the admin's rows only, never the operator's.
    let mine = admin
        .get(&format!("/audit?action=person.set_role&actor={}", t0.admin.email))
        .await
        .text()
        .await
        .expect("html");
    assert!(
        mine.contains("role: dispatcher → viewer") && !mine.contains("platform operator"),
        "{mine}"
    );
    // By record: every row about the dispatcher.
    let handle = api._db.handle_of_person_with_email(&t0.dispatcher.email).await;
    let about = admin.get(&format!("/audit?record={handle}")).await.text().await.expect("html");
    assert_eq!(about.matches("person.set_role").count(), 2, "both role changes name the person");
    assert!(!about.contains("rate_limit.set"));
    assert_eq!(
        admin.get("/audit?actor=%01").await.status(),
        400,
        "a control character is refused in words"
    );

    // The export names people by email and carries the change; no internal id.
    let csv = admin.get("/audit.csv?action=person.set_role").await.text().await.expect("csv");
    let header: Vec<&str> = csv.lines().next().expect("header").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let row = csv.lines().find(|l| l.contains(&t0.admin.email)).expect("the admin's row");
    let cells = csv_cells(row);
    assert_eq!(cells[col("actor_kind")], "person");
    assert_eq!(cells[col("actor_email")], t0.admin.email);
    assert!(cells[col("actor")].starts_with("per_"), "the person by handle: {row}");
    assert!(cells[col("change")].contains("\"from\":\"dispatcher\""), "{row}");
}

#[tokio::test]
async fn an_invalid_new_connection_comes_back_in_place_with_everything_typed() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    let before = api._db.count("connections").await;
    // Fourteen boxes ticked and a name too long: the boxes stay ticked, the name stays typed.
    let long = "n".repeat(81);
    let mut fields = form(&csrf, &[("name", &long), ("toolset", "small")]);
    for r in shared::rights::Right::ALL {
        fields.push(("right".into(), r.as_str().into()));
    }
    let r = admin.post("/connections", &fields).await;
    assert_eq!(r.status(), 422);
    let html = r.text().await.expect("html");
    assert!(html.contains("Nothing was saved"), "{html}");
    assert!(
        html.contains("<header>") && html.contains("href=\"/connections\""),
        "the page keeps its navigation"
    );
    assert!(html.contains(&format!("value=\"{long}\"")), "the name is kept");
    assert!(
        html.contains("aria-invalid=\"true\"") && html.contains("id=\"name-error\""),
        "the field is marked: {html}"
    );
    assert!(!html.contains("name:"), "the message is in words, not a field name");
    assert_eq!(
        html.matches("type=\"checkbox\" name=\"right\"").count(),
        shared::rights::Right::ALL.len()
    );
    assert_eq!(
        html.matches("checked").count(),
        shared::rights::Right::ALL.len(),
        "every box stays ticked"
    );
    assert!(html.contains("value=\"small\" selected"), "the toolset is kept");
    // No right at all: said next to the rights.
    let r = admin
        .post("/connections", &form(&csrf, &[("name", "No rights"), ("toolset", "full")]))
        .await;
    assert_eq!(r.status(), 422);
    let html = r.text().await.expect("html");
    assert!(
        html.contains("id=\"rights-error\"") && html.contains("tick at least one right"),
        "{html}"
    );
    assert_eq!(api._db.count("connections").await, before, "nothing was created");
}

#[tokio::test]
async fn a_refusal_page_keeps_the_navigation_of_who_got_it() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let r = admin.get("/connections/con_doesnotexist000000").await;
    assert_eq!(r.status(), 404);
    let html = r.text().await.expect("html");
    assert!(html.contains("Cannot do that") && html.contains("Nothing was changed"), "{html}");
    assert!(
        html.contains("href=\"/connections\"") && html.contains("Sign out"),
        "the navigation stays: {html}"
    );
    // Signed out, a refusal page carries no one's navigation.
    let anonymous = reqwest::Client::new()
        .get(format!("{}/connections/con_doesnotexist000000", api.url))
        .header("cookie", "gh_session=forged")
        .send()
        .await
        .expect("get");
    let html = anonymous.text().await.expect("html");
    assert!(!html.contains("Sign out"), "{html}");
}

#[tokio::test]
async fn a_failed_sso_save_keeps_what_was_typed_but_never_the_secret() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    let secret = "very-secret-client-secret-1234";
    let fields = form(
        &csrf,
        &[
            ("issuer", "not a url"),
            ("client_id", "gatehouse-web"),
            ("client_secret", secret),
            ("email_domains", "acme.example"),
            ("allow_join", "no"),
            ("sso_required", "yes"),
            ("id_jag", "no"),
            ("session_hours", "8"),
        ],
    );
    let r = admin.post("/settings/sso", &fields).await;
    assert_eq!(r.status(), 422);
    let html = r.text().await.expect("html");
    assert!(html.contains("Nothing was saved") && html.contains("id=\"issuer-error\""), "{html}");
    assert!(
        html.contains("value=\"gatehouse-web\"") && html.contains("value=\"acme.example\""),
        "typed values kept"
    );
    assert!(html.contains("<option value=\"yes\" selected>yes</option>"), "a choice kept");
    assert!(!html.contains(secret), "the secret is never sent back");
    assert!(html.contains("Type the client secret again"), "and it says so");
    assert_eq!(api._db.count("tenant_idps").await, 0, "nothing saved");
}

#[tokio::test]
async fn the_audit_day_filter_is_the_tenants_day_and_times_show_utc_on_hover() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    // Just after midnight and just before the next one, in the tenant's zone.
    for (local, action) in [
        ("2026-11-10 00:10:00", "zone.early"),
        ("2026-11-10 23:50:00", "zone.late"),
        ("2026-11-11 00:10:00", "zone.next"),
    ] {
        api._db.audit_row_at_local_time(&t0.slug, local, action).await;
    }
    let html = admin
        .get("/audit?action=zone.&since=2026-11-10&until=2026-11-10")
        .await
        .text()
        .await
        .expect("html");
    assert!(
        html.contains("zone.early") && html.contains("zone.late"),
        "the whole local day: {html}"
    );
    assert!(!html.contains("zone.next"), "not the next local day");
    assert!(
        html.contains(&format!("day, {}", t0.zone)),
        "the filter names the zone it reads days in"
    );
    assert!(html.contains("<time datetime=\"2026-11-") && html.contains(" UTC\">"), "UTC on hover");
}

#[tokio::test]
async fn a_connection_is_renamed_and_narrowed_in_place_and_widened_only_as_a_decision() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    let r = admin
        .post(
            "/connections",
            &form(
                &csrf,
                &[
                    ("name", "Wide"),
                    ("toolset", "full"),
                    ("right", "bookings:read"),
                    ("right", "bookings:write"),
                ],
            ),
        )
        .await;
    let page =
        r.headers()["location"].to_str().expect("ascii").trim_end_matches("/created").to_owned();
    let handle = page.trim_start_matches("/connections/").to_owned();
    let edit = format!("{page}/edit");
    let html = admin.get(&edit).await.text().await.expect("html");
    assert!(html.contains("value=\"Wide\""), "the form holds what the connection has");
    // Narrowing and renaming: one step, saved and said.
    let r = admin
        .post(
            &edit,
            &form(
                &csrf,
                &[("name", "Narrow"), ("toolset", "read_only"), ("right", "bookings:read")],
            ),
        )
        .await;
    let after = admin.follow(r).await.text().await.expect("html");
    assert!(after.contains("Saved ") && after.contains("Narrow"), "{after}");
    assert_eq!(
        api._db.connection_rights_name_toolset(&handle).await,
        "bookings:read|Narrow|read_only"
    );
    let change = api._db.audit_change_naming("connection.edit", &handle).await;
    assert!(
        change.contains("\"rights\"")
            && change.contains("\"from\": \"bookings:read bookings:write\""),
        "{change}"
    );
    // Beyond the creator's rights: refused in place.
    let r = admin
        .post(
            &edit,
            &form(&csrf, &[("name", "Narrow"), ("toolset", "read_only"), ("right", "not:a-right")]),
        )
        .await;
    assert_eq!(r.status(), 422);
    // Under the passkey policy, widening waits for a passkey; narrowing does not.
    api._db.rows("tenants").set("decisions_need_passkey", true).await;
    let r = admin
        .post(
            &edit,
            &form(
                &csrf,
                &[
                    ("name", "Narrow"),
                    ("toolset", "full"),
                    ("right", "bookings:read"),
                    ("right", "bookings:write"),
                ],
            ),
        )
        .await;
    assert_eq!(r.status(), 403);
    assert!(r.text().await.expect("html").contains("needs a passkey"));
    assert_eq!(
        api._db.connection_rights_name_toolset(&handle).await,
        "bookings:read|Narrow|read_only",
        "nothing widened"
    );
    let r = admin
        .post(
            &edit,
            &form(
                &csrf,
                &[("name", "Renamed"), ("toolset", "read_only"), ("right", "bookings:read")],
            ),
        )
        .await;
    assert_eq!(r.status(), 303, "a rename needs no passkey");
    api._db.rows("tenants").set("decisions_need_passkey", false).await;
    // Revoked: read-only.
    let revoke = format!("{page}/revoke");
    let confirm = admin.get(&revoke).await.text().await.expect("html");
    let mut fields = form_fields(&confirm, &revoke);
    fields.push(("reason".into(), "done".into()));
    assert_eq!(admin.post(&revoke, &fields).await.status(), 303);
    assert_eq!(admin.get(&edit).await.status(), 409);
    let r = admin
        .post(
            &edit,
            &form(&csrf, &[("name", "Back"), ("toolset", "read_only"), ("right", "bookings:read")]),
        )
        .await;
    assert_eq!(r.status(), 422);
    assert!(
        api._db.connection_rights_name_toolset(&handle).await.ends_with("|Renamed|read_only"),
        "a revoked connection changes no more"
    );
}

#[tokio::test]
async fn an_action_that_expired_waiting_is_audited_once_and_listed_with_the_decisions() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let connection = &t0.connections[0].connection;
    // An agent's prepared action that waited for a person and expired (the worker is what
    // prepares them; this suite runs the control plane alone).
    api._db
        .action_expired_while_waiting(
            connection,
            "pac_expiredwhilewaiting01",
            "Email Ada Lovelace about her booking",
        )
        .await;
    shared::services::housekeeping(&api._db.ds).await.expect("housekeeping");
    shared::services::housekeeping(&api._db.ds).await.expect("housekeeping again");
    assert_eq!(
        api._db.expiries_audited_for_action("pac_expiredwhilewaiting01").await,
        1,
        "one audit row, however often housekeeping runs"
    );
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let page = admin.get("/approvals").await.text().await.expect("html");
    assert!(page.contains("id=\"no-approvals\""), "nothing waits any more");
    let history = page.split("id=\"approval-history\"").nth(1).expect("the history of decisions");
    assert!(
        history.contains("Email Ada Lovelace") && history.contains("expired with nobody deciding"),
        "{history}"
    );
    let audit = admin.get("/audit?action=send_customer_message").await.text().await.expect("html");
    assert!(audit.contains("expired while waiting for a person"), "{audit}");
    assert!(
        audit.contains(&format!("({connection}) · created by")),
        "named as the agent that asked: {audit}"
    );
}

#[tokio::test]
async fn hostile_filters_and_another_tenants_handles_are_refused_and_change_nothing() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let t1 = &api.seed.tenants[1];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    let long = "x".repeat(201);
    for (path, why) in [
        ("/people?role=owner".to_owned(), "an unknown role"),
        ("/people?status=sleeping".to_owned(), "an unknown state"),
        ("/people?cursor=%7B%7D".to_owned(), "a cursor of no page"),
        (format!("/people?q={long}"), "a search too long"),
        (format!("/connections?q={long}"), "a search too long"),
        (format!("/audit?actor={long}"), "an actor too long"),
        (format!("/audit?record={long}"), "a record too long"),
    ] {
        let status = admin.get(&path).await.status().as_u16();
        assert!(status == 422 || status == 400, "{why}: {path} answered {status}");
    }
    // A repeated filter reads as its last value, never as two.
    let html = admin.get("/people?role=owner&role=admin").await.text().await.expect("html");
    assert!(html.contains(&t0.admin.email) && !html.contains(&t0.dispatcher.email), "{html}");
    // Another tenant's connection: no edit page, no edit, nothing changed.
    let theirs = &t1.connections[0].connection;
    let before = api._db.rows("connections").eq("handle", theirs).text("name").await;
    assert_eq!(admin.get(&format!("/connections/{theirs}/edit")).await.status(), 404);
    let r = admin
        .post(
            &format!("/connections/{theirs}/edit"),
            &form(&csrf, &[("name", "Mine now"), ("toolset", "full"), ("right", "bookings:read")]),
        )
        .await;
    assert_eq!(r.status(), 404);
    assert_eq!(api._db.rows("connections").eq("handle", theirs).text("name").await, before);
    // Twenty creates of the same form: twenty connections, each its own token, none repeated
    // by a reload of its page.
    let created: Vec<String> = futures_util::future::join_all((0..20).map(|i| {
        let fields = form(
            &csrf,
            &[
                ("name", &format!("Burst {i}")),
                ("toolset", "read_only"),
                ("right", "bookings:read"),
            ],
        );
        let admin = &admin;
        async move {
            admin.post("/connections", &fields).await.headers()["location"]
                .to_str()
                .expect("ascii")
                .to_owned()
        }
    }))
    .await;
    let distinct: std::collections::BTreeSet<&String> = created.iter().collect();
    assert_eq!(distinct.len(), 20);
    assert_eq!(api._db.rows("connections").like("name", "Burst %").count().await, 20);
}

/// The `href` of a page's "Next page" link, as a path to request.
fn next_page(html: &str) -> String {
    html.split("rel=\"next\" href=\"")
        .nth(1)
        .expect("a next page")
        .split('"')
        .next()
        .expect("href")
        .replace("&amp;", "&")
}

#[tokio::test]
async fn api_tokens_and_messages_page_search_and_filter_in_sql() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    for i in 0..55 {
        let name = format!("Export {i:02}");
        let r = admin
            .post("/api-tokens", &form(&csrf, &[("name", &name), ("expires_in_days", "7")]))
            .await;
        assert_eq!(r.status(), 303);
    }
    let rows = |html: &str| html.matches("<td>Export ").count();
    let first = admin.get("/api-tokens").await.text().await.expect("html");
    assert_eq!(rows(&first), 50, "a page holds 50");
    assert!(first.find("Export 54").expect("newest first") < first.find("Export 10").expect("x"));
    let second = admin.get(&next_page(&first)).await.text().await.expect("html");
    assert_eq!(rows(&second), 5, "the next page holds the rest, without repeats");
    assert!(second.contains("Export 00") && !second.contains("Export 54"));
    let found = admin.get("/api-tokens?q=export%2007").await.text().await.expect("html");
    assert_eq!(rows(&found), 1);
    let revoked = admin.get("/api-tokens?status=revoked&q=export").await.text().await.expect("h");
    assert_eq!(rows(&revoked), 0);
    assert!(revoked.contains("No API token matches"));
    for bad in ["status=lost", "cursor=nope", &format!("q={}", "x".repeat(201))] {
        let r = admin.get(&format!("/api-tokens?{bad}")).await;
        assert_eq!(r.status(), 422, "{bad}");
    }

    // Messages: 60 of this tenant (some failed) and one of the other tenant's.
    api._db.reminder_emails_for_paging(&t0.slug, &api.seed.tenants[1].slug).await;
    let rows = |html: &str| html.matches("<td>Reminder ").count();
    let first = admin.get("/messages?q=reminder").await.text().await.expect("html");
    assert_eq!(rows(&first), 50);
    assert!(!first.contains("Reminder elsewhere"), "never another tenant's");
    let second = admin.get(&next_page(&first)).await.text().await.expect("html");
    assert_eq!(rows(&second), 10);
    let failed = admin.get("/messages?q=reminder&status=failed").await.text().await.expect("h");
    assert_eq!(rows(&failed), 6);
    let one = admin.get("/messages?q=c7%40example.com").await.text().await.expect("html");
    assert_eq!(rows(&one), 1);
    assert_eq!(admin.get("/messages?channel=pigeon").await.status(), 422);
    assert_eq!(admin.get("/messages?cursor=WyJ4Il0").await.status(), 422);
}

#[tokio::test]
async fn a_settings_rows_mistake_comes_back_in_its_row_and_saves_nothing() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    let (limits_before, budgets_before) =
        (api._db.count("tenant_rate_limits").await, api._db.budgets_count_and_total().await);

    // A rate limit that is not a number: the row again, the number kept, the field marked.
    let r = admin
        .post("/settings/rate-limit", &form(&csrf, &[("class", "notify"), ("per_minute", "ten")]))
        .await;
    assert_eq!(r.status(), 422);
    let html = r.text().await.expect("html");
    assert!(html.contains("<header>") && html.contains("Settings sections"), "navigation kept");
    assert!(html.contains("value=\"ten\""), "what was typed is kept: {html}");
    assert!(
        html.contains("aria-describedby=\"per_minute-error\"")
            && html.contains("id=\"per_minute-error\"")
            && html.contains("a whole number of calls per minute"),
        "the message sits next to the field, in words"
    );
    assert_eq!(html.matches("aria-invalid=\"true\"").count(), 1, "only the row that failed");
    // Beyond what the platform allows: the service's refusal, in the same place.
    let r = admin
        .post(
            "/settings/rate-limit",
            &form(&csrf, &[("class", "read"), ("per_minute", "99999999")]),
        )
        .await;
    assert_eq!(r.status(), 422);
    let html = r.text().await.expect("html");
    assert!(html.contains("value=\"99999999\"") && html.contains("id=\"per_minute-error\""));

    // A tenant budget with an empty window: refused next to the window, the limit kept.
    let r = admin
        .post(
            "/budgets",
            &form(&csrf, &[("kind", "customers_messaged"), ("limit", "40"), ("window", "")]),
        )
        .await;
    assert_eq!(r.status(), 422);
    let html = r.text().await.expect("html");
    assert!(html.contains("value=\"40\"") && html.contains("id=\"window-error\""), "{html}");
    assert!(html.contains("say how long the window is"));

    // A connection's budget with a window it cannot parse: its own page again.
    let con = t0.connections[0].connection.as_str();
    let r = admin
        .post(
            "/budgets",
            &form(
                &csrf,
                &[
                    ("connection", con),
                    ("kind", "bookings_changed"),
                    ("limit", "3"),
                    ("window", "often"),
                ],
            ),
        )
        .await;
    assert_eq!(r.status(), 422);
    let html = r.text().await.expect("html");
    assert!(html.contains(con) && html.contains("value=\"often\""), "{html}");
    assert!(html.contains("id=\"window-error\""));

    // An approval rule for a tool that does not exist: the tool-rule form again.
    let r = admin
        .post(
            "/settings/approval-policy",
            &form(&csrf, &[("row", "tool-rule"), ("scope", "launch_rockets"), ("mode", "off")]),
        )
        .await;
    assert_eq!(r.status(), 422, "{}", r.text().await.unwrap_or_default());
    assert_eq!(api._db.count("tenant_rate_limits").await, limits_before, "nothing saved");
    assert_eq!(api._db.budgets_count_and_total().await, budgets_before, "nothing saved");
}
