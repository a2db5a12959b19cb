//! Signing in with a passkey, and proving a decision with one: the assertion made for exactly that decision.

use super::*;

/// Starts a passkey sign-in: any discoverable credential of this console's relying party.
pub async fn sign_in_begin(
    ds: &Services,
    rp: &RelyingParty,
    source: &str,
) -> Result<(String, serde_json::Value)> {
    // Anyone may start one, so each address starts a bounded number a minute.
    let key = format!("passkey_sign_in:{}", source.chars().take(64).collect::<String>());
    let (count, _) = ds.preauth_throttle_take(&key, 60).await?;
    if count > SIGN_INS_PER_MINUTE {
        return Err(Error::Unauthenticated(
            "Too many passkey sign-ins from this address; wait a minute and try again.".into(),
        ));
    }
    let (options, state) = rp
        .webauthn
        .start_discoverable_authentication()
        .map_err(|e| Error::Internal(format!("passkey sign-in: {e}")))?;
    let mut options = to_json(&options)?;
    // A button starts it, so the browser shows its own prompt rather than autofill.
    if let Some(o) = options.as_object_mut() {
        o.remove("mediation");
    }
    let (id, hash) = ceremony_id();
    ds.preauth_ceremony_create(&hash, "sign_in", None, None, &to_json(&state)?, CEREMONY_TTL_SECS)
        .await?;
    Ok((id, options))
}

/// Finishes a passkey sign-in and starts a console session signed in with that passkey.
pub async fn sign_in_finish(
    ds: &Services,
    rp: &RelyingParty,
    ceremony: &str,
    assertion: &str,
) -> Result<SignedIn> {
    let refused = || {
        Error::Unauthenticated(
            "That passkey is not registered here; sign in with your password or another passkey."
                .into(),
        )
    };
    let assertion: PublicKeyCredential = bounded("assertion", assertion)?;
    let row = ds
        .preauth_ceremony_take(&secret::hash_token(ceremony), "sign_in", None)
        .await?
        .ok_or_else(|| Error::Unauthenticated("The sign-in expired; try again.".into()))?;
    let state: DiscoverableAuthentication = from_json(row.state)?;
    let (uuid, credential_id) =
        rp.webauthn.identify_discoverable_authentication(&assertion).map_err(|_| refused())?;
    let person = ds
        .preauth_person_by_webauthn_id(&uuid.to_string())
        .await?
        .filter(|p| p.active)
        .ok_or_else(refused)?;
    let credential_id = credential_id.to_vec();
    let mut tx = ds.begin().await?;
    let stored = db::preauth_passkey_lock(&mut tx, &credential_id)
        .await?
        .filter(|r| r.person_id == person.id)
        .ok_or_else(refused)?;
    let mut passkey: Passkey = from_json(stored.passkey.clone())?;
    let result = rp
        .webauthn
        .finish_discoverable_authentication(&assertion, state, &[DiscoverableKey::from(&passkey)])
        .map_err(|e| webauthn_refused("sign-in", e))?;
    advance(&mut tx, &stored, &mut passkey, &result).await?;
    tx.commit().await?;
    crate::services::console::session_begin(ds, person.id, ("passkey", Some(stored.id))).await
}

/// Checks what the library cannot know (user verification, a counter that went backwards
/// against the row as it is now, under its lock) and stores the advanced counter.
pub(super) async fn advance(
    tx: &mut Tx<'_>,
    stored: &PasskeyRow,
    passkey: &mut Passkey,
    result: &AuthenticationResult,
) -> Result<()> {
    if !result.user_verified() {
        return Err(Error::Unauthenticated(
            "The passkey did not verify you (no PIN or biometric); use one that does.".into(),
        ));
    }
    let before = stored.passkey["cred"]["counter"].as_u64().unwrap_or(0);
    let now = u64::from(result.counter());
    if (now > 0 || before > 0) && now <= before {
        tracing::warn!(passkey = %stored.handle, before, now, "passkey counter went backwards");
        return Err(Error::Unauthenticated(
            "This passkey's signature counter went backwards, which a copied key does; it was refused. Use another passkey or ask an operator.".into(),
        ));
    }
    passkey.update_credential(result);
    db::preauth_passkey_used(tx, stored.id, &to_json(passkey)?).await
}

