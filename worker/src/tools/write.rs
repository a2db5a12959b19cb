//! The silent writes: none reaches a customer. Replay protection, duplicate guards, versions
//! and the audit row live in `shared::services::customers` and `shared::services::bookings`, on the silent-write rail (`services::rails`); these adapters only call them.

use shared::rights::Right;
use shared::services::bookings::{
    self, AddBookingNoteInput, BookingWritten, CreateBookingInput, NoteWritten, UpdateBookingInput,
};
use shared::services::customers::{
    self, CreateCustomerInput, CustomerWritten, UpdateCustomerInput,
};
use shared::services::outcome::Written;

use super::{Access, Def, EffectClass, Env, Ref, RefKind, Shape, ThirdPartyText, ToolSpec, tool};

const REPLAY: &str = " Repeating an identical call returns the first result with replayed: true.";

pub fn tools() -> Vec<ToolSpec> {
    vec![
        tool::<CreateCustomerInput, Written<CustomerWritten>, _, _>(
            Def {
                name: "create_customer",
                title: "Create a customer",
                description: "Create a customer with name and email or phone. A customer with the same email or phone is reported with its handle instead of creating a second one; separate: true with a reason creates anyway. Silent: the customer is not contacted. Repeating an identical call returns the first result with replayed: true.",
                class: EffectClass::SilentWrite,
                access: Access::Right(Right::CustomersWrite),
                refs: &[],
                untrusted: &[],
            },
            async |env: Env, input: CreateCustomerInput| customers::create_customer(&env.ds, &env.ctx, &input, env.now).await,
        ),
        tool::<UpdateCustomerInput, Written<CustomerWritten>, _, _>(
            Def {
                name: "update_customer",
                title: "Update a customer",
                description: "Change a customer's name, email or phone. Needs the version you read; if the customer changed since, nothing is written and the current state is returned. Silent: the customer is not contacted.",
                class: EffectClass::SilentWrite,
                access: Access::Right(Right::CustomersWrite),
                refs: &[Ref { field: "customer", kind: RefKind::Customer, shape: Shape::Single }],
                untrusted: &[],
            },
            async |env: Env, input: UpdateCustomerInput| customers::update_customer(&env.ds, &env.ctx, &input, env.now).await,
        ),
        tool::<CreateBookingInput, Written<BookingWritten>, _, _>(
            Def {
                name: "create_booking",
                title: "Create a draft booking",
                description: "Create a draft booking for a customer and service at a start time (local time with zone, or ISO 8601 with offset); the price and tax are computed from the service. The customer does not see drafts until confirm_booking. A booking of the same customer, service and start is reported instead of duplicated.",
                class: EffectClass::SilentWrite,
                access: Access::Right(Right::BookingsWrite),
                refs: &[Ref { field: "customer", kind: RefKind::Customer, shape: Shape::Single }, Ref { field: "service", kind: RefKind::Service, shape: Shape::Single }, Ref { field: "technician", kind: RefKind::Technician, shape: Shape::Single }],
                untrusted: &[],
            },
            async |env: Env, input: CreateBookingInput| bookings::create_booking(&env.ds, &env.ctx, &input, env.now).await,
        ),
        tool::<UpdateBookingInput, Written<BookingWritten>, _, _>(
            Def {
                name: "update_booking",
                title: "Update a booking's internal fields",
                description: "Change fields the customer does not see: priority, internal reference, assigned technician; and for drafts also start and service. Needs the version you read. A confirmed booking's time changes with reschedule_booking.",
                class: EffectClass::SilentWrite,
                access: Access::Right(Right::BookingsWrite),
                refs: &[Ref { field: "booking", kind: RefKind::Booking, shape: Shape::Single }, Ref { field: "technician", kind: RefKind::Technician, shape: Shape::Single }, Ref { field: "service", kind: RefKind::Service, shape: Shape::Single }],
                untrusted: &[ThirdPartyText::CustomerNote],
            },
            async |env: Env, input: UpdateBookingInput| bookings::update_booking(&env.ds, &env.ctx, &input, env.now).await,
        ),
        tool::<AddBookingNoteInput, Written<NoteWritten>, _, _>(
            Def {
                name: "add_booking_note",
                title: "Add an internal note",
                description: "Add an internal staff note to a booking; the customer never sees it.",
                class: EffectClass::SilentWrite,
                access: Access::Right(Right::BookingsWrite),
                refs: &[Ref { field: "booking", kind: RefKind::Booking, shape: Shape::Single }],
                untrusted: &[],
            },
            async |env: Env, input: AddBookingNoteInput| bookings::add_booking_note(&env.ds, &env.ctx, &input, env.now).await,
        ),
    ]
    .into_iter()
    .map(|mut t| {
        if !t.tool.description.as_deref().is_some_and(|d| d.contains("replayed")) {
            t.tool.description = Some(format!("{}{REPLAY}", t.tool.description.as_deref().unwrap_or_default()).into());
        }
        t
    })
    .collect()
}
