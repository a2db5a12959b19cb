//! Listen streams at scale: idle memory and CPU, and how fast a change reaches every stream.

use super::*;

/// `n` connections of the tenant `slug`, made by its dispatcher with `rights`, in one
/// statement; their tokens (random, as the product makes them).
pub(super) fn bulk_connections(
    stack: &Stack,
    slug: &str,
    n: usize,
    rights: &str,
) -> Result<Vec<String>> {
    let tokens: Vec<String> =
        (0..n).map(|_| shared::secret::generate(shared::secret::CredentialKind::Mcp)).collect();
    let values: Vec<String> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            format!(
                "({i}, '\\x{}'::bytea, 'con_{}')",
                hex::encode(shared::secret::hash_token(t)),
                shared::handle::ConnectionHandle::generate().as_str().trim_start_matches("con_")
            )
        })
        .collect();
    let sql = format!(
        "WITH src(i, hash, handle) AS (VALUES {}),
              who AS (SELECT t.id AS tenant_id, m.person_id FROM tenants t
                      JOIN memberships m ON m.tenant_id = t.id AND m.role = 'dispatcher'
                      WHERE t.slug = '{slug}' LIMIT 1),
              made AS (INSERT INTO connections (tenant_id, handle, creator_id, name, client_name, rights)
                       SELECT who.tenant_id, src.handle, who.person_id, 'listen bench ' || src.i, 'bench', '{{{rights}}}'
                       FROM src, who RETURNING id, handle)
         INSERT INTO connection_tokens (connection_id, kind, token_hash)
         SELECT made.id, 'static', src.hash FROM made JOIN src ON src.handle = made.handle",
        values.join(",")
    );
    // Through stdin: one argument may not hold a statement this long.
    let mut child = Command::new("psql")
        .arg(&stack.database_url)
        .args(["-Atq", "-v", "ON_ERROR_STOP=1", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()?;
    use std::io::Write as _;
    child.stdin.take().context("stdin")?.write_all(sql.as_bytes())?;
    if !child.wait()?.success() {
        bail!("psql could not make the bench's connections");
    }
    Ok(tokens)
}

/// Opens one listen stream and reports each frame's arrival: `ack` first, then `changed`.
/// A plain HTTP/1.1 request on a socket of its own, read as bytes ([`e2e::bench::ListenScanner`]):
/// ten thousand of these share two cores with the worker they measure, so the reader does no
/// more per event than find it and note the time.
pub(super) async fn open_stream(
    url: &str,
    token: &str,
    frames: tokio::sync::mpsc::UnboundedSender<(usize, &'static str, Instant)>,
    id: usize,
) -> Result<()> {
    use e2e::bench::{ListenFrame, ListenScanner};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let rest = url.strip_prefix("http://").context("an http:// URL")?;
    let (authority, path) = match rest.split_once('/') {
        Some((authority, path)) => (authority, format!("/{path}")),
        None => (rest, "/".to_owned()),
    };
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": {
        "notifications": {"toolsListChanged": true},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: subscriptions/listen\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut socket = tokio::net::TcpStream::connect(authority).await?;
    socket.set_nodelay(true)?;
    socket.write_all(request.as_bytes()).await?;
    let mut buf = vec![0u8; 4096];
    let mut head = Vec::new();
    let end = loop {
        let n = socket.read(&mut buf).await?;
        if n == 0 {
            bail!("the worker closed the stream before answering");
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    if !head.starts_with(b"HTTP/1.1 200") {
        bail!("listen answered {}", String::from_utf8_lossy(&head));
    }
    let mut scanner = ListenScanner::default();
    let mut tell = |read: &[u8]| {
        for frame in scanner.feed(read) {
            let kind = match frame {
                ListenFrame::Ack => "ack",
                ListenFrame::Changed => "changed",
                ListenFrame::Error => "error",
            };
            let _ = frames.send((id, kind, Instant::now()));
        }
    };
    tell(&head[end..]);
    loop {
        let n = socket.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        tell(&buf[..n]);
    }
    let _ = frames.send((id, "closed", Instant::now()));
    Ok(())
}

/// A process's resident memory (kB) and CPU time so far (clock ticks), from /proc.
pub(super) fn proc_usage(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("VmRSS")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the command's ')'.
    let ticks = fields.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Ok((rss, ticks))
}

/// Listen requests opened at once: under a worker's in-flight bound (256).
pub(super) const WAVE: usize = 200;

/// Waits for `n` acknowledgements; anything else first is a failure.
pub(super) async fn acks(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(usize, &'static str, Instant)>,
    n: usize,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    for got in 0..n {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some((_, "ack", _))) => {}
            Ok(Some((id, kind, _))) => {
                bail!("stream {id} answered {kind} before its acknowledgement")
            }
            _ => bail!("only {got} of {n} streams were acknowledged"),
        }
    }
    Ok(())
}

/// What the listen bench measured.
pub(super) struct ListenFigures {
    pub(super) idle_streams: usize,
    pub(super) rss_before_kb: u64,
    pub(super) rss_after_kb: u64,
    pub(super) idle_cpu_pct: f64,
    pub(super) opened_in_secs: f64,
    pub(super) rounds: usize,
    pub(super) affected: usize,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) max_ms: f64,
    pub(super) missed: usize,
    pub(super) unaffected: usize,
    pub(super) unaffected_told: usize,
    /// Streams on one worker told that their tenant's switch went off, and how fast.
    pub(super) switch_streams: usize,
    pub(super) switch_p50_ms: f64,
    /// The first stream told: the commit and the push, before the fan-out's own cost.
    pub(super) switch_first_ms: f64,
    /// The switch's own call: its transaction, the commit, the publish.
    pub(super) switch_call_ms: f64,
    /// When the switch's commit was stamped (its push), from the call's start: the streams'
    /// times less this are the times from the commit.
    pub(super) switch_commit_ms: f64,
    /// The worker's own turn of the push over every stream (its log line).
    pub(super) switch_fan_out_ms: f64,
    pub(super) switch_p99_ms: f64,
    pub(super) switch_missed: usize,
}

/// Listen streams at scale: `idle` streams held open on one worker (its RSS and CPU while they
/// idle), then from a committed change to `toolsListChanged` on every affected stream across
/// two workers, with another tenant's streams that must stay silent.
pub(super) async fn listen_bench(idle: usize) -> Result<ListenFigures> {
    let mut opts = Options::for_test("bench_listen", 2);
    opts.log_level = "warn,worker::live=info".into();
    // Room for the idle streams and the rounds' streams on the same worker.
    opts.env.push(("GATEHOUSE_MAX_LISTEN_STREAMS".into(), (idle + 1_000).to_string()));
    opts.db_pool = 8;
    let stack = Stack::start(opts).await?;
    let slug = stack.tenant(0)["slug"].as_str().context("slug")?.to_owned();
    let other = stack.tenant(1)["slug"].as_str().context("slug")?.to_owned();
    let per = worker::listen::MAX_PER_CONNECTION;
    let w1 = format!("{}/mcp", stack.worker_urls[0]);
    let w2 = format!("{}/mcp", stack.worker_urls[1]);
    let pid = stack.pid("worker-1").context("worker-1")?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // The affected streams (tenant 0, both workers) and the unaffected ones (tenant 1).
    let affected_tokens = bulk_connections(&stack, &slug, 50, "bookings:read,bookings:notify")?;
    let unaffected_tokens = bulk_connections(&stack, &other, 25, "bookings:read,bookings:notify")?;
    let mut next = 0usize;
    let mut spawn = |url: &str, token: &str, tx: &tokio::sync::mpsc::UnboundedSender<_>| {
        next += 1;
        let (url, token, tx, id) = (url.to_owned(), token.to_owned(), tx.clone(), next);
        tokio::spawn(async move {
            if let Err(e) = open_stream(&url, &token, tx.clone(), id).await {
                eprintln!("stream {id}: {e}");
                let _ = tx.send((id, "error", Instant::now()));
            }
        });
        next
    };
    // Opened in waves a worker's in-flight bound takes (each listen request is in flight until
    // its stream is acknowledged): a burst past it is shed with 503, as it should be.
    let mut wave: Vec<(String, String)> = Vec::new();
    let mut affected = std::collections::BTreeSet::new();
    let mut unaffected = std::collections::BTreeSet::new();
    for (i, t) in affected_tokens.iter().enumerate() {
        for _ in 0..4 {
            wave.push((if i % 2 == 0 { w1.clone() } else { w2.clone() }, t.clone()));
        }
    }
    let first_unaffected = wave.len();
    for (i, t) in unaffected_tokens.iter().enumerate() {
        for _ in 0..4 {
            wave.push((if i % 2 == 0 { w1.clone() } else { w2.clone() }, t.clone()));
        }
    }
    for (k, chunk) in wave.chunks(WAVE).enumerate() {
        for (j, (url, token)) in chunk.iter().enumerate() {
            let id = spawn(url, token, &tx);
            if k * WAVE + j < first_unaffected {
                affected.insert(id);
            } else {
                unaffected.insert(id);
            }
        }
        acks(&mut rx, chunk.len()).await?;
    }
    // Changes through the service, as the console and the CLI make them.
    let mut ds = shared::Services::connect(&stack.database_url, 2).await?;
    let bus = shared::bus::Bus::connect(&stack.nats_url, Duration::from_secs(5), 1).await?;
    ds = ds.with_bus(bus.clone());
    let admin = stack.tenant(0)["admin"]["email"].as_str().context("admin")?.to_owned();
    let operator =
        shared::services::operators::authenticate(&ds, &admin, shared::ctx::Channel::Cli).await?;
    let tenant = shared::services::admin::tenant_by_slug(&ds, &slug).await?;
    let ctx = shared::OpCtx::for_operator(&operator, shared::services::admin::tenant_ref(&tenant)?);
    let rounds = 20;
    let mut lat_ms = Vec::new();
    let mut missed = 0;
    let mut unaffected_told = 0;
    for round in 0..rounds {
        let mode = if round % 2 == 0 { "off" } else { "agent_confirms" };
        let mode = shared::services::approvals::Completion::parse("mode", mode)?;
        let committed = Instant::now();
        shared::services::approvals::policy_set(&ds, &ctx, "notify", Some(mode), false).await?;
        let mut told = std::collections::BTreeSet::new();
        let until = committed + Duration::from_secs(2);
        while told.len() < affected.len() {
            let left = until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, rx.recv()).await {
                Ok(Some((id, "changed", at))) if affected.contains(&id) => {
                    if told.insert(id) {
                        lat_ms.push((at - committed).as_secs_f64() * 1000.0);
                    }
                }
                Ok(Some((id, "changed", _))) if unaffected.contains(&id) => unaffected_told += 1,
                Ok(Some((id, kind, _))) => bail!("stream {id}: {kind} during round {round}"),
                _ => break,
            }
        }
        missed += affected.len() - told.len();
        // Anything late from this round is counted against the next as nothing else moves.
        tokio::time::sleep(Duration::from_millis(200)).await;
        while let Ok((id, kind, _)) = rx.try_recv() {
            if unaffected.contains(&id) && kind == "changed" {
                unaffected_told += 1;
            }
        }
    }
    lat_ms.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        lat_ms.get(((lat_ms.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN)
    };
    // Idle streams on worker 1: RSS and CPU before and after.
    let (rss_before_kb, _) = proc_usage(pid)?;
    let idle_tokens = bulk_connections(&stack, &slug, idle.div_ceil(per), "bookings:read")?;
    let opening = Instant::now();
    let idle_targets: Vec<&String> =
        idle_tokens.iter().flat_map(|t| std::iter::repeat_n(t, per)).take(idle).collect();
    let mut idle_ids = std::collections::BTreeSet::new();
    for chunk in idle_targets.chunks(WAVE) {
        for t in chunk {
            idle_ids.insert(spawn(&w1, t, &tx));
        }
        acks(&mut rx, chunk.len()).await?;
    }
    let opened_in_secs = opening.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, ticks_before) = proc_usage(pid)?;
    let quiet = Duration::from_secs(10);
    tokio::time::sleep(quiet).await;
    let (rss_after_kb, ticks_after) = proc_usage(pid)?;
    // Clock ticks are 1/100 s on Linux.
    let idle_cpu_pct = (ticks_after - ticks_before) as f64 / quiet.as_secs_f64();
    // The tenant's switch turned off with all of them open on one worker (and the affected
    // streams of this tenant on both): from the commit to every stream told.
    while rx.try_recv().is_ok() {}
    let on_w1: std::collections::BTreeSet<usize> =
        idle_ids.iter().copied().chain(affected.iter().copied().filter(|id| id % 2 == 1)).collect();
    // The commit's own moment: the service stamps its push right after the commit
    // (`bus::publish`), and this reads the stamp off the bus as a worker does.
    let pushes = bus.watch().await.context("NATS is not connected")??;
    let mut pushes = Box::pin(pushes);
    let tenant_handle = tenant.handle.to_string();
    let (called_at, called_ns) = (Instant::now(), shared::bus::now_ns());
    let committed = Instant::now();
    shared::services::admin::kill_switch_set(
        &ds,
        shared::services::admin::SwitchScope::Tenant(&ctx),
        true,
        "benchmark: tenant switch fan-out",
    )
    .await?;
    let switch_call_ms = committed.elapsed().as_secs_f64() * 1000.0;
    let mut switch_ms = Vec::new();
    let mut told = std::collections::BTreeSet::new();
    let until = committed + Duration::from_secs(10);
    let everyone: std::collections::BTreeSet<usize> =
        idle_ids.iter().chain(affected.iter()).copied().collect();
    while told.len() < everyone.len() {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some((id, "changed", at))) if everyone.contains(&id) => {
                if told.insert(id) && on_w1.contains(&id) {
                    switch_ms.push((at - committed).as_secs_f64() * 1000.0);
                }
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    let switch_missed = everyone.len() - told.len();
    let stamp_ns = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(pushed) = futures_util::StreamExt::next(&mut pushes).await {
            let off = shared::bus::Event::TenantAccess { tenant: tenant_handle.clone(), on: false };
            if pushed.event == off && pushed.sent_ns >= called_ns {
                return Some(pushed.sent_ns);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .context("the switch's push was not seen on the bus")?;
    // From the call's start to the commit's stamp, on the same clock as the streams' times.
    let commit_ms =
        (stamp_ns - called_ns) as f64 / 1e6 - (committed - called_at).as_secs_f64() * 1e3;
    // The worker's own account of the switch (one log line): the push's lag and its fan-out.
    let mut switch_fan_out_ms = f64::NAN;
    if let Some(line) =
        stack.log("worker-1").lines().rev().find(|l| l.contains("agents turned away"))
    {
        eprintln!("  worker 1: {}", line.split("INFO").last().unwrap_or(line).trim());
        switch_fan_out_ms = line
            .split("fan_out_ms=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(f64::NAN);
    }
    switch_ms.sort_by(f64::total_cmp);
    let spct = |p: f64| {
        switch_ms
            .get(((switch_ms.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let (switch_p50_ms, switch_p99_ms) = (spct(0.5), spct(0.99));
    let switch_first_ms = switch_ms.first().copied().unwrap_or(f64::NAN);
    let switch_commit_ms = commit_ms;
    let switch_streams = switch_ms.len();
    shared::services::admin::kill_switch_set(
        &ds,
        shared::services::admin::SwitchScope::Tenant(&ctx),
        false,
        "benchmark over",
    )
    .await?;
    Ok(ListenFigures {
        idle_streams: idle,
        rss_before_kb,
        rss_after_kb,
        idle_cpu_pct,
        opened_in_secs,
        rounds,
        affected: affected.len(),
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        max_ms: lat_ms.last().copied().unwrap_or(f64::NAN),
        missed,
        unaffected: unaffected.len(),
        unaffected_told,
        switch_streams,
        switch_p50_ms,
        switch_first_ms,
        switch_call_ms,
        switch_commit_ms,
        switch_fan_out_ms,
        switch_p99_ms,
        switch_missed,
    })
}

/// The benchmark's "Listen streams" section, replacing the one in `out` (or appended).
pub(super) fn write_listen_section(out: &str, f: &ListenFigures) -> Result<()> {
    let verdict = if f.missed == 0
        && f.unaffected_told == 0
        && f.p99_ms < 100.0
        && f.switch_missed == 0
        && f.switch_p99_ms - f.switch_commit_ms < 100.0
    {
        "Every affected stream was told in every round, no unaffected stream was, and both p99s are under the 100 ms target (the policy change's from the start of its call, the switch's from its commit)."
    } else {
        "This run misses the target: see the missed and unaffected counts and the p99s."
    };
    let section = format!(
        "## Listen streams\n\n\
         `scripts/bench --listen-only` (release build, this machine, {date}): a stack of two workers behind nginx.\n\n\
         | figure | result |\n|---|---|\n\
         | idle streams held by one worker | {idle} (opened in {opened:.1} s) |\n\
         | worker RSS before → with them | {before:.1} MiB → {after:.1} MiB ({per_stream:.1} KiB a stream) |\n\
         | worker CPU while they idle (10 s) | {cpu:.1} % of one core |\n\
         | a policy change committed → `toolsListChanged`, every affected stream, both workers | p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms ({n} streams × {rounds} changes) |\n\
         | affected notifications missed | {missed} |\n\
         | another tenant's streams told of the change | {told} of {unaffected} streams × {rounds} changes |\n\
         | the tenant's switch turned off → `toolsListChanged`, every stream of the tenant on one worker, from the commit | first {cfirst:.1} ms, p50 {cp50:.1} ms, p99 **{cp99:.1} ms** ({sn} streams; {smissed} missed) |\n\
         | the same, from the start of the call that turns it off (its transaction, the commit, the publish: {scall:.1} ms; the commit stamped at {scommit:.1} ms) | first {sfirst:.1} ms, p50 {sp50:.1} ms, p99 {sp99:.1} ms |\n\n\
         {verdict} Each change goes through `approvals::policy_set` (as the console and the CLI do); the\n\
         workers learn it from the NATS push, re-read the context once per credential (its streams share\n\
         the answer), and compare the tool lists. A tenant switch turned off needs no read at all: the\n\
         worker holds the switch from the same push, and a turned-away tenant's list is empty; the push itself writes the event straight into each stream's response (docs/architecture.md, \"Live tool lists\"). The load generator reads every stream on the same two cores, each a plain HTTP/1.1 socket whose bytes it scans for the frames' names (`e2e::bench::ListenScanner`; before 2026-12-06 each was a reqwest client decoding its chunks, which cost the shared cores more per event). The idle streams use {per} streams per connection (the per-connection bound).\n\n\
         What bounds the switch's fan-out here is the kernel: a profile of the worker during it (perf, 2026-12-06) spent about 58 % of its samples in `writev`, which on loopback also delivers each event into the reader's socket and wakes the reader, and about 11 % polling the response bodies; the turn of the push itself (`listen::Streams::turn_away`, handing every event to its response) took {fan_out:.1} ms in this run. The load generator reading the streams took about a third of the two cores meanwhile (the same profile). A stream's response is looked at only when something woke it: rmcp's part of the body, and since 2026-12-06 the revocation that ends an SSE response, are each polled only after their own wake (`listen::WokenFlag`), not once for each event written.\n\n\
         An idle stream costs no CPU and no query; its memory is mostly the per-request rmcp service\n\
         that answers it (its channels and request context) and the HTTP connection's buffers, so\n\
         `--max-listen-streams` (default {bound}) is sized to the worker's memory at about this figure each.\n",
        date = jiff::Timestamp::now().strftime("%Y-%m-%d"),
        idle = f.idle_streams,
        opened = f.opened_in_secs,
        before = f.rss_before_kb as f64 / 1024.0,
        after = f.rss_after_kb as f64 / 1024.0,
        per_stream =
            (f.rss_after_kb.saturating_sub(f.rss_before_kb)) as f64 / f.idle_streams.max(1) as f64,
        cpu = f.idle_cpu_pct,
        p50 = f.p50_ms,
        p99 = f.p99_ms,
        max = f.max_ms,
        n = f.affected,
        rounds = f.rounds,
        missed = f.missed,
        told = f.unaffected_told,
        unaffected = f.unaffected,
        per = worker::listen::MAX_PER_CONNECTION,
        bound = worker::listen::DEFAULT_MAX_PER_WORKER,
        sfirst = f.switch_first_ms,
        scall = f.switch_call_ms,
        scommit = f.switch_commit_ms,
        fan_out = f.switch_fan_out_ms,
        cfirst = f.switch_first_ms - f.switch_commit_ms,
        cp50 = f.switch_p50_ms - f.switch_commit_ms,
        cp99 = f.switch_p99_ms - f.switch_commit_ms,
        sp50 = f.switch_p50_ms,
        sp99 = f.switch_p99_ms,
        sn = f.switch_streams,
        smissed = f.switch_missed,
    );
    let current = std::fs::read_to_string(out).unwrap_or_default();
    let updated = match current.find("## Listen streams") {
        Some(start) => {
            let end = current[start + 3..]
                .find("\n## ")
                .map(|e| start + 3 + e + 1)
                .unwrap_or(current.len());
            format!("{}{section}\n{}", &current[..start], &current[end..])
        }
        None => format!("{}\n{section}", current.trim_end()),
    };
    std::fs::write(out, updated)?;
    Ok(())
}
