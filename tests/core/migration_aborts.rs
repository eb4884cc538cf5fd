//! Scenario tests of the migration saga's ends on a virtual clock: each
//! phase's deadline (an abort before the point of no return, failing
//! forward after it), `abortMigration` before and after it, a target
//! rejected as an invalid spec, refused or failed, a node lost on either
//! side, and stops Manager did not hear.

use norsk_auto_manager::automanager::migration::{
    DEFAULT_MIGRATION_HANDOVER_STEP_TIMEOUT_MS, DEFAULT_MIGRATION_START_TIMEOUT_MS,
    DEFAULT_MIGRATION_STOPPING_SOURCE_TIMEOUT_MS,
};
use norsk_auto_manager::automanager::{
    Command, CommandError, MigrationId, MigrationPhase, MigrationRefusal, MigrationStep, MigrationStrategy, Rpc,
    RpcFailureKind,
};
use norsk_auto_manager::model::{
    JobHistoryEntry, JobId, JobStopReason, ManagerEvent, MigrationSignal, NodeId, NodeStopReason, RejectionCode,
};

use crate::support::migration::*;
use crate::support::*;

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
    let done = state(&h, &id);
    assert_eq!(done.phase, MigrationPhase::Done);
    assert_eq!(
        done.reason.as_deref(),
        Some("stoppingOutput deadline passed; failed forward"),
        "how it failed forward is kept at done"
    );
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
fn a_source_stop_manager_did_not_hear_is_sent_again() {
    let (mut h, _, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::Starting);
    target_runs(&mut h, &id);
    let stop = h.take_calls();
    assert!(matches!(&stop[..], [(_, Rpc::StopJob { .. })]));
    h.fail(stop[0].0, RpcFailureKind::Transient);
    let s = state(&h, &id);
    assert_eq!(stops(&calls(&mut h)), vec![(s.source_key, s.source_node_id)]);
}

#[test]
fn the_job_is_not_placed_again_while_a_stop_to_its_source_is_on_its_way() {
    let (mut h, job, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::Starting);
    let s = state(&h, &id);
    target_runs(&mut h, &id);
    let first = h.take_calls();
    h.advance(DEFAULT_MIGRATION_STOPPING_SOURCE_TIMEOUT_MS as i64);
    // Failed forward: done, and the source told once more.
    assert_eq!(state(&h, &id).phase, MigrationPhase::Done);
    let second = h.take_calls();
    assert_eq!(second.len(), 1, "{second:?}");
    source_stops(&mut h, &id);
    h.ok(first[0].0);
    // The target fails: its recovery waits for the stop still on its way,
    // which would reach a new instance wearing the source's key there.
    h.history(
        &job,
        JobHistoryEntry::Stopping {
            at: None,
            role: s.target_key.clone(),
            node_id: Some(s.target_node_id.clone()),
            reason: JobStopReason::JobFailed,
        },
    );
    h.stopped(&job, &s.target_node_id, s.target_key.clone());
    h.advance(60_000);
    assert!(
        !h.take_calls().iter().any(|(_, c)| matches!(c, Rpc::StartJob { .. })),
        "placed again while a stop to its source is unanswered"
    );
    h.ok(second[0].0);
    h.advance(1);
    assert!(
        h.take_calls()
            .iter()
            .any(|(_, c)| matches!(c, Rpc::StartJob { job_id, .. } if job_id == &job)),
        "placed again once every stop is answered"
    );
}

#[test]
fn a_source_told_to_stop_again_at_its_deadline_holds_its_job_until_both_stops_are_answered() {
    let (mut h, job, id) = up_to(MigrationStrategy::Overlap, MigrationPhase::Starting);
    let s = state(&h, &id);
    // The target takes a while to run: the source is told to stop well
    // after the migration started, and again at `stoppingSource`'s
    // deadline.
    h.advance(20_000);
    target_runs(&mut h, &id);
    let first = h.take_calls();
    assert_eq!(
        stops(&first.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>()).len(),
        1
    );
    h.advance(DEFAULT_MIGRATION_STOPPING_SOURCE_TIMEOUT_MS as i64);
    assert_eq!(state(&h, &id).phase, MigrationPhase::Done);
    let second = h.take_calls();
    assert_eq!(second.len(), 1, "told again: {second:?}");
    // The first stop is answered and the source seen stopped; the second
    // is still on its way.
    h.ok(first[0].0);
    source_stops(&mut h, &id);
    h.failed(&job, &s.target_node_id);
    h.advance(60_000);
    assert!(
        !h.take_calls().iter().any(|(_, c)| matches!(c, Rpc::StartJob { .. })),
        "placed again under the source's key while a stop to it is unanswered"
    );
    h.ok(second[0].0);
    h.advance(1);
    assert!(
        h.take_calls()
            .iter()
            .any(|(_, c)| matches!(c, Rpc::StartJob { job_id, .. } if job_id == &job)),
        "placed again once every stop is answered"
    );
}

