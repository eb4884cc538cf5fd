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
//! Every comparison leaves a margin (`SLACK`) towards recomputing, so a
//! rounding difference never keeps a verdict that a fresh analysis would
//! change.
//!
//! ## Kept on its outcome
//!
//! A verdict is what a loss means: absorbed or not, each bundle on air or
//! dark and why, the pool and tier each lost job lands in, what is
//! provisioned. Under `binpack` the node a lost job lands on is the
//! fullest that fits, which is where the next placement goes too; so
//! nearly every placement moves the landing node of nearly every verdict
//! while its outcome stays. A verdict the test above would recompute is
//! therefore first judged on its outcome ([`outcome_stands`]), when its run
//! placed every lost job on a node of the fleet from a podium (or its fate
//! stands whatever the fleet does) and every change since the run was to
//! nodes' jobs alone (no tier's node count moved). Step by step, with the
//! nodes that may differ from the run's — those changed since, and those
//! an earlier step may have left or taken anew:
//!
//! - a node that cannot differ ranks against another that cannot as it
//!   did, so the first podium node that cannot differ still survives: the
//!   job lands in the deciding tier, on that node unless a node that may
//!   differ and has the room competes (then the node is not told);
//! - no node of an earlier tier survived, and one that may differ only
//!   might when it has the room now (a node never holds fewer jobs during
//!   a run than it holds now), has not merely taken jobs since, and the
//!   job's own rules do not turn it away whatever its room (a rejection
//!   reading the node alone, checked on the fleet as it is);
//! - a job whose landing may have moved parts its bundle: a later job of
//!   it is not judged (its rules read where that one is).
//!
//! What cannot be told this way is recomputed. A verdict so kept names the
//! node each job lands on where that was told, and leaves it out (a node
//! of the tier) where not. When every job lands where it did, the run is
//! the one a fresh analysis makes and the verdict is exact again; else its
//! run stays the reference for later changes, and once it is
//! `REFRESH_AFTER` node changes old it is made again, a share of those due
//! per update (`REFRESH_WINDOW`), oldest first.
//!
//! Otherwise the verdict is recomputed.
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

use super::super::filter::check;
use super::super::fleet::{FleetError, FleetView, NodeIdx, fill_of, flag};
use super::super::request::{Demand, PlacementRequest, RecoveryContext};
use super::super::settings::Pools;
use super::run::{Deps, Record, Replay, what_if};
use super::{
    Context, Domain, DomainKind, DomainVerdict, Fate, HeadroomReport, JobFate, domains_of, going, members, slot_at,
};

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
    /// Node verdicts kept on their outcome alone: a job may now land on
    /// another node of the same tier, nothing else can differ (see the
    /// module docs).
    pub outcome_kept: usize,
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
    runs: BTreeMap<NodeId, Kept>,
    wide: Vec<DomainVerdict>,
    /// Something changed since the zone and provider verdicts were made.
    wide_stale: bool,
    /// Counts the updates that changed a node.
    revision: u64,
    /// The nodes each such update changed, oldest first: what a run made
    /// at an earlier revision must look at afresh when replayed.
    log: Vec<Logged>,
    /// Runs made before this revision are not replayed: the log no longer
    /// holds what changed since.
    floor: u64,
}

/// A node's verdict and what its run read.
#[derive(Clone, Debug)]
struct Kept {
    verdict: DomainVerdict,
    deps: Deps,
    /// `deps` describe the run on the fleet as of the last update; else
    /// the verdict was kept on its outcome since `deps.revision`, and only
    /// [`outcome_stands`] can judge a change.
    exact: bool,
    /// Where the fate of each lost job is in `verdict`, in the order the
    /// run placed them (`StepDep::at`): bundle and job; `None` for a job
    /// of no bundle.
    fates: Vec<Option<(u32, u32)>>,
    /// The node `verdict` names for each step's job (`None`: not told).
    landed: Vec<Option<NodeIdx>>,
}

