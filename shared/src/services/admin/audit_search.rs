//! Searching the audit log as the console and the CLI show it: a typed filter, pages by
//! cursor, and each row's actor and change in words.

use super::*;

#[derive(Debug, Serialize)]
pub struct AuditView {
    /// The row's id, for its chain columns in the export; not shown.
    #[serde(skip)]
    pub id: i64,
    pub at: String,
    pub channel: String,
    pub action: String,
    pub outcome: String,
    /// Public ids only.
    pub targets: Vec<String>,
    pub connection: Option<String>,
    pub connection_name: Option<String>,
    pub client_name: Option<String>,
    pub reason: Option<String>,
    /// How the person behind it proved themself: `passkey pky_… (user verified)`, or the way
    /// their console session began (`password session`).
    pub proven: Option<String>,
    /// Who acted, as people read it: a person by name and email, an operator marked as such,
    /// an agent as its connection and creator, or Gatehouse itself.
    pub actor: String,
    /// The acting person's email (or the acting connection's creator's), for the export.
    pub actor_email: Option<String>,
    /// The acting person's public handle (`per_…`), as the chain names them.
    pub actor_handle: Option<String>,
    /// `person`, `operator`, `agent` or `system`.
    pub actor_kind: &'static str,
    /// What a settings change changed: `{field: {from, to}}`.
    pub change: Option<serde_json::Value>,
    /// The tenant's policy set behind an agent's decision: `{version, decided_by}`.
    pub policy: Option<serde_json::Value>,
}

