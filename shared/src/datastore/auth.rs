//! The connection context: one query per MCP request (DESIGN step 3, R4).

use crate::datastore::hot_path::Sql;
use crate::datastore::pipe::PipeRow;
use crate::datastore::{BookingFilter, BookingRow, Services, from_ts};
use crate::error::Result;
use tokio_postgres::types::ToSql;

/// Everything a worker needs to decide about one MCP request, read in one round trip:
/// the token, its connection, the tenant and both switches, the creator and their current
/// membership. Live rights are computed from it in [`crate::auth`].
#[derive(Debug, sqlx::FromRow)]
pub struct ConnectionContextRow {
    pub token_expires_at: Option<chrono::DateTime<chrono::Utc>>,
    pub token_audience: Option<String>,
    pub connection_id: i64,
    pub connection_handle: String,
    pub connection_name: String,
    pub client_name: String,
    pub connection_rights: Vec<String>,
    pub connection_status: String,
    pub connection_toolset: String,
    pub tenant_id: i64,
    pub tenant_handle: String,
    pub tenant_slug: String,
    pub tenant_zone: String,
    pub tenant_currency: String,
    pub tenant_agent_access: bool,
    pub creator_id: i64,
    pub creator_handle: String,
    pub creator_active: bool,
    pub creator_role: Option<String>,
    pub membership_active: Option<bool>,
    pub global_kill: bool,
    /// The tenant's override of the per-worker read bucket, if it set one.
    pub read_per_minute: Option<i32>,
    /// The tenant's policy set in force (0: none).
    pub policy_version: i32,
    /// How the connection was granted: `static`, `oauth` or `id_jag`.
    pub connection_grant: String,
    /// The server is a hot standby, whose data may lag a revocation: nothing is decided on it.
    /// Read through `current_setting('in_hot_standby')` (stable) rather than
    /// `pg_is_in_recovery()`, which is volatile and would keep the planner from folding the
    /// context into the booking's lookup.
    pub on_standby: bool,
}

/// What an API token resolves to: the person's current role in the token's tenant.
#[derive(Debug, sqlx::FromRow)]
pub struct ApiContextRow {
    pub api_token_id: i64,
    pub person_id: i64,
    pub person_handle: String,
    pub person_active: bool,
    pub role: Option<String>,
    pub membership_active: Option<bool>,
    pub tenant_id: i64,
    pub tenant_handle: String,
    pub tenant_slug: String,
    pub tenant_zone: String,
    pub tenant_currency: String,
    /// The token is past its expiry.
    pub expired: bool,
}

/// A connection context read together with a tool's read.
pub struct ContextWithBooking {
    pub context: ConnectionContextRow,
    /// `None` when the booking was not read (the statement failed on the tool's part and the
    /// context was read alone); else the booking, when the context's tenant has one of that
    /// handle.
    pub booking: Option<Option<BookingRow>>,
}

/// A connection context read together with a page of a booking search.
pub struct ContextWithBookings {
    pub context: ConnectionContextRow,
    /// The bookings found, when the search found some and they decoded; `None` otherwise
    /// (nothing found, the read's part failed): the tool then searches for itself, and an
    /// empty page is never answered from a row a gate may have emptied.
    pub bookings: Option<Vec<BookingRow>>,
}

/// A connection context read together with what its tenant's policies see of the records a
/// call names.
pub(crate) struct ContextWithFacts {
    pub context: ConnectionContextRow,
    /// The records found, when they were read (a context that passes every gate, of a tenant
    /// with a policy set in force) and decoded; `None` otherwise: the gate then reads them
    /// itself, if it needs them.
    pub facts: Option<Vec<super::PolicyFactRow>>,
}

impl ConnectionContextRow {
    /// Reads the context from a row of the pipe (`sqlx::FromRow` reads the same columns from a
    /// pool row; a test holds the two to the same answer).
    fn from_pipe(row: &PipeRow) -> Result<Self> {
        Ok(ConnectionContextRow {
            token_expires_at: row.get("token_expires_at")?,
            token_audience: row.get("token_audience")?,
            connection_id: row.get("connection_id")?,
            connection_handle: row.get("connection_handle")?,
            connection_name: row.get("connection_name")?,
            client_name: row.get("client_name")?,
            connection_rights: row.get("connection_rights")?,
            connection_status: row.get("connection_status")?,
            connection_toolset: row.get("connection_toolset")?,
            tenant_id: row.get("tenant_id")?,
            tenant_handle: row.get("tenant_handle")?,
            tenant_slug: row.get("tenant_slug")?,
            tenant_zone: row.get("tenant_zone")?,
            tenant_currency: row.get("tenant_currency")?,
            tenant_agent_access: row.get("tenant_agent_access")?,
            creator_id: row.get("creator_id")?,
            creator_handle: row.get("creator_handle")?,
            creator_active: row.get("creator_active")?,
            creator_role: row.get("creator_role")?,
            membership_active: row.get("membership_active")?,
            global_kill: row.get("global_kill")?,
            read_per_minute: row.get("read_per_minute")?,
            policy_version: row.get("policy_version")?,
            connection_grant: row.get("connection_grant")?,
            on_standby: row.get("on_standby")?,
        })
    }
}

