//! A tenant's Cedar policies as agents meet them: real calls through the load balancer over two
//! workers. A security team's rules (cancellations only well ahead, no message at night in the
//! customer's zone, moves only to a technician of the booking's region, large batches to a
//! person) are simulated over the tenant's history, put in force with `gatehousectl`, and then
//! do to the same calls exactly what the simulation said.

use crate::support::*;

/// The status, error code and message of one tool result.
fn answer(result: &Value) -> (String, String, String) {
    let s = &result["structuredContent"];
    (
        s["status"].as_str().unwrap_or_default().to_owned(),
        s["error"]["code"].as_str().unwrap_or_default().to_owned(),
        s["error"]["message"].as_str().or(s["next"].as_str()).unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_security_teams_rules_do_through_the_balancer_what_their_simulation_said() {
    let stack = Stack::start(Options::for_test("policies", 2)).await.expect("stack");
    let db = TestDb::attach(&stack.database_url).await;
    let token = stack.token(0, 0);
    let lb = stack.lb_url.clone();
    let slug = stack.tenant(0)["slug"].as_str().expect("slug").to_owned();
    let soon = db.next_confirmed_booking_starting_between(&slug, "1 hour", "47 hours").await;
    assert!(soon.starts_with("bkg_"), "{soon}");
    let northern = db.first_confirmed_booking_in_region(&slug, "north").await;
    let customers = tool_call(&lb, &token, "find_customers", json!({"limit": 2})).await;
    let customer = |i: usize| {
        customers["structuredContent"]["customers"][i]["customer"]
            .as_str()
            .expect("a customer")
            .to_owned()
    };
    // One customer where it is night now and one where it is day, in zones of their own, so
    // the quiet-hours rule bites whenever this runs: set as the tenant's systems set them,
    // through the REST API (no agent may move a customer into the day).
    let (asleep, awake) = (customer(0), customer(1));
    let api_token = stack.tenant(0)["api_token"].as_str().expect("api token").to_owned();
    let http = reqwest::Client::new();
    for (who, local) in [(&asleep, 2), (&awake, 14)] {
        let placed = http
            .put(format!("{}/api/v1/customers/{who}/place", stack.control_url))
            .bearer_auth(&api_token)
            .json(&json!({"zone": shared::testing::zone_at(local)}))
            .send()
            .await
            .expect("api");
        assert!(placed.status().is_success(), "{}", placed.text().await.unwrap_or_default());
    }
    // A technician of each region, as the seed places them (and, above, a confirmed booking
    // of a northern customer).
    let techs = tool_call(&lb, &token, "find_technicians", json!({})).await;
    let of_region = |region: &str| {
        techs["structuredContent"]["technicians"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["region"] == region))
            .and_then(|t| t["technician"].as_str())
            .expect("a technician of the region")
            .to_owned()
    };
    let (north, south) = (of_region("north"), of_region("south"));
    // A batch of 21 bookings well ahead, over the rule's 20: made by the agent, a day apart.
    let service =
        tool_call(&lb, &token, "find_services", json!({})).await["structuredContent"]["services"]
            [0]["service"]
            .as_str()
            .expect("a service")
            .to_owned();
    let berlin = jiff::tz::TimeZone::get("Europe/Berlin").expect("zone");
    let today = jiff::Timestamp::now().to_zoned_datetime(berlin).date();
    let mut later = Vec::new();
    for day in 1..=21 {
        let date = today.checked_add(jiff::Span::new().days(7 + day)).expect("a date");
        let made = tool_call(
            &lb,
            &token,
            "create_booking",
            json!({"customer": customer(1), "service": service, "technician": north,
                   "start": format!("{date}T10:00"), "zone": "Europe/Berlin"}),
        )
        .await;
        let handle = made["structuredContent"]["booking"]["booking"].as_str();
        later.push(handle.unwrap_or_else(|| panic!("a booking: {made}")).to_owned());
    }
    let rules = r#"@id("cancel-48h")
@reason("agents cancel only bookings that start more than 48 hours from now")
forbid (principal, action == Action::"cancel_bookings", resource is Booking)
when { resource has hours_until_start && resource.hours_until_start < 48 };

@id("quiet-hours")
@reason("no message to a customer between 20:00 and 08:00 in the customer's zone")
forbid (principal, action == Action::"send_customer_message", resource is Customer)
when { resource has local_time && (resource.local_time.hour >= 20 || resource.local_time.hour < 8) };

@id("same-region")
@reason("bookings move only to a technician of the booking's region")
forbid (principal, action == Action::"update_booking", resource is Booking)
when {
  context has technician && resource has region &&
  (if context.technician has region then context.technician.region != resource.region else true)
};

@id("big-batches")
@approval
@reason("a cancellation batch over 20 bookings needs a person")
forbid (principal, action == Action::"cancel_bookings", resource)
when { context.effects > 20 };
"#;
    let file = stack.run_dir.join("rules.cedar");
    std::fs::write(&file, rules).expect("write the rules");
    let file = file.to_str().expect("utf-8 path");

    // The agent's calls, first with no policy in force: the history the draft is simulated on.
    let calls = [
        ("cancel_bookings", json!({"bookings": [soon]})),
        ("cancel_bookings", json!({"bookings": [later[0]]})),
        ("cancel_bookings", json!({"bookings": later})),
        (
            "send_customer_message",
            json!({"customer": asleep, "subject": "Tomorrow", "body": "We arrive at nine."}),
        ),
        (
            "send_customer_message",
            json!({"customer": awake, "subject": "Tomorrow", "body": "We arrive at nine."}),
        ),
        ("update_booking", json!({"booking": northern, "technician": south})),
        ("update_booking", json!({"booking": northern, "technician": north})),
    ];
    // A change carries the version it read, as an agent's would.
    let call = |tool: &'static str, mut args: Value| {
        let (lb, token) = (lb.clone(), token.clone());
        async move {
            if tool == "update_booking" {
                let read =
                    tool_call(&lb, &token, "get_booking", json!({"booking": args["booking"]}))
                        .await;
                args["version"] = read["structuredContent"]["version"].clone();
            }
            answer(&tool_call(&lb, &token, tool, args).await)
        }
    };
    let mut before = Vec::new();
    for (tool, args) in &calls {
        let (status, code, message) = call(tool, args.clone()).await;
        assert!(code.is_empty(), "{tool}: {status} {code} {message}");
        before.push(status);
    }
    let sim = stack
        .ctl(&["policy", "simulate", "--tenant", &slug, file, "--hours", "1"])
        .expect("simulate");
    let counted = |policy: &str, field: &str| {
        sim["by_policy"]
            .as_array()
            .and_then(|p| p.iter().find(|c| c["policy"] == policy))
            .map_or(0, |c| c[field].as_u64().unwrap_or_default())
    };
    assert_eq!(counted("cancel-48h", "forbidden"), 1, "{sim}");
    assert_eq!(counted("quiet-hours", "forbidden"), 1, "{sim}");
    assert_eq!(counted("same-region", "forbidden"), 1, "{sim}");
    assert_eq!(counted("big-batches", "to_a_person"), 1, "{sim}");
    assert_eq!(
        (sim["forbidden"].as_u64(), sim["to_a_person"].as_u64()),
        (Some(3), Some(1)),
        "{sim}"
    );

    // In force, the same calls through the balancer do what the simulation said.
    let set = stack
        .ctl(&["policy", "set", "--tenant", &slug, file, "--expect-version", "0"])
        .expect("set");
    assert_eq!(set["version"], 1, "{set}");
    let mut refused = BTreeMap::new();
    let mut to_a_person = BTreeMap::new();
    let mut allowed = 0;
    for (i, (tool, args)) in calls.iter().enumerate() {
        let (status, code, message) = call(tool, args.clone()).await;
        match (status.as_str(), code.as_str()) {
            (_, "forbidden_by_policy") => {
                let policy = ["cancel-48h", "quiet-hours", "same-region"]
                    .into_iter()
                    .find(|p| message.contains(p))
                    .unwrap_or_else(|| panic!("{tool}: a refusal naming no rule: {message}"));
                *refused.entry(policy).or_insert(0) += 1;
            }
            ("AWAITING_APPROVAL", "") if before[i] != "AWAITING_APPROVAL" => {
                assert!(message.contains("big-batches"), "{tool}: {message}");
                *to_a_person.entry("big-batches").or_insert(0) += 1;
            }
            (status, "") if status == before[i] => allowed += 1,
            other => panic!("{tool}: {other:?} {message}"),
        }
    }
    assert_eq!(
        refused,
        BTreeMap::from([("cancel-48h", 1), ("quiet-hours", 1), ("same-region", 1)])
    );
    assert_eq!(to_a_person, BTreeMap::from([("big-batches", 1)]));
    assert_eq!(
        allowed, 3,
        "the single cancellation well ahead, the message by day and the move within the region go on as before"
    );
    // The refusals say which rule and why, as the agent reads them.
    for (i, why) in
        [(0, "more than 48 hours"), (3, "in the customer's zone"), (5, "booking's region")]
    {
        let (_, _, message) = call(calls[i].0, calls[i].1.clone()).await;
        assert!(message.contains(why), "{message}");
    }
    // The same refusals through the official Python SDK, as an agent built on it reads them:
    // a tool error whose text is the `Error:` line naming the rule and its reason.
    for (i, rule, why) in
        [(3, "quiet-hours", "in the customer's zone"), (5, "same-region", "booking's region")]
    {
        let mut args = calls[i].1.clone();
        if calls[i].0 == "update_booking" {
            let read =
                tool_call(&lb, &token, "get_booking", json!({"booking": args["booking"]})).await;
            args["version"] = read["structuredContent"]["version"].clone();
        }
        let out = std::process::Command::new(e2e::python())
            .arg(e2e::repo_root().join("e2e/py/call_tool.py"))
            .args(["--url", &format!("{lb}/mcp"), "--token", &token, "--tool", calls[i].0])
            .args(["--args", &args.to_string()])
            .output()
            .expect("the .venv's python (scripts/test makes it)");
        let line = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{line}\n{}", String::from_utf8_lossy(&out.stderr));
        let sdk: Value = serde_json::from_str(line.trim()).expect("json");
        let text = sdk["text"].as_str().unwrap_or_default();
        assert_eq!(sdk["is_error"], true, "{sdk}");
        assert!(text.starts_with("Error:") && text.contains(rule) && text.contains(why), "{sdk}");
        assert_eq!(sdk["structured"]["error"]["code"], "forbidden_by_policy", "{sdk}");
    }
    // And each decision's audit row names the set's version and the rule that decided.
    let decided = db.first_deciding_policies_of_version(1).await;
    for rule in ["cancel-48h", "big-batches"] {
        assert!(decided.iter().any(|d| d == rule), "{rule}: {decided:?}");
    }
}
