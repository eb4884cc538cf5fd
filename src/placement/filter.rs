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

use crate::model::{HostPort, IntraReplicaAz, NodePhase};

use super::fleet::{FleetView, GpuDevice, Hot, NO_AZ, NO_SLOT, Name, NodeIdx, flag};
use super::request::{Demand, GpuAsk, Needs};

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
pub type Rejection = RejectionOf<Name>;

/// A [`Rejection`] whose names are of type `N`. The chain itself produces
/// `RejectionOf<Lazy>`, whose names are references resolved only when a
/// trace is recorded: cloning a shared name per rejected node would cost an
/// atomic operation on the hot path.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "reason", rename_all = "camelCase")]
pub enum RejectionOf<N> {
    /// The job is pinned to another node.
    NotTargetNode,
    /// The node belongs to another pool (or none).
    #[serde(rename_all = "camelCase")]
    OtherPool {
        /// The node's pool.
        node_pool: Option<N>,
    },
    /// The node belongs to another tier (or none the pool knows).
    #[serde(rename_all = "camelCase")]
    OtherTier {
        /// The node's tier.
        node_tier: Option<N>,
    },
    /// The recovery or migration excludes the node.
    ExcludedByRecovery,
    /// The node advertises no inventory, so it is invisible to placement.
    NoInventory,
    /// The node is stopping or stopped.
    NotRunning { phase: NodePhase },
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
        capability: N,
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
    HostPortTaken { port: HostPort },
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
    AwayFromCoLocatedPeer { peer: N },
    /// The node holds a job this one must be kept apart from.
    HostsSeparatedPeer { peer: N },
    /// `sameAz: hard` and the node is not in the AZ of the placed peers.
    #[serde(rename_all = "camelCase")]
    OutsidePeerAz {
        /// The peers' AZ (unknown while their node is prospective).
        peer_az: Option<N>,
        /// The node's AZ.
        node_az: Option<N>,
    },
}

impl<N> RejectionOf<N> {
    /// Whether the rejection still stands once the node holds more jobs
    /// (and none fewer): it reads the node's description, its room or its
    /// claims, never where a peer is.
    pub(crate) fn stands_with_more_jobs(&self) -> bool {
        use RejectionOf::*;
        matches!(
            self,
            NotTargetNode
                | OtherPool { .. }
                | OtherTier { .. }
                | ExcludedByRecovery
                | NoInventory
                | NotRunning { .. }
                | Unhealthy
                | Cordoned
                | MissingCapability { .. }
                | InsufficientCapacity { .. }
                | InsufficientCores { .. }
                | HostPortTaken { .. }
                | NoGpuFits { .. }
                | NodeNotEmpty { .. }
                | HeldExclusively
        )
    }

    /// The filter that produced this rejection.
    pub fn filter(&self) -> Filter {
        match self {
            RejectionOf::NotTargetNode => Filter::TargetNode,
            RejectionOf::OtherPool { .. } => Filter::Pool,
            RejectionOf::OtherTier { .. } => Filter::Tier,
            RejectionOf::ExcludedByRecovery => Filter::RecoveryExclusion,
            RejectionOf::NoInventory | RejectionOf::NotRunning { .. } | RejectionOf::Unhealthy => Filter::Reachable,
            RejectionOf::Cordoned => Filter::Cordoned,
            RejectionOf::ReservedForOtherTemplates => Filter::ExclusiveReservation,
            RejectionOf::MissingCapability { .. } => Filter::Capabilities,
            RejectionOf::InsufficientCapacity { .. } => Filter::Capacity,
            RejectionOf::InsufficientCores { .. } => Filter::Cores,
            RejectionOf::HostPortTaken { .. } => Filter::HostPorts,
            RejectionOf::NoGpuFits { .. } => Filter::GpuFit,
            RejectionOf::NodeNotEmpty { .. } | RejectionOf::HeldExclusively => Filter::Exclusivity,
            RejectionOf::AwayFromCoLocatedPeer { .. } | RejectionOf::HostsSeparatedPeer { .. } => Filter::IntraReplica,
            RejectionOf::OutsidePeerAz { .. } => Filter::IntraReplicaAz,
        }
    }
}

