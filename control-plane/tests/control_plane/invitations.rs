//! Inviting people from the console and joining by the link: by setting a password, by signing
//! in to an account that exists, and through the tenant's single sign-on; each once, never
//! after a revocation or the expiry, never as someone else, audited.

use crate::sso::{FakeIdp, claims, connect, finish, no_redirects, session_of, start};
use crate::support::*;
use shared::testing::operator_in;

async fn csrf(browser: &Browser) -> String {
    let html = browser.get("/people").await.text().await.expect("html");
    form_fields(&html, "/logout").into_iter().find(|(k, _)| k == "csrf").expect("csrf").1
}

fn form(csrf: &str, fields: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut out = vec![("csrf".to_owned(), csrf.to_owned())];
    out.extend(fields.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    out
}

/// Invites `email` as `role`; returns the link shown once after the redirect.
async fn invite(admin: &Browser, csrf: &str, email: &str, role: &str) -> String {
    let r = admin
        .post(
            "/people/invite",
            &form(csrf, &[("email", email), ("name", "New Person"), ("role", role)]),
        )
        .await;
    assert_eq!(r.status(), 303, "{:?}", r.text().await);
    let location = r.headers()["location"].to_str().expect("ascii").to_owned();
    assert!(location.starts_with("/people/invitations/inv_"), "{location}");
    let html = admin.follow(r).await.text().await.expect("html");
    let link = html
        .split("<pre id=\"invitation-link\">")
        .nth(1)
        .expect("the link, once")
        .split('<')
        .next()
        .expect("text")
        .to_owned();
    // Once: the page again shows no link.
    let again = admin.get(&location).await.text().await.expect("html");
    assert!(!again.contains("gh_inv_") && again.contains("shown once"), "{again}");
    link
}

/// The acceptance page of `path` as a browser without a session opens it: the page and the
/// double-submit cookie with its form token.
async fn open(api: &Api, path: &str) -> (reqwest::StatusCode, String, String) {
    let r = no_redirects().get(format!("{}{path}", api.url)).send().await.expect("open");
    let status = r.status();
    let cookie = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("gh_invite="))
        .map(|c| c.split(';').next().unwrap_or_default().to_owned())
        .unwrap_or_default();
    (status, r.text().await.expect("html"), cookie)
}

/// The path of an invitation's link (the test server's own origin).
fn path_of(link: &str) -> String {
    url::Url::parse(link).expect("a link").path().to_owned()
}

fn token_field(html: &str) -> String {
    html.split("name=\"invite_csrf\" value=\"")
        .nth(1)
        .expect("form token")
        .split('"')
        .next()
        .expect("v")
        .to_owned()
}

async fn post_accept(
    api: &Api,
    path: &str,
    cookie: &str,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    no_redirects()
        .post(format!("{}{path}", api.url))
        .header("cookie", cookie)
        .form(fields)
        .send()
        .await
        .expect("accept")
}

