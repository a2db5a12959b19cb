//! Console sign-in and sessions. Passwords are argon2id; five failed sign-ins for an email
//! within fifteen minutes block further attempts for that email until the window passes.
//! A session is a `gh_ses_…` secret in an HttpOnly cookie, stored hashed, carrying a CSRF token
//! that every console form must echo.

use crate::ctx::{OpCtx, Proof, ProofMethod, TenantRef};
use crate::datastore::Services;
use crate::datastore::SessionRow;
pub use crate::datastore::{MembershipListRow, OutboxListRow, PersonListRow};
use crate::error::{Error, Result};
use crate::handle::{PersonHandle, TenantHandle};
use crate::rights::Right;
use crate::rights::{RightSet, Role};
use crate::secret::{self, CredentialKind};
use crate::time;

pub const SESSION_TTL_SECS: i64 = 12 * 3600;
/// Sign-in attempts allowed per account and source address in a window, and per account from
/// every source together (the ceiling): a stranger who guesses from one address locks only
/// that address out, never the person from theirs, unless they spread over many.
pub const MAX_ATTEMPTS_PER_SOURCE: i32 = 5;
pub const MAX_ATTEMPTS_PER_ACCOUNT: i32 = 50;
pub const ATTEMPT_WINDOW_SECS: i64 = 15 * 60;
/// Longest email and password a sign-in reads; longer ones are refused before any work.
pub const MAX_EMAIL_LEN: usize = 254;
pub const MAX_PASSWORD_LEN: usize = 1024;

pub struct SignedIn {
    /// The session secret for the cookie; shown to nobody else.
    pub token: String,
}

/// Signs a person in from `source` (their address, as the adapter saw it). Every attempt is
/// counted before the password is checked; past the limits nothing is checked at all.
pub async fn sign_in(ds: &Services, email: &str, password: &str, source: &str) -> Result<SignedIn> {
    let email = email.trim().to_lowercase();
    let wrong = || Error::Unauthenticated("The email or the password is wrong.".into());
    if email.is_empty() || email.len() > MAX_EMAIL_LEN || password.len() > MAX_PASSWORD_LEN {
        return Err(wrong());
    }
    let pair = format!("pair:{email}|{}", source.chars().take(64).collect::<String>());
    let account = format!("account:{email}");
    let (from_here, everywhere) = ds
        .preauth_login_attempt_take(&pair, &account, ATTEMPT_WINDOW_SECS, MAX_ATTEMPTS_PER_SOURCE)
        .await?;
    if from_here > MAX_ATTEMPTS_PER_SOURCE || everywhere > MAX_ATTEMPTS_PER_ACCOUNT {
        return Err(Error::Unauthenticated(
            "Too many sign-in attempts for this email; wait 15 minutes and try again.".into(),
        ));
    }
    let person = ds.preauth_person_login(&email).await?;
    let hash = match &person {
        Some(p) if p.active => p.password_hash.clone(),
        _ => None,
    };
    // Same work whether or not the email exists, so timing does not tell.
    let ok = ds.verify_password(password, hash).await?;
    let Some(person) = person.filter(|_| ok) else {
        return Err(wrong());
    };
    ds.preauth_login_attempts_clear(&pair).await?;
    session_begin(ds, person.id, ("password", None)).await
}

/// Starts a console session for a person the caller verified (by password or passkey), in
/// their one tenant when they have exactly one.
pub(crate) async fn session_begin(
    ds: &Services,
    person_id: i64,
    signed_in_with: (&str, Option<i64>),
) -> Result<SignedIn> {
    let memberships = ds.preauth_memberships_of(person_id).await?;
    // A tenant that requires single sign-on is never entered without it; a person whose
    // every tenant requires it is told where to sign in instead.
    if !memberships.is_empty() && memberships.iter().all(|m| m.sso_required) {
        let names: Vec<&str> = memberships.iter().map(|m| m.name.as_str()).collect();
        return Err(Error::Unauthenticated(format!(
            "{} requires single sign-on: use \"Continue with single sign-on\" below with your work email.",
            names.join(", ")
        )));
    }
    let tenant =
        (memberships.len() == 1 && !memberships[0].sso_required).then(|| memberships[0].tenant_id);
    let token = secret::generate(CredentialKind::Session);
    let csrf = secret::generate(CredentialKind::Session)["gh_ses_".len()..].to_owned();
    ds.preauth_session_create(
        &secret::hash_token(&token),
        person_id,
        tenant,
        &csrf,
        SESSION_TTL_SECS,
        signed_in_with,
    )
    .await?;
    Ok(SignedIn { token })
}

