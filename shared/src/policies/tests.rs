use super::*;
use serde_json::json;

fn schema() -> Arc<PolicySchema> {
    let cancel = json!({"type": "object", "properties": {
        "booking": {"type": "string"}, "reason": {"type": ["string", "null"]},
        "note": {"type": "object"}}, "required": ["booking"]});
    let message = json!({"type": "object", "properties": {
        "customer": {"type": "string"}, "subject": {"type": "string"}}, "required": ["customer"]});
    let tools = [
        ToolFacts {
            name: "cancel_booking",
            class: EffectClass::Notify,
            input_schema: cancel.as_object().expect("object"),
        },
        ToolFacts {
            name: "send_customer_message",
            class: EffectClass::Notify,
            input_schema: message.as_object().expect("object"),
        },
    ];
    Arc::new(PolicySchema::new(schema_json(&tools)).expect("schema"))
}

fn principal() -> Principal {
    Principal {
        handle: "con_a".into(),
        role: "member".into(),
        client: "Claude".into(),
        grant: "static".into(),
        name: "n".into(),
        creator: "per_a".into(),
    }
}

fn call<'a>(
    who: &'a Principal,
    tool: &'a str,
    hour: i8,
    hours_until_start: Option<i64>,
) -> Call<'a> {
    let now = jiff::civil::date(2026, 12, 7)
        .at(hour, 30, 0, 0)
        .to_zoned_datetime(jiff::tz::TimeZone::UTC)
        .expect("zoned");
    Call {
        connection: who,
        tool,
        class: EffectClass::Notify,
        phase: "prepare",
        args: json!({"booking": "bkg_x", "customer": "cus_x"}),
        resource: match hours_until_start {
            Some(h) => Resource::Booking {
                handle: "bkg_x".into(),
                status: Some("confirmed".into()),
                hours_until_start: Some(h),
                region: None,
            },
            None => Resource::Tenant("ten_x".into()),
        },
        technician: None,
        budgets: Vec::new(),
        effects: 1,
        now,
    }
}

const RULES: &str = r#"
@id("cancel-48h")
@reason("agents cancel only bookings that start more than 48 hours from now")
forbid (principal, action == Action::"cancel_booking", resource is Booking)
when { resource has hours_until_start && resource.hours_until_start < 48 };

@id("quiet-hours")
@reason("no message to a customer between 20:00 and 08:00")
forbid (principal, action == Action::"send_customer_message", resource)
when { context.now.hour >= 20 || context.now.hour < 8 };

@id("big-batches")
@approval
@reason("more than 20 records at once needs a person")
forbid (principal, action, resource) when { context.effects > 20 };
"#;

