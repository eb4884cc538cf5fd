//! One what-if: a domain's nodes taken away from the view, their jobs
//! placed again as the core would, the verdict read off, and the view put
//! back as it was. The view is changed in place and restored, rather than
//! cloned per domain: a clone of a large fleet costs far more than the
//! placements themselves.
//!
//! Besides the verdict, a run records what it read of the rest of the
//! fleet ([`Deps`]), so the tracker can tell which later changes could
//! alter it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::iter::Peekable;
use std::slice;

use crate::model::{
    BundleId, BundleSpec, JobId, NodeId, NodePhase, OnRuntimeFailure, PackingStrategy, PlacedJob, ScaleOut,
};

use super::super::PlacementError;
use super::super::engine::{Outcome, SequentialNodeIds, apply_placement, place, place_ranked, tier_refusals};
use super::super::fleet::{FleetError, FleetView, NO_SLOT, NodeIdx, flag};
use super::super::groups::JobGroups;
use super::super::rankings::Rankings;
use super::super::replay::{Podium, replace};
use super::super::request::{PlacementRequest, RecoveryContext};
use super::{
    BundleFate, Context, DarkReason, Domain, DomainVerdict, Fate, JobFate, LostNode, ProvisionNeed, TierRefusal,
    bundle_absorbed, lost_tiers,
};

/// What a run read of the fleet beyond the lost nodes.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Deps {
    /// Bundles of the lost jobs: a change to any of their jobs (peers,
    /// the other replica), their spec or their restart ceilings can
    /// change the run.
    pub bundles: BTreeSet<BundleId>,
    /// Nodes that took a job: a change to any of them can change the run.
    pub landing: BTreeSet<NodeId>,
    /// One per placement made.
    pub steps: Vec<StepDep>,
    /// Elastic tiers `(pool, tier)` a placement found no node in and
    /// asked to provision from: their node counts (`maxNodes`) matter.
    pub elastic: BTreeSet<(usize, usize)>,
    /// The tracker's revision the run was made at: what changed since
    /// is what a replay of it must look at afresh.
    pub revision: u64,
    /// Placements decided from the last run's podium, without a search.
    pub replayed: u32,
    /// Every lost job's fate either stands whatever the rest of the fleet
    /// does (dropped, at its restart ceiling, its bundle broken, its spec
    /// unknown, no bundle at all) or is a placement on a node of the fleet
    /// that left a podium. Only then can the tracker judge a change by
    /// the verdict's outcome alone (see `tracker::outcome_stands`).
    pub settled: bool,
}

/// A run made again from the last one (see `placement::replay`): each
/// placement whose search left a podium is decided from it, looking afresh
/// only at the nodes that changed since — those `changed` names, and those
/// an earlier placement of this run put a job on, or took it from,
/// differently. The rest of the run is made as [`what_if`] makes it, so
/// the result is the one a fresh run gives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Replay<'a> {
    /// The last run of the same domain, with the same lost jobs, bundle
    /// specs and restart ceilings.
    pub last: &'a Deps,
    /// Every node that may differ since `last` was made.
    pub changed: &'a [NodeIdx],
}

/// What a run keeps for the next run of its domain.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Record<'a> {
    /// Nothing: a one-off analysis.
    None,
    /// Each search's podium, for a later replay.
    Podiums,
    /// Podiums, and the run is made from the last one.
    Replay(Replay<'a>),
}

/// How many survivors a run's search keeps for a later replay. Besides
/// replays, the tracker judges a verdict on its outcome from the first
/// podium node no change since can have touched; under `binpack` the
/// fullest nodes, which top every podium, are the ones placements keep
/// changing, so a short podium runs out within a few placements (4 kept
/// 7 of 1,000 verdicts per update on the headroom benchmark, 16 kept 896,
/// 32 kept 977).
const PODIUM: usize = 32;

