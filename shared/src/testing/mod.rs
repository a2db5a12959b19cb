//! Test support: a template database migrated once per test binary, cloned per test
//! (STYLE 6). Tests run in parallel without ordering between them.

use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection as _, PgConnection};
use tokio::sync::OnceCell;

use crate::OpCtx;
use crate::datastore::Services;
use crate::rights::{RightSet, Role};
use crate::services::admin;

mod agents;
mod audit;
mod identity;
mod rows;
mod stacks;
mod tenancy;
pub use rows::{Rows, Val};

/// The server every test database lives on; `GATEHOUSE_TEST_PG` overrides it.
pub fn server_url() -> String {
    std::env::var("GATEHOUSE_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

static TEMPLATE: OnceCell<String> = OnceCell::const_new();

async fn admin_conn() -> PgConnection {
    PgConnection::connect(&format!("{}/postgres", server_url()))
        .await
        .expect("connect to the test Postgres server")
}

/// Creates (once per process) a freshly migrated template database and returns its name.
async fn template() -> &'static str {
    TEMPLATE
        .get_or_init(|| async {
            let name = format!("gh_tpl_{}_{}", std::process::id(), crate::ctx::new_request_id());
            let mut admin = admin_conn().await;
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&mut admin)
                .await
                .expect("create template");
            let ds = Services::from_pool(
                PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&format!("{}/{name}", server_url()))
                    .await
                    .expect("connect template"),
            );
            ds.migrate().await.expect("migrate template");
            ds.pool().close().await;
            name
        })
        .await
}

/// The secret-sealing keys of test databases (`GATEHOUSE_SECRET_KEYS` for the binaries a
/// test runs beside them): a fixed, public key, for tests only.
/// The audit checkpoint signing key of tests (`GATEHOUSE_AUDIT_SIGNING_KEYS`).
pub const TEST_AUDIT_KEYS: &str = "t1:dGVzdC1vbmx5LWF1ZGl0LXNpZ25pbmcta2V5LTMyYnk";
pub const TEST_SECRET_KEYS: &str = "test1:dGVzdC1vbmx5LXNlYWwta2V5LWZvci1nYXRlaG91c2U";

/// A database of its own for one test, cloned from the migrated template.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub ds: Services,
}

impl TestDb {
    pub async fn new() -> TestDb {
        let template = template().await;
        let name = format!("gh_test_{}", crate::ctx::new_request_id());
        let mut admin = admin_conn().await;
        // Cloning needs the template to have no other sessions; retry briefly if one lingers.
        let mut attempt = 0;
        loop {
            match sqlx::query(sqlx::AssertSqlSafe(format!(
                "CREATE DATABASE {name} TEMPLATE {template}"
            )))
            .execute(&mut admin)
            .await
            {
                Ok(_) => break,
                Err(e) if attempt < 50 => {
                    attempt += 1;
                    tracing::debug!(error = %e, "template busy, retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => panic!("clone template: {e}"),
            }
        }
        let url = format!("{}/{name}", server_url());
        let ds = Services::connect(&url, 8).await.expect("connect test database").with_secret_keys(
            std::sync::Arc::new(crate::seal::SealKeys::parse(TEST_SECRET_KEYS).expect("test keys")),
        );
        let ds = ds.with_audit_keys(std::sync::Arc::new(
            crate::services::audit::SigningKeys::parse(TEST_AUDIT_KEYS).expect("audit keys"),
        ));
        TestDb { name, url, ds }
    }

    /// The testkit over a database the test did not make (an end-to-end stack's, already
    /// migrated and seeded): the same probes and fixtures, through a pool of two connections.
    pub async fn attach(url: &str) -> TestDb {
        let ds = Services::connect(url, 2).await.expect("connect to the stack's database");
        let name = url.rsplit('/').next().unwrap_or_default().split('?').next().unwrap_or_default();
        TestDb { name: name.to_owned(), url: url.to_owned(), ds }
    }

    /// Runs raw SQL for fixtures and assertions that no service offers (tests only).
    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(self.ds.pool())
            .await
            .expect("fixture SQL");
    }

    /// Runs raw SQL expected to fail (a refused write); the error's text, or `None`.
    pub async fn exec_err(&self, sql: &str) -> Option<String> {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(self.ds.pool())
            .await
            .err()
            .map(|e| e.to_string())
    }

    pub async fn scalar_i64(&self, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(self.ds.pool())
            .await
            .expect("scalar query")
    }

    pub async fn scalar_string(&self, sql: &str) -> String {
        sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(self.ds.pool())
            .await
            .expect("scalar query")
    }

    /// Every row's one text column.
    pub async fn scalar_strings(&self, sql: &str) -> Vec<String> {
        sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_all(self.ds.pool())
            .await
            .expect("scalar query")
    }
}

// ---------------------------------------------------------------- builders (STYLE 16)
//
// Set-up reads like the product and goes through the services the product uses, so a fixture
// passes the same checks a person's or an operator's action does. Raw SQL stays for what no
// product path may do (tampering, clock skew, bulk volume).

/// Works in tenant `slug` as the platform operator `email` (the demo seed makes its first
/// tenant's admin one), as `gatehousectl --as` does.
pub async fn operator_in(ds: &Services, email: &str, slug: &str) -> OpCtx {
    let operator = crate::services::operators::authenticate(ds, email, crate::ctx::Channel::Cli)
        .await
        .expect("an operator");
    let tenant = admin::tenant_by_slug(ds, slug).await.expect("tenant");
    OpCtx::for_operator(&operator, admin::tenant_ref(&tenant).expect("tenant"))
}

/// A person with a role in the context's tenant, made (or found by email) through
/// [`admin::person_create`]: `Person::new(&ds, &ctx, "lee@x").role(Role::Viewer).create()`.
pub struct Person<'a> {
    ds: &'a Services,
    ctx: &'a OpCtx,
    email: String,
    name: String,
    role: Role,
    password: Option<String>,
}

