//! Every JWT the authorization server verifies goes through [`verify`]: client assertions
//! (RFC 7523 `private_key_jwt`) today, and any other signed assertion a tenant's identity
//! provider sends. The signature itself is checked by one kept JOSE crate (`jsonwebtoken`, on
//! its RustCrypto backend); this module owns the policy around it, in one place:
//!
//! - **Algorithms**: only the asymmetric ones in [`ALGORITHMS`]. `none` and the HMAC family
//!   are refused before any key is looked at, and symmetric keys are never loaded, so a
//!   public key can never serve as an HMAC secret.
//! - **Keys**: found by the header's `kid` among keys whose type, curve, `use` and `alg` fit
//!   the algorithm (RSA moduli under 2048 bits are not loaded). A `kid` the set lacks may cause
//!   one refetch, but only when the key source allows one ([`KeySource::may_refresh`]), so
//!   a flood of forged `kid`s cannot make the server fetch on every request.
//! - **Claims**: the `typ`s the profile accepts, issuer, subject, an audience among ours,
//!   unexpired (with a minute of skew), not valid later (`nbf`), at most `max_lifetime_secs`
//!   ahead, and (when the profile requires one, [`Jti`]) a `jti` of 1 to 200 characters used
//!   once ([`JtiStore`], in Postgres).
//!
//! Every refusal is a sentence for the `error_description` that says what to change.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Header, Validation};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The signing algorithms accepted, in the order the server's metadata advertises them.
pub const ALGORITHMS: &[Algorithm] = &[Algorithm::ES256, Algorithm::RS256, Algorithm::PS256];
/// The same, as the names metadata documents use.
pub const ALGORITHM_NAMES: &[&str] = &["ES256", "RS256", "PS256"];
/// Clock difference tolerated between the signer and this server.
pub const SKEW_SECS: i64 = 60;
/// A JWT is a few hundred bytes; anything far larger is refused unparsed.
pub const MAX_JWT_BYTES: usize = 16 * 1024;
/// RSA keys shorter than this are not loaded (RFC 7518 §3.3 asks for 2048 bits or more).
const MIN_RSA_MODULUS_BITS: usize = 2048;

/// The length in bits of a big-endian unsigned integer.
fn modulus_bits(n: &[u8]) -> usize {
    let n: Vec<u8> = n.iter().copied().skip_while(|b| *b == 0).collect();
    n.first().map_or(0, |top| n.len() * 8 - top.leading_zeros() as usize)
}

/// Why a JWT was refused: a sentence for the client.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused(pub String);

fn refused(why: impl Into<String>) -> Refused {
    Refused(why.into())
}

/// A JSON Web Key Set (RFC 7517), as a client or identity provider publishes it. Keys this
/// server cannot or will not use (symmetric, encryption, unknown types) are skipped, so one
/// odd key does not make a whole set unusable.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    keys: Vec<Jwk>,
}

impl KeySet {
    /// Reads `{"keys": [...]}`; `None` when the value is not a key set, or holds no key that
    /// could verify one of [`ALGORITHMS`] (so a client learns it when it publishes the set,
    /// not at its first token request).
    pub fn parse(value: &Value) -> Option<KeySet> {
        let keys = value.get("keys")?.as_array()?;
        let keys: Vec<Jwk> = keys
            .iter()
            .filter_map(|k| serde_json::from_value::<Jwk>(k.clone()).ok())
            .filter(|k| ALGORITHMS.iter().any(|alg| fits(k, *alg)))
            .collect();
        (!keys.is_empty()).then_some(KeySet { keys })
    }

    /// Whether the set has a key with this id.
    pub fn has_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.common.key_id.as_deref() == Some(kid))
    }

    /// The keys that may verify `alg`, by `kid` when the header names one.
    fn candidates(&self, alg: Algorithm, kid: Option<&str>) -> Vec<DecodingKey> {
        self.keys
            .iter()
            .filter(|k| kid.is_none() || k.common.key_id.as_deref() == kid)
            .filter(|k| fits(k, alg))
            .filter_map(|k| DecodingKey::from_jwk(k).ok())
            .collect()
    }
}

