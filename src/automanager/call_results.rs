//! What Manager answered to the core's calls: the result of every RPC routed
//! to the concern that issued it, and for placement's own calls — `StartJob`
//! and the node provisions — what a success or a refusal means for the job:
//! counted as placed or dispatch-failed, the recovery context kept or
//! dropped, a phantom node forgotten, and a start refused because Manager
//! still holds the instance on a stopping node turned into a wait for that
//! instance (never a node fault, never a spare consumed).

use std::collections::BTreeSet;

use crate::model::{BundleId, BundleState, InstanceKey, JobId, NodeId, NodePhase, ReplicaJob, UnixMillis};

use super::binding::{AwaitedStop, StopWait, StoppingInstance};
use super::core::AutoManagerCore;
use super::notification::Notification;
use super::outbox::Pending;
use super::protocol::{CommandError, RequestId, Rpc, RpcFailure, RpcFailureKind};
use super::recovery::MIN_RECOVERY_INTERVAL_MS;
use super::spares::state::is_spare_tagged;

impl AutoManagerCore {
    pub(super) fn rpc_result(&mut self, id: RequestId, result: Result<(), RpcFailure>, now: UnixMillis) {
        let Some(pending) = self.outbox.answered(id) else {
            return;
        };
        self.settle_create(&pending, &result);
        // A terminate Manager did not hear is sent again (below): a drain
        // waiting on it waits for that answer instead.
        if let Pending::TerminateNode(node_id) = &pending
            && !is_unheard(&result)
        {
            self.drain_terminate_settled(node_id, result.as_ref().err());
        }
        match pending {
            Pending::Command {
                id: command,
                revives,
                started,
                deletes,
            } => {
                if result.is_ok() {
                    self.command_carried_out(revives, started, deletes);
                }
                self.reply(command, result.map_err(CommandError::Manager));
            }
            Pending::Toggle(job_id) => {
                self.manual
                    .toggle_result(&self.facts, &mut self.outbox, &job_id, result, now);
            }
            Pending::ManualStop(job_id) => self.manual.stop_result(&mut self.outbox, &job_id, result, now),
            Pending::TerminateNode(node_id) => self.terminate_result(node_id, result),
            Pending::StartJob {
                job_id,
                instance_key,
                node_id,
            } => self.start_result(&job_id, (instance_key, node_id), id, result, now),
            Pending::CreateNode { node_id, for_job } => self.create_result(&node_id, &for_job, result, now),
            Pending::Subsystem(call) => self
                .subsystems
                .answered(call, result, &mut self.facts, &mut self.outbox, now),
            Pending::Migration { migration_id, call } => {
                self.saga().migration_call_result(&migration_id, call, result, now)
            }
            Pending::UndoStart {
                job_id,
                instance_key,
                node_id,
            } => self.undo_start_result(id, &job_id, instance_key, node_id, result, now),
            Pending::Verdict => {
                if let Err(failure) = result
                    && failure.kind != RpcFailureKind::Rejected
                {
                    self.notify(Notification::Error {
                        message: failure.message,
                    });
                }
            }
        }
    }

    /// What the answer to a node's create means beyond its provision. A
    /// node created after this core gave up on it (its provision timed out
    /// and was terminated while the create was still on its way) exists
    /// now: it is terminated again, or it would run on, leaked. A create
    /// that timed out may have been carried out: the node is forgotten like
    /// any failed provision, and terminated should it appear (see
    /// `terminate_unheard_create`).
    fn settle_create(&mut self, pending: &Pending, result: &Result<(), RpcFailure>) {
        let Some(node_id) = pending.created_node() else {
            return;
        };
        match result {
            Ok(()) if self.facts.fleet.get(node_id).is_some_and(|n| n.terminated) => {
                self.call(
                    Rpc::TerminateNode {
                        node_id: node_id.clone(),
                    },
                    Pending::TerminateNode(node_id.clone()),
                );
            }
            Err(failure) if failure.kind == RpcFailureKind::Transient => {
                self.unheard_creates.insert(node_id.clone());
            }
            _ => {}
        }
    }

