//! The harness every module shares: a worker on a database cloned per test (STYLE 6), a raw
//! JSON-RPC client that ignores every hint (R1), the result contract it checks on every call
//! (R15–R17), and the ways a test reaches the product: the demo seed, and connections made
//! through the admin service.

pub(crate) use std::io::Write;
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
pub(crate) use std::sync::{Arc, Mutex, OnceLock};

pub(crate) use serde_json::{Value, json};
pub(crate) use shared::services::{admin, demo};
pub(crate) use shared::testing::{Connection, TestDb};
pub(crate) use worker::{AppState, Settings, app, tools::Registry};

pub(crate) const PROTOCOL: &str = "2026-07-28";
pub(crate) const DECOY: &str = "DECOY-SECRET-7f3a";
/// How long the test workers wait for a request's headers (production's default is 10 s).
pub(crate) const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// JSON-RPC ids: every request gets a new one, as a retrying client sends.
pub(crate) static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Every log line the workers of this test binary write, to grep for leaks (R14).
pub(crate) static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

#[derive(Clone)]
pub(crate) struct Capture(Arc<Mutex<Vec<u8>>>);
impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub(crate) fn logs() -> Arc<Mutex<Vec<u8>>> {
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = Capture(buffer.clone());
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "debug,sqlx=warn,rmcp=warn,hyper=warn",
            ))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("one subscriber per test binary");
        buffer
    })
    .clone()
}

pub(crate) struct Stack {
    pub(crate) db: TestDb,
    pub(crate) url: String,
    pub(crate) seed: demo::DemoSeed,
    pub(crate) http: reqwest::Client,
    /// The multi round-trip sealing keys every worker of the stack shares.
    pub(crate) mrtr: Arc<shared::seal::SealKeys>,
    /// The first worker's state (its call counts).
    pub(crate) state: Arc<AppState>,
}

impl Stack {
    pub(crate) async fn start() -> Stack {
        logs();
        let db = TestDb::new().await;
        let seed = demo::seed(&db.ds, None, "").await.expect("demo seed");
        let mrtr = Arc::new(
            shared::seal::SealKeys::parse(&shared::seal::SealKeys::generate("t1")).expect("keys"),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let settings = Settings {
            public_url: url.clone(),
            authorization_server: "http://127.0.0.1:1".into(),
            allowed_hosts: vec!["127.0.0.1".into(), "localhost".into()],
            allowed_origins: vec!["https://console.gatehouse.test".into()],
            worker_id: "test-worker".into(),
            mrtr_keys: Some(mrtr.clone()),
        };
        let state = Arc::new(AppState::new(db.ds.clone(), settings));
        let serving = state.clone();
        tokio::spawn(async move {
            let app = app(serving);
            worker::serve::serve(listener, app, HEADER_READ_TIMEOUT, std::future::pending())
                .await
                .expect("serve")
        });
        // No connection reuse: concurrent calls in a test really run side by side.
        let http = reqwest::Client::builder().pool_max_idle_per_host(0).build().expect("client");
        Stack { db, url, seed, http, mrtr, state }
    }

    pub(crate) fn token(&self, tenant: usize, connection: usize) -> String {
        self.seed.tenants[tenant].connections[connection].token.clone()
    }

    /// A raw 2026-07-28 request; returns status, headers and the JSON body.
    pub(crate) async fn raw(
        &self,
        token: Option<&str>,
        method: &str,
        name: Option<&str>,
        params: Value,
        extra: &[(&str, &str)],
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        self.raw_at(&self.url, token, method, name, params, extra).await
    }

    /// Another worker on the same database, as a second replica behind the load balancer.
    pub(crate) async fn another_worker(&self) -> String {
        self.worker_with_origins(&["https://console.gatehouse.test"]).await
    }

    /// A worker on the same database that accepts these browser origins.
    pub(crate) async fn worker_with_origins(&self, origins: &[&str]) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let settings = Settings {
            public_url: self.url.clone(),
            authorization_server: "http://127.0.0.1:1".into(),
            allowed_hosts: vec!["127.0.0.1".into(), "localhost".into()],
            allowed_origins: origins.iter().map(|o| (*o).to_owned()).collect(),
            worker_id: "test-worker-2".into(),
            mrtr_keys: Some(self.mrtr.clone()),
        };
        let state = Arc::new(AppState::new(self.db.ds.clone(), settings));
        tokio::spawn(async move {
            let app = app(state);
            worker::serve::serve(listener, app, HEADER_READ_TIMEOUT, std::future::pending())
                .await
                .expect("serve")
        });
        url
    }