#[tokio::test]
async fn an_invited_person_joins_once_by_setting_a_password() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let db = &api._db;
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    let people = admin.get("/people").await.text().await.expect("html");
    assert!(
        people.find("href=\"/people/invite\"").expect("Invite is a button")
            < people.find("<table").expect("list"),
        "Invite comes before the list"
    );
    let link = invite(&admin, &csrf, "Newcomer@Example.com", "dispatcher").await;
    let path = path_of(&link);
    assert!(path.starts_with("/invitations/gh_inv_"), "{path}");

    // The email went to the outbox with the link; the audit names the invitation, not the address.
    assert_eq!(
        db.rows("outbox")
            .eq("recipient", "newcomer@example.com")
            .like("body", &format!("%{path}%"))
            .count()
            .await,
        1
    );
    let (invitation, role) = db.invite_audit_handle_and_role().await;
    assert!(invitation.starts_with("inv_") && role == "dispatcher", "{invitation} {role}");
    assert_eq!(db.invitations_keeping_their_token().await, 0, "only the hash is kept");
    let people = admin.get("/people").await.text().await.expect("html");
    assert!(
        people.contains("id=\"invitations\"") && people.contains("newcomer@example.com"),
        "listed as waiting"
    );

    // Inviting the same address again, or a member, comes back in place.
    for (email, words) in [
        ("newcomer@example.com", "waiting already"),
        (t0.dispatcher.email.as_str(), "already a member"),
    ] {
        let r = admin
            .post(
                "/people/invite",
                &form(&csrf, &[("email", email), ("name", "Again"), ("role", "viewer")]),
            )
            .await;
        assert_eq!(r.status(), 422, "{email}");
        let html = r.text().await.expect("html");
        assert!(html.contains(words) && html.contains(&format!("value=\"{email}\"")), "{html}");
    }

    // The page names the tenant and the role; a short password comes back with the name kept.
    let (status, html, cookie) = open(&api, &path).await;
    assert_eq!(status, 200);
    assert!(
        html.contains("as <strong>dispatcher</strong>") && html.contains("Set a password"),
        "{html}"
    );
    let form_token = token_field(&html);
    let r = post_accept(
        &api,
        &path,
        &cookie,
        &[
            ("invite_csrf", &form_token),
            ("how", "password"),
            ("name", "Nia Newcomer"),
            ("password", "short"),
        ],
    )
    .await;
    assert_eq!(r.status(), 422);
    let html = r.text().await.expect("html");
    assert!(
        html.contains("id=\"password-error\"") && html.contains("value=\"Nia Newcomer\""),
        "{html}"
    );
    assert!(!html.contains("value=\"short\""), "a password is never sent back");
    // Without the page's cookie (another site's form): refused, nobody made.
    let r = post_accept(
        &api,
        &path,
        "",
        &[
            ("invite_csrf", &form_token),
            ("how", "password"),
            ("name", "Nia"),
            ("password", "a long enough password"),
        ],
    )
    .await;
    assert_eq!(r.status(), 404);
    assert_eq!(db.people_with_email("newcomer@example.com").await, 0);

    // Joining: signed in, a dispatcher of the tenant, the invitation used, audited.
    let (_, html, cookie) = open(&api, &path).await;
    let r = post_accept(
        &api,
        &path,
        &cookie,
        &[
            ("invite_csrf", &token_field(&html)),
            ("how", "password"),
            ("name", "Nia Newcomer"),
            ("password", "a long enough password"),
        ],
    )
    .await;
    assert_eq!(r.status(), 303);
    let session = session_of(&r).expect("signed in");
    let home = no_redirects()
        .get(format!("{}/approvals", api.url))
        .header("cookie", &session)
        .send()
        .await
        .expect("home");
    assert_eq!(home.status(), 200, "working in the tenant");
    assert_eq!(db.membership_of_email("newcomer@example.com").await.0, "dispatcher");
    assert_eq!(db.rows("invitations").text("accepted_how").await, "password");
    assert_eq!(db.audited("person.join").await, 1);
    // The link works once.
    let (status, html, _) = open(&api, &path).await;
    assert_eq!(status, 404);
    assert!(html.contains("does not work"));
    let relogin = Browser::sign_in(&api, "newcomer@example.com", "a long enough password").await;
    assert_eq!(relogin.get("/approvals").await.status(), 200, "the password signs in");
}