    /// A command Manager carried out: the bundle it names is revived (a
    /// delete marks it deleting first) and the applied spec's manual jobs
    /// are wanted as it says.
    fn command_carried_out(
        &mut self,
        revives: Option<BundleId>,
        started: Option<(BundleId, BTreeSet<ReplicaJob>)>,
        deletes: bool,
    ) {
        if let Some(bundle_id) = revives {
            if deletes && let Some(bundle) = self.facts.bundles.get_mut(&bundle_id) {
                bundle.state = BundleState::Deleting;
            }
            self.revive(&bundle_id);
        }
        if let Some((bundle_id, started)) = started {
            self.manual.want(bundle_id, started);
        }
    }

    /// The answer to a `TerminateNode`.
    fn terminate_result(&mut self, node_id: NodeId, result: Result<(), RpcFailure>) {
        let unheard = is_unheard(&result);
        match result {
            // Manager no longer knows it (it never came up, or is gone
            // already): forget it, or it would count against its tier's
            // `maxNodes` forever — unless its create is still on its way:
            // it may yet exist.
            Err(failure) if failure.kind == RpcFailureKind::NotFound => {
                if !self.creating(&node_id) {
                    self.facts.fleet.remove(&node_id);
                }
            }
            // Not heard: the node would run (and cost) on, taking nothing,
            // counted against its tier's `maxNodes`. It is told again;
            // `nodeTerminated` fired once, when it was first issued.
            Err(_)
                if unheard
                    && self
                        .facts
                        .fleet
                        .get(&node_id)
                        .is_some_and(|n| n.phase != NodePhase::Stopped) =>
            {
                self.call(
                    Rpc::TerminateNode {
                        node_id: node_id.clone(),
                    },
                    Pending::TerminateNode(node_id),
                );
            }
            Err(failure) => {
                self.notify(Notification::Error {
                    message: format!("terminating {node_id} failed: {}", failure.message),
                });
                self.notify(Notification::TerminateRefused {
                    node_id,
                    reason: failure.message,
                });
            }
            Ok(()) => {}
        }
    }

    /// The answer to the stop of an instance that is not its job's
    /// placement (a timed-out start's, or a predecessor's stray).
    fn undo_start_result(
        &mut self,
        id: RequestId,
        job_id: &JobId,
        instance_key: InstanceKey,
        node_id: NodeId,
        result: Result<(), RpcFailure>,
        now: UnixMillis,
    ) {
        // Not heard either: told again, the gate still shut.
        if is_unheard(&result) && self.facts.fleet.get(&node_id).is_some_and(|n| !n.is_going()) {
            return self.undo_start(job_id, instance_key, node_id);
        }
        if let Some(mut record) = self.facts.jobs.get_mut(job_id).filter(|r| r.in_flight == Some(id)) {
            record.in_flight = None;
            // It existed and is stopping: its replacement (same key) waits
            // for its `Stopped`, as after a failure.
            if result.is_ok() {
                record.stopping = Some(AwaitedStop {
                    instance: StoppingInstance {
                        node_id: node_id.clone(),
                        instance_key: instance_key.clone(),
                        since: now,
                    },
                    wait: StopWait::FailedOnLiveNode,
                });
            }
        }
        if let Err(failure) = result
            && failure.kind != RpcFailureKind::NotFound
        {
            self.notify(Notification::Error {
                message: format!(
                    "stopping {job_id}'s instance {instance_key} on {node_id}, which is not its placement \
                     (a timed-out start's, or a predecessor's), failed: {}",
                    failure.message
                ),
            });
        }
    }

    /// A node whose create timed out has appeared after all: Manager
    /// carried the create out. Its provision was given up (its jobs placed
    /// elsewhere, nothing counts on it), so it is terminated rather than
    /// left running, leaked.
    pub(super) fn terminate_unheard_create(&mut self, node_id: &NodeId) {
        if self.unheard_creates.remove(node_id) {
            self.terminate(node_id);
        }
    }

    /// Whether a call creating `node_id` awaits its answer.
    fn creating(&self, node_id: &NodeId) -> bool {
        self.outbox.pending.values().any(|p| p.created_node() == Some(node_id))
    }