#[test]
fn a_target_whose_start_is_on_its_way_when_its_node_is_terminated_is_stopped_once_started() {
    let (mut h, job, _) = running_job();
    let id = migrate(&mut h, &job, MigrationStrategy::Overlap);
    let s = state(&h, &id);
    let start = h.take_calls();
    assert!(
        matches!(&start[..], [(_, Rpc::StartMigrationTarget { .. })]),
        "{start:?}"
    );
    // The target's node is terminated before Manager answers the start.
    h.command(Command::TerminateNode(s.target_node_id.clone()));
    assert_eq!(state(&h, &id).phase, MigrationPhase::Aborted);
    assert!(
        stops(&calls(&mut h)).is_empty(),
        "a stop sent before the start is answered could overtake it"
    );
    // Manager carried the start out: the target is stopped, not left
    // running beside the source.
    h.ok(start[0].0);
    assert_eq!(stops(&calls(&mut h)), vec![(s.target_key, s.target_node_id)]);
    assert_eq!(bound(&h, &job), (s.source_node_id, s.source_key));
}

#[test]
fn a_prepared_target_whose_start_manager_did_not_hear_is_started_again() {
    let (mut h, job, id) = up_to(MigrationStrategy::StopThenStart, MigrationPhase::StoppingSource);
    source_stops(&mut h, &id);
    let start = h.take_calls();
    assert!(matches!(&start[..], [(_, Rpc::StartPreparedJob { .. })]), "{start:?}");
    h.fail(start[0].0, RpcFailureKind::Transient);
    assert_eq!(
        state(&h, &id).phase,
        MigrationPhase::StartingTarget,
        "failed forward, not lost"
    );
    let again = calls(&mut h);
    assert!(matches!(&again[..], [Rpc::StartPreparedJob { .. }]), "{again:?}");
    target_runs(&mut h, &id);
    let s = state(&h, &id);
    assert_eq!(s.phase, MigrationPhase::Done);
    assert_eq!(bound(&h, &job), (s.target_node_id, s.target_key));
}

#[test]
fn a_prepared_target_manager_refused_to_start_is_stopped_when_its_migration_is_lost() {
    let (mut h, job, id) = up_to(MigrationStrategy::StopThenStart, MigrationPhase::StoppingSource);
    source_stops(&mut h, &id);
    let start = h.take_calls();
    h.fail(start[0].0, RpcFailureKind::Rejected);
    let s = state(&h, &id);
    assert_eq!(s.phase, MigrationPhase::Lost);
    let after = calls(&mut h);
    assert!(
        stops(&after).contains(&(s.target_key.clone(), s.target_node_id.clone())),
        "the prepared target is stopped: {after:?}"
    );
    assert!(
        after
            .iter()
            .any(|c| matches!(c, Rpc::StartJob { job_id, .. } if *job_id == job)),
        "the job is placed afresh: {after:?}"
    );
}

#[test]
fn an_aborted_target_whose_stop_manager_did_not_hear_is_stopped_again() {
    let (mut h, _, id) = up_to(MigrationStrategy::Handover, MigrationPhase::AwaitingReady);
    h.command(Command::AbortMigration {
        migration_id: id.clone(),
        reason: "operator changed mind".into(),
    });
    let s = state(&h, &id);
    let stop = h
        .take_calls()
        .into_iter()
        .find(|(_, c)| matches!(c, Rpc::StopJob { .. }))
        .expect("the target is stopped");
    h.fail(stop.0, RpcFailureKind::Transient);
    assert_eq!(stops(&calls(&mut h)), vec![(s.target_key, s.target_node_id)]);
}