#[tokio::test]
async fn a_revoked_expired_or_made_up_link_opens_nothing_and_an_account_joins_by_signing_in() {
    let api = Api::start().await;
    let (t0, t1) = (&api.seed.tenants[0], &api.seed.tenants[1]);
    let db = &api._db;
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;

    // Revoked: the link stops working.
    let link = invite(&admin, &csrf, "gone@example.com", "viewer").await;
    let handle = db.rows("invitations").eq("email", "gone@example.com").text("handle").await;
    let r = admin.post(&format!("/people/invitations/{handle}/revoke"), &form(&csrf, &[])).await;
    assert_eq!(r.status(), 303);
    let path = path_of(&link);
    assert_eq!(open(&api, &path).await.0, 404);
    // A second revocation says it was revoked already; another tenant cannot revoke.
    let r = admin.post(&format!("/people/invitations/{handle}/revoke"), &form(&csrf, &[])).await;
    assert_eq!(r.status(), 409);
    let other = Browser::sign_in(&api, &t1.admin.email, &t1.admin.password).await;
    let other_csrf = crate::invitations::csrf(&other).await;
    let link = invite(&admin, &csrf, "late@example.com", "viewer").await;
    let late = db.rows("invitations").eq("email", "late@example.com").text("handle").await;
    assert_eq!(
        other
            .post(&format!("/people/invitations/{late}/revoke"), &form(&other_csrf, &[]))
            .await
            .status(),
        404
    );
    // Nor can another tenant, or a made-up handle, open the page a sent invitation shows.
    assert_eq!(other.get(&format!("/people/invitations/{late}/sent")).await.status(), 404);
    assert_eq!(admin.get("/people/invitations/not-a-handle/sent").await.status(), 404);
    // Expired: the same.
    db.rows("invitations")
        .eq("email", "late@example.com")
        .set_now_plus("expires_at", "-1 second")
        .await;
    let path = path_of(&link);
    assert_eq!(open(&api, &path).await.0, 404);
    // An expired invitation does not block a new one to the same address.
    invite(&admin, &csrf, "late@example.com", "viewer").await;
    // Made up, or a credential of another kind.
    for bad in [
        "/invitations/gh_inv_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "/invitations/gh_ses_abc",
        &format!("/invitations/{}", "x".repeat(5000)),
    ] {
        let (status, html, _) = open(&api, bad).await;
        assert_eq!(status, 404, "{bad}");
        assert!(html.contains("does not work"));
    }

    // Someone with an account (the other tenant's dispatcher) joins by signing in to it.
    let email = t1.dispatcher.email.as_str();
    let link = invite(&admin, &csrf, email, "viewer").await;
    let path = path_of(&link);
    let (_, html, cookie) = open(&api, &path).await;
    assert!(html.contains("Sign in to accept") && !html.contains("Set a password"), "{html}");
    // A password cannot be set on an account that exists.
    let r = post_accept(
        &api,
        &path,
        &cookie,
        &[
            ("invite_csrf", &token_field_or_blank(&html)),
            ("how", "password"),
            ("name", "X"),
            ("password", "a long enough password"),
        ],
    )
    .await;
    assert_ne!(r.status(), 303);
    // Signed in as someone else: refused, not joined.
    let r = admin.post(&path, &form(&csrf, &[("how", "account")])).await;
    assert_eq!(r.status(), 422);
    assert!(r.text().await.expect("html").contains("sign out"));
    assert_eq!(db.memberships_in_tenant(&t0.slug, email).await, 0);
    let invited = Browser::sign_in(&api, email, &t1.dispatcher.password).await;
    let page = invited.get(&path).await.text().await.expect("html");
    let session_csrf =
        form_fields(&page, &path).into_iter().find(|(k, _)| k == "csrf").expect("csrf").1;
    let r = invited.post(&path, &form(&session_csrf, &[("how", "account")])).await;
    assert_eq!(r.status(), 303, "{:?}", r.text().await);
    assert_eq!(
        db.memberships_in_tenant(&t0.slug, email).await,
        1,
        "joined, keeping the other tenant"
    );
    assert_eq!(db.rows("invitations").eq("email", email).text("accepted_how").await, "account");
}

