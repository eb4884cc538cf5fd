//! What Manager may serve beyond the published API, one capability per
//! group of additions, and for each what the operator does with it, what it
//! does without it and what a user loses then. This table is the one place
//! that says so: the Manager port (`crate::manager::port`) decides by it,
//! the core runs a handover as overlap by it, and the startup log,
//! `/metrics` and `docs/manager-compatibility.md` read it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A group of additions Manager serves together or not at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Capability {
    /// `CreateBundle` / `UpdateBundle` / `DeleteBundle` / `StartBundleJob` /
    /// `StopBundleJob` and the bundle events.
    BundleStore,
    /// `UpdateNodeTags` and `node_tags_updated`.
    NodeTags,
    /// `StartJobRequest.defer_start`, `StartPreparedJob` and `job_prepared`.
    DeferredStart,
    /// `SendMigrationSignal` and `migration_signal`.
    MigrationSignals,
    /// `PrefetchImages` and `images_prefetched`.
    ImagePrefetch,
    /// `SetTerminalVerdict` and the verdict fields of jobs and bundles.
    TerminalVerdicts,
}

/// How the operator carries out a capability on the Manager at hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Mode {
    /// Manager serves the additions: they are used.
    Served,
    /// Manager does not: the operator does the same with the published API
    /// (or does without, where nothing published can stand in).
    Published,
}

impl Mode {
    /// The word the log, the metric label and the plugin use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Served => "served",
            Self::Published => "published",
        }
    }
}

impl Capability {
    /// Every capability, in the order they are reported.
    pub const ALL: [Self; 6] = [
        Self::BundleStore,
        Self::NodeTags,
        Self::DeferredStart,
        Self::MigrationSignals,
        Self::ImagePrefetch,
        Self::TerminalVerdicts,
    ];

