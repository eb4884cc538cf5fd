//! Scenario tests of the migration saga on a virtual clock: each strategy
//! walked phase by phase, the target's placement (source excluded, pinned,
//! on a new node, reserved beside the source), refusals, no concurrent
//! migrations, the instance key moving at `done`, `close()`, the queries,
//! and a fresh core finding a target left carrying the job. Deadlines,
//! aborts and failures are in `migration_aborts.rs`.

use norsk_auto_manager::automanager::migration::DEFAULT_MIGRATION_PLACING_TIMEOUT_MS;
use norsk_auto_manager::automanager::{
    Command, CommandError, Input, MigrationId, MigrationOptions, MigrationPhase, MigrationRefusal, MigrationStep,
    MigrationStrategy, Notification, Rpc,
};
use norsk_auto_manager::decide::pool::observe_pool;
use norsk_auto_manager::model::{
    InstanceKey, JobHistoryEntry, JobId, JobStopReason, ManagerEvent, MigrationSignal, NodeId, NodeStopReason,
    ProviderKind, tags,
};

use crate::support::migration::*;
use crate::support::*;

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
    // What the PlacementPool status says, from the same computation.
    let status = |h: &Harness| observe_pool(h.core.read(h.now), "production", &["cluster".to_owned()]);
    assert_eq!(used(&h), 0.25);
    let id = migrate(&mut h, &job, MigrationStrategy::Overlap);
    calls(&mut h);
    assert_eq!(used(&h), 0.5, "the target is reserved beside the source");
    assert_eq!(
        status(&h).used_capacity_fraction,
        0.5,
        "the pool's status counts the target as its gauge does"
    );
    assert_eq!(status(&h).nodes, h.core.metrics(h.now).pools[0].node_count);
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
        strategy: Some(MigrationStrategy::Overlap),
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
        strategy: Some(MigrationStrategy::Overlap),
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
    left_by_a_closed_instance_on(source_stopped, ONE_JOB, |h| h.cluster_node("a", 4.0))
}

/// [`left_by_a_closed_instance`] for a bundle of `spec`, with node `a`
/// registered by `source_node`.
fn left_by_a_closed_instance_on(
    source_stopped: bool,
    spec: &str,
    source_node: impl FnOnce(&mut Harness),
) -> (Harness, JobId) {
    let mut h = Harness::new();
    source_node(&mut h);
    h.cluster_node("b", 4.0);
    let bundle = bundle("b", spec);
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
fn a_migration_in_flight_when_the_stream_breaks_carries_on_in_the_successor() {
    // The target was started and is not running yet; the source was never
    // told to stop. Neither rolling back nor failing forward is known to be
    // safe for a fresh core: it carries the saga on.
    let (mut h, job, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::Starting);
    let s = state(&h, &id);
    h.reconnect();
    assert_eq!(state(&h, &id).phase, MigrationPhase::Starting);
    assert!(aborted(&h.take_notifications()).is_empty());
    assert!(calls(&mut h).is_empty(), "nothing started or stopped again");
    target_runs(&mut h, &id);
    assert_eq!(
        stops(&calls(&mut h)),
        vec![(s.source_key.clone(), s.source_node_id.clone())],
        "the successor stops the source once the target runs"
    );
    source_stops(&mut h, &id);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Done);
    assert_eq!(bound(&h, &job), (s.target_node_id, s.target_key));
}

#[test]
fn a_rolled_back_migrations_target_does_not_carry_the_job_in_a_successor() {
    // The source fails while its target is being prepared: the migration
    // rolls back and the target is told to stop. The stream breaks before
    // that stop is answered, with the source's node going: the successor
    // finds the target the only instance of the job in Manager's history,
    // and must not take it for the job's placement.
    let (mut h, job, id) = up_to(MigrationStrategy::StopThenStart, MigrationPhase::Preparing);
    let s = state(&h, &id);
    h.history(
        &job,
        JobHistoryEntry::Provisioned {
            at: Some(h.now),
            role: s.target_key.clone(),
            node_id: Some(s.target_node_id.clone()),
        },
    );
    h.failed(&job, &s.source_node_id);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Aborted);
    assert!(
        stops(&h.take_calls().into_iter().map(|(_, rpc)| rpc).collect::<Vec<_>>())
            .contains(&(s.target_key.clone(), s.target_node_id.clone()))
    );
    h.node_stopping(s.source_node_id.as_str(), NodeStopReason::HealthPingTimeExceeded);
    h.event(ManagerEvent::NodeStopped(s.source_node_id.clone()));
    h.reconnect();
    let key = h
        .core
        .job(&job)
        .and_then(|r| r.binding.as_ref())
        .map(|b| b.instance_key.clone());
    assert_ne!(key, Some(s.target_key), "a target being stopped is not the job's");
}

