//! Resilience headroom: what-if loss analysis on a copy of the fleet view.
//! PURE, like the rest of `placement`.
//!
//! For a failure domain — one node, one availability zone, one tier, one
//! provider kind, one pool — the analysis takes the domain's nodes away and
//! re-places every job they carried with the spec's own rules, as the core
//! would on their loss: recovery placement per the job's
//! `onRuntimeFailure` (the lost node excluded, spares ranked as the policy
//! says), provisioning through the tier cascade within `maxNodes` (the lost
//! nodes no longer count), the resilience flags for backups, co-located
//! groups placed together (the first mover sizes the node for its group),
//! in the core's order (runtime job id). A `drop` job, or one already at
//! its restart ceiling, is terminal; an essential one breaks its bundle and
//! nothing of that bundle is re-placed. Losing a tier, a provider kind or a
//! pool also loses their capacity: nothing is provisioned from those tiers.
//!
//! The result per domain ([`DomainVerdict`]) says whether the loss is
//! absorbed, and per affected bundle whether it stays on air (a replica
//! untouched, or its lost jobs re-placed) or goes dark, with each job's
//! fate in the engine's vocabulary (`noCapacityInAnyPool` with every
//! tier's reason, `drop`, the restart ceiling, ...) and the nodes it would
//! provision. [`Headroom`] analyses a whole fleet; [`tracker::Tracker`]
//! keeps the verdicts of a changing fleet, recomputing a node's only when a
//! change could alter its outcome (where a job would land within its tier
//! may move without one: such a verdict leaves that node out).
//!
//! The loss is taken as instantaneous: every node of a domain goes at once
//! and is gone for good (it no longer counts against its tier's
//! `maxNodes`). A provisioned node is assumed to boot; in a zone's loss, in
//! another zone.

mod report;
mod run;
pub mod tracker;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::model::{BundleId, BundleSpec, FleetSnapshot, JobId, NodeId, NodePhase, PlacedJob, ProviderKind};

use super::fleet::{FleetError, FleetView, NO_SLOT, NodeIdx, flag};
use super::settings::Pools;
use super::trace::{NoProvisionReason, Trace};

pub use report::{HeadroomReport, KindSummary, PoolHeadroom, WorstDomain};
pub use tracker::Tracker;

/// A kind of failure domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "camelCase")]
pub enum DomainKind {
    /// One node.
    Node,
    /// One availability zone (nodes advertising no AZ belong to none).
    Zone,
    /// One tier of one pool, named `pool/tier`.
    Tier,
    /// One provider kind (`aws`, `oci`, `local-servers`).
    Provider,
    /// One pool.
    Pool,
}

impl DomainKind {
    /// The kind's name, as the output prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            DomainKind::Node => "node",
            DomainKind::Zone => "zone",
            DomainKind::Tier => "tier",
            DomainKind::Provider => "provider",
            DomainKind::Pool => "pool",
        }
    }
}

/// One failure domain.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Domain {
    pub kind: DomainKind,
    /// The node id, zone, `pool/tier`, provider kind or pool.
    pub name: String,
}

impl Domain {
    /// The domain of `kind` named `name`.
    pub fn new(kind: DomainKind, name: impl Into<String>) -> Self {
        Domain {
            kind,
            name: name.into(),
        }
    }
}

impl std::fmt::Display for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind.as_str(), self.name)
    }
}

/// What the analysis knows besides the fleet: the specs of the bundles
/// whose jobs it carries, and the jobs that would not be restarted.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    /// Bundle specs by id. A job of a bundle not listed is reported as
    /// `unknownSpec` (no rule can re-place it).
    pub bundles: &'a BTreeMap<BundleId, BundleSpec>,
    /// Jobs already at their restart ceiling: a loss now would be
    /// terminal for them.
    pub at_restart_ceiling: &'a BTreeSet<JobId>,
}

