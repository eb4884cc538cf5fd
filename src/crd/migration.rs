//! `JobMigration`: move one running job of a bundle to another node
//! (`migrateJob`), namespaced with its bundle. `spec.abort` aborts it
//! (`abortMigration`) — a clean rollback only before the point of no return.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::drain::MigrationStrategy;
use crate::model::MigrationPhase;

/// The migration wanted.
#[serde_with::skip_serializing_none]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "automanager.norsk.video",
    version = "v1alpha1",
    doc = "A migration of one job of a bundle to another node.",
    kind = "JobMigration",
    namespaced,
    category = "norsk",
    shortname = "nmig",
    status = "JobMigrationStatus",
    printcolumn = r#"{"name":"Bundle","type":"string","jsonPath":".spec.bundle"}"#,
    printcolumn = r#"{"name":"Job","type":"string","jsonPath":".spec.jobName"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".status.targetNodeId"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.bundle == oldSelf.bundle && self.replicaIndex == oldSelf.replicaIndex && self.jobName == oldSelf.jobName && has(self.strategy) == has(oldSelf.strategy) && (!has(self.strategy) || self.strategy == oldSelf.strategy)",
     "message": "a migration's job and strategy cannot change: create another JobMigration"},
    {"rule": "!has(oldSelf.abort) || !oldSelf.abort || self.abort",
     "message": "an aborted migration cannot be resumed: create another JobMigration"}
]))]
pub struct JobMigrationSpec {
    /// The `Bundle` (in this namespace) the job belongs to.
    #[schemars(length(min = 1, max = 253))]
    pub bundle: String,
    /// 0 for the primary replica, 1 for the backup.
    #[serde(default)]
    #[schemars(range(min = 0, max = 1))]
    pub replica_index: u32,
    /// The job's name in the bundle.
    #[schemars(length(min = 1, max = 63))]
    pub job_name: String,
    /// How the job (and its co-located group) is moved: `stopThenStart`,
    /// `overlap` or `handover`. When absent, each job moves with the
    /// strategy it declares (`requirements.migrationStrategy` in its
    /// Bundle), else `stopThenStart`.
    pub strategy: Option<MigrationStrategy>,
    /// Pin the target node (placement chooses when absent; the job's
    /// current node is never a candidate).
    pub target_node_id: Option<String>,
    /// May take an exclusively reserved spare.
    #[serde(default)]
    pub override_reservation: bool,
    /// Abort: a clean rollback before the point of no return; after it the
    /// saga fails forward and the status says so.
    #[serde(default)]
    pub abort: bool,
}

/// One phase transition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTransition {
    /// The phase entered.
    pub phase: MigrationPhase,
    /// When (RFC 3339).
    pub at: String,
}

/// Another job of the migrating job's co-located group.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupMemberStatus {
    /// The runtime job.
    pub job_id: String,
    /// Its own migration, to the same target.
    pub migration_id: String,
}

/// What the migration saga reports.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobMigrationStatus {
    /// `Ready` (done), `Stalled` (aborted or lost).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The saga's id.
    pub migration_id: Option<String>,
    /// The phase the saga is in.
    pub phase: Option<MigrationPhase>,
    /// Every phase entered, in order, with its time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transitions: Vec<PhaseTransition>,
    /// The node the job leaves.
    pub source_node_id: Option<String>,
    /// The node the job goes to.
    pub target_node_id: Option<String>,
    /// The source instance's key.
    pub source_instance_key: Option<String>,
    /// The target instance's key (`primary@3f9c1e2a`).
    pub target_instance_key: Option<String>,
    /// The source has been told to stop: no clean rollback any more.
    #[serde(default)]
    pub point_of_no_return_passed: bool,
    /// The rest of the job's co-located group (`coLocateWith`,
    /// `sameNodeDefault`), moving with it to the same target, each in a
    /// migration of its own: a job of a group never moves alone. Empty when
    /// the job moves alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["jobId"]))]
    pub group: Vec<GroupMemberStatus>,
    /// How the job moves: the strategy asked for, or what the Manager at
    /// hand can carry out instead (see `note`).
    pub strategy: Option<MigrationStrategy>,
    /// Why `strategy` differs from the one asked for (a handover run as
    /// overlap on a Manager that relays no migration signals).
    pub note: Option<String>,
    /// Why it was aborted or failed forward; after a restart, whether it
    /// was resumed or failed forward from its recorded phase.
    pub reason: Option<String>,
}
