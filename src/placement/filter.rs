//! The hard filter chain, in the spec's order: target-node pin, pool, tier,
//! recovery exclusion, reachable, cordoned, exclusive reservation,
//! capabilities, capacity, cores, host ports, GPU fit, exclusivity,
//! intra-replica rules, hard intra-replica AZ.
//!
//! A node either passes every filter (and gets the GPU device chosen for the
//! job) or is rejected by the first that fails, with a typed [`Rejection`]
//! carrying the numbers behind it (needed vs free). Nothing here allocates:
//! the chain runs for every node of a tier on every placement.

use serde::Serialize;

use crate::model::{HostPort, NodePhase};

use super::fleet::{FleetView, GpuDevice, Name, NodeEntry, NodeIdx};
use super::request::{Demand, GpuAsk};

/// Tolerance for comparing fractional capacities, so that jobs summing to
/// exactly a node's capacity (0.1 + 0.2 + 0.7) fit.
pub(crate) const CAPACITY_EPSILON: f64 = 1e-9;

/// The filters, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Filter {
    /// Only the pinned target node.
    TargetNode,
    /// Only nodes of the replica's pool.
    Pool,
    /// Only nodes of the tier being walked.
    Tier,
    /// Not a node the recovery or migration excludes.
    RecoveryExclusion,
    /// Advertising an inventory, not stopping or stopped, not unhealthy.
    Reachable,
    /// Not cordoned.
    Cordoned,
    /// Not an unconsumed spare exclusively reserved for other templates.
    ExclusiveReservation,
    /// Every required capability advertised.
    Capabilities,
    /// Enough free capacity.
    Capacity,
    /// Enough free cores.
    Cores,
    /// No required host port already claimed.
    HostPorts,
    /// A GPU device with enough free capacity (and the model asked for).
    GpuFit,
    /// Exclusive jobs alone with their co-located peers.
    Exclusivity,
    /// `coLocateWith`, `separateFrom`, `sameNodeDefault`.
    IntraReplica,
    /// `intraReplicaPlacement.sameAz: hard`.
    IntraReplicaAz,
}

/// Why a node was rejected, with the numbers behind it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "reason", rename_all = "camelCase")]
pub enum Rejection {
    /// The job is pinned to another node.
    NotTargetNode,
    /// The node belongs to another pool (or none).
    #[serde(rename_all = "camelCase")]
    OtherPool {
        /// The node's pool.
        node_pool: Option<Name>,
    },
    /// The node belongs to another tier (or none the pool knows).
    #[serde(rename_all = "camelCase")]
    OtherTier {
        /// The node's tier.
        node_tier: Option<Name>,
    },
    /// The recovery or migration excludes the node.
    ExcludedByRecovery,
    /// The node advertises no inventory, so it is invisible to placement.
    NoInventory,
    /// The node is stopping or stopped.
    NotRunning {
        /// Its phase.
        phase: NodePhase,
    },
    /// The node is excluded after repeated rejections.
    Unhealthy,
    /// No new placements land on a cordoned node.
    Cordoned,
    /// An unconsumed spare exclusively reserved for other templates, and
    /// `overrideReservation` is not set.
    ReservedForOtherTemplates,
    /// A required capability the node does not advertise.
    MissingCapability {
        /// The first one missing.
        capability: Name,
    },
    /// Not enough free capacity (`total × utilizationCap − reserved`).
    InsufficientCapacity {
        /// What the job (or its group) needs.
        needed: f64,
        /// What the node has free.
        free: f64,
    },
    /// Not enough free cores.
    InsufficientCores {
        /// Cores needed.
        needed: u32,
        /// Cores free.
        free: u32,
    },
    /// A required host port another job already claimed on the node.
    HostPortTaken {
        /// The port.
        port: HostPort,
    },
    /// No GPU device (of the model asked for) has enough free capacity.
    #[serde(rename_all = "camelCase")]
    NoGpuFits {
        /// The fraction of a device that did not fit.
        needed: f64,
        /// The most any suitable device has free (0 with none).
        largest_free: f64,
    },
    /// An exclusive job needs a node without other jobs.
    #[serde(rename_all = "camelCase")]
    NodeNotEmpty {
        /// Jobs on the node that are not co-located peers.
        other_jobs: u32,
    },
    /// Another job holds the node exclusively.
    HeldExclusively,
    /// A co-located peer is placed on another node.
    AwayFromCoLocatedPeer {
        /// The peer.
        peer: Name,
    },
    /// The node holds a job this one must be kept apart from.
    HostsSeparatedPeer {
        /// The peer.
        peer: Name,
    },
    /// `sameAz: hard` and the node is not in the AZ of the placed peers.
    #[serde(rename_all = "camelCase")]
    OutsidePeerAz {
        /// The peers' AZ (unknown while their node is prospective).
        peer_az: Option<Name>,
        /// The node's AZ.
        node_az: Option<Name>,
    },
}

