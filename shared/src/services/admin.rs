//! Tenants, people, connections and API tokens: the operations behind `gatehousectl`, the
//! console and (later) the OAuth server. Each one checks its right, writes in one
//! transaction, and audits in that same transaction.

use serde::Serialize;

use crate::bus::{self, Event};
use crate::ctx::{Channel, OpCtx, Operator, TenantRef};
use crate::datastore::{self as ds_fns, AuditEntry, Services, TenantRow};
use crate::error::{Error, Resource, Result};
use crate::handle::{ApiTokenHandle, ConnectionHandle, PersonHandle, TenantHandle};
use crate::rights::{Right, RightSet, Role};
use crate::secret::{self, CredentialKind};
use crate::services::passkeys::{self, Decision};
use crate::time;

mod api_tokens;
mod audit_search;
mod connections;
pub use api_tokens::*;
pub use audit_search::*;
pub use connections::*;

pub fn tenant_ref(t: &TenantRow) -> Result<TenantRef> {
    Ok(TenantRef {
        id: t.id,
        handle: TenantHandle::from_db(t.handle.clone()),
        slug: t.slug.clone(),
        zone: time::zone("zone", &t.zone)?,
        zone_name: t.zone.clone(),
        currency: t.currency.clone(),
    })
}

pub async fn tenant_by_slug(ds: &Services, slug: &str) -> Result<TenantRow> {
    ds.platform_tenant_by_slug(slug).await?.ok_or_else(|| Error::not_found(Resource::Tenant, slug))
}

/// The alert rules every tenant starts with.
pub const DEFAULT_ALERT_RULES: &[(&str, &str)] = &[
    ("Unassigned booking soon", "A confirmed booking starts within 2 hours and has no technician."),
    (
        "Draft booking tomorrow",
        "A draft booking starts within 24 hours and is still not confirmed.",
    ),
];

pub struct NewTenant<'a> {
    pub slug: &'a str,
    pub name: &'a str,
    pub currency: &'a str,
    pub zone: &'a str,
}

/// Creates a tenant with its default alert rules: a platform action, operators only.
pub async fn tenant_create(ds: &Services, by: &Operator, t: NewTenant<'_>) -> Result<TenantRow> {
    insert_tenant(ds, t, |tenant| OpCtx::for_operator(by, tenant)).await
}

/// Creates a tenant for a job of the library (the demo seed), audited as that job.
pub(crate) async fn tenant_create_by_job(
    ds: &Services,
    job: &'static str,
    t: NewTenant<'_>,
) -> Result<TenantRow> {
    insert_tenant(ds, t, |tenant| OpCtx::for_job(job, tenant, &[])).await
}

async fn insert_tenant(
    ds: &Services,
    t: NewTenant<'_>,
    actor: impl FnOnce(TenantRef) -> OpCtx,
) -> Result<TenantRow> {
    let slug = t.slug.trim().to_lowercase();
    let valid_slug = slug.len() >= 2
        && slug.len() <= 63
        && slug.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !slug.starts_with('-');
    if !valid_slug {
        return Err(Error::invalid("slug", "use 2 to 63 lowercase letters, digits and dashes"));
    }
    let currency = t.currency.trim().to_uppercase();
    if currency.len() != 3 || !currency.chars().all(|c| c.is_ascii_uppercase()) {
        return Err(Error::invalid("currency", "use an ISO 4217 code such as EUR"));
    }
    time::zone("zone", t.zone)?;
    if ds.platform_tenant_by_slug(&slug).await?.is_some() {
        return Err(Error::invalid("slug", format!("a tenant {slug:?} exists already")));
    }
    let mut tx = ds.begin().await?;
    let handle = TenantHandle::generate();
    let row = ds_fns::platform_tenant_insert(
        &mut tx,
        handle.as_str(),
        &slug,
        t.name.trim(),
        &currency,
        t.zone.trim(),
    )
    .await?;
    let ctx = actor(tenant_ref(&row)?);
    for (name, description) in DEFAULT_ALERT_RULES {
        let handle = format!("alr_{}", &crate::handle::NoteHandle::generate().as_str()[4..]);
        ds_fns::alert_rule_insert(&mut tx, &ctx, &handle, name, description).await?;
    }
    ds_fns::audit_insert(&mut tx, &ctx, AuditEntry::ok("tenant.create", vec![row.handle.clone()]))
        .await?;
    tx.commit().await?;
    Ok(row)
}

