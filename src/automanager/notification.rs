//! Notifications: the seed's callbacks as one typed enum. Each serialises
//! with `kind` set to the callback's name without `on`, lowerCamelCase
//! (`placementDecision`, `bundleBroken`, `jobDropped`, ...), which is what
//! `standalone` prints and subscribers receive.

use serde::Serialize;

use crate::model::{
    AuditEntry, Bundle, BundleId, ImagePrefetchResult, InstanceKey, JobId, MigrationId, NodeId, NodeInfo,
    NodeStopReason, RejectionCode, RuntimeJob, SchedulePhase, UnixMillis,
};
use crate::placement::{ResilienceFlag, Trace};

use super::drain::state::{DrainState, NodeInterruptionState};
use super::migration::state::MigrationState;

/// Where a placement decided a job goes (the engine's outcome, serialisable).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", rename_all = "camelCase")]
pub enum Decision {
    /// Onto an existing (or prospective) node.
    #[serde(rename_all = "camelCase")]
    Placed {
        node_id: NodeId,
        pool: String,
        tier: String,
        /// The GPU device chosen.
        gpu_index: Option<u32>,
    },
    /// Onto a node being provisioned.
    #[serde(rename_all = "camelCase")]
    Provision {
        /// The prospective node's id.
        node_id: NodeId,
        pool: String,
        /// The tier provisioned from.
        tier: String,
        /// The shape.
        instance_type: String,
        /// The GPU device chosen on the shape.
        gpu_index: Option<u32>,
    },
    /// Nowhere.
    NoCapacityInAnyPool,
}

/// `onPlacementDecision`'s payload.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementDecisionInfo {
    /// The runtime job.
    pub job_id: JobId,
    pub bundle_id: BundleId,
    /// 0 primary, 1 backup.
    pub replica_index: u32,
    /// The job's name in the bundle.
    pub job_name: String,
    /// A re-placement after a loss (rather than a first placement).
    pub recovery: bool,
    /// Where it goes.
    pub decision: Decision,
    /// Every node's verdict, when traces are on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<Trace>,
}