impl Kept {
    fn new(verdict: DomainVerdict, deps: Deps) -> Self {
        // The lost jobs in the order the run placed them (runtime job id).
        let mut lost: Vec<(&JobId, Option<(u32, u32)>)> = verdict
            .bundles
            .iter()
            .enumerate()
            .flat_map(|(b, fate)| {
                fate.jobs
                    .iter()
                    .enumerate()
                    .map(move |(j, job)| (&job.job_id, Some((b as u32, j as u32))))
            })
            .chain(verdict.unmanaged.iter().map(|id| (id, None)))
            .collect();
        lost.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let fates = lost.into_iter().map(|(_, at)| at).collect();
        let landed = deps.steps.iter().map(|step| step.took.map(|(idx, _)| idx)).collect();
        Kept {
            verdict,
            deps,
            exact: true,
            fates,
            landed,
        }
    }

    /// The fate of the lost job the run placed `at`th, and its bundle.
    fn fate(&self, at: usize) -> Option<(&BundleId, &JobFate)> {
        let (b, j) = (*self.fates.get(at)?)?;
        let bundle = self.verdict.bundles.get(b as usize)?;
        Some((&bundle.bundle, bundle.jobs.get(j as usize)?))
    }

    /// Keeps the verdict when its outcome stands on the fleet as it is
    /// now, `since` the nodes changed after its run (see
    /// [`outcome_stands`]), naming where each job lands now. When every
    /// job lands where it did, the run is exact again as of `revision`.
    fn keep_on_outcome(
        &mut self,
        view: &FleetView,
        since: &Since,
        bundles: &BTreeMap<BundleId, BundleSpec>,
        revision: u64,
    ) -> bool {
        let Some(landings) = outcome_stands(view, self, since, bundles) else {
            return false;
        };
        self.land(view, &landings);
        let same = self
            .deps
            .steps
            .iter()
            .zip(&landings)
            .all(|(step, now)| step.took.map(|(idx, _)| idx) == *now);
        if same {
            // Every job lands where it did: the run is the one a fresh
            // analysis makes now.
            self.exact = true;
            self.deps.revision = revision;
        } else {
            self.exact = false;
        }
        true
    }

    /// Names the node each step's job lands on now (`None`: a node of its
    /// tier, which one not told).
    fn land(&mut self, view: &FleetView, landings: &[Option<NodeIdx>]) {
        if self.landed == landings {
            return;
        }
        for ((step, now), named) in self.deps.steps.iter().zip(landings).zip(&mut self.landed) {
            if named == now {
                continue;
            }
            *named = *now;
            let Some(Some((b, j))) = self.fates.get(step.at) else {
                continue;
            };
            let job = self
                .verdict
                .bundles
                .get_mut(*b as usize)
                .and_then(|bundle| bundle.jobs.get_mut(*j as usize));
            if let Some(JobFate {
                fate: Fate::Placed { node_id, .. },
                ..
            }) = job
            {
                let now = now.map(|idx| &view.node(idx).id);
                if node_id.as_ref() != now {
                    *node_id = now.cloned();
                }
            }
        }
    }
}

/// A node an update changed.
#[derive(Clone, Copy, Debug)]
struct Logged {
    revision: u64,
    idx: NodeIdx,
    /// Only its jobs changed: its pool, tier, phase and description are
    /// as they were, so no tier's node count moved.
    jobs_only: bool,
    /// It only took jobs, and is no spare taking its first: it takes no
    /// placement it did not take before.
    grew: bool,
}

/// A verdict kept on its outcome is due to be made again once its run is
/// this many node changes old...
const REFRESH_AFTER: usize = 16;

