//! The read tools. Each is four steps: parse (done by the registry) → service → present.

use schemars::JsonSchema;
use serde::Serialize;
use shared::rights::Right;
use shared::services::bookings::{self, FindBookingsInput, GetBookingInput};
use shared::services::catalog::{
    self, AlertRuleView, FindAlertRulesInput, FindServicesInput, ListRecentChangesInput,
    ServiceView,
};
use shared::services::customers::{self, FindCustomersInput, GetCustomerInput};
use shared::services::technicians::{self, FindTechniciansInput};
use shared::views::{self, BookingSummary, BookingView, CustomerView, TechnicianView};

use super::{Access, Def, EffectClass, Env, Ref, RefKind, Shape, ThirdPartyText, ToolSpec, tool};

#[derive(Serialize, JsonSchema)]
pub struct CustomersOut {
    pub customers: Vec<CustomerView>,
    pub count: usize,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

#[derive(Serialize, JsonSchema)]
pub struct BookingsOut {
    pub bookings: Vec<BookingSummary>,
    pub count: usize,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

#[derive(Serialize, JsonSchema)]
pub struct TechniciansOut {
    pub technicians: Vec<TechnicianView>,
    pub count: usize,
}

#[derive(Serialize, JsonSchema)]
pub struct ServicesOut {
    pub services: Vec<ServiceView>,
}

#[derive(Serialize, JsonSchema)]
pub struct AlertRulesOut {
    pub rules: Vec<AlertRuleView>,
}

pub fn tools() -> Vec<ToolSpec> {
    vec![
        tool(
            Def {
                name: "find_services",
                title: "Find services",
                description: "The tenant's service catalog: what can be booked, its duration and price with tax. Returns each service's handle (svc_…).",
                class: EffectClass::Read,
                access: Access::Right(Right::BookingsRead),
                refs: &[],
                untrusted: &[],
            },
            async |env: Env, input: FindServicesInput| {
                Ok(ServicesOut {
                    services: catalog::find_services(&env.ds, &env.ctx, &input).await?,
                })
            },
        ),
        tool(
            Def {
                name: "find_alert_rules",
                title: "Find alert rules",
                description: "The tenant's alert rules with their handles (alr_…) and whether each is muted, and until when.",
                class: EffectClass::Read,
                access: Access::Right(Right::AlertsMute),
                refs: &[],
                untrusted: &[],
            },
            async |env: Env, input: FindAlertRulesInput| {
                Ok(AlertRulesOut {
                    rules: catalog::find_alert_rules(&env.ds, &env.ctx, &input, env.now).await?,
                })
            },
        ),
        tool(
            Def {
                name: "list_recent_changes",
                title: "List recent changes",
                description: "What this connection changed, newest first, from the audit log: action, outcome, the handles it touched and when; and this connection's budgets on effects (customers messaged, bookings changed, technicians paged, alert-minutes muted, records deleted): used and left in their rolling window.",
                class: EffectClass::Read,
                access: Access::Always,
                refs: &[],
                untrusted: &[],
            },
            async |env: Env, input: ListRecentChangesInput| {
                catalog::list_recent_changes(&env.ds, &env.ctx, &input, env.now).await
            },
        ),
        tool(
            Def {
                name: "find_customers",
                title: "Find customers",
                description: "Search the tenant's customers by part of their name, email or phone, ordered by name and paginated. Returns each customer's handle (cus_…) and version.",
                class: EffectClass::Read,
                access: Access::Right(Right::CustomersRead),
                refs: &[Ref { field: "cursor", kind: RefKind::Cursor, shape: Shape::Cursor }],
                untrusted: &[],
            },
            find_customers,
        ),
        tool(
            Def {
                name: "get_customer",
                title: "Get a customer",
                description: "One customer by handle (cus_…) with contact details and version.",
                class: EffectClass::Read,
                access: Access::Right(Right::CustomersRead),
                refs: &[Ref { field: "customer", kind: RefKind::Customer, shape: Shape::Single }],
                untrusted: &[],
            },
            get_customer,
        ),
        tool(
            Def {
                name: "find_bookings",
                title: "Find bookings",
                description: "Search bookings in a time range, optionally by status, technician (tec_…) or customer (cus_…), ordered by start and paginated. Dates and local times are read in `zone` (an IANA name); times with an offset need no zone. Each booking is listed by handle, version, status, start, customer, technician, service and total; get_booking gives the rest (end, price parts, priority, reference, the customer's note and the notes). Every time is shown with weekday, local time, zone, UTC and distance from now.",
                class: EffectClass::Read,
                access: Access::Right(Right::BookingsRead),
                refs: &[
                    Ref { field: "technician", kind: RefKind::Technician, shape: Shape::Filter },
                    Ref { field: "customer", kind: RefKind::Customer, shape: Shape::Filter },
                    Ref { field: "cursor", kind: RefKind::Cursor, shape: Shape::Cursor },
                ],
                // A list carries no third-party text: the customer's note is get_booking's.
                untrusted: &[],
            },
            find_bookings,
        )
        .reads_ahead(bookings::find_read_ahead),
        tool(
            Def {
                name: "get_booking",
                title: "Get a booking",
                description: "One booking by handle (bkg_…) with customer, technician, service, price, version and its latest 20 notes with their total; earlier notes page with notes_cursor. Text written by customers or external systems is returned under untrusted_text.",
                class: EffectClass::Read,
                access: Access::Right(Right::BookingsRead),
                refs: &[
                    Ref { field: "booking", kind: RefKind::Booking, shape: Shape::Single },
                    Ref { field: "notes_cursor", kind: RefKind::Cursor, shape: Shape::Cursor },
                ],
                untrusted: &[ThirdPartyText::CustomerNote, ThirdPartyText::BookingNotes],
            },
            get_booking,
        )
        .reads_ahead(bookings::read_ahead),
        tool(
            Def {
                name: "find_technicians",
                title: "Find technicians",
                description: "List the tenant's technicians, optionally by part of the name or by skill. Returns each technician's handle (tec_…).",
                class: EffectClass::Read,
                access: Access::Right(Right::TechniciansRead),
                refs: &[],
                untrusted: &[],
            },
            find_technicians,
        ),
    ]
}

async fn find_customers(env: Env, input: FindCustomersInput) -> shared::Result<CustomersOut> {
    let found = customers::find(&env.ds, &env.ctx, &input).await?;
    let tenant = &env.ctx.tenant();
    let customers: Vec<CustomerView> = found
        .items
        .iter()
        .map(|c| views::customer(c, &tenant.zone, &tenant.zone_name, env.now))
        .collect();
    Ok(CustomersOut { count: customers.len(), customers, next_cursor: found.next_cursor })
}

async fn get_customer(env: Env, input: GetCustomerInput) -> shared::Result<CustomerView> {
    let row = customers::get(&env.ds, &env.ctx, &input).await?;
    Ok(views::customer(&row, &env.ctx.tenant().zone, &env.ctx.tenant().zone_name, env.now))
}

async fn find_bookings(env: Env, input: FindBookingsInput) -> shared::Result<BookingsOut> {
    let found = bookings::find(&env.ds, &env.ctx, &input).await?;
    let bookings: Vec<BookingSummary> =
        found.items.iter().map(|b| views::booking_summary(b, env.now)).collect();
    Ok(BookingsOut { count: bookings.len(), bookings, next_cursor: found.next_cursor })
}

async fn get_booking(env: Env, input: GetBookingInput) -> shared::Result<BookingView> {
    let row = bookings::get(&env.ds, &env.ctx, &input).await?;
    Ok(views::booking(&row, true, env.now))
}

async fn find_technicians(env: Env, input: FindTechniciansInput) -> shared::Result<TechniciansOut> {
    let found = technicians::find(&env.ds, &env.ctx, &input).await?;
    let technicians: Vec<TechnicianView> = found.iter().map(views::technician).collect();
    Ok(TechniciansOut { count: technicians.len(), technicians })
}
