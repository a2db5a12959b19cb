//! Following the primary through a failover: `DATABASE_URL` may name several servers
//! (`postgres://user@db-a:5432,db-b:5432/gatehouse?target_session_attrs=read-write`, libpq's
//! form, which a CloudNativePG `-rw` Service makes unnecessary). Every connection goes to the
//! one that takes writes.
//!
//! tokio-postgres (the pipe) reads such a URL itself and tries the servers in order until one
//! is read-write. sqlx (the pool) takes one server: the pool is pointed at the primary found
//! at start, and whenever a connection breaks (the primary went away) a watcher asks each
//! server in turn whether it is in recovery and points the pool at the one that is not. A
//! call that met the broken connection answered 503 with `Retry-After` (see `DbFailure`); its
//! retry reaches the new primary, and a silent write retried with the same arguments is
//! applied once (R8), so an acknowledged write is neither lost (with synchronous replication)
//! nor doubled.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use crate::error::{Error, Result};

/// The servers a `DATABASE_URL` names, each as a one-server URL, in order; one for a plain
/// URL. `target_session_attrs` is dropped (every server is asked itself).
pub(crate) fn servers(url: &str) -> Result<Vec<String>> {
    servers_of("DATABASE_URL", url)
}

/// [`servers`] of the URL in the variable `var`, whose name an error gives.
pub(crate) fn servers_of(var: &str, url: &str) -> Result<Vec<String>> {
    let bad = |why: &str| Error::invalid(var, why);
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(vec![url.to_owned()]);
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if !hosts.contains(',') {
        return Ok(vec![url.to_owned()]);
    }
    let (path, query) = match tail.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (tail, None),
    };
    let query: Vec<&str> = query
        .map(|q| q.split('&').filter(|kv| !kv.starts_with("target_session_attrs=")).collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for host in hosts.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return Err(bad("an empty server in the list"));
        }
        let mut one = format!("{scheme}://");
        if let Some(u) = userinfo {
            one.push_str(u);
            one.push('@');
        }
        one.push_str(host);
        one.push_str(path);
        if !query.is_empty() {
            one.push('?');
            one.push_str(&query.join("&"));
        }
        out.push(one);
    }
    Ok(out)
}

/// Whether the server `options` names takes writes now (a short-lived connection of its own).
async fn writable(options: &PgConnectOptions) -> bool {
    let probe = async {
        let mut conn =
            <sqlx::PgConnection as sqlx::Connection>::connect_with(options).await.ok()?;
        let in_recovery: bool =
            sqlx::query_scalar("SELECT pg_is_in_recovery()").fetch_one(&mut conn).await.ok()?;
        let _ = sqlx::Connection::close(conn).await;
        Some(!in_recovery)
    };
    tokio::time::timeout(Duration::from_secs(2), probe).await.ok().flatten().unwrap_or(false)
}

/// The first of `servers` that takes writes, if any answers.
pub(crate) async fn primary(servers: &[PgConnectOptions]) -> Option<usize> {
    for (i, options) in servers.iter().enumerate() {
        if writable(options).await {
            return Some(i);
        }
    }
    None
}

/// The connect options of each server.
pub(crate) fn options_of(servers: &[String]) -> Result<Vec<PgConnectOptions>> {
    options_of_var("DATABASE_URL", servers)
}

/// [`options_of`] the servers of the variable `var`, whose name an error gives.
pub(crate) fn options_of_var(var: &str, servers: &[String]) -> Result<Vec<PgConnectOptions>> {
    servers
        .iter()
        .map(|s| {
            PgConnectOptions::from_str(s)
                .map(|o| o.application_name("gatehouse"))
                .map_err(|e| Error::invalid(var, e.to_string()))
        })
        .collect()
}

/// Keeps `pool` pointed at the primary among `servers`: after a connection broke (or a
/// standby refused a write), asks each server in turn and, when another one takes writes,
/// points new connections there. Until a primary has answered (a process started mid-failover)
/// it asks every two seconds whatever happens.
pub(crate) async fn follow(
    pool: sqlx::PgPool,
    servers: Vec<PgConnectOptions>,
    mut at: usize,
    mut confirmed: bool,
) {
    let mut seen = super::broken_at();
    let mut asked = std::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let broken = super::broken_at();
        let unsure = !confirmed && asked.elapsed() >= Duration::from_secs(2);
        if broken == seen && !unsure {
            continue;
        }
        asked = std::time::Instant::now();
        // Look until a primary answers: a promotion takes a few seconds.
        for _ in 0..100 {
            match primary(&servers).await {
                Some(found) if found == at => {
                    confirmed = true;
                    break;
                }
                Some(found) => {
                    confirmed = true;
                    tracing::warn!(
                        db.server = found,
                        db.was = at,
                        "the database's primary moved; new connections go to it"
                    );
                    pool.set_connect_options(servers[found].clone());
                    at = found;
                    break;
                }
                None if confirmed => tokio::time::sleep(Duration::from_millis(250)).await,
                None => break,
            }
        }
        seen = super::broken_at();
    }
}

#[cfg(test)]
mod tests {
    use super::servers;

    #[test]
    fn a_url_naming_several_servers_is_one_url_per_server() {
        assert_eq!(
            servers("postgres://u:p@db-a:5432,db-b:6432/gh?sslmode=disable&target_session_attrs=read-write")
                .expect("parsed"),
            vec![
                "postgres://u:p@db-a:5432/gh?sslmode=disable".to_owned(),
                "postgres://u:p@db-b:6432/gh?sslmode=disable".to_owned()
            ]
        );
        assert_eq!(
            servers("postgres://db-a,db-b/gh").expect("parsed"),
            vec!["postgres://db-a/gh".to_owned(), "postgres://db-b/gh".to_owned()]
        );
        let one = "postgres://u@db:5432/gh?target_session_attrs=read-write";
        assert_eq!(servers(one).expect("parsed"), vec![one.to_owned()]);
        assert!(servers("postgres://u@db-a,,db-b/gh").is_err());
    }
}
