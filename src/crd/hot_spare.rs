//! `HotSparePolicy`: one pool's hot spares (the seed's `hotSpares[]` entry),
//! cluster-scoped. The pool is the key: one policy per pool.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::HotSpareSpec;

use super::CommonStatus;

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
    status = "HotSparePolicyStatus"
)]
#[serde(transparent)]
pub struct HotSparePolicySpec(pub HotSpareSpec);

/// What the operator observed (filled in by the controllers).
pub type HotSparePolicyStatus = CommonStatus;
