//! API tokens for the REST API: the list, creating one for oneself (shown once), revoking.
//! They never work on the MCP endpoint (R20).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use maud::{Markup, html};
use shared::error::Error;
use shared::services::admin;

use super::extract::{CsrfForm, Tenant};
use super::layout::{Entered, csrf_field, pager, search_field, select_filter};
use super::{Answer, local, reason, segment, shown};
use crate::AppState;

/// API tokens per page.
const PAGE: i64 = 50;

pub(super) async fn list(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Query(q): Query<BTreeMap<String, String>>,
) -> Answer {
    let get = |k: &str| q.get(k).cloned();
    let filter =
        admin::ApiTokenFilter { q: get("q"), status: get("status"), cursor: get("cursor") };
    let found = admin::api_token_page(&state.ds, &t.ctx, &filter, PAGE).await?;
    let list = &found.rows;
    let ctx = &t.ctx;
    let statuses = [("active", "active"), ("expired", "expired"), ("revoked", "revoked")];
    let body = html! {
        div class="toolbar" {
            p { "API tokens call the REST API (" code { "/api/v1" } ") as a person, with that person's current role. They never work on the MCP endpoint, and they expire." }
            a class="button" href="/api-tokens/new" { "New API token" }
        }
        form method="get" action="/api-tokens" class="filters" role="search" {
            (search_field(filter.q.as_deref(), "Name or person"))
            (select_filter("status", "Status", &statuses, filter.status.as_deref()))
            button type="submit" class="plain" { "Search" }
        }
        @if list.is_empty() {
            p class="muted" { "No API token matches this search." }
        } @else {
        table {
            thead { tr { th { "Token" } th { "Acts for" } th { "Created" } th { "Expires" } th { "Status" } th { span class="visually-hidden" { "Actions" } } } }
            tbody {
                @for k in list {
                    tr {
                        td { (k.name) br; code { (k.api_token) } }
                        td { (k.person) }
                        td { (local(ctx, &k.created_at)) }
                        td { (local(ctx, &k.expires_at)) }
                        td class={ "status-" (k.status) } { (k.status) }
                        td {
                            @if k.status == "active" {
                                a href={ "/api-tokens/" (segment(&k.api_token)) "/revoke" } { "Revoke…" }
                            }
                        }
                    }
                }
            }
        }
        }
        (pager("/api-tokens", &q, found.next.as_deref()))
    };
    Ok(shown("API tokens", &t.nav("/api-tokens"), body))
}

/// The form of a new API token, on its own page.
pub(super) async fn new_form(t: Tenant) -> Answer {
    Ok(shown("New API token", &t.nav("/api-tokens"), new_body(&t, &Entered::fresh())))
}

fn new_body(t: &Tenant, entered: &Entered<'_>) -> Markup {
    let days = entered.value("expires_in_days", "90");
    html! {
        (entered.summary(&["name", "expires_in_days"]))
        form method="post" action="/api-tokens" class="card" {
            (csrf_field(t.csrf()))
            label {
                "Name "
                input type="text" name="name" required maxlength=(admin::API_TOKEN_NAME_CHARS) placeholder="Nightly export"
                    value=(entered.value("name", "")) aria-invalid=[entered.invalid("name")] aria-describedby=[entered.described("name")];
                (entered.message("name"))
            }
            p { "It acts for you (" (t.session.row.email()) "), with your role's rights at the time of each request; it ends when you leave the tenant." }
            label {
                "Expires after "
                select name="expires_in_days" aria-invalid=[entered.invalid("expires_in_days")] aria-describedby=[entered.described("expires_in_days")] {
                    @for d in ["7", "30", "90", "365"] {
                        option value=(d) selected[days == d] { (d) " days" }
                    }
                }
                (entered.message("expires_in_days"))
            }
            button type="submit" { "Create API token" }
            " "
            a href="/api-tokens" { "Cancel" }
        }
    }
}

pub(super) async fn create(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let again = |e: Error| -> Answer {
        super::shown_again(
            "New API token",
            &t.nav("/api-tokens"),
            new_body(&t, &Entered::failed(&form, &e)),
        )
    };
    let Some(Ok(days)) = form.get("expires_in_days").map(|d| d.trim().parse::<i64>()) else {
        let why = "choose how many days the token lives (1 to 365)";
        return again(Error::invalid("expires_in_days", why));
    };
    // A console token acts for the person who creates it: an admin cannot mint a credential
    // that speaks as someone else and outlives the admin's own membership.
    let name = form.get("name").unwrap_or_default();
    let email = t.session.row.email();
    let ctx = super::step_up::proven(&state, &t.session, t.ctx.clone(), &form).await?;
    let k = match admin::api_token_create(&state.ds, &ctx, email, name, Some(days)).await {
        Ok(k) => k,
        Err(e @ Error::Invalid { .. }) => return again(e),
        Err(e) => return Err(e.into()),
    };
    let to = format!("/api-tokens/{}/created", segment(&k.api_token));
    super::created_once(&state, &t.session, "/api-tokens/", &to, &k.api_token, &k.token)
}

/// The page a new API token's create redirects to: the secret, once.
pub(super) async fn created(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Path(handle): Path<String>,
    headers: axum::http::HeaderMap,
) -> Answer {
    let k = admin::api_token_get(&state.ds, &t.ctx, &handle).await?;
    let (token, clear) =
        super::once_secret(&state, &t.session, &headers, "/api-tokens/", &k.api_token);
    let body = match token {
        Some(token) => html! {
            p class="ok" role="status" {
                "API token " code { (k.api_token) } " created for " (k.person) "; it expires " (local(&t.ctx, &k.expires_at)) "."
            }
            div class="card" {
                p { strong { "Copy the token now: it is shown once and only its hash is kept." } }
                pre id="token" { (token) }
                button type="button" class="plain" data-copy="token" { "Copy token" }
                p { "Use it as " code { "Authorization: Bearer …" } " on " code { "/api/v1" } "." }
            }
            p { a href="/api-tokens" { "Back to API tokens" } }
        },
        None => html! {
            p class="warning" role="status" {
                "The secret of " code { (k.api_token) } " was shown once, right after it was created, and only its hash is kept. "
                "If it was not copied, revoke this token and create another."
            }
            p { a href="/api-tokens" { "Back to API tokens" } }
        },
    };
    super::shown_once("API token created", &t.nav("/api-tokens"), body, clear)
}

pub(super) async fn revoke_confirm(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Path(handle): Path<String>,
) -> Answer {
    // A confirmation page exists only for a token of this tenant; its URL is built from the
    // parsed handle, never from the raw path.
    let k = admin::api_token_get(&state.ds, &t.ctx, &handle).await?;
    let body = html! {
        form method="post" action={ "/api-tokens/" (segment(&k.api_token)) "/revoke" } class="card" {
            (csrf_field(t.csrf()))
            p { "Revoke " code { (k.api_token) } " (" (k.name) ", acting for " (k.person) ")? It is refused from its next request on. This cannot be undone." }
            label { "Reason " input type="text" name="reason" required maxlength="300"; }
            button type="submit" class="danger" { "Revoke" }
            " "
            a href="/api-tokens" { "Cancel" }
        }
    };
    Ok(shown("Revoke API token", &t.nav("/api-tokens"), body))
}

pub(super) async fn revoke(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    Path(handle): Path<String>,
    CsrfForm(form): CsrfForm,
) -> Answer {
    let r = admin::api_token_revoke(&state.ds, &t.ctx, &handle, reason(&form)).await?;
    Ok(super::saved("/api-tokens", &format!("API token {} is revoked.", r.api_token)))
}
