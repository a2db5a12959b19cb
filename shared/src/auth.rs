//! Turning a credential into an operation context (R4, R5, R20).
//!
//! For MCP the worker hashes the bearer token, reads one [`ConnectionContextRow`], and calls
//! [`mcp_context`]: it refuses tokens of another kind, unknown, expired or foreign-audience
//! tokens, revoked connections and creators who left, and computes the live rights as the
//! token's rights ∩ the creator's current role rights. The context has the creator as actor
//! and no other "current user".

use crate::ctx::{ConnectionRef, OpCtx, TenantRef};
use crate::datastore::{ApiContextRow, ConnectionContextRow, Services, to_ts};
use crate::handle::{ConnectionHandle, PersonHandle, TenantHandle};
use crate::rights::{RightSet, Role};
use crate::secret::CredentialKind;
use crate::time;

/// Why a credential was refused; each says what the caller should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthFailure {
    Missing,
    WrongKind { got: CredentialKind, wants: CredentialKind },
    Unknown,
    Expired,
    WrongAudience,
    Revoked,
    CreatorGone,
}

impl AuthFailure {
    pub fn message(&self, wants: CredentialKind) -> String {
        let wanted = match wants {
            CredentialKind::Mcp => "an MCP token (gh_mcp_…) from a Gatehouse connection",
            CredentialKind::Api => "an API token (gh_api_…)",
            CredentialKind::Session => "a console session",
            CredentialKind::Invitation => "an invitation link",
        };
        match self {
            AuthFailure::Missing => format!("This endpoint takes {wanted} as `Authorization: Bearer <token>`."),
            AuthFailure::WrongKind { got, .. } => {
                let got = match got {
                    CredentialKind::Mcp => "an MCP token, which only /mcp accepts",
                    CredentialKind::Api => "an API token, which only /api accepts",
                    CredentialKind::Session => "a console session, which only the console accepts",
                    CredentialKind::Invitation => {
                        "an invitation link's token, which only its acceptance page accepts"
                    }
                };
                format!("This endpoint takes {wanted}; the request carried {got}.")
            }
            AuthFailure::Unknown => format!("The token is not known here; it may have been revoked. This endpoint takes {wanted}."),
            AuthFailure::Expired if wants == CredentialKind::Api => "The API token has expired; ask a tenant admin for a new one (console: API tokens, or `gatehousectl api-token create`).".into(),
            AuthFailure::Expired => "The access token has expired; refresh it or sign in again.".into(),
            AuthFailure::WrongAudience => "The token was issued for another resource; request one for this MCP URL.".into(),
            AuthFailure::Revoked => "This connection was revoked by a tenant admin; ask them for a new one.".into(),
            AuthFailure::CreatorGone if wants == CredentialKind::Api => "The person this API token acts for is no longer an active member of the tenant; the token does not work. A current member creates their own token.".into(),
            AuthFailure::CreatorGone => "The person who created this connection is no longer active in the tenant; the connection has ended.".into(),
        }
    }
}

/// A tool's read that may travel in the same statement as the connection context, so a read
/// call costs one round trip (issue: the gate almost free). The worker's entry point asks for
/// one when the call's arguments, read before authentication, say what the tool will read; the
/// service that consumes the row builds the same key from the same parsed input
/// ([`crate::services::bookings::read_ahead`]) and uses the row only when the keys are equal,
/// after its own rights check. The row is read only in the token's tenant (R3), and nothing of
/// it leaves the worker unless that service returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadAhead {
    /// `get_booking`: one booking of the tenant and its notes before the cursor.
    Booking { handle: String, notes_before: Option<crate::datastore::NotesBefore> },
    /// `find_bookings`: one page of a search, the filter as the service runs it (its limit one
    /// more than the page, to tell whether another follows).
    Bookings(crate::datastore::BookingFilter),
    /// The gate of a call judged by the tenant's policies: what they see of the records the
    /// call's arguments name (at most one of each kind), read only when the tenant has a
    /// policy set in force ([`crate::services::policies::facts_ahead`] builds the key).
    Facts { bookings: Vec<String>, customers: Vec<String>, technicians: Vec<String> },
}

