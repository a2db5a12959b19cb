//! Tenants' policies in Cedar, enforced on real calls: a `forbid` refuses naming its `@id` and
//! `@reason`, an `@approval` one sends a two-step action to a person, a policy forbidding
//! everything works like a kill switch, and a set that does not parse, validate or start from
//! the version in force changes nothing. The committed schema is the registry's.

use crate::support::*;
use shared::services::places;
use shared::services::policies;
use worker::tools::Registry;

/// The committed policy registry (tool classes and the Cedar schema) is generated from the
/// tool registry: a new tool fails this test until the file is written again
/// (`GATEHOUSE_WRITE_POLICY_REGISTRY=1 cargo test -p worker the_policy_schema`).
#[test]
fn the_policy_schema_is_the_registrys() {
    let registry = Registry::new();
    let facts = registry.policy_facts();
    let generated = policies::registry_json(&facts);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/src/policies/registry.json");
    let text = serde_json::to_string_pretty(&generated).expect("json") + "\n";
    if std::env::var_os("GATEHOUSE_WRITE_POLICY_REGISTRY").is_some() {
        std::fs::write(&path, &text).expect("write the registry");
    }
    let committed = std::fs::read_to_string(&path).expect("the committed registry");
    assert_eq!(
        committed, text,
        "regenerate shared/src/policies/registry.json (see the doc comment)"
    );
    for spec in registry.all() {
        // Confirming and rejecting are judged as the action they complete.
        let expected = !matches!(spec.name, "confirm_action" | "reject_action");
        let present = generated["schema"][""]["actions"].get(spec.name).is_some();
        assert_eq!(present, expected, "{}", spec.name);
        // `context.budgets` names every kind of effect budgets count, and no other.
        let kinds: Vec<&str> =
            shared::services::two_step::EffectKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(kinds, policies_kinds(), "context.budgets' kinds are the effect kinds");
        // Every argument a policy can name is either kept for simulation or withheld from it.
        let typed_args = generated["schema"][""]["actions"][spec.name]["appliesTo"]["context"]
            ["attributes"]["args"]["attributes"]
            .as_object();
        for arg in typed_args.into_iter().flat_map(|a| a.keys()) {
            let kept = policies::KEPT_ARGUMENTS.contains(&arg.as_str());
            let withheld = policies::WITHHELD_ARGUMENTS.contains(&arg.as_str());
            assert!(
                kept != withheld,
                "{}.{arg}: kept for simulation or withheld, one of the two",
                spec.name
            );
        }
        if !present {
            continue;
        }
        // Every argument of a type Cedar has a word for is one a policy can name, whether the
        // tool requires it or not (an optional one reaches clients as `anyOf` with null).
        let typed = &generated["schema"][""]["actions"][spec.name]["appliesTo"]["context"]["attributes"]
            ["args"]["attributes"];
        let props = spec.tool.input_schema.get("properties").and_then(|p| p.as_object());
        for (arg, prop) in props.into_iter().flatten() {
            let scalar = |p: &serde_json::Value| {
                matches!(p["type"].as_str(), Some("string" | "integer" | "boolean"))
            };
            let branches: Vec<&serde_json::Value> = prop["anyOf"]
                .as_array()
                .map(|b| b.iter().filter(|b| b["type"] != "null").collect())
                .unwrap_or_default();
            let nameable = scalar(prop) || (branches.len() == 1 && scalar(branches[0]));
            if nameable {
                assert!(typed.get(arg).is_some(), "{}: context.args.{arg} is missing", spec.name);
            }
        }
    }
}

const NO_CUSTOMER_READS: &str = r#"
@id("no-customer-reads")
@reason("agents do not read customer records in this tenant")
forbid (principal, action == Action::"get_customer", resource);
"#;

/// A technician of the north and one of the south, as the tools show the seed's regions.
async fn north_and_south(stack: &Stack, token: &str) -> (String, String) {
    let techs = stack.ok(token, "find_technicians", json!({})).await;
    let of_region = |region: &str| {
        techs["technicians"]
            .as_array()
            .expect("technicians")
            .iter()
            .find(|t| t["region"] == region)
            .and_then(|t| t["technician"].as_str())
            .expect("a technician of the region")
            .to_owned()
    };
    (of_region("north"), of_region("south"))
}

async fn set(stack: &Stack, source: &str) -> i32 {
    let ctx = stack.operator_in(0).await;
    let current = policies::show(&stack.db.ds, &ctx).await.expect("show").version;
    policies::set(&stack.db.ds, &ctx, source, current, "test").await.expect("set").version
}

