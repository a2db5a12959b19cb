//! The hot path's statements: what the worker's pipe sends on every request (the connection
//! context, alone or with a tool's read, and the rate window), as text and as the [`Sql`] the
//! pipe prepares. The pipe is the mechanism ([`super::pipe`]); what it runs lives here, so the
//! reads that use it and the pipe both build on this file and on nothing of each other.

use tokio_postgres::types::Type;

/// The statements the pipe runs, each prepared on a pipe connection when first needed there.
///
/// Before adding one that writes: the pipe's sessions commit without waiting for the WAL flush
/// (see `Pipe::new`), and [`Sql::reads_only`] decides what is sent again after a lost
/// connection. Only a write whose loss in a crash is harmless (a rate counter) belongs here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sql {
    /// The connection context ($1 token hash).
    Context = 0,
    /// The connection context and one booking of its tenant ($1 token hash, $2 handle, $3–$4
    /// the notes cursor).
    ContextAndBooking = 1,
    /// One call counted in a connection's rate window.
    RateTake = 2,
    /// The connection context and one page of a booking search in its tenant ($1 token hash,
    /// $2–$9 the search: range, statuses, technician, customer, keyset, limit): one row per
    /// booking, or one with the context alone when none matches.
    ContextAndBookings = 3,
    /// The connection context and what its tenant's policies see of the records a call names
    /// ($1 token hash, $2–$4 the handles of bookings, customers and technicians), read only
    /// when the tenant has a policy set in force: one row per record found, or one with the
    /// context alone.
    ContextAndFacts = 4,
}

impl Sql {
    pub(crate) const COUNT: usize = 5;
    pub(crate) const ALL: [Sql; Sql::COUNT] = [
        Sql::Context,
        Sql::ContextAndBooking,
        Sql::RateTake,
        Sql::ContextAndBookings,
        Sql::ContextAndFacts,
    ];

    /// Its name in metrics.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Sql::Context => "context",
            Sql::ContextAndBooking => "context_and_booking",
            Sql::RateTake => "rate_take",
            Sql::ContextAndBookings => "context_and_bookings",
            Sql::ContextAndFacts => "context_and_facts",
        }
    }

    pub(crate) fn text(self) -> &'static str {
        match self {
            Sql::Context => CONNECTION_CONTEXT_SQL,
            Sql::ContextAndBooking => CONTEXT_AND_BOOKING_SQL.as_str(),
            Sql::RateTake => RATE_TAKE_SQL,
            Sql::ContextAndBookings => CONTEXT_AND_BOOKINGS_SQL.as_str(),
            Sql::ContextAndFacts => CONTEXT_AND_FACTS_SQL.as_str(),
        }
    }

    /// The parameters' types, given rather than inferred, so a statement's meaning does not
    /// depend on what the server makes of it.
    pub(crate) fn types(self) -> &'static [Type] {
        match self {
            Sql::Context => &[Type::BYTEA],
            Sql::ContextAndBooking => &[Type::BYTEA, Type::TEXT, Type::TIMESTAMPTZ, Type::TEXT],
            Sql::RateTake => &[Type::INT8, Type::INT8, Type::TEXT, Type::INT4],
            Sql::ContextAndBookings => &[
                Type::BYTEA,
                Type::TIMESTAMPTZ,
                Type::TIMESTAMPTZ,
                Type::TEXT_ARRAY,
                Type::TEXT,
                Type::TEXT,
                Type::TIMESTAMPTZ,
                Type::TEXT,
                Type::INT8,
            ],
            Sql::ContextAndFacts => {
                &[Type::BYTEA, Type::TEXT_ARRAY, Type::TEXT_ARRAY, Type::TEXT_ARRAY]
            }
        }
    }

    /// Whether sending it twice changes nothing (so a lost connection may be retried).
    pub(crate) fn reads_only(self) -> bool {
        !matches!(self, Sql::RateTake)
    }
}

/// The token and everything its call is decided on: the connection, tenant, switches and the
/// creator's current membership. A plain select (no CTE, no write), so it can stand alone or
/// be the first part of a statement that also carries a tool's read.
const CONTEXT_SELECT: &str = r#"
            SELECT tok.kind AS token_kind, tok.expires_at AS token_expires_at,
                   tok.audience AS token_audience,
                   c.id AS connection_id, c.handle AS connection_handle,
                   c.name AS connection_name, c.client_name, c.rights AS connection_rights,
                   c.status AS connection_status, c.toolset AS connection_toolset,
                   t.id AS tenant_id, t.handle AS tenant_handle, t.slug AS tenant_slug,
                   t.zone AS tenant_zone, t.currency::text AS tenant_currency,
                   t.agent_access AS tenant_agent_access,
                   p.id AS creator_id, p.handle AS creator_handle, p.active AS creator_active,
                   m.role AS creator_role, m.active AS membership_active,
                   (SELECT global_kill FROM platform_state) AS global_kill,
                   t.read_per_minute, t.policy_version,
                   CASE WHEN c.granted_by = 'idp' THEN 'id_jag'
                        WHEN c.oauth_client_id IS NOT NULL THEN 'oauth' ELSE 'static' END
                     AS connection_grant,
                   coalesce(current_setting('in_hot_standby', true), 'off') = 'on' AS on_standby
            FROM connection_tokens tok
            JOIN connections c ON c.id = tok.connection_id
            JOIN tenants t ON t.id = c.tenant_id
            JOIN people p ON p.id = c.creator_id
            LEFT JOIN memberships m ON m.tenant_id = c.tenant_id AND m.person_id = c.creator_id
            WHERE tok.token_hash = $1 AND tok.kind IN ('static', 'access')
            "#;

