//! Scenario tests of cordon / drain / evict / terminate and of spot
//! interruption / rebalance notices on a virtual clock, one per rule of the
//! spec's "Drain / cordon" and "Spot interruption / rebalance" sections.

use norsk_auto_manager::automanager::drain::DEFAULT_DRAIN_TIMEOUT_MS;
use norsk_auto_manager::automanager::interruption::{
    DEFAULT_REBALANCE_DRAIN_MS, DEFAULT_SPOT_INTERRUPTION_DRAIN_MS, SPOT_INTERRUPTION_DRAIN_MARGIN_MS,
};
use norsk_auto_manager::automanager::{
    AutoManagerCore, Command, CommandError, DrainAfter, DrainJobStatus, DrainOptions, DrainPhase, DrainState,
    InterruptionNotice, MigrationId, MigrationState, MigrationStrategy, NodeInterruptionState, Notification, Rpc,
    RpcFailureKind, StrategyFor, validate_auto_settings,
};
use norsk_auto_manager::model::{InterruptionKind, JobId, ManagerEvent, NodeId, NodeStopReason};

use crate::support::migration::{run_overlaps, terminates};
use crate::support::*;

/// Three jobs of one capacity each.
const THREE_JOBS: &str = "pool: production\njobs:\n  - {jobName: j0, requirements: {requiredCapacity: 1}}\n  - {jobName: j1, requirements: {requiredCapacity: 1}}\n  - {jobName: j2, requirements: {requiredCapacity: 1}}\n";

/// A pool of the cluster tier only: a job that fits on no cluster node fits
/// nowhere.
const CLUSTER_ONLY: &str =
    "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n";

fn a() -> NodeId {
    NodeId::from("a")
}

fn b() -> NodeId {
    NodeId::from("b")
}

/// A hydrated core on `pools` with cluster nodes `a` and `b`.
fn hydrated_on(pools: &str) -> Harness {
    let mut settings = settings();
    settings.placement_pools = yaml_serde::from_str(pools).expect("pools parse");
    let mut h = Harness::with(settings);
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    h
}

/// The three jobs of [`THREE_JOBS`] running on node `a` (placed while `b`
/// was cordoned).
fn three_jobs_on_a(h: &mut Harness) -> Vec<JobId> {
    h.command(Command::CordonNode(b()));
    h.bundle("b1", THREE_JOBS);
    let started = h.start_all();
    h.command(Command::UncordonNode(b()));
    assert!(started.iter().all(|(_, node)| node == &a()), "placed on a: {started:?}");
    h.take_replies();
    h.take_notifications();
    started.into_iter().map(|(job, _)| job).collect()
}

fn drain(h: &mut Harness, node: NodeId, options: DrainOptions) -> Result<(), CommandError> {
    let id = h.command(Command::DrainNode { node_id: node, options });
    let replies: Vec<_> = h.take_replies().into_iter().filter(|(reply, _)| *reply == id).collect();
    assert_eq!(replies.len(), 1, "one reply per drainNode");
    replies[0].1.clone()
}

/// The spec's drain-then-terminate. The nodes of these scenarios are
/// registered cluster servers, whose drain keeps them by default (a
/// maintenance drain, see `maintenance_drain.rs`), so the spec's rules
/// are exercised with `after: terminate` asked for.
fn terminating() -> DrainOptions {
    DrainOptions {
        after: Some(DrainAfter::Terminate),
        ..DrainOptions::default()
    }
}

fn overlap() -> DrainOptions {
    DrainOptions {
        strategy_for: StrategyFor::all(MigrationStrategy::Overlap),
        ..terminating()
    }
}

fn status(h: &Harness, node: &NodeId) -> DrainState {
    h.core.drain_status(node).expect("a drain of the node").clone()
}

fn job_statuses(h: &Harness, node: &NodeId) -> Vec<DrainJobStatus> {
    status(h, node).jobs.iter().map(|j| j.status).collect()
}

fn migration(h: &Harness, id: &MigrationId) -> MigrationState {
    h.core.migration_by_id(id).expect("migration known").clone()
}

fn drain_phases(notifications: &[Notification]) -> Vec<DrainPhase> {
    notifications
        .iter()
        .filter_map(|n| match n {
            Notification::DrainProgress(state) => Some(state.phase),
            _ => None,
        })
        .collect()
}

