//! Tasks for slow tools (the tasks extension, SEP-2663): answered at once, state in Postgres,
//! read on any worker, seen only by the connection that created it, cancelled by the client or
//! by a revocation, failed when its worker stops.

use crate::support::*;

const TASKS: &str = "io.modelcontextprotocol/tasks";

fn with_tasks(mut params: Value) -> Value {
    params["_meta"] =
        json!({"io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}}});
    params
}

impl Stack {
    /// `export_bookings` from a client that declares the tasks extension; returns the task.
    async fn export_task(&self, token: &str) -> Value {
        let (status, _, body) = self
            .raw(
                Some(token),
                "tools/call",
                Some("export_bookings"),
                with_tasks(json!({"name": "export_bookings", "arguments": {"from": "2020-01-01", "to": "2030-01-01"}})),
                &[],
            )
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["resultType"], "task", "{body}");
        body["result"].clone()
    }

    /// `tasks/get` or `tasks/cancel` on the worker at `base`: the result, or the JSON-RPC error.
    async fn task_request(
        &self,
        base: &str,
        token: &str,
        method: &str,
        task: &str,
    ) -> Result<Value, Value> {
        let (status, _, body) = self
            .raw_at(base, Some(token), method, Some(task), with_tasks(json!({"taskId": task})), &[])
            .await;
        match body.get("result") {
            Some(result) => {
                assert_eq!(status, 200, "{body}");
                Ok(result.clone())
            }
            None => Err(body["error"].clone()),
        }
    }

    async fn task_until(&self, base: &str, token: &str, task: &str, done: &[&str]) -> Value {
        for _ in 0..100 {
            let got = self.task_request(base, token, "tasks/get", task).await.expect("visible");
            if done.iter().any(|s| got["status"] == *s) {
                return got;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("task {task} did not reach {done:?}");
    }
}

/// Waits until the bookings are locked (by [`TestDb::lock_bookings_for`], which holds an
/// exclusive lock so an export waits, and stays working, meanwhile).
async fn wait_for_lock(stack: &Stack) {
    for _ in 0..50 {
        if stack.db.bookings_lock_granted().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the lock was not taken");
}

#[tokio::test]
async fn a_slow_tool_answers_with_a_task_that_any_worker_reads_to_its_result() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let (_, _, discover) = stack.raw(Some(&token), "server/discover", None, json!({}), &[]).await;
    assert!(
        discover["result"]["capabilities"]["extensions"][TASKS].is_object(),
        "the extension is advertised: {discover}"
    );
    let created = stack.export_task(&token).await;
    let task = created["taskId"].as_str().expect("taskId").to_owned();
    // Unguessable: the handle style with 80 random bits.
    assert!(task.starts_with("tsk_") && task.len() == 20, "{task}");
    for field in ["status", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"] {
        assert!(created.get(field).is_some(), "{field}: {created}");
    }
    assert_eq!(created["ttlMs"], 3_600_000);
    assert!(created.get("result").is_none() && created.get("requestState").is_none());
    // Another worker reads it from Postgres, with the result inlined once completed.
    let other = stack.another_worker().await;
    let done = stack.task_until(&other, &token, &task, &["completed", "failed"]).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["resultType"], "complete", "{done}");
    let summary = &done["result"]["structuredContent"];
    assert!(summary["count"].as_i64().expect("count") > 0, "{done}");
    assert_eq!(done["result"]["isError"], false);
    // The same result as the call answered without the extension.
    let plain = stack
        .ok(&token, "export_bookings", json!({"from": "2020-01-01", "to": "2030-01-01"}))
        .await;
    assert_eq!(plain["count"], summary["count"]);
    // Cancel on an ended task is acknowledged and changes nothing.
    let ack = stack.task_request(&other, &token, "tasks/cancel", &task).await.expect("ack");
    assert_eq!(ack, json!({"resultType": "complete"}));
    assert_eq!(
        stack.task_until(&stack.url, &token, &task, &["completed"]).await["status"],
        "completed"
    );
    // A tool error is a completed task with `isError`, not a failed one.
    let (_, _, body) = stack
        .raw(
            Some(&token),
            "tools/call",
            Some("export_bookings"),
            with_tasks(json!({"name": "export_bookings", "arguments": {"from": "2020-01-01"}})),
            &[],
        )
        .await;
    let bad = body["result"]["taskId"].as_str().expect("a task").to_owned();
    let ended = stack.task_until(&stack.url, &token, &bad, &["completed", "failed"]).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    assert_eq!(ended["result"]["isError"], true, "{ended}");
    // Without the extension the call is answered in the call, as before.
    let (_, _, body) = stack
        .raw(Some(&token), "tools/call", Some("export_bookings"),
            json!({"name": "export_bookings", "arguments": {"from": "2020-01-01", "to": "2030-01-01"}}), &[])
        .await;
    assert!(body["result"].get("taskId").is_none(), "{body}");
    assert_eq!(body["result"]["structuredContent"]["count"], summary["count"]);
    // Without the extension, the task methods are refused as the extension says.
    let (_, _, body) =
        stack.raw(Some(&token), "tasks/get", Some(&task), json!({"taskId": task}), &[]).await;
    assert_eq!(body["error"]["code"], -32021, "{body}");
    // Methods the extension removed are unknown.
    for method in ["tasks/result", "tasks/list"] {
        let (_, _, body) =
            stack.raw(Some(&token), method, None, with_tasks(json!({"taskId": task})), &[]).await;
        assert_eq!(body["error"]["code"], -32601, "{method}: {body}");
    }
}

#[tokio::test]
async fn a_task_is_not_found_for_any_other_connection_or_a_connection_that_lost_the_right() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let task = stack.export_task(&token).await["taskId"].as_str().expect("id").to_owned();
    stack.task_until(&stack.url, &token, &task, &["completed"]).await;
    let unknown = |e: &Value| e["code"] == -32602;
    // Another connection of the same tenant, another tenant's: not found, never forbidden.
    for other in [stack.token(0, 1), stack.token(1, 0)] {
        for method in ["tasks/get", "tasks/cancel"] {
            let err =
                stack.task_request(&stack.url, &other, method, &task).await.expect_err(method);
            assert!(unknown(&err), "{method}: {err}");
        }
    }
    // Guessed, malformed and unknown ids read the same.
    for guess in ["tsk_0000000000000000", "tsk_../../etc", "", &"x".repeat(5000)] {
        let err =
            stack.task_request(&stack.url, &token, "tasks/get", guess).await.expect_err("unknown");
        assert!(unknown(&err), "{err}");
        assert!(err["message"].as_str().expect("message").len() < 200, "{err}");
    }
    // The task's connection loses the right its tool needs: the task is not found either.
    let connection = &stack.seed.tenants[0].connections[0].connection;
    stack.db.connection_right_removed(connection, "bookings:read").await;
    let err = stack.task_request(&stack.url, &token, "tasks/get", &task).await.expect_err("hidden");
    assert!(unknown(&err), "{err}");
    // Revoked: 401 at the door, whatever the task.
    let ctx = stack.operator_in(0).await;
    admin::connection_revoke(&stack.db.ds, &ctx, connection, "test").await.expect("revoke");
    let (status, _, _) = stack
        .raw(Some(&token), "tasks/get", Some(&task), with_tasks(json!({"taskId": task})), &[])
        .await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn a_cancelled_task_stops_on_its_worker_and_stays_cancelled() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let (task, ()) = tokio::join!(
        async {
            wait_for_lock(&stack).await;
            let task = stack.export_task(&token).await["taskId"].as_str().expect("id").to_owned();
            let working =
                stack.task_request(&stack.url, &token, "tasks/get", &task).await.expect("get");
            assert_eq!(working["status"], "working", "{working}");
            assert!(working.get("result").is_none());
            // Cancelled through another worker; the running worker notices at its next heartbeat.
            let other = stack.another_worker().await;
            let ack = stack.task_request(&other, &token, "tasks/cancel", &task).await.expect("ack");
            assert_eq!(ack, json!({"resultType": "complete"}));
            let cancelled = stack.task_until(&stack.url, &token, &task, &["cancelled"]).await;
            assert!(cancelled.get("result").is_none(), "{cancelled}");
            task
        },
        stack.db.lock_bookings_for(4)
    );
    let stopped = format!("\"task.id\":\"{task}\"");
    let mut seen = false;
    for _ in 0..40 {
        let logs = String::from_utf8_lossy(&logs().lock().expect("logs")).to_string();
        if logs.lines().any(|l| l.contains(&stopped) && l.contains("\"outcome\":\"cancelled\"")) {
            seen = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(seen, "the running worker stopped the run");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let after = stack.task_request(&stack.url, &token, "tasks/get", &task).await.expect("get");
    assert_eq!(after["status"], "cancelled", "the late result is not kept: {after}");
}

#[tokio::test]
async fn a_revoked_connections_running_task_is_cancelled() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let db = &stack.db;
    let status =
        move |task: String| async move { db.rows("tasks").eq("handle", task).text("status").await };
    let (task, ()) = tokio::join!(
        async {
            wait_for_lock(&stack).await;
            let task = stack.export_task(&token).await["taskId"].as_str().expect("id").to_owned();
            let ctx = stack.operator_in(0).await;
            let connection = &stack.seed.tenants[0].connections[0].connection;
            admin::connection_revoke(&stack.db.ds, &ctx, connection, "test").await.expect("revoke");
            let mut last = String::new();
            for _ in 0..50 {
                last = status(task.clone()).await;
                if last == "cancelled" {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            assert_eq!(last, "cancelled");
            task
        },
        stack.db.lock_bookings_for(4)
    );
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(status(task).await, "cancelled", "no result is written after the revocation");
}

/// A change that stops a call from being admitted, made behind the console's back.
#[derive(Clone, Copy)]
enum Stop {
    KillSwitch,
    TenantSwitch,
    RightTaken,
    CreatorLeft,
}

impl Stop {
    /// Makes the change (`on`) or undoes it, for tenant `slug`'s `connection`.
    async fn apply(self, stack: &Stack, slug: &str, connection: &str, on: bool) {
        match self {
            Stop::KillSwitch => stack.set_kill_switch(on).await,
            Stop::TenantSwitch => stack.set_agent_access(slug, !on).await,
            Stop::RightTaken if on => {
                stack.db.connection_right_removed(connection, "bookings:read").await;
            }
            Stop::RightTaken => {
                stack.db.connection_right_appended(connection, "bookings:read").await
            }
            Stop::CreatorLeft => stack.db.set_connection_creator_membership(connection, !on).await,
        }
    }
}

/// Every way a call stops being admitted, each with the words the task ends with.
#[tokio::test]
async fn a_running_task_stops_when_its_call_would_no_longer_be_admitted() {
    let stack = Stack::start().await;
    let slug = stack.seed.tenants[0].slug.clone();
    let connection = stack.seed.tenants[0].connections[0].connection.clone();
    let cases = [
        ("the kill switch", Stop::KillSwitch, "kill switch"),
        ("the tenant's switch", Stop::TenantSwitch, "The tenant turned agent access off."),
        (
            "a right taken from the connection",
            Stop::RightTaken,
            "The connection lost the right bookings:read that export_bookings needs.",
        ),
        ("the creator leaving the tenant", Stop::CreatorLeft, "creator no longer belongs"),
    ];
    let token = stack.token(0, 0);
    let db = &stack.db;
    let ended = |task: String| async move { db.task_outcome(&task).await };
    for (what, stop, words) in cases {
        // The export waits on a lock, so it is still running when the change lands.
        let (task, ()) = tokio::join!(
            async {
                wait_for_lock(&stack).await;
                let task =
                    stack.export_task(&token).await["taskId"].as_str().expect("id").to_owned();
                assert!(ended(task.clone()).await.starts_with("working"), "{what}");
                stop.apply(&stack, &slug, &connection, true).await;
                let mut last = String::new();
                for _ in 0..50 {
                    last = ended(task.clone()).await;
                    if !last.starts_with("working") {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                assert!(last.starts_with("cancelled: "), "{what}: {last}");
                assert!(last.contains(words), "{what}: {last}");
                task
            },
            db.lock_bookings_for(4)
        );
        // Once the lock is gone the export could finish: its result is never written.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        assert!(ended(task).await.starts_with("cancelled"), "{what}: no result after the stop");
        stop.apply(&stack, &slug, &connection, false).await;
    }
    // With everything back, a task runs to its result: the stops above were the changes'.
    let task = stack.export_task(&token).await["taskId"].as_str().expect("id").to_owned();
    stack.task_until(&stack.url, &token, &task, &["completed"]).await;
}

#[tokio::test]
async fn a_task_whose_worker_stopped_fails_instead_of_working_forever() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let task = stack.export_task(&token).await["taskId"].as_str().expect("id").to_owned();
    stack.task_until(&stack.url, &token, &task, &["completed"]).await;
    // As a worker that died mid-run leaves it: working, its heartbeat old.
    stack.db.strand_task(&task, "31 seconds").await;
    let failed = stack.task_request(&stack.url, &token, "tasks/get", &task).await.expect("get");
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], -32603, "{failed}");
    assert!(failed.get("result").is_none());
    // Expired tasks are gone (not found), and housekeeping deletes them.
    stack.db.rows("tasks").eq("handle", &task).set_now_plus("expires_at", "-1 second").await;
    let err =
        stack.task_request(&stack.url, &token, "tasks/get", &task).await.expect_err("expired");
    assert_eq!(err["code"], -32602);
    shared::services::housekeeping(&stack.db.ds).await.expect("housekeeping");
    assert_eq!(stack.db.rows("tasks").eq("handle", &task).count().await, 0);
}
