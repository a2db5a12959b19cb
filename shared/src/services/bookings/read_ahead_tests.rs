use super::*;
use crate::auth::ReadAheadRow;
use crate::ctx::{ConnectionRef, TenantRef};
use crate::handle::{ConnectionHandle, PersonHandle, TenantHandle};
use crate::rights::RightSet;

const HANDLE: &str = "bkg_aaaaaaaaaaaaaaaa";

fn row() -> BookingRow {
    let at = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("time");
    BookingRow {
        id: 1,
        customer_id: 1,
        service_id: 1,
        technician_id: None,
        handle: HANDLE.into(),
        status: "confirmed".into(),
        starts_at: at,
        zone: "Europe/Berlin".into(),
        currency: "EUR".into(),
        net_minor: 100,
        tax_minor: 19,
        total_minor: 119,
        customer_note: None,
        customer_handle: "cus_aaaaaaaaaaaaaaaa".into(),
        customer_name: "Read Ahead Canary".into(),
        customer_email: None,
        customer_region: None,
        technician_handle: None,
        technician_name: None,
        service_handle: "srv_aaaaaaaaaaaaaaaa".into(),
        service_name: "Service".into(),
        duration_minutes: 60,
        tax_rate_bp: 1900,
        priority: "normal".into(),
        reference: None,
        updated_at: at,
        notes: sqlx::types::Json(Vec::new()),
        notes_total: 0,
    }
}

/// A connection's context with `rights`, carrying a read-ahead of `HANDLE` (first page).
fn context(rights: &[Right]) -> OpCtx {
    let tenant = TenantRef {
        id: 1,
        handle: TenantHandle::from_db("ten_aaaaaaaaaaaaaaaa".into()),
        slug: "t".into(),
        zone: jiff::tz::TimeZone::UTC,
        zone_name: "UTC".into(),
        currency: "EUR".into(),
    };
    let connection = ConnectionRef {
        id: 1,
        handle: ConnectionHandle::from_db("con_aaaaaaaaaaaaaaaa".into()),
        name: "c".into(),
        client_name: "c".into(),
        toolset: "full".into(),
    };
    let all = RightSet::of(&[Right::BookingsRead, Right::CustomersRead]);
    let key = ReadAhead::Booking { handle: HANDLE.into(), notes_before: None };
    OpCtx::for_connection(
        (1, PersonHandle::from_db("per_aaaaaaaaaaaaaaaa".into())),
        tenant,
        RightSet::of(rights),
        all,
        connection,
    )
    .with_read_ahead(ReadAheadRow::new(key, AheadRows::Booking(Box::new(Some(row())))))
}

/// Services whose database is never reached: a read that is not served from the
/// read-ahead fails to connect.
fn unreachable() -> Services {
    Services::with_pool(
        sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(std::time::Duration::from_millis(200))
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .expect("lazy pool"),
    )
}

fn input(booking: &str, cursor: Option<&str>) -> GetBookingInput {
    GetBookingInput { booking: booking.into(), notes_cursor: cursor.map(str::to_owned) }
}

#[tokio::test]
async fn the_row_read_ahead_serves_only_its_own_read_and_only_after_the_rights_check() {
    let ds = unreachable();
    // Served from the row, no database needed; a log of the context never shows the row's
    // customer data (R14).
    let ctx = context(&[Right::BookingsRead]);
    assert!(!format!("{ctx:?}").contains("Read Ahead Canary"), "{ctx:?}");
    let got = get(&ds, &ctx, &input(HANDLE, None)).await.expect("served from the read-ahead");
    assert_eq!(got.customer_name, "Read Ahead Canary");
    assert_eq!(ctx.read_ahead_used(), Some(true));
    // Taken once: a second read goes to the database.
    assert!(get(&ds, &ctx, &input(HANDLE, None)).await.is_err());
    // Without bookings:read the call is refused and the row stays untaken.
    let ctx = context(&[Right::CustomersRead]);
    let refused = get(&ds, &ctx, &input(HANDLE, None)).await.expect_err("refused");
    assert!(matches!(refused, Error::Forbidden { right: Right::BookingsRead }), "{refused:?}");
    assert_eq!(ctx.read_ahead_used(), Some(false));
    // Another booking, or the same one with a notes cursor, is not that row.
    let ctx = context(&[Right::BookingsRead]);
    let other = get(&ds, &ctx, &input("bkg_bbbbbbbbbbbbbbbb", None)).await;
    assert!(other.is_err(), "read from the database, which is unreachable here");
    let cursor = encode_cursor(&["1800000000000000", "bnt_aaaaaaaaaaaaaaaa"]);
    let paged = get(&ds, &ctx, &input(HANDLE, Some(&cursor))).await;
    assert!(paged.is_err(), "read from the database, which is unreachable here");
    assert_eq!(ctx.read_ahead_used(), Some(false));
}

#[tokio::test]
async fn a_cursor_postgres_would_refuse_is_the_callers_error() {
    let ds = unreachable();
    let ctx = context(&[Right::BookingsRead]);
    for parts in [
        ["-99999999999999999".to_owned(), "bnt_aaaaaaaaaaaaaaaa".to_owned()],
        ["1800000000000000".to_owned(), "bnt_\u{0}aaaaaaaaaaaaaaa".to_owned()],
        ["1800000000000000".to_owned(), String::new()],
        ["1800000000000000".to_owned(), "x".repeat(65)],
    ] {
        let cursor = encode_cursor(&[parts[0].as_str(), parts[1].as_str()]);
        let err = get(&ds, &ctx, &input(HANDLE, Some(&cursor))).await.expect_err("refused");
        assert!(
            matches!(&err, Error::Invalid { field, .. } if field == "notes_cursor"),
            "{parts:?}: {err:?}"
        );
        assert!(read_ahead(&input(HANDLE, Some(&cursor))).is_none(), "{parts:?}");
    }
}

/// The gate of a read judges the booking read ahead for that very handle without taking it from
/// the tool; another handle, or a row already taken, is not looked at.
#[test]
fn the_policy_gate_peeks_at_the_booking_read_ahead_for_its_handle_only() {
    let ctx = context(&[Right::BookingsRead]);
    let peeked = crate::auth::peek_read_ahead_booking(&ctx, HANDLE).expect("read ahead");
    assert_eq!(peeked, Some(("confirmed".to_owned(), row().starts_at, None)));
    assert_eq!(ctx.read_ahead_used(), Some(false), "left for the tool");
    assert!(crate::auth::peek_read_ahead_booking(&ctx, "bkg_bbbbbbbbbbbbbbbb").is_none());
    assert!(crate::auth::peek_read_ahead_booking(&ctx, &HANDLE.to_uppercase()).is_none());
    let _ = crate::auth::take_read_ahead(
        &ctx,
        &ReadAhead::Booking { handle: HANDLE.into(), notes_before: None },
    );
    assert!(crate::auth::peek_read_ahead_booking(&ctx, HANDLE).is_none(), "taken");
}
