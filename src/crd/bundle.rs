//! `Bundle`: the unit of work users submit, namespaced. The bundle id is
//! `<namespace>/<name>`.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::{BundleId, BundleSpec};

use super::CommonStatus;

/// The namespace of a bundle document that names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The desired bundle: the seed's `Bundle` (minus its id, which comes from
/// the resource's namespace and name).
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "automanager.norsk.video",
    version = "v1alpha1",
    doc = "A bundle of jobs placed as a primary copy and, with a resilience policy, one backup.",
    kind = "Bundle",
    namespaced,
    category = "norsk",
    shortname = "nbundle",
    status = "BundleStatus"
)]
#[serde(transparent)]
pub struct BundleResourceSpec(pub BundleSpec);

/// What the operator observed (filled in by the controllers).
pub type BundleStatus = CommonStatus;

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
