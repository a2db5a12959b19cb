use std::sync::LazyLock;

use chrono::{DateTime, Utc};

use crate::ctx::OpCtx;
use crate::datastore::Services;
use crate::error::Result;
use crate::handle::CustomerHandle;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CustomerRow {
    pub id: i64,
    pub handle: String,
    pub name: String,
    pub email: Option<String>,
    pub phone: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str = "id, handle, name, email, phone, created_at, updated_at";

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