/// Whether a key may verify `alg`: its type and curve fit, it is not published for
/// encryption, any `alg` it names is this one, and an RSA modulus is long enough.
fn fits(key: &Jwk, alg: Algorithm) -> bool {
    if key.common.public_key_use.as_ref().is_some_and(|u| *u != PublicKeyUse::Signature) {
        return false;
    }
    if let Some(named) = key.common.key_algorithm
        && !same_algorithm(named, alg)
    {
        return false;
    }
    match (&key.algorithm, alg) {
        (AlgorithmParameters::EllipticCurve(p), Algorithm::ES256) => p.curve == EllipticCurve::P256,
        (AlgorithmParameters::RSA(p), Algorithm::RS256 | Algorithm::PS256) => {
            use base64::Engine;
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p.n.trim_end_matches('='))
                .is_ok_and(|n| modulus_bits(&n) >= MIN_RSA_MODULUS_BITS)
        }
        _ => false,
    }
}

fn same_algorithm(named: KeyAlgorithm, alg: Algorithm) -> bool {
    matches!(
        (named, alg),
        (KeyAlgorithm::ES256, Algorithm::ES256)
            | (KeyAlgorithm::RS256, Algorithm::RS256)
            | (KeyAlgorithm::PS256, Algorithm::PS256)
    )
}

/// Which `typ` headers a profile accepts, so a JWT minted for one profile (an ID-JAG, an
/// access token) is never taken as another.
#[derive(Debug, Clone, Copy)]
pub enum Typ<'a> {
    /// Exactly this one (`oauth-id-jag+jwt`).
    Required(&'a str),
    /// None, or one of these (profiles older than explicit typing, such as RFC 7523).
    AbsentOr(&'a [&'a str]),
}

/// Whether a profile needs a `jti`, and so keeps single use through [`JtiStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jti {
    /// A `jti` of 1 to 200 characters, used once (assertions, ID-JAGs, logout tokens).
    Required,
    /// None needed: the caller carries single use another way (an ID token's `nonce`, which
    /// the sign-in row holds and consumes once). A `jti` present is still length-checked.
    NotRequired,
}

/// The `sub` a profile needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subject<'a> {
    /// Any subject, but one is required.
    Required,
    /// Exactly this subject.
    Is(&'a str),
    /// None needed (a back-channel logout token names `sub`, `sid` or both); an absent `sub`
    /// reads as the empty string.
    Optional,
}

/// What a verified JWT must say, beyond its signature.
pub struct Expect<'a> {
    /// What the JWT is, for refusals ("the assertion", "the ID-JAG").
    pub what: &'a str,
    /// The `typ` header values the profile accepts (compared without case).
    pub typ: Typ<'a>,
    /// The only issuer accepted, if the profile fixes one.
    pub issuer: Option<&'a str>,
    /// Which `sub` the profile needs.
    pub subject: Subject<'a>,
    /// This server's names; the JWT's `aud` must include one.
    pub audiences: &'a [String],
    /// How far ahead `exp` may lie: single use of the `jti` is kept that long.
    pub max_lifetime_secs: i64,
    /// Whether a `jti` is required and recorded.
    pub jti: Jti,
    /// The current time, in seconds since the epoch.
    pub now: i64,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

/// The registered claims every verified JWT has.
#[derive(Debug, Deserialize)]
pub struct Registered {
    pub iss: String,
    /// Empty when absent, which only [`Subject::Optional`] accepts.
    #[serde(default)]
    pub sub: String,
    aud: Audience,
    pub exp: i64,
    #[serde(default)]
    nbf: Option<i64>,
    #[serde(default)]
    pub jti: Option<String>,
}

/// A verified JWT: its registered claims, the profile's own claims, and the key that signed.
#[derive(Debug)]
pub struct Verified<C> {
    pub registered: Registered,
    pub claims: C,
    pub kid: Option<String>,
}

/// Where a JWT's verification keys come from.
pub trait KeySource {
    type Error;
    /// The keys as known (cached), or fetched anew with `refresh`.
    fn keys(&self, refresh: bool) -> impl Future<Output = Result<KeySet, Self::Error>>;
    /// Whether a refetch for an unknown `kid` is allowed now.
    fn may_refresh(&self) -> bool;
}

/// Where used `jti`s are remembered until their JWT expires.
pub trait JtiStore {
    type Error;
    /// Records the `jti` of `issuer`; `false` when it was used already.
    fn first_use(
        &self,
        issuer: &str,
        jti: &str,
        expires: i64,
    ) -> impl Future<Output = Result<bool, Self::Error>>;
}