impl<'a> Person<'a> {
    pub fn new(ds: &'a Services, ctx: &'a OpCtx, email: &str) -> Self {
        Person {
            ds,
            ctx,
            email: email.to_owned(),
            name: "Test Person".into(),
            role: Role::Viewer,
            password: None,
        }
    }

    pub fn name(mut self, name: &str) -> Self {
        name.clone_into(&mut self.name);
        self
    }

    pub fn role(mut self, role: Role) -> Self {
        self.role = role;
        self
    }

    pub fn password(mut self, password: &str) -> Self {
        self.password = Some(password.to_owned());
        self
    }

    pub async fn create(self) -> admin::PersonCreated {
        admin::person_create(
            self.ds,
            self.ctx,
            &self.email,
            &self.name,
            self.role,
            self.password.as_deref(),
        )
        .await
        .expect("person")
    }
}

/// A static connection of a person of the context's tenant, made through
/// [`admin::connection_create`] (so never with more rights than its creator holds):
/// `Connection::new(&ds, &ctx, "admin@x").rights(…).toolset("small").create()`.
pub struct Connection<'a> {
    ds: &'a Services,
    ctx: &'a OpCtx,
    creator: String,
    name: String,
    client_name: String,
    rights: RightSet,
    toolset: String,
}

impl<'a> Connection<'a> {
    /// A full-toolset, read-only connection named "test" until told otherwise.
    pub fn new(ds: &'a Services, ctx: &'a OpCtx, creator_email: &str) -> Self {
        Connection {
            ds,
            ctx,
            creator: creator_email.to_owned(),
            name: "test".into(),
            client_name: "test".into(),
            rights: crate::rights::read_only(),
            toolset: "full".into(),
        }
    }

    pub fn name(mut self, name: &str) -> Self {
        name.clone_into(&mut self.name);
        self
    }

    pub fn client(mut self, client_name: &str) -> Self {
        client_name.clone_into(&mut self.client_name);
        self
    }

    pub fn rights(mut self, rights: RightSet) -> Self {
        self.rights = rights;
        self
    }

    pub fn toolset(mut self, toolset: &str) -> Self {
        toolset.clone_into(&mut self.toolset);
        self
    }

    /// What the service answers, for tests that expect a refusal.
    pub async fn try_create(self) -> crate::Result<admin::ConnectionCreated> {
        let new = admin::NewConnection {
            creator_email: &self.creator,
            name: &self.name,
            client_name: &self.client_name,
            rights: self.rights,
            toolset: &self.toolset,
        };
        admin::connection_create(self.ds, self.ctx, new).await
    }

    pub async fn create(self) -> admin::ConnectionCreated {
        self.try_create().await.expect("connection")
    }
}

