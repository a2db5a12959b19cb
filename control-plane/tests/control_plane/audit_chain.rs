//! The tamper-evident audit log: `gatehousectl audit verify` passes on an untouched chain and
//! names each kind of tampering; the SIEM webhook delivers every event, in order, signed as
//! Standard Webhooks specify, through a dead endpoint and a dispatcher killed mid-delivery.

use std::sync::Mutex;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use shared::services::audit;

use crate::support::*;

pub(crate) async fn chained_tenant() -> (Api, String, i64) {
    let api =
        Api::start_with(shared::services::oauth::FetchPolicy { dev: true, ..Default::default() })
            .await;
    let slug = api.seed.tenants[0].slug.clone();
    let tenant = api._db.tenant_id(&slug).await;
    api._db
        .log_audit_events(tenant, "mcp", "add_booking_note", (1..=12).map(|i| format!("bkg_{i}")))
        .await;
    (api, slug, tenant)
}

/// `gatehousectl` as the platform's operator (the demo's first admin).
pub(crate) fn run(api: &Api, args: &[&str]) -> (bool, Value) {
    ctl_as(&api._db, Some(&api.seed.tenants[0].admin.email), args)
}

/// The published key set of the control plane under test.
pub(crate) fn keys_url(api: &Api) -> String {
    format!("{}/.well-known/gatehouse-audit-keys", api.url)
}

/// The published key set, in a file (the CLI runs while this test's runtime, which serves
/// the control plane, waits for it; e2e fetches the set from its URL).
pub(crate) fn keys_file(api: &Api) -> String {
    let set = json!({"alg": "Ed25519", "keys": audit::public_keys(&api._db.ds)});
    let path = std::env::temp_dir()
        .join(format!("gatehouse-keys-{}.json", api._db.url.rsplit('/').next().unwrap_or("db")));
    std::fs::write(&path, set.to_string()).expect("write the key set");
    path.to_string_lossy().into_owned()
}

/// `audit verify` with the published public keys, and the extra arguments.
pub(crate) fn verify_with(api: &Api, slug: &str, extra: &[&str]) -> (bool, Value) {
    let keys = keys_file(api);
    let mut args = vec!["audit", "verify", "--tenant", slug, "--keys", &keys];
    args.extend_from_slice(extra);
    run(api, &args)
}

fn verify(api: &Api, slug: &str) -> (bool, Value) {
    verify_with(api, slug, &[])
}

