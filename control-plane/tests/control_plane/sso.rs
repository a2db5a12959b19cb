//! Tenant single sign-on as an attacker tries it: an identity provider on loopback (its own
//! discovery document, key set and token endpoint, the ID token the test decides), people
//! linked by (issuer, subject), every hostile ID token refused with nothing linked and no
//! session made, one issuer per tenant, SSO required, back-channel logout.

use std::sync::Mutex;

use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use shared::rights::Role;
use shared::services::oauth::FetchPolicy;
use shared::services::sso;
use shared::testing::{Person, operator_in};

use crate::support::*;

pub(crate) const CLIENT_ID: &str = "gatehouse-at-idp";
pub(crate) const CLIENT_SECRET: &str = "idp-client-secret-0123456789";

/// An ES256 key and its public JWK.
pub(crate) struct Signer {
    pair: EcdsaKeyPair,
    pub(crate) jwk: Value,
}

impl Signer {
    pub(crate) fn new(kid: &str) -> Signer {
        let rng = SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("pair");
        let point = pair.public_key().as_ref().to_vec();
        let jwk = json!({"kty": "EC", "kid": kid, "alg": "ES256", "use": "sig", "crv": "P-256",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65])});
        Signer { pair, jwk }
    }

    pub(crate) fn sign(&self, header: Value, claims: &Value) -> String {
        let h = URL_SAFE_NO_PAD.encode(header.to_string());
        let p = URL_SAFE_NO_PAD.encode(claims.to_string());
        let sig =
            self.pair.sign(&SystemRandom::new(), format!("{h}.{p}").as_bytes()).expect("sign");
        format!("{h}.{p}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }
}

/// An OpenID provider on loopback whose token endpoint answers with the ID token the test put
/// in `next_id_token` (and only to Gatehouse's client id and secret, by Basic).
pub(crate) struct FakeIdp {
    pub(crate) issuer: String,
    pub(crate) signer: Signer,
    pub(crate) next_id_token: Arc<Mutex<String>>,
    pub(crate) token_calls: Arc<Mutex<u32>>,
}

impl FakeIdp {
    pub(crate) async fn start() -> FakeIdp {
        FakeIdp::pointing(None).await
    }

    /// An IdP whose discovery document names these token endpoint and key set URLs.
    pub(crate) async fn pointing(endpoints: Option<(&str, &str)>) -> FakeIdp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let issuer = format!("http://{}/idp", listener.local_addr().expect("addr"));
        let signer = Signer::new("idp-1");
        let next_id_token = Arc::new(Mutex::new(String::new()));
        let token_calls = Arc::new(Mutex::new(0));
        let discovery = json!({
            "issuer": issuer,
            "authorization_endpoint": format!("{issuer}/authorize"),
            "token_endpoint": endpoints.map_or(format!("{issuer}/token"), |e| e.0.to_owned()),
            "jwks_uri": endpoints.map_or(format!("{issuer}/jwks"), |e| e.1.to_owned()),
            "token_endpoint_auth_methods_supported": ["client_secret_basic"],
        });
        let jwks = json!({"keys": [signer.jwk.clone()]});
        let (slot, calls) = (next_id_token.clone(), token_calls.clone());
        let app = axum::Router::new()
            .route(
                "/idp/.well-known/openid-configuration",
                get(move || async move { axum::Json(discovery) }),
            )
            .route("/idp/jwks", get(move || async move { axum::Json(jwks) }))
            .route(
                "/idp/token",
                post(move |headers: axum::http::HeaderMap| async move {
                    *calls.lock().expect("lock") += 1;
                    let expected = format!(
                        "Basic {}",
                        base64::engine::general_purpose::STANDARD
                            .encode(format!("{CLIENT_ID}:{CLIENT_SECRET}"))
                    );
                    let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
                    if auth != Some(expected.as_str()) {
                        return (
                            axum::http::StatusCode::UNAUTHORIZED,
                            axum::Json(json!({"error": "invalid_client"})),
                        );
                    }
                    let token = slot.lock().expect("lock").clone();
                    (
                        axum::http::StatusCode::OK,
                        axum::Json(json!({"access_token": "at", "token_type": "Bearer", "id_token": token})),
                    )
                }),
            );
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve idp") });
        FakeIdp { issuer, signer, next_id_token, token_calls }
    }

    pub(crate) fn id_token(&self, claims: &Value) -> String {
        self.signer.sign(json!({"alg": "ES256", "kid": "idp-1", "typ": "JWT"}), claims)
    }
}

pub(crate) fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Connects `idp` to tenant `slug` (email domain `domain`) as its operator-admin.
pub(crate) async fn connect(
    api: &Api,
    idp: &FakeIdp,
    slug: &str,
    domain: &str,
    sso_required: bool,
    id_jag: bool,
) -> shared::Result<sso::IdpView> {
    let ctx = operator_in(&api._db.ds, &api.seed.tenants[0].admin.email, slug).await;
    let input = sso::IdpInput {
        issuer: idp.issuer.clone(),
        client_id: CLIENT_ID.into(),
        client_secret: Some(CLIENT_SECRET.into()),
        email_domains: vec![domain.into()],
        allow_join: false,
        sso_required,
        id_jag,
        session_hours: 8,
    };
    sso::idp_set(&api._db.ds, &ctx, &FetchPolicy { dev: true, ..Default::default() }, input).await
}

