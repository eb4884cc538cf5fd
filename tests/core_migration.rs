//! Scenario tests of the migration saga on a virtual clock: for each
//! strategy every phase, each phase's deadline, aborts before and after the
//! point of no return, a target rejected as an invalid spec, no concurrent
//! migrations, the instance key moving at `done`, and `close()`.

mod core_support;

use core_support::*;
use norsk_auto_manager::automanager::migration::{
    DEFAULT_MIGRATION_HANDOVER_STEP_TIMEOUT_MS, DEFAULT_MIGRATION_PLACING_TIMEOUT_MS,
    DEFAULT_MIGRATION_START_TIMEOUT_MS, DEFAULT_MIGRATION_STOPPING_SOURCE_TIMEOUT_MS,
};
use norsk_auto_manager::automanager::{
    Answer, Command, CommandError, Input, MigrationId, MigrationOptions, MigrationPhase, MigrationRefusal,
    MigrationState, MigrationStep, MigrationStrategy, Notification, Rpc,
};
use norsk_auto_manager::model::{
    InstanceKey, JobHistoryEntry, JobId, JobStopReason, ManagerEvent, MigrationSignal, NodeId, NodeStopReason,
    RejectionCode,
};

const ONE_JOB: &str = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 2}}\n";

/// A hydrated core (cluster nodes `a`, `b`) with one job running.
fn running_job() -> (Harness, JobId, NodeId) {
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    let (job, node) = h.start_all().remove(0);
    h.take_notifications();
    (h, job, node)
}

fn options(strategy: MigrationStrategy) -> MigrationOptions {
    MigrationOptions {
        strategy,
        ..MigrationOptions::default()
    }
}

fn try_migrate(h: &mut Harness, job: &JobId, options: MigrationOptions) -> Result<MigrationId, CommandError> {
    let command = h.command(Command::MigrateJob {
        job_id: job.clone(),
        options,
    });
    let mut answers = h.take_answers();
    assert_eq!(answers.len(), 1, "one answer per migrateJob");
    let (id, result) = answers.remove(0);
    assert_eq!(id, command);
    result.map(|Answer::Migration(id)| id)
}

fn migrate(h: &mut Harness, job: &JobId, strategy: MigrationStrategy) -> MigrationId {
    try_migrate(h, job, options(strategy)).expect("the migration starts")
}

fn state(h: &Harness, id: &MigrationId) -> MigrationState {
    h.core.migration_by_id(id).expect("migration known").clone()
}

fn phases(h: &Harness, id: &MigrationId) -> Vec<MigrationPhase> {
    state(h, id).transitions.iter().map(|t| t.phase).collect()
}

fn entry_running(h: &Harness, role: &InstanceKey, node: &NodeId) -> JobHistoryEntry {
    JobHistoryEntry::Running {
        at: Some(h.now),
        role: role.clone(),
        node_id: Some(node.clone()),
    }
}

/// The target of `id` reached running.
fn target_runs(h: &mut Harness, id: &MigrationId) {
    let s = state(h, id);
    let entry = entry_running(h, &s.target_key, &s.target_node_id);
    h.history(&s.job_id, entry);
}

