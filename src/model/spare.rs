//! Hot-spare specifications.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One live spare's `SpareSpec`: what it is warmed and reserved for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct SpareSpec {
    /// Templates whose images are pre-pulled onto the spare.
    pub warm_for: Vec<String>,
    /// Templates that score the spare first.
    pub reserved_for: Vec<String>,
    /// With `reservedFor`, nobody else may take the spare (unless they set
    /// `overrideReservation`).
    pub exclusive: bool,
}

/// The instance a pool's spares are provisioned as.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpareInstanceSpec {
    /// Instance type or shape.
    pub instance_type: String,
    /// Region; defaults to the pool's first elastic tier's region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

/// One `hotSpares[]` entry (the `HotSparePolicy` spec): the pool is the key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HotSpareSpec {
    /// The pool this entry keeps spares for (one entry per pool).
    pub pool: String,
    /// How many unconsumed spares to keep.
    pub target_count: u32,
    /// What each spare is provisioned as.
    pub spec: SpareInstanceSpec,
    /// Templates whose images are pre-pulled onto the spares.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warm_for: Vec<String>,
    /// Templates that score the spares first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_for: Vec<String>,
    /// Makes the reservation a guarantee.
    #[serde(default)]
    pub exclusive: bool,
}

impl HotSpareSpec {
    /// The `SpareSpec` a spare provisioned for this entry carries.
    pub fn spare_spec(&self) -> SpareSpec {
        SpareSpec {
            warm_for: self.warm_for.clone(),
            reserved_for: self.reserved_for.clone(),
            exclusive: self.exclusive,
        }
    }
}
