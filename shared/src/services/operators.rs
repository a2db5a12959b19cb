//! Platform operators (R18, STYLE 12): the people who may act for the whole platform — the
//! global kill switch, creating tenants, granting the operator role.
//!
//! An [`Operator`] is made only here, after reading the person from Postgres: active and
//! holding the role at this moment. `gatehousectl` acts as the operator who ran it (`--as`),
//! the console's operator page as the signed-in person; every platform service takes the
//! `Operator`, so "only operators" is a type the compiler checks, and the audit names them.

use crate::ctx::{Channel, Operator};
use crate::datastore::{self as db, OperatorRow, Services};
use crate::error::{Error, Resource, Result};
use crate::handle::PersonHandle;
use crate::rights::Right;
use crate::services::console::ConsoleSession;

fn verified(row: OperatorRow, channel: Channel) -> Result<Operator> {
    if !row.active || !row.is_operator {
        return Err(not_an_operator(&row.email));
    }
    Ok(Operator::verified(row.id, PersonHandle::from_db(row.handle), row.email, channel))
}

fn not_an_operator(email: &str) -> Error {
    Error::Unauthenticated(format!(
        "{email} is not an active platform operator; an operator grants the role with `gatehousectl operator --email {email}`"
    ))
}

/// The operator who runs a command, named by email (`gatehousectl --as`).
pub async fn authenticate(svc: &Services, email: &str, channel: Channel) -> Result<Operator> {
    let row =
        db::entry_operator_get(svc, email).await?.ok_or_else(|| not_an_operator(email.trim()))?;
    verified(row, channel)
}

/// The signed-in console person, if they hold the operator role now.
pub async fn from_session(svc: &Services, s: &ConsoleSession) -> Result<Operator> {
    let s = s.row();
    // A tenant's IdP vouches for that tenant's people, never for the platform's operators.
    if s.idp_id.is_some() {
        return Err(Error::Forbidden { right: Right::TenantSwitch });
    }
    let row = db::entry_operator_by_id(svc, s.person_id)
        .await?
        .ok_or(Error::Forbidden { right: Right::TenantSwitch })?;
    if !row.active || !row.is_operator {
        return Err(Error::Forbidden { right: Right::TenantSwitch });
    }
    verified(row, Channel::Console)
}

/// Grants or withdraws the operator role. `by` is the operator doing it; without one, the
/// only grant allowed is the platform's first operator (bootstrap), audited as such. A person
/// not known yet is created when `name` is given (the first operator of a new install).
pub async fn set_role(
    svc: &Services,
    by: Option<&Operator>,
    email: &str,
    name: Option<&str>,
    grant: bool,
) -> Result<crate::datastore::PersonRow> {
    let email = email.trim();
    let known = svc.platform_person_by_email(email).await?;
    let mut tx = svc.begin().await?;
    let existing = db::platform_operator_count_locked(&mut tx).await?;
    let person = match (known, name.map(str::trim).filter(|n| !n.is_empty())) {
        (Some(p), _) => p,
        (None, Some(name)) if grant => {
            crate::services::admin::check_person(email, name, None)?;
            db::platform_person_insert(
                &mut tx,
                PersonHandle::generate().as_str(),
                email,
                name,
                None,
            )
            .await?
        }
        (None, _) => {
            return Err(Error::not_found(Resource::Person, email));
        }
    };
    let (channel, actor, action) = match by {
        Some(op) => {
            (op.channel(), Some(op.id()), if grant { "operator.grant" } else { "operator.revoke" })
        }
        None if grant && existing == 0 => (Channel::Cli, None, "operator.bootstrap"),
        None => {
            return Err(Error::Unauthenticated(
                "say which operator you are with --as EMAIL (or GATEHOUSE_OPERATOR); without one, only the platform's first operator can be granted".into(),
            ));
        }
    };
    if !grant && existing <= 1 && by.is_some_and(|op| op.id() == person.id) {
        return Err(Error::invalid(
            "email",
            "this is the platform's last operator; grant the role to someone else first",
        ));
    }
    db::platform_person_set_operator(&mut tx, person.id, grant).await?;
    db::platform_audit_insert(&mut tx, channel.as_str(), actor, action, &person.handle).await?;
    tx.commit().await?;
    Ok(person)
}

/// Sets a person's console password and ends all their console sessions: what an operator does
/// for an account whose password someone else may know (adding a person to a tenant again keeps
/// their password). Operators only, audited on the platform.
pub async fn reset_password(
    svc: &Services,
    by: Option<&Operator>,
    email: &str,
    password: &str,
) -> Result<crate::datastore::PersonRow> {
    let Some(op) = by else {
        return Err(Error::Unauthenticated(
            "say which operator you are with --as EMAIL (or GATEHOUSE_OPERATOR); only an operator resets a password".into(),
        ));
    };
    if password.chars().count() < 12 {
        return Err(Error::invalid("password", "use at least 12 characters"));
    }
    let person = svc.platform_person_by_email(email.trim()).await?.ok_or_else(|| {
        Error::invalid("email", format!("no account has the email {:?}", email.trim()))
    })?;
    let hash = crate::secret::hash_password(password)?;
    let mut tx = svc.begin().await?;
    db::platform_person_password_set(&mut tx, person.id, &hash).await?;
    db::platform_audit_insert(
        &mut tx,
        op.channel().as_str(),
        Some(op.id()),
        "person.password_reset",
        &person.handle,
    )
    .await?;
    tx.commit().await?;
    Ok(person)
}

/// Whether the platform has any active operator yet.
pub(crate) async fn any(svc: &Services) -> Result<bool> {
    let mut tx = svc.begin().await?;
    Ok(db::platform_operator_count_locked(&mut tx).await? > 0)
}
