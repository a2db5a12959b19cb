//! Effect classes (R6): what a tool's code path does, exactly one per tool. Hints, rate
//! buckets, the duty to preview and the per-class policy all follow from the class.

/// What an operation does to the world outside Gatehouse's own records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EffectClass {
    /// Reads only.
    Read,
    /// Writes records nobody outside is told about (drafts, internal fields, staff notes).
    SilentWrite,
    /// Reaches customers or changes what they see.
    Notify,
    /// Pages or calls a person.
    Wake,
    /// Mutes, pauses or reroutes alerts.
    Alert,
    /// Deletes records.
    Delete,
}

impl EffectClass {
    /// The class of this name (`read`, `silent_write`, …).
    pub fn parse(name: &str) -> Option<EffectClass> {
        [
            EffectClass::Read,
            EffectClass::SilentWrite,
            EffectClass::Notify,
            EffectClass::Wake,
            EffectClass::Alert,
            EffectClass::Delete,
        ]
        .into_iter()
        .find(|c| c.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EffectClass::Read => "read",
            EffectClass::SilentWrite => "silent_write",
            EffectClass::Notify => "notify",
            EffectClass::Wake => "wake",
            EffectClass::Alert => "alert",
            EffectClass::Delete => "delete",
        }
    }

    /// Whether the class takes two steps (R7): prepared by the tool, executed by a confirmation.
    pub fn two_step(self) -> bool {
        matches!(
            self,
            EffectClass::Notify | EffectClass::Wake | EffectClass::Alert | EffectClass::Delete
        )
    }
}

/// The default allowance of a rate class (`read`, `silent_write`, `notify`, …) per connection
/// and minute, defined once.
pub fn default_per_minute(class: &str) -> i32 {
    match class {
        "read" => 600,
        "silent_write" => 120,
        "notify" => 30,
        "wake" => 10,
        "alert" => 10,
        "delete" => 20,
        _ => 60,
    }
}
