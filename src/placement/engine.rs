//! The engine: walks the replica's pool tier by tier, cheapest first; in
//! each tier runs every node through the filter chain and takes the best
//! survivor by [`PlacementKey`]; when none survives, provisions from the
//! first fitting candidate shape if the tier is elastic and under
//! `maxNodes` (a pinned target never provisions); when every tier is
//! exhausted the answer is `noCapacityInAnyPool`.
//!
//! With the trace on every node of the fleet is run through the chain, so
//! the trace can give each one's verdict. With it off only the nodes that
//! can win are visited: just the pinned node, or the co-located peer's
//! node, or what the candidate index yields for the tier (see
//! `placement::search`). Every node skipped would have been rejected or
//! outranked, so the result is the same as the traced walk's.

use std::collections::HashMap;

use serde::Serialize;

use crate::model::{
    BundleId, InstanceShape, IntraReplicaAz, NodeId, PackingStrategy, PlacedJob, PlacementTier, Reliability, ScaleOut,
    runtime_job_id,
};

use super::PlacementError;
use super::filter::{CAPACITY_EPSILON, check, fit_gpus};
use super::fleet::{FleetError, FleetView, GpuDevice, Name, NodeIdx, flag};
use super::key::{SAME_AZ, SAME_CLOUD, SAME_NODE, key, resilience_violations};
use super::rankings::Rankings;
use super::request::{Demand, Needs, PlacementRequest};
use super::search::{Best, Scratch, best_in_tier};
use super::trace::{NoProvisionReason, NodeTrace, TierDecision, TierTrace, Trace, Verdict};

/// Where the job goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Onto an existing (or already prospective) node.
    Placed {
        node_id: NodeId,
        pool: String,
        tier: String,
        /// The GPU device chosen, when the job asks for GPU capacity.
        gpu_index: Option<u32>,
    },
    /// Onto a node to be provisioned.
    Provision {
        /// The prospective node's id.
        node_id: NodeId,
        pool: String,
        /// The tier provisioned from.
        tier: String,
        /// The first candidate shape that fits.
        instance_type: String,
        /// The GPU device chosen on the shape, when the job asks for one.
        gpu_index: Option<u32>,
    },
    /// No tier of the pool could place or provision.
    NoCapacityInAnyPool,
}

/// Where an [`Outcome`] puts the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Destination<'a> {
    /// The node (prospective, for a provision).
    pub node_id: &'a NodeId,
    /// The pool placed into.
    pub pool: &'a str,
    /// The tier placed into.
    pub tier: &'a str,
    /// The shape to provision the node from; `None` when the node exists
    /// (or is already prospective).
    pub instance_type: Option<&'a str>,
    /// The GPU device chosen, when the job asks for GPU capacity.
    pub gpu_index: Option<u32>,
}

impl Outcome {
    /// Where the job goes; `None` when no tier could place or provision it.
    pub fn destination(&self) -> Option<Destination<'_>> {
        let (node_id, pool, tier, gpu_index, instance_type) = match self {
            Self::Placed {
                node_id,
                pool,
                tier,
                gpu_index,
            } => (node_id, pool, tier, gpu_index, None),
            Self::Provision {
                node_id,
                pool,
                tier,
                gpu_index,
                instance_type,
            } => (node_id, pool, tier, gpu_index, Some(instance_type.as_str())),
            Self::NoCapacityInAnyPool => return None,
        };
        Some(Destination {
            node_id,
            pool,
            tier,
            instance_type,
            gpu_index: *gpu_index,
        })
    }
}

/// A resilience flag a backup violated (`onResilienceDegraded`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ResilienceFlag {
    /// On the primary's node.
    SameNode,
    /// In the primary's AZ.
    SameAz,
    /// In the primary's cloud.
    SameCloud,
}

/// How far a placement falls short of the bundle's resilience policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResilienceReport {
    /// `forbid` flags the backup violates (best-effort placement).
    pub violations: Vec<ResilienceFlag>,
    /// The primary sits on interruptible capacity and the backup is not on
    /// durable capacity.
    pub interruptible_primary_without_durable_backup: bool,
}

impl ResilienceReport {
    /// Whether `onResilienceDegraded` should fire.
    pub fn is_degraded(&self) -> bool {
        !self.violations.is_empty() || self.interruptible_primary_without_durable_backup
    }
}

/// The result of one placement.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Where the job goes.
    pub outcome: Outcome,
    /// Resilience degradation of the choice.
    pub resilience: ResilienceReport,
    /// The trace, when asked for.
    pub trace: Option<Trace>,
}

