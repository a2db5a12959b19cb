//! Passkeys (WebAuthn through `webauthn-rs`) and the proof of the person behind a decision.
//!
//! People register discoverable passkeys with user verification, name and remove them, and
//! sign in with one. Under a tenant's policy "decisions need a passkey", every decision that
//! widens what agents can do needs a user-verified assertion made for that decision, at most
//! [`PROOF_MAX_AGE_SECS`] old. The service that makes the decision builds its [`Decision`] from
//! its own typed input and calls [`require`], which is the check; without a proof that holds it
//! refuses with [`Error::PasskeyRequired`] naming the decision's digest. The adapter starts a
//! ceremony for that digest ([`decision_begin`]), the browser signs its challenge and posts the
//! same form again, and the adapter turns the assertion into a [`Proof`] ([`prove`]) on the
//! context. No adapter builds or predicts a decision: the service is its one source.
//! So an assertion for one approval cannot approve another, a session cookie alone decides
//! nothing, and no adapter can forget the check: it lives in the service. Narrowing decisions
//! (deny, revoke, deactivate, lower a role, switch off) never ask.
//!
//! Ceremony state stays server-side (Postgres, single use, five minutes): the browser holds a
//! random id only. A credential's signature counter is checked and advanced under its row lock.

use std::collections::BTreeMap;

use serde::Serialize;
use webauthn_rs::prelude::*;

use crate::ctx::{Channel, OpCtx, Proof};
use crate::datastore::{self as db, AuditEntry, PasskeyRow, Services, Tx};
use crate::error::{Error, Result};
use crate::handle::PasskeyHandle;
use crate::rights::Right;
use crate::secret::{self, CredentialKind};
use crate::services::console::{ConsoleSession, SignedIn};

mod held;
mod sign_in;
pub use held::*;
pub use sign_in::*;

/// How long an assertion proves a decision, and how long a ceremony may take.
pub const PROOF_MAX_AGE_SECS: i64 = 5 * 60;
const CEREMONY_TTL_SECS: i64 = 5 * 60;
/// A session this young may add a first passkey without a password (people who sign in only
/// through their organization's identity provider have none).
const FRESH_SESSION_SECS: i64 = 10 * 60;
/// Passkey sign-ins one address may start a minute.
const SIGN_INS_PER_MINUTE: i32 = 30;
/// The largest credential or assertion a browser sends, in bytes.
pub(crate) const MAX_CREDENTIAL_BYTES: usize = 16 * 1024;

/// The relying party: this console's origin. Built once at start from the public URL.
pub struct RelyingParty {
    pub(crate) webauthn: Webauthn,
}

impl RelyingParty {
    /// The relying party for a console served at `public_url`. A loopback address (a
    /// development machine) is served as `localhost`: browsers refuse an IP address as a
    /// relying party id.
    pub fn new(public_url: &str) -> Result<Self> {
        let mut origin = Url::parse(public_url)
            .map_err(|e| Error::Internal(format!("public URL {public_url}: {e}")))?;
        let loopback = matches!(origin.host(), Some(url::Host::Ipv4(ip)) if ip.is_loopback())
            || matches!(origin.host(), Some(url::Host::Ipv6(ip)) if ip.is_loopback());
        if loopback {
            origin
                .set_host(Some("localhost"))
                .map_err(|e| Error::Internal(format!("public URL {public_url}: {e}")))?;
        }
        let rp_id = origin
            .host_str()
            .ok_or_else(|| Error::Internal(format!("public URL {public_url} has no host")))?
            .to_owned();
        let webauthn = WebauthnBuilder::new(&rp_id, &origin)
            .and_then(|b| b.rp_name("Gatehouse").build())
            .map_err(|e| Error::Internal(format!("passkeys for {public_url}: {e}")))?;
        Ok(RelyingParty { webauthn })
    }
}

/// A decision that widens what agents can do, as its service sees it: a kind, what it is
/// about, and the facts it sets. Its digest is what a passkey ceremony is made for.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    kind: &'static str,
    subject: String,
    facts: BTreeMap<&'static str, String>,
    /// A person's own credentials and the platform's switch belong to no tenant; every other
    /// decision is made in one, and its digest names the tenant, so an assertion made while
    /// working in one tenant cannot decide in another.
    #[serde(skip)]
    tenantless: bool,
    /// What people call the subject, when that is not in the facts (a client's name): read,
    /// never digested.
    #[serde(skip)]
    shown_as: Option<String>,
}

