//! The audit log in the tenant's SIEM, through faults as a real deployment meets them: a
//! receiver that verifies every Standard Webhooks signature, its endpoint down for a while,
//! and the control plane killed (SIGKILL) mid-delivery and started again. Every event arrives,
//! first arrivals in order, none lost, duplicates only with the same id and body.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

use crate::support::*;

#[derive(Default)]
struct Receiver {
    secret: Mutex<String>,
    down: AtomicBool,
    /// (webhook-id, seq, body) in arrival order.
    got: Mutex<Vec<(String, i64, String)>>,
    bad_signatures: AtomicUsize,
}

async fn receive(
    axum::extract::State(r): axum::extract::State<Arc<Receiver>>,
    headers: axum::http::HeaderMap,
    body: String,
) -> axum::http::StatusCode {
    if r.down.load(Ordering::SeqCst) {
        return axum::http::StatusCode::SERVICE_UNAVAILABLE;
    }
    let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let (id, ts, sigs) = (h("webhook-id"), h("webhook-timestamp"), h("webhook-signature"));
    let secret = r.secret.lock().expect("lock").clone();
    let key = STANDARD.decode(secret.trim_start_matches("whsec_")).expect("secret");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
    let signed = format!("{id}.{ts}.{body}");
    let valid = sigs.split(' ').any(|s| {
        s.strip_prefix("v1,")
            .and_then(|b| STANDARD.decode(b).ok())
            .is_some_and(|sig| ring::hmac::verify(&key, signed.as_bytes(), &sig).is_ok())
    });
    if !valid {
        r.bad_signatures.fetch_add(1, Ordering::SeqCst);
        return axum::http::StatusCode::UNAUTHORIZED;
    }
    let Ok(event) = serde_json::from_str::<Value>(&body) else {
        return axum::http::StatusCode::BAD_REQUEST;
    };
    // Checkpoints (`audit.checkpoint`) come too; the events are what this SIEM counts.
    if event["type"] != "audit.event" {
        return axum::http::StatusCode::NO_CONTENT;
    }
    let seq = event["data"]["row"]["seq"].as_i64().unwrap_or(-1);
    r.got.lock().expect("lock").push((id, seq, body));
    axum::http::StatusCode::NO_CONTENT
}

