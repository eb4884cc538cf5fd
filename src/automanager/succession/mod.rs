//! Succession: after a stream break the runtime disposes of the core and
//! hydrates a fresh one from Manager's new snapshot. What Manager's
//! snapshot cannot say is this AutoManager's own and is carried over here,
//! in two halves: [`AutoManagerCore::succeeding`] takes it from the
//! disposed core into an [`Inheritance`](state::Inheritance), and
//! [`AutoManagerCore::take_up_inheritance`] applies it once the snapshot
//! has been replayed.

pub(super) mod state;

use std::collections::{BTreeMap, BTreeSet};

use crate::automanager::binding::{Binding, BindingPhase};
use crate::automanager::core::AutoManagerCore;
use crate::automanager::drain::state::Drains;
use crate::automanager::history::live_instances;
use crate::automanager::manual::state::ManualStarts;
use crate::automanager::migration::state::{MigrationCall, Migrations};
use crate::automanager::outbox::{Pending, SubsystemCall};
use crate::automanager::protocol::RequestId;
use crate::automanager::recovery::{counts_for_restarts, replay_restart};
use crate::automanager::settings::ValidSettings;
use crate::automanager::spares::state::SpareRequest;
use crate::model::{Bundle, BundleId, InstanceKey, JobId, MigrationPhase, NodeId, UnixMillis};

use self::state::{CarriedJob, InheritedStart, NodeMarks};

impl AutoManagerCore {
    /// A fresh core that carries on from a disposed one: after a stream
    /// break the runtime hydrates a new core from the new snapshot. What
    /// Manager's snapshot cannot say is this AutoManager's own and carries
    /// over: the counters (so `metrics()` stays cumulative), the drains,
    /// cordons and interruption notices, the calls still on their way and
    /// what each was for (starts hold their job's gate and room until
    /// answered), which nodes it provisioned, terminated or is to release
    /// once empty, and the migrations in flight with their jobs' records:
    /// a saga carries on where it was (its calls' answers reach it, its
    /// deadlines stand in for signals sent while the stream was down), as
    /// neither rolling back nor failing forward blind is safe — the
    /// disposed core may have told the source to stop, or not yet.
    pub fn succeeding(valid: ValidSettings, previous: &AutoManagerCore) -> Self {
        let mut core = Self::new(valid, previous.started_at);
        core.counters = previous.counters.clone();
        core.manager = previous.manager.clone();
        core.facts.fleet.carry_declarations(&previous.facts.fleet);
        // `updateHotSpareSpecs` replaced the list without a reconnect; a
        // reconnect keeps it.
        core.facts
            .placed_with
            .set_hot_spares(previous.facts.settings().hot_spares.clone());
        core.outbox.continue_from(&previous.outbox);
        // Revisions keep counting: a reading of the new core is never
        // taken for one of the old.
        core.revision = previous.revision;
        // Node ids keep counting, so a node Manager has already forgotten is
        // never named again by this process.
        core.facts.node_ids = previous.facts.node_ids.clone();
        core.unheard_creates = previous.unheard_creates.clone();
        core.drains = Drains::carried_from(&previous.drains, &previous.facts.fleet);
        core.manual = ManualStarts::carried_from(&previous.manual);
        core.migrations = Migrations::carried_from(&previous.migrations);
        core.inherited.migrating = previous
            .facts
            .jobs
            .iter()
            .filter(|(_, record)| record.migration.is_some())
            .map(|(id, record)| (id.clone(), record.clone()))
            .collect();
        core.carry_calls(previous);
        core.carry_node_marks(previous);
        core.carry_job_outcomes(previous);
        core.subsystems = previous.subsystems.carried();
        core
    }