/// The source of `id` stopped as asked (`Stopping`, user requested, then
/// `Stopped`).
fn source_stops(h: &mut Harness, id: &MigrationId) {
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

fn prepared(h: &mut Harness, id: &MigrationId) {
    let s = state(h, id);
    h.event(ManagerEvent::JobPrepared {
        job_id: s.job_id,
        role: s.target_key,
        node_id: s.target_node_id,
    });
}

fn signal(h: &mut Harness, id: &MigrationId, from_target: bool, signal: MigrationSignal) {
    let s = state(h, id);
    h.event(ManagerEvent::MigrationSignal {
        migration_id: id.0.clone(),
        job_id: s.job_id,
        from_key: if from_target { s.target_key } else { s.source_key },
        signal,
    });
}

/// Answers every call with success; returns them.
fn calls(h: &mut Harness) -> Vec<Rpc> {
    h.ok_all()
}

fn stops(calls: &[Rpc]) -> Vec<(InstanceKey, NodeId)> {
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

fn steps(calls: &[Rpc]) -> Vec<MigrationStep> {
    calls
        .iter()
        .filter_map(|c| match c {
            Rpc::SendMigrationSignal { signal, .. } => Some(signal.clone()),
            _ => None,
        })
        .collect()
}

fn aborted(notifications: &[Notification]) -> Vec<(String, bool)> {
    notifications
        .iter()
        .filter_map(|n| match n {
            Notification::MigrationAborted { reason, lost, .. } => Some((reason.clone(), *lost)),
            _ => None,
        })
        .collect()
}

fn completed(notifications: &[Notification]) -> usize {
    notifications
        .iter()
        .filter(|n| matches!(n, Notification::MigrationCompleted { .. }))
        .count()
}

/// (node, key) of the job's binding.
fn bound(h: &Harness, job: &JobId) -> (NodeId, InstanceKey) {
    let b = h.core.job(job).and_then(|r| r.binding.as_ref()).expect("bound");
    (b.node_id.clone(), b.instance_key.clone())
}

fn is_target_key(key: &InstanceKey, slot: &str) -> bool {
    let (base, tag) = key.as_str().split_once('@').unwrap_or_default();
    base == slot && tag.len() == 8 && tag.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
}

#[test]
fn stop_then_start_prepares_the_target_stops_the_source_then_starts_the_target() {
    let (mut h, job, source) = running_job();
    let id = migrate(&mut h, &job, MigrationStrategy::StopThenStart);
    let s = state(&h, &id);
    assert_ne!(s.target_node_id, source, "the source node is never a candidate");
    let first = calls(&mut h);
    assert!(
        matches!(&first[..], [Rpc::StartMigrationTarget { defer_start: true, runtime_role, migration_id, .. }] if runtime_role == "primary" && migration_id == &id),
        "the target is created with a deferred start: {first:?}"
    );
    assert_eq!(s.phase, MigrationPhase::Preparing);
    assert!(!s.past_point_of_no_return);
    prepared(&mut h, &id);
    assert_eq!(stops(&calls(&mut h)), vec![(s.source_key.clone(), source.clone())]);
    assert!(
        state(&h, &id).past_point_of_no_return,
        "stopping the source is the point of no return"
    );
    source_stops(&mut h, &id);
    let started = calls(&mut h);
    assert!(
        matches!(&started[..], [Rpc::StartPreparedJob { instance_key, node_id, .. }] if instance_key == &s.target_key && node_id == &s.target_node_id),
        "the prepared target is started once the source stopped: {started:?}"
    );
    assert_eq!(bound(&h, &job).0, source, "the binding moves only at done");
    target_runs(&mut h, &id);
    assert_eq!(
        phases(&h, &id),
        vec![
            MigrationPhase::Placing,
            MigrationPhase::Preparing,
            MigrationPhase::StoppingSource,
            MigrationPhase::StartingTarget,
            MigrationPhase::Done
        ]
    );
    assert_eq!(bound(&h, &job), (s.target_node_id, s.target_key));
    assert_eq!(completed(&h.take_notifications()), 1);
}

#[test]
fn overlap_starts_the_target_and_stops_the_source_once_it_runs() {
    let (mut h, job, source) = running_job();
    let id = migrate(&mut h, &job, MigrationStrategy::Overlap);
    let first = calls(&mut h);
    assert!(
        matches!(&first[..], [Rpc::StartMigrationTarget { defer_start: false, .. }]),
        "the target is started at once: {first:?}"
    );
    assert!(
        stops(&first).is_empty(),
        "the source is stopped only once the target runs"
    );
    target_runs(&mut h, &id);
    let s = state(&h, &id);
    assert_eq!(stops(&calls(&mut h)), vec![(s.source_key.clone(), source)]);
    assert!(s.past_point_of_no_return);
    source_stops(&mut h, &id);
    assert_eq!(
        phases(&h, &id),
        vec![
            MigrationPhase::Placing,
            MigrationPhase::Starting,
            MigrationPhase::StoppingSource,
            MigrationPhase::Done
        ]
    );
    assert_eq!(bound(&h, &job), (s.target_node_id, s.target_key));
}

#[test]
fn during_the_overlap_the_job_is_reserved_on_both_nodes() {
    let (mut h, job, _) = running_job();
    let used = |h: &Harness| h.core.metrics(h.now).pools[0].used_capacity_fraction;
    assert_eq!(used(&h), 0.25);
    let id = migrate(&mut h, &job, MigrationStrategy::Overlap);
    calls(&mut h);
    assert_eq!(used(&h), 0.5, "the target is reserved beside the source");
    // A 3-vCPU job fits neither 4-vCPU node now: it is provisioned for.
    h.bundle(
        "big",
        "pool: production\njobs:\n  - {jobName: big, requirements: {requiredCapacity: 3}}\n",
    );
    assert!(
        calls(&mut h).iter().any(|c| matches!(c, Rpc::CreateNode { .. })),
        "the target's node was offered as free"
    );
    target_runs(&mut h, &id);
    source_stops(&mut h, &id);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Done);
    assert_eq!(bound(&h, &job).0, state(&h, &id).target_node_id);
    // The target (2) and the big job's reservation on its new node (3), of
    // the two cluster nodes' 8 vCPUs: the source's 2 are released at done.
    assert_eq!(used(&h), 0.625, "the source's reservation is released at done");
}

#[test]
fn handover_walks_ready_stop_output_apply_then_stops_the_source() {
    let (mut h, job, source) = running_job();
    let id = migrate(&mut h, &job, MigrationStrategy::Handover);
    calls(&mut h);
    target_runs(&mut h, &id);
    assert_eq!(
        steps(&calls(&mut h)),
        vec![MigrationStep::Propose(MigrationStrategy::Handover)]
    );
    signal(&mut h, &id, true, MigrationSignal::TargetReady(b"opaque".to_vec()));
    assert_eq!(
        steps(&calls(&mut h)),
        vec![MigrationStep::StopOutputAt(b"opaque".to_vec())],
        "the source stops output at the target's payload"
    );
    assert!(state(&h, &id).past_point_of_no_return);
    signal(&mut h, &id, false, MigrationSignal::SourceStoppedAt("pts:42".into()));
    assert_eq!(
        steps(&calls(&mut h)),
        vec![MigrationStep::ApplyFrom("pts:42".into())],
        "the target applies from where the source stopped"
    );
    signal(&mut h, &id, true, MigrationSignal::TargetApplied);
    let s = state(&h, &id);
    assert_eq!(
        stops(&calls(&mut h)),
        vec![(s.source_key.clone(), source)],
        "only after the target confirmed is the source stopped"
    );
    source_stops(&mut h, &id);
    assert_eq!(
        phases(&h, &id),
        vec![
            MigrationPhase::Placing,
            MigrationPhase::Starting,
            MigrationPhase::AwaitingReady,
            MigrationPhase::StoppingOutput,
            MigrationPhase::Applying,
            MigrationPhase::StoppingSource,
            MigrationPhase::Done
        ]
    );
    assert_eq!(bound(&h, &job), (s.target_node_id, s.target_key));
}

#[test]
fn every_phase_transition_fires_migration_phase_with_its_timestamp() {
    let (mut h, job, _) = running_job();
    let id = migrate(&mut h, &job, MigrationStrategy::Overlap);
    calls(&mut h);
    h.advance(1_000);
    target_runs(&mut h, &id);
    calls(&mut h);
    h.advance(500);
    source_stops(&mut h, &id);
    let fired: Vec<(MigrationPhase, i64)> = h
        .take_notifications()
        .into_iter()
        .filter_map(|n| match n {
            Notification::MigrationPhase(s) => Some((s.phase, s.transitions.last().map_or(0, |t| t.at))),
            _ => None,
        })
        .collect();
    let start = 1_000_000;
    assert_eq!(
        fired,
        vec![
            (MigrationPhase::Placing, start),
            (MigrationPhase::Starting, start),
            (MigrationPhase::StoppingSource, start + 1_000),
            (MigrationPhase::Done, start + 1_500)
        ]
    );
}

#[test]
fn the_target_wears_slot_at_eight_hex_while_told_its_slot() {
    let mut h = Harness::hydrated();
    h.cluster_node("c", 4.0);
    h.bundle(
        "b",
        "pool: production\nresiliencePolicy: {sameNode: forbid}\nbackup: {}\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n",
    );
    let started = h.start_all();
    assert_eq!(started.len(), 2, "primary and backup run");
    let backup = job_id("b", 1, "encode");
    let id = migrate(&mut h, &backup, MigrationStrategy::Overlap);
    let s = state(&h, &id);
    assert!(is_target_key(&s.target_key, "backup"), "{}", s.target_key);
    assert_eq!(s.target_key.as_str().split_once('@').map(|(_, t)| t), Some(id.as_str()));
    let first = calls(&mut h);
    assert!(
        matches!(&first[..], [Rpc::StartMigrationTarget { instance_key, runtime_role, .. }] if instance_key == &s.target_key && runtime_role == "backup"),
        "{first:?}"
    );
}

#[test]
fn at_done_the_active_key_moves_so_a_second_migration_addresses_the_target() {
    let (mut h, job, source) = running_job();
    let first = migrate(&mut h, &job, MigrationStrategy::Overlap);
    calls(&mut h);
    target_runs(&mut h, &first);
    calls(&mut h);
    source_stops(&mut h, &first);
    let moved = state(&h, &first);
    let second = migrate(&mut h, &job, MigrationStrategy::Overlap);
    let s = state(&h, &second);
    assert_eq!(
        s.source_key, moved.target_key,
        "the second migration moves the target instance"
    );
    assert_eq!(s.source_node_id, moved.target_node_id);
    assert_eq!(s.target_node_id, source, "back to the first node, now free");
    assert_ne!(s.target_key, moved.target_key);
    assert!(is_target_key(&s.target_key, "primary"));
    calls(&mut h);
    target_runs(&mut h, &second);
    assert_eq!(stops(&calls(&mut h)), vec![(moved.target_key, moved.target_node_id)]);
}

#[test]
fn no_concurrent_migrations_per_job() {
    let (mut h, job, _) = running_job();
    let id = migrate(&mut h, &job, MigrationStrategy::Overlap);
    let again = try_migrate(&mut h, &job, options(MigrationStrategy::Handover));
    assert_eq!(
        again,
        Err(CommandError::Migration(MigrationRefusal::AlreadyMigrating {
            job_id: job.clone(),
            migration_id: id.clone()
        }))
    );
    assert_eq!(h.core.migration_for_job(&job).map(|m| m.migration_id.clone()), Some(id));
}

#[test]
fn a_job_not_running_or_not_placed_here_is_refused() {
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    let job = job_id("b", 0, "encode");
    assert_eq!(
        try_migrate(&mut h, &job, options(MigrationStrategy::Overlap)),
        Err(CommandError::Migration(MigrationRefusal::NotRunning {
            job_id: job.clone()
        })),
        "dispatched but not yet running"
    );
    let stranger = JobId("plain-manager-job".into());
    assert_eq!(
        try_migrate(&mut h, &stranger, options(MigrationStrategy::Overlap)),
        Err(CommandError::Migration(MigrationRefusal::NotAutoManagerPlaced {
            job_id: stranger
        }))
    );
}

#[test]
fn migrate_job_rejects_when_placement_finds_nowhere() {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 2}}\n",
    );
    let (job, _) = h.start_all().remove(0);
    let pinned = MigrationOptions {
        strategy: MigrationStrategy::Overlap,
        target_node_id: Some(NodeId::from("nowhere")),
        override_reservation: false,
    };
    let refused = try_migrate(&mut h, &job, pinned);
    assert!(
        matches!(
            refused,
            Err(CommandError::Migration(MigrationRefusal::NowhereToPlace { .. }))
        ),
        "{refused:?}"
    );
    assert!(h.core.migration_for_job(&job).is_none());
    let onto_source = MigrationOptions {
        target_node_id: Some(NodeId::from("a")),
        ..MigrationOptions::default()
    };
    assert!(matches!(
        try_migrate(&mut h, &job, onto_source),
        Err(CommandError::Migration(MigrationRefusal::TargetIsSource { .. }))
    ));
}