/// A sign-in started at the console: the state cookie and the authorization request's
/// parameters as the IdP sees them.
pub(crate) struct Started {
    pub(crate) cookie: String,
    pub(crate) params: std::collections::BTreeMap<String, String>,
}

pub(crate) fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client")
}

pub(crate) async fn start(api: &Api, who: &str) -> Started {
    let r = no_redirects()
        .post(format!("{}/sso/start", api.url))
        .form(&[("who", who), ("next", "/connections")])
        .send()
        .await
        .expect("start");
    assert_eq!(r.status(), 303, "{:?}", r.text().await);
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .split(';')
        .next()
        .expect("pair")
        .to_owned();
    let location = url::Url::parse(r.headers()["location"].to_str().expect("ascii")).expect("url");
    Started { cookie, params: location.query_pairs().into_owned().collect() }
}

/// Comes back from the IdP with `id_token` waiting at its token endpoint; returns the
/// response (a session cookie on success).
pub(crate) async fn finish(
    api: &Api,
    idp: &FakeIdp,
    started: &Started,
    id_token: String,
) -> reqwest::Response {
    *idp.next_id_token.lock().expect("lock") = id_token;
    no_redirects()
        .get(format!("{}/sso/callback", api.url))
        .query(&[("state", started.params["state"].as_str()), ("code", "code-1")])
        .header("cookie", &started.cookie)
        .send()
        .await
        .expect("callback")
}

pub(crate) fn session_of(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("gh_session="))
        .map(|c| c.split(';').next().unwrap_or_default().to_owned())
}

pub(crate) fn claims(idp: &FakeIdp, sub: &str, email: &str, nonce: &str) -> Value {
    json!({"iss": idp.issuer, "sub": sub, "aud": CLIENT_ID, "exp": now() + 600, "iat": now(),
        "nonce": nonce, "email": email, "email_verified": true, "name": "Signed In", "sid": format!("sid-{sub}")})
}

/// Signs `email` in through the IdP as subject `sub`; returns the session cookie.
pub(crate) async fn sign_in(api: &Api, idp: &FakeIdp, sub: &str, email: &str) -> String {
    sign_in_as(api, idp, sub, email, &format!("sid-{sub}")).await
}

/// Signs `email` in as subject `sub` in the IdP's session `sid`; returns the session cookie.
pub(crate) async fn sign_in_as(
    api: &Api,
    idp: &FakeIdp,
    sub: &str,
    email: &str,
    sid: &str,
) -> String {
    let started = start(api, email).await;
    let mut claims = claims(idp, sub, email, &started.params["nonce"]);
    claims["sid"] = json!(sid);
    let token = idp.id_token(&claims);
    let r = finish(api, idp, &started, token).await;
    assert_eq!(r.status(), 303, "{:?}", r.text().await);
    session_of(&r).expect("a session")
}

#[tokio::test]
async fn a_member_signs_in_through_the_tenant_idp_and_is_linked_by_subject() {
    let api = Api::start_with(FetchPolicy { dev: true, ..Default::default() }).await;
    let idp = FakeIdp::start().await;
    let slug = api.seed.tenants[0].slug.clone();
    connect(&api, &idp, &slug, "northwind.example", false, false).await.expect("connected");
    let dispatcher = api.seed.tenants[0].dispatcher.email.clone();
    // The authorization request: code flow, PKCE S256, state, nonce, our redirect URI.
    let started = start(&api, &dispatcher).await;
    let p = &started.params;
    assert_eq!(p["response_type"], "code");
    assert_eq!(p["client_id"], CLIENT_ID);
    assert_eq!(p["code_challenge_method"], "S256");
    assert_eq!(p["redirect_uri"], format!("{}/sso/callback", api.url));
    assert!(p["scope"].contains("openid") && p["nonce"].len() > 20 && p["state"].len() > 20);
    let token = idp.id_token(&claims(&idp, "sub-dispatch", &dispatcher, &p["nonce"]));
    let r = finish(&api, &idp, &started, token).await;
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/connections");
    let cookie = session_of(&r).expect("session");
    let page = no_redirects()
        .get(format!("{}/approvals", api.url))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("page");
    assert_eq!(page.status(), 200, "the session works in the tenant");
    let db = &api._db;
    assert_eq!(db.email_linked_to_subject("sub-dispatch").await, dispatcher);
    // Bounded by the tenant's session lifetime (8 hours), and marked as the IdP's.
    assert_eq!(
        db.rows("console_sessions")
            .not_null("idp_id")
            .eq("idp_sid", "sid-sub-dispatch")
            .before("expires_at", "8 hours 1 minute")
            .count()
            .await,
        1
    );
    assert_eq!(db.rows("audit_log").eq("action", "idp.set").eq("channel", "cli").count().await, 1);
    assert_eq!(db.audited("person.link_idp").await, 1);
    // The next sign-in finds the person by subject, whatever email the IdP says now.
    let again = start(&api, &slug).await;
    let mut c = claims(&idp, "sub-dispatch", "renamed@elsewhere.example", &again.params["nonce"]);
    c["email_verified"] = json!(false);
    let r = finish(&api, &idp, &again, idp.id_token(&c)).await;
    assert_eq!(r.status(), 303, "linked by subject, not by email");
    assert_eq!(db.count("person_identities").await, 1);
}

