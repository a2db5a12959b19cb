//! Client assertions (RFC 7523 `private_key_jwt`): a client whose metadata document names a key
//! set authenticates at the token endpoint with a short-lived JWT signed by one of its keys.
//! ChatGPT's client ID metadata document works this way.
//!
//! Only asymmetric signatures are accepted (ES256, RS256, PS256), verified with `ring`; `none`
//! and the HMAC algorithms are refused before any key is looked at, so a public key can never
//! be used as an HMAC secret. The issuer and subject must both be the client, the audience this
//! server's token endpoint (or its issuer), the lifetime short; single use of the `jti` is
//! enforced by the caller, in Postgres.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;

/// The `client_assertion_type` of a JWT client assertion.
pub const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// The signing algorithms accepted, as advertised in the server's metadata.
pub const SIGNING_ALGS: &[&str] = &["ES256", "RS256", "PS256"];
/// The longest an assertion may live from now: the `jti` is kept that long.
pub const MAX_LIFETIME_SECS: i64 = 600;
/// Clock difference tolerated between client and server.
const SKEW_SECS: i64 = 60;
/// An assertion is a few hundred bytes; anything far larger is refused unparsed.
const MAX_ASSERTION_BYTES: usize = 16 * 1024;

/// A JSON Web Key Set (RFC 7517), as a client publishes it.
#[derive(Debug, Clone, Deserialize)]
pub struct Jwks {
    pub keys: Vec<Jwk>,
}

/// One public key; private members, if a careless client publishes them, are ignored.
#[derive(Debug, Clone, Deserialize)]
pub struct Jwk {
    pub kty: String,
    #[serde(default)]
    pub kid: Option<String>,
    #[serde(default)]
    pub alg: Option<String>,
    #[serde(default, rename = "use")]
    pub usage: Option<String>,
    #[serde(default)]
    pub crv: Option<String>,
    #[serde(default)]
    pub x: Option<String>,
    #[serde(default)]
    pub y: Option<String>,
    #[serde(default)]
    pub n: Option<String>,
    #[serde(default)]
    pub e: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

/// The claims a verified assertion carries.
#[derive(Debug, Deserialize)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    aud: Audience,
    pub exp: i64,
    #[serde(default)]
    nbf: Option<i64>,
    pub jti: String,
}

/// Why an assertion was refused; the text is the `error_description` of `invalid_client`.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused(pub String);

fn refused(why: impl Into<String>) -> Refused {
    Refused(why.into())
}

fn part<T: serde::de::DeserializeOwned>(b64: &str, what: &str) -> Result<T, Refused> {
    let bytes = URL_SAFE_NO_PAD
        .decode(b64)
        .map_err(|_| refused(format!("the assertion's {what} is not base64url")))?;
    serde_json::from_slice(&bytes)
        .map_err(|_| refused(format!("the assertion's {what} is not a JWT {what}")))
}

fn split(assertion: &str) -> Result<(&str, &str, &str), Refused> {
    if assertion.len() > MAX_ASSERTION_BYTES {
        return Err(refused("the assertion is too large"));
    }
    let mut parts = assertion.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(h), Some(p), Some(s), None) => Ok((h, p, s)),
        _ => Err(refused("the assertion is not a signed JWT (three dot-separated parts)")),
    }
}

/// The subject an assertion names, before it is verified: only to find which client's keys
/// to verify it with (a client may omit `client_id` when it sends an assertion).
pub fn unverified_subject(assertion: &str) -> Option<String> {
    let (_, payload, _) = split(assertion).ok()?;
    #[derive(Deserialize)]
    struct Sub {
        sub: String,
    }
    part::<Sub>(payload, "payload").ok().map(|c| c.sub)
}

/// Whether the assertion names a key the set does not have (the client may have rotated).
pub fn names_unknown_key(assertion: &str, jwks: &Jwks) -> bool {
    let Ok((header, _, _)) = split(assertion) else { return false };
    let Ok(header) = part::<Header>(header, "header") else { return false };
    header.kid.is_some_and(|kid| !jwks.keys.iter().any(|k| k.kid.as_deref() == Some(&kid)))
}

fn b64(field: &Option<String>, name: &str) -> Result<Vec<u8>, Refused> {
    field
        .as_deref()
        .and_then(|v| URL_SAFE_NO_PAD.decode(v).ok())
        .ok_or_else(|| refused(format!("a key of the client's key set has no valid {name}")))
}