// ------------------------------------------------------------------ proving a decision

/// Starts a ceremony for one decision of the signed-in person: the options for
/// `navigator.credentials.get`, limited to their own passkeys. `digest` is the decision as its
/// service named it when it asked for a passkey ([`Error::PasskeyRequired`]'s `ceremony_for`):
/// the assertion proves exactly that decision and no other.
pub async fn decision_begin(
    ds: &Services,
    rp: &RelyingParty,
    session: &ConsoleSession,
    label: &str,
    digest: &str,
) -> Result<(String, serde_json::Value)> {
    let keys: Vec<Passkey> = ds
        .preauth_passkeys_of(session.person_id())
        .await?
        .into_iter()
        .filter_map(|r| from_json(r.passkey).ok())
        .collect();
    if keys.is_empty() {
        return Err(Error::PasskeyRequired {
            decision: label.to_owned(),
            problem: "you have no passkey yet; add one under Passkeys (your name, top right), or ask an operator".into(),
            ceremony_for: None,
        });
    }
    let (options, state) = rp
        .webauthn
        .start_passkey_authentication(&keys)
        .map_err(|e| Error::Internal(format!("passkey check: {e}")))?;
    let (id, hash) = ceremony_id();
    ds.preauth_ceremony_create(
        &hash,
        "decision",
        Some(session.person_id()),
        Some(digest),
        &to_json(&state)?,
        CEREMONY_TTL_SECS,
    )
    .await?;
    Ok((id, to_json(&options)?))
}

/// Verifies the browser's assertion for a decision ceremony of this person and returns the
/// proof to put on the context. The ceremony is used up whatever the outcome.
pub async fn prove(
    ds: &Services,
    rp: &RelyingParty,
    session: &ConsoleSession,
    ceremony: &str,
    assertion: &str,
) -> Result<Proof> {
    let refused = |problem: &str| Error::PasskeyRequired {
        decision: "this decision".into(),
        problem: problem.into(),
        ceremony_for: None,
    };
    let assertion: PublicKeyCredential = bounded("passkey_assertion", assertion)?;
    let row = ds
        .preauth_ceremony_take(&secret::hash_token(ceremony), "decision", Some(session.person_id()))
        .await?
        .ok_or_else(|| refused("the passkey check expired, was used already, or is another person's; confirm again"))?;
    let digest = row.decision.unwrap_or_default();
    let state: PasskeyAuthentication = from_json(row.state)?;
    let credential_id = assertion.get_credential_id().to_vec();
    let mut tx = ds.begin().await?;
    let stored = db::preauth_passkey_lock(&mut tx, &credential_id)
        .await?
        .filter(|r| r.person_id == session.person_id())
        .ok_or_else(|| refused("that passkey is not one of yours"))?;
    let mut passkey: Passkey = from_json(stored.passkey.clone())?;
    // Every way the assertion fails refuses the decision as a missing passkey would.
    let as_refusal = |e: Error| match e {
        Error::Unauthenticated(problem) => refused(&problem),
        other => other,
    };
    let result = rp
        .webauthn
        .finish_passkey_authentication(&assertion, &state)
        .map_err(|e| as_refusal(webauthn_refused("check", e)))?;
    advance(&mut tx, &stored, &mut passkey, &result).await.map_err(as_refusal)?;
    tx.commit().await?;
    Ok(Proof::passkey(
        session.person_id(),
        stored.handle,
        result.user_verified(),
        digest,
        jiff::Timestamp::now().as_second(),
    ))
}
