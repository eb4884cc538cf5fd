//! Headroom kept up to date for a changing fleet. Each [`Tracker::update`]
//! is handed the fleet as it stands; the tracker finds what changed since
//! the last one (nodes added, removed, described anew, jobs reserved or
//! released; bundle specs; restart ceilings), applies it to its own view
//! and recomputes a node's verdict only when one of those changes could
//! alter it:
//!
//! - the node itself changed;
//! - a job, spec or restart ceiling of a bundle it carries changed (its
//!   peers, its other replica);
//! - a node its re-placement put a job on changed, unless it only got
//!   fuller (below);
//! - a node's count in a tier that re-placement tried to provision from
//!   changed (`maxNodes`);
//! - another node could now take one of its jobs where it could not, or
//!   could now win where it lost. A node that only took jobs has less room
//!   and nothing else changed about it, so it can only win where it fits
//!   and is at least as full (binpack) or as empty (spread) as the node
//!   that won; any other change counts when the node now fits the job.
//!
//! A node that *only got fuller* — it took jobs asking capacity alone (no
//! cores, host ports, GPU or exclusivity), it already carried one, and it
//! is no spare taking its first job — differs from before in its free
//! capacity and its fill only. Replaying the re-placement step by step on
//! the fleet as it is now, each step decides as before when:
//!
//! - the step went to that node, which still has the room the step can ask
//!   (its co-located group's whole capacity, less what earlier steps put
//!   there), and the tier packs `binpack`: every other node's key is what
//!   it was, and the node's only moved in fill, towards winning;
//! - the step went elsewhere, and the node cannot now beat the winner: it
//!   is in another pool or a later tier, lacks the room, or (binpack, same
//!   tier) is still emptier than the winner, or was already at least as
//!   full before and lost all the same: with the same leading key and
//!   more fill it would have won, so something other than its room ruled
//!   it out (a key component ranked before fill, or a filter), and still
//!   does. Under `spread` a fuller node only ranks worse; and a node
//!   rejected before is rejected still, since it has less room and nothing
//!   else changed.
//!
//! Otherwise the verdict is recomputed. Every comparison leaves a margin
//! (`SLACK`) towards recomputing, so a rounding difference never keeps a
//! verdict that a fresh analysis would change.
//!
//! A verdict recomputed is replayed from its last run rather than made
//! from nothing, when its own node, bundles and restart ceilings are as
//! they were: the tracker logs which nodes each update changed, and each
//! placement of the run whose search left a podium (its deciding tier's
//! best survivors) is decided from it, looking afresh only at the nodes
//! changed since and those this run's earlier placements treated
//! differently (`placement::replay`); only what that cannot decide is
//! searched. The log is bounded (`LOG_CAPACITY`); a run older than what
//! it holds, or with more than `MOST_REPLAYED_CHANGES` changed nodes to
//! look at, is made afresh.
//!
//! Anything else (pools, template images) recomputes every verdict. Zones
//! and provider kinds are few, and each of their what-ifs re-places a large
//! part of the fleet; [`Tracker::update`] only marks them stale, and
//! [`Tracker::refresh_wide`] recomputes them, on the caller's own (longer)
//! cadence.
//!
//! Memory stays bounded: the view's leftovers from what-ifs (the slots of
//! prospective nodes taken away again, released reservations) are dropped
//! by building the view afresh once they outgrow the fleet.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::model::{BundleId, BundleSpec, FleetNode, FleetSnapshot, JobId, NodeId, PackingStrategy, PlacedJob};

use super::super::fleet::{FleetError, FleetView, NO_SLOT, NodeIdx, fill_of, flag};
use super::super::settings::Pools;
use super::run::{Deps, Record, Replay, what_if};
use super::{Context, Domain, DomainKind, DomainVerdict, HeadroomReport, domains_of, members};

/// Tolerance of the fill and capacity comparisons, wider than the
/// engine's so a comparison here never misses a tie the engine sees.
const SLACK: f64 = 1e-6;