fn terminated_notices(notifications: &[Notification]) -> usize {
    notifications
        .iter()
        .filter(|n| matches!(n, Notification::NodeTerminated { .. }))
        .count()
}

// --- cordon ---------------------------------------------------------------

#[test]
fn a_cordoned_node_takes_no_new_placements() {
    let mut h = Harness::hydrated();
    h.command(Command::CordonNode(a()));
    assert!(h.core.is_cordoned(&a()));
    h.bundle("b1", THREE_JOBS);
    let started = h.start_all();
    assert_eq!(started.len(), 3);
    assert!(
        started.iter().all(|(_, node)| node == &b()),
        "a placement landed on a cordoned node: {started:?}"
    );
}

#[test]
fn uncordon_lets_placements_land_again() {
    let mut h = hydrated_on(CLUSTER_ONLY);
    h.command(Command::CordonNode(a()));
    h.command(Command::CordonNode(b()));
    h.bundle("b1", THREE_JOBS);
    assert!(h.start_all().is_empty(), "placed on a cordoned node");
    h.command(Command::UncordonNode(a()));
    assert!(!h.core.is_cordoned(&a()));
    let started = h.start_all();
    assert_eq!(
        started.len(),
        3,
        "the jobs that found nowhere are placed once capacity is back"
    );
    assert!(started.iter().all(|(_, node)| node == &a()));
}

#[test]
fn cordon_of_an_unknown_node_is_refused() {
    let mut h = Harness::hydrated();
    h.command(Command::CordonNode(NodeId::from("nowhere")));
    let replies = h.take_replies();
    assert_eq!(replies[0].1, Err(CommandError::UnknownNode(NodeId::from("nowhere"))));
}

// --- terminate / evict ----------------------------------------------------

#[test]
fn terminate_node_fires_node_terminated_once() {
    let mut h = Harness::hydrated();
    h.command(Command::TerminateNode(a()));
    h.command(Command::TerminateNode(a()));
    assert_eq!(terminates(&h.ok_all()), vec![a()]);
    assert_eq!(terminated_notices(&h.take_notifications()), 1);
    assert!(!h.core.is_cordoned(&a()), "terminateNode does not cordon");
}

#[test]
fn evict_cordons_then_terminates_and_the_jobs_recover_per_on_runtime_failure() {
    let mut h = Harness::hydrated();
    let jobs = three_jobs_on_a(&mut h);
    h.command(Command::EvictNode(a()));
    assert!(h.core.is_cordoned(&a()));
    assert_eq!(terminates(&h.ok_all()), vec![a()]);
    h.node_stopping("a", NodeStopReason::UserRequested);
    let recovered = h.start_all();
    assert_eq!(recovered.len(), jobs.len(), "every job re-placed");
    assert!(recovered.iter().all(|(_, node)| node == &b()));
}

// --- drain ----------------------------------------------------------------

#[test]
fn drain_migrates_every_job_and_terminates_the_empty_node_once() {
    let mut h = Harness::hydrated();
    let jobs = three_jobs_on_a(&mut h);
    drain(&mut h, a(), overlap()).expect("the drain starts");
    assert!(h.core.is_cordoned(&a()));
    let started = status(&h, &a());
    assert_eq!(started.phase, DrainPhase::Migrating);
    assert_eq!(started.jobs.len(), jobs.len());
    assert!(
        started
            .jobs
            .iter()
            .all(|j| j.status == DrainJobStatus::Migrating && j.migration_id.is_some())
    );
    for job in &started.jobs {
        let m = migration(&h, job.migration_id.as_ref().expect("migration id"));
        assert_eq!(m.strategy, MigrationStrategy::Overlap, "strategyFor is honoured");
    }
    run_overlaps(&mut h);
    let done = status(&h, &a());
    assert_eq!(done.phase, DrainPhase::Done);
    assert!(done.jobs.iter().all(|j| j.status == DrainJobStatus::Migrated));
    for job in &jobs {
        assert_eq!(h.bound_node(job), Some(b()));
    }
    let notifications = h.take_notifications();
    assert_eq!(terminated_notices(&notifications), 1, "nodeTerminated fires once");
    assert_eq!(drain_phases(&notifications).last(), Some(&DrainPhase::Done));
}

