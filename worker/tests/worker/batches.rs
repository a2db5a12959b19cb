//! Batch tools and exports: a filter states its count and previews all of it or nothing, a
//! handle listed twice is refused, lists are bounded, and a long export reports progress.

use shared::testing::BulkBookings;

use crate::support::*;

#[tokio::test]
async fn a_batch_filter_with_the_wrong_count_lists_the_matches_and_changes_nothing() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let before = stack.db.fingerprint_of_writes().await;
    let all = stack.ok(&token, "find_bookings", json!({"from": "2020-01-01", "to": "2030-01-01", "zone": "Europe/Berlin", "limit": 100})).await;
    let live: Vec<String> = all["bookings"]
        .as_array()
        .expect("list")
        .iter()
        .filter(|b| b["status"] == "draft" || b["status"] == "confirmed")
        .map(|b| b["booking"].as_str().expect("h").to_owned())
        .collect();
    assert!(live.len() > 3);
    let err = stack
        .call(&token, "cancel_bookings", json!({"from": "2020-01-01", "to": "2030-01-01", "zone": "Europe/Berlin", "expected_count": 3}))
        .await
        .expect_err("count");
    assert_eq!(err["code"], "count_mismatch");
    let mut matches: Vec<String> = err["matches"]
        .as_array()
        .expect("m")
        .iter()
        .map(|m| m.as_str().expect("h").to_owned())
        .collect();
    matches.sort();
    let mut expected = live.clone();
    expected.sort();
    assert_eq!(matches, expected);
    let err = stack
        .call(&token, "cancel_bookings", json!({"from": "2020-01-01", "zone": "Europe/Berlin"}))
        .await
        .expect_err("no count");
    assert_eq!(err["field"], "expected_count");
    // A count given with listed handles is checked, and a filter that matches nothing leaves
    // nothing to confirm.
    let err = stack
        .call(&token, "cancel_bookings", json!({"bookings": [live[0]], "expected_count": 3}))
        .await
        .expect_err("count with handles");
    assert_eq!(err["field"], "expected_count", "{err}");
    let err = stack
        .call(
            &token,
            "cancel_bookings",
            json!({"from": "2040-01-01", "zone": "UTC", "expected_count": 0}),
        )
        .await
        .expect_err("matches nothing");
    assert_eq!(err["field"], "expected_count", "{err}");
    assert!(err["message"].as_str().is_some_and(|m| m.contains("find_bookings")), "{err}");
    assert_eq!(stack.db.fingerprint_of_writes().await, before, "nothing changed");
    // With the right count the preview lists them, and confirming cancels all.
    let preview = stack
        .ok(&token, "cancel_bookings", json!({"from": "2020-01-01", "to": "2030-01-01", "zone": "Europe/Berlin", "expected_count": live.len()}))
        .await;
    stack.ok(&token, "confirm_action", json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]})).await;
    let slug = &stack.seed.tenants[0].slug;
    let in_status =
        |status: &str| stack.db.rows("bookings").tenant(slug).eq("status", status).count();
    let left = in_status("draft").await + in_status("confirmed").await;
    assert_eq!(left, 0);
}