#[tokio::test]
async fn a_forbid_refuses_naming_its_policy_and_the_rest_goes_on() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let (_, customer, _) = handles(&stack, 0).await;
    stack.ok(&token, "get_customer", json!({"customer": customer})).await;
    assert_eq!(set(&stack, NO_CUSTOMER_READS).await, 1);
    let err = stack
        .call(&token, "get_customer", json!({"customer": customer}))
        .await
        .expect_err("refused");
    assert_eq!(err["code"], "forbidden_by_policy", "{err}");
    let message = err["message"].as_str().expect("message");
    assert!(
        message.contains("no-customer-reads") && message.contains("do not read customer records"),
        "{err}"
    );
    assert!(err["fix"].as_str().expect("fix").contains("policy"), "{err}");
    // Under a policy set, another tenant's booking is still not found (R3), not a policy error.
    let (foreign, _, _) = handles(&stack, 1).await;
    let err =
        stack.call(&token, "get_booking", json!({"booking": foreign})).await.expect_err("foreign");
    assert_eq!(err["code"], "not_found", "{err}");
    // Other tools, and another tenant, are untouched.
    stack.ok(&token, "find_bookings", json!({"limit": 1})).await;
    let (_, other, _) = handles(&stack, 1).await;
    stack.ok(&stack.token(1, 0), "get_customer", json!({"customer": other})).await;
    // Forbidding everything works like a kill switch for the tenant's agents.
    set(&stack, "@id(\"pause\")\n@reason(\"agents are paused during the audit\")\nforbid (principal, action, resource);").await;
    for (tool, args) in [("find_bookings", json!({"limit": 1})), ("find_technicians", json!({}))] {
        let err = stack.call(&token, tool, args).await.expect_err("paused");
        assert!(err["message"].as_str().expect("message").contains("pause"), "{tool}: {err}");
    }
    // A read judged on the booking it names: the booking's status, read with the call's
    // context (one round trip), decides; another tenant's booking is still not found.
    set(&stack, "@id(\"no-cancelled\")\n@reason(\"cancelled bookings are archived\")\nforbid (principal, action == Action::\"get_booking\", resource is Booking) when { resource has status && resource.status == \"cancelled\" };").await;
    let slug = stack.seed.tenants[0].slug.clone();
    let cancelled = stack.db.oldest_booking_with_status(&slug, "cancelled").await;
    let confirmed = stack.db.oldest_booking_with_status(&slug, "confirmed").await;
    let err = stack
        .call(&token, "get_booking", json!({"booking": cancelled}))
        .await
        .expect_err("cancelled");
    assert!(err["message"].as_str().expect("message").contains("no-cancelled"), "{err}");
    stack.ok(&token, "get_booking", json!({"booking": confirmed})).await;
    let err =
        stack.call(&token, "get_booking", json!({"booking": foreign})).await.expect_err("foreign");
    assert_eq!(err["code"], "not_found", "{err}");
    // A rule over the connection's creator: their connections' calls, and no one else's.
    let creator = stack.db.first_connection_creator(&slug).await;
    set(&stack, &format!("@id(\"creator\")\n@reason(\"this person's agents are paused\")\nforbid (principal, action == Action::\"get_customer\", resource) when {{ principal.creator == \"{creator}\" }};")).await;
    let err = stack
        .call(&token, "get_customer", json!({"customer": customer}))
        .await
        .expect_err("the creator's agents are paused");
    assert!(err["message"].as_str().expect("message").contains("creator"), "{err}");
    // Back to no policy: everything the rights allow.
    set(&stack, "").await;
    stack.ok(&token, "get_customer", json!({"customer": customer})).await;
    stack.ok(&token, "get_booking", json!({"booking": cancelled})).await;
}

/// A call the gate judges on the records it names (a silent write, a read without a read of
/// its own) has them read with its context: one statement, no round trip of the gate's own.
/// The verdict is the one the records call for, another tenant's record is never read, and a
/// tenant without policies reads nothing ahead.
#[tokio::test]
async fn a_call_judged_on_its_records_reads_them_with_its_context() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let counted =
        |outcome: &str| stack.state.metrics.read_ahead.with_label_values(&[outcome]).get();
    let slug = stack.seed.tenants[0].slug.clone();
    let cancelled = stack.db.oldest_booking_with_status(&slug, "cancelled").await;
    let confirmed = stack.db.oldest_booking_with_status(&slug, "confirmed").await;
    let (foreign, _, _) = handles(&stack, 1).await;
    let (_, customer, _) = handles(&stack, 0).await;
    let region = stack
        .db
        .scalar_string(&format!(
            "SELECT coalesce(region, '') FROM customers WHERE handle = '{customer}'"
        ))
        .await;
    assert!(!region.is_empty(), "the seed gives {customer} a region");
    let note = |booking: &str| json!({"booking": booking, "text": "checked the access code"});
    // No policy set: nothing is read ahead for a write.
    let before = (counted("used"), counted("unused"));
    stack.ok(&token, "add_booking_note", note(&confirmed)).await;
    assert_eq!((counted("used"), counted("unused")), before, "no set, no facts read");
    set(
        &stack,
        &format!(
            r#"
@id("no-notes-on-cancelled")
@reason("cancelled bookings are archived")
forbid (principal, action == Action::"add_booking_note", resource is Booking)
when {{ resource has status && resource.status == "cancelled" }};

@id("region-closed")
@reason("this region's customers are handled by the regional office")
forbid (principal, action == Action::"get_customer", resource is Customer)
when {{ resource has region && resource.region == "{region}" }};
"#
        ),
    )
    .await;
    let cases: [(&str, Value, bool); 5] = [
        ("add_booking_note", note(&confirmed), true),
        ("add_booking_note", note(&cancelled), false),
        // A handle written with spaces (which the tool trims) is judged as the same booking.
        ("add_booking_note", note(&format!(" {cancelled}  ")), false),
        ("get_customer", json!({"customer": customer}), false),
        (
            "update_booking",
            json!({"booking": cancelled, "version": "v1", "priority": "high"}),
            true,
        ),
    ];
    for (tool, args, allowed) in cases {
        let used = counted("used");
        let answer = stack.call(&token, tool, args.clone()).await;
        match answer {
            Ok(ok) => assert!(allowed, "{tool} {args}: allowed: {ok}"),
            // update_booking's stale version is its own error, after the gate let it by.
            Err(e) if allowed => assert_ne!(e["code"], "forbidden_by_policy", "{tool}: {e}"),
            Err(e) => assert_eq!(e["code"], "forbidden_by_policy", "{tool} {args}: {e}"),
        }
        let read_with_context = tool != "update_booking";
        assert_eq!(
            counted("used"),
            used + u64::from(read_with_context),
            "{tool}: the facts the gate judged were read with the context"
        );
    }
    // Another tenant's booking: not found (R3), its facts never read in this tenant.
    let used = counted("used");
    let err = stack.call(&token, "add_booking_note", note(&foreign)).await.expect_err("foreign");
    assert_eq!(err["code"], "not_found", "{err}");
    assert_eq!(counted("used"), used + 1, "read ahead, and found absent in this tenant");
    set(&stack, "").await;
}

