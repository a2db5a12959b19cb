//! Agent connections, their tokens and API tokens.

use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ConnectionRow {
    pub handle: String,
    pub name: String,
    pub client_name: String,
    pub rights: Vec<String>,
    pub status: String,
    pub toolset: String,
    pub creator_email: String,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    /// `idp` when the tenant's identity provider granted it (an ID-JAG).
    pub granted_by: Option<String>,
}

/// What a search of the tenant's connections asks for.
#[derive(Debug, Default)]
pub struct ConnectionQuery<'a> {
    /// Part of the name, handle, client or creator's email.
    pub text: Option<&'a str>,
    pub status: Option<&'a str>,
    pub client: Option<&'a str>,
    /// `token`, `oauth` or `idp`.
    pub granted: Option<&'a str>,
    /// `read`, `write` or `dangerous` ([`crate::rights::RightsLevel`]).
    pub level: Option<&'a str>,
    /// Newest first: the page after `(created_at, id)`.
    pub before: Option<(DateTime<Utc>, i64)>,
}

/// A connection of a search, with the position the next page starts after.
#[derive(Debug, sqlx::FromRow)]
pub struct ConnectionFound {
    pub id: i64,
    #[sqlx(flatten)]
    pub row: ConnectionRow,
    /// `token`, `oauth` or `idp`.
    pub granted: String,
}

impl Services {
    /// A page of the tenant's connections, newest first, searched and filtered in SQL; the
    /// rights level is computed from the dangerous rights' names given.
    pub(crate) async fn connection_search(
        &self,
        ctx: &OpCtx,
        q: &ConnectionQuery<'_>,
        dangerous: &[&str],
        limit: i64,
    ) -> Result<Vec<ConnectionFound>> {
        Ok(sqlx::query_as::<_, ConnectionFound>(
            "SELECT * FROM (
               SELECT c.id, c.handle, c.name, c.client_name, c.rights, c.status, c.toolset,
                      p.email AS creator_email, c.created_at, c.last_used_at, c.granted_by,
                      CASE WHEN c.granted_by = 'idp' THEN 'idp'
                           WHEN c.oauth_client_id IS NOT NULL THEN 'oauth' ELSE 'token' END AS granted,
                      CASE WHEN c.rights && $7::text[] THEN 'dangerous'
                           WHEN EXISTS (SELECT 1 FROM unnest(c.rights) r WHERE r NOT LIKE '%:read') THEN 'write'
                           ELSE 'read' END AS level
               FROM connections c JOIN people p ON p.id = c.creator_id
               WHERE c.tenant_id = $1
                 AND ($2::text IS NULL OR strpos(lower(c.name || ' ' || c.handle || ' ' || c.client_name || ' ' || p.email), lower($2)) > 0)
                 AND ($3::text IS NULL OR c.status = $3)
                 AND ($4::text IS NULL OR c.client_name = $4)
                 AND ($8::timestamptz IS NULL OR (c.created_at, c.id) < ($8, $9))
             ) found
             WHERE ($5::text IS NULL OR granted = $5) AND ($6::text IS NULL OR level = $6)
             ORDER BY created_at DESC, id DESC LIMIT $10",
        )
        .bind(ctx.tenant_id())
        .bind(q.text)
        .bind(q.status)
        .bind(q.client)
        .bind(q.granted)
        .bind(q.level)
        .bind(dangerous)
        .bind(q.before.map(|b| b.0))
        .bind(q.before.map(|b| b.1))
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    /// The client names of the tenant's connections, for a filter's choices.
    pub(crate) async fn connection_clients(&self, ctx: &OpCtx) -> Result<Vec<String>> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT DISTINCT client_name FROM connections WHERE tenant_id = $1 ORDER BY client_name LIMIT 200",
        )
        .bind(ctx.tenant_id())
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(|(c,)| c).collect())
    }

    /// The tenant's connections, or the one with `handle` (a unique-index lookup).
    pub(crate) async fn connection_list(
        &self,
        ctx: &OpCtx,
        handle: Option<&str>,
    ) -> Result<Vec<ConnectionRow>> {
        Ok(sqlx::query_as::<_, ConnectionRow>(
            "SELECT c.id, c.handle, c.name, c.client_name, c.rights, c.status, c.toolset,
                    p.email AS creator_email, c.created_at, c.last_used_at, c.granted_by
             FROM connections c JOIN people p ON p.id = c.creator_id
             WHERE c.tenant_id = $1 AND ($2::text IS NULL OR c.handle = $2)
             ORDER BY c.created_at, c.id",
        )
        .bind(ctx.tenant_id())
        .bind(handle)
        .fetch_all(self.pool())
        .await?)
    }
}

/// Changes an active connection's name, rights and toolset; false when it is not active.
pub(crate) async fn connection_update(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    name: &str,
    rights: &[String],
    toolset: &str,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE connections SET name = $3, rights = $4, toolset = $5
         WHERE tenant_id = $1 AND handle = $2 AND status = 'active'",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(name)
    .bind(rights)
    .bind(toolset)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub(crate) async fn connection_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    creator_id: i64,
    name: &str,
    client_name: &str,
    rights: &[String],
) -> Result<i64> {
    connection_insert_toolset(tx, ctx, handle, creator_id, name, client_name, rights, "full").await
}

