//! What a fleet feels of a decision: confirmed notifies per second, and the time from a kill
//! switch or a revocation to every worker answering accordingly.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::Stack;
use e2e::bench::Outcome;
use serde_json::json;
use shared::ctx::Channel;
use shared::services::{admin, operators};

use crate::load::*;

/// Confirmed notifies per second: 400 previews of a message to `customer`, then confirmed by
/// `concurrency` clients through the balancer at `lb2`: how many were confirmed, and per second.
pub async fn confirm_rate(
    http: &reqwest::Client,
    lb2: &str,
    token: &str,
    customer: &str,
    concurrency: usize,
) -> Result<(usize, f64)> {
    let mut previews = Vec::new();
    for i in 0..400 {
        let message = json!({"customer": customer, "subject": format!("Bench {i}"), "body": "Benchmark message."});
        let v = call_tool(http, lb2, token, "send_customer_message", message).await?;
        let sc = &v["result"]["structuredContent"];
        previews.push(
            json!({"confirm_token": sc["confirm_token"], "confirm_summary": sc["confirm_summary"]}),
        );
    }
    let queue = Arc::new(std::sync::Mutex::new(previews));
    let started = Instant::now();
    let confirmers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (queue, lb2, token) = (queue.clone(), lb2.to_owned(), token.to_owned());
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                let mut done = 0;
                loop {
                    let Some(args) = queue.lock().expect("queue").pop() else { return done };
                    let t = Target {
                        url: format!("{lb2}/mcp"),
                        tool: Some("confirm_action"),
                        tokens: Arc::new(vec![token.clone()]),
                        write: false,
                        body: mcp_body("confirm_action", args),
                        rotate: Default::default(),
                    };
                    done += usize::from(send(&http, &t, 0).await == Outcome::Ok);
                }
            })
        })
        .collect();
    let mut confirmed = 0;
    for c in confirmers {
        confirmed += c.await?;
    }
    Ok((confirmed, confirmed as f64 / started.elapsed().as_secs_f64()))
}

/// Twenty global kill-switch flips on and off, and twenty revocations of a fresh connection:
/// milliseconds until every worker answers 503, then 200, and until the token is refused.
pub async fn switch_and_revocation(
    stack: &Stack,
    http: &reqwest::Client,
    token: &str,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    // Kill switch and revocation propagation.
    let ds = shared::Services::connect(&stack.database_url, 2)
        .await?
        .with_bus(shared::bus::Bus::connect(&stack.nats_url, Duration::from_secs(5), 1).await?);
    let workers = stack.worker_urls.clone();
    let admin_email = stack.tenant(0)["admin"]["email"].as_str().context("email")?.to_owned();
    let operator = operators::authenticate(&ds, &admin_email, Channel::Cli).await?;
    let (mut on_ms, mut off_ms, mut revoke_ms) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..20 {
        let t0 = Instant::now();
        admin::kill_switch_set(&ds, admin::SwitchScope::Global(&operator), true, "benchmark")
            .await?;
        on_ms.push(until_all(http, &workers, token, 503, t0).await);
        let t1 = Instant::now();
        admin::kill_switch_set(&ds, admin::SwitchScope::Global(&operator), false, "benchmark")
            .await?;
        off_ms.push(until_all(http, &workers, token, 200, t1).await);
    }
    let tenant =
        admin::tenant_by_slug(&ds, stack.tenant(0)["slug"].as_str().context("slug")?).await?;
    let ctx = shared::OpCtx::for_operator(&operator, admin::tenant_ref(&tenant)?);
    for i in 0..20 {
        let c = admin::connection_create(
            &ds,
            &ctx,
            admin::NewConnection {
                creator_email: &admin_email,
                name: &format!("bench {i}"),
                client_name: "bench",
                rights: shared::rights::read_only(),
                toolset: "full",
            },
        )
        .await?;
        until_all(http, &workers, &c.token, 200, Instant::now()).await;
        let t0 = Instant::now();
        admin::connection_revoke(&ds, &ctx, &c.connection, "benchmark").await?;
        revoke_ms.push(until_all(http, &workers, &c.token, 401, t0).await);
    }
    Ok((on_ms, off_ms, revoke_ms))
}