/// A name a rejection refers to, resolved only for the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lazy {
    /// The rejected node's pool.
    NodePool,
    /// The rejected node's tier.
    NodeTier,
    /// The rejected node's AZ.
    NodeAz,
    /// The demand's capability at this position.
    Capability(usize),
    /// The placed co-located peer.
    CoLocatedPeer,
    /// The separated peer at this position.
    SeparatedPeer(usize),
    /// The AZ of the placed peer at this position.
    PeerAz(usize),
}

impl Lazy {
    fn resolve(self, view: &FleetView, idx: NodeIdx, demand: &Demand<'_>) -> Option<Name> {
        let az = |node: NodeIdx| view.hot(node).az().map(|az| view.azs.name(az).clone());
        match self {
            Lazy::NodePool => view.node(idx).pool_name.clone(),
            Lazy::NodeTier => view.node(idx).tier_name.clone(),
            Lazy::NodeAz => az(idx),
            Lazy::Capability(i) => demand.needs.capabilities.get(i).map(|(_, name)| name.clone()),
            Lazy::CoLocatedPeer => demand.co_located_with.as_ref().map(|p| p.name.clone()),
            Lazy::SeparatedPeer(i) => demand.separated_from.get(i).map(|p| p.name.clone()),
            Lazy::PeerAz(i) => demand.peers.get(i).and_then(|p| az(p.node)),
        }
    }
}

impl RejectionOf<Lazy> {
    /// The rejection with its names resolved, for the trace.
    pub(crate) fn explain(self, view: &FleetView, idx: NodeIdx, demand: &Demand<'_>) -> Rejection {
        let opt = |lazy: Option<Lazy>| lazy.and_then(|l| l.resolve(view, idx, demand));
        // Every reference points into the demand or the node it came from.
        let name = |lazy: Lazy| lazy.resolve(view, idx, demand).unwrap_or_else(|| Name::from(""));
        match self {
            RejectionOf::NotTargetNode => Rejection::NotTargetNode,
            RejectionOf::OtherPool { node_pool } => Rejection::OtherPool {
                node_pool: opt(node_pool),
            },
            RejectionOf::OtherTier { node_tier } => Rejection::OtherTier {
                node_tier: opt(node_tier),
            },
            RejectionOf::ExcludedByRecovery => Rejection::ExcludedByRecovery,
            RejectionOf::NoInventory => Rejection::NoInventory,
            RejectionOf::NotRunning { phase } => Rejection::NotRunning { phase },
            RejectionOf::Unhealthy => Rejection::Unhealthy,
            RejectionOf::Cordoned => Rejection::Cordoned,
            RejectionOf::ReservedForOtherTemplates => Rejection::ReservedForOtherTemplates,
            RejectionOf::MissingCapability { capability } => Rejection::MissingCapability {
                capability: name(capability),
            },
            RejectionOf::InsufficientCapacity { needed, free } => Rejection::InsufficientCapacity { needed, free },
            RejectionOf::InsufficientCores { needed, free } => Rejection::InsufficientCores { needed, free },
            RejectionOf::HostPortTaken { port } => Rejection::HostPortTaken { port },
            RejectionOf::NoGpuFits { needed, largest_free } => Rejection::NoGpuFits { needed, largest_free },
            RejectionOf::NodeNotEmpty { other_jobs } => Rejection::NodeNotEmpty { other_jobs },
            RejectionOf::HeldExclusively => Rejection::HeldExclusively,
            RejectionOf::AwayFromCoLocatedPeer { peer } => Rejection::AwayFromCoLocatedPeer { peer: name(peer) },
            RejectionOf::HostsSeparatedPeer { peer } => Rejection::HostsSeparatedPeer { peer: name(peer) },
            RejectionOf::OutsidePeerAz { peer_az, node_az } => Rejection::OutsidePeerAz {
                peer_az: opt(peer_az),
                node_az: opt(node_az),
            },
        }
    }
}

