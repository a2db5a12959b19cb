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

#[derive(Debug, Parser)]
#[command(
    name = "gatehousectl",
    version,
    about = "Operate Gatehouse: schema, tenants, people, connections, API tokens, demo data"
)]
#[command(
    after_help = "Configuration: DATABASE_URL (required), NATS_URL (default nats://127.0.0.1:4222).\n\
Who you are: every command but `migrate`, `demo seed` and granting the platform's first\n\
operator acts as a platform operator named with --as EMAIL (or GATEHOUSE_OPERATOR); the\n\
audit log records them."
)]
struct Cli {
    /// Print one JSON object instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// The platform operator running the command (their email); the audit names them.
    #[arg(long = "as", global = true, env = "GATEHOUSE_OPERATOR", value_name = "EMAIL")]
    operator: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply pending database migrations.
    Migrate,
    /// Manage tenants.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Manage people and their roles in a tenant.
    #[command(subcommand)]
    Person(PersonCmd),
    /// Manage agent connections.
    #[command(subcommand)]
    Connection(ConnectionCmd),
    /// Manage the REST API's tokens: they expire, and can be revoked at any time.
    #[command(subcommand)]
    ApiToken(ApiTokenCmd),
    /// Who completes agents' notify, wake, alert and delete actions in a tenant.
    #[command(subcommand)]
    ApprovalPolicy(ApprovalPolicyCmd),
    /// A tenant's rate buckets: calls per connection and minute, by effect class.
    #[command(subcommand)]
    RateLimit(RateLimitCmd),
    /// Budgets on effects: how many customers messaged, bookings changed, technicians paged,
    /// alert-minutes muted and records deleted a connection (or the whole tenant) may cause in a
    /// rolling window before its agent's actions wait for a person.
    #[command(subcommand)]
    Budget(BudgetCmd),
    /// Demo data.
    #[command(subcommand)]
    Demo(DemoCmd),
    /// Turn agent access off (`on`: agents are refused) or back on, globally or for one tenant.
    KillSwitch {
        /// `on` refuses agents (HTTP 503 globally); `off` lets them back in.
        #[arg(value_parser = ["on", "off"])]
        state: String,
        /// Only this tenant (its agents get a clear refusal; others are unaffected).
        #[arg(long)]
        tenant: Option<String>,
        /// Why; kept in the audit log.
        #[arg(long)]
        reason: String,
    },
    /// Make a person a platform operator (the console's global kill switch), or withdraw it.
    Operator {
        #[arg(long)]
        email: String,
        /// Their name, to create the person: the first operator of a new install.
        #[arg(long)]
        name: Option<String>,
        /// Withdraw the operator role instead of granting it.
        #[arg(long)]
        revoke: bool,
    },
    /// Set a new console password for a person (operators only), ending every console session
    /// they have: for an account whose password may be known to someone else.
    PasswordReset {
        #[arg(long)]
        email: String,
        /// The new password (at least 12 characters); read from GATEHOUSE_PASSWORD if unset.
        #[arg(long, env = "GATEHOUSE_PASSWORD", hide_env_values = true)]
        password: String,
    },
    /// People's passkeys: the operator's recovery for a person who lost theirs.
    #[command(subcommand)]
    Passkey(PasskeyCmd),
    /// A tenant's policy "decisions need a passkey": every decision that widens what agents can
    /// do (approving, consenting beyond reading, creating a connection, raising a role, a rate
    /// limit or the approval policy, agent access back on) needs a passkey in the console.
    PasskeyPolicy {
        #[command(flatten)]
        t: InTenant,
        /// `on`, `off`, or `show`.
        #[arg(value_parser = ["on", "off", "show"], default_value = "show")]
        to: String,
    },
    /// Read the audit log of a tenant: tool, outcome, public ids, channel, connection, client;
    /// verify its hash chain and checkpoints; configure its SIEM webhook.
    #[command(args_conflicts_with_subcommands = true)]
    Audit {
        /// The tenant's slug (to list its rows).
        #[arg(long)]
        tenant: Option<String>,
        /// Only this connection (con_…).
        #[arg(long)]
        connection: Option<String>,
        /// At most this many rows, newest first.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        #[command(subcommand)]
        cmd: Option<AuditCmd>,
    },
}

