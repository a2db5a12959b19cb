//! The tenant's passkey policy: every decision that widens what agents can do is refused to a
//! session without a passkey assertion made for it (and changes nothing), every narrowing one
//! stays one step, and the CLI turns the policy on and off and resets a person's passkeys.
//! The ceremony itself runs in Chromium in the e2e suite.

use crate::support::*;

/// A console form's fields with the session's CSRF token.
fn form(csrf: &str, fields: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut f = vec![("csrf".to_owned(), csrf.to_owned())];
    f.extend(fields.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    f
}

async fn csrf_of(browser: &Browser) -> String {
    let html = browser.get("/settings").await.text().await.expect("html");
    form_fields(&html, "/settings/agent-access")
        .into_iter()
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v)
        .expect("csrf")
}

#[tokio::test]
async fn under_the_policy_a_session_alone_widens_nothing_and_narrowing_stays_one_step() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let slug = t0.slug.as_str();
    let db = &api._db;
    let cli = |args: &[&str]| ctl_as(db, Some(&t0.admin.email), args);
    let (ok, shown) = cli(&["passkey-policy", "--tenant", slug]);
    assert!(ok && shown["decisions_need_passkey"] == false, "off by default: {shown}");
    let (ok, on) = cli(&["passkey-policy", "--tenant", slug, "on"]);
    assert!(ok && on["decisions_need_passkey"] == true, "{on}");
    let (_, err) = cli(&["passkey-policy", "--tenant", slug, "maybe"]);
    assert!(err.get("decisions_need_passkey").is_none(), "an unknown direction sets nothing");

    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let csrf = csrf_of(&admin).await;
    let refused = |what: &'static str| {
        move |status: u16, body: &str| {
            assert_eq!(status, 403, "{what}: {body}");
            assert!(body.contains("needs a passkey"), "{what} says why: {body}");
        }
    };

    // Creating a connection.
    let before = db.count("connections").await;
    let r = admin
        .post("/connections", &form(&csrf, &[("name", "Widening"), ("right", "bookings:read")]))
        .await;
    let status = r.status().as_u16();
    refused("a connection")(status, &r.text().await.expect("body"));
    assert_eq!(db.count("connections").await, before);

    // Raising a role; lowering one is one step.
    let dispatcher = t0.dispatcher.email.as_str();
    let r =
        admin.post("/people/role", &form(&csrf, &[("email", dispatcher), ("role", "admin")])).await;
    let status = r.status().as_u16();
    refused("raising a role")(status, &r.text().await.expect("body"));
    assert_eq!(db.membership_of_email(dispatcher).await.0, "dispatcher");
    let r = admin
        .post("/people/role", &form(&csrf, &[("email", dispatcher), ("role", "viewer")]))
        .await;
    assert_eq!(r.status(), 303, "lowering a role stays one step");
    assert_eq!(db.membership_of_email(dispatcher).await.0, "viewer");

    // Raising a rate limit; lowering one is one step.
    let r = admin
        .post("/settings/rate-limit", &form(&csrf, &[("class", "notify"), ("per_minute", "60")]))
        .await;
    let status = r.status().as_u16();
    refused("raising a rate limit")(status, &r.text().await.expect("body"));
    let r = admin
        .post("/settings/rate-limit", &form(&csrf, &[("class", "notify"), ("per_minute", "5")]))
        .await;
    assert_eq!(r.status(), 303, "lowering a rate limit stays one step");
    let r = admin
        .post(
            "/settings/rate-limit",
            &form(&csrf, &[("class", "notify"), ("per_minute", "default")]),
        )
        .await;
    assert_eq!(r.status(), 403, "back to a higher default is raising it");
    assert_eq!(db.rows("tenant_rate_limits").eq("class", "notify").int("per_minute").await, 5);

    // Tightening the approval policy is one step; loosening it, or dropping the condition on
    // who approves, is not.
    let r = admin
        .post(
            "/settings/approval-policy",
            &form(
                &csrf,
                &[
                    ("scope", "notify"),
                    ("mode", "person_approves"),
                    ("approver_not_creator", "yes"),
                ],
            ),
        )
        .await;
    assert_eq!(r.status(), 303, "tightening stays one step");
    for (mode, extra) in
        [("person_approves", None), ("agent_confirms", None), ("person_approves", Some("no"))]
    {
        let mut f = form(&csrf, &[("scope", "notify"), ("mode", mode)]);
        if let Some(v) = extra {
            f.push(("approver_not_creator".into(), v.into()));
        }
        let r = admin.post("/settings/approval-policy", &f).await;
        let status = r.status().as_u16();
        refused("loosening the approval policy")(status, &r.text().await.expect("body"));
    }
    assert_eq!(
        db.rows("approval_policies")
            .eq("scope", "class:notify")
            .eq("mode", "person_approves")
            .eq("approver_not_creator", true)
            .count()
            .await,
        1
    );

    // A form carrying a made-up, unparsable, oversized or repeated assertion decides nothing.
    let before = db.count("connections").await;
    let huge = "x".repeat(20_000);
    let made_up = r#"{"id":"AAAA","rawId":"AAAA","type":"public-key","response":{"authenticatorData":"AAAA","clientDataJSON":"AAAA","signature":"AAAA","userHandle":null},"extensions":{}}"#;
    for (ceremony, assertion) in
        [("not-a-ceremony", made_up), ("x", "{not json"), ("x", huge.as_str()), ("", made_up)]
    {
        let mut f = form(&csrf, &[("name", "Forged"), ("right", "bookings:read")]);
        f.push(("passkey_ceremony".into(), ceremony.into()));
        f.push(("passkey_assertion".into(), assertion.into()));
        if ceremony.is_empty() {
            // Repeated fields: the last one is read, and it proves nothing either.
            f.push(("passkey_ceremony".into(), "again".into()));
            f.push(("passkey_assertion".into(), made_up.into()));
        }
        let r = admin.post("/connections", &f).await;
        let status = r.status().as_u16();
        assert!(status == 403 || status == 422, "{ceremony:?}: {status}");
    }
    assert_eq!(db.count("connections").await, before, "nothing created");

    // Agent access: off is one step, on again is not.
    let r = admin
        .post("/settings/agent-access", &form(&csrf, &[("to", "off"), ("reason", "incident")]))
        .await;
    assert_eq!(r.status(), 303, "turning agent access off stays one step");
    let r = admin
        .post("/settings/agent-access", &form(&csrf, &[("to", "on"), ("reason", "resolved")]))
        .await;
    let status = r.status().as_u16();
    refused("agent access on")(status, &r.text().await.expect("body"));
    assert_eq!(db.rows("tenants").eq("slug", slug).text("agent_access").await, "false");

    // An API token, and single sign-on settings, are credentials and who vouches for people.
    let r = admin
        .post("/api-tokens", &form(&csrf, &[("name", "Script"), ("expires_in_days", "30")]))
        .await;
    let status = r.status().as_u16();
    refused("an API token")(status, &r.text().await.expect("body"));
    assert_eq!(db.rows("api_tokens").eq("name", "Script").count().await, 0);
    let r =
        admin.post("/settings/sso/clients", &form(&csrf, &[("name", "Enterprise agent")])).await;
    let status = r.status().as_u16();
    refused("a confidential client")(status, &r.text().await.expect("body"));

    // The policy itself: off needs a passkey.
    let r = admin.post("/settings/passkey-policy", &form(&csrf, &[("to", "off")])).await;
    let status = r.status().as_u16();
    refused("the policy off")(status, &r.text().await.expect("body"));

    // Consent beyond reading: refused, no connection; reading only: one step.
    let client_id = register_client(&api).await;
    let consent = admin
        .get(&authorize_path(&client_id, &[("scope", "bookings:read bookings:write")]))
        .await
        .text()
        .await
        .expect("html");
    let mut fields = form_fields(&consent, "/oauth/authorize");
    fields.push(("right".into(), "bookings:write".into()));
    fields.push(("decision".into(), "approve".into()));
    let r = admin.post("/oauth/authorize", &fields).await;
    let body = r.text().await.expect("body");
    assert!(body.contains("needs a passkey"), "consent beyond reading: {body}");
    // Named in words, never by the request's PKCE challenge.
    assert!(body.contains("act for you with bookings:write needs a passkey"), "{body}");
    assert!(!body.contains(&client_id), "the client by its name, not its id: {body}");
    assert!(!body.contains("oauth consent") && !body.contains("oauth_consent"), "{body}");
    let granted = || db.rows("connections").eq("oauth_client_id", &client_id).count();
    assert_eq!(granted().await, 0);
    let consent = admin.get(&authorize_path(&client_id, &[])).await.text().await.expect("html");
    let mut fields = form_fields(&consent, "/oauth/authorize");
    fields.push(("right".into(), "bookings:read".into()));
    fields.push(("decision".into(), "approve".into()));
    let r = admin.post("/oauth/authorize", &fields).await;
    assert_eq!(r.status(), 303, "consent to reading stays one step");
    assert_eq!(granted().await, 1);

    // A widening form refused for want of a passkey says where to add one; no page predicts
    // decisions any more (the service names its own when it asks).
    let r = admin
        .post("/settings/agent-access", &form(&csrf, &[("to", "on"), ("reason", "again")]))
        .await;
    assert_eq!(r.status(), 403);
    let body = r.text().await.expect("body");
    assert!(body.contains("no passkey yet") && body.contains("Passkeys"), "{body}");
    // A confirmation's post carries its form sealed to the session and the path: a made-up
    // seal is refused and changes nothing.
    let forged = form(&csrf, &[("confirm_form", "gs1.forged"), ("to", "on"), ("reason", "x")]);
    let r = admin.post("/settings/agent-access", &forged).await;
    assert_eq!(r.status(), 403);
    let body = r.text().await.expect("body");
    assert!(body.contains("not made for this form"), "{body}");
    assert_eq!(db.rows("tenants").eq("slug", slug).text("agent_access").await, "false");
    // A form larger than the console reads is refused whole, before any handler sees it; two
    // seals, the first forged, are refused as one.
    let huge = "x".repeat(600 * 1024);
    let r = admin
        .post("/settings/agent-access", &form(&csrf, &[("to", "on"), ("reason", &huge)]))
        .await;
    assert_eq!(r.status(), 413);
    let twice = form(
        &csrf,
        &[
            ("confirm_form", "gs1.forged"),
            ("confirm_form", "gs1.again"),
            ("to", "on"),
            ("reason", "x"),
        ],
    );
    assert_eq!(admin.post("/settings/agent-access", &twice).await.status(), 403);
    assert_eq!(db.rows("tenants").eq("slug", slug).text("agent_access").await, "false");
    let r =
        admin.post("/passkeys/decision", &form(&csrf, &[("for", "/settings/agent-access")])).await;
    assert!(matches!(r.status().as_u16(), 404 | 405), "no router of decisions by URL");

    // Every refused decision left the audit without a row of it, and the changes that went
    // through record how the session was proven.
    let proof = db.latest_proof_method_of("agent_access.off").await;
    assert_eq!(proof, "password");
    assert_eq!(db.audited("agent_access.on").await, 0);

    // The operator's CLI turns it off (the host is its proof) and resets a person's passkeys.
    let (ok, off) = cli(&["passkey-policy", "--tenant", slug, "off"]);
    assert!(ok && off["decisions_need_passkey"] == false, "{off}");
    let (ok, reset) = cli(&["passkey", "reset", "--email", &t0.admin.email]);
    assert!(ok && reset["passkeys_removed"] == 0 && reset["sessions_ended"] == true, "{reset}");
    let r = admin.get("/settings").await;
    assert_eq!(r.status(), 303, "the reset ended the person's sessions");
    let (ok, err) = cli(&["passkey", "reset", "--email", "nobody@nowhere.example"]);
    assert!(!ok && err["error"]["code"] == "not_found", "{err}");
}