#[expect(clippy::too_many_arguments, reason = "one column each")]
pub(crate) async fn connection_insert_toolset(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    creator_id: i64,
    name: &str,
    client_name: &str,
    rights: &[String],
    toolset: &str,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO connections (tenant_id, handle, creator_id, name, client_name, rights, toolset)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(creator_id)
    .bind(name)
    .bind(client_name)
    .bind(rights)
    .bind(toolset)
    .fetch_one(&mut **tx)
    .await?)
}

/// Inserts a token of one of the context tenant's connections.
#[expect(clippy::too_many_arguments, reason = "one column each, and the context")]
pub(crate) async fn connection_token_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    connection_id: i64,
    kind: &str,
    token_hash: &[u8],
    audience: Option<&str>,
    expires_at: Option<DateTime<Utc>>,
    grant_expires_at: Option<DateTime<Utc>>,
) -> Result<()> {
    let inserted = sqlx::query(
        "INSERT INTO connection_tokens (connection_id, kind, token_hash, audience, expires_at, grant_expires_at)
         SELECT id, $2, $3, $4, $5, $6 FROM connections WHERE id = $1 AND tenant_id = $7",
    )
    .bind(connection_id)
    .bind(kind)
    .bind(token_hash)
    .bind(audience)
    .bind(expires_at)
    .bind(grant_expires_at)
    .bind(ctx.tenant_id())
    .execute(&mut **tx)
    .await?;
    one_row(inserted.rows_affected(), "connection token for a connection outside the tenant")
}

/// Inserts a token for a connection at the OAuth token endpoint, where the code or refresh
/// token is the only credential and there is no actor yet.
pub(crate) async fn preauth_connection_token_insert(
    tx: &mut Tx<'_>,
    connection_id: i64,
    kind: &str,
    token_hash: &[u8],
    audience: Option<&str>,
    expires_at: Option<DateTime<Utc>>,
    grant_expires_at: Option<DateTime<Utc>>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO connection_tokens (connection_id, kind, token_hash, audience, expires_at, grant_expires_at)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(connection_id)
    .bind(kind)
    .bind(token_hash)
    .bind(audience)
    .bind(expires_at)
    .bind(grant_expires_at)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Revokes the active connections of the tenant that match: one handle, or every connection a
/// creator made. Returns the ids and handles revoked.
pub(crate) async fn connection_revoke_where(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: Option<&str>,
    creator_id: Option<i64>,
    reason: &str,
) -> Result<Vec<(i64, String)>> {
    let revoked: Vec<(i64, String)> = sqlx::query_as(
        "UPDATE connections SET status = 'revoked', revoked_at = now(), revoked_reason = $4
         WHERE tenant_id = $1 AND status = 'active'
           AND ($2::text IS NULL OR handle = $2)
           AND ($3::bigint IS NULL OR creator_id = $3)
         RETURNING id, handle",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(creator_id)
    .bind(reason)
    .fetch_all(&mut **tx)
    .await?;
    if !revoked.is_empty() {
        // Tokens die with their connection.
        sqlx::query(
            "DELETE FROM connection_tokens WHERE connection_id = ANY($2)
               AND connection_id IN (SELECT id FROM connections WHERE tenant_id = $1)",
        )
        .bind(ctx.tenant_id())
        .bind(revoked.iter().map(|(id, _)| *id).collect::<Vec<i64>>())
        .execute(&mut **tx)
        .await?;
    }
    Ok(revoked)
}

pub(crate) async fn connection_status(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
) -> Result<Option<String>> {
    Ok(sqlx::query_scalar("SELECT status FROM connections WHERE tenant_id = $1 AND handle = $2")
        .bind(ctx.tenant_id())
        .bind(handle)
        .fetch_optional(&mut **tx)
        .await?)
}

/// The tenant and handle of a connection, by id: a revocation found by token builds its job
/// context from them.
pub(crate) async fn entry_connection_by_id(
    tx: &mut Tx<'_>,
    id: i64,
) -> Result<Option<(i64, String)>> {
    Ok(sqlx::query_as::<_, (i64, String)>(
        "SELECT tenant_id, handle FROM connections WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&mut **tx)
    .await?)
}

/// The rights a connection was granted, as stored.
pub(crate) async fn preauth_connection_rights(tx: &mut Tx<'_>, id: i64) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar("SELECT rights FROM connections WHERE id = $1")
        .bind(id)
        .fetch_one(&mut **tx)
        .await?)
}

/// Ends every OAuth token of a connection (its grant is being replaced); static tokens stay.
pub(crate) async fn connection_tokens_end(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    connection_id: i64,
) -> Result<()> {
    sqlx::query(
        "DELETE FROM connection_tokens WHERE kind IN ('access', 'refresh')
           AND connection_id = (SELECT id FROM connections WHERE id = $1 AND tenant_id = $2)",
    )
    .bind(connection_id)
    .bind(ctx.tenant_id())
    .execute(&mut **tx)
    .await?;
    Ok(())
}
