//! Manual jobs (`startMode: manual`) started and stopped as a desired state.
//!
//! Each bundle whose spec this core applied (or whose jobs it was told to
//! start or stop) has a wanted set: the replicas of its manual jobs that
//! should run — the spec's `startedReplicas`, edited by `startBundleJob` /
//! `stopBundleJob`. Manager keeps what runs as each job's dormant flag; every
//! step brings it to the wanted set with `StartBundleJob` / `StopBundleJob`
//! (one call in flight per job, again `TOGGLE_RETRY_MS` after an answer that
//! did not change the flag). A bundle this core was never told about keeps
//! whatever Manager holds.
//!
//! Going beyond the spec's `stopBundleJob` (which leaves a running worker
//! alone), a manual job that is not wanted is also taken off its node: its
//! instance is stopped (`StopJob`; one launching for it is simply unbound)
//! and, not being wanted, it is never recovered. A migration of it in
//! flight is aborted first (one past its point of no return is let finish).
//!
//! Starting and stopping is not a revision of the bundle: nothing is sent
//! to Manager as `UpdateBundle`, so restart histories and a broken mark are
//! kept and the other jobs are not touched.

pub(super) mod state;

pub use state::TOGGLE_RETRY_MS;

use std::collections::BTreeSet;

use crate::model::{BundleId, BundleJobRef, BundleSpec, BundleState, JobId, ReplicaJob, UnixMillis};

use super::binding::{BindingPhase, JobRecord};
use super::core::AutoManagerCore;
use super::facts::Facts;
use super::migration::Saga;
use super::notification::Notification;
use super::outbox::{Outbox, Pending};
use super::protocol::{Action, CommandError, CommandId, Rpc, RpcFailure};
use state::{ManualStarts, Toggle, replica_job};

impl AutoManagerCore {
    /// A bundle's spec as applied: Manager's spec with each manual job's
    /// `startedReplicas` as this core runs them. What a spec to apply is
    /// compared with.
    pub fn applied_spec(&self, bundle_id: &BundleId) -> Option<BundleSpec> {
        let bundle = self.facts.bundles.get(bundle_id)?;
        Some(
            bundle
                .spec
                .with_started(&self.manual.started_of(&self.facts, bundle_id)),
        )
    }

    /// Whether the job is a manual one that does not run: Manager holds it
    /// dormant or the wanted set keeps it stopped.
    pub fn is_dormant(&self, record: &JobRecord) -> bool {
        record.job.dormant || self.manual.held_stopped(&self.facts, record)
    }

    /// `updateBundle` of a spec equal to the applied one but for which
    /// manual jobs are started: the wanted set changes and nothing is sent
    /// as an update. `false` when the update is a revision.
    pub(super) fn start_stop_only(&mut self, bundle_id: &BundleId, spec: &BundleSpec) -> bool {
        let Some(stored) = self.facts.bundles.get(bundle_id) else {
            return false;
        };
        let started = spec.started();
        if stored.state != BundleState::Live
            || !stored.spec.same_revision(spec)
            || self.manual.started_of(&self.facts, bundle_id) == started
        {
            return false;
        }
        self.manual.want(bundle_id.clone(), started);
        true
    }

    /// `startBundleJob` / `stopBundleJob`: the replica is added to (or
    /// taken from) the wanted set once Manager accepts the toggle, and the
    /// command is answered then (at once when Manager already holds it so).
    /// A bundle this core has not heard of yet (its creation's events still
    /// on their way) is Manager's to judge: the toggle goes to Manager as
    /// asked.
    pub(super) fn toggle_command(&mut self, command: CommandId, job: BundleJobRef, start: bool) {
        let job_id = crate::model::runtime_job_id(&job.bundle_id, job.replica_index, &job.job_name);
        let wants = (job.bundle_id.clone(), replica_job(&job));
        let Some(bundle) = self.facts.bundles.get(&job.bundle_id) else {
            return self
                .manual
                .send_toggle(&mut self.outbox, job_id, job, start, vec![command], Some(wants));
        };
        let spec = &bundle.spec;
        let Some(job_spec) = spec
            .job(&job.job_name)
            .filter(|_| job.replica_index < spec.replica_count())
        else {
            return self.reply(
                command,
                Err(CommandError::UnknownBundleJob {
                    bundle_id: job.bundle_id,
                    replica_index: job.replica_index,
                    job_name: job.job_name,
                }),
            );
        };
        if job_spec.start_mode != crate::model::StartMode::Manual {
            return self.reply(
                command,
                Err(CommandError::NotManualJob {
                    bundle_id: job.bundle_id,
                    job_name: job.job_name,
                }),
            );
        }
        let holds_so = self.facts.jobs.get(&job_id).is_some_and(|r| r.job.dormant != start);
        if holds_so && !self.manual.toggles.contains_key(&job_id) {
            self.manual.apply_want(&self.facts, &wants.0, wants.1, start);
            return self.reply(command, Ok(()));
        }
        match self.manual.toggles.get_mut(&job_id) {
            // The same toggle in flight: answered with it.
            Some(t) if t.start == start && t.answered.is_none() => {
                t.waiting.push(command);
                t.wants = Some(wants);
            }
            _ => self
                .manual
                .send_toggle(&mut self.outbox, job_id, job, start, vec![command], Some(wants)),
        }
    }

