//! The operation context every service and datastore function takes first (STYLE 1, 12; R4, R5).
//!
//! It says who acts, in which tenant, through which channel, with which live rights, and for
//! MCP calls through which connection and client. It is constructed, never assembled: the
//! fields are private and there is one constructor per kind of actor. Only two are public:
//! [`OpCtx::for_operator`], which needs an [`Operator`] (a person the library verified to hold
//! the platform operator role), and [`OpCtx::pre_auth`], which holds no right at all. The
//! others are built by the library's own authentication steps (a connection's token, a
//! console session, an API token) and its background jobs, so an adapter cannot make a
//! context with rights it was not given. There is no "all rights" context and no ambient
//! "current user".

use crate::error::{Error, Result};
use crate::handle::{ConnectionHandle, PersonHandle, TenantHandle};
use crate::rights::{Right, RightSet, Role};

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

/// Who acts.
#[derive(Debug, Clone)]
pub enum Actor {
    /// A person: a connection's creator, a console user, an API token's owner.
    Person { id: i64, handle: PersonHandle },
    /// A platform operator acting for the platform (the CLI, the console's operator page).
    Operator { id: i64, handle: PersonHandle },
    /// A background job, named for the audit.
    Job { name: &'static str },
    /// Nobody is bound yet (a pre-authentication step): every service refuses (fail closed).
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

/// A person the library verified, for this command, to hold the platform operator role.
/// Platform actions (the global kill switch, creating tenants, granting the role) take one;
/// only `services::operators` makes them.
#[derive(Debug, Clone)]
pub struct Operator {
    id: i64,
    handle: PersonHandle,
    email: String,
    channel: Channel,
    proof: Option<Proof>,
}

impl Operator {
    pub(crate) fn verified(id: i64, handle: PersonHandle, email: String, channel: Channel) -> Self {
        Operator { id, handle, email, channel, proof: None }
    }

    /// The same operator carrying a passkey assertion (the console's way to turn agents back
    /// on everywhere).
    pub fn with_proof(mut self, proof: Proof) -> Self {
        self.proof = Some(proof);
        self
    }

    pub fn proof(&self) -> Option<&Proof> {
        self.proof.as_ref()
    }

    pub fn email(&self) -> &str {
        &self.email
    }

    pub fn channel(&self) -> Channel {
        self.channel
    }

    pub(crate) fn id(&self) -> i64 {
        self.id
    }
}

#[derive(Debug, Clone)]
pub struct OpCtx {
    actor: Actor,
    tenant: TenantRef,
    rights: RightSet,
    channel: Channel,
    connection: Option<ConnectionRef>,
    /// The API token of a REST call (its replay cache is the token's, as a connection's is).
    api_token: Option<i64>,
    request_id: String,
    /// A tool's read that came in the same statement as an MCP call's context, for the service
    /// that asked for it to take once. Opaque here: the context knows no row type (the slot is
    /// `auth::ReadAheadRow`).
    read_ahead: Option<std::sync::Arc<dyn ReadAheadSlot>>,
    /// How the person proved themself, for the policy check and the audit.
    proof: Option<Proof>,
    /// The tenant's policy set version in force when an agent's call read its context (0:
    /// none); every audit row the call writes records it.
    policy_version: i32,
}

/// How the person behind a request proved themself: the way their console session began, or
/// a passkey assertion made for one decision (`services::passkeys::prove`). Only the library
/// makes one, so an adapter cannot claim a passkey it did not verify; the audit row of every
/// decision records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    method: ProofMethod,
    person_id: i64,
    /// For a passkey: which credential, whether the authenticator verified the user, the
    /// digest of the decision the assertion was made for, and when (Unix seconds).
    passkey: Option<(String, bool, String, i64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProofMethod {
    Password,
    Passkey,
    SingleSignOn,
}

impl ProofMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            ProofMethod::Password => "password",
            ProofMethod::Passkey => "passkey",
            ProofMethod::SingleSignOn => "sso",
        }
    }

    pub(crate) fn parse(raw: &str) -> ProofMethod {
        match raw {
            "passkey" => ProofMethod::Passkey,
            "sso" => ProofMethod::SingleSignOn,
            _ => ProofMethod::Password,
        }
    }
}

