//! Invitations to a tenant: written by an admin with the email that carries their link, found
//! by their token's hash before anyone is signed in, accepted once.

use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

/// An invitation as the People page lists it and the acceptance page reads it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct InvitationRow {
    pub id: i64,
    pub handle: String,
    pub tenant_id: i64,
    pub email: String,
    pub name: String,
    pub role: String,
    pub invited_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub accepted_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "i.id, i.handle, i.tenant_id, i.email, i.name, i.role, \
     p.email AS invited_by, i.created_at, i.expires_at, i.accepted_at, i.revoked_at";

pub struct NewInvitation<'a> {
    pub handle: &'a str,
    pub email: &'a str,
    pub name: &'a str,
    pub role: &'a str,
    pub token_hash: &'a [u8],
    pub invited_by: Option<i64>,
    pub days: i64,
}

/// Closes the address's expired open invitation, then writes the new one; `None` when one is
/// still open (the unique index decides, so two admins inviting at once make one).
pub(crate) async fn invitation_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    new: &NewInvitation<'_>,
) -> Result<Option<DateTime<Utc>>> {
    sqlx::query(
        "UPDATE invitations SET revoked_at = expires_at
         WHERE tenant_id = $1 AND lower(email) = lower($2)
           AND accepted_at IS NULL AND revoked_at IS NULL AND expires_at <= now()",
    )
    .bind(ctx.tenant_id())
    .bind(new.email)
    .execute(&mut **tx)
    .await?;
    Ok(sqlx::query_scalar(
        "INSERT INTO invitations (handle, tenant_id, email, name, role, token_hash, invited_by, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, now() + make_interval(days => $8))
         ON CONFLICT (tenant_id, lower(email)) WHERE accepted_at IS NULL AND revoked_at IS NULL
         DO NOTHING RETURNING expires_at",
    )
    .bind(new.handle)
    .bind(ctx.tenant_id())
    .bind(new.email)
    .bind(new.name)
    .bind(new.role)
    .bind(new.token_hash)
    .bind(new.invited_by)
    .bind(new.days as i32)
    .fetch_optional(&mut **tx)
    .await?)
}

/// Revokes one open invitation of the tenant; `None` when the tenant has no such invitation,
/// `Some(false)` when it was accepted or revoked already.
pub(crate) async fn invitation_revoke(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
) -> Result<Option<(bool, String)>> {
    Ok(sqlx::query_as(
        "WITH target AS (
             SELECT id, email, accepted_at IS NULL AND revoked_at IS NULL AS open
             FROM invitations WHERE tenant_id = $1 AND handle = $2 FOR UPDATE),
         revoked AS (
             UPDATE invitations i SET revoked_at = now()
             FROM target WHERE i.id = target.id AND target.open RETURNING i.id)
         SELECT EXISTS (SELECT 1 FROM revoked), email FROM target",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .fetch_optional(&mut **tx)
    .await?)
}

/// Marks an invitation accepted by `person_id`, once: only an open, unexpired one changes, in
/// the statement that checks it, so two acceptances at once make one member.
pub(crate) async fn preauth_invitation_accept(
    tx: &mut Tx<'_>,
    id: i64,
    person_id: i64,
    how: &str,
) -> Result<bool> {
    Ok(sqlx::query(
        "UPDATE invitations SET accepted_at = now(), accepted_how = $3, person_id = $2
         WHERE id = $1 AND accepted_at IS NULL AND revoked_at IS NULL AND expires_at > now()",
    )
    .bind(id)
    .bind(person_id)
    .bind(how)
    .execute(&mut **tx)
    .await?
    .rows_affected()
        == 1)
}

/// Whether the person is an active member of the tenant now.
pub(crate) async fn preauth_membership_active(
    tx: &mut Tx<'_>,
    tenant_id: i64,
    person_id: i64,
) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM memberships WHERE tenant_id = $1 AND person_id = $2 AND active)",
    )
    .bind(tenant_id)
    .bind(person_id)
    .fetch_one(&mut **tx)
    .await?)
}