/// The verdict on one domain's loss.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DomainVerdict {
    pub domain: Domain,
    /// Every lost job that should come back comes back, and no bundle
    /// breaks (a non-essential `drop` job may be dropped, as its policy
    /// says).
    pub absorbed: bool,
    /// The nodes lost with it.
    pub nodes: Vec<LostNode>,
    /// Jobs the lost nodes carried.
    pub jobs_lost: u32,
    /// Of those, jobs placed again (on a node or a provision).
    pub jobs_replaced: u32,
    /// Bundles the loss touches, by id.
    pub bundles: Vec<BundleFate>,
    /// Nodes it would provision, and for which jobs.
    pub provisions: Vec<ProvisionNeed>,
    /// Jobs that belong to no bundle (the operator does not re-place them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unmanaged: Vec<JobId>,
}

/// A node a domain's loss takes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LostNode {
    /// The node.
    pub node_id: NodeId,
    /// Its pool, when it belongs to one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
}

/// A node the re-placement would provision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvisionNeed {
    /// The prospective node's id.
    pub node_id: NodeId,
    pub pool: String,
    /// The tier provisioned from.
    pub tier: String,
    /// The shape.
    pub instance_type: String,
    /// The jobs placed on it.
    pub jobs: Vec<JobId>,
}

/// What becomes of one bundle the loss touches.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleFate {
    pub bundle: BundleId,
    /// A replica stays on air: one the loss did not touch, or one whose
    /// lost essential jobs all come back.
    pub on_air: bool,
    /// An essential job would be terminal (`drop`, restart ceiling): the
    /// bundle breaks and none of its lost jobs is re-placed.
    pub broken: bool,
    /// Replicas untouched by the loss that keep running.
    pub untouched_replicas: Vec<u32>,
    /// Every lost job of the bundle, in runtime job id order.
    pub jobs: Vec<JobFate>,
}

/// What becomes of one lost job.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobFate {
    /// The runtime job id.
    pub job_id: JobId,
    /// 0 primary, 1 backup.
    pub replica_index: u32,
    /// The job's name.
    pub job_name: String,
    /// The node it was lost with.
    pub lost_from: NodeId,
    /// Absent `essential` means true.
    pub essential: bool,
    /// Where it goes, or why nowhere.
    pub fate: Fate,
}

/// Where a lost job goes.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "fate", rename_all = "camelCase")]
pub enum Fate {
    /// Re-placed onto a node that exists (or one the same loss provisions
    /// earlier in the order).
    #[serde(rename_all = "camelCase")]
    Placed {
        /// The node; absent from a verdict kept on its outcome where
        /// another node of the tier may now take the job (see `tracker`).
        #[serde(skip_serializing_if = "Option::is_none")]
        node_id: Option<NodeId>,
        pool: String,
        tier: String,
    },
    /// Re-placed onto a node to be provisioned.
    #[serde(rename_all = "camelCase")]
    Provision {
        /// The prospective node.
        node_id: NodeId,
        pool: String,
        /// The tier provisioned from.
        tier: String,
        /// The shape.
        instance_type: String,
    },
    /// Not re-placed.
    Dark {
        /// Why.
        reason: DarkReason,
    },
}

impl Fate {
    /// Whether the job is placed again.
    pub fn is_replaced(&self) -> bool {
        !matches!(self, Fate::Dark { .. })
    }
}

/// Why a lost job would not come back.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "reason", rename_all = "camelCase")]
pub enum DarkReason {
    /// No tier of the replica's pool can place or provision it.
    #[serde(rename_all = "camelCase")]
    NoCapacityInAnyPool {
        /// Every tier's reason for not provisioning (none of its nodes
        /// takes the job).
        tiers: Vec<TierRefusal>,
        /// The placement's trace, when asked for (`--explain`).
        #[serde(skip_serializing_if = "Option::is_none")]
        trace: Option<Trace>,
    },
    /// `onRuntimeFailure: drop`: the runtime is terminal.
    Dropped,
    /// The job is at its restart ceiling: this loss would be terminal.
    RestartCeiling,
    /// Another essential job of the bundle would be terminal, which breaks
    /// the bundle: none of its replicas is placed again.
    #[serde(rename_all = "camelCase")]
    BundleBroken {
        /// The terminal job.
        job_name: String,
    },
    /// The bundle's spec is not known, or has no such job.
    UnknownSpec,
    /// The engine refused the request.
    #[serde(rename_all = "camelCase")]
    PlacementRefused {
        /// Why.
        message: String,
    },
}