#[test]
fn drain_progress_fires_on_every_phase_and_job_status_change() {
    let mut h = Harness::hydrated();
    three_jobs_on_a(&mut h);
    drain(&mut h, a(), overlap()).expect("the drain starts");
    run_overlaps(&mut h);
    let progress: Vec<DrainState> = h
        .take_notifications()
        .into_iter()
        .filter_map(|n| match n {
            Notification::DrainProgress(state) => Some(*state),
            _ => None,
        })
        .collect();
    let first = &progress[0];
    assert_eq!(first.phase, DrainPhase::Migrating);
    // Every report differs from the one before it, and each job's move to
    // `migrated` and each phase was reported.
    for pair in progress.windows(2) {
        assert_ne!(pair[0], pair[1], "drainProgress without a change");
    }
    let migrated_counts: Vec<usize> = progress
        .iter()
        .map(|s| s.jobs.iter().filter(|j| j.status == DrainJobStatus::Migrated).count())
        .collect();
    assert!(migrated_counts.contains(&3));
    let phases: Vec<DrainPhase> = progress.iter().map(|s| s.phase).collect();
    assert!(
        phases.ends_with(&[DrainPhase::Terminating, DrainPhase::Done]),
        "{phases:?}"
    );
    assert_eq!(h.core.drain_status(&a()), progress.last());
}

#[test]
fn drain_of_an_empty_node_terminates_it_at_once() {
    let mut h = Harness::hydrated();
    drain(&mut h, a(), terminating()).expect("the drain starts");
    assert_eq!(status(&h, &a()).phase, DrainPhase::Terminating);
    assert_eq!(terminates(&h.ok_all()), vec![a()]);
    assert_eq!(status(&h, &a()).phase, DrainPhase::Done);
}

#[test]
fn drain_times_out_after_default_drain_timeout_ms() {
    let mut h = Harness::hydrated();
    three_jobs_on_a(&mut h);
    drain(&mut h, a(), overlap()).expect("the drain starts");
    assert_eq!(status(&h, &a()).timeout_ms, DEFAULT_DRAIN_TIMEOUT_MS);
    h.ok_all();
    h.advance(DEFAULT_DRAIN_TIMEOUT_MS as i64 - 1);
    assert!(!status(&h, &a()).phase.is_final());
    h.advance(1);
    assert_eq!(status(&h, &a()).phase, DrainPhase::Partial);
}

#[test]
fn a_job_the_saga_refuses_is_stuck() {
    let mut h = Harness::hydrated();
    h.command(Command::CordonNode(b()));
    h.bundle("b1", THREE_JOBS);
    // Started but never reported running: the saga refuses it.
    h.ok_all();
    drain(&mut h, a(), overlap()).expect("the drain starts");
    let state = status(&h, &a());
    assert_eq!(state.phase, DrainPhase::Waiting);
    assert!(
        state
            .jobs
            .iter()
            .all(|j| j.status == DrainJobStatus::Stuck && j.reason.is_some())
    );
}

#[test]
fn a_job_placement_finds_nowhere_for_is_stuck() {
    let mut h = hydrated_on(CLUSTER_ONLY);
    h.command(Command::CordonNode(b()));
    h.bundle(
        "big",
        "pool: production\njobs:\n  - {jobName: big, requirements: {requiredCapacity: 3}}\n",
    );
    h.start_all();
    h.command(Command::UncordonNode(b()));
    h.bundle(
        "filler",
        "pool: production\njobs:\n  - {jobName: f, requirements: {requiredCapacity: 2}}\n",
    );
    h.start_all();
    drain(&mut h, a(), overlap()).expect("the drain starts");
    let state = status(&h, &a());
    assert_eq!(state.jobs.len(), 1);
    assert_eq!(state.jobs[0].status, DrainJobStatus::Stuck);
    assert!(
        state.jobs[0].reason.as_deref().is_some_and(|r| r.contains("no target")),
        "{state:?}"
    );
}

