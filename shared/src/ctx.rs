//! The operation context every service and datastore function takes first (STYLE 1, R5).
//!
//! It says who acts (a person, the system, or nobody), in which tenant, through which
//! channel, with which live rights, and for MCP calls through which connection and client.
//! There is no ambient "current user": a context built for an MCP request carries the
//! connection's creator as actor and the live rights computed for this call, nothing else.

use crate::error::{Error, Result};
use crate::handle::{ConnectionHandle, PersonHandle, TenantHandle};
use crate::rights::{Right, RightSet};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Mcp,
    Api,
    Console,
    Cli,
    System,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Mcp => "mcp",
            Channel::Api => "api",
            Channel::Console => "console",
            Channel::Cli => "cli",
            Channel::System => "system",
        }
    }
}

#[derive(Debug, Clone)]
pub enum Actor {
    Person {
        id: i64,
        handle: PersonHandle,
    },
    /// A background job or operator command, named for the audit.
    System {
        name: &'static str,
    },
    /// Nobody is bound: every service refuses (fail closed).
    Nobody,
}

#[derive(Debug, Clone)]
pub struct TenantRef {
    pub id: i64,
    pub handle: TenantHandle,
    pub slug: String,
    pub zone: jiff::tz::TimeZone,
    pub zone_name: String,
    pub currency: String,
}

#[derive(Debug, Clone)]
pub struct ConnectionRef {
    pub id: i64,
    pub handle: ConnectionHandle,
    pub name: String,
    pub client_name: String,
    /// The toolset the connection was given: `full`, `read_only` or `small` (R21).
    pub toolset: String,
}

#[derive(Debug, Clone)]
pub struct OpCtx {
    pub actor: Actor,
    pub tenant: TenantRef,
    pub rights: RightSet,
    pub channel: Channel,
    pub connection: Option<ConnectionRef>,
    pub request_id: String,
}

impl OpCtx {
    /// Fails unless a real actor is bound and holds `right`. Every service calls this before
    /// it touches data.
    pub fn require(&self, right: Right) -> Result<()> {
        match self.actor {
            Actor::Nobody => Err(Error::NoActor),
            _ if self.rights.contains(right) => Ok(()),
            _ => Err(Error::Forbidden { right }),
        }
    }

    pub fn actor_person_id(&self) -> Option<i64> {
        match &self.actor {
            Actor::Person { id, .. } => Some(*id),
            _ => None,
        }
    }

    pub fn tenant_id(&self) -> i64 {
        self.tenant.id
    }
}

/// A fresh request id: short, random, safe to log.
pub fn new_request_id() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    hex::encode(bytes)
}