/// Splits off what can be read before any key is looked at: the size, the three parts, the
/// header and its algorithm.
fn header_of(jwt: &str, what: &str) -> Result<Header, Refused> {
    if jwt.len() > MAX_JWT_BYTES {
        return Err(refused(format!("{what} is too large")));
    }
    if jwt.split('.').count() != 3 {
        return Err(refused(format!("{what} is not a signed JWT (three dot-separated parts)")));
    }
    // The header's `alg` is parsed into the crate's closed list first: `none` and unknown
    // names never get further than this.
    let header = jsonwebtoken::decode_header(jwt).map_err(|_| {
        refused(format!(
            "{what} has no readable header or names an algorithm outside {}",
            ALGORITHM_NAMES.join(", ")
        ))
    })?;
    if !ALGORITHMS.contains(&header.alg) {
        return Err(refused(format!(
            "{what} is signed with {:?}; use one of {}",
            header.alg,
            ALGORITHM_NAMES.join(", ")
        )));
    }
    Ok(header)
}

/// The subject a JWT names, before it is verified: only to find whose keys to verify it with
/// (a client may omit `client_id` when it sends an assertion).
pub fn unverified_subject(jwt: &str) -> Option<String> {
    if jwt.len() > MAX_JWT_BYTES {
        return None;
    }
    #[derive(Deserialize)]
    struct Sub {
        sub: String,
    }
    jsonwebtoken::dangerous::insecure_decode_claims::<Sub>(jwt).ok().map(|c| c.sub)
}

/// The issuer a JWT names, before it is verified: only to find whose keys to verify it with
/// (an ID-JAG or a logout token names the identity provider that signed it).
pub fn unverified_issuer(jwt: &str) -> Option<String> {
    if jwt.len() > MAX_JWT_BYTES {
        return None;
    }
    #[derive(Deserialize)]
    struct Iss {
        iss: String,
    }
    jsonwebtoken::dangerous::insecure_decode_claims::<Iss>(jwt).ok().map(|c| c.iss)
}

/// Checks the signature with the given keys and then every claim `expect` names; no key
/// fetching and no `jti` bookkeeping (see [`verify`]).
pub fn verify_with<C: DeserializeOwned>(
    jwt: &str,
    keys: &KeySet,
    expect: &Expect<'_>,
) -> Result<Verified<C>, Refused> {
    let what = expect.what;
    let header = header_of(jwt, what)?;
    match (expect.typ, header.typ.as_deref()) {
        (Typ::Required(want), got) if !got.is_some_and(|t| t.eq_ignore_ascii_case(want)) => {
            return Err(refused(format!("{what} must have the header typ {want}")));
        }
        (Typ::AbsentOr(allowed), Some(got))
            if !allowed.iter().any(|a| a.eq_ignore_ascii_case(got)) =>
        {
            return Err(refused(format!(
                "{what} has the header typ {:?}, which is another kind of JWT; use {} or leave typ out",
                got.chars().take(40).collect::<String>(),
                allowed.join(" or ")
            )));
        }
        _ => {}
    }
    let mut validation = Validation::new(header.alg);
    // The claims are checked below, against the caller's clock and with sentences that say
    // what to change; the crate checks the algorithm and the signature.
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    let payload = keys
        .candidates(header.alg, header.kid.as_deref())
        .iter()
        .find_map(|key| jsonwebtoken::decode::<Value>(jwt, key, &validation).ok())
        .ok_or_else(|| {
            refused(format!("{what}'s signature matches no key of the issuer's key set"))
        })?
        .claims;
    let needs = || {
        let sub = if expect.subject == Subject::Optional { "" } else { " sub," };
        let jti = if expect.jti == Jti::Required { " and jti" } else { "" };
        refused(format!("{what} needs the claims iss,{sub} aud, exp{jti}"))
    };
    let registered: Registered = serde_json::from_value(payload.clone()).map_err(|_| needs())?;
    if registered.sub.is_empty() && expect.subject != Subject::Optional {
        return Err(needs());
    }
    if let Some(iss) = expect.issuer
        && registered.iss != iss
    {
        return Err(refused(format!("{what}'s iss must be {iss}")));
    }
    if let Subject::Is(sub) = expect.subject
        && registered.sub != sub
    {
        return Err(refused(format!("{what}'s sub must be {sub}")));
    }
    let audience_ok = match &registered.aud {
        Audience::One(a) => expect.audiences.contains(a),
        Audience::Many(all) => all.iter().any(|a| expect.audiences.contains(a)),
    };
    if !audience_ok {
        return Err(refused(format!(
            "{what}'s aud must be this server ({})",
            expect.audiences.first().map(String::as_str).unwrap_or_default()
        )));
    }
    let now = expect.now;
    if registered.exp <= now - SKEW_SECS {
        return Err(refused(format!("{what} expired; sign a new one")));
    }
    if registered.exp > now + expect.max_lifetime_secs + SKEW_SECS {
        return Err(refused(format!(
            "{what} lives too long; exp may be at most {} seconds ahead",
            expect.max_lifetime_secs
        )));
    }
    if registered.nbf.is_some_and(|nbf| nbf > now + SKEW_SECS) {
        return Err(refused(format!("{what} is not valid yet (nbf)")));
    }
    let jti_ok = match registered.jti.as_deref() {
        Some(jti) => !jti.is_empty() && jti.len() <= 200,
        None => expect.jti == Jti::NotRequired,
    };
    if !jti_ok {
        return Err(refused(format!("{what} needs a jti of 1 to 200 characters")));
    }
    let claims = serde_json::from_value(payload)
        .map_err(|e| refused(format!("{what} has a claim of the wrong shape: {e}")))?;
    Ok(Verified { registered, claims, kid: header.kid })
}

