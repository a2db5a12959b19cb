//! OAuth as an attacker tries it: consent grants exactly what the person approved, codes never
//! outlive their consent or connection, registration is parsed, capped and throttled, and
//! private_key_jwt clients need a fresh signed assertion.

use crate::support::*;
use shared::rights::Role;
use shared::testing::{Person, operator_in};

#[tokio::test]
async fn consent_grants_exactly_what_the_person_approved() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let client_id = register_client(&api).await;
    // A client that smuggles rights and form fields into its authorize URL.
    let smuggled = authorize_path(
        &client_id,
        &[
            ("right", "bookings:delete"),
            ("right", "customers:delete"),
            ("decision", "approve"),
            ("request", "areq_forged"),
        ],
    );
    let consent = browser.get(&smuggled).await;
    assert_eq!(consent.status(), 200);
    let html = consent.text().await.expect("html");
    assert!(html.contains(&admin.email), "the consent screen names who is signed in");
    assert!(html.contains("Sign out"), "with a way to switch account");
    assert!(
        html.contains("This application registered itself"),
        "a self-registered client's name is not vouched for"
    );
    let fields = form_fields(&html, "/oauth/authorize");
    let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        ["csrf", "request"],
        "the form carries the request's id and nothing of the request"
    );
    assert!(!html.contains("areq_forged"), "no request parameter is echoed");
    // Approve with only what the person ticked, plus whatever the attacker adds to the post.
    let mut form = fields.clone();
    form.push(("right".into(), "bookings:read".into()));
    form.push(("decision".into(), "approve".into()));
    let approved = browser.post("/oauth/authorize", &form).await;
    assert_eq!(approved.status(), 303, "{:?}", approved.text().await);
    let location =
        url::Url::parse(approved.headers()["location"].to_str().expect("ascii")).expect("url");
    let params: std::collections::BTreeMap<String, String> =
        location.query_pairs().into_owned().collect();
    assert!(params.contains_key("code") && params["state"] == "s1", "{location}");
    let rights = api._db.oauth_connection_rights(&client_id).await;
    assert_eq!(rights, "bookings:read", "exactly what was ticked, nothing the URL smuggled");
    // The same request cannot be answered twice, nor by another session, nor without a decision.
    let again = browser.post("/oauth/authorize", &form).await;
    assert_eq!(again.status(), 400, "a consent request works once");
    let consent = browser.get(&authorize_path(&client_id, &[])).await.text().await.expect("html");
    let fields = form_fields(&consent, "/oauth/authorize");
    let dispatcher = &api.seed.tenants[0].dispatcher;
    let other = Browser::sign_in(&api, &dispatcher.email, &dispatcher.password).await;
    let other_html = other.get(&authorize_path(&client_id, &[])).await.text().await.expect("html");
    let mut stolen = form_fields(&other_html, "/oauth/authorize");
    stolen.retain(|(k, _)| k == "csrf");
    stolen.extend(fields.iter().filter(|(k, _)| k == "request").cloned());
    stolen.push(("right".into(), "bookings:read".into()));
    stolen.push(("decision".into(), "approve".into()));
    let response = other.post("/oauth/authorize", &stolen).await;
    assert_eq!(response.status(), 400, "another session's consent request is not found");
    let mut undecided = fields.clone();
    undecided.push(("right".into(), "bookings:read".into()));
    let response = browser.post("/oauth/authorize", &undecided).await;
    assert_eq!(response.status(), 422, "a missing decision grants nothing");
    let connections = api._db.rows("connections").eq("oauth_client_id", &client_id).count().await;
    assert_eq!(connections, 1);
    // A consent screen shown for one tenant cannot be answered after switching to another.
    let consent = browser.get(&authorize_path(&client_id, &[])).await.text().await.expect("html");
    let mut pending = form_fields(&consent, "/oauth/authorize");
    let other_tenant = api._db.tenant_id(&api.seed.tenants[1].slug).await;
    let in_other = operator_in(&api._db.ds, &admin.email, &api.seed.tenants[1].slug).await;
    Person::new(&api._db.ds, &in_other, &admin.email).role(Role::Viewer).create().await;
    api._db.rows("console_sessions").set("tenant_id", other_tenant).await;
    pending.push(("right".into(), "bookings:read".into()));
    pending.push(("decision".into(), "approve".into()));
    let response = browser.post("/oauth/authorize", &pending).await;
    assert_eq!(response.status(), 400, "the tenant switched since the consent screen");
}

