//! Simulation: a draft replayed over the tenant's audited calls of a window, from the facts
//! the audit kept of their arguments.

use super::*;

/// What a draft would have done to the tenant's audited calls of a window.
#[derive(Debug, Serialize)]
pub struct Simulation {
    pub calls: usize,
    pub allowed: usize,
    pub forbidden: usize,
    pub to_a_person: usize,
    pub errors: usize,
    /// By policy id: how many calls it would have forbidden or sent to a person.
    pub by_policy: Vec<PolicyCount>,
    /// Up to five calls each policy would have caught.
    pub examples: Vec<SimulatedCall>,
    /// What the replay cannot know: withheld arguments (free text, contacts, tokens), what a
    /// budget's window had used, records as they were then.
    pub caveat: String,
}

#[derive(Debug, Serialize)]
pub struct PolicyCount {
    pub policy: String,
    pub forbidden: usize,
    pub to_a_person: usize,
}

#[derive(Debug, Serialize)]
pub struct SimulatedCall {
    pub policy: String,
    pub verdict: &'static str,
    /// Why the call could not be evaluated, for a verdict of `error`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    pub tool: String,
    pub connection: String,
    pub at: String,
}

/// The most audited calls one simulation replays (the newest of the window).
pub(super) const REPLAY_LIMIT: i64 = 20_000;

