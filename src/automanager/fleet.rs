//! The core's fleet view: every node Manager reported (or this core asked
//! for), its phase, tags and inventory, its health, what this core
//! provisioned and when, and whether this core terminated it. Reservations
//! are not kept here: they are derived from the job bindings whenever a
//! placement view is built ([`Fleet::snapshot`]) or brought up to date.

use std::collections::{BTreeMap, HashMap};

use crate::model::{
    FleetNode, FleetSnapshot, InstanceShape, JobId, LaunchMode, NodeId, NodeInfo, NodeInventory, NodePhase,
    NodeStopReason, PlacedJob, ProviderKind, ScaleOut, SpareSpec, UnixMillis, tags,
};
use crate::placement::Pools;

use super::recovery::NodeHealth;
use super::settings::AutoSettings;

/// A node this core provisioned.
#[derive(Clone, Debug, PartialEq)]
pub struct Provisioned {
    pub pool: String,
    pub tier: String,
    /// The shape asked for.
    pub instance_type: String,
    /// The provider.
    pub kind: ProviderKind,
    pub region: String,
    /// The job it was provisioned for (none for a hot spare).
    pub for_job: Option<JobId>,
    /// If it has not started by then, its jobs are re-placed and it is
    /// terminated (`provisionTimeoutMs`, which is also its startup grace).
    pub start_deadline: UnixMillis,
}

/// One node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeState {
    /// The node id.
    pub id: NodeId,
    /// Its tags (pool, tier, spare, ...).
    pub tags: BTreeMap<String, String>,
    /// Lifecycle phase.
    pub phase: NodePhase,
    /// What the worker advertises.
    pub inventory: Option<NodeInventory>,
    /// What a person declared the node to be (a NorskNode's
    /// `spec.inventory`): placement reads it where Manager reports no
    /// inventory.
    pub declared: Option<NodeInventory>,
    /// Set when this core provisioned it.
    pub provisioned: Option<Provisioned>,
    /// This core issued a terminate for it (once per node).
    pub terminated: bool,
    /// Cordoned: no new placements land here (`cordonNode`).
    pub cordoned: bool,
    /// A `singleUse` job left it with co-located peers still on it: it is
    /// terminated once nothing is left on it, not kept for reuse.
    pub release_when_empty: bool,
    /// When it stopped and why it was stopping.
    pub stopped_at: Option<UnixMillis>,
    /// The last `NodeStopping` reason.
    pub stop_reason: Option<NodeStopReason>,
    /// Rejection count and exclusion.
    pub health: NodeHealth,
    /// Bumped whenever the node is handed out for change, so the kept
    /// placement view re-reads only the nodes that may have changed.
    pub(super) revision: u64,
}

impl NodeState {
    fn new(id: NodeId, phase: NodePhase) -> Self {
        Self {
            id,
            tags: BTreeMap::new(),
            phase,
            inventory: None,
            declared: None,
            provisioned: None,
            terminated: false,
            cordoned: false,
            release_when_empty: false,
            stopped_at: None,
            stop_reason: None,
            health: NodeHealth::default(),
            revision: 0,
        }
    }

    /// Whether a provisioned cloud node (never a registered cluster node):
    /// the only kind `singleUse` may terminate.
    pub fn is_provisioned_cloud(&self) -> bool {
        self.provisioned.is_some()
            && self
                .inventory
                .as_ref()
                .is_none_or(|inventory| inventory.kind.is_cloud())
    }

    /// Still launching: prospective or starting.
    pub fn is_launching(&self) -> bool {
        matches!(self.phase, NodePhase::Prospective | NodePhase::Starting)
    }

    /// Gone or going.
    pub fn is_going(&self) -> bool {
        matches!(self.phase, NodePhase::Stopping | NodePhase::Stopped)
    }

