//! `PlacementPool`: an ordered list of tiers, cheapest first. The pool's name
//! is the resource's `metadata.name`.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::{self, PlacementTier};

use super::CommonStatus;

/// The desired pool: its tiers in cascade order, exactly as the seed's
/// `PlacementTier`.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "automanager.norsk.video",
    version = "v1alpha1",
    doc = "A placement pool: an ordered cascade of capacity tiers, cheapest first.",
    kind = "PlacementPool",
    category = "norsk",
    shortname = "npool",
    status = "PlacementPoolStatus"
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

/// What the operator observed (filled in by the controllers).
pub type PlacementPoolStatus = CommonStatus;

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
