//! The rights catalog and the roles that grant them.
//!
//! A right names one thing an actor may do. A membership's role decides a person's current
//! rights in a tenant; a connection's rights are capped by its creator's rights at creation,
//! and its live rights are recomputed on every call as token rights ∩ creator's current
//! rights (R4). Rights are a small bit set so that intersection is free on the hot path.

use crate::error::{Error, Result};

pub(crate) mod catalog;

pub use catalog::Right;

/// How much a set of rights lets an agent do, for lists to summarize and filter by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RightsLevel {
    /// Reads only.
    Read,
    /// Changes records, messages or pages people, nothing dangerous.
    Write,
    /// Holds at least one dangerous right ([`Right::is_dangerous`]).
    Dangerous,
}

impl RightsLevel {
    pub const ALL: [RightsLevel; 3] =
        [RightsLevel::Read, RightsLevel::Write, RightsLevel::Dangerous];

    pub fn as_str(self) -> &'static str {
        match self {
            RightsLevel::Read => "read",
            RightsLevel::Write => "write",
            RightsLevel::Dangerous => "dangerous",
        }
    }

    pub fn of(rights: RightSet) -> RightsLevel {
        if rights.iter().any(Right::is_dangerous) {
            RightsLevel::Dangerous
        } else if rights.iter().all(Right::reads_only) {
            RightsLevel::Read
        } else {
            RightsLevel::Write
        }
    }

    pub fn parse(field: &str, raw: &str) -> Result<RightsLevel> {
        RightsLevel::ALL
            .into_iter()
            .find(|l| l.as_str() == raw.trim())
            .ok_or_else(|| Error::invalid(field, "the rights level is read, write or dangerous"))
    }
}

/// The names of the dangerous rights (for SQL filters).
pub fn dangerous_names() -> Vec<&'static str> {
    Right::ALL.iter().copied().filter(|r| r.is_dangerous()).map(Right::as_str).collect()
}

impl std::str::FromStr for Right {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Right::ALL.iter().copied().find(|r| r.as_str() == s.trim()).ok_or_else(|| {
            Error::invalid_with_options(
                "rights",
                format!("unknown right {s:?}"),
                Right::ALL.iter().map(|r| r.as_str().to_owned()).collect(),
            )
        })
    }
}

/// A set of rights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RightSet(u32);

impl RightSet {
    pub const EMPTY: RightSet = RightSet(0);

    pub fn of(rights: &[Right]) -> Self {
        RightSet(rights.iter().fold(0, |acc, r| acc | r.bit()))
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn contains(self, right: Right) -> bool {
        self.0 & right.bit() != 0
    }

    pub fn intersect(self, other: RightSet) -> RightSet {
        RightSet(self.0 & other.0)
    }

    pub fn union(self, other: RightSet) -> RightSet {
        RightSet(self.0 | other.0)
    }

    /// The rights of `self` that `other` lacks.
    pub fn without(self, other: RightSet) -> RightSet {
        RightSet(self.0 & !other.0)
    }

    pub fn is_subset_of(self, other: RightSet) -> bool {
        self.0 & !other.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Right> {
        Right::ALL.iter().copied().filter(move |r| self.contains(*r))
    }

    pub fn names(self) -> Vec<String> {
        self.iter().map(|r| r.as_str().to_owned()).collect()
    }

    /// Parses stored or typed names. Unknown names are an error: a typo must not silently
    /// grant less (or, after a rename, more) than was meant.
    pub fn parse<S: AsRef<str>>(names: &[S]) -> Result<Self> {
        let mut set = RightSet::EMPTY;
        for name in names {
            let right: Right = name.as_ref().parse()?;
            set = RightSet(set.0 | right.bit());
        }
        Ok(set)
    }

    /// Parses stored names, dropping any the catalog no longer knows (fail closed).
    pub fn parse_lenient<S: AsRef<str>>(names: &[S]) -> Self {
        names
            .iter()
            .filter_map(|n| n.as_ref().parse::<Right>().ok())
            .fold(RightSet::EMPTY, |acc, r| RightSet(acc.0 | r.bit()))
    }
}

/// A membership role. Roles are the only way a person gets rights in a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Admin,
    Dispatcher,
    Viewer,
}

impl Role {
    pub const ALL: &'static [Role] = &[Role::Admin, Role::Dispatcher, Role::Viewer];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Dispatcher => "dispatcher",
            Role::Viewer => "viewer",
        }
    }

    pub fn rights(self) -> RightSet {
        use Right::*;
        match self {
            Role::Admin => RightSet::of(Right::ALL),
            Role::Dispatcher => RightSet::of(&[
                CustomersRead,
                CustomersWrite,
                TechniciansRead,
                TechniciansPage,
                BookingsRead,
                BookingsWrite,
                BookingsNotify,
                AlertsMute,
            ]),
            Role::Viewer => RightSet::of(&[CustomersRead, TechniciansRead, BookingsRead]),
        }
    }
}

impl std::str::FromStr for Role {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Role::ALL.iter().copied().find(|r| r.as_str() == s).ok_or_else(|| {
            Error::invalid_with_options(
                "role",
                format!("unknown role {s:?}"),
                Role::ALL.iter().map(|r| r.as_str().to_owned()).collect(),
            )
        })
    }
}

/// The read-only rights: what a "read-only" connection is granted.
pub fn read_only() -> RightSet {
    RightSet::of(&[Right::CustomersRead, Right::TechniciansRead, Right::BookingsRead])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intersection_narrows_to_the_creators_current_rights() {
        let token = Role::Admin.rights();
        let live = token.intersect(Role::Viewer.rights());
        assert!(live.contains(Right::BookingsRead));
        assert!(!live.contains(Right::BookingsNotify));
        assert!(live.is_subset_of(Role::Viewer.rights()));
    }

    #[test]
    fn unknown_right_names_are_rejected_with_the_catalog() {
        let err = RightSet::parse(&["bookings:read", "bookings:everything"]).unwrap_err();
        match err {
            Error::Invalid { options, .. } => assert!(options.contains(&"bookings:write".into())),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn stored_names_the_catalog_forgot_grant_nothing() {
        let set = RightSet::parse_lenient(&["bookings:read", "bookings:everything"]);
        assert_eq!(set, RightSet::of(&[Right::BookingsRead]));
    }
}
