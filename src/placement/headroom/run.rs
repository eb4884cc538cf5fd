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

use crate::model::{BundleId, BundleSpec, NodeId, NodePhase, OnRuntimeFailure, PackingStrategy, PlacedJob, ScaleOut};

use super::super::engine::{Outcome, SequentialNodeIds, apply_placement, place, place_ranked, tier_refusals};
use super::super::fleet::{FleetView, NO_SLOT, NodeIdx, flag};
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
    let (keep, replay) = match record {
        Record::None => (1, None),
        Record::Podiums => (PODIUM, None),
        Record::Replay(replay) => (PODIUM, Some(replay)),
    };
    let lost_nodes: Vec<LostNode> = lost
        .iter()
        .map(|&idx| LostNode {
            node_id: view.node(idx).id.clone(),
            pool: pool_of(view, idx),
        })
        .collect();
    let none: &[PlacedJob] = &[];
    let jobs_of = |id: &NodeId| carried.get(id).map_or(none, Vec::as_slice);

    // Take the nodes away: their jobs released, the nodes stopped (so
    // they no longer count against `maxNodes`).
    let mut saved = Vec::with_capacity(lost.len());
    for (&idx, node) in lost.iter().zip(&lost_nodes) {
        let phase = view.node(idx).phase;
        let unhealthy = view.hot(idx).has(flag::UNHEALTHY);
        for job in jobs_of(&node.node_id) {
            // The node is in the view (it was found there), so neither
            // call can refuse.
            let _ = view.release(&node.node_id, job);
        }
        let _ = view.set_condition(&node.node_id, NodePhase::Stopped, unhealthy);
        saved.push((node.node_id.clone(), phase, unhealthy));
    }
    let withheld = lost_tiers(view.pools(), &domain);
    for &(p, t) in &withheld {
        view.withhold_provisioning(p, t, true);
    }

    // The core recovers in runtime job id order.
    let mut lost_jobs: Vec<(&NodeId, &PlacedJob)> = lost_nodes
        .iter()
        .flat_map(|n| jobs_of(&n.node_id).iter().map(move |j| (&n.node_id, j)))
        .collect();
    lost_jobs.sort_by(|a, b| a.1.job_id.cmp(&b.1.job_id));

    // Judged before anything is placed, as the core judges every job of a
    // lost node first: an essential terminal job breaks its bundle.
    let mut broken: BTreeMap<BundleId, String> = BTreeMap::new();
    for (_, job) in &lost_jobs {
        if let Some(bundle) = &job.bundle
            && let Some(spec) = context.bundles.get(bundle).and_then(|s| s.job(&job.job_name))
            && spec.requirements.is_essential()
            && terminal(context, job, spec.requirements.on_runtime_failure).is_some()
        {
            broken.entry(bundle.clone()).or_insert_with(|| job.job_name.clone());
        }
    }
    // Replicas with jobs left standing, before anything is placed again.
    let mut standing: BTreeMap<BundleId, BTreeSet<u32>> = BTreeMap::new();
    for (_, job) in &lost_jobs {
        if let Some(bundle) = &job.bundle {
            let replicas = view
                .bundle_occupants(bundle)
                .iter()
                .map(|&o| view.occupants[o as usize].replica)
                .collect();
            standing.insert(bundle.clone(), replicas);
        }
    }

    let mut deps = Deps {
        settled: true,
        ..Deps::default()
    };
    let mut met: Vec<&BundleId> = Vec::new();
    let mut rankings = Rankings::keeping(keep);
    // The replay's view of what differs from its last run, growing as this
    // run's placements part from that one's.
    let mut changed: Vec<NodeIdx> = replay.map(|r| r.changed.to_vec()).unwrap_or_default();
    let mut parted: BTreeSet<&BundleId> = BTreeSet::new();
    let mut last_steps = replay
        .map(|r| r.last.steps.as_slice())
        .unwrap_or_default()
        .iter()
        .peekable();
    let mut ids = SequentialNodeIds::default();
    let mut reserved: Vec<(NodeId, PlacedJob)> = Vec::new();
    let mut prospective: Vec<NodeId> = Vec::new();
    let mut provisions: Vec<ProvisionNeed> = Vec::new();
    let mut fates: BTreeMap<BundleId, Vec<JobFate>> = BTreeMap::new();
    let mut unmanaged = Vec::new();
    for (at, (from, job)) in lost_jobs.into_iter().enumerate() {
        let Some(bundle_id) = &job.bundle else {
            unmanaged.push(job.job_id.clone());
            continue;
        };
        let bundle_seq = match met.iter().position(|b| *b == bundle_id) {
            Some(at) => at as u32,
            None => {
                met.push(bundle_id);
                met.len() as u32 - 1
            }
        };
        deps.bundles.insert(bundle_id.clone());
        let bundle = context.bundles.get(bundle_id);
        let spec = bundle.and_then(|b| b.job(&job.job_name));
        let fate = match (bundle, spec) {
            (Some(bundle), Some(spec)) => {
                let policy = spec.requirements.on_runtime_failure;
                if let Some(reason) = terminal(context, job, policy) {
                    Fate::Dark { reason }
                } else if let Some(job_name) = broken.get(bundle_id) {
                    Fate::Dark {
                        reason: DarkReason::BundleBroken {
                            job_name: job_name.clone(),
                        },
                    }
                } else {
                    let recovery = RecoveryContext {
                        on_runtime_failure: Some(policy),
                        excluded_nodes: vec![from.clone()],
                    };
                    let request = PlacementRequest::launch(bundle_id, bundle, job.replica_index, &job.job_name)
                        .recovering(&recovery);
                    let last = last_steps.next_if(|s| s.at == at);
                    let replayed = last
                        .filter(|_| !parted.contains(bundle_id))
                        .and_then(|s| s.podium.as_ref())
                        .and_then(|podium| replace(view, request, podium, &changed, keep).ok().flatten());
                    let (placed, podium) = match replayed {
                        Some((outcome, podium)) => {
                            deps.replayed += 1;
                            (Ok(outcome), Some(podium))
                        }
                        None => {
                            let placed = place_ranked(view, request, &mut ids, &mut rankings).map(|p| p.outcome);
                            let (nodes, complete) = rankings.podium();
                            let nodes: Vec<NodeIdx> = nodes.collect();
                            let podium = match &placed {
                                Ok(Outcome::Placed { pool, tier, .. }) if !nodes.is_empty() => Some(Podium {
                                    tier: tier_index(view, pool, tier),
                                    nodes,
                                    complete,
                                    winner_fill_limit: rankings.winner_fill_limit(),
                                }),
                                _ => None,
                            };
                            (placed, podium)
                        }
                    };
                    let (need, need_max) = needs_of(bundle, &job.job_name);
                    let step = |upto, winner, landed| StepDep {
                        pool: view
                            .pools()
                            .index_of(bundle.pool_for_replica(job.replica_index))
                            .unwrap_or(0),
                        upto,
                        winner,
                        landed,
                        need,
                        need_max,
                        at,
                        bundle: bundle_seq,
                        took: None,
                        podium: None,
                    };
                    match placed {
                        Err(e) => Fate::Dark {
                            reason: DarkReason::PlacementRefused { message: e.to_string() },
                        },
                        Ok(outcome) => {
                            let mut step = match &outcome {
                                Outcome::Placed {
                                    node_id, pool, tier, ..
                                } => {
                                    let t = tier_index(view, pool, tier);
                                    let winner = view
                                        .node_index(node_id)
                                        .map(|idx| (t, view.hot(idx).fill, packing_of(view, pool, t)));
                                    let landed = (!prospective.contains(node_id)).then(|| node_id.clone());
                                    if !deps.landing.contains(node_id) {
                                        deps.landing.insert(node_id.clone());
                                    }
                                    step(t, winner, landed)
                                }
                                Outcome::Provision { pool, tier, .. } => step(tier_index(view, pool, tier), None, None),
                                Outcome::NoCapacityInAnyPool => {
                                    let tiers_in_pool = view
                                        .pools()
                                        .get(bundle.pool_for_replica(job.replica_index))
                                        .map_or(0, |p| p.tiers.len());
                                    step(tiers_in_pool.saturating_sub(1), None, None)
                                }
                            };
                            note_elastic(view, &step, &mut deps.elastic);
                            // The job is reserved where it went (a provision's
                            // prospective node added first), for the placements after.
                            let applied = outcome.destination().and_then(|to| {
                                let applied = apply_placement(view, &request, &outcome);
                                // A provision's node is in the view once added,
                                // even when the reservation after it failed.
                                if to.instance_type.is_some() && view.node_index(to.node_id).is_some() {
                                    prospective.push(to.node_id.clone());
                                }
                                match applied {
                                    Ok(Some(placed)) => {
                                        step.took = view.node_index(to.node_id).map(|idx| (idx, to.gpu_index));
                                        Some(Ok((to.node_id.clone(), placed)))
                                    }
                                    Ok(None) => None,
                                    Err(e) => Some(Err(e)),
                                }
                            });
                            step.podium = podium;
                            // A node that took this job where the last run's did not, or
                            // did not where it did, differs from that run from here on;
                            // so do the job's bundle's later placements.
                            let parts = match last {
                                Some(last) => last.took != step.took,
                                None => replay.is_some(),
                            };
                            if parts {
                                let took = last.and_then(|l| l.took).into_iter().chain(step.took);
                                changed.extend(took.map(|(idx, _)| idx));
                                parted.insert(bundle_id);
                            }
                            deps.steps.push(step);
                            match (applied, outcome) {
                                (Some(Err(e)), _) => Fate::Dark {
                                    reason: DarkReason::PlacementRefused { message: e.to_string() },
                                },
                                (
                                    Some(Ok(reservation)),
                                    Outcome::Placed {
                                        node_id, pool, tier, ..
                                    },
                                ) => {
                                    reserved.push(reservation);
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
                                    reserved.push(reservation);
                                    match provisions.iter_mut().find(|p| p.node_id == node_id) {
                                        Some(need) => need.jobs.push(job.job_id.clone()),
                                        None => provisions.push(ProvisionNeed {
                                            node_id: node_id.clone(),
                                            pool: pool.clone(),
                                            tier: tier.clone(),
                                            instance_type: instance_type.clone(),
                                            jobs: vec![job.job_id.clone()],
                                        }),
                                    }
                                    Fate::Provision {
                                        node_id,
                                        pool,
                                        tier,
                                        instance_type,
                                    }
                                }
                                _ => {
                                    let tiers = tier_refusals(view, request)
                                        .unwrap_or_default()
                                        .into_iter()
                                        .map(|(pool, tier, why)| TierRefusal { pool, tier, why })
                                        .collect();
                                    let trace = explain
                                        .then(|| {
                                            place(view, request.with_trace(true), &mut SequentialNodeIds::default())
                                        })
                                        .and_then(|p| p.ok()?.trace);
                                    Fate::Dark {
                                        reason: DarkReason::NoCapacityInAnyPool { tiers, trace },
                                    }
                                }
                            }
                        }
                    }
                }
            }
            _ => Fate::Dark {
                reason: DarkReason::UnknownSpec,
            },
        };
        deps.settled &= match &fate {
            Fate::Placed { .. } => deps
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
        };
        fates.entry(bundle_id.clone()).or_default().push(JobFate {
            job_id: job.job_id.clone(),
            replica_index: job.replica_index,
            job_name: job.job_name.clone(),
            lost_from: from.clone(),
            essential: spec.is_none_or(|s| s.requirements.is_essential()),
            fate,
        });
    }

    // Put the view back as it was.
    for (node, job) in reserved.iter().rev() {
        let _ = view.release(node, job);
    }
    for id in &prospective {
        let _ = view.remove_node(id);
    }
    for &(p, t) in &withheld {
        view.withhold_provisioning(p, t, false);
    }
    for (id, phase, unhealthy) in saved {
        let _ = view.set_condition(&id, phase, unhealthy);
        for job in jobs_of(&id) {
            let _ = view.reserve(&id, job);
        }
    }

    let bundles: Vec<BundleFate> = fates
        .into_iter()
        .map(|(bundle, jobs)| {
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
        })
        .collect();
    let jobs_lost = bundles.iter().map(|b| b.jobs.len() as u32).sum::<u32>() + unmanaged.len() as u32;
    let jobs_replaced = bundles
        .iter()
        .flat_map(|b| &b.jobs)
        .filter(|j| j.fate.is_replaced())
        .count() as u32;
    let verdict = DomainVerdict {
        domain,
        absorbed: bundles.iter().all(bundle_absorbed),
        nodes: lost_nodes,
        jobs_lost,
        jobs_replaced,
        bundles,
        provisions,
        unmanaged,
    };
    (verdict, deps)
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
