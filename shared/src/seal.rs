//! Sealed values (AEAD): what a server hands a client to carry and must get back unaltered,
//! such as the `requestState` of a multi round-trip tool call (MCP 2026-07-28, MRTR). The
//! client can neither read nor change it: ChaCha20-Poly1305 from `ring`, a fresh random nonce
//! per seal, and the key id bound as associated data. Keys come from configuration as
//! `kid:base64url-32-bytes` pairs, the first sealing and every one opening, so a key is rotated
//! by putting a new one first and dropping the old one after the longest state lifetime.
//!
//! Sealing proves origin and integrity only; single use and expiry are the caller's (the
//! pending action row is the single use, on the server).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// The prefix of every sealed value, naming the format.
const FORMAT: &str = "gs1";

/// The keys that seal and open values; the first one seals.
pub struct SealKeys {
    keys: Vec<(String, LessSafeKey)>,
    rng: SystemRandom,
}

impl std::fmt::Debug for SealKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Key ids only, never key material.
        f.debug_struct("SealKeys")
            .field("kids", &self.keys.iter().map(|k| &k.0).collect::<Vec<_>>())
            .finish()
    }
}

impl SealKeys {
    /// Parses `kid:key[,kid:key…]`, each key 32 bytes in base64url. Key ids are short
    /// alphanumerics (they travel in every sealed value).
    pub fn parse(spec: &str) -> Result<SealKeys, String> {
        let mut keys = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            // Errors name the entry by position, never its text: it may hold key material.
            let n = keys.len() + 1;
            let (kid, key) = part
                .split_once(':')
                .ok_or_else(|| format!("entry {n}: write kid:base64url-key"))?;
            if kid.is_empty() || kid.len() > 16 || !kid.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Err(format!("entry {n}: the key id must be 1 to 16 letters or digits"));
            }
            let bytes = URL_SAFE_NO_PAD
                .decode(key.trim_end_matches('='))
                .map_err(|_| format!("key {kid}: not base64url"))?;
            let unbound = UnboundKey::new(&CHACHA20_POLY1305, &bytes)
                .map_err(|_| format!("key {kid}: must be 32 bytes"))?;
            if keys.iter().any(|(k, _)| k == kid) {
                return Err(format!("key id {kid} appears twice"));
            }
            keys.push((kid.to_owned(), LessSafeKey::new(unbound)));
        }
        if keys.is_empty() {
            return Err("no keys given".into());
        }
        Ok(SealKeys { keys, rng: SystemRandom::new() })
    }

    /// A fresh key specification (`kid:key`), for development stacks and tests.
    pub fn generate(kid: &str) -> String {
        let mut key = [0u8; 32];
        SystemRandom::new().fill(&mut key).expect("the system's random source");
        format!("{kid}:{}", URL_SAFE_NO_PAD.encode(key))
    }

    /// Seals `plaintext` for `purpose` with the current key: `gs1.<kid>.<nonce+ciphertext+tag>`.
    /// The purpose is bound as associated data, so a value sealed for one use never opens as
    /// another even under the same keys.
    pub fn seal(&self, purpose: &str, plaintext: &[u8]) -> Result<String, String> {
        let (kid, key) = &self.keys[0];
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| "no randomness".to_owned())?;
        let mut sealed = plaintext.to_vec();
        let aad = format!("{purpose}\0{kid}");
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad.as_bytes()),
            &mut sealed,
        )
        .map_err(|_| "sealing failed".to_owned())?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(format!("{FORMAT}.{kid}.{}", URL_SAFE_NO_PAD.encode(out)))
    }

    /// Opens a sealed value; `None` when it is not one of ours, names an unknown key, or was
    /// changed in any way.
    pub fn open(&self, purpose: &str, sealed: &str) -> Option<Vec<u8>> {
        if sealed.len() > 8192 {
            return None;
        }
        let mut parts = sealed.splitn(3, '.');
        let (format, kid, body) = (parts.next()?, parts.next()?, parts.next()?);
        if format != FORMAT {
            return None;
        }
        let (_, key) = self.keys.iter().find(|(k, _)| k == kid)?;
        let bytes = URL_SAFE_NO_PAD.decode(body).ok()?;
        if bytes.len() < NONCE_LEN {
            return None;
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buffer = ciphertext.to_vec();
        let aad = format!("{purpose}\0{kid}");
        let plain = key.open_in_place(nonce, Aad::from(aad.as_bytes()), &mut buffer).ok()?;
        Some(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_only_unchanged_and_with_a_known_key() {
        let keys = SealKeys::parse(&SealKeys::generate("k1")).expect("keys");
        let sealed = keys.seal("t", b"{\"action\":\"pac_1\"}").expect("seal");
        assert_eq!(keys.open("t", &sealed).as_deref(), Some(&b"{\"action\":\"pac_1\"}"[..]));
        assert_ne!(sealed, keys.seal("t", b"{\"action\":\"pac_1\"}").expect("seal"), "fresh nonce");
        // Any change to any part, another format, another key id, another key: refused.
        let body = sealed.rsplit('.').next().expect("body").to_owned();
        let mut flipped = URL_SAFE_NO_PAD.decode(&body).expect("b64");
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        for forged in [
            format!("gs1.k1.{}", URL_SAFE_NO_PAD.encode(&flipped)),
            sealed.replacen("gs1.", "gs2.", 1),
            sealed.replacen(".k1.", ".k2.", 1),
            "gs1.k1.".to_owned(),
            "not sealed".to_owned(),
            format!("gs1.k1.{}", "A".repeat(9000)),
        ] {
            assert!(keys.open("t", &forged).is_none(), "{forged}");
        }
        let stranger = SealKeys::parse(&SealKeys::generate("k1")).expect("keys");
        assert!(stranger.open("t", &sealed).is_none(), "another key with the same id");
        assert!(keys.open("another purpose", &sealed).is_none(), "sealed for another purpose");
        // Rotation: a new key first seals; the old one still opens what it sealed.
        let old_spec = format!("k1:{}", URL_SAFE_NO_PAD.encode([7u8; 32]));
        let old = SealKeys::parse(&old_spec).expect("old");
        let rotated =
            SealKeys::parse(&format!("{},{old_spec}", SealKeys::generate("k2"))).expect("rotated");
        let by_old = old.seal("t", b"x").expect("seal");
        assert_eq!(rotated.open("t", &by_old).as_deref(), Some(&b"x"[..]));
        assert!(rotated.seal("t", b"x").expect("seal").starts_with("gs1.k2."));
        let twice = format!("{old_spec},{old_spec}");
        for bad in ["", "k1", "k1:short", &old_spec.replacen("k1", "k!", 1), &twice] {
            assert!(SealKeys::parse(bad).is_err(), "{bad:?}");
        }
    }
}