    fn start_result(
        &mut self,
        job_id: &JobId,
        (instance_key, node_id): (InstanceKey, NodeId),
        id: RequestId,
        result: Result<(), RpcFailure>,
        now: UnixMillis,
    ) {
        // Not heard — or heard, the answer lost: Manager may hold the
        // instance already, where the job is no longer placed.
        let undo = matches!(&result, Err(f) if f.kind == RpcFailureKind::Transient) && self.node_still_up(job_id);
        let Some(mut record) = self.facts.jobs.get_mut(job_id).filter(|r| r.in_flight == Some(id)) else {
            return;
        };
        record.in_flight = None;
        // While the gate was shut the job could not be placed again, so a
        // binding now is normally the one this start was for. None, or
        // another, means the job left it meanwhile (its node lost, a
        // migration ending onto another instance): an instance Manager
        // created for it — accepted, or perhaps, the answer lost — is
        // stopped, never left running beside the job as an orphan.
        let started_here = record
            .binding
            .as_ref()
            .is_some_and(|b| b.instance_key == instance_key && b.node_id == node_id);
        drop(record);
        if !started_here {
            let node_up = self.node_up(&node_id);
            let may_exist = result.is_ok() || matches!(&result, Err(f) if f.kind == RpcFailureKind::Transient);
            if may_exist && node_up && self.facts.jobs.get(job_id).is_some_and(|r| r.in_flight.is_none()) {
                self.undo_start(job_id, instance_key, node_id);
            }
            return;
        }
        let Some(mut guard) = self.facts.jobs.get_mut(job_id) else {
            return;
        };
        let record = &mut *guard;
        let Some(binding) = record.binding.as_mut() else {
            return;
        };
        let counted = std::mem::replace(&mut binding.uncounted, false);
        match result {
            Ok(()) => {
                // The re-placement is done: its context (the nodes to keep
                // away from) is kept until here, so a refused provision or
                // dispatch never sends the job back to the node it failed on.
                record.recovery = None;
                // Manager took the instance key: whatever it held on a
                // stopping node no longer stands in the way.
                if record
                    .stopping
                    .as_ref()
                    .is_some_and(|s| s.wait != StopWait::FailedOnLiveNode)
                {
                    record.stopping = None;
                }
                if counted {
                    self.counters.placements_succeeded += 1;
                }
            }
            Err(failure) => {
                if counted {
                    self.counters.placements_dispatch_failed += 1;
                }
                // Retried no sooner than a recovery would be.
                record.not_before = now + MIN_RECOVERY_INTERVAL_MS;
                let refused_key = binding.instance_key.clone();
                let refused_node = binding.node_id.clone();
                drop(guard);
                let held = self.held_on_stopping_node(job_id, &refused_key, &failure, now);
                // The refusal is no fault of the node it was placed on: its
                // health is not touched, and a spare stays a spare (only an
                // accepted start consumes one) — a single-use job never ran
                // there, so it does not take the spare down either.
                let on_spare = self
                    .facts
                    .jobs
                    .get(job_id)
                    .and_then(|r| r.binding.as_ref())
                    .and_then(|b| self.facts.fleet.get(&b.node_id))
                    .is_some_and(is_spare_tagged);
                // A start that timed out may have run there, though: a
                // single-use job's node is not left for reuse then.
                self.unbind(job_id, !on_spare || undo);
                // What the timed-out start may have created is stopped before
                // the job is placed again (the gate stays shut until Manager
                // answers), so it is never an orphan beside the instance
                // placed next, nor stopped in its place.
                if undo {
                    self.undo_start(job_id, refused_key.clone(), refused_node);
                }
                let message = match held {
                    Some(old) => format!(
                        "StartJob for {job_id} refused: Manager still holds instance {} on stopping node \
                         {old}; recovered once it is gone ({})",
                        refused_key.0, failure.message
                    ),
                    None => format!("StartJob for {job_id} failed: {}", failure.message),
                };
                self.notify(Notification::Error { message });
            }
        }
    }

