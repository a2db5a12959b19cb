use super::Decision;

/// What a refused person reads names the decision in words, never a value only a machine
/// reads (the consent's PKCE challenge, a content hash, a digest).
#[test]
fn every_decision_reads_in_words() {
    let challenge = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";
    let cases = [
        (
            Decision::consent(challenge, "ghc_1", "bookings:write").shown_as("Claude Code"),
            "Letting Claude Code act for you with bookings:write",
        ),
        (
            Decision::approve_action("pac_1", "hash-of-content"),
            "Approving the waiting action pac_1",
        ),
        (
            Decision::create_connection("Claude", &["bookings:read"], "full", "a@x", "cli"),
            "Creating the connection “Claude”",
        ),
        (Decision::create_api_token("ci", 30), "Creating the API token “ci”"),
        (Decision::identity_provider("connect", &[]), "Changing single sign-on (connect)"),
        (Decision::raise_role("per_1", "admin"), "Making per_1 admin"),
        (Decision::agent_access_on(), "Turning agent access on"),
        (Decision::global_switch_on(), "Turning agents back on platform-wide"),
        (Decision::raise_rate_limit("write", Some(60)), "Raising the write rate limit"),
        (
            Decision::raise_budget("tenant", "email", Some((10, 3600))),
            "Raising the budget on email for tenant",
        ),
        (
            Decision::loosen_approval_policy("tenant", "off", false),
            "Loosening the approval policy of tenant",
        ),
        (Decision::passkey_policy_off(), "Turning the passkey requirement off"),
        (
            Decision::audit_webhook("set", "https://siem.example"),
            "Changing the audit webhook (set)",
        ),
        (Decision::remove_passkey("pky_1"), "Removing the passkey pky_1"),
        (Decision::add_passkey("laptop"), "Adding the passkey “laptop”"),
    ];
    for (decision, words) in &cases {
        let label = decision.label();
        assert_eq!(label, *words);
        assert!(!label.contains(challenge) && !label.contains("hash-of-content"), "{label}");
        assert!(
            !label.contains('_')
                || label.contains("pac_1")
                || label.contains("per_1")
                || label.contains("pky_1"),
            "{label}"
        );
    }
}

#[test]
fn an_unknown_passkey_is_called_a_passkey() {
    let e = crate::Error::not_found(crate::error::Resource::Passkey, "pky_unknown");
    assert_eq!(e.to_string(), "no passkey pky_unknown among your passkeys");
}

/// A decision's digest names its tenant (an assertion made while working in one tenant
/// decides nothing in another) and every fact it sets; a person's own credentials and
/// the platform's switch belong to no tenant.
#[test]
fn a_digest_binds_the_tenant_and_every_fact() {
    let on = Decision::agent_access_on();
    assert_ne!(on.digest(Some("ten_a")), on.digest(Some("ten_b")));
    assert_ne!(on.digest(Some("ten_a")), Decision::passkey_policy_off().digest(Some("ten_a")));
    let a = Decision::approve_action("pac_1", "hash-1");
    assert_ne!(a.digest(Some("t")), Decision::approve_action("pac_2", "hash-1").digest(Some("t")));
    assert_ne!(a.digest(Some("t")), Decision::approve_action("pac_1", "hash-2").digest(Some("t")));
    let c = |creator: &str, client: &str| {
        Decision::create_connection("n", &["bookings:read"], "full", creator, client)
            .digest(Some("t"))
    };
    assert_ne!(c("a@x", "console"), c("b@x", "console"));
    assert_ne!(c("a@x", "console"), c("a@x", "other"));
    assert_eq!(
        Decision::create_connection("n", &["b", "a", "a"], "full", "A@X ", "c").digest(None),
        Decision::create_connection("n", &["a", "b"], "full", "a@x", "c").digest(None),
        "the same decision however its rights are listed"
    );
    let g = Decision::global_switch_on();
    assert_eq!(g.digest(Some("ten_a")), g.digest(None));
    let r = Decision::remove_passkey("pky_1");
    assert_eq!(r.digest(Some("ten_a")), r.digest(Some("ten_b")));
}
