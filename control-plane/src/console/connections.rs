//! Agent connections: the list, creating one (the token shown once), one connection's page
//! with its activity and changes, and revoking (R4: through the one service that audits).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use maud::{Markup, html};
use shared::rights::{RightSet, RightsLevel};
use shared::services::{activity, admin};

use super::extract::{CsrfForm, Tenant};
use super::layout::{Entered, RowFailed, csrf_field, pager, search_field, select_filter};
use super::{Answer, local, reason, segment, shown};
use crate::AppState;
use shared::error::Error;

/// The rights a new credential may get: checkboxes of what the person holds, the read-only
/// ones checked on a fresh form, as sent on one that came back.
fn rights_picker(holds: RightSet, defaults: RightSet, entered: &Entered<'_>) -> Markup {
    html! {
        fieldset aria-invalid=[entered.invalid("rights")] aria-describedby=[entered.described("rights")] {
            legend { "Rights (at most your own)" }
            (entered.message("rights"))
            @for r in holds.iter() {
                label {
                    input type="checkbox" name="right" value=(r.as_str()) checked[entered.checked("right", r.as_str(), defaults.contains(r))];
                    " " code { (r.as_str()) } " — " (r.description())
                    @if r.is_dangerous() { " " span class="level level-danger" { "dangerous" } }
                }
            }
        }
    }
}

/// Connections per page.
const PAGE: i64 = 50;

/// Rights summarized by level, the dangerous ones named and marked, the full list a click away.
pub(super) fn rights_summary(names: &[String]) -> Markup {
    let set = RightSet::parse_lenient(names);
    let level = RightsLevel::of(set);
    let dangerous: Vec<&str> =
        set.iter().filter(|r| r.is_dangerous()).map(|r| r.as_str()).collect();
    html! {
        span class={ "level" @if level == RightsLevel::Dangerous { " level-danger" } } { (level.as_str()) }
        " " (names.len()) " right(s)"
        @if !dangerous.is_empty() {
            " · " strong class="dangerous" { "dangerous: " (dangerous.join(", ")) }
        }
    }
}

/// What a connection can do now, beyond its own status: the switches that block every agent.
fn effective_state(t: &Tenant, status: &str) -> (String, &'static str) {
    if status != "active" {
        return (status.to_owned(), "status-revoked");
    }
    if t.session.row.global_kill() {
        ("blocked: platform kill switch on".into(), "status-blocked")
    } else if t.session.row.tenant_agent_access() == Some(false) {
        ("blocked: agent access off".into(), "status-blocked")
    } else {
        ("active".into(), "status-active")
    }
}

fn granted_words(how: Option<&str>) -> &'static str {
    match how {
        Some("idp") => "granted by the IdP (ID-JAG)",
        Some("oauth") => "OAuth consent",
        _ => "token from the console or CLI",
    }
}