fn refuse_standby(on_standby: bool) -> Result<()> {
    if on_standby {
        // A standby answers reads but not the writes a call may make: retry on the primary.
        super::note_broken();
        return Err(crate::error::DbFailure {
            sqlstate: Some("25006".into()),
            message: "connected to a hot standby; the connection context needs the primary".into(),
        }
        .into());
    }
    Ok(())
}

impl Services {
    /// Looks up an MCP token by hash: one round trip, on the pipe.
    pub(crate) async fn entry_connection_context(
        &self,
        token_hash: &[u8],
    ) -> Result<Option<ConnectionContextRow>> {
        let Some(row) = self.pipe().query_opt(Sql::Context, &[&token_hash]).await? else {
            return Ok(None);
        };
        let context = ConnectionContextRow::from_pipe(&row)?;
        refuse_standby(context.on_standby)?;
        Ok(Some(context))
    }

    /// Looks up an MCP token by hash and a booking of its tenant, in one round trip.
    pub(crate) async fn entry_connection_context_with_booking(
        &self,
        token_hash: &[u8],
        booking: &str,
        notes_before: Option<crate::datastore::NotesBefore>,
    ) -> Result<Option<ContextWithBooking>> {
        let (at, note) = notes_before.unzip();
        let params: [&(dyn ToSql + Sync); 4] = [&token_hash, &booking, &at, &note];
        let Some((context, rows)) =
            self.entry_context_and_read(token_hash, Sql::ContextAndBooking, &params).await?
        else {
            return Ok(None);
        };
        // The booking's part never decides authentication: should it not decode, the context
        // stands and the tool reads the booking for itself (and reports what it finds).
        let booking = rows.and_then(|rows| {
            let row = rows.first()?;
            let decoded = row
                .get::<Option<i64>>("id")
                .and_then(|found| found.map(|_| BookingRow::from_pipe(row)).transpose());
            decoded
                .inspect_err(
                    |e| tracing::warn!(error = %e, "the read-ahead row did not decode; not used"),
                )
                .ok()
        });
        Ok(Some(ContextWithBooking { context, booking }))
    }

