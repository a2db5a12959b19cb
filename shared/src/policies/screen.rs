//! A tool's screen: its policies as one, so an allowed call is judged in one pass.
//!
//! Cedar judges a set policy by policy: each builds its condition (the scope and the `when`
//! and `unless` clauses joined), is interpreted, and is recorded in the answer whatever it
//! decided. With ten policies on a tool, that bookkeeping costs more than the conditions
//! themselves. The screen is one `forbid` whose condition is the disjunction of every policy's
//! own condition, built from their JSON form: `(scope₁ && when₁ && !unless₁) || (scope₂ && …)`.
//!
//! **Why the screen may only ever allow sooner.** Cedar's `||` evaluates left to right and
//! stops at the first `true`; an error in any disjunct it reaches is the error of the whole. So
//! a screen that evaluates to `false` without an error evaluated every disjunct to `false`
//! without an error: no policy of the tool applies and none fails, which is exactly when the
//! full set allows. Any other answer (a disjunct true, an error, a screen that could not be
//! built) sends the call to the full set, which names the deciding policies as before.
//! [`super::Compiled::evaluate`] holds to this, and a test compares both paths over every kind
//! of scope, `unless`, errors and matches.

use cedar_policy::{ActionConstraint, EntityUid, Policy, PolicyId};
use serde_json::{Value, json};

/// The screen for the policies that judge the tool `action`, or `None` when one of them has a
/// form the screen does not translate (the full set then judges every call).
pub(super) fn screen(policies: &[&Policy], action: &EntityUid) -> Option<Policy> {
    let disjuncts: Vec<Value> =
        policies.iter().map(|p| condition(p, action)).collect::<Option<_>>()?;
    let body = disjuncts
        .into_iter()
        .reduce(|left, right| json!({"||": {"left": left, "right": right}}))?;
    let screen = json!({
        "effect": "forbid",
        "principal": {"op": "All"},
        "action": {"op": "All"},
        "resource": {"op": "All"},
        "conditions": [{"kind": "when", "body": body}],
        "annotations": {},
    });
    Policy::from_json(Some(PolicyId::new("gatehouse-screen")), screen).ok()
}

/// One policy's condition as Cedar builds it (principal scope, action scope, resource scope,
/// then each clause in order), with the action scope left out when it is true of `action`
/// (every policy of the tool's share names it or no action).
fn condition(policy: &Policy, action: &EntityUid) -> Option<Value> {
    let json = policy.to_json().ok()?;
    let mut parts = Vec::new();
    parts.extend(scope("principal", &json["principal"])?);
    let holds = match policy.action_constraint() {
        ActionConstraint::Any => true,
        ActionConstraint::Eq(uid) => &uid == action,
        ActionConstraint::In(uids) => uids.contains(action),
    };
    if !holds {
        parts.extend(scope("action", &json["action"])?);
    }
    parts.extend(scope("resource", &json["resource"])?);
    for clause in json["conditions"].as_array()? {
        let body = clause.get("body")?.clone();
        parts.push(match clause.get("kind")?.as_str()? {
            "when" => body,
            "unless" => json!({"!": {"arg": body}}),
            _ => return None,
        });
    }
    Some(
        parts
            .into_iter()
            .reduce(|left, right| json!({"&&": {"left": left, "right": right}}))
            .unwrap_or_else(|| json!({"Value": true})),
    )
}

/// A scope constraint as an expression on its variable: nothing for `All`, `None` for a form
/// not translated (a template's slot).
fn scope(var: &str, constraint: &Value) -> Option<Option<Value>> {
    let left = json!({"Var": var});
    let entity = |e: &Value| json!({"Value": {"__entity": e}});
    Some(Some(match constraint.get("op")?.as_str()? {
        "All" => return Some(None),
        "==" => json!({"==": {"left": left, "right": entity(constraint.get("entity")?)}}),
        "in" => match (constraint.get("entity"), constraint.get("entities")) {
            (Some(e), None) => json!({"in": {"left": left, "right": entity(e)}}),
            (None, Some(Value::Array(es))) => {
                let set: Vec<Value> = es.iter().map(entity).collect();
                json!({"in": {"left": left, "right": {"Set": set}}})
            }
            _ => return None,
        },
        "is" => {
            let entity_type = constraint.get("entity_type")?.clone();
            match constraint.get("in") {
                None => json!({"is": {"left": left, "entity_type": entity_type}}),
                Some(within) => json!({"is": {"left": left, "entity_type": entity_type,
                    "in": entity(within.get("entity")?)}}),
            }
        }
        _ => return None,
    }))
}