#[test]
fn a_job_whose_migration_aborts_is_stuck() {
    let mut h = Harness::hydrated();
    three_jobs_on_a(&mut h);
    drain(&mut h, a(), overlap()).expect("the drain starts");
    let id = status(&h, &a()).jobs[0].migration_id.clone().expect("migration id");
    h.command(Command::AbortMigration {
        migration_id: id,
        reason: "operator changed mind".into(),
    });
    let state = status(&h, &a());
    assert_eq!(state.jobs[0].status, DrainJobStatus::Stuck);
    assert_eq!(state.jobs[0].reason.as_deref(), Some("operator changed mind"));
    run_overlaps(&mut h);
    let state = status(&h, &a());
    assert_eq!(
        state.phase,
        DrainPhase::Waiting,
        "the stuck job keeps the node from emptying"
    );
    assert!(h.ok_all().iter().all(|c| !matches!(c, Rpc::TerminateNode { .. })));
}

#[test]
fn at_the_timeout_a_drain_with_stuck_jobs_ends_partial_with_nothing_terminated() {
    let mut h = Harness::hydrated();
    h.command(Command::CordonNode(b()));
    h.bundle("b1", THREE_JOBS);
    h.ok_all();
    drain(
        &mut h,
        a(),
        DrainOptions {
            timeout_ms: Some(60_000),
            ..overlap()
        },
    )
    .expect("the drain starts");
    h.advance(60_000);
    let state = status(&h, &a());
    assert_eq!(state.phase, DrainPhase::Partial);
    assert!(state.reason.is_some());
    assert_eq!(
        state.jobs.iter().filter(|j| j.status == DrainJobStatus::Stuck).count(),
        3
    );
    assert!(h.core.is_cordoned(&a()), "the node stays cordoned");
    assert!(terminates(&h.ok_all()).is_empty(), "nothing terminated");
    assert_eq!(terminated_notices(&h.take_notifications()), 0);
}

#[test]
fn a_forced_drain_terminates_at_the_timeout_ends_failed_and_its_stuck_jobs_recover() {
    let mut h = Harness::hydrated();
    let jobs = three_jobs_on_a(&mut h);
    drain(
        &mut h,
        a(),
        DrainOptions {
            timeout_ms: Some(60_000),
            force: true,
            ..overlap()
        },
    )
    .expect("the drain starts");
    // The targets never come up.
    h.ok_all();
    h.advance(60_000);
    let state = status(&h, &a());
    assert_eq!(state.phase, DrainPhase::Terminating);
    assert!(state.jobs.iter().all(|j| j.status == DrainJobStatus::Terminated));
    assert_eq!(terminates(&h.ok_all()), vec![a()]);
    // "Done" only when every job moved: these went down with the node.
    let ended = status(&h, &a());
    assert_eq!(ended.phase, DrainPhase::Failed);
    assert!(
        ended
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("3 job(s) still on it")),
        "{ended:?}"
    );
    assert!(ended.jobs.iter().all(|j| j.status == DrainJobStatus::Terminated));
    h.node_stopping("a", NodeStopReason::UserRequested);
    let recovered = h.start_all();
    let mut recovered_jobs: Vec<JobId> = recovered.iter().map(|(j, _)| j.clone()).collect();
    recovered_jobs.sort();
    let mut expected = jobs.clone();
    expected.sort();
    assert_eq!(
        recovered_jobs, expected,
        "every job on the node recovers per its onRuntimeFailure"
    );
}

#[test]
fn a_second_drain_returns_the_running_one() {
    let mut h = Harness::hydrated();
    three_jobs_on_a(&mut h);
    drain(&mut h, a(), overlap()).expect("the drain starts");
    let first = status(&h, &a());
    let migrations = h.core.migrations().len();
    h.advance(1_000);
    drain(
        &mut h,
        a(),
        DrainOptions {
            timeout_ms: Some(1),
            force: true,
            ..terminating()
        },
    )
    .expect("the running drain is returned");
    assert_eq!(status(&h, &a()).started, first.started);
    assert_eq!(status(&h, &a()).timeout_ms, first.timeout_ms);
    assert_eq!(h.core.migrations().len(), migrations, "no second set of migrations");
    assert_eq!(h.core.drains().count(), 1);
}

#[test]
fn uncordon_cancels_a_drain_that_has_not_issued_its_terminate() {
    let mut h = Harness::hydrated();
    three_jobs_on_a(&mut h);
    drain(
        &mut h,
        a(),
        DrainOptions {
            timeout_ms: Some(60_000),
            force: true,
            ..overlap()
        },
    )
    .expect("the drain starts");
    h.ok_all();
    h.command(Command::UncordonNode(a()));
    assert_eq!(status(&h, &a()).phase, DrainPhase::Failed);
    assert!(!h.core.is_cordoned(&a()));
    h.advance(120_000);
    assert!(
        terminates(&h.ok_all()).is_empty(),
        "a cancelled drain terminated its node"
    );
}