#[tokio::test]
async fn hostile_id_tokens_are_refused_and_change_nothing() {
    let api = Api::start_with(FetchPolicy { dev: true, ..Default::default() }).await;
    let idp = FakeIdp::start().await;
    let slug = api.seed.tenants[0].slug.clone();
    connect(&api, &idp, &slug, "northwind.example", false, false).await.expect("connected");
    let email = api.seed.tenants[0].dispatcher.email.clone();
    let db = &api._db;
    // A subject linked in another tenant (as when another tenant had this issuer before).
    let other_tenant = api.seed.tenants[1].slug.clone();
    db.link_idp_subject(
        &idp.issuer,
        "sub-elsewhere",
        &api.seed.tenants[1].admin.email,
        &other_tenant,
    )
    .await;
    let stranger = Signer::new("idp-1");
    let used = start(&api, &email).await;
    let used_nonce = used.params["nonce"].clone();
    type Case = Box<dyn Fn(&FakeIdp, &str) -> String>;
    let with = |f: fn(&mut Value)| -> Case {
        Box::new(move |idp: &FakeIdp, nonce: &str| {
            let mut c = claims(idp, "sub-new", "dispatch@northwind.example", nonce);
            f(&mut c);
            idp.id_token(&c)
        })
    };
    let cases: Vec<(&str, Case)> = vec![
        ("another issuer", with(|c| c["iss"] = json!("https://evil.example"))),
        ("wrong audience", with(|c| c["aud"] = json!("someone-else"))),
        ("another azp", with(|c| c["azp"] = json!("someone-else"))),
        ("expired", with(|c| c["exp"] = json!(now() - 600))),
        ("email not verified", with(|c| c["email_verified"] = json!(false))),
        (
            "a domain the IdP does not vouch for",
            with(|c| c["email"] = json!("dispatch@harbor.example")),
        ),
        ("a subject linked in another tenant", with(|c| c["sub"] = json!("sub-elsewhere"))),
        (
            "an access token's typ",
            Box::new(|idp: &FakeIdp, nonce: &str| {
                idp.signer.sign(
                    json!({"alg": "ES256", "kid": "idp-1", "typ": "at+jwt"}),
                    &claims(idp, "sub-new", "dispatch@northwind.example", nonce),
                )
            }),
        ),
        (
            "another key",
            Box::new(move |idp: &FakeIdp, nonce: &str| {
                stranger.sign(
                    json!({"alg": "ES256", "kid": "idp-1"}),
                    &claims(idp, "sub-new", "dispatch@northwind.example", nonce),
                )
            }),
        ),
        (
            "a nonce of another sign-in",
            Box::new(move |idp: &FakeIdp, _: &str| {
                idp.id_token(&claims(idp, "sub-new", "dispatch@northwind.example", &used_nonce))
            }),
        ),
        ("no nonce", with(|c| _ = c.as_object_mut().map(|m| m.remove("nonce")))),
    ];
    let sessions = db.count("console_sessions").await;
    for (name, make) in cases {
        let started = start(&api, &email).await;
        let r = finish(&api, &idp, &started, make(&idp, &started.params["nonce"])).await;
        assert_eq!(r.status(), 401, "{name} was accepted");
        assert!(session_of(&r).is_none(), "{name}");
        let text = r.text().await.expect("text");
        assert!(text.contains("sign") || text.contains("administrator"), "{name}: {text}");
        // The state was used up by the refusal.
        let again = finish(
            &api,
            &idp,
            &started,
            idp.id_token(&claims(&idp, "sub-new", &email, &started.params["nonce"])),
        )
        .await;
        assert_eq!(again.status(), 401, "{name}: a state works once");
    }
    // Coming back in another browser (no state cookie) is refused before the code is used.
    let started = start(&api, &email).await;
    let calls = *idp.token_calls.lock().expect("lock");
    let forged =
        Started { cookie: "gh_sso=someone-elses-state".into(), params: started.params.clone() };
    let r = finish(
        &api,
        &idp,
        &forged,
        idp.id_token(&claims(&idp, "sub-new", &email, &started.params["nonce"])),
    )
    .await;
    assert_eq!(r.status(), 401);
    assert_eq!(*idp.token_calls.lock().expect("lock"), calls, "the code was never exchanged");
    assert_eq!(db.count("console_sessions").await, sessions, "no session");
    assert_eq!(db.count("person_identities").await, 1, "nothing linked");
    assert_eq!(db.audited("person.link_idp").await, 0);
    // The same ID token for a fresh sign-in still works: the refusals were about the tokens.
    sign_in(&api, &idp, "sub-new", &email).await;
}

