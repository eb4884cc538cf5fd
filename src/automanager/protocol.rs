//! What goes into the core and what comes out of it: the inputs
//! ([`Input`]: Manager's events, commands, RPC results, timers), the
//! actions a step holds ([`Action`]: Manager RPCs, notifications, command
//! replies) and the errors a command can end in.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::{
    Bundle, BundleId, BundleJobRef, HotSpareSpec, InstanceKey, JobId, LaunchMode, ManagerEvent, MigrationId, NodeId,
    PlacementPool, ProviderKind, SpareSpec, TerminalVerdict, UnixMillis,
};
use crate::placement::BundleIssue;

use super::drain::state::{DrainOptions, InterruptionNotice};
use super::migration::refusal::MigrationRefusal;
use super::migration::state::{MigrationOptions, MigrationStep};
use super::notification::Notification;
use super::settings::AutoSettingsIssue;
use super::spares::diff::HotSpareSpecsDiff;

/// Identifies one RPC the core asked for, so its result finds its way back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RequestId(pub u64);

/// Identifies one command, so its reply finds its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct CommandId(pub u64);

/// A change asked of the core by its user.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// `createBundle`: validated, then stored on Manager (which expands it).
    CreateBundle(Bundle),
    /// `updateBundle`: always `state: live`; clears the broken mark and the
    /// restart history of the bundle's jobs.
    UpdateBundle(Bundle),
    /// `deleteBundle`: Manager's stop-then-delete saga.
    DeleteBundle(BundleId),
    /// `startBundleJob`: activates a dormant (`startMode: manual`) job and
    /// wants it running from then on.
    StartBundleJob(BundleJobRef),
    /// `stopBundleJob`: flips a manual job back to dormant and takes it off
    /// its node (its instance stopped, not recovered).
    StopBundleJob(BundleJobRef),
    /// `setTemplateImages`: what warmth is scored against.
    SetTemplateImages(BTreeMap<String, Vec<String>>),
    /// `cordonNode`: no new placements land on the node.
    CordonNode(NodeId),
    /// `uncordonNode`: the reverse; cancels a drain that has not issued its
    /// terminate and withdraws an interruption notice with it.
    UncordonNode(NodeId),
    /// `terminateNode`: terminate without cordoning.
    TerminateNode(NodeId),
    /// `evictNode`: cordon, then terminate at once.
    EvictNode(NodeId),
    /// `drainNode`: cordon, migrate every job away, terminate once empty.
    DrainNode {
        node_id: NodeId,
        /// Timeout, force, per-job strategy.
        options: DrainOptions,
    },
    /// `handleNodeInterruption`: a forced drain cut to fit the deadline.
    HandleNodeInterruption {
        node_id: NodeId,
        /// Kind, deadline, per-job strategy.
        notice: InterruptionNotice,
    },
    /// `migrateJob`: answered with [`Answer::Migration`] once the target is
    /// placed (its `StartJob` dispatched, or its node being provisioned).
    MigrateJob {
        /// The job to move.
        job_id: JobId,
        /// Strategy, pin, reservation override.
        options: MigrationOptions,
    },
    /// `abortMigration`: a clean rollback, only before the point of no
    /// return.
    AbortMigration {
        migration_id: MigrationId,
        /// Why (reported with `migrationAborted`).
        reason: String,
    },
    /// Replaces the placement pools live (no reconnect): validated with
    /// the rest of the settings, refused as a whole if any pool is invalid.
    SetPlacementPools(Vec<PlacementPool>),
    /// `updateHotSpareSpecs(list)`: replaces the live `hotSpares` list (no
    /// reconnect), validated as at boot and refused whole; answered with
    /// [`Answer::HotSpares`], what changed per pool.
    UpdateHotSpareSpecs(Vec<HotSpareSpec>),
    /// `updateHotSpareNode`: edits one live spare's `SpareSpec`, written to
    /// its tags.
    UpdateHotSpareNode {
        /// The spare.
        node_id: NodeId,
        /// Its new spec.
        spec: SpareSpec,
    },
    /// What a person declares a node to be (a NorskNode's
    /// `spec.inventory`; `None` withdraws it): placement reads it where
    /// Manager reports no inventory — a cluster server on a Manager
    /// without the inventory addition.
    DeclareInventory {
        /// The node (it need not be known yet).
        node_id: NodeId,
        /// What it holds.
        inventory: Option<crate::model::NodeInventory>,
    },
}

