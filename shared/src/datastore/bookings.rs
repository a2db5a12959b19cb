use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sqlx::types::Json;

use crate::ctx::OpCtx;
use crate::datastore::{Services, Tx, from_ts};
use crate::error::{Error, Resource, Result};
use crate::handle::BookingHandle;

/// A booking with what every presenter of it needs, joined in one query.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct BookingRow {
    pub id: i64,
    pub customer_id: i64,
    pub service_id: i64,
    pub technician_id: Option<i64>,
    pub handle: String,
    pub status: String,
    pub starts_at: DateTime<Utc>,
    pub zone: String,
    pub currency: String,
    pub net_minor: i64,
    pub tax_minor: i64,
    pub total_minor: i64,
    pub customer_note: Option<String>,
    pub customer_handle: String,
    pub customer_name: String,
    pub customer_email: Option<String>,
    /// The customer's region: the booking's, to a tenant's policies.
    pub customer_region: Option<String>,
    pub technician_handle: Option<String>,
    pub technician_name: Option<String>,
    pub service_handle: String,
    pub service_name: String,
    pub duration_minutes: i32,
    pub tax_rate_bp: i32,
    pub priority: String,
    pub reference: Option<String>,
    pub updated_at: DateTime<Utc>,
    /// Filled by [`Services::booking_get`] only: the latest notes (one more than a page, so
    /// the presenter knows whether earlier ones exist), newest first.
    pub notes: Json<Vec<NoteRow>>,
    /// How many notes the booking has in all (0 where notes are not read).
    pub notes_total: i64,
}

/// Where a page of notes starts: before this note (written at, handle).
pub type NotesBefore = (DateTime<Utc>, String);

#[derive(Debug, Clone, serde::Deserialize)]
pub struct NoteRow {
    pub handle: String,
    pub source: String,
    pub body: String,
    pub created_at: String,
}

/// Booking filters, already parsed and resolved to instants.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BookingFilter {
    pub from: Option<jiff::Timestamp>,
    pub to: Option<jiff::Timestamp>,
    /// Any of these statuses; empty means every status.
    pub statuses: Vec<String>,
    pub technician: Option<String>,
    pub customer: Option<String>,
    /// Keyset: bookings strictly after `(starts_at, handle)`.
    pub after: Option<(jiff::Timestamp, String)>,
    pub limit: i64,
}

const SELECT: &str = "
    SELECT b.id, b.customer_id, b.service_id, b.technician_id, b.handle, b.status, b.starts_at, b.zone, b.currency::text AS currency,
           b.net_minor, b.tax_minor, b.total_minor, b.customer_note,
           c.handle AS customer_handle, c.name AS customer_name, c.email AS customer_email,
           c.region AS customer_region,
           t.handle AS technician_handle, t.name AS technician_name,
           s.handle AS service_handle, s.name AS service_name, s.duration_minutes, s.tax_rate_bp,
           b.priority, b.reference, b.updated_at";

const FROM: &str = "
    FROM bookings b
    JOIN customers c ON c.id = b.customer_id AND c.tenant_id = b.tenant_id
    JOIN services s ON s.id = b.service_id AND s.tenant_id = b.tenant_id
    LEFT JOIN technicians t ON t.id = b.technician_id AND t.tenant_id = b.tenant_id";

/// The filter of a booking search, with the given expressions for the tenant and for
/// `[from, to, statuses, technician, customer]`. An open end of the range is an infinite
/// bound rather than `$n IS NULL OR …`: the range stays a condition of the tenant's
/// start-time index whatever the parameters, so the one generic plan walks that index in
/// order and stops at the page (a catch-all `OR` made the generic plan sort the whole tenant:
/// 1.4 s on a million bookings, against 0.2 ms; docs/architecture.md).
fn filter_with(tenant: &str, [from, to, statuses, technician, customer]: [&str; 5]) -> String {
    format!(
        "
    WHERE b.tenant_id = {tenant}
      AND b.starts_at >= coalesce({from}::timestamptz, '-infinity'::timestamptz)
      AND b.starts_at < coalesce({to}::timestamptz, 'infinity'::timestamptz)
      AND (cardinality({statuses}::text[]) = 0 OR b.status = ANY({statuses}))
      AND ({technician}::text IS NULL OR t.handle = {technician})
      AND ({customer}::text IS NULL OR c.handle = {customer})"
    )
}