impl Decision {
    fn new(kind: &'static str, subject: impl Into<String>) -> Self {
        Decision {
            kind,
            subject: subject.into(),
            facts: BTreeMap::new(),
            tenantless: false,
            shown_as: None,
        }
    }

    /// The name people read for what the decision is about.
    pub fn shown_as(mut self, name: &str) -> Self {
        self.shown_as = Some(name.to_owned());
        self
    }

    fn tenantless(mut self) -> Self {
        self.tenantless = true;
        self
    }

    fn with(mut self, fact: &'static str, value: impl Into<String>) -> Self {
        self.facts.insert(fact, value.into());
        self
    }

    /// Approving a waiting action: its handle and the content hash of what it would do.
    pub fn approve_action(handle: &str, content_hash: &str) -> Self {
        Decision::new("approve_action", handle).with("content_hash", content_hash)
    }

    /// Consenting to an OAuth client for rights beyond reading.
    pub fn consent(request: &str, client_id: &str, scope: &str) -> Self {
        Decision::new("oauth_consent", request).with("client_id", client_id).with("scope", scope)
    }

    /// Creating a connection for a creator, with these rights, toolset and client name.
    pub fn create_connection(
        name: &str,
        rights: &[&str],
        toolset: &str,
        creator: &str,
        client_name: &str,
    ) -> Self {
        let mut rights: Vec<&str> = rights.to_vec();
        rights.sort_unstable();
        rights.dedup();
        Decision::new("create_connection", name)
            .with("rights", rights.join(" "))
            .with("toolset", toolset)
            .with("creator", creator.trim().to_lowercase())
            .with("client_name", client_name)
    }

    /// Giving an existing connection more than it has: rights it lacks or a larger toolset.
    pub fn widen_connection(handle: &str, rights: &[&str], toolset: &str) -> Self {
        let mut rights: Vec<&str> = rights.to_vec();
        rights.sort_unstable();
        rights.dedup();
        Decision::new("widen_connection", handle)
            .with("rights", rights.join(" "))
            .with("toolset", toolset)
    }

    /// Creating an API token for oneself, living this many days.
    pub fn create_api_token(name: &str, days: i64) -> Self {
        Decision::new("create_api_token", name.trim()).with("days", days.to_string())
    }

