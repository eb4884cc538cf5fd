//! `NodeDrain`: take one node out of service gracefully (`drainNode`), or
//! ahead of a provider's reclaim (`handleNodeInterruption`), or at once
//! (`mode: evict` is `evictNode`, `mode: terminate` is `terminateNode`),
//! cluster-scoped. Deleting it before its terminate cancels a drain
//! (`uncordonNode`); an evict or terminate has nothing to cancel.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What becomes of the node once every job has left it: the core's own
/// word, so the spec, the status and the drain share one schema.
pub use crate::model::DrainAfter;
/// How a job is moved off the node: the model's strategy, so a drain, a
/// migration and a Bundle job's declaration share one schema.
pub use crate::model::MigrationStrategy;

use crate::model::DrainPhase;

crate::model::string_enum! {
    /// How the node is taken out of service.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum DrainMode {
        /// Migrate every job elsewhere, then terminate or keep the node
        /// (`drainNode`).
        #[default]
        Drain,
        /// Cordon, then terminate at once (`evictNode`): nothing migrates.
        Evict,
        /// Terminate at once without cordoning (`terminateNode`).
        Terminate,
    }
}

impl DrainMode {
    /// Whether the node is terminated at once, without migrating its jobs.
    pub fn is_at_once(self) -> bool {
        self != Self::Drain
    }
}

/// A provider's notice that it takes the node back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum InterruptionKind {
    /// A spot instance is reclaimed (EC2's two-minute warning).
    SpotInterruption,
    /// A rebalance recommendation.
    Rebalance,
}

impl From<InterruptionKind> for crate::model::InterruptionKind {
    fn from(kind: InterruptionKind) -> Self {
        match kind {
            InterruptionKind::SpotInterruption => Self::SpotInterruption,
            InterruptionKind::Rebalance => Self::Rebalance,
        }
    }
}

/// The interruption a drain answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Interruption {
    /// `spot-interruption` or `rebalance`.
    pub kind: InterruptionKind,
    /// When the provider reclaims the node (RFC 3339); the kind's default
    /// drain time when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
}

