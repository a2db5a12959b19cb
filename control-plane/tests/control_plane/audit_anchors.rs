//! A proof that survives the database's owner: checkpoints leave Postgres (the anchor file,
//! the SIEM webhook, the public endpoint), `audit verify` needs only public keys and names a
//! tail deleted or rewritten after the anchors held outside, the signer refuses a forged
//! head, and one tenant's slow SIEM never delays another's chaining or delivery.
//!
//! Tampering is done as a database owner would: triggers switched off for the statement (the
//! testkit's `cut_audit_chain_back_to`, `remove_audit_checkpoint` and friends).

use shared::services::audit;

use super::audit_chain::{Receiver, chained_tenant, keys_url, run, verify_with};
use crate::support::*;

fn problem(v: &Value) -> (Value, Value) {
    (v["verification"]["problem"]["kind"].clone(), v["verification"]["problem"]["seq"].clone())
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gatehouse-anchors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let path = dir.join(format!("{name}-{nanos}-{n}"));
    std::fs::write(&path, text).expect("write");
    path
}

/// Sets the tenant's webhook to the receiver and delivers until it has `n` checkpoints.
async fn deliver_checkpoints(api: &Api, receiver: &Receiver, n: usize) {
    let fetch = shared::services::oauth::FetchPolicy { dev: true, ..Default::default() };
    for _ in 0..200 {
        audit::deliver_round(&api._db.ds, &fetch, audit::WebhookPolicy::default())
            .await
            .expect("round");
        if receiver.checkpoint_lines().lines().count() >= n {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the SIEM got fewer than {n} checkpoints");
}

async fn with_webhook(api: &Api, slug: &str) -> std::sync::Arc<Receiver> {
    let (receiver, url) = Receiver::start().await;
    let (ok, set) =
        run(api, &["audit", "webhook", "set", "--tenant", slug, "--url", &url, "--dev"]);
    assert!(ok, "{set}");
    *receiver.secret.lock().expect("lock") = set["secret"].as_str().expect("secret").to_owned();
    receiver
}

#[tokio::test]
async fn deleting_the_newest_rows_and_their_checkpoints_is_named_by_the_anchors_a_siem_received() {
    let (api, slug, t) = chained_tenant().await;
    let db = &api._db;
    let receiver = with_webhook(&api, &slug).await;
    let (ok, out) = run(&api, &["audit", "checkpoint"]);
    assert!(ok && out["checkpoints"].as_i64().is_some_and(|n| n >= 1), "{out}");
    deliver_checkpoints(&api, &receiver, 1).await;
    let lines = receiver.checkpoint_lines();
    let event: Value = serde_json::from_str(lines.lines().next().expect("one")).expect("json");
    let head = event["data"]["seq"].as_i64().expect("seq");
    assert!(event["data"]["tenant"].as_str().is_some_and(|h| h.starts_with("ten_")), "{event}");
    let anchors = temp_file("siem", &lines);
    let anchors = anchors.to_str().expect("path");
    let (ok, v) = verify_with(&api, &slug, &["--anchors", anchors]);
    assert!(ok, "untouched, with the anchors: {v}");
    assert_eq!(v["verification"]["anchors_checked"], 1, "{v}");

    // The owner deletes the newest rows with their links and every checkpoint covering them,
    // and moves the chainer's head back: what is left is a consistent, shorter chain.
    let keep = head - 4;
    db.cut_audit_chain_back_to(t, keep).await;
    // From the database alone nothing shows it (a proof kept only there cannot survive its
    // owner), and verify says what it would need.
    let (ok, alone) = verify_with(&api, &slug, &[]);
    assert!(ok, "{alone}");
    assert!(alone.to_string().contains("rows_checked"), "{alone}");
    // The anchor the SIEM received names the deleted tail.
    let (ok, v) = verify_with(&api, &slug, &["--anchors", anchors]);
    assert!(!ok, "{v}");
    assert_eq!(problem(&v), (json!("deleted"), json!(keep + 1)), "{v}");
    assert!(v.to_string().contains(&format!("to {head} are gone")), "{v}");
    // So does a head written down by hand.
    let hash = event["data"]["head"].as_str().expect("head");
    let (ok, v) = verify_with(&api, &slug, &["--anchor", &format!("{head}:{hash}")]);
    assert!(!ok, "{v}");
    assert_eq!(problem(&v), (json!("deleted"), json!(keep + 1)), "{v}");
    // A forged anchor is not taken for one.
    let forged = lines.replace(hash, &"ab".repeat(32));
    let forged = temp_file("forged", &forged);
    let (ok, v) = verify_with(&api, &slug, &["--anchors", forged.to_str().expect("path")]);
    assert!(!ok && v["verification"]["problem"]["kind"] == "anchor", "{v}");
}

#[tokio::test]
async fn a_rewritten_history_is_refused_by_the_signer_and_named_by_the_anchor_file() {
    let (api, slug, t) = chained_tenant().await;
    let db = &api._db;
    let ds = &db.ds;
    let receiver = with_webhook(&api, &slug).await;
    let file = temp_file("sink", "");
    let mut anchors = audit::Anchors::with_file(&file).expect("anchors");
    audit::chain_round(ds).await.expect("chain");
    let round = audit::checkpoint_round(ds, &mut anchors).await.expect("sign");
    assert_eq!(round.signed.len(), 2, "both demo tenants: {round:?}");
    let signed = std::fs::read_to_string(&file).expect("file");
    assert_eq!(signed.lines().count(), 2, "each checkpoint is in the file when it is made");
    let handle = db.rows("tenants").eq("id", t).text("handle").await;
    let head = round.signed.iter().find(|c| c.tenant == handle).map(|c| c.seq).expect("signed");
    assert!(
        round.signed.iter().all(|c| signed.contains(&c.signature)),
        "the file holds what was signed"
    );

    // The owner rewrites history from row 5 on: rows and links gone, checkpoints gone, the
    // chainer's head moved back, forged rows written and chained by the product itself, so
    // every hash after row 4 is recomputed.
    db.cut_audit_chain_back_to(t, 4).await;
    db.log_audit_events(
        t,
        "console",
        "booking.update",
        (1..=head).map(|i| format!("bkg_forged{i}")),
    )
    .await;
    audit::chain_round(ds).await.expect("chain the forgery");
    let forged_head = db.rows("audit_chain_heads").eq("tenant_id", t).int("seq").await;
    assert!(forged_head > head, "the forged chain is longer than the real one");

    // The signer that remembers its checkpoint refuses; so does one restarted from the file.
    let round = audit::checkpoint_round(ds, &mut anchors).await.expect("round");
    assert_eq!(round.signed.len(), 0, "{round:?}");
    assert_eq!(round.refused.len(), 1, "{round:?}");
    assert!(round.refused[0].reason.contains("gone from the database"), "{round:?}");
    let mut restarted = audit::Anchors::with_file(&file).expect("anchors");
    let round = audit::checkpoint_round(ds, &mut restarted).await.expect("round");
    assert_eq!((round.signed.len(), round.refused.len()), (0, 1), "{round:?}");
    assert_eq!(
        db.rows("audit_checkpoints").eq("tenant_id", t).count().await,
        0,
        "the forged head is not signed"
    );

    // The control plane's job counts it, and the tenant's webhook hears of it.
    let mut job = control_plane::jobs::Checkpoints {
        state: api.state.clone(),
        every: std::time::Duration::from_secs(60),
        anchors: audit::Anchors::with_file(&file).expect("anchors"),
        alerted: Default::default(),
    };
    use control_plane::jobs::Job as _;
    job.run().await.expect("the job runs");
    let metrics = reqwest::get(format!("{}/metrics", api.url))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("gatehouse_control_plane_audit_checkpoint_refusals_total{tenant=\"ten_"),
        "{metrics}"
    );
    let mut alert = None;
    for _ in 0..250 {
        alert = receiver
            .other
            .lock()
            .expect("lock")
            .iter()
            .find(|e| e["type"] == "audit.alert")
            .cloned();
        if alert.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let alert = alert.expect("an audit.alert reached the webhook");
    assert_eq!(alert["data"]["kind"], "checkpoint_refused", "{alert}");

    // The anchor file names the rewrite: the chain does not pass through the signed head.
    let (ok, v) = verify_with(&api, &slug, &["--anchors", file.to_str().expect("path")]);
    assert!(!ok, "{v}");
    assert_eq!(problem(&v), (json!("edited"), json!(head)), "{v}");
    assert!(v.to_string().contains("rewritten"), "{v}");
}

#[tokio::test]
async fn checkpoints_form_a_chain_a_missing_or_replaced_one_is_named_and_the_page_says_so() {
    let (api, slug, t) = chained_tenant().await;
    let db = &api._db;
    for _ in 0..3 {
        db.log_audit_events(t, "api", "booking.update", (1..=2).map(|i| format!("bkg_{i}"))).await;
        let (ok, out) = run(&api, &["audit", "checkpoint"]);
        assert!(ok, "{out}");
    }
    let count = db.rows("audit_checkpoints").eq("tenant_id", t).count().await;
    assert_eq!(count, 3);
    let linked = db
        .rows("audit_checkpoints")
        .eq("tenant_id", t)
        .not_null("prev_seq")
        .not_null("prev_digest")
        .count()
        .await;
    assert_eq!(linked, 2, "each checkpoint after the first commits to the one before");
    let (ok, v) = verify_with(&api, &slug, &[]);
    assert!(ok, "{v}");

    // A quiet tenant whose last checkpoint is at its head is verified, not "nothing chained".
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let page = admin.get("/audit").await.text().await.expect("html");
    assert!(page.contains("Verified up to"), "{page}");

    // The middle checkpoint deleted: the gap is named.
    let seqs = db.rows("audit_checkpoints").eq("tenant_id", t).texts("seq", "seq").await;
    let middle: i64 = seqs[1].parse().expect("a checkpoint's place");
    db.remove_audit_checkpoint(t, middle).await;
    let (ok, v) = verify_with(&api, &slug, &[]);
    assert!(!ok, "{v}");
    assert_eq!(v["verification"]["problem"]["kind"], "checkpoint", "{v}");
    assert!(v.to_string().contains(&format!("checkpoint at row {middle} is missing")), "{v}");
    let page = admin.get("/audit").await.text().await.expect("html");
    assert!(page.contains("Tampered"), "the page says so: {page}");

    // Put back, but replaced by one with another signature: it no longer verifies.
    db.put_back_audit_checkpoint_signed_later(t, middle).await;
    let (ok, v) = verify_with(&api, &slug, &[]);
    assert!(!ok, "{v}");
    assert_eq!(problem(&v), (json!("checkpoint"), json!(middle)), "{v}");
}

#[tokio::test]
async fn verify_needs_only_public_keys_and_the_published_ones_and_endpoint_serve() {
    let (api, slug, t) = chained_tenant().await;
    let (ok, out) = run(&api, &["audit", "checkpoint"]);
    assert!(ok, "{out}");
    // gatehousectl without any signing seed in its environment.
    let public = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gatehousectl"))
            .args(args)
            .arg("--json")
            .env("DATABASE_URL", &api._db.url)
            .env("GATEHOUSE_OPERATOR", &api.seed.tenants[0].admin.email)
            .env_remove("GATEHOUSE_AUDIT_SIGNING_KEYS")
            .env_remove("GATEHOUSE_AUDIT_KEYS")
            .output()
            .expect("run");
        (out.status.success(), serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null))
    };
    let (ok, none) = public(&["audit", "verify", "--tenant", &slug]);
    assert!(!ok, "{none}");
    assert!(none["error"]["message"].as_str().is_some_and(|m| m.contains("--keys")), "{none}");
    let set = reqwest::get(keys_url(&api)).await.expect("keys").text().await.expect("text");
    let file = temp_file("keys", &set);
    let (ok, v) =
        public(&["audit", "verify", "--tenant", &slug, "--keys", file.to_str().expect("path")]);
    assert!(ok, "the published key set verifies: {v}");
    let set: Value = serde_json::from_str(&set).expect("json");
    let key = &set["keys"][0];
    assert_eq!(key["status"], "signing", "{set}");
    let spec = format!(
        "{}:{}",
        key["kid"].as_str().expect("kid"),
        key["public_key"].as_str().expect("key")
    );
    let (ok, v) = public(&["audit", "verify", "--tenant", &slug, "--public-key", &spec]);
    assert!(ok, "{v}");
    let other = shared::services::audit::SigningKeys::parse(
        &shared::services::audit::SigningKeys::generate("t1"),
    )
    .expect("keys");
    let wrong = format!("t1:{}", other.public_keys()[0].public_key);
    let (ok, v) = public(&["audit", "verify", "--tenant", &slug, "--public-key", &wrong]);
    assert!(!ok && v["verification"]["problem"]["kind"] == "checkpoint", "{v}");

    // The public endpoint: the tenant's checkpoints by handle, which verify as anchors.
    let handle = api._db.rows("tenants").eq("id", t).text("handle").await;
    let page =
        reqwest::get(format!("{}/.well-known/gatehouse-audit-checkpoints/{handle}", api.url))
            .await
            .expect("page")
            .text()
            .await
            .expect("text");
    let listed: Value = serde_json::from_str(&page).expect("json");
    assert_eq!(listed["checkpoints"].as_array().map(Vec::len), Some(1), "{listed}");
    let file = temp_file("endpoint", &page);
    let (ok, v) = public(&[
        "audit",
        "verify",
        "--tenant",
        &slug,
        "--keys",
        &super::audit_chain::keys_file(&api),
        "--anchors",
        file.to_str().expect("path"),
    ]);
    assert!(ok && v["verification"]["anchors_checked"] == 1, "{v}");
    let missing =
        reqwest::get(format!("{}/.well-known/gatehouse-audit-checkpoints/ten_nothere", api.url))
            .await
            .expect("page");
    assert_eq!(missing.status(), 404);
}

