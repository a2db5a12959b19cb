//! Typed configuration from the environment (STYLE 10): no global singletons; binaries read
//! it once and pass it on.

use crate::error::{Error, Result};

#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

#[derive(Debug, Clone)]
pub struct Common {
    /// Postgres URL; it may hold a password, so it is wrapped.
    pub database_url: Secret,
    /// One NATS URL, or several separated by commas (a cluster's seeds).
    pub nats_url: String,
    /// Copies of the switch bucket a NATS cluster keeps (`GATEHOUSE_NATS_REPLICAS`, 1 to 5;
    /// 3 on a three-node cluster, so one node can stop).
    pub nats_replicas: usize,
    pub db_max_connections: u32,
    /// Seconds a pooled connection may sit idle before it is closed (`GATEHOUSE_DB_IDLE_SECS`,
    /// 1 to 3600, default 30).
    pub db_idle_secs: u64,
    /// Connections in a worker's hot-path pipe (`GATEHOUSE_DB_PIPE`); `None`: one per four cores.
    pub db_pipe: Option<u32>,
    /// How the processes reach Postgres (`GATEHOUSE_DB_POOLING`): `session` (directly, or a
    /// pooler in session mode; the default) or `transaction` (a pooler in transaction mode).
    pub db_pooling: crate::Pooling,
    /// Where the worker's pipe connects (`GATEHOUSE_DB_PIPE_URL`; default `DATABASE_URL`):
    /// behind a transaction pooler, as a role that carries the pipe's settings.
    pub db_pipe_url: Option<Secret>,
    /// The keys that seal secrets kept in Postgres (`GATEHOUSE_SECRET_KEYS`,
    /// `kid:base64url-32-bytes[,…]`, the first sealing): a tenant IdP's client secret.
    pub secret_keys: Option<Secret>,
    /// The Ed25519 seeds that sign audit checkpoints (`GATEHOUSE_AUDIT_SIGNING_KEYS`,
    /// `kid:base64url-32-byte-seed[,…]`, the first signing, all published).
    pub audit_signing_keys: Option<Secret>,
    /// Public halves of keys that signed checkpoints once and sign no more
    /// (`GATEHOUSE_AUDIT_RETIRED_KEYS`, `kid:base64url-public-key[,…]`): published, verifying.
    pub audit_retired_keys: Option<String>,
    /// Where every checkpoint is appended as it is made, outside Postgres
    /// (`GATEHOUSE_AUDIT_ANCHOR_FILE`; JSON lines, fsynced), and what the signer remembers.
    pub audit_anchor_file: Option<std::path::PathBuf>,
}

impl Common {
    /// The secret-sealing keys, parsed; an error names what is wrong, never the key.
    pub fn seal_keys(&self) -> Result<Option<std::sync::Arc<crate::seal::SealKeys>>> {
        self.secret_keys
            .as_ref()
            .map(|spec| {
                crate::seal::SealKeys::parse(spec.expose())
                    .map(std::sync::Arc::new)
                    .map_err(|e| Error::invalid("GATEHOUSE_SECRET_KEYS", e))
            })
            .transpose()
    }

    /// The audit checkpoint signing keys, parsed; an error names what is wrong, never the key.
    pub fn audit_keys(
        &self,
    ) -> Result<Option<std::sync::Arc<crate::services::audit::SigningKeys>>> {
        self.audit_signing_keys
            .as_ref()
            .map(|spec| {
                crate::services::audit::SigningKeys::parse(spec.expose())
                    .map_err(|e| Error::invalid("GATEHOUSE_AUDIT_SIGNING_KEYS", e))
                    .and_then(|keys| {
                        keys.with_retired(self.audit_retired_keys.as_deref().unwrap_or_default())
                            .map_err(|e| Error::invalid("GATEHOUSE_AUDIT_RETIRED_KEYS", e))
                    })
                    .map(std::sync::Arc::new)
            })
            .transpose()
    }

    /// What the checkpoint signer remembers: the anchor file when configured, else memory.
    pub fn audit_anchors(&self) -> Result<crate::services::audit::Anchors> {
        match &self.audit_anchor_file {
            Some(path) => crate::services::audit::Anchors::with_file(path),
            None => Ok(crate::services::audit::Anchors::in_memory()),
        }
    }

