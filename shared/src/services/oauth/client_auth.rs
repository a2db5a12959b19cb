//! Client authentication at the token endpoint: public clients with PKCE, and `private_key_jwt` (RFC 7523) for clients whose metadata names their keys.

use super::*;

/// What the token endpoint received to authenticate the client.
#[derive(Debug, Default)]
pub struct ClientCredentials<'a> {
    pub client_id: Option<&'a str>,
    /// A confidential client's secret (`client_secret_post`, or `client_secret_basic` as the
    /// adapter decoded it from the Authorization header).
    pub client_secret: Option<&'a str>,
    pub assertion_type: Option<&'a str>,
    pub assertion: Option<&'a str>,
}

/// Authenticates the client of a token request and returns its `client_id`. Public clients
/// (`none`) prove nothing here (PKCE and the refresh token bind them); a `private_key_jwt`
/// client must send a fresh, single-use assertion signed by a key of its published set
/// (RFC 7523). A client that is public yet sends an assertion is refused, so no client can
/// choose the weaker method. `audiences` are this server's token endpoint and issuer.
pub async fn authenticate_client(
    ds: &Services,
    policy: &FetchPolicy,
    creds: ClientCredentials<'_>,
    audiences: &[String],
) -> std::result::Result<String, OAuthError> {
    let invalid = |why: String| oauth("invalid_client", why);
    let asserted = creds.assertion.map(|a| (a, client_assertion::unverified_subject(a)));
    let client_id = match (creds.client_id, &asserted) {
        (Some(id), Some((_, Some(sub)))) if id != sub => {
            return Err(invalid("client_id differs from the assertion's subject".into()));
        }
        (Some(id), _) => id.to_owned(),
        (None, Some((_, Some(sub)))) => sub.clone(),
        (None, Some((_, None))) => return Err(invalid("the client_assertion is not a JWT".into())),
        (None, None) => return Err(invalid("client_id is required".into())),
    };
    // A metadata-document client is read through its one-hour cache, so a key (or method) the
    // client changed in its document holds at the token endpoint too, not only at consent.
    let client = if client_id.starts_with("https://") || client_id.starts_with("http://") {
        match ds.preauth_oauth_client_get(&client_id).await.map_err(OAuthError::from)? {
            Some(_) => Some(fetch_metadata_document(ds, &client_id, policy).await?),
            None => None,
        }
    } else {
        ds.preauth_oauth_client_get(&client_id).await.map_err(OAuthError::from)?
    };
    let Some(client) = client else {
        // Unknown clients fall through to the grant's own check (the code or refresh token
        // names its client), which answers invalid_grant as before.
        return match (asserted, creds.client_secret) {
            (None, None) => Ok(client_id),
            _ => Err(invalid("unknown client".into())),
        };
    };
    if client.token_endpoint_auth_method == "client_secret" {
        // A confidential client a tenant admin registered: its secret, and nothing else.
        return match (creds.client_secret, asserted, &client.client_secret_hash) {
            (Some(given), None, Some(hash))
                if secret::tokens_match(&hex::encode(secret::hash_token(given)), &hex::encode(hash)) =>
            {
                Ok(client_id)
            }
            (Some(_), None, _) => Err(invalid("the client secret is wrong".into())),
            (_, Some(_), _) => Err(invalid(
                "this client authenticates with its client secret (client_secret_basic or client_secret_post), not an assertion".into(),
            )),
            (None, None, _) => Err(invalid(
                "this client is confidential: send its client_secret (client_secret_basic or client_secret_post)".into(),
            )),
        };
    }
    if creds.client_secret.is_some() {
        return Err(invalid(format!(
            "this client authenticates with {}; it has no client secret",
            client.token_endpoint_auth_method
        )));
    }
    match (client.token_endpoint_auth_method.as_str(), asserted) {
        ("none", None) => Ok(client_id),
        ("none", Some(_)) => Err(invalid(
            "this client is public (token_endpoint_auth_method none); it sends no client_assertion".into(),
        )),
        ("private_key_jwt", None) => Err(invalid(
            "this client authenticates with private_key_jwt: send client_assertion_type and client_assertion".into(),
        )),
        ("private_key_jwt", Some((assertion, _))) => {
            if creds.assertion_type != Some(client_assertion::ASSERTION_TYPE) {
                return Err(invalid(format!(
                    "client_assertion_type must be {}",
                    client_assertion::ASSERTION_TYPE
                )));
            }
            let now = jiff::Timestamp::now().as_second();
            let keys = ClientKeys { ds, policy, client: &client };
            let jtis = AssertionJtis { ds, client_id: &client_id };
            client_assertion::verify(assertion, &client_id, audiences, now, &keys, &jtis, invalid)
                .await?;
            Ok(client_id)
        }
        _ => Err(invalid("the client's authentication method is unknown".into())),
    }
}

