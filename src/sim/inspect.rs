//! The admin snapshot: the whole simulated state as JSON, in the domain
//! model's shapes (converted with `manager::wire`, the same conversions a
//! client applies). Its `fleet` member is a [`FleetSnapshot`], so a fleet
//! captured from the simulator can be planned offline.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::world::{Instance, SimNode, World};
use crate::manager::proto::manager::{self as pb, event_stream_event::Event};
use crate::manager::wire::{
    Notes, bundle_from_pb, event_from_pb, interruption_kind_from_pb, inventory_from_pb, millis_from_pb,
    runtime_job_from_pb,
};
use crate::model::{
    AuditEntry, Bundle, BundleJobRef, FleetNode, FleetSnapshot, InterruptionKind, JobId, ManagerEvent, NodeId,
    NodeInventory, NodePhase, PlacedJob, ProviderKind, RuntimeJob, SpareSpec, UnixMillis, tags,
};

/// Everything the simulator holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimSnapshot {
    /// Simulated now (Unix ms).
    pub time: UnixMillis,
    /// Simulated seconds per real second.
    pub time_scale: f64,
    /// Every node Manager knows.
    pub nodes: Vec<NodeView>,
    /// Every job, with its history.
    pub jobs: Vec<RuntimeJob>,
    /// Every bundle.
    pub bundles: Vec<Bundle>,
    /// Launch accounting per region and instance type.
    pub capacity: Vec<CapacityView>,
    /// The fleet in the format placement reads.
    pub fleet: FleetSnapshot,
    /// Manager's audit log (most recent entries), oldest first.
    pub audit: Vec<AuditEntry>,
    /// The pending window (seconds) each event stream asked for, oldest
    /// first: how far ahead Manager is to announce a scheduled job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_windows_s: Vec<i32>,
    /// Stored records the domain model cannot represent, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
}

/// One node.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    /// The node id.
    pub id: NodeId,
    /// Who provides it.
    pub provider: ProviderKind,
    /// Region.
    pub region: String,
    /// Availability zone / domain.
    pub zone: String,
    /// Instance type or shape.
    pub instance_type: String,
    /// `on-demand`, `spot` or `reserved` (cloud nodes; empty is on-demand).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub launch_mode: String,
    /// The root volume it was launched with, when the request named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_volume: Option<crate::model::RootVolume>,
    /// Phase as Manager reports it.
    pub phase: NodePhase,
    /// The worker is gone and Manager has not noticed yet (keepalive).
    pub worker_gone: bool,
    /// Why it is stopping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping_reason: Option<String>,
    /// When Manager created it.
    pub created_at: Option<UnixMillis>,
    pub tags: BTreeMap<String, String>,
    /// What the worker advertises.
    pub inventory: Option<NodeInventory>,
    /// A pending provider interruption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interruption: Option<InterruptionView>,
    /// Job instances on it.
    pub instances: Vec<InstanceView>,
}

/// A pending interruption notice.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterruptionView {
    /// Spot interruption or rebalance.
    pub kind: InterruptionKind,
    /// When the provider reclaims the node.
    pub deadline: Option<UnixMillis>,
}

/// One job instance on a node.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceView {
    pub job_id: JobId,
    /// The instance key.
    pub role: String,
    /// `provisioned`, `prepared`, `starting`, `running` or `stopping`.
    pub phase: String,
    /// The GPU device it was placed on.
    pub gpu_index: Option<u32>,
    /// The slot the runtime was told.
    pub runtime_role: String,
}

/// Launch accounting for one region and instance type.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityView {
    /// Region.
    pub region: String,
    /// Instance type.
    pub instance_type: String,
    /// Nodes of the type the region can run; `None` is unlimited.
    pub limit: Option<i64>,
    /// Nodes of the type running (or starting, or stopping) there.
    pub in_use: i64,
    /// How many more can launch; `None` is unlimited.
    pub available: Option<i64>,
}