/// The rows read ahead, by the kind of read.
pub(crate) enum AheadRows {
    /// The booking of that handle, or `None` when the tenant has none.
    Booking(Box<Option<crate::datastore::BookingRow>>),
    /// A search's page, never empty.
    Bookings(Vec<crate::datastore::BookingRow>),
    /// The records found of those named (possibly none).
    Facts(Vec<crate::datastore::PolicyFactRow>),
}

/// What was read ahead, taken at most once. Its `Debug` shows the key only: the row holds a
/// customer's data (R14).
pub struct ReadAheadRow {
    pub(crate) key: ReadAhead,
    row: std::sync::Mutex<Option<AheadRows>>,
}

impl std::fmt::Debug for ReadAheadRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadAheadRow").field("key", &self.key).field("used", &self.used()).finish()
    }
}

impl ReadAheadRow {
    pub(crate) fn new(key: ReadAhead, rows: AheadRows) -> Self {
        ReadAheadRow { key, row: std::sync::Mutex::new(Some(rows)) }
    }

    pub(crate) fn take(&self) -> Option<AheadRows> {
        self.row.lock().ok()?.take()
    }

    /// A look at the rows, leaving them for the service.
    fn peek<R>(&self, look: impl FnOnce(&AheadRows) -> R) -> Option<R> {
        self.row.lock().ok()?.as_ref().map(look)
    }

    /// Whether the service took the row.
    pub fn used(&self) -> bool {
        self.row.lock().map(|row| row.is_none()).unwrap_or(false)
    }
}

impl crate::ctx::ReadAheadSlot for ReadAheadRow {
    fn used(&self) -> bool {
        ReadAheadRow::used(self)
    }
}

/// The row read ahead for `key` with this context, once: `None` when nothing was read ahead
/// for this very read (another key, another call, or already taken), so the service reads it
/// itself.
pub(crate) fn take_read_ahead(ctx: &OpCtx, key: &ReadAhead) -> Option<AheadRows> {
    ctx.read_ahead::<ReadAheadRow>().filter(|r| r.key == *key)?.take()
}

/// What a tenant's policies read of a booking: its status, start and its customer's region.
pub(crate) type BookingFacts = (String, chrono::DateTime<chrono::Utc>, Option<String>);

/// The facts of the booking `handle` when it was read ahead with this context (`Some(None)`:
/// the tenant has no such booking), without taking the row from the tool that reads it next;
/// `None` when it was not read ahead.
pub(crate) fn peek_read_ahead_booking(ctx: &OpCtx, handle: &str) -> Option<Option<BookingFacts>> {
    let slot = ctx.read_ahead::<ReadAheadRow>()?;
    match &slot.key {
        ReadAhead::Booking { handle: read, .. } if read == handle => slot
            .peek(|rows| match rows {
                AheadRows::Booking(row) => Some(
                    row.as_ref()
                        .as_ref()
                        .map(|b| (b.status.clone(), b.starts_at, b.customer_region.clone())),
                ),
                AheadRows::Bookings(_) | AheadRows::Facts(_) => None,
            })
            .flatten(),
        _ => None,
    }
}

/// The result of authenticating one MCP request.
#[derive(Debug, Clone)]
pub struct McpContext {
    pub ctx: OpCtx,
    pub tenant_agent_access: bool,
    pub global_kill: bool,
    /// For an OAuth access token, the rights its person holds now that the token lacks: what
    /// a step-up authorization could add (MCP scope challenge, HTTP 403 `insufficient_scope`).
    /// Empty for static tokens, whose missing rights stay a tool error.
    pub grantable: RightSet,
    /// Reads a connection may make per minute on one worker: the tenant's override or the
    /// default, read in the same statement as the rest of the context.
    pub read_limit: i32,
    /// When the credential stops working (OAuth access tokens); `None` for static tokens. A
    /// listen stream ends then at the latest.
    pub expires_at: Option<jiff::Timestamp>,
    /// The tenant's policy set in force (0: none), read with the context: a worker's compiled
    /// copy is checked against it on every call.
    pub policy_version: i32,
    /// The connection's creator's current role, and how the connection was granted, as the
    /// tenant's policies see them.
    pub creator_role: crate::rights::Role,
    pub grant: &'static str,
}