#[tokio::test]
async fn two_step_actions_are_decided_at_prepare_and_at_confirm_with_their_records() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let slug = stack.seed.tenants[0].slug.clone();
    let soon = stack.db.next_booking_starting_between(&slug, "1 hour", "47 hours").await;
    let later = stack.db.next_booking_starting_after(&slug, "72 hours").await;
    set(&stack, r#"
@id("delete-48h")
@reason("agents delete only bookings that start more than 48 hours from now")
forbid (principal, action == Action::"delete_booking", resource is Booking)
when { resource has hours_until_start && resource.hours_until_start < 48 };

@id("messages-need-a-person")
@approval
@reason("every message to a customer is approved by a person")
forbid (principal, action == Action::"send_customer_message", resource) when { context.effects >= 1 };
"#).await;
    let err =
        stack.call(&token, "delete_booking", json!({"booking": soon})).await.expect_err("soon");
    assert_eq!(err["code"], "forbidden_by_policy", "{err}");
    assert!(err["message"].as_str().expect("message").contains("delete-48h"), "{err}");
    let refused = stack
        .db
        .rows("audit_log")
        .eq("action", "delete_booking.preview")
        .eq("outcome", "refused")
        .like("reason", "%delete-48h%")
        .count()
        .await;
    assert_eq!(refused, 1, "the refusal is audited with the policy");
    // Every audited decision records the set's version and the deciding policies.
    let policy_of = |action: &'static str, outcome: &'static str| {
        stack.db.latest_audited_policy(action, outcome)
    };
    let decided = |text: String| serde_json::from_str::<Value>(&text).expect("policy json");
    let refusal = decided(policy_of("delete_booking.preview", "refused").await);
    assert_eq!(refusal, json!({"version": 1, "decided_by": ["delete-48h"]}));
    // A handle written with spaces (which the tool trims) is judged as the same booking.
    let err = stack
        .call(&token, "delete_booking", json!({"booking": format!("  {soon} ")}))
        .await
        .expect_err("padded");
    assert_eq!(err["code"], "forbidden_by_policy", "{err}");
    let preview = stack.ok(&token, "delete_booking", json!({"booking": later})).await;
    assert_eq!(preview["status"], "PREVIEW", "{preview}");
    let allowed = decided(policy_of("delete_booking.preview", "previewed").await);
    assert_eq!(allowed, json!({"version": 1, "decided_by": []}), "allowed by the set, recorded");
    // A silent write records the version its call read with its context.
    stack
        .ok(
            &token,
            "add_booking_note",
            json!({"booking": later, "text": "checked under the policies"}),
        )
        .await;
    let note = decided(policy_of("add_booking_note", "ok").await);
    assert_eq!(note, json!({"version": 1, "decided_by": []}));
    // An @approval policy sends the action to a person, naming the policy.
    let (_, customer, _) = handles(&stack, 0).await;
    let waiting = stack
        .ok(
            &token,
            "send_customer_message",
            json!({"customer": customer, "subject": "Hello", "body": "We arrive at nine."}),
        )
        .await;
    assert_eq!(waiting["status"], "AWAITING_APPROVAL", "{waiting}");
    let held = decided(policy_of("send_customer_message.preview", "awaiting_approval").await);
    assert_eq!(held, json!({"version": 1, "decided_by": ["messages-need-a-person"]}));
    assert!(
        waiting["next"].as_str().expect("next").contains("messages-need-a-person"),
        "{waiting}"
    );
    // A person approving answers an @approval policy, but a forbid set since refuses even them
    // (judged on the connection that asked), audited.
    let version =
        policies::show(&stack.db.ds, &stack.operator_in(0).await).await.expect("show").version;
    let ctx = stack.operator_in(0).await;
    let current = policies::show(&stack.db.ds, &ctx).await.expect("show").source;
    let stricter = format!(
        "{current}\n@id(\"no-messages\")\n@reason(\"no messages today\")\nforbid (principal, action == Action::\"send_customer_message\", resource);"
    );
    // Set, then judged, by a process of its own with one connection that has compiled nothing
    // yet: the set's sources are read in the setting's and the approval's transactions, never
    // on a second connection (which the one the transaction holds would never free).
    let one = shared::Services::connect(&stack.db.url, 1).await.expect("one connection");
    policies::set(&one, &ctx, &stricter, version, "").await.expect("narrower");
    let handle = waiting["action"].as_str().expect("action handle");
    let err = shared::services::actions::approve(&one, &ctx, handle, "ok", jiff::Timestamp::now())
        .await
        .expect_err("a forbid refuses the person too");
    assert!(err.to_string().contains("no-messages"), "{err}");
    // A policy put in force after the preview decides at confirm: the previewed delete is
    // refused now, audited, and cannot run.
    set(&stack, "@id(\"no-deletes\")\n@reason(\"no deletions this week\")\nforbid (principal, action == Action::\"delete_booking\", resource);").await;
    let err = stack
        .call(&token, "confirm_action", json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]}))
        .await
        .expect_err("refused at confirm");
    assert!(err["message"].as_str().expect("message").contains("no-deletes"), "{err}");
    let still = stack.db.rows("bookings").eq("handle", &later).count().await;
    assert_eq!(still, 1, "nothing was deleted");
    let at_confirm = decided(policy_of("delete_booking.confirm", "refused").await);
    assert_eq!(at_confirm, json!({"version": 3, "decided_by": ["no-deletes"]}));
    // Rows no policy decided say nothing of it: a rejection under the set, and a write of a
    // tenant with no set in force.
    let (other_booking, _, _) = handles(&stack, 1).await;
    stack
        .ok(
            &stack.token(1, 0),
            "add_booking_note",
            json!({"booking": other_booking, "text": "no policies here"}),
        )
        .await;
    let (audited, with_a_policy) =
        stack.db.audited_in_tenants_without_policies("add_booking_note").await;
    assert_eq!(audited, 1, "the other tenant's write is audited");
    assert_eq!(with_a_policy, 0);
}