impl Command {
    /// What a standby applies at once rather than holding for its
    /// promotion: the live settings, and what people declared of a node (a
    /// cordon, an inventory). The standby's first round as leader must
    /// already place with them; and its caller, which waits for each
    /// answer before it calls the standby ready to lead, would otherwise
    /// wait for a promotion that waits for it. None of them calls Manager:
    /// a core that is not hydrated takes no step.
    pub fn applies_in_standby(&self) -> bool {
        matches!(
            self,
            Self::SetPlacementPools(_)
                | Self::SetTemplateImages(_)
                | Self::UpdateHotSpareSpecs(_)
                | Self::DeclareInventory { .. }
                | Self::CordonNode(_)
                | Self::UncordonNode(_)
        )
    }
}

/// A command's answer when it has more to say than "done".
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "camelCase")]
pub enum Answer {
    /// `migrateJob`: the migration started.
    Migration(MigrationId),
    /// `updateHotSpareSpecs`: what changed, keyed by pool.
    HotSpares(HotSpareSpecsDiff),
}

/// How a failed RPC should be treated (the client's classification).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RpcFailureKind {
    /// Manager unreachable or timed out.
    Transient,
    /// The provider has no capacity for that shape there.
    InsufficientCapacity,
    /// The thing named does not exist.
    NotFound,
    /// It exists already with a different spec.
    AlreadyExists,
    /// Refused as invalid or out of order.
    Rejected,
}

/// A failed RPC.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{message}")]
pub struct RpcFailure {
    /// How to treat it.
    pub kind: RpcFailureKind,
    /// Manager's words.
    pub message: String,
}

/// One input to the core.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// An event from Manager's stream (the snapshot's events, then
    /// `InitialDataComplete`, then live ones).
    Event(Box<ManagerEvent>),
    /// A command from the user.
    Command {
        /// Echoed in the reply.
        id: CommandId,
        /// What to do.
        command: Command,
    },
    /// The result of an RPC the core asked for.
    RpcResult {
        /// The request.
        id: RequestId,
        /// Its outcome.
        result: Result<(), RpcFailure>,
    },
    /// What the Manager at hand serves beyond the published API: told on
    /// each connection and whenever an addition is found missing.
    ManagerCapabilities(crate::model::manager::Capabilities),
    /// The timer deadline of the previous step was reached.
    Timer,
    /// `close()`: no timer runs and nothing is hydrated or placed any more.
    Close,
}

/// A Manager RPC the core asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Rpc {
    /// `StartJob`: one instance on a node.
    StartJob {
        job_id: JobId,
        /// The key the instance wears.
        instance_key: InstanceKey,
        /// Where.
        node_id: NodeId,
        /// The GPU device placement chose.
        gpu_index: Option<u32>,
        /// The slot told to the runtime (`NORSK_RUNTIME_ROLE`).
        runtime_role: String,
    },
    /// `CreateAwsNode` / `CreateOciNode`, with the deterministic node id and
    /// the pool/tier tags.
    CreateNode {
        /// `aws` or `oci`.
        provider: ProviderKind,
        /// The id chosen here (idempotent on Manager).
        node_id: NodeId,
        /// pool, tier, provisionedFor.
        tags: BTreeMap<String, String>,
        /// Region.
        region: String,
        /// The tier's OCI availability domain, when it names one.
        availability_domain: Option<String>,
        /// Instance type or shape.
        instance_type: String,
        /// The tier's launch mode.
        launch_mode: Option<LaunchMode>,
        /// The tier's root volume (aws tiers only).
        root_volume: Option<crate::model::RootVolume>,
    },
    /// `TerminateNode`.
    TerminateNode { node_id: NodeId },
    /// `SetTerminalVerdict`: a broken bundle, or a dropped job.
    SetTerminalVerdict {
        bundle_id: BundleId,
        /// The job, for a dropped job.
        job_id: Option<JobId>,
        verdict: TerminalVerdict,
        /// The bundle generation it was decided for: Manager refuses it
        /// once the bundle has been updated, as an update clears verdicts.
        generation: u64,
    },
    /// `CreateBundle`.
    CreateBundle(Bundle),
    /// `UpdateBundle`.
    UpdateBundle(Bundle),
    /// `DeleteBundle`.
    DeleteBundle(BundleId),
    /// `StartBundleJob`.
    StartBundleJob(BundleJobRef),
    /// `StopBundleJob`.
    StopBundleJob(BundleJobRef),
    /// `CompleteJob` (published): the job's window is over; Manager stops
    /// its instances and moves it to `POST`.
    CompleteJob { job_id: JobId },
    /// `UpdateNodeTags`: sets then removes tags (a spare's `spare`,
    /// `warmFor`, `reservedFor`, `exclusive`).
    UpdateNodeTags {
        node_id: NodeId,
        /// Tags to set.
        set: BTreeMap<String, String>,
        /// Tags to remove.
        remove: Vec<String>,
    },
    /// `PrefetchImages`: a spare pulls its `warmFor` images; answered by an
    /// `images_prefetched` event.
    PrefetchImages {
        node_id: NodeId,
        /// Image references.
        images: Vec<String>,
    },
    /// `CreateJob`: a plain Manager job (a node service's job on one node).
    CreateJob {
        job_id: JobId,
        /// The template it runs.
        template: String,
        tags: BTreeMap<String, String>,
    },
    /// `StartJob` of a migration target: it wears `<slot>@<id>` while told
    /// its slot in `NORSK_RUNTIME_ROLE`; with `defer_start` it is only
    /// created (answered by `job_prepared`).
    StartMigrationTarget {
        job_id: JobId,
        /// The target's key.
        instance_key: InstanceKey,
        /// Where.
        node_id: NodeId,
        /// The GPU device placement chose.
        gpu_index: Option<u32>,
        /// The slot told to the runtime (`NORSK_RUNTIME_ROLE`).
        runtime_role: String,
        /// Create without starting (`stopThenStart`).
        defer_start: bool,
        migration_id: MigrationId,
    },
    /// `StartPreparedJob`: the prepared target starts.
    StartPreparedJob {
        job_id: JobId,
        /// The prepared instance.
        instance_key: InstanceKey,
        /// Where.
        node_id: NodeId,
    },
    /// `StopJob`: one instance (a migration's source, or its target on
    /// abort).
    StopJob {
        job_id: JobId,
        /// The instance.
        instance_key: InstanceKey,
        /// Where.
        node_id: NodeId,
    },
    /// `SendMigrationSignal`: one step relayed to an instance.
    SendMigrationSignal {
        migration_id: MigrationId,
        job_id: JobId,
        /// The source's key.
        source_key: InstanceKey,
        /// The target's key.
        target_key: InstanceKey,
        /// The step.
        signal: MigrationStep,
    },
}

