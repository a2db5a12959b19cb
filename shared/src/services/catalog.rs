//! The service catalog, alert rules (read, and muted as a two-step `alert` operation, R7), and
//! the connection's own recent changes.

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ctx::OpCtx;
use crate::datastore::{self as db, Services, Tx, to_ts};
use crate::error::{Error, Resource, Result};
use crate::input::lenient_u32;
use crate::money::{self, MoneyView};
use crate::rights::Right;
use crate::services::two_step::{Apply, At, Plan, Planned, TwoStep, content_hash, effect};
use crate::time::{self, TimeView};

/// List the tenant's services (what can be booked).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindServicesInput {}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ServiceView {
    /// The service's handle (svc_…).
    pub service: String,
    pub name: String,
    pub duration_minutes: i32,
    pub net: MoneyView,
    pub tax_rate_percent: String,
    pub total: MoneyView,
}

pub async fn find_services(
    ds: &Services,
    ctx: &OpCtx,
    _input: &FindServicesInput,
) -> Result<Vec<ServiceView>> {
    ctx.require(Right::BookingsRead)?;
    let currency = &ctx.tenant().currency;
    Ok(ds
        .service_list(ctx)
        .await?
        .into_iter()
        .map(|s| {
            let tax = money::tax(s.price_minor, s.tax_rate_bp);
            ServiceView {
                service: s.handle,
                name: s.name,
                duration_minutes: s.duration_minutes,
                net: money::present(s.price_minor, currency),
                tax_rate_percent: format!("{}.{:02}", s.tax_rate_bp / 100, s.tax_rate_bp % 100),
                total: money::present(s.price_minor + tax, currency),
            }
        })
        .collect())
}

/// List the tenant's alert rules and whether each is muted.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindAlertRulesInput {}

#[derive(Debug, Serialize, JsonSchema)]
pub struct AlertRuleView {
    /// The rule's handle (alr_…).
    pub rule: String,
    pub name: String,
    pub description: String,
    /// Until when the rule is muted; absent when it is active.
    pub muted_until: Option<TimeView>,
}

pub async fn find_alert_rules(
    ds: &Services,
    ctx: &OpCtx,
    _input: &FindAlertRulesInput,
    now: Timestamp,
) -> Result<Vec<AlertRuleView>> {
    ctx.require(Right::AlertsMute)?;
    Ok(ds
        .alert_rule_list(ctx)
        .await?
        .into_iter()
        .map(|r| AlertRuleView {
            rule: r.handle,
            name: r.name,
            description: r.description,
            muted_until: r
                .muted_until
                .map(to_ts)
                .filter(|t| *t > now)
                .map(|t| time::present(t, &ctx.tenant().zone, &ctx.tenant().zone_name, now)),
        })
        .collect())
}

/// What this connection changed, newest first.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListRecentChangesInput {
    /// At most this many, 1 to 50 (default 20).
    #[serde(default, deserialize_with = "lenient_u32")]
    #[schemars(with = "Option<u32>")]
    pub limit: Option<u32>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ChangeView {
    pub at: TimeView,
    /// The tool or operation, e.g. create_customer, confirm_booking.preview.
    pub action: String,
    /// ok, previewed, rejected, refused or failed.
    pub outcome: String,
    /// Public handles of what it touched.
    pub targets: Vec<String>,
}

/// What this connection changed, and its budgets on effects used and left.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RecentChanges {
    pub changes: Vec<ChangeView>,
    /// This connection's budgets (and the tenant-wide ones the tenant set): an action that would pass one waits for a person.
    pub budgets: Vec<crate::services::budgets::BudgetView>,
}

pub async fn list_recent_changes(
    ds: &Services,
    ctx: &OpCtx,
    input: &ListRecentChangesInput,
    now: Timestamp,
) -> Result<RecentChanges> {
    let connection = ctx.connection().ok_or_else(|| {
        Error::invalid("connection", "recent changes are listed per agent connection")
    })?;
    let limit = match input.limit.unwrap_or(20) {
        n @ 1..=50 => i64::from(n),
        _ => return Err(Error::invalid("limit", "limit must be between 1 and 50")),
    };
    let changes = ds
        .audit_for_connection(ctx, connection.id, limit)
        .await?
        .into_iter()
        .map(|a| ChangeView {
            at: time::present(to_ts(a.at), &ctx.tenant().zone, &ctx.tenant().zone_name, now),
            action: a.action,
            outcome: a.outcome,
            targets: a.targets,
        })
        .collect();
    let budgets = crate::services::budgets::of_this_connection(ds, ctx).await?;
    Ok(RecentChanges { changes, budgets })
}

// ------------------------------------------------------------------ two-step operations (R7)

/// Silence an alert rule for a bounded time.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MuteAlertsInput {
    /// Alert rule handle (alr_…), from find_alert_rules.
    pub rule: String,
    /// Minutes to mute, 5 to 240.
    #[serde(deserialize_with = "lenient_u32")]
    #[schemars(with = "u32")]
    pub minutes: Option<u32>,
}

impl crate::services::two_step::private::Sealed for MuteAlertsInput {}

impl TwoStep for MuteAlertsInput {
    const OP: crate::services::two_step::Op = crate::services::two_step::Op::MuteAlerts;
}

impl Planned for MuteAlertsInput {
    async fn plan(self, tx: &mut Tx<'static>, ctx: &OpCtx, at: At) -> Result<Plan> {
        let (input, now) = (self, at.now);
        let minutes = input.minutes.unwrap_or(0);
        if !(5..=240).contains(&minutes) {
            return Err(Error::invalid("minutes", "mute for 5 to 240 minutes"));
        }
        let rule = input.rule.trim();
        let r = db::alert_rule_lock(tx, ctx, rule)
            .await?
            .ok_or_else(|| Error::not_found(Resource::AlertRule, rule))?;
        let until = at
            .previewed
            .checked_add(jiff::SignedDuration::from_mins(i64::from(minutes)))
            .map_err(|e| Error::Internal(e.to_string()))?;
        if until <= now {
            return Err(Error::WrongState {
                message: format!(
                    "the mute this preview showed would have ended at {}; prepare it again",
                    time::present(until, &ctx.tenant().zone, &ctx.tenant().zone_name, now).display
                ),
                use_instead: Some("mute_alerts"),
            });
        }
        let until_view = time::present(until, &ctx.tenant().zone, &ctx.tenant().zone_name, now);
        Ok(Plan {
            summary: format!(
                "Mute alert rule {} {} for {minutes} minutes, until {}",
                r.handle,
                crate::text::quoted(&r.name),
                until_view.display
            ),
            preview: effect(&MuteEffect { rule: &r.handle, name: &r.name, until: until_view })?,
            content_hash: content_hash(&MuteContent {
                rule: &r.handle,
                minutes,
                until: until.to_string(),
                muted_until: r.muted_until.map(|m| m.timestamp()),
            })?,
            targets: vec![r.handle.clone()],
            apply: Apply::Mute { id: r.id, until, minutes },
            messages: Vec::new(),
        })
    }
}

/// `mute_alerts`' preview.
#[derive(Serialize)]
struct MuteEffect<'a> {
    rule: &'a str,
    name: &'a str,
    until: time::TimeView,
}

/// `mute_alerts`' content: the rule, the mute asked for, and the mute it has now.
#[derive(Serialize)]
struct MuteContent<'a> {
    rule: &'a str,
    minutes: u32,
    until: String,
    muted_until: Option<i64>,
}
