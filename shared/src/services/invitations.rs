//! Invitations: a tenant admin invites someone by email with a role, and they join by the
//! link in that email, in one of four ways: setting a password (a new account), making a
//! passkey (a new account without a password), signing in to the account they already have,
//! or through the tenant's single sign-on. The link's token is stored only as its SHA-256,
//! works once, for [`DAYS`] days, and an admin can revoke it; each step is audited.
//!
//! Inviting gives rights, so under the tenant's passkey policy it is a decision
//! ([`Decision::invite_person`]). Joining never gives more than the role the admin chose, and
//! a tenant that requires single sign-on is joined through it alone.

use serde::Serialize;
use webauthn_rs::prelude::{PasskeyRegistration, RegisterPublicKeyCredential, Uuid};

use crate::ctx::OpCtx;
use crate::datastore::{
    self as db, AuditEntry, InvitationRow, NewInvitation, NewMessage, Services,
};
use crate::error::{Error, Resource, Result};
use crate::handle::{InvitationHandle, PasskeyHandle, PersonHandle};
use crate::rights::{Right, Role};
use crate::secret::{self, CredentialKind};
use crate::services::console::{self, ConsoleSession, SignedIn};
use crate::services::passkeys::{self, Decision, RelyingParty};
use crate::services::{admin, fields};

/// How long an invitation's link works.
pub const DAYS: i64 = 7;

/// How long a passkey made on the acceptance page may take.
const CEREMONY_TTL_SECS: i64 = 300;

/// What an admin asks: whom (an email and a name) and with which role.
pub struct Invite<'a> {
    pub email: &'a str,
    pub name: &'a str,
    pub role: Role,
}

/// A sent invitation. The link is for the admin to pass on by hand when the email does not
/// arrive; it is shown once, and kept only in the invitation's email in the outbox until it is
/// used or revoked.
#[derive(Serialize)]
pub struct Invited {
    pub invitation: String,
    pub email: String,
    pub role: String,
    pub expires_at: String,
    pub link: String,
}

impl std::fmt::Debug for Invited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invited")
            .field("invitation", &self.invitation)
            .field("role", &self.role)
            .field("link", &"(secret)")
            .finish()
    }
}

/// An open invitation as the People page lists it.
#[derive(Debug, Serialize)]
pub struct InvitationSummary {
    pub invitation: String,
    pub email: String,
    pub name: String,
    pub role: String,
    pub invited_by: Option<String>,
    pub created_at: String,
    pub expires_at: String,
    pub expired: bool,
}