/// The policy set behind a decision as people read it: `policies v3: quiet-hours`, or
/// `policies v3: allowed` when no policy refused or held it.
pub fn policy_words(policy: &serde_json::Value) -> String {
    let version = policy["version"].as_i64().unwrap_or_default();
    let decided: Vec<&str> = policy["decided_by"]
        .as_array()
        .map(|ids| ids.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    if decided.is_empty() {
        format!("policies v{version}: allowed")
    } else {
        format!("policies v{version}: {}", decided.join(", "))
    }
}

/// A change as people read it: `per_minute: 30 → 60; mode: agent_confirms → person_approves`.
pub fn change_words(change: &serde_json::Value) -> String {
    let shown = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "none".to_owned(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    change
        .as_object()
        .map(|fields| {
            fields
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{}: {} → {}",
                        k.replace('_', " "),
                        shown(v.get("from").unwrap_or(&serde_json::Value::Null)),
                        shown(v.get("to").unwrap_or(&serde_json::Value::Null))
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default()
}

pub(super) fn actor_kind(r: &crate::datastore::AuditListRow) -> &'static str {
    match (&r.actor_email, &r.connection_handle) {
        (Some(_), _) if r.actor_operator => "operator",
        (Some(_), _) => "person",
        (None, Some(_)) => "agent",
        (None, None) => "system",
    }
}

pub(super) fn actor_words(r: &crate::datastore::AuditListRow) -> String {
    let person = || {
        format!(
            "{} <{}>",
            r.actor_name.as_deref().unwrap_or(""),
            r.actor_email.as_deref().unwrap_or("")
        )
    };
    match actor_kind(r) {
        "operator" => format!("{} · platform operator", person()),
        "person" => person(),
        "agent" => format!(
            "agent {} ({}) · created by {}",
            r.connection_name.as_deref().unwrap_or(""),
            r.connection_handle.as_deref().unwrap_or(""),
            r.creator_email.as_deref().unwrap_or("someone no longer here")
        ),
        _ => "Gatehouse (system)".to_owned(),
    }
}

/// What an audit row's proof says, as people read it.
pub(crate) fn proven(proof: Option<&serde_json::Value>) -> Option<String> {
    let p = proof?;
    let method = p.get("method")?.as_str()?;
    Some(match p.get("passkey").and_then(|k| k.as_str()) {
        Some(handle) => {
            let verified = p.get("user_verified").and_then(|v| v.as_bool()) == Some(true);
            format!("passkey {handle}{}", if verified { " (user verified)" } else { "" })
        }
        None => format!(
            "{} session",
            match method {
                "sso" => "single sign-on",
                other => other,
            }
        ),
    })
}

/// What an admin searches the audit log for; every field as it came from outside.
#[derive(Debug, Default, Clone)]
pub struct AuditFilter {
    /// A connection handle (`con_…`).
    pub connection: Option<String>,
    /// The start of an action name: `confirm_booking`, `connection.`.
    pub action: Option<String>,
    /// `ok`, `refused` or `failed`.
    pub outcome: Option<String>,
    /// `mcp`, `api`, `console`, `cli` or `system`.
    pub channel: Option<String>,
    /// A person's email or handle: what they did, and what their connections did.
    pub actor: Option<String>,
    /// A record's public handle (`bkg_…`, `cus_…`, `con_…`, `per_…`): every row about it.
    pub record: Option<String>,
    /// From this day (`2026-11-30`, in the tenant's zone) or instant (RFC 3339) on.
    pub since: Option<String>,
    /// Before this day (the whole day included) or instant.
    pub until: Option<String>,
    /// The `next` of a previous page.
    pub cursor: Option<String>,
}

/// One page of a search and where the next one starts.
#[derive(Debug, Serialize)]
pub struct AuditPage {
    pub rows: Vec<AuditView>,
    pub next: Option<String>,
}

/// Every outcome an audit row can have (the table's check constraint).
pub const AUDIT_OUTCOMES: [&str; 7] =
    ["ok", "refused", "failed", "previewed", "rejected", "awaiting_approval", "denied"];
pub const AUDIT_CHANNELS: [&str; 5] = ["mcp", "api", "console", "cli", "system"];

/// A day (`2026-11-30`, UTC; with `end_of_day` the day after it) or an RFC 3339 instant, in
/// the years people mean.
pub fn audit_instant(
    field: &str,
    raw: &str,
    end_of_day: bool,
) -> Result<chrono::DateTime<chrono::Utc>> {
    audit_instant_in(field, raw, end_of_day, None)
}

/// [`audit_instant`] with days in `zone` (the tenant's: the console's one clock).
pub fn audit_instant_in(
    field: &str,
    raw: &str,
    end_of_day: bool,
    zone: Option<&jiff::tz::TimeZone>,
) -> Result<chrono::DateTime<chrono::Utc>> {
    let bad = || {
        Error::invalid(
            field,
            format!(
                "{field} must be a day like 2026-11-30 or an instant like 2026-11-30T14:00:00Z"
            ),
        )
    };
    // Years Postgres stores and people mean: 1 to 9999 (chrono would take -5000 too).
    use chrono::Datelike as _;
    let in_range = |t: chrono::DateTime<chrono::Utc>| (1..=9999).contains(&t.year());
    if let Ok(day) = chrono::NaiveDate::parse_from_str(raw, "%Y-%m-%d") {
        let day = if end_of_day { day.succ_opt().ok_or_else(bad)? } else { day };
        let at = match zone {
            // The day as the tenant lives it: from its midnight in the tenant's zone.
            Some(tz) => {
                let year = i16::try_from(day.year()).map_err(|_| bad())?;
                let civil = jiff::civil::Date::new(year, day.month() as i8, day.day() as i8)
                    .map_err(|_| bad())?;
                let ts = tz
                    .to_ambiguous_timestamp(civil.at(0, 0, 0, 0))
                    .compatible()
                    .map_err(|_| bad())?;
                chrono::DateTime::from_timestamp(ts.as_second(), 0).ok_or_else(bad)?
            }
            None => day.and_hms_opt(0, 0, 0).ok_or_else(bad)?.and_utc(),
        };
        return if in_range(at) { Ok(at) } else { Err(bad()) };
    }
    chrono::DateTime::parse_from_rfc3339(raw)
        .map(|t| t.to_utc())
        .ok()
        .filter(|t| in_range(*t))
        .ok_or_else(bad)
}

/// Searches the tenant's audit log for admins (R23): what was done, by which channel and
/// connection, to which public ids — never arguments or personal data, because the log never
/// holds them. Filters and pages run in SQL; a filter that cannot match anything real (an
/// unknown outcome, a malformed day) is an error that says what to write instead.
pub async fn audit_search(
    ds: &Services,
    ctx: &OpCtx,
    filter: &AuditFilter,
    limit: i64,
) -> Result<AuditPage> {
    ctx.require(Right::AuditRead)?;
    if !(1..=1000).contains(&limit) {
        return Err(Error::invalid("limit", "use 1 to 1000"));
    }
    let given = |v: &Option<String>| {
        v.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned)
    };
    let connection =
        given(&filter.connection).map(|c| ConnectionHandle::parse("connection", &c)).transpose()?;
    let outcome = given(&filter.outcome);
    if let Some(o) = &outcome
        && !AUDIT_OUTCOMES.contains(&o.as_str())
    {
        return Err(Error::invalid(
            "outcome",
            format!("outcome is one of {}", AUDIT_OUTCOMES.join(", ")),
        ));
    }
    let channel = given(&filter.channel);
    if let Some(c) = &channel
        && !AUDIT_CHANNELS.contains(&c.as_str())
    {
        return Err(Error::invalid("channel", "channel is one of mcp, api, console, cli, system"));
    }
    let action = given(&filter.action);
    if let Some(a) = &action
        && (a.chars().count() > 80 || a.chars().any(char::is_control))
    {
        return Err(Error::invalid(
            "action",
            "action is the start of a tool or action name, at most 80 characters",
        ));
    }
    let action_like = action.map(|a| {
        let escaped = a.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_");
        format!("{escaped}%")
    });
    // Days are the tenant's days, as every time the console shows.
    let zone = Some(&ctx.tenant().zone);
    let since =
        given(&filter.since).map(|s| audit_instant_in("since", &s, false, zone)).transpose()?;
    let until =
        given(&filter.until).map(|s| audit_instant_in("until", &s, true, zone)).transpose()?;
    let after = match given(&filter.cursor) {
        None => None,
        Some(c) => {
            let parts = crate::services::decode_cursor(&c, 2)?;
            use chrono::Datelike as _;
            let at = parts[0]
                .parse::<i64>()
                .ok()
                .and_then(chrono::DateTime::from_timestamp_micros)
                .filter(|t| (1..=9999).contains(&t.year()));
            let id = parts[1].parse::<i64>().ok();
            match (at, id) {
                (Some(at), Some(id)) => Some((at, id)),
                _ => {
                    return Err(Error::invalid(
                        "cursor",
                        "not a cursor from a previous page; repeat the search without it",
                    ));
                }
            }
        }
    };
    let actor = given(&filter.actor);
    let record = given(&filter.record);
    for (field, v) in [("actor", &actor), ("record", &record)] {
        if v.as_ref().is_some_and(|v| v.chars().count() > 200 || v.chars().any(char::is_control)) {
            return Err(Error::invalid(
                field,
                format!("{field} is an email address or a public handle, at most 200 characters"),
            ));
        }
    }
    let query = ds_fns::AuditQuery {
        connection: connection.as_ref().map(|c| c.as_str()),
        action_like,
        outcome: outcome.as_deref(),
        channel: channel.as_deref(),
        actor: actor.as_deref(),
        record: record.as_deref(),
        since,
        until,
        after,
    };
    // One row more than asked says whether there is a next page.
    let mut rows = ds.audit_search(ctx, &query, limit + 1).await?;
    let next = if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        rows.last().map(|r| {
            crate::services::encode_cursor(&[
                &r.at.timestamp_micros().to_string(),
                &r.id.to_string(),
            ])
        })
    } else {
        None
    };
    let rows = rows
        .into_iter()
        .map(|r| (actor_words(&r), actor_kind(&r), r))
        .map(|(actor, actor_kind, r)| AuditView {
            id: r.id,
            at: crate::datastore::to_ts(r.at).strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            channel: r.channel,
            action: r.action,
            outcome: r.outcome,
            targets: r.targets,
            connection: r.connection_handle,
            connection_name: r.connection_name,
            client_name: r.client_name,
            proven: proven(r.proof.as_ref()),
            actor,
            actor_email: r.actor_email.or(r.creator_email),
            actor_handle: r.actor_handle,
            actor_kind,
            reason: r.reason,
            change: r.change,
            policy: r.policy,
        })
        .collect();
    Ok(AuditPage { rows, next })
}

/// The newest `limit` audit rows of the tenant, or of one connection.
pub async fn audit_list(
    ds: &Services,
    ctx: &OpCtx,
    connection: Option<&str>,
    limit: i64,
) -> Result<Vec<AuditView>> {
    let filter = AuditFilter { connection: connection.map(str::to_owned), ..Default::default() };
    Ok(audit_search(ds, ctx, &filter, limit).await?.rows)
}