    /// Changing how the tenant's people sign in or which IdP vouches for them (connecting,
    /// changing or removing its IdP, registering a confidential client).
    pub fn identity_provider(change: &str, facts: &[(&'static str, String)]) -> Self {
        let mut d = Decision::new("identity_provider", change);
        for (k, v) in facts {
            d = d.with(k, v.clone());
        }
        d
    }

    /// Giving a person a role with more rights than they hold.
    pub fn raise_role(person: &str, role: &str) -> Self {
        Decision::new("raise_role", person).with("role", role)
    }

    /// Inviting someone to the tenant with a role.
    pub fn invite_person(email: &str, role: &str) -> Self {
        Decision::new("invite_person", email).with("role", role)
    }

    /// Turning the tenant's agent access back on.
    pub fn agent_access_on() -> Self {
        Decision::new("agent_access_on", "tenant")
    }

    /// Turning the platform's kill switch off again (agents back on everywhere).
    pub fn global_switch_on() -> Self {
        Decision::new("global_switch_on", "platform").tenantless()
    }

    /// Raising a class's rate limit (or removing a lower override).
    pub fn raise_rate_limit(class: &str, per_minute: Option<i32>) -> Self {
        Decision::new("raise_rate_limit", class).with(
            "per_minute",
            per_minute.map(|n| n.to_string()).unwrap_or_else(|| "default".into()),
        )
    }

    /// Raising a budget on effects (or removing a lower one): whose (a connection's handle or
    /// `tenant`), its kind, and what it becomes (`none`: no tenant-wide budget).
    pub fn raise_budget(scope: &str, kind: &str, to: Option<(i64, i64)>) -> Self {
        let (limit, window) = match to {
            Some((limit, window)) => (limit.to_string(), window.to_string()),
            None => ("none".into(), "none".into()),
        };
        Decision::new("raise_budget", format!("{kind} for {scope}"))
            .with("limit", limit)
            .with("window_secs", window)
    }

    /// Loosening the approval policy of a scope.
    pub fn loosen_approval_policy(scope: &str, mode: &str, approver_not_creator: bool) -> Self {
        Decision::new("loosen_approval_policy", scope)
            .with("mode", mode)
            .with("approver_not_creator", approver_not_creator.to_string())
    }

    /// Putting a policy set in force that may widen what agents may do (see
    /// `policies::widens`): its version and the digest of its source.
    pub fn policy_widen(version: i32, digest: &str) -> Self {
        Decision::new("policy_widen", version.to_string()).with("digest", digest)
    }

    /// Turning the passkey policy itself off.
    pub fn passkey_policy_off() -> Self {
        Decision::new("passkey_policy_off", "tenant")
    }

    /// Sending the tenant's audit events to a URL, or a new secret for the receiver.
    pub fn audit_webhook(change: &str, url: &str) -> Self {
        Decision::new("audit_webhook", change).with("url", url.trim())
    }

    /// Removing one of one's own passkeys.
    pub fn remove_passkey(handle: &str) -> Self {
        Decision::new("remove_passkey", handle).tenantless()
    }

    /// Adding a passkey to one's own account while holding others.
    pub fn add_passkey(name: &str) -> Self {
        Decision::new("add_passkey", name).tenantless()
    }

    /// What people read, in words: "Letting Claude act for you with bookings:write",
    /// "Creating the connection “Claude”". Never a digest, a PKCE challenge or another value
    /// only a machine reads; a fact a decision lacks reads as nothing.
    pub fn label(&self) -> String {
        let fact = |k: &str| self.facts.get(k).map(String::as_str).unwrap_or_default();
        let s = &self.subject;
        match self.kind {
            "approve_action" => format!("Approving the waiting action {s}"),
            "oauth_consent" => format!(
                "Letting {} act for you with {}",
                self.shown_as.as_deref().unwrap_or(fact("client_id")),
                fact("scope")
            ),
            "create_connection" => format!("Creating the connection “{s}”"),
            "widen_connection" => format!("Giving the connection {s} more rights"),
            "create_api_token" => format!("Creating the API token “{s}”"),
            "identity_provider" => format!("Changing single sign-on ({s})"),
            "raise_role" => {
                format!("Making {} {}", self.shown_as.as_deref().unwrap_or(s), fact("role"))
            }
            "invite_person" => format!("Inviting {s} as {}", fact("role")),
            "agent_access_on" => "Turning agent access on".into(),
            "global_switch_on" => "Turning agents back on platform-wide".into(),
            "raise_rate_limit" => format!("Raising the {s} rate limit"),
            "raise_budget" => format!("Raising the budget on {s}"),
            "loosen_approval_policy" => format!("Loosening the approval policy of {s}"),
            "passkey_policy_off" => "Turning the passkey requirement off".into(),
            "policy_widen" => {
                format!("Putting policy version {s} in force (it may let agents do more)")
            }
            "audit_webhook" => format!("Changing the audit webhook ({s})"),
            "remove_passkey" => format!("Removing the passkey {s}"),
            "add_passkey" => format!("Adding the passkey “{s}”"),
            other => format!("{} {s}", other.replace('_', " ")),
        }
    }

    /// What a ceremony for this decision is made for: its digest (made in `tenant`), and its
    /// facts in words.
    pub fn asked(&self, tenant: Option<&str>) -> Box<crate::error::CeremonyFor> {
        let facts: Vec<(String, String)> = self
            .facts
            .iter()
            // A hash binds what the person reads elsewhere on the page (the action's preview,
            // the policy's text); it means nothing in words.
            .filter(|(k, v)| !v.is_empty() && !k.contains("hash") && !k.contains("digest"))
            .map(|(k, v)| (k.replace('_', " "), v.clone()))
            .collect();
        Box::new(crate::error::CeremonyFor { digest: self.digest(tenant), facts })
    }

    /// The digest a ceremony binds: SHA-256 of the decision's canonical JSON and, for a
    /// decision made in a tenant, that tenant's handle.
    pub fn digest(&self, tenant: Option<&str>) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let tenant = if self.tenantless { "" } else { tenant.unwrap_or("(no tenant)") };
        hex::encode(secret::hash_token(&format!("{tenant}|{}", String::from_utf8_lossy(&json))))
    }
}

/// The check every widening decision makes in its own transaction, in its service: under the
/// tenant's policy the context must carry a user-verified passkey assertion by its person,
/// made for exactly this decision, at most five minutes old. Without the policy the decision
/// goes ahead as before (the audit still records how the session was proven). The CLI is an
/// operator on the host and is not asked.
pub(crate) async fn require(tx: &mut Tx<'_>, ctx: &OpCtx, decision: &Decision) -> Result<()> {
    if ctx.channel() == Channel::Cli {
        return Ok(());
    }
    if !db::decisions_need_passkey(tx, ctx).await? {
        return Ok(());
    }
    check(ctx, decision)
}

/// The proof on the context holds for this decision (the policy already applies).
fn check(ctx: &OpCtx, decision: &Decision) -> Result<()> {
    let person = ctx.actor_person_id().ok_or(Error::NoActor)?;
    let now = jiff::Timestamp::now().as_second();
    let problem = match ctx.proof() {
        Some(p)
            if p.covers(
                person,
                &decision.digest(Some(ctx.tenant().handle.as_str())),
                now,
                PROOF_MAX_AGE_SECS,
            ) =>
        {
            return Ok(());
        }
        Some(p) if p.passkey_handle().is_some() => {
            "the passkey check was made for another decision or is older than five minutes; confirm again"
        }
        _ => {
            "this tenant's policy asks for your passkey on every decision that widens what agents can do; confirm with your passkey"
        }
    };
    Err(Error::PasskeyRequired {
        decision: decision.label(),
        problem: problem.into(),
        ceremony_for: Some(decision.asked(Some(ctx.tenant().handle.as_str()))),
    })
}

/// The platform kill switch's own rule: in the console it always needs the operator's
/// passkey to turn agents back on everywhere (the CLI on the host does not ask).
pub(crate) fn require_for_platform(
    ctx_proof: Option<&Proof>,
    person: i64,
    decision: &Decision,
) -> Result<()> {
    let now = jiff::Timestamp::now().as_second();
    if ctx_proof.is_some_and(|p| p.covers(person, &decision.digest(None), now, PROOF_MAX_AGE_SECS))
    {
        return Ok(());
    }
    Err(Error::PasskeyRequired {
        decision: decision.label(),
        problem: "turning agents back on everywhere needs your passkey; confirm with it (or use gatehousectl on the host)".into(),
        ceremony_for: Some(decision.asked(None)),
    })
}

// ------------------------------------------------------------------ the tenant's policy

/// Whether the tenant's widening decisions need a passkey.
pub async fn policy(ds: &Services, ctx: &OpCtx) -> Result<bool> {
    let mut tx = ds.begin().await?;
    let on = db::decisions_need_passkey(&mut tx, ctx).await?;
    tx.commit().await?;
    Ok(on)
}

/// Turns the policy on or off, audited. Off is itself a widening decision; on needs the
/// person turning it on to hold a passkey (in the console), so they are not the first one
/// locked out of their own decisions.
pub async fn policy_set(ds: &Services, ctx: &OpCtx, on: bool) -> Result<bool> {
    ctx.require(Right::TenantSwitch)?;
    if on && ctx.channel() == Channel::Console {
        let person = ctx.actor_person_id().ok_or(Error::NoActor)?;
        if ds.preauth_passkeys_of(person).await?.is_empty() {
            return Err(Error::invalid(
                "policy",
                "add a passkey for yourself first (Passkeys, top right): under this policy your own decisions need one",
            ));
        }
    }
    // Begun after the read above: a transaction never waits for a second connection.
    let mut tx = ds.begin().await?;
    if !on {
        require(&mut tx, ctx, &Decision::passkey_policy_off()).await?;
    }
    db::passkey_policy_put(&mut tx, ctx, on).await?;
    let mut entry = AuditEntry::ok("passkey_policy.set", Vec::new());
    entry.reason = Some(if on { "decisions need a passkey" } else { "off" });
    db::audit_insert(&mut tx, ctx, entry).await?;
    tx.commit().await?;
    Ok(on)
}

/// The operator's recovery: removes every passkey of a person and ends their sessions,
/// audited on the platform. They sign in again with a password (or single sign-on) and add
/// a new passkey.
pub async fn reset(ds: &Services, by: &crate::ctx::Operator, email: &str) -> Result<u64> {
    let person = ds
        .preauth_person_login(&email.trim().to_lowercase())
        .await?
        .ok_or_else(|| Error::not_found(crate::error::Resource::Person, email))?;
    let mut tx = ds.begin().await?;
    let removed = db::platform_passkeys_reset(&mut tx, person.id).await?;
    db::platform_audit_insert(
        &mut tx,
        by.channel().as_str(),
        Some(by.id()),
        "passkeys.reset",
        &format!("{email} ({removed} passkeys)"),
    )
    .await?;
    tx.commit().await?;
    Ok(removed)
}

#[cfg(test)]
mod tests;