    /// What placement plans on for a node that advertises no inventory:
    /// what a person declared it to be, else the shape it was provisioned
    /// with — this core's record of the
    /// provision, else the pool, tier and instance type it was tagged with
    /// (a node a predecessor provisioned, or any node of a Manager without
    /// the inventory addition) — or, for a cluster server of a pool's fixed
    /// tier, that tier's first candidate shape (what a person declared its
    /// servers to be). None: its capacity is unknown and nothing is placed
    /// on it.
    pub fn placement_inventory(&self, pools: &Pools) -> Option<NodeInventory> {
        if let Some(declared) = &self.declared {
            return Some(declared.clone());
        }
        if let Some(p) = &self.provisioned {
            let shape = shape_of(pools, &p.pool, &p.tier, Some(&p.instance_type))?;
            return Some(shape.prospective_inventory(p.kind, p.region.clone()));
        }
        let pool = pools.get(self.tags.get(tags::POOL)?)?;
        let tier = match self.tags.get(tags::TIER) {
            Some(name) => pool.tiers.iter().find(|t| &t.name == name)?,
            None => pool.fixed_tier()?,
        };
        let shape = match self.tags.get(tags::INSTANCE_TYPE) {
            Some(instance_type) => tier
                .candidate_instance_types
                .iter()
                .find(|s| &s.instance_type == instance_type)?,
            None if tier.scale_out == ScaleOut::Fixed => tier.candidate_instance_types.first()?,
            None => return None,
        };
        Some(shape.prospective_inventory(tier.kind, tier.region.clone().unwrap_or_default()))
    }
}

/// Every node.
///
/// Nodes change only through the named methods below, and each decides
/// whether its change counts in [`Fleet::changes`]: a change that can give
/// a job that found nowhere somewhere to go (a node connected or up, new
/// tags or inventory, an exclusion lifted, a cordon lifted), or that the
/// spare reconciler and node services must see (a node stopping, stopped,
/// terminated, forgotten, newly excluded). A change that only takes
/// capacity away from jobs already placed (a cordon, a launch the placement
/// round itself planned, a node swept long after it stopped) does not
/// count: nothing waiting could fit because of it.
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    nodes: BTreeMap<NodeId, NodeState>,
    /// The last revision handed to a node (moves on every change to the
    /// fleet, a node forgotten included).
    revision: u64,
    /// Counts the changes that count (see above).
    changes: u64,
    /// Every declaration people made (see [`NodeState::declared`]), whether
    /// or not Manager has told of the node yet: a node told of later is
    /// created with its declaration.
    declared: BTreeMap<NodeId, NodeInventory>,
}

impl Fleet {
    /// The node `id`.
    pub fn get(&self, id: &NodeId) -> Option<&NodeState> {
        self.nodes.get(id)
    }

    /// Every node, in id order.
    pub fn iter(&self) -> impl Iterator<Item = &NodeState> {
        self.nodes.values()
    }

    /// Whether the fleet holds `id`.
    pub fn contains(&self, id: &NodeId) -> bool {
        self.nodes.contains_key(id)
    }

    /// How many changes that count the fleet has seen (see [`Fleet`]).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Moves on every change to the fleet, whether it counts or not.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The node `id`, to change: its revision moves, so the kept placement
    /// view reads it again.
    fn get_mut(&mut self, id: &NodeId) -> Option<&mut NodeState> {
        self.revision += 1;
        let revision = self.revision;
        let node = self.nodes.get_mut(id)?;
        node.revision = revision;
        Some(node)
    }

    /// The node `id`, to change, created in `phase` when unknown.
    fn entry(&mut self, id: &NodeId, phase: NodePhase) -> &mut NodeState {
        self.revision += 1;
        let declared = &self.declared;
        let node = self.nodes.entry(id.clone()).or_insert_with(|| NodeState {
            declared: declared.get(id).cloned(),
            ..NodeState::new(id.clone(), phase)
        });
        node.revision = self.revision;
        node
    }

    /// `NodeStarting`: what Manager said about a launching node (tags).
    /// Its launch was already known to placement (planned by this core, or
    /// counted when another's node connects or comes up).
    pub fn starting(&mut self, info: &NodeInfo) {
        let node = self.entry(&info.node_id, NodePhase::Starting);
        node.tags = info.tags.clone();
        if node.phase == NodePhase::Prospective {
            node.phase = NodePhase::Starting;
        }
    }

    /// `NodeStarted`/`NodeRunning`: the node is up, with these tags.
    pub fn running(&mut self, info: &NodeInfo) -> &NodeState {
        self.connected(&info.node_id, info.tags.clone());
        &self.nodes[&info.node_id]
    }

    /// `PhysicalNodeConnected`: a registered node is up, with these tags.
    pub fn connected(&mut self, id: &NodeId, tags: BTreeMap<String, String>) {
        self.changes += 1;
        let node = self.entry(id, NodePhase::Running);
        node.tags = tags;
        node.phase = NodePhase::Running;
    }

