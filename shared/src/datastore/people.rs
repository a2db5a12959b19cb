//! People, their memberships and roles, the operator role, and sign-in throttling.

use crate::ctx::OpCtx;
use crate::datastore::*;
use crate::error::Result;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PersonRow {
    pub id: i64,
    pub handle: String,
    pub email: String,
    pub name: String,
    pub active: bool,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MembershipRow {
    pub role: String,
    pub active: bool,
}

impl Services {
    /// A person by email. People belong to no tenant (one person, many memberships), so a
    /// tenant admin adding a member and an operator granting the role read the same row.
    pub(crate) async fn platform_person_by_email(&self, email: &str) -> Result<Option<PersonRow>> {
        Ok(sqlx::query_as::<_, PersonRow>(
            "SELECT id, handle, email, name, active FROM people WHERE lower(email) = lower($1)",
        )
        .bind(email)
        .fetch_optional(self.pool())
        .await?)
    }
}

impl Services {
    pub(crate) async fn membership_get(
        &self,
        ctx: &OpCtx,
        person_id: i64,
    ) -> Result<Option<MembershipRow>> {
        Ok(sqlx::query_as::<_, MembershipRow>(
            "SELECT role, active FROM memberships WHERE tenant_id = $1 AND person_id = $2",
        )
        .bind(ctx.tenant_id())
        .bind(person_id)
        .fetch_optional(self.pool())
        .await?)
    }
}

/// A new person, in no tenant yet (a membership follows for a tenant admin).
pub(crate) async fn platform_person_insert(
    tx: &mut Tx<'_>,
    handle: &str,
    email: &str,
    name: &str,
    password_hash: Option<&str>,
) -> Result<PersonRow> {
    Ok(sqlx::query_as::<_, PersonRow>(
        "INSERT INTO people (handle, email, name, password_hash) VALUES ($1, $2, $3, $4)
         RETURNING id, handle, email, name, active",
    )
    .bind(handle)
    .bind(email)
    .bind(name)
    .bind(password_hash)
    .fetch_one(&mut **tx)
    .await?)
}

pub(crate) async fn membership_upsert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    person_id: i64,
    role: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO memberships (tenant_id, person_id, role) VALUES ($1, $2, $3)
         ON CONFLICT (tenant_id, person_id) DO UPDATE SET role = EXCLUDED.role, active = true",
    )
    .bind(ctx.tenant_id())
    .bind(person_id)
    .bind(role)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Ends what a person signed in with for the context's tenant: their API tokens there (revoked,
/// returning the handles) and all their console sessions. A membership made active again later
/// starts without them.
pub(crate) async fn person_credentials_end(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    person_id: i64,
) -> Result<Vec<String>> {
    let revoked: Vec<String> = sqlx::query_scalar(
        "UPDATE api_tokens SET revoked_at = now()
         WHERE tenant_id = $1 AND person_id = $2 AND revoked_at IS NULL RETURNING handle",
    )
    .bind(ctx.tenant_id())
    .bind(person_id)
    .fetch_all(&mut **tx)
    .await?;
    // Every session of theirs, not only those working in this tenant: one parked at the tenant
    // picker or in another tenant could switch back in here once they are added again.
    sqlx::query("DELETE FROM console_sessions WHERE person_id = $1")
        .bind(person_id)
        .execute(&mut **tx)
        .await?;
    Ok(revoked)
}

/// Whether the person is an active member of the context's tenant, read in `tx` and held so
/// (a deactivation waits for this transaction, and this one sees it if it came first).
pub(crate) async fn membership_active_held(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    person_id: i64,
) -> Result<bool> {
    let active: Option<bool> = sqlx::query_scalar(
        "SELECT m.active AND p.active FROM memberships m JOIN people p ON p.id = m.person_id
         WHERE m.tenant_id = $1 AND m.person_id = $2 FOR SHARE OF m",
    )
    .bind(ctx.tenant_id())
    .bind(person_id)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(active == Some(true))
}