    pub fn from_env() -> Result<Self> {
        let database_url = std::env::var("DATABASE_URL").map_err(|_| Error::Invalid {
            field: "DATABASE_URL".into(),
            problem: "set DATABASE_URL, e.g. postgres://postgres@127.0.0.1:5432/gatehouse".into(),
            options: Vec::new(),
        })?;
        let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
        let db_max_connections =
            std::env::var("GATEHOUSE_DB_POOL").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
        let db_idle_secs = match std::env::var("GATEHOUSE_DB_IDLE_SECS") {
            Err(_) => 30,
            Ok(v) => v.trim().parse().ok().filter(|n| (1..=3600).contains(n)).ok_or_else(|| {
                Error::invalid(
                    "GATEHOUSE_DB_IDLE_SECS",
                    "use 1 to 3600 (seconds a pooled connection may sit idle before it is closed)",
                )
            })?,
        };
        let db_pipe = match std::env::var("GATEHOUSE_DB_PIPE") {
            Err(_) => None,
            Ok(v) => Some(v.trim().parse().ok().filter(|n| (1..=64).contains(n)).ok_or_else(|| {
                Error::invalid(
                    "GATEHOUSE_DB_PIPE",
                    "use 1 to 64 (connections the worker's requests share; default one per four cores)",
                )
            })?),
        };
        let db_pooling = match std::env::var("GATEHOUSE_DB_POOLING") {
            Err(_) => crate::Pooling::Session,
            Ok(v) if v.trim().is_empty() => crate::Pooling::Session,
            Ok(v) => crate::Pooling::parse(&v).ok_or_else(|| {
                Error::invalid_with_options(
                    "GATEHOUSE_DB_POOLING",
                    "use session (Postgres itself, or a pooler in session mode) or transaction \
                     (a pooler in transaction mode; docs/operations.md, \"Transaction pooling\")",
                    vec!["session".into(), "transaction".into()],
                )
            })?,
        };
        let nats_replicas = match std::env::var("GATEHOUSE_NATS_REPLICAS") {
            Err(_) => 1,
            Ok(v) => v.trim().parse().ok().filter(|n| (1..=5).contains(n)).ok_or_else(|| {
                Error::invalid("GATEHOUSE_NATS_REPLICAS", "use 1 to 5 (3 on a three-node cluster)")
            })?,
        };
        Ok(Common {
            database_url: Secret(database_url),
            nats_url,
            nats_replicas,
            db_max_connections,
            db_idle_secs,
            db_pipe,
            db_pooling,
            db_pipe_url: std::env::var("GATEHOUSE_DB_PIPE_URL")
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map(Secret),
            secret_keys: std::env::var("GATEHOUSE_SECRET_KEYS")
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map(Secret),
            audit_signing_keys: std::env::var("GATEHOUSE_AUDIT_SIGNING_KEYS")
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map(Secret),
            audit_retired_keys: std::env::var("GATEHOUSE_AUDIT_RETIRED_KEYS")
                .ok()
                .filter(|v| !v.trim().is_empty()),
            audit_anchor_file: std::env::var_os("GATEHOUSE_AUDIT_ANCHOR_FILE")
                .filter(|v| !v.is_empty())
                .map(std::path::PathBuf::from),
        })
    }
}

/// Libraries that log every request or statement at info: kept at `warn` unless `RUST_LOG`
/// names them itself, so `RUST_LOG=info` means one line per tool call (rmcp's "Service
/// initialized" carried the client's capabilities in Debug form on every stateless request).
const QUIET_LIBRARIES: [&str; 6] = ["rmcp", "sqlx", "hyper", "h2", "tower_http", "async_nats"];

/// The log filter for `RUST_LOG` (`None`: unset): its directives, then `warn` for every quiet
/// library it does not name.
pub fn log_filter(rust_log: Option<&str>) -> String {
    let given = rust_log.map(str::trim).filter(|v| !v.is_empty()).unwrap_or("info");
    let named = |lib: &str| {
        given.split(',').any(|d| {
            let target = d.split(['=', '[']).next().unwrap_or_default().trim();
            target == lib || target.starts_with(&format!("{lib}::"))
        })
    };
    let mut filter = given.to_owned();
    for lib in QUIET_LIBRARIES.iter().filter(|lib| !named(lib)) {
        filter.push_str(&format!(",{lib}=warn"));
    }
    filter
}

/// Initializes logging: JSON lines with dotted field names when `GATEHOUSE_LOG_FORMAT=json`,
/// readable text otherwise; level from `RUST_LOG` (default info), chatty libraries at `warn`
/// ([`log_filter`]).
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let wanted = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    let filter = EnvFilter::try_new(&wanted).unwrap_or_else(|e| {
        eprintln!("RUST_LOG {wanted:?} does not parse ({e}); logging at info");
        EnvFilter::new(log_filter(None))
    });
    let json = std::env::var("GATEHOUSE_LOG_FORMAT").is_ok_and(|v| v == "json");
    // Colours only for a person at a terminal: a log file or collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    if json {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
}

/// Resolves on SIGTERM (Kubernetes stopping a pod) or Ctrl-C; servers then stop accepting and
/// drain in-flight requests.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    tracing::info!("shutting down: draining in-flight requests");
}

#[cfg(test)]
mod tests {
    use super::log_filter;

    #[test]
    fn chatty_libraries_stay_at_warn_unless_rust_log_names_them() {
        let unset = log_filter(None);
        assert!(unset.starts_with("info,") && unset.contains("rmcp=warn"), "{unset}");
        let info = log_filter(Some("info"));
        for lib in ["rmcp=warn", "sqlx=warn", "hyper=warn", "h2=warn", "tower_http=warn"] {
            assert!(info.split(',').any(|d| d == lib), "{info} lacks {lib}");
        }
        // An operator who asks for a library's lines gets them.
        let debug = log_filter(Some("info,rmcp=debug,sqlx::query=info"));
        assert!(!debug.contains("rmcp=warn") && !debug.contains("sqlx=warn"), "{debug}");
        assert!(debug.contains("hyper=warn"));
        assert_eq!(log_filter(Some("  ")), log_filter(None));
    }
}