    /// Looks up an MCP token by hash and a page of a booking search in its tenant, in one
    /// round trip.
    pub(crate) async fn entry_connection_context_with_bookings(
        &self,
        token_hash: &[u8],
        filter: &BookingFilter,
    ) -> Result<Option<ContextWithBookings>> {
        let (after_at, after_handle) = filter.after.clone().unzip();
        let (from, to, after_at) =
            (filter.from.map(from_ts), filter.to.map(from_ts), after_at.map(from_ts));
        let params: [&(dyn ToSql + Sync); 9] = [
            &token_hash,
            &from,
            &to,
            &filter.statuses,
            &filter.technician,
            &filter.customer,
            &after_at,
            &after_handle,
            &filter.limit,
        ];
        let Some((context, rows)) =
            self.entry_context_and_read(token_hash, Sql::ContextAndBookings, &params).await?
        else {
            return Ok(None);
        };
        let bookings = rows.and_then(|rows| {
            let mut found = Vec::with_capacity(rows.len());
            for row in &rows {
                match row.get::<Option<i64>>("id") {
                    Ok(Some(_)) => match BookingRow::from_pipe(row) {
                        Ok(booking) => found.push(booking),
                        Err(e) => {
                            tracing::warn!(error = %e, "the read-ahead row did not decode; not used");
                            return None;
                        }
                    },
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "the read-ahead row did not decode; not used");
                        return None;
                    }
                }
            }
            (!found.is_empty()).then_some(found)
        });
        Ok(Some(ContextWithBookings { context, bookings }))
    }

    /// Looks up an MCP token by hash and what its tenant's policies see of the records named,
    /// in one round trip.
    pub(crate) async fn entry_connection_context_with_facts(
        &self,
        token_hash: &[u8],
        bookings: &[String],
        customers: &[String],
        technicians: &[String],
    ) -> Result<Option<ContextWithFacts>> {
        let params: [&(dyn ToSql + Sync); 4] = [&token_hash, &bookings, &customers, &technicians];
        let Some((context, rows)) =
            self.entry_context_and_read(token_hash, Sql::ContextAndFacts, &params).await?
        else {
            return Ok(None);
        };
        let facts = rows.and_then(|rows| {
            let decoded: Result<Option<Vec<super::PolicyFactRow>>> = (|| {
                if !rows.first().map(|r| r.get::<bool>("facts_read")).transpose()?.unwrap_or(false)
                {
                    return Ok(None);
                }
                let mut found = Vec::with_capacity(rows.len());
                for row in &rows {
                    if row.get::<Option<String>>("fact_handle")?.is_some() {
                        found.push(super::PolicyFactRow::from_pipe(row)?);
                    }
                }
                Ok(Some(found))
            })();
            decoded
                .inspect_err(
                    |e| tracing::warn!(error = %e, "the read-ahead row did not decode; not used"),
                )
                .ok()
                .flatten()
        });
        Ok(Some(ContextWithFacts { context, facts }))
    }

    /// Runs a statement that reads the connection context and a tool's read together: the
    /// context (from its first row) and the rows, or the context alone (`None` rows) when the
    /// tool's part failed in a way the tool's own read reports better.
    async fn entry_context_and_read(
        &self,
        token_hash: &[u8],
        sql: Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<(ConnectionContextRow, Option<Vec<PipeRow>>)>> {
        let read = self.pipe().query(sql, params).await;
        let rows = match read {
            Ok(rows) => rows,
            // A value Postgres refuses in the tool's part (SQLSTATE class 22, data exception),
            // or a lock on the tool's tables (55P03, a migration's, say: the pipe waits for
            // locks only briefly, as statements are queued behind it): the context alone
            // decides, and the tool reads for itself on the pool, where it may wait without
            // holding up anyone else, and reports its own error. Anything else (overload,
            // timeouts, a broken connection) is the database's and is not retried here.
            Err(failure)
                if failure.sqlstate().is_some_and(|code| {
                    code.starts_with("22") || code == "55P03" || code == "57014"
                }) =>
            {
                tracing::warn!(error = ?failure, "the read-ahead failed; the context is read alone");
                let context = self.entry_connection_context(token_hash).await?;
                return Ok(context.map(|context| (context, None)));
            }
            Err(failure) => return Err(failure.into()),
        };
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        if !first.columns_distinct() {
            return Err(crate::error::Error::Internal(
                "the read-ahead statement names a column twice".into(),
            ));
        }
        let context = ConnectionContextRow::from_pipe(first)?;
        refuse_standby(context.on_standby)?;
        Ok(Some((context, Some(rows))))
    }

    /// Looks up an API token by hash, with its person's current membership.
    pub(crate) async fn entry_api_token_context(
        &self,
        token_hash: &[u8],
    ) -> Result<Option<ApiContextRow>> {
        let row = sqlx::query_as::<_, ApiContextRow>(
            r#"
            SELECT a.id AS api_token_id, p.id AS person_id, p.handle AS person_handle,
                   p.active AS person_active,
                   m.role, m.active AS membership_active,
                   t.id AS tenant_id, t.handle AS tenant_handle, t.slug AS tenant_slug,
                   t.zone AS tenant_zone, t.currency::text AS tenant_currency,
                   a.expires_at <= now() AS expired
            FROM api_tokens a
            JOIN people p ON p.id = a.person_id
            JOIN tenants t ON t.id = a.tenant_id
            LEFT JOIN memberships m ON m.tenant_id = a.tenant_id AND m.person_id = a.person_id
            WHERE a.token_hash = $1 AND a.revoked_at IS NULL
            "#,
        )
        .bind(token_hash)
        .fetch_optional(self.pool())
        .await?;
        Ok(row)
    }
}

impl BookingRow {
    /// Reads a booking from a row of the pipe (the read-ahead); `sqlx::FromRow` reads the same
    /// columns from a pool row, and the worker's read-ahead test holds both to one answer.
    pub(crate) fn from_pipe(row: &PipeRow) -> Result<Self> {
        let notes: tokio_postgres::types::Json<Vec<crate::datastore::NoteRow>> =
            row.get("notes")?;
        Ok(BookingRow {
            id: row.get("id")?,
            customer_id: row.get("customer_id")?,
            service_id: row.get("service_id")?,
            technician_id: row.get("technician_id")?,
            handle: row.get("handle")?,
            status: row.get("status")?,
            starts_at: row.get("starts_at")?,
            zone: row.get("zone")?,
            currency: row.get("currency")?,
            net_minor: row.get("net_minor")?,
            tax_minor: row.get("tax_minor")?,
            total_minor: row.get("total_minor")?,
            customer_note: row.get("customer_note")?,
            customer_handle: row.get("customer_handle")?,
            customer_name: row.get("customer_name")?,
            customer_email: row.get("customer_email")?,
            customer_region: row.get("customer_region")?,
            technician_handle: row.get("technician_handle")?,
            technician_name: row.get("technician_name")?,
            service_handle: row.get("service_handle")?,
            service_name: row.get("service_name")?,
            duration_minutes: row.get("duration_minutes")?,
            tax_rate_bp: row.get("tax_rate_bp")?,
            priority: row.get("priority")?,
            reference: row.get("reference")?,
            updated_at: row.get("updated_at")?,
            notes: sqlx::types::Json(notes.0),
            notes_total: row.get("notes_total")?,
        })
    }
}