/// Builds the snapshot.
pub(crate) fn snapshot(world: &World) -> SimSnapshot {
    let mut reader = Reader::default();
    let jobs = reader.jobs(world);
    let bundles = reader.bundles(world);
    let mut by_node = instances_by_node(world);
    let mut nodes = Vec::new();
    let mut fleet = Vec::new();
    for (node_id, node) in world.nodes() {
        let inventory = reader.inventory(node_id, node);
        let tags: BTreeMap<String, String> = node.metadata.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let on_node = by_node.remove(node_id.as_str()).unwrap_or_default();
        fleet.push(fleet_node(node_id, node, &tags, inventory.clone(), &on_node, &jobs));
        nodes.push(node_view(node_id, node, tags, inventory, &on_node));
    }
    let audit = reader.audit(world);
    SimSnapshot {
        pending_windows_s: world.pending_windows().to_vec(),
        time: world.now(),
        time_scale: world.time_scale(),
        nodes,
        jobs: jobs.into_values().collect(),
        bundles,
        capacity: capacity(world),
        fleet: FleetSnapshot {
            template_images: BTreeMap::new(),
            nodes: fleet,
        },
        audit,
        unreadable: reader.unreadable,
    }
}

/// The stored records read into the domain model, with what could not be.
#[derive(Default)]
struct Reader {
    /// What the conversions normalised (not reported by the snapshot).
    notes: Notes,
    /// Each record the model cannot represent, with why.
    unreadable: Vec<String>,
}

impl Reader {
    /// Every readable job, by id.
    fn jobs(&mut self, world: &World) -> BTreeMap<String, RuntimeJob> {
        let mut jobs = BTreeMap::new();
        for (job_id, stored) in world.jobs() {
            match runtime_job_from_pb(Some(&stored.with_history()), &mut self.notes) {
                Ok(job) => {
                    jobs.insert(job_id.clone(), job);
                }
                Err(e) => self.unreadable.push(format!("job {job_id:?}: {e}")),
            }
        }
        jobs
    }

    /// Every readable bundle.
    fn bundles(&mut self, world: &World) -> Vec<Bundle> {
        let mut bundles = Vec::new();
        for (bundle_id, stored) in world.bundles() {
            match bundle_from_pb(stored, &mut self.notes) {
                Ok(bundle) => bundles.push(bundle),
                Err(e) => self.unreadable.push(format!("bundle {bundle_id:?}: {e}")),
            }
        }
        bundles
    }

    /// What the node's worker advertises, when it advertises something
    /// readable.
    fn inventory(&mut self, node_id: &str, node: &SimNode) -> Option<NodeInventory> {
        let inv = node.inventory.as_ref()?;
        match inventory_from_pb(inv, &mut self.notes) {
            Ok((_, inventory)) => Some(inventory),
            Err(e) => {
                self.unreadable.push(format!("inventory of node {node_id:?}: {e}"));
                None
            }
        }
    }

    /// Manager's audit log, read as the event stream carries it.
    fn audit(&mut self, world: &World) -> Vec<AuditEntry> {
        world
            .audit_log()
            .filter_map(|entry| {
                let event = pb::EventStreamEvent {
                    event: Some(Event::AuditAppended(pb::AuditAppended {
                        entry: Some(entry.clone()),
                    })),
                };
                match event_from_pb(&event, &mut self.notes) {
                    Ok(ManagerEvent::AuditAppended(entry)) => Some(entry),
                    _ => None,
                }
            })
            .collect()
    }
}

/// The job instances on a node: job id, instance key and the instance.
type OnNode<'w> = Vec<(&'w str, &'w str, &'w Instance)>;

/// Every job instance, by the node it is on.
fn instances_by_node(world: &World) -> BTreeMap<&str, OnNode<'_>> {
    let mut by_node: BTreeMap<&str, OnNode<'_>> = BTreeMap::new();
    for ((job_id, role), instance) in world.instances() {
        by_node
            .entry(instance.node_id.as_str())
            .or_default()
            .push((job_id, role, instance));
    }
    by_node
}