/// Verifies the signature with one key, if the key fits the algorithm.
fn verify_with(key: &Jwk, alg: &str, message: &[u8], sig: &[u8]) -> Result<bool, Refused> {
    if key.alg.as_deref().is_some_and(|a| a != alg)
        || key.usage.as_deref().is_some_and(|u| u != "sig")
    {
        return Ok(false);
    }
    match (alg, key.kty.as_str()) {
        ("ES256", "EC") if key.crv.as_deref() == Some("P-256") => {
            let (x, y) = (b64(&key.x, "x")?, b64(&key.y, "y")?);
            if x.len() != 32 || y.len() != 32 {
                return Ok(false);
            }
            let point = [&[0x04][..], &x, &y].concat();
            Ok(UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(message, sig)
                .is_ok())
        }
        ("RS256" | "PS256", "RSA") => {
            let params: &signature::RsaParameters = if alg == "RS256" {
                &signature::RSA_PKCS1_2048_8192_SHA256
            } else {
                &signature::RSA_PSS_2048_8192_SHA256
            };
            let components = RsaPublicKeyComponents { n: b64(&key.n, "n")?, e: b64(&key.e, "e")? };
            Ok(components.verify(params, message, sig).is_ok())
        }
        _ => Ok(false),
    }
}

/// Verifies a client assertion for `client_id` against its key set: signature by one of the
/// keys (by `kid` when the header names one), `iss` = `sub` = the client, an audience among
/// `audiences`, unexpired, not yet valid refused, at most [`MAX_LIFETIME_SECS`] ahead, a `jti`.
pub fn verify(
    assertion: &str,
    jwks: &Jwks,
    client_id: &str,
    audiences: &[String],
    now: i64,
) -> Result<Claims, Refused> {
    let (header_b64, payload_b64, sig_b64) = split(assertion)?;
    let header: Header = part(header_b64, "header")?;
    if !SIGNING_ALGS.contains(&header.alg.as_str()) {
        return Err(refused(format!(
            "the assertion is signed with {:?}; use one of {}",
            header.alg.chars().take(20).collect::<String>(),
            SIGNING_ALGS.join(", ")
        )));
    }
    let sig = URL_SAFE_NO_PAD
        .decode(sig_b64)
        .map_err(|_| refused("the assertion's signature is not base64url"))?;
    let message = format!("{header_b64}.{payload_b64}");
    let mut verified = false;
    for key in jwks.keys.iter().filter(|k| header.kid.is_none() || k.kid == header.kid) {
        if verify_with(key, &header.alg, message.as_bytes(), &sig)? {
            verified = true;
            break;
        }
    }
    if !verified {
        return Err(refused("the assertion's signature matches no key of the client's key set"));
    }
    let claims: Claims = part(payload_b64, "payload")?;
    if claims.iss != client_id || claims.sub != client_id {
        return Err(refused("the assertion's iss and sub must both be the client_id"));
    }
    let audience_ok = match &claims.aud {
        Audience::One(a) => audiences.contains(a),
        Audience::Many(all) => all.iter().any(|a| audiences.contains(a)),
    };
    if !audience_ok {
        return Err(refused(format!(
            "the assertion's aud must be this server's token endpoint ({})",
            audiences.first().map(String::as_str).unwrap_or_default()
        )));
    }
    if claims.exp <= now - SKEW_SECS {
        return Err(refused("the assertion expired; sign a new one"));
    }
    if claims.exp > now + MAX_LIFETIME_SECS + SKEW_SECS {
        return Err(refused(format!(
            "the assertion lives too long; exp may be at most {MAX_LIFETIME_SECS} seconds ahead"
        )));
    }
    if claims.nbf.is_some_and(|nbf| nbf > now + SKEW_SECS) {
        return Err(refused("the assertion is not valid yet (nbf)"));
    }
    if claims.jti.is_empty() || claims.jti.len() > 200 {
        return Err(refused("the assertion needs a jti of 1 to 200 characters"));
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};

    const CLIENT: &str = "https://client.example/oauth/metadata.json";
    const TOKEN: &str = "https://as.example/oauth/token";
    const NOW: i64 = 1_800_000_000;

    fn key() -> (EcdsaKeyPair, Jwk) {
        let rng = SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("pair");
        let point = pair.public_key().as_ref().to_vec();
        let jwk = Jwk {
            kty: "EC".into(),
            kid: Some("k1".into()),
            alg: Some("ES256".into()),
            usage: Some("sig".into()),
            crv: Some("P-256".into()),
            x: Some(URL_SAFE_NO_PAD.encode(&point[1..33])),
            y: Some(URL_SAFE_NO_PAD.encode(&point[33..65])),
            n: None,
            e: None,
        };
        (pair, jwk)
    }

    fn sign(pair: &EcdsaKeyPair, header: serde_json::Value, claims: serde_json::Value) -> String {
        let h = URL_SAFE_NO_PAD.encode(header.to_string());
        let p = URL_SAFE_NO_PAD.encode(claims.to_string());
        let sig = pair.sign(&SystemRandom::new(), format!("{h}.{p}").as_bytes()).expect("sign");
        format!("{h}.{p}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }

    fn claims() -> serde_json::Value {
        serde_json::json!({"iss": CLIENT, "sub": CLIENT, "aud": TOKEN, "exp": NOW + 300, "iat": NOW, "jti": "j-1"})
    }

    fn check(assertion: &str, jwks: &Jwks) -> Result<Claims, Refused> {
        verify(assertion, jwks, CLIENT, &[TOKEN.to_owned()], NOW)
    }

    #[test]
    fn a_signed_assertion_of_the_client_verifies() {
        let (pair, jwk) = key();
        let jwks = Jwks { keys: vec![jwk] };
        let header = serde_json::json!({"alg": "ES256", "kid": "k1", "typ": "JWT"});
        let ok = check(&sign(&pair, header.clone(), claims()), &jwks).expect("verifies");
        assert_eq!(ok.jti, "j-1");
        let mut aud_list = claims();
        aud_list["aud"] = serde_json::json!(["https://other.example", TOKEN]);
        assert!(check(&sign(&pair, header, aud_list), &jwks).is_ok());
        assert_eq!(
            unverified_subject(&sign(&pair, serde_json::json!({"alg": "ES256"}), claims()))
                .as_deref(),
            Some(CLIENT)
        );
    }

    #[test]
    fn hostile_assertions_are_refused() {
        let (pair, jwk) = key();
        let (stranger, _) = key();
        let jwks = Jwks { keys: vec![jwk] };
        let header = serde_json::json!({"alg": "ES256", "kid": "k1"});
        let with = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut c = claims();
            f(&mut c);
            sign(&pair, header.clone(), c)
        };
        let cases: Vec<(&str, String)> = vec![
            ("another key", sign(&stranger, header.clone(), claims())),
            ("expired", with(&|c| c["exp"] = (NOW - 120).into())),
            ("too long-lived", with(&|c| c["exp"] = (NOW + 3600).into())),
            ("not yet valid", with(&|c| c["nbf"] = (NOW + 600).into())),
            ("another audience", with(&|c| c["aud"] = "https://evil.example/token".into())),
            ("another issuer", with(&|c| c["iss"] = "https://evil.example/client".into())),
            ("another subject", with(&|c| c["sub"] = "https://evil.example/client".into())),
            ("no jti", with(&|c| c["jti"] = "".into())),
            (
                "unknown kid",
                sign(&pair, serde_json::json!({"alg": "ES256", "kid": "k9"}), claims()),
            ),
            ("alg none", {
                let h = URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#);
                let p = URL_SAFE_NO_PAD.encode(claims().to_string());
                format!("{h}.{p}.")
            }),
            ("HMAC", sign(&pair, serde_json::json!({"alg": "HS256"}), claims())),
            ("two parts", "a.b".into()),
            ("garbage", "...".into()),
            ("huge", "a".repeat(MAX_ASSERTION_BYTES + 1)),
        ];
        for (name, assertion) in cases {
            assert!(check(&assertion, &jwks).is_err(), "{name} was accepted");
        }
        // A payload changed after signing.
        let good = sign(&pair, header.clone(), claims());
        let parts: Vec<&str> = good.split('.').collect();
        let mut forged = claims();
        forged["jti"] = "j-2".into();
        let tampered =
            format!("{}.{}.{}", parts[0], URL_SAFE_NO_PAD.encode(forged.to_string()), parts[2]);
        assert!(check(&tampered, &jwks).is_err());
        // A key published for encryption is not a signing key.
        let mut enc = jwks.keys[0].clone();
        enc.usage = Some("enc".into());
        assert!(check(&good, &Jwks { keys: vec![enc] }).is_err());
        assert!(names_unknown_key(
            &sign(&pair, serde_json::json!({"alg": "ES256", "kid": "k9"}), claims()),
            &jwks
        ));
        assert!(!names_unknown_key(&good, &jwks));
    }
}