#[tokio::test]
async fn an_issuer_serves_one_tenant_and_a_private_idp_is_refused_outside_development() {
    let api = Api::start_with(FetchPolicy { dev: true, ..Default::default() }).await;
    let idp = FakeIdp::start().await;
    connect(&api, &idp, &api.seed.tenants[0].slug, "northwind.example", false, false)
        .await
        .expect("connected");
    let audits = api._db.count("audit_log").await;
    let err = connect(&api, &idp, &api.seed.tenants[1].slug, "harbor.example", false, false)
        .await
        .expect_err("the same issuer for a second tenant");
    assert!(err.to_string().contains("another tenant"), "{err}");
    assert_eq!(api._db.count("tenant_idps").await, 1);
    // Nor may a second tenant claim the first one's email domain, to receive its people.
    let own = FakeIdp::start().await;
    let err = connect(&api, &own, &api.seed.tenants[1].slug, "northwind.example", false, false)
        .await
        .expect_err("another tenant's domain");
    assert!(err.to_string().contains("northwind.example"), "{err}");
    assert_eq!(api._db.count("tenant_idps").await, 1);
    assert_eq!(api._db.count("audit_log").await, audits, "nothing audited");
    // Production's fetch policy never reaches a loopback IdP (nor its metadata's endpoints).
    let ctx =
        operator_in(&api._db.ds, &api.seed.tenants[0].admin.email, &api.seed.tenants[1].slug).await;
    let other = FakeIdp::start().await;
    let input = sso::IdpInput {
        issuer: other.issuer.replace("http://", "https://"),
        client_id: CLIENT_ID.into(),
        client_secret: Some(CLIENT_SECRET.into()),
        email_domains: vec!["harbor.example".into()],
        allow_join: false,
        sso_required: false,
        id_jag: false,
        session_hours: 8,
    };
    let err = sso::idp_set(&api._db.ds, &ctx, &FetchPolicy::default(), input)
        .await
        .expect_err("a private address");
    assert!(err.to_string().contains("private, loopback or link-local"), "{err}");
    assert_eq!(api._db.count("tenant_idps").await, 1);
    // Metadata that points at the cloud metadata service is refused even in development,
    // whether it names the key set or the token endpoint there.
    let metadata = "http://169.254.169.254/latest/meta-data/iam";
    let jwks_there = FakeIdp::pointing(Some((&format!("{}/token", idp.issuer), metadata))).await;
    let token_there = FakeIdp::pointing(Some((metadata, &format!("{}/jwks", idp.issuer)))).await;
    for hostile in [&jwks_there, &token_there] {
        let err = connect(&api, hostile, &api.seed.tenants[1].slug, "harbor.example", false, false)
            .await
            .expect_err("metadata pointing at a link-local address");
        let err = err.to_string();
        assert!(err.contains("169.254.169.254 is a cloud metadata address"), "{err}");
        assert!(err.contains("never fetched"), "{err}");
    }
    assert_eq!(api._db.count("tenant_idps").await, 1, "nothing stored");
}

#[tokio::test]
async fn sso_required_turns_password_sign_in_off_for_the_tenant() {
    let api = Api::start_with(FetchPolicy { dev: true, ..Default::default() }).await;
    let idp = FakeIdp::start().await;
    let t = &api.seed.tenants[0];
    // A password session working in the tenant before the switch...
    let before = Browser::sign_in(&api, &t.dispatcher.email, &t.dispatcher.password).await;
    assert_eq!(before.get("/approvals").await.status(), 200);
    connect(&api, &idp, &t.slug, "northwind.example", true, false).await.expect("connected");
    assert_eq!(api._db.audited("idp.sso_required.on").await, 1);
    // ...works there no more.
    let sent = before.get("/approvals").await;
    assert_eq!(sent.status(), 303, "a password session left the tenant");
    let to = sent.headers()["location"].to_str().expect("location").to_owned();
    // Where it is sent, it is told why and what to do.
    let told = before.get(&to).await;
    assert_eq!(told.status(), 200, "{to}");
    let told = told.text().await.expect("html");
    assert!(told.contains("requires single sign-on"), "{told}");
    assert!(told.contains("Sign in with single sign-on") && told.contains("action=\"/logout\""));
    assert!(!told.contains("Nothing to manage here"), "{told}");
    let http = no_redirects();
    let r = post_login(
        &http,
        &api.url,
        "192.0.2.7",
        &[("email", &t.dispatcher.email), ("password", &t.dispatcher.password), ("next", "/")],
    )
    .await;
    assert_eq!(r.status(), 401);
    assert!(r.text().await.expect("text").contains("requires single sign-on"));
    // The IdP's session enters the tenant.
    let cookie = sign_in(&api, &idp, "sub-d", &t.dispatcher.email).await;
    let page = http
        .get(format!("{}/approvals", api.url))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("page");
    assert_eq!(page.status(), 200);
    // A member of another tenant too signs in with a password, but cannot enter this one.
    let other = operator_in(&api._db.ds, &t.admin.email, &api.seed.tenants[1].slug).await;
    shared::services::admin::person_create(
        &api._db.ds,
        &other,
        &t.admin.email,
        "Admin",
        shared::rights::Role::Viewer,
        None,
    )
    .await
    .expect("a member of both");
    let browser = Browser::sign_in(&api, &t.admin.email, &t.admin.password).await;
    let page = browser.get("/connections").await;
    assert_eq!(page.status(), 303, "a password session does not work in the tenant");
    let tenants = browser.get("/tenants").await.text().await.expect("html");
    let mut form = form_fields(&tenants, "/tenants");
    form.retain(|(k, _)| k != "tenant");
    let id = api._db.tenant_id(&t.slug).await;
    form.push(("tenant".into(), id.to_string()));
    let picked = browser.post("/tenants", &form).await;
    assert_eq!(picked.status(), 422, "picking it is refused");
    assert!(picked.text().await.expect("html").contains("requires single sign-on"));
}

