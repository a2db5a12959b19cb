//! Public handles: prefixed random ids (`cus_…`, `bkg_…`). Internal keys never leave the
//! server; every lookup by handle also filters by the caller's tenant (R3).
//!
//! A handle value that exists has been checked for its prefix and alphabet (STYLE 4), so a
//! handle of the wrong kind (`cus_…` passed as a booking) fails before any query runs.

use std::fmt;
use std::marker::PhantomData;

use crate::error::{Error, Result};

/// The kinds of handle, each with its prefix.
pub trait Kind {
    const PREFIX: &'static str;
    const NOUN: &'static str;
}

macro_rules! kinds {
    ($($kind:ident => $prefix:literal, $noun:literal, $alias:ident;)*) => {
        $(
            #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
            pub struct $kind;
            impl Kind for $kind {
                const PREFIX: &'static str = $prefix;
                const NOUN: &'static str = $noun;
            }
            pub type $alias = Handle<$kind>;
        )*
    };
}

kinds! {
    TenantKind => "ten", "tenant", TenantHandle;
    PersonKind => "per", "person", PersonHandle;
    CustomerKind => "cus", "customer", CustomerHandle;
    TechnicianKind => "tec", "technician", TechnicianHandle;
    ServiceKind => "svc", "service", ServiceHandle;
    BookingKind => "bkg", "booking", BookingHandle;
    NoteKind => "bnt", "booking note", NoteHandle;
    ConnectionKind => "con", "connection", ConnectionHandle;
    ApiTokenKind => "apt", "API token", ApiTokenHandle;
    PasskeyKind => "pky", "passkey", PasskeyHandle;
    TaskKind => "tsk", "task", TaskHandle;
    InvitationKind => "inv", "invitation", InvitationHandle;
}

const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
const RANDOM_LEN: usize = 16;

pub struct Handle<K> {
    value: String,
    kind: PhantomData<K>,
}

impl<K> Clone for Handle<K> {
    fn clone(&self) -> Self {
        Handle { value: self.value.clone(), kind: PhantomData }
    }
}
impl<K> PartialEq for Handle<K> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}
impl<K> Eq for Handle<K> {}
impl<K> fmt::Debug for Handle<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.value)
    }
}
impl<K> fmt::Display for Handle<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.value)
    }
}

impl<K: Kind> Handle<K> {
    /// A new random handle (80 bits of entropy).
    pub fn generate() -> Self {
        let mut bytes = [0u8; RANDOM_LEN];
        getrandom::fill(&mut bytes).expect("the OS random source is available");
        let tail: String = bytes.iter().map(|b| ALPHABET[(*b & 31) as usize] as char).collect();
        Handle { value: format!("{}_{tail}", K::PREFIX), kind: PhantomData }
    }

    /// Parses a handle given by a caller; `field` names the argument for the error.
    pub fn parse(field: &str, input: &str) -> Result<Self> {
        let input = input.trim();
        let expected = || {
            format!("expected a {} handle like {}_{}", K::NOUN, K::PREFIX, "x".repeat(RANDOM_LEN))
        };
        let Some(tail) = input.strip_prefix(K::PREFIX).and_then(|t| t.strip_prefix('_')) else {
            return Err(Error::invalid(
                field,
                format!("{:?} is not a {} handle; {}", input, K::NOUN, expected()),
            ));
        };
        if tail.len() != RANDOM_LEN || !tail.bytes().all(|b| ALPHABET.contains(&b)) {
            return Err(Error::invalid(field, format!("{input:?} is malformed; {}", expected())));
        }
        Ok(Handle { value: input.to_owned(), kind: PhantomData })
    }

    /// Wraps a handle read from our own database.
    pub fn from_db(value: String) -> Self {
        Handle { value, kind: PhantomData }
    }

    pub fn as_str(&self) -> &str {
        &self.value
    }
}

impl<K> serde::Serialize for Handle<K> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.value)
    }
}

impl<K: Kind> schemars::JsonSchema for Handle<K> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Handle".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": format!("^{}_[0-9a-z]{{{}}}$", K::PREFIX, RANDOM_LEN),
            "description": format!("{} handle", K::NOUN),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_handles_parse_back() {
        let h = BookingHandle::generate();
        assert_eq!(BookingHandle::parse("booking", h.as_str()).unwrap(), h);
    }

    #[test]
    fn a_handle_of_another_kind_is_rejected_naming_the_expected_kind() {
        let customer = CustomerHandle::generate();
        let err = BookingHandle::parse("booking", customer.as_str()).unwrap_err().to_string();
        assert!(err.contains("is not a booking handle"), "{err}");
        assert!(BookingHandle::parse("booking", "bkg_' OR 1=1 --").is_err());
    }
}