/// What one update did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpdateStats {
    /// Node verdicts recomputed.
    pub nodes_recomputed: usize,
    /// Node domains in the fleet.
    pub nodes: usize,
    /// Of the recomputed verdicts' placements, those made by a search.
    pub placements_searched: usize,
    /// And those decided from the verdict's last run without a search
    /// (see `placement::replay`).
    pub placements_replayed: usize,
    /// Zone and provider verdicts recomputed.
    pub wide_recomputed: usize,
    /// Zone and provider verdicts left stale for [`Tracker::refresh_wide`].
    pub wide_stale: bool,
    /// The view was built afresh (first update, new pools or images,
    /// leftovers outgrowing the fleet).
    pub rebuilt: bool,
}

/// The headroom of a changing fleet (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    view: Option<FleetView>,
    nodes: BTreeMap<NodeId, FleetNode>,
    template_images: BTreeMap<String, Vec<String>>,
    carried: HashMap<NodeId, Vec<PlacedJob>>,
    bundles: BTreeMap<BundleId, BundleSpec>,
    ceiling: BTreeSet<JobId>,
    runs: BTreeMap<NodeId, (DomainVerdict, Deps)>,
    wide: Vec<DomainVerdict>,
    /// Something changed since the zone and provider verdicts were made.
    wide_stale: bool,
    /// Counts the updates that changed a node.
    revision: u64,
    /// The nodes each such update changed, oldest first: what a run made
    /// at an earlier revision must look at afresh when replayed.
    log: Vec<(u64, NodeIdx)>,
    /// Runs made before this revision are not replayed: the log no longer
    /// holds what changed since.
    floor: u64,
}

/// The most changed nodes a replay looks at; beyond, a run is made afresh.
const MOST_REPLAYED_CHANGES: usize = 64;

/// The changed nodes the log holds before it drops its older half.
const LOG_CAPACITY: usize = 16_384;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChangeKind {
    /// Only jobs asking capacity alone were added to a node that already
    /// carried one: it differs in its free capacity and fill alone (see the
    /// module docs).
    Fuller,
    /// Only jobs were added: the node has less room, and is no spare
    /// taking its first job.
    Shrink,
    /// Anything else about a node that is still there.
    General,
    /// The node left the fleet.
    Removed,
}

#[derive(Clone, Debug)]
struct Change {
    node: NodeId,
    kind: ChangeKind,
    /// `(pool, tier)` before and after.
    slots: Vec<(usize, usize)>,
    /// The node's free capacity before the change, when it was there.
    free_before: Option<f64>,
    /// Its index in the view.
    idx: Option<NodeIdx>,
}

