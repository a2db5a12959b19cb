//! The Cedar schema of a tenant's policies, generated from the tool registry: one action per
//! tool, its context typed from the tool's arguments.

use serde_json::{Value, json};

use super::*;

/// One tool as the schema sees it: its name, class and input schema (JSON Schema).
pub struct ToolFacts<'a> {
    pub name: &'a str,
    pub class: EffectClass,
    pub input_schema: &'a serde_json::Map<String, Value>,
}

/// The resource types a call may name.
pub(super) const RESOURCE_TYPES: [&str; 4] = ["Tenant", "Booking", "Customer", "Technician"];

/// The Cedar schema (JSON form) of these tools: one action per tool, its context typed from
/// the tool's arguments. Arguments of a type Cedar has no word for (objects, fractions) are
/// left out, so a policy cannot name them.
pub fn schema_json(tools: &[ToolFacts<'_>]) -> Value {
    let string = || json!({"type": "String"});
    let long = || json!({"type": "Long"});
    let boolean = || json!({"type": "Boolean"});
    // A wall clock: the tenant's (`context.now`) or a customer's (`resource.local_time`).
    let clock = || {
        json!({"type": "Record", "attributes": {
            "hour": long(), "minute": long(), "weekday": string(), "date": string(),
        }})
    };
    fn optional(mut t: Value) -> Value {
        t["required"] = json!(false);
        t
    }
    let mut actions = serde_json::Map::new();
    for tool in tools {
        // Every argument is optional to a policy (test it with `has`): a call that left one out
        // is refused by the tool's own parsing, and the replay of audited calls, which keeps no
        // arguments (R19), must still evaluate.
        let mut args = serde_json::Map::new();
        if let Some(props) = tool.input_schema.get("properties").and_then(Value::as_object) {
            for (name, prop) in props {
                let Some(ty) = cedar_type(prop) else { continue };
                args.insert(name.clone(), optional(ty));
            }
        }
        let context = json!({"type": "Record", "attributes": {
            "args": {"type": "Record", "attributes": args},
            "class": string(),
            "phase": string(),
            "effects": long(),
            "now": clock(),
            // A two-step action's effects against the connection's budgets, by kind: what
            // the window has used, the limit, and what this action adds.
            "budgets": optional(json!({"type": "Record", "attributes": BUDGET_KINDS
                .iter()
                .map(|k| ((*k).to_owned(), optional(json!({"type": "Record", "attributes": {
                    "used": long(), "limit": long(), "amount": long(),
                }}))))
                .collect::<serde_json::Map<_, _>>()})),
            // The technician a call names beside its record (`update_booking`'s new one).
            "technician": optional(json!({"type": "Record", "attributes": {
                "handle": string(), "region": optional(string()), "active": optional(boolean()),
            }})),
        }});
        let _ = tool.class;
        actions.insert(
            tool.name.to_owned(),
            json!({"appliesTo": {
                "principalTypes": ["Connection"],
                "resourceTypes": RESOURCE_TYPES,
                "context": context,
            }}),
        );
    }
    json!({"": {
        "entityTypes": {
            "Connection": {"shape": {"type": "Record", "attributes": {
                "role": string(), "client": string(), "grant": string(), "name": string(),
                "creator": string(),
            }}},
            "Tenant": {},
            "Booking": {"shape": {"type": "Record", "attributes": {
                "status": optional(string()),
                "hours_until_start": optional(long()),
                // Its customer's region: where the work is.
                "region": optional(string()),
            }}},
            "Customer": {"shape": {"type": "Record", "attributes": {
                "region": optional(string()),
                // The customer's zone (the tenant's when none is kept) and the time there.
                "zone": optional(string()),
                "local_time": optional(clock()),
            }}},
            "Technician": {"shape": {"type": "Record", "attributes": {
                "region": optional(string()),
                "active": optional(boolean()),
            }}},
        },
        "actions": actions,
    }})
}

/// The Cedar type of one argument's JSON Schema, when Cedar has one.
pub(super) fn cedar_type(prop: &Value) -> Option<Value> {
    // `anyOf: [{type: T}, {type: null}]`: an optional argument, as strict clients are given it
    // (see the worker's `portable`); its one typed branch is its type.
    if let Some(Value::Array(branches)) = prop.get("anyOf") {
        let mut typed = branches.iter().filter(|b| b.get("type") != Some(&json!("null")));
        return match (typed.next(), typed.next()) {
            (Some(one), None) => cedar_type(one),
            _ => None,
        };
    }
    let ty = match prop.get("type") {
        Some(Value::String(t)) => t.as_str(),
        // `["string", "null"]`: an optional argument.
        Some(Value::Array(types)) => {
            let mut named = types.iter().filter_map(Value::as_str).filter(|t| *t != "null");
            match (named.next(), named.next()) {
                (Some(one), None) => one,
                _ => return None,
            }
        }
        _ => return None,
    };
    match ty {
        "string" => Some(json!({"type": "String"})),
        "integer" => Some(json!({"type": "Long"})),
        "boolean" => Some(json!({"type": "Boolean"})),
        "array" => {
            let items = prop.get("items")?;
            let inner = cedar_type(items)?;
            Some(json!({"type": "Set", "element": inner}))
        }
        _ => None,
    }
}
