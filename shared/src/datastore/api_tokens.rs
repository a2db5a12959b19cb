//! API tokens of the REST API: created with an expiry, listed per tenant, revoked with a reason.

use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

/// An API token as the console and the CLI list it (never its secret).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ApiTokenRow {
    pub handle: String,
    pub name: String,
    pub person_email: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

pub(crate) async fn api_token_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    person_id: i64,
    name: &str,
    token_hash: &[u8],
    expires_in_days: i64,
) -> Result<DateTime<Utc>> {
    Ok(sqlx::query_scalar(
        "INSERT INTO api_tokens (tenant_id, handle, person_id, name, token_hash, expires_at)
         VALUES ($1, $2, $3, $4, $5, now() + make_interval(days => $6))
         RETURNING expires_at",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(person_id)
    .bind(name)
    .bind(token_hash)
    .bind(expires_in_days as i32)
    .fetch_one(&mut **tx)
    .await?)
}

/// Revokes one API token of the context's tenant. `None` when the tenant has no such token;
/// `Some(false)` when it was revoked already.
pub(crate) async fn api_token_revoke(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    reason: &str,
) -> Result<Option<bool>> {
    Ok(sqlx::query_scalar(
        "WITH target AS (
             SELECT id, revoked_at IS NULL AS live FROM api_tokens
             WHERE tenant_id = $1 AND handle = $2 FOR UPDATE),
         revoked AS (
             UPDATE api_tokens a SET revoked_at = now(), revoke_reason = $3
             FROM target WHERE a.id = target.id AND target.live RETURNING a.id)
         SELECT EXISTS (SELECT 1 FROM revoked) FROM target",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(reason)
    .fetch_optional(&mut **tx)
    .await?)
}

/// What a search of the tenant's API tokens asks for.
#[derive(Debug, Default, Clone, Copy)]
pub struct ApiTokenQuery<'a> {
    /// Part of the token's name or of its person's email.
    pub text: Option<&'a str>,
    /// `active`, `expired` or `revoked`.
    pub status: Option<&'a str>,
    /// The last row of the previous page: its creation time and handle.
    pub after: Option<(DateTime<Utc>, &'a str)>,
}

impl Services {
    /// A page of the tenant's API tokens, newest first, searched and filtered in SQL.
    pub(crate) async fn api_token_search(
        &self,
        ctx: &OpCtx,
        q: &ApiTokenQuery<'_>,
        limit: i64,
    ) -> Result<Vec<ApiTokenRow>> {
        Ok(sqlx::query_as::<_, ApiTokenRow>(
            "SELECT a.handle, a.name, p.email AS person_email, a.created_at, a.expires_at, a.revoked_at
             FROM api_tokens a JOIN people p ON p.id = a.person_id
             WHERE a.tenant_id = $1
               AND ($2::text IS NULL OR strpos(lower(a.name || ' ' || p.email), lower($2)) > 0)
               AND CASE $3::text
                     WHEN 'revoked' THEN a.revoked_at IS NOT NULL
                     WHEN 'expired' THEN a.revoked_at IS NULL AND a.expires_at <= now()
                     WHEN 'active' THEN a.revoked_at IS NULL AND a.expires_at > now()
                     ELSE true END
               AND ($4::timestamptz IS NULL OR (a.created_at, a.handle) < ($4, $5))
             ORDER BY a.created_at DESC, a.handle DESC LIMIT $6",
        )
        .bind(ctx.tenant_id())
        .bind(q.text)
        .bind(q.status)
        .bind(q.after.map(|a| a.0))
        .bind(q.after.map(|a| a.1))
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    /// The tenant's API tokens, newest first.
    pub(crate) async fn api_token_list(&self, ctx: &OpCtx) -> Result<Vec<ApiTokenRow>> {
        Ok(sqlx::query_as::<_, ApiTokenRow>(
            "SELECT a.handle, a.name, p.email AS person_email, a.created_at, a.expires_at, a.revoked_at
             FROM api_tokens a JOIN people p ON p.id = a.person_id
             WHERE a.tenant_id = $1 ORDER BY a.created_at DESC, a.id DESC",
        )
        .bind(ctx.tenant_id())
        .fetch_all(self.pool())
        .await?)
    }

    /// One API token of the tenant, for the revocation page.
    pub(crate) async fn api_token_get(
        &self,
        ctx: &OpCtx,
        handle: &str,
    ) -> Result<Option<ApiTokenRow>> {
        Ok(sqlx::query_as::<_, ApiTokenRow>(
            "SELECT a.handle, a.name, p.email AS person_email, a.created_at, a.expires_at, a.revoked_at
             FROM api_tokens a JOIN people p ON p.id = a.person_id
             WHERE a.tenant_id = $1 AND a.handle = $2",
        )
        .bind(ctx.tenant_id())
        .bind(handle)
        .fetch_optional(self.pool())
        .await?)
    }
}
