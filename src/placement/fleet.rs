//! The fleet view placement reads: every node of a [`FleetSnapshot`] with
//! its free capacity, cores, host ports and per-device GPU capacity worked
//! out once, indexed by pool and tier, plus the reservations placed since
//! (in-plan placements, prospective nodes).
//!
//! Reservations are applied as deltas ([`FleetView::reserve`]), so a long
//! run of placements never rebuilds the view. Nodes are kept in node-id
//! order, which makes every result independent of the snapshot's order.
//! This module owns the accounting of the capacity, GPU and port contracts;
//! it never decides where anything goes.

use std::collections::HashMap;
use std::sync::Arc;

use crate::model::{
    BundleId, FleetNode, FleetSnapshot, HostPort, InstanceShape, NodeId, NodeInventory, NodePhase, PlacedJob,
    PlacementPool, ProviderKind, Reliability, tags,
};

use super::settings::Pools;

/// Index of a node in the view.
pub(crate) type NodeIdx = u32;

/// Why the view could not be built or changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FleetError {
    /// Two nodes of the snapshot share an id.
    #[error("node {0} appears more than once in the fleet")]
    DuplicateNode(NodeId),
    /// A reservation named a node the view does not hold.
    #[error("no node {0} in the fleet")]
    UnknownNode(NodeId),
    /// A prospective node was asked for a pool, tier or shape that is not
    /// configured.
    #[error("pool {pool:?} has no tier {tier:?} offering instance type {instance_type:?}")]
    UnknownShape {
        /// The pool asked for.
        pool: String,
        /// The tier asked for.
        tier: String,
        /// The instance type asked for.
        instance_type: String,
    },
}

/// A shared, immutable name (pool, tier, AZ, capability, job): cloning it
/// never allocates, so rejections can carry names on the hot path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(Arc<str>);

impl Name {
    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Self {
        Name(Arc::from(s))
    }
}

impl std::borrow::Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for Name {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Names interned to dense ids, so the hot path compares integers.
#[derive(Clone, Debug, Default)]
pub(crate) struct Interner {
    ids: HashMap<Name, u32>,
    names: Vec<Name>,
}

impl Interner {
    pub(crate) fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        let name = Name::from(name);
        self.names.push(name.clone());
        self.ids.insert(name, id);
        id
    }

    pub(crate) fn get(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    pub(crate) fn name(&self, id: u32) -> &Name {
        &self.names[id as usize]
    }
}

/// One GPU device and what placed jobs reserve on it.
#[derive(Clone, Debug)]
pub(crate) struct GpuDevice {
    pub model: Name,
    pub total: f64,
    pub used: f64,
}

impl GpuDevice {
    pub(crate) fn free(&self) -> f64 {
        self.total - self.used
    }
}

/// A set of interned capability ids.
#[derive(Clone, Debug, Default)]
pub(crate) struct CapabilitySet(Vec<u64>);

impl CapabilitySet {
    fn insert(&mut self, id: u32) {
        let word = (id / 64) as usize;
        if self.0.len() <= word {
            self.0.resize(word + 1, 0);
        }
        self.0[word] |= 1 << (id % 64);
    }

    pub(crate) fn contains(&self, id: u32) -> bool {
        self.0
            .get((id / 64) as usize)
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }
}

/// A node as placement sees it.
#[derive(Clone, Debug)]
pub(crate) struct NodeEntry {
    pub id: NodeId,
    /// The pool and tier the node says it belongs to (for the trace).
    pub pool_name: Option<Name>,
    pub tier_name: Option<Name>,
    /// `(pool index, tier index)` once resolved against the settings.
    pub slot: Option<(u32, u32)>,
    pub phase: NodePhase,
    pub cordoned: bool,
    pub unhealthy: bool,
    pub has_inventory: bool,
    pub spare: bool,
    pub reserved_for: Vec<String>,
    pub reservation_exclusive: bool,
    pub kind: ProviderKind,
    /// Interned AZ; `None` when the node does not say (a prospective node).
    pub az: Option<u32>,
    pub durable: bool,
    /// `totalCapacity × utilizationCap − reserved`.
    pub usable: f64,
    /// Capacity reserved by placed jobs.
    pub used: f64,
    pub total_cores: u32,
    pub used_cores: u32,
    pub capabilities: CapabilitySet,
    /// Interned ids of held images that some template names, sorted.
    pub images: Vec<u32>,
    pub gpus: Vec<GpuDevice>,
    pub ports: Vec<HostPort>,
    pub occupants: Vec<u32>,
    pub exclusive_occupants: u32,
}

impl NodeEntry {
    pub(crate) fn free_capacity(&self) -> f64 {
        self.usable - self.used
    }

