use std::str::FromStr;

use super::*;
use crate::testing::TestDb;

fn pipe(db: &TestDb, connections: usize) -> Arc<Pipe> {
    let options = sqlx::postgres::PgConnectOptions::from_str(&db.url).expect("url");
    Arc::new(Pipe::new(config_for(&db.url, &options), connections, super::super::Pooling::Session))
}

/// The backend of each of the pipe's connections.
async fn pids(pipe: &Arc<Pipe>) -> Vec<i32> {
    let mut pids = Vec::new();
    for index in 0..pipe.slots.len() {
        let link = pipe.link(index).await.expect("link");
        let row = link.client.query_one("SELECT pg_backend_pid()", &[]).await.expect("pid");
        pids.push(row.get(0));
    }
    pids
}

/// How many backends the pipes of this test's database hold.
async fn pipe_backends(db: &TestDb) -> i64 {
    db.scalar_i64(&format!(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = '{}' AND application_name = 'gatehouse-pipe'",
        db.name
    ))
    .await
}

async fn terminate(db: &TestDb, pids: &[i32]) {
    for pid in pids {
        db.exec(&format!("SELECT pg_terminate_backend({pid})")).await;
    }
}

/// A token hash no token has: the context statements answer with no row.
const NO_TOKEN: &[u8] = b"no such token";
const NO_CURSOR: (Option<chrono::DateTime<chrono::Utc>>, Option<String>) = (None, None);

#[tokio::test]
async fn concurrent_requests_share_the_pipes_connections_and_each_gets_its_own_answer() {
    let db = TestDb::new().await;
    let seed = crate::services::demo::seed(&db.ds, None, "").await.expect("seed");
    let tokens: Vec<(String, String)> = seed
        .tenants
        .iter()
        .flat_map(|t| t.connections.iter().map(|c| (c.token.clone(), c.connection.clone())))
        .collect();
    assert!(tokens.len() >= 4);
    let pipe = pipe(&db, 2);
    // 96 statements in flight on two connections, for different tokens and for none: each
    // answer is the one its own statement asked for.
    let mut calls = Vec::new();
    for n in 0..96 {
        let pipe = pipe.clone();
        let (token, connection) = tokens[n % tokens.len()].clone();
        calls.push(tokio::spawn(async move {
            let hash =
                if n % 3 == 0 { NO_TOKEN.to_vec() } else { crate::secret::hash_token(&token) };
            let (at, note) = NO_CURSOR;
            let row = pipe
                .query_opt(Sql::ContextAndBooking, &[&hash, &"bkg_none", &at, &note])
                .await
                .expect("answered");
            let got = row.map(|row| row.get::<String>("connection_handle").expect("handle"));
            (n, connection, got)
        }));
    }
    for call in calls {
        let (n, connection, got) = call.await.expect("joined");
        if n % 3 == 0 {
            assert_eq!(got, None, "call {n}: no such token, no row");
        } else {
            assert_eq!(got, Some(connection), "call {n}: its own token's connection");
        }
    }
    assert_eq!(pipe_backends(&db).await, 2, "two connections served all 96");
}

#[tokio::test]
async fn a_connection_the_server_ends_is_replaced_and_the_read_that_met_it_is_answered() {
    let db = TestDb::new().await;
    let pipe = pipe(&db, 1);
    let first = pids(&pipe).await;
    // A statement the server refuses (a NUL in a handle) fails alone, with its SQLSTATE:
    // the connection stays and serves the next.
    let (at, note) = NO_CURSOR;
    let refused = pipe.query_opt(Sql::ContextAndBooking, &[&NO_TOKEN, &"bkg\0", &at, &note]).await;
    let Err(failure) = refused else { panic!("refused: {:?}", refused.is_ok()) };
    assert!(failure.sqlstate().is_some_and(|c| c.starts_with("22")), "{failure:?}");
    assert!(pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await.expect("answered").is_none());
    assert_eq!(pids(&pipe).await, first, "same backend");
    // A restart ends the backend. The read sent right after, on the connection not yet
    // seen closed, is sent again on a new one and answered: no request fails for it.
    terminate(&db, &first).await;
    assert!(pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await.expect("answered").is_none());
    assert_ne!(pids(&pipe).await, first, "a new backend");
    assert_eq!(pipe_backends(&db).await, 1);
}