#[tokio::test]
async fn rows_no_checkpoint_covers_are_unanchored_and_fail_strict() {
    let (api, slug, t) = chained_tenant().await;
    let db = &api._db;
    audit::chain_round(&db.ds).await.expect("chain");
    // Chained an hour ago and never checkpointed (as when signing is stopped).
    db.backdate_audit_chain(t, "1 hour").await;
    let (ok, v) = verify_with(&api, &slug, &[]);
    assert!(ok, "the rows verify: {v}");
    assert!(v["verification"]["unanchored"]["rows"].as_i64().is_some_and(|n| n >= 12), "{v}");
    let (ok, v) = verify_with(&api, &slug, &["--strict"]);
    assert!(!ok && v["strict_failed"] == true, "{v}");
    let t0 = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t0.admin.email, &t0.admin.password).await;
    let page = admin.get("/audit").await.text().await.expect("html");
    assert!(page.contains("Unanchored"), "{page}");
    let (ok, out) = run(&api, &["audit", "checkpoint"]);
    assert!(ok, "{out}");
    let (ok, v) = verify_with(&api, &slug, &["--strict"]);
    assert!(ok && v["verification"]["unanchored"].is_null(), "{v}");
}

/// Tenant A's SIEM takes five seconds per answer; tenant B's answers at once. With the
/// control plane's jobs running, B's events are chained and delivered within 2 s throughout.
#[tokio::test]
async fn a_slow_siem_never_delays_another_tenants_chaining_or_delivery() {
    let api =
        Api::start_with(shared::services::oauth::FetchPolicy { dev: true, ..Default::default() })
            .await;
    let db = &api._db;
    let [a, b] = [0, 1].map(|i| api.seed.tenants[i].slug.clone());
    let (slow, fast) = (with_webhook(&api, &a).await, with_webhook(&api, &b).await);
    slow.delay_secs.store(5, std::sync::atomic::Ordering::SeqCst);
    let state = api.state.clone();
    control_plane::jobs::spawn(control_plane::jobs::Chain { ds: db.ds.clone() }, state.clone());
    control_plane::jobs::spawn(
        control_plane::jobs::Webhooks {
            state: state.clone(),
            policy: audit::WebhookPolicy::default(),
            running: Default::default(),
        },
        state.clone(),
    );
    let tenants = [db.tenant_id(&a).await, db.tenant_id(&b).await];
    let mut worst = std::time::Duration::ZERO;
    for i in 0..8 {
        for tenant in tenants {
            db.log_audit_events(tenant, "api", "booking.update", [format!("bkg_round{i}")]).await;
        }
        let written = std::time::Instant::now();
        let target = format!("bkg_round{i}");
        loop {
            let arrived =
                fast.got.lock().expect("lock").iter().any(|(_, _, body)| body.contains(&target));
            if arrived {
                break;
            }
            assert!(
                written.elapsed() < std::time::Duration::from_secs(2),
                "tenant B's event {i} was not delivered within 2 s while tenant A's SIEM is slow"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        worst = worst.max(written.elapsed());
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    assert!(
        slow.got.lock().expect("lock").len() < fast.got.lock().expect("lock").len(),
        "tenant A's deliveries are the slow ones"
    );
    let jobs: Value =
        reqwest::get(format!("{}/jobs", api.url)).await.expect("jobs").json().await.expect("json");
    assert!(jobs["jobs"]["audit_chain"]["runs"].as_u64().is_some_and(|n| n > 1), "{jobs}");
    eprintln!("slowest delivery to tenant B: {worst:?}");
}