#[test]
fn uncordon_after_the_terminate_does_not_cancel_the_drain() {
    let mut h = Harness::hydrated();
    drain(&mut h, a(), terminating()).expect("the drain starts");
    h.command(Command::UncordonNode(a()));
    assert_eq!(status(&h, &a()).phase, DrainPhase::Terminating);
    h.ok_all();
    assert_eq!(status(&h, &a()).phase, DrainPhase::Done);
}

#[test]
fn a_stuck_job_that_leaves_the_node_otherwise_is_moved() {
    let mut h = Harness::hydrated();
    h.command(Command::CordonNode(b()));
    h.bundle(
        "b1",
        "pool: production\njobs:\n  - {jobName: j0, requirements: {requiredCapacity: 1}}\n",
    );
    let (id, rpc) = h.take_calls().remove(0);
    h.ok(id);
    let Rpc::StartJob { job_id, .. } = rpc else {
        panic!("a StartJob: {rpc:?}")
    };
    drain(&mut h, a(), overlap()).expect("the drain starts");
    assert_eq!(job_statuses(&h, &a()), vec![DrainJobStatus::Stuck]);
    // It crashes and is recovered elsewhere.
    h.failed(&job_id, &a());
    assert_eq!(job_statuses(&h, &a()), vec![DrainJobStatus::Moved]);
    assert_eq!(status(&h, &a()).phase, DrainPhase::Terminating, "now empty");
}

#[test]
fn a_refused_terminate_fails_the_drain() {
    let mut h = Harness::hydrated();
    drain(&mut h, a(), terminating()).expect("the drain starts");
    let (id, _) = h.take_calls().remove(0);
    h.fail(id, RpcFailureKind::Rejected);
    let state = status(&h, &a());
    assert_eq!(state.phase, DrainPhase::Failed);
    assert!(state.reason.is_some());
}

#[test]
fn drain_of_an_unknown_node_is_refused() {
    let mut h = Harness::hydrated();
    assert_eq!(
        drain(&mut h, NodeId::from("nowhere"), terminating()),
        Err(CommandError::UnknownNode(NodeId::from("nowhere")))
    );
}

// --- interruption ---------------------------------------------------------

fn interrupt(h: &mut Harness, node: NodeId, kind: InterruptionKind, deadline: Option<i64>) -> Result<(), CommandError> {
    let notice = InterruptionNotice {
        kind,
        deadline,
        strategy_for: StrategyFor::all(MigrationStrategy::Overlap),
    };
    let id = h.command(Command::HandleNodeInterruption { node_id: node, notice });
    let replies: Vec<_> = h.take_replies().into_iter().filter(|(reply, _)| *reply == id).collect();
    assert_eq!(replies.len(), 1, "one reply per handleNodeInterruption");
    replies[0].1.clone()
}

