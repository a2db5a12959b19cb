//! The tool registry: every tool with its effect class, the right that shows it, its schemas
//! and its adapter function (R6, R12, R16).
//!
//! Tools are the second adapter over the domain services (R2): an adapter parses its input
//! with [`shared::input::parse_input`], calls one service with the connection's
//! [`OpCtx`](shared::OpCtx), and presents the result with a shared presenter. Tool code never
//! touches SQL or the pool; `tests/worker.rs` fails the build's tests if it does.
//! Annotations are derived from the effect class, never written by hand.

mod actions;
mod long;
mod read;
mod small;
mod write;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use shared::auth::ReadAhead;
use shared::rights::Right;
use shared::{OpCtx, Services};

use crate::results;

pub use shared::effect::EffectClass;

/// MCP hints follow from the class; they guide clients and never replace a server check.
pub fn annotations(class: EffectClass, title: &str) -> ToolAnnotations {
    let (read_only, destructive, idempotent, open_world) = match class {
        EffectClass::Read => (true, false, true, false),
        // Replay protection makes a repeated identical silent write a no-op (R8).
        EffectClass::SilentWrite => (false, false, true, false),
        EffectClass::Notify => (false, true, false, true),
        EffectClass::Wake => (false, false, false, true),
        EffectClass::Alert => (false, true, false, false),
        EffectClass::Delete => (false, true, false, false),
    };
    let mut a = ToolAnnotations::with_title(title);
    a.read_only_hint = Some(read_only);
    a.destructive_hint = Some(destructive);
    a.idempotent_hint = Some(idempotent);
    a.open_world_hint = Some(open_world);
    a
}

/// What a tool adapter gets: the services handle, the call's context, the time
/// the call is served at (so every time in one result has the same "now").
pub struct Env {
    pub ds: Services,
    pub ctx: OpCtx,
    pub now: jiff::Timestamp,
    /// Progress notifications to the caller, when it sent a `progressToken` (R22).
    pub progress: Progress,
    /// Cancelled when the client cancels or goes away.
    pub cancel: tokio_util::sync::CancellationToken,
}

/// Sends `notifications/progress` for the call, if the client asked for them.
/// Inside a task, the latest progress is kept for the task's status message instead (the
/// call's HTTP request has ended; `tasks/get` shows it).
pub struct Progress {
    pub peer: Option<rmcp::Peer<rmcp::RoleServer>>,
    pub token: Option<rmcp::model::ProgressToken>,
    pub task: Option<Arc<std::sync::Mutex<Option<String>>>>,
}

impl Progress {
    pub fn none() -> Self {
        Progress { peer: None, token: None, task: None }
    }

    pub async fn report(&self, done: i64, total: i64, message: String) {
        if let Some(latest) = &self.task {
            let mut latest = latest.lock().unwrap_or_else(|p| p.into_inner());
            *latest = Some(format!("{message} ({done} of {total})"));
            return;
        }
        if let (Some(peer), Some(token)) = (&self.peer, &self.token) {
            let param = rmcp::model::ProgressNotificationParam::new(token.clone(), done as f64)
                .with_total(total as f64)
                .with_message(message);
            if let Err(e) = peer.notify_progress(param).await {
                tracing::debug!(error = %e, "progress notification not delivered");
            }
        }
    }
}

/// What a tool adapter answers: presenter JSON, or the two-step rail's typed outcome, which
/// the entry point may turn into a form for the person (multi round-trip) and counts by what
/// it did, before it becomes JSON.
pub enum Answer {
    Json(Value),
    /// A typed output already written as JSON text: a call answered as one JSON body takes it
    /// as it is for both places of its result ([`crate::written`]).
    Written(String),
    TwoStep(Box<shared::services::outcome::Outcome>),
}

impl Answer {
    pub fn into_json(self) -> shared::Result<Value> {
        match self {
            Answer::Json(value) => Ok(value),
            Answer::Written(text) => serde_json::from_str(&text)
                .map_err(|e| shared::Error::Internal(format!("present: {e}"))),
            Answer::TwoStep(outcome) => serde_json::to_value(*outcome)
                .map_err(|e| shared::Error::Internal(format!("present: {e}"))),
        }
    }
}

