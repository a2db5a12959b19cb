//! Agent connections: the list, creating one (the token shown once), one connection's page
//! with its activity and changes, and revoking (R4: through the one service that audits).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect};
use maud::{Markup, html};
use shared::rights::RightSet;
use shared::services::{activity, admin};

use super::extract::{CsrfForm, Tenant};
use super::layout::csrf_field;
use super::{Answer, local, reason, segment, shown};
use crate::AppState;

/// The rights a new credential may get: checkboxes of what the person holds.
fn rights_picker(holds: RightSet, checked: RightSet) -> Markup {
    html! {
        fieldset {
            legend { "Rights (at most your own)" }
            @for r in holds.iter() {
                label {
                    input type="checkbox" name="right" value=(r.as_str()) checked[checked.contains(r)];
                    " " code { (r.as_str()) } " — " (r.description())
                }
            }
        }
    }
}

pub(super) async fn list(State(state): State<Arc<AppState>>, t: Tenant) -> Answer {
    let list = admin::connection_list(&state.ds, &t.ctx).await?;
    let ctx = &t.ctx;
    let body = html! {
        table {
            thead { tr { th { "Connection" } th { "Client" } th { "Created by" } th { "Rights" } th { "Created" } th { "Last used" } th { "Status" } } }
            tbody {
                @for c in &list {
                    tr {
                        td { a href={ "/connections/" (c.connection) } { (c.name) } br; code { (c.connection) } }
                        td { (c.client_name) @if c.granted_by.as_deref() == Some("idp") { br; small class="granted-by-idp" { "granted by the IdP (ID-JAG)" } } }
                        td { (c.creator) }
                        td { (c.rights.join(", ")) br; small { "toolset " (c.toolset) } }
                        td { (local(ctx, &c.created_at)) }
                        td { (c.last_used_at.as_deref().map(|t| local(ctx, t)).unwrap_or_else(|| "never".into())) }
                        td class={ "status-" (c.status) } { (c.status) }
                    }
                }
            }
        }
        form method="post" action="/connections" class="card" data-passkey[t.session.row.passkey_policy()] {
            h2 { "New connection" }
            (csrf_field(t.csrf()))
            label { "Name " input type="text" name="name" required maxlength="80" placeholder="Claude Code on my laptop"; }
            label {
                "Toolset "
                select name="toolset" {
                    option value="full" { "full — every tool the rights allow" }
                    option value="read_only" { "read_only — read tools only" }
                    option value="small" { "small — a few combined tools for small models" }
                }
            }
            (rights_picker(ctx.rights(), shared::rights::read_only().intersect(ctx.rights())))
            button type="submit" { "Create connection" }
        }
    };
    Ok(shown("Connections", &t.nav("/connections"), body))
}

/// The client name of connections made in the console.
pub(super) const CONSOLE_CLIENT: &str = "console";

pub(super) async fn create(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let rights = RightSet::parse(&form.all("right"))?;
    let new = admin::NewConnection {
        creator_email: t.session.row.email(),
        name: form.get("name").unwrap_or_default(),
        client_name: CONSOLE_CLIENT,
        rights,
        toolset: form.get("toolset").unwrap_or("full"),
    };
    let ctx = super::passkeys::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    let c = admin::connection_create(&state.ds, &ctx, new).await?;
    let mcp = state.mcp_resources.first().cloned().unwrap_or_default();
    let claude = format!(
        "claude mcp add --transport http gatehouse {mcp} --header \"Authorization: Bearer {}\"",
        c.token
    );
    let body = html! {
        p class="ok" role="status" { "Connection " code { (c.connection) } " created with " (c.rights.join(", ")) "." }
        div class="card" {
            p { strong { "Copy the token now: it is shown once and only its hash is kept." } }
            pre id="token" { (c.token) }
            button type="button" class="plain" data-copy="token" { "Copy token" }
            p { "Claude Code:" }
            pre id="claude" { (claude) }
            button type="button" class="plain" data-copy="claude" { "Copy command" }
        }
        p { a href="/connections" { "Back to connections" } }
    };
    Ok(shown("Connection created", &t.nav("/connections"), body))
}

pub(super) async fn detail(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Path(handle): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Answer {
    let ctx = &t.ctx;
    let c = admin::connection_get(&state.ds, ctx, &handle).await?;
    let changes = admin::audit_list(&state.ds, ctx, Some(&c.connection), 50).await?;
    let span = activity::Span::parse(q.get("span").map(String::as_str));
    let found =
        activity::activity(&state.ds, ctx, Some(&c.connection), span, jiff::Timestamp::now())
            .await?;
    let base = format!("/connections/{}", segment(&c.connection));
    let budgets = shared::services::budgets::show(&state.ds, ctx, Some(&c.connection)).await?;
    let used = c.last_used_at.as_deref().map(|t| local(ctx, t)).unwrap_or_else(|| "never".into());
    let body = html! {
        div class="card" {
            p {
                code { (c.connection) } " · client " (c.client_name) " · created by " (c.creator)
                @if c.granted_by.as_deref() == Some("idp") { " · granted by the tenant's identity provider (ID-JAG)" }
                " on " (local(ctx, &c.created_at)) " · last used " (used) " · "
                span class={ "status-" (c.status) } { (c.status) }
            }
            p { "Rights: " (c.rights.join(", ")) }
            @if c.status == "active" {
                p { a href={ "/connections/" (c.connection) "/revoke" } { "Revoke this connection…" } }
            }
        }
        (super::budgets::section(&budgets, Some(&c.connection), t.csrf(), t.session.row.passkey_policy()))
        (crate::pictures::section("connection-activity", &base, &found, true))
        h2 { "Recent changes" }
        p { a href={ "/audit?connection=" (c.connection) } { "All of this connection's changes in the audit log" } }
        @if changes.is_empty() {
            p class="muted" { "No changes yet." }
        } @else {
            table {
                thead { tr { th { "When" } th { "Tool" } th { "Outcome" } th { "Records" } } }
                tbody {
                    @for a in &changes {
                        tr { td { (local(ctx, &a.at)) } td { (a.action) } td { (a.outcome) } td { (a.targets.join(", ")) } }
                    }
                }
            }
        }
    };
    Ok(shown(&c.name, &t.nav("/connections"), body))
}

pub(super) async fn revoke_confirm(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Path(handle): Path<String>,
) -> Answer {
    // A confirmation page exists only for a connection that exists; its URL is built from the
    // parsed handle, never from the raw path.
    let handle = segment(&admin::connection_get(&state.ds, &t.ctx, &handle).await?.connection);
    let body = html! {
        form method="post" action={ "/connections/" (handle) "/revoke" } class="card" {
            (csrf_field(t.csrf()))
            p { "Revoke " code { (handle) } "? Its tokens stop working on their next request, on every worker. This cannot be undone." }
            label { "Reason " input type="text" name="reason" required maxlength="300"; }
            button type="submit" class="danger" { "Revoke" }
            " "
            a href={ "/connections/" (handle) } { "Cancel" }
        }
    };
    Ok(shown("Revoke connection", &t.nav("/connections"), body))
}

pub(super) async fn revoke(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Path(handle): Path<String>,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let r = admin::connection_revoke(&state.ds, &t.ctx, &handle, reason(&form)).await?;
    Ok(Redirect::to(&format!("/connections/{}", segment(&r.connection))).into_response())
}