/// Verifies a JWT completely: the keys from `source` (refetched once for an unknown `kid`
/// when the source allows it), the signature and claims ([`verify_with`]), and single use of
/// its `jti` in `jtis`. `refuse` turns a refusal into the caller's error.
pub async fn verify<C, E>(
    jwt: &str,
    expect: &Expect<'_>,
    source: &impl KeySource<Error = E>,
    jtis: &impl JtiStore<Error = E>,
    refuse: impl Fn(String) -> E,
) -> Result<Verified<C>, E>
where
    C: DeserializeOwned,
{
    let header = header_of(jwt, expect.what).map_err(|r| refuse(r.0))?;
    let mut keys = source.keys(false).await?;
    if let Some(kid) = header.kid.as_deref()
        && !keys.has_kid(kid)
        && source.may_refresh()
    {
        keys = source.keys(true).await?;
    }
    let verified = verify_with::<C>(jwt, &keys, expect).map_err(|r| refuse(r.0))?;
    let r = &verified.registered;
    if expect.jti == Jti::Required
        && let Some(jti) = r.jti.as_deref()
        && !jtis.first_use(&r.iss, jti, r.exp).await?
    {
        return Err(refuse(format!("{} was used already; sign a new one", expect.what)));
    }
    Ok(verified)
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::collections::HashSet;

    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    use serde_json::json;

    use super::*;

    const ISSUER: &str = "https://client.example/oauth/metadata.json";
    const AUD: &str = "https://as.example/oauth/token";
    const NOW: i64 = 1_800_000_000;

    struct Signer(EcdsaKeyPair);

    fn key(kid: &str) -> (Signer, Value) {
        let rng = SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("pair");
        let point = pair.public_key().as_ref().to_vec();
        let jwk = json!({"kty": "EC", "kid": kid, "alg": "ES256", "use": "sig", "crv": "P-256",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65])});
        (Signer(pair), jwk)
    }

    impl Signer {
        fn sign(&self, header: Value, claims: Value) -> String {
            let h = URL_SAFE_NO_PAD.encode(header.to_string());
            let p = URL_SAFE_NO_PAD.encode(claims.to_string());
            let sig =
                self.0.sign(&SystemRandom::new(), format!("{h}.{p}").as_bytes()).expect("sign");
            format!("{h}.{p}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
        }
    }

    fn claims() -> Value {
        json!({"iss": ISSUER, "sub": ISSUER, "aud": AUD, "exp": NOW + 300, "iat": NOW, "jti": "j-1"})
    }

    fn set(keys: &[&Value]) -> KeySet {
        KeySet::parse(&json!({"keys": keys})).expect("a key set")
    }

    fn expect(audiences: &[String]) -> Expect<'_> {
        Expect {
            what: "the assertion",
            typ: Typ::AbsentOr(&["JWT"]),
            issuer: Some(ISSUER),
            subject: Subject::Is(ISSUER),
            audiences,
            max_lifetime_secs: 600,
            jti: Jti::Required,
            now: NOW,
        }
    }

    fn check(jwt: &str, keys: &KeySet) -> Result<Verified<Value>, Refused> {
        verify_with(jwt, keys, &expect(&[AUD.to_owned()]))
    }

    #[test]
    fn a_signed_jwt_of_the_issuer_verifies() {
        let (signer, jwk) = key("k1");
        let keys = set(&[&jwk]);
        let header = json!({"alg": "ES256", "kid": "k1", "typ": "JWT"});
        let ok = check(&signer.sign(header.clone(), claims()), &keys).expect("verifies");
        assert_eq!(ok.registered.jti.as_deref(), Some("j-1"));
        assert_eq!(ok.kid.as_deref(), Some("k1"));
        let mut aud_list = claims();
        aud_list["aud"] = json!(["https://other.example", AUD]);
        assert!(check(&signer.sign(header, aud_list), &keys).is_ok());
        assert_eq!(
            unverified_subject(&signer.sign(json!({"alg": "ES256"}), claims())).as_deref(),
            Some(ISSUER)
        );
    }

    #[test]
    fn hostile_jwts_are_refused() {
        let (signer, jwk) = key("k1");
        let (stranger, _) = key("k1");
        let keys = set(&[&jwk]);
        let header = json!({"alg": "ES256", "kid": "k1"});
        let with = |f: &dyn Fn(&mut Value)| {
            let mut c = claims();
            f(&mut c);
            signer.sign(header.clone(), c)
        };
        // An HMAC token whose secret is the public key's bytes, as an attacker would try.
        let hmac_with_public_key = {
            use jsonwebtoken::{EncodingKey, encode};
            let secret = jwk.to_string();
            encode(
                &jsonwebtoken::Header::new(Algorithm::HS256),
                &claims(),
                &EncodingKey::from_secret(secret.as_bytes()).expect("secret"),
            )
            .expect("hmac")
        };
        let cases: Vec<(&str, String)> = vec![
            ("another key", stranger.sign(header.clone(), claims())),
            ("expired", with(&|c| c["exp"] = (NOW - 120).into())),
            ("too long-lived", with(&|c| c["exp"] = (NOW + 3600).into())),
            ("not yet valid", with(&|c| c["nbf"] = (NOW + 600).into())),
            ("another audience", with(&|c| c["aud"] = "https://evil.example/token".into())),
            ("another issuer", with(&|c| c["iss"] = "https://evil.example/client".into())),
            ("another subject", with(&|c| c["sub"] = "https://evil.example/client".into())),
            ("no jti", with(&|c| c["jti"] = "".into())),
            ("jti left out", with(&|c| _ = c.as_object_mut().map(|m| m.remove("jti")))),
            ("no exp", with(&|c| _ = c.as_object_mut().map(|m| m.remove("exp")))),
            ("unknown kid", signer.sign(json!({"alg": "ES256", "kid": "k9"}), claims())),
            ("alg none", {
                let h = URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#);
                let p = URL_SAFE_NO_PAD.encode(claims().to_string());
                format!("{h}.{p}.")
            }),
            ("HMAC header", signer.sign(json!({"alg": "HS256"}), claims())),
            ("HMAC with the public key", hmac_with_public_key),
            ("ES384 header", signer.sign(json!({"alg": "ES384"}), claims())),
            ("two parts", "a.b".into()),
            ("garbage", "...".into()),
            ("huge", "a".repeat(MAX_JWT_BYTES + 1)),
        ];
        for (name, jwt) in cases {
            assert!(check(&jwt, &keys).is_err(), "{name} was accepted");
        }
        // A payload changed after signing.
        let good = signer.sign(header.clone(), claims());
        let parts: Vec<&str> = good.split('.').collect();
        let mut forged = claims();
        forged["jti"] = "j-2".into();
        let tampered =
            format!("{}.{}.{}", parts[0], URL_SAFE_NO_PAD.encode(forged.to_string()), parts[2]);
        assert!(check(&tampered, &keys).is_err());
        // A key published for encryption, or for another algorithm, is not this signing key.
        let mut enc = jwk.clone();
        enc["use"] = "enc".into();
        assert!(KeySet::parse(&json!({"keys": [enc]})).is_none());
        let mut rs = jwk.clone();
        rs["alg"] = "RS256".into();
        assert!(KeySet::parse(&json!({"keys": [rs]})).is_none());
        // A usable key beside them: the token still verifies only with its own key.
        assert!(check(&good, &set(&[&rs, &jwk])).is_ok());
        // A symmetric key in the set is never loaded, whatever the header says.
        let oct = json!({"kty": "oct", "kid": "k1", "k": URL_SAFE_NO_PAD.encode(b"secret")});
        assert!(KeySet::parse(&json!({"keys": [oct]})).is_none());
        assert!(KeySet::parse(&json!({"keys": [{}]})).is_none(), "no usable key");
        assert!(KeySet::parse(&json!({"keys": [oct, jwk]})).is_some_and(|k| k.keys.len() == 1));
        // RSA moduli are measured in bits: 2047 bits is too short, 2048 is enough.
        let mut short = vec![0x7f];
        short.extend(vec![0xff; 255]);
        assert_eq!(modulus_bits(&short), 2047);
        assert_eq!(modulus_bits(&[&[0u8][..], &[0x80], &[0; 255]].concat()), 2048);
        // The profile's typ is required when it names one.
        let audiences = [AUD.to_owned()];
        let mut typed = expect(&audiences);
        typed.typ = Typ::Required("oauth-id-jag+jwt");
        assert!(verify_with::<Value>(&good, &keys, &typed).is_err());
        let jag =
            signer.sign(json!({"alg": "ES256", "kid": "k1", "typ": "oauth-id-jag+jwt"}), claims());
        assert!(verify_with::<Value>(&jag, &keys, &typed).is_ok());
        // A profile that carries single use another way (an ID token's nonce) takes no jti.
        let mut no_jti = expect(&audiences);
        no_jti.jti = Jti::NotRequired;
        let mut without = claims();
        without.as_object_mut().map(|m| m.remove("jti"));
        let id_token = signer.sign(header.clone(), without);
        assert!(verify_with::<Value>(&id_token, &keys, &no_jti).is_ok());
        assert!(check(&id_token, &keys).is_err(), "required when the profile says so");
        // A profile without a typ of its own still refuses another profile's.
        assert!(check(&jag, &keys).expect_err("an ID-JAG as an assertion").0.contains("typ"));
    }

    /// A key source that counts its fetches and caches what it fetched; what it had cached
    /// at first lacks the signing key.
    struct Rotating {
        cached: RefCell<KeySet>,
        published: KeySet,
        fetches: Cell<u32>,
        may: bool,
    }

    impl KeySource for Rotating {
        type Error = String;
        async fn keys(&self, refresh: bool) -> Result<KeySet, String> {
            if refresh {
                self.fetches.set(self.fetches.get() + 1);
                *self.cached.borrow_mut() = self.published.clone();
            }
            Ok(self.cached.borrow().clone())
        }
        fn may_refresh(&self) -> bool {
            self.may
        }
    }

    #[derive(Default)]
    struct Seen(RefCell<HashSet<(String, String)>>);

    impl JtiStore for Seen {
        type Error = String;
        async fn first_use(&self, iss: &str, jti: &str, _: i64) -> Result<bool, String> {
            Ok(self.0.borrow_mut().insert((iss.to_owned(), jti.to_owned())))
        }
    }

    #[tokio::test]
    async fn an_unknown_kid_refetches_only_when_allowed_and_a_jti_is_used_once() {
        let (old, old_jwk) = key("old");
        let (new, new_jwk) = key("new");
        let audiences = [AUD.to_owned()];
        let e = expect(&audiences);
        let jwt = new.sign(json!({"alg": "ES256", "kid": "new"}), claims());
        let seen = Seen::default();
        let no_refetch = Rotating {
            cached: RefCell::new(set(&[&old_jwk])),
            published: set(&[&old_jwk, &new_jwk]),
            fetches: Cell::new(0),
            may: false,
        };
        let refused = verify::<Value, String>(&jwt, &e, &no_refetch, &seen, |s| s).await;
        assert!(refused.is_err());
        assert_eq!(no_refetch.fetches.get(), 0, "a refetch the source forbade");
        let rotating = Rotating { may: true, ..no_refetch };
        verify::<Value, String>(&jwt, &e, &rotating, &seen, |s| s).await.expect("rotated key");
        assert_eq!(rotating.fetches.get(), 1);
        let again = verify::<Value, String>(&jwt, &e, &rotating, &seen, |s| s).await;
        assert!(again.expect_err("replayed").contains("used already"));
        // A known kid never refetches.
        let known = old.sign(json!({"alg": "ES256", "kid": "old"}), {
            let mut c = claims();
            c["jti"] = "j-old".into();
            c
        });
        verify::<Value, String>(&known, &e, &rotating, &seen, |s| s).await.expect("known key");
        assert_eq!(rotating.fetches.get(), 1);
    }
}