#[tokio::test]
async fn a_set_that_does_not_parse_validate_or_start_from_the_version_in_force_changes_nothing() {
    let stack = Stack::start().await;
    let ctx = stack.operator_in(0).await;
    let ds = &stack.db.ds;
    assert_eq!(set(&stack, NO_CUSTOMER_READS).await, 1);
    for (bad, says) in [
        ("forbid (principal, action, resource) when { 1 +* 2 };", "line 1"),
        (
            "@id(\"x\")\n@reason(\"r\")\nforbid (principal, action == Action::\"no_such_tool\", resource);",
            "line 3",
        ),
        ("@id(\"x\")\n@reason(\"r\")\npermit (principal, action, resource);", "only `forbid`"),
        (
            "@id(\"x\")\n@reason(\"r\")\nforbid (principal == Connection::\"con_of_another_tenant\", action, resource) when { context.args.nope == 1 };",
            "nope",
        ),
    ] {
        let err = policies::set(ds, &ctx, bad, 1, "").await.expect_err("refused");
        assert!(err.to_string().contains(says), "{bad}: {err}");
    }
    assert_eq!(policies::show(ds, &ctx).await.expect("show").version, 1, "the set in force stays");
    // Two admins edit at once: the second, starting from version 1 after the first set 2, is
    // told and loses nothing.
    policies::set(ds, &ctx, "", 1, "first").await.expect("first");
    let err = policies::set(ds, &ctx, NO_CUSTOMER_READS, 1, "second").await.expect_err("conflict");
    assert!(err.to_string().contains("version 2 is in force"), "{err}");
    let history = policies::history(ds, &ctx, 10).await.expect("history");
    assert_eq!(history.iter().map(|v| v.version).collect::<Vec<_>>(), vec![2, 1]);
    assert!(history[0].removed.iter().any(|l| l.contains("no-customer-reads")), "{:?}", history[0]);
    // Widening is decided conservatively: removing a policy widens, adding one narrows.
    assert!(shared::policies::widens(NO_CUSTOMER_READS, ""));
    assert!(!shared::policies::widens("", NO_CUSTOMER_READS));
}

#[tokio::test]
async fn a_draft_is_simulated_against_the_audited_calls() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let (_, customer, _) = handles(&stack, 0).await;
    for _ in 0..3 {
        stack
            .ok(
                &token,
                "send_customer_message",
                json!({"customer": customer, "subject": "Hi", "body": "See you."}),
            )
            .await;
    }
    let ctx = stack.operator_in(0).await;
    let draft = "@id(\"quiet\")\n@reason(\"no messages\")\nforbid (principal, action == Action::\"send_customer_message\", resource);";
    let sim = policies::simulate(&stack.db.ds, &ctx, draft, 24).await.expect("simulate");
    assert!(sim.calls >= 3, "{sim:?}");
    assert_eq!(sim.forbidden, 3, "{sim:?}");
    assert_eq!(sim.by_policy[0].policy, "quiet");
    assert!(!sim.examples.is_empty());
    // Enforcing it then does what the simulation said: the same call is refused.
    set(&stack, draft).await;
    let err = stack
        .call(
            &token,
            "send_customer_message",
            json!({"customer": customer, "subject": "Hi", "body": "See you."}),
        )
        .await
        .expect_err("refused");
    assert_eq!(err["code"], "forbidden_by_policy");
}

