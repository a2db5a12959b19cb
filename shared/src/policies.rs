//! Tenants' policies in Cedar: the schema generated from the tool registry, a tenant's policy
//! set compiled once per version, and the verdict for one call.
//!
//! **Policies narrow; rights permit.** The person's role and the connection's rights stay the
//! first gate. A tenant's set holds `forbid` policies only; Gatehouse evaluates them beside one
//! implicit `permit(principal, action, resource);`, so with no policy everything the rights
//! allow is allowed, and each `forbid` takes something away. A `forbid` annotated `@approval`
//! sends a two-step action to a person instead of refusing it. Every policy carries `@id`
//! (named in refusals and in the audit) and `@reason` (shown to the agent and the admin).
//!
//! The schema: principal `Connection` (its creator and their role, the client, how it was
//! granted),
//! action the tool (`Action::"cancel_booking"`), resource the record the call names (`Booking`
//! with its status, start and region, `Customer` with its region and the time in its zone,
//! `Technician` with its region) or the `Tenant`, context the arguments (`context.args`, typed
//! from the tool's input schema, optional ones too), the technician a call names beside its
//! record (`context.technician`), the tenant's local time (`context.now`), the phase (`call`,
//! `prepare`, `confirm`) and the number of records the action touches (`context.effects`).

use std::collections::BTreeMap;
use std::sync::Arc;

use cedar_policy::{
    ActionConstraint, Authorizer, Decision, Entities, EntityId, EntityTypeName, EntityUid,
    PolicySet, Request, Schema, ValidationMode, Validator,
};
use cedar_policy_core::ast;
use cedar_policy_core::entities::{Entities as Store, NoEntitiesSchema, TCComputation};
use cedar_policy_core::evaluator::Evaluator;
use cedar_policy_core::extensions::Extensions;
use serde_json::Value;
use smol_str::SmolStr;

use crate::effect::EffectClass;

mod facts;
mod schema;
mod screen;
pub use facts::*;
pub use schema::*;

/// The largest policy set a tenant may keep, in bytes of source.
pub const MAX_SOURCE_BYTES: usize = 64 * 1024;
/// The most policies a set may hold.
pub const MAX_POLICIES: usize = 500;
/// How deep brackets may nest in a policy's source (Cedar's parser recurses on them).
pub const MAX_NESTING: usize = 32;
/// The most operators one policy may hold (Cedar recurses once per operator of a chain).
pub const MAX_OPERATORS: usize = 128;
/// How deep a parsed policy's JSON form may nest (about two levels per operator or bracket):
/// the backstop behind the counts on the source, checked where the set is compiled (on a
/// large stack), so no set that is kept nests deeper than an ordinary thread can drop.
pub const MAX_DEPTH: usize = 2 * (MAX_OPERATORS + MAX_NESTING) + 64;

/// The most characters the `like` patterns of a set may hold in all (wildcards not counted).
/// Cedar matches a pattern against a text in time up to the product of their lengths, so a
/// long pattern against a long text would hold a worker's thread: with this bound, and texts
/// of at most [`MAX_ARG_CHARS`] (an argument a policy reads, or a string the policy writes),
/// one evaluation's matching is at most about 16 million character steps, whatever set is
/// checked, simulated or set (a version in force before the bound compiles without it).
pub const MAX_LIKE_CHARS: usize = 1024;

/// The kinds of effect budgets count (`customers_messaged`, …), as `context.budgets` names
/// them; the domain's effect kinds, by name.
pub const BUDGET_KINDS: [&str; 5] = [
    "customers_messaged",
    "bookings_changed",
    "technicians_paged",
    "alert_minutes_muted",
    "records_deleted",
];

/// A problem in a policy set's source, at its line (1-based; 0 when Cedar gave no place).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line > 0 {
            write!(f, "line {}: {}", self.line, self.message)
        } else {
            f.write_str(&self.message)
        }
    }
}

fn line_of(source: &str, offset: usize) -> usize {
    source[..offset.min(source.len())].matches('\n').count() + 1
}

fn problems_of(source: &str, diagnostic: &dyn miette::Diagnostic, message: String) -> Problem {
    let line = diagnostic
        .labels()
        .and_then(|mut labels| labels.next())
        .map(|label| line_of(source, label.offset()))
        .unwrap_or(0);
    let help = diagnostic.help().map(|h| format!(" ({h})")).unwrap_or_default();
    Problem { line, message: format!("{message}{help}") }
}

/// One policy as the tenant wrote it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PolicyInfo {
    pub id: String,
    pub reason: String,
    pub approval: bool,
}

