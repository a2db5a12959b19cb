//! Back-channel logout and the IdP's keys: a logout token ends the person's sessions; keys and jtis are kept per provider.

use super::*;

#[derive(Debug, Deserialize)]
pub(super) struct LogoutClaims {
    #[serde(default)]
    events: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    nonce: Option<serde_json::Value>,
    #[serde(default)]
    sid: Option<String>,
}

/// OpenID Connect Back-Channel Logout: the IdP posts a signed logout token; the sessions it
/// started for that session id (`sid`), for the person (`sub`), or for that person's session
/// when it names both, end. Returns how many ended; a refusal is a sentence for the IdP's logs.
pub async fn backchannel_logout(
    ds: &Services,
    policy: &FetchPolicy,
    logout_token: &str,
) -> std::result::Result<u64, Error> {
    let bad = |why: String| Error::invalid("logout_token", why);
    let issuer = jose::unverified_issuer(logout_token)
        .ok_or_else(|| bad("the logout token is not a JWT with an issuer".into()))?;
    let idp = ds
        .preauth_idp_by_issuer(&issuer)
        .await?
        .ok_or_else(|| bad("no tenant signs in with this issuer".into()))?;
    let audiences = [idp.client_id.clone()];
    let expect = Expect {
        what: "the logout token",
        typ: Typ::AbsentOr(&["logout+jwt", "JWT"]),
        issuer: Some(&idp.issuer),
        subject: jose::Subject::Optional,
        audiences: &audiences,
        max_lifetime_secs: LOGOUT_TOKEN_MAX_LIFETIME_SECS,
        jti: Jti::Required,
        now: jiff::Timestamp::now().as_second(),
    };
    let keys = IdpKeys { ds, policy, idp: &idp, refuse: bad };
    let jtis = IdpJtis { ds, refuse: bad };
    let verified =
        jose::verify::<LogoutClaims, Error>(logout_token, &expect, &keys, &jtis, bad).await?;
    let claims = verified.claims;
    if !claims.events.as_ref().is_some_and(|e| e.contains_key(BACKCHANNEL_LOGOUT_EVENT)) {
        return Err(bad(format!("the logout token's events must name {BACKCHANNEL_LOGOUT_EVENT}")));
    }
    if claims.nonce.is_some() {
        return Err(bad("a logout token carries no nonce".into()));
    }
    // §2.4: a logout token names the session (`sid`), the person (`sub`), or both; both
    // means that session of that person.
    let sid = claims.sid.as_deref().filter(|s| !s.is_empty());
    let sub = Some(verified.registered.sub.as_str()).filter(|s| !s.is_empty());
    let person = match sub {
        None => None,
        Some(sub) => match ds
            .preauth_identity_get(&idp.issuer, sub)
            .await?
            .filter(|(_, tenant)| *tenant == idp.tenant_id)
        {
            Some((person, _)) => Some(person),
            // Nobody here signed in as that subject: no session of theirs to end.
            None => return Ok(0),
        },
    };
    if sid.is_none() && person.is_none() {
        return Err(
            bad("the logout token names neither sub nor sid; send sub, sid or both".into()),
        );
    }
    ds.preauth_sessions_end_idp(idp.id, sid, person).await
}

// ---------------------------------------------------------------- the IdP's keys and jtis

/// The key set of a tenant's IdP, from its `jwks_uri` behind the SSRF guard: cached for an
/// hour, refetched for an unknown `kid` at most once a minute, failed fetches included (the
/// keys kept serve meanwhile).
pub(crate) struct IdpKeys<'a, E> {
    pub(crate) ds: &'a Services,
    pub(crate) policy: &'a FetchPolicy,
    pub(crate) idp: &'a IdpRow,
    pub(crate) refuse: fn(String) -> E,
}

impl<E: From<Error>> jose::KeySource for IdpKeys<'_, E> {
    type Error = E;

    async fn keys(&self, refresh: bool) -> std::result::Result<KeySet, E> {
        let idp = self.idp;
        let age = |t: chrono::DateTime<chrono::Utc>| (chrono::Utc::now() - t).num_seconds();
        let fresh = idp.jwks_fetched_at.is_some_and(|t| age(t) < JWKS_CACHE_SECS);
        let tried_recently = idp.jwks_tried_at.is_some_and(|t| age(t) < JWKS_REFRESH_SECS);
        let keys = match &idp.jwks {
            Some(keys) if (fresh && !refresh) || tried_recently => keys.clone(),
            _ if tried_recently => {
                return Err((self.refuse)(format!(
                    "the identity provider's key set ({}) could not be fetched a moment ago; try again in a minute",
                    idp.jwks_uri
                )));
            }
            _ => {
                let fetched = match guarded_fetch(&idp.jwks_uri, self.policy).await {
                    Ok(body) => serde_json::from_slice::<serde_json::Value>(&body)
                        .ok()
                        .filter(|k| KeySet::parse(k).is_some())
                        .ok_or_else(|| "not a JWK set".to_owned()),
                    Err(why) => Err(why),
                };
                match fetched {
                    Ok(keys) => {
                        self.ds.preauth_idp_jwks_put(idp.id, &keys).await?;
                        keys
                    }
                    Err(why) => {
                        self.ds.preauth_idp_jwks_tried(idp.id).await?;
                        match &idp.jwks {
                            Some(kept) => kept.clone(),
                            None => {
                                return Err((self.refuse)(format!(
                                    "the identity provider's key set {}: {why}",
                                    idp.jwks_uri
                                )));
                            }
                        }
                    }
                }
            }
        };
        KeySet::parse(&keys)
            .ok_or_else(|| (self.refuse)("the identity provider's key set is not a JWK set".into()))
    }

    fn may_refresh(&self) -> bool {
        let last = self.idp.jwks_tried_at.or(self.idp.jwks_fetched_at);
        last.is_none_or(|t| (chrono::Utc::now() - t).num_seconds() >= JWKS_REFRESH_SECS)
    }
}

/// `jti`s of JWTs a tenant's IdP signed (ID-JAGs, logout tokens), per issuer, each kept until
/// its JWT expires.
pub(crate) struct IdpJtis<'a, E> {
    pub(crate) ds: &'a Services,
    pub(crate) refuse: fn(String) -> E,
}

impl<E: From<Error>> jose::JtiStore for IdpJtis<'_, E> {
    type Error = E;

    async fn first_use(
        &self,
        issuer: &str,
        jti: &str,
        expires: i64,
    ) -> std::result::Result<bool, E> {
        let expires = chrono::DateTime::from_timestamp(expires, 0)
            .ok_or_else(|| (self.refuse)("exp is out of range".into()))?;
        Ok(self.ds.preauth_idp_jti_use(issuer, jti, expires).await?)
    }
}

/// The identity provider a tenant trusts to sign ID-JAGs, by the issuer an ID-JAG names.
pub(crate) async fn id_jag_issuer(ds: &Services, issuer: &str) -> Result<Option<IdpRow>> {
    Ok(ds.preauth_idp_by_issuer(issuer).await?.filter(|idp| idp.id_jag))
}