/// A booking search with the given expressions for the tenant and for `[from, to, statuses,
/// technician, customer, after at, after handle, limit]`: one statement whatever the filter,
/// so it is prepared once and keeps one plan (the tenant's start-time index, in order).
pub(crate) fn booking_find_sql_with(tenant: &str, p: [&str; 8]) -> String {
    let [from, to, statuses, technician, customer, at, handle, limit] = p;
    format!(
        "{SELECT}, '[]'::json AS notes, 0::bigint AS notes_total {FROM} {filter}
               AND (b.starts_at, b.handle)
                   > (coalesce({at}::timestamptz, '-infinity'::timestamptz), coalesce({handle}::text, ''))
             ORDER BY b.starts_at, b.handle
             LIMIT {limit}",
        filter = filter_with(tenant, [from, to, statuses, technician, customer]),
    )
}

static BOOKING_FIND_SQL: LazyLock<String> =
    LazyLock::new(|| booking_find_sql_with("$1", ["$2", "$3", "$4", "$5", "$6", "$7", "$8", "$9"]));

static BOOKING_COUNT_SQL: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT count(*) {FROM} {}", filter_with("$1", ["$2", "$3", "$4", "$5", "$6"]))
});

/// How many notes a single-booking result shows; earlier ones are paged with a cursor (R21).
pub const NOTES_PAGE: i64 = 20;

/// The single-booking query with the given expressions for the tenant, the handle and the
/// notes cursor (written at, handle): the latest notes before the cursor, one more than a page,
/// and the count kept on the booking, so a booking with thousands of notes answers with a
/// page and costs the same to read as one with two.
pub(crate) fn booking_get_sql_with(tenant: &str, handle: &str, at: &str, note: &str) -> String {
    format!(
        "{SELECT},
               (SELECT coalesce(json_agg(json_build_object(
                    'handle', n.handle, 'source', n.source, 'body', n.body,
                    'created_at', n.created_at)
                    ORDER BY n.created_at DESC, n.handle DESC), '[]'::json)
                FROM (SELECT n.handle, n.source, n.body, n.created_at FROM booking_notes n
                      WHERE n.tenant_id = b.tenant_id AND n.booking_id = b.id
                        AND ({at}::timestamptz IS NULL OR (n.created_at, n.handle) < ({at}, {note}::text))
                      ORDER BY n.created_at DESC, n.handle DESC LIMIT {page}) n) AS notes,
               (SELECT coalesce(sum(k.n), 0) FROM booking_note_counts k
                WHERE k.booking_id = b.id)::bigint AS notes_total
             {FROM}
             WHERE b.tenant_id = {tenant} AND b.handle = {handle}",
        page = NOTES_PAGE + 1
    )
}

static BOOKING_GET_SQL: LazyLock<String> =
    LazyLock::new(|| booking_get_sql_with("$1", "$2", "$3", "$4"));

pub(crate) static BOOKING_LOCK_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{SELECT}, '[]'::json AS notes, 0::bigint AS notes_total {FROM} WHERE b.tenant_id = $1 AND b.handle = $2 FOR UPDATE OF b"
    )
});

static BOOKING_FIND_LOCK_SQL: LazyLock<String> =
    LazyLock::new(|| format!("{} FOR UPDATE OF b", BOOKING_FIND_SQL.as_str()));

/// The booking search, built once (for the benchmark's peer).
pub(crate) fn booking_find_sql() -> &'static str {
    BOOKING_FIND_SQL.as_str()
}

/// The single-booking query, built once. Public so the benchmark can run it through pgbench.
pub(crate) fn booking_get_sql() -> &'static str {
    BOOKING_GET_SQL.as_str()
}

/// One booking of the tenant, held for `tx` against deletion only (`FOR KEY SHARE`): what
/// adding a note needs. Writers adding notes to one booking do not wait for each other, nor
/// for an edit of the booking.
pub(crate) async fn booking_hold(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
) -> Result<Option<(i64, String)>> {
    Ok(sqlx::query_as(
        "SELECT id, handle FROM bookings WHERE tenant_id = $1 AND handle = $2 FOR KEY SHARE",
    )
    .bind(ctx.tenant_id())
    .bind(handle)
    .fetch_optional(&mut **tx)
    .await?)
}

/// Locks one booking of the tenant for a write in `tx`.
pub(crate) async fn booking_lock(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
) -> Result<Option<BookingRow>> {
    Ok(sqlx::query_as::<_, BookingRow>(BOOKING_LOCK_SQL.as_str())
        .bind(ctx.tenant_id())
        .bind(handle)
        .fetch_optional(&mut **tx)
        .await?)
}

