//! `gatehousectl`: the operators' CLI. Every command goes through the same services as the
//! console and the API, audited with channel `cli`. `--json` on any command prints one JSON
//! object (or `{"error": …}`) for scripts; without it, readable text.

use clap::{Args, Parser, Subcommand};
use serde_json::{Value, json};
use shared::OpCtx;
use shared::Services;
use shared::config::Common;
use shared::ctx::{Channel, Operator};
use shared::error::{Error, Resource};
use shared::rights::{RightSet, Role};
use shared::services::{admin, approvals, budgets, demo, operators, rates};

mod cli;
mod handlers;
use cli::*;
use handlers::*;

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let json_out = cli.json;
    match run(cli).await {
        Ok((value, text)) => {
            // A verification that found tampering prints its report and fails.
            let failed = value.pointer("/verification/ok") == Some(&Value::Bool(false))
                || value.get("strict_failed") == Some(&Value::Bool(true));
            if json_out {
                println!("{}", serde_json::to_string_pretty(&value).unwrap_or_default());
            } else {
                println!("{text}");
            }
            if failed {
                std::process::exit(1);
            }
        }
        Err(error) => {
            let (message, fix) = describe(&error);
            if json_out {
                println!(
                    "{}",
                    json!({"error": {"code": error.code(), "message": message, "fix": fix}})
                );
            } else {
                eprintln!("error: {message}\n  {fix}");
            }
            std::process::exit(1);
        }
    }
}

fn describe(error: &Error) -> (String, String) {
    match error {
        Error::Invalid { field, problem, options } if !options.is_empty() => {
            (format!("{field}: {problem}"), format!("choose one of: {}", options.join(", ")))
        }
        Error::Invalid { field, problem, .. } => {
            (format!("{field}: {problem}"), "correct it and run the command again".into())
        }
        Error::NotFound { resource: Resource::ApiToken, .. } => (
            error.to_string(),
            "check the slug and the handle (`gatehousectl api-token list --tenant …`)".into(),
        ),
        Error::NotFound { .. } => (
            error.to_string(),
            "check the slug, email or handle (`gatehousectl connection list --tenant …`)".into(),
        ),
        Error::Internal(detail) => (
            format!("internal error: {detail}"),
            "check DATABASE_URL and that migrations ran (`gatehousectl migrate`)".into(),
        ),
        Error::Unauthenticated(_) => (
            error.to_string(),
            "run it as a platform operator: --as EMAIL or GATEHOUSE_OPERATOR=EMAIL (see --help)"
                .into(),
        ),
        other => (other.to_string(), "see --help".into()),
    }
}

fn need_operator(operator: Option<&Operator>) -> shared::Result<&Operator> {
    operator.ok_or_else(|| {
        Error::Unauthenticated(
            "say which platform operator you are: --as EMAIL or GATEHOUSE_OPERATOR=EMAIL".into(),
        )
    })
}

/// The operator's context in a tenant named by slug.
async fn in_tenant(
    ds: &Services,
    operator: Option<&Operator>,
    slug: &str,
) -> shared::Result<OpCtx> {
    let operator = need_operator(operator)?;
    let tenant = admin::tenant_by_slug(ds, slug).await?;
    Ok(OpCtx::for_operator(operator, admin::tenant_ref(&tenant)?))
}

