//! What is being placed and in which context, and its compiled form: the
//! demand one placement checks every node against.
//!
//! Compiling a request resolves everything that does not depend on the node
//! once (pool, pin, co-located group and its combined needs, placed peers,
//! the primary's failure domains, the spare policy in force), so the per-node
//! filter chain and key only compare numbers and interned ids.

use crate::model::{
    BundleId, BundleSpec, HostPort, IntraReplicaAz, JobSpec, NodeId, OnLaunch, OnRuntimeFailure, ResilienceRule,
};

use super::PlacementError;
use super::fleet::{CapabilitySet, FleetView, Name, NodeIdx, port_bit};
use super::groups::{JobGroups, separated};

/// The context of a re-placement (recovery or migration).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryContext {
    /// The recovering job's `onRuntimeFailure`, which decides the spare
    /// policy in force. A migration passes none: there the reserve is
    /// protected by reservation, not by the spare penalty.
    pub on_runtime_failure: Option<OnRuntimeFailure>,
    /// Nodes the job may not go to (its failed node, a migration's source).
    pub excluded_nodes: Vec<NodeId>,
}

/// One job of one replica of a bundle, to be placed.
#[derive(Clone, Copy, Debug)]
pub struct PlacementRequest<'a> {
    pub bundle_id: &'a BundleId,
    /// Its spec.
    pub bundle: &'a BundleSpec,
    /// 0 primary, 1 backup.
    pub replica_index: u32,
    /// The job's name within the bundle.
    pub job_name: &'a str,
    /// `None` for a launch (the bundle's `onLaunch` is in force); the
    /// recovery or migration context otherwise.
    pub recovery: Option<&'a RecoveryContext>,
    /// A hard pin: only this node may take the job, and nothing is
    /// provisioned for it.
    pub target_node: Option<&'a NodeId>,
    /// May take a spare exclusively reserved for other templates.
    pub override_reservation: bool,
    /// The job moves off this node together with its co-located group (a
    /// group migration): the group's instances there are leaving with it,
    /// so they are not placed peers. The job is then its group's first
    /// mover, sized for the whole group, and may provision a node for it.
    pub moving_group_from: Option<&'a NodeId>,
    /// Record the trace (every node's rejection or key, every tier's
    /// provisioning decision). Off for speed.
    pub trace: bool,
}

impl<'a> PlacementRequest<'a> {
    /// A launch: the bundle's `onLaunch` and `overrideReservation` apply, no
    /// pin, no trace.
    pub fn launch(bundle_id: &'a BundleId, bundle: &'a BundleSpec, replica_index: u32, job_name: &'a str) -> Self {
        PlacementRequest {
            bundle_id,
            bundle,
            replica_index,
            job_name,
            recovery: None,
            target_node: None,
            override_reservation: bundle.override_reservation,
            moving_group_from: None,
            trace: false,
        }
    }

    /// The same request as a re-placement in `context`.
    pub fn recovering(self, context: &'a RecoveryContext) -> Self {
        PlacementRequest {
            recovery: Some(context),
            ..self
        }
    }

    /// The same request pinned to `node`.
    pub fn pinned_to(self, node: &'a NodeId) -> Self {
        PlacementRequest {
            target_node: Some(node),
            ..self
        }
    }

    /// The same request for a job moving off `source` with its co-located
    /// group (see [`Self::moving_group_from`]).
    pub fn moving_group_from(self, source: &'a NodeId) -> Self {
        PlacementRequest {
            moving_group_from: Some(source),
            ..self
        }
    }

    /// The same request with the trace switched on or off.
    pub fn with_trace(self, trace: bool) -> Self {
        PlacementRequest { trace, ..self }
    }
}

/// How an unconsumed spare is treated (components 3 and 6 of the key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SparePolicy {
    /// Ranks below every ordinary node.
    Avoid,
    /// Ranks first among equals (below warmth).
    Prefer,
    /// Neither.
    Neutral,
}

/// One GPU ask: a fraction of one device, optionally of one model.
#[derive(Clone, Debug)]
pub(crate) struct GpuAsk {
    pub capacity: f64,
    pub model: Option<String>,
}

/// A placed job of the same replica, as the intra-replica rules see it.
#[derive(Clone, Debug)]
pub(crate) struct Peer {
    pub node: NodeIdx,
    pub name: Name,
}

/// The resilience flags in force for a backup and the primary's nodes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Resilience {
    pub same_node: bool,
    pub same_az: bool,
    pub same_cloud: bool,
    /// Nodes holding the other replica's jobs (the primary's, for a backup).
    pub other_replica: Vec<NodeIdx>,
}

