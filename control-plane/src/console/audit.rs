//! The audit log (R23: tool names, outcomes and public ids, never arguments): a search run in
//! SQL, paged by cursor, and exported as CSV that no spreadsheet runs as formulas.
//!
//! A search is one typed value, [`AuditSearch`]: it reads the query (`tool` is another name
//! for `action`) and writes the next-page and export links, so a filter that narrowed the
//! first page narrows every page after it and the export.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use shared::error::Error;
use shared::services::admin;

use super::extract::Tenant;
use super::layout::{error_box, page as layout_page};
use super::{Answer, shown};
use crate::AppState;

/// An audit search: the service's own [`admin::AuditFilter`] as a request gave it, with the
/// links that carry it on.
#[derive(Debug, Default, Clone)]
pub struct AuditSearch(pub admin::AuditFilter);

impl AuditSearch {
    /// The search of a query string's parameters (a repeated one reads as its last value);
    /// what the action starts with may be called `action` or `tool`.
    pub fn from_query(q: &BTreeMap<String, String>) -> Self {
        let get = |k: &str| q.get(k).cloned();
        AuditSearch(admin::AuditFilter {
            connection: get("connection"),
            action: get("action").or_else(|| get("tool")),
            outcome: get("outcome"),
            channel: get("channel"),
            actor: get("actor"),
            record: get("record"),
            since: get("since"),
            until: get("until"),
            cursor: get("cursor"),
        })
    }

    pub fn filter(&self) -> admin::AuditFilter {
        self.0.clone()
    }

    /// Every filter that says something, under its own name, without the cursor.
    fn pairs(&self) -> Vec<(&'static str, &str)> {
        let f = &self.0;
        [
            ("connection", &f.connection),
            ("action", &f.action),
            ("outcome", &f.outcome),
            ("channel", &f.channel),
            ("actor", &f.actor),
            ("record", &f.record),
            ("since", &f.since),
            ("until", &f.until),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.as_deref()?.trim())).filter(|(_, v)| !v.is_empty()))
        .collect()
    }

    /// The link to the page after `cursor`, with every filter of this search.
    pub fn next_href(&self, cursor: &str) -> String {
        let query = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(self.pairs())
            .append_pair("cursor", cursor)
            .finish();
        format!("/audit?{query}")
    }

    /// The link to everything this search matches, as CSV.
    pub fn csv_href(&self) -> String {
        let query = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(self.pairs())
            .finish();
        format!("/audit.csv?{query}")
    }

    /// A text filter's value as the search form shows it.
    fn shown(value: &Option<String>) -> &str {
        value.as_deref().unwrap_or("")
    }
}

impl<S: Send + Sync> FromRequestParts<S> for AuditSearch {
    type Rejection = QueryRejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Query(q) = Query::<BTreeMap<String, String>>::from_request_parts(parts, state).await?;
        Ok(AuditSearch::from_query(&q))
    }
}

/// The search form, filled with the search.
fn search_form(search: &AuditSearch, t_zone: &str) -> Markup {
    let select = |name: &str, current: &Option<String>, options: &[&str]| {
        let current = current.as_deref().map(str::trim).unwrap_or("");
        html! {
            select name=(name) {
                option value="" { "any" }
                @for o in options { option selected[*o == current] { (o) } }
            }
        }
    };
    html! {
        form method="get" action="/audit" class="card filters" {
            label { "Connection " input type="text" name="connection" value=(AuditSearch::shown(&search.0.connection)) placeholder="con_…"; }
            label { "Action starts with " input type="text" name="action" value=(AuditSearch::shown(&search.0.action)) placeholder="confirm_booking"; }
            label { "Outcome " (select("outcome", &search.0.outcome, &admin::AUDIT_OUTCOMES)) }
            label { "Channel " (select("channel", &search.0.channel, &admin::AUDIT_CHANNELS)) }
            label { "Who (email or per_…) " input type="text" name="actor" value=(AuditSearch::shown(&search.0.actor)) placeholder="avery@acme.example"; }
            label { "Record " input type="text" name="record" value=(AuditSearch::shown(&search.0.record)) placeholder="bkg_…, cus_…, con_…"; }
            label { "From (day, " (t_zone) ") " input type="date" name="since" value=(AuditSearch::shown(&search.0.since)); }
            label { "Until (day included, " (t_zone) ") " input type="date" name="until" value=(AuditSearch::shown(&search.0.until)); }
            button type="submit" { "Search" }
            " "
            a href="/audit" { "Clear" }
        }
    }
}

