//! Signing in through the tenant's identity provider: the authorization request, the callback, the ID token checked, and the person found or joined.

use super::*;

pub(super) fn random_token() -> String {
    secret::generate(CredentialKind::Session)["gh_ses_".len()..].to_owned()
}

/// Where the browser goes to sign in at the IdP, and the `state` it must bring back (the
/// adapter keeps it in a cookie, so a callback started in another browser is refused).
pub struct Started {
    pub redirect: String,
    pub state: String,
}

/// The redirect URI a tenant registers at its IdP.
pub fn redirect_uri(public_url: &str) -> String {
    format!("{}/sso/callback", public_url.trim_end_matches('/'))
}

/// The back-channel logout URI a tenant registers at its IdP.
pub fn backchannel_logout_uri(public_url: &str) -> String {
    format!("{}/sso/backchannel-logout", public_url.trim_end_matches('/'))
}

/// Starts a sign-in for the person who named `who`: their work email (its domain) or the
/// tenant's short name.
pub async fn sign_in_start(
    ds: &Services,
    public_url: &str,
    who: &str,
    next: &str,
    source: &str,
) -> Result<Started> {
    // Anyone may start one (each stores a row): a bounded number a minute per address, and
    // a return path of bounded length (a longer one returns to the start page).
    let key = format!("sso_start:{}", source.chars().take(64).collect::<String>());
    if ds.preauth_throttle_take(&key, 60).await?.0 > SIGN_INS_PER_MINUTE {
        return Err(Error::Unauthenticated(
            "Too many single sign-on attempts from this address; wait a minute and try again."
                .into(),
        ));
    }
    let next = if next.len() > 2048 { "/" } else { next };
    let who = who.trim().to_lowercase();
    let (key, email) = match who.rsplit_once('@') {
        Some((_, domain)) => (domain.to_owned(), Some(who.clone())),
        None => (who.clone(), None),
    };
    let not_found = || {
        Error::Unauthenticated(
            "No tenant signs in with single sign-on under that name. Give your work email address or your organization's short name, or sign in with your password.".into(),
        )
    };
    if key.is_empty() || key.len() > 253 {
        return Err(not_found());
    }
    let idp = ds.preauth_idp_for(&key).await?.ok_or_else(not_found)?;
    let state = random_token();
    let nonce = random_token();
    let verifier = format!("{}{}", random_token(), random_token());
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    ds.preauth_sso_sign_in_insert(
        &secret::hash_token(&state),
        idp.tenant_id,
        idp.id,
        &nonce,
        &verifier,
        next,
        SIGN_IN_TTL_SECS,
    )
    .await?;
    let mut url = url::Url::parse(&idp.authorization_endpoint)
        .map_err(|_| Error::Internal("stored authorization endpoint is not a URL".into()))?;
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("response_type", "code")
            .append_pair("client_id", &idp.client_id)
            .append_pair("redirect_uri", &redirect_uri(public_url))
            .append_pair("scope", "openid email profile")
            .append_pair("state", &state)
            .append_pair("nonce", &nonce)
            .append_pair("code_challenge", &challenge)
            .append_pair("code_challenge_method", "S256");
        if let Some(email) = &email {
            q.append_pair("login_hint", email);
        }
    }
    Ok(Started { redirect: url.to_string(), state })
}

/// What the IdP sent back to the callback.
pub struct Callback<'a> {
    pub state: Option<&'a str>,
    pub code: Option<&'a str>,
    pub error: Option<&'a str>,
    /// The `state` the browser kept when the sign-in started.
    pub browser_state: Option<&'a str>,
}

pub struct SsoSignedIn {
    /// The session secret for the cookie.
    pub token: String,
    pub next: String,
    /// How long the session lives (the tenant's session lifetime).
    pub ttl_secs: i64,
}

#[derive(Debug, Deserialize)]
pub(super) struct IdClaims {
    #[serde(default)]
    nonce: Option<String>,
    #[serde(default)]
    azp: Option<String>,
    #[serde(default)]
    email: Option<String>,
    #[serde(default)]
    email_verified: Option<serde_json::Value>,
    /// Entra ID's "email domain owner verified" (it sends no `email_verified`).
    #[serde(default)]
    xms_edov: Option<serde_json::Value>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    sid: Option<String>,
}

/// Whether a claim says yes (a boolean, or the string some IdPs send).
pub(super) fn yes(claim: Option<&serde_json::Value>) -> bool {
    match claim {
        Some(serde_json::Value::Bool(b)) => *b,
        Some(serde_json::Value::String(s)) => s == "true",
        _ => false,
    }
}

pub(super) fn refused(why: impl Into<String>) -> Error {
    Error::Unauthenticated(why.into())
}