#[test]
fn a_job_moved_onto_its_target_before_the_stream_breaks_stays_there_in_the_successor() {
    // The source was told to stop and failed instead of stopping cleanly;
    // the migration finished onto the target. Replaying Manager's history,
    // the successor sees the bound instance fail first: the target lived
    // on after it, so the job is there — not lost, not placed again.
    let (mut h, job, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::StoppingSource);
    let s = state(&h, &id);
    h.failed(&job, &s.source_node_id);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Done);
    assert_eq!(bound(&h, &job), (s.target_node_id.clone(), s.target_key.clone()));
    calls(&mut h);
    h.reconnect();
    assert_eq!(bound(&h, &job), (s.target_node_id, s.target_key));
    assert!(
        !calls(&mut h).iter().any(|c| matches!(c, Rpc::StartJob { .. })),
        "the job is not placed again"
    );
}

#[test]
fn a_job_its_migration_failed_forward_onto_stays_on_the_target_in_the_successor_while_the_source_still_shows_live() {
    // The source was told to stop and its stop was not seen by the
    // deadline: the migration fails forward and the job lives on the
    // target. Manager's history still shows both instances live; replaying
    // it cannot say which is the job's, so the predecessor's choice stands.
    let (mut h, job, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::StoppingSource);
    let s = state(&h, &id);
    h.advance(3_600_000);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Done);
    assert_eq!(bound(&h, &job), (s.target_node_id.clone(), s.target_key.clone()));
    calls(&mut h);
    h.reconnect();
    assert_eq!(bound(&h, &job), (s.target_node_id, s.target_key));
}

#[test]
fn a_source_whose_stop_is_still_on_its_way_is_not_taken_back_for_its_job_in_the_successor() {
    // The migration failed forward onto the target (the source's stop went
    // unanswered by the deadline), then the target failed. The stream
    // breaks with the source's stop still on its way: Manager's history
    // shows the source running and never stopped, but it is going, so the
    // successor neither binds the job to it nor counts its room as the
    // job's — the room the predecessor gave away stays given.
    let (mut h, job, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::StoppingSource);
    let s = state(&h, &id);
    h.advance(61_000);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Done);
    h.failed(&job, &s.target_node_id);
    // The stop re-sent at the deadline is never answered.
    assert!(
        stops(&h.take_calls().into_iter().map(|(_, rpc)| rpc).collect::<Vec<_>>())
            .contains(&(s.source_key.clone(), s.source_node_id.clone()))
    );
    h.reconnect();
    let bound_to_source = h
        .core
        .job(&job)
        .and_then(|r| r.binding.as_ref())
        .is_some_and(|b| b.instance_key == s.source_key && b.node_id == s.source_node_id);
    assert!(
        !bound_to_source,
        "the source being stopped was taken back for the job: {:?}",
        h.core.job(&job).map(|r| &r.binding)
    );
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

#[test]
fn nothing_is_migrated_before_initial_data_complete() {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    let bundle = bundle("b", ONE_JOB);
    h.event(ManagerEvent::BundleUpdated(bundle.clone()));
    let mut job = jobs_of(&bundle).remove(0);
    job.history.push(JobHistoryEntry::Running {
        at: None,
        role: InstanceKey("primary".into()),
        node_id: Some(NodeId::from("a")),
    });
    let id = job.job_id.clone();
    h.event(ManagerEvent::JobActive(job));
    assert_eq!(
        try_migrate(&mut h, &id, options(MigrationStrategy::Overlap)),
        Err(CommandError::Migration(MigrationRefusal::NotHydrated {
            job_id: id.clone()
        }))
    );
    h.event(ManagerEvent::InitialDataComplete);
    assert!(try_migrate(&mut h, &id, options(MigrationStrategy::Overlap)).is_ok());
}