/// Why one tier does not take a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TierRefusal {
    pub pool: String,
    pub tier: String,
    /// Why it provisions nothing (none of its nodes takes the job).
    pub why: NoProvisionReason,
}

impl std::fmt::Display for DarkReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DarkReason::NoCapacityInAnyPool { tiers, trace } => {
                if let Some(trace) = trace {
                    return write!(f, "no capacity in any tier: {}", trace.why_not_placed());
                }
                let tiers: Vec<String> = tiers
                    .iter()
                    .map(|t| format!("tier {}: no node takes it, not provisioned: {}", t.tier, t.why))
                    .collect();
                write!(f, "no capacity in any tier ({})", tiers.join("; "))
            }
            DarkReason::Dropped => write!(f, "onRuntimeFailure is drop"),
            DarkReason::RestartCeiling => write!(f, "at its restart ceiling"),
            DarkReason::BundleBroken { job_name } => {
                write!(f, "the bundle breaks: essential job {job_name} would be terminal")
            }
            DarkReason::UnknownSpec => write!(f, "its bundle's spec is not known"),
            DarkReason::PlacementRefused { message } => write!(f, "placement refused: {message}"),
        }
    }
}

impl BundleFate {
    /// The bundle's part of the loss is absorbed: it is not broken, and
    /// every lost job comes back but a non-essential one its own `drop`
    /// policy drops.
    pub fn absorbed(&self) -> bool {
        bundle_absorbed(self)
    }
}

impl DomainVerdict {
    /// Bundles that go dark.
    pub fn dark_bundles(&self) -> usize {
        self.bundles.iter().filter(|b| !b.on_air).count()
    }

    /// Lost jobs that are not placed again.
    pub fn unplaced_jobs(&self) -> usize {
        self.bundles
            .iter()
            .flat_map(|b| &b.jobs)
            .filter(|j| !j.fate.is_replaced())
            .count()
    }

    /// Why the loss is not absorbed, in words: the first bundle that goes
    /// dark (else the first job that does not come back) and its reason.
    pub fn why(&self) -> Option<String> {
        if self.absorbed {
            return None;
        }
        fn first_dark(b: &BundleFate) -> Option<(&BundleFate, &JobFate)> {
            b.jobs.iter().find(|j| !j.fate.is_replaced()).map(|j| (b, j))
        }
        let (bundle, job) = self
            .bundles
            .iter()
            .filter(|b| !b.on_air)
            .find_map(first_dark)
            .or_else(|| self.bundles.iter().find_map(first_dark))?;
        let Fate::Dark { reason } = &job.fate else {
            return None;
        };
        let fate = if bundle.on_air { "loses" } else { "goes dark, losing" };
        let more = self.unplaced_jobs().saturating_sub(1);
        let more = if more > 0 {
            format!(" (and {more} more jobs)")
        } else {
            String::new()
        };
        Some(format!(
            "bundle {} {fate} {} (replica {}): {reason}{more}",
            bundle.bundle, job.job_name, job.replica_index
        ))
    }

    /// The verdict on the part of the loss that falls on `pool`'s nodes:
    /// `None` when the domain takes none of them.
    pub fn within_pool(&self, pool: &str) -> Option<DomainVerdict> {
        let in_pool = |n: &NodeId| {
            self.nodes
                .iter()
                .any(|l| &l.node_id == n && l.pool.as_deref() == Some(pool))
        };
        if !self.nodes.iter().any(|n| n.pool.as_deref() == Some(pool)) {
            return None;
        }
        let bundles: Vec<BundleFate> = self
            .bundles
            .iter()
            .filter(|b| b.jobs.iter().any(|j| in_pool(&j.lost_from)))
            .cloned()
            .collect();
        let jobs = bundles.iter().flat_map(|b| &b.jobs).filter(|j| in_pool(&j.lost_from));
        let (lost, replaced) = jobs.fold((0, 0), |(l, r), j| (l + 1, r + u32::from(j.fate.is_replaced())));
        Some(DomainVerdict {
            domain: self.domain.clone(),
            absorbed: bundles.iter().all(bundle_absorbed),
            nodes: self
                .nodes
                .iter()
                .filter(|n| n.pool.as_deref() == Some(pool))
                .cloned()
                .collect(),
            jobs_lost: lost,
            jobs_replaced: replaced,
            provisions: self.provisions.clone(),
            unmanaged: Vec::new(),
            bundles,
        })
    }
}