type BoxFuture = Pin<Box<dyn Future<Output = shared::Result<Answer>> + Send>>;
type Handler = Arc<dyn Fn(Env, Value) -> BoxFuture + Send + Sync>;
type AheadFn = Arc<dyn Fn(Value) -> Option<ReadAhead> + Send + Sync>;

pub struct ToolSpec {
    pub name: &'static str,
    pub class: EffectClass,
    /// Who sees and may call the tool.
    pub access: Access,
    pub refs: &'static [Ref],
    pub untrusted: &'static [ThirdPartyText],
    /// The toolsets that include the tool (R21).
    pub toolsets: Vec<&'static str>,
    pub tool: Tool,
    handler: Handler,
    /// What the tool will read, from its arguments, when the entry point may read it in the
    /// statement that reads the call's context (one round trip for the call).
    read_ahead: Option<AheadFn>,
    /// Whether a call may be answered with a task (the tasks extension): set for every slow
    /// tool by [`ToolSpec::slow`], so the rule holds for every tool of its kind.
    pub tasks: TaskSupport,
}

/// A tool's support for the tasks extension (SEP-2663), as the registry declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskSupport {
    /// Always answered in the call: a client asking for tasks still gets the result.
    Forbidden,
    /// Answered with a task when the request declares the tasks extension; in the call
    /// otherwise.
    Optional,
}

impl TaskSupport {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskSupport::Forbidden => "forbidden",
            TaskSupport::Optional => "optional",
        }
    }
}

impl ToolSpec {
    pub async fn call(&self, env: Env, args: Value) -> shared::Result<Answer> {
        (self.handler)(env, args).await
    }

    /// Declares the tool's read-ahead: `f` is the consuming service's own key function, given
    /// the input parsed exactly as the tool parses it, so both name the same row.
    pub fn reads_ahead<I>(mut self, f: fn(&I) -> Option<ReadAhead>) -> Self
    where
        I: DeserializeOwned + JsonSchema + 'static,
    {
        self.read_ahead =
            Some(Arc::new(move |args| f(&shared::input::parse_input::<I>(args).ok()?)));
        self
    }

    /// Marks a consistently slow tool (R22): flagged in its `_meta` (there is no slow-tool
    /// hint in MCP 2026-07-28) and answered with a task for clients that declare the tasks
    /// extension (`dev.gatehouse/tasks` says so).
    pub fn slow(mut self) -> Self {
        self.tasks = TaskSupport::Optional;
        if let Some(meta) = self.tool.meta.as_mut() {
            meta.0.insert("dev.gatehouse/slow".into(), Value::Bool(true));
            meta.0.insert("dev.gatehouse/tasks".into(), Value::from(self.tasks.as_str()));
        }
        self
    }

    /// Whether the tool declared a read-ahead at all.
    pub fn reads_ahead_any(&self) -> bool {
        self.read_ahead.is_some()
    }

    /// The read to do with the context for a call with these arguments, if any.
    pub fn read_ahead(&self, args: Value) -> Option<ReadAhead> {
        self.read_ahead.as_ref()?(args)
    }
}

pub struct Def {
    pub name: &'static str,
    pub title: &'static str,
    pub description: &'static str,
    pub class: EffectClass,
    pub access: Access,
    /// Every argument that names a record, and how (R3): the contract suite passes another
    /// tenant's valid handle in each one, and the coverage test fails on an undeclared one.
    pub refs: &'static [Ref],
    /// The third-party text fields its results can carry (R13), always as `untrusted_text`;
    /// the contract suite plants a canary in each and checks the declaration both ways.
    pub untrusted: &'static [ThirdPartyText],
}

/// An argument that names a record of the tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ref {
    pub field: &'static str,
    pub kind: RefKind,
    pub shape: Shape,
}

