//! The harness every module shares: the control plane on a database cloned per test and seeded
//! with the demo (STYLE 6), `gatehousectl` as the real binary, and a browser that keeps its
//! cookies for the console and the OAuth pages.

pub(crate) use std::sync::Arc;

pub(crate) use control_plane::{AppState, Metrics, app};
pub(crate) use serde_json::{Value, json};
pub(crate) use shared::services::demo;
pub(crate) use shared::testing::TestDb;

pub(crate) struct Api {
    pub(crate) _db: TestDb,
    pub(crate) url: String,
    pub(crate) seed: demo::DemoSeed,
    pub(crate) http: reqwest::Client,
    /// The running control plane's state (its jobs can be started on it).
    pub(crate) state: Arc<AppState>,
}

impl Api {
    pub(crate) async fn start() -> Api {
        Api::start_with(Default::default()).await
    }

    /// With a fetch policy for client documents (development's lets loopback through).
    pub(crate) async fn start_with(fetch: shared::services::oauth::FetchPolicy) -> Api {
        let db = TestDb::new().await;
        let seed = demo::seed(&db.ds, None, "").await.expect("seed");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(AppState {
            ds: db.ds.clone(),
            public_url: url.clone(),
            metrics: Metrics::new(),
            mcp_resources: vec!["http://127.0.0.1:9/mcp".into()],
            fetch,
            trust_forwarded_for: true,
            passkeys: shared::services::passkeys::RelyingParty::new(&url).expect("relying party"),
            jobs: Default::default(),
            audit_checkpoint_secs: 60,
            audit_seen: Default::default(),
        });
        let served = state.clone();
        tokio::spawn(async move {
            axum::serve(
                listener,
                app(served).into_make_service_with_connect_info::<std::net::SocketAddr>(),
            )
            .await
            .expect("serve")
        });
        Api { _db: db, url, seed, http: reqwest::Client::new(), state }
    }

    pub(crate) async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        let mut request = self.http.get(format!("{}{path}", self.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

/// The platform operator the CLI tests act as.
pub(crate) const OPS: &str = "ops@platform.example";

/// `gatehousectl` run by the operator `OPS`.
pub(crate) fn ctl(db: &TestDb, args: &[&str]) -> (bool, Value) {
    ctl_as(db, Some(OPS), args)
}

pub(crate) fn ctl_as(db: &TestDb, operator: Option<&str>, args: &[&str]) -> (bool, Value) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_gatehousectl"));
    command
        .args(args)
        .arg("--json")
        .env("DATABASE_URL", &db.url)
        .env("GATEHOUSE_SECRET_KEYS", shared::testing::TEST_SECRET_KEYS)
        .env("GATEHOUSE_AUDIT_SIGNING_KEYS", shared::testing::TEST_AUDIT_KEYS)
        .env_remove("GATEHOUSE_OPERATOR");
    if let Some(email) = operator {
        command.env("GATEHOUSE_OPERATOR", email);
    }
    let out = command.output().expect("run gatehousectl");
    let value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(&out.stdout)}));
    (out.status.success(), value)
}

/// What a browser gets from the sign-in page: the CSRF cookie and the form's token.
pub(crate) async fn login_form(http: &reqwest::Client, base: &str) -> (String, String) {
    let page = http.get(format!("{base}/login")).send().await.expect("login page");
    let cookie = page.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .split(';')
        .next()
        .expect("pair")
        .to_owned();
    let html = page.text().await.expect("html");
    let token = html
        .split("name=\"login_csrf\" value=\"")
        .nth(1)
        .expect("token")
        .split('"')
        .next()
        .expect("end")
        .to_owned();
    (cookie, token)
}

/// Posts the sign-in form as a browser would, from `source`.
pub(crate) async fn post_login(
    http: &reqwest::Client,
    base: &str,
    source: &str,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    let (cookie, token) = login_form(http, base).await;
    let mut form: Vec<(&str, &str)> = fields.to_vec();
    form.push(("login_csrf", &token));
    http.post(format!("{base}/login"))
        .header("cookie", cookie)
        .header("x-forwarded-for", source)
        .form(&form)
        .send()
        .await
        .expect("login")
}

/// A browser of the console: one session cookie, no redirects followed.
pub(crate) struct Browser {
    pub(crate) http: reqwest::Client,
    pub(crate) base: String,
    pub(crate) cookie: String,
}

impl Browser {
    pub(crate) async fn sign_in(api: &Api, email: &str, password: &str) -> Browser {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        let response = post_login(
            &http,
            &api.url,
            "192.0.2.1",
            &[("email", email), ("password", password), ("next", "/")],
        )
        .await;
        assert_eq!(response.status(), 303, "signed in");
        let cookie = response.headers()["set-cookie"]
            .to_str()
            .expect("ascii")
            .split(';')
            .next()
            .expect("cookie")
            .to_owned();
        Browser { http, base: api.url.clone(), cookie }
    }

    pub(crate) async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .send()
            .await
            .expect("get")
    }

    /// Follows a 303 as a browser does: GET its location with the cookies it set (a notice,
    /// a secret sealed for that page).
    pub(crate) async fn follow(&self, response: reqwest::Response) -> reqwest::Response {
        assert_eq!(response.status(), 303, "a form's answer is a redirect (post/redirect/get)");
        let location = response.headers()["location"].to_str().expect("ascii").to_owned();
        let mut cookies = vec![self.cookie.clone()];
        for set in response.headers().get_all("set-cookie") {
            let pair = set.to_str().expect("ascii").split(';').next().expect("pair").to_owned();
            if !pair.ends_with('=') {
                cookies.push(pair);
            }
        }
        self.http
            .get(format!("{}{location}", self.base))
            .header("cookie", cookies.join("; "))
            .send()
            .await
            .expect("get")
    }

    pub(crate) async fn post(&self, path: &str, form: &[(String, String)]) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .form(form)
            .send()
            .await
            .expect("post")
    }
}

/// The hidden inputs of the form posting to `action`, as a browser submits them.
pub(crate) fn form_fields(html: &str, action: &str) -> Vec<(String, String)> {
    let start = html.find(&format!("action=\"{action}\"")).expect("the form");
    let form = &html[start..start + html[start..].find("</form>").expect("closed")];
    form.split("<input type=\"hidden\" ")
        .skip(1)
        .filter_map(|c| {
            Some((
                c.split("name=\"").nth(1)?.split('"').next()?.to_owned(),
                c.split("value=\"").nth(1)?.split('"').next()?.replace("&amp;", "&"),
            ))
        })
        .collect()
}

pub(crate) async fn register_client(api: &Api) -> String {
    let registered: Value = api
        .http
        .post(format!("{}/oauth/register", api.url))
        .json(&json!({"client_name": "Hostile client", "redirect_uris": ["http://127.0.0.1:47615/callback"]}))
        .send()
        .await
        .expect("register")
        .json()
        .await
        .expect("json");
    registered["client_id"].as_str().expect("client_id").to_owned()
}

pub(crate) fn authorize_path(client_id: &str, extra: &[(&str, &str)]) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    q.extend_pairs([
        ("response_type", "code"),
        ("client_id", client_id),
        ("redirect_uri", "http://127.0.0.1:47615/callback"),
        ("code_challenge", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"),
        ("code_challenge_method", "S256"),
        ("resource", "http://127.0.0.1:9/mcp"),
        ("state", "s1"),
        ("scope", "bookings:read"),
    ]);
    q.extend_pairs(extra.iter().copied());
    format!("/oauth/authorize?{}", q.finish())
}