/// The node as placement reads it: what it carries is every job instance
/// on it not stopping.
fn fleet_node(
    node_id: &str,
    node: &SimNode,
    tags: &BTreeMap<String, String>,
    inventory: Option<NodeInventory>,
    on_node: &OnNode<'_>,
    jobs: &BTreeMap<String, RuntimeJob>,
) -> FleetNode {
    FleetNode {
        id: NodeId(node_id.to_owned()),
        pool: tags.get(tags::POOL).cloned(),
        tier: tags.get(tags::TIER).cloned(),
        phase: node.phase,
        cordoned: false,
        unhealthy: false,
        spare: tags.get(tags::SPARE).is_some_and(|v| v == "true"),
        spare_spec: SpareSpec::from_tags(tags),
        tags: tags.clone(),
        inventory,
        jobs: on_node
            .iter()
            .filter(|(_, _, i)| i.phase != super::world::InstancePhase::Stopping)
            .filter_map(|(job_id, _, i)| jobs.get(*job_id).map(|job| placed(job, i)))
            .collect(),
    }
}

/// The node as Manager knows it, with every job instance on it.
fn node_view(
    node_id: &str,
    node: &SimNode,
    tags: BTreeMap<String, String>,
    inventory: Option<NodeInventory>,
    on_node: &OnNode<'_>,
) -> NodeView {
    NodeView {
        id: NodeId(node_id.to_owned()),
        provider: node.provider,
        region: node.region.clone(),
        zone: node.zone.clone(),
        instance_type: node.instance_type.clone(),
        launch_mode: node.launch_mode.clone(),
        root_volume: node
            .root_volume
            .as_ref()
            .map(|(size_gib, kind)| crate::model::RootVolume {
                size_gib: *size_gib,
                volume_type: (!kind.is_empty()).then(|| kind.clone()),
            }),
        phase: node.phase,
        worker_gone: node.silent,
        stopping_reason: node.stopping_reason.map(|r| r.as_str_name().to_owned()),
        created_at: millis_from_pb(node.metadata.created_at.as_ref()),
        tags,
        inventory,
        interruption: node.interruption.as_ref().map(|n| InterruptionView {
            kind: interruption_kind_from_pb(n.kind),
            deadline: millis_from_pb(n.deadline.as_ref()),
        }),
        instances: on_node
            .iter()
            .map(|(job_id, role, i)| InstanceView {
                job_id: JobId((*job_id).to_owned()),
                role: (*role).to_owned(),
                phase: i.phase.as_str().to_owned(),
                gpu_index: i.gpu_index,
                runtime_role: i.runtime_role.clone(),
            })
            .collect(),
    }
}

/// Launch accounting per region and instance type.
fn capacity(world: &World) -> Vec<CapacityView> {
    world
        .launches()
        .iter()
        .map(|((region, instance_type), l)| CapacityView {
            region: region.clone(),
            instance_type: instance_type.clone(),
            limit: l.limit,
            in_use: l.in_use,
            available: l.limit.map(|limit| (limit - l.in_use).max(0)),
        })
        .collect()
}

/// A job instance as placement accounts for it on its node.
fn placed(job: &RuntimeJob, instance: &Instance) -> PlacedJob {
    let r = &job.spec.requirements;
    let bundle_ref: Option<&BundleJobRef> = job.bundle_ref.as_ref();
    PlacedJob {
        job_id: job.job_id.clone(),
        bundle: bundle_ref.map(|b| b.bundle_id.clone()),
        replica_index: bundle_ref.map_or(0, |b| b.replica_index),
        job_name: job.spec.job_name.clone(),
        template: job.spec.template.clone(),
        required_capacity: r.required_capacity,
        required_cores: r.required_cores,
        required_host_ports: r.required_host_ports.clone(),
        required_gpu_capacity: r.required_gpu_capacity,
        gpu_index: instance.gpu_index,
        exclusive: job.spec.exclusive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_tags_become_the_spare_spec() {
        let node_tags: BTreeMap<String, String> = [
            ("warmFor".to_owned(), "xyz, abc".to_owned()),
            ("reservedFor".to_owned(), "xyz".to_owned()),
            ("exclusive".to_owned(), "true".to_owned()),
        ]
        .into();
        let spec = SpareSpec::from_tags(&node_tags);
        assert_eq!(spec.warm_for, ["xyz", "abc"]);
        assert_eq!(spec.reserved_for, ["xyz"]);
        assert!(spec.exclusive);
        assert_eq!(SpareSpec::from_tags(&BTreeMap::new()), SpareSpec::default());
    }
}