    /// Brings Manager to every wanted set (see [`ManualStarts::reconcile`]).
    pub(super) fn reconcile_manual(&mut self, now: UnixMillis) {
        let relays_signals = self.manager.serves(crate::model::manager::Capability::MigrationSignals);
        let mut saga = Saga {
            facts: &mut self.facts,
            outbox: &mut self.outbox,
            migrations: &mut self.migrations,
            counters: &mut self.counters,
            relays_signals,
        };
        self.manual.reconcile(&mut saga, now);
    }
}

impl ManualStarts {
    /// The replicas of `bundle_id`'s manual jobs that run as this core
    /// wants them: its wanted set, or, for a bundle it was never told
    /// about, those Manager holds not dormant.
    fn started_of(&self, facts: &Facts, bundle_id: &BundleId) -> BTreeSet<ReplicaJob> {
        if let Some(wanted) = self.wanted.get(bundle_id) {
            return wanted.clone();
        }
        let Some(bundle) = facts.bundles.get(bundle_id) else {
            return BTreeSet::new();
        };
        facts
            .jobs
            .values()
            .filter(|r| &r.bundle_ref.bundle_id == bundle_id)
            .filter(|r| bundle.spec.is_manual(&r.bundle_ref.job_name) && !r.job.dormant)
            .map(|r| replica_job(&r.bundle_ref))
            .collect()
    }

    /// Whether `record` is a manual job its bundle's wanted set keeps
    /// stopped (never placed, whatever Manager's flag says meanwhile).
    fn held_stopped(&self, facts: &Facts, record: &JobRecord) -> bool {
        let r = &record.bundle_ref;
        facts
            .bundles
            .get(&r.bundle_id)
            .is_some_and(|b| b.spec.is_manual(&r.job_name))
            && self.holds_stopped(&r.bundle_id, &replica_job(r))
    }

    fn send_toggle(
        &mut self,
        outbox: &mut Outbox,
        job_id: JobId,
        job: BundleJobRef,
        start: bool,
        waiting: Vec<CommandId>,
        wants: Option<(BundleId, ReplicaJob)>,
    ) {
        self.toggles.insert(
            job_id.clone(),
            Toggle {
                start,
                answered: None,
                waiting,
                wants,
            },
        );
        let rpc = if start {
            Rpc::StartBundleJob(job)
        } else {
            Rpc::StopBundleJob(job)
        };
        outbox.call(rpc, Pending::Toggle(job_id));
    }

    fn apply_want(&mut self, facts: &Facts, bundle_id: &BundleId, replica: ReplicaJob, start: bool) {
        let mut wanted = self.started_of(facts, bundle_id);
        if start {
            wanted.insert(replica);
        } else {
            wanted.remove(&replica);
        }
        self.want(bundle_id.clone(), wanted);
    }

    /// What Manager answered to a `StartBundleJob` / `StopBundleJob`.
    pub(super) fn toggle_result(
        &mut self,
        facts: &Facts,
        outbox: &mut Outbox,
        job_id: &JobId,
        result: Result<(), RpcFailure>,
        now: UnixMillis,
    ) {
        let Some(toggle) = self.toggles.get_mut(job_id) else {
            return;
        };
        toggle.answered = Some(now);
        let (start, waiting, wants) = (toggle.start, std::mem::take(&mut toggle.waiting), toggle.wants.take());
        match &result {
            Ok(()) => {
                if let Some((bundle_id, replica)) = wants {
                    self.apply_want(facts, &bundle_id, replica, start);
                }
                outbox.notify(if start {
                    Notification::BundleJobStarted { job_id: job_id.clone() }
                } else {
                    Notification::BundleJobStopped { job_id: job_id.clone() }
                });
            }
            Err(failure) => outbox.notify(Notification::Error {
                message: format!(
                    "{} {job_id} failed: {}",
                    if start { "StartBundleJob" } else { "StopBundleJob" },
                    failure.message
                ),
            }),
        }
        for command in waiting {
            outbox.reply(Action::Reply {
                command,
                result: result.clone().map_err(CommandError::Manager),
            });
        }
    }