/// A tenant's policy set, parsed, validated and ready to evaluate.
///
/// Compiled once per tenant and version, and split by action: a call is judged by the policies
/// whose scope names its tool (`action == Action::"…"`, `action in […]`) and those that name no
/// action, never by the rest. A tool no policy names is allowed without building a request, so
/// a set of policies about messages costs a read nothing.
pub struct Compiled {
    /// By tool: the policies that may apply to it, beside the implicit permit; `None` when the
    /// tenant wrote none that does.
    by_action: std::collections::HashMap<String, Option<Share>>,
    /// The tools some policy judging them reads the call's records for (see
    /// [`Compiled::reads_records`]).
    reads_records: std::collections::HashSet<String>,
    /// By tool: the attributes of `context` its policies read (`None`: every one is built).
    context_reads: std::collections::HashMap<String, Option<std::collections::BTreeSet<String>>>,
    schema: Arc<PolicySchema>,
    /// By Cedar's id of each policy: what the tenant named it and why.
    info: BTreeMap<String, PolicyInfo>,
    authorizer: Authorizer,
    /// Each connection's entity as last built, by handle: the same connection calls again
    /// and again, and sharing its entity costs less than building it.
    principals: std::sync::Mutex<std::collections::HashMap<String, (Principal, Connection)>>,
}

/// A connection as a request names it and as its entity holds it, and the entities of a call
/// whose policies read no record: the connection alone.
#[derive(Clone)]
struct Connection {
    uid: ast::EntityUIDEntry,
    entity: Arc<ast::Entity>,
    alone: Arc<Store>,
}

/// The policies that judge one tool: the set Cedar judges policy by policy (which names the
/// deciding ones), and its screen, the same policies as one condition ([`screen`]), which
/// allows an allowed call in one evaluation. `screen` is `None` when a policy has a form it
/// does not translate.
struct Share {
    set: PolicySet,
    screen: Option<ast::Expr>,
}

/// The most connection entities one compiled set keeps (a full cache starts again empty).
const PRINCIPALS_KEPT: usize = 4096;

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled").field("policies", &self.info.len()).finish()
    }
}

/// The schema in both forms: JSON (what the arguments are typed as) and parsed, with what a
/// call's request is built from, made once per process: Cedar's names parsed, and each tool's
/// typed arguments.
pub struct PolicySchema {
    pub json: Value,
    schema: Schema,
    /// Each tool's action and the arguments its context types.
    actions: std::collections::HashMap<String, ActionFacts>,
    connection: ast::EntityType,
    /// `Tenant`, `Booking`, `Customer`, `Technician`, in [`RESOURCE_TYPES`]'s order.
    resources: [ast::EntityType; 4],
}

/// One tool as a request names it: its action, and the arguments a policy may read.
struct ActionFacts {
    uid: EntityUid,
    /// The same action as a request holds it.
    entry: ast::EntityUIDEntry,
    args: Vec<(SmolStr, ArgType)>,
}

/// The Cedar type of one argument, as the schema gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ArgType {
    String,
    Long,
    Boolean,
    Set(Box<ArgType>),
}

impl ArgType {
    fn of(ty: &Value) -> Option<ArgType> {
        match ty["type"].as_str()? {
            "String" => Some(ArgType::String),
            "Long" => Some(ArgType::Long),
            "Boolean" => Some(ArgType::Boolean),
            "Set" => Some(ArgType::Set(Box::new(ArgType::of(&ty["element"])?))),
            _ => None,
        }
    }

    /// `value` as a Cedar value of this type, read as the tools read it: a string trimmed, a
    /// number also from its digits in a string (the tools take `"50"` for 50). `None` when
    /// it has another type: the tool's own parsing refuses it before anything runs, and to a
    /// policy the argument is absent.
    fn fact(&self, value: &Value) -> Option<ast::Value> {
        match (self, value) {
            (ArgType::String, Value::String(s)) => Some(ast::Value::from(s.trim())),
            (ArgType::Long, Value::Number(n)) => n.as_i64().map(ast::Value::from),
            (ArgType::Long, Value::String(s)) => s.trim().parse::<i64>().ok().map(ast::Value::from),
            (ArgType::Boolean, Value::Bool(b)) => Some(ast::Value::from(*b)),
            (ArgType::Set(element), Value::Array(items)) => items
                .iter()
                .map(|item| element.fact(item))
                .collect::<Option<Vec<_>>>()
                .map(|items| ast::Value::set(items, None)),
            _ => None,
        }
    }
}