    pub(crate) fn free_cores(&self) -> u32 {
        self.total_cores.saturating_sub(self.used_cores)
    }

    /// An unconsumed spare: tagged spare and carrying no job (in-plan
    /// reservations included). Only these count as reserve.
    pub(crate) fn is_unconsumed_spare(&self) -> bool {
        self.spare && self.occupants.is_empty()
    }

    /// Booted, rather than still launching.
    pub(crate) fn is_launching(&self) -> bool {
        matches!(self.phase, NodePhase::Prospective | NodePhase::Starting)
    }
}

/// A job placed on a node, as the intra-replica and resilience rules need it.
#[derive(Clone, Debug)]
pub(crate) struct Occupant {
    pub bundle: Option<BundleId>,
    pub replica: u32,
    pub job_name: Name,
    pub node: NodeIdx,
    pub exclusive: bool,
}

/// The indexed, read-only fleet placement runs against (see the module
/// docs). Cloning it is the way to try placements without keeping them.
#[derive(Clone, Debug)]
pub struct FleetView {
    pools: Pools,
    pub(crate) nodes: Vec<NodeEntry>,
    /// Every node, in node-id order.
    pub(crate) order: Vec<NodeIdx>,
    by_id: HashMap<NodeId, NodeIdx>,
    /// `[pool][tier]` -> the tier's nodes, in node-id order.
    tiers: Vec<Vec<Vec<NodeIdx>>>,
    pub(crate) occupants: Vec<Occupant>,
    replicas: HashMap<BundleId, Vec<u32>>,
    pub(crate) capabilities: Interner,
    pub(crate) images: Interner,
    pub(crate) azs: Interner,
    template_images: HashMap<String, Vec<u32>>,
}

impl FleetView {
    /// Builds the view of `snapshot` against validated `pools`, applying
    /// every placed job as a reservation.
    pub fn new(snapshot: &FleetSnapshot, pools: Pools) -> Result<Self, FleetError> {
        let mut view = FleetView {
            tiers: pools.iter().map(|p| vec![Vec::new(); p.tiers.len()]).collect(),
            pools,
            nodes: Vec::with_capacity(snapshot.nodes.len()),
            order: Vec::with_capacity(snapshot.nodes.len()),
            by_id: HashMap::with_capacity(snapshot.nodes.len()),
            occupants: Vec::new(),
            replicas: HashMap::new(),
            capabilities: Interner::default(),
            images: Interner::default(),
            azs: Interner::default(),
            template_images: HashMap::new(),
        };
        for (template, refs) in &snapshot.template_images {
            let ids = refs.iter().map(|r| view.images.intern(r)).collect();
            view.template_images.insert(template.clone(), ids);
        }
        let mut sorted: Vec<&FleetNode> = snapshot.nodes.iter().collect();
        sorted.sort_by(|a, b| a.id.cmp(&b.id));
        for node in sorted {
            let entry = view.entry_for(node);
            view.push_node(entry)?;
        }
        for node in &snapshot.nodes {
            for job in &node.jobs {
                view.reserve(&node.id, job)?;
            }
        }
        Ok(view)
    }

    /// The validated pools the view was built against.
    pub fn pools(&self) -> &Pools {
        &self.pools
    }

    /// Whether the view holds a node with this id.
    pub fn contains(&self, id: &NodeId) -> bool {
        self.by_id.contains_key(id)
    }

    /// How many nodes the view holds (prospective ones included).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Reserves `job` on node `node`: its capacity, cores, host ports and GPU
    /// capacity are taken, and it becomes visible to the intra-replica and
    /// resilience rules. A job without a valid `gpuIndex` is charged to every
    /// device of the node: the device it uses is unknown, and no device may
    /// ever be double-booked.
    pub fn reserve(&mut self, node: &NodeId, job: &PlacedJob) -> Result<(), FleetError> {
        let idx = *self
            .by_id
            .get(node)
            .ok_or_else(|| FleetError::UnknownNode(node.clone()))?;
        let occupant = self.occupants.len() as u32;
        let entry = &mut self.nodes[idx as usize];
        entry.used += job.required_capacity.max(0.0);
        entry.used_cores += job.required_cores;
        entry.ports.extend_from_slice(&job.required_host_ports);
        if job.required_gpu_capacity > 0.0 {
            let device = job.gpu_index.and_then(|i| entry.gpus.get_mut(i as usize));
            match device {
                Some(device) => device.used += job.required_gpu_capacity,
                None => entry.gpus.iter_mut().for_each(|d| d.used += job.required_gpu_capacity),
            }
        }
        entry.occupants.push(occupant);
        if job.exclusive {
            entry.exclusive_occupants += 1;
        }
        self.occupants.push(Occupant {
            bundle: job.bundle.clone(),
            replica: job.replica_index,
            job_name: Name::from(job.job_name.as_str()),
            node: idx,
            exclusive: job.exclusive,
        });
        if let Some(bundle) = &job.bundle {
            self.replicas.entry(bundle.clone()).or_default().push(occupant);
        }
        Ok(())
    }

