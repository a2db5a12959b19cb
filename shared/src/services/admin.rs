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
pub async fn role_decision(
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
        .then(|| Decision::raise_role(&person.handle, role.as_str())))
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

#[derive(Debug, Serialize)]
pub struct ConnectionCreated {
    pub connection: String,
    pub name: String,
    pub rights: Vec<String>,
    /// Shown once; only its hash is stored.
    pub token: String,
}

/// Creates a static connection for `creator_email` with `rights`, which may not exceed the
/// creator's current rights in the tenant (R4).
/// The names of the toolsets a connection can be given (R21).
pub const TOOLSETS: &[&str] = &["full", "read_only", "small"];

pub struct NewConnection<'a> {
    pub creator_email: &'a str,
    pub name: &'a str,
    pub client_name: &'a str,
    pub rights: RightSet,
    pub toolset: &'a str,
}

/// The decision creating a connection is, as a passkey ceremony names it: the name as the
/// connection will carry it, its rights and its toolset.
pub fn connection_decision(
    name: &str,
    rights: RightSet,
    toolset: &str,
    creator_email: &str,
    client_name: &str,
) -> Decision {
    let names = rights.names();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    Decision::create_connection(name.trim(), &names, toolset, creator_email, client_name)
}

/// Creates a static connection for a person of the tenant, with the rights and toolset given
/// (never more rights than the creator holds); the token is returned once.
pub async fn connection_create(
    ds: &Services,
    ctx: &OpCtx,
    new: NewConnection<'_>,
) -> Result<ConnectionCreated> {
    let NewConnection { creator_email, name, client_name, rights, toolset } = new;
    if !TOOLSETS.contains(&toolset) {
        return Err(Error::invalid_with_options(
            "toolset",
            format!("{toolset:?} is not a toolset"),
            TOOLSETS.iter().map(|t| (*t).to_owned()).collect(),
        ));
    }
    ctx.require(Right::ConnectionsManage)?;
    let name = crate::services::fields::label("name", name, 80)?;
    let name = name.as_str();
    if rights == RightSet::EMPTY {
        return Err(Error::invalid_with_options(
            "rights",
            "grant at least one right",
            Right::ALL.iter().map(|r| r.as_str().into()).collect(),
        ));
    }
    let creator = member(ds, ctx, creator_email).await?;
    let membership = ds
        .membership_get(ctx, creator.id)
        .await?
        .filter(|m| m.active && creator.active)
        .ok_or_else(|| {
            Error::invalid(
                "creator",
                format!("{creator_email} is not an active member of this tenant"),
            )
        })?;
    let creator_rights = membership.role.parse::<Role>()?.rights();
    if !rights.is_subset_of(creator_rights) {
        let excess: Vec<String> = rights
            .iter()
            .filter(|r| !creator_rights.contains(*r))
            .map(|r| r.as_str().to_owned())
            .collect();
        return Err(Error::invalid_with_options(
            "rights",
            format!(
                "{creator_email} does not hold {}; a connection cannot exceed its creator's rights",
                excess.join(", ")
            ),
            creator_rights.names(),
        ));
    }
    let token = secret::generate(CredentialKind::Mcp);
    let handle = ConnectionHandle::generate();
    let mut tx = ds.begin().await?;
    let decision = connection_decision(name, rights, toolset, creator_email, client_name);
    passkeys::require(&mut tx, ctx, &decision).await?;
    // Decided again under the membership's row lock: a deactivation running now either revokes
    // this connection too or is seen here, so none is left to wake if the person came back.
    if !ds_fns::membership_active_held(&mut tx, ctx, creator.id).await? {
        return Err(Error::invalid(
            "creator",
            format!("{creator_email} is not an active member of this tenant"),
        ));
    }
    let id = ds_fns::connection_insert_toolset(
        &mut tx,
        ctx,
        handle.as_str(),
        creator.id,
        name,
        client_name,
        &rights.names(),
        toolset,
    )
    .await?;
    ds_fns::connection_token_insert(
        &mut tx,
        ctx,
        id,
        "static",
        &secret::hash_token(&token),
        None,
        None,
        None,
    )
    .await?;
    ds_fns::audit_insert(
        &mut tx,
        ctx,
        AuditEntry::ok("connection.create", vec![handle.to_string()]),
    )
    .await?;
    tx.commit().await?;
    Ok(ConnectionCreated {
        connection: handle.to_string(),
        name: name.to_owned(),
        rights: rights.names(),
        token,
    })
}

#[derive(Debug, Serialize)]
pub struct ConnectionRevoked {
    pub connection: String,
    pub revoked: bool,
}