/// The credential of an `Authorization` header value: `Bearer <token>`, the scheme matched
/// case-insensitively (RFC 7235). The one bearer parser of every adapter.
pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    let value = authorization?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Authenticates one MCP request from its `Authorization` header value: the kind is checked
/// before any database work, then one statement reads the connection context (R4, R20).
/// The outer error is the database's; the inner one says why the credential was refused.
/// With `ahead`, the same statement also reads what the call's tool will read.
pub async fn authenticate_mcp(
    svc: &Services,
    authorization: Option<&str>,
    audience: &str,
    now: jiff::Timestamp,
    ahead: Option<ReadAhead>,
) -> crate::Result<Result<McpContext, AuthFailure>> {
    let token = match expect_kind(bearer(authorization), CredentialKind::Mcp) {
        Ok(token) => token,
        Err(failure) => return Ok(Err(failure)),
    };
    let hash = crate::secret::hash_token(token);
    let Some(key) = ahead else {
        let row = svc.entry_connection_context(&hash).await?;
        return Ok(mcp_context(row, audience, now));
    };
    let (context, rows) = match &key {
        ReadAhead::Booking { handle, notes_before } => {
            match svc
                .entry_connection_context_with_booking(&hash, handle, notes_before.clone())
                .await?
            {
                Some(read) => {
                    (Some(read.context), read.booking.map(|b| AheadRows::Booking(Box::new(b))))
                }
                None => (None, None),
            }
        }
        ReadAhead::Bookings(filter) => {
            match svc.entry_connection_context_with_bookings(&hash, filter).await? {
                Some(read) => (Some(read.context), read.bookings.map(AheadRows::Bookings)),
                None => (None, None),
            }
        }
        ReadAhead::Facts { bookings, customers, technicians } => {
            match svc
                .entry_connection_context_with_facts(&hash, bookings, customers, technicians)
                .await?
            {
                Some(read) => (Some(read.context), read.facts.map(AheadRows::Facts)),
                None => (None, None),
            }
        }
    };
    Ok(mcp_context(context, audience, now).map(|mut context| {
        if let Some(rows) = rows {
            context.ctx = context.ctx.with_read_ahead(ReadAheadRow::new(key, rows));
        }
        context
    }))
}

/// Authenticates one REST API request by its API token, with the person's current rights.
pub async fn authenticate_api(
    svc: &Services,
    authorization: Option<&str>,
) -> crate::Result<Result<OpCtx, AuthFailure>> {
    let token = match expect_kind(bearer(authorization), CredentialKind::Api) {
        Ok(token) => token,
        Err(failure) => return Ok(Err(failure)),
    };
    let row = svc.entry_api_token_context(&crate::secret::hash_token(token)).await?;
    Ok(api_context(row))
}

/// Checks the bearer value's kind before any database work.
pub fn expect_kind(bearer: Option<&str>, wants: CredentialKind) -> Result<&str, AuthFailure> {
    let token = bearer.ok_or(AuthFailure::Missing)?;
    match CredentialKind::of(token) {
        Some(kind) if kind == wants => Ok(token),
        Some(got) => Err(AuthFailure::WrongKind { got, wants }),
        None => Err(AuthFailure::Unknown),
    }
}

fn tenant_ref(id: i64, handle: &str, slug: &str, zone: &str, currency: &str) -> TenantRef {
    TenantRef {
        id,
        handle: TenantHandle::from_db(handle.to_owned()),
        slug: slug.to_owned(),
        zone: time::zone("zone", zone).unwrap_or(jiff::tz::TimeZone::UTC),
        zone_name: zone.to_owned(),
        currency: currency.to_owned(),
    }
}