    /// The name the log, the metric label and the plugin use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BundleStore => "bundleStore",
            Self::NodeTags => "nodeTags",
            Self::DeferredStart => "deferredStart",
            Self::MigrationSignals => "migrationSignals",
            Self::ImagePrefetch => "imagePrefetch",
            Self::TerminalVerdicts => "terminalVerdicts",
        }
    }

    /// The addition that tells whether Manager serves this capability: it
    /// is called once per connection with an empty request, which a Manager
    /// serving it refuses without effect (`INVALID_ARGUMENT` or
    /// `NOT_FOUND`) and one without it answers `UNIMPLEMENTED`.
    pub fn probe(self) -> &'static str {
        match self {
            Self::BundleStore => "DeleteBundle",
            Self::NodeTags => "UpdateNodeTags",
            Self::DeferredStart => "StartPreparedJob",
            Self::MigrationSignals => "SendMigrationSignal",
            Self::ImagePrefetch => "PrefetchImages",
            Self::TerminalVerdicts => "SetTerminalVerdict",
        }
    }

    /// The capability an addition belongs to (none for a published RPC).
    pub fn of_rpc(method: &str) -> Option<Self> {
        Some(match method {
            "CreateBundle" | "UpdateBundle" | "DeleteBundle" | "StartBundleJob" | "StopBundleJob" => Self::BundleStore,
            "UpdateNodeTags" => Self::NodeTags,
            "StartPreparedJob" => Self::DeferredStart,
            "SendMigrationSignal" => Self::MigrationSignals,
            "PrefetchImages" => Self::ImagePrefetch,
            "SetTerminalVerdict" => Self::TerminalVerdicts,
            _ => return None,
        })
    }

    /// What the operator does without the capability, and what a user
    /// loses then (empty: nothing).
    pub fn without(self) -> (&'static str, &'static str) {
        match self {
            Self::BundleStore => (
                "each Bundle is expanded by the operator into one Manager job per replica and job \
                 (CreateJob, UpdateJob, DeleteJob); the job id and tags say which bundle, replica, \
                 job and spec revision it is",
                "Manager's own tools see plain jobs, not bundles",
            ),
            Self::NodeTags => (
                "spare, consumed and cordon marks are kept by the operator (a spare is tagged as one \
                 when it is created)",
                "Manager's node tags do not show that a spare was consumed",
            ),
            Self::DeferredStart => (
                "a stopThenStart target is started with StartJob once its source has stopped",
                "the gap of a stopThenStart move is a stop plus a whole start, not a stop plus a \
                 prepared start",
            ),
            Self::MigrationSignals => (
                "a handover migration runs as overlap: the target starts, then the source stops",
                "no cooperative cut-over: source and target both run until the source stops",
            ),
            Self::ImagePrefetch => (
                "spares are not asked to pull images",
                "spares are warm only with the images they already hold",
            ),
            Self::TerminalVerdicts => (
                "broken bundles and dropped jobs are recorded by the operator",
                "other Manager clients do not see the verdict",
            ),
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The mode of every capability on the current connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Capabilities(BTreeMap<Capability, Mode>);

impl Default for Capabilities {
    /// Before Manager has been asked: everything on the published path,
    /// which works on every Manager.
    fn default() -> Self {
        Self(Capability::ALL.iter().map(|c| (*c, Mode::Published)).collect())
    }
}

impl Capabilities {
    /// Every capability served (a Manager with all the additions).
    pub fn all_served() -> Self {
        Self(Capability::ALL.iter().map(|c| (*c, Mode::Served)).collect())
    }

    /// How `capability` is carried out.
    pub fn mode(&self, capability: Capability) -> Mode {
        self.0.get(&capability).copied().unwrap_or(Mode::Published)
    }

    /// Whether Manager serves `capability`.
    pub fn serves(&self, capability: Capability) -> bool {
        self.mode(capability) == Mode::Served
    }

    /// Sets how `capability` is carried out; true when that changed.
    pub fn set(&mut self, capability: Capability, mode: Mode) -> bool {
        self.0.insert(capability, mode) != Some(mode)
    }

    /// Each capability with its mode.
    pub fn iter(&self) -> impl Iterator<Item = (Capability, Mode)> + '_ {
        self.0.iter().map(|(c, m)| (*c, *m))
    }

    /// One line for the log: `bundleStore=published nodeTags=served ...`.
    pub fn summary(&self) -> String {
        self.iter()
            .map(|(c, m)| format!("{c}={}", m.as_str()))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Tag changes the operator keeps for one node because Manager cannot
/// store them (no `UpdateNodeTags`): a spare that took a job has its spare
/// tags removed, a spare's reservation is set. Shown on the node with
/// Manager's own tags underneath; recorded in the `NorskNode`'s status so
/// that a new leader, after a restart or a leader change, shows the node as
/// the operator left it rather than as it was created.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeptTags {
    /// Tags set (name -> value).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    /// Tags removed.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub removed: BTreeSet<String>,
}

impl KeptTags {
    /// Whether the changes leave Manager's tags as they are.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.removed.is_empty()
    }

    /// Manager's `tags` with the changes made.
    pub fn apply(&self, tags: &mut std::collections::HashMap<String, String>) {
        for name in &self.removed {
            tags.remove(name);
        }
        tags.extend(self.set.iter().map(|(k, v)| (k.clone(), v.clone())));
    }

    /// Adds one change: `set` then `remove`d names, as `UpdateNodeTags`.
    pub fn change(&mut self, set: &BTreeMap<String, String>, remove: &[String]) {
        for name in remove {
            self.set.remove(name);
            self.removed.insert(name.clone());
        }
        for (name, value) in set {
            self.removed.remove(name);
            self.set.insert(name.clone(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_manager_is_asked_every_capability_takes_the_published_path() {
        let caps = Capabilities::default();
        assert!(Capability::ALL.iter().all(|c| !caps.serves(*c)));
        let mut caps = Capabilities::all_served();
        assert!(caps.set(Capability::NodeTags, Mode::Published));
        assert!(!caps.set(Capability::NodeTags, Mode::Published));
        assert_eq!(
            caps.summary(),
            "bundleStore=served nodeTags=published deferredStart=served migrationSignals=served \
             imagePrefetch=served terminalVerdicts=served"
        );
    }
}