    pub(crate) async fn raw_at(
        &self,
        base: &str,
        token: Option<&str>,
        method: &str,
        name: Option<&str>,
        params: Value,
        extra: &[(&str, &str)],
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut params = params;
        // A caller may declare capabilities of its own; everything else is the suite's.
        let capabilities = params["_meta"]["io.modelcontextprotocol/clientCapabilities"].clone();
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": PROTOCOL,
            "io.modelcontextprotocol/clientInfo": {"name": "contract-suite", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": if capabilities.is_object() { capabilities } else { json!({}) }
        });
        let mut request = self
            .http
            .post(format!("{base}/mcp"))
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", PROTOCOL)
            .header("Mcp-Method", method)
            .json(&json!({"jsonrpc": "2.0", "id": NEXT_ID.fetch_add(1, Ordering::Relaxed), "method": method, "params": params}));
        if let Some(name) = name {
            request = request.header("Mcp-Name", name);
        }
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        for (k, v) in extra {
            request = request.header(*k, *v);
        }
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.expect("body");
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, headers, body)
    }

    pub(crate) async fn list(&self, token: &str) -> Vec<Value> {
        let (status, _, body) = self.raw(Some(token), "tools/list", None, json!({}), &[]).await;
        assert_eq!(status, 200, "{body}");
        body["result"]["tools"].as_array().expect("tools").clone()
    }

    /// Calls a tool and checks the result contract (R15, R16) on the way.
    pub(crate) async fn call(&self, token: &str, tool: &str, args: Value) -> Result<Value, Value> {
        self.call_at(&self.url, token, tool, args).await
    }

    /// [`Stack::call`] on the worker at `base`.
    pub(crate) async fn call_at(
        &self,
        base: &str,
        token: &str,
        tool: &str,
        args: Value,
    ) -> Result<Value, Value> {
        let (status, _, body) = self
            .raw_at(
                base,
                Some(token),
                "tools/call",
                Some(tool),
                json!({"name": tool, "arguments": args}),
                &[],
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let result = &body["result"];
        assert!(result.is_object(), "not a tool result: {body}");
        let schema = self.output_schema(token, tool).await;
        check_contract(tool, result, &schema)
    }

    pub(crate) async fn output_schema(&self, token: &str, tool: &str) -> Value {
        self.list(token)
            .await
            .into_iter()
            .find(|t| t["name"] == tool)
            .map(|t| t["outputSchema"].clone())
            .unwrap_or_else(|| {
                Registry::new()
                    .get(tool)
                    .map(|t| {
                        Value::Object((*t.tool.output_schema.clone().expect("schema")).clone())
                    })
                    .expect("known tool")
            })
    }
}