impl Tracker {
    /// A tracker that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Brings every verdict up to date with `snapshot` placed with `pools`,
    /// `bundles` the specs of what it carries and `ceiling` the jobs at
    /// their restart ceiling.
    pub fn update(
        &mut self,
        snapshot: &FleetSnapshot,
        pools: &Pools,
        bundles: &BTreeMap<BundleId, BundleSpec>,
        ceiling: &BTreeSet<JobId>,
    ) -> Result<UpdateStats, FleetError> {
        let fresh = match &self.view {
            None => true,
            Some(view) => view.pools() != pools || self.template_images != snapshot.template_images,
        };
        if fresh {
            return self.rebuild(snapshot, pools, bundles, ceiling);
        }
        let mut touched: BTreeSet<BundleId> = BTreeSet::new();
        for (id, spec) in bundles {
            if self.bundles.get(id) != Some(spec) {
                touched.insert(id.clone());
            }
        }
        touched.extend(self.bundles.keys().filter(|id| !bundles.contains_key(*id)).cloned());
        for job in self.ceiling.symmetric_difference(ceiling) {
            if let Some(bundle) = bundle_of(job) {
                touched.insert(bundle);
            }
        }
        let changes = match self.apply(snapshot, &mut touched) {
            Ok(changes) => changes,
            // The view refused a change it should take: start again.
            Err(_) => return self.rebuild(snapshot, pools, bundles, ceiling),
        };
        if !changes.is_empty() {
            self.revision += 1;
            let revision = self.revision;
            self.log
                .extend(changes.iter().filter_map(|c| c.idx).map(|idx| (revision, idx)));
            if self.log.len() > LOG_CAPACITY {
                // The older half goes; runs made before it are made afresh.
                let cut = self.log.len() / 2;
                self.floor = self.log[cut].0;
                self.log.drain(..self.log.partition_point(|(rev, _)| *rev < self.floor));
            }
        }
        // Only what changed is copied: a fleet's specs are many.
        for id in &touched {
            match bundles.get(id) {
                Some(spec) => {
                    self.bundles.insert(id.clone(), spec.clone());
                }
                None => {
                    self.bundles.remove(id);
                }
            }
        }
        if &self.ceiling != ceiling {
            self.ceiling = ceiling.clone();
        }
        let Some(view) = self.view.as_mut() else {
            return self.rebuild(snapshot, pools, bundles, ceiling);
        };
        let current: Vec<Domain> = domains_of(view, DomainKind::Node);
        let names: BTreeSet<String> = current.iter().map(|d| d.name.clone()).collect();
        self.runs.retain(|id, _| names.contains(id.as_str()));
        let dirty: Vec<Domain> = current
            .into_iter()
            .filter(|d| match self.runs.get(&NodeId::from(d.name.as_str())) {
                None => true,
                Some((_, deps)) => affected(view, deps, &changes, &touched, &d.name),
            })
            .collect();
        let context = Context {
            bundles: &self.bundles,
            at_restart_ceiling: &self.ceiling,
        };
        let mut stats = UpdateStats {
            nodes_recomputed: dirty.len(),
            nodes: names.len(),
            ..UpdateStats::default()
        };
        let mut changed: Vec<NodeIdx> = Vec::new();
        for domain in dirty {
            let lost = members(view, &domain);
            let id = NodeId::from(domain.name.as_str());
            // A run whose own node, bundles or restart ceilings are as they
            // were is replayed from its last run, when the log still holds
            // what changed since (see `run::Replay`).
            let last = self.runs.remove(&id).map(|(_, deps)| deps).filter(|deps| {
                deps.revision >= self.floor
                    && !deps.bundles.iter().any(|b| touched.contains(b))
                    && !changes.iter().any(|c| c.node.as_str() == domain.name)
            });
            let replay = last.as_ref().and_then(|deps| {
                changed.clear();
                let from = self.log.partition_point(|(rev, _)| *rev <= deps.revision);
                changed.extend(self.log[from..].iter().map(|(_, idx)| *idx));
                changed.sort_unstable();
                changed.dedup();
                (changed.len() <= MOST_REPLAYED_CHANGES).then_some(Replay {
                    last: deps,
                    changed: &changed,
                })
            });
            let record = replay.map_or(Record::Podiums, Record::Replay);
            let mut run = what_if(view, &self.carried, context, domain, &lost, false, record);
            run.1.revision = self.revision;
            stats.placements_replayed += run.1.replayed as usize;
            stats.placements_searched += run.1.steps.len() - run.1.replayed as usize;
            self.runs.insert(id, run);
        }
        if !changes.is_empty() || !touched.is_empty() {
            self.wide_stale = true;
        }
        stats.wide_stale = self.wide_stale;
        if self.view.as_ref().is_some_and(has_outgrown) {
            let carried_snapshot = self.snapshot();
            let rebuilt = FleetView::new(&carried_snapshot, pools.clone())?;
            self.view = Some(rebuilt);
            // The runs name nodes by the old view's indices.
            self.forget_log();
        }
        Ok(stats)
    }

    /// Whether the zone and provider verdicts predate a change
    /// ([`Tracker::refresh_wide`] brings them up to date).
    pub fn wide_stale(&self) -> bool {
        self.wide_stale
    }

    /// Recomputes the zone and provider verdicts when something changed
    /// since they were made; returns how many were recomputed.
    pub fn refresh_wide(&mut self) -> usize {
        if !self.wide_stale {
            return 0;
        }
        self.recompute_wide()
    }

    /// Every verdict summed up, for the fleet and per pool; zones and
    /// provider kinds as of the last [`Tracker::refresh_wide`].
    pub fn report(&self) -> HeadroomReport {
        let pools: Vec<String> = self
            .view
            .as_ref()
            .map(|v| v.pools().iter().map(|p| p.name.clone()).collect())
            .unwrap_or_default();
        let domains = self
            .runs
            .values()
            .map(|(v, _)| v.clone())
            .chain(self.wide.iter().cloned());
        HeadroomReport::of(domains.collect(), &pools)
    }

    /// The verdict on one node's loss.
    pub fn node(&self, node: &NodeId) -> Option<&DomainVerdict> {
        self.runs.get(node).map(|(v, _)| v)
    }