/// What an admin changes of a connection in place.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionEdit<'a> {
    pub name: &'a str,
    pub rights: RightSet,
    pub toolset: &'a str,
}

/// Whether a toolset lets a connection do more than another: any move but to `read_only` is
/// counted as more, conservatively (`small` and `full` offer different tools).
fn toolset_widens(from: &str, to: &str) -> bool {
    from != to && to != "read_only"
}

/// The decision an edit is when it widens the connection (rights it lacks, a larger toolset):
/// `None` when it renames or narrows, which never waits for a passkey.
pub fn connection_edit_decision(
    current: &ConnectionSummary,
    edit: &ConnectionEdit<'_>,
) -> Option<Decision> {
    let had = RightSet::parse_lenient(&current.rights);
    let widens = !edit.rights.is_subset_of(had) || toolset_widens(&current.toolset, edit.toolset);
    widens.then(|| {
        let names = edit.rights.names();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        Decision::widen_connection(&current.connection, &names, edit.toolset)
    })
}

/// Renames a connection or changes its rights or toolset in place, from its next call on every
/// worker. Narrowing is one step; widening is a decision under the tenant's passkey policy and
/// never goes beyond what its creator holds now. A revoked connection is read-only.
pub async fn connection_edit(
    ds: &Services,
    ctx: &OpCtx,
    handle: &str,
    edit: ConnectionEdit<'_>,
) -> Result<ConnectionSummary> {
    ctx.require(Right::ConnectionsManage)?;
    let current = connection_get(ds, ctx, handle).await?;
    if current.status != "active" {
        return Err(Error::WrongState {
            message: format!(
                "{} is revoked, and a revoked connection is read-only",
                current.connection
            ),
            use_instead: None,
        });
    }
    let name = crate::services::fields::label("name", edit.name, 80)?;
    if !TOOLSETS.contains(&edit.toolset) {
        return Err(Error::invalid_with_options(
            "toolset",
            format!("{:?} is not a toolset", edit.toolset),
            TOOLSETS.iter().map(|t| (*t).to_owned()).collect(),
        ));
    }
    if edit.rights.is_empty() {
        return Err(Error::invalid("rights", "keep at least one right, or revoke the connection"));
    }
    let creator = member(ds, ctx, &current.creator).await?;
    let held = ds
        .membership_get(ctx, creator.id)
        .await?
        .map(|m| m.role.parse::<Role>().map(Role::rights))
        .transpose()?
        .unwrap_or(RightSet::EMPTY);
    if !edit.rights.is_subset_of(held) {
        let excess: Vec<&str> =
            edit.rights.iter().filter(|r| !held.contains(*r)).map(Right::as_str).collect();
        return Err(Error::invalid(
            "rights",
            format!(
                "{} does not hold {}; a connection cannot exceed its creator's rights",
                current.creator,
                excess.join(", ")
            ),
        ));
    }
    let decision = connection_edit_decision(&current, &edit);
    let mut tx = ds.begin().await?;
    if let Some(decision) = &decision {
        passkeys::require(&mut tx, ctx, decision).await?;
    }
    let rights = edit.rights.names();
    if !ds_fns::connection_update(&mut tx, ctx, &current.connection, &name, &rights, edit.toolset)
        .await?
    {
        return Err(Error::WrongState {
            message: format!("{} was revoked meanwhile; nothing changed", current.connection),
            use_instead: None,
        });
    }
    let mut change = serde_json::Map::new();
    if name != current.name {
        change.extend(
            ds_fns::change("name", &current.name, &name).as_object().cloned().unwrap_or_default(),
        );
    }
    if RightSet::parse_lenient(&current.rights) != edit.rights {
        change.extend(
            ds_fns::change("rights", current.rights.join(" "), rights.join(" "))
                .as_object()
                .cloned()
                .unwrap_or_default(),
        );
    }
    if current.toolset != edit.toolset {
        change.extend(
            ds_fns::change("toolset", &current.toolset, edit.toolset)
                .as_object()
                .cloned()
                .unwrap_or_default(),
        );
    }
    let mut entry = AuditEntry::ok("connection.edit", vec![current.connection.clone()]);
    entry.change = Some(serde_json::Value::Object(change));
    ds_fns::audit_insert(&mut tx, ctx, entry).await?;
    tx.commit().await?;
    // Its sessions list other tools from now on.
    bus::publish(ds.bus(), Event::TenantChanged { tenant: ctx.tenant().handle.to_string() }).await;
    connection_get(ds, ctx, &current.connection).await
}