#[tokio::test]
async fn back_channel_logout_ends_the_sessions_the_idp_started() {
    let api = Api::start_with(FetchPolicy { dev: true, ..Default::default() }).await;
    let idp = FakeIdp::start().await;
    let t = &api.seed.tenants[0];
    connect(&api, &idp, &t.slug, "northwind.example", false, false).await.expect("connected");
    let cookie = sign_in(&api, &idp, "sub-d", &t.dispatcher.email).await;
    let other = sign_in(&api, &idp, "sub-d", &t.dispatcher.email).await;
    let logout = |claims: Value, typ: &str| {
        idp.signer.sign(json!({"alg": "ES256", "kid": "idp-1", "typ": typ}), &claims)
    };
    let good = json!({"iss": idp.issuer, "sub": "sub-d", "aud": CLIENT_ID, "iat": now(), "exp": now() + 120,
        "jti": "logout-1", "sid": "sid-sub-d",
        "events": {sso::BACKCHANNEL_LOGOUT_EVENT: {}}});
    let post = |token: String| {
        let url = format!("{}/sso/backchannel-logout", api.url);
        async move {
            no_redirects().post(url).form(&[("logout_token", token)]).send().await.expect("post")
        }
    };
    let mut no_event = good.clone();
    no_event["events"] = json!({});
    no_event["jti"] = json!("logout-2");
    let mut wrong_aud = good.clone();
    wrong_aud["aud"] = json!("someone-else");
    wrong_aud["jti"] = json!("logout-3");
    for (name, token) in [
        ("no logout event", logout(no_event, "logout+jwt")),
        ("another audience", logout(wrong_aud, "logout+jwt")),
        ("an ID token's claims with typ id", logout(good.clone(), "id+jwt")),
    ] {
        assert_eq!(post(token).await.status(), 400, "{name}");
    }
    let sessions = |c: String| {
        let url = format!("{}/approvals", api.url);
        async move { no_redirects().get(url).header("cookie", c).send().await.expect("get").status() }
    };
    assert_eq!(sessions(cookie.clone()).await, 200, "refused logout tokens end nothing");
    assert_eq!(post(logout(good.clone(), "logout+jwt")).await.status(), 200);
    assert_eq!(sessions(cookie).await, 303, "the IdP's session ended");
    assert_eq!(sessions(other).await, 303, "every session of that sid");
    assert_eq!(post(logout(good, "logout+jwt")).await.status(), 400, "a logout token works once");
}