impl PolicySchema {
    /// Parses the schema once per process from its JSON form.
    pub fn new(json: Value) -> Result<PolicySchema, String> {
        let schema =
            Schema::from_json_value(json.clone()).map_err(|e| format!("the policy schema: {e}"))?;
        let name = |ty: &str| -> Result<EntityTypeName, String> {
            ty.parse().map_err(|e| format!("the policy schema's type {ty}: {e}"))
        };
        let action = name("Action")?;
        let mut actions = std::collections::HashMap::new();
        if let Some(tools) = json[""]["actions"].as_object() {
            for (tool, spec) in tools {
                // A compiled set is split by the tools a policy's scope names; a group would
                // name tools the split cannot see.
                if spec.get("memberOf").is_some() {
                    return Err(format!(
                        "the policy schema puts the action {tool} in a group; actions are tools, never groups"
                    ));
                }
                let typed = &spec["appliesTo"]["context"]["attributes"]["args"]["attributes"];
                let args = typed
                    .as_object()
                    .map(|attrs| {
                        attrs
                            .iter()
                            .filter_map(|(arg, ty)| Some((SmolStr::from(arg), ArgType::of(ty)?)))
                            .collect()
                    })
                    .unwrap_or_default();
                let uid = EntityUid::from_type_name_and_id(action.clone(), EntityId::new(tool));
                let entry = ast::EntityUIDEntry::known(uid.clone().into(), None);
                actions.insert(tool.clone(), ActionFacts { uid, entry, args });
            }
        }
        let [t, b, c, r] = RESOURCE_TYPES;
        Ok(PolicySchema {
            json,
            schema,
            actions,
            connection: name("Connection")?.as_ref().clone(),
            resources: [name(t)?, name(b)?, name(c)?, name(r)?].map(|n| n.as_ref().clone()),
        })
    }
}