/// Sets a person's password and ends every console session they have.
pub(crate) async fn platform_person_password_set(
    tx: &mut Tx<'_>,
    person_id: i64,
    hash: &str,
) -> Result<()> {
    sqlx::query("UPDATE people SET password_hash = $2 WHERE id = $1")
        .bind(person_id)
        .bind(hash)
        .execute(&mut **tx)
        .await?;
    sqlx::query("DELETE FROM console_sessions WHERE person_id = $1")
        .bind(person_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Changes the role of an active membership; `false` when there is none active.
pub(crate) async fn membership_set_role(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    person_id: i64,
    role: &str,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE memberships SET role = $3 WHERE tenant_id = $1 AND person_id = $2 AND active",
    )
    .bind(ctx.tenant_id())
    .bind(person_id)
    .bind(role)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The active admins of the context's tenant, their memberships held until the transaction
/// ends: two admins demoting each other at once are serialized here, and the second sees the
/// first's change (READ COMMITTED re-reads a row it waited for), so one admin always remains.
pub(crate) async fn tenant_admins_held(tx: &mut Tx<'_>, ctx: &OpCtx) -> Result<Vec<i64>> {
    let rows: Vec<(i64,)> = sqlx::query_as(
        "SELECT person_id FROM memberships WHERE tenant_id = $1 AND role = 'admin' AND active \
         ORDER BY person_id FOR UPDATE",
    )
    .bind(ctx.tenant_id())
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// Ends a person's membership in the context's tenant; returns whether there was one.
pub(crate) async fn membership_deactivate(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    person_id: i64,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE memberships SET active = false WHERE tenant_id = $1 AND person_id = $2 AND active",
    )
    .bind(ctx.tenant_id())
    .bind(person_id)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Makes a person an operator of the platform (or not): operators get the global kill switch.
pub(crate) async fn platform_person_set_operator(
    tx: &mut Tx<'_>,
    person_id: i64,
    operator: bool,
) -> Result<()> {
    sqlx::query("UPDATE people SET is_operator = $2 WHERE id = $1")
        .bind(person_id)
        .bind(operator)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A person as the operator check reads them.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OperatorRow {
    pub id: i64,
    pub handle: String,
    pub email: String,
    pub active: bool,
    pub is_operator: bool,
}

pub(crate) async fn entry_operator_get(ds: &Services, email: &str) -> Result<Option<OperatorRow>> {
    Ok(sqlx::query_as::<_, OperatorRow>(
        "SELECT id, handle, email, active, is_operator FROM people WHERE lower(email) = lower($1)",
    )
    .bind(email.trim())
    .fetch_optional(ds.pool())
    .await?)
}

pub(crate) async fn entry_operator_by_id(ds: &Services, id: i64) -> Result<Option<OperatorRow>> {
    Ok(sqlx::query_as::<_, OperatorRow>(
        "SELECT id, handle, email, active, is_operator FROM people WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(ds.pool())
    .await?)
}

/// How many active operators the platform has, serialized against other grants in `tx` so that
/// two racing bootstraps cannot both find none.
pub(crate) async fn platform_operator_count_locked(tx: &mut Tx<'_>) -> Result<i64> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('operator-role', 0))")
        .execute(&mut **tx)
        .await?;
    Ok(sqlx::query_scalar("SELECT count(*) FROM people WHERE is_operator AND active")
        .fetch_one(&mut **tx)
        .await?)
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LoginRow {
    pub id: i64,
    pub password_hash: Option<String>,
    pub active: bool,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MembershipListRow {
    pub tenant_id: i64,
    pub slug: String,
    pub name: String,
    pub role: String,
    /// The tenant takes console sessions from its identity provider only.
    pub sso_required: bool,
}

/// What a search of the tenant's people asks for.
#[derive(Debug, Default, Clone, Copy)]
pub struct PeopleQuery<'a> {
    pub text: Option<&'a str>,
    pub role: Option<&'a str>,
    pub active: Option<bool>,
    pub after: Option<(&'a str, &'a str)>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PersonListRow {
    pub handle: String,
    pub email: String,
    pub name: String,
    pub role: String,
    pub active: bool,
}

impl Services {
    pub(crate) async fn preauth_person_login(&self, email: &str) -> Result<Option<LoginRow>> {
        Ok(sqlx::query_as::<_, LoginRow>(
            "SELECT id, password_hash, active FROM people WHERE lower(email) = lower($1)",
        )
        .bind(email)
        .fetch_optional(self.pool())
        .await?)
    }
}

impl Services {
    /// Counts one sign-in attempt against both keys and returns their counts, in one statement:
    /// concurrent attempts serialize on the rows, so no two read the same count (STYLE: guards
    /// count atomically in the statement that checks them). A window older than `window_secs`
    /// starts again at one.
    pub(crate) async fn preauth_login_attempt_take(
        &self,
        pair: &str,
        account: &str,
        window_secs: i64,
        pair_limit: i32,
    ) -> Result<(i32, i32)> {
        // The account's count rises only with attempts whose source is still under its own
        // limit: a refused source cannot push the person's account to its ceiling.
        Ok(sqlx::query_as(
            "WITH pair AS (
                INSERT INTO login_throttle AS t (key, window_start, attempts) VALUES ($1, now(), 1)
                ON CONFLICT (key) DO UPDATE SET
                    attempts = CASE WHEN t.window_start < now() - make_interval(secs => $3) THEN 1 ELSE t.attempts + 1 END,
                    window_start = CASE WHEN t.window_start < now() - make_interval(secs => $3) THEN now() ELSE t.window_start END
                RETURNING attempts),
             account AS (
                INSERT INTO login_throttle AS t (key, window_start, attempts)
                SELECT $2, now(), 1 FROM pair WHERE pair.attempts <= $4
                ON CONFLICT (key) DO UPDATE SET
                    attempts = CASE WHEN t.window_start < now() - make_interval(secs => $3) THEN 1 ELSE t.attempts + 1 END,
                    window_start = CASE WHEN t.window_start < now() - make_interval(secs => $3) THEN now() ELSE t.window_start END
                RETURNING attempts)
             SELECT (SELECT attempts FROM pair), coalesce((SELECT attempts FROM account), 0)",
        )
        .bind(pair)
        .bind(account)
        .bind(window_secs as f64)
        .bind(pair_limit)
        .fetch_one(self.pool())
        .await?)
    }

    /// A successful sign-in clears its (account, source) count.
    pub(crate) async fn preauth_login_attempts_clear(&self, pair: &str) -> Result<()> {
        sqlx::query("DELETE FROM login_throttle WHERE key = $1")
            .bind(pair)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}

impl Services {
    pub(crate) async fn preauth_memberships_of(
        &self,
        person_id: i64,
    ) -> Result<Vec<MembershipListRow>> {
        Ok(sqlx::query_as::<_, MembershipListRow>(
            "SELECT t.id AS tenant_id, t.slug, t.name, m.role, COALESCE(i.sso_required, false) AS sso_required
             FROM memberships m JOIN tenants t ON t.id = m.tenant_id
             LEFT JOIN tenant_idps i ON i.tenant_id = t.id
             WHERE m.person_id = $1 AND m.active ORDER BY t.name",
        )
        .bind(person_id)
        .fetch_all(self.pool())
        .await?)
    }
}

impl Services {
    /// A page of the tenant's people by name: those whose name or email contains `text`
    /// (case-insensitive), of one role and state when given, after `(name, handle)`.
    pub(crate) async fn people_search(
        &self,
        ctx: &OpCtx,
        q: &PeopleQuery<'_>,
        limit: i64,
    ) -> Result<Vec<PersonListRow>> {
        Ok(sqlx::query_as::<_, PersonListRow>(
            "SELECT p.handle, p.email, p.name, m.role, (m.active AND p.active) AS active
             FROM memberships m JOIN people p ON p.id = m.person_id
             WHERE m.tenant_id = $1
               AND ($2::text IS NULL OR strpos(lower(p.name || ' ' || p.email), lower($2)) > 0)
               AND ($3::text IS NULL OR m.role = $3)
               AND ($4::bool IS NULL OR (m.active AND p.active) = $4)
               AND ($5::text IS NULL OR (p.name, p.handle) > ($5, $6))
             ORDER BY p.name, p.handle LIMIT $7",
        )
        .bind(ctx.tenant_id())
        .bind(q.text)
        .bind(q.role)
        .bind(q.active)
        .bind(q.after.map(|a| a.0))
        .bind(q.after.map(|a| a.1))
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    /// One member of the tenant by email, with how many active connections they created.
    pub(crate) async fn person_in_tenant(
        &self,
        ctx: &OpCtx,
        email: &str,
    ) -> Result<Option<(PersonListRow, i64)>> {
        let row: Option<(String, String, String, String, bool, i64)> = sqlx::query_as(
            "SELECT p.handle, p.email, p.name, m.role, (m.active AND p.active),
                    (SELECT count(*) FROM connections c
                     WHERE c.tenant_id = m.tenant_id AND c.creator_id = p.id AND c.status = 'active')
             FROM memberships m JOIN people p ON p.id = m.person_id
             WHERE m.tenant_id = $1 AND lower(p.email) = lower($2)",
        )
        .bind(ctx.tenant_id())
        .bind(email)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(|(handle, email, name, role, active, connections)| {
            (PersonListRow { handle, email, name, role, active }, connections)
        }))
    }
}
