//! The audit log searched, paged and exported, and each connection's activity drawn from the
//! counted calls.

use crate::support::*;

/// Rows of the first table body of a console page.
fn table_rows(html: &str) -> usize {
    html.split("<tbody>")
        .nth(1)
        .map_or(0, |body| body.split("</tbody>").next().unwrap_or_default().matches("<tr>").count())
}

#[tokio::test]
async fn the_audit_log_is_searched_and_paged_in_sql_and_exported_as_csv_no_spreadsheet_runs() {
    let api = Api::start().await;
    let t = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t.admin.email, &t.admin.password).await;
    let slug = &t.slug;
    // 260 rows over ten days in this tenant, with names a client chose to be formulas, and one
    // row in another tenant that must never show.
    api._db.fill_audit_log_for_search(slug).await;
    let in_tenant = api._db.rows("audit_log").tenant(slug).count().await;

    // Paging: 100 a page, following `next` until the end, visits every row once.
    let mut path = "/audit".to_owned();
    let mut seen = 0;
    let mut pages = 0;
    loop {
        let html = admin.get(&path).await.text().await.expect("page");
        seen += table_rows(&html);
        pages += 1;
        assert!(!html.contains("other_tenants_secret"));
        match html.split("rel=\"next\" href=\"").nth(1) {
            Some(rest) => path = rest.split('"').next().expect("href").replace("&amp;", "&"),
            None => break,
        }
    }
    assert_eq!(seen as i64, in_tenant, "every row once, over {pages} pages");
    assert!(pages >= 3);

    // Filters run in SQL: `_` in an action is a letter, not a wildcard; days are the tenant's
    // (every row here is near noon UTC, the same day in the tenant's zone).
    let html = admin.get("/audit?action=note_&outcome=refused").await.text().await.expect("page");
    let want = (1..=260).filter(|i| i % 3 == 0 && i % 5 == 0).count();
    assert_eq!(table_rows(&html), want, "note_add refused only");
    assert!(!html.contains("noteXadd"));
    let html = admin
        .get("/audit?since=2026-11-04&until=2026-11-04&channel=api")
        .await
        .text()
        .await
        .expect("page");
    let want = (1..=260).filter(|i| i % 10 == 3 && i % 2 == 1).count();
    assert_eq!(table_rows(&html), want, "one day, one channel");

    // Hostile or mistaken filters: a 400 that says what to write, nothing else.
    for (query, says) in [
        ("outcome=bogus", "ok, refused, failed, previewed"),
        ("since=-5000-01-01", "2026-11-30"),
        ("until=20000-01-01T00:00:00Z", "2026-11-30"),
        ("channel=email", "mcp, api"),
        ("since=yesterday", "2026-11-30"),
        ("cursor=AAAA", "previous page"),
        ("connection=bkg_1", "connection"),
    ] {
        let response = admin.get(&format!("/audit?{query}")).await;
        assert_eq!(response.status(), 400, "{query}");
        let html = response.text().await.expect("page");
        assert!(html.contains(says), "{query}: {html}");
    }

    // CSV: every matching row, and no cell a spreadsheet would run as a formula.
    let response = admin.get("/audit.csv?action=note_").await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"].to_str().expect("ct").starts_with("text/csv"));
    assert!(response.headers()["content-disposition"].to_str().expect("cd").contains("attachment"));
    let csv = response.text().await.expect("csv");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "at,channel,action,outcome,records,connection,connection_name,client_name,reason,proven,actor_kind,actor,actor_email,change,policy,seq,prev_hash,hash,canonical"
    );
    assert_eq!(lines.len() - 1, (1..=260).filter(|i| i % 3 == 0).count());
    assert!(
        lines[1].contains("\"'=HYPERLINK(\"\"http://evil.example\"\",\"\"x\"\")\""),
        "{}",
        lines[1]
    );
    assert!(lines[1].contains("\"'+cmd|"), "{}", lines[1]);
    let all = admin.get("/audit.csv").await.text().await.expect("csv");
    assert_eq!(all.lines().count() as i64 - 1, in_tenant, "the export pages through everything");
    assert!(!all.contains("other_tenants_secret"));
    assert_eq!(admin.get("/audit.csv?outcome=bogus").await.status(), 400);
    // A person without the audit right sees none of it.
    let dispatcher = Browser::sign_in(&api, &t.dispatcher.email, &t.dispatcher.password).await;
    assert_ne!(dispatcher.get("/audit.csv").await.status(), 200);
}

