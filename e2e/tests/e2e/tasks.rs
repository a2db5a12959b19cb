//! Tasks of slow tools across workers behind nginx: created on one worker, read on the other and
//! through the balancer from Postgres, invisible to every other connection, cancelled when the
//! connection is revoked.

use crate::support::*;

const TASKS: &str = "io.modelcontextprotocol/tasks";

/// A 2026-07-28 request declaring the tasks extension; returns the JSON-RPC body.
async fn request(base: &str, token: &str, method: &str, name: &str, params: Value) -> Value {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}}
    });
    reqwest::Client::new()
        .post(format!("{base}/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", method)
        .header("Mcp-Name", name)
        .bearer_auth(token)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await
        .expect("request")
        .json()
        .await
        .unwrap_or(Value::Null)
}

async fn export(base: &str, token: &str) -> String {
    let body = request(
        base,
        token,
        "tools/call",
        "export_bookings",
        json!({"name": "export_bookings", "arguments": {"from": "2020-01-01", "to": "2030-01-01"}}),
    )
    .await;
    assert_eq!(body["result"]["resultType"], "task", "{body}");
    body["result"]["taskId"].as_str().expect("taskId").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_created_on_one_worker_is_read_on_the_other_and_by_no_other_connection() {
    let stack = Stack::start(Options::for_test("tasks", 2)).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let token = stack.token(0, 0);
    let w = stack.worker_urls.clone();
    let task = export(&w[0], &token).await;
    let mut done = Value::Null;
    for _ in 0..100 {
        done = request(&w[1], &token, "tasks/get", &task, json!({"taskId": task})).await;
        if done["result"]["status"] == "completed" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert!(done["result"]["result"]["structuredContent"]["count"].as_i64().expect("count") > 0);
    let via_lb = request(&stack.lb_url, &token, "tasks/get", &task, json!({"taskId": task})).await;
    assert_eq!(via_lb["result"]["result"], done["result"]["result"]);
    // Another connection, another tenant: not found on either worker, nothing cancelled.
    for other in [stack.token(0, 1), stack.token(1, 0)] {
        for base in [&w[0], &w[1], &stack.lb_url] {
            for method in ["tasks/get", "tasks/cancel"] {
                let body = request(base, &other, method, &task, json!({"taskId": task})).await;
                assert_eq!(body["error"]["code"], -32602, "{method}: {body}");
            }
        }
    }
    // A revoked connection's running task is cancelled: an export held up by a lock on the
    // bookings, then the connection revoked.
    // Held from a session of its own, as a migration would hold it.
    let locker = TestDb::attach(&stack.database_url).await;
    let lock = tokio::spawn(async move { locker.lock_bookings_for(4).await });
    for _ in 0..50 {
        if db.bookings_lock_granted().await {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let running = export(&w[1], &token).await;
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let handle =
        stack.tenant(0)["connections"][0]["connection"].as_str().expect("handle").to_owned();
    stack
        .ctl(&[
            "connection",
            "revoke",
            "--tenant",
            &slug,
            "--connection",
            &handle,
            "--reason",
            "stolen",
        ])
        .expect("revoke");
    let mut status = String::new();
    for _ in 0..50 {
        status =
            db.rows("tasks").eq("handle", &running).opt_text("status").await.unwrap_or_default();
        if status == "cancelled" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(status, "cancelled");
    let _ = lock.await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        db.rows("tasks").eq("handle", &running).text("status").await,
        "cancelled",
        "no result is written after the revocation"
    );
}
