//! What the core sends out and what it waits for: the [`Outbox`] keeps
//! each Manager call with what it was for ([`Pending`]) until its answer
//! comes back, and the notifications and command replies of the step.
//! Every subsystem is handed it to act; the core hands its actions to the
//! runtime at the end of each step.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{BundleId, InstanceKey, JobId, MigrationId, NodeId, ReplicaJob};

use super::migration::state::MigrationCall;
use super::node_services::state::ServiceRequest;
use super::notification::Notification;
use super::protocol::{Action, CommandId, RequestId, Rpc};
use super::spares::state::SpareRequest;

/// What an outstanding RPC was for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Pending {
    /// The job, and the instance it asked for where (undone when the
    /// answer finds the job placed otherwise).
    StartJob {
        job_id: JobId,
        instance_key: InstanceKey,
        node_id: NodeId,
    },
    CreateNode {
        node_id: crate::model::NodeId,
        for_job: JobId,
    },
    TerminateNode(crate::model::NodeId),
    /// A call of a migration's saga.
    Migration {
        migration_id: MigrationId,
        call: MigrationCall,
    },
    /// The `StopJob` of the instance a timed-out `StartJob` may have
    /// created (the job placed again once it is answered); nothing there to
    /// stop is what it was for.
    UndoStart {
        job_id: JobId,
        instance_key: crate::model::InstanceKey,
        node_id: NodeId,
    },
    /// A `SetTerminalVerdict`: Manager refusing it means the bundle was
    /// updated since (the verdict is moot), which is no error.
    Verdict,
    /// A command's RPC; on success the bundle named is revived (an update
    /// or delete clears its broken mark and restart histories) and the
    /// applied spec's manual jobs are wanted as it says.
    Command {
        id: CommandId,
        revives: Option<BundleId>,
        started: Option<(BundleId, BTreeSet<ReplicaJob>)>,
        /// A `DeleteBundle`: once Manager took it, the bundle is being
        /// deleted and none of its jobs is placed again, whichever of the
        /// answer and Manager's own `deleting` comes first.
        deletes: bool,
    },
    /// A `StartBundleJob` / `StopBundleJob` bringing a manual job to its
    /// wanted state.
    Toggle(JobId),
    /// The `StopJob` of a manual job that is no longer wanted.
    ManualStop(JobId),
    /// A call of a subsystem, answered to it alone.
    Subsystem(SubsystemCall),
}

impl Pending {
    /// The node this call creates, a job's or a spare's
    /// `CreateNode`.
    pub(super) fn created_node(&self) -> Option<&NodeId> {
        match self {
            Pending::CreateNode { node_id, .. }
            | Pending::Subsystem(SubsystemCall::Spare(SpareRequest::Provision { node_id, .. })) => Some(node_id),
            _ => None,
        }
    }
}

/// A subsystem's call, by subsystem: one variant per subsystem listed in
/// `subsystem::subsystems!`, holding its `Subsystem::Call`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum SubsystemCall {
    /// The `CompleteJob` of a job whose bundle's schedule ended.
    Schedule(JobId),
    /// A hot-spare reconciler RPC.
    Spare(SpareRequest),
    /// A node-service placement RPC.
    NodeService(ServiceRequest),
    /// Headroom makes no calls: the variant exists so that every
    /// subsystem has one, and no value of it can.
    #[expect(dead_code, reason = "NoCall has no values")]
    Headroom(NoCall),
}

/// The call type of a subsystem that makes no calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum NoCall {}

/// What the core sends out: Manager calls, each kept with what it was for
/// until its answer comes back, notifications and command replies, in the
/// order a step made them. A step hands its actions to the runtime; the
/// calls' purposes stay until answered (a successor core takes over those
/// whose answers still matter, see [`AutoManagerCore::succeeding`]).
#[derive(Clone, Debug, Default)]
pub(super) struct Outbox {
    /// This step's actions so far.
    actions: Vec<Action>,
    /// Calls sent and not yet answered, with what each was for.
    pub(super) pending: BTreeMap<RequestId, Pending>,
    /// The last request id given out (a successor keeps counting).
    next_request: u64,
}

impl Outbox {
    /// This step's actions, handed to the runtime.
    pub(super) fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// Sends `rpc`, kept as `pending` until answered.
    pub(super) fn call(&mut self, rpc: Rpc, pending: Pending) -> RequestId {
        self.next_request += 1;
        let id = RequestId(self.next_request);
        self.pending.insert(id, pending);
        self.actions.push(Action::Call { id, rpc });
        id
    }

    /// Keeps counting request ids from where `previous` stopped, so an
    /// answer to a predecessor's call is never taken for one of this core's.
    pub(super) fn continue_from(&mut self, previous: &Outbox) {
        self.next_request = previous.next_request;
    }

    /// Sends a notification.
    pub(super) fn notify(&mut self, notification: Notification) {
        self.actions.push(Action::Notify(notification));
    }

    /// Sends a command's reply (or answer).
    pub(super) fn reply(&mut self, action: Action) {
        self.actions.push(action);
    }

    /// Whether a stop of instance `key` of `job_id` on `node_id` that
    /// undoes a start or a stray is on its way: the instance is going,
    /// whatever Manager's history says of it yet.
    pub(super) fn stopping(&self, job_id: &JobId, key: &InstanceKey, node_id: &NodeId) -> bool {
        self.pending.values().any(|p| {
            matches!(p, Pending::UndoStart { job_id: j, instance_key: k, node_id: n }
                if j == job_id && k == key && n == node_id)
        })
    }

    /// What call `id` was for, now that it is answered; `None` for a call
    /// this core does not wait on.
    pub(super) fn answered(&mut self, id: RequestId) -> Option<Pending> {
        self.pending.remove(&id)
    }
}
