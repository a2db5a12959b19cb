//! Parsing the plain fields of writes at the edge: names, duplicate-guard overrides.

use crate::error::{Error, Result};

pub(crate) fn name(field: &str, raw: &str) -> Result<String> {
    label(field, raw, 120)
}

/// A name shown to people (a customer, a person, a connection, a token): one line of 1 to `max`
/// characters, nothing hidden. Every adapter's names pass here, so none reaches a summary, an
/// approver's email or an operator's terminal with a control or hidden character.
pub(crate) fn label(field: &str, raw: &str, max: usize) -> Result<String> {
    let n = raw.trim();
    if n.is_empty()
        || n.chars().count() > max
        || n.chars().any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'))
    {
        return Err(Error::invalid(
            field,
            format!("use 1 to {max} characters on one line without control characters"),
        ));
    }
    if let Some(why) = crate::text::refusal(n) {
        return Err(Error::invalid(field, format!("the name {why}")));
    }
    Ok(n.to_owned())
}

/// Why someone did something (a revocation, a switch), as the audit keeps it: 1 to `max`
/// characters, nothing hidden.
pub(crate) fn reason(raw: &str, max: usize) -> Result<String> {
    let r = raw.trim();
    if r.is_empty() || r.chars().count() > max {
        return Err(Error::invalid(
            "reason",
            format!("say why in 1 to {max} characters; it is kept in the audit log"),
        ));
    }
    if let Some(why) = crate::text::refusal(r) {
        return Err(Error::invalid("reason", format!("the reason {why}")));
    }
    Ok(r.to_owned())
}

/// An email, normalized to lower case; empty means "none".
pub(crate) fn email(raw: Option<&str>) -> Result<Option<String>> {
    let Some(e) = raw.map(str::trim).filter(|e| !e.is_empty()) else { return Ok(None) };
    // One plain address (addr-spec without quoting or comments): a list, a display name or
    // angle brackets would make a message go elsewhere, or to more people, than the preview
    // showed.
    let local_ok = |l: &str| {
        // ASCII only: a local part in other scripts is rare in practice and can look like
        // another address letter for letter.
        l.is_ascii()
            && !l.is_empty()
            && l.len() <= 64
            && !l.starts_with('.')
            && !l.ends_with('.')
            && !l.contains("..")
            && l.chars().all(|c| c.is_alphanumeric() || "!#$%&'*+-/=?^_`{|}~.".contains(c))
    };
    let domain_ok = |d: &str| {
        d.contains('.')
            && d.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label.chars().all(|c| c.is_alphanumeric() || c == '-')
            })
    };
    let valid = e.len() <= 254
        && e.split_once('@').is_some_and(|(local, domain)| local_ok(local) && domain_ok(domain));
    if !valid {
        return Err(Error::invalid("email", format!("{e:?} is not an email address")));
    }
    Ok(Some(e.to_lowercase()))
}

/// An address as a person approving a message should read it: a domain in another script than
/// ASCII is shown in its ASCII (punycode) form, so `exаmple.net` with a Cyrillic `а` cannot pass
/// for `example.net`.
pub(crate) fn shown_address(email: &str) -> String {
    match email.rsplit_once('@') {
        Some((local, domain)) if !domain.is_ascii() => match url::Host::parse(domain) {
            Ok(url::Host::Domain(ascii)) => format!("{local}@{ascii}"),
            _ => email.to_owned(),
        },
        _ => email.to_owned(),
    }
}

/// A phone number as given, and its digits (with a leading +) for the duplicate guard.
pub(crate) fn phone(raw: Option<&str>) -> Result<Option<(String, String)>> {
    let Some(p) = raw.map(str::trim).filter(|p| !p.is_empty()) else { return Ok(None) };
    let digits: String = p.chars().filter(|c| c.is_ascii_digit() || *c == '+').collect();
    let allowed = p.chars().all(|c| c.is_ascii_digit() || " +-()./".contains(c));
    if !allowed || digits.chars().filter(char::is_ascii_digit).count() < 6 || p.len() > 32 {
        return Err(Error::invalid(
            "phone",
            format!("{p:?} is not a phone number; use digits, spaces, + - ( ) . /"),
        ));
    }
    Ok(Some((p.to_owned(), digits)))
}

pub(crate) fn separate_reason(separate: bool, reason: Option<&str>) -> Result<Option<String>> {
    match (separate, reason.map(str::trim).filter(|r| !r.is_empty())) {
        (false, _) => Ok(None),
        (true, Some(r)) if let Some(why) = crate::text::refusal(r) => {
            Err(Error::invalid("reason", format!("the reason {why}")))
        }
        (true, Some(r)) if r.chars().count() <= 300 => Ok(Some(r.to_owned())),
        (true, Some(_)) => Err(Error::invalid("reason", "use at most 300 characters")),
        (true, None) => Err(Error::invalid(
            "reason",
            "`separate: true` needs a `reason` saying why a second record is right",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_email_is_one_plain_address() {
        for good in ["anna.fischer@example.net", "a+tag@mail.example.co.uk", "user@bücher.example"]
        {
            assert!(email(Some(good)).is_ok_and(|e| e.is_some()), "{good}");
        }
        for bad in [
            "eve1@evil.example,victim@corp.example",
            "eve@evil.example;victim@corp.example",
            "Eve <eve@evil.example>",
            "<eve@evil.example>",
            "\"eve\"@evil.example",
            "eve@evil.example (comment)",
            "eve@@evil.example",
            "eve@evil",
            "eve@.evil.example",
            "eve@evil..example",
            ".eve@evil.example",
            "eve@-evil.example",
            "eve@evil.example\r\nBcc: x@y.example",
        ] {
            assert!(email(Some(bad)).is_err(), "{bad}");
        }
        assert_eq!(email(Some("  ")).ok(), Some(None));
        assert!(email(Some("ａnna@example.net")).is_err(), "a local part in another script");
        // A look-alike domain shows as the different name it is.
        let lookalike = email(Some("anna@ex\u{0430}mple.net")).expect("an IDN").expect("some");
        assert!(
            shown_address(&lookalike).starts_with("anna@xn--"),
            "{}",
            shown_address(&lookalike)
        );
        assert_eq!(shown_address("anna@example.net"), "anna@example.net");
    }
}