/// The operation context of a session in its tenant: the person as actor, their current role's
/// rights, channel `console`. `None` until a tenant is picked or when the membership ended.
pub fn session_ctx(s: &ConsoleSession) -> Option<OpCtx> {
    let s = s.row();
    let role: Role = s.role.as_deref()?.parse().ok()?;
    if !(s.person_active && s.membership_active == Some(true)) {
        return None;
    }
    // A tenant that requires single sign-on takes only the sessions its IdP started, and a
    // session an IdP started works only in that IdP's tenant: a tenant's IdP vouches for
    // nobody elsewhere.
    if s.tenant_sso_required == Some(true) && s.idp_id != s.tenant_idp_id {
        return None;
    }
    if s.idp_id.is_some() && s.idp_id != s.tenant_idp_id {
        return None;
    }
    let zone_name = s.tenant_zone.clone()?;
    let tenant = TenantRef {
        id: s.tenant_id?,
        handle: TenantHandle::from_db(s.tenant_handle.clone()?),
        slug: s.tenant_slug.clone()?,
        zone: time::zone("zone", &zone_name).unwrap_or(jiff::tz::TimeZone::UTC),
        zone_name,
        currency: s.tenant_currency.clone()?,
    };
    let proof = Proof::session(s.person_id, ProofMethod::parse(&s.signed_in_with));
    Some(
        OpCtx::for_session(
            (s.person_id, PersonHandle::from_db(s.person_handle.clone())),
            tenant,
            role,
        )
        .with_proof(proof),
    )
}

/// Rights a person holds in the session's tenant.
pub fn session_rights(s: &ConsoleSession) -> RightSet {
    session_ctx(s).map(|c| c.rights()).unwrap_or_default()
}

/// A console session as this library read it from Postgres for a cookie. Only [`session`]
/// makes one, so a session's person, tenant and role are never an adapter's word.
#[derive(Debug, Clone)]
pub struct ConsoleSession {
    row: SessionRow,
}

impl ConsoleSession {
    pub fn csrf_token(&self) -> &str {
        &self.row.csrf_token
    }

    pub fn email(&self) -> &str {
        &self.row.email
    }

    pub fn name(&self) -> &str {
        &self.row.name
    }

    /// Whether the session's tenant requires single sign-on and this session did not come
    /// from its IdP (a password session from before the requirement, or another tenant's
    /// IdP): such a session is shown why it cannot work there.
    pub fn shut_out_by_sso(&self) -> bool {
        self.row.tenant_id.is_some()
            && self.row.tenant_sso_required == Some(true)
            && self.row.idp_id != self.row.tenant_idp_id
    }

    /// The tenant the session works in, once one is picked.
    pub fn tenant_name(&self) -> Option<&str> {
        self.row.tenant_name.as_deref()
    }

    /// Whether the platform's kill switch is on (every agent refused everywhere).
    pub fn global_kill(&self) -> bool {
        self.row.global_kill
    }

    /// Since when (UTC) the tenant's SIEM webhook fails, with its last error, while it does.
    pub fn webhook_failing(&self) -> Option<(jiff::Timestamp, &str)> {
        let since = crate::datastore::to_ts(self.row.webhook_failing_since?);
        Some((since, self.row.webhook_last_error.as_deref().unwrap_or("no answer")))
    }

    pub fn tenant_agent_access(&self) -> Option<bool> {
        self.row.tenant_agent_access
    }

    /// Whether the session's tenant asks for a passkey on widening decisions (for showing
    /// the page; the services check the policy again in the decision's transaction).
    pub fn passkey_policy(&self) -> bool {
        self.row.tenant_passkey_policy == Some(true)
    }

    /// Whether the person held the operator role when the session was read (for showing the
    /// page; the operator services check again).
    pub fn is_operator(&self) -> bool {
        self.row.is_operator && self.row.idp_id.is_none()
    }

    /// The person signed in.
    pub fn person_id(&self) -> i64 {
        self.row.person_id
    }

    /// The tenant the session works in, if one is picked.
    pub fn tenant_id(&self) -> Option<i64> {
        self.row.tenant_id
    }

    /// The identity provider that started the session, if one did.
    pub fn idp_id(&self) -> Option<i64> {
        self.row.idp_id
    }