#[derive(Debug, Serialize)]
pub struct PersonCreated {
    pub person: String,
    pub email: String,
    pub role: String,
    pub tenant: String,
}

/// What a new person must give: an email address, a name, and a password of 12 or more
/// characters if any.
pub(crate) fn check_person(email: &str, name: &str, password: Option<&str>) -> Result<()> {
    // The same rules as a customer's address: approvals are emailed here.
    if crate::services::fields::email(Some(email))?.is_none() {
        return Err(Error::invalid("email", "give the person's email address"));
    }
    crate::services::fields::name("name", name)?;
    if let Some(p) = password
        && p.chars().count() < 12
    {
        return Err(Error::invalid("password", "use at least 12 characters"));
    }
    Ok(())
}

/// Creates a person (or finds them by email) and gives them `role` in the context's tenant.
pub async fn person_create(
    ds: &Services,
    ctx: &OpCtx,
    email: &str,
    name: &str,
    role: Role,
    password: Option<&str>,
) -> Result<PersonCreated> {
    ctx.require(Right::PeopleManage)?;
    let email = email.trim();
    check_person(email, name, password)?;
    let hash = password.map(secret::hash_password).transpose()?;
    let existing = ds.platform_person_by_email(email).await?;
    // A person who has an account keeps their password and name: a tenant admin cannot reset
    // the sign-in of someone who may be a member elsewhere, and saying nothing would leave the
    // person holding a password that does not work.
    if existing.is_some() && password.is_some() {
        return Err(Error::invalid(
            "password",
            format!(
                "{email} has an account already and keeps its password; add them without one (for gatehousectl: no --password, and GATEHOUSE_PASSWORD unset), and an operator sets a new one with gatehousectl password-reset if it must change"
            ),
        ));
    }
    // Adding someone who is already an active member would change their role unseen (and
    // `viewer` is the default): a role change is `set-role`, audited as one.
    if let Some(p) = &existing
        && let Some(m) = ds.membership_get(ctx, p.id).await?
        && m.active
    {
        return Err(Error::WrongState {
            message: format!(
                "{email} is already a member of this tenant as {}; change a role with person set-role",
                m.role
            ),
            use_instead: None,
        });
    }
    let mut tx = ds.begin().await?;
    let person = match existing {
        Some(p) => p,
        None => {
            ds_fns::platform_person_insert(
                &mut tx,
                PersonHandle::generate().as_str(),
                email,
                name.trim(),
                hash.as_deref(),
            )
            .await?
        }
    };
    ds_fns::membership_upsert(&mut tx, ctx, person.id, role.as_str()).await?;
    // Added directly: an invitation still waiting would otherwise change their role later.
    let mut targets = vec![person.handle.clone()];
    targets.extend(ds_fns::invitation_close_for(&mut tx, ctx, &person.email).await?);
    ds_fns::audit_insert(&mut tx, ctx, AuditEntry::ok("person.create", targets)).await?;
    tx.commit().await?;
    Ok(PersonCreated {
        person: person.handle,
        email: person.email,
        role: role.as_str().into(),
        tenant: ctx.tenant().slug.clone(),
    })
}

async fn member(ds: &Services, ctx: &OpCtx, email: &str) -> Result<crate::datastore::PersonRow> {
    let person = ds
        .platform_person_by_email(email)
        .await?
        .ok_or_else(|| Error::not_found(Resource::Person, email))?;
    match ds.membership_get(ctx, person.id).await? {
        Some(_) => Ok(person),
        None => Err(Error::not_found(Resource::Person, email)),
    }
}