    /// What a person declares node `id` to be (`None`: nothing any more);
    /// true when that changed. A declaration can only give placement room,
    /// so it counts.
    pub fn declare(&mut self, id: &NodeId, inventory: Option<NodeInventory>) -> bool {
        let changed = match &inventory {
            Some(i) => self.declared.insert(id.clone(), i.clone()).as_ref() != Some(i),
            None => self.declared.remove(id).is_some(),
        };
        if changed {
            self.changes += 1;
            if let Some(node) = self.get_mut(id) {
                node.declared = inventory;
            }
        }
        changed
    }

    /// The declarations of `previous`, carried to a successor's fleet.
    pub fn carry_declarations(&mut self, previous: &Fleet) {
        self.declared = previous.declared.clone();
    }

    /// `NodeInventory`.
    pub fn set_inventory(&mut self, id: &NodeId, inventory: NodeInventory) {
        self.changes += 1;
        self.entry(id, NodePhase::Starting).inventory = Some(inventory);
    }

    /// `NodeTagsUpdated`: the node's tags are now `tags`.
    pub fn set_tags(&mut self, id: &NodeId, tags: BTreeMap<String, String>) {
        self.changes += 1;
        self.entry(id, NodePhase::Starting).tags = tags;
    }

    /// Tags this core set on a node it knows: `set` added, `remove` taken
    /// off.
    pub fn update_tags(&mut self, id: &NodeId, set: &BTreeMap<String, String>, remove: &[String]) {
        self.changes += 1;
        if let Some(node) = self.get_mut(id) {
            node.tags.extend(set.clone());
            for name in remove {
                node.tags.remove(name);
            }
        }
    }

    /// `NodeStopping` with `reason` (a node already stopped stays so).
    pub fn stopping(&mut self, id: &NodeId, reason: NodeStopReason) {
        self.changes += 1;
        let node = self.entry(id, NodePhase::Stopping);
        if node.phase != NodePhase::Stopped {
            node.phase = NodePhase::Stopping;
        }
        node.stop_reason = Some(reason);
    }

    /// `NodeStopped` at `now`.
    pub fn stopped(&mut self, id: &NodeId, now: UnixMillis) {
        self.changes += 1;
        let node = self.entry(id, NodePhase::Stopped);
        node.phase = NodePhase::Stopped;
        node.stopped_at = Some(now);
    }

    /// A start was rejected on the node; true when that made it unhealthy
    /// (see [`NodeHealth::record_rejection`]).
    pub fn record_rejection(&mut self, id: &NodeId, settings: &AutoSettings, now: UnixMillis) -> bool {
        let excluded = self
            .get_mut(id)
            .is_some_and(|node| node.health.record_rejection(settings, now));
        self.changes += u64::from(excluded);
        excluded
    }

    /// A job reached running on the node; true when that lifted its
    /// exclusion.
    pub fn job_running(&mut self, id: &NodeId) -> bool {
        let healed = self.get_mut(id).is_some_and(|node| node.health.job_running());
        self.changes += u64::from(healed);
        healed
    }

    /// The node's exclusion lapses at `now`; true when it did.
    pub fn heal(&mut self, id: &NodeId, now: UnixMillis) -> bool {
        let healed = self.get_mut(id).is_some_and(|node| node.health.expire(now));
        self.changes += u64::from(healed);
        healed
    }

    /// Records that this core provisioned the node; false when unknown.
    pub fn set_provisioned(&mut self, id: &NodeId, provisioned: Provisioned) -> bool {
        let Some(node) = self.get_mut(id) else {
            return false;
        };
        node.provisioned = Some(provisioned);
        self.changes += 1;
        true
    }

    /// Marks the node terminated; true when it was known and not yet.
    pub fn terminate(&mut self, id: &NodeId) -> bool {
        let Some(node) = self.get_mut(id) else {
            return false;
        };
        if std::mem::replace(&mut node.terminated, true) {
            return false;
        }
        self.changes += 1;
        true
    }

    /// Cordons the node: nothing new lands there. False when unknown.
    pub fn cordon(&mut self, id: &NodeId) -> bool {
        let Some(node) = self.get_mut(id) else {
            return false;
        };
        node.cordoned = true;
        true
    }

