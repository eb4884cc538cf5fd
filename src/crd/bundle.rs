//! `Bundle`: the unit of work users submit, namespaced. The bundle id is
//! `<namespace>/<name>`.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::{BundleId, BundleSpec, DateTime, JobPhase, SchedulePhase};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// The namespace of a bundle document that names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The desired bundle: its jobs, the pool they are placed into and the
/// rules between them. Its id on Manager is `<namespace>/<name>`.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "automanager.norsk.video",
    version = "v1alpha1",
    doc = "A bundle of jobs placed as a primary copy and, with a resilience policy, one backup.",
    kind = "Bundle",
    namespaced,
    category = "norsk",
    shortname = "nbundle",
    status = "BundleStatus",
    printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".spec.pool"}"#,
    printcolumn = r#"{"name":"Primary","type":"string","jsonPath":".status.primaryNode","description":"The node of the primary replica's first job"}"#,
    printcolumn = r#"{"name":"Backup","type":"string","jsonPath":".status.backupNode","description":"The node of the backup replica's first job"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Schedule","type":"string","jsonPath":".status.schedule.phase","description":"A scheduled bundle's phase: waiting, placing, live or ended","priority":1}"#,
    printcolumn = r#"{"name":"Next","type":"date","jsonPath":".status.schedule.nextTransitionTime","description":"When the schedule's next phase comes","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(transparent)]
pub struct BundleResourceSpec(pub BundleSpec);

/// What the operator observed: where every job of every replica is, the
/// schedule's phase, and conditions `Ready`, `Placed`, `Degraded`
/// (resilience degraded), `Broken` and `Admitted` (what admission against
/// the fleet found). A scheduled bundle is `Ready` while it waits for its
/// placement lead (reason `Scheduled`) and once it ended (`Ended`): it is
/// where its schedule says it should be.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BundleStatus {
    /// The generation the status describes.
    pub observed_generation: Option<i64>,
    /// `Ready` and the conditions it summarises.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The node of the primary replica's first job (what `kubectl get` shows).
    pub primary_node: Option<String>,
    /// The node of the backup replica's first job.
    pub backup_node: Option<String>,
    /// Per replica (0 primary, 1 backup), its jobs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["index"]))]
    pub replicas: Vec<ReplicaStatus>,
    /// Why the bundle is broken (no replica is placed again until it is
    /// updated or deleted).
    pub broken: Option<String>,
    /// A scheduled bundle's window and what comes next.
    pub schedule: Option<ScheduleStatus>,
}

/// Where a scheduled bundle stands: `waiting` until `placingFrom` (its start
/// less the pool's placement lead), `placing` until `start`, `live` until
/// `end`, then `ended` (its jobs completed and not placed again).
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleStatus {
    /// `waiting`, `placing`, `live` or `ended`.
    pub phase: SchedulePhase,
    /// When placement starts (the start less the pool's `placementLeadMs`).
    pub placing_from: DateTime,
    /// When the production goes on air.
    pub start: DateTime,
    /// When it ends, if it does.
    pub end: Option<DateTime>,
    /// The phase that comes next.
    pub next_phase: Option<SchedulePhase>,
    /// When it comes.
    pub next_transition_time: Option<DateTime>,
}

/// One replica of a bundle.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    /// 0 for the primary, 1 for the backup.
    pub index: u32,
    /// Its jobs, in bundle order.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["jobName"]))]
    pub jobs: Vec<JobStatus>,
}

/// One job of one replica, as placed and as Manager last reported it.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    /// The job's name in the bundle.
    pub job_name: String,
    /// The runtime job id on Manager (`<bundle id>/<replica>/<job name>`).
    pub job_id: String,
    /// The node it is placed on.
    pub node: Option<String>,
    /// The key its instance wears (`primary`, `backup`, `primary@3f9c1e2a`).
    pub instance_key: Option<String>,
    /// `pending`, `scheduled` (waiting for its schedule's placement lead),
    /// `awaitingCapacity`, `awaitingNode`, `starting`, `running`,
    /// `stopping` (a stopped manual job, or one of an ended schedule, still
    /// on its node), `dormant` (a manual job not started), `ended` (its
    /// schedule's end passed), `dropped`, `broken` or `deleting`.
    pub state: JobPhase,
    /// Restarts in the trailing hour (the restart ceiling counts these).
    #[serde(default)]
    pub restarts_in_last_hour: u32,
    /// The GPU device placement chose.
    pub gpu_index: Option<u32>,
    /// What its last placement decided, in words.
    pub last_placement: Option<String>,
    /// Resilience rules its placement could not honour.
    pub resilience_degraded: Option<String>,
}

impl Bundle {
    /// `<namespace>/<name>`, the namespace `default` when absent.
    pub fn bundle_id(&self) -> BundleId {
        let namespace = self.metadata.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
        BundleId(format!(
            "{namespace}/{}",
            self.metadata.name.as_deref().unwrap_or_default()
        ))
    }
}