#[derive(Debug, Subcommand)]
enum AuditCmd {
    /// Check the tenant's hash chain and signed checkpoints with PUBLIC keys, against anchors
    /// kept outside Gatehouse; exits 1 naming the first row or checkpoint that was edited,
    /// deleted, inserted, reordered or rewritten (and, with --strict, when rows are unanchored).
    Verify {
        #[command(flatten)]
        t: InTenant,
        /// The published key set: its URL (the control plane's
        /// /.well-known/gatehouse-audit-keys) or a file holding it.
        #[arg(long, env = "GATEHOUSE_AUDIT_KEYS")]
        keys: Option<String>,
        /// A public key to check checkpoints with (`kid:base64url`, repeatable).
        #[arg(long = "public-key")]
        public_keys: Vec<String>,
        /// Checkpoints held outside (JSON lines or an array: what the SIEM webhook received as
        /// `audit.checkpoint` events, the anchor file, the public endpoint's list); repeatable.
        #[arg(long = "anchors")]
        anchor_files: Vec<std::path::PathBuf>,
        /// A chain position and its hash written down elsewhere (`seq:hex`); repeatable.
        #[arg(long = "anchor")]
        anchors: Vec<String>,
        /// Fail (exit 1) when chained rows are covered by no checkpoint for longer than two
        /// checkpoint intervals.
        #[arg(long)]
        strict: bool,
        /// The control plane's checkpoint interval (GATEHOUSE_AUDIT_CHECKPOINT_SECS).
        #[arg(long, env = "GATEHOUSE_AUDIT_CHECKPOINT_SECS", default_value_t = 60)]
        checkpoint_secs: i64,
    },
    /// The public keys that verify checkpoints (signing, published and retired), as the
    /// control plane publishes them.
    Keys,
    /// Chain every queued row and sign every chain head now (the control plane does both on
    /// its own; this is for maintenance and before retention). With
    /// GATEHOUSE_AUDIT_ANCHOR_FILE, what it signs is appended there too.
    Checkpoint,
    /// The JSON Schema of the SIEM webhook's event bodies (docs/audit-webhook.schema.json).
    WebhookSchema,
    /// Retention: drop the tenant's audit rows written before a day, up to the newest signed
    /// checkpoint that old (the rest stays verifiable from it); never an undelivered event.
    Prune {
        #[command(flatten)]
        t: InTenant,
        /// A day (2026-01-31, UTC) or an instant (RFC 3339).
        #[arg(long)]
        before: String,
    },
    /// The tenant's SIEM webhook: every audit event, in order, signed (Standard Webhooks).
    #[command(subcommand)]
    Webhook(AuditWebhookCmd),
}

#[derive(Debug, Subcommand)]
enum AuditWebhookCmd {
    /// Set the webhook URL (a new webhook prints its secret, once).
    Set {
        #[command(flatten)]
        t: InTenant,
        #[arg(long)]
        url: String,
        /// Development: allow http and loopback or private addresses.
        #[arg(long)]
        dev: bool,
    },
    Show {
        #[command(flatten)]
        t: InTenant,
    },
    /// A new secret, printed once; the old one keeps signing beside it for a day.
    Rotate {
        #[command(flatten)]
        t: InTenant,
    },
    Remove {
        #[command(flatten)]
        t: InTenant,
    },
}

#[derive(Debug, Subcommand)]
enum PasskeyCmd {
    /// Remove every passkey of a person and end their console sessions (audited). They sign in
    /// again with their password or their organization's sign-in and add a new passkey; under
    /// a tenant's passkey policy that is the way back for someone who lost their last one.
    Reset {
        #[arg(long)]
        email: String,
    },
}

#[derive(Debug, Subcommand)]
enum TenantCmd {
    /// Create a tenant.
    Create {
        /// URL-safe identifier, e.g. northwind-heating.
        #[arg(long)]
        slug: String,
        /// Display name.
        #[arg(long)]
        name: String,
        /// ISO 4217 currency code.
        #[arg(long, default_value = "EUR")]
        currency: String,
        /// IANA time zone.
        #[arg(long, default_value = "Europe/Berlin")]
        zone: String,
    },
    /// The tenant's identity provider: single sign-on (OpenID Connect) and ID-JAG.
    #[command(subcommand)]
    Idp(IdpCmd),
}

