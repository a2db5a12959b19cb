//! Passkeys (WebAuthn through `webauthn-rs`) and the proof of the person behind a decision.
//!
//! People register discoverable passkeys with user verification, name and remove them, and
//! sign in with one. Under a tenant's policy "decisions need a passkey", every decision that
//! widens what agents can do needs a user-verified assertion made for that decision, at most
//! [`PROOF_MAX_AGE_SECS`] old: the adapter asks for a ceremony naming the [`Decision`]
//! ([`decision_begin`]), the browser signs its challenge, the adapter turns the assertion into
//! a [`Proof`] ([`prove`]) and puts it on the context; the service that makes the decision
//! builds the same `Decision` from its own inputs and calls [`require`], which is the check.
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
            "raise_role" => format!("Making {s} {}", fact("role")),
            "invite_person" => format!("Inviting {s} as {}", fact("role")),
            "agent_access_on" => "Turning agent access on".into(),
            "global_switch_on" => "Turning agents back on platform-wide".into(),
            "raise_rate_limit" => format!("Raising the {s} rate limit"),
            "raise_budget" => format!("Raising the budget on {s}"),
            "loosen_approval_policy" => format!("Loosening the approval policy of {s}"),
            "passkey_policy_off" => "Turning the passkey requirement off".into(),
            "audit_webhook" => format!("Changing the audit webhook ({s})"),
            "remove_passkey" => format!("Removing the passkey {s}"),
            "add_passkey" => format!("Adding the passkey “{s}”"),
            other => format!("{} {s}", other.replace('_', " ")),
        }
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
    Err(Error::PasskeyRequired { decision: decision.label(), problem: problem.into() })
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
    })
}

// ------------------------------------------------------------------ a person's passkeys

/// A registered passkey, as its owner sees it.
#[derive(Debug, Clone, Serialize)]
pub struct PasskeySummary {
    pub passkey: String,
    pub name: String,
    pub created_at: String,
    pub last_used_at: Option<String>,
}

fn summary(row: &PasskeyRow) -> PasskeySummary {
    let at = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%dT%H:%M:%SZ").to_string();
    PasskeySummary {
        passkey: row.handle.clone(),
        name: row.name.clone(),
        created_at: at(row.created_at),
        last_used_at: row.last_used_at.map(at),
    }
}

pub async fn list(ds: &Services, session: &ConsoleSession) -> Result<Vec<PasskeySummary>> {
    Ok(ds.preauth_passkeys_of(session.person_id()).await?.iter().map(summary).collect())
}