/// The bookings a filter matches, locked for a batch write in `tx`.
pub(crate) async fn booking_find_locked(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    filter: &BookingFilter,
) -> Result<Vec<BookingRow>> {
    let (after_at, after_handle) = filter.after.clone().unzip();
    Ok(sqlx::query_as::<_, BookingRow>(BOOKING_FIND_LOCK_SQL.as_str())
        .bind(ctx.tenant_id())
        .bind(filter.from.map(from_ts))
        .bind(filter.to.map(from_ts))
        .bind(&filter.statuses)
        .bind(filter.technician.as_deref())
        .bind(filter.customer.as_deref())
        .bind(after_at.map(from_ts))
        .bind(after_handle)
        .bind(filter.limit)
        .fetch_all(&mut **tx)
        .await?)
}

impl Services {
    pub(crate) async fn booking_find(
        &self,
        ctx: &OpCtx,
        filter: &BookingFilter,
    ) -> Result<Vec<BookingRow>> {
        let (after_at, after_handle) = filter.after.clone().unzip();
        let rows = sqlx::query_as::<_, BookingRow>(BOOKING_FIND_SQL.as_str())
            .bind(ctx.tenant_id())
            .bind(filter.from.map(from_ts))
            .bind(filter.to.map(from_ts))
            .bind(&filter.statuses)
            .bind(filter.technician.as_deref())
            .bind(filter.customer.as_deref())
            .bind(after_at.map(from_ts))
            .bind(after_handle)
            .bind(filter.limit)
            .fetch_all(self.pool())
            .await?;
        Ok(rows)
    }

    pub(crate) async fn booking_get(
        &self,
        ctx: &OpCtx,
        handle: &BookingHandle,
        notes_before: Option<NotesBefore>,
    ) -> Result<Option<BookingRow>> {
        let (at, note) = notes_before.unzip();
        let row = sqlx::query_as::<_, BookingRow>(booking_get_sql())
            .bind(ctx.tenant_id())
            .bind(handle.as_str())
            .bind(at)
            .bind(note)
            .fetch_optional(self.pool())
            .await?;
        Ok(row)
    }
}

/// Checks that the technician and customer a filter names exist in the tenant, so that a
/// foreign or mistyped handle answers not found instead of silently matching nothing (R3, R15).
pub(crate) async fn booking_filter_refs<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    ctx: &OpCtx,
    filter: &BookingFilter,
) -> Result<()> {
    if filter.technician.is_none() && filter.customer.is_none() {
        return Ok(());
    }
    let (technician, customer): (bool, bool) = sqlx::query_as(
        "SELECT $2::text IS NULL OR EXISTS (SELECT 1 FROM technicians WHERE tenant_id = $1 AND handle = $2),
                $3::text IS NULL OR EXISTS (SELECT 1 FROM customers WHERE tenant_id = $1 AND handle = $3)",
    )
    .bind(ctx.tenant_id())
    .bind(filter.technician.as_deref())
    .bind(filter.customer.as_deref())
    .fetch_one(executor)
    .await?;
    match (technician, customer, &filter.technician, &filter.customer) {
        (false, _, Some(t), _) => Err(Error::not_found(Resource::Technician, t.as_str())),
        (_, false, _, Some(c)) => Err(Error::not_found(Resource::Customer, c.as_str())),
        _ => Ok(()),
    }
}

/// How many bookings a filter matches (its keyset and limit ignored), on any executor.
pub(crate) async fn booking_count_in<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    ctx: &OpCtx,
    filter: &BookingFilter,
) -> Result<i64> {
    Ok(sqlx::query_scalar(BOOKING_COUNT_SQL.as_str())
        .bind(ctx.tenant_id())
        .bind(filter.from.map(from_ts))
        .bind(filter.to.map(from_ts))
        .bind(&filter.statuses)
        .bind(filter.technician.as_deref())
        .bind(filter.customer.as_deref())
        .fetch_one(executor)
        .await?)
}

impl Services {
    /// How many bookings a filter matches (its keyset and limit ignored).
    pub(crate) async fn booking_count(&self, ctx: &OpCtx, filter: &BookingFilter) -> Result<i64> {
        booking_count_in(self.pool(), ctx, filter).await
    }
}

