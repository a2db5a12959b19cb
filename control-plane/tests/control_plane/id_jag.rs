//! Enterprise-managed authorization (ID-JAG) as an attacker tries it: a confidential client
//! of the tenant trades an ID-JAG its IdP signed for an audience-bound access token with no
//! refresh token, on a connection marked as granted by the IdP; every hostile ID-JAG is
//! refused and creates no connection and no token.

use shared::services::id_jag;
use shared::services::oauth::FetchPolicy;
use shared::testing::operator_in;

use crate::sso::{FakeIdp, Signer, connect, now, sign_in};
use crate::support::*;

const MCP: &str = "http://127.0.0.1:9/mcp";

struct Setup {
    api: Api,
    idp: FakeIdp,
    client_id: String,
    client_secret: String,
}

async fn setup() -> Setup {
    let api = Api::start_with(FetchPolicy { dev: true, ..Default::default() }).await;
    let idp = FakeIdp::start().await;
    let t = &api.seed.tenants[0];
    connect(&api, &idp, &t.slug, "northwind.example", false, true).await.expect("connected");
    // The dispatcher signed in through single sign-on once: their subject is linked.
    sign_in(&api, &idp, "sub-dispatch", &t.dispatcher.email).await;
    let ctx = operator_in(&api._db.ds, &t.admin.email, &t.slug).await;
    let client = id_jag::client_register(&api._db.ds, &ctx, "Acme agents").await.expect("client");
    Setup { api, idp, client_id: client.client_id, client_secret: client.client_secret }
}

fn jag(s: &Setup, f: impl Fn(&mut Value)) -> Value {
    let mut c = json!({"iss": s.idp.issuer, "sub": "sub-dispatch", "aud": s.api.url, "client_id": s.client_id,
        "resource": MCP, "scope": "bookings:read bookings:write", "exp": now() + 300, "iat": now(),
        "jti": format!("jag-{}", shared::ctx::new_request_id())});
    f(&mut c);
    c
}

fn signed(s: &Setup, claims: &Value) -> String {
    s.idp.signer.sign(json!({"alg": "ES256", "kid": "idp-1", "typ": "oauth-id-jag+jwt"}), claims)
}

