//! Long tools (R22): work that may take longer than a client's timeout sends progress when the
//! client gave a `progressToken`, stops when the call is cancelled, and is flagged slow in its
//! `_meta` (there is no slow-tool hint in MCP 2026-07-28) and its description, and is answered
//! with a task (`crate::tasks`) for a client that declares the tasks extension.

use shared::error::Error;
use shared::rights::Right;
use shared::services::bookings::{self, ExportBookingsInput};

use super::{Access, Def, EffectClass, Env, ToolSpec, tool};

pub fn tools() -> Vec<ToolSpec> {
    let export = tool(
        Def {
            name: "export_bookings",
            title: "Export bookings",
            description: "Summarize every booking in a time range, however many: counts by status, totals per currency, the first twenty handles and the find_bookings arguments that continue after them. Slow on large ranges: it reads the range in pages and reports progress when the request carries a progressToken; a client that declares the tasks extension gets a task to poll instead.",
            class: EffectClass::Read,
            access: Access::Right(Right::BookingsRead),
            refs: &[],
            untrusted: &[],
        },
        async |env: Env, input: ExportBookingsInput| {
            let mut run = bookings::export_start(&env.ds, &env.ctx, &input).await?;
            env.progress.report(0, run.total, format!("0 of {} bookings", run.total)).await;
            while run.step(&env.ds, &env.ctx).await? {
                if env.cancel.is_cancelled() {
                    return Err(Error::invalid(
                        "export",
                        "the call was cancelled; nothing was changed",
                    ));
                }
                env.progress
                    .report(run.seen, run.total, format!("{} of {} bookings", run.seen, run.total))
                    .await;
            }
            env.progress.report(run.seen, run.total.max(run.seen), "done".into()).await;
            Ok(run.finish(&env.ctx, env.now))
        },
    );
    vec![export.slow()]
}