#[tokio::test]
async fn the_console_draws_each_connections_activity_from_the_counted_calls() {
    let api = Api::start().await;
    let t = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t.admin.email, &t.admin.password).await;
    let con = t.connections[0].connection.clone();
    let other = api.seed.tenants[1].connections[0].connection.clone();
    // Counts as workers write them: this hour and three hours ago, reads and refused notifies.
    api._db.record_sample_call_activity(&con).await;
    let html = admin.get(&format!("/connections/{con}")).await.text().await.expect("page");
    let section = html.split("id=\"connection-activity\"").nth(1).expect("the activity section");
    let sum = |series: &str| -> u64 {
        section
            .split(&format!("data-series=\"{series}\" data-count=\""))
            .skip(1)
            .map(|rest| rest.split('"').next().unwrap_or("0").parse::<u64>().unwrap_or(0))
            .sum()
    };
    assert_eq!(sum("read"), 11, "the last day's reads, refused ones included");
    assert_eq!(sum("notify"), 2);
    assert_eq!(sum("silent_write"), 0, "thirty hours ago is outside the day");
    assert!(section.contains("role=\"img\""));
    assert!(section.contains("data-reason=\"rate_limited (rate bucket empty)\""), "{section}");
    assert!(section.contains("data-reason=\"permission_denied (lacks the right)\""));
    assert!(section.contains("<code>find_customers</code>"), "the latest calls");
    let week =
        admin.get(&format!("/connections/{con}?span=week")).await.text().await.expect("page");
    // A week is 28 bars of six hours (168 hourly slivers could not be read), every call in
    // one of them, and each chart says what its bars count.
    assert_eq!(week.matches("class=\"bar\"").count(), 28);
    assert!(week.contains("data-series=\"silent_write\" data-count=\"5\""));
    let week_reads: u64 = week
        .split("data-series=\"read\" data-count=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap_or("0").parse::<u64>().unwrap_or(0))
        .sum();
    assert_eq!(week_reads, 11);
    assert!(week.contains(">calls per 6 hours</text>"), "the week's unit");
    assert!(section.contains(">calls per hour</text>"), "the day's unit");
    // The tenant's page adds up its connections; another tenant's connection is not found.
    let tenant = admin.get("/activity").await.text().await.expect("page");
    assert!(tenant.contains("13 calls"), "7 + 2 + 4");
    assert_eq!(admin.get(&format!("/connections/{other}")).await.status(), 404);
    let dispatcher = Browser::sign_in(&api, &t.dispatcher.email, &t.dispatcher.password).await;
    assert_ne!(dispatcher.get("/activity").await.status(), 200, "admins only");
}

#[tokio::test]
async fn an_audit_filter_given_as_tool_narrows_the_next_page_and_the_export_too() {
    let api = Api::start().await;
    let t = &api.seed.tenants[0];
    let admin = Browser::sign_in(&api, &t.admin.email, &t.admin.password).await;
    let slug = &t.slug;
    // 150 rows the filter matches (two pages) and 150 it does not.
    api._db.fill_audit_log_alternating_note_add(slug, 300).await;
    let matching =
        api._db.rows("audit_log").tenant(slug).like("action", "note\\_%").count().await as usize;
    assert!(matching > 100, "two pages of matches");
    let href = |html: &str, marker: &str| {
        html.split(marker)
            .nth(1)
            .map(|rest| rest.split('"').next().expect("href").replace("&amp;", "&"))
    };
    let first = admin.get("/audit?tool=note_").await.text().await.expect("page");
    assert_eq!(table_rows(&first), 100, "the filter narrows the first page");
    assert!(!first.contains("booking.confirm"));
    let next = href(&first, "rel=\"next\" href=\"").expect("a second page");
    assert!(next.contains("action=note_"), "the next page keeps the filter: {next}");
    let export = href(&first, "<a href=\"/audit.csv").expect("the export link");
    assert!(export.contains("action=note_"), "the export keeps the filter: {export}");

    let second = admin.get(&next).await.text().await.expect("page");
    assert_eq!(table_rows(&second), (matching - 100).min(100), "more matches, nothing else");
    assert!(!second.contains("booking.confirm"), "the second page is still filtered");
    let csv = admin.get(&format!("/audit.csv{export}")).await.text().await.expect("csv");
    assert_eq!(csv.lines().count() - 1, matching, "the export holds the matches only");
    assert!(!csv.contains("booking.confirm"));
}
