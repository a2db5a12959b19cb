//! The load generator: the command line, one scenario's calls and what they measured.

use super::*;

/// How many connections the read scenarios spread their calls over.
pub(super) const READ_CONNECTIONS: usize = 64;

pub(super) struct Args {
    pub(super) concurrency: usize,
    pub(super) seconds: u64,
    pub(super) out: String,
    pub(super) cluster_only: bool,
    /// Only the listen streams: 10,000 idle streams on one worker and change-to-notification
    /// latency across two; writes the benchmark's "Listen streams" section.
    pub(super) listen_only: bool,
    /// Only the read ratio: get_booking straight to one worker against the bare rmcp peer,
    /// alternated three times, on the demo data; prints, writes nothing.
    pub(super) reads_only: bool,
    /// Idle listen streams held by one worker in `--listen-only` (default 10,000).
    pub(super) listen_streams: usize,
    /// Only the policy evaluation micro-benchmark; writes its section.
    pub(super) policy_only: bool,
    /// PgBouncer between the services and Postgres (`--pooler session|transaction`); the
    /// bare peers connect to Postgres itself.
    pub(super) pooler: Option<String>,
}

pub(super) fn args() -> Args {
    let mut a = Args {
        concurrency: 16,
        seconds: 8,
        out: e2e::repo_root().join("docs/benchmarks.md").to_string_lossy().into_owned(),
        cluster_only: false,
        reads_only: false,
        listen_only: false,
        listen_streams: 10_000,
        policy_only: false,
        pooler: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        match argv[i].as_str() {
            "--concurrency" => a.concurrency = argv[i + 1].parse().expect("--concurrency N"),
            "--seconds" => a.seconds = argv[i + 1].parse().expect("--seconds N"),
            "--out" => a.out = argv[i + 1].clone(),
            "--pooler" => {
                let mode = argv.get(i + 1).map(String::as_str);
                assert!(
                    matches!(mode, Some("session" | "transaction")),
                    "--pooler session|transaction"
                );
                a.pooler = mode.map(str::to_owned);
            }
            "--listen-streams" => {
                a.listen_streams = argv[i + 1].parse().expect("--listen-streams N")
            }
            "--cluster-only" => {
                a.cluster_only = true;
                i += 1;
                continue;
            }
            "--reads-only" => {
                a.reads_only = true;
                i += 1;
                continue;
            }
            "--listen-only" => {
                a.listen_only = true;
                i += 1;
                continue;
            }
            "--policy-only" => {
                a.policy_only = true;
                i += 1;
                continue;
            }
            "--help" | "-h" => {
                println!(
                    "gatehouse-bench [--concurrency 16] [--seconds 8] [--out docs/benchmarks.md]\n\
                     gatehouse-bench --cluster-only   (prints the NATS cluster push lag, writes nothing)\n\
                     gatehouse-bench --reads-only [--pooler session|transaction]   (get_booking and find_bookings against the bare rmcp peers, alternated; prints; with --pooler the services go through PgBouncer, the peers straight to Postgres, and the figures go to the section Reads through PgBouncer)\n\
                     gatehouse-bench --listen-only [--listen-streams 10000]   (idle listen streams on one worker, change-to-notification latency and a tenant switch's fan-out; writes the Listen streams section)\n\
                     gatehouse-bench --policy-only    (evaluating a tenant's Cedar policies, 0 to 100 of them, per call; writes the Policy evaluation section)"
                );
                std::process::exit(0);
            }
            other => panic!("unknown argument {other}; see --help"),
        }
        i += 2;
    }
    // The full run writes the page's main sections, measured straight to Postgres.
    assert!(
        a.pooler.is_none() || a.reads_only,
        "--pooler goes with --reads-only (the full run measures the services straight to Postgres)"
    );
    a
}

pub(super) struct Figures {
    pub(super) name: String,
    /// Every call sent, successful or not.
    pub(super) requests: usize,
    /// Calls that were not what a user wanted, by kind (see `e2e::bench`).
    pub(super) errors: BTreeMap<Outcome, usize>,
    /// Successful calls per second.
    pub(super) rate: f64,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) cpu_ms_per_call: Option<f64>,
}

/// Of several runs of one scenario, the one with the median rate.
pub(super) fn median_run(mut runs: Vec<Figures>) -> Figures {
    runs.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    let middle = runs.len() / 2;
    runs.swap_remove(middle)
}

/// The median of some ratios (of an even count, the mean of the middle two).
pub(super) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

pub(super) fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize] as f64 / 1000.0
}

/// CPU time (user + system) of a process in milliseconds.
pub(super) fn cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    Some((fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?) * 10.0)
}

