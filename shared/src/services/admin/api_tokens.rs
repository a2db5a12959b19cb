//! A person's API tokens for the REST API: created with an expiry, listed and paged, revoked.

use super::*;

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

pub(super) fn utc_text(t: chrono::DateTime<chrono::Utc>) -> String {
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

pub(super) fn api_token_summary(row: ds_fns::ApiTokenRow) -> ApiTokenSummary {
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
    let text = crate::services::filter_search(&filter.q)?;
    let status = crate::services::filter_one_of(
        "status",
        "status",
        &filter.status,
        &["active", "expired", "revoked"],
    )?;
    let after = match crate::services::filter_value(&filter.cursor) {
        None => None,
        Some(c) => {
            let parts = crate::services::decode_cursor(&c, 2)?;
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
            crate::services::encode_cursor(&[
                &r.created_at.timestamp_micros().to_string(),
                &r.handle,
            ])
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