/// What a person shows before adding a passkey: an assertion with one they hold (when they
/// hold any), else their password, else a session begun in the last ten minutes.
pub enum StepUp<'a> {
    Passkey(Option<&'a Proof>),
    Password(&'a str),
}

fn passkey_name(raw: &str) -> Result<String> {
    crate::services::fields::label("name", raw, 60)
}

/// A ceremony's id for the browser, and its hash for the row.
fn ceremony_id() -> (String, Vec<u8>) {
    let id = secret::generate(CredentialKind::Session)["gh_ses_".len()..].to_owned();
    let hash = secret::hash_token(&id).to_vec();
    (id, hash)
}

fn webauthn_refused(what: &str, e: WebauthnError) -> Error {
    tracing::info!(error = %e, "{what} refused");
    Error::Unauthenticated(format!("The passkey {what} did not verify ({e}); try again."))
}

fn bounded<T: serde::de::DeserializeOwned>(field: &str, raw: &str) -> Result<T> {
    if raw.len() > MAX_CREDENTIAL_BYTES {
        return Err(Error::invalid(field, "the browser's answer is too large"));
    }
    serde_json::from_str(raw)
        .map_err(|e| Error::invalid(field, format!("not a WebAuthn credential: {e}")))
}

fn to_json<T: Serialize>(value: &T) -> Result<serde_json::Value> {
    serde_json::to_value(value).map_err(|e| Error::Internal(e.to_string()))
}

fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T> {
    serde_json::from_value(value).map_err(|e| Error::Internal(format!("ceremony state: {e}")))
}

/// Starts adding a passkey: checks the step-up, then returns the ceremony id and the options
/// for `navigator.credentials.create` (a discoverable credential, user verification required).
pub async fn register_begin(
    ds: &Services,
    rp: &RelyingParty,
    session: &ConsoleSession,
    name: &str,
    step_up: StepUp<'_>,
) -> Result<(String, serde_json::Value)> {
    let name = passkey_name(name)?;
    let person = ds
        .preauth_passkey_person(session.person_id())
        .await?
        .filter(|p| p.active)
        .ok_or(Error::NoActor)?;
    let existing = ds.preauth_passkeys_of(person.id).await?;
    let decision = Decision::add_passkey(&name);
    let now = jiff::Timestamp::now().as_second();
    match step_up {
        _ if !existing.is_empty() => {
            let StepUp::Passkey(Some(proof)) = step_up else {
                return Err(Error::PasskeyRequired {
                    decision: decision.label(),
                    problem: "you hold a passkey already; confirm with it to add another".into(),
                });
            };
            if !proof.covers(person.id, &decision.digest(None), now, PROOF_MAX_AGE_SECS) {
                return Err(Error::PasskeyRequired {
                    decision: decision.label(),
                    problem: "the passkey check was made for another decision; confirm again"
                        .into(),
                });
            }
        }
        StepUp::Password(password) if person.password_hash.is_some() => {
            let hash = person.password_hash.clone();
            if !ds.verify_password(password, hash).await? {
                return Err(Error::invalid(
                    "password",
                    "the password is wrong; enter the one you sign in with",
                ));
            }
        }
        _ if person.password_hash.is_some() => {
            return Err(Error::invalid(
                "password",
                "enter your password to add your first passkey",
            ));
        }
        // No password: only a session the person's own organization just started, and only
        // when every tenant they belong to is that organization's (a passkey signs in
        // everywhere the person is a member; one IdP vouches for its own tenant alone).
        _ => {
            let memberships = ds.preauth_memberships_of(person.id).await?;
            let home = session.tenant_id();
            let one_home = session.idp_id().is_some()
                && home.is_some()
                && memberships.iter().all(|m| Some(m.tenant_id) == home);
            if !one_home {
                return Err(Error::invalid(
                    "password",
                    "set a password first (an operator can: gatehousectl password-reset), then add your first passkey with it",
                ));
            }
            if session.age_secs() > FRESH_SESSION_SECS {
                return Err(Error::invalid(
                    "session",
                    "sign out and in again through your organization, then add your first passkey within ten minutes",
                ));
            }
        }
    }
    let uuid = Uuid::parse_str(&person.webauthn_id).map_err(|e| Error::Internal(e.to_string()))?;
    let exclude: Vec<CredentialID> = existing
        .iter()
        .filter_map(|r| from_json::<Passkey>(r.passkey.clone()).ok())
        .map(|p| p.cred_id().clone())
        .collect();
    let (options, state) = rp
        .webauthn
        .start_passkey_registration(uuid, &person.email, &person.name, Some(exclude))
        .map_err(|e| Error::Internal(format!("passkey registration: {e}")))?;
    let mut options = to_json(&options)?;
    // Discoverable, so the person can sign in with it without typing an email.
    options["publicKey"]["authenticatorSelection"] = serde_json::json!({
        "residentKey": "required", "requireResidentKey": true, "userVerification": "required",
    });
    let (id, hash) = ceremony_id();
    let state = serde_json::json!({ "name": name, "state": to_json(&state)? });
    ds.preauth_ceremony_create(&hash, "register", Some(person.id), None, &state, CEREMONY_TTL_SECS)
        .await?;
    Ok((id, options))
}

/// Finishes adding a passkey with the browser's credential; audited in the session's tenant.
pub async fn register_finish(
    ds: &Services,
    rp: &RelyingParty,
    session: &ConsoleSession,
    ceremony: &str,
    credential: &str,
) -> Result<PasskeySummary> {
    let credential: RegisterPublicKeyCredential = bounded("credential", credential)?;
    let row = ds
        .preauth_ceremony_take(&secret::hash_token(ceremony), "register", Some(session.person_id()))
        .await?
        .ok_or_else(|| {
            Error::invalid("ceremony", "this passkey request expired or was used; start again")
        })?;
    let mut state = row.state;
    let name = state["name"].as_str().unwrap_or("Passkey").to_owned();
    let reg: PasskeyRegistration = from_json(state["state"].take())?;
    let passkey = rp
        .webauthn
        .finish_passkey_registration(&credential, &reg)
        .map_err(|e| webauthn_refused("registration", e))?;
    let handle = PasskeyHandle::generate();
    let stored = ds
        .preauth_passkey_insert(
            session.person_id(),
            handle.as_str(),
            passkey.cred_id().as_ref(),
            &name,
            &to_json(&passkey)?,
        )
        .await?
        .ok_or_else(|| Error::invalid("credential", "this passkey is registered already"))?;
    audit_person(ds, session, "passkey.add", &stored.handle, &name).await?;
    Ok(summary(&stored))
}

/// Removes one of the person's own passkeys, audited. It needs an assertion by one of their
/// passkeys made for this removal: a stolen session cannot strip a person of their keys (one
/// who lost them all asks an operator, `gatehousectl passkey reset`).
pub async fn remove(
    ds: &Services,
    session: &ConsoleSession,
    handle: &str,
    proof: Option<&Proof>,
) -> Result<()> {
    let handle = PasskeyHandle::parse("passkey", handle)?;
    let decision = Decision::remove_passkey(handle.as_str());
    let now = jiff::Timestamp::now().as_second();
    let digest = decision.digest(None);
    if !proof.is_some_and(|p| p.covers(session.person_id(), &digest, now, PROOF_MAX_AGE_SECS)) {
        return Err(Error::PasskeyRequired {
            decision: decision.label(),
            problem: "confirm with one of your passkeys; lost them all? an operator resets them (gatehousectl passkey reset)".into(),
        });
    }
    let row = ds
        .preauth_passkey_delete(session.person_id(), handle.as_str())
        .await?
        .ok_or_else(|| Error::not_found(crate::error::Resource::Passkey, handle.as_str()))?;
    audit_person(ds, session, "passkey.remove", &row.handle, &row.name).await
}

/// A person's own credential change, in the audit of the tenant the session works in (and
/// of the platform when it works in none).
async fn audit_person(
    ds: &Services,
    session: &ConsoleSession,
    action: &str,
    handle: &str,
    name: &str,
) -> Result<()> {
    let mut tx = ds.begin().await?;
    match crate::services::console::session_ctx(session) {
        Some(ctx) => {
            let mut entry = AuditEntry::ok(action, vec![handle.to_owned()]);
            entry.reason = Some(name);
            db::audit_insert(&mut tx, &ctx, entry).await?;
        }
        None => {
            db::platform_audit_insert(
                &mut tx,
                "console",
                Some(session.person_id()),
                action,
                handle,
            )
            .await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

// ------------------------------------------------------------------ signing in

/// Starts a passkey sign-in: any discoverable credential of this console's relying party.
pub async fn sign_in_begin(
    ds: &Services,
    rp: &RelyingParty,
    source: &str,
) -> Result<(String, serde_json::Value)> {
    // Anyone may start one, so each address starts a bounded number a minute.
    let key = format!("passkey_sign_in:{}", source.chars().take(64).collect::<String>());
    let (count, _) = ds.preauth_throttle_take(&key, 60).await?;
    if count > SIGN_INS_PER_MINUTE {
        return Err(Error::Unauthenticated(
            "Too many passkey sign-ins from this address; wait a minute and try again.".into(),
        ));
    }
    let (options, state) = rp
        .webauthn
        .start_discoverable_authentication()
        .map_err(|e| Error::Internal(format!("passkey sign-in: {e}")))?;
    let mut options = to_json(&options)?;
    // A button starts it, so the browser shows its own prompt rather than autofill.
    if let Some(o) = options.as_object_mut() {
        o.remove("mediation");
    }
    let (id, hash) = ceremony_id();
    ds.preauth_ceremony_create(&hash, "sign_in", None, None, &to_json(&state)?, CEREMONY_TTL_SECS)
        .await?;
    Ok((id, options))
}

/// Finishes a passkey sign-in and starts a console session signed in with that passkey.
pub async fn sign_in_finish(
    ds: &Services,
    rp: &RelyingParty,
    ceremony: &str,
    assertion: &str,
) -> Result<SignedIn> {
    let refused = || {
        Error::Unauthenticated(
            "That passkey is not registered here; sign in with your password or another passkey."
                .into(),
        )
    };
    let assertion: PublicKeyCredential = bounded("assertion", assertion)?;
    let row = ds
        .preauth_ceremony_take(&secret::hash_token(ceremony), "sign_in", None)
        .await?
        .ok_or_else(|| Error::Unauthenticated("The sign-in expired; try again.".into()))?;
    let state: DiscoverableAuthentication = from_json(row.state)?;
    let (uuid, credential_id) =
        rp.webauthn.identify_discoverable_authentication(&assertion).map_err(|_| refused())?;
    let person = ds
        .preauth_person_by_webauthn_id(&uuid.to_string())
        .await?
        .filter(|p| p.active)
        .ok_or_else(refused)?;
    let credential_id = credential_id.to_vec();
    let mut tx = ds.begin().await?;
    let stored = db::preauth_passkey_lock(&mut tx, &credential_id)
        .await?
        .filter(|r| r.person_id == person.id)
        .ok_or_else(refused)?;
    let mut passkey: Passkey = from_json(stored.passkey.clone())?;
    let result = rp
        .webauthn
        .finish_discoverable_authentication(&assertion, state, &[DiscoverableKey::from(&passkey)])
        .map_err(|e| webauthn_refused("sign-in", e))?;
    advance(&mut tx, &stored, &mut passkey, &result).await?;
    tx.commit().await?;
    crate::services::console::session_begin(ds, person.id, ("passkey", Some(stored.id))).await
}

/// Checks what the library cannot know (user verification, a counter that went backwards
/// against the row as it is now, under its lock) and stores the advanced counter.
async fn advance(
    tx: &mut Tx<'_>,
    stored: &PasskeyRow,
    passkey: &mut Passkey,
    result: &AuthenticationResult,
) -> Result<()> {
    if !result.user_verified() {
        return Err(Error::Unauthenticated(
            "The passkey did not verify you (no PIN or biometric); use one that does.".into(),
        ));
    }
    let before = stored.passkey["cred"]["counter"].as_u64().unwrap_or(0);
    let now = u64::from(result.counter());
    if (now > 0 || before > 0) && now <= before {
        tracing::warn!(passkey = %stored.handle, before, now, "passkey counter went backwards");
        return Err(Error::Unauthenticated(
            "This passkey's signature counter went backwards, which a copied key does; it was refused. Use another passkey or ask an operator.".into(),
        ));
    }
    passkey.update_credential(result);
    db::preauth_passkey_used(tx, stored.id, &to_json(passkey)?).await
}

// ------------------------------------------------------------------ proving a decision

/// Starts a ceremony for one decision of the signed-in person: the options for
/// `navigator.credentials.get`, limited to their own passkeys.
pub async fn decision_begin(
    ds: &Services,
    rp: &RelyingParty,
    session: &ConsoleSession,
    decision: &Decision,
) -> Result<(String, serde_json::Value)> {
    let keys: Vec<Passkey> = ds
        .preauth_passkeys_of(session.person_id())
        .await?
        .into_iter()
        .filter_map(|r| from_json(r.passkey).ok())
        .collect();
    if keys.is_empty() {
        return Err(Error::PasskeyRequired {
            decision: decision.label(),
            problem: "you have no passkey yet; add one under Passkeys (your name, top right), or ask an operator".into(),
        });
    }
    let (options, state) = rp
        .webauthn
        .start_passkey_authentication(&keys)
        .map_err(|e| Error::Internal(format!("passkey check: {e}")))?;
    let (id, hash) = ceremony_id();
    let tenant =
        crate::services::console::session_ctx(session).map(|c| c.tenant().handle.to_string());
    ds.preauth_ceremony_create(
        &hash,
        "decision",
        Some(session.person_id()),
        Some(&decision.digest(tenant.as_deref())),
        &to_json(&state)?,
        CEREMONY_TTL_SECS,
    )
    .await?;
    Ok((id, to_json(&options)?))
}

/// Verifies the browser's assertion for a decision ceremony of this person and returns the
/// proof to put on the context. The ceremony is used up whatever the outcome.
pub async fn prove(
    ds: &Services,
    rp: &RelyingParty,
    session: &ConsoleSession,
    ceremony: &str,
    assertion: &str,
) -> Result<Proof> {
    let refused = |problem: &str| Error::PasskeyRequired {
        decision: "this decision".into(),
        problem: problem.into(),
    };
    let assertion: PublicKeyCredential = bounded("passkey_assertion", assertion)?;
    let row = ds
        .preauth_ceremony_take(&secret::hash_token(ceremony), "decision", Some(session.person_id()))
        .await?
        .ok_or_else(|| refused("the passkey check expired, was used already, or is another person's; confirm again"))?;
    let digest = row.decision.unwrap_or_default();
    let state: PasskeyAuthentication = from_json(row.state)?;
    let credential_id = assertion.get_credential_id().to_vec();
    let mut tx = ds.begin().await?;
    let stored = db::preauth_passkey_lock(&mut tx, &credential_id)
        .await?
        .filter(|r| r.person_id == session.person_id())
        .ok_or_else(|| refused("that passkey is not one of yours"))?;
    let mut passkey: Passkey = from_json(stored.passkey.clone())?;
    // Every way the assertion fails refuses the decision as a missing passkey would.
    let as_refusal = |e: Error| match e {
        Error::Unauthenticated(problem) => refused(&problem),
        other => other,
    };
    let result = rp
        .webauthn
        .finish_passkey_authentication(&assertion, &state)
        .map_err(|e| as_refusal(webauthn_refused("check", e)))?;
    advance(&mut tx, &stored, &mut passkey, &result).await.map_err(as_refusal)?;
    tx.commit().await?;
    Ok(Proof::passkey(
        session.person_id(),
        stored.handle,
        result.user_verified(),
        digest,
        jiff::Timestamp::now().as_second(),
    ))
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
    let mut tx = ds.begin().await?;
    if on && ctx.channel() == Channel::Console {
        let person = ctx.actor_person_id().ok_or(Error::NoActor)?;
        if ds.preauth_passkeys_of(person).await?.is_empty() {
            return Err(Error::invalid(
                "policy",
                "add a passkey for yourself first (Passkeys, top right): under this policy your own decisions need one",
            ));
        }
    }
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
mod tests {
    use super::Decision;

    /// What a refused person reads names the decision in words, never a value only a machine
    /// reads (the consent's PKCE challenge, a content hash, a digest).
    #[test]
    fn every_decision_reads_in_words() {
        let challenge = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";
        let cases = [
            (
                Decision::consent(challenge, "ghc_1", "bookings:write").shown_as("Claude Code"),
                "Letting Claude Code act for you with bookings:write",
            ),
            (
                Decision::approve_action("pac_1", "hash-of-content"),
                "Approving the waiting action pac_1",
            ),
            (
                Decision::create_connection("Claude", &["bookings:read"], "full", "a@x", "cli"),
                "Creating the connection “Claude”",
            ),
            (Decision::create_api_token("ci", 30), "Creating the API token “ci”"),
            (Decision::identity_provider("connect", &[]), "Changing single sign-on (connect)"),
            (Decision::raise_role("per_1", "admin"), "Making per_1 admin"),
            (Decision::agent_access_on(), "Turning agent access on"),
            (Decision::global_switch_on(), "Turning agents back on platform-wide"),
            (Decision::raise_rate_limit("write", Some(60)), "Raising the write rate limit"),
            (
                Decision::raise_budget("tenant", "email", Some((10, 3600))),
                "Raising the budget on email for tenant",
            ),
            (
                Decision::loosen_approval_policy("tenant", "off", false),
                "Loosening the approval policy of tenant",
            ),
            (Decision::passkey_policy_off(), "Turning the passkey requirement off"),
            (
                Decision::audit_webhook("set", "https://siem.example"),
                "Changing the audit webhook (set)",
            ),
            (Decision::remove_passkey("pky_1"), "Removing the passkey pky_1"),
            (Decision::add_passkey("laptop"), "Adding the passkey “laptop”"),
        ];
        for (decision, words) in &cases {
            let label = decision.label();
            assert_eq!(label, *words);
            assert!(!label.contains(challenge) && !label.contains("hash-of-content"), "{label}");
            assert!(
                !label.contains('_')
                    || label.contains("pac_1")
                    || label.contains("per_1")
                    || label.contains("pky_1"),
                "{label}"
            );
        }
    }

    #[test]
    fn an_unknown_passkey_is_called_a_passkey() {
        let e = crate::Error::not_found(crate::error::Resource::Passkey, "pky_unknown");
        assert_eq!(e.to_string(), "no passkey pky_unknown among your passkeys");
    }

    /// A decision's digest names its tenant (an assertion made while working in one tenant
    /// decides nothing in another) and every fact it sets; a person's own credentials and
    /// the platform's switch belong to no tenant.
    #[test]
    fn a_digest_binds_the_tenant_and_every_fact() {
        let on = Decision::agent_access_on();
        assert_ne!(on.digest(Some("ten_a")), on.digest(Some("ten_b")));
        assert_ne!(on.digest(Some("ten_a")), Decision::passkey_policy_off().digest(Some("ten_a")));
        let a = Decision::approve_action("pac_1", "hash-1");
        assert_ne!(
            a.digest(Some("t")),
            Decision::approve_action("pac_2", "hash-1").digest(Some("t"))
        );
        assert_ne!(
            a.digest(Some("t")),
            Decision::approve_action("pac_1", "hash-2").digest(Some("t"))
        );
        let c = |creator: &str, client: &str| {
            Decision::create_connection("n", &["bookings:read"], "full", creator, client)
                .digest(Some("t"))
        };
        assert_ne!(c("a@x", "console"), c("b@x", "console"));
        assert_ne!(c("a@x", "console"), c("a@x", "other"));
        assert_eq!(
            Decision::create_connection("n", &["b", "a", "a"], "full", "A@X ", "c").digest(None),
            Decision::create_connection("n", &["a", "b"], "full", "a@x", "c").digest(None),
            "the same decision however its rights are listed"
        );
        let g = Decision::global_switch_on();
        assert_eq!(g.digest(Some("ten_a")), g.digest(None));
        let r = Decision::remove_passkey("pky_1");
        assert_eq!(r.digest(Some("ten_a")), r.digest(Some("ten_b")));
    }
}
