//! The console in a browser: a tenant admin manages connections, people and the switch, and
//! sees each connection's calls drawn.

use crate::support::*;

#[tokio::test]
async fn a_tenant_admin_manages_connections_people_and_the_switch_in_a_browser() {
    let stack = Stack::start(Options::for_test("browser", 1)).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let tenant = stack.tenant(0).clone();
    let shots = stack.run_dir.join("screenshots");
    let out = std::process::Command::new("node")
        .arg(e2e::repo_root().join("e2e/browser/console.mjs"))
        .args(["--control", &stack.control_url])
        .args(["--email", tenant["admin"]["email"].as_str().expect("email")])
        .args(["--password", tenant["admin"]["password"].as_str().expect("password")])
        .args(["--dispatcher", tenant["dispatcher"]["email"].as_str().expect("email")])
        .arg("--shots")
        .arg(&shots)
        .output()
        .expect("node (scripts/test installs playwright-core and Chromium)");
    assert!(
        out.status.success(),
        "browser test failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(out.stdout.trim_ascii()).expect("json");
    // What the browser did took effect: the token it saw once is revoked, the role changed,
    // and each console write was audited with channel console.
    let token = seen["token"].as_str().expect("token");
    assert_eq!(tool_names(&stack.lb_url, token).await.0, 401);
    let role = db
        .memberships_of_email_in_role(tenant["dispatcher"]["email"].as_str().expect("e"), "viewer")
        .await;
    assert_eq!(role, 1);
    let mut audited = 0;
    for action in [
        "connection.create",
        "connection.revoke",
        "person.set_role",
        "agent_access.off",
        "agent_access.on",
    ] {
        audited += db.rows("audit_log").eq("channel", "console").eq("action", action).count().await;
    }
    assert_eq!(audited, 5);
    assert_eq!(db.connection_tokens_hashing_to(token).await, 0, "revoked tokens are gone");
}

#[tokio::test]
async fn an_admin_sees_each_connections_calls_drawn_in_the_browser() {
    let stack = Stack::start(Options::for_test("activity_ui", 2)).await.expect("stack");
    let tenant = stack.tenant(0).clone();
    let admin = tenant["admin"]["email"].as_str().expect("email");
    let agent = stack
        .ctl(&[
            "connection",
            "create",
            "--tenant",
            tenant["slug"].as_str().expect("slug"),
            "--creator",
            admin,
            "--name",
            "Activity agent",
            "--rights",
            "customers:read,bookings:read",
        ])
        .expect("connection");
    let out = std::process::Command::new("node")
        .arg(e2e::repo_root().join("e2e/browser/activity.mjs"))
        .args(["--control", &stack.control_url, "--mcp", &format!("{}/mcp", stack.lb_url)])
        .args(["--token", agent["token"].as_str().expect("token")])
        .args(["--connection", agent["connection"].as_str().expect("connection")])
        .args(["--email", admin, "--password", tenant["admin"]["password"].as_str().expect("pw")])
        .arg("--shots")
        .arg(stack.run_dir.join("activity-shots"))
        .output()
        .expect("node (scripts/test installs playwright-core and Chromium)");
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "browser activity check failed:\n{line}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value =
        serde_json::from_str(line.trim().lines().last().unwrap_or_default()).expect("json");
    // The calls the browser's agent made, counted by two workers behind the balancer.
    assert_eq!(seen["read"], 6, "{seen}");
    assert_eq!(seen["notify"], 2, "{seen}");
    assert_eq!(seen["refusals"], json!({"permission_denied": 2, "invalid_argument": 1}), "{seen}");
    assert_eq!(seen["connection_read"], 6, "{seen}");
    assert_eq!(seen["week_bars"], 28, "{seen}");
    assert!(seen["drawn_pixels"].as_u64().is_some_and(|n| n > 0), "the bars are drawn: {seen}");
}

/// Every page a tenant admin reaches, checked with axe-core (no serious or critical violation)
/// and photographed at 1400 px and 390 px into the run's `review/` folder (`scripts/screenshots`
/// runs just this and says where they are).
#[tokio::test]
async fn every_console_page_passes_axe_and_is_photographed_at_two_widths() {
    let stack = Stack::start(Options::for_test("review", 1)).await.expect("stack");
    let tenant = stack.tenant(0).clone();
    let shots = std::env::var_os("GATEHOUSE_REVIEW_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| stack.run_dir.join("review"));
    let out = std::process::Command::new("node")
        .arg(e2e::repo_root().join("e2e/browser/review.mjs"))
        .args(["--control", &stack.control_url])
        .args(["--email", tenant["admin"]["email"].as_str().expect("email")])
        .args(["--password", tenant["admin"]["password"].as_str().expect("password")])
        .arg("--shots")
        .arg(&shots)
        .output()
        .expect("node (scripts/test installs playwright-core, axe-core and Chromium)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "serious or critical accessibility violations, or the review failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(out.stdout.trim_ascii()).expect("json");
    let checked = seen["pages"].as_object().expect("pages");
    assert!(checked.len() >= 20, "every page was checked: {seen}");
    for name in checked.keys() {
        for width in [1400, 390] {
            let shot = shots.join(format!("{name}-{width}.png"));
            assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 1000), "{}", shot.display());
        }
    }
    println!("axe: {seen}\nscreenshots: {}", shots.display());
}
