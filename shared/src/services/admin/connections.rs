//! Agent connections as admins manage them: created (capped at the creator's rights), edited,
//! revoked, found and paged.

use super::*;

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
pub(crate) fn connection_decision(
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
pub(super) fn toolset_widens(from: &str, to: &str) -> bool {
    from != to && to != "read_only"
}

/// The decision an edit is when it widens the connection (rights it lacks, a larger toolset):
/// `None` when it renames or narrows, which never waits for a passkey.
pub(crate) fn connection_edit_decision(
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

pub(super) async fn connections(
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
            let parts = crate::services::decode_cursor(&c, 2)?;
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
            crate::services::encode_cursor(&[
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
