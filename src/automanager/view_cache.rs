//! The placement view the core keeps between placement rounds. Building a
//! [`FleetView`] of a large fleet costs milliseconds (11 ms for 5,000 nodes
//! and 5,200 jobs), which a recovery burst cannot afford; so the view built
//! at hydration is kept and brought up to date before each round instead:
//! nodes whose phase or health changed are updated in place, bindings that
//! ended are released and new ones reserved (migration targets likewise,
//! beside their sources). Anything else that changed
//! what placement reads of a node (nodes added or removed, tags, inventory,
//! template images) rebuilds it, as does a round on backed-off pools.
//!
//! The cache only remembers what the view holds; the fleet and the job
//! bindings stay the one answer to "where is job J".

use std::collections::{BTreeMap, HashMap};

use crate::model::{FleetNode, JobId, JobSpec, NodeId, NodeInventory, NodePhase, PlacedJob, SpareSpec};
use crate::placement::{FleetError, FleetView, Pools, placed_job};

use super::binding::{Binding, JobRecord};
use super::fleet::{Fleet, NodeState, placement_phase};

/// What the view read of one node, to tell what changed since.
#[derive(Clone, Debug)]
struct NodeMark {
    id: NodeId,
    /// The node's revision when read.
    revision: u64,
    pool: Option<String>,
    tier: Option<String>,
    spare: bool,
    spare_spec: SpareSpec,
    inventory: Option<NodeInventory>,
    phase: NodePhase,
    unhealthy: bool,
    cordoned: bool,
}

impl NodeMark {
    fn of(node: FleetNode, revision: u64) -> Self {
        Self {
            id: node.id,
            revision,
            pool: node.pool,
            tier: node.tier,
            spare: node.spare,
            spare_spec: node.spare_spec,
            inventory: node.inventory,
            phase: node.phase,
            unhealthy: node.unhealthy,
            cordoned: node.cordoned,
        }
    }
}

/// Reservations by job: the node, what is reserved there, and the sync
/// that last found it.
type Reservations = HashMap<JobId, (NodeId, PlacedJob, u64)>;

/// A kept placement view and what it holds.
#[derive(Clone, Debug)]
pub(super) struct ViewCache {
    view: FleetView,
    /// Every node the view holds, in id order (the fleet's order).
    nodes: Vec<NodeMark>,
    template_images: BTreeMap<String, Vec<String>>,
    /// Every job reserved in the view, with its node and the sync that
    /// last found it bound.
    reserved: Reservations,
    /// Every migration target reserved in the view, likewise.
    targets: Reservations,
    /// Counts syncs.
    stamp: u64,
    /// The facts as they stood when the view was last known to hold
    /// exactly what they say (see [`ViewCache::matches`]).
    matched: Option<FactsRevision>,
}

/// Where the facts stood: the fleet's revision, the job records' and what
/// the fleet is placed with (settings, pools, held-back capacity). Each
/// moves on every change its owner makes, so two equal readings mean
/// nothing changed in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FactsRevision {
    pub(super) fleet: u64,
    pub(super) jobs: u64,
    pub(super) placed_with: u64,
}

impl ViewCache {
    /// Builds the view of `fleet` with every binding of `jobs` reserved.
    pub(super) fn build(
        fleet: &Fleet,
        pools: &Pools,
        jobs: &BTreeMap<JobId, JobRecord>,
        template_images: &BTreeMap<String, Vec<String>>,
    ) -> Result<Self, FleetError> {
        let snapshot = fleet.snapshot(pools, placed_jobs(jobs), template_images);
        let view = FleetView::new(&snapshot, pools.clone())?;
        let (mut reserved, mut targets) = (HashMap::new(), HashMap::new());
        let mut nodes = Vec::with_capacity(snapshot.nodes.len());
        // The snapshot holds the fleet's nodes in the fleet's order.
        for (mut node, state) in snapshot.nodes.into_iter().zip(fleet.iter()) {
            for job in std::mem::take(&mut node.jobs) {
                let target = jobs
                    .get(&job.job_id)
                    .and_then(JobRecord::migration_target)
                    .is_some_and(|t| t.node_id == node.id);
                let kept = if target { &mut targets } else { &mut reserved };
                kept.insert(job.job_id.clone(), (node.id.clone(), job, 0));
            }
            nodes.push(NodeMark::of(node, state.revision));
        }
        Ok(Self {
            view,
            nodes,
            template_images: snapshot.template_images,
            reserved,
            targets,
            stamp: 0,
            matched: None,
        })
    }