/// Runs the chain for node `idx` while walking tier `tier` of the demand's
/// pool. On success returns the GPU device chosen for the job, if it asked
/// for one. The node's hot part decides almost every node; its entry is read
/// only when a reason needs a name or a list must be searched.
pub(crate) fn check(
    view: &FleetView,
    idx: NodeIdx,
    demand: &Demand<'_>,
    tier: usize,
) -> Result<Option<u32>, RejectionOf<Lazy>> {
    let hot = view.hot(idx);
    if demand.pin.is_some_and(|pin| pin != Some(idx)) {
        return Err(RejectionOf::NotTargetNode);
    }
    if hot.slot == NO_SLOT || (hot.slot >> 16) as usize != demand.pool {
        return Err(RejectionOf::OtherPool {
            node_pool: Some(Lazy::NodePool),
        });
    }
    if (hot.slot & 0xffff) as usize != tier {
        return Err(RejectionOf::OtherTier {
            node_tier: Some(Lazy::NodeTier),
        });
    }
    if demand.excluded.contains(&idx) {
        return Err(RejectionOf::ExcludedByRecovery);
    }
    reachable(view, idx, hot)?;
    if hot.has(flag::CORDONED) {
        return Err(RejectionOf::Cordoned);
    }
    if hot.has(flag::EXCLUSIVE_RESERVATION)
        && hot.occupants == 0
        && !demand.request.override_reservation
        && !view.node(idx).reserved_for.contains(&demand.job.template)
    {
        return Err(RejectionOf::ReservedForOtherTemplates);
    }
    let needs = &demand.needs;
    if needs.capability_mask & !hot.capabilities != 0 || needs.wide_capabilities {
        capabilities(view, idx, hot, needs)?;
    }
    if needs.capacity > hot.free + CAPACITY_EPSILON {
        return Err(RejectionOf::InsufficientCapacity {
            needed: needs.capacity,
            free: hot.free,
        });
    }
    if needs.cores > 0 && needs.cores > hot.free_cores() {
        return Err(RejectionOf::InsufficientCores {
            needed: needs.cores,
            free: hot.free_cores(),
        });
    }
    // A clear bit proves every asked port free; otherwise search the list.
    if needs.port_mask & hot.ports != 0 {
        let claimed = &view.node(idx).ports;
        if let Some(&port) = needs.ports.iter().find(|p| claimed.contains(p)) {
            return Err(RejectionOf::HostPortTaken { port });
        }
    }
    let gpu_index = if needs.gpu_asks.is_empty() {
        None
    } else {
        fit_gpus(&view.node(idx).gpus, &needs.gpu_asks)
            .map_err(|(needed, largest_free)| RejectionOf::NoGpuFits { needed, largest_free })?
    };
    if needs.exclusive || hot.exclusive_occupants > 0 {
        exclusivity(view, idx, demand)?;
    }
    intra_replica(idx, demand)?;
    if demand.same_az == IntraReplicaAz::Hard {
        hard_az(view, idx, demand)?;
    }
    Ok(if demand.own_gpu { gpu_index } else { None })
}

fn reachable(view: &FleetView, idx: NodeIdx, hot: &Hot) -> Result<(), RejectionOf<Lazy>> {
    if !hot.has(flag::INVENTORY) {
        return Err(RejectionOf::NoInventory);
    }
    if hot.has(flag::GONE) {
        return Err(RejectionOf::NotRunning {
            phase: view.node(idx).phase,
        });
    }
    if hot.has(flag::UNHEALTHY) {
        return Err(RejectionOf::Unhealthy);
    }
    Ok(())
}

/// The first required capability the node lacks, in the order asked.
#[inline]
fn capabilities(view: &FleetView, idx: NodeIdx, hot: &Hot, needs: &Needs) -> Result<(), RejectionOf<Lazy>> {
    let held = |id: u32| {
        if id < 64 {
            hot.capabilities & (1 << id) != 0
        } else {
            view.node(idx).capabilities.contains(id)
        }
    };
    match needs.capabilities.iter().position(|(id, _)| !id.is_some_and(held)) {
        Some(i) => Err(RejectionOf::MissingCapability {
            capability: Lazy::Capability(i),
        }),
        None => Ok(()),
    }
}

