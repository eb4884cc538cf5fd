//! Scenario tests of co-located groups moving as a unit, on a virtual
//! clock: a drain of a node carrying the flagship channel's pair (`package`
//! `coLocateWith: [encode]`) under each strategy, an interruption of it with
//! its deadline met and missed, a pinned migration of one job of the group,
//! a group that fits nowhere stuck as a whole with its reason, the first
//! mover sizing the target for the whole group, `separateFrom`, `exclusive`
//! and `sameNodeDefault`, the group's cut-over and rollback, and the
//! outcomes a drain reports when jobs go down with the node.

use norsk_auto_manager::automanager::{
    Command, CommandError, DrainAfter, DrainJobStatus, DrainOptions, DrainPhase, DrainState, InterruptionNotice,
    MigrationId, MigrationOptions, MigrationPhase, MigrationRefusal, MigrationStep, MigrationStrategy, Notification,
    Rpc, RpcFailureKind, StrategyFor,
};
use norsk_auto_manager::model::{
    HotSpareSpec, InterruptionKind, JobId, ManagerEvent, MigrationSignal, NodeId, NodeStopReason, ProviderKind, tags,
};

use crate::support::migration::*;
use crate::support::*;

/// The flagship example's channel `ch1` (`examples/bundle-channel.yaml`),
/// primary only: `encode` (2 vCPU, port 1935/tcp) and `package` (1 vCPU)
/// co-located with it.
const CH1: &str = "pool: production
jobs:
  - {jobName: encode, template: encoder, requirements: {requiredCapacity: 2, requiredHostPorts: [1935/tcp], onRuntimeFailure: preferSpare}}
  - {jobName: package, template: packager, coLocateWith: [encode], requirements: {requiredCapacity: 1}}
";

/// A pool of the cluster tier only.
const CLUSTER_ONLY: &str =
    "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n";

fn node(id: &str) -> NodeId {
    NodeId::from(id)
}

fn encode() -> JobId {
    job_id("ch1", 0, "encode")
}

fn package() -> JobId {
    job_id("ch1", 0, "package")
}

/// Runs `bundle` (named `id`) with every node but `on` cordoned, then
/// uncordons them: its jobs run on `on`.
fn run_on(h: &mut Harness, id: &str, bundle: &str, on: &str) {
    let others: Vec<NodeId> = h
        .core
        .fleet()
        .iter()
        .map(|n| n.id.clone())
        .filter(|n| n.as_str() != on && !h.core.is_cordoned(n))
        .collect();
    for other in &others {
        h.command(Command::CordonNode(other.clone()));
    }
    h.bundle(id, bundle);
    let started = h.start_all();
    assert!(
        started.iter().all(|(_, n)| n.as_str() == on),
        "{id} placed on {on}: {started:?}"
    );
    for other in others {
        h.command(Command::UncordonNode(other));
    }
    h.take_replies();
    h.take_notifications();
}

/// Cluster nodes `a` and `b` (4 vCPU each) of the harness's pools (cluster
/// tier, then elastic AWS and OCI tiers), with `ch1` running on `a`.
fn ch1_on_a() -> Harness {
    let mut h = Harness::hydrated();
    run_on(&mut h, "ch1", CH1, "a");
    h
}

/// A hydrated core on `pools` with cluster nodes of the given capacities.
fn fleet_on(pools: &str, nodes: &[(&str, f64)]) -> Harness {
    let mut settings = settings();
    settings.placement_pools = yaml_serde::from_str(pools).expect("pools parse");
    let mut h = Harness::with(settings);
    for (id, vcpus) in nodes {
        h.cluster_node(id, *vcpus);
    }
    h.event(ManagerEvent::InitialDataComplete);
    h
}

fn drain(h: &mut Harness, on: &str, options: DrainOptions) {
    let id = h.command(Command::DrainNode {
        node_id: node(on),
        options,
    });
    let replies: Vec<_> = h.take_replies().into_iter().filter(|(reply, _)| *reply == id).collect();
    assert_eq!(replies.len(), 1, "one reply per drainNode");
    replies[0].1.clone().expect("the drain starts");
}

/// The spec's drain-then-terminate under `strategy`: the nodes here are
/// registered cluster servers, whose drain otherwise keeps them (a
/// maintenance drain).
fn every_job(strategy: MigrationStrategy) -> DrainOptions {
    DrainOptions {
        strategy_for: StrategyFor::all(strategy),
        after: Some(DrainAfter::Terminate),
        ..DrainOptions::default()
    }
}

fn drain_state(h: &Harness, on: &str) -> DrainState {
    h.core.drain_status(&node(on)).expect("a drain of the node").clone()
}

/// The drain's migration of `job`.
fn drain_migration(h: &Harness, on: &str, job: &JobId) -> MigrationId {
    drain_state(h, on)
        .jobs
        .iter()
        .find(|j| &j.job_id == job)
        .and_then(|j| j.migration_id.clone())
        .unwrap_or_else(|| panic!("{job} migrates: {:?}", drain_state(h, on)))
}