impl Rejection {
    /// The filter that produced this rejection.
    pub fn filter(&self) -> Filter {
        match self {
            Rejection::NotTargetNode => Filter::TargetNode,
            Rejection::OtherPool { .. } => Filter::Pool,
            Rejection::OtherTier { .. } => Filter::Tier,
            Rejection::ExcludedByRecovery => Filter::RecoveryExclusion,
            Rejection::NoInventory | Rejection::NotRunning { .. } | Rejection::Unhealthy => Filter::Reachable,
            Rejection::Cordoned => Filter::Cordoned,
            Rejection::ReservedForOtherTemplates => Filter::ExclusiveReservation,
            Rejection::MissingCapability { .. } => Filter::Capabilities,
            Rejection::InsufficientCapacity { .. } => Filter::Capacity,
            Rejection::InsufficientCores { .. } => Filter::Cores,
            Rejection::HostPortTaken { .. } => Filter::HostPorts,
            Rejection::NoGpuFits { .. } => Filter::GpuFit,
            Rejection::NodeNotEmpty { .. } | Rejection::HeldExclusively => Filter::Exclusivity,
            Rejection::AwayFromCoLocatedPeer { .. } | Rejection::HostsSeparatedPeer { .. } => Filter::IntraReplica,
            Rejection::OutsidePeerAz { .. } => Filter::IntraReplicaAz,
        }
    }
}

/// Runs the chain for node `idx` while walking tier `tier` of the demand's
/// pool. On success returns the GPU device chosen for the job, if it asked
/// for one.
pub(crate) fn check(
    view: &FleetView,
    idx: NodeIdx,
    demand: &Demand<'_>,
    tier: usize,
) -> Result<Option<u32>, Rejection> {
    let node = view.node(idx);
    if demand.pin.is_some_and(|pin| pin != Some(idx)) {
        return Err(Rejection::NotTargetNode);
    }
    let slot = node.slot.map(|(p, t)| (p as usize, t as usize));
    if slot.map(|(p, _)| p) != Some(demand.pool) {
        return Err(Rejection::OtherPool {
            node_pool: node.pool_name.clone(),
        });
    }
    if slot.map(|(_, t)| t) != Some(tier) {
        return Err(Rejection::OtherTier {
            node_tier: node.tier_name.clone(),
        });
    }
    if demand.excluded.contains(&idx) {
        return Err(Rejection::ExcludedByRecovery);
    }
    reachable(node)?;
    if node.cordoned {
        return Err(Rejection::Cordoned);
    }
    if node.is_unconsumed_spare()
        && node.reservation_exclusive
        && !node.reserved_for.is_empty()
        && !demand.request.override_reservation
        && !node.reserved_for.contains(&demand.job.template)
    {
        return Err(Rejection::ReservedForOtherTemplates);
    }
    if let Some((_, name)) = demand
        .needs
        .capabilities
        .iter()
        .find(|(id, _)| !id.is_some_and(|id| node.capabilities.contains(id)))
    {
        return Err(Rejection::MissingCapability {
            capability: name.clone(),
        });
    }
    let needs = &demand.needs;
    let free = node.free_capacity();
    if needs.capacity > free + CAPACITY_EPSILON {
        return Err(Rejection::InsufficientCapacity {
            needed: needs.capacity,
            free,
        });
    }
    if needs.cores > 0 && needs.cores > node.free_cores() {
        return Err(Rejection::InsufficientCores {
            needed: needs.cores,
            free: node.free_cores(),
        });
    }
    if let Some(&port) = needs.ports.iter().find(|p| node.ports.contains(p)) {
        return Err(Rejection::HostPortTaken { port });
    }
    let gpu_index = fit_gpus(&node.gpus, &needs.gpu_asks)
        .map_err(|(needed, largest_free)| Rejection::NoGpuFits { needed, largest_free })?;
    exclusivity(view, node, demand)?;
    intra_replica(idx, demand)?;
    hard_az(view, idx, demand)?;
    Ok(if demand.own_gpu { gpu_index } else { None })
}

