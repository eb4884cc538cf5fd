//! The randomised simulation's migrations: the worker side of the saga
//! (targets created deferred or started, prepared targets started,
//! instances stopped on request, handover steps answered, refused or left
//! unanswered) and random `migrateJob` and `abortMigration` commands.

use norsk_auto_manager::automanager::{
    Command, MigrationOptions, MigrationStep, MigrationStrategy, RequestId, Rpc, RpcFailureKind,
};
use norsk_auto_manager::model::{JobHistoryEntry, JobId, JobStopReason, ManagerEvent, MigrationSignal};
use rand::Rng;

use super::Model;
use super::published::Api;

impl Model {
    /// The worker side of a migration: targets created (deferred or
    /// started), prepared targets started, instances stopped on request,
    /// handover steps answered — or refused, or never answered.
    pub(super) fn answer_migration(&mut self, id: RequestId, rpc: Rpc) {
        match rpc {
            Rpc::StartMigrationTarget {
                job_id,
                instance_key,
                node_id,
                defer_start,
                ..
            } => {
                if !self.node_runs(&node_id) || self.ended.contains(&job_id) {
                    return self.fail(id, RpcFailureKind::NotFound);
                }
                // The same target again is the instance Manager has.
                let existing = self.instances.get(&(job_id.clone(), instance_key.clone()));
                if let Some(i) = existing {
                    if i.node != node_id {
                        return self.fail(id, RpcFailureKind::AlreadyExists);
                    }
                    return self.accept(id);
                }
                self.create_instance(&job_id, &instance_key, &node_id, defer_start);
                self.accept(id);
                self.h.history(
                    &job_id,
                    JobHistoryEntry::Provisioned {
                        at: Some(self.h.now),
                        role: instance_key,
                        node_id: Some(node_id),
                    },
                );
            }
            // The port makes the start it kept on a published Manager now.
            Rpc::StartPreparedJob {
                job_id,
                instance_key,
                node_id,
            } if self.api == Api::Published => self.start_kept(id, &job_id, instance_key, node_id),
            Rpc::StartPreparedJob {
                job_id,
                instance_key,
                node_id,
            } => match self.instances.get_mut(&(job_id, instance_key)) {
                Some(target) if target.node == node_id && !target.held => {
                    target.deferred = false;
                    self.accept(id);
                }
                _ => self.fail(id, RpcFailureKind::NotFound),
            },
            Rpc::StopJob {
                job_id,
                instance_key,
                node_id,
            } => {
                let key = (job_id.clone(), instance_key.clone());
                if self.instances.get(&key).is_none_or(|i| i.node != node_id) {
                    return self.fail(id, RpcFailureKind::NotFound);
                }
                self.instances.remove(&key);
                self.accept(id);
                for entry in [
                    JobHistoryEntry::Stopping {
                        at: Some(self.h.now),
                        role: instance_key.clone(),
                        node_id: Some(node_id.clone()),
                        reason: JobStopReason::UserRequested,
                    },
                    JobHistoryEntry::Stopped {
                        at: Some(self.h.now),
                        role: instance_key,
                        node_id: Some(node_id),
                    },
                ] {
                    self.h.history(&job_id, entry);
                }
            }
            // A published Manager has no such method (`UNIMPLEMENTED`).
            Rpc::SendMigrationSignal { .. } if self.api == Api::Published => self.fail(id, RpcFailureKind::Rejected),
            Rpc::SendMigrationSignal {
                migration_id,
                job_id,
                source_key,
                target_key,
                signal,
            } => {
                self.ok(id);
                let (from, answer) = match signal {
                    MigrationStep::Propose(MigrationStrategy::Handover) => {
                        (target_key, MigrationSignal::TargetReady(b"ready".to_vec()))
                    }
                    MigrationStep::StopOutputAt(_) => (source_key, MigrationSignal::SourceStoppedAt("pts".into())),
                    MigrationStep::ApplyFrom(_) => (target_key, MigrationSignal::TargetApplied),
                    MigrationStep::Propose(_) | MigrationStep::Abort(_) => return,
                };
                let answer = match self.rng.random_range(0..10) {
                    0 if !self.calm => return,
                    1 if !self.calm => MigrationSignal::Refused("no handover".into()),
                    _ => answer,
                };
                self.h.event(ManagerEvent::MigrationSignal {
                    migration_id: migration_id.0,
                    job_id,
                    from_key: from,
                    signal: answer,
                });
            }
            _ => self.ok(id),
        }
    }

    /// A random migration command: a running job migrated under a random
    /// strategy, or a migration in flight aborted.
    pub(super) fn migration_command(&mut self) {
        if self.rng.random_bool(0.3) {
            let in_flight: Vec<_> = self
                .h
                .core
                .migrations()
                .into_iter()
                .filter(|m| m.is_in_flight())
                .map(|m| m.migration_id.clone())
                .collect();
            if let Some(migration_id) = self.pick(in_flight) {
                self.command(Command::AbortMigration {
                    migration_id,
                    reason: "changed mind".into(),
                });
            }
            return;
        }
        let running: Vec<JobId> = self
            .instances
            .iter()
            .filter(|(_, i)| i.running)
            .map(|((j, _), _)| j.clone())
            .collect();
        if let Some(job_id) = self.pick(running) {
            let strategy = [
                MigrationStrategy::StopThenStart,
                MigrationStrategy::Overlap,
                MigrationStrategy::Handover,
            ][self.rng.random_range(0..3)];
            self.command(Command::MigrateJob {
                job_id,
                options: MigrationOptions {
                    strategy: Some(strategy),
                    ..MigrationOptions::default()
                },
            });
        }
    }
}