impl Compiled {
    /// Parses and validates `source` against `schema`: every problem, each at its line.
    pub fn compile(source: &str, schema: Arc<PolicySchema>) -> Result<Compiled, Vec<Problem>> {
        if let Some(problem) = unsafe_to_parse(source) {
            return Err(vec![problem]);
        }
        let tenant: PolicySet = source.parse().map_err(|e: cedar_policy::ParseErrors| {
            e.iter().map(|p| problems_of(source, p, p.to_string())).collect::<Vec<_>>()
        })?;
        let mut problems = Vec::new();
        let mut info = BTreeMap::new();
        let mut ids = std::collections::HashSet::new();
        let count = tenant.policies().count();
        if count > MAX_POLICIES {
            problems.push(Problem {
                line: 0,
                message: format!("{count} policies; a set holds at most {MAX_POLICIES}"),
            });
        }
        if tenant.templates().next().is_some() {
            problems.push(Problem {
                line: 0,
                message:
                    "templates (`?principal`, `?resource`) are not used here; write the policy out"
                        .into(),
            });
        }
        for policy in tenant.policies() {
            // The policy's text as written, found in the source: its line.
            let line = source.find(&policy.to_string()).map(|at| line_of(source, at)).unwrap_or(0);
            if policy.to_json().map_or(true, |json| depth_of(&json) > MAX_DEPTH) {
                problems.push(Problem {
                    line,
                    message: format!(
                        "this policy nests deeper than {MAX_DEPTH} levels; split it into several policies, or list values in a set"
                    ),
                });
            }
            if policy.effect() != cedar_policy::Effect::Forbid {
                problems.push(Problem {
                    line,
                    message: "only `forbid` policies are kept: rights permit, policies narrow (write `forbid (…) unless { … }` to allow only some calls)".into(),
                });
            }
            let id = policy.annotation("id").map(str::trim).unwrap_or_default().to_owned();
            if id.is_empty()
                || id.len() > 64
                || !id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                problems.push(Problem {
                    line,
                    message:
                        "every policy needs `@id(\"…\")`: 1 to 64 letters, digits, `-`, `_` or `.`"
                            .into(),
                });
            } else if !ids.insert(id.clone()) {
                problems.push(Problem { line, message: format!("@id(\"{id}\") is used twice") });
            }
            let reason = policy.annotation("reason").map(str::trim).unwrap_or_default().to_owned();
            if reason.is_empty() || reason.chars().count() > 300 {
                problems.push(Problem {
                    line,
                    message: "every policy needs `@reason(\"…\")`, at most 300 characters: the agent and the admin read it".into(),
                });
            }
            info.insert(
                policy.id().to_string(),
                PolicyInfo { id, reason, approval: policy.annotation("approval").is_some() },
            );
        }
        let validation =
            Validator::new(schema.schema.clone()).validate(&tenant, ValidationMode::Strict);
        for error in validation.validation_errors() {
            problems.push(problems_of(source, error, error.to_string()));
        }
        if !problems.is_empty() {
            problems.sort_by_key(|p| p.line);
            return Err(problems);
        }
        let base = cedar_policy::Policy::parse(
            Some(cedar_policy::PolicyId::new("gatehouse-rights-permit")),
            "permit(principal, action, resource);",
        )
        .map_err(|e| vec![Problem { line: 0, message: e.to_string() }])?;
        // Each tool's share of the set: the policies scoped to it or to no action. The schema
        // has no action groups (`PolicySchema::new` refuses one), so a scope names its tools
        // outright; a scope naming anything but tools joins every share, to be safe.
        let tools: std::collections::HashSet<&EntityUid> =
            schema.actions.values().map(|f| &f.uid).collect();
        let mut by_action = std::collections::HashMap::new();
        let mut reads_records = std::collections::HashSet::new();
        let mut context_keys = std::collections::HashMap::new();
        // Each policy's condition for the screens, read once (not once per tool it judges).
        let conditions: std::collections::HashMap<_, _> =
            tenant.policies().map(|p| (p.id().clone(), screen::Condition::of(p))).collect();
        for (tool, facts) in &schema.actions {
            let mut share = PolicySet::new();
            let mut judging = Vec::new();
            let mut keys = Some(std::collections::BTreeSet::new());
            for policy in tenant.policies() {
                let applies = match policy.action_constraint() {
                    ActionConstraint::Any => true,
                    ActionConstraint::Eq(uid) => !tools.contains(&uid) || uid == facts.uid,
                    ActionConstraint::In(uids) => {
                        uids.iter().any(|u| !tools.contains(u)) || uids.contains(&facts.uid)
                    }
                };
                if applies {
                    if reads_a_record(policy) {
                        reads_records.insert(tool.clone());
                    }
                    keys = match (keys, context_reads(policy)) {
                        (Some(mut all), Some(these)) => {
                            all.extend(these);
                            Some(all)
                        }
                        _ => None,
                    };
                    share
                        .add(policy.clone())
                        .map_err(|e| vec![Problem { line: 0, message: e.to_string() }])?;
                    judging.push(conditions.get(policy.id()).and_then(Option::as_ref));
                }
            }
            let share = if share.is_empty() {
                None
            } else {
                let with_base = |mut set: PolicySet| {
                    set.add(base.clone())
                        .map_err(|e| vec![Problem { line: 0, message: e.to_string() }])?;
                    Ok::<_, Vec<Problem>>(set)
                };
                // The screen's condition as Cedar builds it for evaluation, built once here.
                let screen = screen::screen(&judging, &facts.uid)
                    .map(|one| AsRef::<ast::Policy>::as_ref(&one).condition());
                Some(Share { set: with_base(share)?, screen })
            };
            by_action.insert(tool.clone(), share);
            context_keys.insert(tool.clone(), keys);
        }
        Ok(Compiled {
            by_action,
            reads_records,
            context_reads: context_keys,
            schema,
            info,
            authorizer: Authorizer::new(),
            principals: Default::default(),
        })
    }

    /// [`Compiled::compile`] for a set about to be put in force (checked, simulated or set):
    /// also held to the bounds that keep evaluating it cheap ([`MAX_LIKE_CHARS`], strings of at
    /// most [`MAX_ARG_CHARS`]). A set already in force is compiled without them, so a version
    /// kept before a bound was added keeps working until it is replaced.
    pub fn compile_draft(
        source: &str,
        schema: Arc<PolicySchema>,
    ) -> Result<Compiled, Vec<Problem>> {
        // Nothing reaches Cedar's parser before the checks on the source's size and nesting.
        if let Some(problem) = unsafe_to_parse(source) {
            return Err(vec![problem]);
        }
        let bounds = costly(source);
        match Compiled::compile(source, schema) {
            Ok(compiled) if bounds.is_empty() => Ok(compiled),
            Ok(_) => Err(bounds),
            Err(mut problems) => {
                problems.extend(bounds);
                problems.sort_by_key(|p| p.line);
                Err(problems)
            }
        }
    }

    /// The same set judged policy by policy only, without the screens (for tests that hold
    /// both paths to the same verdicts), and how many tools have a screen.
    #[cfg(test)]
    fn without_screens(mut self) -> (Self, usize) {
        let mut screened = 0;
        for share in self.by_action.values_mut().flatten() {
            screened += usize::from(share.screen.take().is_some());
        }
        (self, screened)
    }

    /// Whether evaluating a call of `tool` may refuse it: some policy applies to the tool, or
    /// the schema does not know it (which refuses). When not, the call needs no facts at all.
    pub fn judges(&self, tool: &str) -> bool {
        !matches!(self.by_action.get(tool), Some(None))
    }

    /// Whether a policy judging `tool` reads the records a call names (its scope constrains
    /// `resource`, or a condition names `resource` or `context.technician`). When none does,
    /// the verdict is the same whatever the records are, and the worker's gate reads none.
    pub fn reads_records(&self, tool: &str) -> bool {
        self.reads_records.contains(tool)
    }

    /// The tenant's policies, as written.
    pub fn policies(&self) -> impl Iterator<Item = &PolicyInfo> {
        self.info.values()
    }

    /// The verdict for one call. A tool no policy applies to is allowed at once. Otherwise
    /// arguments larger than a policy may read (a string over [`MAX_ARG_CHARS`], a list over
    /// [`MAX_ARG_ITEMS`]) refuse the call rather than make every policy scan them.
    pub fn evaluate(&self, call: &Call<'_>) -> Verdict {
        // A tool the schema does not know cannot be judged: refused, never allowed.
        let (Some(share), Some(facts)) =
            (self.by_action.get(call.tool), self.schema.actions.get(call.tool))
        else {
            return Verdict::Error(format!("{} is not in the policy schema", call.tool));
        };
        let Some(share) = share else { return Verdict::Allow };
        if let Some(problem) = oversized(&call.args) {
            return Verdict::Error(problem);
        }
        match self.request(call, facts) {
            Ok((request, store)) => {
                // The screen allows what the set allows in one evaluation: its condition is
                // false, without an error, exactly when no policy of the tool applies and none
                // fails. Anything else (true, an error) is judged by the set, which names the
                // policies.
                if share.screen.as_ref().is_some_and(|s| screen_allows(s, &request, &store)) {
                    return Verdict::Allow;
                }
                let entities = Entities::from(Arc::unwrap_or_clone(store));
                let request = Request::from(request);
                let answer = self.authorizer.is_authorized(&request, &share.set, &entities);
                if let Some(error) = answer.diagnostics().errors().next() {
                    return Verdict::Error(format!("a policy failed to evaluate: {error}"));
                }
                if answer.decision() == Decision::Allow {
                    return Verdict::Allow;
                }
                let mut hits: Vec<&PolicyInfo> = answer
                    .diagnostics()
                    .reason()
                    .filter_map(|id| self.info.get(&id.to_string()))
                    .collect();
                hits.sort_by(|a, b| a.id.cmp(&b.id));
                match hits.iter().find(|p| !p.approval) {
                    Some(hard) => Verdict::Forbid((*hard).clone()),
                    None => match hits.first() {
                        Some(soft) => Verdict::Approval((*soft).clone()),
                        None => Verdict::Error("denied by no policy the tenant wrote".into()),
                    },
                }
            }
            Err(e) => Verdict::Error(e),
        }
    }

    /// The connection's entity: the one built for its last call when the connection is as it
    /// was then (same role, client, grant, name and creator), else built now and kept.
    fn connection(&self, who: &Principal) -> Result<Connection, String> {
        let kept = self.principals.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, connection)) = kept.get(&who.handle)
            && seen == who
        {
            return Ok(connection.clone());
        }
        drop(kept);
        let uid = ast::EntityUID::from_components(
            self.schema.connection.clone(),
            ast::Eid::new(who.handle.as_str()),
            None,
        );
        let attrs = [
            ("role", &who.role),
            ("client", &who.client),
            ("grant", &who.grant),
            ("name", &who.name),
            ("creator", &who.creator),
        ]
        .map(|(name, value)| (SmolStr::new_static(name), string(value).into()));
        let entity = Arc::new(ast::Entity::new_with_attr_partial_value(
            uid.clone(),
            attrs,
            Default::default(),
            Default::default(),
            [],
        ));
        let alone = Arc::new(store([entity.clone()])?);
        let connection = Connection { uid: ast::EntityUIDEntry::known(uid, None), entity, alone };
        let mut kept = self.principals.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() >= PRINCIPALS_KEPT {
            kept.clear();
        }
        kept.insert(who.handle.clone(), (who.clone(), connection.clone()));
        Ok(connection)
    }

    /// The call as Cedar's request and the entities it names, built from Cedar's values: no
    /// JSON, no parsing (the names were parsed with the schema), nothing evaluated.
    ///
    /// The values are those Cedar's own builders make from the same facts: the policies were
    /// validated against the schema when compiled, and the facts are built here from it (only
    /// the arguments it types, as [`ArgType`] reads them), so checking each call's entities and
    /// context against the schema again would cost more than evaluating. A call whose policies
    /// read no record is given the connection alone: a record no policy looks at cannot change
    /// their verdict.
    fn request(
        &self,
        call: &Call<'_>,
        facts: &ActionFacts,
    ) -> Result<(ast::Request, Arc<Store>), String> {
        let connection = self.connection(call.connection)?;
        let (kind, id) = call.resource.uid();
        let resource = ast::EntityUID::from_components(
            self.schema.resources[kind].clone(),
            ast::Eid::new(id),
            None,
        );
        // Only what the tool's policies read is built: the clock, the arguments and the
        // record's attributes cost more than evaluating a policy that never looks at them.
        let reads = self.context_reads.get(call.tool).and_then(Option::as_ref);
        let wants = |key: &str| reads.is_none_or(|r| r.contains(key));
        let mut attrs: Vec<(SmolStr, ast::PartialValue)> = Vec::new();
        let mut put = |name: &'static str, value: Option<ast::Value>| {
            if let Some(value) = value {
                attrs.push((SmolStr::new_static(name), value.into()));
            }
        };
        // The record only when a policy of the tool reads it.
        let reads_record = self.reads_records.contains(call.tool);
        if reads_record {
            match &call.resource {
                Resource::Booking { status, hours_until_start, region, .. } => {
                    put("status", status.as_deref().map(string));
                    put("hours_until_start", hours_until_start.map(ast::Value::from));
                    put("region", region.as_deref().map(string));
                }
                Resource::Customer { region, local, .. } => {
                    put("region", region.as_deref().map(string));
                    put("zone", local.as_ref().and_then(|l| l.time_zone().iana_name()).map(string));
                    put("local_time", local.as_ref().map(clock));
                }
                Resource::Technician(t) => {
                    put("region", t.region.as_deref().map(string));
                    put("active", t.active.map(ast::Value::from));
                }
                Resource::Tenant(_) => {}
            }
        }
        let store = if reads_record {
            let record = ast::Entity::new_with_attr_partial_value(
                resource.clone(),
                attrs,
                Default::default(),
                Default::default(),
                [],
            );
            Arc::new(store([connection.entity, Arc::new(record)])?)
        } else {
            connection.alone
        };
        let mut context = std::collections::BTreeMap::new();
        let mut put = |name: &'static str, value: ast::Value| {
            context.insert(SmolStr::new_static(name), value);
        };
        if wants("args") {
            let args = facts.args.iter().filter_map(|(name, ty)| {
                Some((name.clone(), ty.fact(call.args.get(name.as_str())?)?))
            });
            put("args", ast::Value::record(args, None));
        }
        if wants("class") {
            put("class", string(call.class.as_str()));
        }
        if wants("phase") {
            put("phase", string(call.phase));
        }
        if wants("effects") {
            put("effects", ast::Value::from(call.effects));
        }
        if wants("now") {
            put("now", clock(&call.now));
        }
        if let Some(t) = call.technician.as_ref().filter(|_| wants("technician")) {
            let mut fields = vec![("handle", string(&t.handle))];
            if let Some(region) = &t.region {
                fields.push(("region", string(region)));
            }
            if let Some(active) = t.active {
                fields.push(("active", ast::Value::from(active)));
            }
            put("technician", ast::Value::record(fields, None));
        }
        if !call.budgets.is_empty() && wants("budgets") {
            let kinds: std::collections::BTreeMap<SmolStr, ast::Value> = call
                .budgets
                .iter()
                .map(|b| {
                    let fields = [("used", b.used), ("limit", b.limit), ("amount", b.amount)];
                    (SmolStr::new_static(b.kind), ast::Value::record(fields, None))
                })
                .collect();
            // A kind given twice would be one of them, silently: refused, as Cedar's builder does.
            if kinds.len() != call.budgets.len() {
                return Err("the call's context: a budget's kind is given twice".into());
            }
            put("budgets", ast::Value::record_arc(Arc::new(kinds), None));
        }
        let request = ast::Request::new_unchecked(
            connection.uid,
            facts.entry.clone(),
            ast::EntityUIDEntry::known(resource, None),
            Some(ast::Context::Value(Arc::new(context))),
        );
        Ok((request, store))
    }
}