/// What one placement of a run decided, as far as other nodes could
/// change it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StepDep {
    /// The replica's pool.
    pub pool: usize,
    /// The last tier walked (the deciding one, else the last).
    pub upto: usize,
    /// The tier and fill of the node that won, if one did.
    pub winner: Option<(usize, f64, PackingStrategy)>,
    /// The node of the fleet that won; `None` when nothing won or a node
    /// of the run's own provisions did.
    pub landed: Option<NodeId>,
    /// The job's own capacity: no node with less free can take it.
    pub need: f64,
    /// The most the placement can ask of a node: the job's whole co-located
    /// group (the first mover sizes its node for the group).
    pub need_max: f64,
    /// The job's place among the run's lost jobs.
    pub at: usize,
    /// Its bundle's place among the run's bundles, in the order the run
    /// met them.
    pub bundle: u32,
    /// The view's index of the node that took the job (a provision's
    /// included), and the GPU device.
    pub took: Option<(NodeIdx, Option<u32>)>,
    /// What the search found in its deciding tier, when it decided.
    pub podium: Option<Podium>,
}

/// Analyses the loss of `lost` (the nodes of `domain`) on `view`, which is
/// left as it was found.
pub(crate) fn what_if(
    view: &mut FleetView,
    carried: &HashMap<NodeId, Vec<PlacedJob>>,
    context: Context<'_>,
    domain: Domain,
    lost: &[NodeIdx],
    explain: bool,
    record: Record<'_>,
) -> (DomainVerdict, Deps) {
    let lost_nodes: Vec<LostNode> = lost
        .iter()
        .map(|&idx| LostNode {
            node_id: view.node(idx).id.clone(),
            pool: pool_of(view, idx),
        })
        .collect();
    let taken = take_away(view, carried, lost, &lost_nodes, &domain);
    let lost_jobs = lost_jobs(carried, &lost_nodes);
    let broken = broken_bundles(context, &lost_jobs);
    let standing = standing_replicas(view, &lost_jobs);
    let mut run = Run::new(context, record, explain, broken);
    for (at, (from, job)) in lost_jobs.into_iter().enumerate() {
        run.recover(view, at, from, job);
    }
    // Put the view back as it was.
    run.take_back(view);
    taken.put_back(view, carried);
    run.verdict(domain, lost_nodes, &standing)
}

impl<'a> Record<'a> {
    /// How many survivors each search keeps, and the last run to replay.
    fn parts(self) -> (usize, Option<Replay<'a>>) {
        match self {
            Record::None => (1, None),
            Record::Podiums => (PODIUM, None),
            Record::Replay(replay) => (PODIUM, Some(replay)),
        }
    }
}

/// The jobs `carried` lists on node `id`.
fn jobs_of<'c>(carried: &'c HashMap<NodeId, Vec<PlacedJob>>, id: &NodeId) -> &'c [PlacedJob] {
    carried.get(id).map_or(&[], Vec::as_slice)
}

/// What taking the lost nodes away changed, so that the view can be put
/// back as it was.
struct Taken {
    /// Each lost node's id, phase and health before it was stopped.
    saved: Vec<(NodeId, NodePhase, bool)>,
    /// The tiers whose provisioning is withheld: those the domain is.
    withheld: Vec<(usize, usize)>,
}

/// Takes the lost nodes away: their jobs released, the nodes stopped (so
/// they no longer count against `maxNodes`), and nothing provisioned from
/// the tiers the domain is.
fn take_away(
    view: &mut FleetView,
    carried: &HashMap<NodeId, Vec<PlacedJob>>,
    lost: &[NodeIdx],
    lost_nodes: &[LostNode],
    domain: &Domain,
) -> Taken {
    let mut saved = Vec::with_capacity(lost.len());
    for (&idx, node) in lost.iter().zip(lost_nodes) {
        let phase = view.node(idx).phase;
        let unhealthy = view.hot(idx).has(flag::UNHEALTHY);
        for job in jobs_of(carried, &node.node_id) {
            // The node is in the view (it was found there), so neither
            // call can refuse.
            let _ = view.release(&node.node_id, job);
        }
        let _ = view.set_condition(&node.node_id, NodePhase::Stopped, unhealthy);
        saved.push((node.node_id.clone(), phase, unhealthy));
    }
    let withheld = lost_tiers(view.pools(), domain);
    for &(p, t) in &withheld {
        view.withhold_provisioning(p, t, true);
    }
    Taken { saved, withheld }
}