fn interrupted(notifications: &[Notification]) -> Vec<NodeInterruptionState> {
    notifications
        .iter()
        .filter_map(|n| match n {
            Notification::NodeInterrupted(state) => Some((**state).clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn an_interruption_with_a_deadline_is_a_forced_drain_cut_to_the_deadline_less_the_margin() {
    let mut h = Harness::hydrated();
    three_jobs_on_a(&mut h);
    let deadline = h.now + 120_000;
    interrupt(&mut h, a(), InterruptionKind::SpotInterruption, Some(deadline)).expect("taken");
    let state = status(&h, &a());
    assert!(state.force);
    assert_eq!(state.timeout_ms, 120_000 - SPOT_INTERRUPTION_DRAIN_MARGIN_MS);
    assert!(h.core.is_cordoned(&a()));
    h.ok_all();
    h.advance(90_000);
    assert_eq!(
        status(&h, &a()).phase,
        DrainPhase::Terminating,
        "terminated with its jobs at the timeout"
    );
    assert_eq!(terminates(&h.ok_all()), vec![a()]);
}

#[test]
fn a_spot_interruption_without_a_deadline_drains_for_default_spot_interruption_drain_ms() {
    let mut h = Harness::hydrated();
    interrupt(&mut h, a(), InterruptionKind::SpotInterruption, None).expect("taken");
    assert_eq!(status(&h, &a()).timeout_ms, DEFAULT_SPOT_INTERRUPTION_DRAIN_MS);
}

#[test]
fn a_rebalance_without_a_deadline_drains_for_default_rebalance_drain_ms() {
    let mut h = Harness::hydrated();
    three_jobs_on_a(&mut h);
    interrupt(&mut h, a(), InterruptionKind::Rebalance, None).expect("taken");
    assert_eq!(status(&h, &a()).timeout_ms, DEFAULT_REBALANCE_DRAIN_MS);
}

#[test]
fn jobs_that_migrate_in_time_land_elsewhere_before_the_reclaim() {
    let mut h = Harness::hydrated();
    let jobs = three_jobs_on_a(&mut h);
    let deadline = h.now + 120_000;
    interrupt(&mut h, a(), InterruptionKind::SpotInterruption, Some(deadline)).expect("taken");
    run_overlaps(&mut h);
    assert_eq!(status(&h, &a()).phase, DrainPhase::Done);
    for job in &jobs {
        assert_eq!(h.bound_node(job), Some(b()));
    }
}

#[test]
fn a_notice_for_a_draining_node_keeps_that_drain_and_tightens_its_timeout() {
    let mut h = Harness::hydrated();
    three_jobs_on_a(&mut h);
    interrupt(&mut h, a(), InterruptionKind::Rebalance, None).expect("taken");
    let first = status(&h, &a());
    h.ok_all();
    h.advance(10_000);
    let deadline = h.now + 120_000;
    interrupt(&mut h, a(), InterruptionKind::SpotInterruption, Some(deadline)).expect("taken");
    let tightened = status(&h, &a());
    assert_eq!(tightened.started, first.started, "the same drain");
    assert_eq!(tightened.jobs, first.jobs);
    assert_eq!(
        tightened.timeout_ms,
        10_000 + 120_000 - SPOT_INTERRUPTION_DRAIN_MARGIN_MS
    );
    // A looser notice does not loosen it.
    interrupt(&mut h, a(), InterruptionKind::Rebalance, None).expect("taken");
    assert_eq!(status(&h, &a()).timeout_ms, tightened.timeout_ms);
}

#[test]
fn an_interruption_makes_a_running_drain_forced() {
    let mut h = Harness::hydrated();
    three_jobs_on_a(&mut h);
    drain(&mut h, a(), overlap()).expect("the drain starts");
    assert!(!status(&h, &a()).force);
    interrupt(&mut h, a(), InterruptionKind::SpotInterruption, None).expect("taken");
    assert!(status(&h, &a()).force);
}

#[test]
fn node_interrupted_fires_once_per_call_after_the_drain_started() {
    let mut h = Harness::hydrated();
    three_jobs_on_a(&mut h);
    interrupt(&mut h, a(), InterruptionKind::Rebalance, None).expect("taken");
    interrupt(&mut h, a(), InterruptionKind::SpotInterruption, None).expect("taken");
    let states = interrupted(&h.take_notifications());
    assert_eq!(states.len(), 2);
    assert_eq!(states[0].kind, InterruptionKind::Rebalance);
    assert_eq!(states[0].drain.jobs.len(), 3, "reported once the drain started");
    assert_eq!(states[1].kind, InterruptionKind::SpotInterruption);
    assert_eq!(h.core.node_interruption(&a()).as_ref(), states.last());
}

#[test]
fn uncordon_withdraws_the_notice_with_the_drain() {
    let mut h = Harness::hydrated();
    three_jobs_on_a(&mut h);
    interrupt(&mut h, a(), InterruptionKind::SpotInterruption, None).expect("taken");
    h.ok_all();
    h.command(Command::UncordonNode(a()));
    assert!(h.core.node_interruption(&a()).is_none());
    assert_eq!(status(&h, &a()).phase, DrainPhase::Failed);
    h.advance(DEFAULT_SPOT_INTERRUPTION_DRAIN_MS as i64);
    assert!(terminates(&h.ok_all()).is_empty());
}

#[test]
fn managers_interruption_notice_drives_the_drain() {
    let mut h = Harness::hydrated();
    three_jobs_on_a(&mut h);
    let deadline = h.now + 120_000;
    h.event(ManagerEvent::NodeInterruptionNotice {
        node_id: a(),
        kind: InterruptionKind::SpotInterruption,
        deadline: Some(deadline),
        noticed_at: Some(h.now),
    });
    let state = status(&h, &a());
    assert!(state.force);
    assert_eq!(state.timeout_ms, 90_000);
    assert_eq!(interrupted(&h.take_notifications()).len(), 1);
}

#[test]
fn a_notice_replayed_from_the_snapshot_is_acted_on_once_hydrated() {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    h.event(ManagerEvent::NodeInterruptionNotice {
        node_id: a(),
        kind: InterruptionKind::Rebalance,
        deadline: None,
        noticed_at: None,
    });
    assert!(h.core.drain_status(&a()).is_none());
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(status(&h, &a()).timeout_ms, DEFAULT_REBALANCE_DRAIN_MS);
}

/// A job with a restart ceiling of 1 on node `a` of a cluster-only pool
/// with spare cluster nodes; each round its node goes, by a reclaim after
/// a notice (`reclaim`) or without one, and it recovers onto the next.
fn lose_the_node_three_times(reclaim: bool) -> Harness {
    let mut h = hydrated_on(CLUSTER_ONLY);
    for n in ["c", "d", "e"] {
        h.cluster_node(n, 4.0);
    }
    for n in ["b", "c", "d", "e"] {
        h.command(Command::CordonNode(NodeId::from(n)));
    }
    h.bundle(
        "b1",
        "pool: production\njobs:\n  - {jobName: j0, requirements: {requiredCapacity: 1, maxRestartsPerHour: 1}}\n",
    );
    let (job, mut node) = h.start_all().remove(0);
    for next in ["b", "c", "d"] {
        h.command(Command::UncordonNode(NodeId::from(next)));
        if reclaim {
            let deadline = h.now;
            interrupt(&mut h, node.clone(), InterruptionKind::SpotInterruption, Some(deadline)).expect("taken");
        }
        h.ok_all();
        h.node_stopping(node.as_str(), NodeStopReason::ProviderTerminate);
        h.event(ManagerEvent::NodeStopped(node.clone()));
        h.advance(10_000);
        let started = h.start_all();
        let Some((_, to)) = started.into_iter().find(|(j, _)| j == &job) else {
            return h;
        };
        node = to;
    }
    h
}

#[test]
fn jobs_lost_with_a_reclaimed_node_do_not_count_against_the_restart_ceiling() {
    let h = lose_the_node_three_times(true);
    assert!(h.core.broken_bundles().is_empty(), "three reclaims broke a bundle");
    let job = job_id("b1", 0, "j0");
    assert_eq!(h.bound_node(&job), Some(NodeId::from("d")));
    assert_eq!(
        h.core.job(&job).expect("job").restarts.count(h.now),
        0,
        "restartCount stays put"
    );
    // The same losses without a notice do count.
    let control = lose_the_node_three_times(false);
    assert!(!control.core.broken_bundles().is_empty());
}

#[test]
fn cordons_survive_a_fresh_core_hydrated_after_a_stream_break() {
    let mut h = Harness::hydrated();
    h.command(Command::CordonNode(a()));
    let valid = validate_auto_settings(settings()).expect("settings are valid");
    h.core = AutoManagerCore::succeeding(valid, &h.core);
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    assert!(h.core.is_cordoned(&a()));
    h.bundle("b1", THREE_JOBS);
    let started = h.start_all();
    assert!(
        started.iter().all(|(_, node)| node == &b()),
        "placed on a cordoned node: {started:?}"
    );
}

#[test]
fn a_finished_drain_is_forgotten_once_its_node_leaves_the_fleet() {
    let mut h = Harness::hydrated();
    drain(&mut h, a(), terminating()).expect("the drain starts");
    h.ok_all();
    assert_eq!(status(&h, &a()).phase, DrainPhase::Done);
    h.node_stopping("a", NodeStopReason::UserRequested);
    h.event(ManagerEvent::NodeStopped(a()));
    assert!(
        h.core.drain_status(&a()).is_some(),
        "readable while Manager still reports the node"
    );
    h.advance(h.core.settings().remove_stopped_nodes_after as i64 * 1_000);
    assert!(h.core.fleet().get(&a()).is_none(), "swept");
    assert!(h.core.drain_status(&a()).is_none());
}