/// Whether a bundle's part of a loss is absorbed: not broken, and every
/// lost job back but a non-essential one its own `drop` policy drops.
pub(crate) fn bundle_absorbed(bundle: &BundleFate) -> bool {
    !bundle.broken
        && bundle.jobs.iter().all(|j| {
            j.fate.is_replaced()
                || (!j.essential
                    && matches!(
                        j.fate,
                        Fate::Dark {
                            reason: DarkReason::Dropped
                        }
                    ))
        })
}

/// Which domains to analyse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Every domain of these kinds the fleet has.
    Kinds(Vec<DomainKind>),
    /// These domains only.
    Domains(Vec<Domain>),
}

impl Selection {
    /// Every node, zone and provider kind: what the operator watches.
    pub fn watched() -> Self {
        Selection::Kinds(vec![DomainKind::Node, DomainKind::Zone, DomainKind::Provider])
    }
}

/// Why an analysis could not be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeadroomError {
    /// The fleet snapshot does not make a view.
    #[error(transparent)]
    Fleet(#[from] FleetError),
    /// A domain asked for does not exist in the fleet.
    #[error("the fleet has no {domain}; it has {known}")]
    UnknownDomain {
        /// The domain asked for.
        domain: Domain,
        /// The domains of that kind it has.
        known: String,
    },
}

/// A fleet to ask "what if" of: its view, and what each node carries.
#[derive(Clone, Debug)]
pub struct Headroom {
    view: FleetView,
    carried: HashMap<NodeId, Vec<PlacedJob>>,
}

impl Headroom {
    /// The fleet of `snapshot` against validated `pools`.
    pub fn new(snapshot: &FleetSnapshot, pools: Pools) -> Result<Self, HeadroomError> {
        let view = FleetView::new(snapshot, pools)?;
        let carried = snapshot
            .nodes
            .iter()
            .filter(|n| !n.jobs.is_empty())
            .map(|n| (n.id.clone(), n.jobs.clone()))
            .collect();
        Ok(Headroom { view, carried })
    }

    /// Analyses every selected domain, in domain order; `explain` records
    /// the trace of every placement that finds nowhere.
    pub fn analyse(
        &mut self,
        context: Context<'_>,
        selection: &Selection,
        explain: bool,
    ) -> Result<Vec<DomainVerdict>, HeadroomError> {
        let domains = match selection {
            Selection::Kinds(kinds) => kinds.iter().flat_map(|&k| domains_of(&self.view, k)).collect(),
            Selection::Domains(asked) => {
                for domain in asked {
                    let known = domains_of(&self.view, domain.kind);
                    if !known.contains(domain) {
                        let known: Vec<String> = known.into_iter().map(|d| d.name).collect();
                        return Err(HeadroomError::UnknownDomain {
                            domain: domain.clone(),
                            known: if known.is_empty() {
                                "none".to_owned()
                            } else {
                                known.join(", ")
                            },
                        });
                    }
                }
                asked.clone()
            }
        };
        Ok(domains
            .into_iter()
            .map(|domain| {
                let lost = members(&self.view, &domain);
                run::what_if(
                    &mut self.view,
                    &self.carried,
                    context,
                    domain,
                    &lost,
                    explain,
                    run::Record::None,
                )
                .0
            })
            .collect())
    }
}

/// Whether node `idx` is already going (stopping or stopped): no domain
/// takes it.
pub(crate) fn going(view: &FleetView, idx: NodeIdx) -> bool {
    view.hot(idx).has(flag::GONE) || view.node(idx).phase == NodePhase::Stopped
}