/// `n` audit rows of booking updates through the API in tenant `slug`, naming `{tag}_1`….
async fn add_events(db: &TestDb, slug: &str, n: usize, tag: &str) {
    let tenant = db.tenant_id(slug).await;
    db.log_audit_events(tenant, "api", "booking.update", (1..=n).map(|i| format!("{tag}_{i}")))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_audit_event_reaches_the_siem_in_order_through_a_down_endpoint_and_a_killed_control_plane()
 {
    let mut opts = Options::for_test("siem", 1);
    opts.control_args = vec!["--dev-mode".into()];
    opts.env.push(("GATEHOUSE_AUDIT_WEBHOOK_MAX_BACKOFF_MS".into(), "400".into()));
    let mut stack = Stack::start(opts).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let receiver = Arc::new(Receiver::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/siem/audit", listener.local_addr().expect("addr"));
    let app = axum::Router::new()
        .route("/siem/audit", axum::routing::post(receive))
        .with_state(receiver.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    let set = stack
        .ctl(&["audit", "webhook", "set", "--tenant", &slug, "--url", &url, "--dev"])
        .expect("webhook");
    let secret = set["secret"].as_str().expect("the secret, shown once").to_owned();
    *receiver.secret.lock().expect("lock") = secret;
    let first_seq = set["webhook"]["delivered_seq"].as_i64().unwrap_or(0);

    // The endpoint is down while the first events are written; then it comes back.
    receiver.down.store(true, Ordering::SeqCst);
    add_events(&db, &slug, 40, "a").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(receiver.got.lock().expect("lock").is_empty(), "nothing taken while it was down");
    receiver.down.store(false, Ordering::SeqCst);
    // Mid-delivery the control plane dies; more events are written; it starts again.
    let started = Instant::now();
    while receiver.got.lock().expect("lock").len() < 5
        && started.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stack.kill_control_plane().expect("kill");
    add_events(&db, &slug, 40, "b").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stack.start_control_plane().expect("restart");

    // Every event written after the webhook was set arrives.
    let expected = db.audited_with_first_target_starting(&slug, &["a_", "b_"]).await;
    assert_eq!(expected, 80);
    let deadline = Instant::now() + Duration::from_secs(90);
    let wanted = |got: &Vec<(String, i64, String)>| {
        got.iter()
            .filter(|(_, _, body)| body.contains("\"a_") || body.contains("\"b_"))
            .map(|(id, _, _)| id.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .len() as i64
    };
    while wanted(&receiver.got.lock().expect("lock")) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let got = receiver.got.lock().expect("lock").clone();
    assert_eq!(wanted(&got), expected, "every event arrived");
    assert_eq!(receiver.bad_signatures.load(Ordering::SeqCst), 0, "every signature verified");
    // First arrivals in chain order, with no gap after the webhook was set.
    let mut seen = std::collections::BTreeMap::new();
    let mut firsts = Vec::new();
    for (id, seq, body) in &got {
        match seen.get(id) {
            Some(earlier) => assert_eq!(earlier, body, "a duplicate is the same event, same id"),
            None => {
                seen.insert(id.clone(), body.clone());
                firsts.push(*seq);
            }
        }
    }
    assert!(firsts.windows(2).all(|w| w[1] == w[0] + 1), "in order, none skipped: {firsts:?}");
    assert!(firsts.first().is_some_and(|s| *s > first_seq), "{firsts:?}");
}

/// The CLI line `scripts/dev` prints (`source .run/env && gatehousectl …`) works as printed:
/// it verifies the untouched demo log as intact with the published PUBLIC keys fetched from
/// the control plane, signs a checkpoint that lands in the anchor file, and verifies against
/// that file; it never needs a signing seed to verify.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_cli_line_verifies_the_demo_log_as_intact_with_public_keys_and_anchors() {
    let stack = Stack::start(Options::for_test("cliline", 1)).await.expect("stack");
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let operator = stack.tenant(0)["admin"]["email"].as_str().expect("email").to_owned();
    let env = stack.run_dir.join("env");
    std::fs::write(&env, stack.cli_env(&operator)).expect("env file");
    let ctl = e2e::bin("gatehousectl").expect("gatehousectl");
    // `run(prefix, cmd)`: `source .run/env && PREFIX gatehousectl CMD --json`.
    let run = |prefix: &str, cmd: &str| {
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("source '{}' && {prefix} '{}' {cmd} --json", env.display(), ctl.display()))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .output()
            .expect("bash");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.success(), v, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // Verifying uses only the published key set: the seed is taken out of its environment.
    let verify = format!("audit verify --tenant {slug}");
    let public_only = "env -u GATEHOUSE_AUDIT_SIGNING_KEYS";
    let (ok, v, err) = run(public_only, &verify);
    assert!(ok, "the demo log verifies as intact: {v} {err}");
    let (ok, out, err) = run("", "audit checkpoint");
    assert!(ok, "{out} {err}");
    let anchors = std::fs::read_to_string(stack.anchor_file()).unwrap_or_default();
    assert!(!anchors.is_empty(), "the checkpoint is in the anchor file");
    let (ok, v, err) =
        run(public_only, &format!("{verify} --anchors \"$GATEHOUSE_AUDIT_ANCHOR_FILE\" --strict"));
    assert!(ok, "{v} {err}");
    assert!(v["verification"]["anchors_checked"].as_u64().is_some_and(|n| n >= 1), "{v}");
    assert!(v["verification"]["checkpoints_checked"].as_u64().is_some_and(|n| n >= 1), "{v}");

    // The documented offline procedure, as an auditor runs it: the console's export, the
    // published keys and the anchor file, nothing else of Gatehouse.
    let mut admin = oauth_flow::Browser::new();
    let password = stack.tenant(0)["admin"]["password"].as_str().expect("password").to_owned();
    admin.sign_in(&stack.control_url, &operator, &password, "/audit").await;
    let export = admin.get(&format!("{}/audit.csv", stack.control_url)).await;
    assert_eq!(export.status(), 200);
    let export = export.text().await.expect("csv");
    let keys = reqwest::get(format!("{}/.well-known/gatehouse-audit-keys", stack.control_url))
        .await
        .expect("keys")
        .text()
        .await
        .expect("keys");
    let dir = stack.run_dir.join("offline");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("keys.json"), &keys).expect("keys file");
    let check = |csv: &str| {
        std::fs::write(dir.join("audit.csv"), csv).expect("csv file");
        let out = std::process::Command::new(e2e::python())
            .arg(e2e::repo_root().join("docs/audit-offline-check.py"))
            .arg(dir.join("audit.csv"))
            .arg(dir.join("keys.json"))
            .arg(stack.anchor_file())
            .arg("--strict")
            .output()
            .expect("python");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (ok, said) = check(&export);
    assert!(ok, "the untouched export is intact: {said}");
    assert!(said.starts_with("chain intact: rows 1 to "), "{said}");
    // Each kind of change an owner of the data could make is named.
    let lines: Vec<&str> = export.lines().collect();
    let chained: Vec<usize> = (1..lines.len()).filter(|&i| lines[i].contains(",\"{\"\"")).collect();
    assert!(chained.len() >= 3, "the demo log is chained: {export}");
    let without = |skip: usize| {
        lines.iter().enumerate().filter(|(i, _)| *i != skip).map(|(_, l)| *l).collect::<Vec<_>>()
    };
    // The action column of a chained row, changed where the reader sees it.
    let mut edited = lines.clone();
    let changed = lines[chained[1]].replacen(",\"", ",\"x", 3);
    edited[chained[1]] = &changed;
    let (ok, said) = check(&edited.join("\r\n"));
    assert!(!ok && said.contains("shown differs"), "{said}");
    // A middle row gone.
    let (ok, said) = check(&without(chained[chained.len() / 2]).join("\r\n"));
    assert!(!ok && said.contains("missing (deleted)"), "{said}");
    // The newest checkpointed row gone with everything after it: the anchor names the tail.
    let anchored = std::fs::read_to_string(stack.anchor_file()).expect("anchors");
    let newest = anchored
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        // The file holds every tenant's checkpoints: this export's tenant's.
        .filter(|c| {
            let tenant = c["tenant"].as_str().unwrap_or("?");
            export.contains(&format!("\"\"tenant\"\":\"\"{tenant}\"\""))
        })
        .filter_map(|c| c["seq"].as_i64())
        .max()
        .expect("a checkpoint");
    let cut: Vec<&str> =
        lines.iter().copied().filter(|l| seq_of(l).is_none_or(|s| s < newest)).collect();
    let (ok, said) = check(&cut.join("\r\n"));
    assert!(!ok && said.contains("tail was deleted"), "{said}");
    // The oldest rows gone, where no checkpoint anchors what remains (retention cuts at one).
    let headless: Vec<&str> =
        lines.iter().copied().filter(|l| seq_of(l).is_none_or(|s| s > 2)).collect();
    let (ok, said) = check(&headless.join("\r\n"));
    assert!(!ok && said.contains("rows 1 to 2 are missing"), "{said}");
}

/// The chain position an export line's canonical form names (`""seq"":N` inside its cell).
fn seq_of(line: &str) -> Option<i64> {
    let at = line.find("\"\"seq\"\":")? + "\"\"seq\"\":".len();
    line[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}