/// Refuses a change that would leave the tenant with no active admin: nobody could then manage
/// its people, connections or settings from the console or the API. Holds the admins'
/// memberships until the transaction ends, so concurrent demotions cannot each see another
/// admin left. The same rule for the console, the REST API and `gatehousectl`.
async fn keep_an_admin(
    tx: &mut crate::datastore::Tx<'_>,
    ctx: &OpCtx,
    person: &crate::datastore::PersonRow,
    change: &str,
) -> Result<()> {
    let admins = ds_fns::tenant_admins_held(tx, ctx).await?;
    if admins == [person.id] {
        return Err(Error::WrongState {
            message: format!(
                "{} is the last active admin of {}, so they cannot {change}; make another \
                 person an admin first",
                person.email,
                ctx.tenant().slug
            ),
            use_instead: None,
        });
    }
    Ok(())
}

/// The decision a role change is when it gives the person rights they do not hold now
/// (`None` when it keeps or lowers them: narrowing never waits for a passkey).
pub(crate) async fn role_decision(
    ds: &Services,
    ctx: &OpCtx,
    email: &str,
    role: Role,
) -> Result<Option<Decision>> {
    let person = member(ds, ctx, email).await?;
    let held = ds
        .membership_get(ctx, person.id)
        .await?
        .filter(|m| m.active)
        .and_then(|m| m.role.parse::<Role>().ok())
        .map(|r| r.rights())
        .unwrap_or_default();
    Ok((!role.rights().is_subset_of(held))
        .then(|| Decision::raise_role(&person.handle, role.as_str()).shown_as(&person.email)))
}

/// Changes a person's role. Their connections keep their stored rights, but the live rights
/// of every call are cut to the new role from the next call on (R4).
pub async fn person_set_role(
    ds: &Services,
    ctx: &OpCtx,
    email: &str,
    role: Role,
) -> Result<PersonCreated> {
    ctx.require(Right::PeopleManage)?;
    let person = member(ds, ctx, email).await?;
    let was = ds.membership_get(ctx, person.id).await?.map(|m| m.role);
    let raise = role_decision(ds, ctx, email, role).await?;
    // A role change never brings a deactivated person back: that is adding them again, which
    // is its own audited act with fresh credentials.
    let mut tx = ds.begin().await?;
    if let Some(decision) = raise {
        passkeys::require(&mut tx, ctx, &decision).await?;
    }
    if role != Role::Admin {
        keep_an_admin(&mut tx, ctx, &person, "be given another role").await?;
    }
    // Only an active membership changes role, decided in the statement itself, so a
    // deactivation committed meanwhile is never undone.
    if !ds_fns::membership_set_role(&mut tx, ctx, person.id, role.as_str()).await? {
        return Err(Error::WrongState {
            message: format!(
                "{email} is deactivated in this tenant; add them again (person create) to give them a role"
            ),
            use_instead: None,
        });
    }
    let mut entry = AuditEntry::ok("person.set_role", vec![person.handle.clone()]);
    entry.change = Some(ds_fns::change("role", was, role.as_str()));
    ds_fns::audit_insert(&mut tx, ctx, entry).await?;
    tx.commit().await?;
    // Every connection of the person sees another tool list from now on.
    bus::publish(ds.bus(), Event::TenantChanged { tenant: ctx.tenant().handle.to_string() }).await;
    Ok(PersonCreated {
        person: person.handle,
        email: person.email,
        role: role.as_str().into(),
        tenant: ctx.tenant().slug.clone(),
    })
}

#[derive(Debug, Serialize)]
pub struct PersonDeactivated {
    pub person: String,
    pub revoked_connections: Vec<String>,
    pub revoked_api_tokens: Vec<String>,
}

