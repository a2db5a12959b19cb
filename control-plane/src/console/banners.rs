//! The states every page of a tenant shows while they last, so nobody misses them: agent
//! access off, the platform's kill switch on, the SIEM webhook failing (since when, the last
//! error in words), the audit log unanchored or tampered. The switches and the webhook come
//! with the session's own row (no extra round trip); the audit's state is checked at most
//! every [`AUDIT_EVERY`] per tenant and replica, because checking it verifies the chain's tail.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use shared::OpCtx;
use shared::rights::Right;
use shared::services::audit::{self, ChainState};
use shared::services::console::ConsoleSession;

use super::layout::Banner;
use crate::AppState;

/// How long one check of a tenant's audit chain is shown before it is checked again.
pub const AUDIT_EVERY: Duration = Duration::from_secs(30);

/// The audit states last seen, per tenant.
#[derive(Default)]
pub struct AuditSeen(Mutex<HashMap<i64, (Instant, Option<Banner>)>>);

pub(super) async fn of(state: &AppState, row: &ConsoleSession, ctx: &OpCtx) -> Vec<Banner> {
    let mut out = Vec::new();
    if row.global_kill() {
        out.push(Banner {
            danger: true,
            text: "The platform's kill switch is on: every agent request, in every tenant, is refused until an operator turns it off.".into(),
            link: row.is_operator().then_some(("/operator", "Operator page")),
        });
    }
    if row.tenant_agent_access() == Some(false) {
        out.push(Banner {
            danger: true,
            text: "Agent access is off for this tenant: every agent request is refused, and running tasks stop.".into(),
            link: ctx.rights().contains(Right::TenantSwitch).then_some(("/settings", "Turn it on in Settings")),
        });
    }
    if ctx.rights().contains(Right::AuditRead) {
        if let Some((since, error)) = row.webhook_failing() {
            out.push(Banner {
                danger: false,
                text: format!(
                    "The SIEM webhook has been failing since {}: {}. Events wait and are delivered once it answers.",
                    super::local_text(ctx, since),
                    error
                ),
                link: Some(("/settings/audit", "Audit and SIEM settings")),
            });
        }
        if let Some(b) = audit_banner(state, ctx).await {
            out.push(b);
        }
    }
    out
}

async fn audit_banner(state: &AppState, ctx: &OpCtx) -> Option<Banner> {
    let tenant = ctx.tenant_id();
    if let Some((at, seen)) = state.audit_seen.0.lock().ok()?.get(&tenant)
        && at.elapsed() < AUDIT_EVERY
    {
        return seen.clone();
    }
    let status = match audit::status(&state.ds, ctx, 2 * state.audit_checkpoint_secs as i64).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "the audit banner could not read the chain's state");
            return None;
        }
    };
    let banner = match status.state {
        ChainState::Tampered => Some(Banner {
            danger: true,
            text: format!(
                "The audit log does not verify: {}. Compare it with the checkpoints your SIEM received.",
                status
                    .problem
                    .as_ref()
                    .map(|p| p.detail.as_str())
                    .unwrap_or("a row or checkpoint was changed")
            ),
            link: Some(("/audit", "Audit")),
        }),
        ChainState::Unanchored => Some(Banner {
            danger: false,
            text: format!(
                "{} audit row(s) are covered by no signed checkpoint: nothing outside the database vouches for them yet.",
                status.unanchored.as_ref().map(|u| u.rows).unwrap_or(0)
            ),
            link: Some(("/audit", "Audit")),
        }),
        _ => None,
    };
    if let Ok(mut seen) = state.audit_seen.0.lock() {
        seen.insert(tenant, (Instant::now(), banner.clone()));
    }
    banner
}
