//! `gatehouse-dev`: runs Gatehouse with demo data on fixed loopback ports until Ctrl-C.
//! `scripts/dev` builds the binaries and calls this.

use std::time::Duration;

use e2e::{Options, Stack};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let run_dir = e2e::repo_root().join(".run");
    let _ = std::fs::remove_dir_all(&run_dir);
    let port = |var: &str, default: u16| {
        std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
    };
    let opts = Options {
        workers: 2,
        database: std::env::var("GATEHOUSE_DEV_DB").unwrap_or_else(|_| "gatehouse_dev".into()),
        ports: Some((
            port("GATEHOUSE_LB_PORT", 8000),
            port("GATEHOUSE_CONTROL_PORT", 8080),
            port("GATEHOUSE_WORKER_PORT", 8101),
        )),
        run_dir: run_dir.clone(),
        log_level: "info,sqlx=warn,rmcp=warn".into(),
        db_pool: 8,
        pg_server: e2e::pg_server(),
        smtp_url: std::env::var("GATEHOUSE_SMTP_URL").ok(),
        control_args: Vec::new(),
        // The services inherit this process's environment, OTEL_* included.
        env: Vec::new(),
        nats_nodes: 1,
        pgbouncer: None,
        pgbouncer_transaction: false,
    };
    eprintln!("starting: Postgres database, control plane, 2 workers, nginx…");
    let stack = Stack::start(opts).await?;
    let tenant = stack.tenant(0);
    // The demo seed made the first tenant's admin the platform's operator, so the console
    // shows them the global kill switch and `gatehousectl --as` takes their email.
    let token = stack.token(0, 0);
    let mcp_url = format!("{}/mcp", stack.lb_url);
    println!();
    println!("Gatehouse is running (logs in {}).", run_dir.display());
    println!();
    println!("  Console:   {}/", stack.control_url);
    println!(
        "  Login:     {} / {}   (tenant admin and platform operator)",
        tenant["admin"]["email"].as_str().unwrap_or_default(),
        tenant["admin"]["password"].as_str().unwrap_or_default()
    );
    println!("  MCP URL:   {mcp_url}   (load balancer over {} workers)", stack.worker_urls.len());
    println!(
        "  Token:     {token}   ({}, tenant {})",
        tenant["connections"][0]["name"].as_str().unwrap_or_default(),
        tenant["slug"].as_str().unwrap_or_default()
    );
    println!("  Read-only: {}", stack.token(0, 1));
    println!("  API token: {}", tenant["api_token"].as_str().unwrap_or_default());
    let operator = tenant["admin"]["email"].as_str().unwrap_or_default();
    std::fs::write(run_dir.join("env"), stack.cli_env(operator))?;
    println!(
        "  CLI:       source .run/env && target/debug/gatehousectl audit verify --tenant {}",
        tenant["slug"].as_str().unwrap_or_default()
    );
    println!(
        "             (.run/env carries the stack's database, NATS, keys and operator for every command)"
    );
    println!();
    println!("Connect Claude Code:");
    println!(
        "  claude mcp add --transport http gatehouse {mcp_url} --header \"Authorization: Bearer {token}\""
    );
    println!();
    println!("Everything the demo seeded: {}/seed.json. Ctrl-C stops it all.", run_dir.display());
    std::fs::write(run_dir.join("seed.json"), serde_json::to_string_pretty(&stack.seed)?)?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
        }
    }
    eprintln!("stopping…");
    drop(stack);
    Ok(())
}
