//! The tenant's identity provider with real parts: `oidc-provider` (npm, Node 22) as the
//! tenant's OpenID provider, signed into through its own login and consent forms by a browser
//! that keeps cookies; its back-channel logout ends the session. And the official Python SDK's
//! `IdentityAssertionOAuthProvider` trading an ID-JAG for a token through the load balancer.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};

use crate::support::*;

const CLIENT_ID: &str = "gatehouse";
const CLIENT_SECRET: &str = "e2e-oidc-client-secret-0123456789abcdef";

/// A child process ended when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `oidc-provider` on a free loopback port, knowing Gatehouse as its client.
fn start_idp(stack: &Stack) -> (Killed, String) {
    let port = e2e::free_port().expect("port");
    let accounts = json!({
        "dispatch@northwind.example": {"sub": "okta-00u1dispatch", "email": "dispatch@northwind.example", "email_verified": true, "name": "Dispatch"},
        "unverified@northwind.example": {"sub": "okta-00u2unverified", "email": "unverified@northwind.example", "email_verified": false},
    });
    let log = std::fs::File::create(stack.run_dir.join("oidc-provider.log")).expect("log");
    let child = Command::new(node22())
        .arg(e2e::repo_root().join("e2e/idp/provider.mjs"))
        .current_dir(e2e::repo_root().join("e2e/idp"))
        .env("IDP_PORT", port.to_string())
        .env("IDP_CLIENT_ID", CLIENT_ID)
        .env("IDP_CLIENT_SECRET", CLIENT_SECRET)
        .env("IDP_REDIRECT_URI", format!("{}/sso/callback", stack.control_url))
        .env("IDP_BACKCHANNEL_URI", format!("{}/sso/backchannel-logout", stack.control_url))
        .env("IDP_ACCOUNTS", accounts.to_string())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .expect("node e2e/idp/provider.mjs (scripts/test installs oidc-provider)");
    (Killed(child), format!("http://127.0.0.1:{port}"))
}

/// A browser: one cookie jar for 127.0.0.1 (cookies ignore ports, as browsers do), redirects
/// followed by hand, forms submitted as a person would.
struct Browser {
    http: reqwest::Client,
    jar: HashMap<String, String>,
}

impl Browser {
    fn new() -> Browser {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        Browser { http, jar: HashMap::new() }
    }

    fn cookies(&self) -> String {
        self.jar.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ")
    }

    fn keep(&mut self, r: &reqwest::Response) {
        for c in r.headers().get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()) {
            let pair = c.split(';').next().unwrap_or_default();
            if let Some((k, v)) = pair.split_once('=') {
                let expired = c.to_ascii_lowercase().contains("max-age=0")
                    || c.to_ascii_lowercase().contains("expires=thu, 01 jan 1970");
                if v.is_empty() || expired {
                    self.jar.remove(k.trim());
                } else {
                    self.jar.insert(k.trim().to_owned(), v.to_owned());
                }
            }
        }
    }

    async fn send(&mut self, req: reqwest::RequestBuilder) -> reqwest::Response {
        let r = req.header("cookie", self.cookies()).send().await.expect("request");
        self.keep(&r);
        r
    }

    /// Follows redirects from `r` and submits the IdP's login and consent forms, until a page
    /// of `stop_at` (an origin) that is not a redirect: its status, URL and body.
    async fn walk(
        &mut self,
        mut r: reqwest::Response,
        login: &str,
        stop_at: &str,
    ) -> (u16, String, String) {
        let mut url = r.url().to_string();
        for _ in 0..20 {
            if r.status().is_redirection() {
                let location = r.headers()["location"].to_str().expect("ascii").to_owned();
                url =
                    url::Url::parse(&url).expect("url").join(&location).expect("join").to_string();
                r = self.send(self.http.get(&url)).await;
                continue;
            }
            let status = r.status().as_u16();
            let body = r.text().await.expect("body");
            if url.starts_with(stop_at) {
                return (status, url, body);
            }
            // A page of the IdP: its one form, filled in.
            let action = body
                .split("action=\"")
                .nth(1)
                .and_then(|a| a.split('"').next())
                .unwrap_or_else(|| panic!("no form at {url}: {body}"))
                .replace("&amp;", "&");
            let mut fields: Vec<(String, String)> = body
                .split("<input")
                .skip(1)
                .filter_map(|i| {
                    let name = i.split("name=\"").nth(1)?.split('"').next()?.to_owned();
                    let value = i
                        .split("value=\"")
                        .nth(1)
                        .and_then(|v| v.split('"').next())
                        .unwrap_or("")
                        .to_owned();
                    Some((name, value))
                })
                .collect();
            for (k, v) in fields.iter_mut() {
                match k.as_str() {
                    "login" => *v = login.to_owned(),
                    "password" => *v = "any password".into(),
                    _ => {}
                }
            }
            if body.contains("name=\"logout\"") {
                fields.push(("logout".into(), "yes".into()));
            }
            let target =
                url::Url::parse(&url).expect("url").join(&action).expect("join").to_string();
            r = self.send(self.http.post(&target).form(&fields)).await;
            url = target;
        }
        panic!("too many steps at {url}");
    }
}

