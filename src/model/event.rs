//! Manager's view of jobs and the events it streams, in domain form. Values
//! a newer Manager may send that this build does not know are kept as typed
//! `Unknown` variants, never dropped and never a panic.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    Bundle, BundleId, InstanceKey, IntraReplicaPlacement, JobId, JobSpec, NodeId, NodeInfo, NodeInventory, OnLaunch,
    Requirements, ResiliencePolicy, TerminalVerdict, UnixMillis,
};

/// The bundle-level context a runtime job carries so it can be placed on its
/// own (copied from its bundle at expansion).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobPlacementContext {
    /// The bundle's pool (the primary's).
    pub pool: String,
    /// The bundle's resilience policy.
    pub resilience_policy: Option<ResiliencePolicy>,
    /// The bundle's intra-replica placement.
    pub intra_replica_placement: IntraReplicaPlacement,
    /// The bundle's `onLaunch`.
    pub on_launch: OnLaunch,
    /// The bundle's `overrideReservation`.
    pub override_reservation: bool,
}

/// A runtime job's place in its bundle.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleJobRef {
    /// The bundle.
    pub bundle_id: BundleId,
    /// 0 primary, 1 backup.
    pub replica_index: u32,
    /// The job's name in the bundle.
    pub job_name: String,
}

/// Manager's `Job.JobState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum JobState {
    /// Before its window.
    Pre,
    /// Should be running.
    Active,
    /// After its window.
    Post,
    /// A value this build does not know.
    Unknown(i32),
}

/// Why an instance is stopping (`JobHistoryJobStopping.Reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum JobStopReason {
    /// Its node stopped.
    NodeStopped,
    /// Its node was terminated.
    NodeTerminated,
    /// Somebody asked.
    UserRequested,
    /// The worker did not know the job.
    UnknownJob,
    /// The job failed at runtime.
    JobFailed,
    /// A value this build does not know.
    Unknown(i32),
}

/// One entry of a job's history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "entry")]
pub enum JobHistoryEntry {
    /// The job was created.
    Created {
        /// When.
        at: Option<UnixMillis>,
    },
    /// The job's spec changed.
    Updated {
        /// When.
        at: Option<UnixMillis>,
    },
    /// An instance was provisioned on a node.
    Provisioned {
        /// When.
        at: Option<UnixMillis>,
        /// The instance key.
        role: InstanceKey,
        /// Where.
        node_id: Option<NodeId>,
    },
    /// An instance reached running.
    Running {
        /// When.
        at: Option<UnixMillis>,
        /// The instance key.
        role: InstanceKey,
        /// Where.
        node_id: Option<NodeId>,
    },
    /// An instance is stopping.
    Stopping {
        /// When.
        at: Option<UnixMillis>,
        /// The instance key.
        role: InstanceKey,
        /// Where.
        node_id: Option<NodeId>,
        /// Why.
        reason: JobStopReason,
    },
    /// An instance stopped.
    Stopped {
        /// When.
        at: Option<UnixMillis>,
        /// The instance key.
        role: InstanceKey,
        /// Where.
        node_id: Option<NodeId>,
    },
    /// The job completed.
    Completed {
        /// When.
        at: Option<UnixMillis>,
    },
    /// A history entry this build does not know.
    Unknown,
}

/// A runtime job as Manager holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeJob {
    pub job_id: JobId,
    /// Manager's state.
    pub state: JobState,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Scheduled start, if any.
    pub start_date_time: Option<UnixMillis>,
    /// The bundle it was expanded from.
    pub bundle_ref: Option<BundleJobRef>,
    /// The job's spec within its bundle (name, template, requirements,
    /// intra-replica rules, parameters with backup overrides applied).
    pub spec: JobSpec,
    /// The bundle context, for bundle jobs.
    pub context: Option<JobPlacementContext>,
    /// Dormant (`startMode: manual`, not started).
    pub dormant: bool,
    /// Set when the job or its bundle ended terminally.
    pub terminal_verdict: Option<TerminalVerdict>,
    /// History, oldest first.
    pub history: Vec<JobHistoryEntry>,
}

impl RuntimeJob {
    /// The job's requirements.
    pub fn requirements(&self) -> &Requirements {
        &self.spec.requirements
    }
}

/// A job instance Manager reports as running on a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunningInstance {
    /// The job.
    pub job_id: JobId,
    /// The instance key.
    pub role: InstanceKey,
    /// The node.
    pub node_id: NodeId,
}

/// Why Manager is stopping a node (`NodeStopping.Reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NodeStopReason {
    /// The provider refused to create it.
    CreateFailed,
    /// Pending too long.
    PendingTimeExceeded,
    /// Starting too long.
    StartupTimeExceeded,
    /// No health ping during initialisation.
    InitialisationHealthPingTimeExceeded,
    /// Keepalive lost.
    HealthPingTimeExceeded,
    /// A duplicate job was found.
    DuplicateJob,
    /// The provider stopped it.
    ProviderStop,
    /// The provider terminated it.
    ProviderTerminate,
    /// A client asked.
    UserRequested,
    /// Manager did not know it.
    UnknownNode,
    /// A value this build does not know.
    Unknown(i32),
}

