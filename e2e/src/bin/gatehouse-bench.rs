//! `gatehouse-bench`: measures a read tool call end to end and the database work under it,
//! side by side on one machine, and writes the figures to `docs/benchmarks.md`.
//!
//! Scenarios, all at the same concurrency with the same booking:
//! - `get_booking` straight to one worker;
//! - `get_booking` through nginx over two workers;
//! - the same two SQL statements (connection context + booking lookup) through `pgbench`.
//!
//! Run it with `scripts/bench` (release build). The load generator runs on the same two cores
//! as the servers, so absolute rates are lower than on a dedicated load machine; the ratios
//! are what to compare.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Options, Stack};
use serde_json::{Value, json};

struct Args {
    concurrency: usize,
    seconds: u64,
    out: String,
}

fn args() -> Args {
    let mut a = Args {
        concurrency: 16,
        seconds: 10,
        out: e2e::repo_root().join("docs/benchmarks.md").to_string_lossy().into_owned(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        match argv[i].as_str() {
            "--concurrency" => a.concurrency = argv[i + 1].parse().expect("--concurrency N"),
            "--seconds" => a.seconds = argv[i + 1].parse().expect("--seconds N"),
            "--out" => a.out = argv[i + 1].clone(),
            "--help" | "-h" => {
                println!(
                    "gatehouse-bench [--concurrency 16] [--seconds 10] [--out docs/benchmarks.md]"
                );
                std::process::exit(0);
            }
            other => panic!("unknown argument {other}; see --help"),
        }
        i += 2;
    }
    a
}

struct Figures {
    name: String,
    requests: usize,
    errors: usize,
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_ms_per_request: Option<f64>,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx] as f64 / 1000.0
}

/// CPU time (user + system) of a process in milliseconds, from /proc.
fn cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = stat.rsplit(')').next()?;
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks * 10.0) // USER_HZ is 100 on Linux
}

fn tool_call_body(booking: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "get_booking", "arguments": {"booking": booking},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}}})
}

