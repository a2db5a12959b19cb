//! One error type for every adapter (STYLE 3).
//!
//! Services return [`Error`]; the MCP tool layer, the REST API and the CLI each map it to their
//! own shape in one place. Variants carry what the caller needs to fix the next call (R15):
//! the field, the allowed values, the resource to look up instead. Internal detail (a database
//! message) stays in [`Error::Internal`] and is logged, never shown.

use crate::rights::Right;

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
}

impl Resource {
    pub fn noun(self) -> &'static str {
        match self {
            Resource::Tenant => "tenant",
            Resource::Person => "person",
            Resource::Customer => "customer",
            Resource::Technician => "technician",
            Resource::Service => "service",
            Resource::Booking => "booking",
            Resource::Connection => "connection",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such object in the caller's tenant (another tenant's handle lands here too, R3).
    #[error("no {} {handle} in this tenant", resource.noun())]
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

    /// The object changed since the caller read it (R10).
    #[error("{} {handle} changed since version {expected}", resource.noun())]
    Conflict { resource: Resource, handle: String, expected: String, current: String },

    /// A credential is missing, unknown, expired, revoked, or of the wrong kind.
    #[error("{0}")]
    Unauthenticated(String),

    /// An internal failure; the message is for logs only.
    #[error("internal error")]
    Internal(String),
}

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
            Error::Unauthenticated(_) => "unauthenticated",
            Error::Internal(_) => "internal",
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Error::Internal(format!("database: {e}"))
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        Error::Internal(format!("migration: {e}"))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
