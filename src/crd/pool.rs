//! `PlacementPool`: an ordered list of tiers, cheapest first. The pool's name
//! is the resource's `metadata.name`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::{self, PlacementTier};

/// The desired pool: its tiers in cascade order, cheapest first. Placement
/// walks them in this order and takes the first that can place or
/// provision.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "automanager.norsk.video",
    version = "v1alpha1",
    doc = "A placement pool: an ordered cascade of capacity tiers, cheapest first.",
    kind = "PlacementPool",
    category = "norsk",
    shortname = "npool",
    status = "PlacementPoolStatus",
    printcolumn = r#"{"name":"Nodes","type":"integer","jsonPath":".status.nodes"}"#,
    printcolumn = r#"{"name":"Used","type":"number","jsonPath":".status.usedCapacityFraction","description":"Reserved capacity over usable capacity"}"#,
    printcolumn = r#"{"name":"Spares","type":"integer","jsonPath":".status.liveSpares"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.tiers.all(t, self.tiers.exists_one(u, u.name == t.name))",
     "message": "tier names must be unique within a pool"},
    {"rule": "self.tiers.filter(t, has(t.scaleOut) && t.scaleOut == 'fixed').size() <= 1",
     "message": "a pool has at most one fixed tier (its pre-registered cluster nodes)"}
]))]
pub struct PlacementPoolSpec {
    /// Tiers in cascade order: placement walks them cheapest first and takes
    /// the first that can place or provision.
    #[schemars(length(min = 1, max = 16))]
    pub tiers: Vec<PlacementTier>,
}

/// What the operator observed: nodes per tier, prospective nodes, used
/// capacity and live spares; `Ready` once the core runs with this pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementPoolStatus {
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` and the conditions it summarises.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Nodes of the pool that are not stopped (launching ones included).
    #[serde(default)]
    pub nodes: u32,
    /// Capacity reserved by placed jobs over usable capacity (0 to 1).
    #[serde(default)]
    pub used_capacity_fraction: f64,
    /// Unconsumed hot spares.
    #[serde(default)]
    pub live_spares: u32,
    /// Per tier, in cascade order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub tiers: Vec<TierStatus>,
    /// Resilience headroom (with `settings.experimental.headroom`): per
    /// kind of failure domain (`node`, `zone`, `provider`), whether the
    /// loss of any single one is absorbed by the pool, and the worst one.
    /// Absent while headroom is not computed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["kind"]))]
    pub headroom: Vec<DomainHeadroomStatus>,
}

/// The pool's headroom against the loss of one kind of failure domain.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainHeadroomStatus {
    /// `node`, `zone` or `provider`.
    pub kind: String,
    /// Domains of the kind holding nodes of the pool.
    #[serde(default)]
    pub domains: u32,
    /// Of those, the ones whose loss the pool absorbs: every lost job
    /// placed again, no bundle broken.
    #[serde(default)]
    pub absorbed: u32,
    /// The loss of any single domain of the kind is absorbed.
    #[serde(default)]
    pub survives: bool,
    /// The loss that does the most harm, when one is not absorbed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst: Option<WorstDomainStatus>,
}

/// The worst loss of one kind of domain.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorstDomainStatus {
    /// The node id, zone or provider kind.
    pub name: String,
    /// Bundles its loss takes off the air.
    #[serde(default)]
    pub dark_bundles: u32,
    /// Lost jobs not placed again.
    #[serde(default)]
    pub unplaced_jobs: u32,
    /// Why, in words.
    #[serde(default)]
    pub why: String,
}

/// One tier of a pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TierStatus {
    /// The tier's name.
    pub name: String,
    /// Nodes of the tier that are up.
    #[serde(default)]
    pub nodes: u32,
    /// Nodes asked for and not yet started.
    #[serde(default)]
    pub prospective_nodes: u32,
    /// Capacity reserved by placed jobs over the tier's usable capacity.
    #[serde(default)]
    pub used_capacity_fraction: f64,
}

impl PlacementPool {
    /// The model pool: `metadata.name` is the pool name (empty when the
    /// document has none, which settings validation reports).
    pub fn to_model(&self) -> model::PlacementPool {
        model::PlacementPool {
            name: self.metadata.name.clone().unwrap_or_default(),
            tiers: self.spec.tiers.clone(),
        }
    }
}
