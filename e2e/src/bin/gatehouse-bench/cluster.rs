//! Push lag on a three-node NATS cluster, with one server stopped.

use super::*;

/// The push-lag histogram of one worker for one kind: (sum of seconds, count).
pub(super) async fn push_lag(http: &reqwest::Client, worker: &str, kind: &str) -> (f64, f64) {
    let text = match http.get(format!("{worker}/metrics")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let value = |series: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    };
    (
        value(&format!("gatehouse_worker_bus_push_lag_seconds_sum{{kind=\"{kind}\"}}")),
        value(&format!("gatehouse_worker_bus_push_lag_seconds_count{{kind=\"{kind}\"}}")),
    )
}

/// Each worker's lag for one change, in milliseconds: every change is applied once per worker,
/// so the histogram's sum grows by exactly that change's lag. `None` for a worker the change
/// did not reach within five seconds.
pub(super) async fn lags_of(
    http: &reqwest::Client,
    workers: &[String],
    kind: &str,
    before: &[(f64, f64)],
) -> Vec<Option<f64>> {
    let started = Instant::now();
    let mut out = vec![None; workers.len()];
    while out.iter().any(Option::is_none) && started.elapsed() < Duration::from_secs(5) {
        for (i, w) in workers.iter().enumerate() {
            if out[i].is_none() {
                let (sum, count) = push_lag(http, w, kind).await;
                if count > before[i].1 {
                    out[i] = Some((sum - before[i].0) * 1000.0);
                }
            }
        }
    }
    out
}

/// Switch and revocation pushes on a three-node NATS cluster, one worker per server: the
/// first third of the flips with every server up, the rest with one stopped. Returns
/// (p50, p99, missed) per phase, over every worker's lag for every change.
pub(super) async fn cluster_propagation() -> Result<[(f64, f64, usize, usize); 2]> {
    let mut opts = Options::for_test("bench_cluster", 3);
    opts.log_level = "warn".into();
    opts.nats_nodes = 3;
    let mut stack = Stack::start(opts).await?;
    let http = reqwest::Client::new();
    let workers = stack.worker_urls.clone();
    for w in &workers {
        let started = Instant::now();
        loop {
            let body: Value = http.get(format!("{w}/readyz")).send().await?.json().await?;
            if body["nats"] == "connected" {
                break;
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!("{w} has no NATS watch");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let ds = shared::Services::connect(&stack.database_url, 2)
        .await?
        .with_bus(shared::bus::Bus::connect(&stack.nats_url, Duration::from_secs(5), 3).await?);
    let admin_email = stack.tenant(0)["admin"]["email"].as_str().context("email")?.to_owned();
    let operator = operators::authenticate(&ds, &admin_email, Channel::Cli).await?;
    let tenant =
        admin::tenant_by_slug(&ds, stack.tenant(0)["slug"].as_str().context("slug")?).await?;
    let ctx = shared::OpCtx::for_operator(&operator, admin::tenant_ref(&tenant)?);
    let mut phases = [(Vec::new(), 0usize), (Vec::new(), 0usize)];
    for (phase, flips) in [(0usize, 10), (1, 20)] {
        if phase == 1 {
            stack.stop_nats_node(0)?;
            let survivors = stack.worker_nats_url(1) + "," + &stack.worker_nats_url(2);
            let started = Instant::now();
            loop {
                let ready =
                    match shared::bus::Bus::connect(&survivors, Duration::from_secs(2), 3).await {
                        Ok(bus) => bus.probe().await.is_ok(),
                        Err(_) => false,
                    };
                if ready {
                    break;
                }
                if started.elapsed() > Duration::from_secs(30) {
                    bail!("the cluster takes no write with one server stopped");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        for i in 0..flips {
            for kind in ["global_kill", "tenant_access", "revoked"] {
                let mut before = Vec::new();
                for w in &workers {
                    before.push(push_lag(&http, w, kind).await);
                }
                match kind {
                    "global_kill" => {
                        admin::kill_switch_set(
                            &ds,
                            admin::SwitchScope::Global(&operator),
                            i % 2 == 0,
                            "benchmark",
                        )
                        .await?;
                    }
                    "tenant_access" => {
                        admin::kill_switch_set(
                            &ds,
                            admin::SwitchScope::Tenant(&ctx),
                            i % 2 == 0,
                            "benchmark",
                        )
                        .await?;
                    }
                    _ => {
                        let c = admin::connection_create(
                            &ds,
                            &ctx,
                            admin::NewConnection {
                                creator_email: &admin_email,
                                name: &format!("cluster bench {phase} {i}"),
                                client_name: "bench",
                                rights: shared::rights::read_only(),
                                toolset: "full",
                            },
                        )
                        .await?;
                        admin::connection_revoke(&ds, &ctx, &c.connection, "benchmark").await?;
                    }
                }
                for lag in lags_of(&http, &workers, kind, &before).await {
                    match lag {
                        Some(ms) => phases[phase].0.push(ms),
                        None => phases[phase].1 += 1,
                    }
                }
            }
        }
    }
    // Leave the switches off for whoever reads this database next.
    admin::kill_switch_set(&ds, admin::SwitchScope::Global(&operator), false, "benchmark").await?;
    let figures = |(lags, missed): &(Vec<f64>, usize)| {
        let (p50, p99) = summary(lags.clone());
        (p50, p99, lags.len(), *missed)
    };
    Ok([figures(&phases[0]), figures(&phases[1])])
}