impl Proof {
    /// The way a console session began (its sign-in), which proves nothing about a decision.
    pub(crate) fn session(person_id: i64, method: ProofMethod) -> Self {
        Proof { method, person_id, passkey: None }
    }

    /// A verified passkey assertion made for the decision `digest`.
    pub(crate) fn passkey(
        person_id: i64,
        passkey: String,
        user_verified: bool,
        digest: String,
        at: i64,
    ) -> Self {
        Proof {
            method: ProofMethod::Passkey,
            person_id,
            passkey: Some((passkey, user_verified, digest, at)),
        }
    }

    /// Whether this is a user-verified assertion by `person` for the decision `digest`, made
    /// no more than `max_age_secs` before `now` (Unix seconds).
    pub(crate) fn covers(&self, person: i64, digest: &str, now: i64, max_age_secs: i64) -> bool {
        match &self.passkey {
            Some((_, verified, d, at)) => {
                *verified
                    && self.person_id == person
                    && crate::secret::tokens_match(d, digest)
                    && now - at <= max_age_secs
                    && *at <= now + 5
            }
            None => false,
        }
    }

    pub fn method(&self) -> ProofMethod {
        self.method
    }

    /// The passkey's public handle, for a passkey assertion.
    pub fn passkey_handle(&self) -> Option<&str> {
        self.passkey.as_ref().map(|p| p.0.as_str())
    }

    /// What the audit row keeps: the method, and for an assertion the credential and whether
    /// the user was verified (the decision's digest stays out: the row itself says what).
    pub fn audit_json(&self) -> serde_json::Value {
        match &self.passkey {
            Some((handle, verified, _, _)) => serde_json::json!({
                "method": "passkey", "passkey": handle, "user_verified": verified,
            }),
            None => serde_json::json!({ "method": self.method.as_str(), "session": true }),
        }
    }

    /// How people read it: "with a passkey", "with a password".
    pub fn phrase(&self) -> &'static str {
        match (&self.passkey, self.method) {
            (Some(_), _) => "with a passkey",
            (None, ProofMethod::Passkey) => "in a session signed in with a passkey",
            (None, ProofMethod::Password) => "in a session signed in with a password",
            (None, ProofMethod::SingleSignOn) => "in a session signed in through single sign-on",
        }
    }
}

/// A read that came with the context, taken at most once by the service that asked for it.
pub(crate) trait ReadAheadSlot: std::any::Any + Send + Sync + std::fmt::Debug {
    /// Whether the service took what was read.
    fn used(&self) -> bool;
}

impl OpCtx {
    fn new(
        actor: Actor,
        tenant: TenantRef,
        rights: RightSet,
        channel: Channel,
        connection: Option<ConnectionRef>,
    ) -> Self {
        OpCtx {
            actor,
            tenant,
            rights,
            channel,
            connection,
            api_token: None,
            request_id: new_request_id(),
            read_ahead: None,
            proof: None,
            policy_version: 0,
        }
    }

    /// Whether a read came with this context (`None`), and whether its service used it.
    /// The same context carrying how its person proved themself (a passkey assertion from
    /// `services::passkeys::prove`, or the session's sign-in). Services that widen what agents
    /// can do check it against the tenant's policy; every audit row written with it keeps it.
    pub fn with_proof(mut self, proof: Proof) -> Self {
        self.proof = Some(proof);
        self
    }

    pub fn proof(&self) -> Option<&Proof> {
        self.proof.as_ref()
    }

    pub fn read_ahead_used(&self) -> Option<bool> {
        self.read_ahead.as_ref().map(|r| r.used())
    }

    /// The same context under the tenant's policy set `version` (read with the call's context).
    pub(crate) fn with_policy_version(mut self, version: i32) -> Self {
        self.policy_version = version;
        self
    }

    /// The policy set version in force when the call read its context (0: none).
    pub fn policy_version(&self) -> i32 {
        self.policy_version
    }

    pub(crate) fn with_read_ahead(mut self, slot: impl ReadAheadSlot) -> Self {
        self.read_ahead = Some(std::sync::Arc::new(slot));
        self
    }

    /// The read-ahead slot, if it is of type `T`.
    pub(crate) fn read_ahead<T: ReadAheadSlot>(&self) -> Option<&T> {
        let slot: &dyn std::any::Any = self.read_ahead.as_deref()?;
        slot.downcast_ref()
    }