/// Names prospective nodes. `plan` uses [`SequentialNodeIds`]; the core
/// supplies its own deterministic ids.
pub trait ProspectiveNodeIds {
    /// An id for a node about to be provisioned in `pool`/`tier`, not yet
    /// held by `view`.
    fn prospective_node_id(&mut self, view: &FleetView, pool: &str, tier: &str) -> NodeId;
}

/// `<pool>-<tier>-<n>`, counting per tier from 1 and skipping ids the fleet
/// already holds.
#[derive(Clone, Debug, Default)]
pub struct SequentialNodeIds {
    next: HashMap<(String, String), u32>,
}

impl ProspectiveNodeIds for SequentialNodeIds {
    fn prospective_node_id(&mut self, view: &FleetView, pool: &str, tier: &str) -> NodeId {
        let counter = self.next.entry((pool.to_owned(), tier.to_owned())).or_insert(0);
        loop {
            *counter += 1;
            let id = NodeId(format!("{pool}-{tier}-{counter}"));
            if !view.contains(&id) {
                return id;
            }
        }
    }
}

/// Places one job (see the module docs).
pub fn place(
    view: &FleetView,
    request: PlacementRequest<'_>,
    ids: &mut dyn ProspectiveNodeIds,
) -> Result<Placement, PlacementError> {
    place_with(view, request, ids, &mut Scratch::default())
}

/// Places one job of a burst: the same decision as [`place`], with what
/// the burst keeps between its placements in `rankings` (see [`Rankings`]).
pub fn place_ranked(
    view: &FleetView,
    request: PlacementRequest<'_>,
    ids: &mut dyn ProspectiveNodeIds,
    rankings: &mut Rankings,
) -> Result<Placement, PlacementError> {
    place_with(view, request, ids, &mut rankings.scratch)
}

fn place_with(
    view: &FleetView,
    request: PlacementRequest<'_>,
    ids: &mut dyn ProspectiveNodeIds,
    scratch: &mut Scratch,
) -> Result<Placement, PlacementError> {
    let demand = Demand::compile(view, request)?;
    let pool = view
        .pools()
        .at(demand.pool)
        .ok_or_else(|| PlacementError::UnknownPool {
            pool: request.bundle.pool_for_replica(request.replica_index).to_owned(),
        })?;
    let mut trace = request.trace.then(Trace::default);
    for (t, tier) in pool.tiers.iter().enumerate() {
        scratch.podium.clear();
        let mut nodes = Vec::new();
        let best = if trace.is_some() {
            rank_traced(view, &demand, t, tier.packing_strategy, &mut nodes)
        } else {
            match candidates(&demand) {
                Some(few) => rank(view, &demand, few, t, tier.packing_strategy),
                None => best_in_tier(view, &demand, t, tier.packing_strategy, scratch),
            }
        };
        let mut record = |decision: TierDecision, nodes: Vec<NodeTrace>| {
            if let Some(trace) = trace.as_mut() {
                trace.tiers.push(TierTrace {
                    pool: pool.name.clone(),
                    tier: tier.name.clone(),
                    nodes,
                    decision,
                });
            }
        };
        if let Some(best) = best {
            let node_id = view.node(best.idx).id.clone();
            record(
                TierDecision::Placed {
                    node_id: node_id.clone(),
                },
                nodes,
            );
            return Ok(Placement {
                outcome: Outcome::Placed {
                    node_id,
                    pool: pool.name.clone(),
                    tier: tier.name.clone(),
                    gpu_index: best.gpu_index,
                },
                resilience: resilience_report(view, &demand, Chosen::Node(best.idx)),
                trace,
            });
        }
        match provisioning(view, &demand, t, tier) {
            Ok(shape) => {
                record(
                    TierDecision::Provision {
                        instance_type: shape.instance_type.clone(),
                    },
                    nodes,
                );
                let gpu_index = if demand.own_gpu {
                    fit_gpus(&shape_gpus(shape), &demand.needs.gpu_asks).ok().flatten()
                } else {
                    None
                };
                return Ok(Placement {
                    outcome: Outcome::Provision {
                        node_id: ids.prospective_node_id(view, &pool.name, &tier.name),
                        pool: pool.name.clone(),
                        tier: tier.name.clone(),
                        instance_type: shape.instance_type.clone(),
                        gpu_index,
                    },
                    resilience: resilience_report(view, &demand, Chosen::NewNode(tier)),
                    trace,
                });
            }
            Err(why) => record(TierDecision::NotProvisioned { why }, nodes),
        }
    }
    Ok(Placement {
        outcome: Outcome::NoCapacityInAnyPool,
        resilience: ResilienceReport::default(),
        trace,
    })
}