pub(super) async fn list(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Query(q): Query<BTreeMap<String, String>>,
) -> Answer {
    let get = |k: &str| q.get(k).cloned();
    let filter = admin::ConnectionFilter {
        q: get("q"),
        status: get("status"),
        client: get("client"),
        granted: get("granted"),
        level: get("level"),
        cursor: get("cursor"),
    };
    let found = admin::connection_search(&state.ds, &t.ctx, &filter, PAGE).await?;
    let ctx = &t.ctx;
    let clients: Vec<(&str, &str)> =
        found.clients.iter().map(|c| (c.as_str(), c.as_str())).collect();
    let levels: Vec<(&str, &str)> =
        RightsLevel::ALL.iter().map(|l| (l.as_str(), l.as_str())).collect();
    let body = html! {
        div class="toolbar" {
            form method="get" action="/connections" class="filters" role="search" {
                (search_field(filter.q.as_deref(), "Name, handle, client or creator"))
                (select_filter("status", "Status", &[("active", "active"), ("revoked", "revoked")], filter.status.as_deref()))
                (select_filter("client", "Client", &clients, filter.client.as_deref()))
                (select_filter("granted", "How granted", &[("token", "token (console or CLI)"), ("oauth", "OAuth consent"), ("idp", "IdP (ID-JAG)")], filter.granted.as_deref()))
                (select_filter("level", "Rights", &levels, filter.level.as_deref()))
                button type="submit" class="plain" { "Search" }
            }
            a class="button" href="/connections/new" { "New connection" }
        }
        @if found.rows.is_empty() {
            p class="muted" { "No connection matches this search." }
        } @else {
            table {
                thead { tr { th { "Connection" } th { "Client" } th { "Created by" } th { "Rights" } th { "Created" } th { "Last used" } th { "Status" } } }
                tbody {
                    @for c in &found.rows {
                        @let (state_text, state_class) = effective_state(&t, &c.status);
                        tr {
                            td { a href={ "/connections/" (segment(&c.connection)) } { (c.name) } br; code { (c.connection) } }
                            td { (c.client_name) br; small class=[(c.how_granted.as_deref() == Some("idp")).then_some("granted-by-idp")] { (granted_words(c.how_granted.as_deref())) } }
                            td { (c.creator) }
                            td { (rights_summary(&c.rights)) br; small { "toolset " (c.toolset) } }
                            td { (local(ctx, &c.created_at)) }
                            td { (c.last_used_at.as_deref().map(|t| local(ctx, t)).unwrap_or_else(|| html! { "never" })) }
                            td class=(state_class) { (state_text) }
                        }
                    }
                }
            }
        }
        (pager("/connections", &q, found.next.as_deref()))
    };
    Ok(shown("Connections", &t.nav("/connections"), body))
}

/// The form of a new connection, on its own page.
pub(super) async fn new_form(t: Tenant) -> Answer {
    Ok(shown("New connection", &t.nav("/connections"), new_body(&t, &Entered::fresh())))
}

fn new_body(t: &Tenant, entered: &Entered<'_>) -> Markup {
    let ctx = &t.ctx;
    let toolset = entered.value("toolset", "full");
    html! {
        (entered.summary(&["name", "toolset", "rights"]))
        form method="post" action="/connections" class="card" {
            (csrf_field(t.csrf()))
            label {
                "Name "
                input type="text" name="name" required maxlength="80" placeholder="Claude Code on my laptop"
                    value=(entered.value("name", "")) aria-invalid=[entered.invalid("name")] aria-describedby=[entered.described("name")];
                (entered.message("name"))
            }
            label {
                "Toolset "
                select name="toolset" aria-invalid=[entered.invalid("toolset")] aria-describedby=[entered.described("toolset")] {
                    option value="full" selected[toolset == "full"] { "full — every tool the rights allow" }
                    option value="read_only" selected[toolset == "read_only"] { "read_only — read tools only" }
                    option value="small" selected[toolset == "small"] { "small — a few combined tools for small models" }
                }
                (entered.message("toolset"))
            }
            (rights_picker(ctx.rights(), shared::rights::read_only().intersect(ctx.rights()), entered))
            button type="submit" { "Create connection" }
            " "
            a href="/connections" { "Cancel" }
        }
    }
}

/// An edit form as the service's input (the name and toolset as they were when not sent).
pub(super) fn edit_of<'a>(
    form: &'a super::extract::Fields,
    current: &'a admin::ConnectionSummary,
) -> Result<admin::ConnectionEdit<'a>, Error> {
    Ok(admin::ConnectionEdit {
        name: form.get("name").unwrap_or(&current.name),
        rights: RightSet::parse(&form.all("right"))?,
        toolset: form.get("toolset").unwrap_or(&current.toolset),
    })
}

fn edit_body(t: &Tenant, c: &admin::ConnectionSummary, entered: &Entered<'_>) -> Markup {
    let toolset = entered.value("toolset", &c.toolset);
    let had = RightSet::parse_lenient(&c.rights);
    html! {
        (entered.summary(&["name", "toolset", "rights"]))
        form method="post" action={ "/connections/" (segment(&c.connection)) "/edit" } class="card" {
            (csrf_field(t.csrf()))
            p { "Renaming or narrowing applies from the connection's next call, on every worker; its token stays the same. Giving it more is a decision under the tenant's passkey policy." }
            label {
                "Name "
                input type="text" name="name" required maxlength="80" value=(entered.value("name", &c.name))
                    aria-invalid=[entered.invalid("name")] aria-describedby=[entered.described("name")];
                (entered.message("name"))
            }
            label {
                "Toolset "
                select name="toolset" aria-invalid=[entered.invalid("toolset")] aria-describedby=[entered.described("toolset")] {
                    @for ts in admin::TOOLSETS { option value=(ts) selected[toolset == *ts] { (ts) } }
                }
                (entered.message("toolset"))
            }
            (rights_picker(t.ctx.rights().union(had), had, entered))
            button type="submit" { "Save changes" }
            " "
            a href={ "/connections/" (segment(&c.connection)) } { "Cancel" }
        }
    }
}