/// Finishes a sign-in: the state (from this browser, once), the code exchanged at the IdP's
/// token endpoint with the PKCE verifier, the ID token verified, the person linked, a session
/// bounded by the tenant's lifetime.
pub async fn sign_in_finish(
    ds: &Services,
    policy: &FetchPolicy,
    public_url: &str,
    cb: Callback<'_>,
) -> Result<SsoSignedIn> {
    let again = "start again from the sign-in page";
    let state = cb
        .state
        .filter(|s| !s.is_empty() && s.len() <= 200)
        .ok_or_else(|| refused(format!("The identity provider sent no sign-in state; {again}.")))?;
    if !cb.browser_state.is_some_and(|b| secret::tokens_match(b, state)) {
        return Err(refused(format!("This sign-in was not started in this browser; {again}.")));
    }
    let row = ds.preauth_sso_sign_in_take(&secret::hash_token(state)).await?.ok_or_else(|| {
        refused(format!("This single sign-on attempt expired or was used already; {again}."))
    })?;
    if let Some(error) = cb.error {
        return Err(refused(format!(
            "Your identity provider did not sign you in ({}); {again}, or ask your administrator.",
            error.chars().filter(|c| c.is_ascii_graphic()).take(60).collect::<String>()
        )));
    }
    let code = cb.code.filter(|c| !c.is_empty() && c.len() <= 4096).ok_or_else(|| {
        refused(format!("The identity provider sent no authorization code; {again}."))
    })?;
    let idp = ds
        .preauth_idp_by_id(row.idp_id)
        .await?
        .ok_or_else(|| refused("This tenant no longer signs in with single sign-on."))?;
    let client_secret = open_secret(ds, &idp)?;
    let redirect = redirect_uri(public_url);
    let mut form = vec![
        ("grant_type", "authorization_code"),
        ("code", code),
        ("redirect_uri", redirect.as_str()),
        ("code_verifier", row.pkce_verifier.as_str()),
        ("client_id", idp.client_id.as_str()),
    ];
    let basic = if idp.token_auth_method == "client_secret_post" {
        form.push(("client_secret", client_secret.as_str()));
        None
    } else {
        Some((idp.client_id.as_str(), client_secret.as_str()))
    };
    let (status, body) =
        guarded_post(&idp.token_endpoint, policy, &form, basic).await.map_err(|why| {
            refused(format!("The identity provider's token endpoint: {why}; {again}."))
        })?;
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let Some(id_token) = answer.get("id_token").and_then(|t| t.as_str()).filter(|_| status == 200)
    else {
        let error = answer.get("error").and_then(|e| e.as_str()).unwrap_or("no ID token");
        return Err(refused(format!(
            "The identity provider refused the sign-in code ({}); {again}.",
            error.chars().take(60).collect::<String>()
        )));
    };
    let audiences = [idp.client_id.clone()];
    let expect = Expect {
        what: "the ID token",
        typ: Typ::AbsentOr(&["JWT"]),
        issuer: Some(&idp.issuer),
        subject: jose::Subject::Required,
        audiences: &audiences,
        max_lifetime_secs: ID_TOKEN_MAX_LIFETIME_SECS,
        jti: Jti::NotRequired,
        now: jiff::Timestamp::now().as_second(),
    };
    let keys = IdpKeys { ds, policy, idp: &idp, refuse: refused };
    let jtis = IdpJtis { ds, refuse: refused };
    let verified = jose::verify::<IdClaims, Error>(id_token, &expect, &keys, &jtis, |why| {
        refused(format!(
            "Your identity provider's answer was refused: {why}. Ask your administrator."
        ))
    })
    .await?;
    let claims = &verified.claims;
    // The nonce is the ID token's single use: the sign-in row held it and is consumed now.
    if !claims.nonce.as_deref().is_some_and(|n| secret::tokens_match(n, &row.nonce)) {
        return Err(refused(format!("The ID token is not for this sign-in (nonce); {again}.")));
    }
    if claims.azp.as_deref().is_some_and(|azp| azp != idp.client_id) {
        return Err(refused(
            "The ID token was issued to another client (azp). Ask your administrator.",
        ));
    }
    let verified_email = match &claims.email_verified {
        Some(said) => yes(Some(said)),
        None => yes(claims.xms_edov.as_ref()),
    };
    let person_id = link(
        ds,
        &idp,
        &verified.registered.sub,
        claims.email.as_deref(),
        verified_email,
        claims.name.as_deref(),
    )
    .await?;
    let token = secret::generate(CredentialKind::Session);
    let csrf = random_token();
    let ttl_secs = SESSION_TTL_SECS.min(i64::from(idp.session_hours) * 3600);
    ds.preauth_session_create_sso(
        &secret::hash_token(&token),
        person_id,
        idp.tenant_id,
        &csrf,
        ttl_secs,
        idp.id,
        claims.sid.as_deref().filter(|s| s.len() <= 255),
    )
    .await?;
    Ok(SsoSignedIn { token, next: row.next, ttl_secs })
}

pub(super) fn open_secret(ds: &Services, idp: &IdpRow) -> Result<String> {
    let keys = ds.secret_keys().ok_or_else(|| {
        Error::Internal("GATEHOUSE_SECRET_KEYS is not set on this control plane".into())
    })?;
    let plain = keys.open(SECRET_PURPOSE, &idp.client_secret_sealed).ok_or_else(|| {
        refused("The tenant's single sign-on secret cannot be read with this server's keys; ask your administrator to set the IdP's client secret again.")
    })?;
    String::from_utf8(plain).map_err(|_| Error::Internal("sealed secret is not text".into()))
}

