//! Gatehouse as users meet it: real binaries, two workers behind nginx, real Postgres, and the
//! official MCP Python SDK connecting through the load balancer in both protocol eras.
//!
//! One test binary (STYLE 6), one module per concern.

mod approvals;
mod audit_webhook;
mod bench;
mod clients;
mod console;
mod failover;
mod fleet;
mod identity;
mod listen;
mod logs;
mod oauth;
mod policies;
mod sso;
mod support;
mod tasks;
mod traces;
mod writes;