/// What a reference argument names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefKind {
    Booking,
    Customer,
    Technician,
    Service,
    AlertRule,
    /// A pending action, by its confirm token.
    ConfirmToken,
    /// A position in a listing of the tenant's records.
    Cursor,
}

/// How an argument names records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One record the call acts on or reads.
    Single,
    /// A list of records the call acts on (a batch).
    List,
    /// Narrows which records a search or batch matches.
    Filter,
    /// Continues a listing.
    Cursor,
}

/// Third-party text a result can carry: written by customers or other systems, never by staff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThirdPartyText {
    /// `bookings.customer_note`: what the customer wrote when booking.
    CustomerNote,
    /// `booking_notes` written by the customer portal or an external system.
    BookingNotes,
}

/// Which live rights show a tool. A hidden tool called by name is refused naming the right.
#[derive(Debug, Clone, Copy)]
pub enum Access {
    /// Every connection (reading its own changes).
    Always,
    Right(Right),
    /// Any one of these (confirming or rejecting actions that some right could prepare).
    AnyOf(&'static [Right]),
}

impl Access {
    /// The right to name when `rights` do not allow the tool.
    pub fn missing(self, rights: shared::rights::RightSet) -> Option<Right> {
        match self {
            Access::Always => None,
            Access::Right(r) => (!rights.contains(r)).then_some(r),
            Access::AnyOf(all) => (!all.iter().any(|r| rights.contains(*r))).then(|| all[0]),
        }
    }

