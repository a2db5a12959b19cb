//! The catalog of rights: each right's name, its description and its bit. Nothing here can
//! fail, so the kernel's error type names a right without the rights module's parsers.

use std::fmt;

macro_rules! rights {
    ($($variant:ident = $bit:expr, $name:literal, $what:literal;)*) => {
        /// One right. The string form (`bookings:read`) is what tokens, the CLI and the
        /// console use.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Right { $($variant),* }

        impl Right {
            pub const ALL: &'static [Right] = &[$(Right::$variant),*];

            pub fn as_str(self) -> &'static str {
                match self { $(Right::$variant => $name),* }
            }

            pub fn description(self) -> &'static str {
                match self { $(Right::$variant => $what),* }
            }

            pub(crate) fn bit(self) -> u32 {
                match self { $(Right::$variant => 1 << $bit),* }
            }
        }
    };
}

rights! {
    CustomersRead = 0, "customers:read", "see customers and their contact details";
    CustomersWrite = 1, "customers:write", "create and edit customers";
    CustomersDelete = 2, "customers:delete", "delete customers";
    TechniciansRead = 3, "technicians:read", "see technicians";
    TechniciansPage = 4, "technicians:page", "page a technician";
    BookingsRead = 5, "bookings:read", "see bookings and their notes";
    BookingsWrite = 6, "bookings:write", "create drafts and edit internal booking fields";
    BookingsNotify = 7, "bookings:notify", "confirm, reschedule or cancel bookings and message customers";
    BookingsDelete = 8, "bookings:delete", "delete bookings";
    AlertsMute = 9, "alerts:mute", "mute alert rules for a bounded time";
    AuditRead = 10, "audit:read", "read the audit log";
    ConnectionsManage = 11, "connections:manage", "create and revoke agent connections";
    PeopleManage = 12, "people:manage", "change roles and deactivate people";
    TenantSwitch = 13, "tenant:switch", "turn agent access for the tenant off and on";
}

impl Right {
    /// Rights an over-privileged agent is spotted by: managing credentials or people,
    /// switching the tenant, deleting records.
    pub fn is_dangerous(self) -> bool {
        matches!(
            self,
            Right::CustomersDelete
                | Right::BookingsDelete
                | Right::ConnectionsManage
                | Right::PeopleManage
                | Right::TenantSwitch
        )
    }

    /// Whether the right only reads.
    pub fn reads_only(self) -> bool {
        self.as_str().ends_with(":read")
    }
}

impl fmt::Display for Right {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
