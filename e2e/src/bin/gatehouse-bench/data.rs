//! The benchmark's database: the large tables, the skew, plans, and the same statements through pgbench.

use super::*;

pub(super) fn psql(url: &str, sql: &str) -> Result<String> {
    let out = Command::new("psql").arg(url).args(["-Atqc", sql]).output()?;
    if !out.status.success() {
        bail!("psql: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The statement of a `get_booking` call (its context and the booking), through pgbench.
pub(super) fn pgbench(
    stack: &Stack,
    token: &str,
    booking: &str,
    args: &Args,
) -> Result<(Figures, String)> {
    let hash = hex::encode(shared::secret::hash_token(token));
    // The first page of notes: no cursor.
    let sql = shared::services::read_path_statement()
        .replace("$1", &format!("'\\x{hash}'::bytea"))
        .replace("$2", &format!("'{booking}'"))
        .replace("$3", "NULL")
        .replace("$4", "NULL");
    let one_line = |sql: &str| sql.split_whitespace().collect::<Vec<_>>().join(" ");
    let script = stack.run_dir.join("pgbench-get-booking.sql");
    std::fs::write(&script, format!("{};\n", one_line(&sql)))?;
    let plans = format!(
        "-- the connection context and the booking with its latest notes, one statement\n{}",
        explain(&stack.database_url, &sql)?,
    );
    Ok((
        pgbench_run(
            stack,
            "same SQL through pgbench (context and lookup, one statement)",
            &[script],
            args,
        )?,
        plans,
    ))
}

/// Rows the large-table load adds (tenants; bookings per tenant; connections per tenant; tokens
/// per connection): 100 tenants of 10,000 bookings, 100,000 connections, 1,000,000 tokens.
pub(super) const BULK: (i64, i64, i64, i64) = (100, 10_000, 1_000, 10);

/// Fills the database as a large deployment would be, before any scenario runs, so every
/// figure is measured against big tables and their indexes. Returns the seconds it took.
pub(super) fn bulk_load(url: &str) -> Result<f64> {
    let (tenants, bookings, connections, tokens) = BULK;
    let started = Instant::now();
    let hex = |expr: &str| format!("lpad(to_hex({expr}), 16, '0')");
    for sql in [
        format!(
            "INSERT INTO tenants (handle, slug, name, currency, zone)
             SELECT 'ten_' || {}, 'bulk-' || t, 'Bulk tenant ' || t, 'EUR', 'Europe/Berlin'
             FROM generate_series(1, {tenants}) t",
            hex("900000000 + t")
        ),
        format!(
            "WITH p AS (INSERT INTO people (handle, email, name)
                        SELECT 'per_' || {}, 'bulk-admin-' || t || '@example.net', 'Bulk admin ' || t
                        FROM generate_series(1, {tenants}) t RETURNING id, email)
             INSERT INTO memberships (tenant_id, person_id, role)
             SELECT t.id, p.id, 'admin' FROM p JOIN tenants t ON t.slug = 'bulk-' || split_part(split_part(p.email, '@', 1), '-', 3)",
            hex("900000000 + t")
        ),
        format!(
            "INSERT INTO services (tenant_id, handle, name, duration_minutes, price_minor, tax_rate_bp)
             SELECT id, 'svc_' || {}, 'Service', 60, 10000, 1900 FROM tenants WHERE slug LIKE 'bulk-%'",
            hex("900000000 + id")
        ),
        format!(
            "INSERT INTO technicians (tenant_id, handle, name) SELECT id, 'tec_' || {}, 'Technician' FROM tenants WHERE slug LIKE 'bulk-%'",
            hex("900000000 + id")
        ),
        format!(
            "INSERT INTO customers (tenant_id, handle, name, email)
             SELECT t.id, 'cus_' || {}, 'Customer ' || i, 'customer' || i || '@example.net'
             FROM tenants t, generate_series(1, 10) i WHERE t.slug LIKE 'bulk-%'",
            hex("900000000 + t.id * 100 + i")
        ),
        format!(
            "INSERT INTO bookings (tenant_id, handle, customer_id, technician_id, service_id, starts_at, zone, status,
                                   currency, net_minor, tax_minor, total_minor)
             SELECT t.id, 'bkg_' || {}, c.ids[1 + i % 10], tec.id, s.id,
                    now() + (i % 4000) * interval '1 hour', 'Europe/Berlin', 'confirmed', 'EUR', 10000, 1900, 11900
             FROM tenants t
             JOIN LATERAL (SELECT array_agg(id ORDER BY id) ids FROM customers WHERE tenant_id = t.id) c ON true
             JOIN technicians tec ON tec.tenant_id = t.id
             JOIN services s ON s.tenant_id = t.id,
             generate_series(1, {bookings}) i
             WHERE t.slug LIKE 'bulk-%'",
            hex("9000000000 + t.id * 100000 + i")
        ),
        format!(
            "INSERT INTO connections (tenant_id, handle, creator_id, name, client_name, rights)
             SELECT m.tenant_id, 'con_' || {}, m.person_id, 'Bulk agent ' || i, 'bulk', ARRAY['bookings:read', 'customers:read']
             FROM memberships m JOIN tenants t ON t.id = m.tenant_id, generate_series(1, {connections}) i
             WHERE t.slug LIKE 'bulk-%'",
            hex("9000000000 + m.tenant_id * 10000 + i")
        ),
        format!(
            "INSERT INTO connection_tokens (connection_id, kind, token_hash, expires_at)
             SELECT c.id, CASE WHEN k = 1 THEN 'static' ELSE 'access' END,
                    sha256(convert_to('bulk-' || c.id || '-' || k, 'UTF8')),
                    CASE WHEN k = 1 THEN NULL ELSE now() + interval '1 day' END
             FROM connections c, generate_series(1, {tokens}) k WHERE c.client_name = 'bulk'"
        ),
        "VACUUM ANALYZE".to_owned(),
    ] {
        psql(url, &sql)?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// What a year of use leaves in the benchmark's tenant: three of its bookings with ten thousand
/// notes each (the notes' statistics skewed), a write phase that rewrites a fifth of the
/// bookings and deletes some notes (dead rows left for autovacuum), then a plain `ANALYZE`, as
/// autovacuum's analyze runs it: the statistics the pipe's plans must not follow.
pub(super) fn skew(url: &str, slug: &str) -> Result<()> {
    for sql in [
        format!(
            "INSERT INTO booking_notes (tenant_id, handle, booking_id, source, body)
             SELECT b.tenant_id, 'bnt_hot' || b.id || '_' || g, b.id, 'customer', 'note ' || g
             FROM (SELECT b.* FROM bookings b JOIN tenants t ON t.id = b.tenant_id
                   WHERE t.slug = '{slug}' ORDER BY b.starts_at DESC LIMIT 3) b,
                  generate_series(1, 10000) g"
        ),
        "UPDATE bookings SET net_minor = net_minor WHERE id % 5 = 0".to_owned(),
        "DELETE FROM booking_notes WHERE handle LIKE 'bnt_hot%' AND id % 7 = 0".to_owned(),
        "ANALYZE".to_owned(),
    ] {
        psql(url, &sql)?;
    }
    Ok(())
}

/// The worker's pipe statements and how Postgres planned their executions (generic, custom),
/// from the worker's own metric.
pub(super) async fn plan_counts(
    http: &reqwest::Client,
    worker: &str,
) -> Result<Vec<(String, i64, i64)>> {
    let text = http.get(format!("{worker}/metrics")).send().await?.text().await?;
    let mut counts: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("gatehouse_worker_pipe_plan_executions{")) {
        let label = |name: &str| {
            let at = line.find(&format!("{name}=\""))? + name.len() + 2;
            line[at..].split('"').next().map(str::to_owned)
        };
        let (Some(statement), Some(plan)) = (label("statement"), label("plan")) else { continue };
        let value: i64 =
            line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) as i64;
        let entry = counts.entry(statement).or_default();
        if plan == "generic" {
            entry.0 += value;
        } else {
            entry.1 += value;
        }
    }
    Ok(counts.into_iter().map(|(s, (g, c))| (s, g, c)).collect())
}

/// The plan Postgres runs for a statement, as it ran it.
pub(super) fn explain(url: &str, sql: &str) -> Result<String> {
    psql(url, &format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {sql}"))
}

/// Runs a pgbench script with the scenarios' concurrency and duration (prepared statements).
pub(super) fn pgbench_run(
    stack: &Stack,
    name: &str,
    scripts: &[std::path::PathBuf],
    args: &Args,
) -> Result<Figures> {
    let logs = stack.run_dir.join("pgbench-logs");
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs)?;
    let out = Command::new("pgbench")
        .current_dir(&logs)
        // The plan settings of Gatehouse's pipe.
        .env("PGOPTIONS", "-c plan_cache_mode=force_generic_plan")
        .args([
            "-n",
            "-M",
            "prepared",
            "-l",
            "-c",
            &args.concurrency.to_string(),
            "-j",
            "2",
            "-T",
            &args.seconds.to_string(),
        ])
        // Several scripts are picked at random per transaction, with equal weights.
        .args(scripts.iter().flat_map(|s| ["-f".to_owned(), format!("{}@1", s.display())]))
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
        .context("tps")?;
    let mut latencies = Vec::new();
    for entry in std::fs::read_dir(&logs)? {
        for line in std::fs::read_to_string(entry?.path())?.lines() {
            if let Some(us) = line.split_whitespace().nth(2).and_then(|v| v.parse::<u64>().ok()) {
                latencies.push(us);
            }
        }
    }
    latencies.sort_unstable();
    eprintln!("  pgbench: {tps:.0}/s");
    Ok(Figures {
        name: name.into(),
        requests: latencies.len(),
        // pgbench stops at the first failed statement (exit status above), so none counted.
        errors: BTreeMap::new(),
        rate: tps,
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        cpu_ms_per_call: None,
    })
}

/// A literal for a pgbench script.
pub(super) fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Replaces `$1`…`$n` of a statement with literals (highest first, so `$1` never eats `$12`).
pub(super) fn bind_all(sql: &str, values: &[String]) -> String {
    let mut out = sql.to_owned();
    for (i, v) in values.iter().enumerate().rev() {
        out = out.replace(&format!("${}", i + 1), v);
    }
    // A statement that gained a parameter must not run with a placeholder left in it.
    let left = out
        .match_indices('$')
        .any(|(at, _)| out[at + 1..].chars().next().is_some_and(|c| c.is_ascii_digit()));
    assert!(!left, "a statement takes more parameters than the benchmark binds: {out}");
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The statements of a silent write (`add_booking_note`) through pgbench, in one transaction
/// after the context and the rate window, each note with its own handle and replay digest.
/// The silent write's statements through pgbench, one script per booking (`bookings`: handle
/// and id), picked at random per transaction as the Gatehouse scenario rotates over them.
pub(super) fn pgbench_write(
    stack: &Stack,
    token: &str,
    bookings: &[(String, String)],
    args: &Args,
) -> Result<Figures> {
    let hash = hex::encode(shared::secret::hash_token(token));
    let row = psql(
        &stack.database_url,
        &format!(
            "SELECT c.id || '|' || c.tenant_id || '|' || c.creator_id || '|' || c.name || '|' || c.client_name
             FROM connection_tokens t JOIN connections c ON c.id = t.connection_id
             WHERE t.token_hash = '\\x{hash}'::bytea"
        ),
    )?;
    let f: Vec<&str> = row.split('|').collect();
    if f.len() != 5 {
        bail!("the write peer's connection: {row}");
    }
    let (connection, tenant, person, name, client) = (f[0], f[1], f[2], f[3], f[4]);
    let (context_sql, _) = shared::services::read_path_statements();
    let [rate, lock, find, locked, note, replay, audit] = shared::services::write_path_statements();
    // pgbench reads `:name` as a variable even inside a literal: the lock key's colons are
    // spelled chr(58).
    let digest = "'d' || CAST(:r AS text)";
    let handle = "'bnt_' || substr(md5(random()::text || CAST(:r AS text)), 1, 16)";
    let s = |v: &str| v.to_owned();
    let mut scripts = Vec::new();
    for (i, (booking, booking_id)) in bookings.iter().enumerate() {
        let script = [
            "\\set r random(1, 2000000000)".to_owned(),
            bind_all(context_sql, &[format!("'\\x{hash}'::bytea")]) + ";",
            bind_all(rate, &[s(connection), s(tenant), quoted("silent_write"), s("60")]) + ";",
            "BEGIN;".to_owned(),
            bind_all(
                lock,
                &[
                    format!("'replay' || chr(58) || 'add_booking_note' || chr(58) || {digest}"),
                    s(connection),
                ],
            ) + ";",
            bind_all(find, &[s(connection), quoted("add_booking_note"), s(digest), s("600")]) + ";",
            bind_all(locked, &[s(tenant), quoted(booking)]) + ";",
            bind_all(
                note,
                &[
                    s(tenant),
                    s(handle),
                    s(booking_id),
                    quoted("staff"),
                    s(person),
                    quoted("bench note"),
                ],
            ) + ";",
            bind_all(
                replay,
                &[s(connection), quoted("add_booking_note"), s(digest), s("NULL"), s("'{}'")],
            ) + ";",
            bind_all(
                audit,
                &[
                    s(tenant),
                    quoted("mcp"),
                    s(person),
                    s(connection),
                    quoted(name),
                    quoted(client),
                    quoted("add_booking_note"),
                    quoted("ok"),
                    format!("ARRAY[{}]::text[]", quoted(booking)),
                    quoted("bench"),
                    s("NULL"),
                    s("NULL"),
                    s("NULL"),
                    // change: a note changes no setting.
                    s("NULL"),
                    // policy: no set in force.
                    s("NULL"),
                    // The argument facts a policy simulation replays, as the worker keeps them.
                    format!(
                        "{}::jsonb",
                        quoted(&serde_json::json!({"booking": booking}).to_string())
                    ),
                ],
            ) + ";",
            "COMMIT;".to_owned(),
        ]
        .join("\n");
        let path = stack.run_dir.join(format!("pgbench-add-note-{i}.sql"));
        std::fs::write(&path, script + "\n")?;
        scripts.push(path);
    }
    pgbench_run(
        stack,
        "same write statements through pgbench (context, rate window, one transaction)",
        &scripts,
        args,
    )
}