/// The tenant the IdP serves, as a context for linking and joining (a job of the library,
/// audited as `sso-sign-in`).
pub(super) async fn tenant_ctx(ds: &Services, tenant_id: i64) -> Result<OpCtx> {
    let mut tx = ds.begin().await?;
    let tenant = db::entry_tenant_by_id(&mut tx, tenant_id).await?;
    drop(tx);
    Ok(OpCtx::for_job("sso-sign-in", admin::tenant_ref(&tenant)?, &[Right::PeopleManage]))
}

/// The person an IdP subject is, linking them on their first sign-in.
pub(super) async fn link(
    ds: &Services,
    idp: &IdpRow,
    subject: &str,
    email: Option<&str>,
    email_verified: bool,
    name: Option<&str>,
) -> Result<i64> {
    let ctx = tenant_ctx(ds, idp.tenant_id).await?;
    let tenant = ctx.tenant().slug.clone();
    if let Some((person_id, tenant_id)) = ds.preauth_identity_get(&idp.issuer, subject).await? {
        if tenant_id != idp.tenant_id {
            return Err(refused(
                "Your account at this identity provider is linked to another tenant here. Ask your administrator.",
            ));
        }
        return match ds.membership_get(&ctx, person_id).await? {
            Some(m) if m.active => Ok(person_id),
            // Invited back: the IdP linked this person before, so its word is theirs.
            _ => match invitations::accept_through_sso(
                ds,
                idp.tenant_id,
                invitations::SsoJoiner::Linked(person_id),
            )
            .await?
            {
                Some(id) => Ok(id),
                None => Err(refused(format!(
                    "You are no longer a member of {tenant}; ask one of its admins to add you again."
                ))),
            },
        };
    }
    let email = email.map(|e| e.trim().to_lowercase()).filter(|e| !e.is_empty()).ok_or_else(|| {
        refused("Your identity provider sent no email address; ask your administrator to release the email claim to Gatehouse.")
    })?;
    if !email_verified {
        return Err(refused(
            "Your identity provider has not verified your email address (email_verified); ask your administrator to verify it there, then sign in again.",
        ));
    }
    let domain = email.rsplit_once('@').map(|(_, d)| d).unwrap_or_default();
    if !idp.email_domains.iter().any(|d| d == domain) {
        return Err(refused(format!(
            "{domain} is not an email domain {tenant}'s identity provider signs in; ask your administrator."
        )));
    }
    let person = ds.platform_person_by_email(&email).await?;
    let member = match &person {
        Some(p) => ds.membership_get(&ctx, p.id).await?,
        None => None,
    };
    // A new address an admin invited joins with the invitation's role. An account that
    // exists accepts on the link's page by signing in to it, never by its email alone.
    let invited = match &person {
        Some(_) => None,
        None => {
            let name: String =
                name.unwrap_or_default().chars().filter(|c| !c.is_control()).take(100).collect();
            let joiner = invitations::SsoJoiner::New { email: &email, name: &name };
            invitations::accept_through_sso(ds, idp.tenant_id, joiner).await?
        }
    };
    let person_id = match (person, member) {
        _ if invited.is_some() => invited.unwrap_or_default(),
        (Some(p), Some(m)) if m.active && p.active => p.id,
        (_, Some(_)) => {
            return Err(refused(format!(
                "Your membership of {tenant} was ended; ask one of its admins to add you again."
            )));
        }
        (Some(p), None) if !p.active => {
            return Err(refused("This account is deactivated; ask your administrator."));
        }
        // An account that exists elsewhere is never joined here by its email alone: the
        // tenant's IdP vouches for this tenant's people, not for another tenant's.
        (Some(_), None) => {
            return Err(refused(format!(
                "You have a Gatehouse account already, and you are not a member of {tenant}; ask one of its admins to add you, then sign in here again."
            )));
        }
        (None, None) if idp.allow_join => {
            let name = name.map(str::trim).filter(|n| !n.is_empty()).unwrap_or(&email);
            let name: String = name.chars().filter(|c| !c.is_control()).take(100).collect();
            admin::person_create(ds, &ctx, &email, &name, Role::Viewer, None).await?;
            ds.platform_person_by_email(&email)
                .await?
                .ok_or_else(|| Error::Internal("joined person vanished".into()))?
                .id
        }
        (_, None) => {
            return Err(refused(format!(
                "You are not a member of {tenant} yet; ask one of its admins to add you."
            )));
        }
    };
    // Read before the transaction: one never waits for a second connection.
    let handle = ds_person_handle(ds, &email).await?;
    let mut tx = ds.begin().await?;
    db::identity_insert(&mut tx, &ctx, &idp.issuer, subject, person_id).await?;
    db::audit_insert(&mut tx, &ctx, AuditEntry::ok("person.link_idp", vec![handle])).await?;
    tx.commit().await?;
    Ok(person_id)
}

pub(super) async fn ds_person_handle(ds: &Services, email: &str) -> Result<String> {
    Ok(ds.platform_person_by_email(email).await?.map(|p| p.handle).unwrap_or_default())
}