    /// Adds a prospective node of `pool`/`tier` provisioned as
    /// `instance_type`, so later placements can use it. It advertises what
    /// the shape says, in the tier's provider and region, with no AZ yet.
    pub fn add_prospective_node(
        &mut self,
        id: NodeId,
        pool: &str,
        tier: &str,
        instance_type: &str,
    ) -> Result<(), FleetError> {
        let unknown = || FleetError::UnknownShape {
            pool: pool.to_owned(),
            tier: tier.to_owned(),
            instance_type: instance_type.to_owned(),
        };
        let tier_spec = self
            .pools
            .get(pool)
            .and_then(|p| p.tiers.iter().find(|t| t.name == tier));
        let tier_spec = tier_spec.ok_or_else(unknown)?;
        let shape = tier_spec
            .candidate_instance_types
            .iter()
            .find(|s| s.instance_type == instance_type);
        let node = prospective_node(
            id,
            pool,
            tier,
            tier_spec.kind,
            tier_spec.region.clone(),
            shape.ok_or_else(unknown)?,
        );
        let entry = self.entry_for(&node);
        self.push_node(entry)
    }

    /// The nodes of one tier, in node-id order.
    pub(crate) fn tier_nodes(&self, pool: usize, tier: usize) -> &[NodeIdx] {
        self.tiers
            .get(pool)
            .and_then(|p| p.get(tier))
            .map_or(&[], Vec::as_slice)
    }

    pub(crate) fn node_index(&self, id: &NodeId) -> Option<NodeIdx> {
        self.by_id.get(id).copied()
    }

    pub(crate) fn node(&self, idx: NodeIdx) -> &NodeEntry {
        &self.nodes[idx as usize]
    }

    /// Occupant indices of one bundle (every replica).
    pub(crate) fn bundle_occupants(&self, bundle: &BundleId) -> &[u32] {
        self.replicas.get(bundle).map_or(&[], Vec::as_slice)
    }

    /// Interned images of a template; empty for a template with none known.
    pub(crate) fn template_images(&self, template: &str) -> &[u32] {
        self.template_images.get(template).map_or(&[], Vec::as_slice)
    }

    /// How many nodes of a tier count against its `maxNodes`: every node not
    /// yet stopped, prospective ones included.
    pub(crate) fn counted_tier_nodes(&self, pool: usize, tier: usize) -> u32 {
        let live = self
            .tier_nodes(pool, tier)
            .iter()
            .filter(|&&i| self.node(i).phase != NodePhase::Stopped);
        live.count() as u32
    }

    fn push_node(&mut self, entry: NodeEntry) -> Result<(), FleetError> {
        if self.by_id.contains_key(&entry.id) {
            return Err(FleetError::DuplicateNode(entry.id));
        }
        let idx = self.nodes.len() as NodeIdx;
        let nodes = &self.nodes;
        let at = self.order.partition_point(|&i| nodes[i as usize].id < entry.id);
        self.order.insert(at, idx);
        if let Some((pool, tier)) = entry.slot {
            let list = &mut self.tiers[pool as usize][tier as usize];
            let at = list.partition_point(|&i| nodes[i as usize].id < entry.id);
            list.insert(at, idx);
        }
        self.by_id.insert(entry.id.clone(), idx);
        self.nodes.push(entry);
        Ok(())
    }