/// Many bookings of one tenant at once, for tests of volume (batches, exports, streams): raw
/// SQL on purpose, since thousands of rows through the services would be the test's whole
/// run. Handles are `prefix` followed by the row number, zero-padded to 20 characters.
pub struct BulkBookings {
    slug: String,
    count: usize,
    first: String,
    every: String,
    status: String,
    prefix: String,
    like_first_booking: bool,
}

impl BulkBookings {
    /// `count` draft bookings of tenant `slug` from 2031-01-01 08:00 UTC, one every ten
    /// hours, for its first customer and service without a technician, at 10.00 + 1.90 tax.
    pub fn new(slug: &str, count: usize) -> Self {
        BulkBookings {
            slug: slug.to_owned(),
            count,
            first: "2031-01-01 08:00+00".into(),
            every: "10 hours".into(),
            status: "draft".into(),
            prefix: "bkg_bulk".into(),
            like_first_booking: false,
        }
    }

    /// The first start (a `timestamptz` literal) and the interval between starts.
    pub fn starting(mut self, first: &str, every: &str) -> Self {
        self.first = first.to_owned();
        self.every = every.to_owned();
        self
    }

    pub fn status(mut self, status: &str) -> Self {
        self.status = status.to_owned();
        self
    }

    /// What the handles start with (`bkg_` gives `bkg_0000000000000001`…).
    pub fn handles(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self
    }

    /// Copies customer, technician, service, zone and prices from the tenant's first booking.
    pub fn like_first_booking(mut self) -> Self {
        self.like_first_booking = true;
        self
    }

    /// The one statement that inserts them and returns how many it inserted.
    pub fn sql(&self) -> String {
        let BulkBookings { slug, count, first, every, status, prefix, .. } = self;
        let width = 20usize.saturating_sub(prefix.len());
        let columns = "tenant_id, handle, customer_id, technician_id, service_id, starts_at, zone, \
                       status, currency, net_minor, tax_minor, total_minor";
        let handle = format!("'{prefix}' || lpad(g::text, {width}, '0')");
        let start = format!("timestamptz '{first}' + g * interval '{every}'");
        let select = if self.like_first_booking {
            format!(
                "SELECT b.tenant_id, {handle}, b.customer_id, b.technician_id, b.service_id, {start}, \
                        b.zone, '{status}', b.currency, b.net_minor, b.tax_minor, b.total_minor
                 FROM generate_series(1, {count}) g,
                      (SELECT b.* FROM bookings b JOIN tenants t ON t.id = b.tenant_id
                       WHERE t.slug = '{slug}' ORDER BY b.id LIMIT 1) b"
            )
        } else {
            format!(
                "SELECT t.id, {handle}, c.id, NULL, s.id, {start}, t.zone, '{status}', t.currency, \
                        1000, 190, 1190
                 FROM tenants t
                 CROSS JOIN generate_series(1, {count}) g
                 CROSS JOIN LATERAL (SELECT id FROM customers WHERE tenant_id = t.id ORDER BY id LIMIT 1) c
                 CROSS JOIN LATERAL (SELECT id FROM services WHERE tenant_id = t.id ORDER BY id LIMIT 1) s
                 WHERE t.slug = '{slug}'"
            )
        };
        format!(
            "WITH ins AS (INSERT INTO bookings ({columns}) {select} RETURNING 1) SELECT count(*) FROM ins"
        )
    }

    /// Inserts them; panics unless exactly `count` rows went in.
    pub async fn insert(&self, db: &TestDb) {
        let inserted = db.scalar_i64(&self.sql()).await;
        assert_eq!(inserted, self.count as i64, "bulk bookings of {}", self.slug);
    }
}

/// A fixed-offset IANA zone where it is now `local` o'clock (give or take the hour turning), so
/// a test of a rule over a local clock bites whenever it runs.
pub fn zone_at(local: i64) -> String {
    let utc = i64::from(jiff::Timestamp::now().to_zoned_datetime(jiff::tz::TimeZone::UTC).hour());
    let mut offset = (local - utc).rem_euclid(24);
    if offset > 14 {
        offset -= 24;
    }
    // `Etc/GMT-5` is five hours ahead of UTC: the sign is POSIX's.
    format!("Etc/GMT{}{}", if offset > 0 { "-" } else { "+" }, offset.abs())
}
