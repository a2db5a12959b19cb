//! The Ed25519 keys that sign the audit log's checkpoints, and the public keys that check them:
//! pure cryptography and parsing, no I/O, so the store and the audit service both build on it.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

/// The Ed25519 keys that sign checkpoints (`GATEHOUSE_AUDIT_SIGNING_KEYS`,
/// `kid:base64url-32-byte-seed[,…]`): the first signs, every one is published, so a key is
/// rotated by putting a new one first. A key taken out of signing for good is listed by its
/// public half alone in `GATEHOUSE_AUDIT_RETIRED_KEYS` (`kid:base64url-public-key[,…]`) and
/// stays verifiable.
pub struct SigningKeys {
    keys: Vec<(String, Ed25519KeyPair)>,
    retired: Vec<PublicKey>,
}

impl std::fmt::Debug for SigningKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKeys")
            .field("kids", &self.keys.iter().map(|k| &k.0).collect::<Vec<_>>())
            .finish()
    }
}

/// Where a public key stands.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum KeyStatus {
    /// Signs new checkpoints.
    Signing,
    /// Listed beside the signing key (a rotation in progress).
    #[default]
    Published,
    /// Signs nothing any more; verifies what it signed.
    Retired,
}

/// A public key that checks checkpoints.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PublicKey {
    pub kid: String,
    /// The raw 32-byte Ed25519 public key, base64url without padding.
    pub public_key: String,
    #[serde(default)]
    pub status: KeyStatus,
}

impl PublicKey {
    /// Parses `kid:base64url-public-key`.
    pub fn parse(spec: &str) -> std::result::Result<PublicKey, String> {
        let (kid, key) = spec.split_once(':').ok_or("write kid:base64url-public-key")?;
        let bytes = URL_SAFE_NO_PAD
            .decode(key.trim().trim_end_matches('='))
            .map_err(|_| format!("key {kid}: not base64url"))?;
        if bytes.len() != 32 {
            return Err(format!("key {kid}: an Ed25519 public key is 32 bytes"));
        }
        Ok(PublicKey {
            kid: kid.trim().to_owned(),
            public_key: URL_SAFE_NO_PAD.encode(bytes),
            status: KeyStatus::Published,
        })
    }

    /// Parses a published key set (`/.well-known/gatehouse-audit-keys`, `audit keys --json`).
    pub fn parse_set(json: &str) -> std::result::Result<Vec<PublicKey>, String> {
        #[derive(Deserialize)]
        struct Set {
            keys: Vec<PublicKey>,
        }
        let set: Set = serde_json::from_str(json).map_err(|e| {
            format!("not a key set ({{\"keys\": [{{\"kid\", \"public_key\"}}]}}): {e}")
        })?;
        set.keys
            .iter()
            .map(|k| {
                PublicKey::parse(&format!("{}:{}", k.kid, k.public_key))
                    .map(|p| PublicKey { status: k.status, ..p })
            })
            .collect()
    }

    pub(crate) fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        URL_SAFE_NO_PAD.decode(&self.public_key).is_ok_and(|raw| {
            UnparsedPublicKey::new(&ED25519, raw).verify(message, signature).is_ok()
        })
    }
}

impl SigningKeys {
    pub fn parse(spec: &str) -> std::result::Result<SigningKeys, String> {
        let mut keys: Vec<(String, Ed25519KeyPair)> = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let n = keys.len() + 1;
            let (kid, seed) = part
                .split_once(':')
                .ok_or_else(|| format!("entry {n}: write kid:base64url-32-byte-seed"))?;
            if kid.is_empty() || kid.len() > 16 || !kid.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Err(format!("entry {n}: the key id must be 1 to 16 letters or digits"));
            }
            let seed = URL_SAFE_NO_PAD
                .decode(seed.trim_end_matches('='))
                .map_err(|_| format!("key {kid}: not base64url"))?;
            let pair = Ed25519KeyPair::from_seed_unchecked(&seed)
                .map_err(|_| format!("key {kid}: the seed must be 32 bytes"))?;
            if keys.iter().any(|(k, _)| k == kid) {
                return Err(format!("key id {kid} appears twice"));
            }
            keys.push((kid.to_owned(), pair));
        }
        if keys.is_empty() {
            return Err("no keys given".into());
        }
        Ok(SigningKeys { keys, retired: Vec::new() })
    }

    /// With public keys that signed once and sign no more (`GATEHOUSE_AUDIT_RETIRED_KEYS`).
    pub fn with_retired(mut self, spec: &str) -> std::result::Result<SigningKeys, String> {
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let key = PublicKey::parse(part)?;
            if self.keys.iter().any(|(k, _)| *k == key.kid) {
                return Err(format!("key id {} is both signing and retired", key.kid));
            }
            self.retired.push(PublicKey { status: KeyStatus::Retired, ..key });
        }
        Ok(self)
    }

    /// A fresh key specification (`kid:seed`), for development stacks and tests.
    pub fn generate(kid: &str) -> String {
        let mut seed = [0u8; 32];
        SystemRandom::new().fill(&mut seed).expect("the system's random source");
        format!("{kid}:{}", URL_SAFE_NO_PAD.encode(seed))
    }

    /// Every key that verifies: the signing one first, then the others, then retired ones.
    pub fn public_keys(&self) -> Vec<PublicKey> {
        self.keys
            .iter()
            .enumerate()
            .map(|(i, (kid, pair))| PublicKey {
                kid: kid.clone(),
                public_key: URL_SAFE_NO_PAD.encode(pair.public_key().as_ref()),
                status: if i == 0 { KeyStatus::Signing } else { KeyStatus::Published },
            })
            .chain(self.retired.iter().cloned())
            .collect()
    }

    /// The id of the key that signs.
    pub(crate) fn signing_kid(&self) -> &str {
        &self.keys[0].0
    }

    pub(crate) fn sign(&self, message: &[u8]) -> (String, Vec<u8>) {
        let (kid, pair) = &self.keys[0];
        (kid.clone(), pair.sign(message).as_ref().to_vec())
    }
}
