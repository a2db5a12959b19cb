//! What the rails answer, as types: [`Written`] for a silent write (R8), and for the two-step
//! rail (R7): every two-step tool, `confirm_action`,
//! `reject_action`, the console's Approvals page, the REST API and the multi round-trip path
//! present these, and the tools' output schemas are derived from them, so a schema and the
//! value it describes cannot drift.
//!
//! A [`Preview`] carries what the rail knows beyond what the caller is shown (the content hash
//! and expiry of its pending action), so the multi round-trip path seals it without reading
//! the pending action again.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use super::rails::Written;
use crate::time::TimeView;
use crate::views::BookingView;

/// Whether a prepared action waits for the agent's confirmation or for a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PreviewStatus {
    /// The agent confirms with `confirm_action` (or the person in the client's own form).
    Preview,
    /// A person approves in the console; the agent cannot complete it.
    AwaitingApproval,
}

// Never read back from JSON: the fields the caller is not shown exist only in the preview the
// rail returned. (A plain comment: the doc comment below is what models read.)
/// A prepared action: nothing has happened yet.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Preview {
    /// PREVIEW, or AWAITING_APPROVAL when a person must approve it in the console.
    pub status: PreviewStatus,
    /// The pending action's handle (pac_…).
    pub action: String,
    pub tool: String,
    /// Single-use token for confirm_action or reject_action.
    pub confirm_token: String,
    /// What will happen, written by the server; pass it back unchanged to confirm.
    pub confirm_summary: String,
    pub expires: TimeView,
    /// The details of what will be sent or changed.
    pub effect: Map<String, Value>,
    pub next: String,
    /// The hash of exactly what the action will send or change (never shown).
    #[serde(skip)]
    #[schemars(skip)]
    pub content_hash: String,
    /// When the pending action expires, in seconds since the epoch (never shown).
    #[serde(skip)]
    #[schemars(skip)]
    pub expires_at: i64,
}

/// Always EXECUTED.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ExecutedStatus {
    Executed,
}

/// Who approved an action a person had to approve, and why.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Approval {
    /// The approving person's handle.
    pub by: Option<String>,
    pub reason: String,
    /// How the approving person proved themself: `with a passkey`, or the way their
    /// console session began when the tenant does not ask for a passkey.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proven: Option<String>,
}

/// What an executed action changed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Changed {
    Bookings {
        bookings: Vec<BookingView>,
    },
    Booking {
        booking: Box<BookingView>,
    },
    Muted {
        muted_until: TimeView,
    },
    Deleted {
        deleted: Vec<String>,
    },
    /// Messages only.
    Nothing(NothingChanged),
}

// Closed, so that no other shape reads back as "nothing changed".
/// No record changed; the effect was its messages.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NothingChanged {}

/// What an executed action changed and how many messages it queued.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ExecutedResult {
    pub changed: Changed,
    pub messages_queued: usize,
}

/// An executed action.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Executed {
    pub status: ExecutedStatus,
    pub action: String,
    pub tool: String,
    pub summary: String,
    /// What changed and how many messages were queued.
    pub result: ExecutedResult,
    /// Present when a person approved it in the console.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<Approval>,
}

/// Always REJECTED.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RejectedStatus {
    Rejected,
}

/// A rejected action.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Rejected {
    pub status: RejectedStatus,
    pub action: String,
    pub tool: String,
}

impl Rejected {
    pub(crate) fn new(action: String, tool: String) -> Rejected {
        Rejected { status: RejectedStatus::Rejected, action, tool }
    }
}

/// What a two-step tool answers: a preview, or, once the person answered in the client's own
/// form (multi round-trip), the executed or rejected action.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Outcome {
    Preview(Preview),
    Executed(Executed),
    Rejected(Rejected),
}

impl From<Preview> for Outcome {
    fn from(p: Preview) -> Outcome {
        Outcome::Preview(p)
    }
}

impl From<Executed> for Outcome {
    fn from(e: Executed) -> Outcome {
        Outcome::Executed(e)
    }
}

impl From<Rejected> for Outcome {
    fn from(r: Rejected) -> Outcome {
        Outcome::Rejected(r)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A stored result is read back as what it was: an unknown shape is an error, never
    /// "nothing changed".
    #[test]
    fn a_stored_change_reads_back_as_itself() {
        let read = |v| serde_json::from_value::<Changed>(v);
        assert!(matches!(read(json!({})), Ok(Changed::Nothing(_))));
        assert!(matches!(read(json!({"deleted": ["cus_1"]})), Ok(Changed::Deleted { .. })));
        assert!(read(json!({"moved": "bkg_1"})).is_err());
        let deleted = Changed::Deleted { deleted: vec!["bkg_1".into()] };
        let again = read(serde_json::to_value(&deleted).expect("json")).expect("reads");
        assert!(matches!(again, Changed::Deleted { deleted } if deleted == ["bkg_1"]));
    }
}
