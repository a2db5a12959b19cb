//! The tenant's people: their roles, changing one, and deactivating a person (which ends every
//! connection they created, R4).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect};
use maud::html;
use shared::error::{Error, Resource};
use shared::rights::Role;
use shared::services::{admin, console};

use super::extract::{CsrfForm, Tenant};
use super::layout::csrf_field;
use super::{Answer, shown};
use crate::AppState;

pub(super) async fn list(State(state): State<Arc<AppState>>, t: Tenant) -> Answer {
    let list = console::people(&state.ds, &t.ctx).await?;
    let body = html! {
        table {
            thead { tr { th { "Person" } th { "Email" } th { "Role" } th {} } }
            tbody {
                @for p in &list {
                    tr {
                        td { (p.name) br; code { (p.handle) } }
                        td { (p.email) }
                        td { (p.role) }
                        td {
                            @if p.active {
                                form method="post" action="/people/role" data-passkey[t.session.row.passkey_policy()] {
                                    (csrf_field(t.csrf()))
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
                                    button type="submit" { "Save role" }
                                }
                                a href={ "/people/deactivate?email=" (url::form_urlencoded::byte_serialize(p.email.as_bytes()).collect::<String>()) } { "Deactivate…" }
                            } @else {
                                "deactivated"
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(shown("People", &t.nav("/people"), body))
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
    let ctx = super::passkeys::proven(&state, &t.session, t.ctx, &form).await?;
    admin::person_set_role(&state.ds, &ctx, form.get("email").unwrap_or_default(), role).await?;
    Ok(Redirect::to("/people").into_response())
}

pub(super) async fn deactivate_confirm(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Query(q): Query<BTreeMap<String, String>>,
) -> Answer {
    // A confirmation page exists only for a person of this tenant.
    let wanted = q.get("email").map(|e| e.trim().to_lowercase()).unwrap_or_default();
    let people = console::people(&state.ds, &t.ctx).await?;
    let Some(email) =
        people.into_iter().find(|p| p.email.to_lowercase() == wanted).map(|p| p.email)
    else {
        return Err(Error::not_found(Resource::Person, wanted).into());
    };
    let body = html! {
        form method="post" action="/people/deactivate" class="card" {
            (csrf_field(t.csrf()))
            input type="hidden" name="email" value=(email);
            p { "Deactivate " strong { (email) } "? Every connection they created in this tenant ends at once." }
            button type="submit" class="danger" { "Deactivate" }
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
    admin::person_deactivate(&state.ds, &t.ctx, form.get("email").unwrap_or_default()).await?;
    Ok(Redirect::to("/people").into_response())
}