    /// The right that would let `rights` call the tool when the person can still grant it
    /// (`grantable`): what a step-up authorization asks for. `None` when the tool is allowed
    /// already or no grantable right would allow it.
    pub fn step_up(
        self,
        rights: shared::rights::RightSet,
        grantable: shared::rights::RightSet,
    ) -> Option<Right> {
        self.missing(rights)?;
        match self {
            Access::Always => None,
            Access::Right(r) => grantable.contains(r).then_some(r),
            Access::AnyOf(all) => all.iter().copied().find(|r| grantable.contains(*r)),
        }
    }
}

/// Builds a tool from its definition and a typed adapter `f(env, input) -> output`.
pub fn tool<I, O, F, Fut>(def: Def, f: F) -> ToolSpec
where
    I: DeserializeOwned + JsonSchema + Send + 'static,
    O: Serialize + JsonSchema + 'static,
    F: Fn(Env, I) -> Fut + Send + Sync + Copy + 'static,
    Fut: Future<Output = shared::Result<O>> + Send + 'static,
{
    tool_answer::<I, O, _, _>(def, move |env, input| async move {
        let output = f(env, input).await?;
        serde_json::to_string(&output)
            .map(Answer::Written)
            .map_err(|e| shared::Error::Internal(format!("present: {e}")))
    })
}

/// Builds a tool whose adapter returns presenter JSON made by a service; `S` declares its
/// shape for the `outputSchema` (the contract suite validates every result against it).
pub fn tool_json<I, S, F, Fut>(def: Def, f: F) -> ToolSpec
where
    I: DeserializeOwned + JsonSchema + Send + 'static,
    S: JsonSchema + 'static,
    F: Fn(Env, I) -> Fut + Send + Sync + Copy + 'static,
    Fut: Future<Output = shared::Result<Value>> + Send + 'static,
{
    tool_answer::<I, S, _, _>(def, move |env, input| async move {
        f(env, input).await.map(Answer::Json)
    })
}

/// Builds a two-step tool (R7) from a typed adapter: its output schema is derived from `O`,
/// the rail's own type, and the entry point sees the outcome before it becomes JSON.
pub fn tool_two_step<I, O, F, Fut>(def: Def, f: F) -> ToolSpec
where
    I: DeserializeOwned + JsonSchema + Send + 'static,
    O: Into<shared::services::outcome::Outcome> + JsonSchema + 'static,
    F: Fn(Env, I) -> Fut + Send + Sync + Copy + 'static,
    Fut: Future<Output = shared::Result<O>> + Send + 'static,
{
    tool_answer::<I, O, _, _>(def, move |env, input| async move {
        f(env, input).await.map(|o| Answer::TwoStep(Box::new(o.into())))
    })
}

fn tool_answer<I, S, F, Fut>(def: Def, f: F) -> ToolSpec
where
    I: DeserializeOwned + JsonSchema + Send + 'static,
    S: JsonSchema + 'static,
    F: Fn(Env, I) -> Fut + Send + Sync + Copy + 'static,
    Fut: Future<Output = shared::Result<Answer>> + Send + 'static,
{
    let input_schema = input_schema::<I>();
    let output_schema =
        results::output_schema(schemars::SchemaGenerator::default().into_root_schema_for::<S>());
    let mut meta = rmcp::model::MetaObject::new();
    meta.0.insert("dev.gatehouse/effect_class".into(), Value::from(def.class.as_str()));
    if let Access::Right(right) = def.access {
        meta.0.insert("dev.gatehouse/right".into(), Value::from(right.as_str()));
    }
    let tool = Tool::new(def.name, def.description, Arc::new(input_schema))
        .with_title(def.title)
        .with_raw_output_schema(Arc::new(output_schema))
        .with_annotations(annotations(def.class, def.title))
        .with_meta(meta);
    let handler: Handler = Arc::new(move |env: Env, args: Value| {
        Box::pin(async move {
            let input: I = shared::input::parse_input(args)?;
            f(env, input).await
        })
    });
    ToolSpec {
        name: def.name,
        class: def.class,
        access: def.access,
        refs: def.refs,
        untrusted: def.untrusted,
        toolsets: Vec::new(),
        tool,
        handler,
        read_ahead: None,
        tasks: TaskSupport::Forbidden,
    }
}

/// The input schema: the struct's schema, closed to unknown fields (R12).
fn input_schema<I: JsonSchema>() -> JsonObject {
    let schema = schemars::SchemaGenerator::default().into_root_schema_for::<I>();
    let mut value = schema.to_value();
    results::strip_numeric_formats(&mut value);
    results::portable(&mut value);
    let mut object = value.as_object().cloned().unwrap_or_default();
    object.remove("$schema");
    object.insert("additionalProperties".into(), Value::Bool(false));
    object.entry("properties").or_insert_with(|| Value::Object(Default::default()));
    object
}

/// The toolsets (R21): `full` has every standard tool; `read_only` its read tools; `small`, for
/// small models, a few combined tools whose handles and results fit one model reply.
fn toolsets_of(name: &str, class: EffectClass) -> Vec<&'static str> {
    match name {
        "list_recent_changes" => vec!["full", "read_only", "small"],
        n if small::NAMES.contains(&n) => vec!["small"],
        _ if class == EffectClass::Read => vec!["full", "read_only"],
        _ => vec!["full"],
    }
}

impl ToolSpec {
    /// Whether calls count against a rate bucket: every tool but confirming or rejecting an
    /// action, whose preview already counted.
    pub fn rate_class(&self) -> Option<EffectClass> {
        (!matches!(self.access, Access::AnyOf(_))).then_some(self.class)
    }
}

/// All tools, sorted by name so `tools/list` is deterministic.
pub struct Registry {
    tools: Vec<ToolSpec>,
}

impl Registry {
    pub fn new() -> Self {
        let mut tools = read::tools();
        tools.extend(write::tools());
        tools.extend(actions::tools());
        tools.extend(small::tools());
        tools.extend(long::tools());
        for t in &mut tools {
            t.toolsets = toolsets_of(t.name, t.class);
        }
        tools.sort_by_key(|t| t.name);
        Registry { tools }
    }

    pub fn all(&self) -> &[ToolSpec] {
        &self.tools
    }

    /// Every tool as the policy schema sees it (`shared::policies::schema_json`).
    pub fn policy_facts(&self) -> Vec<shared::policies::ToolFacts<'_>> {
        self.tools
            .iter()
            .map(|t| shared::policies::ToolFacts {
                name: t.name,
                class: t.class,
                input_schema: &t.tool.input_schema,
            })
            .collect()
    }

    pub fn get(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.iter().find(|t| t.name == name)
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}