impl Taken {
    /// Gives the tiers their provisioning back, and the lost nodes their
    /// condition and their jobs.
    fn put_back(self, view: &mut FleetView, carried: &HashMap<NodeId, Vec<PlacedJob>>) {
        for &(p, t) in &self.withheld {
            view.withhold_provisioning(p, t, false);
        }
        for (id, phase, unhealthy) in self.saved {
            let _ = view.set_condition(&id, phase, unhealthy);
            for job in jobs_of(carried, &id) {
                let _ = view.reserve(&id, job);
            }
        }
    }
}

/// Every job of the lost nodes, with its node, in runtime job id order:
/// the order the core recovers them in.
fn lost_jobs<'c>(
    carried: &'c HashMap<NodeId, Vec<PlacedJob>>,
    lost_nodes: &[LostNode],
) -> Vec<(&'c NodeId, &'c PlacedJob)> {
    let mut jobs: Vec<(&NodeId, &PlacedJob)> = lost_nodes
        .iter()
        .filter_map(|n| carried.get_key_value(&n.node_id))
        .flat_map(|(id, jobs)| jobs.iter().map(move |j| (id, j)))
        .collect();
    jobs.sort_by(|a, b| a.1.job_id.cmp(&b.1.job_id));
    jobs
}

/// The bundles an essential terminal job breaks, each with that job's
/// name. Judged before anything is placed, as the core judges every job of
/// a lost node first.
fn broken_bundles(context: Context<'_>, lost_jobs: &[(&NodeId, &PlacedJob)]) -> BTreeMap<BundleId, String> {
    let mut broken = BTreeMap::new();
    for (_, job) in lost_jobs {
        if let Some(bundle) = &job.bundle
            && let Some(spec) = context.bundles.get(bundle).and_then(|s| s.job(&job.job_name))
            && spec.requirements.is_essential()
            && terminal(context, job, spec.requirements.on_runtime_failure).is_some()
        {
            broken.entry(bundle.clone()).or_insert_with(|| job.job_name.clone());
        }
    }
    broken
}

/// The replicas of each lost job's bundle with jobs left standing, before
/// anything is placed again.
fn standing_replicas(view: &FleetView, lost_jobs: &[(&NodeId, &PlacedJob)]) -> BTreeMap<BundleId, BTreeSet<u32>> {
    let mut standing = BTreeMap::new();
    for (_, job) in lost_jobs {
        if let Some(bundle) = &job.bundle {
            let replicas = view
                .bundle_occupants(bundle)
                .iter()
                .map(|&o| view.occupants[o as usize].replica)
                .collect();
            standing.insert(bundle.clone(), replicas);
        }
    }
    standing
}

/// A lost job of a bundle, as the run meets it.
struct LostJob<'a> {
    /// Its place among the run's lost jobs.
    at: usize,
    /// The node it was lost with.
    from: &'a NodeId,
    job: &'a PlacedJob,
    bundle_id: &'a BundleId,
    /// Its bundle's place among the run's bundles, in the order met.
    bundle_seq: u32,
}