    fn rebuild(
        &mut self,
        snapshot: &FleetSnapshot,
        pools: &Pools,
        bundles: &BTreeMap<BundleId, BundleSpec>,
        ceiling: &BTreeSet<JobId>,
    ) -> Result<UpdateStats, FleetError> {
        let mut view = FleetView::new(snapshot, pools.clone())?;
        self.nodes = snapshot.nodes.iter().map(|n| (n.id.clone(), n.clone())).collect();
        self.template_images = snapshot.template_images.clone();
        self.carried = snapshot
            .nodes
            .iter()
            .filter(|n| !n.jobs.is_empty())
            .map(|n| (n.id.clone(), n.jobs.clone()))
            .collect();
        self.bundles = bundles.clone();
        self.ceiling = ceiling.clone();
        self.forget_log();
        let context = Context {
            bundles: &self.bundles,
            at_restart_ceiling: &self.ceiling,
        };
        self.runs.clear();
        let mut searched = 0;
        for domain in domains_of(&view, DomainKind::Node) {
            let lost = members(&view, &domain);
            let id = NodeId::from(domain.name.as_str());
            let mut run = what_if(&mut view, &self.carried, context, domain, &lost, false, Record::Podiums);
            run.1.revision = self.revision;
            searched += run.1.steps.len();
            self.runs.insert(id, run);
        }
        let nodes = self.runs.len();
        self.view = Some(view);
        let wide_recomputed = self.recompute_wide();
        Ok(UpdateStats {
            nodes_recomputed: nodes,
            nodes,
            wide_recomputed,
            wide_stale: false,
            rebuilt: true,
            placements_searched: searched,
            placements_replayed: 0,
        })
    }

    fn recompute_wide(&mut self) -> usize {
        let Some(view) = self.view.as_mut() else {
            return 0;
        };
        let context = Context {
            bundles: &self.bundles,
            at_restart_ceiling: &self.ceiling,
        };
        let domains: Vec<Domain> = [DomainKind::Zone, DomainKind::Provider]
            .into_iter()
            .flat_map(|k| domains_of(view, k))
            .collect();
        self.wide = domains
            .into_iter()
            .map(|domain| {
                let lost = members(view, &domain);
                what_if(view, &self.carried, context, domain, &lost, false, Record::None).0
            })
            .collect();
        self.wide_stale = false;
        self.wide.len()
    }

    /// Applies what changed in `snapshot` to the view; the bundles of the
    /// jobs that moved go to `touched`.
    fn apply(&mut self, snapshot: &FleetSnapshot, touched: &mut BTreeSet<BundleId>) -> Result<Vec<Change>, FleetError> {
        let Some(view) = self.view.as_mut() else {
            return Ok(Vec::new());
        };
        let mut changes = Vec::new();
        let mut seen: BTreeSet<&NodeId> = BTreeSet::new();
        for node in &snapshot.nodes {
            seen.insert(&node.id);
            let old = self.nodes.get(&node.id);
            if old == Some(node) {
                continue;
            }
            let mut slots = Vec::new();
            slots.extend(old.and_then(|_| slot_of(view, &node.id)));
            let free_before = old
                .and_then(|_| view.node_index(&node.id))
                .map(|idx| view.hot(idx).free);
            let kind = match old {
                None => {
                    view.add_node(node)?;
                    ChangeKind::General
                }
                Some(old) if same_but_jobs(old, node) => {
                    let removed: Vec<&PlacedJob> = old.jobs.iter().filter(|j| !node.jobs.contains(j)).collect();
                    let added: Vec<&PlacedJob> = node.jobs.iter().filter(|j| !old.jobs.contains(j)).collect();
                    for job in &removed {
                        view.release(&node.id, job)?;
                    }
                    for job in &added {
                        view.reserve(&node.id, job)?;
                    }
                    touched.extend(removed.iter().chain(&added).filter_map(|j| j.bundle.clone()));
                    if removed.is_empty() && !old.jobs.is_empty() && added.iter().all(|j| asks_capacity_alone(j)) {
                        ChangeKind::Fuller
                    } else if removed.is_empty() && !old.is_unconsumed_spare() {
                        ChangeKind::Shrink
                    } else {
                        ChangeKind::General
                    }
                }
                Some(old) => {
                    view.replace_node(node)?;
                    touched.extend(old.jobs.iter().chain(&node.jobs).filter_map(|j| j.bundle.clone()));
                    ChangeKind::General
                }
            };
            slots.extend(slot_of(view, &node.id));
            changes.push(Change {
                node: node.id.clone(),
                kind,
                slots,
                free_before,
                idx: view.node_index(&node.id),
            });
            if node.jobs.is_empty() {
                self.carried.remove(&node.id);
            } else {
                self.carried.insert(node.id.clone(), node.jobs.clone());
            }
            self.nodes.insert(node.id.clone(), node.clone());
        }
        let gone: Vec<NodeId> = self.nodes.keys().filter(|id| !seen.contains(id)).cloned().collect();
        for id in gone {
            let slots = slot_of(view, &id).into_iter().collect();
            let idx = view.node_index(&id);
            if let Some(old) = self.nodes.get(&id) {
                touched.extend(old.jobs.iter().filter_map(|j| j.bundle.clone()));
            }
            view.remove_node(&id)?;
            self.carried.remove(&id);
            self.nodes.remove(&id);
            changes.push(Change {
                node: id,
                kind: ChangeKind::Removed,
                slots,
                free_before: None,
                idx,
            });
        }
        Ok(changes)
    }