#[test]
fn a_forbid_names_its_policy_an_approval_sends_to_a_person_and_the_rest_is_allowed() {
    let compiled = Compiled::compile(RULES, schema()).expect("compiles");
    let who = principal();
    assert_eq!(compiled.evaluate(&call(&who, "cancel_booking", 10, Some(100))), Verdict::Allow);
    match compiled.evaluate(&call(&who, "cancel_booking", 10, Some(12))) {
        Verdict::Forbid(p) => assert_eq!(p.id, "cancel-48h"),
        other => panic!("{other:?}"),
    }
    match compiled.evaluate(&call(&who, "send_customer_message", 21, None)) {
        Verdict::Forbid(p) => {
            assert_eq!(p.id, "quiet-hours");
            assert!(p.reason.contains("20:00"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(compiled.evaluate(&call(&who, "send_customer_message", 9, None)), Verdict::Allow);
    let mut batch = call(&who, "send_customer_message", 9, None);
    batch.effects = 21;
    match compiled.evaluate(&batch) {
        Verdict::Approval(p) => assert_eq!(p.id, "big-batches"),
        other => panic!("{other:?}"),
    }
    // A hard forbid beats an approval.
    let mut both = call(&who, "send_customer_message", 22, None);
    both.effects = 21;
    assert!(matches!(compiled.evaluate(&both), Verdict::Forbid(p) if p.id == "quiet-hours"));
    // No policy: everything the rights allow.
    let empty = Compiled::compile("", schema()).expect("an empty set");
    assert_eq!(empty.evaluate(&call(&who, "cancel_booking", 10, Some(1))), Verdict::Allow);
}

#[test]
fn a_set_that_does_not_parse_or_validate_is_refused_with_each_problem_at_its_line() {
    let parse = Compiled::compile("@id(\"x\")\n@reason(\"r\")\nforbid (principal, action, resource) when { context.now.hour >> 3 };", schema()).expect_err("parse");
    assert!(parse.iter().all(|p| p.line == 3), "{parse:?}");
    let unknown = "\n\n@id(\"x\")\n@reason(\"r\")\nforbid (principal, action == Action::\"no_such_tool\", resource);";
    let problems = Compiled::compile(unknown, schema()).expect_err("schema");
    assert!(
        problems.iter().any(|p| p.line == 5 && p.message.contains("no_such_tool")),
        "{problems:?}"
    );
    let typo = "@id(\"x\")\n@reason(\"r\")\nforbid (principal, action, resource) when { context.now.hours > 3 };";
    assert!(Compiled::compile(typo, schema()).is_err(), "an attribute the schema lacks");
    let permit = "@id(\"x\")\n@reason(\"r\")\npermit (principal, action, resource);";
    let problems = Compiled::compile(permit, schema()).expect_err("permit");
    assert!(problems[0].message.contains("only `forbid`"), "{problems:?}");
    let unnamed = "forbid (principal, action, resource);";
    let problems = Compiled::compile(unnamed, schema()).expect_err("no id");
    assert!(
        problems.iter().any(|p| p.message.contains("@id"))
            && problems.iter().any(|p| p.message.contains("@reason")),
        "{problems:?}"
    );
    let twice = "@id(\"x\")\n@reason(\"r\")\nforbid (principal, action, resource);\n@id(\"x\")\n@reason(\"r\")\nforbid (principal, action, resource) when { context.effects > 1 };";
    assert!(
        Compiled::compile(twice, schema())
            .expect_err("twice")
            .iter()
            .any(|p| p.message.contains("twice"))
    );
    // Another tenant's entities are just names that match nothing of this tenant's calls; a
    // policy's principal is this tenant's connection or nothing.
    let deep = format!(
        "@id(\"x\")\n@reason(\"r\")\nforbid (principal, action, resource) when {{ {}true{} }};",
        "(".repeat(200),
        ")".repeat(200)
    );
    let problems = Compiled::compile(&deep, schema()).expect_err("deep");
    assert!(problems[0].message.contains("nest"), "{problems:?}");
    let huge = "// x\n".repeat(MAX_SOURCE_BYTES / 4);
    assert!(Compiled::compile(&huge, schema()).expect_err("huge")[0].message.contains("bytes"));
}

#[test]
fn a_policy_forbidding_everything_works_like_a_kill_switch_and_an_evaluation_error_denies() {
    let all =
        "@id(\"stop\")\n@reason(\"agents are paused\")\nforbid (principal, action, resource);";
    let compiled = Compiled::compile(all, schema()).expect("compiles");
    let who = principal();
    for tool in ["cancel_booking", "send_customer_message"] {
        assert!(
            matches!(compiled.evaluate(&call(&who, tool, 10, Some(100))), Verdict::Forbid(p) if p.id == "stop")
        );
    }
    // A tool the schema does not know cannot be evaluated: refused, never allowed.
    assert!(matches!(compiled.evaluate(&call(&who, "no_such_tool", 10, None)), Verdict::Error(_)));
}

#[test]
fn adding_a_forbid_narrows_and_anything_else_widens() {
    let one = "@id(\"a\")\n@reason(\"r\")\nforbid (principal, action, resource) when { context.effects > 5 };";
    let two = format!(
        "{one}\n@id(\"b\")\n@approval\n@reason(\"r\")\nforbid (principal, action, resource) when {{ context.effects > 2 }};"
    );
    assert!(!widens("", one));
    assert!(!widens(one, &two));
    assert!(widens(&two, one), "removing a policy widens");
    assert!(widens(one, &one.replace("> 5", "> 50")), "changing one widens");
    assert!(widens(one, "not cedar"), "a set that does not parse is taken to widen");
}

#[test]
fn the_schema_types_the_arguments_cedar_can_name_and_facts_keep_only_those() {
    let cancel = json!({"type": "object", "properties": {
        "booking": {"type": "string"}, "limit": {"type": "integer"}, "statuses": {"type": "array", "items": {"type": "string"}},
        "nested": {"type": "object"}, "price": {"type": "number"}}, "required": ["booking"]});
    let tools = [ToolFacts {
        name: "t",
        class: EffectClass::Read,
        input_schema: cancel.as_object().expect("object"),
    }];
    let json = schema_json(&tools);
    let args =
        &json[""]["actions"]["t"]["appliesTo"]["context"]["attributes"]["args"]["attributes"];
    assert_eq!(args["booking"]["type"], "String");
    assert_eq!(args["booking"]["required"], false, "every argument is optional to a policy");
    assert_eq!(args["limit"]["required"], false);
    assert_eq!(args["statuses"]["type"], "Set");
    assert!(args.get("nested").is_none() && args.get("price").is_none(), "{args}");
    // A policy reads the arguments of their type; one sent with another type is absent to it.
    let schema = Arc::new(PolicySchema::new(json).expect("schema"));
    let rules = r#"
@id("typed")
@reason("r")
forbid (principal, action == Action::"t", resource)
when { context.args has booking && context.args.booking == "bkg_1" && context.args has statuses && context.args.statuses.contains("a") };
@id("limit")
@reason("r")
forbid (principal, action == Action::"t", resource) when { context.args has limit };
"#;
    let compiled = Compiled::compile(rules, schema).expect("compiles");
    let who = principal();
    let mut sent = call(&who, "t", 10, None);
    sent.args = json!({"booking": "bkg_1", "limit": "ten", "statuses": ["a"], "nested": {}});
    assert!(matches!(compiled.evaluate(&sent), Verdict::Forbid(p) if p.id == "typed"));
    sent.args = json!({"booking": "bkg_1", "limit": 10, "statuses": ["b"]});
    assert!(matches!(compiled.evaluate(&sent), Verdict::Forbid(p) if p.id == "limit"));
    sent.args = json!({"booking": "bkg_1", "statuses": ["a", 3]});
    assert_eq!(compiled.evaluate(&sent), Verdict::Allow, "a list with a stranger is absent");
}

#[test]
fn a_call_is_judged_by_the_policies_scoped_to_its_tool_and_those_scoped_to_none() {
    let rules = r#"
@id("messages")
@reason("r")
forbid (principal, action == Action::"send_customer_message", resource);
@id("both")
@reason("r")
forbid (principal, action in [Action::"send_customer_message", Action::"cancel_booking"], resource)
when { context.effects > 5 };
@id("any")
@reason("r")
forbid (principal, action, resource) when { context.now.hour == 3 };
"#;
    let compiled = Compiled::compile(rules, schema()).expect("compiles");
    let who = principal();
    assert!(compiled.judges("cancel_booking") && compiled.judges("send_customer_message"));
    assert!(compiled.judges("no_such_tool"), "an unknown tool is refused, so it is judged");
    let at = |tool, hour, effects| {
        let mut c = call(&who, tool, hour, Some(100));
        c.effects = effects;
        compiled.evaluate(&c)
    };
    assert!(matches!(at("send_customer_message", 10, 1), Verdict::Forbid(p) if p.id == "messages"));
    assert_eq!(at("cancel_booking", 10, 1), Verdict::Allow);
    assert!(matches!(at("cancel_booking", 10, 6), Verdict::Forbid(p) if p.id == "both"));
    assert!(matches!(at("cancel_booking", 3, 1), Verdict::Forbid(p) if p.id == "any"));
    // A set about messages only does not judge cancellations at all.
    let messages = Compiled::compile(
        "@id(\"m\")\n@reason(\"r\")\nforbid (principal, action == Action::\"send_customer_message\", resource);",
        schema(),
    )
    .expect("compiles");
    assert!(!messages.judges("cancel_booking") && messages.judges("send_customer_message"));
    assert_eq!(messages.evaluate(&call(&who, "cancel_booking", 3, Some(1))), Verdict::Allow);
}

#[test]
fn comments_cannot_hide_nesting_or_make_a_changed_policy_look_the_same() {
    let hidden = format!(
        "// a \" opens no string in a comment\n@id(\"x\")\n@reason(\"r\")\nforbid (principal, action, resource) when {{ {}true{} }};",
        "(".repeat(100),
        ")".repeat(100)
    );
    let problems = Compiled::compile(&hidden, schema()).expect_err("deep");
    assert!(problems[0].message.contains("nest"), "{problems:?}");
    // The old policy forbids always (its comment swallowed the condition); the new one only
    // sometimes: that widens, whatever the layout.
    let old = "@id(\"x\")\n@reason(\"r\")\nforbid (principal, action, resource) // x when { context.effects > 1 }\n;";
    let new = "@id(\"x\")\n@reason(\"r\")\nforbid (principal, action, resource) // x\nwhen { context.effects > 1 }\n;";
    assert!(widens(old, new));
    assert!(!widens(old, &format!("{old}\n// a comment added")), "comments change nothing");
}

#[test]
fn arguments_too_large_for_policies_refuse_the_call() {
    let compiled = Compiled::compile(RULES, schema()).expect("compiles");
    let who = principal();
    let mut big = call(&who, "send_customer_message", 10, None);
    big.args = json!({"customer": "c".repeat(MAX_ARG_CHARS + 1)});
    assert!(matches!(compiled.evaluate(&big), Verdict::Error(e) if e.contains("longer")));
    big.args = json!({"customer": vec!["c"; MAX_ARG_ITEMS + 1]});
    assert!(matches!(compiled.evaluate(&big), Verdict::Error(e) if e.contains("items")));
    // No policy reads a call of a tool none applies to: nothing to bound.
    let empty = Compiled::compile("", schema()).expect("empty");
    big.args = json!({"customer": "c".repeat(MAX_ARG_CHARS + 1)});
    assert_eq!(empty.evaluate(&big), Verdict::Allow);
}

/// The split by tool decides exactly what the whole set decides, for every tool and every form
/// of scope: `==`, `in [...]`, no action, `action` named in a condition, `is` on the resource.
#[test]
fn the_split_by_tool_decides_what_the_whole_set_decides() {
    let rules = r#"
@id("eq") @reason("r") forbid (principal, action == Action::"cancel_booking", resource) when { context.effects > 3 };
@id("in") @reason("r") forbid (principal, action in [Action::"send_customer_message"], resource is Booking);
@id("any") @reason("r") forbid (principal, action, resource) when { context.now.hour == 4 };
@id("cond") @approval @reason("r") forbid (principal, action, resource) when { action == Action::"send_customer_message" && context.effects > 1 };
@id("is") @reason("r") forbid (principal, action, resource is Booking) when { resource has status && resource.status == "draft" };
"#;
    let schema = schema();
    let compiled = Compiled::compile(rules, schema.clone()).expect("compiles");
    let mut whole: PolicySet = rules.parse().expect("parses");
    whole
        .add(
            cedar_policy::Policy::parse(
                Some(cedar_policy::PolicyId::new("gatehouse-rights-permit")),
                "permit(principal, action, resource);",
            )
            .expect("permit"),
        )
        .expect("added");
    let who = principal();
    let mut compared = 0;
    for tool in ["cancel_booking", "send_customer_message"] {
        for hour in [4, 10] {
            for effects in [0, 2, 5] {
                for status in ["draft", "confirmed"] {
                    for booking in [true, false] {
                        let mut c = call(&who, tool, hour, booking.then_some(100));
                        c.effects = effects;
                        if let Resource::Booking { status: s, .. } = &mut c.resource {
                            *s = Some(status.into());
                        }
                        let facts = &schema.actions[tool];
                        let (request, store) = compiled.request(&c, facts).expect("request");
                        let (request, entities) =
                            (Request::from(request), Entities::from(Arc::unwrap_or_clone(store)));
                        let answer = Authorizer::new().is_authorized(&request, &whole, &entities);
                        let mut expected: Vec<String> = answer
                            .diagnostics()
                            .reason()
                            .filter_map(|id| compiled.info.get(&id.to_string()))
                            .map(|p| p.id.clone())
                            .collect();
                        expected.sort();
                        let got = match compiled.evaluate(&c) {
                            Verdict::Allow => Vec::new(),
                            Verdict::Forbid(p) | Verdict::Approval(p) => vec![p.id],
                            Verdict::Error(e) => panic!("{e}"),
                        };
                        // The verdict names the strictest match; the whole set's matches hold it.
                        assert_eq!(
                            got.is_empty(),
                            expected.is_empty(),
                            "{tool} {hour} {effects} {status}: {expected:?}"
                        );
                        assert!(got.iter().all(|g| expected.contains(g)), "{got:?} {expected:?}");
                        compared += 1;
                    }
                }
            }
        }
    }
    assert_eq!(compared, 48);
}

#[test]
fn a_schema_that_groups_actions_is_refused() {
    let mut json = schema().json.clone();
    json[""]["actions"]["bookings"] = json!({});
    json[""]["actions"]["cancel_booking"]["memberOf"] = json!([{"id": "bookings"}]);
    let refused = PolicySchema::new(json).err().expect("refused");
    assert!(refused.contains("group"), "{refused}");
}

#[test]
fn a_policy_names_the_connections_creator() {
    let compiled = Compiled::compile(
        "@id(\"leaver\")\n@reason(\"r\")\nforbid (principal, action, resource) when { principal.creator == \"per_gone\" };",
        schema(),
    )
    .expect("compiles");
    let mut who = principal();
    assert_eq!(compiled.evaluate(&call(&who, "cancel_booking", 10, None)), Verdict::Allow);
    who.creator = "per_gone".into();
    assert!(
        matches!(compiled.evaluate(&call(&who, "cancel_booking", 10, None)), Verdict::Forbid(p) if p.id == "leaver")
    );
}

#[test]
fn a_connection_is_judged_as_it_is_now_when_its_entity_was_kept_from_before() {
    let set = Compiled::compile(
        "@id(\"no-dispatchers\")\n@reason(\"dispatchers' agents do not message customers\")\nforbid (principal, action == Action::\"send_customer_message\", resource) when { principal.role == \"dispatcher\" };",
        schema(),
    )
    .expect("compiles");
    let mut who = principal();
    let judged = |who: &Principal| set.evaluate(&call(who, "send_customer_message", 12, None));
    assert_eq!(judged(&who), Verdict::Allow);
    // The same connection after its creator became a dispatcher: the kept entity is not used.
    who.role = "dispatcher".into();
    assert!(matches!(judged(&who), Verdict::Forbid(p) if p.id == "no-dispatchers"));
    who.role = "member".into();
    assert_eq!(judged(&who), Verdict::Allow);
    // Another connection with the same handle's fields but another handle is its own entity.
    let mut other = principal();
    other.handle = "con_b".into();
    other.role = "dispatcher".into();
    assert!(matches!(judged(&other), Verdict::Forbid(_)));
    assert_eq!(judged(&who), Verdict::Allow);
}

#[test]
fn a_set_reads_the_records_of_a_call_only_when_a_policy_judging_it_names_them() {
    let reads = |source: &str| {
        Compiled::compile(source, schema()).expect("compiles").reads_records("cancel_booking")
    };
    let policy = |scope: &str, when: &str| {
        format!(
            "@id(\"p\")\n@reason(\"r\")\nforbid (principal, action == Action::\"cancel_booking\", {scope}) when {{ {when} }};"
        )
    };
    // Rules over the connection, the clock or the batch need no record.
    assert!(!reads(&policy("resource", "context.effects > 20")));
    assert!(!reads(&policy("resource", "principal.role == \"member\" && context.now.hour > 20")));
    // Every way of naming the record reads it: in the scope, in a condition, nested, negated,
    // in an `if`, as `is`, and the technician beside it.
    for (scope, when) in [
        ("resource is Booking", "true"),
        ("resource == Booking::\"bkg_x\"", "true"),
        ("resource", "resource is Booking"),
        ("resource", "resource has hours_until_start"),
        ("resource", "!(resource has status) || context.effects > 1"),
        ("resource", "if context.effects > 1 then resource == Booking::\"bkg_x\" else false"),
        ("resource is Booking", "[resource].contains(Booking::\"bkg_x\")"),
        ("resource", "context.effects > 1 && (resource is Customer || false)"),
        ("resource", "context has technician"),
    ] {
        assert!(reads(&policy(scope, when)), "{scope} when {when}");
    }
    // A policy for another tool reads nothing for this one.
    let other = "@id(\"p\")\n@reason(\"r\")\nforbid (principal, action == Action::\"send_customer_message\", resource) when { resource is Customer };";
    assert!(!reads(other));
    // And a policy naming no action judges every tool, records included when it names them.
    assert!(reads(
        "@id(\"p\")\n@reason(\"r\")\nforbid (principal, action, resource) when { resource is Booking };"
    ));
}

#[test]
fn a_call_builds_only_the_context_its_policies_read_and_each_read_part_still_decides() {
    let parse = |text: &str| cedar_policy::Policy::parse(None, text).expect("a policy");
    let reads = |text: &str| facts::context_reads(&parse(text));
    let keys = |names: &[&str]| Some(names.iter().map(|n| (*n).to_owned()).collect());
    assert_eq!(
        reads(
            "forbid (principal, action, resource) when { context.now.hour == 3 && context has args && context.args.x == \"y\" };"
        ),
        keys(&["args", "now"])
    );
    assert_eq!(
        reads("forbid (principal, action, resource) when { principal.client == \"c\" };"),
        keys(&[])
    );
    // `context` as a whole value: nothing can be left out.
    assert_eq!(reads("forbid (principal, action, resource) when { context == {} };"), None);
    // Each part of the context, read by a policy alone, still reaches it: the call it matches
    // is refused by name, never by an evaluation error (a part left out would be one).
    let who = principal();
    let parts = [
        (
            "args",
            "context has args && context.args has customer && context.args.customer == \"cus_x\"",
        ),
        ("class", "context.class == \"notify\""),
        ("phase", "context.phase == \"prepare\""),
        ("effects", "context.effects == 1"),
        ("now", "context.now.hour == 10"),
        ("technician", "context has technician && context.technician.handle == \"tec_x\""),
        (
            "budgets",
            "context has budgets && context.budgets has customers_messaged && context.budgets.customers_messaged.used == 4",
        ),
    ];
    for (part, condition) in parts {
        let source = format!(
            "@id(\"reads-{part}\")\n@reason(\"reads {part}\")\nforbid (principal, action == Action::\"send_customer_message\", resource) when {{ {condition} }};"
        );
        let compiled = Compiled::compile(&source, schema()).expect("compiles");
        let mut c = call(&who, "send_customer_message", 10, None);
        c.technician =
            Some(TechnicianFacts { handle: "tec_x".into(), region: None, active: Some(true) });
        c.budgets = vec![BudgetFact { kind: "customers_messaged", used: 4, limit: 10, amount: 1 }];
        match compiled.evaluate(&c) {
            Verdict::Forbid(p) => assert_eq!(p.id, format!("reads-{part}")),
            other => panic!("{part}: {other:?}"),
        }
    }
}

#[test]
fn the_screen_allows_only_what_the_set_allows_and_leaves_every_other_verdict_to_it() {
    // Every kind of scope, `when` and `unless` clauses, a policy on no action, one on two,
    // and conditions that fail at evaluation (an overflow), one policy per line.
    let policies = [
        r#"forbid (principal == Connection::"con_a", action == Action::"cancel_booking", resource) when { context.effects > 3 };"#,
        r#"forbid (principal in Connection::"con_b", action, resource) when { context.now.hour == 4 };"#,
        r#"forbid (principal is Connection, action in [Action::"cancel_booking", Action::"send_customer_message"], resource is Booking) when { resource has status && resource.status == "draft" } unless { context.effects == 2 };"#,
        r#"forbid (principal is Connection in Connection::"con_a", action == Action::"send_customer_message", resource) unless { context.now.hour < 20 && context.now.hour >= 8 };"#,
        r#"forbid (principal, action, resource == Tenant::"ten_x") when { principal.client == "Blocked" };"#,
        r#"forbid (principal, action == Action::"cancel_booking", resource in Tenant::"ten_x") when { context.effects * 4611686018427387904 > 0 && context.now.hour == 10 };"#,
        r#"forbid (principal, action == Action::"send_customer_message", resource) when { context.effects > 100 } when { principal.role == "member" };"#,
        r#"forbid (principal, action, resource) when { action == Action::"cancel_booking" && resource is Booking && resource has hours_until_start && resource.hours_until_start < 48 };"#,
        r#"forbid (principal, action in Action::"cancel_booking", resource is Booking in Tenant::"ten_x") unless { context.effects > 1 } unless { context.now.hour == 4 };"#,
        r#"forbid (principal, action == Action::"send_customer_message", resource) unless { principal.client like "Bl*" } when { context.now.hour == 21 };"#,
        r#"forbid (principal, action == Action::"cancel_booking", resource is Booking);"#,
        r#"forbid (principal, action, resource) when { if context.effects > 3 then [4, 21].contains(context.now.hour) else false };"#,
        r#"forbid (principal == Connection::"con_\"q\\", action, resource) when { true };"#,
    ];
    let who = principal();
    let mut other = principal();
    other.handle = "con_b".into();
    other.client = "Blocked".into();
    let mut compared = 0;
    let mut not_allowed = 0;
    let mut verdicts = std::collections::BTreeSet::new();
    // Each policy alone, every pair in order, and the whole list.
    let mut sets: Vec<Vec<usize>> = (0..policies.len()).map(|i| vec![i]).collect();
    for i in 0..policies.len() {
        for j in i + 1..policies.len() {
            sets.push(vec![i, j]);
        }
    }
    sets.push((0..policies.len()).collect());
    for chosen in &sets {
        let source: String = chosen
            .iter()
            // Every third one sends to a person instead of refusing.
            .map(|&i| {
                let approval = if i % 3 == 0 { "@approval " } else { "" };
                format!("@id(\"p{i}\") {approval}@reason(\"r\") {}\n", policies[i])
            })
            .collect();
        let screened = Compiled::compile(&source, schema()).expect("compiles");
        let (exact, with_screen) =
            Compiled::compile(&source, schema()).expect("compiles").without_screens();
        // Every form above translates: each tool a policy judges has its screen.
        assert!(with_screen > 0, "{source}");
        for tool in ["cancel_booking", "send_customer_message"] {
            for who in [&who, &other] {
                for hour in [4, 10, 21] {
                    for effects in [0, 2, 5, 200] {
                        for status in ["draft", "confirmed"] {
                            for start in [None, Some(12), Some(100)] {
                                let mut c = call(who, tool, hour, start);
                                c.effects = effects;
                                if let Resource::Booking { status: s, .. } = &mut c.resource {
                                    *s = Some(status.into());
                                }
                                let expected = exact.evaluate(&c);
                                // The screen alone: it allows exactly the calls the set allows
                                // (every policy false, none failing), and no other.
                                let Some(share) = screened.by_action[tool].as_ref() else {
                                    // No policy judges the tool: allowed without a request.
                                    assert_eq!(expected, Verdict::Allow);
                                    compared += 1;
                                    continue;
                                };
                                let facts = &screened.schema.actions[tool];
                                let (request, store) =
                                    screened.request(&c, facts).expect("request");
                                let screen = share.screen.as_ref().expect("a screen");
                                assert_eq!(
                                    screen_allows(screen, &request, &store),
                                    expected == Verdict::Allow,
                                    "{source}\n{tool} {hour} {effects}"
                                );
                                assert_eq!(
                                    screened.evaluate(&c),
                                    expected,
                                    "{source}\n{tool} {} {hour} {effects} {status} {start:?}",
                                    who.handle
                                );
                                not_allowed += usize::from(expected != Verdict::Allow);
                                verdicts.insert(match &expected {
                                    Verdict::Allow => "allow",
                                    Verdict::Forbid(_) => "forbid",
                                    Verdict::Approval(_) => "approval",
                                    Verdict::Error(_) => "error",
                                });
                                compared += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(compared, sets.len() * 2 * 2 * 3 * 4 * 2 * 3);
    // Both paths were exercised: refusals, approvals and errors as well as allowed calls.
    assert!(not_allowed > compared / 10 && not_allowed < compared, "{not_allowed} of {compared}");
    assert!(
        verdicts.contains("forbid") && verdicts.contains("approval") && verdicts.contains("error")
    );
}

#[test]
fn a_tool_judged_by_the_most_policies_a_set_holds_keeps_a_shallow_screen_that_agrees() {
    // Every policy names no action, so each tool's screen joins all of them.
    let source: String = (0..MAX_POLICIES)
        .map(|i| {
            format!(
                "@id(\"p{i}\") @reason(\"r\") forbid (principal, action, resource) when {{ context.effects == {} }};\n",
                1000 + i
            )
        })
        .collect();
    let screened = Compiled::compile(&source, schema()).expect("compiles");
    let (exact, with_screen) =
        Compiled::compile(&source, schema()).expect("compiles").without_screens();
    assert_eq!(with_screen, 2, "both tools have their screen");
    let who = principal();
    for effects in [0, 1000, 1250, 1499, 1500] {
        let mut c = call(&who, "cancel_booking", 10, Some(100));
        c.effects = effects;
        let verdict = screened.evaluate(&c);
        assert_eq!(verdict, exact.evaluate(&c));
        assert_eq!(verdict == Verdict::Allow, !(1000..1500).contains(&effects), "{effects}");
    }
}

#[test]
fn a_policy_with_more_operators_than_a_thread_can_take_is_refused_at_its_line() {
    let chain = |terms: usize| vec!["1"; terms].join(" + ");
    // The limit counts every operator character: `> 0` and `context.` add three.
    let within = format!(
        "@id(\"ok\") @reason(\"r\") forbid (principal, action, resource) when {{ context.effects + {} < 0 }};",
        chain(MAX_OPERATORS - 4)
    );
    let beyond = format!(
        "@id(\"short\") @reason(\"r\") forbid (principal, action, resource) when {{ context.effects > 5 }};\n\n@id(\"long\") @reason(\"r\")\nforbid (principal, action, resource) when {{ context.effects + {} > 0 }};",
        chain(MAX_OPERATORS)
    );
    // Refused before Cedar parses it (which would recurse once per operator), at its line.
    let problems = Compiled::compile(&beyond, schema()).expect_err("refused");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].line, 4, "{problems:?}");
    assert!(problems[0].message.contains("operators"), "{problems:?}");
    // Operators in strings and comments are not counted; each policy counts its own.
    let quoted = format!(
        "// {}\n@id(\"q\") @reason(\"{}\") forbid (principal, action, resource) when {{ principal.client == \"{}\" }};\n{within}",
        "+".repeat(4 * MAX_OPERATORS),
        "&|".repeat(70),
        "||".repeat(MAX_OPERATORS),
    );
    // What the count cannot be fooled by: a carriage return ends a comment for Cedar, `if`
    // nests with any space after it, an index chain nests with brackets that close.
    for hidden in [
        format!("//\r context.effects{} > 0", "+1".repeat(MAX_OPERATORS)),
        format!("{}true", "if\ttrue then true else\t".repeat(MAX_OPERATORS + 1)),
        format!("context.args{} == 1", "[\"a\"]".repeat(MAX_OPERATORS + 1)),
        format!("context.effects{} > 0", " 1in".repeat(MAX_OPERATORS + 1)),
    ] {
        let source = format!(
            "@id(\"h\") @reason(\"r\") forbid (principal, action, resource) when {{ {hidden} }};"
        );
        let problems = Compiled::compile(&source, schema()).expect_err("refused");
        assert!(
            problems.iter().any(|p| p.message.contains("operators")),
            "{hidden:.60}: {problems:?}"
        );
    }
    // Counted per policy: a set of many policies with an `if` each is not refused for them
    // together, and one policy of too many `if`s is refused at its line.
    let many: String = (0..200)
        .map(|i| format!("@id(\"i{i}\") @reason(\"r\") forbid (principal, action, resource) when {{ if context.effects > {i} then true else false }};\n"))
        .collect();
    assert!(Compiled::compile(&many, schema()).is_ok());
    let nested = format!(
        "{many}@id(\"deep\") @reason(\"r\")\nforbid (principal, action, resource) when {{ {}true }};",
        "if true then true else ".repeat(MAX_OPERATORS + 1)
    );
    let problems = Compiled::compile(&nested, schema()).expect_err("refused");
    assert_eq!(problems[0].line, 202, "{problems:?}");
    // Behind the counts, the parsed policy's depth: a set within them is checked again.
    let deep = json!({"a": [[[[1]]]]});
    assert_eq!(depth_of(&deep), 6);
    // One at the limit compiles on a compiling thread's stack (as the services compile) and is
    // judged and dropped on an ordinary test thread's.
    let compiled = std::thread::Builder::new()
        .stack_size(256 * 1024 * 1024)
        .spawn(move || Compiled::compile(&quoted, schema()))
        .expect("thread")
        .join()
        .expect("joined")
        .expect("compiles");
    let compiled = Arc::new(compiled);
    let judge = |stack: usize| {
        let compiled = compiled.clone();
        std::thread::Builder::new()
            .stack_size(stack)
            .spawn(move || compiled.evaluate(&call(&principal(), "cancel_booking", 10, None)))
            .expect("thread")
            .join()
            .expect("no overflow")
    };
    assert_eq!(judge(8 * 1024 * 1024), Verdict::Allow);
    // On a small stack Cedar's own check stops the walk: the call is refused, never allowed
    // unjudged, and the thread lives.
    assert!(matches!(judge(256 * 1024), Verdict::Error(e) if e.contains("recursion limit")));
    assert!(!widens(&within, &within));
    drop(compiled);
}

/// A value of `ty`, as a call's argument.
fn argument_of(ty: &ArgType) -> Value {
    match ty {
        ArgType::String => json!(" x "),
        ArgType::Long => json!(3),
        ArgType::Boolean => json!(true),
        ArgType::Set(element) => json!([argument_of(element)]),
    }
}

/// The committed schema, and a set whose one policy reads the context as a whole, the record
/// and the connection: every call it judges builds every part of its request.
fn reading_everything() -> (Arc<PolicySchema>, Compiled) {
    let schema = crate::services::policies::schema();
    let whole = r#"@id("whole") @reason("r") forbid (principal, action, resource) when { {"c": context}.c.effects > 1000000 && resource has region && principal.role == "x" };"#;
    let compiled = Compiled::compile(whole, schema.clone()).expect("compiles");
    (schema, compiled)
}

/// A call's argument of `ty` as a client may send it (strings padded, a number in a string,
/// a list with a repeat), and what a policy should read of it, in Cedar's JSON form.
fn sent_and_read(ty: &ArgType) -> (Value, Value) {
    match ty {
        ArgType::String => (json!("  north "), json!("north")),
        ArgType::Long => (json!(" 50"), json!(50)),
        ArgType::Boolean => (json!(false), json!(false)),
        ArgType::Set(element) => {
            let (sent, read) = sent_and_read(element);
            (json!([sent, sent]), json!([read]))
        }
    }
}

#[test]
fn a_calls_request_holds_exactly_the_facts_cedar_reads_from_their_json_form() {
    // What the request is built from, against what Cedar's own JSON parsers make of the same
    // facts written out by hand: every attribute present when its fact is, none when it is not,
    // and each argument as the tools read it. A set that reads everything builds everything.
    let (schema, compiled) = reading_everything();
    let who = principal();
    let berlin = jiff::tz::TimeZone::get("Europe/Berlin").expect("zone");
    let local =
        jiff::civil::date(2027, 3, 28).at(1, 59, 0, 0).to_zoned_datetime(berlin).expect("zoned");
    let connection = json!({"uid": {"type": "Connection", "id": "con_a"}, "parents": [], "attrs": {
        "role": "member", "client": "Claude", "grant": "static", "name": "n", "creator": "per_a"}});
    let clock = |hour: i64, minute: i64, weekday: &str, date: &str| json!({"hour": hour, "minute": minute, "weekday": weekday, "date": date});
    let cases = [
        (Resource::Tenant("ten_x".into()), json!({"type": "Tenant", "id": "ten_x"}), json!({})),
        (
            Resource::Booking {
                handle: "bkg_x".into(),
                status: Some("confirmed".into()),
                hours_until_start: Some(-5),
                region: Some("north".into()),
            },
            json!({"type": "Booking", "id": "bkg_x"}),
            json!({"status": "confirmed", "hours_until_start": -5, "region": "north"}),
        ),
        (
            Resource::Booking {
                handle: "bkg_y".into(),
                status: None,
                hours_until_start: None,
                region: None,
            },
            json!({"type": "Booking", "id": "bkg_y"}),
            json!({}),
        ),
        (
            Resource::Customer {
                handle: "cus_x".into(),
                region: Some("east".into()),
                local: Some(local),
            },
            json!({"type": "Customer", "id": "cus_x"}),
            json!({"region": "east", "zone": "Europe/Berlin",
                "local_time": clock(1, 59, "Sunday", "2027-03-28")}),
        ),
        (
            Resource::Customer { handle: "cus_y".into(), region: None, local: None },
            json!({"type": "Customer", "id": "cus_y"}),
            json!({}),
        ),
        (
            Resource::Technician(TechnicianFacts {
                handle: "tec_x".into(),
                region: Some("south".into()),
                active: Some(false),
            }),
            json!({"type": "Technician", "id": "tec_x"}),
            json!({"region": "south", "active": false}),
        ),
        (
            Resource::Technician(TechnicianFacts {
                handle: "tec_y".into(),
                region: None,
                active: None,
            }),
            json!({"type": "Technician", "id": "tec_y"}),
            json!({}),
        ),
    ];
    let technicians = [
        None,
        Some(TechnicianFacts { handle: "tec_b".into(), region: None, active: None }),
        Some(TechnicianFacts {
            handle: "tec_c".into(),
            region: Some("west".into()),
            active: Some(true),
        }),
    ];
    let mut compared = 0;
    for (tool, facts) in &schema.actions {
        let (mut sent, mut read) = (serde_json::Map::new(), serde_json::Map::new());
        for (name, ty) in &facts.args {
            let (s, r) = sent_and_read(ty);
            sent.insert(name.to_string(), s);
            read.insert(name.to_string(), r);
        }
        // An argument the schema does not type is no fact at all.
        sent.insert("untyped_extra".into(), json!({"nested": 1}));
        for (resource, uid, attrs) in &cases {
            for technician in &technicians {
                for budgets in [0, 2] {
                    let mut c = call(&who, tool, 21, None);
                    c.args = Value::Object(sent.clone());
                    c.resource = resource.clone();
                    c.technician = technician.clone();
                    c.budgets = BUDGET_KINDS[..budgets]
                        .iter()
                        .map(|kind| BudgetFact { kind, used: 1, limit: 2, amount: 3 })
                        .collect();
                    let (request, store) = compiled.request(&c, facts).expect("request");
                    let mut context = json!({
                        "args": read, "class": "notify", "phase": "prepare", "effects": 1,
                        "now": clock(21, 30, "Monday", "2026-12-07"),
                    });
                    if let Some(t) = technician {
                        let mut fields = json!({"handle": t.handle});
                        if let Some(region) = &t.region {
                            fields["region"] = json!(region);
                        }
                        if let Some(active) = t.active {
                            fields["active"] = json!(active);
                        }
                        context["technician"] = fields;
                    }
                    if budgets > 0 {
                        context["budgets"] = BUDGET_KINDS[..budgets]
                            .iter()
                            .map(|k| ((*k).to_owned(), json!({"used": 1, "limit": 2, "amount": 3})))
                            .collect::<serde_json::Map<_, _>>()
                            .into();
                    }
                    let expected = cedar_policy::Context::from_json_value(
                        context,
                        Some((&schema.schema, &facts.uid)),
                    )
                    .unwrap_or_else(|e| panic!("{tool}: {e}"));
                    let request = Request::from(request);
                    assert_eq!(request.context(), Some(&expected), "{tool} on {resource:?}");
                    let entities = Entities::from_json_value(
                        json!([connection, {"uid": uid, "attrs": attrs, "parents": []}]),
                        None,
                    )
                    .expect("entities");
                    assert!(
                        Entities::from(Arc::unwrap_or_clone(store)).deep_eq(&entities),
                        "{tool} on {resource:?}"
                    );
                    compared += 1;
                }
            }
        }
    }
    assert_eq!(compared, schema.actions.len() * cases.len() * technicians.len() * 2);
}

#[test]
fn every_fact_a_call_brings_has_the_type_the_schema_gives_it() {
    // The request is built from Cedar's values without Cedar's checks: here Cedar checks it,
    // with the committed schema, for every tool, every kind of record, and every part of the
    // context (a policy reading the context as a whole and the record makes every part built).
    let (schema, compiled) = reading_everything();
    let who = principal();
    let local = jiff::Timestamp::UNIX_EPOCH
        .to_zoned_datetime(jiff::tz::TimeZone::get("Europe/Berlin").expect("zone"));
    let resources = [
        Resource::Tenant("ten_x".into()),
        Resource::Booking {
            handle: "bkg_x".into(),
            status: Some("confirmed".into()),
            hours_until_start: Some(-5),
            region: Some("north".into()),
        },
        Resource::Booking {
            handle: "bkg_y".into(),
            status: None,
            hours_until_start: None,
            region: None,
        },
        Resource::Customer {
            handle: "cus_x".into(),
            region: Some("north".into()),
            local: Some(local),
        },
        Resource::Technician(TechnicianFacts {
            handle: "tec_x".into(),
            region: Some("south".into()),
            active: Some(false),
        }),
    ];
    let mut checked = 0;
    let mut typed_args = 0;
    for (tool, facts) in &schema.actions {
        for resource in &resources {
            let mut c = call(&who, tool, 21, None);
            c.args = facts.args.iter().map(|(n, ty)| (n.to_string(), argument_of(ty))).collect();
            c.resource = resource.clone();
            c.technician =
                Some(TechnicianFacts { handle: "tec_x".into(), region: None, active: Some(true) });
            c.budgets = BUDGET_KINDS
                .iter()
                .map(|kind| BudgetFact { kind, used: 1, limit: 2, amount: 3 })
                .collect();
            let (request, store) = compiled.request(&c, facts).expect("request");
            let request = Request::from(request);
            let context = request.context().expect("a context");
            for part in ["args", "class", "phase", "effects", "now", "technician", "budgets"] {
                assert!(context.get(part).is_some(), "{tool}: context.{part} was not built");
            }
            typed_args += facts.args.len();
            cedar_policy::Request::new(
                request.principal().expect("principal").clone(),
                request.action().expect("action").clone(),
                request.resource().expect("resource").clone(),
                context.clone(),
                Some(&schema.schema),
            )
            .unwrap_or_else(|e| panic!("{tool} on {resource:?}: {e}"));
            Entities::from_entities(
                Entities::from(Arc::unwrap_or_clone(store)),
                Some(&schema.schema),
            )
            .unwrap_or_else(|e| panic!("{tool} on {resource:?}: {e}"));
            checked += 1;
        }
    }
    assert_eq!(checked, schema.actions.len() * resources.len());
    // The registry's tools type arguments of every kind the schema has words for.
    assert!(typed_args > 20, "{typed_args}");
    // A budget kind given twice is refused, never one of them silently kept.
    let mut c = call(&who, "cancel_bookings", 10, None);
    c.budgets = vec![
        BudgetFact { kind: "bookings_changed", used: 1, limit: 5, amount: 2 },
        BudgetFact { kind: "bookings_changed", used: 1, limit: 5, amount: 9 },
    ];
    assert!(compiled.request(&c, &schema.actions["cancel_bookings"]).is_err());
}

#[test]
fn the_clock_a_call_sees_is_its_own_minute_in_its_own_zone_when_kept() {
    // Two zones and two minutes, asked in turn and again: each answer is built afresh or
    // kept, and always the fields of the time asked.
    let at = |zone: &str, minute: i8| {
        jiff::civil::date(2026, 12, 31)
            .at(23, minute, 59, 0)
            .to_zoned_datetime(jiff::tz::TimeZone::get(zone).expect("zone"))
            .expect("zoned")
    };
    let times = [
        at("UTC", 58),
        at("Asia/Kolkata", 58),
        at("UTC", 58),
        at("UTC", 59),
        at("Asia/Kolkata", 58),
        at("UTC", 59),
        at("UTC", 58),
        // The same instant in another zone: another local minute, another day.
        at("UTC", 59)
            .timestamp()
            .to_zoned_datetime(jiff::tz::TimeZone::get("Asia/Kolkata").expect("zone")),
        // The same minute of another hour, and of another day; then each again after both
        // slots were taken by others.
        at("UTC", 58).checked_sub(jiff::Span::new().hours(1)).expect("an hour before"),
        at("UTC", 58).checked_sub(jiff::Span::new().days(1)).expect("a day before"),
        at("UTC", 58).checked_sub(jiff::Span::new().days(8)).expect("a week and a day before"),
        at("UTC", 58).checked_sub(jiff::Span::new().hours(1)).expect("an hour before"),
        at("UTC", 58),
    ];
    for time in times {
        let fields: std::collections::BTreeMap<String, String> =
            match facts::clock(&time).value_kind() {
                ast::ValueKind::Record(fields) => {
                    fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
                }
                other => panic!("{other:?}"),
            };
        let expected: std::collections::BTreeMap<String, String> = [
            ("date", format!("\"{}\"", time.date())),
            ("hour", time.hour().to_string()),
            ("minute", time.minute().to_string()),
            ("weekday", format!("\"{}\"", facts::weekday(time.weekday()))),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(fields, expected, "{time}");
    }
}

#[test]
fn like_patterns_and_written_strings_are_bounded_so_matching_stays_cheap_whatever_the_set() {
    // Cedar matches a pattern in time up to the product of the pattern's and the text's
    // lengths: a set put in force holds at most MAX_LIKE_CHARS characters of patterns in all,
    // wildcards aside, counted in every form a pattern takes, and no string longer than an
    // argument a policy reads.
    let policy = |i: usize, chars: usize| {
        // `chars` characters of patterns: one long, one of a single escaped star.
        format!(
            "@id(\"p{i}\") @reason(\"r\") forbid (principal, action == Action::\"send_customer_message\", resource) when {{ context.args has subject && (context.args.subject like \"*{}b*\" || context.args.subject like \"*\\**\") }};\n",
            "a".repeat(chars - 2)
        )
    };
    let quarter = MAX_LIKE_CHARS / 4;
    let fits: String = (0..4).map(|i| policy(i, quarter)).collect();
    let compiled = Compiled::compile_draft(&fits, schema()).expect("exactly the bound fits");
    // The worst text for them: a long run of the pattern's prefix, never its end.
    let who = principal();
    let mut c = call(&who, "send_customer_message", 10, None);
    c.args = json!({"customer": "cus_x", "subject": "a".repeat(MAX_ARG_CHARS)});
    assert_eq!(compiled.evaluate(&c), Verdict::Allow);
    c.args = json!({"customer": "cus_x", "subject": format!("{}b", "a".repeat(quarter))});
    assert!(matches!(compiled.evaluate(&c), Verdict::Forbid(p) if p.id == "p0"));
    c.args = json!({"customer": "cus_x", "subject": "a*"});
    assert!(matches!(compiled.evaluate(&c), Verdict::Forbid(_)));
    // One character more, in a pattern inside `unless` and `if`: refused at its line.
    let over = format!(
        "{fits}@id(\"q\") @reason(\"r\") forbid (principal, action, resource) unless {{ if context.effects > 1 then principal.client like \"x*\" else true }};\n"
    );
    let problems = Compiled::compile_draft(&over, schema()).expect_err("one character over");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].line, 5, "{problems:?}");
    assert!(problems[0].message.contains(&MAX_LIKE_CHARS.to_string()), "{problems:?}");
    // A string written in a policy is a text a pattern may be matched against: bounded too.
    let literal = format!(
        "@id(\"w\") @reason(\"r\") forbid (principal, action, resource) when {{ {{\"t\": \"{}\"}}.t like \"*a*\" }};",
        "a".repeat(MAX_ARG_CHARS + 1)
    );
    let problems = Compiled::compile_draft(&literal, schema()).expect_err("a long string");
    assert!(problems.iter().any(|p| p.message.contains("writes a string")), "{problems:?}");
    // Wildcards, annotations and strings of an argument's length do not count.
    let outside = format!(
        "@id(\"q\") @reason(\"{}\") forbid (principal, action, resource) when {{ context.effects > 1 && principal.client == \"{}\" && principal.client like \"*{}*\" }};",
        "r".repeat(200),
        "c".repeat(MAX_ARG_CHARS),
        "*".repeat(2 * MAX_LIKE_CHARS)
    );
    Compiled::compile_draft(&outside, schema()).expect("no pattern characters");
    // A draft reaches Cedar's parser only past the checks on size and nesting, as a stored set
    // does: a long operator chain is refused by its count, on a small thread.
    let chain = format!(
        "@id(\"c\") @reason(\"r\") forbid (principal, action, resource) when {{ {} }};",
        vec!["context.effects > 1"; 2_000].join(" || ")
    );
    let problems = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || Compiled::compile_draft(&chain, schema()).expect_err("a long chain"))
        .expect("thread")
        .join()
        .expect("no overflow");
    assert!(problems[0].message.contains("operators"), "{problems:?}");
    // A set kept in force before the bounds still compiles: replacing it must meet them.
    Compiled::compile(&over, schema()).expect("a stored set compiles as before");
}
