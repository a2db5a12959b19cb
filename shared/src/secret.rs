//! Credentials: generation, hashing, and the three kinds that never cross (R20).
//!
//! MCP tokens (`gh_mcp_…`), API tokens (`gh_api_…`) and console session ids (`gh_ses_…`) are
//! shown once and stored as SHA-256 hashes. The prefix tells each endpoint at once whether a
//! credential is of the kind it takes, so it can say which kind it wants.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialKind {
    Mcp,
    Api,
    Session,
    /// The link of an invitation to a tenant.
    Invitation,
}

impl CredentialKind {
    pub fn prefix(self) -> &'static str {
        match self {
            CredentialKind::Mcp => "gh_mcp_",
            CredentialKind::Api => "gh_api_",
            CredentialKind::Session => "gh_ses_",
            CredentialKind::Invitation => "gh_inv_",
        }
    }

    pub fn of(token: &str) -> Option<Self> {
        [
            CredentialKind::Mcp,
            CredentialKind::Api,
            CredentialKind::Session,
            CredentialKind::Invitation,
        ]
        .into_iter()
        .find(|k| token.starts_with(k.prefix()))
    }
}

/// A new secret of the given kind: the prefix and 32 random base32 characters (160 bits).
pub fn generate(kind: CredentialKind) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    let tail: String = bytes.iter().map(|b| ALPHABET[(*b & 31) as usize] as char).collect();
    format!("{}{tail}", kind.prefix())
}

pub fn hash_token(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Whether a presented form token equals the expected one, in time that does not depend on
/// where they first differ: their digests are compared in full.
pub fn tokens_match(presented: &str, expected: &str) -> bool {
    let (a, b) = (Sha256::digest(presented.as_bytes()), Sha256::digest(expected.as_bytes()));
    a.iter().zip(b.iter()).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

pub fn hash_password(password: &str) -> Result<String> {
    let mut salt_bytes = [0u8; 16];
    getrandom::fill(&mut salt_bytes).expect("the OS random source is available");
    let salt = SaltString::encode_b64(&salt_bytes).map_err(|e| Error::Internal(e.to_string()))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| Error::Internal(format!("argon2: {e}")))
}

pub fn verify_password(password: &str, stored: &str) -> bool {
    PasswordHash::new(stored)
        .map(|parsed| Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_tokens_match_only_themselves() {
        let token = generate(CredentialKind::Session);
        assert!(tokens_match(&token, &token));
        assert!(!tokens_match(&token[..token.len() - 1], &token), "a prefix");
        assert!(!tokens_match(&format!("{token}x"), &token), "a longer one");
        assert!(!tokens_match("", &token));
        assert!(!tokens_match(&generate(CredentialKind::Session), &token));
    }

    #[test]
    fn kinds_are_told_apart_by_prefix() {
        let mcp = generate(CredentialKind::Mcp);
        assert_eq!(CredentialKind::of(&mcp), Some(CredentialKind::Mcp));
        assert_eq!(CredentialKind::of(&generate(CredentialKind::Api)), Some(CredentialKind::Api));
        assert_eq!(CredentialKind::of("Bearer something"), None);
        assert_ne!(hash_token(&mcp), hash_token(&generate(CredentialKind::Mcp)));
    }

    #[test]
    fn passwords_verify_only_against_their_hash() {
        let stored = hash_password("correct horse").unwrap();
        assert!(verify_password("correct horse", &stored));
        assert!(!verify_password("wrong horse", &stored));
    }
}