/// A run under way: the lost jobs are met one by one, each placed again
/// and reserved where it went before the next, as the core recovers them.
struct Run<'a> {
    context: Context<'a>,
    /// A job nothing takes gets the trace of its search.
    explain: bool,
    /// The bundles an essential terminal job breaks (see
    /// [`broken_bundles`]).
    broken: BTreeMap<BundleId, String>,
    /// How many survivors each search keeps (see [`PODIUM`]).
    keep: usize,
    rankings: Rankings,
    ids: SequentialNodeIds,
    replaying: Replaying<'a>,
    /// The bundles met so far, in the order met.
    met: Vec<&'a BundleId>,
    deps: Deps,
    /// The reservations made, in order: released when the run is done.
    reserved: Vec<(NodeId, PlacedJob)>,
    /// The provisions' nodes added to the view: removed when the run is
    /// done.
    prospective: Vec<NodeId>,
    provisions: Vec<ProvisionNeed>,
    fates: BTreeMap<BundleId, Vec<JobFate>>,
    /// The lost jobs of no bundle.
    unmanaged: Vec<JobId>,
}

impl<'a> Run<'a> {
    fn new(context: Context<'a>, record: Record<'a>, explain: bool, broken: BTreeMap<BundleId, String>) -> Self {
        let (keep, replay) = record.parts();
        Run {
            context,
            explain,
            broken,
            keep,
            rankings: Rankings::keeping(keep),
            ids: SequentialNodeIds::default(),
            replaying: Replaying::new(replay),
            met: Vec::new(),
            deps: Deps {
                settled: true,
                ..Deps::default()
            },
            reserved: Vec::new(),
            prospective: Vec::new(),
            provisions: Vec::new(),
            fates: BTreeMap::new(),
            unmanaged: Vec::new(),
        }
    }

    /// Decides and records the fate of `job`, the `at`th lost job, lost
    /// with node `from`.
    fn recover(&mut self, view: &mut FleetView, at: usize, from: &'a NodeId, job: &'a PlacedJob) {
        let Some(bundle_id) = &job.bundle else {
            self.unmanaged.push(job.job_id.clone());
            return;
        };
        let lost = LostJob {
            at,
            from,
            job,
            bundle_id,
            bundle_seq: self.bundle_seq(bundle_id),
        };
        self.deps.bundles.insert(bundle_id.clone());
        let bundle = self.context.bundles.get(bundle_id);
        let spec = bundle.and_then(|b| b.job(&job.job_name));
        let fate = match (bundle, spec) {
            (Some(bundle), Some(spec)) => self.fate_of(view, &lost, bundle, spec.requirements.on_runtime_failure),
            _ => Fate::Dark {
                reason: DarkReason::UnknownSpec,
            },
        };
        self.deps.settled &= self.settles(&fate, at);
        self.fates.entry(bundle_id.clone()).or_default().push(JobFate {
            job_id: job.job_id.clone(),
            replica_index: job.replica_index,
            job_name: job.job_name.clone(),
            lost_from: from.clone(),
            essential: spec.is_none_or(|s| s.requirements.is_essential()),
            fate,
        });
    }

    /// The bundle's place among those the run met, in the order met.
    fn bundle_seq(&mut self, bundle_id: &'a BundleId) -> u32 {
        match self.met.iter().position(|b| *b == bundle_id) {
            Some(at) => at as u32,
            None => {
                self.met.push(bundle_id);
                self.met.len() as u32 - 1
            }
        }
    }

    /// Whether `fate`, of the `at`th lost job, stands whatever the rest of
    /// the fleet does, or is a placement on a node of the fleet that left
    /// a podium (see [`Deps::settled`]).
    fn settles(&self, fate: &Fate, at: usize) -> bool {
        match fate {
            Fate::Placed { .. } => self
                .deps
                .steps
                .last()
                .is_some_and(|s| s.at == at && s.landed.is_some() && s.podium.is_some()),
            Fate::Provision { .. } => false,
            Fate::Dark { reason } => matches!(
                reason,
                DarkReason::Dropped
                    | DarkReason::RestartCeiling
                    | DarkReason::BundleBroken { .. }
                    | DarkReason::UnknownSpec
            ),
        }
    }