/// Signs in as `login` (work email, given to Gatehouse) typing `account` at the IdP's form.
async fn sign_in(
    stack: &Stack,
    browser: &mut Browser,
    login: &str,
    account: &str,
) -> (u16, String, String) {
    let start = browser
        .send(
            browser
                .http
                .post(format!("{}/sso/start", stack.control_url))
                .form(&[("who", login), ("next", "/approvals")]),
        )
        .await;
    assert_eq!(start.status(), 303, "{:?}", start.text().await);
    let first =
        browser.send(browser.http.get(start.headers()["location"].to_str().expect("ascii"))).await;
    browser.walk(first, account, &stack.control_url).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_sign_in_through_a_real_openid_provider_and_its_logout_ends_the_session() {
    let mut opts = Options::for_test("sso", 1);
    opts.control_args = vec!["--dev-mode".into()];
    let stack = Stack::start(opts).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let (_idp, issuer) = start_idp(&stack);
    e2e::wait_ready(
        &format!("{issuer}/.well-known/openid-configuration"),
        std::time::Duration::from_secs(20),
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {}",
            std::fs::read_to_string(stack.run_dir.join("oidc-provider.log")).unwrap_or_default()
        )
    });
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let set = stack
        .ctl(&[
            "tenant",
            "idp",
            "set",
            "--tenant",
            &slug,
            "--issuer",
            &issuer,
            "--client-id",
            CLIENT_ID,
            "--client-secret",
            CLIENT_SECRET,
            "--email-domain",
            "northwind.example",
            "--allow-join",
            "off",
            "--sso-required",
            "on",
            "--id-jag",
            "off",
            "--dev-mode",
        ])
        .expect("idp set");
    assert_eq!(set["idp"]["token_auth_method"], "client_secret_basic");
    // A member signs in at the IdP and lands in the console, linked by subject.
    let mut browser = Browser::new();
    let (status, url, body) =
        sign_in(&stack, &mut browser, "dispatch@northwind.example", "okta-00u1dispatch").await;
    assert_eq!(status, 200, "{url}: {body}\n{}", stack.log("control-plane"));
    assert!(url.ends_with("/approvals"), "{url}");
    assert_eq!(db.rows("person_identities").eq("subject", "okta-00u1dispatch").count().await, 1);
    assert_eq!(db.rows("console_sessions").not_null("idp_sid").count().await, 1);
    // Password sign-in is off for the tenant.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let login = http.get(format!("{}/login", stack.control_url)).send().await.expect("login");
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .split(';')
        .next()
        .expect("c")
        .to_owned();
    let html = login.text().await.expect("html");
    assert!(html.contains("Continue with single sign-on"));
    let token =
        html.split("name=\"login_csrf\" value=\"").nth(1).expect("t").split('"').next().expect("t");
    let dispatcher = stack.tenant(0)["dispatcher"].clone();
    let refused = http
        .post(format!("{}/login", stack.control_url))
        .header("cookie", cookie)
        .form(&[
            ("email", dispatcher["email"].as_str().expect("e")),
            ("password", dispatcher["password"].as_str().expect("p")),
            ("login_csrf", token),
            ("next", "/"),
        ])
        .send()
        .await
        .expect("post");
    assert_eq!(refused.status(), 401);
    assert!(refused.text().await.expect("html").contains("requires single sign-on"));
    // A person whose email the IdP has not verified is not linked.
    let mut other = Browser::new();
    let (status, _, body) =
        sign_in(&stack, &mut other, "unverified@northwind.example", "okta-00u2unverified").await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("verified"), "{body}");
    assert_eq!(db.count("person_identities").await, 1);
    // Signing out at the IdP sends a back-channel logout: the console session ends.
    let end = browser.send(browser.http.get(format!("{issuer}/session/end"))).await;
    let (_, _, _) = browser.walk(end, "", &format!("{issuer}/session/end/success")).await;
    let mut ended = false;
    for _ in 0..50 {
        if db.rows("console_sessions").not_null("idp_sid").count().await == 0 {
            ended = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        ended,
        "the IdP's logout ended the session\n{}\n{}",
        std::fs::read_to_string(stack.run_dir.join("oidc-provider.log")).unwrap_or_default(),
        stack.log("control-plane")
    );
    let after = browser.send(browser.http.get(format!("{}/approvals", stack.control_url))).await;
    assert_eq!(after.status(), 303, "signed out");
}