/// A notification (one per seed callback the core or its runtime fires).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Notification {
    /// `onConnectionStateChange`: `idle | connecting | ready |
    /// transientFailure | shutdown`.
    ConnectionStateChange {
        /// The new state's name.
        state: String,
    },
    /// `onError`: the catch-all.
    Error {
        /// What went wrong.
        message: String,
    },
    /// `onJobUpdated` (also replayed for every job of the snapshot).
    JobUpdated {
        /// The job with its history.
        job: Box<RuntimeJob>,
    },
    /// `onJobInfo`: an informational worker message.
    #[serde(rename_all = "camelCase")]
    JobInfo {
        job_id: JobId,
        /// The instance.
        role: InstanceKey,
        /// The message.
        text: String,
    },
    /// `onJobDeleted`.
    #[serde(rename_all = "camelCase")]
    JobDeleted { job_id: JobId },
    /// `onJobRejected`: a worker refused a placement.
    #[serde(rename_all = "camelCase")]
    JobRejected {
        job_id: JobId,
        /// The instance refused.
        role: InstanceKey,
        /// Where.
        node_id: NodeId,
        /// The typed reason.
        code: RejectionCode,
        /// The worker's words.
        detail: String,
        /// The inventory the worker sent with its refusal (what it holds
        /// now), when it sent one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        inventory: Option<crate::model::NodeInventory>,
    },
    /// `onJobDropped`: a failed job is not restarted.
    #[serde(rename_all = "camelCase")]
    JobDropped {
        job_id: JobId,
        /// Why.
        reason: String,
    },
    /// `onNodeStarting`.
    NodeStarting { node: NodeInfo },
    /// `onNodeStarted`.
    NodeStarted { node: NodeInfo },
    /// `onNodeStopping`: the prompt "worker dropped" signal.
    #[serde(rename_all = "camelCase")]
    NodeStopping {
        node_id: NodeId,
        /// Why.
        reason: NodeStopReason,
    },
    /// `onNodeStopped`.
    #[serde(rename_all = "camelCase")]
    NodeStopped { node_id: NodeId },
    /// `onNodeTerminated`: this core issued a terminate (once per node, at
    /// issue time).
    #[serde(rename_all = "camelCase")]
    NodeTerminated { node_id: NodeId },
    /// Manager refused a terminate this core issued (also said as an
    /// [`Notification::Error`], the spec's catch-all): what an evict or
    /// terminate `NodeDrain` ends `failed` on.
    #[serde(rename_all = "camelCase")]
    TerminateRefused {
        node_id: NodeId,
        /// Manager's reason.
        reason: String,
    },
    /// `onNodeUnhealthy`: excluded from placement after repeated rejections.
    #[serde(rename_all = "camelCase")]
    NodeUnhealthy { node_id: NodeId },
    /// `onNodeHealthy`: the exclusion cleared.
    #[serde(rename_all = "camelCase")]
    NodeHealthy { node_id: NodeId },
    /// `onBundleUpdated` (also replayed for every bundle of the snapshot).
    BundleUpdated { bundle: Box<Bundle> },
    /// `onBundleDeleted`.
    #[serde(rename_all = "camelCase")]
    BundleDeleted { bundle_id: BundleId },
    /// `onBundleBroken`: the production ended; no replica is placed again
    /// until the bundle is updated or deleted.
    #[serde(rename_all = "camelCase")]
    BundleBroken {
        bundle_id: BundleId,
        /// Why.
        reason: String,
    },
    /// A bundle's schedule entered a phase (`placing` at its placement
    /// lead, `live` at its start, `ended` at its end — its jobs completed —
    /// or `waiting` again once rescheduled). An extension of the spec's
    /// callbacks.
    #[serde(rename_all = "camelCase")]
    BundleSchedule {
        bundle_id: BundleId,
        /// The phase entered.
        phase: SchedulePhase,
        /// The phase after it, if one is to come.
        #[serde(skip_serializing_if = "Option::is_none")]
        next_phase: Option<SchedulePhase>,
        /// When that comes.
        #[serde(skip_serializing_if = "Option::is_none")]
        next_at: Option<UnixMillis>,
    },
    /// Manager accepted a `StartBundleJob`: the manual job runs (it is
    /// placed). An extension of the spec's callbacks.
    #[serde(rename_all = "camelCase")]
    BundleJobStarted { job_id: JobId },
    /// Manager accepted a `StopBundleJob`: the manual job is dormant and
    /// its instance, if any, is being stopped. An extension of the spec's
    /// callbacks.
    #[serde(rename_all = "camelCase")]
    BundleJobStopped { job_id: JobId },
    /// `onPlacementDecision`: every time placement runs.
    PlacementDecision(Box<PlacementDecisionInfo>),
    /// `onPlacementFailed`: no tier could place or provision. Also said as
    /// an [`Notification::Error`], as the spec has it.
    #[serde(rename_all = "camelCase")]
    PlacementFailed {
        job_id: JobId,
        /// Why.
        reason: String,
    },
    /// `onResilienceDegraded`.
    #[serde(rename_all = "camelCase")]
    ResilienceDegraded {
        /// The job placed.
        job_id: JobId,
        /// Where it went.
        node_id: NodeId,
        /// `forbid` flags violated.
        violations: Vec<ResilienceFlag>,
        /// The primary is interruptible and no backup is durable.
        interruptible_primary_without_durable_backup: bool,
    },
    /// Resilience headroom changed what it says of one bundle: the loss of
    /// a node it runs on became absorbed, or stopped being so. The status
    /// of the bundle (its `Resilient` condition) reads afresh. An extension
    /// of the spec's callbacks.
    #[serde(rename_all = "camelCase")]
    BundleHeadroomChanged { bundle_id: BundleId },
    /// Resilience headroom changed its verdict: whether the loss of any
    /// single domain of `kind` would be absorbed, for the fleet (`pool`
    /// absent) or one pool. An extension of the spec's callbacks.
    #[serde(rename_all = "camelCase")]
    HeadroomChanged {
        /// The pool; absent for the whole fleet.
        #[serde(skip_serializing_if = "Option::is_none")]
        pool: Option<String>,
        /// The kind of domain.
        domain_kind: crate::placement::headroom::DomainKind,
        /// The loss of any single one would be absorbed.
        survives: bool,
        /// The worst domain, when one would not be.
        #[serde(skip_serializing_if = "Option::is_none")]
        worst: Option<String>,
        /// Why, in words.
        #[serde(skip_serializing_if = "Option::is_none")]
        why: Option<String>,
    },
    /// `onSpareUnderflow(pool, effective, target)`: the hot-spare
    /// reconciler is short of the pool's target.
    #[serde(rename_all = "camelCase")]
    SpareUnderflow {
        pool: String,
        /// Unconsumed spares, launching ones included.
        effective: u32,
        /// `hotSpares[].targetCount`.
        target: u32,
    },
    /// `onImagesPrefetched`: one prefetch batch settled on a node.
    #[serde(rename_all = "camelCase")]
    ImagesPrefetched {
        node_id: NodeId,
        /// Per image.
        results: Vec<ImagePrefetchResult>,
    },
    /// `onAuditAppended`: pass-through of Manager's audit log.
    AuditAppended { entry: AuditEntry },
    /// Manager was found to serve other additions to the published API
    /// than before (on a connection, or an addition answered
    /// `UNIMPLEMENTED`): each capability with how it is carried out now,
    /// `served` (with the addition) or `published` (without it).
    ManagerCapabilities {
        /// Capability name -> `served` | `published`.
        capabilities: std::collections::BTreeMap<String, String>,
    },
    /// `onDrainProgress`: every phase transition of a node drain and every
    /// change to a job's status within it.
    DrainProgress(Box<DrainState>),
    /// `onNodeInterrupted`: once per `handleNodeInterruption`, after the
    /// node is cordoned and its drain started or tightened.
    NodeInterrupted(Box<NodeInterruptionState>),
    /// `onMigrationPhase`: every phase transition of a migration.
    MigrationPhase(Box<MigrationState>),
    /// `onMigrationCompleted`: the job now lives on the target.
    #[serde(rename_all = "camelCase")]
    MigrationCompleted {
        migration_id: MigrationId,
        /// The job moved.
        job_id: JobId,
    },
    /// `onMigrationAborted`: rolled back, or (`lost`) past the point of no
    /// return and not finished.
    #[serde(rename_all = "camelCase")]
    MigrationAborted {
        migration_id: MigrationId,
        job_id: JobId,
        /// Why.
        reason: String,
        /// Lost past the point of no return rather than rolled back.
        lost: bool,
    },
}