    /// Calls still on their way are answered here: commands (a toggle in
    /// flight answers the commands that wait on it), creates and
    /// terminates, and starts with the stops undoing timed-out ones —
    /// Manager may carry those out after its snapshot was taken, so each
    /// start holds its job's gate shut and its room reserved until
    /// answered; left unknown, a start landing late would put the job
    /// beside its new placement, or over the room given to another.
    fn carry_calls(&mut self, previous: &AutoManagerCore) {
        // The gate each job's calls held: the predecessor's records name it
        // once it has taken up its own inheritance; before that (disposed
        // while still hydrating) its inheritance does.
        let gate_of = |id: RequestId, job_id: &JobId| -> (bool, Option<Binding>) {
            if previous.facts.hydrated {
                let record = previous.facts.jobs.get(job_id).filter(|r| r.in_flight == Some(id));
                return (record.is_some(), record.and_then(|r| r.binding.clone()));
            }
            previous
                .inherited
                .starts
                .iter()
                .find(|s| s.id == id)
                .map_or((false, None), |s| (s.holds_gate, s.binding.clone()))
        };
        for (id, pending) in &previous.outbox.pending {
            match pending {
                Pending::Command { .. }
                | Pending::Toggle(_)
                | Pending::CreateNode { .. }
                | Pending::Subsystem(SubsystemCall::Spare(SpareRequest::Provision { .. }))
                | Pending::TerminateNode(_) => {}
                Pending::Migration { migration_id, call } => {
                    // A stop of a migration's source or target still on its
                    // way: the instance is going even when the saga ended
                    // (a source whose stop went unanswered past its
                    // deadline), so it is never taken back for the job.
                    if let Some(m) = previous.migrations.get(migration_id) {
                        let going = match call {
                            MigrationCall::StopSource => Some((&m.source_key, &m.source_node_id)),
                            MigrationCall::StopTarget => Some((&m.target_key, &m.target_node_id)),
                            _ => None,
                        };
                        if let Some((key, node)) = going {
                            self.inherited
                                .undoing
                                .insert((m.job_id.clone(), key.clone(), node.clone()));
                        }
                    }
                }
                Pending::StartJob { job_id, .. } => {
                    let (holds_gate, binding) = gate_of(*id, job_id);
                    self.inherited.starts.push(InheritedStart {
                        id: *id,
                        job_id: job_id.clone(),
                        holds_gate,
                        binding,
                    });
                }
                Pending::UndoStart {
                    job_id,
                    instance_key,
                    node_id,
                } => {
                    self.inherited.starts.push(InheritedStart {
                        id: *id,
                        job_id: job_id.clone(),
                        holds_gate: gate_of(*id, job_id).0,
                        binding: None,
                    });
                    self.inherited
                        .undoing
                        .insert((job_id.clone(), instance_key.clone(), node_id.clone()));
                }
                _ => continue,
            }
            self.outbox.pending.insert(*id, pending.clone());
        }
    }

    /// The predecessor's marks on its nodes, and the nodes it was
    /// launching.
    fn carry_node_marks(&mut self, previous: &AutoManagerCore) {
        for node in previous.facts.fleet.iter() {
            // A node it was launching keeps its provision deadline (one the
            // snapshot shows starting would otherwise wait forever), and one
            // Manager has not announced yet stays, so its create's answer
            // finds it.
            if node.is_launching()
                && let Some(provisioned) = &node.provisioned
            {
                self.facts.fleet.add_provisioned(node.id.clone(), provisioned.clone());
            }
            // Which nodes it provisioned (what `singleUse` may release),
            // terminated (they take nothing new; a terminate Manager did not
            // hear is sent again) or is to release once empty.
            if node.provisioned.is_some() || node.terminated || node.release_when_empty {
                self.inherited.nodes.insert(
                    node.id.clone(),
                    NodeMarks {
                        provisioned: node.provisioned.clone(),
                        terminated: node.terminated,
                        release_when_empty: node.release_when_empty,
                    },
                );
            }
        }
    }

    /// What the predecessor decided of its bundles and jobs that Manager's
    /// history does not say, for the generation it knew.
    fn carry_job_outcomes(&mut self, previous: &AutoManagerCore) {
        let generation = |bundle: &BundleId| previous.facts.bundles.get(bundle).map_or(0, |b| b.generation);
        self.inherited.broken = previous
            .facts
            .broken
            .iter()
            .map(|(bundle, reason)| (bundle.clone(), (reason.clone(), generation(bundle))))
            .collect();
        self.inherited.jobs = previous
            .facts
            .jobs
            .iter()
            .map(|(id, record)| {
                let read = &record.job.history[..record.history_seen.min(record.job.history.len())];
                let carried = CarriedJob {
                    generation: generation(&record.bundle_ref.bundle_id),
                    restarts: record.restarts.clone(),
                    counted: read.iter().filter(|e| counts_for_restarts(e)).count(),
                    // A migrating job's record is carried whole.
                    binding: record
                        .binding
                        .clone()
                        .filter(|b| record.migration.is_none() && b.phase != BindingPhase::AwaitingNode),
                    dropped: record.dropped,
                };
                (id.clone(), carried)
            })
            .collect();
    }

