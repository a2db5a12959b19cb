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

/// One policy's condition in parts, read from its JSON form once when the set is compiled
/// (a policy on no action joins every tool's screen).
pub(super) struct Condition {
    action: ActionConstraint,
    principal: Option<Value>,
    action_scope: Option<Value>,
    resource: Option<Value>,
    /// The `when` clauses, and each `unless` negated, in their order.
    clauses: Vec<Value>,
}

impl Condition {
    /// `None` when the policy has a form the screen does not translate: no tool it judges
    /// then has a screen, and the full set judges every call.
    pub(super) fn of(policy: &Policy) -> Option<Condition> {
        let json = policy.to_json().ok()?;
        let mut clauses = Vec::new();
        for clause in json["conditions"].as_array()? {
            let body = clause.get("body")?.clone();
            clauses.push(match clause.get("kind")?.as_str()? {
                "when" => body,
                "unless" => json!({"!": {"arg": body}}),
                _ => return None,
            });
        }
        Some(Condition {
            action: policy.action_constraint(),
            principal: scope("principal", &json["principal"])?,
            action_scope: scope("action", &json["action"])?,
            resource: scope("resource", &json["resource"])?,
            clauses,
        })
    }

    /// The condition as Cedar builds it (principal scope, action scope, resource scope, then
    /// each clause in order), with the action scope left out when it is true of `action`
    /// (every policy of the tool's share names it or no action).
    fn on(&self, action: &EntityUid) -> Value {
        let holds = match &self.action {
            ActionConstraint::Any => true,
            ActionConstraint::Eq(uid) => uid == action,
            ActionConstraint::In(uids) => uids.contains(action),
        };
        let parts =
            [&self.principal, if holds { &None } else { &self.action_scope }, &self.resource]
                .into_iter()
                .flatten()
                .chain(&self.clauses)
                .cloned()
                .collect();
        balanced("&&", parts).unwrap_or_else(|| json!({"Value": true}))
    }
}

/// The screen for the policies that judge the tool `action`, or `None` when one of them has a
/// form the screen does not translate (the full set then judges every call).
pub(super) fn screen(policies: &[Option<&Condition>], action: &EntityUid) -> Option<Policy> {
    let disjuncts: Vec<Value> =
        policies.iter().map(|c| c.map(|c| c.on(action))).collect::<Option<_>>()?;
    let body = balanced("||", disjuncts)?;
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

/// `items` joined by `op` (`||` or `&&`) in their order, as a balanced tree: a tool with
/// hundreds of policies makes a screen a few levels deep, not hundreds (Cedar evaluates
/// recursively). Both operators are associative and evaluate left to right, so the grouping
/// changes neither the value nor which operand is reached first.
fn balanced(op: &str, mut items: Vec<Value>) -> Option<Value> {
    match items.len() {
        0 => None,
        1 => items.pop(),
        n => {
            let right = items.split_off(n / 2);
            Some(json!({op: {"left": balanced(op, items)?, "right": balanced(op, right)?}}))
        }
    }
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