#[tokio::test]
async fn a_connection_whose_prepared_statements_went_stale_is_replaced_unseen() {
    let db = TestDb::new().await;
    let pipe = pipe(&db, 1);
    let first = pids(&pipe).await;
    assert!(pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await.expect("answered").is_none());
    // A migration changes the type of a column the context returns: the server refuses the
    // statement prepared before it (0A000), and the pipe prepares it again on a new
    // connection instead of meeting the same refusal until the connection ages out.
    db.exec("ALTER TABLE tenants ALTER COLUMN slug TYPE varchar(200)").await;
    assert!(pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await.expect("answered").is_none());
    assert_ne!(pids(&pipe).await, first, "a new connection");
}

/// Holds `table` locked as a migration would, until the returned connection rolls back.
async fn lock(db: &TestDb, table: &str) -> sqlx::PgConnection {
    use sqlx::Connection as _;
    let mut holder = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"
    )))
    .execute(&mut holder)
    .await
    .expect("lock");
    holder
}

#[tokio::test]
async fn a_request_cancelled_mid_statement_leaves_the_connection_serving_others() {
    let db = TestDb::new().await;
    // Statements wait for locks long enough here that the request is cancelled while its
    // statement still waits.
    let options = sqlx::postgres::PgConnectOptions::from_str(&db.url).expect("url");
    let pipe = Arc::new(Pipe::waiting_for_locks(
        config_for(&db.url, &options),
        1,
        "5s",
        super::super::Pooling::Session,
    ));
    let first = pids(&pipe).await;
    // A request whose statement waits behind a lock is cancelled (its client hung up).
    let mut holder = lock(&db, "connection_tokens").await;
    let waiting = tokio::spawn({
        let pipe = pipe.clone();
        async move { pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await.map(|r| r.is_none()) }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiting.abort();
    assert!(waiting.await.is_err_and(|e| e.is_cancelled()));
    sqlx::raw_sql("ROLLBACK").execute(&mut holder).await.expect("unlock");
    // The next request is answered, on the same backend.
    assert!(pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await.expect("answered").is_none());
    assert_eq!(pids(&pipe).await, first);
}

#[tokio::test]
async fn a_statement_behind_a_lock_gives_up_soon_and_holds_up_the_others_no_longer() {
    let db = TestDb::new().await;
    let pipe = pipe(&db, 1);
    // A migration holds the bookings: the context and booking read gives up within the lock
    // timeout (and the caller falls back to the context alone); the context statement
    // queued behind it on the same connection is answered right after.
    let mut holder = lock(&db, "bookings").await;
    let started = Instant::now();
    let (at, note) = NO_CURSOR;
    let params: [&(dyn ToSql + Sync); 4] = [&NO_TOKEN, &"bkg_x", &at, &note];
    let (blocked, behind) = tokio::join!(pipe.query_opt(Sql::ContextAndBooking, &params), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await
    });
    let Err(failure) = blocked else { panic!("answered behind the lock") };
    assert_eq!(failure.sqlstate(), Some("55P03"), "lock_timeout: {failure:?}");
    assert!(behind.expect("answered").is_none());
    assert!(started.elapsed() < WAIT, "the lock timeout ended it, not the request's wait");
    sqlx::raw_sql("ROLLBACK").execute(&mut holder).await.expect("unlock");
}

#[tokio::test]
async fn the_pipe_reads_every_context_as_the_pool_reads_it() {
    let db = TestDb::new().await;
    let seed = crate::services::demo::seed(&db.ds, None, "").await.expect("seed");
    // Vary what may be absent or false: one creator without a membership, one tenant
    // switched off, one token with an expiry and an audience, one override.
    db.exec(
        "DELETE FROM memberships WHERE (tenant_id, person_id) IN
           (SELECT tenant_id, creator_id FROM connections ORDER BY id LIMIT 1);
         UPDATE tenants SET agent_access = false, read_per_minute = 77
           WHERE id = (SELECT max(id) FROM tenants);
         UPDATE connection_tokens SET expires_at = now() + interval '1 hour',
                audience = 'https://mcp.example/mcp'
           WHERE id = (SELECT max(id) FROM connection_tokens)",
    )
    .await;
    let mut seen = 0;
    for tenant in &seed.tenants {
        for connection in &tenant.connections {
            let hash = crate::secret::hash_token(&connection.token);
            let pooled = sqlx::query_as::<_, super::super::ConnectionContextRow>(
                super::super::hot_path::CONNECTION_CONTEXT_SQL,
            )
            .bind(&hash)
            .fetch_optional(db.ds.pool())
            .await
            .expect("pool");
            let piped = db.ds.entry_connection_context(&hash).await.expect("pipe");
            assert_eq!(format!("{piped:?}"), format!("{pooled:?}"), "{}", connection.name);
            assert!(piped.is_some());
            seen += 1;
        }
    }
    assert!(seen >= 4);
    db.ds.ping_hot_path().await.expect("ready");
}

#[tokio::test]
async fn rows_are_read_by_column_name_and_a_missing_or_mistyped_column_is_an_error() {
    let db = TestDb::new().await;
    let seed = crate::services::demo::seed(&db.ds, None, "").await.expect("seed");
    let token = &seed.tenants[0].connections[0].token;
    let pipe = pipe(&db, 1);
    let row = pipe
        .query_opt(Sql::Context, &[&crate::secret::hash_token(token)])
        .await
        .expect("answered")
        .expect("a row");
    assert!(row.columns_distinct());
    assert_eq!(row.get::<String>("tenant_slug").expect("slug"), seed.tenants[0].slug);
    assert!(row.get::<i32>("no_such_column").is_err());
    assert!(row.get::<String>("tenant_id").is_err(), "a wrong type is an error, not a guess");
}

#[test]
fn the_pipe_reads_database_url_as_the_pool_does() {
    let url =
        "postgres://app:p%40ss%2Fw0rd@db.internal:6543/bookings?options=-c%20search_path%3Dgh";
    let options = sqlx::postgres::PgConnectOptions::from_str(url).expect("sqlx reads it");
    let config = config_for(url, &options);
    assert_eq!(config.get_password(), Some(b"p@ss/w0rd".as_slice()), "percent-decoded");
    assert_eq!(config.get_user(), Some("app"));
    assert_eq!(config.get_dbname(), Some("bookings"));
    assert_eq!(config.get_ports(), &[6543]);
    assert!(
        matches!(config.get_hosts(), [tokio_postgres::config::Host::Tcp(h)] if h == "db.internal")
    );
    assert_eq!(config.get_options(), options.get_options());
    // A `password` parameter wins over the URL's, as in sqlx.
    let param = "postgres://app:old@db.internal/bookings?password=n%26w";
    let options = sqlx::postgres::PgConnectOptions::from_str(param).expect("sqlx reads it");
    assert_eq!(config_for(param, &options).get_password(), Some(b"n&w".as_slice()));
    // A socket directory, as sqlx reads `host=`.
    let socket = "postgres:///bookings?host=/run/postgresql&user=app";
    let options = sqlx::postgres::PgConnectOptions::from_str(socket).expect("sqlx reads it");
    let config = config_for(socket, &options);
    assert!(
        matches!(config.get_hosts(), [tokio_postgres::config::Host::Unix(p)] if p.ends_with("postgresql"))
    );
    assert_eq!(config.get_user(), Some("app"));
}

/// The facts a tenant's policies read, with the connection context: read only for a tenant
/// with a policy set in force (a tenant without one pays for no lookup: the plan never runs
/// the scans), equal to what the gate reads for itself, and never another tenant's.
#[tokio::test]
async fn the_policy_facts_are_read_with_the_context_only_under_a_policy_set() {
    let db = TestDb::new().await;
    let seed = crate::services::demo::seed(&db.ds, None, "").await.expect("seed");
    let slug = &seed.tenants[0].slug;
    let hash = crate::secret::hash_token(&seed.tenants[0].connections[0].token);
    let own = db.scalar_string(&format!(
        "SELECT b.handle FROM bookings b JOIN tenants t ON t.id = b.tenant_id WHERE t.slug = '{slug}' ORDER BY b.id LIMIT 1")).await;
    let foreign = db.scalar_string(&format!(
        "SELECT b.handle FROM bookings b JOIN tenants t ON t.id = b.tenant_id WHERE t.slug <> '{slug}' ORDER BY b.id LIMIT 1")).await;
    let technician = db.scalar_string(&format!(
        "SELECT x.handle FROM technicians x JOIN tenants t ON t.id = x.tenant_id WHERE t.slug = '{slug}' ORDER BY x.id LIMIT 1")).await;
    let pipe = pipe(&db, 1);
    let read = |bookings: Vec<String>, technicians: Vec<String>| {
        let (pipe, hash) = (pipe.clone(), hash.clone());
        async move {
            let none: Vec<String> = Vec::new();
            let rows = pipe
                .query(Sql::ContextAndFacts, &[&hash, &bookings, &none, &technicians])
                .await
                .expect("answered");
            let first = rows.first().expect("the context's row");
            assert!(first.columns_distinct());
            let read = first.get::<bool>("facts_read").expect("facts_read");
            let facts: Vec<(String, Option<String>, Option<String>)> = rows
                .iter()
                .filter(|r| r.get::<Option<String>>("fact_handle").expect("handle").is_some())
                .map(|r| {
                    let f = crate::datastore::PolicyFactRow::from_pipe(r).expect("decodes");
                    (f.handle, f.status, f.region)
                })
                .collect();
            (read, facts)
        }
    };
    // No policy set: not read, and the plan shows the scans never ran.
    let (was_read, facts) = read(vec![own.clone()], vec![technician.clone()]).await;
    assert!(!was_read && facts.is_empty(), "no set: nothing read ({facts:?})");
    let mut conn = db.ds.pool().acquire().await.expect("conn");
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .expect("set");
    let text = Sql::ContextAndFacts.text();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "PREPARE facts(bytea, text[], text[], text[]) AS {text}"
    )))
    .execute(&mut *conn)
    .await
    .expect("prepare");
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    let explain = format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE facts('\\x{hex}', ARRAY['{own}'], '{{}}', ARRAY['{technician}'])"
    );
    let plan: sqlx::types::Json<serde_json::Value> =
        sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
            .fetch_one(&mut *conn)
            .await
            .expect("explain");
    fn scans(node: &serde_json::Value, out: &mut Vec<(String, i64)>) {
        if let Some(relation) = node["Relation Name"].as_str() {
            out.push((relation.to_owned(), node["Actual Loops"].as_i64().unwrap_or(-1)));
        }
        for child in node["Plans"].as_array().into_iter().flatten() {
            scans(child, out);
        }
    }
    let mut seen = Vec::new();
    scans(&plan.0[0]["Plan"], &mut seen);
    let record_scans: Vec<&(String, i64)> = seen
        .iter()
        .filter(|(r, _)| matches!(r.as_str(), "bookings" | "customers" | "technicians"))
        .collect();
    assert!(record_scans.len() >= 3, "the plan has the facts' scans: {seen:?}");
    assert!(record_scans.iter().all(|(_, loops)| *loops == 0), "never run: {seen:?}");
    // A policy set in force: read, the same facts the gate reads for itself, this tenant's only.
    db.exec(&format!("UPDATE tenants SET policy_version = 1 WHERE slug = '{slug}'")).await;
    let (was_read, facts) = read(vec![own.clone()], vec![technician.clone()]).await;
    assert!(was_read, "read under a set");
    let tenant_id = db.scalar_i64(&format!("SELECT id FROM tenants WHERE slug = '{slug}'")).await;
    let pooled: Vec<(String, Option<String>, Option<String>)> =
        sqlx::query_as(POLICY_FACTS_FOR_TEST.as_str())
            .bind(tenant_id)
            .bind(vec![own.clone()])
            .bind(Vec::<String>::new())
            .bind(vec![technician.clone()])
            .fetch_all(db.ds.pool())
            .await
            .expect("pool");
    assert_eq!(facts.len(), 2, "{facts:?}");
    let mut sorted = facts.clone();
    sorted.sort();
    let mut pooled = pooled;
    pooled.sort();
    assert_eq!(sorted, pooled, "the pipe's facts are the pool's");
    let (was_read, facts) = read(vec![foreign.clone()], vec![]).await;
    assert!(was_read && facts.is_empty(), "another tenant's booking is not found: {facts:?}");
    // A connection that no longer passes the gates reads nothing of the tenant's records.
    db.exec(&format!("UPDATE tenants SET agent_access = false WHERE slug = '{slug}'")).await;
    let (was_read, facts) = read(vec![own.clone()], vec![]).await;
    assert!(!was_read && facts.is_empty(), "agents off: nothing read ({facts:?})");
}

