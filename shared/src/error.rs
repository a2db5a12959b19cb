//! One error type for every adapter (STYLE 3).
//!
//! Services return [`Error`]; the MCP tool layer, the REST API and the CLI each map it to their
//! own shape in one place. Variants carry what the caller needs to fix the next call (R15):
//! the field, the allowed values, the resource to look up instead. Internal detail (a database
//! message) stays in [`Error::Internal`] and is logged, never shown.

use crate::rights::catalog::Right;

/// The kinds of object a handle can name; adapters turn these into "look it up with …" hints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Tenant,
    Person,
    Customer,
    Technician,
    Service,
    Booking,
    Connection,
    ApiToken,
    AlertRule,
    Action,
    Passkey,
    Invitation,
}

impl Resource {
    /// Where a handle of this kind is looked for: a person's own passkeys belong to no tenant.
    pub fn scope(self) -> &'static str {
        match self {
            Resource::Passkey => "among your passkeys",
            _ => "in this tenant",
        }
    }

    pub fn noun(self) -> &'static str {
        match self {
            Resource::Tenant => "tenant",
            Resource::Person => "person",
            Resource::Customer => "customer",
            Resource::Technician => "technician",
            Resource::Service => "service",
            Resource::Booking => "booking",
            Resource::Connection => "connection",
            Resource::ApiToken => "API token",
            Resource::AlertRule => "alert rule",
            Resource::Action => "pending action",
            Resource::Passkey => "passkey",
            Resource::Invitation => "invitation",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such object in the caller's tenant (another tenant's handle lands here too, R3).
    #[error("no {} {handle} {}", resource.noun(), resource.scope())]
    NotFound { resource: Resource, handle: String },

    /// One argument is malformed or out of range.
    #[error("{field}: {problem}")]
    Invalid {
        field: String,
        problem: String,
        /// Values the caller may choose from (zones, offsets, enum values).
        options: Vec<String>,
    },

    /// Fields the operation does not take (R12); `allowed` lists the ones it does.
    #[error("unknown field(s) {}", unknown.join(", "))]
    UnknownFields { unknown: Vec<String>, allowed: Vec<String> },

    /// The actor lacks a right the operation needs.
    #[error("this needs the right {}", right.as_str())]
    Forbidden { right: Right },

    /// No actor in the operation context: services fail closed (R5).
    #[error("no actor is bound to this operation")]
    NoActor,

    /// The object changed since the caller read it (R10); `current` is its presented state.
    #[error("{} {handle} changed since version {expected}", resource.noun())]
    Conflict {
        resource: Resource,
        handle: String,
        expected: String,
        current_version: String,
        current: Box<serde_json::Value>,
    },

    /// A create would duplicate an existing object's business key (R9).
    #[error("a {} with the same {key} exists: {existing}", resource.noun())]
    Duplicate { resource: Resource, existing: String, key: String },

    /// A batch filter matched another number of objects than the caller expected (R11).
    #[error("the filter matches {} bookings, not {expected}", matches.len())]
    CountMismatch {
        expected: usize,
        /// How many records the filter really matches.
        count: usize,
        /// Their handles, the first [`MAX_LISTED_MATCHES`] of them.
        matches: Vec<String>,
    },

    /// A two-step action cannot proceed with this token (R7).
    #[error("{message}")]
    ActionRefused { reason: ActionRefusal, message: String },

    /// What the action would do changed since the preview; a new preview is attached and the
    /// old token is dead (R7). The preview is `services::outcome::Preview` as JSON, so that
    /// this module stays a leaf the services depend on, never the other way round.
    #[error("the action changed since its preview")]
    ChangedSincePreview { preview: Box<serde_json::Value> },

    /// The connection used up its allowance for this effect class.
    #[error("the {class} limit of {limit} calls per minute is used up")]
    RateLimited { class: &'static str, limit: i32, retry_after_secs: u32 },

    /// The tenant's approval policy turned this kind of action off for agents.
    #[error("{tool} is turned off for agents in this tenant ({class} actions)")]
    TurnedOff { tool: String, class: &'static str },

    /// A policy the tenant wrote refuses the call (`policy` is its `@id`, `reason` its
    /// `@reason`); `approval` when the policy sends such actions to a person and this call could
    /// not wait for one. A policy set that cannot be evaluated refuses too, never allows.
    #[error("the tenant's policy {policy} refuses this: {reason}")]
    PolicyRefused { policy: String, reason: String, approval: bool },

    /// The tool is not in the connection's toolset (R21).
    #[error("{tool} is not in this connection's toolset {toolset}")]
    NotInToolset { tool: String, toolset: String, available_in: Vec<String> },

    /// The operation cannot run in the object's current state (a confirmed booking's time is
    /// changed by rescheduling, not editing).
    #[error("{message}")]
    WrongState { message: String, use_instead: Option<&'static str> },

    /// A credential is missing, unknown, expired, revoked, or of the wrong kind.
    #[error("{0}")]
    Unauthenticated(String),

    /// The tenant's policy needs a passkey assertion made for this decision, and the request
    /// carried none that holds (missing, for another decision, expired, or another person's).
    /// `ceremony_for` is what a passkey ceremony must be made for to satisfy it (the decision
    /// as the service built it from its own input), or `None` when no ceremony can (the person
    /// holds no passkey, or the assertion itself was bad).
    #[error("{decision} needs a passkey: {problem}")]
    PasskeyRequired { decision: String, problem: String, ceremony_for: Option<Box<CeremonyFor>> },

    /// The database could not serve the call (no connection, a restart, a failover); nothing
    /// of it was applied and a retry after a few seconds is expected to work. The cause names
    /// the SQLSTATE (see [`DbFailure`]).
    #[error("the database is unavailable ({cause})")]
    Unavailable { cause: String },

    /// An internal failure; the message is for logs only.
    #[error("internal error")]
    Internal(String),
}

/// How many matches a count mismatch lists at most; the count itself is always exact (R11).
pub const MAX_LISTED_MATCHES: usize = 100;

impl Error {
    pub fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Error::Invalid { field: field.into(), problem: problem.into(), options: Vec::new() }
    }

    pub fn invalid_with_options(
        field: impl Into<String>,
        problem: impl Into<String>,
        options: Vec<String>,
    ) -> Self {
        Error::Invalid { field: field.into(), problem: problem.into(), options }
    }

    pub fn not_found(resource: Resource, handle: impl Into<String>) -> Self {
        Error::NotFound { resource, handle: handle.into() }
    }

    /// A short stable code for machines: the JSON detail line and metrics use it.
    pub fn code(&self) -> &'static str {
        match self {
            Error::NotFound { .. } => "not_found",
            Error::Invalid { .. } => "invalid_argument",
            Error::UnknownFields { .. } => "unknown_field",
            Error::Forbidden { .. } => "permission_denied",
            Error::NoActor => "permission_denied",
            Error::Conflict { .. } => "conflict",
            Error::Duplicate { .. } => "duplicate",
            Error::CountMismatch { .. } => "count_mismatch",
            Error::ActionRefused { reason, .. } => reason.code(),
            Error::ChangedSincePreview { .. } => "changed_since_preview",
            Error::WrongState { .. } => "wrong_state",
            Error::RateLimited { .. } => "rate_limited",
            Error::NotInToolset { .. } => "not_in_toolset",
            Error::TurnedOff { .. } => "turned_off_by_policy",
            Error::PolicyRefused { .. } => "forbidden_by_policy",
            Error::Unauthenticated(_) => "unauthenticated",
            Error::PasskeyRequired { .. } => "passkey_required",
            Error::Unavailable { .. } => "unavailable",
            Error::Internal(_) => "internal",
        }
    }
}