    fn entry_for(&mut self, node: &FleetNode) -> NodeEntry {
        let pool_name = node
            .pool
            .as_deref()
            .or_else(|| node.tags.get(tags::POOL).map(String::as_str));
        let tier_name = node
            .tier
            .as_deref()
            .or_else(|| node.tags.get(tags::TIER).map(String::as_str));
        let slot = resolve_slot(&self.pools, pool_name, tier_name);
        // An untagged cluster node is reported under the fixed tier it
        // resolved to.
        let resolved_tier = slot.and_then(|(p, t)| self.pools.at(p as usize)?.tiers.get(t as usize));
        let tier_name = tier_name.or(resolved_tier.map(|t| t.name.as_str()));
        let durable = resolved_tier.is_none_or(|tier| tier.effective_reliability() == Reliability::Durable);
        let spare = node.spare || node.tags.get(tags::SPARE).is_some_and(|v| v == "true");
        let mut entry = NodeEntry {
            id: node.id.clone(),
            pool_name: pool_name.map(Name::from),
            tier_name: tier_name.map(Name::from),
            slot,
            phase: node.phase,
            cordoned: node.cordoned,
            unhealthy: node.unhealthy,
            has_inventory: node.inventory.is_some(),
            spare,
            reserved_for: node.spare_spec.reserved_for.clone(),
            reservation_exclusive: node.spare_spec.exclusive,
            kind: ProviderKind::LocalServers,
            az: None,
            durable,
            usable: 0.0,
            used: 0.0,
            total_cores: 0,
            used_cores: 0,
            capabilities: CapabilitySet::default(),
            images: Vec::new(),
            gpus: Vec::new(),
            ports: Vec::new(),
            occupants: Vec::new(),
            exclusive_occupants: 0,
        };
        if let Some(inventory) = &node.inventory {
            self.apply_inventory(&mut entry, inventory);
        }
        entry
    }

    fn apply_inventory(&mut self, entry: &mut NodeEntry, inventory: &NodeInventory) {
        entry.kind = inventory.kind;
        entry.az = (!inventory.az.is_empty()).then(|| self.azs.intern(&inventory.az));
        // "utilizationCap is a fraction (0, 1]; anything else is read as 1",
        // so a node can never advertise more than its declared capacity.
        let cap = inventory.utilization_cap;
        let cap = if cap > 0.0 && cap <= 1.0 { cap } else { 1.0 };
        let total = if inventory.total_capacity.is_finite() {
            inventory.total_capacity
        } else {
            0.0
        };
        entry.usable = (total * cap - inventory.reserved_capacity.max(0.0)).max(0.0);
        entry.total_cores = inventory.total_cores;
        for capability in &inventory.capabilities {
            entry.capabilities.insert(self.capabilities.intern(capability));
        }
        let mut images: Vec<u32> = inventory.images.iter().filter_map(|i| self.images.get(i)).collect();
        images.sort_unstable();
        images.dedup();
        entry.images = images;
        entry.gpus = inventory
            .gpus
            .iter()
            .map(|g| GpuDevice {
                model: Name::from(g.model.as_str()),
                total: if g.total_capacity.is_finite() {
                    g.total_capacity.max(0.0)
                } else {
                    0.0
                },
                used: 0.0,
            })
            .collect();
    }
}

fn resolve_slot(pools: &Pools, pool: Option<&str>, tier: Option<&str>) -> Option<(u32, u32)> {
    let pool_idx = pools.index_of(pool?)?;
    let spec: &PlacementPool = pools.at(pool_idx)?;
    // An untagged cluster node belongs to its pool's fixed tier.
    let tier_idx = match tier {
        Some(name) => spec.tiers.iter().position(|t| t.name == name)?,
        None => spec
            .tiers
            .iter()
            .position(|t| t.scale_out == crate::model::ScaleOut::Fixed)?,
    };
    Some((pool_idx as u32, tier_idx as u32))
}

fn prospective_node(
    id: NodeId,
    pool: &str,
    tier: &str,
    kind: ProviderKind,
    region: Option<String>,
    shape: &InstanceShape,
) -> FleetNode {
    FleetNode {
        id,
        pool: Some(pool.to_owned()),
        tier: Some(tier.to_owned()),
        phase: NodePhase::Prospective,
        cordoned: false,
        unhealthy: false,
        spare: false,
        spare_spec: Default::default(),
        tags: Default::default(),
        inventory: Some(NodeInventory {
            kind,
            region: region.unwrap_or_default(),
            az: String::new(),
            instance_type: shape.instance_type.clone(),
            total_capacity: shape.total_capacity,
            total_cores: shape.total_cores,
            utilization_cap: 1.0,
            reserved_capacity: 0.0,
            capabilities: shape.capabilities.clone(),
            gpus: shape.gpus.clone(),
            images: Vec::new(),
            nics: Vec::new(),
        }),
        jobs: Vec::new(),
    }
}
