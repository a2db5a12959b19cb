//! The tenant's people: a searchable, paged list, changing a role (confirmed, with what it
//! gives and takes), and deactivating a person (which ends every connection they created, R4).
//! The tenant's last active admin can be neither demoted nor deactivated: the service refuses
//! it for the console, the REST API and the CLI alike.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use maud::html;
use shared::error::Error;
use shared::rights::Role;
use shared::services::{admin, console, invitations};

use super::extract::{CsrfForm, Tenant};
use super::layout::{csrf_field, pager, search_field, select_filter};
use super::{Answer, saved, shown};
use crate::AppState;

/// People per page.
const PAGE: i64 = 50;

pub(super) async fn list(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Query(q): Query<BTreeMap<String, String>>,
) -> Answer {
    let get = |k: &str| q.get(k).cloned();
    let filter = console::PeopleFilter {
        q: get("q"),
        role: get("role"),
        status: get("status"),
        cursor: get("cursor"),
    };
    let found = console::people_page(&state.ds, &t.ctx, &filter, PAGE).await?;
    let me = t.session.row.email().to_lowercase();
    let roles: Vec<(&str, &str)> = Role::ALL.iter().map(|r| (r.as_str(), r.as_str())).collect();
    let waiting = invitations::list_open(&state.ds, &t.ctx).await?;
    let body = html! {
        div class="toolbar" {
            p { "The people of this tenant and their roles. A role's rights are every connection's ceiling: a connection never does more than its creator's role allows now." }
            a class="button" href="/people/invite" { "Invite someone" }
        }
        (super::invitations::waiting(&t, &waiting))
        form method="get" action="/people" class="filters" role="search" {
            (search_field(filter.q.as_deref(), "Name or email"))
            (select_filter("role", "Role", &roles, filter.role.as_deref()))
            (select_filter("status", "Status", &[("active", "active"), ("deactivated", "deactivated")], filter.status.as_deref()))
            button type="submit" class="plain" { "Search" }
        }
        @if found.rows.is_empty() {
            p class="muted" { "Nobody matches this search." }
        } @else {
            table {
                thead { tr { th { "Person" } th { "Email" } th { "Role" } th { span class="visually-hidden" { "Actions" } } } }
                tbody {
                    @for p in &found.rows {
                        tr {
                            td { (p.name) @if p.email.to_lowercase() == me { " (you)" } br; code { (p.handle) } }
                            td { (p.email) }
                            td { (p.role) }
                            td {
                                @if p.active {
                                    // Choosing a role opens its confirmation, which says what
                                    // the change gives and takes before anything changes.
                                    form method="get" action="/people/role" class="inline" {
                                        input type="hidden" name="email" value=(p.email);
                                        label {
                                            "Role "
                                            select name="role" aria-label={ "Role of " (p.email) } {
                                                @for r in Role::ALL.iter() {
                                                    option value=(r.as_str()) selected[r.as_str() == p.role] { (r.as_str()) }
                                                }
                                            }
                                        }
                                        " "
                                        button type="submit" class="plain" { "Change role…" }
                                    }
                                    " "
                                    a href={ "/people/deactivate?email=" (super::segment(&p.email)) } { "Deactivate…" }
                                } @else {
                                    "deactivated"
                                }
                            }
                        }
                    }
                }
            }
        }
        (pager("/people", &q, found.next.as_deref()))
    };
    Ok(shown("People", &t.nav("/people"), body))
}

/// The person a confirmation is about (one of this tenant's people, found by email) and how
/// many active connections they created.
async fn person_of(
    state: &AppState,
    t: &Tenant,
    email: Option<&String>,
) -> Answer<(console::PersonListRow, i64)> {
    Ok(console::person(&state.ds, &t.ctx, email.map(String::as_str).unwrap_or_default()).await?)
}

