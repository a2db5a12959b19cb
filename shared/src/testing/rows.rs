//! Rows of one table, picked by their columns: the testkit's way to check or age what a test
//! cannot reach through a service, without SQL text in the test.
//!
//! `db.rows("audit_log").eq("action", "idp.set").eq("channel", "cli").count().await`
//!
//! Table and column names are identifiers checked here (a test that names anything else
//! panics); values are bound parameters, never spliced into the statement. Every comparison
//! is on the column's text form, so an enum, a `citext` or an `int4` column compares with the
//! same call.

use sqlx::Row as _;

use super::TestDb;

/// A value a column is compared with or set to.
#[derive(Clone, Debug)]
pub enum Val {
    Text(String),
    Int(i64),
    Bool(bool),
}

impl From<&str> for Val {
    fn from(v: &str) -> Self {
        Val::Text(v.to_owned())
    }
}
impl From<String> for Val {
    fn from(v: String) -> Self {
        Val::Text(v)
    }
}
impl From<&String> for Val {
    fn from(v: &String) -> Self {
        Val::Text(v.clone())
    }
}
impl From<i64> for Val {
    fn from(v: i64) -> Self {
        Val::Int(v)
    }
}
impl From<i32> for Val {
    fn from(v: i32) -> Self {
        Val::Int(i64::from(v))
    }
}
impl From<bool> for Val {
    fn from(v: bool) -> Self {
        Val::Bool(v)
    }
}

impl Val {
    fn text(&self) -> String {
        match self {
            Val::Text(s) => s.clone(),
            Val::Int(i) => i.to_string(),
            Val::Bool(b) => b.to_string(),
        }
    }
}