/// "`exclusive: true` gives a job a node of its own (co-located peers
/// excepted)": an exclusive demand needs a node holding only its peers, and
/// a node holding an exclusive job takes only that job's peers.
fn exclusivity(view: &FleetView, idx: NodeIdx, demand: &Demand<'_>) -> Result<(), RejectionOf<Lazy>> {
    let mut other_jobs = 0;
    let mut held = false;
    for &o in &view.node(idx).occupants {
        let occupant = &view.occupants[o as usize];
        if !demand.is_group_peer(occupant.bundle.as_ref(), occupant.replica, occupant.job_name.as_str()) {
            other_jobs += 1;
            held |= occupant.exclusive;
        }
    }
    if demand.needs.exclusive && other_jobs > 0 {
        return Err(RejectionOf::NodeNotEmpty { other_jobs });
    }
    if held {
        return Err(RejectionOf::HeldExclusively);
    }
    Ok(())
}

fn intra_replica(idx: NodeIdx, demand: &Demand<'_>) -> Result<(), RejectionOf<Lazy>> {
    if demand.co_located_with.as_ref().is_some_and(|peer| peer.node != idx) {
        return Err(RejectionOf::AwayFromCoLocatedPeer {
            peer: Lazy::CoLocatedPeer,
        });
    }
    if let Some(i) = demand.separated_from.iter().position(|p| p.node == idx) {
        return Err(RejectionOf::HostsSeparatedPeer {
            peer: Lazy::SeparatedPeer(i),
        });
    }
    Ok(())
}

fn hard_az(view: &FleetView, idx: NodeIdx, demand: &Demand<'_>) -> Result<(), RejectionOf<Lazy>> {
    match demand.peers.iter().position(|p| !same_az(view, idx, p.node)) {
        Some(i) => Err(RejectionOf::OutsidePeerAz {
            peer_az: Some(Lazy::PeerAz(i)),
            node_az: Some(Lazy::NodeAz),
        }),
        None => Ok(()),
    }
}

/// Two nodes share an AZ when they are the same node or both advertise the
/// same AZ; an unknown AZ (a prospective node) matches nothing else.
pub(crate) fn same_az(view: &FleetView, a: NodeIdx, b: NodeIdx) -> bool {
    shares_az(view, Some(a), view.hot(a).az, b)
}

/// Whether a node (`node`, or any node other than `other` when `None`) in
/// `az` shares an AZ with node `other`, as [`same_az`] tells it.
pub(crate) fn shares_az(view: &FleetView, node: Option<NodeIdx>, az: u32, other: NodeIdx) -> bool {
    node == Some(other) || (az != NO_AZ && view.hot(other).az == az)
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
            Rejection::ReservedForOtherTemplates => {
                write!(f, "spare exclusively reserved for other templates")
            }
            Rejection::MissingCapability { capability } => {
                write!(f, "lacks capability {capability}")
            }
            Rejection::InsufficientCapacity { needed, free } => {
                write!(f, "needs {needed} vCPU, {free} free")
            }
            Rejection::InsufficientCores { needed, free } => {
                write!(f, "needs {needed} cores, {free} free")
            }
            Rejection::HostPortTaken { port } => write!(f, "host port {port} taken"),
            Rejection::NoGpuFits { needed, largest_free } => {
                write!(f, "needs {needed} of a GPU, largest free {largest_free}")
            }
            Rejection::NodeNotEmpty { other_jobs } => {
                write!(f, "exclusive job, {other_jobs} other jobs on node")
            }
            Rejection::HeldExclusively => write!(f, "held exclusively by another job"),
            Rejection::AwayFromCoLocatedPeer { peer } => {
                write!(f, "co-located peer {peer} is elsewhere")
            }
            Rejection::HostsSeparatedPeer { peer } => {
                write!(f, "hosts {peer}, which must be kept apart")
            }
            Rejection::OutsidePeerAz { peer_az, node_az } => {
                write!(f, "in AZ {}, peers in {}", name(node_az), name(peer_az))
            }
        }
    }
}