#[tokio::test]
async fn a_logout_token_naming_sid_sub_or_both_ends_just_those_sessions() {
    let api = Api::start_with(FetchPolicy { dev: true, ..Default::default() }).await;
    let idp = FakeIdp::start().await;
    let t = &api.seed.tenants[0];
    connect(&api, &idp, &t.slug, "northwind.example", false, false).await.expect("connected");
    let (d, a) = (&t.dispatcher.email, &t.admin.email);
    // The dispatcher in three IdP sessions, the admin in one.
    let d1 = sign_in_as(&api, &idp, "sub-d", d, "sid-1").await;
    let d2 = sign_in_as(&api, &idp, "sub-d", d, "sid-2").await;
    let d3 = sign_in_as(&api, &idp, "sub-d", d, "sid-3").await;
    let a1 = sign_in_as(&api, &idp, "sub-a", a, "sid-a").await;
    let jti = std::sync::atomic::AtomicU64::new(0);
    let token = |sub: Option<&str>, sid: Option<&str>| {
        let mut claims = json!({"iss": idp.issuer, "aud": CLIENT_ID, "iat": now(), "exp": now() + 120,
            "jti": format!("forms-{}", jti.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
            "events": {sso::BACKCHANNEL_LOGOUT_EVENT: {}}});
        if let Some(sub) = sub {
            claims["sub"] = json!(sub);
        }
        if let Some(sid) = sid {
            claims["sid"] = json!(sid);
        }
        idp.signer.sign(json!({"alg": "ES256", "kid": "idp-1", "typ": "logout+jwt"}), &claims)
    };
    let post = |token: String| {
        let url = format!("{}/sso/backchannel-logout", api.url);
        async move {
            no_redirects().post(url).form(&[("logout_token", token)]).send().await.expect("post")
        }
    };
    let alive = |c: &String| {
        let (url, c) = (format!("{}/approvals", api.url), c.clone());
        async move {
            no_redirects().get(url).header("cookie", c).send().await.expect("get").status() == 200
        }
    };
    let all = [&d1, &d2, &d3, &a1];
    let states = || async {
        let mut states = Vec::new();
        for c in all {
            states.push(alive(c).await);
        }
        states
    };
    assert_eq!(states().await, [true; 4]);

    // Neither: refused with what to send, and nothing ends.
    let r = post(token(None, None)).await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.expect("text").contains("neither sub nor sid"));
    assert_eq!(states().await, [true; 4]);
    // Both, but the session is another person's: nothing ends.
    assert_eq!(post(token(Some("sub-d"), Some("sid-a"))).await.status(), 200);
    assert_eq!(states().await, [true; 4]);
    // A sid no session has, or a subject nobody signed in as: nothing ends, and the IdP is
    // answered as the specification says (the logout is done).
    assert_eq!(post(token(None, Some("sid-unknown"))).await.status(), 200);
    assert_eq!(post(token(Some("sub-unknown"), Some("sid-1"))).await.status(), 200);
    assert_eq!(states().await, [true; 4]);

    // sid only: that session.
    assert_eq!(post(token(None, Some("sid-1"))).await.status(), 200);
    assert_eq!(states().await, [false, true, true, true]);
    // sub and sid: that person's session.
    assert_eq!(post(token(Some("sub-d"), Some("sid-2"))).await.status(), 200);
    assert_eq!(states().await, [false, false, true, true]);
    // sub only: every session of that person, no one else's.
    let d4 = sign_in_as(&api, &idp, "sub-d", d, "sid-4").await;
    assert_eq!(post(token(Some("sub-d"), None)).await.status(), 200);
    assert_eq!(states().await, [false, false, false, true]);
    assert!(!alive(&d4).await);
}

// The CLI runs as a child process while this runtime serves the IdP: two threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gatehousectl_sets_shows_and_removes_the_idp_audited_as_cli() {
    let api = Api::start_with(FetchPolicy { dev: true, ..Default::default() }).await;
    let idp = FakeIdp::start().await;
    let db = &api._db;
    let slug = api.seed.tenants[0].slug.clone();
    let admin = api.seed.tenants[0].admin.email.clone();
    let ctl = |db: &shared::testing::TestDb, args: &[&str]| ctl_as(db, Some(&admin), args);
    let (ok, out) = ctl(
        db,
        &[
            "tenant",
            "idp",
            "set",
            "--tenant",
            &slug,
            "--issuer",
            &idp.issuer,
            "--client-id",
            CLIENT_ID,
            "--client-secret",
            CLIENT_SECRET,
            "--email-domain",
            "northwind.example,Example.COM",
            "--allow-join",
            "off",
            "--sso-required",
            "on",
            "--id-jag",
            "on",
            "--dev-mode",
        ],
    );
    assert!(ok, "{out}");
    assert_eq!(out["idp"]["email_domains"], json!(["northwind.example", "example.com"]));
    assert!(!out.to_string().contains(CLIENT_SECRET), "the secret is never shown");
    let stored = db.rows("tenant_idps").text("client_secret_sealed").await;
    assert!(stored.starts_with("gs1.") && !stored.contains(CLIENT_SECRET), "kept sealed");
    let (ok, shown) = ctl(db, &["tenant", "idp", "show", "--tenant", &slug]);
    assert!(ok && shown["idp"]["sso_required"] == json!(true), "{shown}");
    // Changing a setting keeps the stored secret of the same client.
    let admin = api.seed.tenants[0].admin.email.clone();
    let ctl = |db: &shared::testing::TestDb, args: &[&str]| ctl_as(db, Some(&admin), args);
    let (ok, out) = ctl(
        db,
        &[
            "tenant",
            "idp",
            "set",
            "--tenant",
            &slug,
            "--issuer",
            &idp.issuer,
            "--client-id",
            CLIENT_ID,
            "--email-domain",
            "northwind.example",
            "--allow-join",
            "off",
            "--sso-required",
            "off",
            "--id-jag",
            "on",
            "--dev-mode",
        ],
    );
    assert!(ok, "{out}");
    sign_in(&api, &idp, "sub-x", &api.seed.tenants[0].dispatcher.email).await;
    let (ok, out) = ctl(db, &["tenant", "idp", "remove", "--tenant", &slug]);
    assert!(ok && out["removed"] == json!(true), "{out}");
    assert_eq!(
        db.rows("console_sessions").not_null("idp_id").count().await,
        0,
        "its sessions ended"
    );
    let audited = db
        .rows("audit_log")
        .eq("channel", "cli")
        .like("action", "idp.%")
        .texts("action", "id")
        .await;
    assert_eq!(
        audited.join(","),
        "idp.set,idp.sso_required.on,idp.set,idp.sso_required.off,idp.remove"
    );
    let (ok, out) = ctl(db, &["tenant", "idp", "show", "--tenant", &slug]);
    assert!(ok && out["idp"].is_null(), "{out}");
}