/// Drops the link from the invitation's email once it can no longer be used (accepted or
/// revoked), so the outbox keeps no live secret.
pub(crate) async fn preauth_invitation_forget_link(
    tx: &mut Tx<'_>,
    tenant_id: i64,
    handle: &str,
) -> Result<()> {
    sqlx::query(
        "UPDATE outbox SET body = 'This invitation was used or revoked; its link no longer works.'
         WHERE tenant_id = $1 AND idempotency_key = 'invitation:' || $2",
    )
    .bind(tenant_id)
    .bind(handle)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Closes every open invitation of an address to the tenant (the person was added directly,
/// or deactivated: an older invitation must not bring them back or change their role).
pub(crate) async fn invitation_close_for(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    email: &str,
) -> Result<Vec<String>> {
    let handles: Vec<String> = sqlx::query_scalar(
        "UPDATE invitations SET revoked_at = now()
         WHERE tenant_id = $1 AND lower(email) = lower($2) AND accepted_at IS NULL AND revoked_at IS NULL
         RETURNING handle",
    )
    .bind(ctx.tenant_id())
    .bind(email)
    .fetch_all(&mut **tx)
    .await?;
    for h in &handles {
        preauth_invitation_forget_link(tx, ctx.tenant_id(), h).await?;
    }
    Ok(handles)
}

/// Adds a person invited by email (no password when `password_hash` is `None`), with the
/// WebAuthn user handle their first passkey was made for.
pub(crate) async fn preauth_invited_person_insert(
    tx: &mut Tx<'_>,
    handle: &str,
    email: &str,
    name: &str,
    password_hash: Option<&str>,
    webauthn_id: Option<&str>,
) -> Result<PersonRow> {
    Ok(sqlx::query_as::<_, PersonRow>(
        "INSERT INTO people (handle, email, name, password_hash, webauthn_id)
         VALUES ($1, $2, $3, $4, coalesce($5::uuid, gen_random_uuid()))
         RETURNING id, handle, email, name, active",
    )
    .bind(handle)
    .bind(email)
    .bind(name)
    .bind(password_hash)
    .bind(webauthn_id)
    .fetch_one(&mut **tx)
    .await?)
}

/// Stores the passkey an invited person joins with; `None` when the credential is registered
/// already.
pub(crate) async fn preauth_invited_passkey_insert(
    tx: &mut Tx<'_>,
    person_id: i64,
    handle: &str,
    credential_id: &[u8],
    passkey: &serde_json::Value,
) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(
        "INSERT INTO passkeys (handle, person_id, credential_id, name, passkey)
         VALUES ($1, $2, $3, 'Passkey', $4)
         ON CONFLICT (credential_id) DO NOTHING RETURNING id",
    )
    .bind(handle)
    .bind(person_id)
    .bind(credential_id)
    .bind(passkey)
    .fetch_optional(&mut **tx)
    .await?)
}

/// Gives an invited person their membership, within the invitation's tenant.
pub(crate) async fn preauth_invited_membership(
    tx: &mut Tx<'_>,
    tenant_id: i64,
    person_id: i64,
    role: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO memberships (tenant_id, person_id, role) VALUES ($1, $2, $3)
         ON CONFLICT (tenant_id, person_id) DO UPDATE SET role = EXCLUDED.role, active = true",
    )
    .bind(tenant_id)
    .bind(person_id)
    .bind(role)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Services {
    /// The invitation a link's token names, whatever its state (the page says which).
    pub(crate) async fn preauth_invitation_by_token(
        &self,
        token_hash: &[u8],
    ) -> Result<Option<InvitationRow>> {
        Ok(sqlx::query_as::<_, InvitationRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM invitations i LEFT JOIN people p ON p.id = i.invited_by
             WHERE i.token_hash = $1"
        )))
        .bind(token_hash)
        .fetch_optional(self.pool())
        .await?)
    }

    /// The open, unexpired invitation of `email` to the tenant, for single sign-on.
    pub(crate) async fn preauth_invitation_open_for(
        &self,
        tenant_id: i64,
        email: &str,
    ) -> Result<Option<InvitationRow>> {
        Ok(sqlx::query_as::<_, InvitationRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM invitations i LEFT JOIN people p ON p.id = i.invited_by
             WHERE i.tenant_id = $1 AND lower(i.email) = lower($2)
               AND i.accepted_at IS NULL AND i.revoked_at IS NULL AND i.expires_at > now()"
        )))
        .bind(tenant_id)
        .bind(email)
        .fetch_optional(self.pool())
        .await?)
    }

    /// One open invitation of the tenant by its handle.
    pub(crate) async fn invitation_get_open(
        &self,
        ctx: &OpCtx,
        handle: &str,
    ) -> Result<Option<InvitationRow>> {
        Ok(sqlx::query_as::<_, InvitationRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM invitations i LEFT JOIN people p ON p.id = i.invited_by
             WHERE i.tenant_id = $1 AND i.handle = $2 AND i.accepted_at IS NULL AND i.revoked_at IS NULL"
        )))
        .bind(ctx.tenant_id())
        .bind(handle)
        .fetch_optional(self.pool())
        .await?)
    }

    /// The tenant's open invitations (expired ones included: the page says so), newest first.
    pub(crate) async fn invitation_list_open(
        &self,
        ctx: &OpCtx,
        limit: i64,
    ) -> Result<Vec<InvitationRow>> {
        Ok(sqlx::query_as::<_, InvitationRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM invitations i LEFT JOIN people p ON p.id = i.invited_by
             WHERE i.tenant_id = $1 AND i.accepted_at IS NULL AND i.revoked_at IS NULL
             ORDER BY i.created_at DESC, i.id DESC LIMIT $2"
        )))
        .bind(ctx.tenant_id())
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }
}