fn utc_text(t: chrono::DateTime<chrono::Utc>) -> String {
    db::to_ts(t).strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn summary(row: InvitationRow) -> InvitationSummary {
    InvitationSummary {
        expired: row.expires_at <= chrono::Utc::now(),
        invitation: row.handle,
        email: row.email,
        name: row.name,
        role: row.role,
        invited_by: row.invited_by,
        created_at: utc_text(row.created_at),
        expires_at: utc_text(row.expires_at),
    }
}

/// The link an invitation's email carries.
pub fn link(public_url: &str, token: &str) -> String {
    format!("{}/invitations/{token}", public_url.trim_end_matches('/'))
}

/// The decision an invitation is: letting someone new in with a role's rights.
pub(crate) fn invite_decision(email: &str, role: Role) -> Decision {
    Decision::invite_person(&email.trim().to_lowercase(), role.as_str())
}

/// Invites `invite.email` to the context's tenant: one open invitation per address, never to
/// an active member, the email written to the outbox in the same transaction.
pub async fn invite(
    ds: &Services,
    ctx: &OpCtx,
    invite: Invite<'_>,
    public_url: &str,
) -> Result<Invited> {
    ctx.require(Right::PeopleManage)?;
    let email = invite.email.trim().to_lowercase();
    admin::check_person(&email, invite.name, None)?;
    let name = invite.name.trim();
    if let Some(p) = ds.platform_person_by_email(&email).await?
        && ds.membership_get(ctx, p.id).await?.is_some_and(|m| m.active)
    {
        return Err(Error::WrongState {
            message: format!(
                "{email} is already a member of this tenant; change their role on People instead"
            ),
            use_instead: None,
        });
    }
    // A tenant entered through single sign-on alone can be joined only through it: an address
    // its identity provider does not vouch for could never accept.
    if let Some(idp) = ds.idp_get(ctx).await?.filter(|i| i.sso_required) {
        let domain = email.rsplit_once('@').map(|(_, d)| d).unwrap_or_default();
        if !idp.email_domains.iter().any(|d| d == domain) {
            return Err(Error::invalid(
                "email",
                format!(
                    "this tenant is entered through single sign-on only, and its identity provider does not sign in addresses of {domain}"
                ),
            ));
        }
    }
    let handle = InvitationHandle::generate();
    let token = secret::generate(CredentialKind::Invitation);
    let link = link(public_url, &token);
    let inviter = ctx.actor_person_id();
    let mut tx = ds.begin().await?;
    let tenant = db::entry_tenant_by_id(&mut tx, ctx.tenant_id()).await?;
    passkeys::require(&mut tx, ctx, &invite_decision(&email, invite.role)).await?;
    let new = NewInvitation {
        handle: handle.as_str(),
        email: &email,
        name,
        role: invite.role.as_str(),
        token_hash: &secret::hash_token(&token),
        invited_by: inviter,
        days: DAYS,
    };
    let Some(expires_at) = db::invitation_insert(&mut tx, ctx, &new).await? else {
        return Err(Error::WrongState {
            message: format!(
                "{email} has an invitation waiting already; revoke it on People to send a new one"
            ),
            use_instead: None,
        });
    };
    let body = format!(
        "You are invited to {} on Gatehouse as {}.\n\nJoin within {DAYS} days: {link}\n\n\
         You can set a password, make a passkey, use the Gatehouse account you have, or sign in \
         through your organization's single sign-on if {} uses it. If you did not expect this, \
         ignore this email.",
        tenant.name,
        invite.role.as_str(),
        tenant.name,
    );
    db::outbox_insert(
        &mut tx,
        ctx,
        NewMessage {
            pending_action_id: None,
            channel: "email",
            recipient: &email,
            subject: &format!("You are invited to {} on Gatehouse", tenant.name),
            body: &body,
            idempotency_key: &format!("invitation:{handle}"),
        },
    )
    .await?;
    let mut entry = AuditEntry::ok("person.invite", vec![handle.to_string()]);
    entry.change = Some(db::change("role", None::<&str>, invite.role.as_str()));
    db::audit_insert(&mut tx, ctx, entry).await?;
    tx.commit().await?;
    Ok(Invited {
        invitation: handle.to_string(),
        email,
        role: invite.role.as_str().into(),
        expires_at: utc_text(expires_at),
        link,
    })
}

/// The tenant's invitations still waiting (expired ones say so), newest first.
pub async fn list_open(ds: &Services, ctx: &OpCtx) -> Result<Vec<InvitationSummary>> {
    ctx.require(Right::PeopleManage)?;
    Ok(ds.invitation_list_open(ctx, 200).await?.into_iter().map(summary).collect())
}

/// One waiting invitation of the tenant, by a handle as it came from outside.
pub async fn get_open(ds: &Services, ctx: &OpCtx, raw: &str) -> Result<InvitationSummary> {
    ctx.require(Right::PeopleManage)?;
    let not_found =
        || Error::not_found(Resource::Invitation, raw.chars().take(40).collect::<String>());
    let handle = InvitationHandle::parse("invitation", raw.trim()).map_err(|_| not_found())?;
    ds.invitation_get_open(ctx, handle.as_str()).await?.map(summary).ok_or_else(not_found)
}

/// Revokes a waiting invitation: its link stops working. Returns the address it was for.
pub async fn revoke(ds: &Services, ctx: &OpCtx, raw: &str) -> Result<String> {
    ctx.require(Right::PeopleManage)?;
    let not_found =
        || Error::not_found(Resource::Invitation, raw.chars().take(40).collect::<String>());
    let handle = InvitationHandle::parse("invitation", raw.trim()).map_err(|_| not_found())?;
    let mut tx = ds.begin().await?;
    let (revoked, email) =
        db::invitation_revoke(&mut tx, ctx, handle.as_str()).await?.ok_or_else(not_found)?;
    if !revoked {
        return Err(Error::WrongState {
            message: format!("the invitation to {email} was accepted or revoked already"),
            use_instead: None,
        });
    }
    db::audit_insert(
        &mut tx,
        ctx,
        AuditEntry::ok("person.invitation_revoke", vec![handle.to_string()]),
    )
    .await?;
    db::preauth_invitation_forget_link(&mut tx, ctx.tenant_id(), handle.as_str()).await?;
    tx.commit().await?;
    Ok(email)
}

// ------------------------------------------------------------------ the acceptance page

/// What the acceptance page shows: the tenant, the role, who invited, and the ways in.
#[derive(Debug, Clone)]
pub struct Opened {
    pub tenant: String,
    pub email: String,
    pub name: String,
    pub role: String,
    pub invited_by: Option<String>,
    pub expires_at: String,
    /// The expiry in the tenant's zone, as the console shows times.
    pub expires_local: String,
    /// The address has a Gatehouse account: it joins by signing in to it.
    pub account: bool,
    /// The tenant's single sign-on vouches for the address.
    pub sso: bool,
    /// The tenant is entered through single sign-on only.
    pub sso_required: bool,
}

/// The invitation a link names, open: anything else is refused in words (a made-up, used,
/// revoked or expired link), the same way whichever it is not to tell which.
async fn open_row(ds: &Services, token: &str) -> Result<(InvitationRow, db::TenantRow)> {
    let closed = || {
        Error::Unauthenticated(
            "This invitation link does not work: it was used, revoked or has expired. Ask the admin who invited you for a new one.".into(),
        )
    };
    if CredentialKind::of(token) != Some(CredentialKind::Invitation) || token.len() > 200 {
        return Err(closed());
    }
    let row =
        ds.preauth_invitation_by_token(&secret::hash_token(token)).await?.ok_or_else(closed)?;
    if row.accepted_at.is_some() || row.revoked_at.is_some() || row.expires_at <= chrono::Utc::now()
    {
        return Err(closed());
    }
    let mut tx = ds.begin().await?;
    let tenant = db::entry_tenant_by_id(&mut tx, row.tenant_id).await?;
    drop(tx);
    Ok((row, tenant))
}

/// Opens an invitation's link.
pub async fn open(ds: &Services, token: &str) -> Result<Opened> {
    let (row, tenant) = open_row(ds, token).await?;
    let account = ds.platform_person_by_email(&row.email).await?.is_some();
    let idp = ds.preauth_idp_for(&tenant.slug).await?.filter(|i| i.tenant_id == tenant.id);
    let domain = row.email.rsplit_once('@').map(|(_, d)| d.to_owned()).unwrap_or_default();
    // In the tenant's zone, as every console page shows times.
    let tenant_ref = admin::tenant_ref(&tenant)?;
    let expires = crate::time::present(
        db::to_ts(row.expires_at),
        &tenant_ref.zone,
        &tenant_ref.zone_name,
        jiff::Timestamp::now(),
    )
    .display;
    Ok(Opened {
        tenant: tenant.name,
        email: row.email,
        name: row.name,
        role: row.role,
        invited_by: row.invited_by,
        expires_at: utc_text(row.expires_at),
        expires_local: expires,
        account,
        sso: idp.as_ref().is_some_and(|i| i.email_domains.contains(&domain)),
        sso_required: idp.is_some_and(|i| i.sso_required),
    })
}

/// The job context an acceptance is audited in: the invitation's tenant, acting for nobody
/// but the invitation (as single sign-on's linking is).
fn accept_ctx(tenant: &db::TenantRow) -> Result<OpCtx> {
    Ok(OpCtx::for_job("invitation", admin::tenant_ref(tenant)?, &[Right::PeopleManage]))
}

fn refuse_sso_only(tenant: &db::TenantRow, sso_required: bool) -> Result<()> {
    if sso_required {
        return Err(Error::invalid(
            "how",
            format!(
                "{} is entered through single sign-on only; continue with single sign-on",
                tenant.name
            ),
        ));
    }
    Ok(())
}

/// Whether the invitation's tenant requires single sign-on.
async fn sso_required(ds: &Services, tenant: &db::TenantRow) -> Result<bool> {
    Ok(ds
        .preauth_idp_for(&tenant.slug)
        .await?
        .is_some_and(|i| i.tenant_id == tenant.id && i.sso_required))
}

/// Marks the invitation accepted and gives the membership, in `tx`; audited.
async fn join(
    tx: &mut db::Tx<'_>,
    ctx: &OpCtx,
    row: &InvitationRow,
    person: &db::PersonRow,
    how: &str,
) -> Result<()> {
    // Someone who is a member already keeps the role an admin gave them since: an older
    // invitation never changes it.
    if db::preauth_membership_active(tx, row.tenant_id, person.id).await? {
        return Err(Error::WrongState {
            message: format!(
                "{} is a member of this tenant already; sign in to work in it",
                person.email
            ),
            use_instead: None,
        });
    }
    if !db::preauth_invitation_accept(tx, row.id, person.id, how).await? {
        return Err(Error::Unauthenticated(
            "This invitation was used, revoked or has expired meanwhile; ask for a new one.".into(),
        ));
    }
    db::preauth_invitation_forget_link(tx, row.tenant_id, &row.handle).await?;
    db::preauth_invited_membership(tx, row.tenant_id, person.id, &row.role).await?;
    let mut entry = AuditEntry::ok("person.join", vec![person.handle.clone(), row.handle.clone()]);
    entry.change = Some(db::change("role", None::<&str>, &row.role));
    entry.reason = Some(match how {
        "password" => "accepted an invitation by setting a password",
        "passkey" => "accepted an invitation with a passkey",
        "sso" => "accepted an invitation through single sign-on",
        _ => "accepted an invitation by signing in",
    });
    db::audit_insert(tx, ctx, entry).await
}

/// A new account joins by setting a password of 12 or more characters; it is signed in.
pub async fn accept_with_password(
    ds: &Services,
    token: &str,
    name: &str,
    password: &str,
) -> Result<SignedIn> {
    let (row, tenant) = open_row(ds, token).await?;
    refuse_sso_only(&tenant, sso_required(ds, &tenant).await?)?;
    if ds.platform_person_by_email(&row.email).await?.is_some() {
        return Err(Error::invalid(
            "password",
            format!("{} has an account already: sign in to it to accept", row.email),
        ));
    }
    admin::check_person(&row.email, name, Some(password))?;
    if password.len() > console::MAX_PASSWORD_LEN {
        return Err(Error::invalid("password", "use at most 1024 characters"));
    }
    let hash = secret::hash_password(password)?;
    let ctx = accept_ctx(&tenant)?;
    let mut tx = ds.begin().await?;
    let person = db::preauth_invited_person_insert(
        &mut tx,
        PersonHandle::generate().as_str(),
        &row.email,
        name.trim(),
        Some(&hash),
        None,
    )
    .await?;
    join(&mut tx, &ctx, &row, &person, "password").await?;
    tx.commit().await?;
    console::session_begin(ds, person.id, ("password", None)).await
}

/// A person signed in to the account the invitation names joins with it.
pub async fn accept_signed_in(ds: &Services, token: &str, session: &ConsoleSession) -> Result<()> {
    let (row, tenant) = open_row(ds, token).await?;
    if !session.email().eq_ignore_ascii_case(&row.email) {
        return Err(Error::WrongState {
            message: format!(
                "this invitation is for {}, and you are signed in as {}; sign out, then open the link again",
                row.email,
                session.email()
            ),
            use_instead: None,
        });
    }
    refuse_sso_only(&tenant, sso_required(ds, &tenant).await?)?;
    // A session another organization's identity provider started vouches for its own tenant
    // alone: it cannot carry its person into this one.
    if session.idp_id().is_some() {
        return Err(Error::invalid(
            "how",
            "you are signed in through another organization's single sign-on; sign out, sign in with your password or a passkey, then open the link again",
        ));
    }
    let person = ds
        .platform_person_by_email(&row.email)
        .await?
        .filter(|p| p.active)
        .ok_or(Error::NoActor)?;
    let ctx = accept_ctx(&tenant)?;
    let mut tx = ds.begin().await?;
    join(&mut tx, &ctx, &row, &person, "account").await?;
    tx.commit().await?;
    console::pick_tenant(ds, session, tenant.id).await
}

/// Starts making the passkey a new account joins with: the options for
/// `navigator.credentials.create` and the ceremony id. The account exists only once the
/// passkey is verified ([`accept_with_passkey`]).
pub async fn passkey_begin(
    ds: &Services,
    rp: &RelyingParty,
    token: &str,
    name: &str,
) -> Result<(String, serde_json::Value)> {
    let (row, tenant) = open_row(ds, token).await?;
    refuse_sso_only(&tenant, sso_required(ds, &tenant).await?)?;
    if ds.platform_person_by_email(&row.email).await?.is_some() {
        return Err(Error::invalid(
            "name",
            format!("{} has an account already: sign in to it to accept", row.email),
        ));
    }
    fields::name("name", name)?;
    let uuid = Uuid::new_v4();
    let (options, state) = rp
        .webauthn
        .start_passkey_registration(uuid, &row.email, name.trim(), None)
        .map_err(|e| Error::Internal(format!("passkey registration: {e}")))?;
    let mut options = serde_json::to_value(&options).map_err(|e| Error::Internal(e.to_string()))?;
    options["publicKey"]["authenticatorSelection"] = serde_json::json!({
        "residentKey": "required", "requireResidentKey": true, "userVerification": "required",
    });
    let id = secret::generate(CredentialKind::Session)["gh_ses_".len()..].to_owned();
    let state = serde_json::json!({
        "invitation": row.handle,
        "name": name.trim(),
        "webauthn_id": uuid.to_string(),
        "state": serde_json::to_value(&state).map_err(|e| Error::Internal(e.to_string()))?,
    });
    ds.preauth_ceremony_create(
        &secret::hash_token(&id),
        "invitation",
        None,
        None,
        &state,
        CEREMONY_TTL_SECS,
    )
    .await?;
    Ok((id, options))
}

/// A new account joins with the passkey it just made (no password); it is signed in with it.
pub async fn accept_with_passkey(
    ds: &Services,
    rp: &RelyingParty,
    token: &str,
    ceremony: &str,
    credential: &str,
) -> Result<SignedIn> {
    let (row, tenant) = open_row(ds, token).await?;
    refuse_sso_only(&tenant, sso_required(ds, &tenant).await?)?;
    if credential.len() > passkeys::MAX_CREDENTIAL_BYTES {
        return Err(Error::invalid("credential", "the browser's answer is too large"));
    }
    let credential: RegisterPublicKeyCredential =
        serde_json::from_str(credential).map_err(|e| {
            tracing::info!(error = %e, "an invitation's passkey answer did not parse");
            Error::invalid("credential", "the browser's answer is not a passkey; try again")
        })?;
    let taken = ds
        .preauth_ceremony_take(&secret::hash_token(ceremony), "invitation", None)
        .await?
        .filter(|c| c.state["invitation"].as_str() == Some(row.handle.as_str()))
        .ok_or_else(|| {
            Error::invalid("ceremony", "this passkey request expired or was used; start again")
        })?;
    let mut state = taken.state;
    let name = state["name"].as_str().unwrap_or_default().to_owned();
    let webauthn_id = state["webauthn_id"].as_str().unwrap_or_default().to_owned();
    let reg: PasskeyRegistration = serde_json::from_value(state["state"].take())
        .map_err(|e| Error::Internal(format!("ceremony state: {e}")))?;
    let passkey = rp.webauthn.finish_passkey_registration(&credential, &reg).map_err(|e| {
        tracing::info!(error = %e, "invitation passkey refused");
        Error::invalid("credential", "the passkey did not verify; try again")
    })?;
    let ctx = accept_ctx(&tenant)?;
    let mut tx = ds.begin().await?;
    let person = db::preauth_invited_person_insert(
        &mut tx,
        PersonHandle::generate().as_str(),
        &row.email,
        &name,
        None,
        Some(&webauthn_id),
    )
    .await?;
    let stored = db::preauth_invited_passkey_insert(
        &mut tx,
        person.id,
        PasskeyHandle::generate().as_str(),
        passkey.cred_id().as_ref(),
        &serde_json::to_value(&passkey).map_err(|e| Error::Internal(e.to_string()))?,
    )
    .await?
    .ok_or_else(|| Error::invalid("credential", "this passkey is registered already"))?;
    join(&mut tx, &ctx, &row, &person, "passkey").await?;
    tx.commit().await?;
    console::session_begin(ds, person.id, ("passkey", Some(stored))).await
}

/// Who single sign-on brings to an invitation: an address with no account yet, or the person
/// the IdP's subject was linked to before (by an earlier sign-in). An account that exists is
/// never joined by its email alone: its person accepts by signing in on the link's page.
pub(crate) enum SsoJoiner<'a> {
    New { email: &'a str, name: &'a str },
    Linked(i64),
}

