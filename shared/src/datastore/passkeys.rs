//! Passkeys, WebAuthn ceremonies in flight, and the tenant's passkey policy. A person's
//! credentials are the person's, not a tenant's: those queries are `preauth_` (they run
//! before or outside a tenant context) and filter by the person the library verified.

use super::{Services, Tx};
use crate::ctx::OpCtx;
use crate::error::Result;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PasskeyRow {
    pub id: i64,
    pub handle: String,
    pub person_id: i64,
    pub name: String,
    pub passkey: serde_json::Value,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub last_used_at: Option<chrono::DateTime<chrono::Utc>>,
}

const COLUMNS: &str = "id, handle, person_id, name, passkey, created_at, last_used_at";

/// A ceremony taken for its one use.
#[derive(Debug, sqlx::FromRow)]
pub struct CeremonyRow {
    pub decision: Option<String>,
    pub state: serde_json::Value,
}

/// What a passkey sign-in needs of the person a credential names.
#[derive(Debug, sqlx::FromRow)]
pub struct PasskeyPersonRow {
    pub id: i64,
    pub active: bool,
    pub webauthn_id: String,
    pub email: String,
    pub name: String,
    pub password_hash: Option<String>,
}

impl Services {
    pub(crate) async fn preauth_passkeys_of(&self, person_id: i64) -> Result<Vec<PasskeyRow>> {
        Ok(sqlx::query_as::<_, PasskeyRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM passkeys WHERE person_id = $1 ORDER BY created_at, id"
        )))
        .bind(person_id)
        .fetch_all(self.pool())
        .await?)
    }

    pub(crate) async fn preauth_passkey_person(
        &self,
        person_id: i64,
    ) -> Result<Option<PasskeyPersonRow>> {
        Ok(sqlx::query_as::<_, PasskeyPersonRow>(
            "SELECT id, active, webauthn_id::text AS webauthn_id, email, name,
                    password_hash
             FROM people WHERE id = $1",
        )
        .bind(person_id)
        .fetch_optional(self.pool())
        .await?)
    }

    pub(crate) async fn preauth_person_by_webauthn_id(
        &self,
        webauthn_id: &str,
    ) -> Result<Option<PasskeyPersonRow>> {
        Ok(sqlx::query_as::<_, PasskeyPersonRow>(
            "SELECT id, active, webauthn_id::text AS webauthn_id, email, name,
                    password_hash
             FROM people WHERE webauthn_id = $1::uuid",
        )
        .bind(webauthn_id)
        .fetch_optional(self.pool())
        .await?)
    }

    pub(crate) async fn preauth_passkey_insert(
        &self,
        person_id: i64,
        handle: &str,
        credential_id: &[u8],
        name: &str,
        passkey: &serde_json::Value,
    ) -> Result<Option<PasskeyRow>> {
        Ok(sqlx::query_as::<_, PasskeyRow>(sqlx::AssertSqlSafe(format!(
            "INSERT INTO passkeys (handle, person_id, credential_id, name, passkey)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (credential_id) DO NOTHING
             RETURNING {COLUMNS}"
        )))
        .bind(handle)
        .bind(person_id)
        .bind(credential_id)
        .bind(name)
        .bind(passkey)
        .fetch_optional(self.pool())
        .await?)
    }

    pub(crate) async fn preauth_passkey_delete(
        &self,
        person_id: i64,
        handle: &str,
    ) -> Result<Option<PasskeyRow>> {
        Ok(sqlx::query_as::<_, PasskeyRow>(sqlx::AssertSqlSafe(format!(
            "DELETE FROM passkeys WHERE person_id = $1 AND handle = $2 RETURNING {COLUMNS}"
        )))
        .bind(person_id)
        .bind(handle)
        .fetch_optional(self.pool())
        .await?)
    }

    pub(crate) async fn preauth_ceremony_create(
        &self,
        token_hash: &[u8],
        purpose: &str,
        person_id: Option<i64>,
        decision: Option<&str>,
        state: &serde_json::Value,
        ttl_secs: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO webauthn_ceremonies (token_hash, purpose, person_id, decision, state, expires_at)
             VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))",
        )
        .bind(token_hash)
        .bind(purpose)
        .bind(person_id)
        .bind(decision)
        .bind(state)
        .bind(ttl_secs as f64)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Takes a ceremony for its one use: unused, unexpired, of this purpose and (when given)
    /// this person. A second take of the same ceremony finds nothing.
    pub(crate) async fn preauth_ceremony_take(
        &self,
        token_hash: &[u8],
        purpose: &str,
        person_id: Option<i64>,
    ) -> Result<Option<CeremonyRow>> {
        Ok(sqlx::query_as::<_, CeremonyRow>(
            "UPDATE webauthn_ceremonies SET used_at = now()
             WHERE token_hash = $1 AND purpose = $2 AND used_at IS NULL AND expires_at > now()
               AND ($3::bigint IS NULL OR person_id = $3)
             RETURNING decision, state",
        )
        .bind(token_hash)
        .bind(purpose)
        .bind(person_id)
        .fetch_optional(self.pool())
        .await?)
    }
}

/// Locks a credential's row for a use: the counter check and its update happen under it,
/// so two assertions racing cannot both pass with the same counter.
pub(crate) async fn preauth_passkey_lock(
    tx: &mut Tx<'_>,
    credential_id: &[u8],
) -> Result<Option<PasskeyRow>> {
    Ok(sqlx::query_as::<_, PasskeyRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM passkeys WHERE credential_id = $1 FOR UPDATE"
    )))
    .bind(credential_id)
    .fetch_optional(&mut **tx)
    .await?)
}

pub(crate) async fn preauth_passkey_used(
    tx: &mut Tx<'_>,
    id: i64,
    passkey: &serde_json::Value,
) -> Result<()> {
    sqlx::query("UPDATE passkeys SET passkey = $2, last_used_at = now() WHERE id = $1")
        .bind(id)
        .bind(passkey)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Removes every passkey of a person and ends all their console sessions (the operator's
/// recovery); returns how many passkeys there were.
pub(crate) async fn platform_passkeys_reset(tx: &mut Tx<'_>, person_id: i64) -> Result<u64> {
    sqlx::query("DELETE FROM console_sessions WHERE person_id = $1")
        .bind(person_id)
        .execute(&mut **tx)
        .await?;
    sqlx::query("DELETE FROM webauthn_ceremonies WHERE person_id = $1")
        .bind(person_id)
        .execute(&mut **tx)
        .await?;
    Ok(sqlx::query("DELETE FROM passkeys WHERE person_id = $1")
        .bind(person_id)
        .execute(&mut **tx)
        .await?
        .rows_affected())
}

/// Whether the tenant's decisions that widen what agents can do need a passkey, read in
/// the decision's own transaction.
pub(crate) async fn decisions_need_passkey(tx: &mut Tx<'_>, ctx: &OpCtx) -> Result<bool> {
    Ok(sqlx::query_scalar::<_, bool>("SELECT decisions_need_passkey FROM tenants WHERE id = $1")
        .bind(ctx.tenant_id())
        .fetch_one(&mut **tx)
        .await?)
}

pub(crate) async fn passkey_policy_put(tx: &mut Tx<'_>, ctx: &OpCtx, on: bool) -> Result<()> {
    sqlx::query("UPDATE tenants SET decisions_need_passkey = $2 WHERE id = $1")
        .bind(ctx.tenant_id())
        .bind(on)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
