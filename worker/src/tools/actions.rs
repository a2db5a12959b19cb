//! The two-step tools (R7): notify, wake, alert and delete tools only prepare and return a
//! preview; `confirm_action` executes after every check in `shared::services::actions`.

use shared::rights::Right;
use shared::services::actions::{self, ConfirmActionInput, Op, RejectActionInput};
use shared::services::bookings::{
    CancelBookingsInput, ConfirmBookingInput, DeleteBookingInput, RescheduleBookingInput,
};
use shared::services::catalog::MuteAlertsInput;
use shared::services::customers::{DeleteCustomerInput, SendCustomerMessageInput};
use shared::services::outcome::{Executed, Outcome, Rejected};
use shared::services::technicians::PageTechnicianInput;

use super::{
    Access, Def, EffectClass, Env, Ref, RefKind, Shape, ThirdPartyText, ToolSpec, tool_two_step,
};

/// Every right that can prepare a two-step action.
const TWO_STEP_RIGHTS: &[Right] = &[
    Right::BookingsNotify,
    Right::TechniciansPage,
    Right::AlertsMute,
    Right::CustomersDelete,
    Right::BookingsDelete,
];

const TWO_STEP: &str = " Returns a preview with confirm_token and confirm_summary; nothing happens until confirm_action.";

fn def(
    op: Op,
    title: &'static str,
    description: &'static str,
    refs: &'static [Ref],
    untrusted: &'static [ThirdPartyText],
) -> Def {
    Def {
        name: op.name(),
        title,
        description,
        class: op.class(),
        access: Access::Right(op.right()),
        refs,
        untrusted,
    }
}

