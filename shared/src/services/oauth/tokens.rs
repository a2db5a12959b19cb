//! The token endpoint and revocation: codes exchanged for access and refresh tokens (PKCE),
//! refresh tokens rotated (one used twice ends its connection), and RFC 7009 revocation.

use super::*;

#[derive(Debug, Serialize)]
pub struct TokenResponse {
    pub access_token: String,
    pub token_type: &'static str,
    pub expires_in: i64,
    /// None for grants that carry no refresh (an ID-JAG: the client asks its IdP again).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// The rights granted, space-separated: a narrowed grant says so (RFC 6749 §5.1).
    pub scope: String,
}

pub(super) fn pkce_matches(verifier: &str, challenge: &str) -> bool {
    let valid = (43..=128).contains(&verifier.len())
        && verifier.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b));
    valid && URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes())) == challenge
}

pub(super) async fn issue(
    tx: &mut db::Tx<'static>,
    connection_id: i64,
    resource: &str,
    grant_ends: jiff::Timestamp,
) -> Result<TokenResponse> {
    let access = secret::generate(CredentialKind::Mcp);
    let refresh = secret::generate(CredentialKind::Mcp);
    let now = jiff::Timestamp::now();
    let at = |secs: i64| {
        now.checked_add(jiff::SignedDuration::from_secs(secs))
            .map(from_ts)
            .map_err(|e| Error::Internal(e.to_string()))
    };
    db::preauth_connection_token_insert(
        tx,
        connection_id,
        "access",
        &secret::hash_token(&access),
        Some(resource),
        Some(at(ACCESS_TTL_SECS)?),
        None,
    )
    .await?;
    db::preauth_connection_token_insert(
        tx,
        connection_id,
        "refresh",
        &secret::hash_token(&refresh),
        Some(resource),
        Some(at(REFRESH_TTL_SECS)?.min(from_ts(grant_ends))),
        Some(from_ts(grant_ends)),
    )
    .await?;
    let scope = db::preauth_connection_rights(tx, connection_id).await?.join(" ");
    Ok(TokenResponse {
        access_token: access,
        token_type: "Bearer",
        expires_in: ACCESS_TTL_SECS,
        refresh_token: Some(refresh),
        scope,
    })
}

/// `grant_type=authorization_code`.
pub async fn exchange_code(
    ds: &Services,
    code: &str,
    client_id: &str,
    redirect_uri: &str,
    verifier: &str,
    resource: Option<&str>,
) -> std::result::Result<TokenResponse, OAuthError> {
    let mut tx = ds.begin().await.map_err(OAuthError::from)?;
    let code_hash = secret::hash_token(code);
    // The connection first, then the code: the order a consent takes them in, so the two never
    // wait on each other. A consent or a revocation running now finishes first and is seen.
    let active = match db::preauth_oauth_code_connection(&mut tx, &code_hash).await? {
        Some(connection_id) => db::preauth_connection_is_active(&mut tx, connection_id).await?,
        None => false,
    };
    let Some(c) = db::preauth_oauth_code_lock(&mut tx, &code_hash).await? else {
        return Err(oauth("invalid_grant", "unknown authorization code"));
    };
    if c.used {
        // A code used twice: someone replays it; end the grant it produced (RFC 6749 §4.1.2).
        revoke_connection(ds, tx, c.connection_id, "authorization code reused").await?;
        return Err(oauth(
            "invalid_grant",
            "this authorization code was used already; the grant is revoked",
        ));
    }
    if c.expired {
        return Err(oauth("invalid_grant", "the authorization code expired; authorize again"));
    }
    if c.client_id != client_id {
        return Err(oauth("invalid_grant", "the code was issued to another client"));
    }
    if c.redirect_uri != redirect_uri {
        return Err(oauth("invalid_grant", "redirect_uri differs from the authorization request"));
    }
    if !pkce_matches(verifier, &c.code_challenge) {
        return Err(oauth("invalid_grant", "code_verifier does not match the code_challenge"));
    }
    if resource.is_some_and(|r| r.trim_end_matches('/') != c.resource.trim_end_matches('/')) {
        return Err(oauth("invalid_target", "resource differs from the authorization request"));
    }
    // A connection revoked after the person approved issues nothing.
    if !active {
        return Err(oauth(
            "invalid_grant",
            "the connection this code was issued for was revoked; authorize again",
        ));
    }
    db::preauth_oauth_code_use(&mut tx, c.id).await?;
    let grant_ends = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(GRANT_TTL_SECS))
        .map_err(|e| OAuthError::from(Error::Internal(e.to_string())))?;
    let tokens = issue(&mut tx, c.connection_id, &c.resource, grant_ends).await?;
    tx.commit().await.map_err(Error::from)?;
    Ok(tokens)
}