fn drain_job(h: &Harness, on: &str, job: &JobId) -> (DrainJobStatus, Option<String>) {
    let state = drain_state(h, on);
    let found = state
        .jobs
        .iter()
        .find(|j| &j.job_id == job)
        .expect("the job is the drain's");
    (found.status, found.reason.clone())
}

/// Plays member `id` up to its point of no return: prepared
/// (`stopThenStart`), running (`overlap`), running and ready (`handover`).
fn make_ready(h: &mut Harness, id: &MigrationId) {
    match state(h, id).strategy {
        MigrationStrategy::StopThenStart => prepared(h, id),
        MigrationStrategy::Overlap => target_runs(h, id),
        MigrationStrategy::Handover => {
            target_runs(h, id);
            signal(h, id, true, MigrationSignal::TargetReady(b"at-gop".to_vec()));
        }
    }
}

/// Plays member `id`, past its point of no return, to `done`; returns every
/// call answered on the way.
fn finish(h: &mut Harness, id: &MigrationId) -> Vec<Rpc> {
    let mut answered = Vec::new();
    match state(h, id).strategy {
        MigrationStrategy::StopThenStart => {
            source_stops(h, id);
            answered.extend(calls(h));
            target_runs(h, id);
        }
        MigrationStrategy::Overlap => source_stops(h, id),
        MigrationStrategy::Handover => {
            signal(h, id, false, MigrationSignal::SourceStoppedAt("pts:90000".into()));
            answered.extend(calls(h));
            signal(h, id, true, MigrationSignal::TargetApplied);
            answered.extend(calls(h));
            source_stops(h, id);
        }
    }
    answered.extend(calls(h));
    answered
}