/// What [`crate::datastore::policy_facts`] runs, as (handle, status, region).
static POLICY_FACTS_FOR_TEST: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT handle, status, region FROM ({}) f",
        crate::datastore::policy_facts_sql_with("$1", "$2", "$3", "$4")
    )
});

/// A pipe for a transaction pooler, connecting to this test's database (Postgres itself) as
/// `role`; `probe_names`: whether it checks the pooler keeps prepared statements per client
/// (Postgres itself, like a pooler that does not, keeps the client's names).
fn pooled_pipe(db: &TestDb, role: &str, probe_names: bool) -> Arc<Pipe> {
    let options = sqlx::postgres::PgConnectOptions::from_str(&db.url).expect("url");
    let mut config = config_for(&db.url, &options);
    config.user(role);
    let mut pipe = Pipe::new(config, 1, super::super::Pooling::Transaction);
    pipe.probe_names = probe_names;
    Arc::new(pipe)
}

/// What a pipe that would not open said.
fn said(failure: &Failure) -> String {
    failure.described().message
}

/// A role that may do what the tests' owner may, created once for the whole server (tests run
/// in parallel: it may appear between a check and a create).
async fn role(db: &TestDb, name: &str) {
    db.exec(&format!(
        "DO $$ BEGIN CREATE ROLE {name} LOGIN IN ROLE postgres; \
         EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
    ))
    .await;
}

