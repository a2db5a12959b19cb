//! A person's passkeys: registering one (a WebAuthn ceremony), listing and removing them.

use super::*;

/// A registered passkey, as its owner sees it.
#[derive(Debug, Clone, Serialize)]
pub struct PasskeySummary {
    pub passkey: String,
    pub name: String,
    pub created_at: String,
    pub last_used_at: Option<String>,
}

pub(super) fn summary(row: &PasskeyRow) -> PasskeySummary {
    let at = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%dT%H:%M:%SZ").to_string();
    PasskeySummary {
        passkey: row.handle.clone(),
        name: row.name.clone(),
        created_at: at(row.created_at),
        last_used_at: row.last_used_at.map(at),
    }
}

pub async fn list(ds: &Services, session: &ConsoleSession) -> Result<Vec<PasskeySummary>> {
    Ok(ds.preauth_passkeys_of(session.person_id()).await?.iter().map(summary).collect())
}

/// What a person shows before adding a passkey: an assertion with one they hold (when they
/// hold any), else their password, else a session begun in the last ten minutes.
pub enum StepUp<'a> {
    Passkey(Option<&'a Proof>),
    Password(&'a str),
}

pub(super) fn passkey_name(raw: &str) -> Result<String> {
    crate::services::fields::label("name", raw, 60)
}

/// A ceremony's id for the browser, and its hash for the row.
pub(super) fn ceremony_id() -> (String, Vec<u8>) {
    let id = secret::generate(CredentialKind::Session)["gh_ses_".len()..].to_owned();
    let hash = secret::hash_token(&id).to_vec();
    (id, hash)
}

pub(super) fn webauthn_refused(what: &str, e: WebauthnError) -> Error {
    tracing::info!(error = %e, "{what} refused");
    Error::Unauthenticated(format!("The passkey {what} did not verify ({e}); try again."))
}

pub(super) fn bounded<T: serde::de::DeserializeOwned>(field: &str, raw: &str) -> Result<T> {
    if raw.len() > MAX_CREDENTIAL_BYTES {
        return Err(Error::invalid(field, "the browser's answer is too large"));
    }
    serde_json::from_str(raw)
        .map_err(|e| Error::invalid(field, format!("not a WebAuthn credential: {e}")))
}

pub(super) fn to_json<T: Serialize>(value: &T) -> Result<serde_json::Value> {
    serde_json::to_value(value).map_err(|e| Error::Internal(e.to_string()))
}

pub(super) fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T> {
    serde_json::from_value(value).map_err(|e| Error::Internal(format!("ceremony state: {e}")))
}

/// Starts adding a passkey: checks the step-up, then returns the ceremony id and the options
/// for `navigator.credentials.create` (a discoverable credential, user verification required).
pub async fn register_begin(
    ds: &Services,
    rp: &RelyingParty,
    session: &ConsoleSession,
    name: &str,
    step_up: StepUp<'_>,
) -> Result<(String, serde_json::Value)> {
    let name = passkey_name(name)?;
    let person = ds
        .preauth_passkey_person(session.person_id())
        .await?
        .filter(|p| p.active)
        .ok_or(Error::NoActor)?;
    let existing = ds.preauth_passkeys_of(person.id).await?;
    let decision = Decision::add_passkey(&name);
    let now = jiff::Timestamp::now().as_second();
    match step_up {
        _ if !existing.is_empty() => {
            let StepUp::Passkey(Some(proof)) = step_up else {
                return Err(Error::PasskeyRequired {
                    decision: decision.label(),
                    problem: "you hold a passkey already; confirm with it to add another".into(),
                    ceremony_for: Some(decision.asked(None)),
                });
            };
            if !proof.covers(person.id, &decision.digest(None), now, PROOF_MAX_AGE_SECS) {
                return Err(Error::PasskeyRequired {
                    decision: decision.label(),
                    problem: "the passkey check was made for another decision; confirm again"
                        .into(),
                    ceremony_for: Some(decision.asked(None)),
                });
            }
        }
        StepUp::Password(password) if person.password_hash.is_some() => {
            let hash = person.password_hash.clone();
            if !ds.verify_password(password, hash).await? {
                return Err(Error::invalid(
                    "password",
                    "the password is wrong; enter the one you sign in with",
                ));
            }
        }
        _ if person.password_hash.is_some() => {
            return Err(Error::invalid(
                "password",
                "enter your password to add your first passkey",
            ));
        }
        // No password: only a session the person's own organization just started, and only
        // when every tenant they belong to is that organization's (a passkey signs in
        // everywhere the person is a member; one IdP vouches for its own tenant alone).
        _ => {
            let memberships = ds.preauth_memberships_of(person.id).await?;
            let home = session.tenant_id();
            let one_home = session.idp_id().is_some()
                && home.is_some()
                && memberships.iter().all(|m| Some(m.tenant_id) == home);
            if !one_home {
                return Err(Error::invalid(
                    "password",
                    "set a password first (an operator can: gatehousectl password-reset), then add your first passkey with it",
                ));
            }
            if session.age_secs() > FRESH_SESSION_SECS {
                return Err(Error::invalid(
                    "session",
                    "sign out and in again through your organization, then add your first passkey within ten minutes",
                ));
            }
        }
    }
    let uuid = Uuid::parse_str(&person.webauthn_id).map_err(|e| Error::Internal(e.to_string()))?;
    let exclude: Vec<CredentialID> = existing
        .iter()
        .filter_map(|r| from_json::<Passkey>(r.passkey.clone()).ok())
        .map(|p| p.cred_id().clone())
        .collect();
    let (options, state) = rp
        .webauthn
        .start_passkey_registration(uuid, &person.email, &person.name, Some(exclude))
        .map_err(|e| Error::Internal(format!("passkey registration: {e}")))?;
    let mut options = to_json(&options)?;
    // Discoverable, so the person can sign in with it without typing an email.
    options["publicKey"]["authenticatorSelection"] = serde_json::json!({
        "residentKey": "required", "requireResidentKey": true, "userVerification": "required",
    });
    let (id, hash) = ceremony_id();
    let state = serde_json::json!({ "name": name, "state": to_json(&state)? });
    ds.preauth_ceremony_create(&hash, "register", Some(person.id), None, &state, CEREMONY_TTL_SECS)
        .await?;
    Ok((id, options))
}

/// Finishes adding a passkey with the browser's credential; audited in the session's tenant.
pub async fn register_finish(
    ds: &Services,
    rp: &RelyingParty,
    session: &ConsoleSession,
    ceremony: &str,
    credential: &str,
) -> Result<PasskeySummary> {
    let credential: RegisterPublicKeyCredential = bounded("credential", credential)?;
    let row = ds
        .preauth_ceremony_take(&secret::hash_token(ceremony), "register", Some(session.person_id()))
        .await?
        .ok_or_else(|| {
            Error::invalid("ceremony", "this passkey request expired or was used; start again")
        })?;
    let mut state = row.state;
    let name = state["name"].as_str().unwrap_or("Passkey").to_owned();
    let reg: PasskeyRegistration = from_json(state["state"].take())?;
    let passkey = rp
        .webauthn
        .finish_passkey_registration(&credential, &reg)
        .map_err(|e| webauthn_refused("registration", e))?;
    let handle = PasskeyHandle::generate();
    let stored = ds
        .preauth_passkey_insert(
            session.person_id(),
            handle.as_str(),
            passkey.cred_id().as_ref(),
            &name,
            &to_json(&passkey)?,
        )
        .await?
        .ok_or_else(|| Error::invalid("credential", "this passkey is registered already"))?;
    audit_person(ds, session, "passkey.add", &stored.handle, &name).await?;
    Ok(summary(&stored))
}

/// Removes one of the person's own passkeys, audited. It needs an assertion by one of their
/// passkeys made for this removal: a stolen session cannot strip a person of their keys (one
/// who lost them all asks an operator, `gatehousectl passkey reset`).
pub async fn remove(
    ds: &Services,
    session: &ConsoleSession,
    handle: &str,
    proof: Option<&Proof>,
) -> Result<()> {
    let handle = PasskeyHandle::parse("passkey", handle)?;
    let decision = Decision::remove_passkey(handle.as_str());
    let now = jiff::Timestamp::now().as_second();
    let digest = decision.digest(None);
    if !proof.is_some_and(|p| p.covers(session.person_id(), &digest, now, PROOF_MAX_AGE_SECS)) {
        return Err(Error::PasskeyRequired {
            decision: decision.label(),
            problem: "confirm with one of your passkeys; lost them all? an operator resets them (gatehousectl passkey reset)".into(),
            ceremony_for: Some(decision.asked(None)),
        });
    }
    let row = ds
        .preauth_passkey_delete(session.person_id(), handle.as_str())
        .await?
        .ok_or_else(|| Error::not_found(crate::error::Resource::Passkey, handle.as_str()))?;
    audit_person(ds, session, "passkey.remove", &row.handle, &row.name).await
}

/// A person's own credential change, in the audit of the tenant the session works in (and
/// of the platform when it works in none).
pub(super) async fn audit_person(
    ds: &Services,
    session: &ConsoleSession,
    action: &str,
    handle: &str,
    name: &str,
) -> Result<()> {
    let mut tx = ds.begin().await?;
    match crate::services::console::session_ctx(session) {
        Some(ctx) => {
            let mut entry = AuditEntry::ok(action, vec![handle.to_owned()]);
            entry.reason = Some(name);
            db::audit_insert(&mut tx, &ctx, entry).await?;
        }
        None => {
            db::platform_audit_insert(
                &mut tx,
                "console",
                Some(session.person_id()),
                action,
                handle,
            )
            .await?;
        }
    }
    tx.commit().await?;
    Ok(())
}
