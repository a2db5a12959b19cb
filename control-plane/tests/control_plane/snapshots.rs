//! What people and integrations read, held still: the REST API's error bodies and the stable
//! parts of console pages, as insta snapshots (`control-plane/tests/control_plane/snapshots/`).
//! A change to a text or a shape shows as a diff to review; `INSTA_UPDATE=always` writes the
//! new one. Handles differ per run and are written as their kind before comparing; what is
//! snapshotted holds no time.

use crate::support::*;

/// `text` with every handle (`cus_…`, `bkg_…`) written as its kind (`cus_*`).
fn stable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('_') {
        let start = rest[..at]
            .char_indices()
            .rev()
            .find(|(_, c)| !c.is_ascii_lowercase())
            .map_or(0, |(i, c)| i + c.len_utf8());
        let prefix = &rest[start..at];
        let tail: String =
            rest[at + 1..].chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
        if prefix.len() == 3 && tail.len() >= 12 {
            out.push_str(&rest[..at]);
            out.push_str("_*");
            rest = &rest[at + 1 + tail.len()..];
        } else {
            out.push_str(&rest[..=at]);
            rest = &rest[at + 1..];
        }
    }
    out.push_str(rest);
    out
}

#[test]
fn handles_are_written_as_their_kind() {
    assert_eq!(
        stable("No cus_0123456789abcdef here; see bkg_aaaaaaaaaaaaaaaa. snake_case stays."),
        "No cus_* here; see bkg_*. snake_case stays."
    );
    assert_eq!(stable("… é_x ün_0123456789abcdef"), "… é_x ün_0123456789abcdef");
    assert_eq!(stable("—cus_0123456789abcdef"), "—cus_*");
}

#[tokio::test]
async fn the_rest_apis_error_bodies_are_snapshotted() {
    let api = Api::start().await;
    let token = api.seed.tenants[0].api_token.clone();
    let mcp = api.seed.tenants[0].connections[0].token.clone();
    let other = api.get("/api/v1/bookings?limit=1", Some(&api.seed.tenants[1].api_token)).await.1;
    let foreign = other["bookings"][0]["booking"].as_str().expect("handle").to_owned();
    let ours = api.get("/api/v1/customers?limit=1", Some(&token)).await.1;
    let customer = ours["customers"][0]["customer"].as_str().expect("handle").to_owned();
    let url = |p: &str| format!("{}/api/v1{p}", api.url);
    let cases = [
        ("no credential", api.http.get(url("/customers"))),
        ("an MCP token", api.http.get(url("/customers")).bearer_auth(&mcp)),
        ("no such route", api.http.get(url("/nowhere")).bearer_auth(&token)),
        ("a wrong method", api.http.delete(url("/customers")).bearer_auth(&token)),
        (
            "not JSON",
            api.http
                .post(url("/customers"))
                .bearer_auth(&token)
                .header("content-type", "application/json")
                .body("{not json"),
        ),
        (
            "an unknown field",
            api.http
                .post(url("/customers"))
                .bearer_auth(&token)
                .json(&json!({"name": "X", "tenant_id": 1})),
        ),
        (
            "a field in error",
            api.http.post(url("/customers")).bearer_auth(&token).json(&json!({"name": ""})),
        ),
        (
            "another tenant's booking",
            api.http.get(url(&format!("/bookings/{foreign}"))).bearer_auth(&token),
        ),
        (
            "a zone that is none",
            api.http
                .put(url(&format!("/customers/{customer}/place")))
                .bearer_auth(&token)
                .json(&json!({"zone": "Mars/Olympus_Mons"})),
        ),
    ];
    let mut texts = String::new();
    for (case, request) in cases {
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let pretty = serde_json::to_string_pretty(&body).expect("json");
        texts.push_str(&format!("## {case}: {status}\n{}\n\n", stable(&pretty)));
    }
    insta::assert_snapshot!("rest_error_bodies", texts);
}

#[tokio::test]
async fn what_a_policy_can_read_is_snapshotted_as_the_console_shows_it() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let browser = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let page = browser.get("/settings/policies").await.text().await.expect("page");
    let start = page.find("<details class=\"card\" id=\"policy-reference\">").expect("reference");
    let end = start + page[start..].find("</details>").expect("its end") + "</details>".len();
    let reference = page[start..end].replace("<tr>", "\n<tr>").replace("<p ", "\n<p ");
    insta::assert_snapshot!("console_policy_reference", stable(&reference));
}

#[tokio::test]
async fn what_a_console_refusal_says_is_snapshotted() {
    let api = Api::start().await;
    let t0 = &api.seed.tenants[0];
    let db = &api._db;
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let html = admin.get("/settings").await.text().await.expect("html");
    let csrf = form_fields(&html, "/settings/agent-access")
        .into_iter()
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v)
        .expect("csrf");
    let form = |fields: &[(&str, &str)]| {
        let mut f = vec![("csrf".to_owned(), csrf.clone())];
        f.extend(fields.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        f
    };
    // Under the tenant's passkey policy, by an admin who holds no passkey yet: each widening
    // decision in its service's own words, and a form that is wrong in its own words.
    db.rows("tenants").eq("slug", &t0.slug).set("decisions_need_passkey", true).await;
    let dispatcher = t0.dispatcher.email.as_str();
    let cases = [
        (
            "a connection",
            "/connections",
            form(&[("name", "Dispatch bot"), ("right", "bookings:read")]),
        ),
        ("a role raised", "/people/role", form(&[("email", dispatcher), ("role", "admin")])),
        (
            "a rate limit raised",
            "/settings/rate-limit",
            form(&[("class", "notify"), ("per_minute", "60")]),
        ),
        (
            "an invitation",
            "/people/invite",
            form(&[("email", "new@example.com"), ("name", "New"), ("role", "dispatcher")]),
        ),
        ("a switch with no direction", "/settings/agent-access", form(&[("to", "sideways")])),
    ];
    let mut texts = String::new();
    for (case, path, fields) in cases {
        let r = admin.post(path, &fields).await;
        let status = r.status().as_u16();
        let page = r.text().await.expect("page");
        let said: Vec<&str> = page
            .split("<p class=\"error\" role=\"alert\">")
            .skip(1)
            .filter_map(|rest| rest.split("</p>").next())
            .collect();
        texts.push_str(&format!("## {case}: {status}\n{}\n\n", stable(&said.join("\n"))));
    }
    insta::assert_snapshot!("console_refusals", texts);
}