/// The confirmation of a role change: the rights it gives and takes, what happens to the
/// person's connections, and a word when it is the admin's own role.
pub(super) async fn role_confirm(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Query(q): Query<BTreeMap<String, String>>,
) -> Answer {
    let (person, connections) = person_of(&state, &t, q.get("email")).await?;
    let role = match q.get("role").map(|r| r.parse::<Role>()) {
        Some(r) => r?,
        None => return Err(Error::invalid("role", "pick a role").into()),
    };
    if !person.active {
        return Err(Error::WrongState {
            message: format!("{} is deactivated; add them again to give them a role", person.email),
            use_instead: None,
        }
        .into());
    }
    let from: Role = person.role.parse()?;
    if from == role {
        let message = format!("{} is already {}; nothing changed.", person.email, role.as_str());
        return Ok(saved("/people", &message));
    }
    let gained = role.rights().without(from.rights());
    let lost = from.rights().without(role.rights());
    let yourself = person.email.eq_ignore_ascii_case(t.session.row.email());
    let body = html! {
        form method="post" action="/people/role" class="card" {
            (csrf_field(t.csrf()))
            input type="hidden" name="email" value=(person.email);
            input type="hidden" name="role" value=(role.as_str());
            p { "Change " strong { (person.name) " (" (person.email) ")" } " from " strong { (from.as_str()) } " to " strong { (role.as_str()) } "?" }
            @if !gained.is_empty() {
                p { "They gain: " (super::rights_words(gained)) "." }
            }
            @if !lost.is_empty() {
                p { "They lose: " (super::rights_words(lost)) "." }
            }
            p {
                @if connections == 0 { "They have no active connections." }
                @else { "Their " (connections) " active connection(s) keep working with the new role's rights from their next call: tools outside it disappear." }
            }
            @if yourself && from == Role::Admin {
                p class="warning" { "This is your own role: you lose the admin pages as soon as you confirm." }
            }
            button type="submit" class=[(!lost.is_empty()).then_some("danger")] { "Change role to " (role.as_str()) }
            " "
            a href="/people" { "Cancel" }
        }
    };
    Ok(shown("Change role", &t.nav("/people"), body))
}

pub(super) async fn set_role(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let role = match form.get("role").map(str::parse::<Role>) {
        Some(r) => r?,
        None => return Err(Error::invalid("role", "pick a role").into()),
    };
    let ctx = super::step_up::proven(&state, &t.session, t.ctx, &form).await?;
    let done = admin::person_set_role(&state.ds, &ctx, form.get("email").unwrap_or_default(), role)
        .await?;
    Ok(saved("/people", &format!("{} is now {}.", done.email, done.role)))
}

pub(super) async fn deactivate_confirm(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Query(q): Query<BTreeMap<String, String>>,
) -> Answer {
    // A confirmation page exists only for a person of this tenant.
    let (person, _) = person_of(&state, &t, q.get("email")).await?;
    let yourself = person.email.eq_ignore_ascii_case(t.session.row.email());
    let body = html! {
        form method="post" action="/people/deactivate" class="card" {
            (csrf_field(t.csrf()))
            input type="hidden" name="email" value=(person.email);
            p { "Deactivate " strong { (person.email) } "? Every connection and API token they created in this tenant ends at once, and they can no longer sign in to it." }
            @if yourself {
                p class="warning" { "This is you: you are signed out of this tenant as soon as you confirm, and only another admin can add you back." }
            }
            button type="submit" class="danger" { @if yourself { "Deactivate myself" } @else { "Deactivate" } }
            " "
            a href="/people" { "Cancel" }
        }
    };
    Ok(shown("Deactivate person", &t.nav("/people"), body))
}

pub(super) async fn deactivate(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let email = form.get("email").unwrap_or_default();
    let done = admin::person_deactivate(&state.ds, &t.ctx, email).await?;
    let message = format!(
        "{email} is deactivated: {} connection(s) and {} API token(s) ended.",
        done.revoked_connections.len(),
        done.revoked_api_tokens.len()
    );
    Ok(saved("/people", &message))
}
