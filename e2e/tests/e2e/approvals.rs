//! Approvals: a person approves what an agent prepares under the tenant policy, in the browser
//! or in the client's own UI, and a step-up still arriving when its connection is revoked
//! executes nothing.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_up_body_still_arriving_when_the_connection_is_revoked_executes_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stack = Stack::start(Options::for_test("slowbody", 1)).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    // A narrowed OAuth grant: its person could grant more, so the worker reads the body.
    let granted = oauth_flow::connect(&stack, &["customers:read", "customers:write"]).await;
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "create_customer",
        "arguments": {"name": "Slow Body", "email": "slow.body@example.com"},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string();
    let worker = stack.worker_urls[0].trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&worker).await.expect("connect");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {worker}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: create_customer\r\n\
         Authorization: Bearer {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        granted.access,
        body.len()
    );
    socket.write_all(head.as_bytes()).await.expect("head");
    socket.write_all(&body.as_bytes()[..10]).await.expect("start of body");
    // Revoked while the body is still arriving; wait until a fresh request is refused.
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let handle =
        db.rows("connections").eq("oauth_client_id", &granted.client_id).text("handle").await;
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
    assert_eq!(tool_names(&stack.worker_urls[0], &granted.access).await.0, 401);
    let _ = socket.write_all(&body.as_bytes()[10..]).await;
    let mut answer = String::new();
    let _ = socket.read_to_string(&mut answer).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert_eq!(
        db.rows("customers").eq("email", "slow.body@example.com").count().await,
        0,
        "nothing executed after the revocation"
    );
}

/// The CSRF token a console page's forms carry.
fn csrf_of(html: &str) -> String {
    html.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .expect("a csrf field")
        .to_owned()
}

/// A console session of a demo person (`admin` or `dispatcher`) of the first tenant.
async fn console_as(stack: &Stack, control: &str, who: &str) -> oauth_flow::Browser {
    let person = &stack.tenant(0)[who];
    let mut browser = oauth_flow::Browser::new();
    browser
        .sign_in(
            control,
            person["email"].as_str().expect("email"),
            person["password"].as_str().expect("password"),
            "/approvals",
        )
        .await;
    browser
}

