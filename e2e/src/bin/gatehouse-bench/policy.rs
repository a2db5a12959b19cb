//! Evaluating a tenant's Cedar policies per call, in process.

use super::*;

/// Evaluating a tenant's policies for one call, in process (what a worker does per call with a
/// compiled set): sets of 1, 10 and 100 policies, three kinds of call, 200,000 evaluations each.
pub(super) fn policy_bench() -> Result<String> {
    use shared::policies::{Call, Compiled, Principal, Resource};
    let registry = worker::tools::Registry::new();
    let facts = registry.policy_facts();
    let schema = std::sync::Arc::new(
        shared::policies::PolicySchema::new(shared::policies::schema_json(&facts))
            .map_err(anyhow::Error::msg)?,
    );
    let principal = Principal {
        handle: "con_bench".into(),
        role: "admin".into(),
        client: "Claude".into(),
        grant: "static".into(),
        name: "bench".into(),
        creator: "per_bench".into(),
    };
    let now = jiff::Timestamp::now().to_zoned_datetime(jiff::tz::TimeZone::get("Europe/Berlin")?);
    let calls = |tool: &'static str| -> Call<'_> {
        let (args, resource) = match tool {
            "get_booking" => (
                json!({"booking": "bkg_0000000000000001"}),
                Resource::Booking {
                    handle: "bkg_0000000000000001".into(),
                    status: Some("confirmed".into()),
                    hours_until_start: Some(72),
                    region: Some("north".into()),
                },
            ),
            "send_customer_message" => (
                json!({"customer": "cus_0000000000000001", "subject": "Hello", "body": "We arrive at nine."}),
                Resource::Customer {
                    handle: "cus_0000000000000001".into(),
                    region: Some("north".into()),
                    local: Some(now.clone()),
                },
            ),
            _ => (
                json!({"from": "2026-12-01", "to": "2026-12-31", "zone": "Europe/Berlin"}),
                Resource::Tenant("ten_bench".into()),
            ),
        };
        Call {
            connection: &principal,
            tool,
            class: shared::effect::EffectClass::Read,
            phase: "call",
            args,
            resource,
            technician: None,
            budgets: Vec::new(),
            effects: 3,
            now: now.clone(),
        }
    };
    let mut rows = String::new();
    let mut worst_100 = 0.0f64;
    // The last row's set is the 100 with one rule more per tool that reads the context as a
    // whole: every call then builds all of it (the clock, the arguments, the record), as
    // before a call's context held only what its tool's policies read.
    let whole = |source: String| {
        let tools = ["get_booking", "find_bookings", "send_customer_message"];
        tools.iter().fold(source, |acc, tool| {
            acc + &format!(
                "@id(\"bench-whole-{tool}\")\n@reason(\"reads the whole context\")\nforbid (principal, action == Action::\"{tool}\", resource is Booking) when {{ {{\"c\": context}}.c.effects > 1000000 && resource has status && resource.status == \"none\" }};\n"
            )
        })
    };
    let sets = [(1usize, false), (10, false), (100, false), (100, true)];
    for (n, read_whole) in sets {
        let source = e2e::bench::policy_set(n);
        let source = if read_whole { whole(source) } else { source };
        let label = if read_whole { format!("{n} + 1 reading all") } else { n.to_string() };
        let started = Instant::now();
        let compiled = Compiled::compile(&source, schema.clone())
            .map_err(|p| anyhow::anyhow!("the benchmark's set does not compile: {p:?}"))?;
        let compile_ms = started.elapsed().as_secs_f64() * 1000.0;
        for tool in ["get_booking", "find_bookings", "send_customer_message"] {
            let call = calls(tool);
            let mut samples = Vec::with_capacity(200_000);
            for _ in 0..200_000 {
                let t = Instant::now();
                let verdict = compiled.evaluate(&call);
                samples.push(t.elapsed().as_nanos() as u64);
                if verdict != shared::policies::Verdict::Allow {
                    bail!("the benchmark's set refused {tool}: {verdict:?}");
                }
            }
            samples.sort_unstable();
            let at = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
            if n == 100 && !read_whole {
                worst_100 = worst_100.max(at(0.99));
            }
            rows.push_str(&format!(
                "| {label} | {tool} | {:.1} | {:.1} | {:.1} | {compile_ms:.1} |\n",
                at(0.5),
                at(0.99),
                samples[samples.len() - 1] as f64 / 1000.0
            ));
        }
    }
    let verdict = if worst_100 <= 20.0 {
        format!("With 100 policies the worst p99 is {worst_100:.1} µs, inside the 20 µs target.")
    } else {
        format!(
            "With 100 policies the worst p99 is {worst_100:.1} µs: this run misses the 20 µs target."
        )
    };
    Ok(format!(
        "## Policy evaluation\n\n\
         `scripts/bench --policy-only` (release build, this machine, {date}): one tenant's Cedar set, compiled once, \
         evaluated for one call as a worker does (entities and context built from the call as Cedar's values, then the tool's screen through Cedar's evaluator), \
         200,000 times per row, every call allowed (the set's rules never match, so no refusal cuts it short). \
         The sets are like a security team's: rules over tools, arguments, records, local time and batch sizes, \
         spread over ten tools (`e2e::bench::policy_set`), so with 100 policies a call is judged by the 10 scoped to \
         its tool. A set is split by action when compiled: a tool no policy names is allowed without building a \
         request (the rows of 0.1 µs: the one-policy set names only `send_customer_message`). \
         With no policy set the worker evaluates nothing. A call's context holds only what its tool's policies read \
         (found in their JSON form when compiled), and the record's attributes only when one reads the record: the last \
         rows add to the 100 one rule per tool that reads the context as a whole and the record, so every part is built \
         again, as it was for every call before. Each tool's policies are also joined into one screen (their conditions \
         as one disjunction, docs/architecture.md): an allowed call is judged in one pass, and only a call some policy \
         applies to (or fails on) goes on to the set, through Cedar's authorizer, which names the deciding policies.\n\n\
         | policies | call | p50 µs | p99 µs | max µs | compile ms |\n|---|---|---|---|---|---|\n{rows}\n{verdict}\n",
        date = jiff::Timestamp::now().strftime("%Y-%m-%d"),
    ))
}
