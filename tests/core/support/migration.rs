//! Helpers for the migration saga's scenario tests: starting migrations,
//! playing both instances' side (prepared, running, stopped, handover
//! signals) and reading what the core asked for.

use super::*;
use norsk_auto_manager::automanager::{
    Answer, Command, CommandError, MigrationId, MigrationOptions, MigrationPhase, MigrationState, MigrationStep,
    MigrationStrategy, Notification, Rpc,
};
use norsk_auto_manager::model::{
    InstanceKey, JobHistoryEntry, JobId, JobStopReason, ManagerEvent, MigrationSignal, NodeId,
};

pub const ONE_JOB: &str = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 2}}\n";

/// A hydrated core (cluster nodes `a`, `b`) with one job running.
pub fn running_job() -> (Harness, JobId, NodeId) {
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    let (job, node) = h.start_all().remove(0);
    h.take_notifications();
    (h, job, node)
}

pub fn options(strategy: MigrationStrategy) -> MigrationOptions {
    MigrationOptions {
        strategy: Some(strategy),
        ..MigrationOptions::default()
    }
}

pub fn try_migrate(h: &mut Harness, job: &JobId, options: MigrationOptions) -> Result<MigrationId, CommandError> {
    let command = h.command(Command::MigrateJob {
        job_id: job.clone(),
        options,
    });
    let mut answers = h.take_answers();
    assert_eq!(answers.len(), 1, "one answer per migrateJob");
    let (id, result) = answers.remove(0);
    assert_eq!(id, command);
    result.map(|answer| match answer {
        Answer::Migration(id) => id,
        other => panic!("migrateJob answered {other:?}"),
    })
}

pub fn migrate(h: &mut Harness, job: &JobId, strategy: MigrationStrategy) -> MigrationId {
    try_migrate(h, job, options(strategy)).expect("the migration starts")
}

pub fn state(h: &Harness, id: &MigrationId) -> MigrationState {
    h.core.migration_by_id(id).expect("migration known").clone()
}

pub fn phases(h: &Harness, id: &MigrationId) -> Vec<MigrationPhase> {
    state(h, id).transitions.iter().map(|t| t.phase).collect()
}

pub fn entry_running(h: &Harness, role: &InstanceKey, node: &NodeId) -> JobHistoryEntry {
    JobHistoryEntry::Running {
        at: Some(h.now),
        role: role.clone(),
        node_id: Some(node.clone()),
    }
}

/// The target of `id` reached running.
pub fn target_runs(h: &mut Harness, id: &MigrationId) {
    let s = state(h, id);
    let entry = entry_running(h, &s.target_key, &s.target_node_id);
    h.history(&s.job_id, entry);
}

/// The source of `id` stopped as asked (`Stopping`, user requested, then
/// `Stopped`).
pub fn source_stops(h: &mut Harness, id: &MigrationId) {
    let s = state(h, id);
    h.history(
        &s.job_id,
        JobHistoryEntry::Stopping {
            at: Some(h.now),
            role: s.source_key.clone(),
            node_id: Some(s.source_node_id.clone()),
            reason: JobStopReason::UserRequested,
        },
    );
    h.stopped(&s.job_id, &s.source_node_id, s.source_key.clone());
}

pub fn prepared(h: &mut Harness, id: &MigrationId) {
    let s = state(h, id);
    h.event(ManagerEvent::JobPrepared {
        job_id: s.job_id,
        role: s.target_key,
        node_id: s.target_node_id,
    });
}

pub fn signal(h: &mut Harness, id: &MigrationId, from_target: bool, signal: MigrationSignal) {
    let s = state(h, id);
    h.event(ManagerEvent::MigrationSignal {
        migration_id: id.0.clone(),
        job_id: s.job_id,
        from_key: if from_target { s.target_key } else { s.source_key },
        signal,
    });
}

/// Answers every call with success; returns them.
pub fn calls(h: &mut Harness) -> Vec<Rpc> {
    h.ok_all()
}

pub fn stops(calls: &[Rpc]) -> Vec<(InstanceKey, NodeId)> {
    calls
        .iter()
        .filter_map(|c| match c {
            Rpc::StopJob {
                instance_key, node_id, ..
            } => Some((instance_key.clone(), node_id.clone())),
            _ => None,
        })
        .collect()
}

pub fn steps(calls: &[Rpc]) -> Vec<MigrationStep> {
    calls
        .iter()
        .filter_map(|c| match c {
            Rpc::SendMigrationSignal { signal, .. } => Some(signal.clone()),
            _ => None,
        })
        .collect()
}

