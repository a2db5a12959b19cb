//! The console's layout: one page shell with its navigation, the stylesheet and the one
//! script, and small form pieces. Pages are maud templates, so every value is escaped by
//! construction; `PreEscaped` wraps only constants written here.

use maud::{Markup, PreEscaped, html};

pub const STYLE: &str = "body{font:15px/1.5 system-ui,sans-serif;margin:0;color:#1d2430;background:#f6f7f9}\
header{background:#1d2430;color:#fff;padding:.6rem 1.5rem;display:flex;flex-wrap:wrap;gap:.5rem 1.5rem;align-items:center}\
header a{color:#dfe6f0;text-decoration:none}header a[aria-current]{color:#fff;font-weight:600}\
header form{margin-left:auto}main{max-width:72rem;margin:1.5rem auto;padding:0 1.5rem}\
table{border-collapse:collapse;width:100%;background:#fff}th,td{text-align:left;padding:.45rem .6rem;border-bottom:1px solid #e3e6ea;vertical-align:top}\
th{font-size:.8rem;text-transform:uppercase;color:#5b6472}.card{background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:1rem 1.25rem;margin:1rem 0}\
label{display:block;margin:.4rem 0}input[type=text],input[type=email],input[type=password],select{padding:.4rem;border:1px solid #b9c0ca;border-radius:4px;min-width:18rem}\
button{padding:.45rem .9rem;border-radius:4px;border:1px solid #2f5bd3;background:#2f5bd3;color:#fff;cursor:pointer}\
button.danger{background:#b42318;border-color:#b42318}button.plain{background:#fff;color:#2f5bd3}\
.error{background:#fdecea;border:1px solid #f5c2bd;padding:.6rem 1rem;border-radius:4px}.warning{background:#fff6e0;border:1px solid #f0d58c;padding:.6rem 1rem;border-radius:4px}.ok{background:#e8f5ec;border:1px solid #b7dfc3;padding:.6rem 1rem;border-radius:4px}\
code,pre{background:#eef1f5;padding:.1rem .3rem;border-radius:3px;font-size:.9em}pre{padding:.6rem;white-space:pre-wrap;word-break:break-all}\
.status-revoked,.status-expired{color:#b42318}.count{font-weight:700}form.inline{display:inline}label.inline{display:inline-block}label.inline select{min-width:0}.approval form{display:inline-block;margin-right:1rem}.status-active{color:#067647}.status-blocked{color:#b42318;font-weight:600}fieldset{border:1px solid #e3e6ea;border-radius:4px}\
.picture{margin:.5rem 0 1rem;background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:.5rem}.picture svg{display:block;width:100%;height:auto}\
.muted{color:#5b6472}.banner{margin:0;padding:.55rem 1.5rem;border-bottom:1px solid}.banner-danger{background:#fdecea;border-color:#f5c2bd;color:#7a1710}.banner-warning{background:#fff6e0;border-color:#f0d58c;color:#5c4300}.banner a{color:inherit;font-weight:600}\
nav.tabs{display:flex;flex-wrap:wrap;gap:.25rem 1rem;border-bottom:1px solid #e3e6ea;margin:0 0 1rem;padding-bottom:.4rem}nav.tabs a[aria-current]{font-weight:700;color:#1d2430}\
.visually-hidden{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap}.pager{margin:1rem 0;display:flex;gap:1rem}.toolbar{display:flex;flex-wrap:wrap;gap:.5rem 1rem;align-items:flex-end;justify-content:space-between;margin:0 0 1rem}\
a.button{display:inline-block;padding:.45rem .9rem;border-radius:4px;background:#2f5bd3;color:#fff;text-decoration:none}.level{display:inline-block;padding:0 .4rem;border-radius:3px;font-size:.85em;border:1px solid #b9c0ca}.level-danger{background:#fdecea;border-color:#f5c2bd;color:#7a1710;font-weight:600}\
.field-error{color:#b42318;display:block;font-size:.9em}[aria-invalid=true]{border-color:#b42318!important;outline:1px solid #b42318}time{text-decoration:underline dotted #b9c0ca}\
.email{border-left:4px solid #2f5bd3;padding:.25rem 1rem;background:#f8f9fb}.email-body{white-space:pre-wrap;background:#fff;border:1px solid #e3e6ea;padding:.6rem;border-radius:4px}\
table.change tr.changed td{background:#fff6e0;font-weight:600}dl{display:grid;grid-template-columns:max-content 1fr;gap:.2rem 1rem}dt{color:#5b6472}dd{margin:0}.filters label{display:inline-block;margin-right:1rem}.filters input[type=text],.filters input[type=search]{min-width:12rem}.filters select{min-width:8rem}.outcome-refused{color:#b42318}";