const SAME_REGION: &str = r#"
@id("same-region")
@reason("bookings move only to a technician of the booking's region")
forbid (principal, action == Action::"update_booking", resource is Booking)
when {
  context has technician && resource has region &&
  (if context.technician has region then context.technician.region != resource.region else true)
};

@id("same-region-new")
@reason("new bookings go only to a technician of the customer's region")
forbid (principal, action == Action::"create_booking", resource is Customer)
when {
  context has technician && resource has region &&
  (if context.technician has region then context.technician.region != resource.region else true)
};
"#;

const CUSTOMER_NIGHT: &str = r#"
@id("customer-night")
@reason("no message to a customer between 20:00 and 08:00 in the customer's zone")
forbid (principal, action == Action::"send_customer_message", resource is Customer)
when { resource has local_time && (resource.local_time.hour >= 20 || resource.local_time.hour < 8) };
"#;

#[tokio::test]
async fn rules_read_the_region_and_the_customers_clock_of_the_records_a_call_names() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    // The seed's regions, as the tools show them.
    let (north, south) = north_and_south(&stack, &token).await;
    let found =
        stack.ok(&token, "find_bookings", json!({"status": "confirmed", "limit": 100})).await;
    let mut booking = None;
    for b in found["bookings"].as_array().expect("bookings") {
        let customer = b["customer"]["customer"].as_str().expect("customer");
        let c = stack.ok(&token, "get_customer", json!({"customer": customer})).await;
        if c["region"] == "north" {
            booking = Some(b["booking"].as_str().expect("handle").to_owned());
            break;
        }
    }
    let booking = booking.expect("a confirmed booking of a northern customer");
    let northern =
        stack.ok(&token, "get_booking", json!({"booking": booking})).await["customer"]["customer"]
            .as_str()
            .expect("customer")
            .to_owned();
    let service = stack.ok(&token, "find_services", json!({})).await["services"][0]["service"]
        .as_str()
        .expect("service")
        .to_owned();
    // Days a few weeks ahead, whenever this runs.
    let today = jiff::Timestamp::now().to_zoned_datetime(jiff::tz::TimeZone::UTC).date();
    let new_booking = |technician: &str, day: i64| {
        let date = today.checked_add(jiff::Span::new().days(21 + day)).expect("a date");
        json!({"customer": northern, "service": service, "technician": technician,
               "start": format!("{date}T10:00"), "zone": "Europe/Berlin"})
    };
    let version = |b: &Value| b["version"].as_str().expect("version").to_owned();
    let read = stack.ok(&token, "get_booking", json!({"booking": booking})).await;
    // With no set in force, a move to the south; replaying the draft over that history
    // predicts the refusal that enforcing it then gives.
    let earlier = stack
        .ok(
            &token,
            "update_booking",
            json!({"booking": booking, "version": version(&read), "technician": south}),
        )
        .await;
    let before = earlier["booking"].clone();
    stack.ok(&token, "create_booking", new_booking(&south, 1)).await;
    stack.ok(&token, "create_booking", new_booking(&north, 2)).await;
    let operator = stack.operator_in(0).await;
    let sim = policies::simulate(&stack.db.ds, &operator, SAME_REGION, 1).await.expect("simulate");
    assert_eq!((sim.forbidden, sim.allowed), (2, sim.calls - 2), "{sim:?}");
    let by: Vec<(&str, usize)> =
        sim.by_policy.iter().map(|p| (p.policy.as_str(), p.forbidden)).collect();
    assert_eq!(by, [("same-region", 1), ("same-region-new", 1)], "{sim:?}");
    set(&stack, SAME_REGION).await;
    // Enforced, the same new bookings do what the replay said.
    let err = stack
        .call(&token, "create_booking", new_booking(&south, 3))
        .await
        .expect_err("a technician of another region");
    assert!(err["message"].as_str().expect("message").contains("same-region-new"), "{err}");
    stack.ok(&token, "create_booking", new_booking(&north, 4)).await;
    let err = stack
        .call(
            &token,
            "update_booking",
            json!({"booking": booking, "version": version(&before), "technician": south}),
        )
        .await
        .expect_err("a technician of another region");
    assert_eq!(err["code"], "forbidden_by_policy", "{err}");
    let message = err["message"].as_str().expect("message");
    assert!(message.contains("same-region") && message.contains("booking's region"), "{err}");
    let unchanged = stack.ok(&token, "get_booking", json!({"booking": booking})).await;
    assert_eq!(version(&unchanged), version(&before), "the refused move changed nothing");
    // A technician of the booking's region: the move goes through, and the audit names the
    // technician among the records touched (what a replay of the rule reads).
    let moved = stack
        .ok(
            &token,
            "update_booking",
            json!({"booking": booking, "version": version(&before), "technician": north}),
        )
        .await;
    assert_eq!(moved["booking"]["technician"]["technician"], north.as_str(), "{moved}");
    let named =
        stack.db.audited_with_targets("update_booking", &[booking.as_str(), north.as_str()]).await;
    assert_eq!(named, 1);
    // A change naming no technician is not judged on one.
    stack
        .ok(
            &token,
            "update_booking",
            json!({"booking": booking, "version": version(&moved["booking"]), "priority": "high"}),
        )
        .await;

    // The customer's own clock: night in their zone refuses, day lets the message through.
    // The tenant's systems set the zone; an agent cannot (it would switch the rule off).
    set(&stack, CUSTOMER_NIGHT).await;
    let (_, customer, _) = handles(&stack, 0).await;
    let operator = stack.operator_in(0).await;
    let place = |zone: String| {
        let (ds, operator, customer) = (&stack.db.ds, &operator, customer.clone());
        async move {
            let input = places::CustomerPlaceInput { customer, region: None, zone: Some(zone) };
            places::set_customer_place(ds, operator, &input, jiff::Timestamp::now())
                .await
                .expect("placed")
                .customer
        }
    };
    let asleep = shared::testing::zone_at(2);
    let night = place(asleep.clone()).await;
    assert_eq!(night.zone.as_deref(), Some(asleep.as_str()));
    let c = stack.ok(&token, "get_customer", json!({"customer": customer})).await;
    let err = stack
        .call(
            &token,
            "update_customer",
            json!({"customer": customer, "version": version(&c), "zone": shared::testing::zone_at(14)}),
        )
        .await
        .expect_err("an agent cannot move a customer into the day");
    assert_eq!(err["code"], "unknown_field", "{err}");
    let agent = stack.connection_ctx(&token).await;
    let input = places::CustomerPlaceInput {
        customer: customer.clone(),
        region: Some(String::new()),
        zone: None,
    };
    let err = places::set_customer_place(&stack.db.ds, &agent, &input, jiff::Timestamp::now())
        .await
        .expect_err("not by agents");
    assert!(err.to_string().contains("an agent cannot set"), "{err}");
    let message = json!({"customer": customer, "subject": "Visit", "body": "We arrive at nine."});
    let err = stack
        .call(&token, "send_customer_message", message.clone())
        .await
        .expect_err("night in the customer's zone");
    assert_eq!(err["code"], "forbidden_by_policy", "{err}");
    assert!(err["message"].as_str().expect("message").contains("customer-night"), "{err}");
    let awake = shared::testing::zone_at(14);
    place(awake.clone()).await;
    let preview = stack.ok(&token, "send_customer_message", message).await;
    assert_eq!(preview["status"], "PREVIEW", "{preview}");
    // A zone that is none, or a blank region, is refused and leaves the customer as they were;
    // a zone is kept by its canonical name and a region in lowercase.
    for (region, zone) in [(None, Some("Mars/Olympus_Mons")), (Some("  "), None)] {
        let input = places::CustomerPlaceInput {
            customer: customer.clone(),
            region: region.map(str::to_owned),
            zone: zone.map(str::to_owned),
        };
        let err =
            places::set_customer_place(&stack.db.ds, &operator, &input, jiff::Timestamp::now())
                .await
                .expect_err("refused");
        assert!(matches!(err, shared::Error::Invalid { .. }), "{err}");
    }
    let after = stack.ok(&token, "get_customer", json!({"customer": customer})).await;
    assert_eq!(after["zone"], awake.as_str());
    let input = places::CustomerPlaceInput {
        customer: customer.clone(),
        region: Some("North ".into()),
        zone: Some("europe/lisbon".into()),
    };
    let kept = places::set_customer_place(&stack.db.ds, &operator, &input, jiff::Timestamp::now())
        .await
        .expect("placed")
        .customer;
    assert_eq!(
        (kept.region.as_deref(), kept.zone.as_deref()),
        (Some("north"), Some("Europe/Lisbon"))
    );
}