pub fn aborted(notifications: &[Notification]) -> Vec<(String, bool)> {
    notifications
        .iter()
        .filter_map(|n| match n {
            Notification::MigrationAborted { reason, lost, .. } => Some((reason.clone(), *lost)),
            _ => None,
        })
        .collect()
}

pub fn completed(notifications: &[Notification]) -> usize {
    notifications
        .iter()
        .filter(|n| matches!(n, Notification::MigrationCompleted { .. }))
        .count()
}

/// (node, key) of the job's binding.
pub fn bound(h: &Harness, job: &JobId) -> (NodeId, InstanceKey) {
    let b = h.core.job(job).and_then(|r| r.binding.as_ref()).expect("bound");
    (b.node_id.clone(), b.instance_key.clone())
}

pub fn is_target_key(key: &InstanceKey, slot: &str) -> bool {
    let (base, tag) = key.as_str().split_once('@').unwrap_or_default();
    base == slot && tag.len() == 8 && tag.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
}

/// Runs a migration of `strategy` up to (not through) `phase`.
pub fn up_to(strategy: MigrationStrategy, phase: MigrationPhase) -> (Harness, JobId, MigrationId) {
    let (mut h, job, _) = running_job();
    let id = migrate(&mut h, &job, strategy);
    calls(&mut h);
    let walk: &[MigrationPhase] = match strategy {
        MigrationStrategy::StopThenStart => &[
            MigrationPhase::Preparing,
            MigrationPhase::StoppingSource,
            MigrationPhase::StartingTarget,
        ],
        MigrationStrategy::Overlap => &[MigrationPhase::Starting, MigrationPhase::StoppingSource],
        MigrationStrategy::Handover => &[
            MigrationPhase::Starting,
            MigrationPhase::AwaitingReady,
            MigrationPhase::StoppingOutput,
            MigrationPhase::Applying,
            MigrationPhase::StoppingSource,
        ],
    };
    for step in walk {
        if *step == phase {
            break;
        }
        match (strategy, step) {
            (MigrationStrategy::StopThenStart, MigrationPhase::Preparing) => prepared(&mut h, &id),
            (MigrationStrategy::StopThenStart, MigrationPhase::StoppingSource) => source_stops(&mut h, &id),
            (_, MigrationPhase::Starting) => target_runs(&mut h, &id),
            (_, MigrationPhase::AwaitingReady) => signal(&mut h, &id, true, MigrationSignal::TargetReady(vec![1])),
            (_, MigrationPhase::StoppingOutput) => {
                signal(&mut h, &id, false, MigrationSignal::SourceStoppedAt("p".into()))
            }
            (_, MigrationPhase::Applying) => signal(&mut h, &id, true, MigrationSignal::TargetApplied),
            _ => unreachable!(),
        }
        calls(&mut h);
    }
    assert_eq!(state(&h, &id).phase, phase, "walked to {phase:?}");
    h.take_notifications();
    (h, job, id)
}

/// Plays Manager for every `overlap` migration in flight until none moves:
/// every call answered, each target reported running, each source stopped
/// once asked.
pub fn run_overlaps(h: &mut Harness) {
    loop {
        h.ok_all();
        let mut moved = false;
        let in_flight: Vec<MigrationState> = h
            .core
            .migrations()
            .into_iter()
            .filter(|m| m.is_in_flight())
            .cloned()
            .collect();
        for m in in_flight {
            match m.phase {
                MigrationPhase::Starting => {
                    h.history(
                        &m.job_id,
                        JobHistoryEntry::Running {
                            at: Some(h.now),
                            role: m.target_key.clone(),
                            node_id: Some(m.target_node_id.clone()),
                        },
                    );
                    moved = true;
                }
                MigrationPhase::StoppingSource => {
                    h.history(
                        &m.job_id,
                        JobHistoryEntry::Stopping {
                            at: Some(h.now),
                            role: m.source_key.clone(),
                            node_id: Some(m.source_node_id.clone()),
                            reason: JobStopReason::UserRequested,
                        },
                    );
                    h.stopped(&m.job_id, &m.source_node_id, m.source_key.clone());
                    moved = true;
                }
                _ => {}
            }
        }
        if !moved {
            return;
        }
    }
}

/// The nodes the core asked Manager to terminate.
pub fn terminates(calls: &[Rpc]) -> Vec<NodeId> {
    calls
        .iter()
        .filter_map(|c| match c {
            Rpc::TerminateNode { node_id } => Some(node_id.clone()),
            _ => None,
        })
        .collect()
}