/// The calls crossing a point of no return: a source's `StopJob` or a
/// handover's `StopOutputAt`, as (job, what).
fn crossings(calls: &[Rpc]) -> Vec<(JobId, &'static str)> {
    let mut out: Vec<(JobId, &'static str)> = calls
        .iter()
        .filter_map(|c| match c {
            Rpc::StopJob {
                job_id, instance_key, ..
            } if !instance_key.as_str().contains('@') => Some((job_id.clone(), "stop source")),
            Rpc::SendMigrationSignal {
                job_id,
                signal: MigrationStep::StopOutputAt(_),
                ..
            } => Some((job_id.clone(), "stop output")),
            _ => None,
        })
        .collect();
    out.sort();
    out
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

/// A drain of `a` under `strategy` moves `encode` and `package` together:
/// one target for both, no source stopped before both are ready, both
/// sources stopped in one step, the node terminated only once both moved.
fn drain_moves_the_pair_together(strategy: MigrationStrategy) {
    let mut h = ch1_on_a();
    drain(&mut h, "a", every_job(strategy));
    let started = drain_state(&h, "a");
    assert_eq!(started.phase, DrainPhase::Migrating);
    assert!(
        started.jobs.iter().all(|j| j.status == DrainJobStatus::Migrating),
        "{started:?}"
    );
    let (enc, pkg) = (
        drain_migration(&h, "a", &encode()),
        drain_migration(&h, "a", &package()),
    );
    let (enc_state, pkg_state) = (state(&h, &enc), state(&h, &pkg));
    assert_eq!(enc_state.target_node_id, node("b"), "the empty node takes the group");
    assert_eq!(pkg_state.target_node_id, node("b"), "one target for the whole group");
    assert_eq!((enc_state.strategy, pkg_state.strategy), (strategy, strategy));
    assert_eq!(enc_state.group.len(), 1);
    assert_eq!(enc_state.group[0].job_id, package());
    assert_eq!(pkg_state.group[0].migration_id, enc);
    let dispatched = calls(&mut h);
    assert_eq!(
        dispatched
            .iter()
            .filter(|c| matches!(c, Rpc::StartMigrationTarget { node_id, .. } if node_id == &node("b")))
            .count(),
        2,
        "{dispatched:?}"
    );

    make_ready(&mut h, &enc);
    let waiting = calls(&mut h);
    assert!(
        crossings(&waiting).is_empty(),
        "a source told before its group was ready: {waiting:?}"
    );
    assert_eq!(state(&h, &enc).phase, MigrationPhase::AwaitingGroup);
    assert!(!state(&h, &enc).past_point_of_no_return);

    make_ready(&mut h, &pkg);
    let cut_over = calls(&mut h);
    let how = if strategy == MigrationStrategy::Handover {
        "stop output"
    } else {
        "stop source"
    };
    assert_eq!(
        crossings(&cut_over),
        vec![(encode(), how), (package(), how)],
        "the group crosses its point of no return together"
    );
    assert!(state(&h, &enc).past_point_of_no_return && state(&h, &pkg).past_point_of_no_return);

    let first_moved = finish(&mut h, &enc);
    assert_eq!(state(&h, &enc).phase, MigrationPhase::Done);
    assert_eq!(drain_state(&h, "a").phase, DrainPhase::Migrating);
    assert!(
        terminates(&first_moved).is_empty(),
        "released before the whole group moved"
    );

    let ended = finish(&mut h, &pkg);
    assert_eq!(terminates(&ended), vec![node("a")]);
    let done = drain_state(&h, "a");
    assert_eq!(done.phase, DrainPhase::Done);
    assert!(
        done.jobs.iter().all(|j| j.status == DrainJobStatus::Migrated),
        "{done:?}"
    );
    assert_eq!(h.bound_node(&encode()), Some(node("b")));
    assert_eq!(h.bound_node(&package()), Some(node("b")));
    assert_eq!(drain_phases(&h.take_notifications()).last(), Some(&DrainPhase::Done));
}

#[test]
fn a_drain_moves_a_co_located_pair_together_under_stop_then_start() {
    drain_moves_the_pair_together(MigrationStrategy::StopThenStart);
}

#[test]
fn a_drain_moves_a_co_located_pair_together_under_overlap() {
    drain_moves_the_pair_together(MigrationStrategy::Overlap);
}

#[test]
fn a_drain_moves_a_co_located_pair_together_under_handover() {
    drain_moves_the_pair_together(MigrationStrategy::Handover);
}

#[test]
fn the_flagship_channel_drains_onto_an_empty_hot_spare() {
    let mut settings = settings();
    settings.hot_spares = vec![HotSpareSpec {
        pool: "production".into(),
        target_count: 1,
        spec: yaml_serde::from_str("{instanceType: m5.xlarge}").expect("spare spec parses"),
        warm_for: vec![],
        reserved_for: vec![],
        exclusive: false,
    }];
    let mut h = Harness::with(settings);
    h.cluster_node("a", 4.0);
    h.provisioned_node_starts(
        "s1",
        ProviderKind::Aws,
        &[(tags::POOL, "production"), (tags::TIER, "aws"), (tags::SPARE, "true")],
    );
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("ch1", CH1);
    let started = h.start_all();
    assert!(started.iter().all(|(_, n)| n == &node("a")), "{started:?}");
    h.take_notifications();
    drain(&mut h, "a", every_job(MigrationStrategy::StopThenStart));
    let (enc, pkg) = (
        drain_migration(&h, "a", &encode()),
        drain_migration(&h, "a", &package()),
    );
    assert_eq!(
        state(&h, &enc).target_node_id,
        node("s1"),
        "the empty spare takes the channel"
    );
    assert_eq!(state(&h, &pkg).target_node_id, node("s1"));
    calls(&mut h);
    make_ready(&mut h, &enc);
    make_ready(&mut h, &pkg);
    calls(&mut h);
    finish(&mut h, &enc);
    let ended = finish(&mut h, &pkg);
    assert_eq!(terminates(&ended), vec![node("a")]);
    assert_eq!(drain_state(&h, "a").phase, DrainPhase::Done);
    assert_eq!(h.bound_node(&encode()), Some(node("s1")));
    assert_eq!(h.bound_node(&package()), Some(node("s1")));
}

#[test]
fn each_job_of_a_group_is_switched_with_its_own_strategy() {
    let mut h = ch1_on_a();
    let mut strategy_for = StrategyFor::all(MigrationStrategy::Overlap);
    strategy_for.jobs.insert(package(), MigrationStrategy::StopThenStart);
    drain(
        &mut h,
        "a",
        DrainOptions {
            strategy_for,
            after: Some(DrainAfter::Terminate),
            ..DrainOptions::default()
        },
    );
    let (enc, pkg) = (
        drain_migration(&h, "a", &encode()),
        drain_migration(&h, "a", &package()),
    );
    assert_eq!(state(&h, &enc).strategy, MigrationStrategy::Overlap);
    assert_eq!(state(&h, &pkg).strategy, MigrationStrategy::StopThenStart);
    let dispatched = calls(&mut h);
    let deferred: Vec<(JobId, bool)> = dispatched
        .iter()
        .filter_map(|c| match c {
            Rpc::StartMigrationTarget {
                job_id, defer_start, ..
            } => Some((job_id.clone(), *defer_start)),
            _ => None,
        })
        .collect();
    assert!(deferred.contains(&(encode(), false)) && deferred.contains(&(package(), true)));
    make_ready(&mut h, &pkg);
    make_ready(&mut h, &enc);
    assert_eq!(
        crossings(&calls(&mut h)),
        vec![(encode(), "stop source"), (package(), "stop source")]
    );
    finish(&mut h, &enc);
    let ended = finish(&mut h, &pkg);
    assert_eq!(terminates(&ended), vec![node("a")]);
    assert_eq!(drain_state(&h, "a").phase, DrainPhase::Done);
    assert_eq!(h.bound_node(&encode()), h.bound_node(&package()));
}

// --- interruption ---------------------------------------------------------

fn interrupt(h: &mut Harness, on: &str, deadline: i64) {
    let notice = InterruptionNotice {
        kind: InterruptionKind::SpotInterruption,
        deadline: Some(deadline),
        strategy_for: StrategyFor::all(MigrationStrategy::Overlap),
    };
    let id = h.command(Command::HandleNodeInterruption {
        node_id: node(on),
        notice,
    });
    let replies: Vec<_> = h.take_replies().into_iter().filter(|(reply, _)| *reply == id).collect();
    assert_eq!(replies[0].1, Ok(()));
}

#[test]
fn an_interruption_whose_deadline_is_met_moves_the_pair_together_and_the_drain_is_done() {
    let mut h = ch1_on_a();
    let deadline = h.now + 120_000;
    interrupt(&mut h, "a", deadline);
    let (enc, pkg) = (
        drain_migration(&h, "a", &encode()),
        drain_migration(&h, "a", &package()),
    );
    calls(&mut h);
    h.advance(10_000);
    make_ready(&mut h, &enc);
    make_ready(&mut h, &pkg);
    calls(&mut h);
    finish(&mut h, &enc);
    finish(&mut h, &pkg);
    let interrupted = h.core.node_interruption(&node("a")).expect("the notice is known");
    assert_eq!(interrupted.drain.phase, DrainPhase::Done);
    assert!(
        interrupted
            .drain
            .jobs
            .iter()
            .all(|j| j.status == DrainJobStatus::Migrated)
    );
    assert_eq!(h.bound_node(&encode()), Some(node("b")));
    assert_eq!(h.bound_node(&package()), Some(node("b")));
}

#[test]
fn an_interruption_whose_deadline_is_missed_reports_the_pair_terminated_and_the_drain_never_done() {
    let mut h = ch1_on_a();
    let deadline = h.now + 120_000;
    interrupt(&mut h, "a", deadline);
    // The targets never come up before the drain's timeout (the deadline
    // less the margin).
    calls(&mut h);
    h.take_notifications();
    h.advance(90_000);
    let terminating = drain_state(&h, "a");
    assert_eq!(terminating.phase, DrainPhase::Terminating);
    assert_eq!(terminates(&calls(&mut h)), vec![node("a")]);
    let ended = drain_state(&h, "a");
    assert_eq!(ended.phase, DrainPhase::Failed, "{ended:?}");
    for job in [encode(), package()] {
        let (status, reason) = drain_job(&h, "a", &job);
        assert_eq!(status, DrainJobStatus::Terminated, "{job} went down with the node");
        assert!(reason.is_some());
    }
    let why = ended.reason.clone().unwrap_or_default();
    assert!(
        why.contains("2 job(s) still on it") && why.contains("ch1/0/encode") && why.contains("ch1/0/package"),
        "{why}"
    );
    let phases = drain_phases(&h.take_notifications());
    assert!(!phases.contains(&DrainPhase::Done), "notified done: {phases:?}");
    assert_eq!(phases.last(), Some(&DrainPhase::Failed));
    // The node goes; the pair recovers together, not against the ceiling.
    h.node_stopping("a", NodeStopReason::ProviderTerminate);
    let recovered = h.start_all();
    assert_eq!(recovered.len(), 2, "{recovered:?}");
    assert_eq!(
        h.bound_node(&encode()),
        h.bound_node(&package()),
        "recovered onto one node"
    );
    assert_eq!(h.core.job(&encode()).expect("job").restarts.count(h.now), 0);
}

// --- one job of a group ---------------------------------------------------

#[test]
fn a_pinned_migration_of_one_job_of_a_group_moves_the_whole_group_to_the_pin() {
    let mut h = ch1_on_a();
    h.cluster_node("c", 4.0);
    let pinned = MigrationOptions {
        strategy: Some(MigrationStrategy::Overlap),
        target_node_id: Some(node("c")),
        override_reservation: false,
    };
    let pkg = try_migrate(&mut h, &package(), pinned).expect("the group moves");
    let asked = state(&h, &pkg);
    assert_eq!(asked.job_id, package());
    assert_eq!(asked.target_node_id, node("c"));
    assert_eq!(asked.group.len(), 1, "the migration says its group moves with it");
    assert_eq!(asked.group[0].job_id, encode());
    let enc = asked.group[0].migration_id.clone();
    let along = state(&h, &enc);
    assert_eq!(along.target_node_id, node("c"), "the peer goes to the pin too");
    assert_eq!(along.strategy, MigrationStrategy::Overlap);
    assert_eq!(
        h.core.migration_for_job(&encode()).map(|m| m.migration_id.clone()),
        Some(enc.clone())
    );
    calls(&mut h);
    make_ready(&mut h, &pkg);
    make_ready(&mut h, &enc);
    calls(&mut h);
    finish(&mut h, &pkg);
    finish(&mut h, &enc);
    assert_eq!(h.bound_node(&encode()), Some(node("c")));
    assert_eq!(h.bound_node(&package()), Some(node("c")));
    assert_eq!(completed(&h.take_notifications()), 2);
}

#[test]
fn a_pinned_target_without_room_for_the_whole_group_refuses_it_with_the_numbers() {
    let mut h = ch1_on_a();
    run_on(
        &mut h,
        "filler",
        "pool: production\njobs:\n  - {jobName: f, requirements: {requiredCapacity: 2}}\n",
        "b",
    );
    let pinned = MigrationOptions {
        target_node_id: Some(node("b")),
        ..MigrationOptions::default()
    };
    let refused = try_migrate(&mut h, &package(), pinned);
    let Err(CommandError::Migration(MigrationRefusal::GroupCannotMove { group, reason, .. })) = &refused else {
        panic!("refused as a group: {refused:?}");
    };
    assert_eq!(group, &vec![encode(), package()]);
    assert!(reason.contains("b: needs 3 vCPU, 2 free"), "{reason}");
    assert!(h.core.migrations().is_empty(), "nothing of the group moved");
    assert_eq!(h.bound_node(&package()), Some(node("a")));
}

#[test]
fn a_group_member_that_is_not_running_keeps_the_whole_group_where_it_is() {
    let mut h = Harness::hydrated();
    h.command(Command::CordonNode(node("b")));
    h.bundle("ch1", CH1);
    // `encode` runs; `package` was started but has not reported running.
    for (id, rpc) in h.take_calls() {
        h.ok(id);
        if let Rpc::StartJob { job_id, node_id, .. } = rpc
            && job_id == encode()
        {
            h.running(&job_id, &node_id);
        }
    }
    h.command(Command::UncordonNode(node("b")));
    let refused = try_migrate(&mut h, &encode(), options(MigrationStrategy::Overlap));
    let Err(CommandError::Migration(MigrationRefusal::GroupCannotMove { reason, .. })) = &refused else {
        panic!("refused as a group: {refused:?}");
    };
    assert!(reason.contains("ch1/0/package is not running"), "{reason}");
    assert!(h.core.migrations().is_empty());
}

// --- fitting the group ------------------------------------------------------

#[test]
fn a_group_that_fits_nowhere_is_stuck_as_a_whole_with_the_rule_the_tier_and_the_numbers() {
    let mut h = fleet_on(CLUSTER_ONLY, &[("a", 4.0), ("b", 4.0), ("c", 8.0)]);
    run_on(&mut h, "ch1", CH1, "a");
    // b has room for `encode` alone, not for the pair; c has the room but
    // another channel holds the pair's port.
    run_on(
        &mut h,
        "filler",
        "pool: production\njobs:\n  - {jobName: f, requirements: {requiredCapacity: 2}}\n",
        "b",
    );
    run_on(
        &mut h,
        "ch2",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 2, requiredHostPorts: [1935/tcp]}}\n",
        "c",
    );
    drain(
        &mut h,
        "a",
        DrainOptions {
            timeout_ms: Some(60_000),
            ..every_job(MigrationStrategy::Overlap)
        },
    );
    let state = drain_state(&h, "a");
    assert_eq!(state.phase, DrainPhase::Waiting);
    let (enc_status, enc_reason) = drain_job(&h, "a", &encode());
    let (pkg_status, pkg_reason) = drain_job(&h, "a", &package());
    assert_eq!((enc_status, pkg_status), (DrainJobStatus::Stuck, DrainJobStatus::Stuck));
    assert_eq!(enc_reason, pkg_reason, "one reason for the whole group");
    let reason = enc_reason.unwrap_or_default();
    for words in [
        "co-located group [ch1/0/encode, ch1/0/package]",
        "tier cluster",
        "b: needs 3 vCPU, 2 free",
        "c: host port 1935/tcp taken",
        "not provisioned: fixed tier",
    ] {
        assert!(reason.contains(words), "{words:?} missing from {reason:?}");
    }
    assert!(h.core.migrations().is_empty(), "no member moved alone");
    assert_eq!(h.bound_node(&encode()), Some(node("a")));
    assert_eq!(h.bound_node(&package()), Some(node("a")));
    h.advance(60_000);
    let ended = drain_state(&h, "a");
    assert_eq!(ended.phase, DrainPhase::Partial);
    assert!(terminates(&calls(&mut h)).is_empty(), "nothing terminated");
}