#[tokio::test]
async fn a_client_that_names_no_scope_gets_read_rights_ticked_and_a_new_consent_ends_old_tokens() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let client_id = register_client(&api).await;
    let path = authorize_path(&client_id, &[]).replace("&scope=bookings%3Aread", "");
    let html = browser.get(&path).await.text().await.expect("html");
    let ticked: Vec<&str> = html
        .split("name=\"right\" value=\"")
        .skip(1)
        .filter(|c| c.split('>').next().unwrap_or_default().contains("checked"))
        .map(|c| c.split('"').next().unwrap_or_default())
        .collect();
    assert!(
        !ticked.is_empty() && ticked.iter().all(|r| r.ends_with(":read")),
        "only read rights are ticked: {ticked:?}"
    );
    // Two consents in a row: the first grant's tokens end when the second is approved.
    let mut tokens = Vec::new();
    for right in ["bookings:read", "bookings:write"] {
        let html = browser.get(&authorize_path(&client_id, &[])).await.text().await.expect("html");
        let mut form = form_fields(&html, "/oauth/authorize");
        form.push(("right".into(), right.into()));
        form.push(("decision".into(), "approve".into()));
        let approved = browser.post("/oauth/authorize", &form).await;
        let location =
            url::Url::parse(approved.headers()["location"].to_str().expect("ascii")).expect("url");
        let code = location.query_pairs().find(|(k, _)| k == "code").expect("code").1.into_owned();
        let issued: Value = api
            .http
            .post(format!("{}/oauth/token", api.url))
            .form(&[
                ("grant_type", "authorization_code"),
                ("code", code.as_str()),
                ("client_id", client_id.as_str()),
                ("redirect_uri", "http://127.0.0.1:47615/callback"),
                ("code_verifier", "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            ])
            .send()
            .await
            .expect("token")
            .json()
            .await
            .expect("json");
        tokens.push(issued["access_token"].as_str().expect("access").to_owned());
    }
    assert_eq!(
        api._db.connection_tokens_hashing_to(&tokens[0]).await,
        0,
        "the earlier grant's token ended"
    );
    assert_eq!(api._db.connection_tokens_hashing_to(&tokens[1]).await, 1);
}

#[tokio::test]
async fn a_code_never_outlives_the_consent_or_the_connection_it_came_from() {
    let api = Api::start().await;
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let client_id = register_client(&api).await;
    let consent = |right: &'static str| {
        let browser = &browser;
        let client_id = client_id.clone();
        async move {
            let html =
                browser.get(&authorize_path(&client_id, &[])).await.text().await.expect("html");
            let mut form = form_fields(&html, "/oauth/authorize");
            form.push(("right".into(), right.into()));
            form.push(("decision".into(), "approve".into()));
            let approved = browser.post("/oauth/authorize", &form).await;
            let location = url::Url::parse(approved.headers()["location"].to_str().expect("ascii"))
                .expect("url");
            location.query_pairs().find(|(k, _)| k == "code").expect("code").1.into_owned()
        }
    };
    let exchange = |code: String| {
        let (http, url, client_id) =
            (api.http.clone(), format!("{}/oauth/token", api.url), client_id.clone());
        async move {
            let response = http
                .post(url)
                .form(&[
                    ("grant_type", "authorization_code"),
                    ("code", code.as_str()),
                    ("client_id", client_id.as_str()),
                    ("redirect_uri", "http://127.0.0.1:47615/callback"),
                    ("code_verifier", "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
                ])
                .send()
                .await
                .expect("token");
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // A wider consent's code, not yet exchanged, ends when the person consents again narrower.
    let wide = consent("bookings:write").await;
    let narrow = consent("bookings:read").await;
    let (status, body) = exchange(wide).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_grant")), "{body}");
    let (status, body) = exchange(narrow).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["scope"], "bookings:read");
    // A code approved before the connection was revoked issues nothing.
    let late = consent("bookings:read").await;
    let connection =
        api._db.rows("connections").eq("oauth_client_id", &client_id).text("handle").await;
    let slug = api.seed.tenants[0].slug.clone();
    let (ok, revoked) = ctl_as(
        &api._db,
        Some(&admin.email),
        &[
            "connection",
            "revoke",
            "--tenant",
            &slug,
            "--connection",
            &connection,
            "--reason",
            "lost laptop",
        ],
    );
    assert!(ok, "{revoked}");
    let (status, body) = exchange(late).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_grant")), "{body}");
    assert!(body["error_description"].as_str().is_some_and(|d| d.contains("revoked")), "{body}");
    let connection_id = api._db.rows("connections").eq("handle", &connection).int("id").await;
    let live = api._db.rows("connection_tokens").eq("connection_id", connection_id).count().await;
    assert_eq!(live, 0, "no token exists for the revoked connection");
}

#[tokio::test]
async fn registration_parses_redirect_uris_and_caps_what_it_stores() {
    let api = Api::start().await;
    let register = |body: Value| {
        let http = api.http.clone();
        let url = format!("{}/oauth/register", api.url);
        async move { http.post(url).json(&body).send().await.expect("register") }
    };
    let long = format!("https://app.example.com/{}", "a".repeat(3000));
    let many: Vec<String> = (0..11).map(|i| format!("https://app.example.com/cb{i}")).collect();
    for (case, uris) in [
        ("not a URL", json!(["::::"])),
        ("userinfo", json!(["https://user:pw@app.example.com/cb"])),
        ("fragment", json!(["https://app.example.com/cb#x"])),
        ("plain http elsewhere", json!(["http://app.example.com/cb"])),
        ("loopback look-alike", json!(["http://127.0.0.1.evil.example/cb"])),
        ("too long", json!([long])),
        ("too many", json!(many)),
        ("none", json!([])),
    ] {
        let response = register(json!({"client_name": "x", "redirect_uris": uris})).await;
        assert_eq!(response.status(), 400, "{case}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["error"], "invalid_redirect_uri", "{case}: {body}");
    }
    assert_eq!(api._db.count("oauth_clients").await, 0, "nothing stored");
    let ok = register(json!({"client_name": format!("  Claude\u{202E}\u{0007} {}", "n".repeat(200)), "redirect_uris": ["http://[::1]/cb", "http://127.0.0.1/cb"]})).await;
    assert_eq!(ok.status(), 201);
    let body: Value = ok.json().await.expect("json");
    let name = body["client_name"].as_str().expect("name");
    assert!(
        name.starts_with("Claude ")
            && name.chars().count() <= 80
            && !name.chars().any(char::is_control),
        "{name:?}"
    );
    // A loopback client may come back on any port, never on another path.
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let client_id = body["client_id"].as_str().expect("id");
    let path = |redirect: &str| {
        let q = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs([
                ("response_type", "code"),
                ("client_id", client_id),
                ("redirect_uri", redirect),
                ("code_challenge", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"),
                ("code_challenge_method", "S256"),
                ("resource", "http://127.0.0.1:9/mcp"),
            ])
            .finish();
        format!("/oauth/authorize?{q}")
    };
    assert_eq!(browser.get(&path("http://127.0.0.1:53117/cb")).await.status(), 200);
    assert_eq!(browser.get(&path("http://127.0.0.1:53117/other")).await.status(), 400);
}

#[tokio::test]
async fn registration_is_throttled_per_source_address() {
    let api = Api::start().await;
    let register = |source: String| {
        let (http, url) = (api.http.clone(), format!("{}/oauth/register", api.url));
        async move {
            let response = http
                .post(url)
                .header("x-forwarded-for", source)
                .json(&json!({"client_name": "Flood", "redirect_uris": ["http://127.0.0.1:40000/cb"]}))
                .send()
                .await
                .expect("register");
            let retry = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()?.parse::<i64>().ok());
            (
                response.status().as_u16(),
                retry,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    // Thirty at once from one address: exactly the limit gets through (counted atomically).
    let results =
        futures_util::future::join_all((0..30).map(|_| register("198.51.100.7".into()))).await;
    let created = results.iter().filter(|r| r.0 == 201).count();
    let limited: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    assert_eq!((created, limited.len()), (20, 10), "{results:?}");
    let (_, retry, body) = limited[0];
    assert!(retry.is_some_and(|s| (1..=3600).contains(&s)), "Retry-After: {retry:?}");
    assert_eq!(body["error"], "too_many_requests");
    assert!(body["error_description"].as_str().expect("d").contains("retry in"), "{body}");
    assert_eq!(api._db.rows("oauth_clients").eq("client_name", "Flood").count().await, 20);
    // Another address is unaffected; IPv6 addresses count by their /64.
    assert_eq!(register("198.51.100.8".into()).await.0, 201);
    for i in 0..20 {
        assert_eq!(register(format!("2001:db8:1:2::{i:x}")).await.0, 201);
    }
    assert_eq!(register("2001:db8:1:2:ffff::1".into()).await.0, 429, "the same /64");
    assert_eq!(register("2001:db8:1:3::1".into()).await.0, 201, "another /64");
    // Every IPv6 form of an exhausted IPv4 address counts as that address: mapped, 6to4 (any
    // of its 65,536 subnets) and Teredo (the client's address inverted in the last 32 bits).
    for form in [
        "::ffff:198.51.100.7",
        "2002:c633:6407::1",
        "2002:c633:6407:ffff::2",
        "2001:0:4136:e378:8000:63bf:39cc:9bf8",
    ] {
        assert_eq!(register(form.into()).await.0, 429, "{form}");
    }
    assert_eq!(register("2002:c633:6408::1".into()).await.0, 201, "6to4 of another address");
    // A /48 holds 65,536 /64s: it has a ceiling of its own.
    let mut site = Vec::new();
    for i in 0..110 {
        site.push(register(format!("2001:db8:9:{i:x}::1")).await.0);
    }
    assert_eq!(site.iter().filter(|s| **s == 201).count(), 100, "{site:?}");
    // A body that is not client metadata is an OAuth error, not a bare 422.
    let response = api
        .http
        .post(format!("{}/oauth/register", api.url))
        .header("x-forwarded-for", "198.51.100.9")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("register");
    assert_eq!(response.status(), 400);
    assert_eq!(response.json::<Value>().await.expect("json")["error"], "invalid_client_metadata");
}

mod signing {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    use serde_json::{Value, json};

    /// A client's P-256 signing key and its public JWK.
    pub struct Key {
        pair: EcdsaKeyPair,
        pub jwk: Value,
    }

    impl Key {
        pub fn new(kid: &str) -> Key {
            let rng = SystemRandom::new();
            let pkcs8 =
                EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
            let pair =
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
                    .expect("pair");
            let point = pair.public_key().as_ref().to_vec();
            let jwk = json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
                "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65])});
            Key { pair, jwk }
        }

        /// A client assertion for `client` to `aud`, with these claims changed.
        pub fn assertion(&self, client: &str, aud: &str, change: Value) -> String {
            let now = jiff::Timestamp::now().as_second();
            let mut claims = json!({"iss": client, "sub": client, "aud": aud, "iat": now, "exp": now + 120,
                "jti": format!("jti-{}", ring::rand::generate::<[u8; 8]>(&SystemRandom::new()).expect("rng").expose().iter().map(|b| format!("{b:02x}")).collect::<String>())});
            for (k, v) in change.as_object().expect("object") {
                claims[k] = v.clone();
            }
            let header = json!({"alg": "ES256", "kid": self.jwk["kid"], "typ": "JWT"});
            let h = URL_SAFE_NO_PAD.encode(header.to_string());
            let p = URL_SAFE_NO_PAD.encode(claims.to_string());
            let sig =
                self.pair.sign(&SystemRandom::new(), format!("{h}.{p}").as_bytes()).expect("sign");
            format!("{h}.{p}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
        }
    }
}

#[tokio::test]
async fn a_private_key_jwt_client_authenticates_with_a_fresh_signed_assertion() {
    let api =
        Api::start_with(shared::services::oauth::FetchPolicy { dev: true, ..Default::default() })
            .await;
    let meta: Value = api
        .http
        .get(format!("{}/.well-known/oauth-authorization-server", api.url))
        .send()
        .await
        .expect("meta")
        .json()
        .await
        .expect("json");
    assert!(
        meta["token_endpoint_auth_methods_supported"]
            .as_array()
            .expect("m")
            .contains(&json!("private_key_jwt")),
        "{meta}"
    );
    assert!(
        meta["token_endpoint_auth_methods_supported"]
            .as_array()
            .expect("m")
            .contains(&json!("none")),
        "Claude checks for none"
    );
    assert_eq!(meta["client_id_metadata_document_supported"], true);
    // The client publishes its metadata document and key set, as ChatGPT does.
    let key = signing::Key::new("k1");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let docs = format!("http://{}", listener.local_addr().expect("addr"));
    let client_id = format!("{docs}/oauth/client.json");
    let document = json!({"client_id": client_id, "client_name": "Signed client", "redirect_uris": ["http://127.0.0.1:47615/callback"],
        "token_endpoint_auth_method": "private_key_jwt", "jwks_uri": format!("{docs}/oauth/jwks.json")});
    let jwks = json!({"keys": [key.jwk.clone()]});
    let routes = axum::Router::new()
        .route(
            "/oauth/client.json",
            axum::routing::get(move || async move { axum::Json(document) }),
        )
        .route("/oauth/jwks.json", axum::routing::get(move || async move { axum::Json(jwks) }));
    tokio::spawn(async move { axum::serve(listener, routes).await.expect("serve") });
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let html = browser.get(&authorize_path(&client_id, &[])).await.text().await.expect("consent");
    assert!(html.contains("Signed client"), "the document was fetched");
    assert!(html.contains("a page on its own domain"), "named by its own domain");
    assert!(!html.contains("registered itself"));
    let mut form = form_fields(&html, "/oauth/authorize");
    form.extend([("right".into(), "bookings:read".into()), ("decision".into(), "approve".into())]);
    let approved = browser.post("/oauth/authorize", &form).await;
    let location =
        url::Url::parse(approved.headers()["location"].to_str().expect("ascii")).expect("url");
    let code = location.query_pairs().find(|(k, _)| k == "code").expect("code").1.into_owned();
    let token_url = format!("{}/oauth/token", api.url);
    let post = |fields: Vec<(&'static str, String)>| {
        let (http, url) = (api.http.clone(), token_url.clone());
        async move {
            let response = http.post(url).form(&fields).send().await.expect("token");
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let exchange = |assertion: Option<String>, kind: &str| {
        let mut fields = vec![
            ("grant_type", "authorization_code".to_owned()),
            ("code", code.clone()),
            ("client_id", client_id.clone()),
            ("redirect_uri", "http://127.0.0.1:47615/callback".to_owned()),
            ("code_verifier", "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk".to_owned()),
        ];
        if let Some(a) = assertion {
            fields.push(("client_assertion_type", kind.to_owned()));
            fields.push(("client_assertion", a));
        }
        fields
    };
    const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
    let stranger = signing::Key::new("k1");
    let hostile = [
        ("no assertion", None, JWT_BEARER),
        ("another key", Some(stranger.assertion(&client_id, &token_url, json!({}))), JWT_BEARER),
        (
            "another audience",
            Some(key.assertion(&client_id, "https://evil.example/token", json!({}))),
            JWT_BEARER,
        ),
        (
            "another issuer",
            Some(key.assertion(&client_id, &token_url, json!({"iss": "https://evil.example/c"}))),
            JWT_BEARER,
        ),
        (
            "expired",
            Some(key.assertion(
                &client_id,
                &token_url,
                json!({"exp": jiff::Timestamp::now().as_second() - 300}),
            )),
            JWT_BEARER,
        ),
        (
            "a year long",
            Some(key.assertion(
                &client_id,
                &token_url,
                json!({"exp": jiff::Timestamp::now().as_second() + 31_536_000}),
            )),
            JWT_BEARER,
        ),
        (
            "wrong type",
            Some(key.assertion(&client_id, &token_url, json!({}))),
            "urn:ietf:params:oauth:client-assertion-type:saml2-bearer",
        ),
        ("not a JWT", Some("not.a.jwt".to_owned()), JWT_BEARER),
    ];
    for (name, assertion, kind) in hostile {
        let (status, body) = post(exchange(assertion, kind)).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (401, Some("invalid_client")),
            "{name}: {body}"
        );
    }
    // The code survived every refused attempt: the signed exchange succeeds.
    let (status, tokens) =
        post(exchange(Some(key.assertion(&client_id, &token_url, json!({}))), JWT_BEARER)).await;
    assert_eq!(status, 200, "{tokens}");
    assert_eq!(tokens["scope"], "bookings:read");
    // Refresh needs a fresh assertion too: a replayed one is refused, a new one works.
    let used = key.assertion(&client_id, &token_url, json!({}));
    let refresh = |assertion: Option<String>, token: String| {
        let mut fields = vec![
            ("grant_type", "refresh_token".to_owned()),
            ("refresh_token", token),
            ("client_id", client_id.clone()),
        ];
        if let Some(a) = assertion {
            fields.push(("client_assertion_type", JWT_BEARER.to_owned()));
            fields.push(("client_assertion", a));
        }
        fields
    };
    let refresh_token = tokens["refresh_token"].as_str().expect("refresh").to_owned();
    assert_eq!(post(refresh(None, refresh_token.clone())).await.0, 401);
    let (status, rotated) = post(refresh(Some(used.clone()), refresh_token.clone())).await;
    assert_eq!(status, 200, "{rotated}");
    let (status, body) =
        post(refresh(Some(used), rotated["refresh_token"].as_str().expect("r").to_owned())).await;
    assert_eq!(status, 401, "a replayed assertion: {body}");
    assert!(body["error_description"].as_str().expect("d").contains("used already"), "{body}");
    // Revocation needs the client's assertion too (RFC 7009 §2.1): a stolen refresh token
    // alone cannot end the grant.
    let live = rotated["refresh_token"].as_str().expect("r").to_owned();
    let revoke_url = format!("{}/oauth/revoke", api.url);
    let revoke = |fields: Vec<(&'static str, String)>| {
        let (http, url) = (api.http.clone(), revoke_url.clone());
        async move { http.post(url).form(&fields).send().await.expect("revoke").status().as_u16() }
    };
    assert_eq!(revoke(vec![("token", live.clone())]).await, 401);
    // The issuer URL is accepted as audience too (RFC 7523 lets servers take either).
    let latest = post(refresh(Some(key.assertion(&client_id, &api.url, json!({}))), live)).await;
    assert_eq!(latest.0, 200, "{}", latest.1);
    let newest = latest.1["refresh_token"].as_str().expect("r").to_owned();
    let signed = vec![
        ("token", newest.clone()),
        ("client_id", client_id.clone()),
        ("client_assertion_type", JWT_BEARER.to_owned()),
        ("client_assertion", key.assertion(&client_id, &revoke_url, json!({}))),
    ];
    assert_eq!(revoke(signed).await, 200);
    assert_eq!(
        post(refresh(Some(key.assertion(&client_id, &token_url, json!({}))), newest)).await.0,
        400,
        "revoked"
    );
    // A public client cannot present an assertion (nor choose the method for itself).
    let public = register_client(&api).await;
    let mut fields = vec![
        ("grant_type", "refresh_token".to_owned()),
        ("refresh_token", "gh_mcp_x".to_owned()),
        ("client_id", public.clone()),
    ];
    fields.push(("client_assertion_type", JWT_BEARER.to_owned()));
    fields.push(("client_assertion", key.assertion(&public, &token_url, json!({}))));
    let (status, body) = post(fields).await;
    assert_eq!((status, body["error"].as_str()), (401, Some("invalid_client")), "{body}");
}

#[tokio::test]
async fn a_key_set_that_cannot_be_fetched_is_tried_at_most_once_a_minute() {
    let api =
        Api::start_with(shared::services::oauth::FetchPolicy { dev: true, ..Default::default() })
            .await;
    let key = signing::Key::new("k1");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let docs = format!("http://{}", listener.local_addr().expect("addr"));
    let client_id = format!("{docs}/oauth/client.json");
    let document = json!({"client_id": client_id, "client_name": "Broken keys", "redirect_uris": ["http://127.0.0.1:47615/callback"],
        "token_endpoint_auth_method": "private_key_jwt", "jwks_uri": format!("{docs}/oauth/jwks.json")});
    let fetches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = fetches.clone();
    let routes = axum::Router::new()
        .route(
            "/oauth/client.json",
            axum::routing::get(move || async move { axum::Json(document) }),
        )
        .route(
            "/oauth/jwks.json",
            axum::routing::get(move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, routes).await.expect("serve") });
    // The client becomes known when a person opens its consent page.
    let admin = &api.seed.tenants[0].admin;
    let browser = Browser::sign_in(&api, &admin.email, &admin.password).await;
    let html = browser.get(&authorize_path(&client_id, &[])).await.text().await.expect("consent");
    assert!(html.contains("Broken keys"), "the document was fetched");
    let token_url = format!("{}/oauth/token", api.url);
    let mut answers = Vec::new();
    for _ in 0..5 {
        let fields = [
            ("grant_type", "authorization_code".to_owned()),
            ("code", "no-such-code".to_owned()),
            ("client_id", client_id.clone()),
            (
                "client_assertion_type",
                "urn:ietf:params:oauth:client-assertion-type:jwt-bearer".to_owned(),
            ),
            ("client_assertion", key.assertion(&client_id, &token_url, json!({}))),
        ];
        let response = api.http.post(&token_url).form(&fields).send().await.expect("token");
        let status = response.status().as_u16();
        answers.push((status, response.json::<Value>().await.expect("json")));
    }
    for (status, body) in &answers {
        assert_eq!((*status, body["error"].as_str()), (401, Some("invalid_client")), "{body}");
    }
    assert_eq!(fetches.load(std::sync::atomic::Ordering::SeqCst), 1, "one fetch, not five");
    let later = answers[4].1["error_description"].as_str().expect("why");
    assert!(later.contains("a moment ago"), "{later}");
}
