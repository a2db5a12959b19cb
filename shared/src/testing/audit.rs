//! Testkit: The audit log, its chain and anchors, OAuth and API tokens, and what gatehousectl leaves.
//!
//! Named fixtures and probes for what no service offers a test (aging a row, tampering, reading
//! what only the database shows); raw SQL of tests lives here, never in a test.

#[allow(unused_imports)]
use super::TestDb;