/// These entities, as Cedar keeps them. They have no parents, so their hierarchy needs no
/// closure computed.
fn store<const N: usize>(entities: [Arc<ast::Entity>; N]) -> Result<Store, String> {
    Store::new()
        .add_entities(
            entities,
            None::<&NoEntitiesSchema>,
            TCComputation::AssumeAlreadyComputed,
            Extensions::all_available(),
        )
        .map_err(|e| format!("the call's entities: {e}"))
}

/// Whether a tool's screen allows the call: its condition evaluates to `false` without an
/// error (Cedar's evaluator, as its authorizer runs it for a policy with no slots).
fn screen_allows(screen: &ast::Expr, request: &ast::Request, store: &Store) -> bool {
    let evaluator = Evaluator::new(request.clone(), store, Extensions::all_available());
    let value = evaluator.interpret(screen, &ast::SlotEnv::new());
    matches!(
        value.as_ref().map(ast::Value::value_kind),
        Ok(ast::ValueKind::Lit(ast::Literal::Bool(false)))
    )
}

/// A string as Cedar's value.
fn string(s: &str) -> ast::Value {
    ast::Value::from(s)
}

/// The longest argument text a policy reads.
pub const MAX_ARG_CHARS: usize = 16 * 1024;
/// The longest argument list a policy reads.
pub const MAX_ARG_ITEMS: usize = 200;