pub struct Nav<'a> {
    pub current: &'a str,
    pub tenant: Option<&'a str>,
    pub person: &'a str,
    pub csrf: &'a str,
    pub admin: bool,
    /// Holds a right that can approve an agent's action.
    pub approver: bool,
    pub operator: bool,
    /// What the last save said (the page after a redirect shows it once).
    pub notice: Option<&'a str>,
    /// States nobody may miss: agent access off, the global switch, a failing SIEM webhook,
    /// an unanchored or tampered audit log.
    pub banners: &'a [Banner],
}

/// A state shown above every page while it lasts.
#[derive(Debug, Clone)]
pub struct Banner {
    pub danger: bool,
    pub text: String,
    /// Where to act on it.
    pub link: Option<(&'static str, &'static str)>,
}

/// A whole page: the head, the navigation (none before sign-in and on refusals), the title
/// as the page's one `h1`, and the body.
pub fn page(title: &str, nav: Option<&Nav<'_>>, body: Markup) -> Markup {
    html! {
        (PreEscaped("<!doctype html>"))
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width";
                title { (title) " · Gatehouse" }
                link rel="stylesheet" href="/static/console.css";
                script src="/static/console.js" defer {}
                script src="/static/passkeys.js" defer {}
            }
            body {
                header {
                    strong { "Gatehouse" }
                    @if let Some(n) = nav { (navigation(n)) }
                }
                @if let Some(n) = nav {
                    @for b in n.banners {
                        p class={ "banner " (if b.danger { "banner-danger" } else { "banner-warning" }) } role=(if b.danger { "alert" } else { "status" }) {
                            (b.text)
                            @if let Some((href, label)) = b.link { " " a href=(href) { (label) } }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    @if let Some(text) = nav.and_then(|n| n.notice) {
                        p class="ok" role="status" id="notice" { (text) }
                    }
                    (body)
                }
            }
        }
    }
}

/// The links a person's rights open, who is signed in, and the sign-out form.
fn navigation(n: &Nav<'_>) -> Markup {
    let link = |href: &'static str, label: Markup| {
        html! { a href=(href) aria-current=[(n.current == href).then_some("page")] { (label) } }
    };
    html! {
        @if n.approver {
            (link("/approvals", html! {
                "Approvals " span id="approvals-count" class="count" aria-live="polite" {}
            }))
        }
        @if n.admin {
            @for (href, label) in ADMIN_LINKS {
                (link(href, html! { (label) }))
            }
        }
        @if n.operator { (link("/operator", html! { "Operator" })) }
        span {
            a href="/account/passkeys" title="Your passkeys" { (n.person) }
            @if let Some(t) = n.tenant { " · " a href="/tenants" { (t) } }
        }
        form method="post" action="/logout" {
            (csrf_field(n.csrf))
            button class="plain" type="submit" { "Sign out" }
        }
    }
}

/// The pages of a tenant admin, in the navigation's order.
const ADMIN_LINKS: [(&str, &str); 7] = [
    ("/activity", "Activity"),
    ("/connections", "Connections"),
    ("/people", "People"),
    ("/api-tokens", "API tokens"),
    ("/audit", "Audit"),
    ("/messages", "Messages"),
    ("/settings", "Settings"),
];

/// The session's CSRF token, which every console form carries.
pub fn csrf_field(token: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(token); }
}

/// A form of one row of a settings table (a rate limit, a budget, an approval rule) that came
/// back with a mistake: which row (`row`) and what was typed there.
pub struct RowFailed<'a> {
    pub row: String,
    pub entered: Entered<'a>,
}

impl<'a> RowFailed<'a> {
    /// What was typed into the row `row`, when that row's form is the one that failed.
    pub fn of(failed: Option<&'a RowFailed<'a>>, row: &str) -> Option<&'a Entered<'a>> {
        failed.filter(|f| f.row == row).map(|f| &f.entered)
    }
}

/// Whether a service's refusal belongs next to a field (it comes back in place) or on the
/// refusal page (a right, a state, a proof).
pub fn in_place(e: &shared::error::Error) -> bool {
    matches!(e, shared::error::Error::Invalid { .. })
}

/// What a form that failed was given, and why it failed: the page renders the form again with
/// every value kept (secrets excepted: they say they must be typed again), the message next to
/// its field in words, and the field marked invalid for screen readers.
#[derive(Default)]
pub struct Entered<'a> {
    fields: Option<&'a Fields>,
    /// The field at fault (empty when the problem is the form's as a whole) and the message.
    error: Option<(String, String)>,
}

impl<'a> Entered<'a> {
    /// A form shown for the first time.
    pub fn fresh() -> Self {
        Entered::default()
    }

    /// A form that came back with `error`.
    pub fn failed(fields: &'a Fields, error: &shared::error::Error) -> Self {
        let error = match error {
            shared::error::Error::Invalid { field, problem, .. } => {
                (field.clone(), problem.clone())
            }
            other => (String::new(), other.to_string()),
        };
        Entered { fields: Some(fields), error: Some(error) }
    }

