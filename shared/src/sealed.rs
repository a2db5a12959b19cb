//! What an adapter cannot write (R2, R5, STYLE 11–12), proven by the compiler: each snippet
//! below is an adapter's attempt and must fail to compile (`cargo test -p shared --doc`). A
//! change that lets one compile makes that doctest fail. Stable rustdoc does not check the
//! error codes named, so every snippet is typed correctly: privacy is its only error.
//!
//! Reaching the datastore module:
//! ```compile_fail,E0603
//! let _ = shared::datastore::booking_get_sql();
//! ```
//!
//! Calling a datastore function on the services handle:
//! ```compile_fail,E0624
//! async fn f(svc: &shared::Services, ctx: &shared::OpCtx, h: &shared::handle::CustomerHandle) {
//!     let _ = svc.customer_get(ctx, h).await;
//! }
//! ```
//!
//! Taking the pool:
//! ```compile_fail,E0624
//! fn f(svc: &shared::Services) {
//!     let _ = svc.pool();
//! }
//! ```
//!
//! Assembling a context with every right:
//! ```compile_fail,E0451
//! fn f(tenant: shared::ctx::TenantRef) -> shared::OpCtx {
//!     shared::OpCtx {
//!         actor: shared::ctx::Actor::Nobody,
//!         tenant,
//!         rights: shared::rights::RightSet::of(shared::rights::Right::ALL),
//!         channel: shared::ctx::Channel::Mcp,
//!         connection: None,
//!         request_id: String::new(),
//!     }
//! }
//! ```
//!
//! Building a connection's context without its token:
//! ```compile_fail,E0624
//! fn f(tenant: shared::ctx::TenantRef, c: shared::ctx::ConnectionRef) -> shared::OpCtx {
//!     let all = shared::rights::RightSet::of(shared::rights::Right::ALL);
//!     let who = (1, shared::handle::PersonHandle::generate());
//!     shared::OpCtx::for_connection(who, tenant, all, all, c)
//! }
//! ```
//!
//! Making up an operator, or a background job:
//! ```compile_fail,E0624
//! fn f() -> shared::ctx::Operator {
//!     let who = shared::handle::PersonHandle::generate();
//!     shared::ctx::Operator::verified(1, who, "x@example.net".into(), shared::ctx::Channel::Cli)
//! }
//! ```
//! ```compile_fail,E0624
//! fn f(tenant: shared::ctx::TenantRef) -> shared::OpCtx {
//!     shared::OpCtx::for_job("mine", tenant, shared::rights::Right::ALL)
//! }
//! ```
//!
//! Forging a console session (its person, tenant and role), or naming the row it is read from:
//! ```compile_fail,E0603
//! fn f() -> Option<shared::OpCtx> {
//!     let row: shared::services::console::SessionRow = todo!();
//!     None
//! }
//! ```
//! ```compile_fail,E0451
//! fn f(real: shared::services::console::ConsoleSession) -> shared::services::console::ConsoleSession {
//!     shared::services::console::ConsoleSession { row: todo!() }
//! }
//! ```
//!
//! The same calls through the public doors compile (so the snippets above fail for the reason
//! they name, not a typo):
//! ```no_run
//! async fn f(svc: &shared::Services, ctx: &shared::OpCtx) -> shared::Result<()> {
//!     let input = shared::services::customers::GetCustomerInput { customer: "cus_x".into() };
//!     shared::services::customers::get(svc, ctx, &input).await?;
//!     let op = shared::services::operators::authenticate(svc, "x@example.net", shared::ctx::Channel::Cli).await?;
//!     let _ = shared::OpCtx::for_operator(&op, ctx.tenant().clone());
//!     Ok(())
//! }
//! ```