    /// How the session began.
    pub fn signed_in_with(&self) -> ProofMethod {
        ProofMethod::parse(&self.row.signed_in_with)
    }

    /// Seconds since the session began.
    pub fn age_secs(&self) -> i64 {
        (chrono::Utc::now() - self.row.created_at).num_seconds()
    }

    pub(crate) fn row(&self) -> &SessionRow {
        &self.row
    }
}

/// The console session a cookie value names: a `gh_ses_…` secret of a person who is still
/// active. `None` sends the browser to sign in.
pub async fn session(svc: &Services, cookie: &str) -> Result<Option<ConsoleSession>> {
    if CredentialKind::of(cookie) != Some(CredentialKind::Session) {
        return Ok(None);
    }
    let row = svc.entry_session_get(&secret::hash_token(cookie)).await?;
    Ok(row.filter(|row| row.person_active).map(|row| ConsoleSession { row }))
}

/// Ends the session a cookie value names.
pub async fn sign_out(svc: &Services, cookie: &str) -> Result<()> {
    svc.preauth_session_delete(&secret::hash_token(cookie)).await
}

/// The tenants the session's person is an active member of, to pick one.
pub async fn tenants_of(svc: &Services, s: &ConsoleSession) -> Result<Vec<MembershipListRow>> {
    svc.preauth_memberships_of(s.row.person_id).await
}

/// Moves the session into a tenant the person is a member of; any other is refused.
pub async fn pick_tenant(svc: &Services, s: &ConsoleSession, tenant_id: i64) -> Result<()> {
    let s = s.row();
    let memberships = svc.preauth_memberships_of(s.person_id).await?;
    let Some(m) = memberships.iter().find(|m| m.tenant_id == tenant_id) else {
        return Err(Error::invalid("tenant", "you are not a member of that tenant"));
    };
    // Asked once, and only when it matters: whether this session's IdP is that tenant's.
    let from_its_idp = (s.idp_id.is_some() || m.sso_required)
        && svc.preauth_session_from_idp_of(s.id, tenant_id).await?;
    if s.idp_id.is_some() && !from_its_idp {
        return Err(Error::invalid(
            "tenant",
            format!(
                "this session began at another tenant's identity provider; sign out and sign in again to work in {}",
                m.name
            ),
        ));
    }
    if m.sso_required && !from_its_idp {
        return Err(Error::Unauthenticated(format!(
            "{} requires single sign-on: sign out, then choose \"Sign in with single sign-on\" and give your work email or {}.",
            m.name, m.slug
        )));
    }
    svc.preauth_session_set_tenant(s.id, tenant_id).await
}

/// One of the tenant's people by email (any case), and how many active connections they
/// created: what a confirmation about them says. Not found when they are no member.
pub async fn person(svc: &Services, ctx: &OpCtx, email: &str) -> Result<(PersonListRow, i64)> {
    ctx.require(Right::PeopleManage)?;
    let email = email.trim();
    if email.is_empty() || email.len() > MAX_EMAIL_LEN {
        return Err(Error::not_found(
            crate::error::Resource::Person,
            email.chars().take(60).collect::<String>(),
        ));
    }
    svc.person_in_tenant(ctx, email)
        .await?
        .ok_or_else(|| Error::not_found(crate::error::Resource::Person, email))
}

/// What an admin looks for among the tenant's people; every field as it came from outside.
#[derive(Debug, Default, Clone)]
pub struct PeopleFilter {
    /// Part of a name or an email address.
    pub q: Option<String>,
    /// `admin`, `dispatcher` or `viewer`.
    pub role: Option<String>,
    /// `active` or `deactivated`.
    pub status: Option<String>,
    /// The `next` of a previous page.
    pub cursor: Option<String>,
}

/// One page of people and where the next one starts.
pub struct PeoplePage {
    pub rows: Vec<PersonListRow>,
    pub next: Option<String>,
}