#[test]
fn the_first_mover_sizes_the_target_for_the_whole_group() {
    let mut h = fleet_on(CLUSTER_ONLY, &[("a", 4.0), ("b", 4.0), ("c", 4.0)]);
    run_on(&mut h, "ch1", CH1, "a");
    // Binpack would put `encode` alone on the fuller b (2 free); the pair
    // needs 3.
    run_on(
        &mut h,
        "filler",
        "pool: production\njobs:\n  - {jobName: f, requirements: {requiredCapacity: 2}}\n",
        "b",
    );
    let enc = migrate(&mut h, &encode(), MigrationStrategy::Overlap);
    assert_eq!(state(&h, &enc).target_node_id, node("c"));
    assert_eq!(
        state(&h, &state(&h, &enc).group[0].migration_id).target_node_id,
        node("c")
    );
}

#[test]
fn a_group_with_no_node_to_fit_it_provisions_one_sized_for_the_group() {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("ch1", CH1);
    h.start_all();
    h.take_notifications();
    let enc = migrate(&mut h, &encode(), MigrationStrategy::Overlap);
    let provisioned = calls(&mut h);
    let created: Vec<NodeId> = provisioned
        .iter()
        .filter_map(|c| match c {
            Rpc::CreateNode { node_id, .. } => Some(node_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(created.len(), 1, "one node for the whole group: {provisioned:?}");
    let target = state(&h, &enc).target_node_id;
    assert_eq!(created[0], target);
    let pkg = state(&h, &enc).group[0].migration_id.clone();
    assert_eq!(state(&h, &pkg).target_node_id, target);
    h.provisioned_node_starts(target.as_str(), ProviderKind::Aws, &[]);
    let started = calls(&mut h);
    assert_eq!(
        started
            .iter()
            .filter(|c| matches!(c, Rpc::StartMigrationTarget { node_id, .. } if node_id == &target))
            .count(),
        2,
        "{started:?}"
    );
}

#[test]
fn separate_from_keeps_the_moving_group_off_the_node_of_a_job_it_must_be_kept_apart_from() {
    let mut h = fleet_on(CLUSTER_ONLY, &[("a", 4.0), ("b", 4.0), ("c", 4.0)]);
    let spec = "pool: production
jobs:
  - {jobName: encode, requirements: {requiredCapacity: 2}}
  - {jobName: package, coLocateWith: [encode], requirements: {requiredCapacity: 1}}
  - {jobName: monitor, separateFrom: [encode], requirements: {requiredCapacity: 1}}
";
    h.command(Command::CordonNode(node("c")));
    h.bundle("ch1", spec);
    let started = h.start_all();
    h.command(Command::UncordonNode(node("c")));
    let monitor = job_id("ch1", 0, "monitor");
    let monitor_node = started
        .iter()
        .find(|(j, _)| j == &monitor)
        .map(|(_, n)| n.clone())
        .expect("monitor runs");
    let group_node = h.bound_node(&encode()).expect("encode runs");
    assert_ne!(monitor_node, group_node);
    let enc = migrate(&mut h, &encode(), MigrationStrategy::Overlap);
    // The monitor's node is the fuller one binpack prefers: the rule keeps
    // the group off it.
    assert_eq!(state(&h, &enc).target_node_id, node("c"));
}

#[test]
fn an_exclusive_member_gives_the_moving_group_a_node_of_its_own() {
    let mut h = fleet_on(CLUSTER_ONLY, &[("a", 4.0), ("b", 4.0), ("c", 4.0)]);
    let spec = "pool: production
jobs:
  - {jobName: encode, exclusive: true, requirements: {requiredCapacity: 2}}
  - {jobName: package, coLocateWith: [encode], requirements: {requiredCapacity: 1}}
";
    run_on(&mut h, "ch1", spec, "a");
    run_on(
        &mut h,
        "other",
        "pool: production\njobs:\n  - {jobName: x, requirements: {requiredCapacity: 0.5}}\n",
        "b",
    );
    let pkg = migrate(&mut h, &package(), MigrationStrategy::Overlap);
    assert_eq!(
        state(&h, &pkg).target_node_id,
        node("c"),
        "b has company outside the group"
    );
    assert_eq!(
        state(&h, &state(&h, &pkg).group[0].migration_id).target_node_id,
        node("c")
    );
}

#[test]
fn same_node_default_jobs_move_together() {
    let mut h = Harness::hydrated();
    let spec = "pool: production
intraReplicaPlacement: {sameNodeDefault: true}
jobs:
  - {jobName: encode, requirements: {requiredCapacity: 1}}
  - {jobName: package, requirements: {requiredCapacity: 1}}
";
    run_on(&mut h, "ch1", spec, "a");
    let enc = migrate(&mut h, &encode(), MigrationStrategy::Overlap);
    let moving = state(&h, &enc);
    assert_eq!(moving.group.len(), 1);
    assert_eq!(moving.group[0].job_id, package());
    assert_eq!(
        state(&h, &moving.group[0].migration_id).target_node_id,
        moving.target_node_id
    );
}

#[test]
fn a_job_outside_any_group_still_moves_alone() {
    let (mut h, job, _) = running_job();
    let id = migrate(&mut h, &job, MigrationStrategy::Overlap);
    assert!(state(&h, &id).group.is_empty());
    assert_eq!(h.core.migrations().len(), 1);
}

// --- rollback -------------------------------------------------------------

#[test]
fn a_member_whose_target_fails_before_the_cut_over_rolls_the_whole_group_back() {
    let mut h = ch1_on_a();
    drain(&mut h, "a", every_job(MigrationStrategy::Overlap));
    let (enc, pkg) = (
        drain_migration(&h, "a", &encode()),
        drain_migration(&h, "a", &package()),
    );
    calls(&mut h);
    make_ready(&mut h, &enc);
    calls(&mut h);
    assert_eq!(state(&h, &enc).phase, MigrationPhase::AwaitingGroup);
    let target = state(&h, &pkg);
    h.event(ManagerEvent::JobRejected {
        job_id: package(),
        role: target.target_key.clone(),
        node_id: target.target_node_id.clone(),
        code: norsk_auto_manager::model::RejectionCode::InsufficientCapacity,
        detail: "out of capacity".into(),
        inventory: None,
    });
    assert_eq!(state(&h, &pkg).phase, MigrationPhase::Aborted);
    let enc_state = state(&h, &enc);
    assert_eq!(
        enc_state.phase,
        MigrationPhase::Aborted,
        "the waiting member rolls back too"
    );
    assert!(
        enc_state.reason.as_deref().is_some_and(|r| r.contains("ch1/0/package")),
        "{enc_state:?}"
    );
    let after = calls(&mut h);
    assert!(
        stops(&after).contains(&(enc_state.target_key.clone(), enc_state.target_node_id.clone())),
        "the running target of the waiting member is stopped: {after:?}"
    );
    assert!(crossings(&after).is_empty(), "no source was told to stop");
    assert_eq!(h.bound_node(&encode()), Some(node("a")));
    assert_eq!(h.bound_node(&package()), Some(node("a")));
    assert_eq!(drain_job(&h, "a", &encode()).0, DrainJobStatus::Stuck);
    assert_eq!(drain_job(&h, "a", &package()).0, DrainJobStatus::Stuck);
}

#[test]
fn aborting_one_member_aborts_its_group() {
    let mut h = ch1_on_a();
    let enc = migrate(&mut h, &encode(), MigrationStrategy::StopThenStart);
    let pkg = state(&h, &enc).group[0].migration_id.clone();
    calls(&mut h);
    h.command(Command::AbortMigration {
        migration_id: pkg.clone(),
        reason: "operator changed mind".into(),
    });
    assert_eq!(state(&h, &pkg).phase, MigrationPhase::Aborted);
    assert_eq!(state(&h, &enc).phase, MigrationPhase::Aborted);
    assert_eq!(
        aborted(&h.take_notifications()).len(),
        2,
        "migrationAborted for each member"
    );
}

#[test]
fn a_waiting_member_keeps_no_deadline_of_its_own_but_its_group_s_deadlines_still_bound_it() {
    let mut h = ch1_on_a();
    let enc = migrate(&mut h, &encode(), MigrationStrategy::StopThenStart);
    let pkg = state(&h, &enc).group[0].migration_id.clone();
    calls(&mut h);
    prepared(&mut h, &enc);
    calls(&mut h);
    assert_eq!(state(&h, &enc).phase, MigrationPhase::AwaitingGroup);
    assert_eq!(state(&h, &enc).phase_deadline, None);
    // `package` never gets prepared: its `preparing` deadline rolls the
    // group back, and `encode` stays where it runs.
    h.advance(h.core.settings().migration.preparing_timeout_ms as i64);
    assert_eq!(state(&h, &pkg).phase, MigrationPhase::Aborted);
    assert_eq!(state(&h, &enc).phase, MigrationPhase::Aborted);
    assert_eq!(h.bound_node(&encode()), Some(node("a")));
}

// --- honest outcomes ------------------------------------------------------

#[test]
fn a_job_that_goes_down_with_its_node_during_a_drain_is_terminated_never_moved() {
    let mut h = ch1_on_a();
    drain(&mut h, "a", every_job(MigrationStrategy::Overlap));
    calls(&mut h);
    h.take_notifications();
    // The node stops under the drain before any target runs.
    h.node_stopping("a", NodeStopReason::ProviderTerminate);
    let ended = drain_state(&h, "a");
    assert_eq!(ended.phase, DrainPhase::Failed);
    for job in [encode(), package()] {
        let (status, reason) = drain_job(&h, "a", &job);
        assert_eq!(status, DrainJobStatus::Terminated, "{job}: {reason:?}");
        assert!(reason.is_some_and(|r| r.contains("went down with the node")));
    }
    assert!(
        ended
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("2 job(s) still on it")),
        "{ended:?}"
    );
    let phases = drain_phases(&h.take_notifications());
    assert_eq!(phases.last(), Some(&DrainPhase::Failed));
}

#[test]
fn a_job_that_completes_onto_its_running_target_as_the_node_goes_is_migrated() {
    let mut h = ch1_on_a();
    drain(&mut h, "a", every_job(MigrationStrategy::Overlap));
    let (enc, pkg) = (
        drain_migration(&h, "a", &encode()),
        drain_migration(&h, "a", &package()),
    );
    calls(&mut h);
    make_ready(&mut h, &enc);
    calls(&mut h);
    // `encode`'s target runs, `package`'s does not, when the node goes.
    h.node_stopping("a", NodeStopReason::ProviderTerminate);
    assert_eq!(state(&h, &enc).phase, MigrationPhase::Done);
    assert_eq!(state(&h, &pkg).phase, MigrationPhase::Aborted);
    assert_eq!(drain_job(&h, "a", &encode()).0, DrainJobStatus::Migrated);
    assert_eq!(drain_job(&h, "a", &package()).0, DrainJobStatus::Terminated);
    // The lost member is recovered next to the one that made it.
    h.advance(10_000);
    let recovered = h.start_all();
    assert_eq!(recovered, vec![(package(), node("b"))]);
}

#[test]
fn a_refused_target_start_of_a_member_rolls_the_group_back_and_keeps_both_sources() {
    let mut h = ch1_on_a();
    let enc = migrate(&mut h, &encode(), MigrationStrategy::Overlap);
    let pkg = state(&h, &enc).group[0].migration_id.clone();
    for (id, rpc) in h.take_calls() {
        match rpc {
            Rpc::StartMigrationTarget { job_id, .. } if job_id == package() => h.fail(id, RpcFailureKind::Rejected),
            _ => h.ok(id),
        }
    }
    assert_eq!(state(&h, &pkg).phase, MigrationPhase::Aborted);
    assert_eq!(state(&h, &enc).phase, MigrationPhase::Aborted);
    assert_eq!(h.bound_node(&encode()), Some(node("a")));
    assert_eq!(h.bound_node(&package()), Some(node("a")));
}

#[test]
fn a_node_interrupted_notification_carries_each_key_once() {
    let mut h = ch1_on_a();
    h.take_notifications();
    let deadline = h.now + 120_000;
    interrupt(&mut h, "a", deadline);
    let interrupted = h
        .take_notifications()
        .into_iter()
        .find(|n| matches!(n, Notification::NodeInterrupted(_)))
        .expect("nodeInterrupted fires");
    let line = serde_json::to_string(&interrupted).expect("encodes");
    // A last-wins JSON reader must see the callback's name under `kind`.
    assert_eq!(line.matches("\"kind\"").count(), 1, "{line}");
    let value: serde_json::Value = serde_json::from_str(&line).expect("decodes");
    assert_eq!(value["kind"], "nodeInterrupted", "{line}");
    assert_eq!(value["interruptionKind"], "spot-interruption", "{line}");
    assert_eq!(value["nodeId"], "a", "{line}");
}

#[test]
fn a_member_that_arrived_ahead_of_its_group_does_not_move_again_until_the_group_has_arrived() {
    let mut h = ch1_on_a();
    let enc = migrate(&mut h, &encode(), MigrationStrategy::Overlap);
    let pkg = state(&h, &enc).group[0].migration_id.clone();
    calls(&mut h);
    make_ready(&mut h, &pkg);
    calls(&mut h);
    assert_eq!(state(&h, &pkg).phase, MigrationPhase::AwaitingGroup);
    // `package`'s source fails with its target running: it lands there
    // ahead of `encode`, which is still on its way.
    h.failed(&package(), &node("a"));
    assert_eq!(state(&h, &pkg).phase, MigrationPhase::Done);
    assert_eq!(h.bound_node(&package()), Some(node("b")));
    assert_eq!(state(&h, &enc).phase, MigrationPhase::Starting);
    let refusal = try_migrate(&mut h, &package(), options(MigrationStrategy::Overlap));
    match refusal {
        Err(CommandError::Migration(MigrationRefusal::GroupCannotMove { reason, .. })) => {
            assert!(reason.contains("ch1/0/encode is still moving"), "{reason}")
        }
        other => panic!("a second move of the group is refused while it moves: {other:?}"),
    }
    // The group arrives together on `b`, and may then move again, whole.
    make_ready(&mut h, &enc);
    calls(&mut h);
    finish(&mut h, &enc);
    assert_eq!(state(&h, &enc).phase, MigrationPhase::Done);
    assert_eq!(h.bound_node(&encode()), Some(node("b")));
    assert_eq!(h.bound_node(&package()), Some(node("b")));
    let again = migrate(&mut h, &package(), MigrationStrategy::Overlap);
    assert_eq!(
        state(&h, &again).group.len(),
        1,
        "the whole group moves: {:?}",
        state(&h, &again)
    );
}

#[test]
fn a_member_that_fails_beside_its_running_group_rejoins_it_on_its_node() {
    let mut h = ch1_on_a();
    h.failed(&package(), &node("a"));
    h.advance(10_000);
    let recovered = h.start_all();
    assert_eq!(
        recovered,
        vec![(package(), node("a"))],
        "placed beside encode, the only node co-location allows it"
    );
}