/// A person's decision on an action in the console: the status and the page.
async fn decide(
    control: &str,
    browser: &mut oauth_flow::Browser,
    action: &str,
    decision: &str,
    reason: &str,
) -> (u16, String) {
    let page = browser.get(&format!("{}/approvals", control)).await.text().await.expect("html");
    let form = vec![("csrf".to_owned(), csrf_of(&page)), ("reason".to_owned(), reason.to_owned())];
    let response =
        browser.post_form(&format!("{}/approvals/{action}/{decision}", control), &form).await;
    // A decision answers with a redirect to the Approvals page, which says what happened.
    if response.status() == 303 {
        let location = response.headers()["location"].to_str().expect("ascii").to_owned();
        let page = browser.get(&format!("{}{location}", control)).await;
        return (page.status().as_u16(), page.text().await.unwrap_or_default());
    }
    (response.status().as_u16(), response.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_person_approves_what_an_agent_prepares_under_the_tenant_policy() {
    let mut stack = Stack::start(Options::for_test("approvals", 2)).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    // A second control-plane process: two people deciding at once reach different processes.
    let port = e2e::free_port().expect("port");
    let control2 = format!("http://127.0.0.1:{port}");
    let mcp = format!("{}/mcp", stack.lb_url);
    stack
        .spawn_helper(
            "control-plane-2",
            "control-plane",
            &[
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--public-url",
                &control2,
                "--mcp-resource",
                &mcp,
                "--no-dispatcher",
                "--no-audit-jobs",
            ],
        )
        .expect("second control plane");
    e2e::wait_ready(&format!("{control2}/readyz"), std::time::Duration::from_secs(30))
        .await
        .expect("ready");
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    // A dispatcher's agent: customer emails and pages, nothing more.
    let token = dispatch_agent(
        &stack,
        "customers:read,bookings:read,bookings:notify,technicians:read,technicians:page",
    );
    let set = |scope: &str, mode: &str, extra: &[&str]| {
        let mut args = vec![
            "approval-policy",
            "set",
            "--tenant",
            slug.as_str(),
            "--scope",
            scope,
            "--mode",
            mode,
        ];
        args.extend(extra);
        stack.ctl(&args).expect("policy")
    };
    let shown = set("notify", "person_approves", &[]);
    assert_eq!(
        shown["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .find(|t| t["tool"] == "send_customer_message")
            .expect("t")["mode"],
        "person_approves"
    );
    set("wake", "off", &[]);
    // The policy holds from the next call on every worker: wake tools are hidden, and called
    // anyway they answer with the reason.
    for worker in &stack.worker_urls {
        let (_, names) = tool_names(worker, &token).await;
        assert!(
            !names.contains(&"page_technician".to_owned())
                && names.contains(&"send_customer_message".to_owned()),
            "{names:?}"
        );
    }
    let technician = db.technician_with_phone(&slug).await;
    let paged = tool_call(
        &stack.lb_url,
        &token,
        "page_technician",
        json!({"technician": technician, "message": "Boiler down at Elm St"}),
    )
    .await;
    assert_eq!(paged["isError"], true);
    assert_eq!(paged["structuredContent"]["error"]["code"], "turned_off_by_policy", "{paged}");
    assert!(
        paged["content"][0]["text"]
            .as_str()
            .expect("t")
            .starts_with("Error: A tenant admin turned wake actions off"),
        "{paged}"
    );
    // Prepared under person_approves: the agent is told a person decides, and cannot complete it.
    let customer = emailed_customer(&db, &slug).await;
    let customer_email = db.rows("customers").eq("handle", &customer).text("email").await;
    let prepare = |subject: &str| {
        let (lb, token, customer) = (stack.lb_url.clone(), token.clone(), customer.clone());
        let subject = subject.to_owned();
        async move {
            tool_call(&lb, &token, "send_customer_message", json!({"customer": customer, "subject": subject, "body": "Your technician arrives at 9."})).await["structuredContent"].clone()
        }
    };
    let preview = prepare("Arrival time").await;
    assert_eq!(preview["status"], "AWAITING_APPROVAL", "{preview}");
    assert!(preview["next"].as_str().expect("next").contains("must approve"), "{preview}");
    let confirm = json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]});
    let early = tool_call(&stack.lb_url, &token, "confirm_action", confirm.clone()).await;
    assert_eq!(early["structuredContent"]["error"]["code"], "awaiting_approval", "{early}");
    let sent_to_customer = || db.rows("outbox").eq("recipient", &customer_email).count();
    assert_eq!(
        sent_to_customer().await,
        0,
        "nothing reaches the customer before a person approves"
    );
    let admins_told = db
        .messages_with_subject_not_mentioning(
            "Approval needed: send_customer_message from Dispatch agent",
            "Arrival time",
        )
        .await;
    assert!(admins_told >= 2, "the members who can approve are emailed: {admins_told}");
    // Two people approve at once on the console while the agent asks again: one execution.
    let action = preview["action"].as_str().expect("action").to_owned();
    let mut admin = console_as(&stack, &stack.control_url, "admin").await;
    let mut second = console_as(&stack, &control2, "dispatcher").await;
    let page =
        admin.get(&format!("{}/approvals", stack.control_url)).await.text().await.expect("html");
    assert!(
        page.contains(&action) && page.contains("Arrival time") && page.contains("Dispatch agent"),
        "the page shows what waits"
    );
    let count: Value = admin
        .get(&format!("{}/approvals/count", stack.control_url))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(count["count"], 1);
    let (a, b, c) = tokio::join!(
        decide(&stack.control_url, &mut admin, &action, "approve", "customer asked for it"),
        decide(&control2, &mut second, &action, "approve", "looks right"),
        tool_call(&stack.lb_url, &token, "confirm_action", confirm.clone()),
    );
    let approved = [&a, &b]
        .iter()
        .filter(|(s, html)| *s == 200 && html.contains("Approved and executed"))
        .count();
    assert_eq!(approved, 1, "exactly one approval executes: {a:?} {b:?}");
    assert!(c["isError"] == true || c["structuredContent"]["status"] == "EXECUTED", "{c}");
    assert_eq!(sent_to_customer().await, 1, "one email to the customer");
    // The person's approval is the agent's change too: its connection names it.
    let recent = tool_call(&stack.lb_url, &token, "list_recent_changes", json!({})).await;
    let executed = recent["structuredContent"]["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .any(|c| c["action"] == "send_customer_message" && c["outcome"] == "ok");
    assert!(executed, "the agent's recent changes show what a person approved for it: {recent}");
    let done = tool_call(&stack.lb_url, &token, "confirm_action", confirm).await;
    assert_eq!(
        done["structuredContent"]["status"], "EXECUTED",
        "the agent learns it was approved: {done}"
    );
    assert_eq!(db.audited_with_the_decisions_reason("send_customer_message", "console").await, 1);
    // Denied: the agent is told, with the reason; nothing is sent.
    let denied = prepare("Discount offer").await;
    let (status, _) = decide(
        &stack.control_url,
        &mut admin,
        denied["action"].as_str().expect("a"),
        "deny",
        "we do not offer discounts",
    )
    .await;
    assert_eq!(status, 200);
    let told = tool_call(&stack.lb_url, &token, "confirm_action", json!({"confirm_token": denied["confirm_token"], "confirm_summary": denied["confirm_summary"]})).await;
    assert_eq!(told["structuredContent"]["error"]["code"], "action_denied", "{told}");
    assert!(
        told["content"][0]["text"].as_str().expect("t").contains("we do not offer discounts"),
        "{told}"
    );
    assert_eq!(sent_to_customer().await, 1);
    // Changed between preparation and approval: nothing executes, the new version waits.
    let changed = prepare("New address").await;
    db.customer_email_changed_elsewhere(&customer, "moved@example.com").await;
    let (status, html) = decide(
        &stack.control_url,
        &mut admin,
        changed["action"].as_str().expect("a"),
        "approve",
        "ok",
    )
    .await;
    assert_eq!(status, 200);
    assert!(html.contains("changed since it was prepared"), "{html}");
    assert_eq!(db.rows("outbox").eq("recipient", "moved@example.com").count().await, 0);
    // The agent's token follows its action to the new version.
    let follow = json!({"confirm_token": changed["confirm_token"], "confirm_summary": changed["confirm_summary"]});
    let told = tool_call(&stack.lb_url, &token, "confirm_action", follow.clone()).await;
    assert_eq!(told["structuredContent"]["error"]["code"], "awaiting_approval", "{told}");
    let waiting =
        admin.get(&format!("{}/approvals", stack.control_url)).await.text().await.expect("html");
    assert!(waiting.contains("moved@example.com"), "the person sees the new version");
    // Hostile decisions: no CSRF token, an unknown decision, no reason, a foreign or
    // agent-confirmed action: refused, nothing changes.
    let newest = db
        .rows("pending_actions")
        .eq("status", "pending")
        .eq("completion", "person_approves")
        .texts("handle", "id")
        .await
        .pop()
        .expect("an action waiting for a person");
    let url = |d: &str| format!("{}/approvals/{newest}/{d}", stack.control_url);
    assert_eq!(
        admin.post_form(&url("approve"), &[("reason".into(), "no csrf".into())]).await.status(),
        403
    );
    let csrf = csrf_of(&waiting);
    assert_eq!(
        admin
            .post_form(
                &url("execute"),
                &[("csrf".into(), csrf.clone()), ("reason".into(), "x".into())]
            )
            .await
            .status(),
        404
    );
    // A comment is optional but bounded: an over-long one is refused and approves nothing.
    assert_eq!(
        admin
            .post_form(
                &url("approve"),
                &[("csrf".into(), csrf.clone()), ("reason".into(), "x".repeat(501))]
            )
            .await
            .status(),
        422
    );
    for other in ["pac_doesnotexist000000", "con_x", "..%2Fconnections"] {
        let r = admin
            .post_form(
                &format!("{}/approvals/{other}/approve", stack.control_url),
                &[("csrf".into(), csrf.clone()), ("reason".into(), "x".into())],
            )
            .await;
        assert_eq!(r.status(), 404, "{other}");
    }
    assert_eq!(db.rows("outbox").eq("recipient", "moved@example.com").count().await, 0);
    let newest_version = db
        .rows("pending_actions")
        .eq("handle", changed["action"].as_str().expect("a"))
        .text("replaced_by")
        .await;
    let (status, _) =
        decide(&stack.control_url, &mut admin, &newest_version, "approve", "new address checked")
            .await;
    assert_eq!(status, 200);
    let done = tool_call(&stack.lb_url, &token, "confirm_action", follow).await;
    assert_eq!(
        done["structuredContent"]["status"], "EXECUTED",
        "the agent learns the new version was approved: {done}"
    );
    assert_eq!(db.rows("outbox").eq("recipient", "moved@example.com").count().await, 1);
    // A policy change reaches actions already prepared: one the agent could confirm a moment
    // ago now waits for a person, or, turned off, dies.
    set("notify", "agent_confirms", &[]);
    let before = prepare("Prepared before the change").await;
    assert_eq!(before["status"], "PREVIEW", "{before}");
    set("notify", "person_approves", &[]);
    let now_waits = tool_call(&stack.lb_url, &token, "confirm_action", json!({"confirm_token": before["confirm_token"], "confirm_summary": before["confirm_summary"]})).await;
    assert_eq!(now_waits["structuredContent"]["error"]["code"], "awaiting_approval", "{now_waits}");
    set("notify", "agent_confirms", &[]);
    let second_try = prepare("Prepared before off").await;
    set("notify", "off", &[]);
    let dead = tool_call(&stack.lb_url, &token, "confirm_action", json!({"confirm_token": second_try["confirm_token"], "confirm_summary": second_try["confirm_summary"]})).await;
    assert_eq!(dead["structuredContent"]["error"]["code"], "turned_off_by_policy", "{dead}");
    let mut prepared_before = 0;
    for subject in ["Prepared before the change", "Prepared before off"] {
        prepared_before += db.rows("outbox").eq("subject", subject).count().await;
    }
    assert_eq!(prepared_before, 0);
    set("notify", "person_approves", &[]);
    // Expired before anyone decided: refused in the console, and the agent is told.
    let late = prepare("Too late").await;
    let late_action = late["action"].as_str().expect("a").to_owned();
    db.rows("pending_actions")
        .eq("handle", &late_action)
        .set_now_plus("expires_at", "-1 second")
        .await;
    let (status, _) = decide(&stack.control_url, &mut admin, &late_action, "approve", "ok").await;
    assert_eq!(status, 422, "an expired action cannot be approved");
    let told = tool_call(
        &stack.lb_url,
        &token,
        "confirm_action",
        json!({"confirm_token": late["confirm_token"], "confirm_summary": late["confirm_summary"]}),
    )
    .await;
    assert_eq!(told["structuredContent"]["error"]["code"], "token_expired", "{told}");
    assert_eq!(db.rows("outbox").eq("subject", "Too late").count().await, 0);
    // The policy may require that the approver is not the connection's creator.
    set("notify", "person_approves", &["--approver-not-creator"]);
    let guarded = prepare("Reminder").await;
    let guarded_action = guarded["action"].as_str().expect("a").to_owned();
    let (status, _) =
        decide(&control2, &mut second, &guarded_action, "approve", "my own agent").await;
    assert_eq!(status, 409, "the dispatcher created the connection (a refusal by state)");
    let (status, html) =
        decide(&stack.control_url, &mut admin, &guarded_action, "approve", "checked").await;
    assert_eq!((status, html.contains("Approved and executed")), (200, true), "{html}");
    assert_eq!(
        db.rows("audit_log").eq("action", "approval_policy.set").eq("channel", "cli").count().await,
        8
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_confirms_in_its_own_ui_with_a_sealed_single_use_state() {
    let stack = Stack::start(Options::for_test("mrtr", 2)).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let customer = emailed_customer(&db, &slug).await;
    let run = |answer: &str, subject: &str| {
        let out = std::process::Command::new(e2e::python())
            .arg(e2e::repo_root().join("e2e/py/mrtr_check.py"))
            .args(["--url", &format!("{}/mcp", stack.lb_url), "--token", &stack.token(0, 0)])
            .args(["--customer", &customer, "--answer", answer, "--subject", subject])
            .output()
            .expect("the .venv's python (scripts/test makes it)");
        let line = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{line}\n{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_str::<Value>(line.trim()).expect("json")
    };
    let sent = |subject: &str| db.rows("outbox").eq("subject", subject).count();
    // Accepted in the client's own UI: the person saw the server's summary; executed once.
    let accepted = run("accept", "SDK accepted");
    assert_eq!(accepted["status"], "EXECUTED", "{accepted}");
    let asked = accepted["asked"][0].as_str().expect("the person was asked");
    assert!(asked.contains("Email") && asked.contains("SDK accepted"), "{asked}");
    assert_eq!(sent("SDK accepted").await, 1);
    // Declined: nothing is sent and the action is rejected.
    let declined = run("decline", "SDK declined");
    assert_eq!(declined["status"], "REJECTED", "{declined}");
    assert_eq!(sent("SDK declined").await, 0);
    assert_eq!(
        db.rows("pending_actions")
            .eq("status", "rejected")
            .eq("tool", "send_customer_message")
            .count()
            .await,
        1
    );
}

#[tokio::test]
async fn an_admin_approves_in_the_browser_what_a_dispatchers_agent_prepared() {
    let stack = Stack::start(Options::for_test("approve_ui", 1)).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let tenant = stack.tenant(0).clone();
    let slug = tenant["slug"].as_str().expect("slug").to_owned();
    let (agent_token, customer, customer_email) =
        notify_waits_for_a_person(&stack, &db, &slug).await;
    let out = std::process::Command::new("node")
        .arg(e2e::repo_root().join("e2e/browser/approvals.mjs"))
        .args(["--control", &stack.control_url, "--mcp", &format!("{}/mcp", stack.lb_url)])
        .args(["--token", &agent_token, "--customer", &customer])
        .args(["--email", tenant["admin"]["email"].as_str().expect("email")])
        .args(["--password", tenant["admin"]["password"].as_str().expect("password")])
        .arg("--shots")
        .arg(stack.run_dir.join("approval-shots"))
        .output()
        .expect("node (scripts/test installs playwright-core and Chromium)");
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "browser approvals failed:\n{line}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value =
        serde_json::from_str(line.trim().lines().last().unwrap_or_default()).expect("json");
    assert_eq!(seen["live_count_seen"], true, "the count updated without a reload: {seen}");
    assert_eq!(seen["agent_status"], "EXECUTED", "{seen}");
    assert_eq!(seen["denied_code"], "action_denied", "{seen}");
    // Exactly one email reached the customer: the approved one.
    assert_eq!(db.rows("outbox").eq("recipient", &customer_email).count().await, 1);
    let approved = seen["approved_action"].as_str().expect("action");
    let status = db.rows("pending_actions").eq("handle", approved).text("status").await;
    let reason = db
        .rows("pending_actions")
        .eq("handle", approved)
        .opt_text("decision_reason")
        .await
        .unwrap_or_default();
    assert_eq!(format!("{status} {reason}"), "executed customer asked for it");
}

/// The first tenant's notify actions wait for a person; a dispatcher's agent that may send
/// them: its token, and a customer with an email (handle, address).
pub(crate) async fn notify_waits_for_a_person(
    stack: &Stack,
    db: &TestDb,
    slug: &str,
) -> (String, String, String) {
    let agent_token = dispatch_agent(stack, "customers:read,bookings:read,bookings:notify");
    stack
        .ctl(&[
            "approval-policy",
            "set",
            "--tenant",
            slug,
            "--scope",
            "notify",
            "--mode",
            "person_approves",
        ])
        .expect("policy");
    let customer = emailed_customer(db, slug).await;
    let customer_email = db.rows("customers").eq("handle", &customer).text("email").await;
    (agent_token, customer, customer_email)
}

/// A connection of the first tenant's dispatcher named "Dispatch agent", with these rights; its token.
pub(crate) fn dispatch_agent(stack: &Stack, rights: &str) -> String {
    let slug = stack.tenant(0)["slug"].as_str().expect("slug");
    let dispatcher = stack.tenant(0)["dispatcher"]["email"].as_str().expect("email");
    let agent = stack
        .ctl(&[
            "connection",
            "create",
            "--tenant",
            slug,
            "--creator",
            dispatcher,
            "--name",
            "Dispatch agent",
            "--rights",
            rights,
        ])
        .expect("connection");
    agent["token"].as_str().expect("token").to_owned()
}

/// The first customer of a tenant who has an email address.
pub(crate) async fn emailed_customer(db: &TestDb, slug: &str) -> String {
    db.rows("customers")
        .tenant(slug)
        .not_null("email")
        .texts("handle", "id")
        .await
        .into_iter()
        .next()
        .expect("a customer with an email")
}