pub(super) async fn page(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    search: AuditSearch,
) -> Answer {
    let form = search_form(&search, &t.ctx.tenant().zone_name);
    let found = match admin::audit_search(&state.ds, &t.ctx, &search.filter(), 100).await {
        Ok(found) => found,
        Err(e @ (Error::Invalid { .. } | Error::NotFound { .. })) => {
            let body = html! { (form) (error_box(&e.to_string())) };
            let page = layout_page("Audit", Some(&t.nav("/audit")), body);
            return Ok((StatusCode::BAD_REQUEST, page).into_response());
        }
        Err(e) => return Err(e.into()),
    };
    let status =
        shared::services::audit::status(&state.ds, &t.ctx, 2 * state.audit_checkpoint_secs as i64)
            .await?;
    let body = html! {
        (chain_status(&status))
        (form)
        p {
            (found.rows.len()) " rows" @if found.next.is_some() { " on this page" }
            " · "
            a href=(search.csv_href()) download { "Export everything that matches as CSV" }
            " · "
            a href="/audit/webhook" { "Send it to your SIEM (webhook)" }
        }
        table {
            thead { tr { th { "When" } th { "Who" } th { "Action" } th { "Outcome" } th { "Records" } th { "Why and what changed" } th { "Proven by" } } }
            tbody {
                @for r in &found.rows {
                    tr {
                        td { (super::local(&t.ctx, &r.at)) br; small class="muted" { (r.channel) } }
                        td class={ "actor-" (r.actor_kind) } {
                            @match &r.actor_email {
                                Some(email) if r.actor_kind != "system" => {
                                    a href={ "/audit?actor=" (super::segment(email)) } title="Everything they and their agents did" { (r.actor) }
                                }
                                _ => { (r.actor) }
                            }
                            @if let Some(client) = &r.client_name { br; small class="muted" { "client " (client) } }
                        }
                        td { (r.action) }
                        td class={ "outcome-" (r.outcome) } { (r.outcome) }
                        td {
                            @for (i, h) in r.targets.iter().enumerate() {
                                @if i > 0 { ", " }
                                a href={ "/audit?record=" (super::segment(h)) } { code { (h) } }
                            }
                        }
                        td {
                            @if let Some(reason) = &r.reason { (reason) }
                            @if let Some(change) = &r.change {
                                @if r.reason.is_some() { br; }
                                span class="change" { (admin::change_words(change)) }
                            }
                            @if let Some(policy) = &r.policy {
                                @if r.reason.is_some() || r.change.is_some() { br; }
                                small class="muted policy" { (admin::policy_words(policy)) }
                            }
                        }
                        td { (r.proven.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
        p class="pager" {
            @if let Some(cursor) = &found.next {
                a rel="next" href=(search.next_href(cursor)) { "Next page" }
            } @else {
                span class="muted" { "End of the log" }
            }
        }
    };
    Ok(shown("Audit", &t.nav("/audit"), body))
}

/// A CSV cell: quoted, and a value a spreadsheet would run as a formula (`=`, `+`, `-`, `@`,
/// tab, carriage return) is prefixed with `'`, since names come from clients.
fn csv_cell(value: &str) -> String {
    // A value beginning with ' is prefixed too, so a reader strips exactly one ' back.
    let risky = value.starts_with(['=', '+', '-', '@', '\t', '\r', '\'']);
    let value = if risky { format!("'{value}") } else { value.to_owned() };
    format!("\"{}\"", value.replace('"', "\"\""))
}

/// The CSV lines of one page of the search, each with its chain columns (empty while the
/// row waits to be chained).
fn csv_rows(
    page: &admin::AuditPage,
    links: &std::collections::HashMap<i64, shared::services::audit::ExportLink>,
) -> String {
    let none = shared::services::audit::ExportLink::default();
    page.rows
        .iter()
        .map(|r| {
            let link = links.get(&r.id).unwrap_or(&none);
            let change = r.change.as_ref().map(|c| c.to_string()).unwrap_or_default();
            let policy = r.policy.as_ref().map(|c| c.to_string()).unwrap_or_default();
            [
                r.at.as_str(),
                &r.channel,
                &r.action,
                &r.outcome,
                &r.targets.join(" "),
                r.connection.as_deref().unwrap_or(""),
                r.connection_name.as_deref().unwrap_or(""),
                r.client_name.as_deref().unwrap_or(""),
                r.reason.as_deref().unwrap_or(""),
                r.proven.as_deref().unwrap_or(""),
                r.actor_kind,
                r.actor_handle.as_deref().unwrap_or(""),
                r.actor_email.as_deref().unwrap_or(""),
                &change,
                &policy,
                &link.seq,
                &link.prev_hash,
                &link.hash,
                &link.canonical,
            ]
            .iter()
            .map(|c| csv_cell(c))
            .collect::<Vec<_>>()
            .join(",")
                + "\r\n"
        })
        .collect()
}

/// Everything the search matches, as CSV, read page by page (1,000 rows a statement) and
/// streamed, so a long log neither waits nor sits in memory.
pub(super) async fn csv(
    State(state): State<Arc<AppState>>,
    t: Tenant,
    search: AuditSearch,
) -> Answer {
    let ctx = t.ctx;
    let mut filter = search.filter();
    filter.cursor = None;
    // The first page answers now, so a bad filter is a 400 with the reason, not a broken file.
    let first = match admin::audit_search(&state.ds, &ctx, &filter, 1000).await {
        Ok(found) => found,
        Err(e @ (Error::Invalid { .. } | Error::NotFound { .. })) => {
            return Ok((StatusCode::BAD_REQUEST, e.to_string()).into_response());
        }
        Err(e) => return Err(e.into()),
    };
    let header = "at,channel,action,outcome,records,connection,connection_name,client_name,reason,proven,actor_kind,actor,actor_email,change,policy,seq,prev_hash,hash,canonical\r\n";
    let links = chain_links(&state.ds, &ctx, &first).await?;
    let first_chunk = format!("{header}{}", csv_rows(&first, &links));
    let slug: String =
        ctx.tenant().slug.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
    let name = format!("attachment; filename=\"audit-{slug}.csv\"");
    let ds = state.ds.clone();
    let stream = futures_util::stream::unfold(
        (Some(first_chunk), first.next, filter),
        move |(chunk, next, mut filter)| {
            let ds = ds.clone();
            let ctx = ctx.clone();
            async move {
                if let Some(chunk) = chunk {
                    return Some((Ok::<_, std::io::Error>(chunk), (None, next, filter)));
                }
                filter.cursor = Some(next?);
                match admin::audit_search(&ds, &ctx, &filter, 1000).await {
                    Ok(page) => {
                        let links = chain_links(&ds, &ctx, &page).await.unwrap_or_default();
                        Some((Ok(csv_rows(&page, &links)), (None, page.next, filter)))
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "audit export interrupted");
                        Some((
                            Err(std::io::Error::other("the audit export was interrupted")),
                            (None, None, filter),
                        ))
                    }
                }
            }
        },
    );
    let mut response: Response = axum::body::Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/csv; charset=utf-8"));
    if let Ok(v) = HeaderValue::from_str(&name) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(response)
}

/// The chain columns of a page's rows.
async fn chain_links(
    ds: &shared::Services,
    ctx: &shared::OpCtx,
    page: &admin::AuditPage,
) -> shared::Result<std::collections::HashMap<i64, shared::services::audit::ExportLink>> {
    let ids: Vec<i64> = page.rows.iter().map(|r| r.id).collect();
    shared::services::audit::export_links(ds, ctx, &ids).await
}

/// What the chain's state is, in every state: tampered, unanchored, verified up to, being
/// chained, nothing yet. The tail since the last signed checkpoint is checked on each view.
fn chain_status(status: &shared::services::audit::ChainStatus) -> Markup {
    use shared::services::audit::ChainState;
    let checkpoint = html! {
        @if let Some(c) = &status.checkpoint {
            " The last checkpoint covers row " (c.seq) ", signed " (c.signed_at) " by key " (c.kid) "."
        } @else {
            " No checkpoint is signed yet."
        }
        @if status.pending > 0 { " " (status.pending) " row(s) are being chained." }
    };
    html! {
        @match status.state {
            ChainState::Tampered => {
                p class="card error" role="alert" {
                    strong { "Tampered: the audit log does not verify. " }
                    @if let Some(p) = &status.problem { (p.detail) "." }
                    " Compare it with the checkpoints your SIEM received (the offline check in the operations guide), and tell your security team."
                }
            }
            ChainState::Unanchored => {
                p class="card warning" role="status" {
                    strong { "Unanchored: " }
                    @if let Some(u) = &status.unanchored {
                        (u.rows) " row(s) from row " (u.from_seq) ", chained since " (u.oldest_chained_at)
                        ", are covered by no signed checkpoint."
                    }
                    " The rows verify, but nothing outside the database vouches for them yet: the control plane's checkpoint signing is not running or refused."
                    (checkpoint)
                }
            }
            ChainState::Verified => {
                p class="card" {
                    @match (&status.verified_until, status.last_seq) {
                        (Some(at), Some(seq)) => { "Verified up to " (at) " (row " (seq) ")." }
                        _ => { "Verified." }
                    }
                    (checkpoint)
                }
            }
            ChainState::Chaining => {
                p class="card" { (status.pending) " row(s) are being chained; nothing is verified yet." }
            }
            ChainState::Empty => {
                p class="card" { "Nothing is in the audit log yet." }
            }
        }
    }
}