/// A page of the tenant's people, searched and filtered in SQL.
pub async fn people_page(
    svc: &Services,
    ctx: &OpCtx,
    filter: &PeopleFilter,
    limit: i64,
) -> Result<PeoplePage> {
    ctx.require(Right::PeopleManage)?;
    let given = |v: &Option<String>| {
        v.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned)
    };
    let q = given(&filter.q);
    if q.as_ref().is_some_and(|q| q.chars().count() > 200) {
        return Err(Error::invalid("q", "search with at most 200 characters"));
    }
    let role = given(&filter.role).map(|r| r.parse::<Role>()).transpose()?;
    let active = match given(&filter.status).as_deref() {
        None => None,
        Some("active") => Some(true),
        Some("deactivated") => Some(false),
        Some(_) => return Err(Error::invalid("status", "status is active or deactivated")),
    };
    let after = given(&filter.cursor).map(|c| super::decode_cursor(&c, 2)).transpose()?;
    let query = crate::datastore::PeopleQuery {
        text: q.as_deref(),
        role: role.map(Role::as_str),
        active,
        after: after.as_ref().map(|a| (a[0].as_str(), a[1].as_str())),
    };
    let mut rows = svc.people_search(ctx, &query, limit + 1).await?;
    let next = if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        rows.last().map(|r| super::encode_cursor(&[&r.name, &r.handle]))
    } else {
        None
    };
    Ok(PeoplePage { rows, next })
}

/// What an admin looks for among the tenant's messages; every field as it came from outside.
#[derive(Debug, Default, Clone)]
pub struct MessagesFilter {
    /// Part of the recipient or the subject.
    pub q: Option<String>,
    /// `queued`, `sent` or `failed`.
    pub status: Option<String>,
    /// `email` or `page`.
    pub channel: Option<String>,
    pub cursor: Option<String>,
}

/// One page of messages and where the next one starts.
pub struct MessagesPage {
    pub rows: Vec<OutboxListRow>,
    pub next: Option<String>,
}

/// What the tenant sent (the outbox), newest first, searched and filtered in SQL, for those
/// who read the audit.
pub async fn messages_page(
    svc: &Services,
    ctx: &OpCtx,
    filter: &MessagesFilter,
    limit: i64,
) -> Result<MessagesPage> {
    ctx.require(Right::AuditRead)?;
    let text = super::filter_search(&filter.q)?;
    let status =
        super::filter_one_of("status", "status", &filter.status, &["queued", "sent", "failed"])?;
    let channel = super::filter_one_of("channel", "channel", &filter.channel, &["email", "page"])?;
    let before_id = match super::filter_value(&filter.cursor) {
        None => None,
        Some(c) => Some(super::decode_cursor(&c, 1)?[0].parse::<i64>().map_err(|_| {
            Error::invalid(
                "cursor",
                "not a cursor from a previous page; repeat the search without it",
            )
        })?),
    };
    let query = crate::datastore::OutboxQuery {
        text: text.as_deref(),
        status: status.as_deref(),
        channel: channel.as_deref(),
        before_id,
    };
    let mut rows = svc.outbox_search(ctx, &query, limit + 1).await?;
    let next = if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        rows.last().map(|r| super::encode_cursor(&[&r.id.to_string()]))
    } else {
        None
    };
    Ok(MessagesPage { rows, next })
}

/// Seals a new secret to be shown once on the page a create redirects to (post/redirect/get):
/// bound to this session and to `what` (`connection:con_…`), so it opens nowhere else. Sealed
/// with the installation's secret keys, or without them (a development stack) with a key this
/// process made at start, which other replicas cannot open.
pub fn once_seal(
    svc: &Services,
    session: &ConsoleSession,
    what: &str,
    secret: &str,
) -> Result<String> {
    let purpose = once_purpose(session, what);
    once_keys(svc).seal(&purpose, secret.as_bytes()).map_err(Error::Internal)
}

/// Opens what [`once_seal`] sealed for this session and `what`; `None` for anything else.
pub fn once_open(
    svc: &Services,
    session: &ConsoleSession,
    what: &str,
    sealed: &str,
) -> Option<String> {
    let bytes = once_keys(svc).open(&once_purpose(session, what), sealed)?;
    String::from_utf8(bytes).ok()
}

fn once_purpose(session: &ConsoleSession, what: &str) -> String {
    format!("console-once\0{}\0{what}", session.row.id)
}

fn once_keys(svc: &Services) -> &crate::seal::SealKeys {
    static PROCESS: std::sync::OnceLock<crate::seal::SealKeys> = std::sync::OnceLock::new();
    svc.secret_keys().unwrap_or_else(|| {
        PROCESS.get_or_init(|| {
            crate::seal::SealKeys::parse(&crate::seal::SealKeys::generate("process"))
                .expect("a generated key parses")
        })
    })
}