    /// What Manager answered to the `StopJob` of an unwanted job.
    pub(super) fn stop_result(
        &mut self,
        outbox: &mut Outbox,
        job_id: &JobId,
        result: Result<(), RpcFailure>,
        now: UnixMillis,
    ) {
        if let Some((_, answered)) = self.stops.get_mut(job_id) {
            *answered = Some(now);
        }
        if let Err(failure) = result {
            outbox.notify(Notification::Error {
                message: format!(
                    "stopping the instance of stopped manual job {job_id} failed: {}",
                    failure.message
                ),
            });
        }
    }

    /// Brings every wanted set's bundle to it: toggles Manager's dormant
    /// flags and takes unwanted jobs off their nodes (aborting a migration
    /// of one in flight through the saga).
    pub(super) fn reconcile(&mut self, saga: &mut Saga, now: UnixMillis) {
        let mut mismatches = Vec::new();
        let mut stops = Vec::new();
        let facts = &*saga.facts;
        for (bundle_id, wanted) in &self.wanted {
            let Some(bundle) = facts.bundles.get(bundle_id).filter(|b| b.state == BundleState::Live) else {
                continue;
            };
            for job in bundle.spec.jobs.iter().filter(|j| bundle.spec.is_manual(&j.job_name)) {
                for replica_index in 0..bundle.spec.replica_count() {
                    let job_id = crate::model::runtime_job_id(bundle_id, replica_index, &job.job_name);
                    let Some(record) = facts.jobs.get(&job_id) else {
                        continue;
                    };
                    let want = wanted.contains(&(replica_index, job.job_name.clone()));
                    if record.job.dormant == want {
                        mismatches.push((job_id.clone(), record.bundle_ref.clone(), want));
                    }
                    if !want && record.binding.is_some() {
                        stops.push(job_id);
                    }
                }
            }
        }
        let mismatched: BTreeSet<&JobId> = mismatches.iter().map(|(id, _, _)| id).collect();
        // A toggle whose job reached the wanted state needs nothing more.
        self.toggles
            .retain(|id, t| mismatched.contains(id) || t.answered.is_none());
        for (job_id, job, start) in mismatches {
            let due = match self.toggles.get(&job_id) {
                None => true,
                Some(t) => t
                    .answered
                    .is_some_and(|at| t.start != start || at + TOGGLE_RETRY_MS <= now),
            };
            if due {
                self.send_toggle(saga.outbox, job_id, job, start, Vec::new(), None);
            }
        }
        // A stop is remembered only while its job is unwanted and still on
        // the instance it was sent for.
        self.stops.retain(|job_id, (key, _)| {
            stops.contains(job_id)
                && facts
                    .jobs
                    .get(job_id)
                    .and_then(|r| r.binding.as_ref())
                    .is_some_and(|b| &b.instance_key == key)
        });
        for job_id in stops {
            self.take_off_node(saga, &job_id, now);
        }
    }

    /// An unwanted manual job leaves its node: a start in flight is waited
    /// for, a migration in flight aborted (past its point of no return it
    /// is let finish), an instance still to start is unbound, and a started
    /// one stopped.
    fn take_off_node(&mut self, saga: &mut Saga, job_id: &JobId, now: UnixMillis) {
        let Some(record) = saga.facts.jobs.get(job_id) else {
            return;
        };
        if record.in_flight.is_some() {
            return;
        }
        if let Some(claim) = &record.migration {
            let migration_id = claim.migration_id.clone();
            // Refused past the point of no return: the saga finishes, then
            // the job is stopped where it landed.
            let _ = saga.abort_migration(&migration_id, "the manual job was stopped", now);
            return;
        }
        let Some(binding) = record.binding.clone() else {
            return;
        };
        if binding.phase == BindingPhase::AwaitingNode {
            return saga.facts.unbind(saga.outbox, job_id, true);
        }
        let due = match self.stops.get(job_id) {
            Some((key, answered)) if key == &binding.instance_key => {
                answered.is_some_and(|at| at + TOGGLE_RETRY_MS <= now)
            }
            _ => true,
        };
        if !due {
            return;
        }
        self.stops.insert(job_id.clone(), (binding.instance_key.clone(), None));
        saga.outbox.call(
            Rpc::StopJob {
                job_id: job_id.clone(),
                instance_key: binding.instance_key,
                node_id: binding.node_id,
            },
            Pending::ManualStop(job_id.clone()),
        );
    }

    /// When a toggle or a stop is due again (one held back by something
    /// else, such as a start in flight, waits for that to change instead).
    pub(super) fn deadline(&self, now: UnixMillis) -> impl Iterator<Item = UnixMillis> + '_ {
        let toggles = self.toggles.values().filter_map(|t| t.answered);
        let stops = self.stops.values().filter_map(|(_, answered)| *answered);
        toggles
            .chain(stops)
            .map(|at| at + TOGGLE_RETRY_MS)
            .filter(move |&at| at > now)
    }
}