    /// The fate of a lost job whose bundle and spec are known: dark when
    /// it is terminal or its bundle broke, else wherever it is placed.
    fn fate_of(
        &mut self,
        view: &mut FleetView,
        lost: &LostJob<'a>,
        bundle: &BundleSpec,
        policy: OnRuntimeFailure,
    ) -> Fate {
        if let Some(reason) = terminal(self.context, lost.job, policy) {
            return Fate::Dark { reason };
        }
        if let Some(job_name) = self.broken.get(lost.bundle_id) {
            return Fate::Dark {
                reason: DarkReason::BundleBroken {
                    job_name: job_name.clone(),
                },
            };
        }
        self.place_again(view, lost, bundle, policy)
    }

    /// Places the job again as the core would, reserves it where it went
    /// for the placements after, and records the step.
    fn place_again(
        &mut self,
        view: &mut FleetView,
        lost: &LostJob<'a>,
        bundle: &BundleSpec,
        policy: OnRuntimeFailure,
    ) -> Fate {
        let job = lost.job;
        let recovery = RecoveryContext {
            on_runtime_failure: Some(policy),
            excluded_nodes: vec![lost.from.clone()],
        };
        let request =
            PlacementRequest::launch(lost.bundle_id, bundle, job.replica_index, &job.job_name).recovering(&recovery);
        let last = self.replaying.last_step(lost.at);
        let (outcome, podium) = match self.decide(view, request, last, lost.bundle_id) {
            Ok(decided) => decided,
            Err(e) => {
                return Fate::Dark {
                    reason: DarkReason::PlacementRefused { message: e.to_string() },
                };
            }
        };
        let mut step = self.step_of(view, &outcome, lost, bundle);
        note_elastic(view, &step, &mut self.deps.elastic);
        let reserved = self.reserve(view, &request, &outcome, &mut step);
        step.podium = podium;
        self.replaying.note(last, &step, lost.bundle_id);
        self.deps.steps.push(step);
        self.fate_of_reservation(view, request, reserved, outcome, &job.job_id)
    }

    /// Where the job goes: from the last run's podium when a replay can
    /// tell, else by a search; with the podium the decision leaves.
    fn decide(
        &mut self,
        view: &FleetView,
        request: PlacementRequest<'_>,
        last: Option<&StepDep>,
        bundle_id: &BundleId,
    ) -> Result<(Outcome, Option<Podium>), PlacementError> {
        if let Some((outcome, podium)) = self.replaying.replayed(view, request, last, bundle_id, self.keep) {
            self.deps.replayed += 1;
            return Ok((outcome, Some(podium)));
        }
        let outcome = place_ranked(view, request, &mut self.ids, &mut self.rankings)?.outcome;
        let podium = self.podium_of(view, &outcome);
        Ok((outcome, podium))
    }

    /// What the search just made found in its deciding tier, when it
    /// placed the job on a node it ranked.
    fn podium_of(&self, view: &FleetView, outcome: &Outcome) -> Option<Podium> {
        let Outcome::Placed { pool, tier, .. } = outcome else {
            return None;
        };
        let (nodes, complete) = self.rankings.podium();
        let nodes: Vec<NodeIdx> = nodes.collect();
        (!nodes.is_empty()).then(|| Podium {
            tier: tier_index(view, pool, tier),
            nodes,
            complete,
            winner_fill_limit: self.rankings.winner_fill_limit(),
        })
    }