/// Another live booking of this customer for this service at this start (R9).
pub(crate) async fn booking_by_key(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    customer_id: i64,
    service_id: i64,
    starts_at: DateTime<Utc>,
) -> Result<Option<String>> {
    Ok(sqlx::query_scalar(
        "SELECT handle FROM bookings
         WHERE tenant_id = $1 AND customer_id = $2 AND service_id = $3 AND starts_at = $4
           AND status <> 'cancelled'
         ORDER BY id LIMIT 1",
    )
    .bind(ctx.tenant_id())
    .bind(customer_id)
    .bind(service_id)
    .bind(starts_at)
    .fetch_optional(&mut **tx)
    .await?)
}

pub struct BookingChange<'a> {
    pub technician_id: Option<i64>,
    pub service_id: i64,
    pub starts_at: DateTime<Utc>,
    pub net_minor: i64,
    pub tax_minor: i64,
    pub priority: &'a str,
    pub reference: Option<&'a str>,
    pub status: &'a str,
}

pub(crate) async fn booking_update(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    c: BookingChange<'_>,
) -> Result<()> {
    sqlx::query(
        "UPDATE bookings SET technician_id = $3, service_id = $4, starts_at = $5, net_minor = $6,
                tax_minor = $7, total_minor = $6 + $7, priority = $8, reference = $9, status = $10,
                updated_at = clock_timestamp()
         WHERE tenant_id = $1 AND id = $2",
    )
    .bind(ctx.tenant_id())
    .bind(id)
    .bind(c.technician_id)
    .bind(c.service_id)
    .bind(c.starts_at)
    .bind(c.net_minor)
    .bind(c.tax_minor)
    .bind(c.priority)
    .bind(c.reference)
    .bind(c.status)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(crate) async fn booking_set_separate_reason(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    id: i64,
    reason: &str,
) -> Result<()> {
    sqlx::query("UPDATE bookings SET separate_reason = $3 WHERE tenant_id = $1 AND id = $2")
        .bind(ctx.tenant_id())
        .bind(id)
        .bind(reason)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

pub(crate) async fn booking_delete(tx: &mut Tx<'_>, ctx: &OpCtx, id: i64) -> Result<()> {
    sqlx::query("DELETE FROM bookings WHERE tenant_id = $1 AND id = $2")
        .bind(ctx.tenant_id())
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

// Seed data for the bookings domain. The write tools and their guards arrive with the write
// services; these inserts serve the demo and test fixtures.

pub struct NewBooking<'a> {
    pub handle: &'a str,
    pub customer_id: i64,
    pub technician_id: Option<i64>,
    pub service_id: i64,
    pub starts_at: DateTime<Utc>,
    pub zone: &'a str,
    pub status: &'a str,
    pub currency: &'a str,
    pub net_minor: i64,
    pub tax_minor: i64,
    pub customer_note: Option<&'a str>,
}

pub(crate) async fn booking_insert(tx: &mut Tx<'_>, ctx: &OpCtx, b: NewBooking<'_>) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO bookings (tenant_id, handle, customer_id, technician_id, service_id, starts_at,
                               zone, status, currency, net_minor, tax_minor, total_minor,
                               customer_note, created_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $10 + $11, $12, $13) RETURNING id",
    )
    .bind(ctx.tenant_id())
    .bind(b.handle)
    .bind(b.customer_id)
    .bind(b.technician_id)
    .bind(b.service_id)
    .bind(b.starts_at)
    .bind(b.zone)
    .bind(b.status)
    .bind(b.currency)
    .bind(b.net_minor)
    .bind(b.tax_minor)
    .bind(b.customer_note)
    .bind(ctx.actor_person_id())
    .fetch_one(&mut **tx)
    .await?)
}

pub(crate) const NOTE_INSERT_SQL: &str =
    "INSERT INTO booking_notes (tenant_id, handle, booking_id, source, author_id, body)
         VALUES ($1, $2, $3, $4, $5, $6)";

pub(crate) async fn booking_note_insert(
    tx: &mut Tx<'_>,
    ctx: &OpCtx,
    handle: &str,
    booking_id: i64,
    source: &str,
    body: &str,
) -> Result<()> {
    sqlx::query(NOTE_INSERT_SQL)
        .bind(ctx.tenant_id())
        .bind(handle)
        .bind(booking_id)
        .bind(source)
        .bind(ctx.actor_person_id())
        .bind(body)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
