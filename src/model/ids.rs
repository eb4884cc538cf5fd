//! Identifiers. Each is a newtype so a node id cannot be passed where a job
//! id is expected.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }
    };
}

string_id!(
    /// A Manager node id.
    NodeId
);
string_id!(
    /// A runtime job id. Bundle jobs use `<bundle id>/<replica>/<job name>`.
    JobId
);
string_id!(
    /// A bundle id; bundles from Kubernetes use `<namespace>/<name>`.
    BundleId
);
string_id!(
    /// A migration's id: eight hex digits, which are also the tag of the
    /// target's instance key (`migrationTargetRole(slot, id)`:
    /// `primary@3f9c1e2a`).
    MigrationId
);

impl MigrationId {
    /// The id of tag `tag`.
    pub fn of_tag(tag: u32) -> Self {
        Self(format!("{tag:08x}"))
    }
}

/// Which copy of a bundle a runtime job belongs to. Replica 0 is the
/// primary; replica 1, present only with a resilience policy, the backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Slot {
    /// Replica index 0.
    Primary,
    /// Replica index 1.
    Backup,
}

impl Slot {
    /// The slot of a replica index (anything but 0 is the backup; there is no
    /// N-way redundancy).
    pub fn of_replica(replica_index: u32) -> Self {
        if replica_index == 0 {
            Slot::Primary
        } else {
            Slot::Backup
        }
    }

    /// The replica index of this slot.
    pub fn replica_index(self) -> u32 {
        match self {
            Slot::Primary => 0,
            Slot::Backup => 1,
        }
    }

    /// The slot's wire name, told to the runtime in `NORSK_RUNTIME_ROLE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Slot::Primary => "primary",
            Slot::Backup => "backup",
        }
    }
}

/// The address of one running instance of a job: the slot (`primary`) or,
/// for a migration target, `<slot>@<8 hex digits>` (`primary@3f9c1e2a`).
/// Carried in Manager's `role` field. Any other string a plain Manager job
/// uses is kept verbatim.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct InstanceKey(pub String);

impl InstanceKey {
    /// The key of a slot's original instance.
    pub fn slot(slot: Slot) -> Self {
        Self(slot.as_str().to_owned())
    }

    /// `migrationTargetRole(slot, id)`: the key a migration target wears.
    pub fn migration_target(slot: Slot, tag: u32) -> Self {
        Self(format!("{}@{tag:08x}", slot.as_str()))
    }

    /// The slot this key belongs to, when it names one.
    pub fn slot_of(&self) -> Option<Slot> {
        let base = self.0.split('@').next().unwrap_or_default();
        match base {
            "primary" => Some(Slot::Primary),
            "backup" => Some(Slot::Backup),
            _ => None,
        }
    }

    /// Whether this is the key a migration target wears
    /// (`<slot>@<tag>`).
    pub fn is_migration_target(&self) -> bool {
        self.slot_of().is_some() && self.0.contains('@')
    }

    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstanceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The runtime job id Manager gives a bundle job:
/// `<bundle id>/<replica index>/<job name>`.
pub fn runtime_job_id(bundle: &BundleId, replica_index: u32, job_name: &str) -> JobId {
    JobId(format!("{bundle}/{replica_index}/{job_name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_target_key_carries_slot_and_eight_hex_digits() {
        let key = InstanceKey::migration_target(Slot::Primary, 0x3f9c1e2a);
        assert_eq!(key.as_str(), "primary@3f9c1e2a");
        assert_eq!(key.slot_of(), Some(Slot::Primary));
        assert_eq!(
            InstanceKey::migration_target(Slot::Backup, 1).as_str(),
            "backup@00000001"
        );
    }

    #[test]
    fn foreign_role_has_no_slot() {
        assert_eq!(InstanceKey("worker-7".into()).slot_of(), None);
    }
}