/// The IdP of the ID-JAG test: the test's own key, published as the issuer's key set.
async fn serve_key_set(jwk: Value) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let issuer = format!("http://{}/idp", listener.local_addr().expect("addr"));
    let discovery = json!({
        "issuer": issuer,
        "authorization_endpoint": format!("{issuer}/authorize"),
        "token_endpoint": format!("{issuer}/token"),
        "jwks_uri": format!("{issuer}/jwks"),
    });
    let keys = json!({"keys": [jwk]});
    let app = axum::Router::new()
        .route(
            "/idp/.well-known/openid-configuration",
            axum::routing::get(move || async move { axum::Json(discovery) }),
        )
        .route("/idp/jwks", axum::routing::get(move || async move { axum::Json(keys) }));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    issuer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_trades_an_id_jag_for_a_token_and_calls_tools_through_the_load_balancer() {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
        .expect("pair");
    let point = pair.public_key().as_ref().to_vec();
    let jwk = json!({"kty": "EC", "kid": "idp-e2e", "alg": "ES256", "use": "sig", "crv": "P-256",
        "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65])});
    let idp = serve_key_set(jwk).await;
    let mut opts = Options::for_test("idjag", 2);
    opts.control_args = vec!["--dev-mode".into()];
    let stack = Stack::start(opts).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    stack
        .ctl(&[
            "tenant",
            "idp",
            "set",
            "--tenant",
            &slug,
            "--issuer",
            &idp,
            "--client-id",
            "unused-for-id-jag",
            "--client-secret",
            "unused-secret",
            "--email-domain",
            "northwind.example",
            "--allow-join",
            "off",
            "--sso-required",
            "off",
            "--id-jag",
            "on",
            "--dev-mode",
        ])
        .expect("idp set");
    let client = stack
        .ctl(&["tenant", "idp", "client-add", "--tenant", &slug, "--name", "Acme agents"])
        .expect("client");
    // The dispatcher signed in through the IdP once before (their subject is linked).
    let dispatcher = stack.tenant(0)["dispatcher"]["email"].as_str().expect("email").to_owned();
    db.link_idp_subject(&idp, "sub-dispatch", &dispatcher, &slug).await;
    let out = Command::new(e2e::python())
        .arg(e2e::repo_root().join("e2e/py/id_jag_check.py"))
        .args(["--url", &format!("{}/mcp", stack.lb_url), "--issuer", &stack.control_url])
        .args(["--client-id", client["client_id"].as_str().expect("id")])
        .args(["--client-secret", client["client_secret"].as_str().expect("secret")])
        .args([
            "--idp-issuer",
            &idp,
            "--idp-key-der-b64",
            &STANDARD.encode(pkcs8.as_ref()),
            "--kid",
            "idp-e2e",
        ])
        .args(["--sub", "sub-dispatch", "--scope", "bookings:read technicians:read"])
        .output()
        .expect("the .venv's python (scripts/test makes it)");
    assert!(
        out.status.success(),
        "{}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        stack.log("control-plane"),
        stack.log("worker-1")
    );
    let seen: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        seen["tools"].as_array().expect("tools").iter().any(|t| t == "find_bookings"),
        "{seen}"
    );
    assert_eq!(seen["found"], 3, "{seen}");
    assert_eq!(seen["minted"][0]["aud"], json!(stack.control_url), "aud = our issuer");
    assert_eq!(seen["minted"][0]["resource"], json!(format!("{}/mcp", stack.lb_url)));
    let scope: BTreeSet<&str> = seen["scope"].as_str().expect("scope").split(' ').collect();
    assert_eq!(scope, BTreeSet::from(["bookings:read", "technicians:read"]), "{seen}");
    assert!(seen["refresh_token"].is_null(), "{seen}");
    assert!(seen["write_refused"] != json!(false), "a write beyond the granted rights: {seen}");
    assert_eq!(
        seen["workers"].as_array().expect("workers").len(),
        2,
        "both workers served it: {seen}"
    );
    assert_eq!(db.rows("connections").eq("granted_by", "idp").count().await, 1);
    // The first grant, and the SDK's step-up attempt for the write (the same rights again).
    assert!(db.audited("connection.id_jag").await >= 1);
    let listed = stack.ctl(&["connection", "list", "--tenant", &slug]).expect("list");
    assert!(
        listed["connections"].as_array().expect("list").iter().any(|c| c["granted_by"] == "idp"),
        "{listed}"
    );
}
