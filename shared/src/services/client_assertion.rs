//! Client assertions (RFC 7523 `private_key_jwt`): a client whose metadata document names a key
//! set authenticates at the token endpoint with a short-lived JWT signed by one of its keys.
//! ChatGPT's client ID metadata document works this way.
//!
//! This module is only the profile: the issuer and subject are both the client, the audience
//! this server's token endpoint (or its issuer), the lifetime at most ten minutes. Signature,
//! algorithms, key lookup and single use of the `jti` are [`super::jose`]'s, as for every JWT
//! the authorization server verifies.

use serde_json::Value;

use super::jose::{self, Expect, Jti, JtiStore, KeySource, Typ, Verified};

/// The `client_assertion_type` of a JWT client assertion.
pub const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// The signing algorithms accepted, as advertised in the server's metadata.
pub const SIGNING_ALGS: &[&str] = jose::ALGORITHM_NAMES;
/// The longest an assertion may live from now: the `jti` is kept that long.
pub const MAX_LIFETIME_SECS: i64 = 600;

pub use jose::unverified_subject;

/// Verifies a client assertion for `client_id`: signed by a key from `keys`, `iss` = `sub` =
/// the client, an audience among `audiences`, short-lived, its `jti` never seen before.
pub async fn verify<E>(
    assertion: &str,
    client_id: &str,
    audiences: &[String],
    now: i64,
    keys: &impl KeySource<Error = E>,
    jtis: &impl JtiStore<Error = E>,
    refuse: impl Fn(String) -> E,
) -> Result<Verified<Value>, E> {
    let expect = Expect {
        what: "the assertion",
        // RFC 7523 names no typ; its successor draft names client-authentication+jwt. Any
        // other (an ID-JAG, an access token) is a JWT made for something else.
        typ: Typ::AbsentOr(&["JWT", "client-authentication+jwt"]),
        issuer: Some(client_id),
        subject: jose::Subject::Is(client_id),
        audiences,
        max_lifetime_secs: MAX_LIFETIME_SECS,
        jti: Jti::Required,
        now,
    };
    jose::verify(assertion, &expect, keys, jtis, refuse).await
}
