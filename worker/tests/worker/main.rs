//! The worker's contract suite: every tool through the real HTTP endpoint, from a raw JSON-RPC
//! client that ignores every hint (R1), against a real Postgres database cloned per test.
//!
//! One test binary (STYLE 6), one module per resource or concern. What a model reads is
//! snapshotted here, at the binary's root, so the snapshots keep their names (STYLE 7).

mod architecture;
mod batches;
mod budgets;
mod database;
mod entry;
mod isolation;
mod limits;
mod listen;
mod live_rights;
mod operations;
mod policies;
mod reads;
mod registry_matrix;
mod support;
mod tasks;
mod two_step;
mod writes;

use support::*;

/// Replaces what differs between runs — handles, tokens, times — so a snapshot shows only what
/// a change to the product changes.
fn normalized(text: &str) -> String {
    const PREFIXES: [&str; 11] =
        ["bkg_", "cus_", "tec_", "svc_", "alr_", "pac_", "cfm_", "con_", "bnt_", "gh_mcp_", "v_"];
    const WEEKDAYS: [&str; 7] = ["Mon ", "Tue ", "Wed ", "Thu ", "Fri ", "Sat ", "Sun "];
    let mut out = String::new();
    let mut rest = text;
    'scan: while !rest.is_empty() {
        for p in PREFIXES {
            if rest.starts_with(p) {
                let len = rest[p.len()..]
                    .find(|c: char| !c.is_ascii_alphanumeric())
                    .unwrap_or(rest.len() - p.len());
                out.push_str(p);
                out.push('…');
                rest = &rest[p.len() + len..];
                continue 'scan;
            }
        }
        // A display time: `Tue 2 Dec 2026, 09:00 CET`.
        if WEEKDAYS.iter().any(|w| rest.starts_with(w))
            && let Some(comma) = rest.find(", ").filter(|c| *c <= 16)
            && rest.as_bytes().get(comma + 4) == Some(&b':')
        {
            let after = &rest[comma + 7..];
            let zone = after
                .trim_start()
                .find(|c: char| !c.is_ascii_alphanumeric() && c != '+' && c != '-')
                .unwrap_or(after.trim_start().len());
            out.push_str("<time>");
            rest = &after.trim_start()[zone..];
            continue;
        }
        let c = rest.chars().next().expect("char");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[tokio::test]
async fn what_a_model_reads_is_snapshotted() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    // Tool names, descriptions, schemas and annotations, as a full connection lists them.
    let tools = serde_json::to_string_pretty(&stack.list(&token).await).expect("json");
    insta::with_settings!({ snapshot_path => "../snapshots" }, {
        insta::assert_snapshot!("tools_list", tools);
    });
    // Every kind of error text a model can meet, with its fix (the JSON line is checked by the contract).
    let fixture = stack.fixture(0).await;
    let read_only = stack.token(0, 1);
    let small = stack.connection_with("small").await;
    let stale =
        stack.ok(&token, "get_customer", json!({"customer": fixture.customer})).await["version"]
            .clone();
    stack
        .ok(
            &token,
            "update_customer",
            json!({"customer": fixture.customer, "version": stale, "name": "Changed Meanwhile"}),
        )
        .await;
    let preview =
        stack.ok(&token, "mute_alerts", json!({"rule": fixture.rule, "minutes": 30})).await;
    let calls: Vec<(&str, &str, Value)> = vec![
        ("not_found", "get_booking", json!({"booking": "bkg_0000000000000000"})),
        ("missing argument", "get_booking", json!({})),
        ("unknown field", "get_booking", json!({"booking": fixture.noted, "tenant_id": 2})),
        ("not an option", "find_bookings", json!({"status": "pending"})),
        (
            "nonexistent local time",
            "find_bookings",
            json!({"from": "2026-03-29T02:30", "zone": "Europe/Berlin"}),
        ),
        (
            "ambiguous local time",
            "create_booking",
            json!({"customer": fixture.customer, "service": fixture.service, "start": "2026-10-25T02:30", "zone": "Europe/Berlin"}),
        ),
        ("wrong handle kind", "get_booking", json!({"booking": fixture.customer})),
        (
            "stale version",
            "update_customer",
            json!({"customer": fixture.customer, "version": stale, "name": "Late"}),
        ),
        (
            "duplicate",
            "create_customer",
            json!({"name": "Anna Again", "email": "anna.fischer@example.net"}),
        ),
        (
            "count mismatch",
            "cancel_bookings",
            json!({"from": "2020-01-01", "to": "2030-01-01", "zone": "UTC", "expected_count": 1}),
        ),
        (
            "listed twice",
            "cancel_bookings",
            json!({"bookings": [fixture.confirmed[0], fixture.confirmed[0]]}),
        ),
        ("wrong state", "confirm_booking", json!({"booking": fixture.confirmed[0]})),
        ("out of bounds", "mute_alerts", json!({"rule": fixture.rule, "minutes": 600})),
        (
            "unknown token",
            "confirm_action",
            json!({"confirm_token": "cfm_unknown", "confirm_summary": "x"}),
        ),
        (
            "wrong summary",
            "confirm_action",
            json!({"confirm_token": preview["confirm_token"], "confirm_summary": "Mute it"}),
        ),
    ];
    let mut texts = String::new();
    let mut record = |case: &str, tool: &str, result: &Value| {
        let text = result["content"][0]["text"].as_str().expect("text");
        let human: Vec<&str> = text.lines().take_while(|l| !l.starts_with('{')).collect();
        texts.push_str(&format!("## {case} ({tool})\n{}\n\n", normalized(&human.join("\n"))));
    };
    for (case, tool, args) in calls {
        let (_, _, body) = stack
            .raw(
                Some(&token),
                "tools/call",
                Some(tool),
                json!({"name": tool, "arguments": args}),
                &[],
            )
            .await;
        assert_eq!(body["result"]["isError"], true, "{case}: {body}");
        record(case, tool, &body["result"]);
    }
    stack.ok(&token, "confirm_action", json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]})).await;
    for (case, who, tool, args) in [
        (
            "used token",
            token.as_str(),
            "confirm_action",
            json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]}),
        ),
        (
            "hidden by rights",
            read_only.as_str(),
            "create_customer",
            json!({"name": "X", "email": "x@example.net"}),
        ),
        ("not in toolset", small.as_str(), "find_bookings", json!({})),
    ] {
        let (_, _, body) = stack
            .raw(Some(who), "tools/call", Some(tool), json!({"name": tool, "arguments": args}), &[])
            .await;
        assert_eq!(body["result"]["isError"], true, "{case}: {body}");
        record(case, tool, &body["result"]);
    }
    insta::with_settings!({ snapshot_path => "../snapshots" }, {
        insta::assert_snapshot!("error_texts", texts);
    });
}

#[test]
fn the_snapshot_normalizer_hides_only_what_varies() {
    assert_eq!(
        normalized(
            "Move booking bkg_abc123 (Boiler, Tue 2 Dec 2026, 09:00 CET) to Sun 29 Mar 2026, 10:00 CEST; token cfm_x9"
        ),
        "Move booking bkg_… (Boiler, <time>) to <time>; token cfm_…"
    );
    assert_eq!(normalized("matches 12 booking(s)"), "matches 12 booking(s)");
}