fn policies_kinds() -> Vec<&'static str> {
    shared::policies::BUDGET_KINDS.to_vec()
}

const ONE_MESSAGE: &str = r#"
@id("one-message")
@reason("one message a window per connection; ask a person for more")
forbid (principal, action == Action::"send_customer_message", resource)
when {
  context has budgets && context.budgets has customers_messaged &&
  context.budgets.customers_messaged.used >= 1
};
"#;

#[tokio::test]
async fn a_rule_over_budgets_reads_what_the_window_used_apart_from_the_action_itself() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    set(&stack, ONE_MESSAGE).await;
    let customers = stack.ok(&token, "find_customers", json!({"limit": 2})).await;
    let customer = |i: usize| customers["customers"][i]["customer"].as_str().expect("c").to_owned();
    let message = |c: String| json!({"customer": c, "subject": "Visit", "body": "At nine."});
    // Nothing used yet: the first message is previewed, and reserves its effect.
    let preview = stack.ok(&token, "send_customer_message", message(customer(0))).await;
    assert_eq!(preview["status"], "PREVIEW", "{preview}");
    // The reservation is used: a second message is refused by the rule.
    let err = stack
        .call(&token, "send_customer_message", message(customer(1)))
        .await
        .expect_err("the window's one message is taken");
    assert_eq!(err["code"], "forbidden_by_policy", "{err}");
    assert!(err["message"].as_str().expect("message").contains("one-message"), "{err}");
    // Confirming the first is judged apart from its own reservation, and runs.
    let done = stack
        .ok(
            &token,
            "confirm_action",
            json!({"confirm_token": preview["confirm_token"], "confirm_summary": preview["confirm_summary"]}),
        )
        .await;
    assert_eq!(done["status"], "EXECUTED", "{done}");
}

