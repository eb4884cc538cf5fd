//! Kubernetes custom resource types of API group
//! `automanager.norsk.video/v1alpha1`, and their mapping to [`crate::model`].
//!
//! The specs embed the model types, so what `kubectl apply` takes, what
//! `plan` reads and what the engine places are one definition. Every kind is
//! in category `norsk` (`kubectl get norsk` lists them all) and carries
//! `status.conditions` as a list-map keyed by `type`, with a root `Ready`;
//! `crate::controller` writes the status. Kinds: `PlacementPool`,
//! `HotSparePolicy`, `Bundle`, `NorskNode`, `NodeDrain`, `JobMigration`.

mod bundle;
mod drain;
mod hot_spare;
mod migration;
mod node;
mod node_placement;
mod pool;

pub use bundle::{
    Bundle, BundleResourceSpec, BundleStatus, DEFAULT_NAMESPACE, JobStatus, ReplicaStatus, ScheduleStatus,
};
pub use drain::{
    DrainAfter, DrainJobStatus, DrainMode, Interruption, InterruptionKind, MigrationStrategy, NodeDrain, NodeDrainSpec,
    NodeDrainStatus,
};
pub use hot_spare::{HotSparePolicy, HotSparePolicySpec, HotSparePolicyStatus};
pub use migration::{GroupMemberStatus, JobMigration, JobMigrationSpec, JobMigrationStatus, PhaseTransition};
pub use node::{NodeHealth, NodeInventoryStatus, NorskNode, NorskNodeSpec, NorskNodeStatus};
pub use node_placement::{
    MAX_LISTED_RESERVATIONS, NodePlacementStatus, NodeStatusError, OmittedReservations, SkippedNode, fleet_snapshot,
};
pub use pool::{
    DomainHeadroomStatus, PlacementPool, PlacementPoolSpec, PlacementPoolStatus, TierStatus, WorstDomainStatus,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{CustomResourceDefinition, ValidationRule};
use kube::CustomResourceExt;

/// The API group of every kind.
pub const GROUP: &str = "automanager.norsk.video";
/// The version of every kind.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as it appears in resource documents.
pub const API_VERSION: &str = "automanager.norsk.video/v1alpha1";

/// Every custom resource definition, as `norsk-auto-manager crds` writes
/// them into `crds/`.
pub fn definitions() -> Vec<CustomResourceDefinition> {
    let mut hot_spares = HotSparePolicy::crd();
    // The pool is the key (one policy per pool): naming the resource after
    // its pool makes the API server itself refuse a second policy for it.
    add_root_rule(
        &mut hot_spares,
        "self.metadata.name == self.spec.pool",
        "metadata.name must equal spec.pool: one HotSparePolicy per pool, named after it",
    );
    vec![
        PlacementPool::crd(),
        hot_spares,
        Bundle::crd(),
        NorskNode::crd(),
        NodeDrain::crd(),
        JobMigration::crd(),
    ]
}

/// Adds a CEL rule at the root of every version's schema (where
/// `self.metadata.name` is visible).
fn add_root_rule(crd: &mut CustomResourceDefinition, rule: &str, message: &str) {
    for version in &mut crd.spec.versions {
        if let Some(schema) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) {
            schema
                .x_kubernetes_validations
                .get_or_insert_with(Vec::new)
                .push(ValidationRule {
                    rule: rule.to_owned(),
                    message: Some(message.to_owned()),
                    ..Default::default()
                });
        }
    }
}

/// The file name of a definition in `crds/`: `<plural>.<group>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"))
}

#[cfg(test)]
mod tests {
    use kube::Resource;

    use super::*;

    #[test]
    fn every_kind_is_in_the_norsk_category_of_the_api_group() {
        for crd in definitions() {
            assert_eq!(crd.spec.group, GROUP);
            assert_eq!(crd.spec.versions[0].name, VERSION);
            assert_eq!(crd.spec.names.categories.as_deref(), Some(&["norsk".to_owned()][..]));
        }
    }

    #[test]
    fn fleet_kinds_are_cluster_scoped_and_bundle_kinds_namespaced() {
        assert_eq!(PlacementPool::crd().spec.scope, "Cluster");
        assert_eq!(HotSparePolicy::crd().spec.scope, "Cluster");
        assert_eq!(Bundle::crd().spec.scope, "Namespaced");
        assert_eq!(NorskNode::crd().spec.scope, "Cluster");
        assert_eq!(NodeDrain::crd().spec.scope, "Cluster");
        assert_eq!(JobMigration::crd().spec.scope, "Namespaced");
        assert_eq!(Bundle::api_version(&()), API_VERSION);
    }
}