    /// The step `outcome` makes, before the job is reserved: the last tier
    /// walked, and the node that won, how full it was and how its tier
    /// packs.
    fn step_of(&mut self, view: &FleetView, outcome: &Outcome, lost: &LostJob<'_>, bundle: &BundleSpec) -> StepDep {
        let job = lost.job;
        let pool_name = bundle.pool_for_replica(job.replica_index);
        let (upto, winner, landed) = match outcome {
            Outcome::Placed {
                node_id, pool, tier, ..
            } => {
                let t = tier_index(view, pool, tier);
                let winner = view
                    .node_index(node_id)
                    .map(|idx| (t, view.hot(idx).fill, packing_of(view, pool, t)));
                let landed = (!self.prospective.contains(node_id)).then(|| node_id.clone());
                if !self.deps.landing.contains(node_id) {
                    self.deps.landing.insert(node_id.clone());
                }
                (t, winner, landed)
            }
            Outcome::Provision { pool, tier, .. } => (tier_index(view, pool, tier), None, None),
            Outcome::NoCapacityInAnyPool => {
                let tiers_in_pool = view.pools().get(pool_name).map_or(0, |p| p.tiers.len());
                (tiers_in_pool.saturating_sub(1), None, None)
            }
        };
        let (need, need_max) = needs_of(bundle, &job.job_name);
        StepDep {
            pool: view.pools().index_of(pool_name).unwrap_or(0),
            upto,
            winner,
            landed,
            need,
            need_max,
            at: lost.at,
            bundle: lost.bundle_seq,
            took: None,
            podium: None,
        }
    }

    /// Reserves the job where `outcome` put it (a provision's prospective
    /// node added first), and notes in `step` the node that took it.
    /// `None` when the outcome places nowhere, or reserves nothing.
    fn reserve(
        &mut self,
        view: &mut FleetView,
        request: &PlacementRequest<'_>,
        outcome: &Outcome,
        step: &mut StepDep,
    ) -> Option<Result<(NodeId, PlacedJob), FleetError>> {
        let to = outcome.destination()?;
        let applied = apply_placement(view, request, outcome);
        // A provision's node is in the view once added, even when the
        // reservation after it failed.
        if to.instance_type.is_some() && view.node_index(to.node_id).is_some() {
            self.prospective.push(to.node_id.clone());
        }
        match applied {
            Ok(Some(placed)) => {
                step.took = view.node_index(to.node_id).map(|idx| (idx, to.gpu_index));
                Some(Ok((to.node_id.clone(), placed)))
            }
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// The fate a placement leaves the job once reserved: placed, on a node
    /// to provision, or dark with why.
    fn fate_of_reservation(
        &mut self,
        view: &FleetView,
        request: PlacementRequest<'_>,
        reserved: Option<Result<(NodeId, PlacedJob), FleetError>>,
        outcome: Outcome,
        job_id: &JobId,
    ) -> Fate {
        match (reserved, outcome) {
            (Some(Err(e)), _) => Fate::Dark {
                reason: DarkReason::PlacementRefused { message: e.to_string() },
            },
            (
                Some(Ok(reservation)),
                Outcome::Placed {
                    node_id, pool, tier, ..
                },
            ) => {
                self.reserved.push(reservation);
                Fate::Placed {
                    node_id: Some(node_id),
                    pool,
                    tier,
                }
            }
            (
                Some(Ok(reservation)),
                Outcome::Provision {
                    node_id,
                    pool,
                    tier,
                    instance_type,
                    ..
                },
            ) => {
                self.reserved.push(reservation);
                self.note_provision(&node_id, &pool, &tier, &instance_type, job_id);
                Fate::Provision {
                    node_id,
                    pool,
                    tier,
                    instance_type,
                }
            }
            _ => no_capacity(view, request, self.explain),
        }
    }

    /// Counts the job among those its provision's node is for; the first
    /// job there names the node.
    fn note_provision(&mut self, node_id: &NodeId, pool: &str, tier: &str, instance_type: &str, job_id: &JobId) {
        match self.provisions.iter_mut().find(|p| &p.node_id == node_id) {
            Some(need) => need.jobs.push(job_id.clone()),
            None => self.provisions.push(ProvisionNeed {
                node_id: node_id.clone(),
                pool: pool.to_owned(),
                tier: tier.to_owned(),
                instance_type: instance_type.to_owned(),
                jobs: vec![job_id.clone()],
            }),
        }
    }

    /// Takes the run's reservations out of the view again, last first, and
    /// then its provisions' nodes.
    fn take_back(&self, view: &mut FleetView) {
        for (node, job) in self.reserved.iter().rev() {
            let _ = view.release(node, job);
        }
        for id in &self.prospective {
            let _ = view.remove_node(id);
        }
    }

    /// The verdict on the loss of `nodes`, from every lost job's fate, and
    /// what the run read of the fleet.
    fn verdict(
        self,
        domain: Domain,
        nodes: Vec<LostNode>,
        standing: &BTreeMap<BundleId, BTreeSet<u32>>,
    ) -> (DomainVerdict, Deps) {
        let bundles: Vec<BundleFate> = self
            .fates
            .into_iter()
            .map(|(bundle, jobs)| bundle_fate(bundle, jobs, standing, &self.broken))
            .collect();
        let jobs_lost = bundles.iter().map(|b| b.jobs.len() as u32).sum::<u32>() + self.unmanaged.len() as u32;
        let jobs_replaced = bundles
            .iter()
            .flat_map(|b| &b.jobs)
            .filter(|j| j.fate.is_replaced())
            .count() as u32;
        let verdict = DomainVerdict {
            domain,
            absorbed: bundles.iter().all(bundle_absorbed),
            nodes,
            jobs_lost,
            jobs_replaced,
            bundles,
            provisions: self.provisions,
            unmanaged: self.unmanaged,
        };
        (verdict, self.deps)
    }
}

/// What a replay (see [`Replay`]) keeps as its run goes: the last run's
/// steps still to meet, and what differs from that run so far.
struct Replaying<'a> {
    /// The run is made from a last one.
    active: bool,
    /// The last run's steps not met yet.
    last_steps: Peekable<slice::Iter<'a, StepDep>>,
    /// Every node that may differ from the last run, growing as this run's
    /// placements part from that one's.
    changed: Vec<NodeIdx>,
    /// The bundles a placement of which parted from the last run's.
    parted: BTreeSet<&'a BundleId>,
}

impl<'a> Replaying<'a> {
    fn new(replay: Option<Replay<'a>>) -> Self {
        Replaying {
            active: replay.is_some(),
            last_steps: replay
                .map(|r| r.last.steps.as_slice())
                .unwrap_or_default()
                .iter()
                .peekable(),
            changed: replay.map(|r| r.changed.to_vec()).unwrap_or_default(),
            parted: BTreeSet::new(),
        }
    }

