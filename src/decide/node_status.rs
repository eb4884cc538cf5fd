//! What a `NorskNode` mirrors, computed from the core's fleet: pure, run on
//! the core's task. `status.placement` is the node exactly as the core's
//! placement view reads it (the core's own fleet snapshot, with every
//! bound job's and migration target's reservation), so a plan against the
//! mirrored nodes places as the operator would. Also the resource name of
//! a node id (node ids are Manager's and need not be valid Kubernetes
//! names).

use std::collections::BTreeMap;

use crate::automanager::{NodeView, ReadModel};
use crate::crd::{NodeHealth, NodeInventoryStatus, NodePlacementStatus, NorskNodeStatus};
use crate::model::{NodeId, NodePhase, tags};

use super::conditions::{Observed, READY};

/// How many job ids a `NorskNode` lists (`jobCount` has them all): a
/// status stays small however dense the node.
const LISTED_JOBS: usize = 50;
/// The longest Kubernetes object name.
const MAX_NAME: usize = 253;

/// One node as its resource should read.
#[derive(Clone, Debug, PartialEq)]
pub struct MirroredNode {
    /// Manager's node id.
    pub node_id: NodeId,
    /// The status (conditions without timestamps in `conditions`).
    pub status: NorskNodeStatus,
    /// `Ready` and why.
    pub conditions: Vec<Observed>,
}

/// The fleet an operator mirrors when none is named.
pub const DEFAULT_FLEET: &str = "default";

/// The name of the resources the operator makes for `node_id` of `fleet`
/// (its `NorskNode`, the `NodeDrain` of an interruption): the node's own
/// [`resource_name`] in the default fleet, prefixed `<fleet>.` in any
/// other — fleets sharing a cluster may well have nodes of the same id
/// (each operator numbers the nodes it provisions from 1), and must never
/// write each other's resources.
pub fn node_resource_name(fleet: &str, node_id: &str) -> String {
    if fleet == DEFAULT_FLEET {
        resource_name(node_id)
    } else {
        resource_name(&format!("{fleet}.{node_id}"))
    }
}

/// The resource name of `node_id`: lowercased, characters a name cannot
/// hold replaced by `-`, and — when that changed anything — a stable hash
/// of the exact id appended, so two ids never share a name.
pub fn resource_name(node_id: &str) -> String {
    let cleaned: String = node_id
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    let trimmed = cleaned.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed == node_id && !trimmed.is_empty() && trimmed.len() <= MAX_NAME {
        return trimmed.to_owned();
    }
    // FNV-1a: stable across builds and processes (std's hasher is not).
    let hash = node_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let keep: String = trimmed.chars().take(MAX_NAME - 17).collect();
    let keep = keep.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if keep.is_empty() {
        format!("node-{hash:016x}")
    } else {
        format!("{keep}-{hash:016x}")
    }
}

fn mirror(node: NodeView, template_images: &BTreeMap<String, Vec<String>>) -> MirroredNode {
    let inventory = node.inventory.as_ref();
    let unhealthy = node.unhealthy;
    let jobs = &node.jobs;
    let status = NorskNodeStatus {
        conditions: Vec::new(),
        pool: node.tags.get(tags::POOL).cloned(),
        tier: node.tier.clone(),
        provider: node.provider.map(|k| k.as_str().to_owned()),
        instance_type: node.instance_type.clone(),
        region: node.region.clone(),
        availability_zone: inventory.map(|i| i.az.clone()).filter(|az| !az.is_empty()),
        phase: node.phase,
        inventory: inventory.map(|i| NodeInventoryStatus {
            total_capacity: i.total_capacity,
            total_cores: i.total_cores,
            utilization_cap: i.utilization_cap,
            gpus: i
                .gpus
                .iter()
                .enumerate()
                .map(|(index, g)| format!("{index}: {} ({})", g.model, g.total_capacity))
                .collect(),
            capabilities: i.capabilities.clone(),
            images: i.images.clone(),
        }),
        job_count: u32::try_from(jobs.len()).unwrap_or(u32::MAX),
        jobs: jobs.iter().take(LISTED_JOBS).map(ToString::to_string).collect(),
        spare: node.tags.get(tags::SPARE).is_some_and(|v| v == "true"),
        health: if unhealthy {
            NodeHealth::Unhealthy
        } else {
            NodeHealth::Healthy
        },
        interruption: node.tags.get(tags::INTERRUPTION).cloned(),
        placement: node
            .placement
            .as_ref()
            .map(|fleet_node| NodePlacementStatus::of(fleet_node, template_images)),
        // Kept by the Manager port, not the core: the mirror adds them.
        kept_tags: None,
    };
    let capacity_known = node.placement.as_ref().is_some_and(|n| n.inventory.is_some());
    let ready = match (node.phase, unhealthy) {
        // Nothing is placed on a node whose size nobody knows.
        (NodePhase::Running, false) if !capacity_known => Observed::no(
            READY,
            "CapacityUnknown",
            "Manager reports no inventory for this node and none is declared: set spec.inventory, or give its \
             pool's fixed tier a candidateInstanceTypes entry; nothing is placed here until then",
        ),
        (NodePhase::Running, false) => Observed::yes(READY, "Running", ""),
        (NodePhase::Running, true) => Observed::no(
            READY,
            "Unhealthy",
            "excluded from placement after repeated job rejections",
        ),
        (phase, _) => Observed::no(READY, capitalised(&crate::model::wire_name(&phase)), ""),
    };
    MirroredNode {
        node_id: node.id.clone(),
        status,
        conditions: vec![ready],
    }
}

fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

/// Every node of the core's fleet as its resource should read, by
/// resource name. A node the core has swept (stopped for longer than
/// `removeStoppedNodesAfter`) is not here, so its resource goes.
pub fn mirrored_nodes(core: ReadModel<'_>, fleet: &str) -> BTreeMap<String, MirroredNode> {
    core.nodes()
        .into_iter()
        .map(|node| {
            (
                node_resource_name(fleet, node.id.as_str()),
                mirror(node, core.template_images()),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::fixture::{ONE_JOB, TestCore, node_info};
    use crate::model::ManagerEvent;

    #[test]
    fn a_running_node_mirrors_its_pool_inventory_and_jobs_and_is_ready() {
        let mut test = TestCore::hydrated(&[("a", 4.0)]);
        test.bundle("ns/ch1", ONE_JOB);
        let nodes = mirrored_nodes(test.read(), DEFAULT_FLEET);
        assert_eq!(nodes.keys().collect::<Vec<_>>(), ["a"]);
        let a = &nodes["a"];
        assert_eq!(a.node_id, NodeId::from("a"));
        let status = &a.status;
        assert_eq!(status.phase, NodePhase::Running);
        assert_eq!(status.pool.as_deref(), Some("production"));
        assert_eq!(status.tier.as_deref(), Some("cluster"));
        assert_eq!(status.provider.as_deref(), Some("local-servers"));
        assert_eq!(status.availability_zone.as_deref(), Some("az1"));
        assert_eq!(status.health, NodeHealth::Healthy);
        assert!(!status.spare);
        assert_eq!(status.inventory.as_ref().map(|i| i.total_capacity), Some(4.0));
        assert_eq!(
            (status.job_count, status.jobs.as_slice()),
            (1, &["ns/ch1/0/encode".to_owned()][..])
        );
        assert!(status.placement.is_some());
        assert_eq!(a.conditions, [Observed::yes(READY, "Running", "")]);
    }

    #[test]
    fn a_running_node_nobody_knows_the_size_of_is_not_ready_until_one_is_declared() {
        // A cluster server on a Manager that reports no inventory.
        let mut test = TestCore::hydrated(&[("a", 4.0)]);
        test.node_started("b");
        let b = &mirrored_nodes(test.read(), DEFAULT_FLEET)["b"];
        assert_eq!(b.conditions[0].reason, "CapacityUnknown");
        assert!(!b.conditions[0].status);
        test.command(crate::automanager::Command::DeclareInventory {
            node_id: NodeId::from("b"),
            inventory: Some(crate::model::NodeInventory::local_server(
                "studio", "rack-2", "r640", 8.0,
            )),
        });
        let b = &mirrored_nodes(test.read(), DEFAULT_FLEET)["b"];
        assert_eq!(b.conditions, [Observed::yes(READY, "Running", "")]);
        let placement = b.status.placement.as_ref().expect("placement reads the node");
        assert_eq!(placement.inventory.as_ref().map(|i| i.total_capacity), Some(8.0));
    }

    #[test]
    fn a_node_not_yet_running_is_not_ready_and_says_its_phase() {
        let mut test = TestCore::hydrated(&[("a", 4.0)]);
        test.event(ManagerEvent::NodeStarting(node_info("b")));
        let b = &mirrored_nodes(test.read(), DEFAULT_FLEET)["b"];
        assert_eq!(b.status.phase, NodePhase::Starting);
        assert_eq!(b.status.job_count, 0);
        assert_eq!(b.conditions, [Observed::no(READY, "Starting", "")]);
    }

    #[test]
    fn a_dense_node_lists_some_jobs_and_counts_them_all() {
        let mut test = TestCore::hydrated(&[("a", 64.0)]);
        for channel in 0..60 {
            test.bundle(&format!("ns/ch{channel}"), ONE_JOB);
        }
        let a = &mirrored_nodes(test.read(), DEFAULT_FLEET)["a"];
        assert_eq!(a.status.job_count, 60);
        assert_eq!(a.status.jobs.len(), LISTED_JOBS);
    }

    #[test]
    fn another_fleets_nodes_are_named_with_the_fleet() {
        let test = TestCore::hydrated(&[("a", 4.0)]);
        let nodes = mirrored_nodes(test.read(), "blue");
        assert_eq!(nodes.keys().collect::<Vec<_>>(), ["blue.a"]);
        assert_eq!(node_resource_name(DEFAULT_FLEET, "a"), "a");
    }

    #[test]
    fn a_valid_node_id_is_its_own_name() {
        assert_eq!(resource_name("node-a"), "node-a");
        assert_eq!(resource_name("am-production-aws-3"), "am-production-aws-3");
    }

    #[test]
    fn ids_that_are_not_names_get_distinct_stable_names() {
        let a = resource_name("Node_A");
        let b = resource_name("node-a");
        assert_ne!(a, b);
        assert!(a.starts_with("node-a-"), "{a}");
        assert_eq!(a, resource_name("Node_A"));
        assert!(resource_name("@@").starts_with("node-"));
        assert!(resource_name(&"x".repeat(400)).len() <= MAX_NAME);
    }
}