/// `grant_type=refresh_token`: rotates; a refresh token used twice revokes the connection.
pub async fn refresh(
    ds: &Services,
    token: &str,
    client_id: &str,
    resource: Option<&str>,
) -> std::result::Result<TokenResponse, OAuthError> {
    let mut tx = ds.begin().await.map_err(OAuthError::from)?;
    let Some(r) = db::preauth_refresh_lock(&mut tx, &secret::hash_token(token)).await? else {
        return Err(oauth("invalid_grant", "unknown refresh token"));
    };
    if r.used {
        revoke_connection(ds, tx, r.connection_id, "refresh token reused").await?;
        return Err(oauth(
            "invalid_grant",
            "this refresh token was used already; the connection is revoked for safety",
        ));
    }
    if r.connection_status != "active" {
        return Err(oauth("invalid_grant", "the connection was revoked"));
    }
    if r.expired {
        return Err(oauth("invalid_grant", "the refresh token expired; authorize again"));
    }
    if r.oauth_client_id.as_deref() != Some(client_id) {
        return Err(oauth("invalid_grant", "the refresh token belongs to another client"));
    }
    let audience = r.audience.clone().unwrap_or_default();
    if resource.is_some_and(|res| res.trim_end_matches('/') != audience.trim_end_matches('/')) {
        return Err(oauth("invalid_target", "resource differs from the one this grant is for"));
    }
    // Rotation renews the token, never the grant: past its absolute lifetime, consent again.
    let grant_ends = r.grant_expires_at.map(crate::datastore::to_ts);
    let Some(grant_ends) = grant_ends.filter(|g| *g > jiff::Timestamp::now()) else {
        return Err(oauth("invalid_grant", "this grant reached its lifetime; authorize again"));
    };
    db::preauth_token_mark_used(&mut tx, r.id).await?;
    let tokens = issue(&mut tx, r.connection_id, &audience, grant_ends).await?;
    tx.commit().await.map_err(Error::from)?;
    Ok(tokens)
}

/// Ends a connection found through one of its tokens, through the one revocation service.
pub(super) async fn revoke_connection(
    ds: &Services,
    mut tx: db::Tx<'static>,
    connection_id: i64,
    reason: &str,
) -> Result<()> {
    let Some((tenant_id, handle)) = db::entry_connection_by_id(&mut tx, connection_id).await?
    else {
        return Ok(());
    };
    let tenant = db::entry_tenant_by_id(&mut tx, tenant_id).await?;
    drop(tx);
    // Reuse of a refresh token is a theft signal: the authorization server ends the grant.
    let ctx = OpCtx::for_job(
        "oauth-reuse-detection",
        admin::tenant_ref(&tenant)?,
        &[Right::ConnectionsManage],
    );
    match admin::connection_revoke(ds, &ctx, &handle, reason).await {
        Ok(_) | Err(Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// RFC 7009: an access token is deleted; a refresh token ends its connection. Unknown tokens
/// are not an error. A token is revoked only by the client it was issued to, when the request
/// names one (`client`, authenticated by [`authenticate_client`]); a `private_key_jwt` client's
/// tokens only with its assertion (§2.1), so a stolen refresh token alone cannot end its grant.
pub async fn revoke(
    ds: &Services,
    token: &str,
    client: Option<&str>,
) -> std::result::Result<(), OAuthError> {
    let hash = secret::hash_token(token);
    if let Some((issued_to, method)) = ds.preauth_token_client(&hash).await? {
        if method != "none" && client != Some(issued_to.as_str()) {
            return Err(oauth(
                "invalid_client",
                "this client is confidential: revoke with its client_assertion or client secret",
            ));
        }
        if client.is_some_and(|c| c != issued_to) {
            // Not this client's token: nothing to do, and nothing said about it.
            return Ok(());
        }
    }
    let mut tx = ds.begin().await?;
    if let Some(tenant) = db::preauth_access_token_delete(&mut tx, &hash).await? {
        tx.commit().await.map_err(Error::from)?;
        // A listen stream opened with this token re-reads its context and ends.
        crate::bus::publish(ds.bus(), crate::bus::Event::TenantChanged { tenant }).await;
        return Ok(());
    }
    match db::preauth_refresh_lock(&mut tx, &hash).await? {
        Some(r) => Ok(revoke_connection(ds, tx, r.connection_id, "revoked by the client").await?),
        None => Ok(()),
    }
}