fn reachable(node: &NodeEntry) -> Result<(), Rejection> {
    if !node.has_inventory {
        return Err(Rejection::NoInventory);
    }
    if matches!(node.phase, NodePhase::Stopping | NodePhase::Stopped) {
        return Err(Rejection::NotRunning { phase: node.phase });
    }
    if node.unhealthy {
        return Err(Rejection::Unhealthy);
    }
    Ok(())
}

/// "`exclusive: true` gives a job a node of its own (co-located peers
/// excepted)": an exclusive demand needs a node holding only its peers, and
/// a node holding an exclusive job takes only that job's peers.
fn exclusivity(view: &FleetView, node: &NodeEntry, demand: &Demand<'_>) -> Result<(), Rejection> {
    if !demand.needs.exclusive && node.exclusive_occupants == 0 {
        return Ok(());
    }
    let occupants = node.occupants.iter().map(|&o| &view.occupants[o as usize]);
    let mut other_jobs = 0;
    let mut held = false;
    for occupant in occupants {
        if !demand.is_group_peer(occupant.bundle.as_ref(), occupant.replica, occupant.job_name.as_str()) {
            other_jobs += 1;
            held |= occupant.exclusive;
        }
    }
    if demand.needs.exclusive && other_jobs > 0 {
        return Err(Rejection::NodeNotEmpty { other_jobs });
    }
    if held {
        return Err(Rejection::HeldExclusively);
    }
    Ok(())
}

fn intra_replica(idx: NodeIdx, demand: &Demand<'_>) -> Result<(), Rejection> {
    if let Some(peer) = &demand.co_located_with
        && peer.node != idx
    {
        return Err(Rejection::AwayFromCoLocatedPeer {
            peer: peer.name.clone(),
        });
    }
    if let Some(peer) = demand.separated_from.iter().find(|p| p.node == idx) {
        return Err(Rejection::HostsSeparatedPeer {
            peer: peer.name.clone(),
        });
    }
    Ok(())
}

fn hard_az(view: &FleetView, idx: NodeIdx, demand: &Demand<'_>) -> Result<(), Rejection> {
    if demand.same_az != crate::model::IntraReplicaAz::Hard {
        return Ok(());
    }
    match demand.peers.iter().find(|p| !same_az(view, idx, p.node)) {
        Some(peer) => Err(Rejection::OutsidePeerAz {
            peer_az: view.node(peer.node).az.map(|az| view.azs.name(az).clone()),
            node_az: view.node(idx).az.map(|az| view.azs.name(az).clone()),
        }),
        None => Ok(()),
    }
}

/// Two nodes share an AZ when they are the same node or both advertise the
/// same AZ; an unknown AZ (a prospective node) matches nothing else.
pub(crate) fn same_az(view: &FleetView, a: NodeIdx, b: NodeIdx) -> bool {
    a == b || view.node(a).az.is_some_and(|az| view.node(b).az == Some(az))
}