enum Filter {
    Eq(&'static str, Val),
    Ne(&'static str, Val),
    Like(&'static str, String),
    Null(&'static str),
    NotNull(&'static str),
    Tenant(String),
    Before(&'static str, String),
}

fn ident(name: &str) -> &str {
    let ok = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    assert!(ok, "the testkit takes plain identifiers, not {name:?}");
    name
}

/// The rows of one table a test names; nothing runs until a reading or writing call.
pub struct Rows<'a> {
    db: &'a TestDb,
    table: &'static str,
    filters: Vec<Filter>,
}

impl TestDb {
    /// The rows of `table`, to be narrowed with [`Rows::eq`] and friends.
    pub fn rows(&self, table: &'static str) -> Rows<'_> {
        Rows { db: self, table: ident(table), filters: Vec::new() }
    }

    /// How many rows of `table` there are.
    pub async fn count(&self, table: &'static str) -> i64 {
        self.rows(table).count().await
    }

    /// How many audit rows name `action`.
    pub async fn audited(&self, action: &str) -> i64 {
        self.rows("audit_log").eq("action", action).count().await
    }

    /// The id of tenant `slug`.
    pub async fn tenant_id(&self, slug: &str) -> i64 {
        self.rows("tenants").eq("slug", slug).int("id").await
    }
}

impl<'a> Rows<'a> {
    /// Rows whose `column` is `value` (compared as text).
    pub fn eq(mut self, column: &'static str, value: impl Into<Val>) -> Self {
        self.filters.push(Filter::Eq(ident(column), value.into()));
        self
    }

    /// Rows whose `column` is not `value`, or is null.
    pub fn ne(mut self, column: &'static str, value: impl Into<Val>) -> Self {
        self.filters.push(Filter::Ne(ident(column), value.into()));
        self
    }

    /// Rows whose `column`'s text matches the SQL `LIKE` pattern.
    pub fn like(mut self, column: &'static str, pattern: &str) -> Self {
        self.filters.push(Filter::Like(ident(column), pattern.to_owned()));
        self
    }

    pub fn null(mut self, column: &'static str) -> Self {
        self.filters.push(Filter::Null(ident(column)));
        self
    }

    pub fn not_null(mut self, column: &'static str) -> Self {
        self.filters.push(Filter::NotNull(ident(column)));
        self
    }

    /// Rows of tenant `slug` (the table's `tenant_id`).
    pub fn tenant(mut self, slug: &str) -> Self {
        self.filters.push(Filter::Tenant(slug.to_owned()));
        self
    }

    /// Rows whose time `column` is earlier than now plus `interval` (`"0 s"`, `"-1 hour"`).
    pub fn before(mut self, column: &'static str, interval: &str) -> Self {
        self.filters.push(Filter::Before(ident(column), interval.to_owned()));
        self
    }

    /// The `WHERE` clause and the values it binds, numbered from `$first`.
    fn clause(&self, first: usize) -> (String, Vec<String>) {
        let mut parts = Vec::new();
        let mut binds = Vec::new();
        for filter in &self.filters {
            let n = first + binds.len();
            match filter {
                Filter::Eq(c, v) => {
                    parts.push(format!("\"{c}\"::text = ${n}"));
                    binds.push(v.text());
                }
                Filter::Ne(c, v) => {
                    parts.push(format!("\"{c}\"::text IS DISTINCT FROM ${n}"));
                    binds.push(v.text());
                }
                Filter::Like(c, p) => {
                    parts.push(format!("\"{c}\"::text LIKE ${n}"));
                    binds.push(p.clone());
                }
                Filter::Null(c) => parts.push(format!("\"{c}\" IS NULL")),
                Filter::NotNull(c) => parts.push(format!("\"{c}\" IS NOT NULL")),
                Filter::Tenant(slug) => {
                    parts.push(format!("tenant_id = (SELECT id FROM tenants WHERE slug = ${n})"));
                    binds.push(slug.clone());
                }
                Filter::Before(c, interval) => {
                    parts.push(format!("\"{c}\" < now() + ${n}::interval"));
                    binds.push(interval.clone());
                }
            }
        }
        let clause = if parts.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", parts.join(" AND "))
        };
        (clause, binds)
    }

    /// Panics when a tenant the rows are narrowed to does not exist: a probe of no tenant would
    /// find nothing, and a test checking for nothing would pass without looking.
    async fn tenants_known(&self) {
        for filter in &self.filters {
            if let Filter::Tenant(slug) = filter {
                let known =
                    sqlx::query_scalar::<_, i64>("SELECT count(*) FROM tenants WHERE slug = $1")
                        .bind(slug)
                        .fetch_one(self.db.ds.pool())
                        .await
                        .expect("testkit tenant");
                assert_eq!(known, 1, "the testkit knows no tenant {slug:?}");
            }
        }
    }

    async fn texts_of(&self, expr: &str, order: &str) -> Vec<Option<String>> {
        let (clause, binds) = self.clause(1);
        self.tenants_known().await;
        let sql =
            format!("SELECT (\"{expr}\")::text FROM \"{}\"{clause} ORDER BY {order}", self.table);
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for b in binds {
            query = query.bind(b);
        }
        let rows = query.fetch_all(self.db.ds.pool()).await.expect("testkit read");
        rows.iter().map(|r| r.get::<Option<String>, _>(0)).collect()
    }

    /// How many rows match.
    pub async fn count(self) -> i64 {
        let (clause, binds) = self.clause(1);
        self.tenants_known().await;
        let sql = format!("SELECT count(*) FROM \"{}\"{clause}", self.table);
        let mut query = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql));
        for b in binds {
            query = query.bind(b);
        }
        query.fetch_one(self.db.ds.pool()).await.expect("testkit count")
    }

    /// `column`'s text in the one matching row (panics unless exactly one matches).
    pub async fn text(self, column: &'static str) -> String {
        let values = self.texts_of(ident(column), "1").await;
        assert_eq!(values.len(), 1, "one row of {} expected", self.table);
        values.into_iter().next().flatten().unwrap_or_else(|| panic!("{column} is null"))
    }

    /// `column`'s text in the one matching row, `None` when no row matches or it is null.
    pub async fn opt_text(self, column: &'static str) -> Option<String> {
        let values = self.texts_of(ident(column), "1").await;
        assert!(values.len() <= 1, "at most one row of {} expected", self.table);
        values.into_iter().next().flatten()
    }

    /// `column`'s text in every matching row, in the order of `order_by` (a column); rows where
    /// it is null are left out.
    pub async fn texts(self, column: &'static str, order_by: &'static str) -> Vec<String> {
        let order = format!("\"{}\"", ident(order_by));
        self.texts_of(ident(column), &order).await.into_iter().flatten().collect()
    }

    /// `column` of the one matching row as a number.
    pub async fn int(self, column: &'static str) -> i64 {
        let text = self.text(column).await;
        text.parse().unwrap_or_else(|_| panic!("{column} is not a whole number: {text}"))
    }

    /// `column` of the one matching row as a yes or no.
    pub async fn flag(self, column: &'static str) -> bool {
        match self.text(column).await.as_str() {
            "true" => true,
            "false" => false,
            other => panic!("{column} is not a boolean: {other}"),
        }
    }

    async fn update(self, column: &'static str, value_sql: &str, value: Option<String>) -> u64 {
        let column = ident(column);
        let first = if value.is_some() { 2 } else { 1 };
        let (clause, binds) = self.clause(first);
        self.tenants_known().await;
        let sql = format!("UPDATE \"{}\" SET \"{column}\" = {value_sql}{clause}", self.table);
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        if let Some(v) = value {
            query = query.bind(v);
        }
        for b in binds {
            query = query.bind(b);
        }
        query.execute(self.db.ds.pool()).await.expect("testkit update").rows_affected()
    }

    /// The SQL type of `column`, for casting a text value into it.
    async fn type_of(&self, column: &str) -> String {
        sqlx::query_scalar::<_, String>(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = $1::regclass AND attname = $2 AND NOT attisdropped",
        )
        .bind(self.table)
        .bind(column)
        .fetch_one(self.db.ds.pool())
        .await
        .unwrap_or_else(|_| panic!("{}.{column} is not a column", self.table))
    }

    /// Sets `column` to `value` in every matching row; how many rows changed.
    pub async fn set(self, column: &'static str, value: impl Into<Val>) -> u64 {
        let ty = self.type_of(ident(column)).await;
        self.update(column, &format!("$1::text::{ty}"), Some(value.into().text())).await
    }

    /// Sets `column` to null in every matching row.
    pub async fn set_null(self, column: &'static str) -> u64 {
        self.update(column, "NULL", None).await
    }

    /// Sets time `column` to now plus `interval` (`"-2 hours"` ages a row): the clock a test
    /// cannot wait for.
    pub async fn set_now_plus(self, column: &'static str, interval: &str) -> u64 {
        self.update(column, "now() + $1::interval", Some(interval.to_owned())).await
    }

    /// Deletes every matching row; how many went.
    pub async fn delete(self) -> u64 {
        let (clause, binds) = self.clause(1);
        self.tenants_known().await;
        let sql = format!("DELETE FROM \"{}\"{clause}", self.table);
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for b in binds {
            query = query.bind(b);
        }
        query.execute(self.db.ds.pool()).await.expect("testkit delete").rows_affected()
    }
}