#[tokio::test]
async fn behind_a_transaction_pooler_the_pipe_takes_its_settings_from_its_role_and_sets_none() {
    let db = TestDb::new().await;
    // Hostile: a role without the settings. The pipe refuses to serve rather than run with
    // plans that could flip and no statement limits, and says what fixes it.
    role(&db, "gh_pipe_bare").await;
    let bare = pooled_pipe(&db, "gh_pipe_bare", false);
    let Err(refused) = bare.query_opt(Sql::Context, &[&NO_TOKEN]).await else {
        panic!("a pipe served on a role without its settings")
    };
    assert_eq!(refused.sqlstate(), Some("55000"), "{refused:?}");
    let said = said(&refused);
    for part in [
        "role gh_pipe_bare has plan_cache_mode=auto",
        "ALTER ROLE gh_pipe_bare SET plan_cache_mode = force_generic_plan",
        "Transaction pooling",
    ] {
        assert!(said.contains(part), "{part:?} in {said}");
    }
    // A role that carries them (a lock wait of 40 ms where the pipe's own `SET` says 50): the
    // pipe serves, its session keeps the role's values, and nothing it sent changed them, so
    // nothing stays on a pooled server connection for another client.
    role(&db, "gh_pipe_set").await;
    for setting in [
        "plan_cache_mode = force_generic_plan",
        "statement_timeout = '4s'",
        "lock_timeout = '40ms'",
        "synchronous_commit = local",
    ] {
        db.exec(&format!("ALTER ROLE gh_pipe_set IN DATABASE {} SET {setting}", db.name)).await;
    }
    let pipe = pooled_pipe(&db, "gh_pipe_set", false);
    assert!(pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await.expect("served").is_none());
    let link = pipe.link(0).await.expect("link");
    let row = link
        .client
        .query_one(
            "SELECT current_setting('lock_timeout'), current_setting('statement_timeout'),
                    current_setting('synchronous_commit'), current_setting('plan_cache_mode')",
            &[],
        )
        .await
        .expect("settings");
    let values: Vec<String> = (0..4).map(|i| row.get(i)).collect();
    assert_eq!(values, ["40ms", "4s", "local", "force_generic_plan"]);
    // The session pipe, on the same role, sets its own: the difference the mode makes.
    let options = sqlx::postgres::PgConnectOptions::from_str(&db.url).expect("url");
    let mut config = config_for(&db.url, &options);
    config.user("gh_pipe_set");
    let session = Arc::new(Pipe::new(config, 1, super::super::Pooling::Session));
    let link = session.link(0).await.expect("link");
    let row = link.client.query_one("SELECT current_setting('lock_timeout')", &[]).await;
    assert_eq!(row.expect("setting").get::<_, String>(0), "50ms");
}