pub(super) fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// What one load scenario sends.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) url: String,
    /// MCP tool name (sets the MCP headers), or None for plain JSON.
    pub(super) tool: Option<&'static str>,
    /// Bearer tokens, taken round-robin per call (many connections keep a read scenario off
    /// any one connection's read bucket); none for the peers.
    pub(super) tokens: Arc<Vec<String>>,
    /// A silent write: a replayed answer is not a success.
    pub(super) write: bool,
    /// The request body; `{n}` in it is replaced by a per-call counter (unique writes) and
    /// `{b}` by a booking handle taken round-robin from `rotate`.
    pub(super) body: String,
    pub(super) rotate: Arc<Vec<String>>,
}

pub(super) fn mcp_body(tool: &str, args: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": args,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string()
}

/// One tools/call of `tool` through `base` (a worker or the balancer), as JSON.
pub(super) async fn call_tool(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    tool: &str,
    args: Value,
) -> anyhow::Result<Value> {
    Ok(http
        .post(format!("{base}/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", tool)
        .bearer_auth(token)
        .body(mcp_body(tool, args))
        .send()
        .await?
        .json()
        .await?)
}

pub(super) async fn send(http: &reqwest::Client, t: &Target, n: u64) -> Outcome {
    let mut body = t.body.replace("{n}", &n.to_string());
    if !t.rotate.is_empty() {
        body = body.replace("{b}", &t.rotate[n as usize % t.rotate.len()]);
    }
    let mut req = http.post(&t.url).header("Content-Type", "application/json").body(body);
    if let Some(tool) = t.tool {
        req = req
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", tool);
    }
    if !t.tokens.is_empty() {
        req = req.bearer_auth(&t.tokens[n as usize % t.tokens.len()]);
    }
    let Ok(response) = req.send().await else { return Outcome::Http(0) };
    let status = response.status().as_u16();
    let Ok(bytes) = response.bytes().await else { return Outcome::Unreadable };
    match t.tool {
        Some(_) => judge_mcp(status, &bytes, t.write),
        None => judge_plain(status, &bytes),
    }
}

pub(super) async fn load(name: &str, t: &Target, args: &Args, pids: &[u32]) -> Result<Figures> {
    let counter = Arc::new(AtomicU64::new(0));
    let run = |secs: u64| {
        (0..args.concurrency)
            .map(|_| {
                let (t, counter) = (t.clone(), counter.clone());
                tokio::spawn(async move {
                    let http = reqwest::Client::new();
                    let deadline = Instant::now() + Duration::from_secs(secs);
                    let (mut latencies, mut errors) = (Vec::new(), BTreeMap::new());
                    while Instant::now() < deadline {
                        let started = Instant::now();
                        let outcome =
                            send(&http, &t, counter.fetch_add(1, Ordering::Relaxed)).await;
                        // Latencies are of successful calls: a refusal is fast and says nothing
                        // of the work a call does.
                        match outcome {
                            Outcome::Ok => latencies.push(started.elapsed().as_micros() as u64),
                            other => *errors.entry(other).or_insert(0usize) += 1,
                        }
                    }
                    (latencies, errors)
                })
            })
            .collect::<Vec<_>>()
    };
    for task in run(2) {
        task.await?;
    }
    let before: Vec<Option<f64>> = pids.iter().map(|p| cpu_ms(*p)).collect();
    let started = Instant::now();
    let (mut latencies, mut errors) = (Vec::new(), BTreeMap::new());
    for task in run(args.seconds) {
        let (l, e) = task.await?;
        latencies.extend(l);
        for (k, n) in e {
            *errors.entry(k).or_insert(0) += n;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu: Option<f64> = pids.iter().zip(&before).map(|(p, b)| Some(cpu_ms(*p)? - (*b)?)).sum();
    latencies.sort_unstable();
    let failed: usize = errors.values().sum();
    eprintln!("  {name}: {:.0}/s ok, {failed} not ok", latencies.len() as f64 / elapsed);
    Ok(Figures {
        name: name.to_owned(),
        requests: latencies.len() + failed,
        errors,
        rate: latencies.len() as f64 / elapsed,
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        cpu_ms_per_call: if pids.is_empty() {
            None
        } else {
            // Per call sent: a refusal costs the server too.
            cpu.map(|c| c / (latencies.len() + failed).max(1) as f64)
        },
    })
}

pub(super) async fn status_of(http: &reqwest::Client, base: &str, token: &str) -> u16 {
    http.post(format!("{base}/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/list")
        .bearer_auth(token)
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}}).to_string())
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// Milliseconds until every worker answers `want`.
pub(super) async fn until_all(
    http: &reqwest::Client,
    workers: &[String],
    token: &str,
    want: u16,
    from: Instant,
) -> f64 {
    loop {
        let mut all = true;
        for w in workers {
            all &= status_of(http, w, token).await == want;
        }
        if all || from.elapsed() > Duration::from_secs(5) {
            return from.elapsed().as_secs_f64() * 1000.0;
        }
    }
}

pub(super) fn summary(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    (at(0.5), at(0.99))
}
