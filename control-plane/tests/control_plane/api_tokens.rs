//! API tokens: shown once, expiring, and revoked from the CLI and the console.

use crate::support::*;

/// The `<pre id="token">` secret a page shows once.
fn shown_token(html: &str) -> String {
    html.split("<pre id=\"token\">")
        .nth(1)
        .and_then(|t| t.split('<').next())
        .expect("a token")
        .to_owned()
}

#[tokio::test]
async fn api_tokens_expire_and_are_revoked_from_the_cli_and_the_console() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    // The demo seed made the first tenant's admin the platform's operator.
    let cli = |args: &[&str]| ctl_as(&api._db, Some(&t0.admin.email), args);
    let slug = t0.slug.as_str();
    let (ok, created) = cli(&[
        "api-token",
        "create",
        "--tenant",
        slug,
        "--person",
        &t0.dispatcher.email,
        "--name",
        "Nightly export",
        "--expires-in-days",
        "30",
    ]);
    assert!(ok, "{created}");
    let token = created["token"].as_str().expect("token").to_owned();
    let handle = created["api_token"].as_str().expect("handle").to_owned();
    assert!(token.starts_with("gh_api_") && handle.starts_with("apt_"), "{created}");
    let expires: jiff::Timestamp = created["expires_at"].as_str().expect("at").parse().expect("ts");
    let days = (expires.as_second() - jiff::Timestamp::now().as_second()) / 86_400;
    assert!((29..=30).contains(&days), "expires in 30 days: {expires}");
    assert_eq!(api.get("/api/v1/bookings?limit=1", Some(&token)).await.0, 200);
    // Lifetimes and names out of range are refused and create nothing.
    for (flag, value) in [
        ("--expires-in-days", "0"),
        ("--expires-in-days", "366"),
        ("--name", " "),
        ("--name", &"n".repeat(81)),
    ] {
        let mut args =
            vec!["api-token", "create", "--tenant", slug, "--person", &t0.dispatcher.email];
        if flag == "--name" {
            args.extend([flag, value]);
        } else {
            args.extend(["--name", "Refused", flag, value]);
        }
        let (ok, err) = cli(&args);
        assert!(!ok && err["error"]["code"] == "invalid_argument", "{flag} {value:?}: {err}");
    }
    let (ok, err) = cli(&[
        "api-token",
        "create",
        "--tenant",
        slug,
        "--person",
        &api.seed.tenants[1].admin.email,
        "--name",
        "Stranger",
    ]);
    assert!(!ok && err["error"]["code"] == "not_found", "a person of another tenant: {err}");
    assert_eq!(api._db.count("api_tokens").await, 3, "two demo tokens and one new");
    // The list shows status and expiry, never a secret.
    let (ok, list) = cli(&["api-token", "list", "--tenant", slug]);
    assert!(ok, "{list}");
    assert!(!list.to_string().contains("gh_api_"), "no secret in the list: {list}");
    let row = list["api_tokens"]
        .as_array()
        .expect("list")
        .iter()
        .find(|t| t["api_token"] == handle.as_str())
        .expect("listed")
        .clone();
    assert_eq!(
        (row["status"].as_str(), row["person"].as_str()),
        (Some("active"), Some(t0.dispatcher.email.as_str()))
    );
    // Another tenant's token, or no token at all, is not found, and the other token still works.
    let foreign = api._db.rows("api_tokens").tenant(&api.seed.tenants[1].slug).text("handle").await;
    for other in [foreign.as_str(), "apt_nonexistentnonexistent00", "con_x", "../../x"] {
        let (ok, err) =
            cli(&["api-token", "revoke", "--tenant", slug, "--token", other, "--reason", "x"]);
        assert!(!ok && err["error"]["code"] == "not_found", "{other}: {err}");
    }
    assert_eq!(
        api.get("/api/v1/bookings?limit=1", Some(&api.seed.tenants[1].api_token)).await.0,
        200
    );
    // Revoked: refused from the next request on, audited once with its reason.
    let (ok, revoked) =
        cli(&["api-token", "revoke", "--tenant", slug, "--token", &handle, "--reason", "rotated"]);
    assert!(ok && revoked["revoked"] == true, "{revoked}");
    assert_eq!(api.get("/api/v1/bookings?limit=1", Some(&token)).await.0, 401);
    let (ok, again) =
        cli(&["api-token", "revoke", "--tenant", slug, "--token", &handle, "--reason", "again"]);
    assert!(ok && again["revoked"] == false, "{again}");
    assert_eq!(api._db.audit_rows_naming(&handle, "api_token.revoke", "cli", "rotated").await, 1);
    // Past its expiry a token is refused, and the refusal says it expired.
    let (_, short) = cli(&[
        "api-token",
        "create",
        "--tenant",
        slug,
        "--person",
        &t0.admin.email,
        "--name",
        "Short",
        "--expires-in-days",
        "1",
    ]);
    let short_token = short["token"].as_str().expect("token").to_owned();
    assert_eq!(api.get("/api/v1/bookings?limit=1", Some(&short_token)).await.0, 200);
    api._db
        .rows("api_tokens")
        .eq("handle", short["api_token"].as_str().expect("h"))
        .set_now_plus("expires_at", "-1 second")
        .await;
    let (status, body) = api.get("/api/v1/bookings?limit=1", Some(&short_token)).await;
    assert_eq!(status, 401);
    assert!(body["error"]["message"].as_str().expect("m").contains("expired"), "{body}");

    // The console: an admin creates one (shown once, never cached), then revokes it.
    let browser = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let page = browser.get("/api-tokens").await;
    assert_eq!(page.status(), 200);
    let html = page.text().await.expect("html");
    assert!(
        html.contains(&handle) && html.contains("revoked") && html.contains("expired"),
        "the list shows each status"
    );
    assert!(!html.contains("gh_api_"), "no secret in the list");
    assert!(html.contains("href=\"/api-tokens/new\""), "New is a button at the top");
    let new = browser.get("/api-tokens/new").await.text().await.expect("html");
    let mut form = form_fields(&new, "/api-tokens");
    form.extend([
        ("name".into(), "Console token".into()),
        ("person".into(), t0.admin.email.clone()),
        ("expires_in_days".into(), "7".into()),
    ]);
    let created = browser.post("/api-tokens", &form).await;
    assert_eq!(created.status(), 303, "a create redirects: a reload never repeats it");
    let location = created.headers()["location"].to_str().expect("ascii").to_owned();
    let once = created
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok()?.split(';').next().map(str::to_owned))
        .find(|c| c.starts_with("gh_once="))
        .expect("the secret rides a cookie sealed to the session");
    assert!(!once.contains("gh_api_"), "sealed, not in the clear");
    let created = browser.follow(created).await;
    assert_eq!(created.status(), 200);
    assert_eq!(
        created.headers()["cache-control"],
        "no-store",
        "a page with a secret is never cached"
    );
    let console_token = shown_token(&created.text().await.expect("html"));
    // Reloading the page after the create (the secret's cookie cleared, as the page asked)
    // shows no secret and creates nothing.
    let reloaded = browser.get(&location).await.text().await.expect("html");
    assert!(!reloaded.contains("gh_api_") && reloaded.contains("was shown once"), "{reloaded}");
    assert_eq!(
        api._db.rows("api_tokens").eq("name", "Console token").count().await,
        1,
        "a reload creates no second token"
    );
    // Another session of the same person cannot open the sealed secret.
    let other = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let elsewhere = other
        .http
        .get(format!("{}{location}", api.url))
        .header("cookie", format!("{}; {once}", other.cookie))
        .send()
        .await
        .expect("get")
        .text()
        .await
        .expect("html");
    assert!(!elsewhere.contains("gh_api_"), "sealed to the session that created it");
    // The console ignores a person smuggled into the form: a token acts for whoever creates it.
    let mut smuggled = form.clone();
    smuggled.retain(|(k, _)| k != "name");
    smuggled.extend([
        ("name".into(), "Smuggled".into()),
        ("person".into(), t0.dispatcher.email.clone()),
    ]);
    assert_eq!(browser.post("/api-tokens", &smuggled).await.status(), 303);
    assert_eq!(api._db.api_token_holder_email("Smuggled").await, t0.admin.email);
    assert_eq!(api.get("/api/v1/bookings?limit=1", Some(&console_token)).await.0, 200);
    let mut bad = form.clone();
    bad.retain(|(k, _)| k != "expires_in_days");
    bad.push(("expires_in_days".into(), "forever".into()));
    let refused = browser.post("/api-tokens", &bad).await;
    assert_eq!(refused.status(), 422);
    let again = refused.text().await.expect("html");
    assert!(again.contains("value=\"Console token\""), "what was typed is kept");
    assert!(
        again.contains("aria-invalid=\"true\"") && again.contains("choose how many days"),
        "{again}"
    );
    let console_handle =
        api._db.rows("api_tokens").eq("name", "Console token").text("handle").await;
    // A confirmation page exists only for a token of this tenant.
    for other in [
        foreign.as_str(),
        "apt_nonexistentnonexistent00",
        "..%2F..%2Fconnections",
        "%22%3E%3Cscript%3E",
    ] {
        assert_eq!(
            browser.get(&format!("/api-tokens/{other}/revoke")).await.status(),
            404,
            "{other}"
        );
    }
    let action = format!("/api-tokens/{console_handle}/revoke");
    let confirm = browser.get(&action).await.text().await.expect("html");
    let mut fields = form_fields(&confirm, &action);
    let forged: Vec<(String, String)> = vec![("reason".into(), "no csrf".into())];
    assert_eq!(browser.post(&action, &forged).await.status(), 403);
    assert_eq!(
        api.get("/api/v1/bookings?limit=1", Some(&console_token)).await.0,
        200,
        "a forged form revokes nothing"
    );
    fields.push(("reason".into(), "laptop lost".into()));
    assert_eq!(browser.post(&action, &fields).await.status(), 303);
    assert_eq!(api.get("/api/v1/bookings?limit=1", Some(&console_token)).await.0, 401);
    let mut console_audited = 0;
    for action in ["api_token.create", "api_token.revoke"] {
        console_audited +=
            api._db.rows("audit_log").eq("action", action).eq("channel", "console").count().await;
    }
    assert_eq!(console_audited, 3, "two creations and one revocation");
    // Another tenant's admin cannot revoke it through their own console either.
    let t1 = &api.seed.tenants[1];
    let stranger = Browser::sign_in(&api, &t1.admin.email, &t1.admin.password).await;
    let mut theirs = form_fields(
        &stranger.get("/api-tokens/new").await.text().await.expect("html"),
        "/api-tokens",
    );
    theirs.retain(|(k, _)| k == "csrf");
    theirs.push(("reason".into(), "cross-tenant".into()));
    assert_eq!(stranger.post(&format!("/api-tokens/{handle}/revoke"), &theirs).await.status(), 404);
}