    /// Lifts the node's cordon: `None` when unknown, else whether it was
    /// cordoned.
    pub fn uncordon(&mut self, id: &NodeId) -> Option<bool> {
        let was = std::mem::replace(&mut self.get_mut(id)?.cordoned, false);
        self.changes += u64::from(was);
        Some(was)
    }

    /// The node is terminated once nothing is left on it.
    pub fn release_when_empty(&mut self, id: &NodeId) {
        if let Some(node) = self.get_mut(id) {
            node.release_when_empty = true;
        }
    }

    /// What a predecessor knew of the node: it terminated it, would release
    /// it once empty, provisioned it.
    pub fn inherit(
        &mut self,
        id: &NodeId,
        terminated: bool,
        release_when_empty: bool,
        provisioned: Option<Provisioned>,
    ) {
        let Some(node) = self.get_mut(id) else {
            return;
        };
        node.terminated |= terminated;
        node.release_when_empty |= release_when_empty;
        if node.provisioned.is_none() {
            node.provisioned = provisioned;
        }
    }

    /// Adds a node this core is about to provision.
    pub fn add_provisioned(&mut self, id: NodeId, provisioned: Provisioned) {
        let mut node = NodeState::new(id.clone(), NodePhase::Prospective);
        node.declared = self.declared.get(&id).cloned();
        node.tags = provisioned_tags(&provisioned);
        node.provisioned = Some(provisioned);
        self.revision += 1;
        node.revision = self.revision;
        self.nodes.insert(id, node);
    }

    /// Forgets a node.
    pub fn remove(&mut self, id: &NodeId) -> Option<NodeState> {
        let node = self.nodes.remove(id)?;
        self.revision += 1;
        self.changes += 1;
        Some(node)
    }

    /// Forgets a node stopped long ago: its stop was counted when it came.
    pub fn sweep(&mut self, id: &NodeId) {
        if self.nodes.remove(id).is_some() {
            self.revision += 1;
        }
    }

    /// The fleet as placement sees it: each node with the jobs `placed`
    /// on it. A provisioned node with no inventory yet advertises its
    /// shape, so later placements can plan on it while it launches.
    pub fn snapshot(
        &self,
        pools: &Pools,
        mut placed: HashMap<&NodeId, Vec<PlacedJob>>,
        template_images: &BTreeMap<String, Vec<String>>,
    ) -> FleetSnapshot {
        let nodes = self
            .nodes
            .values()
            .map(|node| FleetNode {
                id: node.id.clone(),
                pool: node.tags.get(tags::POOL).cloned(),
                tier: node.tags.get(tags::TIER).cloned(),
                phase: crate::automanager::fleet::placement_phase(node),
                cordoned: node.cordoned,
                unhealthy: node.health.is_unhealthy(),
                spare: node.tags.get(tags::SPARE).is_some_and(|v| v == "true"),
                spare_spec: SpareSpec::from_tags(&node.tags),
                // Placement reads pool, tier and spare from the fields above;
                // copying every tag of every node would only cost.
                tags: BTreeMap::new(),
                inventory: node.inventory.clone().or_else(|| node.placement_inventory(pools)),
                jobs: placed.remove(&node.id).unwrap_or_default(),
            })
            .collect();
        FleetSnapshot {
            template_images: template_images.clone(),
            nodes,
        }
    }
}

/// The tags a provisioned node carries: its pool, tier and shape (what it
/// can hold, known without Manager's inventory addition) and the job it was
/// provisioned for.
pub fn provisioned_tags(p: &Provisioned) -> BTreeMap<String, String> {
    let mut node_tags = BTreeMap::from([
        (tags::POOL.to_owned(), p.pool.clone()),
        (tags::TIER.to_owned(), p.tier.clone()),
        (tags::INSTANCE_TYPE.to_owned(), p.instance_type.clone()),
    ]);
    if let Some(job) = &p.for_job {
        node_tags.insert(tags::PROVISIONED_FOR.to_owned(), job.0.clone());
    }
    node_tags
}

fn shape_of<'p>(pools: &'p Pools, pool: &str, tier: &str, instance_type: Option<&str>) -> Option<&'p InstanceShape> {
    pools
        .get(pool)?
        .tiers
        .iter()
        .find(|t| t.name == tier)?
        .candidate_instance_types
        .iter()
        .find(|s| Some(s.instance_type.as_str()) == instance_type)
}

