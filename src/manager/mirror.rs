//! A mirror of Manager's state (nodes, inventories, jobs, bundles) built
//! from the event stream: replaced whole by each snapshot, then updated by
//! live events. It is the client's view of Manager; the core hydrates from
//! the same snapshot.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::{
    Bundle, BundleId, InstanceKey, JobHistoryEntry, JobId, ManagerEvent, NodeId, NodeInfo, NodeInventory, NodePhase,
    RuntimeJob,
};

/// One node as the mirror knows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MirrorNode {
    /// Manager's metadata, once an event carried it.
    pub info: Option<NodeInfo>,
    /// Lifecycle phase.
    pub phase: NodePhase,
    /// What the worker advertises.
    pub inventory: Option<NodeInventory>,
}

/// Where one instance of a job is, according to its history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceLocation {
    /// The instance key.
    pub role: InstanceKey,
    pub node_id: NodeId,
    /// Reached running (else provisioned, or stopping).
    pub running: bool,
}

/// The live instances of a job: the last history entry per instance key
/// that places it on a node and is not a stop.
pub fn live_instances(job: &RuntimeJob) -> Vec<InstanceLocation> {
    let mut by_role: BTreeMap<&InstanceKey, Option<InstanceLocation>> = BTreeMap::new();
    for entry in &job.history {
        match entry {
            JobHistoryEntry::Provisioned { role, node_id, .. } | JobHistoryEntry::Running { role, node_id, .. } => {
                let Some(node) = node_id else {
                    continue;
                };
                by_role.insert(
                    role,
                    Some(InstanceLocation {
                        role: role.clone(),
                        node_id: node.clone(),
                        running: matches!(entry, JobHistoryEntry::Running { .. }),
                    }),
                );
            }
            JobHistoryEntry::Stopped { role, .. } => {
                by_role.insert(role, None);
            }
            _ => {}
        }
    }
    by_role.into_values().flatten().collect()
}

/// The mirror.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagerMirror {
    /// Nodes by id.
    pub nodes: BTreeMap<NodeId, MirrorNode>,
    /// Runtime jobs by id.
    pub jobs: BTreeMap<JobId, RuntimeJob>,
    /// Bundles by id.
    pub bundles: BTreeMap<BundleId, Bundle>,
}

impl ManagerMirror {
    /// A mirror of a snapshot.
    pub fn from_snapshot<'a>(events: impl IntoIterator<Item = &'a ManagerEvent>) -> Self {
        let mut mirror = Self::default();
        for e in events {
            mirror.apply(e);
        }
        mirror
    }

    fn node(&mut self, id: &NodeId) -> &mut MirrorNode {
        self.nodes.entry(id.clone()).or_insert(MirrorNode {
            info: None,
            phase: NodePhase::Starting,
            inventory: None,
        })
    }

    fn node_info(&mut self, info: &NodeInfo, phase: NodePhase) {
        let node = self.node(&info.node_id);
        node.info = Some(info.clone());
        node.phase = phase;
    }

    /// Applies one event.
    pub fn apply(&mut self, event: &ManagerEvent) {
        match event {
            ManagerEvent::NodeStarting(info) => self.node_info(info, NodePhase::Starting),
            ManagerEvent::NodeStarted(info) | ManagerEvent::NodeRunning { node: info, .. } => {
                self.node_info(info, NodePhase::Running)
            }
            ManagerEvent::NodeStopping { node_id, .. } => self.node(node_id).phase = NodePhase::Stopping,
            ManagerEvent::NodeStopped(node_id) => self.node(node_id).phase = NodePhase::Stopped,
            ManagerEvent::NodeInventory { node_id, inventory } => {
                self.node(node_id).inventory = Some(inventory.clone())
            }
            ManagerEvent::NodeTagsUpdated { node_id, tags } => {
                if let Some(info) = self.node(node_id).info.as_mut() {
                    info.tags = tags.clone();
                }
            }
            ManagerEvent::JobActive(job)
            | ManagerEvent::JobPending(job)
            | ManagerEvent::JobUpdated(job)
            | ManagerEvent::JobOutOfWindow(job) => {
                self.jobs.insert(job.job_id.clone(), job.clone());
            }
            ManagerEvent::JobDeleted(id) => {
                self.jobs.remove(id);
            }
            ManagerEvent::BundleUpdated(bundle) => {
                self.bundles.insert(bundle.bundle_id.clone(), bundle.clone());
            }
            ManagerEvent::BundleDeleted(id) => {
                self.bundles.remove(id);
            }
            _ => {}
        }
    }

    /// Nodes that are running, by id.
    pub fn running_nodes(&self) -> impl Iterator<Item = (&NodeId, &MirrorNode)> {
        self.nodes.iter().filter(|(_, n)| n.phase == NodePhase::Running)
    }
}