    /// What a predecessor left (see [`AutoManagerCore::succeeding`]): its
    /// marks on the nodes the snapshot shows (provisioned, terminated, to
    /// release once empty); for each of its starts still on their way the
    /// job's gate stays shut until the answer, and a job the snapshot shows
    /// placed nowhere keeps the placement the start was for (its capacity
    /// reserved), on a node that is still up.
    ///
    /// A migrating job the snapshot does not show was deleted meanwhile: its
    /// migration ends as for any deleted job.
    pub(super) fn take_up_inheritance(&mut self, now: UnixMillis) {
        let inherited = std::mem::take(&mut self.inherited);
        for (job_id, record) in inherited.migrating {
            self.facts.jobs.insert(job_id.clone(), record);
            self.job_deleted(job_id, now);
        }
        for (bundle, (reason, generation)) in inherited.broken {
            if generation_unchanged(&self.facts.bundles, &bundle, generation) {
                self.facts.broken.entry(bundle.clone()).or_insert(reason);
                self.losses().withhold_unstarted(&bundle);
            }
        }
        self.take_up_jobs(inherited.jobs);
        for (node_id, marks) in inherited.nodes {
            self.facts
                .fleet
                .inherit(&node_id, marks.terminated, marks.release_when_empty, marks.provisioned);
        }
        self.take_up_starts(inherited.starts);
    }

    /// Each job's carried binding (while Manager's history shows it live,
    /// or its start is still on its way), and its outcome and restart count
    /// for the generation its predecessor knew.
    fn take_up_jobs(&mut self, jobs: BTreeMap<JobId, CarriedJob>) {
        // Prepared targets whose start is still on its way, of migrations
        // that moved their job onto them (a deadline passed first). A
        // Manager without deferred start records such a target only once
        // the start lands: until then its history cannot show it, and the
        // job stands bound to it as to any start on its way.
        let starting: BTreeSet<(JobId, InstanceKey, NodeId)> = self
            .outbox
            .pending
            .values()
            .filter_map(|pending| match pending {
                Pending::Migration {
                    migration_id,
                    call: MigrationCall::StartPrepared,
                } => self
                    .migrations
                    .get(migration_id)
                    .filter(|m| m.phase == MigrationPhase::Done)
                    .map(|m| (m.job_id.clone(), m.target_key.clone(), m.target_node_id.clone())),
                _ => None,
            })
            .collect();
        for (job_id, carried) in jobs {
            let usable = |node: &NodeId| {
                self.facts
                    .fleet
                    .get(node)
                    .is_some_and(|n| !n.is_going() && !n.terminated)
            };
            let binding = carried.binding.filter(|b| usable(&b.node_id));
            let Some(mut record) = self.facts.jobs.get_mut(&job_id) else {
                continue;
            };
            // The predecessor judged the losses it saw; those a snapshot
            // replays are not news.
            record.unjudged_loss = None;
            // A job dropped since (its verdict is on Manager) is bound to
            // nothing: its instance is a stray.
            if let Some(binding) = binding
                && record.migration.is_none()
                && !record.dropped
                && record.job.terminal_verdict.is_none()
                && record.binding.as_ref() != Some(&binding)
                && let Some(phase) = live_instances(&record.job.history)
                    .into_iter()
                    .find(|(key, node, _)| key == &binding.instance_key && node == &binding.node_id)
                    .map(|(_, _, phase)| phase)
                    .or_else(|| {
                        starting
                            .contains(&(job_id.clone(), binding.instance_key.clone(), binding.node_id.clone()))
                            .then_some(BindingPhase::Dispatched)
                    })
            {
                record.binding = Some(Binding { phase, ..binding });
            }
            // Its outcome and count are for the generation it knew.
            if !generation_unchanged(&self.facts.bundles, &record.bundle_ref.bundle_id, carried.generation) {
                continue;
            }
            record.dropped |= carried.dropped;
            let mut restarts = carried.restarts;
            let since = record
                .job
                .history
                .iter()
                .filter(|e| counts_for_restarts(e))
                .skip(carried.counted);
            for entry in since {
                replay_restart(&mut restarts, entry);
            }
            record.restarts = restarts;
        }
    }

    /// The starts its predecessor awaited, each holding its job's gate.
    fn take_up_starts(&mut self, starts: Vec<InheritedStart>) {
        // Each job's gate is the one its predecessor held; the other calls'
        // answers are handled without it, as they would have been there.
        for start in starts.into_iter().filter(|s| s.holds_gate) {
            let binding = start.binding;
            let node_up = binding
                .as_ref()
                .is_some_and(|b| self.facts.fleet.get(&b.node_id).is_some_and(|n| !n.is_going()));
            let Some(mut record) = self.facts.jobs.get_mut(&start.job_id).filter(|r| r.in_flight.is_none()) else {
                continue;
            };
            record.in_flight = Some(start.id);
            if record.binding.is_none()
                && node_up
                && let Some(mut binding) = binding
            {
                binding.phase = BindingPhase::Dispatched;
                record.binding = Some(binding);
            }
        }
    }
}

/// Whether `bundle` is still at the generation a predecessor decided for.
fn generation_unchanged(bundles: &BTreeMap<BundleId, Bundle>, bundle: &BundleId, generation: u64) -> bool {
    bundles.get(bundle).is_some_and(|b| b.generation == generation)
}
