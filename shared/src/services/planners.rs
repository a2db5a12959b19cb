//! Where two-step operations register (R7): the one place that maps an [`Op`] to its
//! resource's input, so the rail can plan a stored action again at confirmation without
//! knowing any resource. A new operation adds its arm here (the match is exhaustive over
//! `Op`, so one cannot be forgotten).

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::ctx::OpCtx;
use crate::datastore::Tx;
use crate::error::Result;
use crate::input::parse_input;
use crate::services::bookings::{
    CancelBookingsInput, ConfirmBookingInput, DeleteBookingInput, RescheduleBookingInput,
};
use crate::services::catalog::MuteAlertsInput;
use crate::services::customers::{DeleteCustomerInput, SendCustomerMessageInput};
use crate::services::technicians::PageTechnicianInput;
use crate::services::two_step::{At, Op, Plan, Planned};

/// Plans the operation `op` from its stored arguments.
pub(crate) async fn plan(
    tx: &mut Tx<'static>,
    ctx: &OpCtx,
    op: Op,
    args: &Value,
    at: At,
) -> Result<Plan> {
    fn input<T: DeserializeOwned + JsonSchema>(args: &Value) -> Result<T> {
        parse_input(args.clone())
    }
    match op {
        Op::SendCustomerMessage => input::<SendCustomerMessageInput>(args)?.plan(tx, ctx, at).await,
        Op::ConfirmBooking => input::<ConfirmBookingInput>(args)?.plan(tx, ctx, at).await,
        Op::RescheduleBooking => input::<RescheduleBookingInput>(args)?.plan(tx, ctx, at).await,
        Op::CancelBookings => input::<CancelBookingsInput>(args)?.plan(tx, ctx, at).await,
        Op::PageTechnician => input::<PageTechnicianInput>(args)?.plan(tx, ctx, at).await,
        Op::MuteAlerts => input::<MuteAlertsInput>(args)?.plan(tx, ctx, at).await,
        Op::DeleteCustomer => input::<DeleteCustomerInput>(args)?.plan(tx, ctx, at).await,
        Op::DeleteBooking => input::<DeleteBookingInput>(args)?.plan(tx, ctx, at).await,
    }
}