/// The hot-path query: the token, its connection, tenant, switches and the creator's current
/// membership in one round trip. Public so the benchmark can run the same SQL through pgbench.
/// `last_used_at` is not stamped here: the workers' activity flush writes it with the counts,
/// off the request path.
pub(crate) const CONNECTION_CONTEXT_SQL: &str = CONTEXT_SELECT;

/// The connection context and one booking of the context's tenant in one statement, so a
/// `get_booking` call costs one round trip ($1 token hash, $2 booking handle, $3–$4 the
/// notes cursor). The booking is looked up only in the token's tenant and only for an active
/// connection; whether the caller may see it is still decided in Rust from the context, before
/// the row is used (see [`crate::auth::ReadAhead`]).
pub(crate) static CONTEXT_AND_BOOKING_SQL: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| {
        format!(
            "WITH ctx AS ({CONTEXT_SELECT})
             SELECT ctx.*, bk.* FROM ctx
             LEFT JOIN LATERAL ({booking}) bk ON {READ_GATES}",
            booking = crate::datastore::booking_get_sql_with("ctx.tenant_id", "$2", "$3", "$4"),
        )
    });

/// The connection context and one page of a booking search in its tenant, in one statement,
/// so a `find_bookings` call costs one round trip ($1 token hash, $2–$9 the search as
/// [`crate::datastore::booking_find_sql_with`] takes it). One row per booking found, in the
/// search's order, each carrying the context; one row with the context alone when none is.
pub(crate) static CONTEXT_AND_BOOKINGS_SQL: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| {
        format!(
            "WITH ctx AS ({CONTEXT_SELECT})
             SELECT ctx.*, bk.* FROM ctx
             LEFT JOIN LATERAL ({search}) bk ON {READ_GATES}
             ORDER BY bk.starts_at, bk.handle",
            search = crate::datastore::booking_find_sql_with(
                "ctx.tenant_id",
                ["$2", "$3", "$4", "$5", "$6", "$7", "$8", "$9"]
            ),
        )
    });

/// The connection context and the facts its tenant's policies read of the records a call
/// names, in one statement, so the policy gate of a call that names a booking, customer or
/// technician costs no round trip of its own ($1 token hash, $2–$4 the handles, as
/// [`crate::datastore::policy_facts_sql_with`] takes them). The facts are read only for a
/// context that passes every gate and whose tenant has a policy set in force (`facts_read`
/// says whether they were): a tenant without policies pays for a lookup never made. The
/// subquery is kept whole (`OFFSET 0`), so its conditions on the context are the plan's
/// one-time filter and its scans never start when they fail. Columns of a record carry the
/// prefix `fact_`.
pub(crate) static CONTEXT_AND_FACTS_SQL: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| {
        format!(
            "WITH ctx AS ({CONTEXT_SELECT})
             SELECT ctx.*, ({READ_GATES} AND ctx.policy_version > 0) AS facts_read,
                    f.handle AS fact_handle, f.status AS fact_status,
                    f.starts_at AS fact_starts_at, f.region AS fact_region,
                    f.zone AS fact_zone, f.active AS fact_active
             FROM ctx
             LEFT JOIN LATERAL (SELECT * FROM ({facts}) f
                                WHERE ctx.policy_version > 0 AND {READ_GATES} OFFSET 0) f
               ON true",
            facts = crate::datastore::policy_facts_sql_with("ctx.tenant_id", "$2", "$3", "$4"),
        )
    });

/// A tool's read joins its context only for a context that will pass every gate, so a
/// refused call reads nothing of the tenant's records.
const READ_GATES: &str = "ctx.connection_status = 'active' AND ctx.tenant_agent_access
                  AND NOT ctx.global_kill AND NOT ctx.on_standby
                  AND (ctx.token_expires_at IS NULL OR ctx.token_expires_at > now())
                  AND ctx.creator_active AND ctx.membership_active IS TRUE";

/// Counts one call of a connection's class in the current minute's window.
pub(crate) const RATE_TAKE_SQL: &str = "WITH up AS (
                 INSERT INTO rate_windows (connection_id, class, window_start, count)
                 VALUES ($1, $3, date_trunc('minute', now()), 1)
                 ON CONFLICT (connection_id, class, window_start) DO UPDATE SET count = rate_windows.count + 1
                 RETURNING count, window_start)
             SELECT up.count,
                    coalesce((SELECT per_minute FROM tenant_rate_limits WHERE tenant_id = $2 AND class = $3), $4) AS per_minute,
                    extract(epoch FROM up.window_start + interval '1 minute' - now())::float8 AS seconds_left
             FROM up";