    /// The last run's step for the `at`th lost job, when it made one.
    fn last_step(&mut self, at: usize) -> Option<&'a StepDep> {
        self.last_steps.next_if(|s| s.at == at)
    }

    /// The placement of `request` decided from the podium of `last`, when
    /// its bundle has not parted from the last run and the podium can tell.
    fn replayed(
        &self,
        view: &FleetView,
        request: PlacementRequest<'_>,
        last: Option<&StepDep>,
        bundle_id: &BundleId,
        keep: usize,
    ) -> Option<(Outcome, Podium)> {
        last.filter(|_| !self.parted.contains(bundle_id))
            .and_then(|s| s.podium.as_ref())
            .and_then(|podium| replace(view, request, podium, &self.changed, keep).ok().flatten())
    }

    /// Notes where `step` parts from `last`, the last run's step for the
    /// same job. A node that took this job where the last run's did not,
    /// or did not where it did, differs from that run from here on; so do
    /// the job's bundle's later placements.
    fn note(&mut self, last: Option<&StepDep>, step: &StepDep, bundle_id: &'a BundleId) {
        let parts = match last {
            Some(last) => last.took != step.took,
            None => self.active,
        };
        if parts {
            let took = last.and_then(|l| l.took).into_iter().chain(step.took);
            self.changed.extend(took.map(|(idx, _)| idx));
            self.parted.insert(bundle_id);
        }
    }
}