    /// Drops the log of changed nodes: every run is made afresh next.
    fn forget_log(&mut self) {
        self.revision += 1;
        self.floor = self.revision;
        self.log.clear();
    }

    /// The fleet as last seen.
    fn snapshot(&self) -> FleetSnapshot {
        FleetSnapshot {
            template_images: self.template_images.clone(),
            nodes: self.nodes.values().cloned().collect(),
        }
    }
}

/// Whether a change could alter the run of node `name` (see the module
/// docs).
fn affected(view: &FleetView, deps: &Deps, changes: &[Change], touched: &BTreeSet<BundleId>, name: &str) -> bool {
    if deps.bundles.iter().any(|b| touched.contains(b)) {
        return true;
    }
    changes.iter().any(|change| {
        change.node.as_str() == name
            || match change.kind {
                ChangeKind::Fuller => fuller_could_change(view, deps, change),
                kind => {
                    deps.landing.contains(&change.node)
                        || (kind != ChangeKind::Shrink && change.slots.iter().any(|s| deps.elastic.contains(s)))
                        || (kind != ChangeKind::Removed && could_win(view, deps, change))
                }
            }
    })
}

/// Whether a node that only got fuller (see the module docs) could change
/// a step of the run: replays the steps on the node's room as it is now.
fn fuller_could_change(view: &FleetView, deps: &Deps, change: &Change) -> bool {
    let node = &change.node;
    let (Some(idx), Some(free_before)) = (view.node_index(node), change.free_before) else {
        return true;
    };
    let hot = view.hot(idx);
    let usable = view.node(idx).usable;
    let reachable =
        hot.has(flag::INVENTORY) && !hot.has(flag::GONE) && !hot.has(flag::UNHEALTHY) && !hot.has(flag::CORDONED);
    let slot = (hot.slot != NO_SLOT && reachable).then_some(((hot.slot >> 16) as usize, (hot.slot & 0xffff) as usize));
    // What the run's earlier steps put on the node.
    let mut taken = 0.0;
    for (at, step) in deps.steps.iter().enumerate() {
        let free = hot.free - taken;
        match &step.landed {
            Some(id) if id == node => {
                if free < step.need_max + SLACK {
                    return true;
                }
                // Under `binpack` fuller only ranks better. Under `spread`
                // it still wins while it stays below the fill the podium
                // allows it (emptier than the runner-up, or ahead of it on
                // a component ranked before packing).
                let binpack = matches!(step.winner, Some((_, _, PackingStrategy::Binpack)));
                let limit = step.podium.as_ref().and_then(|p| p.winner_fill_limit);
                if !binpack && !limit.is_some_and(|limit| fill_of(usable, free) + SLACK < limit) {
                    return true;
                }
                taken += step.need;
            }
            _ => {
                let Some((pool, tier)) = slot else {
                    continue;
                };
                if step.pool != pool || tier > step.upto || free + SLACK < step.need {
                    continue;
                }
                // It fits, so it fitted before with more room: it wins
                // now only when its fill crossed the winner's. Were it
                // already at least as full and still lost, something
                // other than its room ruled it out, and still does.
                if let Some((t, fill, PackingStrategy::Binpack)) = step.winner
                    && t == tier
                {
                    let winner = winner_fill(view, deps, at).unwrap_or(fill);
                    let was = fill_of(usable, free_before - taken);
                    if fill_of(usable, free) + SLACK >= winner && was <= winner + SLACK {
                        return true;
                    }
                }
            }
        }
    }
    false
}