#[tokio::test]
async fn a_long_export_reports_progress_and_summarizes_thousands() {
    let stack = Stack::start().await;
    let slug = stack.seed.tenants[0].slug.clone();
    // 1200 more bookings in December 2027, copied from a demo booking.
    BulkBookings::new(&slug, 1200)
        .like_first_booking()
        .starting("2027-12-01 08:00+01", "30 minutes")
        .status("confirmed")
        .handles("bkg_")
        .insert(&stack.db)
        .await;
    let token = stack.token(0, 1);
    let tool = stack
        .list(&token)
        .await
        .into_iter()
        .find(|t| t["name"] == "export_bookings")
        .expect("listed");
    assert_eq!(tool["_meta"]["dev.gatehouse/slow"], true);
    let response = stack
        .http
        .post(format!("{}/mcp", stack.url))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", PROTOCOL)
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "export_bookings")
        .bearer_auth(&token)
        .json(&json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {
            "name": "export_bookings", "arguments": {"from": "2027-12-01", "to": "2028-01-31", "zone": "Europe/Berlin"},
            "_meta": {"progressToken": "export-1", "io.modelcontextprotocol/protocolVersion": PROTOCOL,
                      "io.modelcontextprotocol/clientCapabilities": {}}}}))
        .send()
        .await
        .expect("request");
    assert!(response.headers()["content-type"].to_str().expect("ct").contains("text/event-stream"));
    let body = response.text().await.expect("body");
    let messages: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| serde_json::from_str(d).expect("json"))
        .collect();
    let progress: Vec<f64> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| {
            assert_eq!(m["params"]["progressToken"], "export-1");
            assert_eq!(m["params"]["total"], 1200.0);
            m["params"]["progress"].as_f64().expect("progress")
        })
        .collect();
    assert!(progress.len() >= 12, "a notification per page: {progress:?}");
    assert!(progress.windows(2).all(|w| w[0] < w[1]), "progress increases: {progress:?}");
    let result = messages.iter().find(|m| m["id"] == 99).expect("the result")["result"].clone();
    let summary =
        check_contract("export_bookings", &result, &tool["outputSchema"]).expect("summary");
    assert_eq!(summary["count"], 1200);
    assert_eq!(summary["by_status"], json!([{"status": "confirmed", "count": 1200}]));
    assert_eq!(summary["first"].as_array().expect("first").len(), 20);
    assert!(summary["continue_with"]["cursor"].is_string());
}

/// Inserts `n` live draft bookings of tenant `t` in 2031, spread over the year.
async fn many_drafts(stack: &Stack, t: usize, n: usize) {
    BulkBookings::new(&stack.seed.tenants[t].slug, n).insert(&stack.db).await;
}

#[tokio::test]
async fn a_batch_filter_counts_every_match_and_never_previews_part_of_them() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    many_drafts(&stack, 0, 600).await;
    // Cancelled bookings in the range must neither count nor crowd live ones out of the count.
    stack.db.cancel_bookings_with_handles_up_to("bkg_bulk000000000050").await;
    let before = stack.db.fingerprint_of_writes().await;
    let range = json!({"from": "2031-01-01", "to": "2031-12-31", "zone": "UTC"});
    let with_count = |n: usize| {
        let mut args = range.clone();
        args["expected_count"] = json!(n);
        args
    };
    // 550 live matches: expecting the first 500 of them is a mismatch, never a preview.
    let err = stack.call(&token, "cancel_bookings", with_count(500)).await.expect_err("mismatch");
    assert_eq!(err["code"], "count_mismatch", "{err}");
    assert_eq!(err["count"], 550, "the count is exact: {err}");
    assert!(err["matches"].as_array().expect("matches").len() <= 100);
    // The exact count of more than one call may cancel is refused, naming the limit.
    let err = stack.call(&token, "cancel_bookings", with_count(550)).await.expect_err("too many");
    assert_eq!(err["field"], "expected_count", "{err}");
    assert!(err.to_string().contains("550"), "{err}");
    assert_eq!(stack.db.fingerprint_of_writes().await, before, "nothing was prepared");
    // Exactly as many as one call may cancel is allowed.
    stack.db.cancel_latest_drafts("bkg_bulk%", 50).await;
    let at_limit = stack.ok(&token, "cancel_bookings", with_count(500)).await;
    assert_eq!(at_limit["status"], "PREVIEW", "500 is within a call's limit");
    stack.ok(&token, "reject_action", json!({"confirm_token": at_limit["confirm_token"]})).await;
    // Narrowed to what one call may do, it previews and cancels exactly that many.
    let narrow = json!({"from": "2031-01-01", "to": "2031-01-31", "zone": "UTC"});
    let in_january = |status: Option<&'static str>, up_to: Option<&'static str>| {
        stack.db.bookings_starting_before("bkg_bulk%", "2031-02-01", status, up_to)
    };
    let live_in_january = in_january(Some("draft"), None).await;
    let mut args = narrow.clone();
    args["expected_count"] = json!(live_in_january);
    let preview = stack.ok(&token, "cancel_bookings", args).await;
    stack.ok(&token, "confirm_action", json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]})).await;
    let cancelled = in_january(Some("cancelled"), None).await;
    let was_cancelled = in_january(None, Some("bkg_bulk000000000050")).await;
    assert_eq!(cancelled, live_in_january + was_cancelled);
}

