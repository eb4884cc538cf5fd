//! Driving the saga on what Manager reports: the target's and the source's
//! history (provisioned, running, stopping, stopped), `job_prepared`, the
//! handover's `migration_signal`s, a target's rejection, a node lost, the
//! job ending, and the answers to the saga's own calls. While a migration
//! is in flight its two instances are the saga's to follow: the source
//! stopping on request does not end the job's binding.

use super::Saga;
use crate::automanager::binding::BindingPhase;
use crate::automanager::notification::Notification;
use crate::automanager::protocol::{RpcFailure, RpcFailureKind};
use crate::automanager::recovery::MIN_RECOVERY_INTERVAL_MS;
use crate::model::{
    InstanceKey, JobHistoryEntry, JobId, JobStopReason, MigrationId, MigrationPhase, MigrationSignal,
    MigrationStrategy, NodeId, UnixMillis,
};

use super::state::{CutOver, MigrationCall, MigrationStep};
use super::wind_down::Target;

/// Which of a migration's instances a report is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Instance {
    Source,
    Target,
}

impl Saga<'_> {
    /// The migration in flight of `job`, with which of its instances
    /// `role` on `node` is.
    fn instance_of(&self, job: &JobId, role: &InstanceKey, node: Option<&NodeId>) -> Option<(MigrationId, Instance)> {
        let claim = self.facts.jobs.get(job)?.migration.as_ref()?;
        let state = self.migrations.get(&claim.migration_id)?;
        let at = |n: &NodeId| node.is_none_or(|node| node == n);
        let which = if role == &state.target_key && at(&state.target_node_id) {
            Instance::Target
        } else if role == &state.source_key && at(&state.source_node_id) {
            Instance::Source
        } else {
            return None;
        };
        Some((claim.migration_id.clone(), which))
    }

    /// A history entry of a job with a migration in flight; true when it
    /// was the saga's (the ordinary binding rules must not see it).
    pub(crate) fn migration_observes(&mut self, job: &JobId, entry: &JobHistoryEntry, now: UnixMillis) -> bool {
        let (role, node) = match entry {
            JobHistoryEntry::Provisioned { role, node_id, .. }
            | JobHistoryEntry::Running { role, node_id, .. }
            | JobHistoryEntry::Stopping { role, node_id, .. }
            | JobHistoryEntry::Stopped { role, node_id, .. } => (role, node_id.as_ref()),
            _ => return false,
        };
        if let JobHistoryEntry::Stopped { .. } = entry {
            self.migrations.source_seen_stopped(job, role, node);
        }
        let Some((id, which)) = self.instance_of(job, role, node) else {
            return self.rebind_to_live_target(job, entry);
        };
        match (which, entry) {
            (Instance::Target, JobHistoryEntry::Provisioned { .. }) => true,
            (Instance::Target, JobHistoryEntry::Running { .. }) => {
                self.target_running(&id, now);
                true
            }
            (Instance::Target, JobHistoryEntry::Stopping { reason, .. }) => {
                self.target_lost(
                    &id,
                    &format!("the target is stopping ({})", stop_reason(reason)),
                    Target::Gone,
                    now,
                );
                true
            }
            (Instance::Target, _) => {
                self.target_lost(&id, "the target stopped", Target::Gone, now);
                true
            }
            (Instance::Source, JobHistoryEntry::Stopping { reason, .. }) => self.source_stopping(&id, reason, now),
            (Instance::Source, JobHistoryEntry::Stopped { .. }) => self.source_stopped(&id, now),
            (Instance::Source, _) => false,
        }
    }

    /// The target runs: `overlap` stops the source (the point of no
    /// return, crossed with the rest of its group); `handover` proposes to both instances and waits for the
    /// target's ready; `stopThenStart`'s started target is done.
    fn target_running(&mut self, id: &MigrationId, now: UnixMillis) {
        let Some((state, _)) = self.in_flight(id) else {
            return;
        };
        let (job, phase, strategy) = (state.job_id.clone(), state.phase, state.strategy);
        if let Some(mut record) = self.facts.jobs.get_mut(&job)
            && let Some(claim) = record.migration.as_mut()
        {
            claim.target.phase = BindingPhase::Running;
        }
        match (phase, strategy) {
            (MigrationPhase::Starting, MigrationStrategy::Overlap) => self.cut_over(id, CutOver::StopSource, now),
            (MigrationPhase::Starting, MigrationStrategy::Handover) => {
                self.signal(id, MigrationStep::Propose(MigrationStrategy::Handover));
                self.enter_phase(id, MigrationPhase::AwaitingReady, now);
            }
            (MigrationPhase::StartingTarget, _) => self.complete(id, None, now),
            _ => {}
        }
    }

    /// The source is stopping. Past the point of no return that was asked
    /// for (or comes anyway); before it, the source failed: the job lands
    /// on a running target, or the migration aborts and the ordinary
    /// recovery takes the job. True when the saga took the entry.
    fn source_stopping(&mut self, id: &MigrationId, reason: &JobStopReason, now: UnixMillis) -> bool {
        let Some((state, claim)) = self.in_flight(id) else {
            return false;
        };
        if state.past_point_of_no_return {
            return true;
        }
        if claim.target.phase == BindingPhase::Running {
            let why = format!(
                "the source stopped ({}); completed onto the running target",
                stop_reason(reason)
            );
            self.complete(id, Some(&why), now);
            return true;
        }
        // The job is lost where it ran: recovered on its own, while the
        // rest of its group moves on.
        self.roll_back_leaving_group(id, &format!("the source is stopping ({})", stop_reason(reason)), now);
        false
    }

    /// The source stopped: `stopThenStart` starts its prepared target;
    /// the others are done. Before the point of no return it is a failure
    /// (see [`Self::source_stopping`]).
    fn source_stopped(&mut self, id: &MigrationId, now: UnixMillis) -> bool {
        let Some((state, claim)) = self.in_flight(id) else {
            return false;
        };
        if !state.past_point_of_no_return {
            if claim.target.phase == BindingPhase::Running {
                self.migrations.source_stopped.insert(id.clone());
                self.complete(id, Some("the source stopped; completed onto the running target"), now);
                return true;
            }
            self.roll_back_leaving_group(id, "the source stopped", now);
            return false;
        }
        let (strategy, phase) = (state.strategy, state.phase);
        self.migrations.source_stopped.insert(id.clone());
        match (strategy, phase) {
            (MigrationStrategy::StopThenStart, MigrationPhase::StoppingSource) => {
                self.start_prepared(id);
                self.enter_phase(id, MigrationPhase::StartingTarget, now);
            }
            (MigrationStrategy::StopThenStart, _) => {}
            _ => self.complete(id, None, now),
        }
        true
    }

    /// `job_prepared`: `stopThenStart`'s target is created; the source is
    /// stopped (the point of no return, crossed with the rest of its
    /// group).
    pub(crate) fn migration_prepared(&mut self, job: &JobId, role: &InstanceKey, node: &NodeId, now: UnixMillis) {
        let Some((id, Instance::Target)) = self.instance_of(job, role, Some(node)) else {
            return;
        };
        if self
            .migrations
            .get(&id)
            .is_some_and(|m| m.phase == MigrationPhase::Preparing)
        {
            self.cut_over(&id, CutOver::StopSource, now);
        }
    }

    /// A handover step from an instance: ready -> the source stops output
    /// at the payload (the point of no return); stopped at -> the target
    /// applies from there; applied -> the source is stopped. A refusal
    /// aborts before the point of no return and fails forward after.
    pub(crate) fn migration_signal(
        &mut self,
        migration_id: &str,
        job: &JobId,
        from: &InstanceKey,
        signal: MigrationSignal,
        now: UnixMillis,
    ) {
        let id = MigrationId(migration_id.to_owned());
        let Some((state, _)) = self.in_flight(&id) else {
            return;
        };
        if &state.job_id != job {
            return;
        }
        let from_target = from == &state.target_key;
        let from_source = from == &state.source_key;
        match (signal, state.phase) {
            (MigrationSignal::TargetReady(payload), MigrationPhase::AwaitingReady) if from_target => {
                self.cut_over(&id, CutOver::StopOutputAt(payload), now);
            }
            (MigrationSignal::SourceStoppedAt(position), MigrationPhase::StoppingOutput) if from_source => {
                self.signal(&id, MigrationStep::ApplyFrom(position));
                self.enter_phase(&id, MigrationPhase::Applying, now);
            }
            (MigrationSignal::TargetApplied, MigrationPhase::Applying) if from_target => {
                self.stop_source(&id);
                self.enter_phase(&id, MigrationPhase::StoppingSource, now);
            }
            (MigrationSignal::Refused(why), phase) if from_target || from_source => {
                let reason = format!("{from} refused the handover: {why}");
                if !state.past_point_of_no_return {
                    self.roll_back(&id, &reason, Target::Stop, now);
                } else if phase != MigrationPhase::StoppingSource {
                    self.fail_forward_to_stop(&id, &reason, now);
                }
            }
            _ => {}
        }
    }

    /// Past the point of no return without cooperation: the source is
    /// stopped and the target takes the job.
    fn fail_forward_to_stop(&mut self, id: &MigrationId, reason: &str, now: UnixMillis) {
        if let Some(state) = self.migrations.get_mut(id) {
            state.reason = Some(format!("{reason}; failed forward"));
        }
        self.stop_source(id);
        self.enter_phase(id, MigrationPhase::StoppingSource, now);
    }

    /// A worker refused the target (an invalid spec among others): the
    /// migration aborts and the source keeps running; past the point of no
    /// return it is lost.
    pub(crate) fn migration_target_rejected(
        &mut self,
        job: &JobId,
        role: &InstanceKey,
        node: &NodeId,
        detail: &str,
        now: UnixMillis,
    ) {
        if let Some((id, Instance::Target)) = self.instance_of(job, role, Some(node)) {
            self.target_lost(&id, &format!("the target was rejected: {detail}"), Target::Gone, now);
        }
    }

    /// A node is stopping or stopped. A target there is lost. A source
    /// there: the job lands on its target when that runs or the point of no
    /// return is passed (the source was going anyway); otherwise the
    /// migration aborts and the ordinary recovery takes the job.
    pub(crate) fn migration_node_lost(&mut self, node: &NodeId, now: UnixMillis) {
        self.migrations.forget_sources_on(node);
        for id in self.migrations.in_flight() {
            let Some((state, claim)) = self.in_flight(&id) else {
                continue;
            };
            if &claim.target.node_id == node {
                self.target_lost(&id, &format!("the target's node {node} is gone"), Target::Gone, now);
            } else if &state.source_node_id == node {
                let forward = state.past_point_of_no_return || claim.target.phase == BindingPhase::Running;
                let reason = format!("the source's node {node} is gone");
                if !forward {
                    // Every member of a group there is settled on its own:
                    // a running target takes its job, the rest recover.
                    self.roll_back_alone(&id, &reason, Target::Stop, now);
                    continue;
                }
                let prepared = state.strategy == MigrationStrategy::StopThenStart
                    && matches!(state.phase, MigrationPhase::StoppingSource);
                if prepared {
                    self.start_prepared(&id);
                }
                self.complete(&id, Some(&format!("{reason}; completed onto the target")), now);
            }
        }
    }

    /// The job ended (deleted, its window over): its migration is rolled
    /// back, or lost past the point of no return.
    pub(crate) fn migration_job_ended(&mut self, job: &JobId, reason: &str, now: UnixMillis) {
        let Some(id) = self
            .facts
            .jobs
            .get(job)
            .and_then(|r| r.migration.as_ref())
            .map(|c| c.migration_id.clone())
        else {
            return;
        };
        if self.migrations.get(&id).is_some_and(|m| m.past_point_of_no_return) {
            self.wind_down_target(&id, Target::Stop, true);
            self.mark_lost(&id, reason, now);
        } else {
            self.roll_back_leaving_group(&id, reason, now);
        }
    }

    /// The answer to one of the saga's calls.
    pub(crate) fn migration_call_result(
        &mut self,
        id: &MigrationId,
        call: MigrationCall,
        result: Result<(), RpcFailure>,
        now: UnixMillis,
    ) {
        if call == MigrationCall::StopSource {
            let gone = matches!(&result, Err(f) if f.kind == RpcFailureKind::NotFound);
            self.migrations.source_stop_answered(id, gone);
        }
        if call == MigrationCall::StartTarget {
            self.migrations.start_pending.remove(id);
            // A start whose answer was lost may have created the target:
            // it is stopped as one that was.
            let unheard = matches!(&result, Err(f) if f.kind == RpcFailureKind::Transient);
            if self.migrations.stop_when_started.remove(id) && (result.is_ok() || unheard) {
                self.stop_target(id);
            }
            self.count_target_start(id, result.is_ok());
        }
        if call == MigrationCall::StartPrepared {
            self.prepared_start_answered(id, &result);
        }
        let Err(failure) = result else {
            return;
        };
        if call == MigrationCall::StartPrepared && failure.kind == RpcFailureKind::Transient {
            self.migrations.prepared_start_unheard.insert(id.clone());
        }
        // `NotFound` says nothing is prepared there: the target is gone —
        // unless an earlier try went unanswered and may have made it.
        let target_gone =
            failure.kind == RpcFailureKind::NotFound && !self.migrations.prepared_start_unheard.contains(id);
        let in_flight = self.in_flight(id).is_some();
        // The saga failed forward onto a prepared target whose start had not
        // been answered: the job lives there now, and must still start.
        let moved_onto_target = !in_flight && self.bound_to_target_of(id);
        match call {
            MigrationCall::StartPrepared if moved_onto_target => {
                self.start_prepared_after_done(id, &failure, target_gone, now)
            }
            // Not heard — or heard, the answer lost: the target Manager may
            // hold is stopped with the migration.
            MigrationCall::StartTarget if in_flight => {
                let reason = format!("the target's StartJob failed: {}", failure.message);
                let target = if failure.kind == RpcFailureKind::Transient {
                    Target::Stop
                } else {
                    Target::Gone
                };
                self.target_lost(id, &reason, target, now);
            }
            // Manager did not hear it: the prepared target is told again
            // (the phase's deadline still bounds the wait).
            MigrationCall::StartPrepared if in_flight && failure.kind == RpcFailureKind::Transient => {
                self.start_prepared(id);
            }
            // Refused: the prepared target, if Manager still holds it, is
            // stopped rather than left beside the job placed afresh.
            MigrationCall::StartPrepared if in_flight => {
                let target = if target_gone { Target::Gone } else { Target::Stop };
                let reason = format!("StartPreparedJob failed: {}", failure.message);
                self.target_lost(id, &reason, target, now);
            }
            // The source is gone already: what the stop was for.
            MigrationCall::StopSource if failure.kind == RpcFailureKind::NotFound => {}
            // Manager did not hear it: the source is told again while it is
            // still waited for.
            MigrationCall::StopSource
                if failure.kind == RpcFailureKind::Transient && self.migrations.awaits_source_stop(id) =>
            {
                self.stop_source(id);
            }
            MigrationCall::StopTarget if failure.kind == RpcFailureKind::NotFound => {}
            // Manager did not hear it: a target left running beside the job
            // would run it twice, so it is told again.
            MigrationCall::StopTarget if failure.kind == RpcFailureKind::Transient => self.stop_target(id),
            MigrationCall::Signal
                if in_flight && !self.migrations.get(id).is_some_and(|m| m.past_point_of_no_return) =>
            {
                self.roll_back(
                    id,
                    &format!("a migration signal failed: {}", failure.message),
                    Target::Stop,
                    now,
                );
            }
            _ => self.outbox.notify(Notification::Error {
                message: format!("migration {id}: {call:?} failed: {}", failure.message),
            }),
        }
    }

    /// A `StartPreparedJob` of `id`'s target was answered. Ok: Manager
    /// made the instance, and a job already moved onto it is accepted
    /// there now. Unheard: it is still awaited (it is told again). Refused:
    /// no longer awaited (the target is lost, or the job placed again).
    fn prepared_start_answered(&mut self, id: &MigrationId, result: &Result<(), RpcFailure>) {
        match result {
            Err(f) if f.kind == RpcFailureKind::Transient => return,
            Err(_) => {
                self.migrations.prepared_start_awaited.remove(id);
                return;
            }
            Ok(()) => {
                self.migrations.prepared_start_awaited.remove(id);
            }
        }
        let Some(m) = self.migrations.get(id) else {
            return;
        };
        let (job, node, key) = (m.job_id.clone(), m.target_node_id.clone(), m.target_key.clone());
        if let Some(mut record) = self.facts.jobs.get_mut(&job)
            && let Some(binding) = record.binding.as_mut()
            && binding.node_id == node
            && binding.instance_key == key
            && binding.prepared_start_awaited
        {
            binding.prepared_start_awaited = false;
        }
    }

    /// Whether the job of migration `id` is bound to the migration's
    /// target (the migration completed onto it).
    fn bound_to_target_of(&self, id: &MigrationId) -> bool {
        self.migrations.get(id).is_some_and(|m| {
            self.facts
                .jobs
                .get(&m.job_id)
                .and_then(|r| r.binding.as_ref())
                .is_some_and(|b| b.node_id == m.target_node_id && b.instance_key == m.target_key)
        })
    }

    /// The start of a prepared target the job was already moved onto (its
    /// phase deadline passed first) failed. Not heard: it is started
    /// again. Refused: the job cannot run there — the prepared instance is
    /// stopped and the job placed again, as after any refused start (no
    /// restart counted, no sooner than `MIN_RECOVERY_INTERVAL_MS`).
    ///
    /// A later migration of the job already moving that instance owns it
    /// now: the late answer is left to it (its source's stop and its own
    /// target decide), never ending the binding under it — which would
    /// place the job afresh beside that migration's target.
    ///
    /// A start answered after Manager reported the target running (a try
    /// sent again after an answer was lost, which finds nothing prepared
    /// any more) changes nothing: the job runs there.
    fn start_prepared_after_done(&mut self, id: &MigrationId, failure: &RpcFailure, gone: bool, now: UnixMillis) {
        let Some(job) = self.migrations.get(id).map(|m| m.job_id.clone()) else {
            return;
        };
        let running = self
            .facts
            .jobs
            .get(&job)
            .and_then(|r| r.binding.as_ref())
            .is_some_and(|b| b.phase == BindingPhase::Running);
        if running {
            return;
        }
        let moved_on = self
            .facts
            .jobs
            .get(&job)
            .and_then(|r| r.migration.as_ref())
            .is_some_and(|claim| &claim.migration_id != id);
        if moved_on {
            return self.outbox.notify(Notification::Error {
                message: format!(
                    "migration {id}: the prepared target {job} was moved onto could not be started ({}); a later \
                     migration of it is moving that instance",
                    failure.message
                ),
            });
        }
        if failure.kind == RpcFailureKind::Transient {
            return self.start_prepared(id);
        }
        if !gone {
            self.stop_target(id);
        }
        self.facts.end_binding(self.outbox, &job);
        if let Some(mut record) = self.facts.jobs.get_mut(&job) {
            record.not_before = now + MIN_RECOVERY_INTERVAL_MS;
        }
        self.outbox.notify(Notification::Error {
            message: format!(
                "migration {id}: the prepared target {job} was moved onto could not be started ({}); placed again",
                failure.message
            ),
        });
    }

    /// The target's placement counts as succeeded or dispatch-failed once,
    /// at its first wire answer.
    fn count_target_start(&mut self, id: &MigrationId, ok: bool) {
        let Some(job) = self.migrations.get(id).map(|m| m.job_id.clone()) else {
            return;
        };
        let counted = self
            .facts
            .jobs
            .get_mut(&job)
            .is_some_and(|mut r| match r.migration.as_mut() {
                Some(c) if &c.migration_id == id => std::mem::replace(&mut c.target.uncounted, false),
                _ => false,
            });
        if counted {
            if ok {
                self.counters.placements_succeeded += 1;
            } else {
                self.counters.placements_dispatch_failed += 1;
            }
        }
    }
}

/// A stop reason in words.
fn stop_reason(reason: &JobStopReason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{reason:?}"))
}