#[test]
fn a_target_is_not_provisioned_from_an_exhausted_offering() {
    let mut settings = settings();
    settings.placement_pools = yaml_serde::from_str(
        "
- name: production
  tiers:
    - {name: cluster, kind: local-servers, scaleOut: fixed}
    - name: aws
      kind: aws
      region: eu-west-1
      candidateInstanceTypes:
        - {instanceType: m5.2xlarge, totalCapacity: 8, totalCores: 8}
        - {instanceType: m5.xlarge, totalCapacity: 4, totalCores: 4}
",
    )
    .unwrap();
    let mut h = Harness::with(settings);
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("b", ONE_JOB);
    let (job, _) = h.start_all().remove(0);
    // A bundle too big for `a` provisions; the provider has no m5.2xlarge.
    h.bundle(
        "big",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 4}}\n",
    );
    let created = h.take_calls();
    let (refused, _) = created
        .iter()
        .find(|(_, rpc)| matches!(rpc, Rpc::CreateNode { instance_type, .. } if instance_type == "m5.2xlarge"))
        .expect("the larger shape is tried first");
    h.fail(
        *refused,
        norsk_auto_manager::automanager::RpcFailureKind::InsufficientCapacity,
    );
    h.ok_all();
    // The migration's target needs a node of its own too.
    migrate(&mut h, &job, MigrationStrategy::Overlap);
    let shapes: Vec<String> = calls(&mut h)
        .into_iter()
        .filter_map(|rpc| match rpc {
            Rpc::CreateNode { instance_type, .. } => Some(instance_type),
            _ => None,
        })
        .collect();
    assert_eq!(
        shapes,
        ["m5.xlarge"],
        "the target was provisioned from an exhausted offering"
    );
}

#[test]
fn a_single_use_node_the_binding_leaves_for_a_live_target_is_released() {
    // "A single-use job's node is terminated when the job leaves it": the
    // job leaves it for a live target as much as by stopping.
    let single_use = "pool: production\njobs:\n  - {jobName: encode, exclusive: true, singleUse: true, requirements: {requiredCapacity: 1}}\n";
    let (mut h, job) = left_by_a_closed_instance_on(false, single_use, |h| {
        h.provisioned_node_starts(
            "a",
            ProviderKind::Aws,
            &[
                ("pool", "production"),
                ("tier", "aws"),
                (tags::PROVISIONED_FOR, "b/0/encode"),
            ],
        )
    });
    assert_eq!(bound(&h, &job).0, NodeId::from("a"));
    calls(&mut h);
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
    assert_eq!(bound(&h, &job).0, NodeId::from("b"), "the live target carries the job");
    assert_eq!(
        terminates(&calls(&mut h)),
        vec![NodeId::from("a")],
        "the single-use node is released"
    );
}

#[test]
fn a_target_of_a_rolled_back_migration_never_takes_over_the_binding() {
    // A rolled-back migration's target is the core's to stop: when the
    // bound instance is then stopped, the job does not move onto it.
    let (mut h, job, _) = running_job();
    let id = migrate(&mut h, &job, MigrationStrategy::Overlap);
    let s = state(&h, &id);
    let start = h
        .take_calls()
        .into_iter()
        .find(|(_, rpc)| matches!(rpc, Rpc::StartMigrationTarget { .. }))
        .expect("the target is started")
        .0;
    h.advance(norsk_auto_manager::automanager::migration::DEFAULT_MIGRATION_START_TIMEOUT_MS as i64);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Aborted);
    calls(&mut h);
    // The start is answered after all, and Manager provisions the target.
    h.ok(start);
    assert_eq!(
        stops(&calls(&mut h)),
        vec![(s.target_key.clone(), s.target_node_id.clone())]
    );
    h.history(
        &job,
        JobHistoryEntry::Provisioned {
            at: None,
            role: s.target_key.clone(),
            node_id: Some(s.target_node_id.clone()),
        },
    );
    h.history(
        &job,
        JobHistoryEntry::Stopping {
            at: None,
            role: s.source_key.clone(),
            node_id: Some(s.source_node_id.clone()),
            reason: JobStopReason::UserRequested,
        },
    );
    assert!(
        h.core
            .job(&job)
            .and_then(|r| r.binding.as_ref())
            .is_none_or(|b| b.instance_key != s.target_key),
        "the job moved onto the target being stopped"
    );
}