/// The drain wanted.
#[serde_with::skip_serializing_none]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "automanager.norsk.video",
    version = "v1alpha1",
    doc = "A drain of one node: its jobs migrated elsewhere, then the node terminated (or, with after: keep, kept cordoned for maintenance); with mode: evict or terminate, the node terminated at once.",
    kind = "NodeDrain",
    category = "norsk",
    shortname = "ndrain",
    status = "NodeDrainStatus",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeId"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode","description":"drain (when empty), evict or terminate"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Force","type":"boolean","jsonPath":".spec.force"}"#,
    printcolumn = r#"{"name":"After","type":"string","jsonPath":".status.after","description":"terminate, or keep (a maintenance drain)"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.nodeId == oldSelf.nodeId", "message": "nodeId cannot change: delete this drain and create another"},
    {"rule": "!has(self.interruption) || !has(self.after) || self.after == 'terminate'",
     "message": "a drain answering an interruption cannot keep its node: the provider takes it at the deadline"},
    {"rule": "(has(self.mode) ? self.mode : 'drain') == (has(oldSelf.mode) ? oldSelf.mode : 'drain')",
     "message": "mode cannot change: delete this NodeDrain and create another"},
    {"rule": "!has(self.mode) || self.mode == 'drain' || (!has(self.timeoutSeconds) && !(has(self.force) && self.force) && !has(self.strategy) && !has(self.after) && !has(self.interruption))",
     "message": "evict and terminate act at once: timeoutSeconds, force, strategy, after and interruption only apply to mode drain"}
]))]
pub struct NodeDrainSpec {
    /// The Manager node to drain.
    #[schemars(length(min = 1, max = 253))]
    pub node_id: String,
    /// How the node leaves service: `drain` (every job migrated elsewhere
    /// first, then the node terminated or kept as `after` says), `evict`
    /// (cordoned, then terminated at once: its jobs go down with it and
    /// recover per their `onRuntimeFailure`, like `kubectl delete node`
    /// rather than `kubectl drain`) or `terminate` (terminated at once
    /// without cordoning). Default `drain`. `evict` and `terminate` take
    /// none of the drain's options, end `done` once Manager stops the node
    /// (or `failed` with the reason) and are never issued twice: deleting
    /// the resource afterwards cancels nothing.
    pub mode: Option<DrainMode>,
    /// Seconds before a drain with stuck jobs ends `partial` (or, with
    /// `force`, terminates the node anyway). Default 600
    /// (`DEFAULT_DRAIN_TIMEOUT_MS`).
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: Option<u32>,
    /// Terminate at the timeout even with jobs still on the node.
    #[serde(default)]
    pub force: bool,
    /// How every job is migrated: `stopThenStart` (target prepared, source
    /// stopped, target started: a gap of one start), `overlap` (both run for
    /// a moment) or `handover` (cooperative). When absent, each job moves
    /// with the strategy it declares (`requirements.migrationStrategy` in
    /// its Bundle), else `stopThenStart`.
    pub strategy: Option<MigrationStrategy>,
    /// What becomes of the node once every job moved: `terminate` (the
    /// spec's drain) or `keep` (a maintenance drain: the node stays
    /// cordoned and running for planned work; the drain ends `done` and
    /// sets the NorskNode's spec.cordoned, so the cordon outlives leader
    /// changes and restarts; setting it back to false returns the node to
    /// service). A `partial` drain hands its cordon over the same way. Default:
    /// `terminate`, for every node (a registered cluster server too: ask for
    /// `keep` to do maintenance on it). `force` still terminates at the
    /// timeout.
    pub after: Option<DrainAfter>,
    /// The provider notice this drain answers (a forced drain sized to the
    /// deadline).
    pub interruption: Option<Interruption>,
}

/// One job of the drain.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainJobStatus {
    /// The runtime job.
    pub job_id: String,
    /// `migrating`, `migrated`, `moved`, `stuck` or `terminated` (it went
    /// down with the node: never counted as moved off).
    pub status: crate::model::DrainJobStatus,
    /// Its migration, while one runs.
    pub migration_id: Option<String>,
    /// The node its migration moves it to (once `migrated`, where it runs
    /// now).
    pub target_node_id: Option<String>,
    /// Why it is stuck, or how it went down with the node.
    pub reason: Option<String>,
}

/// Where the drain is: its phase, each job that was on the node and what
/// became of it, and why it ended as it did.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDrainStatus {
    /// `Ready` (the drain ended `done`: every job moved off), `Stalled`
    /// (`partial` / `failed`; reason `JobsLost` when jobs went down with the
    /// node).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// `migrating`, `waiting`, `terminating`, `done` (every job moved off,
    /// the node terminated, or kept cordoned with `after: keep`), `partial` (jobs stuck at the timeout; nothing
    /// terminated, the node still cordoned) or `failed` (jobs `terminated`
    /// with the node by a forced drain, the node stopped under the drain, or
    /// its terminate refused). An `evict` or `terminate` is `terminating`
    /// from the moment its terminate is issued (it is never issued again)
    /// until Manager stops the node (`done`) or it is refused (`failed`).
    pub phase: Option<DrainPhase>,
    /// What becomes of the node once every job moved: `terminate` or
    /// `keep` (the default resolved for the node).
    pub after: Option<DrainAfter>,
    /// When the drain started (RFC 3339).
    pub started: Option<String>,
    /// Every job that was on the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["jobId"]))]
    pub jobs: Vec<DrainJobStatus>,
    /// Why the drain ended as it did.
    pub reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{schema_names, serde_names};

    #[test]
    fn the_drain_mode_schema_lists_every_serde_name() {
        assert_eq!(schema_names::<DrainMode>(), serde_names(DrainMode::ALL));
    }
}