/// What a node must have free for a job, or for a co-located group's first
/// mover (the whole group).
#[derive(Clone, Debug, Default)]
pub(crate) struct Needs {
    /// Capability id (`None`: no node advertises it) and name.
    pub capabilities: Vec<(Option<u32>, Name)>,
    pub capacity: f64,
    pub cores: u32,
    pub ports: Vec<HostPort>,
    /// The GPU asks the node must fit; the placing job's own ask first.
    pub gpu_asks: Vec<GpuAsk>,
    /// The node will be held exclusively.
    pub exclusive: bool,
    /// The capabilities with ids below 64, as the hot mask holds them.
    pub capability_mask: u64,
    /// Some capability has an id of 64 or more, or no node advertises it:
    /// the node's full set must be searched.
    pub wide_capabilities: bool,
    /// The hot port bits of `ports`.
    pub port_mask: u64,
}

impl Needs {
    /// Whether a node advertising `capabilities` has every one required.
    pub(crate) fn held_by(&self, capabilities: &CapabilitySet) -> bool {
        self.capabilities
            .iter()
            .all(|(id, _)| id.is_some_and(|id| capabilities.contains(id)))
    }

    /// The combined needs of `jobs` (the first one's GPU ask first).
    pub(crate) fn of<'j>(view: &FleetView, jobs: impl IntoIterator<Item = &'j JobSpec>) -> Self {
        let mut needs = Needs::default();
        for job in jobs {
            needs.add(view, job);
        }
        needs
    }

    fn add(&mut self, view: &FleetView, job: &JobSpec) {
        let asked = &job.requirements;
        self.capacity += asked.required_capacity.max(0.0);
        self.cores += asked.required_cores;
        self.ports.extend_from_slice(&asked.required_host_ports);
        self.exclusive |= job.exclusive;
        for port in &asked.required_host_ports {
            self.port_mask |= port_bit(port);
        }
        for capability in &asked.required_capabilities {
            if self.capabilities.iter().any(|(_, n)| n.as_str() == capability) {
                continue;
            }
            let id = view.capabilities.get(capability);
            let name = id.map_or_else(
                || Name::from(capability.as_str()),
                |id| view.capabilities.name(id).clone(),
            );
            match id {
                Some(id) if id < 64 => self.capability_mask |= 1 << id,
                _ => self.wide_capabilities = true,
            }
            self.capabilities.push((id, name));
        }
        if asked.required_gpu_capacity > 0.0 {
            self.gpu_asks.push(GpuAsk {
                capacity: asked.required_gpu_capacity,
                model: asked.required_gpu_model.clone(),
            });
        }
    }
}

/// A request compiled against a view.
#[derive(Clone, Debug)]
pub(crate) struct Demand<'a> {
    pub request: PlacementRequest<'a>,
    pub job: &'a JobSpec,
    pub pool: usize,
    /// `Some(None)`: pinned to a node the fleet does not hold.
    pub pin: Option<Option<NodeIdx>>,
    pub excluded: Vec<NodeIdx>,
    /// The template's images with ids below 64, as the hot mask holds them.
    pub warm_mask: u64,
    /// The template's images with higher ids.
    pub warm_wide: Vec<u32>,
    pub spare_policy: SparePolicy,
    /// What the node must have free.
    pub needs: Needs,
    /// The job itself asks for GPU capacity (so `gpuIndex` is reported).
    pub own_gpu: bool,
    /// Names of the job's co-located group (itself included).
    pub group: Vec<&'a str>,
    /// The first placed member of the group, if any: the job must join it.
    pub co_located_with: Option<Peer>,
    /// Placed jobs the job (or its group) must be kept apart from.
    pub separated_from: Vec<Peer>,
    pub same_az: IntraReplicaAz,
    /// Every placed job of the same replica.
    pub peers: Vec<Peer>,
    /// Set for a backup of a bundle with a resilience policy.
    pub resilience: Option<Resilience>,
}

