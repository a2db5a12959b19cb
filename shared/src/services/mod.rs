//! Domain services: the one place each operation's rules live (R2, STYLE 2).
//!
//! Every adapter — MCP tools, the REST API, the console and `gatehousectl` — calls these with
//! an [`OpCtx`](crate::ctx::OpCtx). Each service checks the rights it needs itself before it
//! reads or writes, and refuses when no actor is bound (R5).

pub mod actions;
pub mod activity;
pub mod admin;
pub mod approvals;
pub mod audit;
pub mod bookings;
pub mod budgets;
pub mod catalog;
pub mod client_assertion;
pub mod console;
pub mod customers;
pub mod demo;
mod fields;
pub mod id_jag;
pub mod invitations;
pub mod jose;
pub mod oauth;
pub mod operators;
pub mod outbox;
pub mod outcome;
pub mod passkeys;
pub mod places;
mod planners;
pub mod policies;
mod rails;
pub mod rates;
pub mod sso;
pub mod tasks;
pub mod technicians;
pub mod two_step;

use crate::error::{Error, Result};

/// Drops what outlived its use: rate windows, old replay entries, expired sessions and codes,
/// old sign-in failures, tokens a day after they expired. The control plane runs it as a
/// background job; it reads no tenant's data.
pub async fn housekeeping(svc: &crate::Services) -> Result<u64> {
    svc.job_housekeeping().await
}

/// The statement of the read hot path, as text for the benchmark to run through pgbench: a
/// `get_booking` call's connection context and its booking in one statement ($1 token hash,
/// $2 booking handle, $3–$4 the notes cursor). Text only: the pool stays private to the
/// library.
pub fn read_path_statement() -> &'static str {
    crate::datastore::CONTEXT_AND_BOOKING_SQL.as_str()
}

/// The connection context alone (every MCP request that reads nothing ahead) and the booking
/// lookup alone ($1 tenant, $2 handle, $3–$4 the notes cursor), as text: the bare peer runs the
/// lookup, and the write benchmark starts with the context.
pub fn read_path_statements() -> (&'static str, &'static str) {
    (crate::datastore::CONNECTION_CONTEXT_SQL, crate::datastore::booking_get_sql())
}

/// The booking search `find_bookings` runs ($1 tenant, $2–$3 range, $4 statuses, $5
/// technician, $6 customer, $7–$8 keyset, $9 limit), as text for the benchmark's peer.
pub fn search_statement() -> &'static str {
    crate::datastore::booking_find_sql()
}

/// The statements of a silent write (`add_booking_note`) after its connection context, in the
/// order they run, as text for the benchmark to run through pgbench: the rate window, then in
/// one transaction the replay lock and lookup, the booking's row lock, the note, the replay
/// entry and the audit row. Text only, as [`read_path_statements`].
pub fn write_path_statements() -> [&'static str; 7] {
    use crate::datastore as db;
    [
        db::RATE_TAKE_SQL,
        db::REPLAY_LOCK_SQL,
        db::REPLAY_FIND_SQL,
        db::BOOKING_LOCK_SQL.as_str(),
        db::NOTE_INSERT_SQL,
        db::REPLAY_INSERT_SQL,
        db::AUDIT_INSERT_SQL,
    ]
}

pub const DEFAULT_LIMIT: u32 = 25;
pub const MAX_LIMIT: u32 = 100;

pub(crate) fn limit(requested: Option<u32>) -> Result<i64> {
    match requested.unwrap_or(DEFAULT_LIMIT) {
        0 => Err(Error::invalid("limit", format!("limit must be between 1 and {MAX_LIMIT}"))),
        n if n > MAX_LIMIT => Err(Error::invalid(
            "limit",
            format!("limit must be between 1 and {MAX_LIMIT}; page with `cursor` for more"),
        )),
        n => Ok(i64::from(n)),
    }
}

pub(crate) use crate::cursor::{decode_cursor, encode_cursor};

/// A list filter's value as it came from outside: trimmed, and absent when empty.
pub(crate) fn filter_value(v: &Option<String>) -> Option<String> {
    v.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned)
}

/// A list's search text: at most 200 characters.
pub(crate) fn filter_search(v: &Option<String>) -> Result<Option<String>> {
    let text = filter_value(v);
    if text.as_ref().is_some_and(|q| q.chars().count() > 200) {
        return Err(Error::invalid("q", "search with at most 200 characters"));
    }
    Ok(text)
}

/// A list filter that takes one of `allowed`; anything else is refused, naming them.
pub(crate) fn filter_one_of(
    field: &'static str,
    what: &str,
    v: &Option<String>,
    allowed: &[&str],
) -> Result<Option<String>> {
    let value = filter_value(v);
    match value {
        Some(ref x) if !allowed.contains(&x.as_str()) => {
            let (last, rest) = allowed.split_last().unwrap_or((&"", &[]));
            Err(Error::invalid(field, format!("{what} is {} or {last}", rest.join(", "))))
        }
        _ => Ok(value),
    }
}

/// One page of records plus the cursor of the next one.
#[derive(Debug)]
pub struct Found<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

/// Trims text arguments and treats empty strings as absent.
pub(crate) fn nonempty(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// A presenter's output as JSON, for the places that carry it untyped inside the
/// transport-agnostic error: the current state a version conflict returns (R10) and the new
/// preview of an action that changed since its preview (R7).
pub(crate) fn presented<T: serde::Serialize>(view: &T) -> crate::error::Result<serde_json::Value> {
    serde_json::to_value(view).map_err(|e| crate::error::Error::Internal(format!("present: {e}")))
}

#[cfg(test)]
mod layering {
    /// The import circles stay untied: resources and the two-step contract never name the
    /// rail or the registry, the rail names no resource (it plans through `planners`), the
    /// operation context names no row type, and the error type no service.
    #[test]
    fn the_rail_the_contract_and_the_resources_import_one_way() {
        let resources = [
            ("two_step.rs", include_str!("two_step.rs")),
            ("bookings.rs", include_str!("bookings.rs")),
            ("bookings/export.rs", include_str!("bookings/export.rs")),
            ("bookings/writes.rs", include_str!("bookings/writes.rs")),
            ("bookings/changes.rs", include_str!("bookings/changes.rs")),
            ("customers.rs", include_str!("customers.rs")),
            ("technicians.rs", include_str!("technicians.rs")),
            ("catalog.rs", include_str!("catalog.rs")),
        ];
        for (file, source) in resources {
            for rail in [
                "crate::services::actions",
                "crate::services::planners",
                "crate::services::approvals",
            ] {
                assert!(!source.contains(rail), "{file} names {rail}");
            }
        }
        let rail = [
            include_str!("actions/mod.rs"),
            include_str!("actions/person.rs"),
            include_str!("actions/mrtr.rs"),
        ];
        for resource in ["bookings::", "customers::", "technicians::", "catalog::"] {
            let path = format!("crate::services::{resource}");
            assert!(rail.iter().all(|file| !file.contains(&path)), "the rail names {resource}");
        }
        let ctx = include_str!("../ctx.rs");
        for row in ["crate::auth", "crate::datastore", "crate::services"] {
            assert!(!ctx.contains(row), "ctx.rs names {row}");
        }
        assert!(
            !include_str!("../error.rs").contains("crate::services"),
            "error.rs names a service"
        );
    }
}