const OVER_ARGUMENTS: &str = r#"
@id("short-mutes")
@reason("alerts are muted for an hour at most")
forbid (principal, action == Action::"mute_alerts", resource)
when { context.args has minutes && context.args.minutes > 60 };

@id("no-refund-talk")
@reason("notes never promise refunds")
forbid (principal, action == Action::"add_booking_note", resource)
when { context.args has text && context.args.text like "*refund*" };
"#;

#[tokio::test]
async fn a_rule_over_arguments_replays_on_the_facts_kept_and_never_on_free_text() {
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let (booking, _, _) = handles(&stack, 0).await;
    let rule = stack.ok(&token, "find_alert_rules", json!({})).await["rules"][0]["rule"]
        .as_str()
        .expect("rule")
        .to_owned();
    // The history, with no set in force: a long mute (previewed), a short one, and a note.
    for minutes in [120, 30] {
        let preview =
            stack.ok(&token, "mute_alerts", json!({"rule": rule, "minutes": minutes})).await;
        assert_eq!(preview["status"], "PREVIEW", "{preview}");
    }
    let note = json!({"booking": booking, "text": "We will refund the call-out."});
    stack.ok(&token, "add_booking_note", note.clone()).await;
    // What is kept of the calls: the numbers and handles, never the note's text.
    let with_text = stack.db.call_facts_with_key_or_text("text", "refund").await;
    assert_eq!(with_text, 0, "free text is never kept");
    let minutes = stack.db.call_facts_with_number("minutes", 120).await;
    assert_eq!(minutes, 1);
    // The replay judges the mutes on their minutes, exactly as enforcement then does; the
    // rule over text cannot be replayed, and says so in the caveat.
    let operator = stack.operator_in(0).await;
    let sim = policies::simulate(&stack.db.ds, &operator, OVER_ARGUMENTS, 1).await.expect("sim");
    let by: Vec<(&str, usize)> =
        sim.by_policy.iter().map(|p| (p.policy.as_str(), p.forbidden)).collect();
    assert_eq!(by, [("short-mutes", 1)], "{sim:?}");
    assert!(sim.caveat.contains("free text"), "{}", sim.caveat);
    set(&stack, OVER_ARGUMENTS).await;
    let err = stack
        .call(&token, "mute_alerts", json!({"rule": rule, "minutes": 120}))
        .await
        .expect_err("a long mute");
    assert!(err["message"].as_str().expect("message").contains("short-mutes"), "{err}");
    let short = stack.ok(&token, "mute_alerts", json!({"rule": rule, "minutes": 30})).await;
    assert_eq!(short["status"], "PREVIEW", "{short}");
    let err = stack.call(&token, "add_booking_note", note).await.expect_err("enforced on text");
    assert!(err["message"].as_str().expect("message").contains("no-refund-talk"), "{err}");
}

const NO_PAGING_SOUTH: &str = r#"
@id("no-paging-south")
@reason("the southern crew is paged by its dispatcher, not by agents")
forbid (principal, action == Action::"page_technician", resource is Technician)
when { resource has region && resource.region == "south" };
"#;

#[tokio::test]
async fn a_call_is_replayed_on_the_record_its_arguments_name_as_enforcement_judges_it() {
    // `page_technician` takes an optional booking: paged without one, the call is judged on
    // the technician it names, and the replay must judge it there too (not on the tenant, as
    // the first kind of record the tool can name would say).
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let (north, south) = north_and_south(&stack, &token).await;
    // The tools read a handle trimmed: one padded past the length the audit keeps still names
    // its technician, to the replay as to enforcement.
    let padded = format!("{south}{}", " ".repeat(150));
    for technician in [&south, &north, &padded] {
        stack
            .ok(&token, "page_technician", json!({"technician": technician, "message": "Leak"}))
            .await;
    }
    let operator = stack.operator_in(0).await;
    let sim =
        policies::simulate(&stack.db.ds, &operator, NO_PAGING_SOUTH, 1).await.expect("simulate");
    assert_eq!((sim.calls, sim.forbidden, sim.allowed), (3, 2, 1), "{sim:?}");
    set(&stack, NO_PAGING_SOUTH).await;
    let err = stack
        .call(&token, "page_technician", json!({"technician": south, "message": "Leak"}))
        .await
        .expect_err("the southern crew");
    assert_eq!(err["code"], "forbidden_by_policy", "{err}");
    assert!(err["message"].as_str().expect("message").contains("no-paging-south"), "{err}");
    let err = stack
        .call(&token, "page_technician", json!({"technician": padded, "message": "Leak"}))
        .await
        .expect_err("the southern crew, padded");
    assert_eq!(err["code"], "forbidden_by_policy", "{err}");
    stack.ok(&token, "page_technician", json!({"technician": north, "message": "Leak"})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_arrive_together_after_a_new_version_share_one_compilation() {
    let stack = Stack::start().await;
    let version = set(&stack, &hundred_policies()).await;
    let ctx = stack.operator_in(0).await;
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let (ds, ctx) = (stack.db.ds.clone(), ctx.clone());
            tokio::spawn(async move { policies::compiled(&ds, &ctx, version).await })
        })
        .collect();
    let mut sets = Vec::new();
    for call in calls {
        sets.push(call.await.expect("joined").expect("compiled").expect("a set in force"));
    }
    // One compilation: every call holds the very same compiled set.
    assert!(sets.iter().all(|s| std::sync::Arc::ptr_eq(s, &sets[0])), "each call compiled its own");
}

