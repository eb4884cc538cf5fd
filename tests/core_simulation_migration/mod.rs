//! The randomised simulation's migrations: the worker side of the saga
//! (targets created deferred or started, prepared targets started,
//! instances stopped on request, handover steps answered, refused or left
//! unanswered), random `migrateJob` and `abortMigration` commands, and the
//! model following the job onto its target at `done`.

use norsk_auto_manager::automanager::{
    Command, MigrationOptions, MigrationStep, MigrationStrategy, RequestId, Rpc, RpcFailureKind,
};
use norsk_auto_manager::model::{InstanceKey, JobHistoryEntry, JobId, JobStopReason, ManagerEvent, MigrationSignal};
use rand::Rng;

use super::{Instance, Model, NodePhase};

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
                let usable = self.nodes.get(&node_id).is_some_and(|(p, _)| *p == NodePhase::Running);
                if !usable || self.ended.contains(&job_id) {
                    return self.fail(id, RpcFailureKind::NotFound);
                }
                self.h.ok(id);
                let target = Instance {
                    key: instance_key.clone(),
                    node: node_id.clone(),
                    running: false,
                };
                self.targets
                    .insert((job_id.clone(), instance_key.clone()), (target, defer_start));
                self.h.history(
                    &job_id,
                    JobHistoryEntry::Provisioned {
                        at: Some(self.h.now),
                        role: instance_key,
                        node_id: Some(node_id),
                    },
                );
            }
            Rpc::StartPreparedJob {
                job_id, instance_key, ..
            } => match self.targets.get_mut(&(job_id, instance_key)) {
                Some((_, deferred)) => {
                    *deferred = false;
                    self.h.ok(id);
                }
                _ => self.fail(id, RpcFailureKind::NotFound),
            },
            Rpc::StopJob {
                job_id,
                instance_key,
                node_id,
            } => {
                let stopped = if self
                    .instances
                    .get(&job_id)
                    .is_some_and(|i| i.key == instance_key && i.node == node_id)
                {
                    self.instances.remove(&job_id)
                } else if self
                    .targets
                    .get(&(job_id.clone(), instance_key.clone()))
                    .is_some_and(|(t, _)| t.node == node_id)
                {
                    self.targets
                        .remove(&(job_id.clone(), instance_key.clone()))
                        .map(|(t, _)| t)
                } else if self
                    .displaced
                    .get(&job_id)
                    .is_some_and(|i| i.key == instance_key && i.node == node_id)
                {
                    self.displaced.remove(&job_id)
                } else {
                    None
                };
                let Some(stopped) = stopped else {
                    return self.fail(id, RpcFailureKind::NotFound);
                };
                self.h.ok(id);
                for entry in [
                    JobHistoryEntry::Stopping {
                        at: Some(self.h.now),
                        role: stopped.key.clone(),
                        node_id: Some(stopped.node.clone()),
                        reason: JobStopReason::UserRequested,
                    },
                    JobHistoryEntry::Stopped {
                        at: Some(self.h.now),
                        role: stopped.key,
                        node_id: Some(stopped.node),
                    },
                ] {
                    self.h.history(&job_id, entry);
                }
            }
            Rpc::SendMigrationSignal {
                migration_id,
                job_id,
                source_key,
                target_key,
                signal,
            } => {
                self.h.ok(id);
                let (from, answer) = match signal {
                    MigrationStep::Propose(MigrationStrategy::Handover) => {
                        (target_key, MigrationSignal::TargetReady(b"ready".to_vec()))
                    }
                    MigrationStep::StopOutputAt(_) => (source_key, MigrationSignal::SourceStoppedAt("pts".into())),
                    MigrationStep::ApplyFrom(_) => (target_key, MigrationSignal::TargetApplied),
                    MigrationStep::Propose(_) | MigrationStep::Abort(_) => return,
                };
                let answer = match self.rng.random_range(0..10) {
                    0 => return,
                    1 => MigrationSignal::Refused("no handover".into()),
                    _ => answer,
                };
                self.h.event(ManagerEvent::MigrationSignal {
                    migration_id: migration_id.0,
                    job_id,
                    from_key: from,
                    signal: answer,
                });
            }
            _ => self.h.ok(id),
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
                self.h.command(Command::AbortMigration {
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
            .map(|(j, _)| j.clone())
            .collect();
        if let Some(job_id) = self.pick(running) {
            let strategy = [
                MigrationStrategy::StopThenStart,
                MigrationStrategy::Overlap,
                MigrationStrategy::Handover,
            ][self.rng.random_range(0..3)];
            self.h.command(Command::MigrateJob {
                job_id,
                options: MigrationOptions {
                    strategy: Some(strategy),
                    ..MigrationOptions::default()
                },
            });
        }
    }

    /// A migration target moves on: a deferred one reports prepared, a
    /// started one reaches running.
    pub(super) fn target_progresses(&mut self) {
        let waiting: Vec<(JobId, InstanceKey)> = self
            .targets
            .iter()
            .filter(|(_, (t, _))| !t.running)
            .map(|(k, _)| k.clone())
            .collect();
        let Some(key) = self.pick(waiting) else {
            return;
        };
        let Some((target, deferred)) = self.targets.get_mut(&key) else {
            return;
        };
        let (job, target_now) = (key.0, target.clone());
        if *deferred {
            self.h.event(ManagerEvent::JobPrepared {
                job_id: job,
                role: target_now.key,
                node_id: target_now.node,
            });
        } else {
            target.running = true;
            let entry = JobHistoryEntry::Running {
                at: Some(self.h.now),
                role: target_now.key,
                node_id: Some(target_now.node),
            };
            self.h.history(&job, entry);
        }
    }

    /// A target the core has moved the job to (`done`) is the job's
    /// instance from then on.
    pub(super) fn adopt_completed_targets(&mut self) {
        let adopted: Vec<(JobId, InstanceKey)> = self
            .targets
            .iter()
            .filter(|((job, _), (t, _))| {
                self.h
                    .core
                    .job(job)
                    .and_then(|r| r.binding.as_ref())
                    .is_some_and(|b| b.instance_key == t.key && b.node_id == t.node)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in adopted {
            if let Some((target, _)) = self.targets.remove(&key)
                && let Some(source) = self.instances.insert(key.0.clone(), target)
            {
                // Done before the source stopped (failing forward): it
                // still runs until its stop arrives.
                self.displaced.insert(key.0, source);
            }
        }
    }
}