#[tokio::test]
async fn audit_verify_passes_untouched_and_names_every_kind_of_tampering() {
    let (api, slug, t) = chained_tenant().await;
    let db = &api._db;
    let (ok, out) = run(&api, &["audit", "checkpoint"]);
    assert!(ok, "{out}");
    let (ok, v) = verify(&api, &slug);
    assert!(ok, "{v}");
    let rows = v["verification"]["rows_checked"].as_i64().expect("rows");
    assert!(rows >= 12, "{v}");
    assert_eq!(v["verification"]["checkpoints_checked"], 1, "{v}");
    // The product cannot edit or delete the log, nor can a stray statement.
    // Raw SQL on purpose: the database itself must refuse each of these statements.
    for sql in [
        format!("UPDATE audit_log SET reason = 'x' WHERE tenant_id = {t}"),
        format!("DELETE FROM audit_log WHERE tenant_id = {t}"),
        "TRUNCATE audit_log".to_owned(),
        format!("DELETE FROM audit_chain WHERE tenant_id = {t}"),
    ] {
        let err = db.exec_err(&sql).await;
        assert!(err.is_some_and(|e| e.contains("append-only")), "{sql}");
    }
    let kind = |v: &Value| {
        (v["verification"]["problem"]["kind"].clone(), v["verification"]["problem"]["seq"].clone())
    };

    // Edited: a reason changed behind the product's back (as a superuser could).
    let fifth = db.audit_id_at(t, 5).await;
    db.rewrite_audit_row(fifth, "reason", Some("nothing happened")).await;
    let (ok, v) = verify(&api, &slug);
    assert!(!ok, "{v}");
    assert_eq!(kind(&v), (json!("edited"), json!(5)), "{v}");
    db.rewrite_audit_row(fifth, "reason", None).await;
    assert!(verify(&api, &slug).0);

    // Edited: what a settings change changed, rewritten, or planted on a row that had none.
    let sixth = db.audit_id_at(t, 6).await;
    db.rewrite_audit_row(sixth, "change", Some(r#"{"role": {"from": "viewer", "to": "admin"}}"#))
        .await;
    let (ok, v) = verify(&api, &slug);
    assert!(!ok, "{v}");
    assert_eq!(kind(&v), (json!("edited"), json!(6)), "a planted change is an edit: {v}");
    db.rewrite_audit_row(sixth, "change", None).await;
    assert!(verify(&api, &slug).0, "rows without a change verify as before");

    // Edited: a policy decision planted on a row that had none (the chain hashes it).
    db.rewrite_audit_row(sixth, "policy", Some(r#"{"version": 1, "decided_by": []}"#)).await;
    let (ok, v) = verify(&api, &slug);
    assert!(!ok, "{v}");
    assert_eq!(kind(&v), (json!("edited"), json!(6)), "a planted policy is an edit: {v}");
    db.rewrite_audit_row(sixth, "policy", None).await;
    assert!(verify(&api, &slug).0, "rows without a policy verify as before");

    // Reordered: two rows swapped in the chain.
    db.swap_audit_chain_links(t, 3, 4).await;
    let (ok, v) = verify(&api, &slug);
    assert!(!ok);
    assert_eq!(kind(&v), (json!("reordered"), json!(3)), "{v}");
    db.swap_audit_chain_links(t, 3, 4).await;
    assert!(verify(&api, &slug).0);

    // Inserted: a forged row written with the chain's trigger off.
    db.forge_backdated_audit_row(t, "person.create").await;
    let (ok, v) = verify(&api, &slug);
    assert!(!ok);
    assert_eq!(v["verification"]["problem"]["kind"], "inserted", "{v}");
    db.remove_backdated_audit_rows(t, "person.create").await;
    assert!(verify(&api, &slug).0);

    // Deleted: a row and its link gone.
    db.delete_audit_row_and_link(t, 7).await;
    let (ok, v) = verify(&api, &slug);
    assert!(!ok);
    assert_eq!(kind(&v), (json!("deleted"), json!(8)), "{v}");
}

/// A SIEM: verifies every Standard Webhooks signature and records what arrived.
#[derive(Default)]
pub(crate) struct Receiver {
    pub(crate) secret: Mutex<String>,
    pub(crate) down: std::sync::atomic::AtomicBool,
    /// Seconds to wait before answering (a slow SIEM).
    pub(crate) delay_secs: std::sync::atomic::AtomicU64,
    /// (webhook-id, seq, body) of `audit.event`s in arrival order.
    pub(crate) got: Mutex<Vec<(String, i64, String)>>,
    /// Every other body (`audit.checkpoint`, `audit.alert`), in arrival order.
    pub(crate) other: Mutex<Vec<Value>>,
    pub(crate) bad_signatures: std::sync::atomic::AtomicUsize,
}

impl Receiver {
    /// Serves on loopback; returns the receiver and its URL.
    pub(crate) async fn start() -> (Arc<Receiver>, String) {
        let receiver = Arc::new(Receiver::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/siem/audit", listener.local_addr().expect("addr"));
        let app = axum::Router::new()
            .route("/siem/audit", axum::routing::post(receive))
            .with_state(receiver.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        (receiver, url)
    }

    /// The checkpoints received, as a SIEM would keep them (JSON lines of their events).
    pub(crate) fn checkpoint_lines(&self) -> String {
        self.other
            .lock()
            .expect("lock")
            .iter()
            .filter(|e| e["type"] == "audit.checkpoint")
            .map(|e| format!("{e}\n"))
            .collect()
    }
}

async fn receive(
    axum::extract::State(r): axum::extract::State<Arc<Receiver>>,
    headers: axum::http::HeaderMap,
    body: String,
) -> axum::http::StatusCode {
    let delay = r.delay_secs.load(std::sync::atomic::Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(std::time::Duration::from_secs(delay)).await;
    }
    if r.down.load(std::sync::atomic::Ordering::SeqCst) {
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
        r.bad_signatures.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        return axum::http::StatusCode::UNAUTHORIZED;
    }
    let event: Value = serde_json::from_str(&body).expect("json");
    if event["type"] != "audit.event" && event["type"] != "audit.gap" {
        r.other.lock().expect("lock").push(event);
        return axum::http::StatusCode::NO_CONTENT;
    }
    let seq = event["data"]["row"]["seq"].as_i64().or(event["data"]["seq"].as_i64()).expect("seq");
    assert_eq!(event["data"]["id"], id.as_str());
    r.got.lock().expect("lock").push((id, seq, body));
    axum::http::StatusCode::NO_CONTENT
}

#[tokio::test]
async fn the_siem_webhook_gets_every_event_in_order_signed_through_a_dead_endpoint_and_a_killed_dispatcher()
 {
    let (api, slug, t) = chained_tenant().await;
    let ds = api._db.ds.clone();
    let (receiver, url) = Receiver::start().await;

    // Without --dev the guard refuses a loopback URL, as it does for client metadata documents.
    let (ok, err) = run(&api, &["audit", "webhook", "set", "--tenant", &slug, "--url", &url]);
    assert!(!ok, "{err}");
    audit::chain_round(&ds).await.expect("chain");
    let (ok, set) =
        run(&api, &["audit", "webhook", "set", "--tenant", &slug, "--url", &url, "--dev"]);
    assert!(ok, "{set}");
    let secret = set["secret"].as_str().expect("secret shown once").to_owned();
    assert!(secret.starts_with("whsec_"));
    *receiver.secret.lock().expect("lock") = secret;
    let (_, shown) = run(&api, &["audit", "webhook", "show", "--tenant", &slug]);
    assert!(!shown.to_string().contains("whsec_"), "never shown again: {shown}");

    // 40 events after the webhook was set (its own audit row among them).
    api._db
        .log_audit_events(t, "api", "booking.update", (1..=40).map(|i| format!("bkg_{i}")))
        .await;
    audit::chain_round(&ds).await.expect("chain");
    let fetch = shared::services::oauth::FetchPolicy { dev: true, ..Default::default() };
    let policy =
        audit::WebhookPolicy { max_backoff_ms: 50, batch: 10, lease_secs: 1, ..Default::default() };

    // The endpoint is down for a while: attempts fail, back off, nothing is lost.
    receiver.down.store(true, std::sync::atomic::Ordering::SeqCst);
    for _ in 0..3 {
        let done = audit::deliver_round(&ds, &fetch, policy).await.expect("round");
        assert_eq!(done.sent, 0);
        tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    }
    let (_, shown) = run(&api, &["audit", "webhook", "show", "--tenant", &slug]);
    assert!(shown["webhook"]["last_error"].as_str().is_some_and(|e| e.contains("503")), "{shown}");
    assert!(shown["webhook"]["backlog"].as_i64().expect("backlog") >= 41, "{shown}");
    receiver.down.store(false, std::sync::atomic::Ordering::SeqCst);

    // The dispatcher dies mid-round: its lease lapses, and another round goes on from the last
    // event the endpoint took (one may come again, with the same id and body).
    let slow = {
        let (ds, fetch) = (ds.clone(), fetch.clone());
        tokio::spawn(async move { audit::deliver_round(&ds, &fetch, policy).await })
    };
    while receiver.got.lock().expect("lock").len() < 4 {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    slow.abort();
    let _ = slow.await;
    let head = api._db.rows("audit_chain_heads").eq("tenant_id", t).int("seq").await;
    for _ in 0..400 {
        audit::deliver_round(&ds, &fetch, policy).await.expect("round");
        let delivered =
            api._db.rows("audit_webhooks").eq("tenant_id", t).int("delivered_seq").await;
        if delivered == head {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let got = receiver.got.lock().expect("lock").clone();
    assert_eq!(receiver.bad_signatures.load(std::sync::atomic::Ordering::SeqCst), 0);
    // Every event once at least, first arrivals in chain order, duplicates identical.
    let mut first: Vec<i64> = Vec::new();
    let mut bodies = std::collections::HashMap::new();
    for (id, seq, body) in &got {
        match bodies.get(id) {
            Some(b) => assert_eq!(b, body, "a duplicate is the same event"),
            None => {
                bodies.insert(id.clone(), body.clone());
                first.push(*seq);
            }
        }
    }
    let start = first[0];
    assert_eq!(first, (start..=head).collect::<Vec<_>>(), "every event, in order");
    assert!(got.len() <= first.len() + 1, "at most the event in flight came twice");
    // Bodies name everything by public handle, never by internal id.
    for (_, _, body) in &got {
        let e: Value = serde_json::from_str(body).expect("json");
        assert!(e["data"]["row"]["tenant"].as_str().is_some_and(|h| h.starts_with("ten_")), "{e}");
        assert!(!body.contains("tenant_id") && !body.contains("audit_id"), "{body}");
    }
    let webhook_set_seq = api._db.audit_seq_of_action(t, "audit_webhook.set").await;
    assert_eq!(
        start, webhook_set_seq,
        "deliveries start with the events after the webhook was set"
    );
}

/// The console's audit webhook page: an admin sends the log to a URL (the SSRF guard as for
/// the CLI), sees the secret once, rotates it, and stops it; a viewer cannot; under the
/// tenant's passkey policy a session alone cannot point the log somewhere else.
#[tokio::test]
async fn an_admin_sets_rotates_and_removes_the_audit_webhook_in_the_console() {
    let api =
        Api::start_with(shared::services::oauth::FetchPolicy { dev: true, ..Default::default() })
            .await;
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let page = admin.get("/audit/webhook").await.text().await.expect("html");
    assert!(page.contains("No audit webhook"), "{page}");
    let csrf = form_fields(&page, "/audit/webhook")
        .into_iter()
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v)
        .expect("csrf");
    let field = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    let set = admin
        .post("/audit/webhook", &[field("csrf", &csrf), field("url", "http://127.0.0.1:9/siem")])
        .await;
    assert_eq!(set.status(), 303, "post/redirect/get: a reload repeats nothing");
    let shown = admin.follow(set).await.text().await.expect("html");
    let secret = shown
        .split("id=\"webhook-secret\">")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .expect("the secret, shown once")
        .to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    let again = admin.get("/audit/webhook").await.text().await.expect("html");
    assert!(!again.contains(&secret) && again.contains("http://127.0.0.1:9/siem"), "{again}");
    let rotated = admin.post("/audit/webhook/rotate", &[field("csrf", &csrf)]).await;
    let rotated = admin.follow(rotated).await.text().await.expect("html");
    assert!(rotated.contains("whsec_") && !rotated.contains(&secret), "a new secret, once");
    // A forged form changes nothing.
    let forged = admin.post("/audit/webhook", &[field("url", "https://evil.example/x")]).await;
    assert_eq!(forged.status(), 403);
    // Under the passkey policy, pointing the log elsewhere needs a passkey.
    api._db.rows("tenants").set("decisions_need_passkey", true).await;
    let moved = admin
        .post(
            "/audit/webhook",
            &[field("csrf", &csrf), field("url", "http://127.0.0.1:9/elsewhere")],
        )
        .await;
    assert_eq!(moved.status(), 403);
    assert!(moved.text().await.expect("html").contains("needs a passkey"));
    let url = api._db.rows("audit_webhooks").text("url").await;
    assert_eq!(url, "http://127.0.0.1:9/siem", "nothing changed");
    // Stopping is confirmed first: the page says what stops and what stays, and changes nothing.
    let confirm = admin.get("/audit/webhook/remove").await.text().await.expect("html");
    assert!(
        confirm.contains("Stop sending audit events to") && confirm.contains("keeps everything"),
        "{confirm}"
    );
    assert_eq!(api._db.count("audit_webhooks").await, 1);
    let removed = admin.post("/audit/webhook/remove", &[field("csrf", &csrf)]).await;
    assert_eq!(removed.status(), 303);
    assert_eq!(api._db.count("audit_webhooks").await, 0);
    assert!(
        api._db
            .rows("audit_log")
            .like("action", "audit\\_webhook.%")
            .eq("channel", "console")
            .count()
            .await
            >= 3,
        "set, rotate and remove are audited"
    );
}

/// Retention drops rows up to a signed checkpoint and the rest still verifies from it; a
/// date no checkpoint covers is refused with what to do; tampering after retention is still
/// named; and undelivered webhook events are never dropped.
#[tokio::test]
async fn retention_keeps_the_rest_verifiable_from_a_signed_checkpoint() {
    let (api, slug, t) = chained_tenant().await;
    let db = &api._db;
    let (ok, none) = run(&api, &["audit", "prune", "--tenant", &slug, "--before", "2999-01-01"]);
    assert!(!ok && none.to_string().contains("checkpoint"), "no checkpoint yet: {none}");
    let (ok, out) = run(&api, &["audit", "checkpoint"]);
    assert!(ok, "{out}");
    let before = db.rows("audit_log").eq("tenant_id", t).count().await;
    // Newer rows after the checkpoint, then retention of everything older than now.
    db.log_audit_events(t, "api", "booking.update", (1..=5).map(|i| format!("bkg_new{i}"))).await;
    let (ok, out) = run(&api, &["audit", "checkpoint"]);
    assert!(ok, "{out}");
    let (ok, pruned) = run(
        &api,
        &["audit", "prune", "--tenant", &slug, "--before", &jiff::Timestamp::now().to_string()],
    );
    assert!(ok, "{pruned}");
    let removed = pruned["pruned"]["rows_removed"].as_i64().expect("removed");
    assert!(removed >= before, "the old rows went: {pruned}");
    let (ok, v) = verify(&api, &slug);
    assert!(ok, "what is left verifies from the checkpoint: {v}");
    assert_eq!(db.audited("audit.prune").await, 1, "retention is audited");
    // Deleting a kept row behind the trigger's back is still named.
    let (ok, out) = run(&api, &["audit", "checkpoint"]);
    assert!(ok, "{out}");
    db.delete_newest_chained_audit_row(t).await;
    let (ok, v) = verify(&api, &slug);
    assert!(!ok, "{v}");
}