/// The one revocation path (R4): every channel revokes through here, and it audits.
pub async fn connection_revoke(
    ds: &Services,
    ctx: &OpCtx,
    handle: &str,
    reason: &str,
) -> Result<ConnectionRevoked> {
    ctx.require(Right::ConnectionsManage)?;
    let handle = ConnectionHandle::parse("connection", handle)?;
    let reason = crate::services::fields::reason(reason, 500)?;
    let reason = reason.as_str();
    let mut tx = ds.begin().await?;
    if ds_fns::connection_status(&mut tx, ctx, handle.as_str()).await?.is_none() {
        return Err(Error::not_found(Resource::Connection, handle.as_str()));
    }
    let revoked =
        ds_fns::connection_revoke_where(&mut tx, ctx, Some(handle.as_str()), None, reason).await?;
    let mut entry = AuditEntry::ok("connection.revoke", vec![handle.to_string()]);
    entry.reason = Some(reason);
    ds_fns::audit_insert(&mut tx, ctx, entry).await?;
    tx.commit().await?;
    for (_, handle) in &revoked {
        bus::publish(ds.bus(), Event::Revoked { connection: handle.clone() }).await;
    }
    Ok(ConnectionRevoked { connection: handle.to_string(), revoked: !revoked.is_empty() })
}

/// How long an API token lives unless its creator chooses: 90 days; at most a year.
pub const API_TOKEN_DEFAULT_DAYS: i64 = 90;
pub const API_TOKEN_MAX_DAYS: i64 = 365;
/// How long an API token's name may be.
pub const API_TOKEN_NAME_CHARS: usize = 80;

#[derive(Debug, Serialize)]
pub struct ApiTokenCreated {
    pub api_token: String,
    pub name: String,
    pub person: String,
    pub expires_at: String,
    /// The secret, shown once.
    pub token: String,
}

/// An API token as listed (never its secret).
#[derive(Debug, Serialize)]
pub struct ApiTokenSummary {
    pub api_token: String,
    pub name: String,
    pub person: String,
    pub created_at: String,
    pub expires_at: String,
    /// `active`, `expired` or `revoked`.
    pub status: &'static str,
}