/// R16: text and structuredContent carry the same JSON, which validates against the tool's
/// outputSchema; R15: errors start with `Error:` and end with a parseable JSON line.
pub(crate) fn check_contract(tool: &str, result: &Value, schema: &Value) -> Result<Value, Value> {
    let structured = result["structuredContent"].clone();
    let text = result["content"][0]["text"].as_str().expect("a text block");
    assert_times_are_full(tool, &structured, "");
    // R13 and R14 for every result of the suite: third-party text only inside its wrapper, and
    // no planted secret anywhere.
    assert_canary_wrapped(&structured, "");
    for form in decoy_forms() {
        assert!(
            !text.contains(&form),
            "{tool}: a planted secret reached a result ({form}): {text}"
        );
    }
    let validator = jsonschema::validator_for(schema).expect("outputSchema compiles");
    let problems: Vec<String> = validator.iter_errors(&structured).map(|e| e.to_string()).collect();
    assert!(
        problems.is_empty(),
        "{tool}: result does not match its outputSchema: {problems:?}\n{structured}"
    );
    if result["isError"] == json!(true) {
        assert!(text.starts_with("Error: "), "{tool}: error text must start with `Error:`: {text}");
        let last = text.lines().last().expect("a last line");
        let detail: Value = serde_json::from_str(last).expect("last line is JSON");
        assert_eq!(detail, structured, "{tool}: the JSON line equals structuredContent");
        Err(structured["error"].clone())
    } else {
        let parsed: Value = serde_json::from_str(text).expect("text is JSON");
        assert_eq!(parsed, structured, "{tool}: text equals structuredContent");
        Ok(structured)
    }
}

/// The planted secret as text, and as the hex and base64 a byte column would leak as.
pub(crate) fn decoy_forms() -> [String; 3] {
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = &DECOY.as_bytes()[..15];
    let hex: String = DECOY.bytes().map(|b| format!("{b:02x}")).collect();
    let b64: String = bytes
        .chunks(3)
        .flat_map(|c| {
            let n = (u32::from(c[0]) << 16) | (u32::from(c[1]) << 8) | u32::from(c[2]);
            [18, 12, 6, 0].map(|shift| B64[((n >> shift) & 63) as usize] as char)
        })
        .collect();
    [DECOY.to_owned(), hex, b64]
}

/// R17 for every result: a time is an object with weekday, local time, zone, display, UTC and
/// distance from now; a bare time string anywhere else fails.
pub(crate) fn assert_times_are_full(tool: &str, value: &Value, path: &str) {
    const VIEW: [&str; 6] = ["weekday", "local", "zone", "display", "utc", "from_now"];
    match value {
        Value::Object(map) => {
            if map.contains_key("utc") || map.contains_key("from_now") {
                for key in VIEW {
                    assert!(map.contains_key(key), "{tool}: time at {path} lacks `{key}`: {value}");
                }
                return;
            }
            for (k, v) in map {
                // Options are values to send back as arguments, not times to show.
                if path == ".error" && k == "options" {
                    continue;
                }
                assert_times_are_full(tool, v, &format!("{path}.{k}"));
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                assert_times_are_full(tool, v, &format!("{path}[{i}]"));
            }
        }
        Value::String(s) => {
            assert!(
                !looks_like_a_time(s),
                "{tool}: bare time {s:?} at {path}; present it as a time view"
            );
        }
        _ => {}
    }
}

/// An ISO 8601 date-time (`2026-12-01T09:00…`) or a display time (`Tue 1 Dec 2026, 09:00 CET`).
pub(crate) fn looks_like_a_time(s: &str) -> bool {
    let b = s.as_bytes();
    let iso = b.len() >= 16
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[7] == b'-'
        && (b[10] == b'T' || b[10] == b' ')
        && b[13] == b':';
    let display =
        ["Mon ", "Tue ", "Wed ", "Thu ", "Fri ", "Sat ", "Sun "].iter().any(|d| s.starts_with(d))
            && s.len() < 40
            && s.contains(", ")
            && s.contains(':');
    iso || display
}

/// What a read-only connection sees.
pub(crate) const READ_ONLY_TOOLS: [&str; 8] = [
    "export_bookings",
    "find_bookings",
    "find_customers",
    "find_services",
    "find_technicians",
    "get_booking",
    "get_customer",
    "list_recent_changes",
];