async fn load(
    name: &str,
    url: &str,
    token: &str,
    booking: &str,
    args: &Args,
    pids: &[u32],
) -> Result<Figures> {
    let body = serde_json::to_vec(&tool_call_body(booking))?;
    let run = |secs: u64| {
        let body = body.clone();
        let url = url.to_owned();
        let token = token.to_owned();
        let tasks: Vec<_> = (0..args.concurrency)
            .map(|_| {
                let (body, url, token) = (body.clone(), url.clone(), token.clone());
                tokio::spawn(async move {
                    let http = reqwest::Client::new();
                    let deadline = Instant::now() + Duration::from_secs(secs);
                    let mut latencies = Vec::new();
                    let mut errors = 0usize;
                    while Instant::now() < deadline {
                        let started = Instant::now();
                        let response = http
                            .post(&url)
                            .header("Content-Type", "application/json")
                            .header("Accept", "application/json, text/event-stream")
                            .header("MCP-Protocol-Version", "2026-07-28")
                            .header("Mcp-Method", "tools/call")
                            .header("Mcp-Name", "get_booking")
                            .bearer_auth(&token)
                            .body(body.clone())
                            .send()
                            .await;
                        let ok = match response {
                            Ok(r) if r.status().is_success() => r
                                .bytes()
                                .await
                                .map(|b| !b.windows(13).any(|w| w == b"\"isError\":true"))
                                .unwrap_or(false),
                            _ => false,
                        };
                        latencies.push(started.elapsed().as_micros() as u64);
                        if !ok {
                            errors += 1;
                        }
                    }
                    (latencies, errors)
                })
            })
            .collect();
        tasks
    };
    // Warm up pools, prepared statements and keep-alive connections.
    for t in run(2) {
        t.await?;
    }
    let cpu_before: Vec<Option<f64>> = pids.iter().map(|p| cpu_ms(*p)).collect();
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in run(args.seconds) {
        let (l, e) = t.await?;
        latencies.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_after: Vec<Option<f64>> = pids.iter().map(|p| cpu_ms(*p)).collect();
    latencies.sort_unstable();
    let cpu: Option<f64> =
        cpu_before.iter().zip(&cpu_after).map(|(b, a)| Some((*a)? - (*b)?)).sum();
    Ok(Figures {
        name: name.to_owned(),
        requests: latencies.len(),
        errors,
        rate: latencies.len() as f64 / elapsed,
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
        cpu_ms_per_request: cpu.map(|c| c / latencies.len().max(1) as f64),
    })
}

/// The same two statements a `get_booking` call runs, through pgbench.
fn pgbench(stack: &Stack, token: &str, booking: &str, args: &Args) -> Result<Figures> {
    let tenant_id = psql_scalar(
        &stack.database_url,
        &format!("SELECT tenant_id FROM bookings WHERE handle = '{booking}'"),
    )?;
    let hash = hex::encode(shared::secret::hash_token(token));
    let context =
        shared::datastore::CONNECTION_CONTEXT_SQL.replace("$1", &format!("'\\x{hash}'::bytea"));
    let lookup = shared::datastore::booking_get_sql()
        .replace("$1", &tenant_id)
        .replace("$2", &format!("'{booking}'"));
    let script = stack.run_dir.join("pgbench-get-booking.sql");
    // pgbench reads one statement per line unless it ends with a semicolon.
    let one_line = |sql: &str| sql.split_whitespace().collect::<Vec<_>>().join(" ");
    std::fs::write(&script, format!("{};\n{};\n", one_line(&context), one_line(&lookup)))?;
    let log_dir = stack.run_dir.join("pgbench-logs");
    let _ = std::fs::remove_dir_all(&log_dir);
    std::fs::create_dir_all(&log_dir)?;
    let out = Command::new("pgbench")
        .current_dir(&log_dir)
        .args(["-n", "-M", "prepared", "-l"])
        .args(["-c", &args.concurrency.to_string(), "-j", "2", "-T", &args.seconds.to_string()])
        .arg("-f")
        .arg(&script)
        .arg(&stack.database_url)
        .output()
        .context("run pgbench")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!("pgbench failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    }
    let tps: f64 = text
        .lines()
        .find(|l| l.starts_with("tps ="))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
        .context("pgbench printed no tps")?;
    let mut latencies = Vec::new();
    for entry in std::fs::read_dir(&log_dir)? {
        for line in std::fs::read_to_string(entry?.path())?.lines() {
            if let Some(us) = line.split_whitespace().nth(2).and_then(|v| v.parse::<u64>().ok()) {
                latencies.push(us);
            }
        }
    }
    latencies.sort_unstable();
    Ok(Figures {
        name: "same SQL through pgbench (context + lookup)".into(),
        requests: latencies.len(),
        errors: 0,
        rate: tps,
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
        cpu_ms_per_request: None,
    })
}

fn psql_scalar(url: &str, sql: &str) -> Result<String> {
    let out = Command::new("psql").arg(url).args(["-Atqc", sql]).output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| format!("{} GiB", kb / 1024 / 1024))
        .unwrap_or_default();
    format!("{cores} cores ({cpu}), {mem}")
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = args();
    let mut opts = Options::for_test("bench", 2);
    opts.log_level = "warn".into();
    opts.db_pool = 16;
    let stack = Stack::start(opts).await?;
    let token = stack.token(0, 0);
    let http = reqwest::Client::new();
    let found: Value = http
        .post(format!("{}/mcp", stack.worker_urls[0]))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "find_bookings")
        .bearer_auth(&token)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "find_bookings", "arguments": {"limit": 1},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}}))
        .send()
        .await?
        .json()
        .await?;
    let booking = found["result"]["structuredContent"]["bookings"][0]["booking"]
        .as_str()
        .context("a booking")?
        .to_owned();
    let worker_pids: Vec<u32> =
        ["worker-1", "worker-2"].iter().filter_map(|w| stack.pid(w)).collect();

    eprintln!("measuring get_booking straight to one worker…");
    let direct = load(
        "get_booking straight to one worker",
        &format!("{}/mcp", stack.worker_urls[0]),
        &token,
        &booking,
        &args,
        &worker_pids[..1],
    )
    .await?;
    eprintln!("measuring get_booking through nginx over two workers…");
    let balanced = load(
        "get_booking through nginx, two workers",
        &format!("{}/mcp", stack.lb_url),
        &token,
        &booking,
        &args,
        &worker_pids,
    )
    .await?;
    eprintln!("measuring the same SQL through pgbench…");
    let sql = pgbench(&stack, &token, &booking, &args)?;

    let rows: String = [&direct, &balanced, &sql]
        .iter()
        .map(|f| {
            format!(
                "| {} | {:.0} | {:.2} | {:.2} | {} | {} | {} |\n",
                f.name,
                f.rate,
                f.p50_ms,
                f.p99_ms,
                f.cpu_ms_per_request.map(|c| format!("{c:.3}")).unwrap_or_else(|| "–".into()),
                f.requests,
                f.errors
            )
        })
        .collect();
    let report = format!(
        "# Benchmarks\n\n\
         Measured by `scripts/bench` ({concurrency} concurrent clients, {seconds} s per scenario after a 2 s warm-up), \
         which builds the release binaries and runs `target/release/gatehouse-bench`. The figures below are from the last run.\n\n\
         - Machine: {machine}. Postgres and NATS are the local Debian packages; the load generator, nginx, \
         the workers and Postgres all share these cores, so absolute rates are lower than with a separate load machine.\n\
         - Each `get_booking` call: HTTP POST with a bearer token → one SQL query for the connection context \
         (token, connection, tenant, switches, creator's membership) → one SQL query for the booking with its \
         customer, technician, service and notes → presenter → JSON.\n\
         - The pgbench row runs exactly those two statements (prepared) at the same concurrency: \
         the database work alone, the ceiling for any MCP layer on this machine.\n\n\
         | scenario | calls/s | p50 ms | p99 ms | worker CPU ms per call | calls | errors |\n\
         |---|---|---|---|---|---|---|\n{rows}\n\
         Ratios: one worker reaches {r1:.0} % of the database-only rate; through nginx over two workers {r2:.0} %.\n\n\
         Reproduce: `scripts/bench` (options: `scripts/bench --concurrency 16 --seconds 10`).\n",
        concurrency = args.concurrency,
        seconds = args.seconds,
        machine = machine(),
        r1 = 100.0 * direct.rate / sql.rate,
        r2 = 100.0 * balanced.rate / sql.rate,
    );
    std::fs::write(&args.out, &report)?;
    println!("{report}");
    Ok(())
}