/// The key set of a `private_key_jwt` client: inline in its document, else from its
/// `jwks_uri` (behind the SSRF guard, cached for an hour; a refresh fetches anew).
pub(super) struct ClientKeys<'a> {
    ds: &'a Services,
    policy: &'a FetchPolicy,
    client: &'a ClientRow,
}

impl jose::KeySource for ClientKeys<'_> {
    type Error = OAuthError;

    async fn keys(&self, refresh: bool) -> std::result::Result<KeySet, OAuthError> {
        let invalid = |why: String| oauth("invalid_client", why);
        let client = self.client;
        let age = |t: chrono::DateTime<chrono::Utc>| (chrono::Utc::now() - t).num_seconds();
        let fresh = client.jwks_fetched_at.is_some_and(|t| age(t) < CIMD_CACHE_SECS);
        // A fetch, failed or not, is not repeated within the minute: the keys kept serve
        // meanwhile, and a client with none is told to try again.
        let tried_recently = client.jwks_tried_at.is_some_and(|t| age(t) < JWKS_REFRESH_SECS);
        let cached = match (&client.jwks, &client.jwks_uri) {
            (Some(keys), None) => Some(keys.clone()),
            (Some(keys), Some(_)) if (fresh && !refresh) || tried_recently => Some(keys.clone()),
            _ => None,
        };
        let keys = match cached {
            Some(keys) => keys,
            None => {
                let uri = client
                    .jwks_uri
                    .as_deref()
                    .ok_or_else(|| invalid("the client publishes no keys".into()))?;
                if tried_recently {
                    return Err(invalid(format!(
                        "jwks_uri {uri} could not be fetched a moment ago; publish the key set there and try again in a minute"
                    )));
                }
                let fetched = async {
                    let body = guarded_fetch(uri, self.policy)
                        .await
                        .map_err(|why| invalid(format!("jwks_uri {uri}: {why}")))?;
                    let keys: serde_json::Value = serde_json::from_slice(&body)
                        .map_err(|_| invalid(format!("jwks_uri {uri}: not JSON")))?;
                    KeySet::parse(&keys)
                        .ok_or_else(|| invalid(format!("jwks_uri {uri}: not a JWK set")))?;
                    Ok::<_, OAuthError>(keys)
                }
                .await;
                match fetched {
                    // Only a key set is kept: a glitch on the client's host does not lock it out.
                    Ok(keys) => {
                        self.ds.preauth_oauth_client_jwks_put(&client.client_id, &keys).await?;
                        keys
                    }
                    Err(refusal) => {
                        self.ds.preauth_oauth_client_jwks_tried(&client.client_id).await?;
                        return Err(refusal);
                    }
                }
            }
        };
        KeySet::parse(&keys).ok_or_else(|| invalid("the client's key set is not a JWK set".into()))
    }

    /// The client may have rotated its keys: an unknown `kid` refetches at most once a
    /// minute, so forged assertions cannot make the server fetch on every request.
    fn may_refresh(&self) -> bool {
        let last = self.client.jwks_tried_at.or(self.client.jwks_fetched_at);
        self.client.jwks_uri.is_some()
            && last.is_none_or(|t| (chrono::Utc::now() - t).num_seconds() >= JWKS_REFRESH_SECS)
    }
}

/// Client assertions' `jti`s, each kept until its assertion expires.
pub(super) struct AssertionJtis<'a> {
    ds: &'a Services,
    client_id: &'a str,
}

impl jose::JtiStore for AssertionJtis<'_> {
    type Error = OAuthError;

    async fn first_use(
        &self,
        _issuer: &str,
        jti: &str,
        expires: i64,
    ) -> std::result::Result<bool, OAuthError> {
        let expires = chrono::DateTime::from_timestamp(expires, 0)
            .ok_or_else(|| oauth("invalid_client", "the assertion's exp is out of range"))?;
        Ok(self.ds.preauth_oauth_assertion_use(self.client_id, jti, expires).await?)
    }
}