/// Node `idx`'s pool and tier, by index, when it has them.
pub(crate) fn slot_at(view: &FleetView, idx: NodeIdx) -> Option<(usize, usize)> {
    let slot = view.hot(idx).slot;
    (slot != NO_SLOT).then_some(((slot >> 16) as usize, (slot & 0xffff) as usize))
}

/// The nodes a domain takes: every node of it not already going.
pub(crate) fn members(view: &FleetView, domain: &Domain) -> Vec<NodeIdx> {
    let going = |idx: NodeIdx| going(view, idx);
    if domain.kind == DomainKind::Node {
        // One lookup, not a scan.
        return view
            .node_index(&NodeId::from(domain.name.as_str()))
            .filter(|&idx| !going(idx))
            .into_iter()
            .collect();
    }
    let pools = view.pools();
    let tier_of = |idx: NodeIdx| slot_at(view, idx);
    view.order
        .iter()
        .copied()
        .filter(|&idx| !going(idx))
        .filter(|&idx| match domain.kind {
            DomainKind::Node => view.node(idx).id.as_str() == domain.name,
            DomainKind::Zone => view
                .hot(idx)
                .az()
                .is_some_and(|az| view.azs.name(az).as_str() == domain.name),
            DomainKind::Provider => view.hot(idx).has(flag::INVENTORY) && view.hot(idx).kind.as_str() == domain.name,
            DomainKind::Pool => tier_of(idx)
                .and_then(|(p, _)| pools.at(p))
                .is_some_and(|p| p.name == domain.name),
            DomainKind::Tier => tier_of(idx)
                .and_then(|(p, t)| Some((pools.at(p)?, t)))
                .is_some_and(|(p, t)| format!("{}/{}", p.name, p.tiers[t].name) == domain.name),
        })
        .collect()
}

/// The tiers whose capacity a domain's loss takes: every tier of a lost
/// pool, every tier of a lost provider kind, a lost tier.
pub(crate) fn lost_tiers(pools: &Pools, domain: &Domain) -> Vec<(usize, usize)> {
    let mut lost = Vec::new();
    for (p, pool) in pools.iter().enumerate() {
        for (t, tier) in pool.tiers.iter().enumerate() {
            let taken = match domain.kind {
                DomainKind::Node | DomainKind::Zone => false,
                DomainKind::Tier => format!("{}/{}", pool.name, tier.name) == domain.name,
                DomainKind::Provider => tier.kind.as_str() == domain.name,
                DomainKind::Pool => pool.name == domain.name,
            };
            if taken {
                lost.push((p, t));
            }
        }
    }
    lost
}

/// Every domain of `kind` the fleet has, by name.
pub(crate) fn domains_of(view: &FleetView, kind: DomainKind) -> Vec<Domain> {
    let mut names = BTreeSet::new();
    let pools = view.pools();
    match kind {
        DomainKind::Tier => {
            for pool in pools.iter() {
                for tier in &pool.tiers {
                    names.insert(format!("{}/{}", pool.name, tier.name));
                }
            }
        }
        DomainKind::Pool => names.extend(pools.iter().map(|p| p.name.clone())),
        _ => {
            for &idx in &view.order {
                if going(view, idx) {
                    continue;
                }
                let hot = view.hot(idx);
                match kind {
                    DomainKind::Node => {
                        names.insert(view.node(idx).id.to_string());
                    }
                    DomainKind::Zone => {
                        if let Some(az) = hot.az() {
                            names.insert(view.azs.name(az).to_string());
                        }
                    }
                    DomainKind::Provider if hot.has(flag::INVENTORY) => {
                        names.insert(hot.kind.as_str().to_owned());
                    }
                    _ => {}
                }
            }
        }
    }
    names.into_iter().map(|name| Domain::new(kind, name)).collect()
}

/// A provider kind's domain name.
pub fn provider_domain(kind: ProviderKind) -> Domain {
    Domain::new(DomainKind::Provider, kind.as_str())
}