/// Why a command failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum CommandError {
    /// The bundle failed validation; nothing was sent to Manager.
    #[error("the bundle is invalid: {}", .errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    InvalidBundle {
        /// Every error.
        errors: Vec<BundleIssue>,
    },
    /// New settings (pools) were refused; the old ones stay in force.
    #[error("the settings are invalid: {}", .errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    InvalidSettings {
        /// Every problem.
        errors: Vec<AutoSettingsIssue>,
    },
    /// Manager refused or could not be reached.
    #[error("Manager refused: {0}")]
    Manager(RpcFailure),
    /// The core was closed before the command completed.
    #[error("AutoManager is closed")]
    Closed,
    /// The fleet holds no node of that id.
    #[error("no node {0} in the fleet")]
    UnknownNode(NodeId),
    /// The node is stopping, stopped or already terminated.
    #[error("node {0} is already going")]
    NodeGone(NodeId),
    /// `updateHotSpareNode` of a node that is not an unconsumed hot spare.
    #[error("node {0} is not an unconsumed hot spare")]
    NotASpare(NodeId),
    /// `migrateJob` / `abortMigration` refused.
    #[error(transparent)]
    Migration(MigrationRefusal),
    /// `startBundleJob` / `stopBundleJob` of a job that is not
    /// `startMode: manual`.
    #[error(
        "job {job_name} of bundle {bundle_id} is startMode auto: it runs whenever its bundle does; only manual jobs are started and stopped"
    )]
    #[serde(rename_all = "camelCase")]
    NotManualJob {
        bundle_id: BundleId,
        /// The job.
        job_name: String,
    },
    /// `startBundleJob` / `stopBundleJob` of a job or replica the bundle
    /// does not have.
    #[error("bundle {bundle_id} has no replica {replica_index} of a job {job_name}")]
    #[serde(rename_all = "camelCase")]
    UnknownBundleJob {
        bundle_id: BundleId,
        /// The replica asked for.
        replica_index: u32,
        /// The job asked for.
        job_name: String,
    },
}

/// Something the runtime must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Issue an RPC and feed its result back as [`Input::RpcResult`].
    Call {
        /// Echo in the result.
        id: RequestId,
        /// The call.
        rpc: Rpc,
    },
    /// Deliver a notification to subscribers.
    Notify(Notification),
    /// Answer a command's caller.
    Reply {
        command: CommandId,
        /// Its outcome.
        result: Result<(), CommandError>,
    },
    /// Answer a command's caller with a value (see [`Answer`]).
    Answer {
        command: CommandId,
        /// Its outcome.
        result: Result<Answer, CommandError>,
    },
}

/// The result of one [`AutoManagerCore::handle`](crate::automanager::AutoManagerCore::handle).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    /// In order.
    pub actions: Vec<Action>,
    /// Feed [`Input::Timer`] at this instant (none: nothing is waiting).
    pub next_deadline: Option<UnixMillis>,
}