#[derive(Debug, Subcommand)]
enum IdpCmd {
    /// Connect the tenant's identity provider, or change it (its discovery document and key
    /// set are checked first). Register at the IdP the redirect URI
    /// <control plane URL>/sso/callback and, if it sends one, the back-channel logout URI
    /// <control plane URL>/sso/backchannel-logout.
    Set {
        #[command(flatten)]
        t: InTenant,
        /// The IdP's issuer, exactly as its discovery document names it
        /// (e.g. https://example.okta.com, https://login.microsoftonline.com/TENANT/v2.0,
        /// https://accounts.google.com).
        #[arg(long)]
        issuer: String,
        /// The client id the IdP issued for Gatehouse.
        #[arg(long)]
        client_id: String,
        /// The client secret; read from GATEHOUSE_IDP_CLIENT_SECRET if unset; may be left out
        /// when changing other settings of the same client.
        #[arg(long, env = "GATEHOUSE_IDP_CLIENT_SECRET", hide_env_values = true)]
        client_secret: Option<String>,
        /// Email domains the IdP vouches for (comma-separated): a first sign-in links a member
        /// by a verified email of these domains.
        #[arg(long = "email-domain", value_delimiter = ',', required = true)]
        email_domains: Vec<String>,
        /// `on`: verified people of these domains who are not members join as viewers.
        #[arg(long, value_parser = ["on", "off"])]
        allow_join: String,
        /// `on`: password sign-in is off for the tenant; only sessions the IdP started enter it.
        #[arg(long, value_parser = ["on", "off"])]
        sso_required: String,
        /// `on`: the IdP may grant agents access with ID-JAGs (enterprise-managed authorization).
        #[arg(long, value_parser = ["on", "off"])]
        id_jag: String,
        /// How long a console session started by the IdP lives (1 to 12 hours).
        #[arg(long, default_value_t = shared::services::sso::DEFAULT_SESSION_HOURS)]
        session_hours: i32,
        /// Development: fetch the IdP over http and from loopback or private addresses.
        #[arg(long)]
        dev_mode: bool,
    },
    /// Show the tenant's identity provider (never its secret).
    Show {
        #[command(flatten)]
        t: InTenant,
    },
    /// Disconnect the tenant's identity provider; the sessions it started end.
    Remove {
        #[command(flatten)]
        t: InTenant,
    },
    /// Register a confidential client (an agent platform presenting ID-JAGs from the tenant's
    /// IdP); prints its client id and secret once.
    ClientAdd {
        #[command(flatten)]
        t: InTenant,
        #[arg(long)]
        name: String,
    },
    /// List the tenant's confidential clients.
    Clients {
        #[command(flatten)]
        t: InTenant,
    },
}

#[derive(Debug, Args)]
struct InTenant {
    /// The tenant's slug.
    #[arg(long)]
    tenant: String,
}

#[derive(Debug, Subcommand)]
enum PersonCmd {
    /// Create a person (or add an existing one) with a role in a tenant.
    Create {
        #[command(flatten)]
        t: InTenant,
        #[arg(long)]
        email: String,
        #[arg(long)]
        name: String,
        /// admin, dispatcher or viewer.
        #[arg(long, default_value = "viewer")]
        role: String,
        /// Console password (at least 12 characters); read from GATEHOUSE_PASSWORD if unset.
        #[arg(long, env = "GATEHOUSE_PASSWORD", hide_env_values = true)]
        password: Option<String>,
    },
    /// Change a person's role; their connections narrow on the next call.
    SetRole {
        #[command(flatten)]
        t: InTenant,
        #[arg(long)]
        email: String,
        /// admin, dispatcher or viewer.
        #[arg(long)]
        role: String,
    },
    /// End a person's membership, every connection they created and their API tokens in the
    /// tenant, and all their console sessions.
    Deactivate {
        #[command(flatten)]
        t: InTenant,
        #[arg(long)]
        email: String,
    },
    /// Invite someone by email with a role: the email goes through the outbox, and the link
    /// (valid 7 days, once) is printed once, to pass on by hand.
    Invite {
        #[command(flatten)]
        t: InTenant,
        #[arg(long)]
        email: String,
        #[arg(long)]
        name: String,
        /// admin, dispatcher or viewer.
        #[arg(long, default_value = "viewer")]
        role: String,
        /// The console's public URL, which the link starts with (the chart sets
        /// GATEHOUSE_CONTROL_URL in every pod).
        #[arg(long, env = "GATEHOUSE_CONTROL_URL")]
        console_url: String,
    },
    /// The tenant's invitations still waiting.
    Invitations {
        #[command(flatten)]
        t: InTenant,
    },
    /// Revoke a waiting invitation (inv_…): its link stops working.
    Uninvite {
        #[command(flatten)]
        t: InTenant,
        #[arg(long)]
        invitation: String,
    },
}