fn utc_text(t: chrono::DateTime<chrono::Utc>) -> String {
    crate::datastore::to_ts(t).strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Creates an API token for a member of the tenant, valid for `expires_in_days` (1 to 365,
/// 90 when `None`). The person's current role decides what it may do on every request.
pub async fn api_token_create(
    ds: &Services,
    ctx: &OpCtx,
    person_email: &str,
    name: &str,
    expires_in_days: Option<i64>,
) -> Result<ApiTokenCreated> {
    ctx.require(Right::ConnectionsManage)?;
    let name = crate::services::fields::label("name", name, API_TOKEN_NAME_CHARS)?;
    let name = name.as_str();
    let days = expires_in_days.unwrap_or(API_TOKEN_DEFAULT_DAYS);
    if !(1..=API_TOKEN_MAX_DAYS).contains(&days) {
        return Err(Error::invalid(
            "expires_in_days",
            format!("an API token lives 1 to {API_TOKEN_MAX_DAYS} days; {days} is out of range"),
        ));
    }
    let person = member(ds, ctx, person_email).await?;
    // A token acts for the person who creates it: a tenant admin cannot mint a credential that
    // speaks as someone else and outlives the admin's own membership. Operators (the CLI, a
    // platform trust root, audited) and the library's jobs may name any member.
    let for_someone_else = ctx.actor_person_id() != Some(person.id);
    if for_someone_else && !matches!(ctx.channel(), Channel::Cli | Channel::System) {
        return Err(Error::invalid(
            "person",
            "an API token acts for the person who creates it; they create it themselves in the console (API tokens), or an operator runs gatehousectl api-token create",
        ));
    }
    let token = secret::generate(CredentialKind::Api);
    let handle = ApiTokenHandle::generate();
    let mut tx = ds.begin().await?;
    passkeys::require(&mut tx, ctx, &Decision::create_api_token(name, days)).await?;
    // A deactivated member gets no credential: it would lie dormant and wake if they were
    // added again. Decided under the membership's row lock, so a deactivation running now
    // either ends this token too or is seen here.
    if !ds_fns::membership_active_held(&mut tx, ctx, person.id).await? {
        return Err(Error::WrongState {
            message: format!("{person_email} is not an active member of this tenant"),
            use_instead: None,
        });
    }
    let expires_at = ds_fns::api_token_insert(
        &mut tx,
        ctx,
        handle.as_str(),
        person.id,
        name,
        &secret::hash_token(&token),
        days,
    )
    .await?;
    ds_fns::audit_insert(
        &mut tx,
        ctx,
        AuditEntry::ok("api_token.create", vec![handle.to_string(), person.handle.clone()]),
    )
    .await?;
    tx.commit().await?;
    Ok(ApiTokenCreated {
        api_token: handle.to_string(),
        name: name.to_owned(),
        person: person.email,
        expires_at: utc_text(expires_at),
        token,
    })
}

fn api_token_summary(row: ds_fns::ApiTokenRow) -> ApiTokenSummary {
    let status = if row.revoked_at.is_some() {
        "revoked"
    } else if row.expires_at <= chrono::Utc::now() {
        "expired"
    } else {
        "active"
    };
    ApiTokenSummary {
        api_token: row.handle,
        name: row.name,
        person: row.person_email,
        created_at: utc_text(row.created_at),
        expires_at: utc_text(row.expires_at),
        status,
    }
}

/// The tenant's API tokens, newest first.
pub async fn api_token_list(ds: &Services, ctx: &OpCtx) -> Result<Vec<ApiTokenSummary>> {
    ctx.require(Right::ConnectionsManage)?;
    Ok(ds.api_token_list(ctx).await?.into_iter().map(api_token_summary).collect())
}

/// What an admin looks for among the tenant's API tokens; every field as it came from outside.
#[derive(Debug, Default, Clone)]
pub struct ApiTokenFilter {
    /// Part of the token's name or of its person's email.
    pub q: Option<String>,
    /// `active`, `expired` or `revoked`.
    pub status: Option<String>,
    pub cursor: Option<String>,
}

/// One page of API tokens and where the next one starts.
#[derive(Debug, Serialize)]
pub struct ApiTokenPage {
    pub rows: Vec<ApiTokenSummary>,
    pub next: Option<String>,
}

/// A page of the tenant's API tokens, newest first, searched and filtered in SQL.
pub async fn api_token_page(
    ds: &Services,
    ctx: &OpCtx,
    filter: &ApiTokenFilter,
    limit: i64,
) -> Result<ApiTokenPage> {
    ctx.require(Right::ConnectionsManage)?;
    let text = super::filter_search(&filter.q)?;
    let status = super::filter_one_of(
        "status",
        "status",
        &filter.status,
        &["active", "expired", "revoked"],
    )?;
    let after = match super::filter_value(&filter.cursor) {
        None => None,
        Some(c) => {
            let parts = super::decode_cursor(&c, 2)?;
            let at = parts[0].parse::<i64>().ok().and_then(chrono::DateTime::from_timestamp_micros);
            let Some(at) = at else {
                return Err(Error::invalid(
                    "cursor",
                    "not a cursor from a previous page; repeat the search without it",
                ));
            };
            Some((at, parts[1].clone()))
        }
    };
    let query = ds_fns::ApiTokenQuery {
        text: text.as_deref(),
        status: status.as_deref(),
        after: after.as_ref().map(|(at, h)| (*at, h.as_str())),
    };
    let mut rows = ds.api_token_search(ctx, &query, limit + 1).await?;
    let next = if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        rows.last().map(|r| {
            super::encode_cursor(&[&r.created_at.timestamp_micros().to_string(), &r.handle])
        })
    } else {
        None
    };
    Ok(ApiTokenPage { rows: rows.into_iter().map(api_token_summary).collect(), next })
}

/// One API token of the tenant, by a handle as it came from outside: anything that is not an
/// API token handle of this tenant is not found.
pub async fn api_token_get(ds: &Services, ctx: &OpCtx, raw: &str) -> Result<ApiTokenSummary> {
    ctx.require(Right::ConnectionsManage)?;
    let not_found =
        || Error::not_found(Resource::ApiToken, raw.chars().take(40).collect::<String>());
    let handle = ApiTokenHandle::parse("api_token", raw).map_err(|_| not_found())?;
    ds.api_token_get(ctx, handle.as_str()).await?.map(api_token_summary).ok_or_else(not_found)
}

#[derive(Debug, Serialize)]
pub struct ApiTokenRevoked {
    pub api_token: String,
    /// False when it was revoked already.
    pub revoked: bool,
}

/// Revokes an API token of the tenant: refused from the next request on, audited with the reason.
pub async fn api_token_revoke(
    ds: &Services,
    ctx: &OpCtx,
    raw: &str,
    reason: &str,
) -> Result<ApiTokenRevoked> {
    ctx.require(Right::ConnectionsManage)?;
    let not_found =
        || Error::not_found(Resource::ApiToken, raw.chars().take(40).collect::<String>());
    let handle = ApiTokenHandle::parse("api_token", raw).map_err(|_| not_found())?;
    let reason = crate::services::fields::reason(reason, 500)?;
    let reason = reason.as_str();
    let mut tx = ds.begin().await?;
    let revoked = ds_fns::api_token_revoke(&mut tx, ctx, handle.as_str(), reason)
        .await?
        .ok_or_else(not_found)?;
    let mut entry = AuditEntry::ok("api_token.revoke", vec![handle.to_string()]);
    entry.reason = Some(reason);
    ds_fns::audit_insert(&mut tx, ctx, entry).await?;
    tx.commit().await?;
    Ok(ApiTokenRevoked { api_token: handle.to_string(), revoked })
}

#[derive(Debug, Serialize)]
pub struct ConnectionSummary {
    pub connection: String,
    pub name: String,
    pub client_name: String,
    pub status: String,
    pub toolset: String,
    pub creator: String,
    pub rights: Vec<String>,
    pub created_at: String,
    pub last_used_at: Option<String>,
    /// `idp` when the tenant's identity provider granted it (an ID-JAG), else absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub granted_by: Option<String>,
    /// `token`, `oauth` or `idp`, where a search computed it.
    #[serde(skip)]
    pub how_granted: Option<String>,
}

/// One connection of the tenant, by a handle as it came from outside (a URL path segment):
/// anything that is not a connection handle of this tenant is not found.
pub async fn connection_get(ds: &Services, ctx: &OpCtx, raw: &str) -> Result<ConnectionSummary> {
    let not_found =
        || Error::not_found(Resource::Connection, raw.chars().take(40).collect::<String>());
    let handle = ConnectionHandle::parse("connection", raw).map_err(|_| not_found())?;
    connections(ds, ctx, Some(handle.as_str())).await?.into_iter().next().ok_or_else(not_found)
}

pub async fn connection_list(ds: &Services, ctx: &OpCtx) -> Result<Vec<ConnectionSummary>> {
    connections(ds, ctx, None).await
}

async fn connections(
    ds: &Services,
    ctx: &OpCtx,
    handle: Option<&str>,
) -> Result<Vec<ConnectionSummary>> {
    ctx.require(Right::ConnectionsManage)?;
    let fmt = |t: chrono::DateTime<chrono::Utc>| {
        crate::datastore::to_ts(t).strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    };
    Ok(ds
        .connection_list(ctx, handle)
        .await?
        .into_iter()
        .map(|c| ConnectionSummary {
            connection: c.handle,
            name: c.name,
            client_name: c.client_name,
            status: c.status,
            toolset: c.toolset,
            creator: c.creator_email,
            rights: c.rights,
            created_at: fmt(c.created_at),
            last_used_at: c.last_used_at.map(fmt),
            granted_by: c.granted_by,
            how_granted: None,
        })
        .collect())
}

/// What an admin looks for among the tenant's connections; every field as it came from outside.
#[derive(Debug, Default, Clone)]
pub struct ConnectionFilter {
    pub q: Option<String>,
    /// `active` or `revoked`.
    pub status: Option<String>,
    pub client: Option<String>,
    /// `token` (made in the console or the CLI), `oauth` or `idp`.
    pub granted: Option<String>,
    /// `read`, `write` or `dangerous`.
    pub level: Option<String>,
    pub cursor: Option<String>,
}

/// One page of connections, the client names to filter by, and where the next page starts.
#[derive(Debug, Serialize)]
pub struct ConnectionPage {
    pub rows: Vec<ConnectionSummary>,
    pub clients: Vec<String>,
    pub next: Option<String>,
}

/// A page of the tenant's connections, newest first, searched and filtered in SQL.
pub async fn connection_search(
    ds: &Services,
    ctx: &OpCtx,
    filter: &ConnectionFilter,
    limit: i64,
) -> Result<ConnectionPage> {
    ctx.require(Right::ConnectionsManage)?;
    let given = |v: &Option<String>| {
        v.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned)
    };
    let text = given(&filter.q);
    if text.as_ref().is_some_and(|q| q.chars().count() > 200) {
        return Err(Error::invalid("q", "search with at most 200 characters"));
    }
    let status = given(&filter.status);
    if status.as_deref().is_some_and(|s| !["active", "revoked"].contains(&s)) {
        return Err(Error::invalid("status", "status is active or revoked"));
    }
    let granted = given(&filter.granted);
    if granted.as_deref().is_some_and(|g| !["token", "oauth", "idp"].contains(&g)) {
        return Err(Error::invalid("granted", "how granted is token, oauth or idp"));
    }
    let level =
        given(&filter.level).map(|l| crate::rights::RightsLevel::parse("level", &l)).transpose()?;
    let before = match given(&filter.cursor) {
        None => None,
        Some(c) => {
            let parts = super::decode_cursor(&c, 2)?;
            let at = parts[0].parse::<i64>().ok().and_then(chrono::DateTime::from_timestamp_micros);
            match (at, parts[1].parse::<i64>().ok()) {
                (Some(at), Some(id)) => Some((at, id)),
                _ => {
                    return Err(Error::invalid(
                        "cursor",
                        "not a cursor from a previous page; repeat the search without it",
                    ));
                }
            }
        }
    };
    let client = given(&filter.client);
    let query = ds_fns::ConnectionQuery {
        text: text.as_deref(),
        status: status.as_deref(),
        client: client.as_deref(),
        granted: granted.as_deref(),
        level: level.map(|l| l.as_str()),
        before,
    };
    let mut rows =
        ds.connection_search(ctx, &query, &crate::rights::dangerous_names(), limit + 1).await?;
    let next = if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        rows.last().map(|r| {
            super::encode_cursor(&[
                &r.row.created_at.timestamp_micros().to_string(),
                &r.id.to_string(),
            ])
        })
    } else {
        None
    };
    let rows = rows
        .into_iter()
        .map(|f| ConnectionSummary {
            connection: f.row.handle,
            name: f.row.name,
            client_name: f.row.client_name,
            status: f.row.status,
            toolset: f.row.toolset,
            creator: f.row.creator_email,
            rights: f.row.rights,
            created_at: utc_text(f.row.created_at),
            last_used_at: f.row.last_used_at.map(utc_text),
            granted_by: f.row.granted_by,
            how_granted: Some(f.granted),
        })
        .collect();
    Ok(ConnectionPage { rows, clients: ds.connection_clients(ctx).await?, next })
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