#[tokio::test]
async fn a_handle_listed_twice_in_a_batch_is_refused_and_nobody_is_emailed() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let confirmed = stack
        .ok(&token, "find_bookings", json!({"status": "confirmed", "limit": 2}))
        .await["bookings"]
        .clone();
    let (a, b) = (confirmed[0]["booking"].clone(), confirmed[1]["booking"].clone());
    let before = stack.db.fingerprint_of_writes().await;
    for list in
        [json!([a, b, a]), json!([a, a]), json!([a, format!(" {} ", a.as_str().expect("h"))])]
    {
        let err = stack
            .call(&token, "cancel_bookings", json!({"bookings": list}))
            .await
            .expect_err("listed twice");
        assert_eq!(err["field"], "bookings", "{list}: {err}");
        assert!(err["message"].as_str().expect("m").contains(a.as_str().expect("h")), "{err}");
    }
    assert_eq!(stack.db.fingerprint_of_writes().await, before, "nothing prepared or sent");
    // Listed once each, one email per customer booking.
    let preview = stack.ok(&token, "cancel_bookings", json!({"bookings": [a, b]})).await;
    stack.ok(&token, "confirm_action", json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]})).await;
    assert_eq!(stack.db.count("outbox").await, 2);
}

#[tokio::test]
async fn batch_lists_are_bounded_and_exports_honour_their_status() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let before = stack.db.fingerprint_of_writes().await;
    // An empty list and one longer than a batch holds are refused before anything is read.
    let too_many: Vec<String> = (0..51).map(|i| format!("bkg_{i:016}")).collect();
    for list in [json!([]), json!(too_many)] {
        let err = stack
            .call(&token, "cancel_bookings", json!({"bookings": list}))
            .await
            .expect_err("bounds");
        assert_eq!(err["field"], "bookings", "{err}");
        assert!(err["message"].as_str().expect("m").contains("1 to 50"), "{err}");
    }
    assert_eq!(stack.db.fingerprint_of_writes().await, before);
    // Exactly as many as a batch holds is accepted.
    BulkBookings::new(&stack.seed.tenants[0].slug, 50)
        .starting("2031-01-01 08:00+00", "1 day")
        .handles("bkg_")
        .insert(&stack.db)
        .await;
    let fifty: Vec<String> = (1..=50).map(|i| format!("bkg_{i:016}")).collect();
    let preview = stack.ok(&token, "cancel_bookings", json!({"bookings": fifty})).await;
    assert_eq!(preview["status"], "PREVIEW");
    stack.ok(&token, "reject_action", json!({"confirm_token": preview["confirm_token"]})).await;
    // An export with a status counts that status only.
    let range = json!({"from": "2020-01-01", "to": "2030-01-01", "zone": "UTC", "status": "confirmed", "limit": 100});
    let found = stack.ok(&token, "find_bookings", range.clone()).await;
    let summary = stack
        .ok(
            &token,
            "export_bookings",
            json!({"from": "2020-01-01", "to": "2030-01-01", "zone": "UTC", "status": "confirmed"}),
        )
        .await;
    assert_eq!(summary["count"], found["count"], "{summary}");
    let statuses: Vec<&str> = summary["by_status"]
        .as_array()
        .expect("list")
        .iter()
        .map(|s| s["status"].as_str().expect("s"))
        .collect();
    assert_eq!(statuses, ["confirmed"], "{summary}");
}