fn oversized(args: &Value) -> Option<String> {
    match args {
        Value::String(s) if s.chars().count() > MAX_ARG_CHARS => Some(format!(
            "an argument of {} characters is longer than the tenant's policies read ({MAX_ARG_CHARS})",
            s.chars().count()
        )),
        Value::Array(items) if items.len() > MAX_ARG_ITEMS => Some(format!(
            "an argument of {} items is longer than the tenant's policies read ({MAX_ARG_ITEMS})",
            items.len()
        )),
        Value::Array(items) => items.iter().find_map(oversized),
        Value::Object(map) => map.values().find_map(oversized),
        _ => None,
    }
}

/// Calls `visit` with each character of `source` outside strings and comments, and its line;
/// the line where `visit` first answers `true`.
fn first_in_code(source: &str, mut visit: impl FnMut(char) -> bool) -> Option<usize> {
    let mut line = 1;
    let mut in_string = false;
    let mut in_comment = false;
    let mut escaped = false;
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\n' || c == '\r' {
            // Cedar ends a comment at either; a line is counted at `\n`.
            line += usize::from(c == '\n');
            in_comment = false;
            if visit(' ') {
                return Some(line);
            }
            continue;
        }
        if in_comment {
            continue;
        }
        if !in_string && c == '/' && chars.peek() == Some(&'/') {
            in_comment = true;
            continue;
        }
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        if c == '"' {
            in_string = true;
            // A string is one operand: it ends a word as a space does.
            if visit(' ') {
                return Some(line);
            }
            continue;
        }
        if visit(c) {
            return Some(line);
        }
    }
    None
}