/// A person's current role in the tenant, while person and membership are active.
fn current_role(
    person_active: bool,
    role: Option<&str>,
    membership_active: Option<bool>,
) -> Option<Role> {
    let role: Role = role?.parse().ok()?;
    (person_active && membership_active == Some(true)).then_some(role)
}

pub(crate) fn mcp_context(
    row: Option<ConnectionContextRow>,
    audience: &str,
    now: jiff::Timestamp,
) -> Result<McpContext, AuthFailure> {
    let row = row.ok_or(AuthFailure::Unknown)?;
    if let Some(expires) = row.token_expires_at
        && to_ts(expires) <= now
    {
        return Err(AuthFailure::Expired);
    }
    if let Some(aud) = &row.token_audience
        && aud.trim_end_matches('/') != audience.trim_end_matches('/')
    {
        return Err(AuthFailure::WrongAudience);
    }
    if row.connection_status != "active" {
        return Err(AuthFailure::Revoked);
    }
    let creator_role =
        current_role(row.creator_active, row.creator_role.as_deref(), row.membership_active)
            .ok_or(AuthFailure::CreatorGone)?;
    let creator_rights = creator_role.rights();
    let token_rights = RightSet::parse_lenient(&row.connection_rights);
    let tenant = tenant_ref(
        row.tenant_id,
        &row.tenant_handle,
        &row.tenant_slug,
        &row.tenant_zone,
        &row.tenant_currency,
    );
    let connection = ConnectionRef {
        id: row.connection_id,
        handle: ConnectionHandle::from_db(row.connection_handle),
        name: row.connection_name,
        client_name: row.client_name,
        toolset: row.connection_toolset,
    };
    let ctx = OpCtx::for_connection(
        (row.creator_id, PersonHandle::from_db(row.creator_handle)),
        tenant,
        token_rights,
        creator_rights,
        connection,
    )
    .with_policy_version(row.policy_version);
    // Only OAuth access tokens carry an audience; a client holding one can ask its person for more.
    let grantable = if row.token_audience.is_some() {
        creator_rights.without(token_rights)
    } else {
        RightSet::EMPTY
    };
    Ok(McpContext {
        ctx,
        tenant_agent_access: row.tenant_agent_access,
        global_kill: row.global_kill,
        grantable,
        expires_at: row.token_expires_at.map(to_ts),
        read_limit: row
            .read_per_minute
            .unwrap_or_else(|| crate::effect::default_per_minute("read")),
        policy_version: row.policy_version,
        creator_role,
        grant: match row.connection_grant.as_str() {
            "id_jag" => "id_jag",
            "oauth" => "oauth",
            _ => "static",
        },
    })
}

pub(crate) fn api_context(row: Option<ApiContextRow>) -> Result<OpCtx, AuthFailure> {
    let row = row.ok_or(AuthFailure::Unknown)?;
    if row.expired {
        return Err(AuthFailure::Expired);
    }
    let role = current_role(row.person_active, row.role.as_deref(), row.membership_active)
        .ok_or(AuthFailure::CreatorGone)?;
    let tenant = tenant_ref(
        row.tenant_id,
        &row.tenant_handle,
        &row.tenant_slug,
        &row.tenant_zone,
        &row.tenant_currency,
    );
    Ok(OpCtx::for_api_token(
        (row.person_id, PersonHandle::from_db(row.person_handle)),
        tenant,
        role,
        row.api_token_id,
    ))
}

#[cfg(test)]
mod tests {
    use super::bearer;

    #[test]
    fn only_a_bearer_scheme_carries_a_token() {
        assert_eq!(bearer(Some("Bearer gh_mcp_x")), Some("gh_mcp_x"));
        assert_eq!(bearer(Some("bearer  gh_mcp_x ")), Some("gh_mcp_x"));
        assert_eq!(bearer(Some("BEARER gh_mcp_x")), Some("gh_mcp_x"));
        for refused in ["Basic gh_mcp_x", "Bearer", "Bearer ", "gh_mcp_x", "Bearergh_mcp_x", ""] {
            assert_eq!(bearer(Some(refused)), None, "{refused:?}");
        }
        assert_eq!(bearer(None), None);
    }
}