/// Every tool, with its effect class.
pub(crate) const ALL_TOOLS: [(&str, &str); 24] = [
    ("add_booking_note", "silent_write"),
    ("cancel_bookings", "notify"),
    ("confirm_action", "notify"),
    ("confirm_booking", "notify"),
    ("create_booking", "silent_write"),
    ("create_customer", "silent_write"),
    ("delete_booking", "delete"),
    ("delete_customer", "delete"),
    ("export_bookings", "read"),
    ("find_alert_rules", "read"),
    ("find_bookings", "read"),
    ("find_customers", "read"),
    ("find_services", "read"),
    ("find_technicians", "read"),
    ("get_booking", "read"),
    ("get_customer", "read"),
    ("list_recent_changes", "read"),
    ("mute_alerts", "alert"),
    ("page_technician", "wake"),
    ("reject_action", "silent_write"),
    ("reschedule_booking", "notify"),
    ("send_customer_message", "notify"),
    ("update_booking", "silent_write"),
    ("update_customer", "silent_write"),
];

/// Some handle of each kind in tenant `t`, found through the tools themselves.
pub(crate) async fn handles(stack: &Stack, t: usize) -> (String, String, String) {
    let token = stack.token(t, 0);
    let bookings =
        stack.call(&token, "find_bookings", json!({"limit": 100})).await.expect("find_bookings");
    // A search lists summaries; the customer's note is get_booking's.
    let mut with_notes = None;
    for b in bookings["bookings"].as_array().expect("list") {
        let full = stack
            .call(&token, "get_booking", json!({"booking": b["booking"]}))
            .await
            .expect("get_booking");
        if full["customer_note"].is_object() {
            with_notes = Some(full);
            break;
        }
    }
    let with_notes = with_notes.expect("a booking with a note");
    let booking = with_notes["booking"].as_str().expect("handle").to_owned();
    let customer = with_notes["customer"]["customer"].as_str().expect("handle").to_owned();
    let techs = stack.call(&token, "find_technicians", json!({})).await.expect("find_technicians");
    let technician = techs["technicians"][0]["technician"].as_str().expect("handle").to_owned();
    (booking, customer, technician)
}

/// What a second session holds before the test acts.
#[derive(Clone, Copy)]
pub(crate) enum HeldLock {
    /// A lock of this mode (`AccessExclusiveLock`) on this table.
    Table(&'static str, &'static str),
    /// Its transaction's id: it has written in the transaction it keeps open.
    Written,
}

/// A second session (psql) holding a transaction open, as a migration or another process
/// would, while the test acts.
pub(crate) struct Held {
    pub(crate) psql: tokio::process::Child,
    pub(crate) sql: Option<tokio::process::ChildStdin>,
}

impl Held {
    /// Sends `sql` and waits until this database shows psql holding `lock`.
    pub(crate) async fn open(stack: &Stack, sql: &str, lock: HeldLock) -> Held {
        let mut psql = tokio::process::Command::new("psql")
            .args([stack.db.url.as_str(), "-q", "-v", "ON_ERROR_STOP=1"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("psql");
        let sql_in = psql.stdin.take();
        let mut held = Held { psql, sql: sql_in };
        held.send(sql).await;
        // The test is about what happens while psql holds it: wait until it does (at most 30 s
        // on a slow machine), never go on without it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let holds = match lock {
                HeldLock::Table(table, mode) => stack.db.psql_holds_table_lock(table, mode).await,
                HeldLock::Written => stack.db.psql_has_written().await,
            };
            if holds {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "psql never took what it was sent");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        held
    }

    pub(crate) async fn send(&mut self, sql: &str) {
        use tokio::io::AsyncWriteExt;
        let stdin = self.sql.as_mut().expect("psql's input is open");
        stdin.write_all(format!("{sql}\n").as_bytes()).await.expect("to psql");
        stdin.flush().await.expect("flush");
    }

    /// Sends `sql` (the transaction's end), closes the session and waits for psql to exit.
    pub(crate) async fn end(mut self, sql: &str) {
        if !sql.is_empty() {
            self.send(sql).await;
        }
        drop(self.sql.take());
        self.psql.wait().await.expect("psql ends");
    }
}

/// Walks a result; every string holding the canary must be an `untrusted_text` value.
pub(crate) fn assert_canary_wrapped(value: &Value, path: &str) -> usize {
    match value {
        Value::String(s) if s.contains("IGNORE ALL PREVIOUS INSTRUCTIONS") => {
            assert!(path.ends_with(".untrusted_text"), "canary outside untrusted_text at {path}");
            1
        }
        Value::Object(map) => {
            map.iter().map(|(k, v)| assert_canary_wrapped(v, &format!("{path}.{k}"))).sum()
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| assert_canary_wrapped(v, &format!("{path}[{i}]")))
            .sum(),
        _ => 0,
    }
}

impl Stack {
    /// Tenant `t` as the platform operator the demo seed made (tenant 0's admin) works in it.
    pub(crate) async fn operator_in(&self, t: usize) -> shared::OpCtx {
        let operator = &self.seed.tenants[0].admin.email;
        shared::testing::operator_in(&self.db.ds, operator, &self.seed.tenants[t].slug).await
    }