#[derive(Debug, Serialize)]
pub struct AuditView {
    /// The row's id, for its chain columns in the export; not shown.
    #[serde(skip)]
    pub id: i64,
    pub at: String,
    pub channel: String,
    pub action: String,
    pub outcome: String,
    /// Public ids only.
    pub targets: Vec<String>,
    pub connection: Option<String>,
    pub connection_name: Option<String>,
    pub client_name: Option<String>,
    pub reason: Option<String>,
    /// How the person behind it proved themself: `passkey pky_… (user verified)`, or the way
    /// their console session began (`password session`).
    pub proven: Option<String>,
    /// Who acted, as people read it: a person by name and email, an operator marked as such,
    /// an agent as its connection and creator, or Gatehouse itself.
    pub actor: String,
    /// The acting person's email (or the acting connection's creator's), for the export.
    pub actor_email: Option<String>,
    /// The acting person's public handle (`per_…`), as the chain names them.
    pub actor_handle: Option<String>,
    /// `person`, `operator`, `agent` or `system`.
    pub actor_kind: &'static str,
    /// What a settings change changed: `{field: {from, to}}`.
    pub change: Option<serde_json::Value>,
}

/// A change as people read it: `per_minute: 30 → 60; mode: agent_confirms → person_approves`.
pub fn change_words(change: &serde_json::Value) -> String {
    let shown = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "none".to_owned(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    change
        .as_object()
        .map(|fields| {
            fields
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{}: {} → {}",
                        k.replace('_', " "),
                        shown(v.get("from").unwrap_or(&serde_json::Value::Null)),
                        shown(v.get("to").unwrap_or(&serde_json::Value::Null))
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default()
}

fn actor_kind(r: &crate::datastore::AuditListRow) -> &'static str {
    match (&r.actor_email, &r.connection_handle) {
        (Some(_), _) if r.actor_operator => "operator",
        (Some(_), _) => "person",
        (None, Some(_)) => "agent",
        (None, None) => "system",
    }
}

fn actor_words(r: &crate::datastore::AuditListRow) -> String {
    let person = || {
        format!(
            "{} <{}>",
            r.actor_name.as_deref().unwrap_or(""),
            r.actor_email.as_deref().unwrap_or("")
        )
    };
    match actor_kind(r) {
        "operator" => format!("{} · platform operator", person()),
        "person" => person(),
        "agent" => format!(
            "agent {} ({}) · created by {}",
            r.connection_name.as_deref().unwrap_or(""),
            r.connection_handle.as_deref().unwrap_or(""),
            r.creator_email.as_deref().unwrap_or("someone no longer here")
        ),
        _ => "Gatehouse (system)".to_owned(),
    }
}

/// What an audit row's proof says, as people read it.
pub(crate) fn proven(proof: Option<&serde_json::Value>) -> Option<String> {
    let p = proof?;
    let method = p.get("method")?.as_str()?;
    Some(match p.get("passkey").and_then(|k| k.as_str()) {
        Some(handle) => {
            let verified = p.get("user_verified").and_then(|v| v.as_bool()) == Some(true);
            format!("passkey {handle}{}", if verified { " (user verified)" } else { "" })
        }
        None => format!(
            "{} session",
            match method {
                "sso" => "single sign-on",
                other => other,
            }
        ),
    })
}

/// What an admin searches the audit log for; every field as it came from outside.
#[derive(Debug, Default, Clone)]
pub struct AuditFilter {
    /// A connection handle (`con_…`).
    pub connection: Option<String>,
    /// The start of an action name: `confirm_booking`, `connection.`.
    pub action: Option<String>,
    /// `ok`, `refused` or `failed`.
    pub outcome: Option<String>,
    /// `mcp`, `api`, `console`, `cli` or `system`.
    pub channel: Option<String>,
    /// A person's email or handle: what they did, and what their connections did.
    pub actor: Option<String>,
    /// A record's public handle (`bkg_…`, `cus_…`, `con_…`, `per_…`): every row about it.
    pub record: Option<String>,
    /// From this day (`2026-11-30`, in the tenant's zone) or instant (RFC 3339) on.
    pub since: Option<String>,
    /// Before this day (the whole day included) or instant.
    pub until: Option<String>,
    /// The `next` of a previous page.
    pub cursor: Option<String>,
}

/// One page of a search and where the next one starts.
#[derive(Debug, Serialize)]
pub struct AuditPage {
    pub rows: Vec<AuditView>,
    pub next: Option<String>,
}

/// Every outcome an audit row can have (the table's check constraint).
pub const AUDIT_OUTCOMES: [&str; 7] =
    ["ok", "refused", "failed", "previewed", "rejected", "awaiting_approval", "denied"];
pub const AUDIT_CHANNELS: [&str; 5] = ["mcp", "api", "console", "cli", "system"];

/// A day (`2026-11-30`, UTC; with `end_of_day` the day after it) or an RFC 3339 instant, in
/// the years people mean.
pub fn audit_instant(
    field: &str,
    raw: &str,
    end_of_day: bool,
) -> Result<chrono::DateTime<chrono::Utc>> {
    audit_instant_in(field, raw, end_of_day, None)
}

/// [`audit_instant`] with days in `zone` (the tenant's: the console's one clock).
pub fn audit_instant_in(
    field: &str,
    raw: &str,
    end_of_day: bool,
    zone: Option<&jiff::tz::TimeZone>,
) -> Result<chrono::DateTime<chrono::Utc>> {
    let bad = || {
        Error::invalid(
            field,
            format!(
                "{field} must be a day like 2026-11-30 or an instant like 2026-11-30T14:00:00Z"
            ),
        )
    };
    // Years Postgres stores and people mean: 1 to 9999 (chrono would take -5000 too).
    use chrono::Datelike as _;
    let in_range = |t: chrono::DateTime<chrono::Utc>| (1..=9999).contains(&t.year());
    if let Ok(day) = chrono::NaiveDate::parse_from_str(raw, "%Y-%m-%d") {
        let day = if end_of_day { day.succ_opt().ok_or_else(bad)? } else { day };
        let at = match zone {
            // The day as the tenant lives it: from its midnight in the tenant's zone.
            Some(tz) => {
                let year = i16::try_from(day.year()).map_err(|_| bad())?;
                let civil = jiff::civil::Date::new(year, day.month() as i8, day.day() as i8)
                    .map_err(|_| bad())?;
                let ts = tz
                    .to_ambiguous_timestamp(civil.at(0, 0, 0, 0))
                    .compatible()
                    .map_err(|_| bad())?;
                chrono::DateTime::from_timestamp(ts.as_second(), 0).ok_or_else(bad)?
            }
            None => day.and_hms_opt(0, 0, 0).ok_or_else(bad)?.and_utc(),
        };
        return if in_range(at) { Ok(at) } else { Err(bad()) };
    }
    chrono::DateTime::parse_from_rfc3339(raw)
        .map(|t| t.to_utc())
        .ok()
        .filter(|t| in_range(*t))
        .ok_or_else(bad)
}

/// Searches the tenant's audit log for admins (R23): what was done, by which channel and
/// connection, to which public ids — never arguments or personal data, because the log never
/// holds them. Filters and pages run in SQL; a filter that cannot match anything real (an
/// unknown outcome, a malformed day) is an error that says what to write instead.
pub async fn audit_search(
    ds: &Services,
    ctx: &OpCtx,
    filter: &AuditFilter,
    limit: i64,
) -> Result<AuditPage> {
    ctx.require(Right::AuditRead)?;
    if !(1..=1000).contains(&limit) {
        return Err(Error::invalid("limit", "use 1 to 1000"));
    }
    let given = |v: &Option<String>| {
        v.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned)
    };
    let connection =
        given(&filter.connection).map(|c| ConnectionHandle::parse("connection", &c)).transpose()?;
    let outcome = given(&filter.outcome);
    if let Some(o) = &outcome
        && !AUDIT_OUTCOMES.contains(&o.as_str())
    {
        return Err(Error::invalid(
            "outcome",
            format!("outcome is one of {}", AUDIT_OUTCOMES.join(", ")),
        ));
    }
    let channel = given(&filter.channel);
    if let Some(c) = &channel
        && !AUDIT_CHANNELS.contains(&c.as_str())
    {
        return Err(Error::invalid("channel", "channel is one of mcp, api, console, cli, system"));
    }
    let action = given(&filter.action);
    if let Some(a) = &action
        && (a.chars().count() > 80 || a.chars().any(char::is_control))
    {
        return Err(Error::invalid(
            "action",
            "action is the start of a tool or action name, at most 80 characters",
        ));
    }
    let action_like = action.map(|a| {
        let escaped = a.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_");
        format!("{escaped}%")
    });
    // Days are the tenant's days, as every time the console shows.
    let zone = Some(&ctx.tenant().zone);
    let since =
        given(&filter.since).map(|s| audit_instant_in("since", &s, false, zone)).transpose()?;
    let until =
        given(&filter.until).map(|s| audit_instant_in("until", &s, true, zone)).transpose()?;
    let after = match given(&filter.cursor) {
        None => None,
        Some(c) => {
            let parts = super::decode_cursor(&c, 2)?;
            use chrono::Datelike as _;
            let at = parts[0]
                .parse::<i64>()
                .ok()
                .and_then(chrono::DateTime::from_timestamp_micros)
                .filter(|t| (1..=9999).contains(&t.year()));
            let id = parts[1].parse::<i64>().ok();
            match (at, id) {
                (Some(at), Some(id)) => Some((at, id)),
                _ => {
                    return Err(Error::invalid(
                        "cursor",
                        "not a cursor from a previous page; repeat the search without it",
                    ));
                }
            }
        }
    };
    let actor = given(&filter.actor);
    let record = given(&filter.record);
    for (field, v) in [("actor", &actor), ("record", &record)] {
        if v.as_ref().is_some_and(|v| v.chars().count() > 200 || v.chars().any(char::is_control)) {
            return Err(Error::invalid(
                field,
                format!("{field} is an email address or a public handle, at most 200 characters"),
            ));
        }
    }
    let query = ds_fns::AuditQuery {
        connection: connection.as_ref().map(|c| c.as_str()),
        action_like,
        outcome: outcome.as_deref(),
        channel: channel.as_deref(),
        actor: actor.as_deref(),
        record: record.as_deref(),
        since,
        until,
        after,
    };
    // One row more than asked says whether there is a next page.
    let mut rows = ds.audit_search(ctx, &query, limit + 1).await?;
    let next = if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        rows.last().map(|r| {
            super::encode_cursor(&[&r.at.timestamp_micros().to_string(), &r.id.to_string()])
        })
    } else {
        None
    };
    let rows = rows
        .into_iter()
        .map(|r| (actor_words(&r), actor_kind(&r), r))
        .map(|(actor, actor_kind, r)| AuditView {
            id: r.id,
            at: crate::datastore::to_ts(r.at).strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            channel: r.channel,
            action: r.action,
            outcome: r.outcome,
            targets: r.targets,
            connection: r.connection_handle,
            connection_name: r.connection_name,
            client_name: r.client_name,
            proven: proven(r.proof.as_ref()),
            actor,
            actor_email: r.actor_email.or(r.creator_email),
            actor_handle: r.actor_handle,
            actor_kind,
            reason: r.reason,
            change: r.change,
        })
        .collect();
    Ok(AuditPage { rows, next })
}

/// The newest `limit` audit rows of the tenant, or of one connection.
pub async fn audit_list(
    ds: &Services,
    ctx: &OpCtx,
    connection: Option<&str>,
    limit: i64,
) -> Result<Vec<AuditView>> {
    let filter = AuditFilter { connection: connection.map(str::to_owned), ..Default::default() };
    Ok(audit_search(ds, ctx, &filter, limit).await?.rows)
}

/// Whether the global kill switch is on, for the operator page.
pub async fn global_kill_state(ds: &Services, _by: &Operator) -> Result<bool> {
    ds_fns::platform_kill_get(ds).await
}
