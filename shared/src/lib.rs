//! The library every Gatehouse binary uses: domain types, the rights catalog, the operation
//! context, the datastore and the domain services. See `docs/architecture.md`.

pub mod auth;
pub mod bus;
pub mod canon;
pub mod config;
pub mod ctx;
mod cursor;
mod datastore;
pub mod effect;
pub mod error;
pub mod handle;
#[cfg(test)]
mod house;
pub mod input;
pub mod money;
pub mod policies;
pub mod rights;
pub mod seal;
mod sealed;
pub mod secret;
pub mod services;
pub mod signing;
pub mod telemetry;
pub mod text;
pub mod time;
pub mod views;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use ctx::OpCtx;
pub use datastore::{Policy, Pooling, SECOND_CONNECTION_LOGGED, Services};
pub use error::{Error, Result};