/// Applies a placement to the view: a provision adds its prospective node,
/// then the job is reserved where it went. Later placements see both.
/// Returns the reservation made: none when the outcome places nowhere (or
/// the bundle has no such job).
pub fn apply_placement(
    view: &mut FleetView,
    request: &PlacementRequest<'_>,
    outcome: &Outcome,
) -> Result<Option<PlacedJob>, FleetError> {
    let Some(to) = outcome.destination() else {
        return Ok(None);
    };
    if let Some(instance_type) = to.instance_type {
        view.add_prospective_node(to.node_id.clone(), to.pool, to.tier, instance_type)?;
    }
    let Some(job) = request.bundle.job(request.job_name) else {
        return Ok(None);
    };
    let placed = placed_job(request.bundle_id, request.replica_index, job, to.gpu_index);
    view.reserve(to.node_id, &placed)?;
    Ok(Some(placed))
}

/// The reservation a bundle job makes on its node.
pub fn placed_job(
    bundle_id: &BundleId,
    replica_index: u32,
    job: &crate::model::JobSpec,
    gpu_index: Option<u32>,
) -> PlacedJob {
    let needs = &job.requirements;
    PlacedJob {
        job_id: runtime_job_id(bundle_id, replica_index, &job.job_name),
        bundle: Some(bundle_id.clone()),
        replica_index,
        job_name: job.job_name.clone(),
        template: job.template.clone(),
        required_capacity: needs.required_capacity,
        required_cores: needs.required_cores,
        required_host_ports: needs.required_host_ports.clone(),
        required_gpu_capacity: needs.required_gpu_capacity,
        gpu_index,
        exclusive: job.exclusive,
    }
}

/// The only nodes that can take the job, when a rule names them: the
/// pinned node, or the placed co-located peer's node.
pub(super) fn candidates<'s>(demand: &'s Demand<'_>) -> Option<&'s [NodeIdx]> {
    match (&demand.pin, &demand.co_located_with) {
        (Some(Some(idx)), _) => Some(std::slice::from_ref(idx)),
        (Some(None), _) => Some(&[]),
        (None, Some(peer)) => Some(std::slice::from_ref(&peer.node)),
        (None, None) => None,
    }
}

fn rank(
    view: &FleetView,
    demand: &Demand<'_>,
    candidates: &[NodeIdx],
    tier: usize,
    packing: PackingStrategy,
) -> Option<Best> {
    let mut best: Option<Best> = None;
    for &idx in candidates {
        let Ok(gpu_index) = check(view, idx, demand, tier) else {
            continue;
        };
        let key = key(view, idx, demand, packing);
        if best.as_ref().is_none_or(|b| key < b.key) {
            best = Some(Best { key, idx, gpu_index });
        }
    }
    best
}

fn rank_traced(
    view: &FleetView,
    demand: &Demand<'_>,
    tier: usize,
    packing: PackingStrategy,
    nodes: &mut Vec<NodeTrace>,
) -> Option<Best> {
    let mut best: Option<Best> = None;
    nodes.reserve(view.order.len());
    for &idx in &view.order {
        let node_id = view.node(idx).id.clone();
        match check(view, idx, demand, tier) {
            Err(rejection) => nodes.push(NodeTrace {
                node_id,
                verdict: Verdict::Rejected {
                    filter: rejection.filter(),
                    rejection: rejection.explain(view, idx, demand),
                },
            }),
            Ok(gpu_index) => {
                let key = key(view, idx, demand, packing);
                nodes.push(NodeTrace {
                    node_id,
                    verdict: Verdict::Survived { key },
                });
                if best.as_ref().is_none_or(|b| key < b.key) {
                    best = Some(Best { key, idx, gpu_index });
                }
            }
        }
    }
    best
}