/// One thing a provider sells: a shape, in a region, bought one way.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Offering {
    pub(super) kind: ProviderKind,
    pub(super) region: String,
    pub(super) instance_type: String,
    pub(super) launch_mode: Option<LaunchMode>,
}

/// The phase placement sees: a node this core terminated takes nothing new.
pub(super) fn placement_phase(node: &NodeState) -> NodePhase {
    // Terminated by this core: going, until Manager reports it stopped —
    // from then on it no longer counts against its tier's `maxNodes`.
    if node.terminated && node.phase != NodePhase::Stopped {
        NodePhase::Stopping
    } else {
        node.phase
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str) -> NodeId {
        NodeId(id.to_owned())
    }

    /// Counts `change` makes in `fleet`'s changes.
    fn counted(fleet: &mut Fleet, change: impl FnOnce(&mut Fleet)) -> u64 {
        let before = fleet.changes();
        change(fleet);
        fleet.changes() - before
    }

    #[test]
    fn what_can_give_capacity_back_or_move_the_fleet_counts_and_nothing_else_does() {
        let mut fleet = Fleet::default();
        let a = node("a");
        assert_eq!(counted(&mut fleet, |f| f.connected(&a, BTreeMap::new())), 1);
        assert_eq!(
            counted(&mut fleet, |f| assert!(f.cordon(&a))),
            0,
            "a cordon only takes capacity"
        );
        assert_eq!(counted(&mut fleet, |f| assert_eq!(f.uncordon(&a), Some(true))), 1);
        assert_eq!(
            counted(&mut fleet, |f| assert_eq!(f.uncordon(&a), Some(false))),
            0,
            "not cordoned"
        );
        assert_eq!(counted(&mut fleet, |f| assert_eq!(f.uncordon(&node("x")), None)), 0);
        assert!(!fleet.cordon(&node("x")), "an unknown node is not cordoned");

        let settings = AutoSettings {
            rejection_escalation_count: 2,
            ..AutoSettings::default()
        };
        assert_eq!(
            counted(&mut fleet, |f| assert!(!f.record_rejection(&a, &settings, 0))),
            0
        );
        assert_eq!(
            counted(&mut fleet, |f| assert!(f.record_rejection(&a, &settings, 1))),
            1
        );
        assert_eq!(
            counted(&mut fleet, |f| assert!(f.job_running(&a))),
            1,
            "the exclusion lifts"
        );
        assert_eq!(
            counted(&mut fleet, |f| assert!(!f.job_running(&a))),
            0,
            "nothing to lift"
        );
        assert_eq!(counted(&mut fleet, |f| assert!(!f.heal(&a, 10))), 0);

        assert_eq!(counted(&mut fleet, |f| assert!(f.terminate(&a))), 1);
        assert_eq!(counted(&mut fleet, |f| assert!(!f.terminate(&a))), 0, "terminated once");
        assert_eq!(counted(&mut fleet, |f| f.stopped(&a, 5)), 1);
        assert_eq!(
            fleet.get(&a).map(|n| (n.phase, n.stopped_at)),
            Some((NodePhase::Stopped, Some(5)))
        );
        assert_eq!(counted(&mut fleet, |f| f.sweep(&a)), 0, "its stop was counted");
        assert!(!fleet.contains(&a));

        let b = node("b");
        let info = NodeInfo {
            node_id: b.clone(),
            tags: BTreeMap::from([(tags::POOL.to_owned(), "p".to_owned())]),
            created_at: None,
            provider: crate::model::ProviderMetadata::Unknown,
        };
        assert_eq!(
            counted(&mut fleet, |f| f.starting(&info)),
            0,
            "a launch placement planned"
        );
        assert_eq!(
            counted(&mut fleet, |f| assert_eq!(f.running(&info).phase, NodePhase::Running)),
            1
        );
        assert_eq!(counted(&mut fleet, |f| f.set_tags(&b, BTreeMap::new())), 1);
        assert_eq!(counted(&mut fleet, |f| assert!(f.remove(&b).is_some())), 1);
        assert_eq!(
            counted(&mut fleet, |f| assert!(f.remove(&b).is_none())),
            0,
            "already gone"
        );
    }
}