#[test]
fn a_pinned_target_goes_to_the_pin() {
    let (mut h, job, _) = running_job();
    h.cluster_node("c", 4.0);
    let pinned = MigrationOptions {
        strategy: MigrationStrategy::Overlap,
        target_node_id: Some(NodeId::from("c")),
        override_reservation: false,
    };
    let id = try_migrate(&mut h, &job, pinned).expect("starts");
    assert_eq!(state(&h, &id).target_node_id, NodeId::from("c"));
}

#[test]
fn a_target_needing_a_new_node_waits_in_placing_until_it_starts() {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("b", ONE_JOB);
    let (job, _) = h.start_all().remove(0);
    let id = migrate(&mut h, &job, MigrationStrategy::Overlap);
    let provisioned = calls(&mut h);
    let node = match &provisioned[..] {
        [Rpc::CreateNode { node_id, .. }] => node_id.clone(),
        other => panic!("expected a provision, got {other:?}"),
    };
    assert_eq!(state(&h, &id).phase, MigrationPhase::Placing);
    h.provisioned_node_starts(node.as_str(), norsk_auto_manager::model::ProviderKind::Aws, &[]);
    let started = calls(&mut h);
    assert!(
        matches!(&started[..], [Rpc::StartMigrationTarget { node_id, .. }] if node_id == &node),
        "{started:?}"
    );
    assert_eq!(state(&h, &id).phase, MigrationPhase::Starting);
}