/// Seconds a caller waits before retrying a call the database could not serve: a pool's wait,
/// a restart, a failover's promotion all settle within a few.
pub const UNAVAILABLE_RETRY_AFTER_SECS: u32 = 5;

/// What a pool's wait that ended without a connection says (sqlx retries a refused connect,
/// 53300 or 57P03, until the wait ends, and keeps no cause: `Services::explain` finds it).
pub(crate) const POOL_TIMED_OUT: &str = "no pooled connection was free within 5 s";

/// Why Postgres did not serve a statement, as an operator reads it: the SQLSTATE and
/// Postgres's own message, or what the driver saw (no SQLSTATE: the socket, a pool timeout).
/// What a passkey ceremony must be made for to satisfy [`Error::PasskeyRequired`]: the
/// decision's digest, and the facts it binds in words, for the person who confirms it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CeremonyFor {
    pub digest: String,
    pub facts: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbFailure {
    pub sqlstate: Option<String>,
    pub message: String,
}

impl DbFailure {
    /// Whether the database, not the statement, failed: no connection to be had or kept
    /// (class 08; 53, out of connections or memory; 57P, shutting down, starting up,
    /// terminated), a read-only server (25006: a standby, mid-failover), or no answer at all.
    /// Such a call is worth retrying; nothing of it was applied.
    pub fn unavailable(&self) -> bool {
        match self.sqlstate.as_deref() {
            None => true,
            Some(c) => {
                c.starts_with("08") || c.starts_with("53") || c.starts_with("57P") || c == "25006"
            }
        }
    }