/// A set of 100 policies, as the benchmark writes it: compiling it takes long enough for calls
/// arriving together to meet.
fn hundred_policies() -> String {
    (0..100)
        .map(|i| {
            format!(
                "@id(\"p{i}\")\n@reason(\"r\")\nforbid (principal, action == Action::\"get_booking\", resource) when {{ context.effects > {} }};\n",
                100_000 + i
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admins_setting_at_once_from_the_same_version_leave_one_set_and_lose_no_update() {
    // Eight edits started from version 0 at the same moment: exactly one is put in force, each
    // other one is told the version it raced, and the history holds only the one.
    let stack = Stack::start().await;
    let ctx = stack.operator_in(0).await;
    let edits: Vec<_> = (0..8)
        .map(|i| {
            let (ds, ctx) = (stack.db.ds.clone(), ctx.clone());
            let source = format!(
                "@id(\"edit-{i}\")\n@reason(\"edit {i}\")\nforbid (principal, action == Action::\"get_customer\", resource);"
            );
            tokio::spawn(async move { policies::set(&ds, &ctx, &source, 0, &format!("edit {i}")).await })
        })
        .collect();
    let (mut won, mut told) = (Vec::new(), 0);
    for (i, edit) in edits.into_iter().enumerate() {
        match edit.await.expect("joined") {
            Ok(done) => won.push((i, done.version)),
            Err(e) => {
                assert!(e.to_string().contains("version 1 is in force"), "{e}");
                told += 1;
            }
        }
    }
    assert_eq!((won.len(), told), (1, 7), "{won:?}");
    assert_eq!(won[0].1, 1);
    let view = policies::show(&stack.db.ds, &ctx).await.expect("show");
    assert_eq!(view.version, 1);
    assert!(view.source.contains(&format!("edit-{}", won[0].0)), "{}", view.source);
    let history = policies::history(&stack.db.ds, &ctx, 10).await.expect("history");
    assert_eq!(history.len(), 1, "{history:?}");
}

#[tokio::test]
async fn a_version_that_no_longer_compiles_refuses_every_call_until_another_is_set() {
    // The version in force stops compiling (here its stored text is changed to name a tool the
    // schema does not have, as a tool that left the registry would): every call judged by the
    // tenant's policies is refused, none allowed, and the next version set is compiled afresh.
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let (_, customer, _) = handles(&stack, 0).await;
    let version = set(&stack, NO_CUSTOMER_READS).await;
    stack
        .db
        .exec(&format!(
            "UPDATE tenant_policies SET source = replace(source, 'get_customer', 'gone_tool') WHERE version = {version}"
        ))
        .await;
    for _ in 0..2 {
        let err = stack
            .call(&token, "get_customer", json!({"customer": customer}))
            .await
            .expect_err("refused while the set does not compile");
        let message = err["message"].as_str().expect("message");
        assert!(message.contains("no longer compiles") && message.contains("gone_tool"), "{err}");
    }
    set(&stack, "").await;
    stack.ok(&token, "get_customer", json!({"customer": customer})).await;
}

#[tokio::test]
async fn a_batch_is_refused_when_any_of_its_bookings_is_whatever_its_place_in_the_batch() {
    // A plan is judged on each booking it touches when a policy reads the record (once when
    // none does): the one booking inside 48 hours refuses the batch also when it comes last.
    let stack = Stack::start().await;
    let token = stack.token(0, 0);
    let slug = stack.seed.tenants[0].slug.clone();
    let soon = stack.db.next_booking_starting_between(&slug, "1 hour", "47 hours").await;
    let far = stack.db.next_confirmed_bookings_starting_after(&slug, "72 hours", 2).await;
    assert_eq!(far.len(), 2, "{far:?}");
    set(
        &stack,
        r#"
@id("cancel-48h")
@reason("agents cancel only bookings that start more than 48 hours from now")
forbid (principal, action == Action::"cancel_bookings", resource is Booking)
when { resource has hours_until_start && resource.hours_until_start < 48 };
"#,
    )
    .await;
    let err = stack
        .call(&token, "cancel_bookings", json!({"bookings": [far[0], far[1], soon]}))
        .await
        .expect_err("the last booking starts within 48 hours");
    assert_eq!(err["code"], "forbidden_by_policy", "{err}");
    assert!(err["message"].as_str().expect("message").contains("cancel-48h"), "{err}");
    stack.ok(&token, "cancel_bookings", json!({"bookings": far})).await;
}