#[test]
fn a_target_node_whose_provision_times_out_aborts_the_migration() {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("b", ONE_JOB);
    let (job, source) = h.start_all().remove(0);
    let id = migrate(&mut h, &job, MigrationStrategy::Overlap);
    calls(&mut h);
    // The tier's provisionTimeoutMs (10 min in these pools).
    h.advance(600_000);
    let s = state(&h, &id);
    assert_eq!(s.phase, MigrationPhase::Aborted);
    assert_eq!(s.reason.as_deref(), Some("the target's node is gone"));
    assert_eq!(bound(&h, &job).0, source);
}

#[test]
fn placing_deadline_aborts_and_the_unused_node_is_terminated() {
    // Shorter than the tier's provisionTimeoutMs, so the migration's own
    // deadline is what ends it.
    let mut settings = settings();
    settings.migration.placing_timeout_ms = DEFAULT_MIGRATION_PLACING_TIMEOUT_MS / 2;
    let mut h = Harness::with(settings);
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("b", ONE_JOB);
    let (job, source) = h.start_all().remove(0);
    let id = migrate(&mut h, &job, MigrationStrategy::Overlap);
    calls(&mut h);
    h.take_notifications();
    h.advance(DEFAULT_MIGRATION_PLACING_TIMEOUT_MS as i64 / 2);
    let s = state(&h, &id);
    assert_eq!(s.phase, MigrationPhase::Aborted);
    assert_eq!(s.reason.as_deref(), Some("placing deadline passed"));
    let after = calls(&mut h);
    assert!(
        after
            .iter()
            .any(|c| matches!(c, Rpc::TerminateNode { node_id } if node_id == &s.target_node_id))
    );
    assert!(stops(&after).is_empty(), "a target never started is not stopped");
    assert_eq!(
        steps(&after),
        vec![MigrationStep::Abort("placing deadline passed".into())]
    );
    assert_eq!(bound(&h, &job).0, source, "the source keeps running");
}

/// Runs a migration of `strategy` up to (not through) `phase`.
fn up_to(strategy: MigrationStrategy, phase: MigrationPhase) -> (Harness, JobId, MigrationId) {
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

/// Before the point of no return a phase's expiry aborts: both keys told,
/// the target stopped, the source still bound and running.
fn expiry_aborts(strategy: MigrationStrategy, phase: MigrationPhase, timeout: u64, name: &str) {
    let (mut h, job, id) = up_to(strategy, phase);
    let s = state(&h, &id);
    assert_eq!(s.phase_deadline, Some(h.now + timeout as i64));
    h.advance(timeout as i64 - 1);
    assert_eq!(state(&h, &id).phase, phase, "expired early");
    h.advance(1);
    let reason = format!("{name} deadline passed");
    let after = calls(&mut h);
    assert_eq!(steps(&after), vec![MigrationStep::Abort(reason.clone())]);
    assert!(
        after
            .iter()
            .any(|c| matches!(c, Rpc::SendMigrationSignal { source_key, target_key, .. } if source_key == &s.source_key && target_key == &s.target_key)),
        "both instance keys are told"
    );
    assert_eq!(stops(&after), vec![(s.target_key.clone(), s.target_node_id.clone())]);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Aborted);
    assert_eq!(aborted(&h.take_notifications()), vec![(reason, false)]);
    assert_eq!(bound(&h, &job), (s.source_node_id, s.source_key));
    assert!(h.core.job(&job).is_some_and(|r| r.migration.is_none()));
}

#[test]
fn preparing_deadline_aborts_stop_then_start() {
    expiry_aborts(
        MigrationStrategy::StopThenStart,
        MigrationPhase::Preparing,
        DEFAULT_MIGRATION_START_TIMEOUT_MS,
        "preparing",
    );
}

#[test]
fn starting_deadline_aborts_overlap() {
    expiry_aborts(
        MigrationStrategy::Overlap,
        MigrationPhase::Starting,
        DEFAULT_MIGRATION_START_TIMEOUT_MS,
        "starting",
    );
}