async fn exchange(s: &Setup, assertion: &str, extra: &[(&str, &str)]) -> (u16, Value) {
    let mut form = vec![
        ("grant_type", id_jag::GRANT_TYPE),
        ("assertion", assertion),
        ("client_id", s.client_id.as_str()),
        ("client_secret", s.client_secret.as_str()),
        ("resource", MCP),
    ];
    form.extend_from_slice(extra);
    let r = s
        .api
        .http
        .post(format!("{}/oauth/token", s.api.url))
        .form(&form)
        .send()
        .await
        .expect("token");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn an_id_jag_from_the_tenant_idp_buys_an_audience_bound_token_on_a_connection_marked_idp() {
    let s = setup().await;
    let (_, meta) = s.api.get("/.well-known/oauth-authorization-server", None).await;
    assert_eq!(meta["authorization_grant_profiles_supported"], json!([id_jag::PROFILE]));
    assert!(
        meta["grant_types_supported"]
            .as_array()
            .expect("list")
            .contains(&json!(id_jag::GRANT_TYPE))
    );
    let (status, token) =
        exchange(&s, &signed(&s, &jag(&s, |_| {})), &[("scope", "bookings:read customers:read")])
            .await;
    assert_eq!(status, 200, "{token}");
    assert_eq!(token["token_type"], "Bearer");
    assert!(token.get("refresh_token").is_none(), "no refresh token: the IdP decides again");
    assert_eq!(token["scope"], "bookings:read", "the ID-JAG's scope ∩ the requested scope");
    let db = &s.api._db;
    assert_eq!(db.rows("connection_tokens").eq("kind", "access").text("audience").await, MCP);
    // The connection is the tenant's like any other, marked as granted by the IdP.
    let ctx =
        operator_in(&db.ds, &s.api.seed.tenants[0].admin.email, &s.api.seed.tenants[0].slug).await;
    let list = shared::services::admin::connection_list(&db.ds, &ctx).await.expect("list");
    let c = list.iter().find(|c| c.granted_by.as_deref() == Some("idp")).expect("marked");
    assert_eq!(c.creator, s.api.seed.tenants[0].dispatcher.email);
    assert_eq!(c.rights, ["bookings:read"]);
    // Basic authentication works too, and the same pair stays one connection.
    use base64::Engine;
    let basic = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", s.client_id, s.client_secret));
    let r = s
        .api
        .http
        .post(format!("{}/oauth/token", s.api.url))
        .header("authorization", format!("Basic {basic}"))
        .form(&[
            ("grant_type", id_jag::GRANT_TYPE),
            ("assertion", &signed(&s, &jag(&s, |c| c["scope"] = json!("bookings:read")))),
            ("resource", MCP),
        ])
        .send()
        .await
        .expect("token");
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert_eq!(db.rows("connections").eq("granted_by", "idp").count().await, 1);
    assert_eq!(db.audited("connection.id_jag").await, 2);
    // The admin revokes it like any other; the next ID-JAG makes a new grant.
    shared::services::admin::connection_revoke(&db.ds, &ctx, &c.connection, "test")
        .await
        .expect("revoke");
    assert_eq!(db.tokens_of_active_idp_grants().await, 0);
}

#[tokio::test]
async fn hostile_id_jags_are_refused_and_create_nothing() {
    let s = setup().await;
    let db = &s.api._db;
    // Another tenant's person, linked at another tenant's IdP.
    let other = FakeIdp::start().await;
    connect(&s.api, &other, &s.api.seed.tenants[1].slug, "harbor.example", false, true)
        .await
        .expect("other");
    sign_in(&s.api, &other, "sub-harbor", &s.api.seed.tenants[1].dispatcher.email).await;
    let stranger = Signer::new("idp-1");
    let hmac = {
        use jsonwebtoken::{EncodingKey, Header, encode};
        let mut h = Header::new(jsonwebtoken::Algorithm::HS256);
        h.typ = Some("oauth-id-jag+jwt".into());
        encode(
            &h,
            &jag(&s, |_| {}),
            &EncodingKey::from_secret(s.idp.signer.jwk.to_string().as_bytes()).expect("key"),
        )
        .expect("hmac")
    };
    let unsigned = {
        use base64::Engine;
        let b = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        format!("{}.{}.", b(json!({"alg": "none", "typ": "oauth-id-jag+jwt"})), b(jag(&s, |_| {})))
    };
    let replayed = signed(&s, &jag(&s, |c| c["jti"] = json!("jag-once")));
    assert_eq!(exchange(&s, &replayed, &[]).await.0, 200, "the first use");
    let before = (db.count("connections").await, db.count("connection_tokens").await);
    type Extra<'a> = Vec<(&'a str, &'a str)>;
    let cases: Vec<(&str, String, Extra)> = vec![
        ("unsigned", unsigned, vec![]),
        ("HMAC-signed with the IdP's public key", hmac, vec![]),
        (
            "signed by another key",
            stranger.sign(
                json!({"alg": "ES256", "kid": "idp-1", "typ": "oauth-id-jag+jwt"}),
                &jag(&s, |_| {}),
            ),
            vec![],
        ),
        (
            "an ID token's typ",
            s.idp
                .signer
                .sign(json!({"alg": "ES256", "kid": "idp-1", "typ": "JWT"}), &jag(&s, |_| {})),
            vec![],
        ),
        (
            "a foreign issuer",
            signed(&s, &jag(&s, |c| c["iss"] = json!("https://evil.example"))),
            vec![],
        ),
        (
            "another tenant's subject",
            signed(&s, &jag(&s, |c| c["sub"] = json!("sub-harbor"))),
            vec![],
        ),
        (
            "a subject never linked",
            signed(&s, &jag(&s, |c| c["sub"] = json!("sub-unknown"))),
            vec![],
        ),
        (
            "scope beyond the role",
            signed(&s, &jag(&s, |c| c["scope"] = json!("bookings:read people:manage"))),
            vec![],
        ),
        (
            "a request beyond the role",
            signed(&s, &jag(&s, |c| _ = c.as_object_mut().map(|m| m.remove("scope")))),
            vec![("scope", "tenant:switch")],
        ),
        ("a replayed jti", replayed, vec![]),
        (
            "the aud of another server",
            signed(&s, &jag(&s, |c| c["aud"] = json!("https://other-as.example"))),
            vec![],
        ),
        (
            "another resource",
            signed(&s, &jag(&s, |c| c["resource"] = json!("https://other.example/mcp"))),
            vec![],
        ),
        ("expired", signed(&s, &jag(&s, |c| c["exp"] = json!(now() - 300))), vec![]),
        ("long-lived", signed(&s, &jag(&s, |c| c["exp"] = json!(now() + 7200))), vec![]),
        (
            "issued to another client",
            signed(&s, &jag(&s, |c| c["client_id"] = json!("ghcc_other"))),
            vec![],
        ),
        (
            "no client_id claim",
            signed(&s, &jag(&s, |c| _ = c.as_object_mut().map(|m| m.remove("client_id")))),
            vec![],
        ),
    ];
    for (name, assertion, extra) in cases {
        let (status, body) = exchange(&s, &assertion, &extra).await;
        assert_eq!(status, 400, "{name}: {body}");
        assert!(
            body["error_description"].as_str().is_some_and(|d| !d.is_empty()),
            "{name}: {body}"
        );
    }
    // A wrong secret, and a public client, are refused before the ID-JAG is read.
    let good = signed(&s, &jag(&s, |_| {}));
    let r = s
        .api
        .http
        .post(format!("{}/oauth/token", s.api.url))
        .form(&[
            ("grant_type", id_jag::GRANT_TYPE),
            ("assertion", good.as_str()),
            ("client_id", s.client_id.as_str()),
            ("client_secret", "wrong"),
        ])
        .send()
        .await
        .expect("token");
    assert_eq!(r.status(), 401);
    let public = register_client(&s.api).await;
    let r = s
        .api
        .http
        .post(format!("{}/oauth/token", s.api.url))
        .form(&[
            ("grant_type", id_jag::GRANT_TYPE),
            ("assertion", good.as_str()),
            ("client_id", public.as_str()),
        ])
        .send()
        .await
        .expect("token");
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.expect("json")["error"], "unauthorized_client");
    assert_eq!(
        (db.count("connections").await, db.count("connection_tokens").await),
        before,
        "no connection and no token"
    );
    // A tenant that does not trust its IdP for ID-JAGs takes none.
    connect(&s.api, &s.idp, &s.api.seed.tenants[0].slug, "northwind.example", false, false)
        .await
        .expect("off");
    assert_eq!(exchange(&s, &good, &[]).await.0, 400);
}