    /// Notes that the view holds exactly what the facts say at `revision`
    /// (it was just brought up to date, and what was placed on it since
    /// has been written to the facts).
    pub(super) fn matched_at(&mut self, revision: FactsRevision) {
        self.matched = Some(revision);
    }

    /// How many times the view was brought up to date since it was built.
    #[cfg(test)]
    pub(super) fn syncs(&self) -> u64 {
        self.stamp
    }

    /// Whether the view is known to hold what the facts say at `revision`:
    /// nothing changed since it was noted to. Bringing it up to date would
    /// then find nothing to do, at the cost of a pass over the fleet and
    /// every job.
    pub(super) fn matches(&self, revision: FactsRevision) -> bool {
        self.matched == Some(revision)
    }

    /// Brings the view up to date with `fleet` and `jobs`; `None` when what
    /// changed can only be had by building it again.
    pub(super) fn sync(
        mut self,
        fleet: &Fleet,
        pools: &Pools,
        jobs: &BTreeMap<JobId, JobRecord>,
        template_images: &BTreeMap<String, Vec<String>>,
    ) -> Option<Self> {
        if &self.template_images != template_images || self.view.pools() != pools {
            return None;
        }
        let mut count = 0;
        for (node, mark) in fleet.iter().zip(self.nodes.iter_mut()) {
            count += 1;
            if node.revision == mark.revision && node.id == mark.id {
                continue;
            }
            if !same_node(node, mark, pools) {
                return None;
            }
            mark.revision = node.revision;
            let (phase, unhealthy) = (placement_phase(node), node.health.is_unhealthy());
            if (phase, unhealthy) != (mark.phase, mark.unhealthy) {
                self.view.set_condition(&node.id, phase, unhealthy).ok()?;
                (mark.phase, mark.unhealthy) = (phase, unhealthy);
            }
        }
        // The view holds a node the marks do not (a prospective node a
        // placement added), or the fleet holds one they do not: built again.
        // Counting the view's nodes too matters when the fleet has since
        // dropped another node — or that very one — and the counts of
        // fleet and marks happen to agree again.
        if count != self.nodes.len() || fleet.iter().count() != count || self.view.node_count() != count {
            return None;
        }
        self.stamp += 1;
        let stamp = self.stamp;
        // Targets first: a target that became the binding is released as
        // a target before it is reserved as the binding.
        // A migration target is reserved beside its source ("during the
        // overlap the job is reserved on both nodes").
        let targets = jobs.values().filter_map(|r| Some((r, r.migration_target()?)));
        sync_reservations(&mut self.view, &mut self.targets, stamp, targets)?;
        let bindings = jobs.values().filter_map(|r| Some((r, r.binding.as_ref()?)));
        sync_reservations(&mut self.view, &mut self.reserved, stamp, bindings)?;
        Some(self)
    }

    /// The view, for a placement round.
    pub(super) fn view_mut(&mut self) -> &mut FleetView {
        &mut self.view
    }

    /// Records a reservation a placement round made in the view.
    pub(super) fn reserved(&mut self, job_id: JobId, node_id: NodeId, placed: PlacedJob) {
        self.reserved.insert(job_id, (node_id, placed, self.stamp));
    }

    /// Records a migration target's reservation a placement made in the
    /// view.
    pub(super) fn reserved_target(&mut self, job_id: JobId, node_id: NodeId, placed: PlacedJob) {
        self.targets.insert(job_id, (node_id, placed, self.stamp));
    }
}