pub fn tools() -> Vec<ToolSpec> {
    let mut tools = vec![
        tool_two_step::<SendCustomerMessageInput, Outcome, _, _>(
            def(
                Op::SendCustomerMessage,
                "Email a customer",
                "Prepare an email to a customer (subject and text).",
                &[Ref { field: "customer", kind: RefKind::Customer, shape: Shape::Single }],
                &[],
            ),
            async |env: Env, input: SendCustomerMessageInput| {
                actions::prepare(&env.ds, &env.ctx, &input, env.now).await.map(Outcome::from)
            },
        ),
        tool_two_step::<ConfirmBookingInput, Outcome, _, _>(
            def(
                Op::ConfirmBooking,
                "Confirm a booking",
                "Prepare confirming a draft booking; the customer receives a confirmation email.",
                &[Ref { field: "booking", kind: RefKind::Booking, shape: Shape::Single }],
                &[ThirdPartyText::CustomerNote],
            ),
            async |env: Env, input: ConfirmBookingInput| {
                actions::prepare(&env.ds, &env.ctx, &input, env.now).await.map(Outcome::from)
            },
        ),
        tool_two_step::<RescheduleBookingInput, Outcome, _, _>(
            def(
                Op::RescheduleBooking,
                "Reschedule a booking",
                "Prepare moving a booking to a new start (local time with zone, or ISO 8601 with offset); a confirmed booking's customer is emailed.",
                &[Ref { field: "booking", kind: RefKind::Booking, shape: Shape::Single }],
                &[],
            ),
            async |env: Env, input: RescheduleBookingInput| {
                actions::prepare(&env.ds, &env.ctx, &input, env.now).await.map(Outcome::from)
            },
        ),
        tool_two_step::<CancelBookingsInput, Outcome, _, _>(
            def(
                Op::CancelBookings,
                "Cancel bookings",
                "Prepare cancelling bookings given by handle, or by a filter together with expected_count (the number of bookings you expect it to match; if it differs, the matches are listed and nothing happens). Customers of confirmed bookings are emailed.",
                &[
                    Ref { field: "bookings", kind: RefKind::Booking, shape: Shape::List },
                    Ref { field: "technician", kind: RefKind::Technician, shape: Shape::Filter },
                    Ref { field: "customer", kind: RefKind::Customer, shape: Shape::Filter },
                ],
                &[ThirdPartyText::CustomerNote],
            ),
            async |env: Env, input: CancelBookingsInput| {
                actions::prepare(&env.ds, &env.ctx, &input, env.now).await.map(Outcome::from)
            },
        ),
        tool_two_step::<PageTechnicianInput, Outcome, _, _>(
            def(
                Op::PageTechnician,
                "Page a technician",
                "Prepare paging a technician's phone with a short message, optionally about a booking.",
                &[
                    Ref { field: "technician", kind: RefKind::Technician, shape: Shape::Single },
                    Ref { field: "booking", kind: RefKind::Booking, shape: Shape::Single },
                ],
                &[],
            ),
            async |env: Env, input: PageTechnicianInput| {
                actions::prepare(&env.ds, &env.ctx, &input, env.now).await.map(Outcome::from)
            },
        ),
        tool_two_step::<MuteAlertsInput, Outcome, _, _>(
            def(
                Op::MuteAlerts,
                "Mute an alert rule",
                "Prepare silencing one alert rule (alr_…) for 5 to 240 minutes.",
                &[Ref { field: "rule", kind: RefKind::AlertRule, shape: Shape::Single }],
                &[],
            ),
            async |env: Env, input: MuteAlertsInput| {
                actions::prepare(&env.ds, &env.ctx, &input, env.now).await.map(Outcome::from)
            },
        ),
        tool_two_step::<DeleteCustomerInput, Outcome, _, _>(
            def(
                Op::DeleteCustomer,
                "Delete a customer",
                "Prepare deleting a customer who has no bookings.",
                &[Ref { field: "customer", kind: RefKind::Customer, shape: Shape::Single }],
                &[],
            ),
            async |env: Env, input: DeleteCustomerInput| {
                actions::prepare(&env.ds, &env.ctx, &input, env.now).await.map(Outcome::from)
            },
        ),
        tool_two_step::<DeleteBookingInput, Outcome, _, _>(
            def(
                Op::DeleteBooking,
                "Delete a booking",
                "Prepare deleting a booking and its notes.",
                &[Ref { field: "booking", kind: RefKind::Booking, shape: Shape::Single }],
                &[ThirdPartyText::CustomerNote],
            ),
            async |env: Env, input: DeleteBookingInput| {
                actions::prepare(&env.ds, &env.ctx, &input, env.now).await.map(Outcome::from)
            },
        ),
    ];
    for t in &mut tools {
        t.tool.description =
            Some(format!("{}{TWO_STEP}", t.tool.description.as_deref().unwrap_or_default()).into());
    }
    tools.push(tool_two_step::<ConfirmActionInput, Executed, _, _>(
        Def {
            name: "confirm_action",
            title: "Confirm a prepared action",
            description: "Execute an action prepared by a notify, wake, alert or delete tool, given its confirm_token and its confirm_summary exactly as issued. If what the action would do changed since the preview, nothing is executed and a new preview is returned.",
            class: EffectClass::Notify,
            access: Access::AnyOf(TWO_STEP_RIGHTS),
            refs: &[Ref { field: "confirm_token", kind: RefKind::ConfirmToken, shape: Shape::Single }],
            untrusted: &[ThirdPartyText::CustomerNote],
        },
        async |env: Env, input: ConfirmActionInput| actions::confirm(&env.ds, &env.ctx, &input, env.now).await,
    ));
    tools.push(tool_two_step::<RejectActionInput, Rejected, _, _>(
        Def {
            name: "reject_action",
            title: "Reject a prepared action",
            description: "Discard an action prepared by a notify, wake, alert or delete tool; its token stops working.",
            class: EffectClass::SilentWrite,
            access: Access::AnyOf(TWO_STEP_RIGHTS),
            refs: &[Ref { field: "confirm_token", kind: RefKind::ConfirmToken, shape: Shape::Single }],
            untrusted: &[],
        },
        async |env: Env, input: RejectActionInput| actions::reject(&env.ds, &env.ctx, &input).await,
    ));
    tools
}