impl<'a> Demand<'a> {
    /// Compiles `request` against `view`.
    pub(crate) fn compile(view: &FleetView, request: PlacementRequest<'a>) -> Result<Self, PlacementError> {
        let bundle = request.bundle;
        let replica_count = bundle.replica_count();
        if request.replica_index >= replica_count {
            return Err(PlacementError::NoSuchReplica {
                replica_index: request.replica_index,
                replica_count,
            });
        }
        let job_index = bundle
            .jobs
            .iter()
            .position(|j| j.job_name == request.job_name)
            .ok_or_else(|| PlacementError::UnknownJob {
                job_name: request.job_name.to_owned(),
            })?;
        let job = &bundle.jobs[job_index];
        let pool_name = bundle.pool_for_replica(request.replica_index);
        let pool = view
            .pools()
            .index_of(pool_name)
            .ok_or_else(|| PlacementError::UnknownPool {
                pool: pool_name.to_owned(),
            })?;

        let groups = JobGroups::of(bundle);
        let group: Vec<usize> = groups.members(job_index).collect();
        // A group moving off its node leaves its instances there behind: they
        // are neither the company it must join nor failure-domain peers.
        let moving_from = request.moving_group_from.and_then(|id| view.node_index(id));
        let peers: Vec<Peer> = placed_peers(view, &request)
            .into_iter()
            .filter(|p| !(moving_from == Some(p.node) && is_member(bundle, &group, &p.name)))
            .collect();
        let co_located_with = peers.iter().find(|p| is_member(bundle, &group, &p.name)).cloned();
        // "The first mover of a co-located group sizes its node for the whole
        // group"; a later member only needs room for itself.
        let sized: Vec<&JobSpec> = if co_located_with.is_none() {
            group.iter().map(|&i| &bundle.jobs[i]).collect()
        } else {
            vec![job]
        };
        let separated_from = peers
            .iter()
            .filter(|p| {
                bundle
                    .job(p.name.as_str())
                    .is_some_and(|other| sized.iter().any(|mine| separated(mine, other)))
            })
            .cloned()
            .collect();

        // The placing job's own GPU ask goes first so its device is the one
        // reported as `gpuIndex`.
        let ordered = std::iter::once(job).chain(sized.iter().copied().filter(|j| j.job_name != job.job_name));
        let needs = Needs::of(view, ordered);
        Ok(Demand {
            request,
            job,
            pool,
            pin: request.target_node.map(|id| view.node_index(id)),
            // A re-placement keeps away from the node it left — but for the
            // node a co-located peer is placed on: the group's node is the
            // one the hard co-location rule allows, so the member rejoins
            // its group there rather than being placed nowhere.
            excluded: request
                .recovery
                .map(|r| {
                    r.excluded_nodes
                        .iter()
                        .filter_map(|id| view.node_index(id))
                        .filter(|&idx| co_located_with.as_ref().is_none_or(|peer| peer.node != idx))
                        .collect()
                })
                .unwrap_or_default(),
            warm_mask: view
                .template_images(&job.template)
                .iter()
                .filter(|&&i| i < 64)
                .fold(0, |m, &i| m | (1 << i)),
            warm_wide: view
                .template_images(&job.template)
                .iter()
                .copied()
                .filter(|&i| i >= 64)
                .collect(),
            spare_policy: spare_policy(&request),
            needs,
            own_gpu: job.requirements.required_gpu_capacity > 0.0,
            group: group.iter().map(|&i| bundle.jobs[i].job_name.as_str()).collect(),
            co_located_with,
            separated_from,
            same_az: bundle.intra_replica_placement.same_az,
            resilience: resilience(view, &request),
            peers,
        })
    }

    /// Whether an occupant of a node is one of the job's co-located group
    /// (the only company an exclusive job tolerates).
    pub(crate) fn is_group_peer(&self, bundle: Option<&BundleId>, replica: u32, job_name: &str) -> bool {
        bundle == Some(self.request.bundle_id)
            && replica == self.request.replica_index
            && self.group.contains(&job_name)
    }
}

fn is_member(bundle: &BundleSpec, group: &[usize], name: &Name) -> bool {
    group.iter().any(|&i| bundle.jobs[i].job_name == name.as_str())
}

/// Placed jobs of the same replica, the job itself excepted.
fn placed_peers(view: &FleetView, request: &PlacementRequest<'_>) -> Vec<Peer> {
    view.bundle_occupants(request.bundle_id)
        .iter()
        .map(|&o| &view.occupants[o as usize])
        .filter(|o| o.replica == request.replica_index && o.job_name.as_str() != request.job_name)
        .map(|o| Peer {
            node: o.node,
            name: o.job_name.clone(),
        })
        .collect()
}

/// The spare policy in force: recovery follows the job's
/// `onRuntimeFailure`, launch the bundle's `onLaunch`; a migration (no
/// `onRuntimeFailure`) and `drop` are neutral.
fn spare_policy(request: &PlacementRequest<'_>) -> SparePolicy {
    match request.recovery {
        Some(context) => match context.on_runtime_failure {
            Some(OnRuntimeFailure::AvoidSpare) => SparePolicy::Avoid,
            Some(OnRuntimeFailure::PreferSpare) => SparePolicy::Prefer,
            Some(OnRuntimeFailure::Drop) | None => SparePolicy::Neutral,
        },
        None => match request.bundle.on_launch {
            OnLaunch::AvoidSpare => SparePolicy::Avoid,
            OnLaunch::AllowSpare => SparePolicy::Neutral,
        },
    }
}

/// For a backup of a bundle with a resilience policy: its `forbid` flags and
/// the nodes of the primary (the whole replica is the failure domain).
fn resilience(view: &FleetView, request: &PlacementRequest<'_>) -> Option<Resilience> {
    let policy = request.bundle.resilience_policy.as_ref()?;
    let other = if request.replica_index == 0 { 1 } else { 0 };
    let mut other_replica: Vec<NodeIdx> = view
        .bundle_occupants(request.bundle_id)
        .iter()
        .map(|&o| &view.occupants[o as usize])
        .filter(|o| o.replica == other)
        .map(|o| o.node)
        .collect();
    other_replica.sort_unstable();
    other_replica.dedup();
    let backup = request.replica_index > 0;
    Some(Resilience {
        same_node: backup && policy.same_node == ResilienceRule::Forbid,
        same_az: backup && policy.same_az == ResilienceRule::Forbid,
        same_cloud: backup && policy.same_cloud == ResilienceRule::Forbid,
        other_replica,
    })
}
