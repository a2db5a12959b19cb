//! Live tool lists: the Python SDK's `Client.listen(tools_list_changed=True)` through the load
//! balancer is told of each kind of change to what its connection sees, and of nothing else;
//! a revoked connection's stream ends.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use crate::approvals::dispatch_agent;
use crate::support::*;

/// A listening client: its events as they arrive.
struct Listener {
    child: Child,
    events: mpsc::Receiver<Value>,
}

impl Listener {
    fn start(url: &str, token: &str) -> Listener {
        let mut child = Command::new(e2e::python())
            .arg(e2e::repo_root().join("e2e/py/listen_check.py"))
            .args(["--url", url, "--token", token])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python (scripts/test installs the MCP SDK)");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send(v);
                }
            }
        });
        Listener { child, events }
    }

    /// The next event, waiting at most `secs`.
    fn next(&self, secs: u64) -> Option<Value> {
        self.events.recv_timeout(Duration::from_secs(secs)).ok()
    }

    /// Nothing arrives within `secs`.
    fn silent(&self, secs: u64) -> Result<(), Value> {
        match self.events.recv_timeout(Duration::from_secs(secs)) {
            Ok(v) => Err(v),
            Err(_) => Ok(()),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tools(event: &Value) -> Vec<String> {
    event["tools"]
        .as_array()
        .map(|a| a.iter().filter_map(|t| t.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_hears_each_change_to_its_tool_list_and_nothing_else() {
    let mut opts = Options::for_test("listen", 2);
    opts.log_level = "info,worker=debug,sqlx=warn,rmcp=warn".into();
    let stack = Stack::start(opts).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let mcp = format!("{}/mcp", stack.lb_url);
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let agent = dispatch_agent(&stack, "customers:read,bookings:read,bookings:notify");
    // Another tenant's connection: nothing of tenant 0 concerns it.
    let other = stack.token(1, 0);
    let a = Listener::start(&mcp, &agent);
    let b = Listener::start(&mcp, &other);
    let ready = a.next(30).expect("a acknowledged");
    assert_eq!(ready["event"], "ready", "{ready}");
    assert!(tools(&ready).contains(&"send_customer_message".to_owned()), "{ready}");
    let ready_b = b.next(30).expect("b acknowledged");
    assert_eq!(ready_b["event"], "ready", "{ready_b}");

    // 1. The tenant's approval policy turns notify actions off: they leave the list.
    stack
        .ctl(&["approval-policy", "set", "--tenant", &slug, "--scope", "notify", "--mode", "off"])
        .expect("policy");
    let changed = a.next(20).expect("told of the policy");
    assert_eq!(changed["event"], "changed", "{changed}");
    assert!(!tools(&changed).contains(&"send_customer_message".to_owned()), "{changed}");
    // A change that leaves its list as it was says nothing: policy for a class it cannot use.
    stack
        .ctl(&["approval-policy", "set", "--tenant", &slug, "--scope", "delete", "--mode", "off"])
        .expect("policy");
    assert_eq!(a.silent(3), Ok(()), "an unchanged list is not announced");
    stack
        .ctl(&[
            "approval-policy",
            "set",
            "--tenant",
            &slug,
            "--scope",
            "notify",
            "--mode",
            "person_approves",
        ])
        .expect("policy");
    let changed = a.next(20).expect("told the tools are back");
    assert!(tools(&changed).contains(&"send_customer_message".to_owned()), "{changed}");

    // 2. The creator's role changes: the rights it lost leave the list.
    let dispatcher = stack.tenant(0)["dispatcher"]["email"].as_str().expect("email").to_owned();
    stack
        .ctl(&["person", "set-role", "--tenant", &slug, "--email", &dispatcher, "--role", "viewer"])
        .expect("role");
    let changed = a.next(20).expect("told of the role");
    assert!(!tools(&changed).contains(&"send_customer_message".to_owned()), "{changed}");
    stack
        .ctl(&[
            "person",
            "set-role",
            "--tenant",
            &slug,
            "--email",
            &dispatcher,
            "--role",
            "dispatcher",
        ])
        .expect("role");
    a.next(20).expect("told of the role again");

    // 3. The tenant's switch: off, then on.
    stack
        .ctl(&["kill-switch", "on", "--tenant", &slug, "--reason", "drill"])
        .expect("tenant switch");
    let off = a.next(20).expect("told agents are turned away");
    assert_eq!(off["event"], "changed", "{off}");
    stack
        .ctl(&["kill-switch", "off", "--tenant", &slug, "--reason", "drill over"])
        .expect("tenant switch");
    a.next(20).expect("told agents are back");
    // Nothing of tenant 0 reached tenant 1's stream.
    assert_eq!(b.silent(1), Ok(()), "another tenant's stream stays silent");

    // 4. The global switch concerns everyone.
    stack.ctl(&["kill-switch", "on", "--reason", "drill"]).expect("global");
    assert_eq!(a.next(20).expect("a told")["event"], "changed");
    assert_eq!(b.next(20).expect("b told")["event"], "changed");
    stack.ctl(&["kill-switch", "off", "--reason", "drill over"]).expect("global");
    a.next(20).expect("a told again");
    b.next(20).expect("b told again");

    // 5. A change made while NATS is down reaches the stream when the worker watches again.
    let mut stack = stack;
    stack.stop_nats().expect("stop nats");
    stack
        .ctl(&["approval-policy", "set", "--tenant", &slug, "--scope", "notify", "--mode", "off"])
        .expect("policy while NATS is down");
    assert_eq!(a.silent(2), Ok(()), "nothing can tell it while NATS is away");
    stack.start_nats().expect("start nats");
    let caught_up = a.next(30).expect("re-checked when NATS came back");
    assert_eq!(caught_up["event"], "changed", "{caught_up}");
    assert!(!tools(&caught_up).contains(&"send_customer_message".to_owned()), "{caught_up}");
    assert_eq!(b.silent(2), Ok(()), "a re-check that finds the same list says nothing");

    // 6. Revoking the connection ends its stream at once, with its final result (the SDK's
    //    graceful close, not a stream cut under it); the other goes on.
    let connection = db
        .rows("connections")
        .eq("name", "Dispatch agent")
        .eq("status", "active")
        .text("handle")
        .await;
    stack
        .ctl(&["connection", "revoke", "--tenant", &slug, "--connection", &connection])
        .expect("revoke");
    let end = a.next(20).expect("the stream ended");
    assert_eq!(end["event"], "ended", "ended by the server with its result: {end}");
    assert_eq!(b.silent(2), Ok(()), "the other stream stays open and silent");
}

/// An OAuth access token revoked (RFC 7009) while its tenant's agents are turned away ends the
/// stream it opened at once: a woken stream re-reads its credential, not only the switch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_access_token_revoked_while_its_tenant_is_off_ends_its_stream() {
    let stack = Stack::start(Options::for_test("listen_revoke", 2)).await.expect("stack");
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let granted = oauth_flow::connect(&stack, &["bookings:read"]).await;
    let mcp = format!("{}/mcp", stack.lb_url);
    let a = Listener::start(&mcp, &granted.access);
    // Another credential of the same tenant: the revocation is not its.
    let other = Listener::start(&mcp, &stack.token(0, 0));
    assert_eq!(a.next(30).expect("acknowledged")["event"], "ready");
    assert_eq!(other.next(30).expect("acknowledged")["event"], "ready");
    stack
        .ctl(&["kill-switch", "on", "--tenant", &slug, "--reason", "drill"])
        .expect("tenant switch");
    assert_eq!(a.next(20).expect("told agents are turned away")["event"], "changed");
    assert_eq!(other.next(20).expect("told as well")["event"], "changed");
    // The switch alone ends nothing.
    assert_eq!(a.silent(3), Ok(()), "the stream stays open while its tenant is off");
    let revoked = reqwest::Client::new()
        .post(format!("{}/oauth/revoke", stack.control_url))
        .form(&[("token", granted.access.as_str())])
        .send()
        .await
        .expect("revoke");
    assert_eq!(revoked.status(), 200);
    let end = a.next(20).expect("the stream ended while its tenant was off");
    assert_eq!(end["event"], "ended", "ended by the server with its result: {end}");
    assert_eq!(other.silent(3), Ok(()), "the other credential's stream stays open and silent");
}