#[test]
fn starting_deadline_aborts_handover() {
    expiry_aborts(
        MigrationStrategy::Handover,
        MigrationPhase::Starting,
        DEFAULT_MIGRATION_START_TIMEOUT_MS,
        "starting",
    );
}

#[test]
fn awaiting_ready_deadline_aborts_handover() {
    expiry_aborts(
        MigrationStrategy::Handover,
        MigrationPhase::AwaitingReady,
        DEFAULT_MIGRATION_HANDOVER_STEP_TIMEOUT_MS,
        "awaitingReady",
    );
}

/// After the point of no return a phase's expiry fails forward: the
/// source is stopped and the saga goes on towards the target.
fn expiry_fails_forward(
    strategy: MigrationStrategy,
    phase: MigrationPhase,
    timeout: u64,
) -> (Harness, JobId, MigrationId) {
    let (mut h, job, id) = up_to(strategy, phase);
    h.advance(timeout as i64);
    let s = state(&h, &id);
    assert_ne!(s.phase, MigrationPhase::Aborted);
    assert!(
        s.reason.as_deref().is_some_and(|r| r.contains("failed forward")),
        "{:?}",
        s.reason
    );
    assert!(
        aborted(&h.take_notifications()).is_empty(),
        "no rollback past the point of no return"
    );
    (h, job, id)
}

#[test]
fn stopping_output_deadline_fails_forward_to_stopping_the_source() {
    let (mut h, _, id) = expiry_fails_forward(
        MigrationStrategy::Handover,
        MigrationPhase::StoppingOutput,
        DEFAULT_MIGRATION_HANDOVER_STEP_TIMEOUT_MS,
    );
    let s = state(&h, &id);
    assert_eq!(s.phase, MigrationPhase::StoppingSource);
    assert_eq!(stops(&calls(&mut h)), vec![(s.source_key, s.source_node_id)]);
    source_stops(&mut h, &id);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Done);
}

#[test]
fn applying_deadline_fails_forward_to_stopping_the_source() {
    let (mut h, _, id) = expiry_fails_forward(
        MigrationStrategy::Handover,
        MigrationPhase::Applying,
        DEFAULT_MIGRATION_HANDOVER_STEP_TIMEOUT_MS,
    );
    let s = state(&h, &id);
    assert_eq!(s.phase, MigrationPhase::StoppingSource);
    assert_eq!(stops(&calls(&mut h)), vec![(s.source_key, s.source_node_id)]);
}

#[test]
fn stopping_source_deadline_completes_overlap_onto_the_target() {
    let (h, job, id) = expiry_fails_forward(
        MigrationStrategy::Overlap,
        MigrationPhase::StoppingSource,
        DEFAULT_MIGRATION_STOPPING_SOURCE_TIMEOUT_MS,
    );
    let s = state(&h, &id);
    assert_eq!(s.phase, MigrationPhase::Done);
    assert_eq!(bound(&h, &job), (s.target_node_id, s.target_key));
}

#[test]
fn stopping_source_deadline_completes_handover_onto_the_target() {
    let (h, _, id) = expiry_fails_forward(
        MigrationStrategy::Handover,
        MigrationPhase::StoppingSource,
        DEFAULT_MIGRATION_STOPPING_SOURCE_TIMEOUT_MS,
    );
    assert_eq!(state(&h, &id).phase, MigrationPhase::Done);
}

#[test]
fn stopping_source_deadline_starts_the_prepared_target_anyway() {
    let (mut h, _, id) = expiry_fails_forward(
        MigrationStrategy::StopThenStart,
        MigrationPhase::StoppingSource,
        DEFAULT_MIGRATION_STOPPING_SOURCE_TIMEOUT_MS,
    );
    assert_eq!(state(&h, &id).phase, MigrationPhase::StartingTarget);
    assert!(matches!(&calls(&mut h)[..], [Rpc::StartPreparedJob { .. }]));
    target_runs(&mut h, &id);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Done);
}

#[test]
fn starting_target_deadline_completes_onto_the_target() {
    let (h, job, id) = expiry_fails_forward(
        MigrationStrategy::StopThenStart,
        MigrationPhase::StartingTarget,
        DEFAULT_MIGRATION_START_TIMEOUT_MS,
    );
    let s = state(&h, &id);
    assert_eq!(s.phase, MigrationPhase::Done);
    assert_eq!(bound(&h, &job), (s.target_node_id, s.target_key));
}

#[test]
fn phase_deadlines_come_from_the_migration_settings() {
    let mut settings = settings();
    settings.migration.starting_timeout_ms = 7_000;
    let mut h = Harness::with(settings);
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("b", ONE_JOB);
    let (job, _) = h.start_all().remove(0);
    let id = migrate(&mut h, &job, MigrationStrategy::Overlap);
    calls(&mut h);
    assert_eq!(state(&h, &id).phase_deadline, Some(h.now + 7_000));
    assert_eq!(h.next_deadline, Some(h.now + 7_000));
    h.advance(7_000);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Aborted);
}