    /// An MCP call through a connection: its creator acts, with the token's rights cut to the
    /// creator's current ones (R4).
    pub(crate) fn for_connection(
        creator: (i64, PersonHandle),
        tenant: TenantRef,
        token_rights: RightSet,
        creator_rights: RightSet,
        connection: ConnectionRef,
    ) -> Self {
        let actor = Actor::Person { id: creator.0, handle: creator.1 };
        let rights = token_rights.intersect(creator_rights);
        OpCtx::new(actor, tenant, rights, Channel::Mcp, Some(connection))
    }

    /// A console session in its tenant: the person with their current role's rights.
    pub(crate) fn for_session(person: (i64, PersonHandle), tenant: TenantRef, role: Role) -> Self {
        let actor = Actor::Person { id: person.0, handle: person.1 };
        OpCtx::new(actor, tenant, role.rights(), Channel::Console, None)
    }

    /// A REST API call by an API token: its person with their current role's rights.
    pub(crate) fn for_api_token(
        person: (i64, PersonHandle),
        tenant: TenantRef,
        role: Role,
        api_token: i64,
    ) -> Self {
        let actor = Actor::Person { id: person.0, handle: person.1 };
        let mut ctx = OpCtx::new(actor, tenant, role.rights(), Channel::Api, None);
        ctx.api_token = Some(api_token);
        ctx
    }

    /// An operator working in a tenant (through the CLI or the console): they act as the
    /// tenant's admin would, and the audit names them.
    pub fn for_operator(operator: &Operator, tenant: TenantRef) -> Self {
        let actor = Actor::Operator { id: operator.id, handle: operator.handle.clone() };
        OpCtx::new(actor, tenant, Role::Admin.rights(), operator.channel, None)
    }

    /// A background job of the library in a tenant, with only the rights its work needs.
    pub(crate) fn for_job(name: &'static str, tenant: TenantRef, rights: &[Right]) -> Self {
        OpCtx::new(Actor::Job { name }, tenant, RightSet::of(rights), Channel::System, None)
    }

    /// A step before anyone is authenticated: no actor and no right, so every service refuses.
    pub fn pre_auth(tenant: TenantRef, channel: Channel) -> Self {
        OpCtx::new(Actor::Nobody, tenant, RightSet::default(), channel, None)
    }

    /// Fails unless a real actor is bound and holds `right`. Every service calls this before
    /// it touches data.
    pub fn require(&self, right: Right) -> Result<()> {
        match self.actor {
            Actor::Nobody => Err(Error::NoActor),
            _ if self.rights.contains(right) => Ok(()),
            _ => Err(Error::Forbidden { right }),
        }
    }

    /// Whether a verified platform operator acts (the CLI's `--as`, the console's operator page).
    pub(crate) fn is_operator(&self) -> bool {
        matches!(self.actor, Actor::Operator { .. })
    }

    /// The person behind the actor, for the audit's `actor_id`.
    pub fn actor_person_id(&self) -> Option<i64> {
        match &self.actor {
            Actor::Person { id, .. } | Actor::Operator { id, .. } => Some(*id),
            _ => None,
        }
    }

    /// The acting person's public handle, if a person acts.
    pub fn actor_handle(&self) -> Option<&str> {
        match &self.actor {
            Actor::Person { handle, .. } | Actor::Operator { handle, .. } => Some(handle.as_str()),
            _ => None,
        }
    }

    pub fn tenant(&self) -> &TenantRef {
        &self.tenant
    }

    pub fn tenant_id(&self) -> i64 {
        self.tenant.id
    }

    /// The live rights of this call.
    pub fn rights(&self) -> RightSet {
        self.rights
    }

    pub fn channel(&self) -> Channel {
        self.channel
    }

    /// The connection of an MCP call; `None` for every other channel.
    pub fn connection(&self) -> Option<&ConnectionRef> {
        self.connection.as_ref()
    }

    /// The API token of a REST call; `None` for every other channel.
    pub(crate) fn api_token(&self) -> Option<i64> {
        self.api_token
    }

    pub fn request_id(&self) -> &str {
        &self.request_id
    }
}

/// A fresh request id: short, random, safe to log.
pub fn new_request_id() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    hex::encode(bytes)
}