/// Single sign-on with a waiting invitation to the IdP's tenant: the person (made now when
/// new) joins with the invitation's role. `None` when nothing waits.
pub(crate) async fn accept_through_sso(
    ds: &Services,
    tenant_id: i64,
    joiner: SsoJoiner<'_>,
) -> Result<Option<i64>> {
    let email = match &joiner {
        SsoJoiner::New { email, .. } => (*email).to_owned(),
        SsoJoiner::Linked(id) => match ds.preauth_passkey_person(*id).await? {
            Some(p) if p.active => p.email,
            _ => return Ok(None),
        },
    };
    let Some(row) = ds.preauth_invitation_open_for(tenant_id, &email).await? else {
        return Ok(None);
    };
    let existing = ds.platform_person_by_email(&email).await?;
    let mut tx = ds.begin().await?;
    let tenant = db::entry_tenant_by_id(&mut tx, tenant_id).await?;
    let ctx = accept_ctx(&tenant)?;
    let person = match (joiner, existing) {
        (SsoJoiner::Linked(_), Some(p)) => p,
        (SsoJoiner::New { name, .. }, None) => {
            let name = if name.trim().is_empty() { row.name.as_str() } else { name };
            db::preauth_invited_person_insert(
                &mut tx,
                PersonHandle::generate().as_str(),
                &email,
                name.trim(),
                None,
                None,
            )
            .await?
        }
        _ => return Ok(None),
    };
    join(&mut tx, &ctx, &row, &person, "sso").await?;
    tx.commit().await?;
    Ok(Some(person.id))
}