#[test]
fn abort_before_the_point_of_no_return_rolls_back_cleanly() {
    let (mut h, job, id) = up_to(MigrationStrategy::Handover, MigrationPhase::AwaitingReady);
    let s = state(&h, &id);
    let command = h.command(Command::AbortMigration {
        migration_id: id.clone(),
        reason: "operator changed mind".into(),
    });
    assert_eq!(h.take_replies(), vec![(command, Ok(()))]);
    let after = calls(&mut h);
    assert_eq!(
        steps(&after),
        vec![MigrationStep::Abort("operator changed mind".into())]
    );
    assert_eq!(stops(&after), vec![(s.target_key.clone(), s.target_node_id.clone())]);
    assert_eq!(
        aborted(&h.take_notifications()),
        vec![("operator changed mind".into(), false)]
    );
    assert_eq!(bound(&h, &job), (s.source_node_id, s.source_key));
    assert_eq!(
        h.core.metrics(h.now).pools[0].used_capacity_fraction,
        0.25,
        "the target's reservation is released"
    );
    // Its instance stopping afterwards is no loss of the job.
    h.history(
        &job,
        JobHistoryEntry::Stopping {
            at: None,
            role: s.target_key.clone(),
            node_id: Some(s.target_node_id.clone()),
            reason: JobStopReason::UserRequested,
        },
    );
    h.stopped(&job, &s.target_node_id, s.target_key);
    assert!(h.core.job(&job).is_some_and(|r| r.binding.is_some()));
    assert!(calls(&mut h).is_empty(), "nothing re-placed");
}

#[test]
fn abort_past_the_point_of_no_return_is_refused_and_the_saga_goes_on() {
    let (mut h, _, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::StoppingSource);
    let command = h.command(Command::AbortMigration {
        migration_id: id.clone(),
        reason: "too late".into(),
    });
    assert_eq!(
        h.take_replies(),
        vec![(
            command,
            Err(CommandError::Migration(MigrationRefusal::PastPointOfNoReturn {
                migration_id: id.clone()
            }))
        )]
    );
    assert!(calls(&mut h).is_empty());
    source_stops(&mut h, &id);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Done);
}

#[test]
fn abort_of_an_unknown_or_ended_migration_is_refused() {
    let (mut h, _, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::Starting);
    let unknown = MigrationId("00000000".into());
    let command = h.command(Command::AbortMigration {
        migration_id: unknown.clone(),
        reason: String::new(),
    });
    assert_eq!(
        h.take_replies(),
        vec![(
            command,
            Err(CommandError::Migration(MigrationRefusal::UnknownMigration {
                migration_id: unknown
            }))
        )]
    );
    h.command(Command::AbortMigration {
        migration_id: id.clone(),
        reason: "first".into(),
    });
    let command = h.command(Command::AbortMigration {
        migration_id: id.clone(),
        reason: "second".into(),
    });
    assert!(matches!(
        &h.take_replies()[..],
        [_, (c, Err(CommandError::Migration(MigrationRefusal::AlreadyEnded { .. })))] if *c == command
    ));
}

#[test]
fn a_target_rejected_as_an_invalid_spec_aborts_and_the_source_keeps_running() {
    let (mut h, job, id) = up_to(MigrationStrategy::StopThenStart, MigrationPhase::Preparing);
    let s = state(&h, &id);
    h.event(ManagerEvent::JobRejected {
        job_id: job.clone(),
        role: s.target_key.clone(),
        node_id: s.target_node_id.clone(),
        code: RejectionCode::InvalidSpec,
        detail: "bad spec".into(),
        inventory: None,
    });
    let m = state(&h, &id);
    assert_eq!(m.phase, MigrationPhase::Aborted);
    assert_eq!(m.reason.as_deref(), Some("the target was rejected: bad spec"));
    let notes = kinds(&h.take_notifications());
    assert!(notes.iter().any(|k| k == "migrationAborted"));
    assert!(
        !notes.iter().any(|k| k == "jobDropped" || k == "bundleBroken"),
        "the job itself is not ended: {notes:?}"
    );
    let after = calls(&mut h);
    assert!(
        stops(&after).is_empty(),
        "neither the source nor the gone target is stopped"
    );
    assert_eq!(bound(&h, &job), (s.source_node_id, s.source_key));
}

#[test]
fn a_refused_handover_aborts_before_the_point_of_no_return() {
    let (mut h, job, id) = up_to(MigrationStrategy::Handover, MigrationPhase::AwaitingReady);
    signal(&mut h, &id, true, MigrationSignal::Refused("no handover here".into()));
    assert_eq!(state(&h, &id).phase, MigrationPhase::Aborted);
    assert_eq!(bound(&h, &job).0, state(&h, &id).source_node_id);
}

#[test]
fn the_target_failing_before_the_point_of_no_return_aborts() {
    let (mut h, job, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::Starting);
    let s = state(&h, &id);
    h.history(
        &job,
        JobHistoryEntry::Stopping {
            at: None,
            role: s.target_key.clone(),
            node_id: Some(s.target_node_id.clone()),
            reason: JobStopReason::JobFailed,
        },
    );
    assert_eq!(state(&h, &id).phase, MigrationPhase::Aborted);
    assert_eq!(bound(&h, &job), (s.source_node_id, s.source_key));
    assert!(
        h.core.job(&job).is_some_and(|r| r.restarts.count(h.now) == 0),
        "a failed target does not count against the job's ceiling"
    );
}

#[test]
fn the_target_node_lost_before_the_point_of_no_return_aborts() {
    let (mut h, job, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::Starting);
    let s = state(&h, &id);
    h.node_stopping(s.target_node_id.as_str(), NodeStopReason::HealthPingTimeExceeded);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Aborted);
    assert_eq!(bound(&h, &job), (s.source_node_id, s.source_key));
}

