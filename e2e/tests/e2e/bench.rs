//! The benchmark's judge, tested like code: its verdict and what it counts.

use crate::support::*;

#[test]
fn the_benchmarks_verdict_says_which_peer_the_read_meets() {
    use e2e::bench::read_verdict;
    assert!(read_verdict(960.0, 1000.0, 1000.0).contains("against both peers"));
    let one = read_verdict(970.0, 1000.0, 1200.0);
    assert!(
        one.contains("meets")
            && one.contains("as sqlx runs it by default (97 %)")
            && one.contains("81 %"),
        "{one}"
    );
    let other = read_verdict(970.0, 1200.0, 1000.0);
    assert!(other.contains("only against the peer without its ping (97 %"), "{other}");
    let neither = read_verdict(900.0, 1000.0, 1000.0);
    assert!(neither.contains("misses") && neither.contains("90 %"), "{neither}");
    // Exactly 95 % meets; a scenario that served nothing meets nothing, whatever the peers did.
    assert!(read_verdict(950.0, 1000.0, 1000.0).contains("both peers"));
    assert!(read_verdict(0.0, 0.0, 0.0).contains("misses"));
    assert!(read_verdict(0.0, 1000.0, 1000.0).contains("misses"));
}

#[test]
fn a_benchmark_run_replaces_its_own_sections_and_keeps_the_others() {
    use e2e::bench::with_kept_sections;
    let old = "# Benchmarks\nold intro\n## Ratios\nold ratio\n## Listen streams\nstreams 10000\n## Fifty writers\nby hand\n";
    let report = "# Benchmarks\nnew intro\n## Ratios\nnew ratio\n";
    let page = with_kept_sections(report, old);
    assert!(page.starts_with(report.trim_end()), "{page}");
    assert!(!page.contains("old ratio") && !page.contains("old intro"), "{page}");
    let streams = page.find("## Listen streams\nstreams 10000").expect("kept");
    let fifty = page.find("## Fifty writers\nby hand").expect("kept");
    assert!(streams < fifty, "in their order: {page}");
    assert_eq!(with_kept_sections(report, ""), report, "a first run writes the report alone");
}

