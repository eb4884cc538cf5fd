//! How a migration ends: `done` (the binding, placement of record and
//! active instance key move to the target), `aborted` (a clean rollback,
//! only before the point of no return: both instance keys told, the target
//! stopped, the source keeps running) or `lost` (past the point of no
//! return and not finished). Also the timers — each phase's deadline from
//! the `migration` settings: "expiry before the point of no return aborts,
//! after it the saga fails forward" — and `close()`, which aborts what it
//! can and marks the rest lost.

use super::Saga;
use crate::automanager::binding::{Binding, BindingPhase};
use crate::automanager::notification::Notification;
use crate::automanager::protocol::Rpc;
use crate::model::{JobId, MigrationId, MigrationPhase, MigrationStrategy, NodeId, UnixMillis};
use crate::placement::RecoveryContext;

use super::refusal::MigrationRefusal;
use super::state::MigrationStep;

/// Whether an abort must stop the target, or it is gone already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// Still there (or its start still in flight): `StopJob` it.
    Stop,
    /// Rejected, failed, or lost with its node: nothing to stop.
    Gone,
}

impl Saga<'_> {
    /// `abortMigration`: a clean rollback only until the source has been
    /// told to stop; after that it is refused and the saga fails forward.
    pub(crate) fn abort_migration(
        &mut self,
        id: &MigrationId,
        reason: &str,
        now: UnixMillis,
    ) -> Result<(), MigrationRefusal> {
        let state = self
            .migrations
            .get(id)
            .ok_or_else(|| MigrationRefusal::UnknownMigration {
                migration_id: id.clone(),
            })?;
        if state.phase.is_ended() {
            return Err(MigrationRefusal::AlreadyEnded {
                migration_id: id.clone(),
                phase: state.phase,
            });
        }
        if state.past_point_of_no_return {
            return Err(MigrationRefusal::PastPointOfNoReturn {
                migration_id: id.clone(),
            });
        }
        self.roll_back(id, reason, Target::Stop, now);
        Ok(())
    }

    /// The rollback: the abort told to both instance keys, the target
    /// stopped (at once, or when its start is answered), its reservation
    /// released; the source keeps running. Only before the point of no
    /// return. The rest of a co-located group moving with it is rolled back
    /// too: a group moves whole or not at all.
    pub(super) fn roll_back(&mut self, id: &MigrationId, reason: &str, target: Target, now: UnixMillis) {
        if self.group_left_source(id) {
            return self.rejoin_group(id, reason, target, now);
        }
        if self.roll_back_alone(id, reason, target, now) {
            self.roll_back_group(id, reason, now);
        }
    }

    /// The rollback of a member whose own source failed: settled alone,
    /// the rest of its group moves on (a member waiting for it at the
    /// cut-over crosses now).
    pub(super) fn roll_back_leaving_group(&mut self, id: &MigrationId, reason: &str, now: UnixMillis) {
        if self.roll_back_alone(id, reason, Target::Stop, now) {
            self.release_peers_of(id, now);
        }
    }

    /// Members of `id`'s group waiting at the cut-over cross it when `id`
    /// was the last they waited for.
    fn release_peers_of(&mut self, id: &MigrationId, now: UnixMillis) {
        let peers: Vec<MigrationId> = self
            .migrations
            .get(id)
            .map(|m| m.group.iter().map(|p| p.migration_id.clone()).collect())
            .unwrap_or_default();
        if let Some(peer) = peers.iter().find(|p| self.migrations.parked.contains_key(*p)) {
            self.release_group_if_ready(&peer.clone(), now);
        }
    }

    /// The rollback of this migration only; true when it was rolled back.
    pub(super) fn roll_back_alone(&mut self, id: &MigrationId, reason: &str, target: Target, now: UnixMillis) -> bool {
        let Some((state, claim)) = self.in_flight(id) else {
            return false;
        };
        if state.past_point_of_no_return {
            return false;
        }
        let job_id = state.job_id.clone();
        let dispatched = claim.target.phase != BindingPhase::AwaitingNode;
        self.signal(id, MigrationStep::Abort(reason.to_owned()));
        self.wind_down_target(id, target, dispatched);
        self.release_target(&job_id);
        self.end_migration(id, MigrationPhase::Aborted, reason, now);
        true
    }

    /// The target of a migration that is ending without it is stopped,
    /// unless it is known to be gone. A target whose start is still on its
    /// way is stopped once the start is answered — so the stop cannot
    /// overtake the start — whatever this core believes of it meanwhile: a
    /// start Manager carries out on a node given up on (terminated, say)
    /// would otherwise leave an instance nobody stops, the job running
    /// twice.
    pub(super) fn wind_down_target(&mut self, id: &MigrationId, target: Target, dispatched: bool) {
        if self.migrations.start_pending.contains(id) {
            self.migrations.stop_when_started.insert(id.clone());
        } else if target == Target::Stop && dispatched {
            self.stop_target(id);
        }
    }

    /// Past the point of no return and not finished: marked lost
    /// (`migrationAborted` with `lost`, plus an error).
    pub(super) fn mark_lost(&mut self, id: &MigrationId, reason: &str, now: UnixMillis) {
        let Some(state) = self.migrations.get(id).filter(|m| m.is_in_flight()) else {
            return;
        };
        let job_id = state.job_id.clone();
        self.release_target(&job_id);
        self.end_migration(id, MigrationPhase::Lost, reason, now);
        self.outbox.notify(Notification::Error {
            message: format!("migration {id} of {job_id} lost past its point of no return: {reason}"),
        });
    }

    /// `done`: the job's binding, placement of record and active instance
    /// key move to the target, so a second migration addresses the right
    /// instance.
    pub(super) fn complete(&mut self, id: &MigrationId, reason: Option<&str>, now: UnixMillis) {
        let Some((state, claim)) = self.in_flight(id) else {
            return;
        };
        let (job_id, source_node) = (state.job_id.clone(), state.source_node_id.clone());
        let target = claim.target.clone();
        let Some(mut record) = self.facts.jobs.get_mut(&job_id) else {
            return;
        };
        record.migration = None;
        // A target not seen running whose start is still to be answered is
        // not yet accepted on its node (a spare there is not consumed).
        let prepared_start_awaited =
            target.phase != BindingPhase::Running && self.migrations.prepared_start_awaited.contains(id);
        record.binding = Some(Binding {
            uncounted: false,
            phase: match target.phase {
                BindingPhase::Running => BindingPhase::Running,
                _ => BindingPhase::Dispatched,
            },
            prepared_start_awaited,
            ..target
        });
        drop(record);
        // The node a group leaves is released once its last member has
        // gone (`release_node` keeps a node anything is bound to).
        let single_use = self.group_single_use(id);
        self.facts.release_node(self.outbox, &source_node, single_use);
        // A reason given earlier (how it failed forward) is kept.
        if let Some(reason) = reason {
            self.note_reason(id, reason);
        }
        self.enter_phase(id, MigrationPhase::Done, now);
        self.outbox.notify(Notification::MigrationCompleted {
            migration_id: id.clone(),
            job_id,
        });
        // A member that completed ahead of its group (its source failed
        // with its target running) no longer holds the rest back.
        self.release_peers_of(id, now);
    }

    /// The job's claim ends; its target's node, if it was provisioned for
    /// it and carries nothing else, is not left behind.
    fn release_target(&mut self, job_id: &JobId) {
        let Some(mut record) = self.facts.jobs.get_mut(job_id) else {
            return;
        };
        let Some(claim) = record.migration.take() else {
            return;
        };
        let single_use = record.job.spec.single_use;
        drop(record);
        self.facts.release_node(self.outbox, &claim.target.node_id, single_use);
    }

    fn end_migration(&mut self, id: &MigrationId, phase: MigrationPhase, reason: &str, now: UnixMillis) {
        let Some(state) = self.migrations.get_mut(id) else {
            return;
        };
        state.reason = Some(reason.to_owned());
        let job_id = state.job_id.clone();
        self.enter_phase(id, phase, now);
        self.outbox.notify(Notification::MigrationAborted {
            migration_id: id.clone(),
            job_id,
            reason: reason.to_owned(),
            lost: phase == MigrationPhase::Lost,
        });
    }

    /// `StopJob` of the target.
    pub(super) fn stop_target(&mut self, id: &MigrationId) {
        let Some(state) = self.migrations.get(id) else {
            return;
        };
        let rpc = Rpc::StopJob {
            job_id: state.job_id.clone(),
            instance_key: state.target_key.clone(),
            node_id: state.target_node_id.clone(),
        };
        self.call_for(id, rpc, super::state::MigrationCall::StopTarget);
    }

    /// Once per step: targets whose node now runs are dispatched, targets
    /// whose node went (its provision refused or timed out) end their
    /// migration, and expired phase deadlines are acted on.
    pub(crate) fn step_migrations(&mut self, now: UnixMillis) {
        for id in self.migrations.in_flight() {
            self.dispatch_target_if_ready(&id, now);
            // A node this core terminated may still be running what was
            // started there: its target is stopped. One Manager reports
            // going has taken it along.
            let gone = self
                .in_flight(&id)
                .and_then(|(_, claim)| match self.facts.fleet.get(&claim.target.node_id) {
                    None => Some(Target::Gone),
                    Some(n) if n.is_going() => Some(Target::Gone),
                    Some(n) if n.terminated => Some(Target::Stop),
                    Some(_) => None,
                });
            if let Some(target) = gone {
                self.target_lost(&id, "the target's node is gone", target, now);
            }
            let expired = self
                .migrations
                .get(&id)
                .and_then(|m| m.phase_deadline.filter(|&at| at <= now).map(|_| m.phase));
            if let Some(phase) = expired {
                self.phase_expired(&id, phase, now);
            }
        }
    }

    /// A phase outlived its deadline: before the point of no return the
    /// migration aborts; after it the saga fails forward — towards the
    /// target, without waiting for what did not come.
    fn phase_expired(&mut self, id: &MigrationId, phase: MigrationPhase, now: UnixMillis) {
        let Some(state) = self.migrations.get(id) else {
            return;
        };
        let name = serde_json::to_value(phase)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        if !state.past_point_of_no_return {
            return self.roll_back(id, &format!("{name} deadline passed"), Target::Stop, now);
        }
        let reason = format!("{name} deadline passed; failed forward");
        let strategy = state.strategy;
        match phase {
            // Handover without the source's position, or without the
            // target's confirmation: the source is stopped anyway.
            MigrationPhase::StoppingOutput | MigrationPhase::Applying => {
                self.note_reason(id, &reason);
                self.stop_source(id);
                self.enter_phase(id, MigrationPhase::StoppingSource, now);
            }
            // The prepared target is started without the source's stop
            // confirmed.
            MigrationPhase::StoppingSource if strategy == MigrationStrategy::StopThenStart => {
                self.note_reason(id, &reason);
                self.start_prepared(id);
                self.enter_phase(id, MigrationPhase::StartingTarget, now);
            }
            // The target takes the job; a source not yet seen stopped is
            // told again.
            _ => {
                if phase == MigrationPhase::StoppingSource && !self.migrations.source_stopped.contains(id) {
                    self.stop_source(id);
                }
                self.complete(id, Some(&reason), now);
            }
        }
    }

    fn note_reason(&mut self, id: &MigrationId, reason: &str) {
        if let Some(state) = self.migrations.get_mut(id) {
            state.reason = Some(reason.to_owned());
        }
    }

    /// The target is lost (failed, rejected, its node lost, or it cannot
    /// be started; `target` says whether it may still be there to stop):
    /// before the point of no return the migration aborts and the source
    /// keeps running; after it the migration is lost, the target stopped
    /// if it may still be there, the source (told to stop) is stopped and
    /// the job is placed afresh.
    pub(super) fn target_lost(&mut self, id: &MigrationId, reason: &str, target: Target, now: UnixMillis) {
        let Some((state, claim)) = self.in_flight(id) else {
            return;
        };
        if !state.past_point_of_no_return {
            return self.roll_back(id, reason, target, now);
        }
        let dispatched = claim.target.phase != BindingPhase::AwaitingNode;
        self.wind_down_target(id, target, dispatched);
        let Some((state, _)) = self.in_flight(id) else {
            return;
        };
        let (job_id, source_node) = (state.job_id.clone(), state.source_node_id.clone());
        let told_to_stop = matches!(
            state.phase,
            MigrationPhase::StoppingSource | MigrationPhase::StartingTarget
        );
        // The source was told to stop (or to stop output): it is stopped,
        // and the job placed afresh once it has (its replacement wears the
        // same key).
        if !self.migrations.source_stopped.contains(id) && !told_to_stop {
            self.stop_source(id);
        }
        self.lost_and_placed_afresh(id, &job_id, source_node, reason, now);
    }

    /// Ends migration `id` `lost` and places its job afresh away from the
    /// node it was leaving (a stop still addressed to the source there
    /// cannot reach the new instance), and, as for any migration, without
    /// `onRuntimeFailure`.
    pub(super) fn lost_and_placed_afresh(
        &mut self,
        id: &MigrationId,
        job_id: &JobId,
        source_node: NodeId,
        reason: &str,
        now: UnixMillis,
    ) {
        self.mark_lost(id, reason, now);
        self.facts.end_binding(self.outbox, job_id);
        if let Some(mut record) = self.facts.jobs.get_mut(job_id) {
            record.recovery = Some(RecoveryContext {
                on_runtime_failure: None,
                excluded_nodes: vec![source_node],
            });
            record.not_before = now;
        }
    }

    /// `close()`: in-flight migrations before the point of no return are
    /// rolled back (the calls are sent while the channel is held open, at
    /// most `CLOSE_ABORT_GRACE_MS`); past it they are marked lost and the
    /// target is left carrying the job, for the next instance to rebuild
    /// from history.
    pub(crate) fn close_migrations(&mut self, now: UnixMillis) {
        for id in self.migrations.in_flight() {
            let past = self.migrations.get(&id).is_some_and(|m| m.past_point_of_no_return);
            if past {
                self.mark_lost(&id, "AutoManager closed", now);
            } else {
                // Every migration in flight is visited: no group to settle.
                self.roll_back_alone(&id, "AutoManager closed", Target::Stop, now);
                // No answer will be read any more: stop the target now.
                if self.migrations.stop_when_started.remove(&id) {
                    self.stop_target(&id);
                }
            }
        }
    }
}
