//! Parsing the plain fields of writes at the edge: names, duplicate-guard overrides.

use crate::error::{Error, Result};

pub(crate) fn name(field: &str, raw: &str) -> Result<String> {
    let n = raw.trim();
    if n.is_empty() || n.chars().count() > 120 || n.chars().any(char::is_control) {
        return Err(Error::invalid(field, "use 1 to 120 characters without control characters"));
    }
    Ok(n.to_owned())
}

/// An email, normalized to lower case; empty means "none".
pub(crate) fn email(raw: Option<&str>) -> Result<Option<String>> {
    let Some(e) = raw.map(str::trim).filter(|e| !e.is_empty()) else { return Ok(None) };
    let valid = e.len() <= 254
        && e.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty() && domain.contains('.') && !domain.starts_with('.')
        })
        && !e.chars().any(|c| c.is_whitespace() || c.is_control());
    if !valid {
        return Err(Error::invalid("email", format!("{e:?} is not an email address")));
    }
    Ok(Some(e.to_lowercase()))
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
        (true, Some(r)) if r.chars().count() <= 300 => Ok(Some(r.to_owned())),
        (true, Some(_)) => Err(Error::invalid("reason", "use at most 300 characters")),
        (true, None) => Err(Error::invalid(
            "reason",
            "`separate: true` needs a `reason` saying why a second record is right",
        )),
    }
}