/// A connection's edit form; a revoked connection has none.
pub(super) async fn edit_form(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Path(handle): Path<String>,
) -> Answer {
    let c = admin::connection_get(&state.ds, &t.ctx, &handle).await?;
    if c.status != "active" {
        return Err(Error::WrongState {
            message: format!("{} is revoked, and a revoked connection is read-only", c.connection),
            use_instead: None,
        }
        .into());
    }
    let title = format!("Edit {}", c.name);
    Ok(shown(&title, &t.nav("/connections"), edit_body(&t, &c, &Entered::fresh())))
}

pub(super) async fn edit(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Path(handle): Path<String>,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let c = admin::connection_get(&state.ds, &t.ctx, &handle).await?;
    let again = |e: Error| -> Answer {
        super::shown_again(
            &format!("Edit {}", c.name),
            &t.nav("/connections"),
            edit_body(&t, &c, &Entered::failed(&form, &e)),
        )
    };
    let edit = match edit_of(&form, &c) {
        Ok(edit) => edit,
        Err(e) => return again(e),
    };
    let ctx = super::step_up::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    match admin::connection_edit(&state.ds, &ctx, &c.connection, edit).await {
        Ok(done) => {
            let to = format!("/connections/{}", segment(&done.connection));
            let message = format!(
                "Saved {}: {} with {}, toolset {}.",
                done.connection,
                done.name,
                done.rights.join(", "),
                done.toolset
            );
            Ok(super::saved(&to, &message))
        }
        Err(e @ (Error::Invalid { .. } | Error::WrongState { .. })) => again(e),
        Err(e) => Err(e.into()),
    }
}

/// The client name of connections made in the console.
pub(super) const CONSOLE_CLIENT: &str = "console";

pub(super) async fn create(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    // A mistake in the form comes back in place, with everything typed kept.
    let again = |e: Error| -> Answer {
        super::shown_again(
            "New connection",
            &t.nav("/connections"),
            new_body(&t, &Entered::failed(&form, &e)),
        )
    };
    let rights = match RightSet::parse(&form.all("right")) {
        Ok(r) if r.is_empty() => return again(Error::invalid("rights", "tick at least one right")),
        Ok(r) => r,
        Err(e) => return again(e),
    };
    let new = admin::NewConnection {
        creator_email: t.session.row.email(),
        name: form.get("name").unwrap_or_default(),
        client_name: CONSOLE_CLIENT,
        rights,
        toolset: form.get("toolset").unwrap_or("full"),
    };
    let ctx = super::step_up::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    match admin::connection_create(&state.ds, &ctx, new).await {
        Ok(c) => {
            let to = format!("/connections/{}/created", segment(&c.connection));
            super::created_once(&state, &t.session, "/connections/", &to, &c.connection, &c.token)
        }
        Err(e @ (Error::Invalid { .. } | Error::WrongState { .. })) => again(e),
        Err(e) => Err(e.into()),
    }
}

