//! `NorskNode`: a mirror of one Manager node, cluster-scoped, written by the
//! operator (status) and edited by people (spec: cordon, spare spec). The
//! resource name is the node id made a valid Kubernetes name; the exact id
//! is `spec.nodeId`. What placement reads of the node (`status.placement`)
//! and its conversion back into a fleet snapshot are in `node_placement`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::node_placement::NodePlacementStatus;
use crate::model::manager::KeptTags;
use crate::model::{NodeInventory, NodePhase, SpareSpec};

/// What people may change about a node: whether placement may use it, and
/// (for a live spare) what it is warmed and reserved for.
#[serde_with::skip_serializing_none]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "automanager.norsk.video",
    version = "v1alpha1",
    doc = "A Norsk node as Manager reports it, mirrored by the operator.",
    kind = "NorskNode",
    category = "norsk",
    shortname = "nnode",
    status = "NorskNodeStatus",
    printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".status.pool"}"#,
    printcolumn = r#"{"name":"Tier","type":"string","jsonPath":".status.tier"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Jobs","type":"integer","jsonPath":".status.jobCount"}"#,
    printcolumn = r#"{"name":"Cordoned","type":"boolean","jsonPath":".status.placement.cordoned","description":"No new placement lands here: cordoned by spec.cordoned, a drain or a maintenance"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NorskNodeSpec {
    /// The node's id on Manager (set by the operator when it mirrors the
    /// node; never changes).
    #[schemars(length(min = 1, max = 253))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "nodeId is the Manager node this resource mirrors and cannot change"}
    ]))]
    pub node_id: String,
    /// Like a Node's `unschedulable`: no new placement lands here; jobs on
    /// it stay. Set back to false to uncordon.
    #[serde(default)]
    pub cordoned: bool,
    /// A live spare's spec: what it is warmed and reserved for
    /// (`updateHotSpareNode`). Ignored on a node that is not a spare.
    pub spare: Option<SpareSpec>,
    /// What the node is, declared by a person: placement reads it when
    /// Manager reports no inventory for the node (a cluster server on a
    /// Manager that speaks only the published API). What Manager reports
    /// wins.
    pub inventory: Option<NodeInventory>,
}

/// The node as Manager and the AutoManager core see it.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NorskNodeStatus {
    /// `Ready` (running and healthy), `Cordoned`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Its pool (tag `pool`).
    pub pool: Option<String>,
    /// Its tier (tag `tier`; the fixed tier when absent on a cluster node).
    pub tier: Option<String>,
    /// `aws`, `oci` or `local-servers`.
    pub provider: Option<String>,
    /// Instance type or shape.
    pub instance_type: Option<String>,
    /// The provider region the node runs in (for example `eu-west-1`).
    pub region: Option<String>,
    /// Availability zone (or rack).
    pub availability_zone: Option<String>,
    /// `prospective`, `starting`, `running`, `stopping` or `stopped`.
    #[serde(default)]
    pub phase: NodePhase,
    /// What the worker advertises.
    pub inventory: Option<NodeInventoryStatus>,
    /// How many jobs are bound to it.
    #[serde(default)]
    pub job_count: u32,
    /// The jobs bound to it (the first 50; `jobCount` has them all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<String>,
    /// A hot spare (tag `spare`).
    #[serde(default)]
    pub spare: bool,
    /// `healthy`, or `unhealthy` after repeated rejections.
    #[serde(default)]
    pub health: NodeHealth,
    /// The provider's interruption notice, if any (tag `interruption`).
    pub interruption: Option<String>,
    /// What placement reads of the node, exactly as the operator's
    /// placement sees it: `kubectl norsk plan` rebuilds the fleet from it.
    pub placement: Option<NodePlacementStatus>,
    /// Tag changes the operator keeps for this node because Manager cannot
    /// store them (a Manager without `UpdateNodeTags`): a spare that took a
    /// job has its `spare` tags removed here. The next leader reads them
    /// back, so a consumed spare is never taken for a live one again.
    pub kept_tags: Option<KeptTags>,
}

/// Whether placement still uses a node its jobs keep rejecting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum NodeHealth {
    /// Placement may use it.
    #[default]
    Healthy,
    /// Excluded from placement after repeated job rejections.
    Unhealthy,
}

/// A node's advertised inventory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeInventoryStatus {
    /// Total capacity (vCPUs).
    pub total_capacity: f64,
    /// Physical cores.
    pub total_cores: u32,
    /// The fraction of capacity placement may use.
    pub utilization_cap: f64,
    /// GPUs by device index: model and capacity.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// Capabilities it offers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// Images it holds (what warmth is scored against).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<String>,
}