    pub fn has_error(&self) -> bool {
        self.error.is_some()
    }

    /// The value typed into `name`, or `default` on a fresh form.
    pub fn value<'b>(&'b self, name: &str, default: &'b str) -> &'b str {
        match self.fields {
            Some(f) => f.get(name).unwrap_or(""),
            None => default,
        }
    }

    /// Whether the checkbox `name=value` is checked: as sent, or `default` on a fresh form.
    pub fn checked(&self, name: &str, value: &str, default: bool) -> bool {
        match self.fields {
            Some(f) => f.all(name).contains(&value),
            None => default,
        }
    }

    fn error_of(&self, name: &str) -> Option<&str> {
        self.error.as_ref().filter(|(f, _)| f == name).map(|(_, m)| m.as_str())
    }

    /// `aria-invalid` of the field `name`.
    pub fn invalid(&self, name: &str) -> Option<&'static str> {
        self.error_of(name).map(|_| "true")
    }

    /// `aria-describedby` of the field `name`: its message, when it has one.
    pub fn described(&self, name: &str) -> Option<String> {
        self.error_of(name).map(|_| format!("{name}-error"))
    }

    /// The message next to the field `name`.
    pub fn message(&self, name: &str) -> Markup {
        html! {
            @if let Some(m) = self.error_of(name) {
                span class="field-error" id={ (name) "-error" } { (m) }
            }
        }
    }

    /// Above the form: that nothing was saved, and the problem itself when no field of the
    /// form (`fields`) holds it.
    pub fn summary(&self, fields: &[&str]) -> Markup {
        html! {
            @if let Some((field, message)) = &self.error {
                p class="error" role="alert" {
                    "Nothing was saved. "
                    @if fields.contains(&field.as_str()) { "Correct the field marked below." }
                    @else { (message) }
                }
            }
        }
    }
}

/// A search box of a list's filter form (`q`).
pub fn search_field(value: Option<&str>, placeholder: &str) -> Markup {
    html! {
        label { "Search " input type="search" name="q" value=[value] placeholder=(placeholder) maxlength="200"; }
    }
}

/// A select of a list's filter form, "any" first.
pub fn select_filter(
    name: &str,
    label: &str,
    options: &[(&str, &str)],
    current: Option<&str>,
) -> Markup {
    html! {
        label {
            (label) " "
            select name=(name) {
                option value="" { "any" }
                @for (value, shown) in options {
                    option value=(value) selected[current == Some(*value)] { (shown) }
                }
            }
        }
    }
}

/// The link to a list's next page: the same search with the cursor the last page gave, and
/// a way back to the first.
pub fn pager(
    path: &str,
    query: &std::collections::BTreeMap<String, String>,
    next: Option<&str>,
) -> Markup {
    let with = |cursor: Option<&str>| {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in query {
            if k != "cursor" && !v.is_empty() {
                q.append_pair(k, v);
            }
        }
        if let Some(c) = cursor {
            q.append_pair("cursor", c);
        }
        let q = q.finish();
        if q.is_empty() { path.to_owned() } else { format!("{path}?{q}") }
    };
    html! {
        nav class="pager" aria-label="Pages" {
            @if query.contains_key("cursor") { a href=(with(None)) { "First page" } }
            @if let Some(c) = next { a rel="next" href=(with(Some(c))) { "Next page" } }
        }
    }
}

pub fn error_box(message: &str) -> Markup {
    html! { p class="error" role="alert" { (message) } }
}

/// The console's only script: copy buttons (`data-copy="<element id>"`) and the approvals
/// count. Served from the console's own origin so the Content-Security-Policy needs no inline
/// script.
pub const SCRIPT: &str = "document.addEventListener('click', (e) => {\n  const b = e.target.closest('[data-copy]');\n  if (b) { navigator.clipboard.writeText(document.getElementById(b.dataset.copy).textContent); }\n});\n\
// The navigation's count of actions waiting for approval, kept fresh without a reload.\n\
async function approvalsCount() {\n  const el = document.getElementById('approvals-count');\n  if (!el) return;\n\
  try { const r = await fetch('/approvals/count', {credentials: 'same-origin'}); if (r.ok) { const n = (await r.json()).count; el.textContent = n > 0 ? `(${n})` : ''; } } catch (_) {}\n}\n\
approvalsCount();\nsetInterval(approvalsCount, 5000);\n";

/// A posted form's fields, in the order sent. A field named twice reads as its last value,
/// except through [`Fields::all`].
pub struct Fields(pub(super) Vec<(String, String)>);

impl Fields {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// Every value of a field that may repeat (checkboxes).
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.0.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_str()).collect()
    }
}