/// How deep brackets nest, when deeper than allowed: the line where it happens.
fn too_deep(source: &str) -> Option<usize> {
    // `if` nests without brackets: each is counted among its policy's operators
    // ([`too_many_operators`]), per policy and at its line.
    let mut depth = 0usize;
    first_in_code(source, |c| {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        depth > MAX_NESTING
    })
}

/// The line of a policy with more operators than [`MAX_OPERATORS`]. Operators chain without
/// brackets (`a || b || c …`, `x + 1 + 1 …`), and Cedar parses, converts, evaluates and drops
/// such a chain recursively, one level per operator: a long one would overflow a thread's stack
/// (a worker's, when the set it cached is dropped). Counted generously: every operator
/// character (`&&` is two), every `.` and `[` (an index chain `x["a"]["a"]…` nests as well),
/// and the words `in`, `has`, `like`, `is` and `if`. What this count misses, the depth of the
/// parsed policy catches ([`MAX_DEPTH`]).
fn too_many_operators(source: &str) -> Option<usize> {
    let (mut count, mut word) = (0usize, String::new());
    first_in_code(source, |c| {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
            return false;
        }
        // A name cannot start with a digit: `1in` is a number and `in`.
        if matches!(
            word.trim_start_matches(|d: char| d.is_ascii_digit()),
            "in" | "has" | "like" | "is" | "if"
        ) {
            count += 1;
        }
        word.clear();
        match c {
            ';' => count = 0,
            '+' | '-' | '*' | '<' | '>' | '=' | '!' | '&' | '|' | '.' | '[' => count += 1,
            _ => {}
        }
        count > MAX_OPERATORS
    })
}

/// How deep a JSON value nests (a scalar is 1), without recursing: the value may be as deep as
/// the policy it was made from.
fn depth_of(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 1usize)];
    while let Some((value, depth)) = stack.pop() {
        deepest = deepest.max(depth);
        match value {
            Value::Array(items) => stack.extend(items.iter().map(|v| (v, depth + 1))),
            Value::Object(map) => stack.extend(map.values().map(|v| (v, depth + 1))),
            _ => {}
        }
    }
    deepest
}

