//! Console sign-in and sessions. Passwords are argon2id; five failed sign-ins for an email
//! within fifteen minutes block further attempts for that email until the window passes.
//! A session is a `gh_ses_…` secret in an HttpOnly cookie, stored hashed, carrying a CSRF token
//! that every console form must echo.

use crate::ctx::{Actor, Channel, OpCtx, TenantRef, new_request_id};
use crate::datastore::{Datastore, SessionRow};
use crate::error::{Error, Result};
use crate::handle::{PersonHandle, TenantHandle};
use crate::rights::{RightSet, Role};
use crate::secret::{self, CredentialKind};
use crate::time;

pub const SESSION_TTL_SECS: i64 = 12 * 3600;
pub const MAX_FAILURES: i64 = 5;
pub const FAILURE_WINDOW_SECS: i64 = 15 * 60;

pub struct SignedIn {
    /// The session secret for the cookie; shown to nobody else.
    pub token: String,
}

pub async fn sign_in(ds: &Datastore, email: &str, password: &str) -> Result<SignedIn> {
    let email = email.trim();
    if ds.login_failures_recent(email, FAILURE_WINDOW_SECS).await? >= MAX_FAILURES {
        return Err(Error::Unauthenticated(
            "Too many failed sign-ins for this email; wait 15 minutes and try again.".into(),
        ));
    }
    let person = ds.person_login(email).await?;
    let ok = match &person {
        Some(p) if p.active => {
            p.password_hash.as_deref().is_some_and(|h| secret::verify_password(password, h))
        }
        _ => {
            // Same work whether or not the email exists, so timing does not tell.
            let _ = secret::verify_password(
                password,
                "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHRzYWx0$0000000000000000000000000000000000000000000",
            );
            false
        }
    };
    let Some(person) = person.filter(|_| ok) else {
        ds.login_failure_add(email).await?;
        return Err(Error::Unauthenticated("The email or the password is wrong.".into()));
    };
    let memberships = ds.memberships_of(person.id).await?;
    let tenant = (memberships.len() == 1).then(|| memberships[0].tenant_id);
    let token = secret::generate(CredentialKind::Session);
    let csrf = secret::generate(CredentialKind::Session)["gh_ses_".len()..].to_owned();
    ds.session_create(&secret::hash_token(&token), person.id, tenant, &csrf, SESSION_TTL_SECS)
        .await?;
    Ok(SignedIn { token })
}

/// The operation context of a session in its tenant: the person as actor, their current role's
/// rights, channel `console`. `None` until a tenant is picked or when the membership ended.
pub fn session_ctx(s: &SessionRow) -> Option<OpCtx> {
    let role: Role = s.role.as_deref()?.parse().ok()?;
    if !(s.person_active && s.membership_active == Some(true)) {
        return None;
    }
    let zone_name = s.tenant_zone.clone()?;
    Some(OpCtx {
        actor: Actor::Person {
            id: s.person_id,
            handle: PersonHandle::from_db(s.person_handle.clone()),
        },
        tenant: TenantRef {
            id: s.tenant_id?,
            handle: TenantHandle::from_db(s.tenant_handle.clone()?),
            slug: s.tenant_slug.clone()?,
            zone: time::zone("zone", &zone_name).unwrap_or(jiff::tz::TimeZone::UTC),
            zone_name,
            currency: s.tenant_currency.clone()?,
        },
        rights: role.rights(),
        channel: Channel::Console,
        connection: None,
        request_id: new_request_id(),
    })
}

/// Rights a person holds in the session's tenant.
pub fn session_rights(s: &SessionRow) -> RightSet {
    session_ctx(s).map(|c| c.rights).unwrap_or_default()
}
