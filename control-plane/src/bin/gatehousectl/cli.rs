//! The command line as clap reads it: every command, its arguments and its help.

use super::*;

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
pub(super) struct Cli {
    /// Print one JSON object instead of text.
    #[arg(long, global = true)]
    pub(super) json: bool,
    /// The platform operator running the command (their email); the audit names them.
    #[arg(long = "as", global = true, env = "GATEHOUSE_OPERATOR", value_name = "EMAIL")]
    pub(super) operator: Option<String>,
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Debug, Subcommand)]
pub(super) enum Command {
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
    /// A tenant's policies in Cedar (forbid rules over tools, arguments, records and time):
    /// show, check, simulate against the audited calls, set, and the history of versions.
    #[command(subcommand)]
    Policy(PolicyCmd),
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
pub(super) enum AuditCmd {
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
pub(super) enum AuditWebhookCmd {
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
pub(super) enum PasskeyCmd {
    /// Remove every passkey of a person and end their console sessions (audited). They sign in
    /// again with their password or their organization's sign-in and add a new passkey; under
    /// a tenant's passkey policy that is the way back for someone who lost their last one.
    Reset {
        #[arg(long)]
        email: String,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum TenantCmd {
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
pub(super) enum IdpCmd {
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
pub(super) struct InTenant {
    /// The tenant's slug.
    #[arg(long)]
    pub(super) tenant: String,
}

#[derive(Debug, Subcommand)]
pub(super) enum PersonCmd {
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
pub(super) enum ConnectionCmd {
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
pub(super) enum ApiTokenCmd {
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
pub(super) enum ApprovalPolicyCmd {
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
pub(super) enum RateLimitCmd {
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
pub(super) enum BudgetCmd {
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
pub(super) enum DemoCmd {
    /// Create two demo tenants with people, bookings and connections; prints logins and tokens.
    Seed,
}

#[derive(Debug, Subcommand)]
pub(super) enum PolicyCmd {
    /// The policy set in force: its version, who set it, its policies and its source.
    Show {
        #[command(flatten)]
        t: InTenant,
    },
    /// Check a policy file against the schema without a tenant: every problem at its line.
    Check {
        /// The policy set's file (Cedar).
        file: std::path::PathBuf,
    },
    /// Replay the tenant's audited agent calls of a window against a draft: what it would
    /// have allowed, forbidden or sent to a person, by policy, with examples.
    Simulate {
        #[command(flatten)]
        t: InTenant,
        /// The draft policy set's file (Cedar).
        file: std::path::PathBuf,
        /// The window, in hours back from now (1 to 2160).
        #[arg(long, default_value_t = 168)]
        hours: i64,
    },
    /// Put a policy set in force as the next version. Refused, with the set in force
    /// unchanged, when it does not parse or validate, or when another version was set since
    /// the one `--expect-version` names.
    Set {
        #[command(flatten)]
        t: InTenant,
        /// The policy set's file (Cedar).
        file: std::path::PathBuf,
        /// The version this edit started from (`policy show` says which is in force; 0 when
        /// none is): if another was set since, nothing is saved.
        #[arg(long)]
        expect_version: i32,
        /// Why, kept with the version.
        #[arg(long, default_value = "")]
        note: String,
    },
    /// The versions, newest first, with what each added and removed.
    History {
        #[command(flatten)]
        t: InTenant,
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
}