    /// The cause in words, for the caller and the log.
    pub fn cause(&self) -> String {
        let what = match self.sqlstate.as_deref() {
            Some("53300") => "Postgres has no free connection (too many clients)",
            Some(c) if c.starts_with("53") => "Postgres is out of resources",
            Some("57P03") => "Postgres is starting up or shutting down",
            Some(c) if c.starts_with("57P") => {
                "Postgres ended the session (a restart or an operator)"
            }
            Some("25006") => "the database is read-only (a standby: a failover is under way)",
            Some(c) if c.starts_with("08") => "the connection to Postgres failed",
            Some(_) => "Postgres refused the statement",
            None => "Postgres could not be reached",
        };
        match &self.sqlstate {
            Some(code) => format!("{what}: SQLSTATE {code}: {}", self.loggable_message()),
            None => format!("{what}: {}", self.message),
        }
    }

    /// What may be logged of Postgres's message: a data exception's (class 22) quotes the
    /// value it refused, which may be an argument (R14), so only its SQLSTATE is kept.
    fn loggable_message(&self) -> &str {
        match self.sqlstate.as_deref() {
            Some(c) if c.starts_with("22") => "(a value Postgres refused; not logged)",
            _ => &self.message,
        }
    }

    /// Logs it with its fields: the SQLSTATE, and Postgres's message unless it may quote a
    /// value (see [`DbFailure::loggable_message`]).
    pub fn log(&self) {
        let code = self.sqlstate.as_deref().unwrap_or("none");
        let message = self.loggable_message();
        if self.unavailable() {
            tracing::warn!(db.sqlstate = code, db.message = %message, "database unavailable");
        } else {
            tracing::error!(db.sqlstate = code, db.message = %message, "database error");
        }
    }

    pub(crate) fn into_error(self) -> Error {
        self.log();
        if self.unavailable() {
            Error::Unavailable { cause: self.cause() }
        } else {
            Error::Internal(format!("database: {}", self.cause()))
        }
    }
}

impl From<DbFailure> for Error {
    fn from(f: DbFailure) -> Self {
        f.into_error()
    }
}

/// Why a confirmation token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionRefusal {
    Unknown,
    Used,
    /// The action ran once already (an earlier confirmation, maybe one whose answer was lost).
    AlreadyExecuted,
    Rejected,
    Expired,
    OtherConnection,
    SummaryMismatch,
    /// A person has not decided yet (`person_approves`).
    AwaitingApproval,
    /// A person denied it.
    Denied,
}

impl ActionRefusal {
    pub fn code(self) -> &'static str {
        match self {
            ActionRefusal::Unknown => "unknown_token",
            ActionRefusal::Used | ActionRefusal::AlreadyExecuted => "token_used",
            ActionRefusal::Rejected => "action_rejected",
            ActionRefusal::Expired => "token_expired",
            ActionRefusal::OtherConnection => "foreign_token",
            ActionRefusal::SummaryMismatch => "summary_mismatch",
            ActionRefusal::AwaitingApproval => "awaiting_approval",
            ActionRefusal::Denied => "action_denied",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