/// The page a new connection's create redirects to: its token and a ready `claude mcp add`,
/// once. A reload (or anyone else) finds the token gone and is told what to do instead.
pub(super) async fn created(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Path(handle): Path<String>,
    headers: axum::http::HeaderMap,
) -> Answer {
    let c = admin::connection_get(&state.ds, &t.ctx, &handle).await?;
    let (token, clear) =
        super::once_secret(&state, &t.session, &headers, "/connections/", &c.connection);
    let href = format!("/connections/{}", segment(&c.connection));
    let body = match token {
        Some(token) => {
            let mcp = state.mcp_resources.first().cloned().unwrap_or_default();
            let claude = format!(
                "claude mcp add --transport http gatehouse {mcp} --header \"Authorization: Bearer {token}\""
            );
            html! {
                p class="ok" role="status" { "Connection " code { (c.connection) } " (" (c.name) ") created with " (rights_summary(&c.rights)) "." }
                div class="card" {
                    p { strong { "Copy the token now: it is shown once and only its hash is kept." } }
                    pre id="token" { (token) }
                    button type="button" class="plain" data-copy="token" { "Copy token" }
                    p { "Claude Code:" }
                    pre id="claude" { (claude) }
                    button type="button" class="plain" data-copy="claude" { "Copy command" }
                }
                p { a href=(href) { "Go to the connection" } " · " a href="/connections" { "Back to connections" } }
            }
        }
        None => html! {
            p class="warning" role="status" {
                "The token of " code { (c.connection) } " was shown once, right after it was created, and only its hash is kept. "
                "If it was not copied, revoke this connection and create another."
            }
            p { a href=(href) { "Go to the connection" } " · " a href="/connections" { "Back to connections" } }
        },
    };
    super::shown_once("Connection created", &t.nav("/connections"), body, clear)
}

pub(super) async fn detail(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Path(handle): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Answer {
    let (title, body) = detail_body(&state, &t, &handle, q.get("span"), None).await?;
    Ok(shown(&title, &t.nav("/connections"), body))
}

/// The connection's page again, with a budget row's mistake in place.
pub(super) async fn detail_again(
    state: &AppState,
    t: &Tenant,
    handle: &str,
    failed: &RowFailed<'_>,
) -> Answer {
    let (title, body) = detail_body(state, t, handle, None, Some(failed)).await?;
    super::shown_again(&title, &t.nav("/connections"), body)
}

async fn detail_body(
    state: &AppState,
    t: &Tenant,
    handle: &str,
    span: Option<&String>,
    failed: Option<&RowFailed<'_>>,
) -> Result<(String, maud::Markup), super::Fail> {
    let ctx = &t.ctx;
    let c = admin::connection_get(&state.ds, ctx, handle).await?;
    let changes = admin::audit_list(&state.ds, ctx, Some(&c.connection), 50).await?;
    let span = activity::Span::parse(span.map(String::as_str));
    let found =
        activity::activity(&state.ds, ctx, Some(&c.connection), span, jiff::Timestamp::now())
            .await?;
    let base = format!("/connections/{}", segment(&c.connection));
    let budgets = shared::services::budgets::show(&state.ds, ctx, Some(&c.connection)).await?;
    let (state_text, state_class) = effective_state(t, &c.status);
    let used =
        c.last_used_at.as_deref().map(|t| local(ctx, t)).unwrap_or_else(|| html! { "never" });
    let body = html! {
        div class="card" {
            p {
                code { (c.connection) } " · client " (c.client_name) " · created by " (c.creator)
                @if c.granted_by.as_deref() == Some("idp") { " · granted by the tenant's identity provider (ID-JAG)" }
                " on " (local(ctx, &c.created_at)) " · last used " (used) " · "
                span class=(state_class) id="connection-state" { (state_text) }
            }
            p { "Rights: " (rights_summary(&c.rights)) }
            details { summary { "Every right" } ul { @for r in &c.rights { li { code { (r) } } } } }
            @if c.status == "active" {
                p {
                    a href={ "/connections/" (segment(&c.connection)) "/edit" } { "Edit name, rights or toolset" }
                    " · "
                    a href={ "/connections/" (c.connection) "/revoke" } { "Revoke this connection…" }
                }
            }
        }
        // A revoked connection is read-only: nothing of it can be set any more.
        @if c.status == "active" {
            @let can = shared::services::budgets::EffectKind::caused_by(RightSet::parse_lenient(&c.rights));
            (super::budgets::section(&budgets, Some(&c.connection), Some(&can), t.csrf(), failed))
        }
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
    Ok((c.name.clone(), body))
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
    let to = format!("/connections/{}", segment(&r.connection));
    Ok(super::saved(
        &to,
        &format!(
            "Connection {} is revoked: its tokens stop working on their next request.",
            r.connection
        ),
    ))
}
