//! The REST API over the shared services (R2): it serves its tenant, rejects what the tools
//! reject with a JSON error saying what to change, replays a retry with its key once, and
//! conflicts on a stale version.

use crate::support::*;

#[tokio::test]
async fn the_api_serves_its_tenant_through_the_shared_services() {
    let api = Api::start().await;
    let token = api.seed.tenants[0].api_token.clone();
    let (status, body) = api.get("/api/v1/bookings?limit=3", Some(&token)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["count"], 3);
    let booking = body["bookings"][0]["booking"].as_str().expect("handle").to_owned();
    let (status, one) = api.get(&format!("/api/v1/bookings/{booking}"), Some(&token)).await;
    assert_eq!(status, 200);
    assert!(one["notes"].is_array());
    let (status, customers) = api.get("/api/v1/customers?query=fischer", Some(&token)).await;
    assert_eq!(status, 200);
    assert_eq!(customers["count"], 1);
}

#[tokio::test]
async fn the_api_rejects_what_the_tools_reject() {
    let api = Api::start().await;
    let token = api.seed.tenants[0].api_token.clone();
    // Same parser as the tools (R2, R12): unknown fields named, with the allowed list.
    let (status, body) = api.get("/api/v1/bookings?tenant_id=harbor-plumbing", Some(&token)).await;
    assert_eq!(status, 422);
    assert_eq!(body["error"]["unknown"], json!(["tenant_id"]));
    assert!(body["error"]["allowed"].as_array().expect("allowed").contains(&json!("from")));
    let (status, body) =
        api.get("/api/v1/bookings?from=2026-03-29T02:30&zone=Europe/Berlin", Some(&token)).await;
    assert_eq!(status, 422);
    assert_eq!(body["error"]["options"].as_array().expect("options").len(), 2);
    let (status, _) = api.get("/api/v1/bookings?limit=0", Some(&token)).await;
    assert_eq!(status, 422);
}

#[tokio::test]
async fn another_tenants_handle_is_not_found() {
    let api = Api::start().await;
    let other = api.get("/api/v1/bookings?limit=1", Some(&api.seed.tenants[1].api_token)).await.1;
    let foreign = other["bookings"][0]["booking"].as_str().expect("handle").to_owned();
    let (status, body) =
        api.get(&format!("/api/v1/bookings/{foreign}"), Some(&api.seed.tenants[0].api_token)).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
}