#[test]
fn the_source_node_lost_while_the_target_runs_completes_onto_the_target() {
    let (mut h, job, id) = up_to(MigrationStrategy::Handover, MigrationPhase::AwaitingReady);
    let s = state(&h, &id);
    h.node_stopping(s.source_node_id.as_str(), NodeStopReason::HealthPingTimeExceeded);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Done);
    assert_eq!(bound(&h, &job), (s.target_node_id, s.target_key));
    assert!(
        !calls(&mut h).iter().any(|c| matches!(c, Rpc::StartJob { .. })),
        "the job was placed again though it runs on the target"
    );
}

#[test]
fn the_source_node_lost_before_the_target_runs_aborts_and_recovers_the_job() {
    let (mut h, job, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::Starting);
    let s = state(&h, &id);
    h.node_stopping(s.source_node_id.as_str(), NodeStopReason::HealthPingTimeExceeded);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Aborted);
    assert!(
        h.core
            .job(&job)
            .is_some_and(|r| r.binding.is_none() || r.binding.as_ref().is_some_and(|b| b.node_id != s.source_node_id))
    );
}

#[test]
fn the_target_lost_past_the_point_of_no_return_marks_the_migration_lost() {
    let (mut h, job, id) = up_to(MigrationStrategy::StopThenStart, MigrationPhase::StartingTarget);
    let s = state(&h, &id);
    h.cluster_node("c", 4.0);
    h.node_stopping(s.target_node_id.as_str(), NodeStopReason::HealthPingTimeExceeded);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Lost);
    let notes = h.take_notifications();
    assert_eq!(aborted(&notes).len(), 1);
    assert!(aborted(&notes)[0].1, "reported as lost");
    assert!(kinds(&notes).iter().any(|k| k == "error"));
    // The job is not left running nowhere: it is placed afresh, away from
    // the node it was leaving.
    let placed = calls(&mut h);
    assert!(
        placed.iter().any(
            |c| matches!(c, Rpc::StartJob { job_id, node_id, .. } if job_id == &job && node_id == &NodeId::from("c"))
        ),
        "{placed:?}"
    );
}

#[test]
fn close_rolls_back_migrations_before_the_point_of_no_return() {
    let (mut h, job, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::Starting);
    let s = state(&h, &id);
    h.input(Input::Close);
    let after = h.take_calls().into_iter().map(|(_, c)| c).collect::<Vec<_>>();
    assert_eq!(steps(&after), vec![MigrationStep::Abort("AutoManager closed".into())]);
    assert_eq!(stops(&after), vec![(s.target_key, s.target_node_id)]);
    assert_eq!(
        aborted(&h.take_notifications()),
        vec![("AutoManager closed".into(), false)]
    );
    assert_eq!(h.next_deadline, None, "no timer runs after close");
    assert_eq!(bound(&h, &job).0, s.source_node_id);
}

#[test]
fn close_marks_migrations_past_the_point_of_no_return_lost() {
    let (mut h, _, id) = up_to(MigrationStrategy::Handover, MigrationPhase::Applying);
    h.input(Input::Close);
    assert!(h.take_calls().is_empty(), "nothing to roll back");
    assert_eq!(state(&h, &id).phase, MigrationPhase::Lost);
    let notes = h.take_notifications();
    assert_eq!(aborted(&notes), vec![("AutoManager closed".into(), true)]);
    assert!(kinds(&notes).iter().any(|k| k == "error"), "lost is also an error");
}

#[test]
fn close_with_a_target_start_in_flight_still_stops_the_target() {
    let (mut h, job, _) = running_job();
    migrate(&mut h, &job, MigrationStrategy::Overlap);
    let start = h.take_calls();
    assert!(matches!(&start[..], [(_, Rpc::StartMigrationTarget { .. })]));
    h.input(Input::Close);
    let after = h.take_calls().into_iter().map(|(_, c)| c).collect::<Vec<_>>();
    assert_eq!(stops(&after).len(), 1, "{after:?}");
}

#[test]
fn an_abort_while_the_target_start_is_in_flight_stops_it_once_answered() {
    let (mut h, job, _) = running_job();
    let id = migrate(&mut h, &job, MigrationStrategy::Overlap);
    let start = h.take_calls();
    h.command(Command::AbortMigration {
        migration_id: id.clone(),
        reason: "changed mind".into(),
    });
    let before = h.take_calls().into_iter().map(|(_, c)| c).collect::<Vec<_>>();
    assert!(stops(&before).is_empty(), "a stop could overtake the start");
    h.ok(start[0].0);
    let s = state(&h, &id);
    let after = h.take_calls().into_iter().map(|(_, c)| c).collect::<Vec<_>>();
    assert_eq!(stops(&after), vec![(s.target_key, s.target_node_id)]);
}

#[test]
fn migration_for_job_answers_the_one_in_flight_then_the_latest_ended() {
    let (mut h, job, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::Starting);
    assert_eq!(
        h.core.migration_for_job(&job).map(|m| m.phase),
        Some(MigrationPhase::Starting)
    );
    h.command(Command::AbortMigration {
        migration_id: id.clone(),
        reason: "x".into(),
    });
    calls(&mut h);
    assert_eq!(
        h.core
            .migration_for_job(&job)
            .map(|m| (m.migration_id.clone(), m.phase)),
        Some((id.clone(), MigrationPhase::Aborted))
    );
    let second = migrate(&mut h, &job, MigrationStrategy::Overlap);
    assert_eq!(
        h.core.migration_for_job(&job).map(|m| m.migration_id.clone()),
        Some(second.clone())
    );
    let all: Vec<MigrationId> = h
        .core
        .migrations()
        .into_iter()
        .map(|m| m.migration_id.clone())
        .collect();
    assert_eq!(all, vec![id, second]);
}