/// A worker's typed refusal of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RejectionCode {
    /// No node would do better: terminal on the first rejection.
    #[serde(rename = "JOB_REJECTED_INVALID_SPEC")]
    InvalidSpec,
    /// The worker is out of capacity.
    #[serde(rename = "JOB_REJECTED_INSUFFICIENT_CAPACITY")]
    InsufficientCapacity,
    /// A host port is taken.
    #[serde(rename = "JOB_REJECTED_PORT_IN_USE")]
    PortInUse,
    /// The GPU device is not available.
    #[serde(rename = "JOB_REJECTED_GPU_UNAVAILABLE")]
    GpuUnavailable,
    /// The image cannot be had.
    #[serde(rename = "JOB_REJECTED_IMAGE_UNAVAILABLE")]
    ImageUnavailable,
    /// The node is going away.
    #[serde(rename = "JOB_REJECTED_NODE_SHUTTING_DOWN")]
    NodeShuttingDown,
    /// Unspecified or a value this build does not know.
    #[serde(rename = "JOB_REJECTED_UNKNOWN")]
    Unknown(i32),
}

/// The kind of a provider interruption notice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InterruptionKind {
    /// The provider reclaims the node at the deadline.
    #[serde(rename = "spot-interruption")]
    SpotInterruption,
    /// The provider recommends moving off the node.
    #[serde(rename = "rebalance")]
    Rebalance,
    /// A value this build does not know.
    #[serde(rename = "unknown")]
    Unknown(i32),
}

/// A step in a cooperative handover, as an instance reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MigrationSignal {
    /// The target is ready; the payload belongs to the job.
    TargetReady(Vec<u8>),
    /// The source stopped output at this position.
    SourceStoppedAt(String),
    /// The target applied from the position and took over.
    TargetApplied,
    /// The instance refused to cooperate.
    Refused(String),
    /// A signal this build does not know.
    Unknown,
}

/// The outcome of one image pull.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImagePrefetchResult {
    /// The image reference.
    pub image: String,
    /// Whether the node now holds it.
    pub ok: bool,
    /// Why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One entry of Manager's audit log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// When.
    pub at: Option<UnixMillis>,
    /// Who.
    pub actor: String,
    /// What.
    pub action: String,
    /// On what.
    pub subject: String,
    /// Anything else.
    pub details: BTreeMap<String, String>,
}

/// One event from Manager's stream, in domain form.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "event")]
pub enum ManagerEvent {
    /// A node is running (with the instances on it).
    NodeRunning {
        node: NodeInfo,
        /// Instances on it.
        instances: Vec<RunningInstance>,
    },
    /// A job entered its window.
    JobActive(RuntimeJob),
    /// A job is pending (inside the pending window).
    JobPending(RuntimeJob),
    /// A job changed.
    JobUpdated(RuntimeJob),
    /// A job left its window.
    JobOutOfWindow(RuntimeJob),
    /// A job was deleted.
    JobDeleted(JobId),
    /// The initial snapshot is complete.
    InitialDataComplete,
    /// A node is starting.
    NodeStarting(NodeInfo),
    /// A node started.
    NodeStarted(NodeInfo),
    /// A node is stopping.
    NodeStopping {
        /// The node.
        node_id: NodeId,
        /// Why.
        reason: NodeStopReason,
    },
    /// A node stopped.
    NodeStopped(NodeId),
    /// A physical (cluster) node connected.
    PhysicalNodeConnected {
        /// The node.
        node_id: NodeId,
        tags: BTreeMap<String, String>,
        /// Instances on it.
        instances: Vec<RunningInstance>,
    },
    /// A provider's health changed.
    ProviderHealthChange,
    /// Informational worker message about a job instance.
    JobInfo {
        /// The job.
        job_id: JobId,
        /// The instance.
        role: InstanceKey,
        /// A readable summary.
        text: String,
    },
    /// A bundle was stored or changed.
    BundleUpdated(Bundle),
    /// A bundle was deleted.
    BundleDeleted(BundleId),
    /// A node's inventory.
    NodeInventory {
        /// The node.
        node_id: NodeId,
        /// What it advertises.
        inventory: NodeInventory,
    },
    /// A worker refused a job.
    JobRejected {
        /// The job.
        job_id: JobId,
        /// The instance key refused.
        role: InstanceKey,
        /// Where.
        node_id: NodeId,
        /// Typed reason.
        code: RejectionCode,
        /// The worker's own words.
        detail: String,
        /// The inventory the worker sent.
        inventory: Option<NodeInventory>,
    },
    /// A deferred start finished preparing.
    JobPrepared {
        /// The job.
        job_id: JobId,
        /// The prepared instance.
        role: InstanceKey,
        /// Where.
        node_id: NodeId,
    },
    /// A handover step from an instance.
    MigrationSignal {
        /// The migration.
        migration_id: String,
        /// The job.
        job_id: JobId,
        /// Who sent it.
        from_key: InstanceKey,
        /// What.
        signal: MigrationSignal,
    },
    /// The provider is taking a node back.
    NodeInterruptionNotice {
        /// The node.
        node_id: NodeId,
        /// Spot interruption or rebalance.
        kind: InterruptionKind,
        /// When the node goes.
        deadline: Option<UnixMillis>,
        /// When the notice was seen.
        noticed_at: Option<UnixMillis>,
    },
    /// A prefetch batch settled.
    ImagesPrefetched {
        /// The node.
        node_id: NodeId,
        /// Per image.
        results: Vec<ImagePrefetchResult>,
    },
    /// Manager appended to its audit log.
    AuditAppended(AuditEntry),
    /// A node's tags changed.
    NodeTagsUpdated {
        /// The node.
        node_id: NodeId,
        /// The whole tag set after the change.
        tags: BTreeMap<String, String>,
    },
    /// An event kind this build does not know (a newer Manager); kept so it
    /// can be logged, otherwise ignored.
    Unknown,
}