/// Fits every GPU ask onto the devices, each device's free capacity derived
/// from the jobs placed on it. One ask takes the suitable device with the
/// least free capacity that fits (lowest index on a tie), keeping whole
/// devices for larger asks; several (a co-located group's first mover) are
/// fitted largest first the same way. Returns the device of the first ask,
/// or `(needed, largest free)` for the ask that did not fit.
pub(crate) fn fit_gpus(devices: &[GpuDevice], asks: &[GpuAsk]) -> Result<Option<u32>, (f64, f64)> {
    match asks {
        [] => Ok(None),
        [ask] => best_fit(devices.iter().map(GpuDevice::free), devices, ask).map(Some),
        _ => {
            let mut free: Vec<f64> = devices.iter().map(GpuDevice::free).collect();
            let mut order: Vec<usize> = (0..asks.len()).collect();
            order.sort_by(|&a, &b| asks[b].capacity.total_cmp(&asks[a].capacity));
            let mut first = None;
            for i in order {
                let device = best_fit(free.iter().copied(), devices, &asks[i])?;
                free[device as usize] -= asks[i].capacity;
                if i == 0 {
                    first = Some(device);
                }
            }
            Ok(first)
        }
    }
}

fn best_fit(free: impl Iterator<Item = f64>, devices: &[GpuDevice], ask: &GpuAsk) -> Result<u32, (f64, f64)> {
    let mut best: Option<(u32, f64)> = None;
    let mut largest_free: f64 = 0.0;
    for (i, (free, device)) in free.zip(devices).enumerate() {
        if ask.model.as_deref().is_some_and(|m| m != device.model.as_str()) {
            continue;
        }
        largest_free = largest_free.max(free);
        if ask.capacity <= free + CAPACITY_EPSILON && best.is_none_or(|(_, b)| free < b) {
            best = Some((i as u32, free));
        }
    }
    best.map(|(i, _)| i).ok_or((ask.capacity, largest_free))
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |n: &Option<Name>| n.as_ref().map_or_else(|| "none".to_owned(), Name::to_string);
        match self {
            Rejection::NotTargetNode => write!(f, "not the pinned target node"),
            Rejection::OtherPool { node_pool } => write!(f, "in pool {}", name(node_pool)),
            Rejection::OtherTier { node_tier } => write!(f, "in tier {}", name(node_tier)),
            Rejection::ExcludedByRecovery => write!(f, "excluded by the recovery"),
            Rejection::NoInventory => write!(f, "advertises no inventory"),
            Rejection::NotRunning { phase } => write!(f, "{phase:?}"),
            Rejection::Unhealthy => write!(f, "unhealthy"),
            Rejection::Cordoned => write!(f, "cordoned"),
            Rejection::ReservedForOtherTemplates => write!(f, "spare exclusively reserved for other templates"),
            Rejection::MissingCapability { capability } => write!(f, "lacks capability {capability}"),
            Rejection::InsufficientCapacity { needed, free } => write!(f, "needs {needed} vCPU, {free} free"),
            Rejection::InsufficientCores { needed, free } => write!(f, "needs {needed} cores, {free} free"),
            Rejection::HostPortTaken { port } => write!(f, "host port {port} taken"),
            Rejection::NoGpuFits { needed, largest_free } => {
                write!(f, "needs {needed} of a GPU, largest free {largest_free}")
            }
            Rejection::NodeNotEmpty { other_jobs } => write!(f, "exclusive job, {other_jobs} other jobs on node"),
            Rejection::HeldExclusively => write!(f, "held exclusively by another job"),
            Rejection::AwayFromCoLocatedPeer { peer } => write!(f, "co-located peer {peer} is elsewhere"),
            Rejection::HostsSeparatedPeer { peer } => write!(f, "hosts {peer}, which must be kept apart"),
            Rejection::OutsidePeerAz { peer_az, node_az } => {
                write!(f, "in AZ {}, peers in {}", name(node_az), name(peer_az))
            }
        }
    }
}