#[tokio::test]
async fn a_tenant_admin_connects_the_idp_in_the_console_and_others_cannot() {
    let api = Api::start_with(FetchPolicy { dev: true, ..Default::default() }).await;
    let idp = FakeIdp::start().await;
    let t = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t.admin.email, &t.admin.password).await;
    let page = admin.get("/settings/sso").await.text().await.expect("html");
    assert!(page.contains(&format!("{}/sso/callback", api.url)), "the redirect URI to register");
    let mut form = form_fields(&page, "/settings/sso");
    let fill = |form: &mut Vec<(String, String)>, extra: &[(&str, &str)]| {
        form.retain(|(k, _)| k == "csrf");
        for (k, v) in extra {
            form.push(((*k).into(), (*v).into()));
        }
    };
    let fields = [
        ("issuer", idp.issuer.as_str()),
        ("client_id", CLIENT_ID),
        ("client_secret", CLIENT_SECRET),
        ("email_domains", "northwind.example"),
        ("allow_join", "no"),
        ("id_jag", "yes"),
        ("session_hours", "4"),
    ];
    // A form that does not say whether SSO is required changes nothing.
    fill(&mut form, &fields);
    let r = admin.post("/settings/sso", &form).await;
    assert_eq!(r.status(), 422);
    assert_eq!(api._db.count("tenant_idps").await, 0);
    // A forged form (no CSRF token) neither.
    let forged: Vec<(String, String)> = form.iter().filter(|(k, _)| k != "csrf").cloned().collect();
    assert_eq!(admin.post("/settings/sso", &forged).await.status(), 403);
    let mut with_choice = fields.to_vec();
    with_choice.push(("sso_required", "no"));
    fill(&mut form, &with_choice);
    let r = admin.post("/settings/sso", &form).await;
    assert_eq!(r.status(), 303, "{:?}", r.text().await);
    assert_eq!(
        api._db.rows("audit_log").eq("action", "idp.set").eq("channel", "console").count().await,
        1
    );
    // Registering an agent platform shows its secret once.
    let page = admin.get("/settings/sso").await.text().await.expect("html");
    let mut register = form_fields(&page, "/settings/sso/clients");
    register.push(("name".into(), "Acme agents".into()));
    let shown = admin.post("/settings/sso/clients", &register).await.text().await.expect("html");
    assert!(shown.contains("ghcs_"), "the secret, once");
    assert!(!admin.get("/settings/sso").await.text().await.expect("html").contains("ghcs_"));
    // A dispatcher cannot see or change it.
    let dispatcher = Browser::sign_in(&api, &t.dispatcher.email, &t.dispatcher.password).await;
    assert_eq!(dispatcher.get("/settings/sso").await.status(), 403);
    let d_page = dispatcher.get("/approvals").await.text().await.expect("html");
    let csrf = d_page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .expect("csrf")
        .split('"')
        .next()
        .expect("end");
    let mut d_form = vec![("csrf".to_owned(), csrf.to_owned())];
    d_form.extend(with_choice.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    assert_eq!(dispatcher.post("/settings/sso/remove", &d_form).await.status(), 403);
    assert_eq!(api._db.count("tenant_idps").await, 1);
}

#[tokio::test]
async fn with_join_allowed_a_verified_newcomer_joins_as_viewer_and_a_removed_member_does_not() {
    let api = Api::start_with(FetchPolicy { dev: true, ..Default::default() }).await;
    let idp = FakeIdp::start().await;
    let t = &api.seed.tenants[0];
    let ctx = operator_in(&api._db.ds, &t.admin.email, &t.slug).await;
    let input = sso::IdpInput {
        issuer: idp.issuer.clone(),
        client_id: CLIENT_ID.into(),
        client_secret: Some(CLIENT_SECRET.into()),
        email_domains: vec!["northwind.example".into()],
        allow_join: true,
        sso_required: false,
        id_jag: false,
        session_hours: 2,
    };
    let policy = FetchPolicy { dev: true, ..Default::default() };
    sso::idp_set(&api._db.ds, &ctx, &policy, input).await.expect("set");
    let db = &api._db;
    let joins = move || db.rows("audit_log").eq("action", "person.create").eq("channel", "system");
    let joined_before = joins().count().await;
    let cookie = sign_in(&api, &idp, "sub-newcomer", "newcomer@northwind.example").await;
    assert_eq!(
        db.membership_of_email("newcomer@northwind.example").await.0,
        "viewer",
        "the lowest role"
    );
    assert_eq!(
        db.rows("console_sessions")
            .not_null("idp_id")
            .before("expires_at", "2 hours 1 minute")
            .count()
            .await,
        1,
        "the tenant's session lifetime"
    );
    let home = no_redirects()
        .get(format!("{}/", api.url))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("home");
    assert_eq!(home.status(), 200, "a viewer's home page in the tenant");
    assert_eq!(joins().count().await, joined_before + 1, "the join is audited");
    // A member an admin removed does not come back through the IdP.
    shared::services::admin::person_deactivate(&db.ds, &ctx, &t.dispatcher.email)
        .await
        .expect("deactivate");
    let started = start(&api, &t.dispatcher.email).await;
    let token =
        idp.id_token(&claims(&idp, "sub-removed", &t.dispatcher.email, &started.params["nonce"]));
    let r = finish(&api, &idp, &started, token).await;
    assert_eq!(r.status(), 401);
    assert!(r.text().await.expect("html").contains("ended"));
}