/// The fill, on the fleet as it is now, of the node that won step `at`
/// when it is a node of the fleet: its free capacity less what the run's
/// earlier steps put there.
fn winner_fill(view: &FleetView, deps: &Deps, at: usize) -> Option<f64> {
    let id = deps.steps.get(at)?.landed.as_ref()?;
    let idx = view.node_index(id)?;
    let taken: f64 = deps.steps[..at]
        .iter()
        .filter(|s| s.landed.as_ref() == Some(id))
        .map(|s| s.need)
        .sum();
    Some(fill_of(view.node(idx).usable, view.hot(idx).free - taken))
}

/// Whether a job asks for capacity alone: no cores, host ports, GPU or
/// exclusivity, so taking it changes nothing of a node but its room.
fn asks_capacity_alone(job: &PlacedJob) -> bool {
    job.required_cores == 0
        && job.required_host_ports.is_empty()
        && job.required_gpu_capacity <= 0.0
        && job.gpu_index.is_none()
        && !job.exclusive
}

/// Whether the changed node could now take, or win, a placement of the run.
fn could_win(view: &FleetView, deps: &Deps, change: &Change) -> bool {
    let Some(idx) = view.node_index(&change.node) else {
        return false;
    };
    let hot = view.hot(idx);
    let reachable =
        hot.has(flag::INVENTORY) && !hot.has(flag::GONE) && !hot.has(flag::UNHEALTHY) && !hot.has(flag::CORDONED);
    if hot.slot == NO_SLOT || !reachable {
        return false;
    }
    let (pool, tier) = ((hot.slot >> 16) as usize, (hot.slot & 0xffff) as usize);
    deps.steps.iter().any(|step| {
        if step.pool != pool || tier > step.upto || hot.free + SLACK < step.need {
            return false;
        }
        match change.kind {
            ChangeKind::Shrink => match step.winner {
                Some((t, fill, packing)) if t == tier => match packing {
                    PackingStrategy::Binpack => hot.fill + SLACK >= fill,
                    PackingStrategy::Spread => hot.fill <= fill + SLACK,
                },
                // It had no room in a tier that had none: it has less now.
                _ => false,
            },
            _ => true,
        }
    })
}

fn slot_of(view: &FleetView, id: &NodeId) -> Option<(usize, usize)> {
    let slot = view.hot(view.node_index(id)?).slot;
    (slot != NO_SLOT).then_some(((slot >> 16) as usize, (slot & 0xffff) as usize))
}

/// Whether two descriptions of a node differ in their jobs alone.
fn same_but_jobs(a: &FleetNode, b: &FleetNode) -> bool {
    a.id == b.id
        && a.pool == b.pool
        && a.tier == b.tier
        && a.phase == b.phase
        && a.cordoned == b.cordoned
        && a.unhealthy == b.unhealthy
        && a.spare == b.spare
        && a.spare_spec == b.spare_spec
        && a.tags == b.tags
        && a.inventory == b.inventory
}

/// The bundle of a runtime job id (`<bundle>/<replica>/<job>`).
fn bundle_of(job: &JobId) -> Option<BundleId> {
    let mut parts = job.as_str().rsplitn(3, '/');
    let (_, _, bundle) = (parts.next()?, parts.next()?, parts.next()?);
    Some(BundleId::from(bundle))
}

/// Whether the view's leftovers from what-ifs outgrew the fleet.
fn has_outgrown(view: &FleetView) -> bool {
    let live: usize = view.order.iter().map(|&i| view.node(i).occupants.len()).sum();
    view.nodes.len() > 2 * view.node_count() + 256 || view.occupants.len() > 4 * live + 4096
}