/// What becomes of a bundle: on air while a replica the loss did not touch
/// keeps running, or one it touched gets every lost essential job back.
fn bundle_fate(
    bundle: BundleId,
    jobs: Vec<JobFate>,
    standing: &BTreeMap<BundleId, BTreeSet<u32>>,
    broken: &BTreeMap<BundleId, String>,
) -> BundleFate {
    let touched: BTreeSet<u32> = jobs.iter().map(|j| j.replica_index).collect();
    let untouched_replicas: Vec<u32> = standing
        .get(&bundle)
        .into_iter()
        .flatten()
        .copied()
        .filter(|r| !touched.contains(r))
        .collect();
    let back = touched.iter().any(|&r| {
        jobs.iter()
            .filter(|j| j.replica_index == r && j.essential)
            .all(|j| j.fate.is_replaced())
    });
    BundleFate {
        on_air: !untouched_replicas.is_empty() || back,
        broken: broken.contains_key(&bundle),
        untouched_replicas,
        bundle,
        jobs,
    }
}

/// Why no node takes the job: each tier's refusal, and the search's trace
/// when the run explains.
fn no_capacity(view: &FleetView, request: PlacementRequest<'_>, explain: bool) -> Fate {
    let tiers = tier_refusals(view, request)
        .unwrap_or_default()
        .into_iter()
        .map(|(pool, tier, why)| TierRefusal { pool, tier, why })
        .collect();
    let trace = explain
        .then(|| place(view, request.with_trace(true), &mut SequentialNodeIds::default()))
        .and_then(|p| p.ok()?.trace);
    Fate::Dark {
        reason: DarkReason::NoCapacityInAnyPool { tiers, trace },
    }
}

/// What a placement of `job_name` can ask of a node's capacity: at least
/// the job's own, at most its co-located group's (what a first mover asks).
fn needs_of(bundle: &BundleSpec, job_name: &str) -> (f64, f64) {
    let Some(at) = bundle.jobs.iter().position(|j| j.job_name == job_name) else {
        return (0.0, 0.0);
    };
    let own = bundle.jobs[at].requirements.required_capacity.max(0.0);
    let group = JobGroups::of(bundle)
        .members(at)
        .map(|i| bundle.jobs[i].requirements.required_capacity.max(0.0))
        .sum::<f64>();
    (own, group.max(own))
}

/// Why a lost job would be terminal: `drop`, or its restart ceiling.
fn terminal(context: Context<'_>, job: &PlacedJob, policy: OnRuntimeFailure) -> Option<DarkReason> {
    if policy == OnRuntimeFailure::Drop {
        Some(DarkReason::Dropped)
    } else if context.at_restart_ceiling.contains(&job.job_id) {
        Some(DarkReason::RestartCeiling)
    } else {
        None
    }
}

fn pool_of(view: &FleetView, idx: NodeIdx) -> Option<String> {
    let slot = view.hot(idx).slot;
    (slot != NO_SLOT)
        .then(|| view.pools().at((slot >> 16) as usize))
        .flatten()
        .map(|p| p.name.clone())
}

fn tier_index(view: &FleetView, pool: &str, tier: &str) -> usize {
    view.pools()
        .get(pool)
        .and_then(|p| p.tiers.iter().position(|t| t.name == tier))
        .unwrap_or(0)
}

fn packing_of(view: &FleetView, pool: &str, tier: usize) -> PackingStrategy {
    view.pools()
        .get(pool)
        .and_then(|p| p.tiers.get(tier))
        .map_or(PackingStrategy::Binpack, |t| t.packing_strategy)
}

/// Records the elastic tiers a placement found no node in.
fn note_elastic(view: &FleetView, step: &StepDep, elastic: &mut BTreeSet<(usize, usize)>) {
    let Some(pool) = view.pools().at(step.pool) else {
        return;
    };
    let last = match step.winner {
        Some((t, _, _)) => t,
        None => step.upto + 1,
    };
    for (t, tier) in pool.tiers.iter().enumerate().take(last.min(pool.tiers.len())) {
        if tier.scale_out == ScaleOut::Elastic {
            elastic.insert((step.pool, t));
        }
    }
}