/// A job as Manager describes it after a migration the previous core did
/// not finish: the source ran on `a`, the target `primary@0badcafe` runs
/// on `b`, and (with `source_stopped`) the source was stopped.
fn left_by_a_closed_instance(source_stopped: bool) -> (Harness, JobId) {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    let bundle = bundle("b", ONE_JOB);
    h.event(ManagerEvent::BundleUpdated(bundle.clone()));
    let mut job = jobs_of(&bundle).remove(0);
    let (primary, target) = (InstanceKey("primary".into()), InstanceKey("primary@0badcafe".into()));
    let (a, b) = (Some(NodeId::from("a")), Some(NodeId::from("b")));
    job.history.extend([
        JobHistoryEntry::Running {
            at: None,
            role: primary.clone(),
            node_id: a.clone(),
        },
        JobHistoryEntry::Provisioned {
            at: None,
            role: target.clone(),
            node_id: b.clone(),
        },
        JobHistoryEntry::Running {
            at: None,
            role: target,
            node_id: b,
        },
    ]);
    if source_stopped {
        job.history.extend([
            JobHistoryEntry::Stopping {
                at: None,
                role: primary.clone(),
                node_id: a.clone(),
                reason: JobStopReason::UserRequested,
            },
            JobHistoryEntry::Stopped {
                at: None,
                role: primary,
                node_id: a,
            },
        ]);
    }
    let id = job.job_id.clone();
    h.event(ManagerEvent::JobActive(job));
    h.event(ManagerEvent::InitialDataComplete);
    (h, id)
}

#[test]
fn hydration_rebuilds_the_binding_onto_a_target_left_carrying_the_job() {
    let (mut h, job) = left_by_a_closed_instance(true);
    assert_eq!(
        bound(&h, &job),
        (NodeId::from("b"), InstanceKey("primary@0badcafe".into()))
    );
    assert!(
        !calls(&mut h).iter().any(|c| matches!(c, Rpc::StartJob { .. })),
        "a job running on its target was placed again"
    );
}

#[test]
fn a_source_stopped_after_hydration_hands_the_binding_to_the_live_target() {
    let (mut h, job) = left_by_a_closed_instance(false);
    assert_eq!(bound(&h, &job).0, NodeId::from("a"));
    let source = InstanceKey("primary".into());
    h.history(
        &job,
        JobHistoryEntry::Stopping {
            at: None,
            role: source.clone(),
            node_id: Some(NodeId::from("a")),
            reason: JobStopReason::UserRequested,
        },
    );
    h.stopped(&job, &NodeId::from("a"), source);
    assert_eq!(
        bound(&h, &job),
        (NodeId::from("b"), InstanceKey("primary@0badcafe".into()))
    );
    assert!(!calls(&mut h).iter().any(|c| matches!(c, Rpc::StartJob { .. })));
}

#[test]
fn a_core_hydrated_after_a_stream_break_marks_inherited_migrations_lost() {
    let (mut h, _, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::Starting);
    let valid = norsk_auto_manager::automanager::validate_auto_settings(settings()).expect("valid");
    h.core = norsk_auto_manager::automanager::AutoManagerCore::succeeding(valid, &h.core, h.now);
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Lost);
    assert_eq!(
        aborted(&h.take_notifications()),
        vec![("the connection to Manager was re-established".into(), true)]
    );
}

#[test]
fn a_source_stop_manager_did_not_hear_is_sent_again() {
    let (mut h, _, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::Starting);
    target_runs(&mut h, &id);
    let stop = h.take_calls();
    assert!(matches!(&stop[..], [(_, Rpc::StopJob { .. })]));
    h.fail(stop[0].0, norsk_auto_manager::automanager::RpcFailureKind::Transient);
    let s = state(&h, &id);
    assert_eq!(stops(&calls(&mut h)), vec![(s.source_key, s.source_node_id)]);
}

#[test]
fn migrations_started_together_each_see_the_targets_placed_before_them() {
    let mut h = Harness::new();
    h.cluster_node("a", 8.0);
    h.cluster_node("b", 4.0);
    h.cluster_node("c", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    let three = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 3}}\n";
    h.bundle("x", three);
    h.bundle("y", three);
    let started = h.start_all();
    assert!(
        started.iter().all(|(_, node)| node == &NodeId::from("a")),
        "both run on the big node: {started:?}"
    );
    // One step, two migrations: b and c (4 vCPUs each) can take one 3-vCPU
    // target each, not two.
    let inputs = started
        .iter()
        .enumerate()
        .map(|(i, (job, _))| Input::Command {
            id: norsk_auto_manager::automanager::CommandId(100 + i as u64),
            command: Command::MigrateJob {
                job_id: job.clone(),
                options: options(MigrationStrategy::Overlap),
            },
        })
        .collect::<Vec<_>>();
    let step = h.core.handle_all(inputs, h.now);
    let targets: Vec<NodeId> = step
        .actions
        .iter()
        .filter_map(|a| match a {
            norsk_auto_manager::automanager::Action::Call {
                rpc: Rpc::StartMigrationTarget { node_id, .. },
                ..
            } => Some(node_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(targets.len(), 2, "{:?}", step.actions);
    assert_ne!(targets[0], targets[1], "two 3-vCPU targets on one 4-vCPU node");
}