#[tokio::test]
async fn behind_a_pooler_that_passes_statement_names_through_the_pipe_refuses_to_serve() {
    // Postgres itself keeps the client's statement names, as PgBouncer before 1.21 (or with
    // max_prepared_statements = 0) lets them through: on a shared server connection this
    // process's `s3` could meet another client's. Refused, with what fixes it.
    let db = TestDb::new().await;
    role(&db, "gh_pipe_set").await;
    for setting in [
        "plan_cache_mode = force_generic_plan",
        "statement_timeout = '4s'",
        "lock_timeout = '40ms'",
    ] {
        db.exec(&format!("ALTER ROLE gh_pipe_set IN DATABASE {} SET {setting}", db.name)).await;
    }
    let pipe = pooled_pipe(&db, "gh_pipe_set", true);
    let Err(refused) = pipe.query_opt(Sql::Context, &[&NO_TOKEN]).await else {
        panic!("a pipe served through names passed through")
    };
    assert_eq!(refused.sqlstate(), Some("55000"), "{refused:?}");
    assert!(said(&refused).contains("max_prepared_statements"), "{refused:?}");
}

#[test]
fn behind_a_transaction_pooler_the_pipe_needs_a_role_of_its_own() {
    use super::super::{Pooling, pipe_role_fits};
    let url = "postgres://gatehouse@pooler:6432/gatehouse";
    assert!(pipe_role_fits(Pooling::Session, url, None).is_ok());
    let missing = pipe_role_fits(Pooling::Transaction, url, None).expect_err("no pipe URL");
    assert!(missing.to_string().contains("GATEHOUSE_DB_PIPE_URL"), "{missing}");
    // The same role by another spelling of the URL: its settings would reach every transaction.
    let same = "postgres://gatehouse:secret@pooler:6432/gatehouse?application_name=x";
    let shared = pipe_role_fits(Pooling::Transaction, url, Some(same)).expect_err("same role");
    assert!(shared.to_string().contains("role of its own"), "{shared}");
    let own = "postgres://gatehouse_pipe@pooler:6432/gatehouse";
    assert!(pipe_role_fits(Pooling::Transaction, url, Some(own)).is_ok());
    // Another database: the pipe would read rights and switches from somewhere else.
    let elsewhere = "postgres://gatehouse_pipe@pooler:6432/other";
    let other = pipe_role_fits(Pooling::Transaction, url, Some(elsewhere)).expect_err("other db");
    assert!(other.to_string().contains("GATEHOUSE_DB_PIPE_URL"), "{other}");
    // A pipe URL that does not parse is named as itself, not as DATABASE_URL.
    let broken = "postgres://gatehouse_pipe@a,,b/gatehouse";
    let said = pipe_role_fits(Pooling::Transaction, url, Some(broken)).expect_err("unparsable");
    assert!(said.to_string().contains("GATEHOUSE_DB_PIPE_URL"), "{said}");
}

#[tokio::test]
async fn a_url_that_insists_on_tls_is_refused_by_name_for_the_pool_and_the_pipe() {
    // Neither driver speaks TLS here: sqlx would refuse one URL, and the pipe would have gone
    // plain on the other. Both are refused before anything connects, naming the setting.
    let db = TestDb::new().await;
    let tls = format!("{}?sslmode=require", db.url);
    let pooling = super::super::Pooling::Session;
    let idle = Duration::from_secs(30);
    for (url, pipe_url, field) in [
        (tls.as_str(), None, "DATABASE_URL"),
        (db.url.as_str(), Some(tls.as_str()), "GATEHOUSE_DB_PIPE_URL"),
    ] {
        let refused = crate::Services::connect_worker_pooled(url, pipe_url, pooling, 4, None, idle)
            .await
            .expect_err("TLS insisted on");
        let said = refused.to_string();
        assert!(said.contains(field) && said.contains("TLS"), "{said}");
    }
    let served = crate::Services::connect_worker_pooled(&db.url, None, pooling, 4, None, idle);
    assert!(served.await.is_ok(), "plain URLs connect");
}
