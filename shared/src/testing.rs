//! Test support: a template database migrated once per test binary, cloned per test
//! (STYLE 6). Tests run in parallel without ordering between them.

use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection};
use tokio::sync::OnceCell;

use crate::datastore::Services;

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
        let ds = Services::connect(&url, 8).await.expect("connect test database");
        TestDb { name, url, ds }
    }

    /// Runs raw SQL for fixtures and assertions that no service offers (tests only).
    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(self.ds.pool())
            .await
            .expect("fixture SQL");
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
}