#[derive(Debug, Subcommand)]
enum ConnectionCmd {
    /// Create a static connection; prints its token once.
    Create {
        #[command(flatten)]
        t: InTenant,
        /// Email of the person the connection acts for.
        #[arg(long)]
        creator: String,
        #[arg(long)]
        name: String,
        /// Comma-separated rights, e.g. bookings:read,customers:read.
        #[arg(long, value_delimiter = ',')]
        rights: Vec<String>,
        /// The client this is for, shown in the console and audit.
        #[arg(long, default_value = "static")]
        client_name: String,
        /// full, read_only, or small (a few combined tools for small models).
        #[arg(long, default_value = "full")]
        toolset: String,
    },
    /// Revoke a connection; its tokens stop working on the next call.
    Revoke {
        #[command(flatten)]
        t: InTenant,
        /// The connection handle (con_…).
        #[arg(long)]
        connection: String,
        #[arg(long, default_value = "revoked by an operator")]
        reason: String,
    },
    /// List a tenant's connections.
    List {
        #[command(flatten)]
        t: InTenant,
    },
}

#[derive(Debug, Subcommand)]
enum ApiTokenCmd {
    /// Create an API token for a member of the tenant; prints its secret once.
    Create {
        #[command(flatten)]
        t: InTenant,
        /// Email of the person the token acts for (with their current role's rights).
        #[arg(long)]
        person: String,
        #[arg(long)]
        name: String,
        /// Days until it expires (1 to 365).
        #[arg(long, default_value_t = admin::API_TOKEN_DEFAULT_DAYS)]
        expires_in_days: i64,
    },
    /// List a tenant's API tokens (never their secrets).
    List {
        #[command(flatten)]
        t: InTenant,
    },
    /// Revoke an API token; it is refused from the next request on.
    Revoke {
        #[command(flatten)]
        t: InTenant,
        /// The token's handle (apt_…), as `api-token list` shows it.
        #[arg(long = "token")]
        handle: String,
        /// Why; kept in the audit log.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Debug, Subcommand)]
enum ApprovalPolicyCmd {
    /// Show the tenant's rules and what each two-step tool gets.
    Show {
        #[command(flatten)]
        t: InTenant,
    },
    /// Set who completes a class (notify, wake, alert, delete) or one two-step tool:
    /// agent_confirms (the default), person_approves (a member approves in the console), or off.
    Set {
        #[command(flatten)]
        t: InTenant,
        /// An effect class (notify, wake, alert, delete) or a two-step tool's name.
        #[arg(long)]
        scope: String,
        /// agent_confirms, person_approves or off; `default` removes the rule.
        #[arg(long)]
        mode: String,
        /// With person_approves: the approver may not be the connection's creator.
        #[arg(long)]
        approver_not_creator: bool,
    },
}

#[derive(Debug, Subcommand)]
enum RateLimitCmd {
    /// Show every class's allowance (the tenant's own or the default).
    Show {
        #[command(flatten)]
        t: InTenant,
    },
    /// Set a class's allowance per connection and minute, or `default`.
    Set {
        #[command(flatten)]
        t: InTenant,
        /// read, silent_write, notify, wake, alert or delete.
        #[arg(long)]
        class: String,
        /// Calls per connection and minute (1 to 1000000), or `default`.
        #[arg(long)]
        per_minute: String,
    },
}

#[derive(Debug, Subcommand)]
enum BudgetCmd {
    /// Show a connection's budgets (and the tenant-wide ones), used and left; without
    /// --connection, the tenant-wide budgets only.
    Show {
        #[command(flatten)]
        t: InTenant,
        /// The connection (con_…).
        #[arg(long)]
        connection: Option<String>,
    },
    /// Set a budget of one kind for a connection, or with no --connection for the whole tenant.
    Set {
        #[command(flatten)]
        t: InTenant,
        /// The connection (con_…); without it, the tenant-wide budget.
        #[arg(long)]
        connection: Option<String>,
        /// customers_messaged, bookings_changed, technicians_paged, alert_minutes_muted or
        /// records_deleted.
        #[arg(long)]
        kind: String,
        /// Units per window, or `default` (a connection's default again; for the tenant, no
        /// tenant-wide budget).
        #[arg(long)]
        limit: String,
        /// The rolling window: 30m, 1h, 24h, 7d (1m to 30d); unchanged if left out.
        #[arg(long)]
        window: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum DemoCmd {
    /// Create two demo tenants with people, bookings and connections; prints logins and tokens.
    Seed,
}

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

async fn idp(ds: &Services, operator: &Operator, cmd: IdpCmd) -> shared::Result<(Value, String)> {
    use shared::services::{id_jag, sso};
    let slug = match &cmd {
        IdpCmd::Set { t, .. }
        | IdpCmd::Show { t }
        | IdpCmd::Remove { t }
        | IdpCmd::ClientAdd { t, .. }
        | IdpCmd::Clients { t } => t.tenant.clone(),
    };
    let ctx = in_tenant(ds, Some(operator), &slug).await?;
    let describe = |i: &sso::IdpView| {
        format!(
            "issuer {}\nclient id {} ({})\nemail domains {}\njoin as viewer {}\nsso required {}\nid-jag {}\nsession hours {}",
            i.issuer,
            i.client_id,
            i.token_auth_method,
            i.email_domains.join(","),
            if i.allow_join { "on" } else { "off" },
            if i.sso_required { "on" } else { "off" },
            if i.id_jag { "on" } else { "off" },
            i.session_hours
        )
    };
    match cmd {
        IdpCmd::Set {
            issuer,
            client_id,
            client_secret,
            email_domains,
            allow_join,
            sso_required,
            id_jag,
            session_hours,
            dev_mode,
            ..
        } => {
            let policy =
                shared::services::oauth::FetchPolicy { dev: dev_mode, ..Default::default() };
            let input = sso::IdpInput {
                issuer,
                client_id,
                client_secret,
                email_domains,
                allow_join: allow_join == "on",
                sso_required: sso_required == "on",
                id_jag: id_jag == "on",
                session_hours,
            };
            let v = sso::idp_set(ds, &ctx, &policy, input).await?;
            let text = format!("identity provider of {slug} set\n{}", describe(&v));
            Ok((json!({"tenant": slug, "idp": v}), text))
        }
        IdpCmd::Show { .. } => {
            let v = sso::idp_show(ds, &ctx).await?;
            let text = match &v {
                Some(v) => describe(v),
                None => format!("{slug} has no identity provider; people sign in with passwords"),
            };
            Ok((json!({"tenant": slug, "idp": v}), text))
        }
        IdpCmd::Remove { .. } => {
            let removed = sso::idp_remove(ds, &ctx).await?;
            let text = if removed {
                format!("identity provider of {slug} removed; its sessions ended")
            } else {
                format!("{slug} had no identity provider")
            };
            Ok((json!({"tenant": slug, "removed": removed}), text))
        }
        IdpCmd::ClientAdd { name, .. } => {
            let r = id_jag::client_register(ds, &ctx, &name).await?;
            let text = format!(
                "registered {} for {slug}\nclient id     {}\nclient secret {} (shown once)",
                r.name, r.client_id, r.client_secret
            );
            Ok((to_json(&r), text))
        }
        IdpCmd::Clients { .. } => {
            let list = id_jag::client_list(ds, &ctx).await?;
            let text = list
                .iter()
                .map(|c| format!("{}  {}  {}", c.client_id, c.name, c.created_at))
                .collect::<Vec<_>>()
                .join("\n");
            Ok((json!({"clients": list}), if text.is_empty() { "no clients".into() } else { text }))
        }
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or_default()
}

/// Reads the published key set from a URL or a file.
async fn key_set(source: &str) -> shared::Result<Vec<shared::services::audit::PublicKey>> {
    let text = if source.starts_with("http://") || source.starts_with("https://") {
        let fail = |e: String| Error::invalid("keys", format!("{source}: {e}"));
        let response = reqwest::Client::new()
            .get(source)
            .timeout(std::time::Duration::from_secs(10))
            .send()
            .await
            .map_err(|e| fail(format!("could not be fetched ({e})")))?;
        if !response.status().is_success() {
            return Err(fail(format!("answered {}", response.status())));
        }
        response.text().await.map_err(|e| fail(e.to_string()))?
    } else {
        std::fs::read_to_string(source)
            .map_err(|e| Error::invalid("keys", format!("{source} cannot be read: {e}")))?
    };
    shared::services::audit::PublicKey::parse_set(&text)
        .map_err(|e| Error::invalid("keys", format!("{source}: {e}")))
}

async fn audit(
    ds: &Services,
    common: &Common,
    operator: Option<&Operator>,
    cmd: AuditCmd,
) -> shared::Result<(Value, String)> {
    use shared::services::audit;
    match cmd {
        AuditCmd::Keys => {
            let keys = audit::public_keys(ds);
            let text = keys
                .iter()
                .map(|k| {
                    let status = serde_json::to_value(k.status).unwrap_or_default();
                    format!(
                        "{}  Ed25519  {}  {}",
                        k.kid,
                        k.public_key,
                        status.as_str().unwrap_or("")
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            let text = if text.is_empty() {
                "GATEHOUSE_AUDIT_SIGNING_KEYS is not set".into()
            } else {
                text
            };
            Ok((json!({"alg": "Ed25519", "keys": keys}), text))
        }
        AuditCmd::WebhookSchema => {
            let schema = audit::event_schema();
            let text = serde_json::to_string_pretty(&schema).unwrap_or_default();
            Ok((schema, text))
        }
        AuditCmd::Checkpoint => {
            need_operator(operator)?;
            let mut anchors = common.audit_anchors()?;
            let chained = audit::chain_round(ds).await?;
            let round = audit::checkpoint_round(ds, &mut anchors).await?;
            let mut text =
                format!("{chained} row(s) chained, {} checkpoint(s) signed", round.signed.len());
            for r in &round.refused {
                text.push_str(&format!("\nREFUSED {}: {}", r.tenant, r.reason));
            }
            if let Some(e) = &round.file_error {
                text.push_str(&format!("\nwarning: {e}"));
            }
            Ok((
                json!({
                    "chained": chained,
                    "checkpoints": round.signed.len(),
                    "signed": round.signed,
                    "refused": round.refused,
                    "anchor_file_error": round.file_error,
                }),
                text,
            ))
        }
        AuditCmd::Verify {
            t,
            keys,
            public_keys,
            anchor_files,
            anchors,
            strict,
            checkpoint_secs,
        } => {
            let ctx = in_tenant(ds, operator, &t.tenant).await?;
            let mut with = audit::VerifyWith {
                keys: public_keys
                    .iter()
                    .map(|k| {
                        audit::PublicKey::parse(k).map_err(|e| Error::invalid("public-key", e))
                    })
                    .collect::<shared::Result<Vec<_>>>()?,
                anchors: anchors
                    .iter()
                    .map(|a| audit::Anchor::parse_head(a).map_err(|e| Error::invalid("anchor", e)))
                    .collect::<shared::Result<Vec<_>>>()?,
                unanchored_after_secs: 2 * checkpoint_secs.max(1),
            };
            if let Some(source) = &keys {
                with.keys.extend(key_set(source).await?);
            }
            for path in &anchor_files {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    Error::invalid("anchors", format!("{} cannot be read: {e}", path.display()))
                })?;
                let found = audit::parse_anchors(&text)
                    .map_err(|e| Error::invalid("anchors", format!("{}: {e}", path.display())))?;
                with.anchors.extend(found.into_iter().map(audit::Anchor::Signed));
            }
            let v = audit::verify(ds, &ctx, &with).await?;
            let mut text = match &v.problem {
                None => format!(
                    "{}: verified {} row(s){}{}",
                    t.tenant,
                    v.rows_checked,
                    v.last_seq.map(|s| format!(" up to row {s}")).unwrap_or_default(),
                    v.verified_until
                        .as_deref()
                        .map(|at| format!(" (written {at})"))
                        .unwrap_or_default()
                ),
                Some(p) => format!(
                    "{}: TAMPERED ({}) at {}: {}",
                    t.tenant,
                    serde_json::to_value(p.kind)
                        .ok()
                        .and_then(|k| k.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    p.seq
                        .map(|s| format!("row {s}"))
                        .or(p.audit_id.map(|i| format!("audit id {i}")))
                        .unwrap_or_default(),
                    p.detail
                ),
            };
            if let Some(c) = &v.last_checkpoint {
                text.push_str(&format!(
                    "\n{} checkpoint(s); the last at row {} signed {} by {}",
                    v.checkpoints_checked, c.seq, c.signed_at, c.kid
                ));
            }
            if v.anchors_checked > 0 {
                text.push_str(&format!("\n{} anchor(s) held outside checked", v.anchors_checked));
            } else {
                text.push_str("\nno anchors given: a deleted tail or a rewrite since the last checkpoint in the database is found only with --anchors (what your SIEM received)");
            }
            if v.pending > 0 {
                text.push_str(&format!("\n{} row(s) not chained yet", v.pending));
            }
            if let Some(u) = &v.unanchored {
                text.push_str(&format!(
                    "\nUNANCHORED: {} row(s) from row {} (chained since {}) are covered by no checkpoint{}",
                    u.rows,
                    u.from_seq,
                    u.oldest_chained_at,
                    if strict { "" } else { " (--strict fails on this)" }
                ));
            }
            let strict_failed = strict && v.unanchored.is_some();
            Ok((
                json!({"tenant": t.tenant, "verification": v, "strict_failed": strict_failed}),
                text,
            ))
        }
        AuditCmd::Prune { t, before } => {
            let before = admin::audit_instant("before", &before, false)?;
            let ctx = in_tenant(ds, operator, &t.tenant).await?;
            let p = audit::prune(ds, &ctx, before).await?;
            let text = format!(
                "{}: {} audit rows removed, through row {} (the checkpoint signed {} anchors the rest)",
                t.tenant, p.rows_removed, p.through_seq, p.checkpoint_signed_at
            );
            Ok((json!({"pruned": p}), text))
        }
        AuditCmd::Webhook(cmd) => {
            let slug = match &cmd {
                AuditWebhookCmd::Set { t, .. }
                | AuditWebhookCmd::Show { t }
                | AuditWebhookCmd::Rotate { t }
                | AuditWebhookCmd::Remove { t } => t.tenant.clone(),
            };
            let ctx = in_tenant(ds, operator, &slug).await?;
            match cmd {
                AuditWebhookCmd::Set { url, dev, .. } => {
                    let policy = shared::services::oauth::FetchPolicy { dev, ..Default::default() };
                    let (hook, secret) = audit::webhook_set(ds, &ctx, &url, &policy).await?;
                    let text = match &secret {
                        Some(s) => format!(
                            "{slug}: audit events go to {}\nsecret (shown once): {s}",
                            hook.url
                        ),
                        None => {
                            format!("{slug}: audit events go to {} (secret unchanged)", hook.url)
                        }
                    };
                    Ok((json!({"webhook": hook, "secret": secret}), text))
                }
                AuditWebhookCmd::Show { .. } => {
                    let hook = audit::webhook_show(ds, &ctx).await?;
                    let text = match &hook {
                        None => format!("{slug}: no audit webhook"),
                        Some(h) => format!(
                            "{slug}: {}  delivered up to row {}, {} waiting{}{}",
                            h.url,
                            h.delivered_seq,
                            h.backlog,
                            h.last_error
                                .as_deref()
                                .map(|e| format!(", last error: {e}"))
                                .unwrap_or_default(),
                            h.dropped_note.as_deref().map(|n| format!("\n{n}")).unwrap_or_default()
                        ),
                    };
                    Ok((json!({"webhook": hook}), text))
                }
                AuditWebhookCmd::Rotate { .. } => {
                    let r = audit::webhook_rotate(ds, &ctx).await?;
                    let text = format!(
                        "{slug}: new secret (shown once): {}\nthe previous one keeps signing beside it for a day",
                        r.secret
                    );
                    Ok((json!({"webhook": r.webhook, "secret": r.secret}), text))
                }
                AuditWebhookCmd::Remove { .. } => {
                    let removed = audit::webhook_remove(ds, &ctx).await?;
                    Ok((
                        json!({"removed": removed}),
                        if removed {
                            format!("{slug}: audit webhook removed")
                        } else {
                            format!("{slug}: no audit webhook")
                        },
                    ))
                }
            }
        }
    }
}