    /// `StopJob` of the instance a timed-out start of `job_id` may have
    /// created; the in-flight gate stays shut for it.
    pub(super) fn undo_start(&mut self, job_id: &JobId, instance_key: InstanceKey, node_id: NodeId) {
        let rpc = Rpc::StopJob {
            job_id: job_id.clone(),
            instance_key: instance_key.clone(),
            node_id: node_id.clone(),
        };
        let id = self.call(
            rpc,
            Pending::UndoStart {
                job_id: job_id.clone(),
                instance_key,
                node_id,
            },
        );
        if let Some(mut record) = self.facts.jobs.get_mut(job_id) {
            record.in_flight = Some(id);
        }
    }

    /// Whether the node `job_id` is bound to still runs and is not on its
    /// way out, terminated or not (an instance there would live on).
    fn node_still_up(&self, job_id: &JobId) -> bool {
        self.facts
            .jobs
            .get(job_id)
            .and_then(|r| r.binding.as_ref())
            .is_some_and(|b| self.node_up(&b.node_id))
    }

    /// Whether `node_id` still runs and is not on its way out.
    fn node_up(&self, node_id: &NodeId) -> bool {
        self.facts
            .fleet
            .get(node_id)
            .is_some_and(|n| !n.is_going() && n.phase != NodePhase::Stopped)
    }

    /// A start refused as `AlreadyExists` while the job's previous
    /// instance (same key) was lost with a node that is still stopping:
    /// Manager holds that instance until the node has stopped, so the job
    /// waits for it to go instead of being retried (and placed, perhaps
    /// provisioned, elsewhere) meanwhile. Returns the stopping node.
    fn held_on_stopping_node(
        &mut self,
        job_id: &JobId,
        refused_key: &InstanceKey,
        failure: &RpcFailure,
        now: UnixMillis,
    ) -> Option<NodeId> {
        if failure.kind != RpcFailureKind::AlreadyExists {
            return None;
        }
        let record = self.facts.jobs.get(job_id)?;
        let awaited = record
            .stopping
            .as_ref()
            .filter(|s| s.wait == StopWait::LostWithStoppingNode && &s.instance.instance_key == refused_key)?;
        let old = awaited.instance.node_id.clone();
        let stopping = self
            .facts
            .fleet
            .get(&old)
            .is_some_and(|n| n.phase == NodePhase::Stopping);
        if !stopping {
            return None;
        }
        let mut record = self.facts.jobs.get_mut(job_id)?;
        if let Some(awaited) = record.stopping.as_mut() {
            awaited.wait = StopWait::HeldOnStoppingNode;
            awaited.instance.since = now;
        }
        Some(old)
    }

    fn create_result(&mut self, node_id: &NodeId, for_job: &JobId, result: Result<(), RpcFailure>, now: UnixMillis) {
        let counted = self
            .facts
            .jobs
            .get_mut(for_job)
            .is_some_and(|mut r| match r.binding.as_mut() {
                Some(b) if &b.node_id == node_id => std::mem::replace(&mut b.uncounted, false),
                _ => false,
            });
        let Err(failure) = result else {
            if counted {
                self.counters.placements_succeeded += 1;
            }
            return;
        };
        if counted {
            self.counters.placements_dispatch_failed += 1;
        }
        // No phantom node: it is forgotten, its jobs re-placed, and what
        // refused held back so the next shape or tier is tried. (The kept
        // view, should it hold it as a prospective node, sees a node the
        // fleet does not and is built again.)
        if let Some(node) = self.facts.fleet.remove(node_id)
            && let Some(p) = node.provisioned
        {
            self.facts.placed_with.provision_refused(&p, failure.kind, now);
        }
        for mut record in self.facts.jobs.values_mut() {
            if record.is_bound_to(node_id) {
                record.binding = None;
                // A recovery's next attempt keeps its spacing.
                if record.recovery.is_some() {
                    let earliest = record
                        .last_recovery_at
                        .map_or(now, |last| last + MIN_RECOVERY_INTERVAL_MS);
                    record.not_before = record.not_before.max(earliest);
                }
            }
        }
        self.notify(Notification::Error {
            message: format!("provisioning {node_id} failed: {}", failure.message),
        });
    }
}

/// Whether a call's answer says Manager may not have heard it (it timed
/// out, or the connection went): what it asked for may or may not be done.
fn is_unheard(result: &Result<(), RpcFailure>) -> bool {
    matches!(result, Err(f) if f.kind == RpcFailureKind::Transient)
}
