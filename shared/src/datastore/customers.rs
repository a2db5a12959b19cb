use std::sync::LazyLock;

use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::Services;
use crate::datastore::*;
use crate::error::Result;
use crate::handle::CustomerHandle;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CustomerRow {
    pub id: i64,
    pub handle: String,
    pub name: String,
    pub email: Option<String>,
    pub phone: Option<String>,
    pub region: Option<String>,
    pub zone: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str = "id, handle, name, email, phone, region, zone, created_at, updated_at";

static CUSTOMER_FIND_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {COLUMNS} FROM customers
             WHERE tenant_id = $1
               AND ($2::text IS NULL OR lower(name) LIKE $2 OR lower(coalesce(email, '')) LIKE $2
                    OR coalesce(phone, '') LIKE $2)
               AND ($3::text IS NULL OR (lower(name), handle) > ($3, $4))
             ORDER BY lower(name), handle
             LIMIT $5"
    )
});
static CUSTOMER_GET_SQL: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT {COLUMNS} FROM customers WHERE tenant_id = $1 AND handle = $2")
});

impl Services {
    /// Customers of the tenant ordered by name, optionally matching `query` in name, email or
    /// phone, after the keyset `(lower(name), handle)`.
    pub(crate) async fn customer_find(
        &self,
        ctx: &OpCtx,
        query: Option<&str>,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<CustomerRow>> {
        let pattern = query.map(|q| format!("%{}%", escape_like(&q.to_lowercase())));
        let (after_name, after_handle) = after.unzip();
        let rows = sqlx::query_as::<_, CustomerRow>(CUSTOMER_FIND_SQL.as_str())
            .bind(ctx.tenant_id())
            .bind(pattern)
            .bind(after_name)
            .bind(after_handle)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        Ok(rows)
    }

    pub(crate) async fn customer_get(
        &self,
        ctx: &OpCtx,
        handle: &CustomerHandle,
    ) -> Result<Option<CustomerRow>> {
        let row = sqlx::query_as::<_, CustomerRow>(CUSTOMER_GET_SQL.as_str())
            .bind(ctx.tenant_id())
            .bind(handle.as_str())
            .fetch_optional(self.pool())
            .await?;
        Ok(row)
    }
}

/// Escapes LIKE wildcards so that a search for `50%` means the characters.
pub(crate) fn escape_like(s: &str) -> String {
    s.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_")
}

const CUSTOMER_COLUMNS: &str = COLUMNS;

pub(crate) async fn customer_lock(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
) -> Result<Option<CustomerRow>> {
    Ok(sqlx::query_as::<_, CustomerRow>(sqlx::AssertSqlSafe(format!(
        "SELECT {CUSTOMER_COLUMNS} FROM customers WHERE tenant_id = $1 AND handle = $2 FOR UPDATE"
    )))
    .bind(ctx.tenant_id())
    .bind(handle)
    .fetch_optional(&mut **tx)
    .await?)
}

/// The handle and key of a customer with this normalized email or phone, if any (R9).
pub(crate) async fn customer_by_key(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    email: Option<&str>,
    phone: Option<&str>,
    except_id: Option<i64>,
) -> Result<Option<(String, String)>> {
    Ok(sqlx::query_as::<_, (String, String)>(
        "SELECT handle, CASE WHEN $2::text IS NOT NULL AND lower(email) = $2 THEN 'email' ELSE 'phone' END
         FROM customers
         WHERE tenant_id = $1 AND ($4::bigint IS NULL OR id <> $4)
           AND (($2::text IS NOT NULL AND lower(email) = $2)
             OR ($3::text IS NOT NULL AND regexp_replace(coalesce(phone, ''), '[^0-9+]', '', 'g') = $3))
         ORDER BY id LIMIT 1",
    )
    .bind(ctx.tenant_id())
    .bind(email)
    .bind(phone)
    .bind(except_id)
    .fetch_optional(&mut **tx)
    .await?)
}

pub(crate) async fn customer_create(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    name: &str,
    email: Option<&str>,
    phone: Option<&str>,
    separate_reason: Option<&str>,
) -> Result<CustomerRow> {
    Ok(sqlx::query_as::<_, CustomerRow>(sqlx::AssertSqlSafe(format!(
        "INSERT INTO customers (tenant_id, handle, name, email, phone, separate_reason, created_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {CUSTOMER_COLUMNS}"
    )))
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(name)
    .bind(email)
    .bind(phone)
    .bind(separate_reason)
    .bind(ctx.actor_person_id())
    .fetch_one(&mut **tx)
    .await?)
}

pub(crate) async fn customer_update(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    name: &str,
    email: Option<&str>,
    phone: Option<&str>,
) -> Result<CustomerRow> {
    Ok(sqlx::query_as::<_, CustomerRow>(sqlx::AssertSqlSafe(format!(
        "UPDATE customers SET name = $3, email = $4, phone = $5, updated_at = clock_timestamp()
         WHERE tenant_id = $1 AND id = $2 RETURNING {CUSTOMER_COLUMNS}"
    )))
    .bind(ctx.tenant_id())
    .bind(id)
    .bind(name)
    .bind(email)
    .bind(phone)
    .fetch_one(&mut **tx)
    .await?)
}

pub(crate) async fn customer_booking_handles(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    customer_id: i64,
) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT handle FROM bookings WHERE tenant_id = $1 AND customer_id = $2 ORDER BY starts_at",
    )
    .bind(ctx.tenant_id())
    .bind(customer_id)
    .fetch_all(&mut **tx)
    .await?)
}

pub(crate) async fn customer_delete(tx: &mut Tx<'_>, ctx: &OpCtx, id: i64) -> Result<()> {
    sqlx::query("DELETE FROM customers WHERE tenant_id = $1 AND id = $2")
        .bind(ctx.tenant_id())
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

// ------------------------------------------------------------------ business keys (R9)

/// Serializes, for this transaction, every write of the tenant that could claim the same
/// business key (a customer's email or phone), so that the duplicate guard's read and the
/// insert that follows it act as one step across workers.
pub(crate) async fn business_key_lock(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    kind: &str,
    key: &str,
) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, $2))")
        .bind(format!("key:{kind}:{key}"))
        .bind(ctx.tenant_id())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

pub(crate) async fn customer_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    name: &str,
    email: Option<&str>,
    phone: Option<&str>,
    portal_password_hash: Option<&str>,
) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO customers (tenant_id, handle, name, email, phone, portal_password_hash, created_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .bind(name)
    .bind(email)
    .bind(phone)
    .bind(portal_password_hash)
    .bind(ctx.actor_person_id())
    .fetch_one(&mut **tx)
    .await?)
}

/// Where a customer is served and the zone they live in (`None`: the tenant's), as a tenant's
/// policies read them.
pub(crate) async fn customer_set_place(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    region: Option<&str>,
    zone: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "UPDATE customers SET region = $3, zone = $4, updated_at = clock_timestamp() WHERE tenant_id = $1 AND id = $2",
    )
    .bind(ctx.tenant_id())
    .bind(id)
    .bind(region)
    .bind(zone)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
