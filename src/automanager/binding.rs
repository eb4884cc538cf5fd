//! "Where is job J": one record per bundle job. The record holds the job as
//! Manager last described it, its binding (node, instance key, placement of
//! record, phase), its in-flight gate, its restart history, what its next
//! placement must honour (recovery context, earliest attempt) and its
//! migration claim (the target instance of a migration in flight). No other
//! module keeps a second answer to "where is J".

use crate::model::{BundleJobRef, InstanceKey, JobId, MigrationId, NodeId, RuntimeJob, UnixMillis};
use crate::placement::RecoveryContext;

use super::protocol::RequestId;
use super::recovery::RestartHistory;

/// Where a bound instance is in its life, as this core knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindingPhase {
    /// Placed on a node that has not started yet; `StartJob` follows when
    /// it does.
    AwaitingNode,
    /// `StartJob` issued (or Manager reported the instance provisioned).
    Dispatched,
    /// Manager reported the instance running.
    Running,
}

/// The placement of record of one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    pub node_id: NodeId,
    /// The key the instance wears.
    pub instance_key: InstanceKey,
    /// The GPU device placement chose.
    pub gpu_index: Option<u32>,
    /// Where it is in its life.
    pub phase: BindingPhase,
    /// The placement has not yet been counted as succeeded or
    /// dispatch-failed (its first wire call is still to come or pending).
    pub uncounted: bool,
    /// Moved onto a prepared migration target whose `StartPreparedJob` is
    /// not yet answered (a phase deadline, or the source's end, completed
    /// the migration first), nor the instance reported by Manager: Manager
    /// may yet never make it. On a published Manager the start was only
    /// kept by the operator's port, which gives it up at the first try,
    /// heard or not; a try that went unheard may have made nothing. Until
    /// then the job is not accepted there (a spare there stays a spare).
    pub prepared_start_awaited: bool,
}

/// One bundle job.
#[derive(Clone, Debug)]
pub struct JobRecord {
    /// The job as Manager last sent it.
    pub job: RuntimeJob,
    /// Its place in its bundle.
    pub bundle_ref: BundleJobRef,
    /// Its placement of record, if bound.
    pub binding: Option<Binding>,
    /// The in-flight gate: the `StartJob` whose result is awaited. While
    /// set the job is never dispatched (nor placed) again, even if the
    /// binding it was for has ended meanwhile.
    pub in_flight: Option<RequestId>,
    /// History entries already applied.
    pub history_seen: usize,
    /// Restarts in the trailing hour.
    pub restarts: RestartHistory,
    /// Set while the next placement is a re-placement.
    pub recovery: Option<RecoveryContext>,
    /// When the last recovery placement was made (recoveries are spaced by
    /// `MIN_RECOVERY_INTERVAL_MS`).
    pub last_recovery_at: Option<UnixMillis>,
    /// Not placed before this instant.
    pub not_before: UnixMillis,
    /// The last placement found nowhere; retried when the fleet changes.
    pub awaiting_capacity_since: Option<u64>,
    /// Dropped: terminal, never placed again.
    pub dropped: bool,
    /// Its window was seen over, and its bundle not updated since: a
    /// snapshot putting the window back is an older one, delivered late.
    pub window_over: bool,
    /// An instance Manager may still hold: one that failed and is being
    /// stopped (its `Stopping` seen, not yet its `Stopped`), or one lost
    /// with a node that is stopping. The replacement wears the same
    /// instance key, so while it is awaited (see [`StopWait`]) the
    /// replacement is not started.
    pub stopping: Option<AwaitedStop>,
    /// The migration in flight, if any: no second one starts while it is
    /// set ("no concurrent migrations per job").
    pub migration: Option<MigrationClaim>,
    /// Its instance went with a node while the core was hydrating (a
    /// standby following its leader): judged by the failure policy once
    /// hydrated, unless Manager shows it placed again or ended first. A
    /// leader that died before it saw the loss never judged it.
    pub unjudged_loss: Option<UnjudgedLoss>,
}