/// Brings `kept` up to date with `bound` (each job with the placement it
/// holds now): what moved or changed is released and reserved again, what
/// no placement holds any more is released. `None` when the view refuses.
fn sync_reservations<'a>(
    view: &mut FleetView,
    kept: &mut Reservations,
    stamp: u64,
    bound: impl Iterator<Item = (&'a JobRecord, &'a Binding)>,
) -> Option<()> {
    let mut count = 0;
    for (record, binding) in bound {
        let id = record.job_id();
        if let Some((node, placed, seen)) = kept.get_mut(id)
            && node == &binding.node_id
            && reserves(placed, &record.job.spec, binding.gpu_index)
        {
            *seen = stamp;
            count += 1;
            continue;
        }
        if let Some((node, placed, _)) = kept.remove(id) {
            view.release(&node, &placed).ok()?;
        }
        let r = &record.bundle_ref;
        let placed = placed_job(&r.bundle_id, r.replica_index, &record.job.spec, binding.gpu_index);
        // A binding to a node the fleet no longer holds reserves
        // nothing, as in a freshly built view.
        if view.reserve(&binding.node_id, &placed).is_ok() {
            kept.insert(id.clone(), (binding.node_id.clone(), placed, stamp));
            count += 1;
        }
    }
    if kept.len() > count {
        // What no binding holds any more is released.
        let ended: Vec<JobId> = kept
            .iter()
            .filter(|(_, (_, _, seen))| *seen != stamp)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ended {
            if let Some((node, placed, _)) = kept.remove(&id) {
                view.release(&node, &placed).ok()?;
            }
        }
    }
    Some(())
}

/// What every bound job (and every migration target) reserves, by node.
pub(super) fn placed_jobs(jobs: &BTreeMap<JobId, JobRecord>) -> HashMap<&NodeId, Vec<PlacedJob>> {
    let mut placed: HashMap<&NodeId, Vec<PlacedJob>> = HashMap::new();
    let bound = jobs.values().flat_map(|r| {
        [r.binding.as_ref(), r.migration_target()]
            .into_iter()
            .flatten()
            .map(move |b| (r, b))
    });
    for (record, binding) in bound {
        let r = &record.bundle_ref;
        placed.entry(&binding.node_id).or_default().push(placed_job(
            &r.bundle_id,
            r.replica_index,
            &record.job.spec,
            binding.gpu_index,
        ));
    }
    placed
}

/// Whether the view's description of a node (everything but its phase and
/// health) still holds.
fn same_node(node: &NodeState, mark: &NodeMark, pools: &Pools) -> bool {
    use crate::model::tags;
    // A cordon is rare (an operator's act, a drain): the view is built
    // again rather than taught to flip it in place.
    node.id == mark.id
        && node.cordoned == mark.cordoned
        && node.tags.get(tags::POOL) == mark.pool.as_ref()
        && node.tags.get(tags::TIER) == mark.tier.as_ref()
        && node.tags.get(tags::SPARE).is_some_and(|v| v == "true") == mark.spare
        && SpareSpec::from_tags(&node.tags) == mark.spare_spec
        && match &node.inventory {
            Some(inventory) => mark.inventory.as_ref() == Some(inventory),
            None => node.placement_inventory(pools) == mark.inventory,
        }
}

/// Whether `placed` is what a job of `spec` on GPU `gpu_index` reserves.
fn reserves(placed: &PlacedJob, spec: &JobSpec, gpu_index: Option<u32>) -> bool {
    let needs = &spec.requirements;
    placed.gpu_index == gpu_index
        && placed.job_name == spec.job_name
        && placed.template == spec.template
        && placed.required_capacity == needs.required_capacity
        && placed.required_cores == needs.required_cores
        && placed.required_host_ports == needs.required_host_ports
        && placed.required_gpu_capacity == needs.required_gpu_capacity
        && placed.exclusive == spec.exclusive
}