    /// The context a call with `token` runs in, read as the worker reads it (no read-ahead).
    pub(crate) async fn connection_ctx(&self, token: &str) -> shared::OpCtx {
        shared::auth::authenticate_mcp(
            &self.db.ds,
            Some(&format!("Bearer {token}")),
            &self.state.settings.mcp_url(),
            jiff::Timestamp::now(),
            None,
        )
        .await
        .expect("database")
        .expect("a live token")
        .ctx
    }

    pub(crate) async fn ok(&self, token: &str, tool: &str, args: Value) -> Value {
        self.call(token, tool, args).await.unwrap_or_else(|e| panic!("{tool} failed: {e}"))
    }

    /// A second connection of tenant 0's admin with every right.
    pub(crate) async fn second_connection(&self) -> String {
        self.admin_connection("second", shared::rights::Role::Admin.rights(), "full").await
    }

    /// A new connection of tenant 0's admin with these rights and toolset; its token.
    pub(crate) async fn admin_connection(
        &self,
        name: &str,
        rights: shared::rights::RightSet,
        toolset: &str,
    ) -> String {
        let ctx = self.operator_in(0).await;
        Connection::new(&self.db.ds, &ctx, &self.seed.tenants[0].admin.email)
            .name(name)
            .rights(rights)
            .toolset(toolset)
            .create()
            .await
            .token
    }

    /// A future draft booking of tenant `t`.
    pub(crate) async fn draft(&self, t: usize) -> Value {
        let found = self
            .ok(&self.token(t, 0), "find_bookings", json!({"status": "draft", "limit": 100}))
            .await;
        found["bookings"]
            .as_array()
            .expect("list")
            .iter()
            .find(|b| b["starts"]["from_now"].as_str().is_some_and(|f| f.starts_with("in ")))
            .cloned()
            .expect("a future draft in the demo")
    }
}

impl Stack {
    /// Turns the platform's kill switch on or off in the database, behind the console's back
    /// (nothing audited, no event sent).
    pub(crate) async fn set_kill_switch(&self, on: bool) {
        self.db.rows("platform_state").set("global_kill", on).await;
    }

    /// Turns tenant `slug`'s agent access on or off in the database, behind the console's back.
    pub(crate) async fn set_agent_access(&self, slug: &str, on: bool) {
        self.db.rows("tenants").eq("slug", slug).set("agent_access", on).await;
    }

    pub(crate) async fn connection_with(&self, toolset: &str) -> String {
        self.admin_connection(toolset, shared::rights::Role::Admin.rights(), toolset).await
    }
}

/// Waits, when the minute is nearly over, for the next one: the buckets count in calendar
/// minutes, and a test that fills one must make its calls within the same minute (the
/// database's clock for write classes, the worker's for reads; both are this machine's).
pub(crate) async fn early_in_a_minute() {
    let second = jiff::Timestamp::now().as_second().rem_euclid(60);
    if second >= 40 {
        tokio::time::sleep(std::time::Duration::from_secs((61 - second) as u64)).await;
    }
}