#[test]
fn the_benchmark_checker_counts_only_what_a_user_wanted() {
    use e2e::bench::{Outcome, judge_mcp, judge_plain};
    let result = |r: Value| json!({"jsonrpc": "2.0", "id": 1, "result": r}).to_string();
    let ok = result(json!({"content": [{"type": "text", "text": "{}"}], "isError": false,
        "structuredContent": {"booking": "bkg_x", "note": "the customer wrote \"isError\":true here"}}));
    assert_eq!(judge_mcp(200, ok.as_bytes(), false), Outcome::Ok, "text inside a result is data");
    // A tool error, however it is laid out: compact, pretty-printed, or in an SSE event.
    let limited = json!({"jsonrpc": "2.0", "id": 1, "result": {"isError": true,
        "content": [{"type": "text", "text": "Error: …"}],
        "structuredContent": {"error": {"code": "rate_limited", "message": "…"}}}});
    for body in [
        limited.to_string(),
        serde_json::to_string_pretty(&limited).expect("json"),
        format!(
            "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{{}}}}\n\nevent: message\ndata: {limited}\n\n"
        ),
    ] {
        assert_eq!(
            judge_mcp(200, body.as_bytes(), false),
            Outcome::Tool("rate_limited".into()),
            "{body}"
        );
    }
    // A refusal before any tool ran, a JSON-RPC error, and garbage.
    assert_eq!(judge_mcp(503, b"{}", false), Outcome::Http(503));
    assert_eq!(judge_mcp(429, ok.as_bytes(), false), Outcome::Http(429));
    let rpc =
        json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "Unknown tool"}});
    assert_eq!(judge_mcp(200, rpc.to_string().as_bytes(), false), Outcome::Rpc(-32602));
    assert_eq!(judge_mcp(200, b"<html>bad gateway</html>", false), Outcome::Unreadable);
    assert_eq!(judge_mcp(200, result(json!("x")).as_bytes(), false), Outcome::Unreadable);
    assert_eq!(judge_mcp(200, result(json!(null)).as_bytes(), false), Outcome::Unreadable);
    let odd_flag = result(json!({"isError": "yes", "content": []}));
    assert_eq!(judge_mcp(200, odd_flag.as_bytes(), false), Outcome::Unreadable);
    // A success whose own data has fields named like the judge's is still a success.
    let data_named_error = result(json!({"isError": false, "content": [],
        "structuredContent": {"error": "a field of the data", "replayed": "no"}}));
    assert_eq!(judge_mcp(200, data_named_error.as_bytes(), true), Outcome::Ok);
    // Truncated JSON is not an answer, however much of it arrived.
    assert_eq!(judge_mcp(200, &ok.as_bytes()[..ok.len() - 2], false), Outcome::Unreadable);
    // A write answered from the replay cache executed nothing: not a success of a write.
    let replayed =
        result(json!({"isError": false, "content": [], "structuredContent": {"replayed": true}}));
    assert_eq!(judge_mcp(200, replayed.as_bytes(), true), Outcome::Replayed);
    let fresh =
        result(json!({"isError": false, "content": [], "structuredContent": {"replayed": false}}));
    assert_eq!(judge_mcp(200, fresh.as_bytes(), true), Outcome::Ok);
    assert_eq!(judge_plain(200, br#"{"booking":"bkg_x"}"#), Outcome::Ok);
    assert_eq!(judge_plain(500, br#"{"booking":"bkg_x"}"#), Outcome::Http(500));
    assert_eq!(judge_plain(200, b"not json"), Outcome::Unreadable);
    assert_eq!(
        judge_plain(200, br#"{"error":"not found"}"#),
        Outcome::Tool("error".into()),
        "the peer's own error is not a fast read"
    );
}

#[test]
fn the_benchmarks_policy_sets_validate_against_the_schema_and_a_section_is_replaced_in_place() {
    for n in [1, 10, 100] {
        let found = shared::services::policies::check(&e2e::bench::policy_set(n))
            .unwrap_or_else(|p| panic!("{n} policies: {p:?}"));
        assert_eq!(found.len(), n);
        assert!(found.iter().any(|p| p.approval) || n < 7, "some are @approval");
    }
    // With 100, each tool the benchmark calls is judged by every kind of condition.
    let set = e2e::bench::policy_set(100);
    for tool in ["get_booking", "add_booking_note", "find_bookings"] {
        let conditions: Vec<&str> =
            set.split("forbid ").filter(|p| p.contains(&format!("Action::\"{tool}\""))).collect();
        assert_eq!(conditions.len(), 10, "{tool}");
        for kind in
            ["principal.client", "resource.hours_until_start", "context.effects", "context.now"]
        {
            assert!(conditions.iter().any(|c| c.contains(kind)), "{tool} has a {kind} policy");
        }
    }
    let page = "# B\n\n## A\nold a\n## Policy evaluation\nold p\n## C\nc\n";
    let new =
        e2e::bench::replace_section(page, "Policy evaluation", "## Policy evaluation\nnew p\n");
    assert_eq!(new, "# B\n\n## A\nold a\n## Policy evaluation\nnew p\n\n## C\nc\n");
    let last = e2e::bench::replace_section(&new, "C", "## C\nnew c\n");
    assert_eq!(last, "# B\n\n## A\nold a\n## Policy evaluation\nnew p\n\n## C\nnew c\n");
    let appended =
        e2e::bench::replace_section("# B\n", "Policy evaluation", "## Policy evaluation\nx\n");
    assert!(appended.ends_with("## Policy evaluation\nx\n"), "{appended}");
}

#[test]
fn the_listen_reader_finds_each_frame_once_however_the_bytes_are_split() {
    use e2e::bench::{ListenFrame, ListenScanner};
    let response = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
        7a\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/subscriptions/acknowledged\",\"params\":{}}\n\n\r\n\
        60\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\",\"params\":{}}\n\n\r\n\
        60\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\",\"params\":{}}\n\n\r\n\
        30\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{}}\n\n\r\n";
    let want =
        vec![ListenFrame::Ack, ListenFrame::Changed, ListenFrame::Changed, ListenFrame::Error];
    // Whole, byte by byte, and cut at every place: the same frames, once each, in order.
    for size in [response.len(), 1, 2, 3, 7, 31, 64] {
        let mut scanner = ListenScanner::default();
        let found: Vec<ListenFrame> =
            response.as_bytes().chunks(size).flat_map(|c| scanner.feed(c)).collect();
        assert_eq!(found, want, "reads of {size} bytes");
    }
    for cut in 0..response.len() {
        let mut scanner = ListenScanner::default();
        let (a, b) = response.as_bytes().split_at(cut);
        let mut found = scanner.feed(a);
        found.extend(scanner.feed(b));
        assert_eq!(found, want, "cut at {cut}");
    }
    // Other frames (a keep-alive comment, a result) are not counted.
    let mut scanner = ListenScanner::default();
    assert!(scanner.feed(b": keep-alive\n\ndata: {\"result\":{}}\n\n").is_empty());
}
