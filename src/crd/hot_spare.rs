//! `HotSparePolicy`: one pool's hot spares (one entry of the settings' `hotSpares`),
//! cluster-scoped. The pool is the key: one policy per pool.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::HotSpareSpec;

/// The desired spares: `pool`, `targetCount`, `spec` (instance type,
/// region), `warmFor`, `reservedFor`, `exclusive`.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "automanager.norsk.video",
    version = "v1alpha1",
    doc = "One pool's hot spares: warm nodes held ready to take jobs at once.",
    kind = "HotSparePolicy",
    category = "norsk",
    shortname = "nspare",
    status = "HotSparePolicyStatus",
    printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".spec.pool"}"#,
    printcolumn = r#"{"name":"Target","type":"integer","jsonPath":".spec.targetCount"}"#,
    printcolumn = r#"{"name":"Live","type":"integer","jsonPath":".status.liveSpares"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(transparent)]
pub struct HotSparePolicySpec(pub HotSpareSpec);

/// What the operator observed: live, provisioning and consumed spares, the
/// last underflow, and `Stalled` when the policy names an unknown pool.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HotSparePolicyStatus {
    /// The generation the status describes.
    pub observed_generation: Option<i64>,
    /// `Ready`, `Stalled` and the conditions they summarise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Spares up and unconsumed.
    #[serde(default)]
    pub live_spares: u32,
    /// Spares asked for and not yet started.
    #[serde(default)]
    pub provisioning_spares: u32,
    /// Spares that took a job (no longer spares).
    #[serde(default)]
    pub consumed_spares: u32,
    /// When the live spares last fell below the target (RFC 3339).
    pub last_underflow: Option<String>,
}