/// Replays the tenant's audited calls of the last `hours` against `source`.
pub async fn simulate(ds: &Services, ctx: &OpCtx, source: &str, hours: i64) -> Result<Simulation> {
    ctx.require(Right::TenantSwitch)?;
    if !(1..=24 * 90).contains(&hours) {
        return Err(Error::invalid("hours", "a window of 1 hour to 90 days"));
    }
    let set =
        draft_guarded(source).map_err(|problems| Error::invalid("policy", join(&problems)))?;
    let calls = ds.policy_replay(ctx, hours, REPLAY_LIMIT).await?;
    let truncated = calls.len() as i64 == REPLAY_LIMIT;
    // Every record the calls touched or named, read once, as enforcement reads them.
    let named = |c: &db::ReplayedCall| -> Vec<String> {
        let Some(args) = &c.facts else { return Vec::new() };
        let tool = c.action.strip_suffix(".preview").unwrap_or(&c.action);
        let (booking, customer, technician) = records_named(tool, args);
        [booking, customer, technician, technician_named(tool, args)]
            .into_iter()
            .flatten()
            .collect()
    };
    let of_kind = |prefix: &str| -> Vec<String> {
        calls
            .iter()
            .flat_map(|c| c.targets.iter().cloned().chain(named(c)))
            .filter(|t| t.starts_with(prefix))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    let records: HashMap<String, db::PolicyFactRow> =
        db::policy_facts(ds.pool(), ctx, &of_kind("bkg_"), &of_kind("cus_"), &of_kind("tec_"))
            .await?
            .into_iter()
            .map(|r| (r.handle.clone(), r))
            .collect();
    let mut sim = Simulation {
        calls: 0,
        allowed: 0,
        forbidden: 0,
        to_a_person: 0,
        errors: 0,
        by_policy: Vec::new(),
        examples: Vec::new(),
        caveat: format!(
            "The audit log keeps tool, outcome, connection, time and the records touched; the non-secret facts of an agent's arguments are kept beside it for 91 days (handles, times, zones, numbers, choices; never free text, names, contacts, search words or tokens): a rule over context.args replays with those, and without the withheld ones; a rule over context.budgets is replayed without them (what a window had used then is not kept). Bookings, customers and technicians are judged as they are now, connections with their creator's current role. A two-step action is replayed where it was prepared: what only its confirmation would have met (context.phase, a clock or a start that moved on between the two steps) is not predicted.{}",
            if truncated {
                format!(" Only the newest {REPLAY_LIMIT} calls of the window were replayed.")
            } else {
                String::new()
            }
        ),
    };
    let mut counts: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
    let mut shown: HashMap<String, usize> = HashMap::new();
    for call in calls {
        let (tool, phase) = match call.action.strip_suffix(".preview") {
            Some(tool) => (tool.to_owned(), "prepare"),
            None => (call.action.clone(), "call"),
        };
        let Some(class) = classes().get(tool.as_str()).copied() else { continue };
        // A two-step action is judged where it was prepared; its execution row is the same call.
        if class.two_step() != (phase == "prepare") {
            continue;
        }
        sim.calls += 1;
        let principal = Principal {
            handle: call.connection.clone(),
            role: call.role.clone(),
            client: call.client.clone(),
            grant: call.grant.clone(),
            name: call.name.clone(),
            creator: call.creator.clone(),
        };
        // The record enforcement judged the call on: the booking its arguments name, else the
        // customer, else the technician (`records_of`), read from the arguments the audit kept;
        // for a call that kept none, the first of those kinds its audit targets hold.
        let first = match &call.facts {
            Some(args) => {
                let (booking, customer, technician) = records_named(&tool, args);
                booking.or(customer).or(technician).unwrap_or_default()
            }
            None => resource_prefixes(&tool)
                .find_map(|p| call.targets.iter().find(|t| t.starts_with(p)))
                .cloned()
                .unwrap_or_default(),
        };
        let at = crate::datastore::to_ts(call.at);
        // As enforcement judges it: a prepared plan on each booking it touches, else the
        // record the call named; hours until a start from the time of the call.
        let bookings: Vec<&String> = if phase == "prepare" {
            call.targets.iter().filter(|t| t.starts_with("bkg_")).collect()
        } else {
            std::iter::once(&first).filter(|t| t.starts_with("bkg_")).collect()
        };
        let resources: Option<Vec<Resource>> = if !bookings.is_empty() {
            bookings.iter().map(|h| records.get(*h).map(|r| booking_of(r, at))).collect()
        } else if first.starts_with("cus_") {
            Some(vec![customer_of(ctx, first.clone(), records.get(&first), at)])
        } else if first.starts_with("tec_") {
            Some(vec![Resource::Technician(match records.get(&first) {
                Some(row) => technician_of(row),
                None => TechnicianFacts { handle: first.clone(), region: None, active: None },
            })])
        } else {
            Some(vec![Resource::Tenant(ctx.tenant().handle.to_string())])
        };
        let Some(resources) = resources else {
            sim.errors += 1;
            continue;
        };
        // The technician the call acted on or for, as its arguments name it (else as its
        // audit targets do).
        let technician = match &call.facts {
            Some(args) => technician_named(&tool, args),
            None => NAMES_A_TECHNICIAN
                .contains(&tool.as_str())
                .then(|| call.targets.iter().find(|t| t.starts_with("tec_")).cloned())
                .flatten(),
        }
        .and_then(|h| records.get(&h))
        .map(technician_of);
        let verdict = strictest(resources.into_iter().map(|resource| {
            set.evaluate(&Call {
                connection: &principal,
                tool: &tool,
                class,
                phase,
                args: call.facts.clone().unwrap_or_else(|| Value::Object(Default::default())),
                resource,
                technician: technician.clone(),
                // Budgets are not replayed: what a window had used at the time is not kept.
                budgets: Vec::new(),
                effects: if phase == "prepare" { call.targets.len() as i64 } else { 0 },
                now: at.to_zoned_datetime(ctx.tenant().zone.clone()),
            })
        }));
        let mut why = None;
        let (policy, word) = match &verdict {
            Verdict::Allow => {
                sim.allowed += 1;
                continue;
            }
            Verdict::Forbid(p) => {
                sim.forbidden += 1;
                counts.entry(p.id.clone()).or_default().0 += 1;
                (p.id.clone(), "forbidden")
            }
            // A read or silent write cannot wait for a person: enforcement refuses it.
            Verdict::Approval(p) if phase == "call" => {
                sim.forbidden += 1;
                counts.entry(p.id.clone()).or_default().0 += 1;
                (p.id.clone(), "forbidden")
            }
            Verdict::Approval(p) => {
                sim.to_a_person += 1;
                counts.entry(p.id.clone()).or_default().1 += 1;
                (p.id.clone(), "to a person")
            }
            Verdict::Error(e) => {
                sim.errors += 1;
                why = Some(e.clone());
                ("(evaluation)".to_owned(), "error")
            }
        };
        let seen = shown.entry(policy.clone()).or_default();
        if *seen < 5 {
            *seen += 1;
            sim.examples.push(SimulatedCall {
                policy,
                verdict: word,
                why,
                tool,
                connection: call.connection,
                at: crate::time::present(at, &ctx.tenant().zone, &ctx.tenant().zone_name, at)
                    .display,
            });
        }
    }
    sim.by_policy = counts
        .into_iter()
        .map(|(policy, (forbidden, to_a_person))| PolicyCount { policy, forbidden, to_a_person })
        .collect();
    Ok(sim)
}