fn token_field_or_blank(html: &str) -> String {
    html.split("name=\"invite_csrf\" value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn an_invited_address_joins_through_single_sign_on_with_the_invitations_role() {
    let api =
        Api::start_with(shared::services::oauth::FetchPolicy { dev: true, ..Default::default() })
            .await;
    let idp = FakeIdp::start().await;
    let t0 = &api.seed.tenants[0];
    let db = &api._db;
    connect(&api, &idp, &t0.slug, "northwind.example", false, false).await.expect("idp");
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    // Without an invitation (joining not allowed) the IdP's word is not enough.
    let started = start(&api, "uninvited@northwind.example").await;
    let token = idp.id_token(&claims(
        &idp,
        "sub-u",
        "uninvited@northwind.example",
        &started.params["nonce"],
    ));
    assert_eq!(finish(&api, &idp, &started, token).await.status(), 401);
    let link = invite(&admin, &csrf, "invitee@northwind.example", "dispatcher").await;
    let path = path_of(&link);
    let (_, html, _) = open(&api, &path).await;
    assert!(html.contains("Continue with single sign-on"), "{html}");
    let started = start(&api, "invitee@northwind.example").await;
    let token =
        idp.id_token(&claims(&idp, "sub-i", "invitee@northwind.example", &started.params["nonce"]));
    let r = finish(&api, &idp, &started, token).await;
    assert_eq!(r.status(), 303, "{:?}", r.text().await);
    assert_eq!(
        db.membership_of_email("invitee@northwind.example").await.0,
        "dispatcher",
        "the invitation's role, not the lowest"
    );
    assert_eq!(db.rows("invitations").text("accepted_how").await, "sso");
    assert_eq!(open(&api, &path).await.0, 404, "used");
}

#[tokio::test]
async fn an_older_invitation_never_brings_back_or_promotes_someone_added_or_removed_since() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let db = &api._db;
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    let ops = operator_in(&db.ds, &t0.admin.email, &t0.slug).await;
    // Invited as admin, then added directly as viewer: the invitation is closed.
    let link = invite(&admin, &csrf, "later@example.com", "admin").await;
    shared::services::admin::person_create(
        &db.ds,
        &ops,
        "later@example.com",
        "Lee Later",
        shared::rights::Role::Viewer,
        Some("a long enough password"),
    )
    .await
    .expect("added directly");
    let path = path_of(&link);
    assert_eq!(open(&api, &path).await.0, 404, "the older invitation no longer works");
    // Invited again while a member: refused. Deactivated, the next invitation brings them back
    // with its own role, and one sent before the deactivation does not.
    let r = admin
        .post(
            "/people/invite",
            &form(&csrf, &[("email", "later@example.com"), ("name", "L"), ("role", "admin")]),
        )
        .await;
    assert_eq!(r.status(), 422);
    shared::services::admin::person_deactivate(&db.ds, &ops, "later@example.com")
        .await
        .expect("deactivate");
    let link = invite(&admin, &csrf, "later@example.com", "dispatcher").await;
    let path = path_of(&link);
    let invited = Browser::sign_in(&api, "later@example.com", "a long enough password").await;
    let page = invited.get(&path).await.text().await.expect("html");
    let session_csrf =
        form_fields(&page, &path).into_iter().find(|(k, _)| k == "csrf").expect("csrf").1;
    let r = invited.post(&path, &form(&session_csrf, &[("how", "account")])).await;
    assert_eq!(r.status(), 303);
    assert_eq!(db.membership_of_email("later@example.com").await, ("dispatcher".to_owned(), true));
    // The used link's email keeps no live link.
    assert_eq!(
        db.rows("outbox")
            .like("idempotency_key", "invitation:%")
            .like("body", "%gh_inv_%")
            .count()
            .await,
        0,
        "used and closed invitations leave no link in the outbox"
    );
}

