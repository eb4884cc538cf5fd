//! The fleet view placement reads: every node of a [`FleetSnapshot`] with
//! its free capacity, cores, host ports and per-device GPU capacity worked
//! out once, indexed by pool and tier, plus the reservations placed since
//! (in-plan placements, prospective nodes).
//!
//! Reservations are applied as deltas ([`FleetView::reserve`]), and nodes
//! are added, replaced and removed in place, so a long run of placements
//! never rebuilds the view. Nodes are kept in node-id order (labels that
//! sort like the ids, `order`), which makes every result independent of the
//! snapshot's order. Every change keeps the candidate index (`index`) the
//! untraced placement searches up to date. This module owns the accounting
//! of the capacity, GPU and port contracts; it never decides where anything
//! goes.

mod index;
mod membership;
mod names;
mod node;
mod order;

use foldhash::{HashMap, HashMapExt};

pub(crate) use index::{ClassKey, Entry, FleetIndex, GPU_ROOM_STEPS, Occupancy, Traits, fill_order, order_fill};
pub(crate) use names::Interner;
pub use names::Name;
pub(crate) use node::{CapabilitySet, GpuDevice, Hot, NO_AZ, NO_SLOT, NodeEntry, fill_of, flag, port_bit};
use node::{cores, slot};

use crate::model::{
    BundleId, FleetNode, FleetSnapshot, NodeId, NodeInventory, NodePhase, PlacedJob, PlacementPool, ProviderKind,
    Reliability, tags,
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

/// A job placed on a node, as the intra-replica and resilience rules need it.
#[derive(Clone, Debug)]
pub(crate) struct Occupant {
    pub bundle: Option<BundleId>,
    pub replica: u32,
    pub job_name: Name,
    pub node: NodeIdx,
    pub exclusive: bool,
    /// GPU capacity reserved, and on which device (`None`: unknown, so
    /// charged to every device).
    pub gpu: f64,
    pub gpu_index: Option<u32>,
}

/// The indexed, read-only fleet placement runs against (see the module
/// docs). Cloning it is the way to try placements without keeping them.
#[derive(Clone, Debug)]
pub struct FleetView {
    pools: Pools,
    /// The hot part of every node, indexed like `nodes`.
    pub(crate) hot: Vec<Hot>,
    pub(crate) nodes: Vec<NodeEntry>,
    /// Every node, in node-id order (a removed node's index is left unused).
    pub(crate) order: Vec<NodeIdx>,
    by_id: HashMap<NodeId, NodeIdx>,
    /// `[pool][tier]` -> the tier's nodes.
    tiers: Vec<Vec<Vec<NodeIdx>>>,
    /// The tiers' nodes filed for the untraced search.
    pub(crate) index: FleetIndex,
    pub(crate) occupants: Vec<Occupant>,
    /// Slots of `occupants` released and free for the next reservation, so
    /// what-ifs that reserve and release again do not grow it.
    free_occupants: Vec<u32>,
    replicas: HashMap<BundleId, Vec<u32>>,
    pub(crate) capabilities: Interner,
    pub(crate) images: Interner,
    pub(crate) azs: Interner,
    template_images: HashMap<String, Vec<u32>>,
    /// `(pool, tier)` indices whose provisioning is withheld (a what-if in
    /// which the tier's capacity is lost, see `placement::headroom`).
    withheld: Vec<(usize, usize)>,
}

impl FleetView {
    /// Builds the view of `snapshot` against validated `pools`, applying
    /// every placed job as a reservation.
    pub fn new(snapshot: &FleetSnapshot, pools: Pools) -> Result<Self, FleetError> {
        let mut view = FleetView {
            tiers: pools.iter().map(|p| vec![Vec::new(); p.tiers.len()]).collect(),
            index: FleetIndex::new(&pools),
            pools,
            hot: Vec::with_capacity(snapshot.nodes.len()),
            nodes: Vec::with_capacity(snapshot.nodes.len()),
            order: Vec::with_capacity(snapshot.nodes.len()),
            by_id: HashMap::with_capacity(snapshot.nodes.len()),
            occupants: Vec::new(),
            free_occupants: Vec::new(),
            replicas: HashMap::new(),
            capabilities: Interner::default(),
            images: Interner::default(),
            azs: Interner::default(),
            template_images: HashMap::new(),
            withheld: Vec::new(),
        };
        // Template images are interned first, so they get the low ids the
        // hot image mask holds.
        for (template, refs) in &snapshot.template_images {
            let ids = refs.iter().map(|r| view.images.intern(r)).collect();
            view.template_images.insert(template.clone(), ids);
        }
        // Nodes are numbered tier by tier, in id order within a tier, so a
        // tier scan reads the hot parts front to back.
        let mut sorted: Vec<(u32, &FleetNode)> = snapshot.nodes.iter().map(|n| (view.slot_of(n), n)).collect();
        sorted.sort_by(|(a_slot, a), (b_slot, b)| a_slot.cmp(b_slot).then_with(|| a.id.cmp(&b.id)));
        for (_, node) in sorted {
            let (idx, slot) = view.append_node(node)?;
            if slot != NO_SLOT {
                view.tiers[(slot >> 16) as usize][(slot & 0xffff) as usize].push(idx);
            }
        }
        let nodes = &view.nodes;
        view.order = (0..nodes.len() as NodeIdx).collect();
        view.order
            .sort_by(|&a, &b| nodes[a as usize].id.cmp(&nodes[b as usize].id));
        view.label_in_order();
        for node in &snapshot.nodes {
            for job in &node.jobs {
                view.reserve(&node.id, job)?;
            }
        }
        // Filed once every reservation is in, rather than re-filed per job.
        for idx in 0..view.nodes.len() {
            view.index.reprofile(idx as NodeIdx, &view.hot[idx], &view.nodes[idx]);
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
        self.by_id.len()
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
        let occupant = self.free_occupants.pop().unwrap_or(self.occupants.len() as u32);
        let hot = &mut self.hot[idx as usize];
        hot.free -= job.required_capacity.max(0.0);
        hot.refill(self.nodes[idx as usize].usable);
        hot.used_cores = hot.used_cores.saturating_add(cores(job.required_cores));
        hot.occupants = hot.occupants.saturating_add(1);
        if job.exclusive {
            hot.exclusive_occupants = hot.exclusive_occupants.saturating_add(1);
        }
        for port in &job.required_host_ports {
            hot.ports |= port_bit(port);
        }
        let entry = &mut self.nodes[idx as usize];
        entry.ports.extend_from_slice(&job.required_host_ports);
        if job.required_gpu_capacity > 0.0 {
            match job.gpu_index.and_then(|i| entry.gpus.get_mut(i as usize)) {
                Some(device) => device.used += job.required_gpu_capacity,
                None => entry.gpus.iter_mut().for_each(|d| d.used += job.required_gpu_capacity),
            }
        }
        entry.occupants.push(occupant);
        let record = Occupant {
            bundle: job.bundle.clone(),
            replica: job.replica_index,
            job_name: Name::from(job.job_name.as_str()),
            node: idx,
            exclusive: job.exclusive,
            gpu: job.required_gpu_capacity.max(0.0),
            gpu_index: job.gpu_index,
        };
        match self.occupants.get_mut(occupant as usize) {
            Some(slot) => *slot = record,
            None => self.occupants.push(record),
        }
        if let Some(bundle) = &job.bundle {
            match self.replicas.get_mut(bundle) {
                Some(list) => list.push(occupant),
                None => {
                    self.replicas.insert(bundle.clone(), vec![occupant]);
                }
            }
        }
        let slot = self.hot[idx as usize].slot;
        let mut take_up = false;
        for &port in &job.required_host_ports {
            take_up |= self.index.port_claim(slot, port, true);
        }
        self.refile(idx, take_up);
        Ok(())
    }

    /// Re-files node `idx` in the index, and every node of its tier when
    /// the tier has just taken up a host port.
    fn refile(&mut self, idx: NodeIdx, whole_tier: bool) {
        let slot = self.hot[idx as usize].slot;
        let tier_nodes = match self.tier_list(slot) {
            Some(list) if whole_tier => std::mem::take(list),
            _ => Vec::new(),
        };
        for &i in tier_nodes.iter().chain(std::iter::once(&idx)) {
            self.index.refile(i, &self.hot[i as usize], &self.nodes[i as usize]);
        }
        if let Some(list) = self.tier_list(slot)
            && whole_tier
        {
            *list = tier_nodes;
        }
    }

    /// Undoes [`FleetView::reserve`] of `job` on `node`: its capacity, cores,
    /// host ports and GPU capacity are given back and it is no longer seen
    /// by the intra-replica and resilience rules. A job not reserved there
    /// changes nothing.
    pub fn release(&mut self, node: &NodeId, job: &PlacedJob) -> Result<(), FleetError> {
        let idx = *self
            .by_id
            .get(node)
            .ok_or_else(|| FleetError::UnknownNode(node.clone()))?;
        let occupants = &self.occupants;
        let entry = &mut self.nodes[idx as usize];
        let Some(at) = entry.occupants.iter().position(|&o| {
            let o = &occupants[o as usize];
            o.bundle == job.bundle && o.replica == job.replica_index && o.job_name.as_str() == job.job_name
        }) else {
            return Ok(());
        };
        let occupant = entry.occupants.remove(at);
        self.free_occupants.push(occupant);
        let slot = self.hot[idx as usize].slot;
        for port in &job.required_host_ports {
            if let Some(p) = entry.ports.iter().position(|p| p == port) {
                entry.ports.remove(p);
                self.index.port_claim(slot, *port, false);
            }
        }
        if job.required_gpu_capacity > 0.0 {
            match job.gpu_index.and_then(|i| entry.gpus.get_mut(i as usize)) {
                Some(device) => device.used -= job.required_gpu_capacity,
                None => entry.gpus.iter_mut().for_each(|d| d.used -= job.required_gpu_capacity),
            }
        }
        let hot = &mut self.hot[idx as usize];
        hot.free += job.required_capacity.max(0.0);
        hot.refill(entry.usable);
        hot.used_cores = hot.used_cores.saturating_sub(cores(job.required_cores));
        hot.occupants = cores(entry.occupants.len() as u32);
        let exclusive = entry.occupants.iter().filter(|&&o| occupants[o as usize].exclusive);
        hot.exclusive_occupants = cores(exclusive.count() as u32);
        hot.ports = entry.ports.iter().fold(0, |mask, p| mask | port_bit(p));
        if let Some(bundle) = &job.bundle
            && let Some(list) = self.replicas.get_mut(bundle)
        {
            list.retain(|&o| o != occupant);
        }
        self.refile(idx, false);
        Ok(())
    }

    /// Changes a node's lifecycle phase and health, as [`FleetView::new`]
    /// would have read them.
    pub fn set_condition(&mut self, node: &NodeId, phase: NodePhase, unhealthy: bool) -> Result<(), FleetError> {
        let idx = *self
            .by_id
            .get(node)
            .ok_or_else(|| FleetError::UnknownNode(node.clone()))?;
        self.nodes[idx as usize].phase = phase;
        let hot = &mut self.hot[idx as usize];
        for (on, bit) in [
            (matches!(phase, NodePhase::Stopping | NodePhase::Stopped), flag::GONE),
            (unhealthy, flag::UNHEALTHY),
            (
                matches!(phase, NodePhase::Prospective | NodePhase::Starting),
                flag::LAUNCHING,
            ),
        ] {
            if on {
                hot.flags |= bit;
            } else {
                hot.flags &= !bit;
            }
        }
        self.index
            .reprofile(idx, &self.hot[idx as usize], &self.nodes[idx as usize]);
        Ok(())
    }

    /// Withholds (or gives back) provisioning from tier `tier` of pool
    /// `pool`: while withheld, the tier places only on the nodes it has.
    pub(crate) fn withhold_provisioning(&mut self, pool: usize, tier: usize, withheld: bool) {
        self.withheld.retain(|&at| at != (pool, tier));
        if withheld {
            self.withheld.push((pool, tier));
        }
    }

    /// Whether provisioning from the tier is withheld.
    pub(crate) fn provisioning_withheld(&self, pool: usize, tier: usize) -> bool {
        self.withheld.contains(&(pool, tier))
    }

    /// The nodes of one tier.
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

    pub(crate) fn hot(&self, idx: NodeIdx) -> &Hot {
        &self.hot[idx as usize]
    }

    /// Whether what is reserved on node `id` exceeds what it holds: its
    /// capacity or cores, or a host port claimed twice. (GPU devices are
    /// left out: a job whose device is not known is charged to every
    /// device, so a sum over them overstates the load.) A node the view
    /// does not hold is not.
    pub fn over_committed(&self, id: &NodeId) -> bool {
        let Some(idx) = self.node_index(id) else {
            return false;
        };
        let (hot, entry) = (self.hot(idx), self.node(idx));
        hot.free < -super::filter::CAPACITY_EPSILON
            || hot.used_cores > hot.total_cores
            || entry
                .ports
                .iter()
                .enumerate()
                .any(|(i, p)| entry.ports[..i].contains(p))
            || gpus_over_committed(entry, &self.occupants)
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
        self.index.tier(pool, tier).map_or(0, |t| t.counted)
    }

    /// The node list of slot `slot`'s tier.
    fn tier_list(&mut self, slot: u32) -> Option<&mut Vec<NodeIdx>> {
        if slot == NO_SLOT {
            return None;
        }
        self.tiers
            .get_mut((slot >> 16) as usize)?
            .get_mut((slot & 0xffff) as usize)
    }

    /// Numbers a node and records it, returning its index and slot.
    fn append_node(&mut self, node: &FleetNode) -> Result<(NodeIdx, u32), FleetError> {
        if self.by_id.contains_key(&node.id) {
            return Err(FleetError::DuplicateNode(node.id.clone()));
        }
        let (hot, entry) = self.describe(node);
        let idx = self.nodes.len() as NodeIdx;
        self.by_id.insert(entry.id.clone(), idx);
        self.hot.push(hot);
        self.nodes.push(entry);
        Ok((idx, hot.slot))
    }

    /// The pool and tier a node belongs to, packed as [`Hot::slot`].
    fn slot_of(&self, node: &FleetNode) -> u32 {
        let (pool, tier) = membership(node);
        resolve_slot(&self.pools, pool, tier).map_or(NO_SLOT, |(p, t)| slot(p, t))
    }

    /// The hot and cold parts of a node, before any job is reserved on it.
    fn describe(&mut self, node: &FleetNode) -> (Hot, NodeEntry) {
        let (pool_name, tier_name) = membership(node);
        let resolved = resolve_slot(&self.pools, pool_name, tier_name);
        let resolved_tier = resolved.and_then(|(p, t)| self.pools.at(p)?.tiers.get(t));
        // An untagged cluster node is reported under the fixed tier it
        // resolved to.
        let tier_name = tier_name.or(resolved_tier.map(|t| t.name.as_str()));
        let spare = node.spare || node.tags.get(tags::SPARE).is_some_and(|v| v == "true");
        let reserved = spare && !node.spare_spec.reserved_for.is_empty();
        let mut flags = 0;
        for (on, bit) in [
            (node.inventory.is_some(), flag::INVENTORY),
            (
                matches!(node.phase, NodePhase::Stopping | NodePhase::Stopped),
                flag::GONE,
            ),
            (node.unhealthy, flag::UNHEALTHY),
            (node.cordoned, flag::CORDONED),
            (spare, flag::SPARE),
            (reserved, flag::RESERVED),
            (reserved && node.spare_spec.exclusive, flag::EXCLUSIVE_RESERVATION),
            (
                matches!(node.phase, NodePhase::Prospective | NodePhase::Starting),
                flag::LAUNCHING,
            ),
            (
                resolved_tier.is_none_or(|t| t.effective_reliability() == Reliability::Durable),
                flag::DURABLE,
            ),
        ] {
            if on {
                flags |= bit;
            }
        }
        let mut hot = Hot {
            free: 0.0,
            fill: 1.0,
            capabilities: 0,
            ports: 0,
            images: 0,
            slot: resolved.map_or(NO_SLOT, |(p, t)| slot(p, t)),
            az: NO_AZ,
            rank: 0,
            total_cores: 0,
            used_cores: 0,
            occupants: 0,
            exclusive_occupants: 0,
            flags,
            kind: ProviderKind::LocalServers,
        };
        let mut entry = NodeEntry {
            id: node.id.clone(),
            usable: 0.0,
            pool_name: pool_name.map(Name::from),
            tier_name: tier_name.map(Name::from),
            phase: node.phase,
            reserved_for: node.spare_spec.reserved_for.clone(),
            capabilities: CapabilitySet::default(),
            images: Vec::new(),
            gpus: Vec::new(),
            ports: Vec::new(),
            occupants: Vec::new(),
        };
        if let Some(inventory) = &node.inventory {
            self.apply_inventory(&mut hot, &mut entry, inventory);
        }
        (hot, entry)
    }

    fn apply_inventory(&mut self, hot: &mut Hot, entry: &mut NodeEntry, inventory: &NodeInventory) {
        hot.kind = inventory.kind;
        if !inventory.az.is_empty() {
            hot.az = self.azs.intern(&inventory.az);
        }
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
        hot.free = entry.usable;
        hot.refill(entry.usable);
        hot.total_cores = cores(inventory.total_cores);
        for capability in &inventory.capabilities {
            entry.capabilities.insert(self.capabilities.intern(capability));
        }
        hot.capabilities = entry.capabilities.low_word();
        let mut images: Vec<u32> = inventory.images.iter().filter_map(|i| self.images.get(i)).collect();
        images.sort_unstable();
        images.dedup();
        hot.images = images.iter().filter(|&&i| i < 64).fold(0, |mask, &i| mask | (1 << i));
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

/// Whether a node's GPUs hold more than they can. A job with a known
/// device over-commits that device. Jobs whose device is unknown (read back
/// from Manager, which does not record it) are charged to every device by
/// placement, to stay safe; here they over-commit the node only when they
/// cannot be given devices: first fit, largest first, into what the known
/// assignments leave free. (Reading every device as holding all of them
/// would call a healthy node of several devices over-committed, and shed a
/// live instance from it.)
fn gpus_over_committed(entry: &NodeEntry, occupants: &[Occupant]) -> bool {
    let epsilon = super::filter::CAPACITY_EPSILON;
    let mut free: Vec<f64> = entry.gpus.iter().map(|d| d.total).collect();
    let mut unknown: Vec<f64> = Vec::new();
    for occupant in entry
        .occupants
        .iter()
        .map(|&o| &occupants[o as usize])
        .filter(|o| o.gpu > 0.0)
    {
        match occupant.gpu_index.and_then(|i| free.get_mut(i as usize)) {
            Some(device) => *device -= occupant.gpu,
            None => unknown.push(occupant.gpu),
        }
    }
    if free.iter().any(|&f| f < -epsilon) {
        return true;
    }
    unknown.sort_unstable_by(|a, b| b.total_cmp(a));
    unknown
        .into_iter()
        .any(|need| match free.iter_mut().find(|f| **f + epsilon >= need) {
            Some(device) => {
                *device -= need;
                false
            }
            None => true,
        })
}

/// The pool and tier a node names: its fields, else its tags.
fn membership(node: &FleetNode) -> (Option<&str>, Option<&str>) {
    let tag = |name| node.tags.get(name).map(String::as_str);
    (
        node.pool.as_deref().or_else(|| tag(tags::POOL)),
        node.tier.as_deref().or_else(|| tag(tags::TIER)),
    )
}

fn resolve_slot(pools: &Pools, pool: Option<&str>, tier: Option<&str>) -> Option<(usize, usize)> {
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
    Some((pool_idx, tier_idx))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::validate_pools;

    fn view() -> FleetView {
        let pools = yaml_serde::from_str(
            "- {name: p, tiers: [{name: t, kind: aws, candidateInstanceTypes: [{instanceType: m, totalCapacity: 4}]}]}",
        )
        .unwrap();
        let fleet: FleetSnapshot = yaml_serde::from_str(
            "nodes:\n- {id: d, pool: p, tier: t, inventory: {kind: aws, totalCapacity: 4}}\n- {id: b, pool: p, tier: t, inventory: {kind: aws, totalCapacity: 4}}",
        )
        .unwrap();
        FleetView::new(&fleet, validate_pools(pools).unwrap()).unwrap()
    }

    /// Node ids with their labels, in label order.
    fn by_label(view: &FleetView) -> Vec<(u32, String)> {
        let mut ranked: Vec<(u32, String)> = view
            .order
            .iter()
            .map(|&i| (view.hot(i).rank, view.node(i).id.to_string()))
            .collect();
        ranked.sort_unstable();
        ranked
    }

    #[test]
    fn labels_follow_node_id_order_as_prospective_nodes_arrive_without_moving_the_others() {
        let mut view = view();
        for id in ["c", "a", "e"] {
            let before = by_label(&view);
            view.add_prospective_node(NodeId::from(id), "p", "t", "m").unwrap();
            let after = by_label(&view);
            assert!(
                before.iter().all(|old| after.contains(old)),
                "adding {id} moved a label"
            );
        }
        let ids: Vec<String> = by_label(&view).into_iter().map(|(_, id)| id).collect();
        assert_eq!(ids, ["a", "b", "c", "d", "e"]);
        assert_eq!(view.counted_tier_nodes(0, 0), 5);
    }

    #[test]
    fn a_crowded_label_gap_is_spread_out_and_the_index_follows() {
        let mut view = view();
        let mut moved = 0;
        // Ids that all sort between "b" and "d", each just after the last.
        let mut id = String::from("c");
        for _ in 0..200 {
            id.push('0');
            let before = by_label(&view);
            view.add_prospective_node(NodeId::from(id.as_str()), "p", "t", "m")
                .unwrap();
            moved += before.iter().filter(|old| !by_label(&view).contains(old)).count();
            for &idx in &view.order {
                assert_eq!(
                    view.index.filed_label(idx),
                    Some(view.hot(idx).rank),
                    "{} is filed under its label",
                    view.node(idx).id
                );
            }
        }
        assert!(moved > 0, "the room ran out and labels were spread again");
        let ranked = by_label(&view);
        let mut ids: Vec<String> = ranked.iter().map(|(_, id)| id.clone()).collect();
        let labelled = ids.clone();
        ids.sort();
        assert_eq!(labelled, ids);
        assert!(ranked.windows(2).all(|w| w[0].0 < w[1].0), "labels are distinct");
    }

    #[test]
    fn a_reservation_takes_capacity_cores_ports_and_gpu_from_its_node() {
        let mut view = view();
        let job: PlacedJob =
            yaml_serde::from_str("{jobId: x, requiredCapacity: 1.5, requiredCores: 2, requiredHostPorts: [1935/tcp]}")
                .unwrap();
        view.reserve(&NodeId::from("b"), &job).unwrap();
        let idx = view.node_index(&NodeId::from("b")).unwrap();
        assert_eq!(view.hot(idx).free, 2.5);
        assert_eq!(view.hot(idx).used_cores, 2);
        assert_eq!(view.hot(idx).occupants, 1);
        assert_eq!(view.node(idx).ports, vec!["1935/tcp".parse().unwrap()]);
        assert!(view.hot(idx).ports & port_bit(&"1935/tcp".parse().unwrap()) != 0);
        assert_eq!(
            view.reserve(&NodeId::from("nope"), &job),
            Err(FleetError::UnknownNode(NodeId::from("nope")))
        );
    }

    #[test]
    fn gpus_are_over_committed_per_known_device_and_when_jobs_of_unknown_devices_cannot_be_fitted() {
        let pools = validate_pools(vec![]).unwrap();
        let fleet: FleetSnapshot = yaml_serde::from_str(
            "nodes:\n- {id: one, inventory: {kind: local-servers, totalCapacity: 8, gpus: [{model: t4, totalCapacity: 1}]}}\n\
             - {id: two, inventory: {kind: local-servers, totalCapacity: 8, gpus: [{model: t4, totalCapacity: 1}, {model: t4, totalCapacity: 1}]}}",
        )
        .unwrap();
        let mut view = FleetView::new(&fleet, pools).unwrap();
        let job = |id: &str, index: Option<u32>| -> PlacedJob {
            let mut job: PlacedJob =
                yaml_serde::from_str(&format!("{{jobId: {id}, jobName: {id}, requiredGpuCapacity: 0.6}}")).unwrap();
            job.gpu_index = index;
            job
        };
        let (one, two) = (NodeId::from("one"), NodeId::from("two"));
        // One device: two jobs of 0.6 whose device is unknown cannot fit.
        view.reserve(&one, &job("a", None)).unwrap();
        assert!(!view.over_committed(&one));
        view.reserve(&one, &job("b", None)).unwrap();
        assert!(view.over_committed(&one));
        view.release(&one, &job("b", None)).unwrap();
        assert!(!view.over_committed(&one));
        // Two devices: two such jobs fit (one on each), a third does not.
        view.reserve(&two, &job("a", None)).unwrap();
        view.reserve(&two, &job("b", None)).unwrap();
        assert!(!view.over_committed(&two), "one job on each device fits");
        view.reserve(&two, &job("c", None)).unwrap();
        assert!(view.over_committed(&two));
        view.release(&two, &job("c", None)).unwrap();
        // A known device holds no more than it has.
        view.reserve(&two, &job("c", Some(0))).unwrap();
        view.release(&two, &job("a", None)).unwrap();
        view.release(&two, &job("b", None)).unwrap();
        view.reserve(&two, &job("d", Some(0))).unwrap();
        assert!(view.over_committed(&two), "device 0 holds 1.2 of 1");
    }

    #[test]
    fn a_node_listed_twice_is_refused() {
        let fleet: FleetSnapshot = yaml_serde::from_str("nodes: [{id: a}, {id: a}]").unwrap();
        let pools = validate_pools(vec![]).unwrap();
        assert_eq!(
            FleetView::new(&fleet, pools).unwrap_err(),
            FleetError::DuplicateNode(NodeId::from("a"))
        );
    }
}
