//! The control plane against real Postgres: the REST API through HTTP, and `gatehousectl` as
//! the real binary.
//!
//! One test binary (STYLE 6), one module per resource or concern.

// The chart drawing is pure and has its unit tests beside it; the crate's library builds no
// test binary of its own, so they run here.
#[path = "../../src/charts/mod.rs"]
mod charts;

mod api_tokens;
mod audit_anchors;
mod audit_and_activity;
mod audit_chain;
mod budgets;
mod console_admin;
mod console_security;
mod gatehousectl;
mod id_jag;
mod invitations;
mod oauth;
mod passkey_policy;
mod people_and_sessions;
mod policies;
mod rest_api;
mod snapshots;
mod sso;
mod support;
mod tenant_settings;