#[tokio::test]
async fn single_sign_on_never_joins_an_existing_account_by_its_email_and_a_required_idp_is_the_only_way_in()
 {
    let api =
        Api::start_with(shared::services::oauth::FetchPolicy { dev: true, ..Default::default() })
            .await;
    let idp = FakeIdp::start().await;
    let (t0, t1) = (&api.seed.tenants[0], &api.seed.tenants[1]);
    let db = &api._db;
    // The other tenant's dispatcher has an account; this tenant's IdP claims their domain.
    let email = t1.dispatcher.email.clone();
    let domain = email.rsplit_once('@').expect("domain").1.to_owned();
    connect(&api, &idp, &t0.slug, &domain, false, false).await.expect("idp");
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf(&admin).await;
    invite(&admin, &csrf, &email, "admin").await;
    let started = start(&api, &email).await;
    let token = idp.id_token(&claims(&idp, "sub-victim", &email, &started.params["nonce"]));
    let r = finish(&api, &idp, &started, token).await;
    assert_eq!(r.status(), 401, "an account that exists is not joined by the IdP's word");
    assert_eq!(db.memberships_in_tenant(&t0.slug, &email).await, 0);
    assert_eq!(db.count("person_identities").await, 0, "nothing linked");

    // Single sign-on required: the password and account ways are refused, even posted by hand,
    // and an address the IdP does not vouch for cannot be invited at all.
    connect(&api, &idp, &t0.slug, &domain, true, false).await.expect("required");
    let ops = operator_in(&db.ds, &t0.admin.email, &t0.slug).await;
    let outside = shared::services::invitations::Invite {
        email: "x@elsewhere.example",
        name: "X",
        role: shared::rights::Role::Viewer,
    };
    let refused = shared::services::invitations::invite(&db.ds, &ops, outside, &api.url)
        .await
        .expect_err("an address the IdP does not vouch for");
    assert!(refused.to_string().contains("single sign-on only"), "{refused}");
    let path = db.invitation_path_in_outbox().await;
    let invited = Browser::sign_in(&api, &email, &t1.dispatcher.password).await;
    let page = invited.get(&path).await.text().await.expect("html");
    assert!(page.contains("single sign-on only") && !page.contains("Sign in to accept"), "{page}");
    let r = invited.post(&path, &form(&invited_csrf(&invited).await, &[("how", "account")])).await;
    assert_eq!(r.status(), 422);
    assert_eq!(db.memberships_in_tenant(&t0.slug, &email).await, 0, "not joined by hand either");
}

/// The CSRF token of a session with no tenant page to read it from: the tenant picker's form.
async fn invited_csrf(browser: &Browser) -> String {
    let html = browser.get("/tenants").await.text().await.expect("html");
    form_fields(&html, "/logout").into_iter().find(|(k, _)| k == "csrf").expect("csrf").1
}

#[tokio::test]
async fn gatehousectl_invites_lists_and_revokes_with_json() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let (ok, sent) = ctl_as(
        &api._db,
        Some(&t0.admin.email),
        &[
            "person",
            "invite",
            "--tenant",
            &t0.slug,
            "--email",
            "cli.invitee@example.com",
            "--name",
            "Cli Invitee",
            "--role",
            "dispatcher",
            "--console-url",
            &api.url,
        ],
    );
    assert!(ok, "{sent}");
    let link = sent["link"].as_str().expect("the link, once");
    assert!(link.starts_with(&format!("{}/invitations/gh_inv_", api.url)), "{link}");
    let handle = sent["invitation"].as_str().expect("handle").to_owned();
    let (ok, list) =
        ctl_as(&api._db, Some(&t0.admin.email), &["person", "invitations", "--tenant", &t0.slug]);
    assert!(ok && list.to_string().contains("cli.invitee@example.com"), "{list}");
    assert!(!list.to_string().contains("gh_inv_"), "a list never shows a link");
    // A member, an unknown role: refused, nothing sent.
    for (email, role) in [(t0.dispatcher.email.as_str(), "viewer"), ("x@example.com", "owner")] {
        let (ok, refused) = ctl_as(
            &api._db,
            Some(&t0.admin.email),
            &[
                "person",
                "invite",
                "--tenant",
                &t0.slug,
                "--email",
                email,
                "--name",
                "X",
                "--role",
                role,
                "--console-url",
                &api.url,
            ],
        );
        assert!(!ok, "{email} {role}: {refused}");
    }
    let (ok, gone) = ctl_as(
        &api._db,
        Some(&t0.admin.email),
        &["person", "uninvite", "--tenant", &t0.slug, "--invitation", &handle],
    );
    assert!(ok && gone["revoked"] == true, "{gone}");
    let path = url::Url::parse(link).expect("url").path().to_owned();
    assert_eq!(open(&api, &path).await.0, 404, "a revoked link opens nothing");
    assert_eq!(
        api._db.rows("outbox").eq("recipient", "cli.invitee@example.com").count().await,
        1,
        "one email for the one invitation"
    );
}