/// Ends a person's membership in the tenant and every connection they created there (R4).
pub async fn person_deactivate(
    ds: &Services,
    ctx: &OpCtx,
    email: &str,
) -> Result<PersonDeactivated> {
    ctx.require(Right::PeopleManage)?;
    let person = member(ds, ctx, email).await?;
    let mut tx = ds.begin().await?;
    keep_an_admin(&mut tx, ctx, &person, "be deactivated").await?;
    ds_fns::membership_deactivate(&mut tx, ctx, person.id).await?;
    let revoked =
        ds_fns::connection_revoke_where(&mut tx, ctx, None, Some(person.id), "creator deactivated")
            .await?;
    let api_tokens = ds_fns::person_credentials_end(&mut tx, ctx, person.id).await?;
    // An invitation sent before must not bring them back.
    let closed = ds_fns::invitation_close_for(&mut tx, ctx, &person.email).await?;
    let mut targets = vec![person.handle.clone()];
    targets.extend(closed);
    targets.extend(revoked.iter().map(|(_, h)| h.clone()));
    targets.extend(api_tokens.iter().cloned());
    ds_fns::audit_insert(&mut tx, ctx, AuditEntry::ok("person.deactivate", targets)).await?;
    tx.commit().await?;
    bus::publish(ds.bus(), Event::TenantChanged { tenant: ctx.tenant().handle.to_string() }).await;
    for (_, handle) in &revoked {
        bus::publish(ds.bus(), Event::Revoked { connection: handle.clone() }).await;
    }
    let revoked_connections = revoked.into_iter().map(|(_, h)| h).collect();
    Ok(PersonDeactivated {
        person: person.handle,
        revoked_connections,
        revoked_api_tokens: api_tokens,
    })
}

/// Where a kill switch acts.
#[derive(Debug, Clone, Copy)]
pub enum SwitchScope<'a> {
    /// Every tenant: operators only, so it takes the verified operator.
    Global(&'a Operator),
    /// One tenant's agent access.
    Tenant(&'a OpCtx),
}

#[derive(Debug, Serialize)]
pub struct SwitchFlipped {
    pub scope: String,
    /// Whether agents are now refused.
    pub kill: bool,
    pub changed: bool,
    pub reason: String,
}

/// The one service that flips a kill switch (R18): it writes Postgres, audits who, why and
/// through which channel in the same transaction, then pushes the change over NATS.
///
/// `kill: true` turns agents away: globally every MCP request answers 503, for a tenant its
/// requests are refused with the reason.
pub async fn kill_switch_set(
    ds: &Services,
    scope: SwitchScope<'_>,
    kill: bool,
    reason: &str,
) -> Result<SwitchFlipped> {
    let reason = crate::services::fields::reason(reason, 300)?;
    let reason = reason.as_str();
    let mut tx = ds.begin().await?;
    let (label, changed, event) = match scope {
        SwitchScope::Global(operator) => {
            if !kill && operator.channel() == Channel::Console {
                passkeys::require_for_platform(
                    operator.proof(),
                    operator.id(),
                    &Decision::global_switch_on(),
                )?;
            }
            let was = ds_fns::platform_kill_set(
                &mut tx,
                kill,
                operator.email(),
                operator.channel().as_str(),
                reason,
                &crate::ctx::new_request_id(),
            )
            .await?;
            ("global".to_owned(), was != kill, Event::GlobalKill(kill))
        }
        SwitchScope::Tenant(ctx) => {
            ctx.require(Right::TenantSwitch)?;
            if !kill {
                passkeys::require(&mut tx, ctx, &Decision::agent_access_on()).await?;
            }
            let was_on = ds_fns::tenant_agent_access_set(&mut tx, ctx, !kill).await?;
            let action = if kill { "agent_access.off" } else { "agent_access.on" };
            let mut entry = AuditEntry::ok(action, vec![ctx.tenant().handle.to_string()]);
            entry.reason = Some(reason);
            let words = |on: bool| if on { "on" } else { "off" };
            entry.change = Some(ds_fns::change("agent_access", words(was_on), words(!kill)));
            ds_fns::audit_insert(&mut tx, ctx, entry).await?;
            (
                format!("tenant {}", ctx.tenant().slug),
                was_on == kill,
                Event::TenantAccess { tenant: ctx.tenant().handle.to_string(), on: !kill },
            )
        }
    };
    tx.commit().await?;
    bus::publish(ds.bus(), event).await;
    Ok(SwitchFlipped { scope: label, kill, changed, reason: reason.to_owned() })
}

/// Whether the global kill switch is on, for the operator page.
pub async fn global_kill_state(ds: &Services, _by: &Operator) -> Result<bool> {
    ds_fns::platform_kill_get(ds).await
}