async fn run(cli: Cli) -> shared::Result<(Value, String)> {
    let common = Common::from_env()?;
    let mut ds = Services::connect(common.database_url.expose(), 4).await?;
    if let Some(keys) = common.seal_keys()? {
        ds = ds.with_secret_keys(keys);
    }
    if let Some(keys) = common.audit_keys()? {
        ds = ds.with_audit_keys(keys);
    }
    if cli.command.pushes() {
        match shared::bus::Bus::connect(
            &common.nats_url,
            std::time::Duration::from_secs(2),
            common.nats_replicas,
        )
        .await
        {
            Ok(bus) => ds = ds.with_bus(bus),
            Err(_) => eprintln!(
                "warning: NATS at {} is unreachable; workers will see this change on their next request instead of at once",
                common.nats_url
            ),
        }
    }
    // The operator this command acts as, checked against Postgres before anything is done.
    let operator = match &cli.operator {
        Some(email) => Some(operators::authenticate(&ds, email, Channel::Cli).await?),
        None => None,
    };
    let need = || need_operator(operator.as_ref());
    match cli.command {
        Command::Migrate => {
            // sqlx's migrator holds a session-level advisory lock while it migrates: through
            // a transaction pooler its unlock could reach another server connection than its
            // lock, leaving the lock held there for whoever migrates next.
            if common.db_pooling == shared::Pooling::Transaction {
                return Err(shared::Error::invalid(
                    "DATABASE_URL",
                    "migrations hold a session lock a transaction pooler cannot keep: run \
                     `gatehousectl migrate` with DATABASE_URL naming Postgres itself (or a \
                     session-mode pool) and GATEHOUSE_DB_POOLING unset",
                ));
            }
            let applied = ds.migrate().await?;
            Ok((json!({"applied": applied}), format!("migrations applied: {applied}")))
        }
        Command::Tenant(TenantCmd::Idp(cmd)) => idp(&ds, need()?, cmd).await,
        Command::Tenant(TenantCmd::Create { slug, name, currency, zone }) => {
            let t = admin::tenant_create(
                &ds,
                need()?,
                admin::NewTenant { slug: &slug, name: &name, currency: &currency, zone: &zone },
            )
            .await?;
            Ok((
                json!({"tenant": t.handle, "slug": t.slug, "zone": t.zone, "currency": t.currency}),
                format!("created tenant {} ({})", t.slug, t.handle),
            ))
        }
        Command::Operator { email, name, revoke } => {
            let p = operators::set_role(&ds, operator.as_ref(), &email, name.as_deref(), !revoke)
                .await?;
            let text =
                format!("{} is {}an operator", p.email, if revoke { "no longer " } else { "" });
            Ok((json!({"person": p.handle, "email": p.email, "operator": !revoke}), text))
        }
        Command::PasswordReset { email, password } => {
            let p = operators::reset_password(&ds, operator.as_ref(), &email, &password).await?;
            let text = format!("{} has a new password; their console sessions ended", p.email);
            Ok((json!({"person": p.handle, "email": p.email, "password_reset": true}), text))
        }
        Command::Passkey(PasskeyCmd::Reset { email }) => {
            let removed = shared::services::passkeys::reset(&ds, need()?, &email).await?;
            let text = format!(
                "{email}: {removed} passkey(s) removed and every console session ended; they sign in with their password or single sign-on and add a new passkey"
            );
            Ok((json!({"email": email, "passkeys_removed": removed, "sessions_ended": true}), text))
        }
        Command::PasskeyPolicy { t, to } => {
            let ctx = in_tenant(&ds, operator.as_ref(), &t.tenant).await?;
            let on = match to.as_str() {
                "on" => shared::services::passkeys::policy_set(&ds, &ctx, true).await?,
                "off" => shared::services::passkeys::policy_set(&ds, &ctx, false).await?,
                _ => shared::services::passkeys::policy(&ds, &ctx).await?,
            };
            let text = if on {
                format!("{}: decisions that widen what agents can do need a passkey", t.tenant)
            } else {
                format!("{}: decisions need no passkey", t.tenant)
            };
            Ok((json!({"tenant": t.tenant, "decisions_need_passkey": on}), text))
        }
        Command::Person(cmd) => {
            let slug = match &cmd {
                PersonCmd::Create { t, .. }
                | PersonCmd::SetRole { t, .. }
                | PersonCmd::Deactivate { t, .. }
                | PersonCmd::Invite { t, .. }
                | PersonCmd::Invitations { t }
                | PersonCmd::Uninvite { t, .. } => t.tenant.clone(),
            };
            let ctx = in_tenant(&ds, operator.as_ref(), &slug).await?;
            match cmd {
                PersonCmd::Create { email, name, role, password, .. } => {
                    let p = admin::person_create(
                        &ds,
                        &ctx,
                        &email,
                        &name,
                        role.parse::<Role>()?,
                        password.as_deref(),
                    )
                    .await?;
                    Ok((
                        to_json(&p),
                        format!("{} is {} in {} ({})", p.email, p.role, p.tenant, p.person),
                    ))
                }
                PersonCmd::SetRole { email, role, .. } => {
                    let p =
                        admin::person_set_role(&ds, &ctx, &email, role.parse::<Role>()?).await?;
                    Ok((to_json(&p), format!("{} is now {} in {}", p.email, p.role, p.tenant)))
                }
                PersonCmd::Deactivate { email, .. } => {
                    let d = admin::person_deactivate(&ds, &ctx, &email).await?;
                    let list = |items: &[String]| {
                        if items.is_empty() { "none".to_owned() } else { items.join(", ") }
                    };
                    let text = format!(
                        "deactivated {email}; connections ended: {}; API tokens revoked: {}; console sessions ended",
                        list(&d.revoked_connections),
                        list(&d.revoked_api_tokens)
                    );
                    Ok((to_json(&d), text))
                }
                PersonCmd::Invite { email, name, role, console_url, .. } => {
                    let invite = shared::services::invitations::Invite {
                        email: &email,
                        name: &name,
                        role: role.parse::<Role>()?,
                    };
                    let sent =
                        shared::services::invitations::invite(&ds, &ctx, invite, &console_url)
                            .await?;
                    let text = format!(
                        "invited {} as {} ({}), until {}; the email is queued. The link, shown once:\n{}",
                        sent.email, sent.role, sent.invitation, sent.expires_at, sent.link
                    );
                    Ok((to_json(&sent), text))
                }
                PersonCmd::Invitations { .. } => {
                    let list = shared::services::invitations::list_open(&ds, &ctx).await?;
                    let text = if list.is_empty() {
                        "no invitation is waiting".to_owned()
                    } else {
                        list.iter()
                            .map(|i| {
                                format!(
                                    "{}  {}  {}  until {}{}",
                                    i.invitation,
                                    i.email,
                                    i.role,
                                    i.expires_at,
                                    if i.expired { " (expired)" } else { "" }
                                )
                            })
                            .collect::<Vec<_>>()
                            .join("\n")
                    };
                    Ok((to_json(&list), text))
                }
                PersonCmd::Uninvite { invitation, .. } => {
                    let email =
                        shared::services::invitations::revoke(&ds, &ctx, &invitation).await?;
                    Ok((
                        json!({"invitation": invitation, "email": email, "revoked": true}),
                        format!("the invitation to {email} is revoked; its link no longer works"),
                    ))
                }
            }
        }
        Command::Connection(cmd) => {
            let slug = match &cmd {
                ConnectionCmd::Create { t, .. }
                | ConnectionCmd::Revoke { t, .. }
                | ConnectionCmd::List { t } => t.tenant.clone(),
            };
            let ctx = in_tenant(&ds, operator.as_ref(), &slug).await?;
            match cmd {
                ConnectionCmd::Create { creator, name, rights, client_name, toolset, .. } => {
                    let rights = RightSet::parse(&rights)?;
                    let new = admin::NewConnection {
                        creator_email: &creator,
                        name: &name,
                        client_name: &client_name,
                        rights,
                        toolset: &toolset,
                    };
                    let c = admin::connection_create(&ds, &ctx, new).await?;
                    let text = format!(
                        "created connection {} ({}) with rights {}\ntoken (shown once): {}",
                        c.connection,
                        c.name,
                        c.rights.join(","),
                        c.token
                    );
                    Ok((to_json(&c), text))
                }
                ConnectionCmd::Revoke { connection, reason, .. } => {
                    let r = admin::connection_revoke(&ds, &ctx, &connection, &reason).await?;
                    let text = if r.revoked {
                        format!("revoked {}", r.connection)
                    } else {
                        format!("{} was already revoked", r.connection)
                    };
                    Ok((to_json(&r), text))
                }
                ConnectionCmd::List { .. } => {
                    let list = admin::connection_list(&ds, &ctx).await?;
                    let text = list
                        .iter()
                        .map(|c| {
                            format!(
                                "{}  {:8}  {}  by {}  [{}]{}",
                                c.connection,
                                c.status,
                                c.name,
                                c.creator,
                                c.rights.join(","),
                                if c.granted_by.as_deref() == Some("idp") {
                                    "  granted by the IdP"
                                } else {
                                    ""
                                }
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("\n");
                    Ok((
                        json!({"connections": list}),
                        if text.is_empty() { "no connections".into() } else { text },
                    ))
                }
            }
        }
        Command::ApiToken(cmd) => {
            let slug = match &cmd {
                ApiTokenCmd::Create { t, .. }
                | ApiTokenCmd::List { t }
                | ApiTokenCmd::Revoke { t, .. } => t.tenant.clone(),
            };
            let ctx = in_tenant(&ds, operator.as_ref(), &slug).await?;
            match cmd {
                ApiTokenCmd::Create { person, name, expires_in_days, .. } => {
                    let created =
                        admin::api_token_create(&ds, &ctx, &person, &name, Some(expires_in_days))
                            .await?;
                    let text = format!(
                        "created API token {} ({}) for {}, expires {}\ntoken (shown once): {}",
                        created.api_token,
                        created.name,
                        created.person,
                        created.expires_at,
                        created.token
                    );
                    Ok((to_json(&created), text))
                }
                ApiTokenCmd::List { .. } => {
                    let list = admin::api_token_list(&ds, &ctx).await?;
                    let text = list
                        .iter()
                        .map(|t| {
                            format!(
                                "{}  {:7}  {}  for {}  expires {}",
                                t.api_token, t.status, t.name, t.person, t.expires_at
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("\n");
                    Ok((
                        json!({"api_tokens": list}),
                        if text.is_empty() { "no API tokens".into() } else { text },
                    ))
                }
                ApiTokenCmd::Revoke { handle, reason, .. } => {
                    let r = admin::api_token_revoke(&ds, &ctx, &handle, &reason).await?;
                    let text = if r.revoked {
                        format!("revoked {}", r.api_token)
                    } else {
                        format!("{} was already revoked", r.api_token)
                    };
                    Ok((to_json(&r), text))
                }
            }
        }
        Command::ApprovalPolicy(cmd) => {
            let slug = match &cmd {
                ApprovalPolicyCmd::Show { t } | ApprovalPolicyCmd::Set { t, .. } => {
                    t.tenant.clone()
                }
            };
            let ctx = in_tenant(&ds, operator.as_ref(), &slug).await?;
            if let ApprovalPolicyCmd::Set { scope, mode, approver_not_creator, .. } = cmd {
                let mode = match mode.as_str() {
                    "default" => None,
                    other => Some(approvals::Completion::parse("mode", other)?),
                };
                approvals::policy_set(&ds, &ctx, &scope, mode, approver_not_creator).await?;
            }
            let policy = approvals::policy(&ds, &ctx).await?;
            let tools: Vec<Value> = shared::services::actions::Op::ALL
                .iter()
                .map(|op| {
                    let (mode, not_creator) = policy.for_op(*op);
                    json!({"tool": op.name(), "class": op.class().as_str(), "mode": mode, "approver_not_creator": not_creator})
                })
                .collect();
            let text = tools
                .iter()
                .map(|t| {
                    format!(
                        "{:24} {:7} {}{}",
                        t["tool"].as_str().unwrap_or_default(),
                        t["class"].as_str().unwrap_or_default(),
                        t["mode"].as_str().unwrap_or_default(),
                        if t["approver_not_creator"] == true {
                            " (approver is not the creator)"
                        } else {
                            ""
                        }
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            Ok((json!({"rules": policy.rules, "tools": tools}), text))
        }
        Command::RateLimit(cmd) => {
            let slug = match &cmd {
                RateLimitCmd::Show { t } | RateLimitCmd::Set { t, .. } => t.tenant.clone(),
            };
            let ctx = in_tenant(&ds, operator.as_ref(), &slug).await?;
            if let RateLimitCmd::Set { class, per_minute, .. } = cmd {
                let per_minute = match per_minute.as_str() {
                    "default" => None,
                    n => Some(n.parse::<i32>().map_err(|_| {
                        Error::invalid(
                            "per_minute",
                            "a whole number of calls per minute, or `default`",
                        )
                    })?),
                };
                rates::set_limit(&ds, &ctx, &class, per_minute).await?;
            }
            let limits = rates::limits(&ds, &ctx).await?;
            let text = limits
                .iter()
                .map(|l| {
                    format!(
                        "{:13} {:>8} per minute{}  (counted {})",
                        l.class,
                        l.per_minute,
                        if l.overridden {
                            format!(", default {}", l.default)
                        } else {
                            " (default)".into()
                        },
                        l.counted.replace('_', " ")
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            Ok((json!({"limits": limits}), text))
        }
        Command::Policy(cmd) => policy(&ds, operator.as_ref(), cmd).await,
        Command::Budget(cmd) => {
            let (slug, connection) = match &cmd {
                BudgetCmd::Show { t, connection } | BudgetCmd::Set { t, connection, .. } => {
                    (t.tenant.clone(), connection.clone())
                }
            };
            let ctx = in_tenant(&ds, operator.as_ref(), &slug).await?;
            let shown = match cmd {
                BudgetCmd::Set { kind, limit, window, .. } => {
                    let limit = match limit.as_str() {
                        "default" => None,
                        n => Some(n.parse::<i64>().map_err(|_| {
                            Error::invalid("limit", "a whole number of units, or `default`")
                        })?),
                    };
                    let window_secs = window.as_deref().map(budgets::parse_window).transpose()?;
                    let set = budgets::BudgetSet {
                        connection: connection.as_deref(),
                        kind: &kind,
                        limit,
                        window_secs,
                    };
                    budgets::set(&ds, &ctx, &set).await?
                }
                BudgetCmd::Show { .. } => budgets::show(&ds, &ctx, connection.as_deref()).await?,
            };
            let text = shown
                .iter()
                .map(|b| {
                    format!(
                        "{:20} {:10} {:>8} per {:4} used {:>8} left {:>8}{}",
                        b.kind.as_str(),
                        match b.scope {
                            budgets::Scope::Connection => "connection",
                            budgets::Scope::Tenant => "tenant",
                        },
                        b.limit,
                        b.window,
                        b.used,
                        b.left,
                        if b.default { " (default)" } else { "" }
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            let text = if text.is_empty() { "no tenant-wide budgets".to_owned() } else { text };
            Ok((json!({"budgets": shown}), text))
        }
        Command::KillSwitch { state, tenant, reason } => {
            let kill = state == "on";
            let flipped = match tenant {
                None => {
                    admin::kill_switch_set(&ds, admin::SwitchScope::Global(need()?), kill, &reason)
                        .await?
                }
                Some(slug) => {
                    let ctx = in_tenant(&ds, operator.as_ref(), &slug).await?;
                    admin::kill_switch_set(&ds, admin::SwitchScope::Tenant(&ctx), kill, &reason)
                        .await?
                }
            };
            let text = format!(
                "{}: agents {}{}",
                flipped.scope,
                if flipped.kill { "refused" } else { "allowed" },
                if flipped.changed { "" } else { " (unchanged)" }
            );
            Ok((to_json(&flipped), text))
        }
        Command::Audit { cmd: Some(cmd), .. } => audit(&ds, &common, operator.as_ref(), cmd).await,
        Command::Audit { tenant, connection, limit, cmd: None } => {
            let tenant = tenant.ok_or_else(|| {
                Error::invalid("tenant", "name the tenant: gatehousectl audit --tenant SLUG")
            })?;
            let ctx = in_tenant(&ds, operator.as_ref(), &tenant).await?;
            let rows = admin::audit_list(&ds, &ctx, connection.as_deref(), limit).await?;
            let text = rows
                .iter()
                .map(|r| {
                    format!(
                        "{}  {:7} {:8} {:32} {}  {}",
                        r.at,
                        r.channel,
                        r.outcome,
                        r.action,
                        r.connection.as_deref().unwrap_or("-"),
                        r.targets.join(",")
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            Ok((
                json!({"audit": rows}),
                if text.is_empty() { "no audit rows".into() } else { text },
            ))
        }
        Command::Demo(DemoCmd::Seed) => {
            let seed = demo::seed(&ds, operator.as_ref(), "").await?;
            let mut text = String::from("Demo seeded.\n");
            for t in &seed.tenants {
                text.push_str(&format!(
                    "\n{} ({})\n  admin: {} / {}\n",
                    t.slug, t.zone, t.admin.email, t.admin.password
                ));
                for c in &t.connections {
                    text.push_str(&format!("  connection {:28} {}\n", c.name, c.token));
                }
                text.push_str(&format!("  API token: {}\n", t.api_token));
            }
            Ok((to_json(&seed), text))
        }
    }
}

impl Command {
    /// Commands whose change workers should hear about at once.
    fn pushes(&self) -> bool {
        matches!(
            self,
            Command::KillSwitch { .. }
                | Command::Connection(ConnectionCmd::Revoke { .. })
                | Command::Person(PersonCmd::Deactivate { .. })
                // What connections may see changes: listen streams are told.
                | Command::Person(PersonCmd::SetRole { .. })
                | Command::ApprovalPolicy(ApprovalPolicyCmd::Set { .. })
        )
    }
}