/// A tenant's IdP vouches for that tenant's people only: a session it started never works in
/// another tenant the person belongs to, never reaches the operator's page, never adds a
/// first passkey that would sign in elsewhere, and an account of another tenant is never
/// joined here by its email alone (a tenant admin who controls the IdP cannot take it over).
#[tokio::test]
async fn an_idp_session_works_only_in_its_tenant_and_vouches_for_no_one_elsewhere() {
    let api = Api::start_with(FetchPolicy { dev: true, ..Default::default() }).await;
    let idp = FakeIdp::start().await;
    let t0 = &api.seed.tenants[0];
    let t1 = &api.seed.tenants[1];
    let db = &api._db;
    let ctx0 = operator_in(&db.ds, &t0.admin.email, &t0.slug).await;
    let input = sso::IdpInput {
        issuer: idp.issuer.clone(),
        client_id: CLIENT_ID.into(),
        client_secret: Some(CLIENT_SECRET.into()),
        email_domains: vec!["northwind.example".into()],
        allow_join: true,
        sso_required: false,
        id_jag: false,
        session_hours: 8,
    };
    let policy = FetchPolicy { dev: true, ..Default::default() };
    sso::idp_set(&db.ds, &ctx0, &policy, input).await.expect("set");
    // The dispatcher of tenant 0 is also an admin of tenant 1 and a platform operator.
    let ctx1 = operator_in(&db.ds, &t0.admin.email, &t1.slug).await;
    Person::new(&db.ds, &ctx1, &t0.dispatcher.email).role(Role::Admin).create().await;
    let made = db.rows("people").eq("email", &t0.dispatcher.email).set("is_operator", true).await;
    assert_eq!(made, 1, "the dispatcher is an operator now");
    let cookie = sign_in(&api, &idp, "sub-two-homes", &t0.dispatcher.email).await;
    let get = |path: &'static str| {
        let cookie = cookie.clone();
        let url = format!("{}{path}", api.url);
        async move { no_redirects().get(url).header("cookie", cookie).send().await.expect("get") }
    };
    assert_eq!(get("/approvals").await.status(), 200, "the session works in its own tenant");
    assert_eq!(get("/operator").await.status(), 403, "an IdP session is no operator");
    // Picking the other tenant is refused; a session moved there anyway has no context.
    let html = get("/tenants").await.text().await.expect("html");
    let csrf = form_fields(&html, "/tenants")
        .into_iter()
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v)
        .expect("csrf");
    let t1_id = db.tenant_id(&t1.slug).await;
    let picked = no_redirects()
        .post(format!("{}/tenants", api.url))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str()), ("tenant", &t1_id.to_string()), ("next", "/")])
        .send()
        .await
        .expect("pick");
    assert_eq!(picked.status(), 422, "another tenant is refused to an IdP session");
    db.rows("console_sessions").not_null("idp_id").set("tenant_id", t1_id).await;
    let moved = get("/connections").await;
    assert_eq!(moved.status(), 303, "no context in another tenant");
    assert_eq!(moved.headers()["location"], "/tenants");
    // Back in its tenant: a first passkey is refused, since the person belongs elsewhere too.
    let t0_id = db.tenant_id(&t0.slug).await;
    db.rows("console_sessions").not_null("idp_id").set("tenant_id", t0_id).await;
    let cleared = db.rows("people").eq("email", &t0.dispatcher.email).set_null("password_hash");
    assert_eq!(cleared.await, 1, "the dispatcher has no password now");
    let r = no_redirects()
        .post(format!("{}/account/passkeys/options", api.url))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str()), ("name", "Thief's key")])
        .send()
        .await
        .expect("options");
    assert_eq!(r.status(), 422);
    assert!(r.text().await.expect("body").contains("set a password first"));
    // An account of tenant 1 only is not joined to tenant 0 by its email, join or not.
    let ctx1 = operator_in(&db.ds, &t0.admin.email, &t1.slug).await;
    Person::new(&db.ds, &ctx1, "outsider@northwind.example").role(Role::Admin).create().await;
    let started = start(&api, "outsider@northwind.example").await;
    let token = idp.id_token(&claims(
        &idp,
        "sub-outsider",
        "outsider@northwind.example",
        &started.params["nonce"],
    ));
    let r = finish(&api, &idp, &started, token).await;
    assert_eq!(r.status(), 401);
    assert!(r.text().await.expect("html").contains("account already"));
    assert_eq!(db.memberships_in_tenant(&t0.slug, "outsider@northwind.example").await, 0);
    assert_eq!(db.rows("person_identities").eq("subject", "sub-outsider").count().await, 0);
}