/// Why `source` may not be handed to Cedar's parser at all: too long, brackets nested too
/// deep, or too many operators in one policy (Cedar parses, converts and drops them
/// recursively, so such a source could exhaust even a large stack).
fn unsafe_to_parse(source: &str) -> Option<Problem> {
    if source.len() > MAX_SOURCE_BYTES {
        return Some(Problem {
            line: 0,
            message: format!(
                "the policy set is {} bytes; at most {MAX_SOURCE_BYTES} are kept",
                source.len()
            ),
        });
    }
    if let Some(line) = too_deep(source) {
        return Some(Problem {
            line,
            message: format!("brackets nest deeper than {MAX_NESTING} levels here"),
        });
    }
    too_many_operators(source).map(|line| Problem {
        line,
        message: format!(
            "the policy reaching this line holds more than {MAX_OPERATORS} operators; split it into several policies, or list values in a set (`[\"a\", \"b\"].contains(context.args.region)`)"
        ),
    })
}

/// The problems of a set whose evaluation could cost too much: `like` patterns of more than
/// [`MAX_LIKE_CHARS`] characters in all, or a string longer than [`MAX_ARG_CHARS`] written in a
/// policy (one could be the text a pattern is matched against), each at its policy's line.
/// A source that does not parse, or a policy too deep to read, has its problems from
/// [`Compiled::compile`]; the caller has checked the source is safe to parse
/// ([`unsafe_to_parse`]).
fn costly(source: &str) -> Vec<Problem> {
    let Ok(set) = source.parse::<PolicySet>() else { return Vec::new() };
    let mut problems = Vec::new();
    let mut like_chars = 0;
    for policy in set.policies() {
        let Some(json) = policy.to_json().ok().filter(|j| depth_of(j) <= MAX_DEPTH) else {
            continue;
        };
        let line = source.find(&policy.to_string()).map(|at| line_of(source, at)).unwrap_or(0);
        let (patterns, longest) = strings_of(&json["conditions"]);
        let before = like_chars;
        like_chars += patterns;
        if before <= MAX_LIKE_CHARS && like_chars > MAX_LIKE_CHARS {
            problems.push(Problem {
                line,
                message: format!(
                    "with this policy the set's `like` patterns hold {like_chars} characters; at most {MAX_LIKE_CHARS} are kept in all (matching costs the pattern's length times the text's): shorten the patterns, or compare whole values (`==`, `[\"a\", \"b\"].contains(…)`)"
                ),
            });
        }
        if longest > MAX_ARG_CHARS {
            problems.push(Problem {
                line,
                message: format!(
                    "this policy writes a string of {longest} characters; at most {MAX_ARG_CHARS} are kept"
                ),
            });
        }
    }
    problems
}

/// In a policy's conditions (JSON form): how many characters its `like` patterns hold
/// (wildcards not counted), and the length of its longest string value; without recursing.
fn strings_of(value: &Value) -> (usize, usize) {
    let (mut patterns, mut longest) = (0, 0);
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => {
                if let Some(Value::Array(pattern)) = map.get("like").and_then(|l| l.get("pattern"))
                {
                    patterns += pattern
                        .iter()
                        .filter_map(|e| e.get("Literal").and_then(Value::as_str))
                        .map(|l| l.chars().count())
                        .sum::<usize>();
                }
                if let Some(Value::String(text)) = map.get("Value") {
                    longest = longest.max(text.chars().count());
                }
                stack.extend(map.values());
            }
            _ => {}
        }
    }
    (patterns, longest)
}

/// Whether replacing the set `old` with `new` may widen what agents may do. Decided
/// conservatively on the policies as written: the new set narrows only when it keeps every
/// policy of the old one word for word (adding a `forbid` or an `@approval` narrows); removing
/// or changing any policy widens.
pub fn widens(old: &str, new: &str) -> bool {
    // Compared in Cedar's JSON form, which keeps what a policy says and drops comments and
    // layout: a comment that swallowed a condition, or spaces inside a string, cannot make two
    // different policies look the same.
    let policies = |source: &str| -> Option<Vec<String>> {
        let set: PolicySet = source.parse().ok()?;
        set.policies().map(|p| p.to_json().ok().map(|j| crate::canon::canonical_json(&j))).collect()
    };
    match (policies(old), policies(new)) {
        (Some(old), Some(new)) => old.iter().any(|p| !new.contains(p)),
        _ => true,
    }
}

#[cfg(test)]
mod tests;