/// Whether tier `t` provisions for the demand, and which shape.
pub(super) fn provisioning<'p>(
    view: &FleetView,
    demand: &Demand<'_>,
    t: usize,
    tier: &'p PlacementTier,
) -> Result<&'p InstanceShape, NoProvisionReason> {
    if demand.pin.is_some() {
        return Err(NoProvisionReason::PinnedTarget);
    }
    if tier.scale_out == ScaleOut::Fixed {
        return Err(NoProvisionReason::FixedTier);
    }
    if demand.co_located_with.is_some() {
        return Err(NoProvisionReason::CoLocatedPeerPlaced);
    }
    if demand.same_az == IntraReplicaAz::Hard && !demand.peers.is_empty() {
        return Err(NoProvisionReason::PeerAzUnknownForNewNode);
    }
    if view.provisioning_withheld(demand.pool, t) {
        return Err(NoProvisionReason::CapacityLost);
    }
    if let Some(max_nodes) = tier.max_nodes {
        let nodes = view.counted_tier_nodes(demand.pool, t);
        if nodes >= max_nodes {
            return Err(NoProvisionReason::AtMaxNodes { nodes, max_nodes });
        }
    }
    tier.candidate_instance_types
        .iter()
        .find(|shape| shape_fits(shape, &demand.needs))
        .ok_or(NoProvisionReason::NoShapeFits)
}

/// Why each tier of the replica's pool refuses the job, when no node of
/// any tier takes it: the per-tier decisions of a placement that found
/// `noCapacityInAnyPool`, without scanning the nodes (the untraced
/// placement already showed none survives).
pub(crate) fn tier_refusals(
    view: &FleetView,
    request: PlacementRequest<'_>,
) -> Result<Vec<(String, String, NoProvisionReason)>, PlacementError> {
    let demand = Demand::compile(view, request)?;
    let Some(pool) = view.pools().at(demand.pool) else {
        return Ok(Vec::new());
    };
    Ok(pool
        .tiers
        .iter()
        .enumerate()
        .filter_map(|(t, tier)| {
            let why = provisioning(view, &demand, t, tier).err()?;
            Some((pool.name.clone(), tier.name.clone(), why))
        })
        .collect())
}

/// Whether a fresh node of `shape` would take `needs` (a first mover's
/// whole group).
pub(crate) fn shape_fits(shape: &InstanceShape, needs: &Needs) -> bool {
    needs.capacity <= shape.total_capacity + CAPACITY_EPSILON
        && needs.cores <= shape.total_cores
        && needs
            .capabilities
            .iter()
            .all(|(_, name)| shape.capabilities.iter().any(|c| c == name.as_str()))
        && fit_gpus(&shape_gpus(shape), &needs.gpu_asks).is_ok()
}

fn shape_gpus(shape: &InstanceShape) -> Vec<GpuDevice> {
    shape
        .gpus
        .iter()
        .map(|g| GpuDevice {
            model: Name::from(g.model.as_str()),
            total: g.total_capacity,
            used: 0.0,
        })
        .collect()
}

enum Chosen<'p> {
    Node(NodeIdx),
    NewNode(&'p PlacementTier),
}

fn resilience_report(view: &FleetView, demand: &Demand<'_>, chosen: Chosen<'_>) -> ResilienceReport {
    let Some(resilience) = &demand.resilience else {
        return ResilienceReport::default();
    };
    if resilience.other_replica.is_empty() {
        return ResilienceReport::default();
    }
    let (bits, chosen_durable) = match chosen {
        Chosen::Node(idx) => (
            resilience_violations(view, idx, demand),
            view.hot(idx).has(flag::DURABLE),
        ),
        // A new node shares no node and no known AZ with the primary; only
        // its provider can already be told.
        Chosen::NewNode(tier) => {
            let same_cloud =
                resilience.same_cloud && resilience.other_replica.iter().any(|&o| view.hot(o).kind == tier.kind);
            (
                if same_cloud { SAME_CLOUD } else { 0 },
                tier.effective_reliability() == Reliability::Durable,
            )
        }
    };
    let others_durable = resilience.other_replica.iter().all(|&o| view.hot(o).has(flag::DURABLE));
    let (primary_durable, backup_durable) = if demand.request.replica_index == 0 {
        (chosen_durable, others_durable)
    } else {
        (others_durable, chosen_durable)
    };
    let violations = [
        (SAME_NODE, ResilienceFlag::SameNode),
        (SAME_AZ, ResilienceFlag::SameAz),
        (SAME_CLOUD, ResilienceFlag::SameCloud),
    ]
    .into_iter()
    .filter(|(bit, _)| bits & bit != 0)
    .map(|(_, flag)| flag)
    .collect();
    ResilienceReport {
        violations,
        interruptible_primary_without_durable_backup: !primary_durable && !backup_durable,
    }
}