#[tokio::test]
async fn mcp_tokens_and_strangers_get_401_naming_the_credential_wanted() {
    let api = Api::start().await;
    let mcp = api.seed.tenants[0].connections[0].token.clone();
    for path in ["/api/v1/bookings", "/api/v1/customers"] {
        let (status, body) = api.get(path, Some(&mcp)).await;
        assert_eq!(status, 401, "{path}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains("API token") && message.contains("MCP token"), "{message}");
        let (status, _) = api.get(path, None).await;
        assert_eq!(status, 401);
        let (status, _) = api.get(path, Some("gh_api_unknownunknownunknownunknown00")).await;
        assert_eq!(status, 401);
    }
    let (status, _) = api.get("/readyz", None).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn every_rest_refusal_is_a_json_error_saying_what_to_change() {
    let api = Api::start().await;
    let token = api.seed.tenants[0].api_token.clone();
    let url = |p: &str| format!("{}/api/v1{p}", api.url);
    let cases = [
        (
            "not JSON",
            api.http
                .post(url("/customers"))
                .header("content-type", "application/json")
                .body("{not json"),
            400,
        ),
        (
            "not sent as JSON",
            api.http.post(url("/customers")).header("content-type", "text/plain").body("{}"),
            415,
        ),
        ("a wrong method", api.http.delete(url("/customers")), 405),
        ("no such route", api.http.get(url("/technicians")), 404),
    ];
    for (case, request, status) in cases {
        let response = request.bearer_auth(&token).send().await.expect("request");
        assert_eq!(response.status().as_u16(), status, "{case}");
        if status == 405 {
            assert!(response.headers().contains_key("allow"), "{case}: the Allow header stays");
        }
        let body: Value = response.json().await.unwrap_or_else(|e| panic!("{case}: not JSON: {e}"));
        assert!(body["error"]["code"].is_string(), "{case}: {body}");
        assert!(body["error"]["fix"].as_str().is_some_and(|f| !f.is_empty()), "{case}: {body}");
    }
    // The services' refusals say what to change too.
    let create = |body: Value| {
        let (http, url, token) = (api.http.clone(), url("/customers"), token.clone());
        async move {
            let r = http.post(url).bearer_auth(token).json(&body).send().await.expect("post");
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, _) = create(json!({"name": "Fix Test", "email": "fix.test@example.net"})).await;
    assert_eq!(status, 201);
    for (case, body, status, says) in [
        (
            "a duplicate",
            json!({"name": "Fix Tester", "email": "fix.test@example.net"}),
            409,
            "separate",
        ),
        ("an unknown field", json!({"name": "Fix Test", "tenant_id": 1}), 422, "allowed"),
        ("a field in error", json!({"name": ""}), 422, "name"),
    ] {
        let (got, body) = create(body).await;
        assert_eq!(got, status, "{case}: {body}");
        assert!(body["error"]["fix"].as_str().is_some_and(|f| f.contains(says)), "{case}: {body}");
    }
    let anonymous = api.http.get(url("/customers")).send().await.expect("get");
    assert_eq!(anonymous.status().as_u16(), 401);
    let body: Value = anonymous.json().await.expect("json");
    assert!(body["error"]["fix"].as_str().is_some_and(|f| f.contains("Bearer")), "{body}");
}

#[tokio::test]
async fn a_rest_retry_with_its_key_executes_once() {
    let api = Api::start().await;
    let token = api.seed.tenants[0].api_token.clone();
    let found = api.get("/api/v1/bookings?limit=1", Some(&token)).await.1;
    let booking = found["bookings"][0]["booking"].as_str().expect("booking").to_owned();
    let post = |body: Value| {
        let (http, url, token) = (
            api.http.clone(),
            format!("{}/api/v1/bookings/{booking}/notes", api.url),
            token.clone(),
        );
        async move {
            let response =
                http.post(url).bearer_auth(token).json(&body).send().await.expect("post");
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let count = |text: &'static str| {
        let db = &api._db;
        async move { db.rows("booking_notes").eq("body", text).count().await }
    };
    let (status, first) =
        post(json!({"text": "Gate code 4711", "idempotency_key": "rest-1"})).await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["replayed"], false, "{first}");
    // The integration's retry, and the same call without the key: answered, not executed.
    for again in [
        json!({"text": "Gate code 4711", "idempotency_key": "rest-1"}),
        json!({"text": "Gate code 4711"}),
    ] {
        let (status, body) = post(again.clone()).await;
        assert!(status == 200 || status == 201, "{again}: {status} {body}");
        assert_eq!(body["replayed"], true, "{again}: {body}");
    }
    assert_eq!(count("Gate code 4711").await, 1);
    // Another call under the same key is refused, not executed.
    let (status, body) = post(json!({"text": "Another note", "idempotency_key": "rest-1"})).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "idempotency_key", "{body}");
    assert_eq!(count("Another note").await, 0);
    // The path names the record: a body naming another one is refused, not overridden.
    let (status, body) =
        post(json!({"booking": "bkg_aaaaaaaaaaaaaaaa", "text": "Elsewhere"})).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "booking", "{body}");
    assert_eq!(count("Elsewhere").await, 0);
}

#[tokio::test]
async fn a_stale_version_through_the_api_conflicts() {
    let api = Api::start().await;
    let token = api.seed.tenants[0].api_token.clone();
    let http = &api.http;
    let found = api.get("/api/v1/customers?query=Richter", Some(&token)).await.1;
    let customer = found["customers"][0].clone();
    let url = format!("{}/api/v1/customers/{}", api.url, customer["customer"].as_str().expect("h"));
    let first = http
        .patch(&url)
        .bearer_auth(&token)
        .json(&json!({"version": customer["version"], "phone": "+49 30 5550777"}))
        .send()
        .await
        .expect("patch");
    assert_eq!(first.status(), 200);
    let stale = http
        .patch(&url)
        .bearer_auth(&token)
        .json(&json!({"version": customer["version"], "name": "E. Richter"}))
        .send()
        .await
        .expect("patch");
    assert_eq!(stale.status(), 409);
    let body: Value = stale.json().await.expect("json");
    assert_eq!(body["error"]["code"], "conflict");
    assert_eq!(body["error"]["current"]["phone"], "+49 30 5550777");
    let now = api
        .get(
            &format!("/api/v1/customers/{}", customer["customer"].as_str().expect("h")),
            Some(&token),
        )
        .await
        .1;
    assert_eq!(now["name"], "Emma Richter", "unchanged by the stale update");
    // API writes are audited with channel api and carry no connection.
    let audited = api
        ._db
        .rows("audit_log")
        .eq("channel", "api")
        .eq("action", "update_customer")
        .null("connection_id")
        .count()
        .await;
    assert_eq!(audited, 1);
}

#[tokio::test]
async fn the_tenants_systems_place_customers_and_technicians_for_its_policies() {
    let api = Api::start().await;
    let token = api.seed.tenants[0].api_token.clone();
    let put = |path: String, body: Value, token: String| {
        let (http, url) = (api.http.clone(), format!("{}/api/v1{path}", api.url));
        async move {
            let r = http.put(url).bearer_auth(token).json(&body).send().await.expect("put");
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let bookings = api.get("/api/v1/bookings?limit=20", Some(&token)).await.1;
    let with_technician = bookings["bookings"]
        .as_array()
        .expect("bookings")
        .iter()
        .find(|b| b["technician"]["technician"].is_string())
        .expect("an assigned booking");
    let technician = with_technician["technician"]["technician"].as_str().expect("h").to_owned();
    let customer = with_technician["customer"]["customer"].as_str().expect("h").to_owned();
    // Kept lowercase, a zone by its canonical name; the answer shows what is kept.
    let (status, body) =
        put(format!("/technicians/{technician}/region"), json!({"region": "East "}), token.clone())
            .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["technician"]["region"], "east");
    // Set back and forth, each time kept: a place is set, never answered from a replay.
    for region in ["west", "east", "west"] {
        let (status, body) = put(
            format!("/technicians/{technician}/region"),
            json!({"region": region}),
            token.clone(),
        )
        .await;
        assert_eq!((status, body["technician"]["region"].as_str()), (200, Some(region)), "{body}");
    }
    let (status, body) = put(
        format!("/customers/{customer}/place"),
        json!({"region": "East", "zone": "europe/lisbon"}),
        token.clone(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (&body["customer"]["region"], &body["customer"]["zone"]),
        (&json!("east"), &json!("Europe/Lisbon"))
    );
    // Bad input is refused, says what to change, and changes nothing.
    for (path, input, says) in [
        (format!("/customers/{customer}/place"), json!({"zone": "Mars/Olympus_Mons"}), "IANA"),
        (format!("/customers/{customer}/place"), json!({"region": "x".repeat(65)}), "region"),
        (format!("/customers/{customer}/place"), json!({"tenant_id": 1}), "allowed"),
        (format!("/technicians/{technician}/region"), json!({"region": "a\u{7}b"}), "region"),
    ] {
        let (status, body) = put(path.clone(), input, token.clone()).await;
        assert_eq!(status, 422, "{path}: {body}");
        assert!(
            body["error"]["fix"].as_str().is_some_and(|f| f.contains(says))
                || body["error"]["message"].as_str().is_some_and(|m| m.contains(says)),
            "{path}: {body}"
        );
    }
    let (_, kept) = api.get(&format!("/api/v1/customers/{customer}"), Some(&token)).await;
    assert_eq!((&kept["region"], &kept["zone"]), (&json!("east"), &json!("Europe/Lisbon")));
    // Another tenant's records are not found from here (R3).
    let other = api.seed.tenants[1].api_token.clone();
    let (status, _) =
        put(format!("/technicians/{technician}/region"), json!({"region": "west"}), other).await;
    assert_eq!(status, 404);
}