/// ... and is, within about this many updates (a share of those due per
/// update, oldest first).
const REFRESH_WINDOW: usize = 32;

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
    /// Only its jobs changed (see [`Logged`]).
    jobs_only: bool,
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
        let mut touched = self.touched_bundles(bundles, ceiling);
        let changes = match self.apply(snapshot, &mut touched) {
            Ok(changes) => changes,
            // The view refused a change it should take: start again.
            Err(_) => return self.rebuild(snapshot, pools, bundles, ceiling),
        };
        self.log_changes(&changes);
        self.copy_specs(&touched, bundles, ceiling);
        // The view is taken out while the verdicts are brought up to date,
        // so that the tracker's other fields can change beside it.
        let Some(mut view) = self.view.take() else {
            return self.rebuild(snapshot, pools, bundles, ceiling);
        };
        let mut stats = self.refresh_nodes(&mut view, &changes, &touched);
        self.view = Some(view);
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

    /// The bundles whose spec changed since the last update, or one of
    /// whose jobs reached or left its restart ceiling.
    fn touched_bundles(
        &self,
        bundles: &BTreeMap<BundleId, BundleSpec>,
        ceiling: &BTreeSet<JobId>,
    ) -> BTreeSet<BundleId> {
        let mut touched = changed_specs(&self.bundles, bundles);
        for job in self.ceiling.symmetric_difference(ceiling) {
            if let Some(bundle) = bundle_of(job) {
                touched.insert(bundle);
            }
        }
        touched
    }

    /// Logs the nodes `changes` name at a new revision, for the replays of
    /// runs made before it.
    fn log_changes(&mut self, changes: &[Change]) {
        if changes.is_empty() {
            return;
        }
        self.revision += 1;
        let revision = self.revision;
        self.log.extend(changes.iter().filter_map(|c| {
            Some(Logged {
                revision,
                idx: c.idx?,
                jobs_only: c.jobs_only,
                grew: matches!(c.kind, ChangeKind::Fuller | ChangeKind::Shrink),
            })
        }));
        if self.log.len() > LOG_CAPACITY {
            // The older half goes; runs made before it are made afresh.
            let cut = self.log.len() / 2;
            self.floor = self.log[cut].revision;
            self.log.drain(..self.log.partition_point(|l| l.revision < self.floor));
        }
    }

    /// Copies the specs of the `touched` bundles, and the restart ceilings
    /// when they changed. Only what changed is copied: a fleet's specs are
    /// many.
    fn copy_specs(
        &mut self,
        touched: &BTreeSet<BundleId>,
        bundles: &BTreeMap<BundleId, BundleSpec>,
        ceiling: &BTreeSet<JobId>,
    ) {
        for id in touched {
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
    }

    /// Brings the node verdicts up to date with `changes` to the nodes and
    /// the `touched` bundles: drops those of nodes gone or going, keeps
    /// those no change can alter, and recomputes the rest.
    fn refresh_nodes(&mut self, view: &mut FleetView, changes: &[Change], touched: &BTreeSet<BundleId>) -> UpdateStats {
        // The node domains: every node that is not stopped or going.
        let nodes = node_domains(view);
        self.runs
            .retain(|id, _| view.node_index(id).is_some_and(|idx| !going(view, idx)));
        let (dirty, outcome_kept) = self.stale_nodes(view, &nodes, changes, touched);
        let mut stats = UpdateStats {
            nodes_recomputed: dirty.len(),
            nodes: nodes.len(),
            outcome_kept,
            ..UpdateStats::default()
        };
        let mut changed: Vec<NodeIdx> = Vec::new();
        for idx in dirty {
            let id = view.node(idx).id.clone();
            // A run whose own node, bundles or restart ceilings are as they
            // were is replayed from its last run, when the log still holds
            // what changed since (see `run::Replay`).
            let last = self.runs.remove(&id).map(|kept| kept.deps).filter(|deps| {
                deps.revision >= self.floor
                    && !deps.bundles.iter().any(|b| touched.contains(b))
                    && !changes.iter().any(|c| c.node == id)
            });
            let replay = last.as_ref().and_then(|deps| replay_of(&self.log, deps, &mut changed));
            let record = replay.map_or(Record::Podiums, Record::Replay);
            let (replayed, searched) = self.run_node(view, idx, id, record);
            stats.placements_replayed += replayed;
            stats.placements_searched += searched;
        }
        stats
    }

    /// The node verdicts to recompute, in `nodes` order (a share of those
    /// kept on their outcome long enough last), and how many verdicts were
    /// kept on their outcome. A verdict stands when no change could alter
    /// it; else it is kept when its outcome stands ([`outcome_stands`]).
    fn stale_nodes(
        &mut self,
        view: &FleetView,
        nodes: &[NodeIdx],
        changes: &[Change],
        touched: &BTreeSet<BundleId>,
    ) -> (Vec<NodeIdx>, usize) {
        let mut outcome_kept = 0;
        let mut dirty: Vec<NodeIdx> = Vec::new();
        // Verdicts kept on their outcome, by the revision of their run.
        let mut aging: Vec<(u64, NodeIdx)> = Vec::new();
        // What changed since each revision runs were made at.
        let mut sinces: Vec<(u64, Since)> = Vec::new();
        for &idx in nodes {
            let id = &view.node(idx).id;
            let Some(kept) = self.runs.get_mut(id) else {
                dirty.push(idx);
                continue;
            };
            let own = changes.iter().any(|c| &c.node == id) || kept.deps.bundles.iter().any(|b| touched.contains(b));
            if !own && kept.exact && !affected(view, &kept.deps, changes) {
                continue;
            }
            if !own && kept.deps.revision >= self.floor {
                let since = since_of(&mut sinces, view, &self.log, kept.deps.revision);
                if kept.keep_on_outcome(view, since, &self.bundles, self.revision) {
                    if !kept.exact {
                        outcome_kept += 1;
                        if since.changes >= REFRESH_AFTER {
                            aging.push((kept.deps.revision, idx));
                        }
                    }
                    continue;
                }
            }
            dirty.push(idx);
        }
        if !changes.is_empty() {
            // Verdicts kept on their outcome with `REFRESH_AFTER` changes
            // since their run are made again a share per update, oldest
            // first, so that none reaches `MOST_REPLAYED_CHANGES` (and they
            // do not all come due at once).
            aging.sort_by_key(|(revision, _)| *revision);
            let due = aging.len().div_ceil(REFRESH_WINDOW);
            dirty.extend(aging.into_iter().take(due).map(|(_, idx)| idx));
        }
        (dirty, outcome_kept)
    }

    /// Makes and keeps the verdict on the loss of node `idx`, `id`; returns
    /// how many of its placements were replayed and how many searched.
    fn run_node(&mut self, view: &mut FleetView, idx: NodeIdx, id: NodeId, record: Record<'_>) -> (usize, usize) {
        let context = Context {
            bundles: &self.bundles,
            at_restart_ceiling: &self.ceiling,
        };
        let domain = Domain::new(DomainKind::Node, id.as_str());
        let (verdict, mut deps) = what_if(view, &self.carried, context, domain, &[idx], false, record);
        deps.revision = self.revision;
        let replayed = deps.replayed as usize;
        let searched = deps.steps.len() - replayed;
        self.runs.insert(id, Kept::new(verdict, deps));
        (replayed, searched)
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
            .map(|kept| kept.verdict.clone())
            .chain(self.wide.iter().cloned());
        HeadroomReport::of(domains.collect(), &pools)
    }

    /// The verdict on one node's loss (a job's landing node left out where
    /// the verdict was kept on its outcome and the node cannot be told).
    pub fn node(&self, node: &NodeId) -> Option<&DomainVerdict> {
        self.runs.get(node).map(|kept| &kept.verdict)
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
        self.runs.clear();
        let mut searched = 0;
        for idx in node_domains(&view) {
            let id = view.node(idx).id.clone();
            let (_, searched_here) = self.run_node(&mut view, idx, id, Record::Podiums);
            searched += searched_here;
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
            outcome_kept: 0,
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
            let (kind, jobs_only) = match old {
                None => {
                    view.add_node(node)?;
                    (ChangeKind::General, false)
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
                    let kind =
                        if removed.is_empty() && !old.jobs.is_empty() && added.iter().all(|j| asks_capacity_alone(j)) {
                            ChangeKind::Fuller
                        } else if removed.is_empty() && !old.is_unconsumed_spare() {
                            ChangeKind::Shrink
                        } else {
                            ChangeKind::General
                        };
                    (kind, true)
                }
                Some(old) => {
                    view.replace_node(node)?;
                    touched.extend(old.jobs.iter().chain(&node.jobs).filter_map(|j| j.bundle.clone()));
                    (ChangeKind::General, false)
                }
            };
            slots.extend(slot_of(view, &node.id));
            changes.push(Change {
                node: node.id.clone(),
                kind,
                slots,
                free_before,
                jobs_only,
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
                jobs_only: false,
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

/// The bundles whose spec differs between `old` and `new` (added, removed
/// or changed): one walk of both maps in key order.
fn changed_specs(old: &BTreeMap<BundleId, BundleSpec>, new: &BTreeMap<BundleId, BundleSpec>) -> BTreeSet<BundleId> {
    use std::cmp::Ordering;
    let mut changed = BTreeSet::new();
    let (mut old, mut new) = (old.iter().peekable(), new.iter().peekable());
    loop {
        let order = match (old.peek(), new.peek()) {
            (None, None) => return changed,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((a, _)), Some((b, _))) => a.cmp(b),
        };
        match order {
            Ordering::Less => changed.extend(old.next().map(|(id, _)| id.clone())),
            Ordering::Greater => changed.extend(new.next().map(|(id, _)| id.clone())),
            Ordering::Equal => {
                if let (Some((id, was)), Some((_, is))) = (old.next(), new.next())
                    && was != is
                {
                    changed.insert(id.clone());
                }
            }
        }
    }
}

/// Whether a change to another node could alter a run (see the module
/// docs).
fn affected(view: &FleetView, deps: &Deps, changes: &[Change]) -> bool {
    changes.iter().any(|change| match change.kind {
        ChangeKind::Fuller => fuller_could_change(view, deps, change),
        kind => {
            deps.landing.contains(&change.node)
                || (kind != ChangeKind::Shrink && change.slots.iter().any(|s| deps.elastic.contains(s)))
                || (kind != ChangeKind::Removed && could_win(view, deps, change))
        }
    })
}

/// Where the jobs of a run made at `deps.revision` land on the fleet as it
/// is now, `since` the nodes changed after it, when every one still lands
/// in the same pool and tier (see the module docs): per step, its node
/// when that can be told. `None` when the outcome may differ. Never a
/// guess: what cannot be told is "may differ".
fn outcome_stands(
    view: &FleetView,
    kept: &Kept,
    since: &Since,
    bundles: &BTreeMap<BundleId, BundleSpec>,
) -> Option<Vec<Option<NodeIdx>>> {
    let deps = &kept.deps;
    if !deps.settled || !since.jobs_only {
        return None;
    }
    // Besides the nodes changed since, those an earlier step may have left
    // or taken anew; the nodes it left may take what they did not.
    let mut moved: Vec<Rival> = Vec::new();
    let mut parted: Vec<u32> = Vec::new();
    let mut landings = Vec::with_capacity(deps.steps.len());
    for step in &deps.steps {
        let (Some(podium), Some((took, _))) = (&step.podium, step.took) else {
            return None;
        };
        // A later job of a bundle whose earlier job may have moved: its
        // rules read where that job is.
        if parted.contains(&step.bundle) {
            return None;
        }
        let (pool, tier) = (step.pool, podium.tier);
        // The nodes that may differ and could take the job: a node holds
        // at least the jobs it holds now at any step of a run, so one
        // without the room now never takes it.
        let left = |idx: NodeIdx| moved.iter().any(|m| m.idx == idx && !m.grew);
        let rivals = since
            .nodes
            .iter()
            .chain(&moved)
            .filter(|r| r.pool == pool && r.free + SLACK >= step.need);
        // No node of an earlier tier survived, and node counts did not
        // move (no tier provisions anew). One that may now have more room
        // might survive, unless the job's own rules turn it away whatever
        // its room.
        let mut earlier = rivals
            .clone()
            .filter(|r| r.tier < tier && (!r.grew || left(r.idx)))
            .map(|r| (r.idx, r.tier))
            .peekable();
        if earlier.peek().is_some() && !turn_away(view, kept, bundles, step.at, earlier) {
            return None;
        }
        // The best survivor of the tier that cannot differ ranks as it did
        // against all the others that cannot: it still survives, and only
        // it or a rival can win.
        let differs = |idx: &NodeIdx| since.contains(*idx) || moved.iter().any(|m| m.idx == *idx);
        let best = *podium.nodes.iter().find(|i| !differs(i))?;
        let contested = rivals.clone().any(|r| r.tier == tier);
        landings.push((!contested).then_some(best));
        if contested || best != took {
            for idx in [took, best] {
                if let Some(rival) = Rival::of(view, idx, false) {
                    moved.push(rival);
                }
            }
            parted.push(step.bundle);
        }
    }
    Some(landings)
}

/// A node that may differ from a run's: where it is and the room it has.
#[derive(Clone, Copy, Debug)]
struct Rival {
    idx: NodeIdx,
    pool: usize,
    tier: usize,
    free: f64,
    /// It only took jobs: it takes no placement it did not take before.
    grew: bool,
}

impl Rival {
    fn of(view: &FleetView, idx: NodeIdx, grew: bool) -> Option<Self> {
        let (pool, tier) = slot_at(view, idx)?;
        Some(Rival {
            idx,
            pool,
            tier,
            free: view.hot(idx).free,
            grew,
        })
    }
}

/// The nodes changed since a revision, as [`outcome_stands`] reads them.
#[derive(Debug)]
struct Since {
    /// Node changes since.
    changes: usize,
    /// Every change since was to a node's jobs alone.
    jobs_only: bool,
    /// By node index.
    nodes: Vec<Rival>,
}

impl Since {
    fn of(view: &FleetView, log: &[Logged]) -> Self {
        let mut nodes: Vec<Rival> = Vec::new();
        for logged in log {
            match nodes.iter_mut().find(|r| r.idx == logged.idx) {
                Some(rival) => rival.grew &= logged.grew,
                None => nodes.extend(Rival::of(view, logged.idx, logged.grew)),
            }
        }
        nodes.sort_unstable_by_key(|r| r.idx);
        Since {
            changes: log.len(),
            jobs_only: log.len() <= MOST_REPLAYED_CHANGES && log.iter().all(|l| l.jobs_only),
            nodes,
        }
    }

    fn contains(&self, idx: NodeIdx) -> bool {
        self.nodes.binary_search_by_key(&idx, |r| r.idx).is_ok()
    }
}

/// What changed since `revision` (see [`Since`]), read off `log` once per
/// revision and kept in `sinces` for the other runs made at it.
fn since_of<'s>(sinces: &'s mut Vec<(u64, Since)>, view: &FleetView, log: &[Logged], revision: u64) -> &'s Since {
    match sinces.iter().position(|(r, _)| *r == revision) {
        Some(at) => &sinces[at].1,
        None => {
            let log = &log[log.partition_point(|l| l.revision <= revision)..];
            sinces.push((revision, Since::of(view, log)));
            &sinces[sinces.len() - 1].1
        }
    }
}

/// The replay of `last` (see `run::Replay`), with `changed` filled with
/// the nodes `log` names since it was made; `None` when they are too many
/// to look at one by one.
fn replay_of<'r>(log: &[Logged], last: &'r Deps, changed: &'r mut Vec<NodeIdx>) -> Option<Replay<'r>> {
    changed.clear();
    let from = log.partition_point(|l| l.revision <= last.revision);
    changed.extend(log[from..].iter().map(|l| l.idx));
    changed.sort_unstable();
    changed.dedup();
    (changed.len() <= MOST_REPLAYED_CHANGES).then_some(Replay { last, changed })
}

/// The node domains, by index: every node not already going.
fn node_domains(view: &FleetView) -> Vec<NodeIdx> {
    view.order.iter().copied().filter(|&idx| !going(view, idx)).collect()
}

/// Node `idx`'s pool and tier when placement can reach it (it advertises
/// inventory, is not going, unhealthy or cordoned).
fn reachable_slot(view: &FleetView, idx: NodeIdx) -> Option<(usize, usize)> {
    let hot = view.hot(idx);
    let reachable =
        hot.has(flag::INVENTORY) && !hot.has(flag::GONE) && !hot.has(flag::UNHEALTHY) && !hot.has(flag::CORDONED);
    slot_at(view, idx).filter(|_| reachable)
}

/// Whether every one of `nodes` (node, tier) turns away the lost job the
/// run placed `at`th, and would holding more jobs than it does now: a
/// rejection that reads the node alone, never a peer's place.
fn turn_away(
    view: &FleetView,
    kept: &Kept,
    bundles: &BTreeMap<BundleId, BundleSpec>,
    at: usize,
    mut nodes: impl Iterator<Item = (NodeIdx, usize)>,
) -> bool {
    let Some((bundle_id, job)) = kept.fate(at) else {
        return false;
    };
    let Some(bundle) = bundles.get(bundle_id) else {
        return false;
    };
    let Some(spec) = bundle.job(&job.job_name) else {
        return false;
    };
    let recovery = RecoveryContext {
        on_runtime_failure: Some(spec.requirements.on_runtime_failure),
        excluded_nodes: vec![job.lost_from.clone()],
    };
    let request = PlacementRequest::launch(bundle_id, bundle, job.replica_index, &job.job_name).recovering(&recovery);
    let Ok(demand) = Demand::compile(view, request) else {
        return false;
    };
    nodes.all(|(idx, tier)| check(view, idx, &demand, tier).is_err_and(|why| why.stands_with_more_jobs()))
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
    let slot = reachable_slot(view, idx);
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
    let Some((pool, tier)) = reachable_slot(view, idx) else {
        return false;
    };
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
    slot_at(view, view.node_index(id)?)
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