/// A loss seen while hydrating, for the failure policy to judge once
/// hydrated (see [`JobRecord::unjudged_loss`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnjudgedLoss {
    /// The instance, where it ran.
    pub lost: Binding,
    /// Lost with a node Manager reported stopping (it may still hold the
    /// instance there) rather than stopped.
    pub node_stopping: bool,
    /// Whether its node was reclaimed after an interruption notice (not
    /// counted against the restart ceiling).
    pub reclaimed: bool,
    /// When.
    pub at: UnixMillis,
}

/// A migration's claim on its job: the target instance, reserved on its
/// node beside the source ("during the overlap the job is reserved on both
/// nodes") until the migration ends; at `done` it becomes the binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrationClaim {
    pub migration_id: MigrationId,
    /// The target: its node, key, GPU and phase.
    pub target: Binding,
}

/// An instance Manager is stopping (or may still hold although the job has
/// left it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoppingInstance {
    /// Where it ran.
    pub node_id: NodeId,
    /// The key it wears.
    pub instance_key: InstanceKey,
    /// When its failure was seen (or the wait for it began); its
    /// replacement waits for it until `FAILED_INSTANCE_STOP_GRACE_MS` after
    /// this at most.
    pub since: UnixMillis,
}

/// An instance a job's replacement may have to wait for, and what for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwaitedStop {
    pub instance: StoppingInstance,
    /// What the replacement waits for.
    pub wait: StopWait,
}

/// What the replacement of an instance Manager may still hold waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopWait {
    /// The instance failed on a node that stays up: the replacement waits
    /// for its `Stopped` (or for its node to go).
    FailedOnLiveNode,
    /// The instance was lost with a node that is stopping. Recovery is
    /// prompt ("`onNodeStopping` is the prompt worker-dropped signal"), so
    /// nothing is awaited yet; should Manager refuse the replacement's start
    /// because it still holds this instance there, the wait becomes
    /// [`StopWait::HeldOnStoppingNode`].
    LostWithStoppingNode,
    /// Manager refused the replacement's start (`AlreadyExists`) because
    /// it still holds this instance on its stopping node: the job is
    /// recovered once the instance is gone (its `Stopped`, or the node's
    /// `NodeStopped`), not retried against Manager meanwhile.
    HeldOnStoppingNode,
}

impl JobRecord {
    /// A fresh record for a bundle job.
    pub fn new(job: RuntimeJob, bundle_ref: BundleJobRef) -> Self {
        Self {
            job,
            bundle_ref,
            binding: None,
            in_flight: None,
            history_seen: 0,
            restarts: RestartHistory::default(),
            recovery: None,
            last_recovery_at: None,
            not_before: UnixMillis::MIN,
            awaiting_capacity_since: None,
            dropped: false,
            window_over: false,
            stopping: None,
            migration: None,
            unjudged_loss: None,
        }
    }

    /// The job id.
    pub fn job_id(&self) -> &JobId {
        &self.job.job_id
    }

    /// The migration target's placement, while a migration is in flight.
    pub fn migration_target(&self) -> Option<&Binding> {
        self.migration.as_ref().map(|c| &c.target)
    }

    /// Whether the job is bound to `node`.
    pub fn is_bound_to(&self, node: &NodeId) -> bool {
        self.binding.as_ref().is_some_and(|b| &b.node_id == node)
    }

    /// The node Manager accepted this job's instance on: its `StartJob`
    /// succeeded, or Manager reported the instance provisioned or running
    /// there. A binding still awaiting its node, or whose `StartJob` (or,
    /// moved onto a prepared migration target, `StartPreparedJob`) result
    /// is still to come, is not accepted: Manager may yet refuse it. This
    /// is what consumes a hot spare ("a spare that picks up a job is no
    /// longer a spare").
    pub fn accepted_on(&self) -> Option<&NodeId> {
        self.binding
            .as_ref()
            .filter(|b| match b.phase {
                BindingPhase::AwaitingNode => false,
                BindingPhase::Dispatched => self.in_flight.is_none() && !b.prepared_start_awaited,
                BindingPhase::Running => true,
            })
            .map(|b| &b.node_id)
    }
}
