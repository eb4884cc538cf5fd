//! Scenario tests of maintenance drains, an extension of the spec's
//! drain-then-terminate: a drain with `after: keep` empties its node and
//! keeps it, cordoned and running, for planned work; it is the default for
//! registered cluster servers (nodes of a `local-servers` tier), while any
//! other node's drain still terminates it by default.

use norsk_auto_manager::automanager::{
    Command, DrainAfter, DrainJobStatus, DrainOptions, DrainPhase, DrainState, InterruptionNotice, MigrationStrategy,
    Notification, StrategyFor,
};
use norsk_auto_manager::model::{InterruptionKind, JobId, ManagerEvent, NodeId, ProviderKind, tags};

use crate::support::migration::{run_overlaps, terminates};
use crate::support::*;

/// Three jobs of one capacity each.
const THREE_JOBS: &str = "pool: production\njobs:\n  - {jobName: j0, requirements: {requiredCapacity: 1}}\n  - {jobName: j1, requirements: {requiredCapacity: 1}}\n  - {jobName: j2, requirements: {requiredCapacity: 1}}\n";

fn node(id: &str) -> NodeId {
    NodeId::from(id)
}

/// The jobs of [`THREE_JOBS`] running on `on`, placed while every node in
/// `others` was cordoned.
fn three_jobs_on(h: &mut Harness, on: &str, others: &[&str]) -> Vec<JobId> {
    for other in others {
        h.command(Command::CordonNode(node(other)));
    }
    h.bundle("b1", THREE_JOBS);
    let started = h.start_all();
    for other in others {
        h.command(Command::UncordonNode(node(other)));
    }
    assert!(
        started.iter().all(|(_, n)| n == &node(on)),
        "placed on {on}: {started:?}"
    );
    h.take_replies();
    h.take_notifications();
    started.into_iter().map(|(job, _)| job).collect()
}

/// Overlap for every job, `after` as given.
fn overlap(after: Option<DrainAfter>) -> DrainOptions {
    DrainOptions {
        strategy_for: StrategyFor::all(MigrationStrategy::Overlap),
        after,
        ..DrainOptions::default()
    }
}

fn drain(h: &mut Harness, on: &str, options: DrainOptions) {
    let id = h.command(Command::DrainNode {
        node_id: node(on),
        options,
    });
    let replies: Vec<_> = h.take_replies().into_iter().filter(|(reply, _)| *reply == id).collect();
    assert!(matches!(&replies[..], [(_, Ok(_))]), "the drain starts: {replies:?}");
}

fn status(h: &Harness, on: &str) -> DrainState {
    h.core.drain_status(&node(on)).expect("a drain of the node").clone()
}

fn terminated_notices(notifications: &[Notification]) -> usize {
    notifications
        .iter()
        .filter(|n| matches!(n, Notification::NodeTerminated { .. }))
        .count()
}

/// A cloud node `c1` of the `aws` tier beside cluster server `b`.
fn cloud_node_beside_a_cluster_server() -> Harness {
    let mut h = Harness::new();
    h.cluster_node("b", 4.0);
    h.provisioned_node_starts(
        "c1",
        ProviderKind::Aws,
        &[(tags::POOL, "production"), (tags::TIER, "aws")],
    );
    h.event(ManagerEvent::InitialDataComplete);
    h
}

/// The spec's drain: "terminates the node once it is empty — through the
/// same path as `terminateNode`, so `onNodeTerminated` fires once", for a
/// registered cluster server as for any node.
#[test]
fn a_cluster_server_drained_without_after_is_terminated_as_the_spec_says() {
    let mut h = Harness::hydrated();
    three_jobs_on(&mut h, "a", &["b"]);
    drain(&mut h, "a", overlap(None));
    assert_eq!(status(&h, "a").after, DrainAfter::Terminate);
    run_overlaps(&mut h);
    assert_eq!(status(&h, "a").phase, DrainPhase::Done);
    assert!(
        h.core.fleet().get(&node("a")).is_none_or(|n| n.terminated),
        "the cluster server was terminated"
    );
    assert_eq!(
        terminated_notices(&h.take_notifications()),
        1,
        "onNodeTerminated fires once"
    );
}

#[test]
fn a_maintenance_drain_of_a_cluster_server_ends_done_with_nothing_terminated_and_the_node_cordoned() {
    let mut h = Harness::hydrated();
    let jobs = three_jobs_on(&mut h, "a", &["b"]);
    drain(&mut h, "a", overlap(Some(DrainAfter::Keep)));
    run_overlaps(&mut h);
    let done = status(&h, "a");
    assert_eq!(done.phase, DrainPhase::Done);
    assert!(done.jobs.iter().all(|j| j.status == DrainJobStatus::Migrated));
    for job in &jobs {
        assert_eq!(h.bound_node(job), Some(node("b")));
    }
    assert!(terminates(&h.ok_all()).is_empty(), "nothing terminated");
    assert_eq!(terminated_notices(&h.take_notifications()), 0);
    assert!(h.core.is_cordoned(&node("a")), "the node stays cordoned");
    assert!(
        h.core.fleet().get(&node("a")).is_some_and(|n| !n.terminated),
        "the node stays running"
    );
}

#[test]
fn uncordon_returns_a_kept_node_to_service() {
    let mut h = Harness::hydrated();
    three_jobs_on(&mut h, "a", &["b"]);
    drain(&mut h, "a", overlap(Some(DrainAfter::Keep)));
    run_overlaps(&mut h);
    assert_eq!(status(&h, "a").phase, DrainPhase::Done);
    h.command(Command::UncordonNode(node("a")));
    assert!(!h.core.is_cordoned(&node("a")));
    assert_eq!(status(&h, "a").phase, DrainPhase::Done, "the ended drain stays done");
    // b is full enough that the next job lands on a again.
    h.command(Command::CordonNode(node("b")));
    h.bundle(
        "b2",
        "pool: production\njobs:\n  - {jobName: j0, requirements: {requiredCapacity: 1}}\n",
    );
    let started = h.start_all();
    assert_eq!(
        started.iter().map(|(_, n)| n.clone()).collect::<Vec<_>>(),
        vec![node("a")]
    );
}

#[test]
fn a_cloud_nodes_default_drain_still_terminates() {
    let mut h = cloud_node_beside_a_cluster_server();
    three_jobs_on(&mut h, "c1", &["b"]);
    drain(&mut h, "c1", overlap(None));
    assert_eq!(status(&h, "c1").after, DrainAfter::Terminate);
    run_overlaps(&mut h);
    let done = status(&h, "c1");
    assert_eq!(done.phase, DrainPhase::Done, "{done:?}");
    assert!(
        h.core.fleet().get(&node("c1")).is_none_or(|n| n.terminated),
        "the cloud node was terminated"
    );
    assert_eq!(terminated_notices(&h.take_notifications()), 1);
}

#[test]
fn a_cluster_server_drained_with_after_terminate_is_terminated() {
    let mut h = Harness::hydrated();
    three_jobs_on(&mut h, "a", &["b"]);
    drain(&mut h, "a", overlap(Some(DrainAfter::Terminate)));
    run_overlaps(&mut h);
    assert_eq!(status(&h, "a").phase, DrainPhase::Done);
    assert_eq!(terminated_notices(&h.take_notifications()), 1);
}

#[test]
fn a_cloud_node_drained_with_after_keep_is_kept() {
    let mut h = cloud_node_beside_a_cluster_server();
    three_jobs_on(&mut h, "c1", &["b"]);
    drain(&mut h, "c1", overlap(Some(DrainAfter::Keep)));
    run_overlaps(&mut h);
    assert_eq!(status(&h, "c1").phase, DrainPhase::Done);
    assert_eq!(terminated_notices(&h.take_notifications()), 0);
    assert!(h.core.is_cordoned(&node("c1")));
}

#[test]
fn an_interruption_during_a_maintenance_drain_terminates_the_node() {
    let mut h = Harness::hydrated();
    three_jobs_on(&mut h, "a", &["b"]);
    drain(&mut h, "a", overlap(Some(DrainAfter::Keep)));
    assert_eq!(status(&h, "a").after, DrainAfter::Keep);
    let deadline = h.now + 120_000;
    h.command(Command::HandleNodeInterruption {
        node_id: node("a"),
        notice: InterruptionNotice {
            kind: InterruptionKind::SpotInterruption,
            deadline: Some(deadline),
            strategy_for: StrategyFor::default(),
        },
    });
    let tightened = status(&h, "a");
    assert!(tightened.force);
    assert_eq!(tightened.after, DrainAfter::Terminate, "the provider takes the node");
    run_overlaps(&mut h);
    assert_eq!(status(&h, "a").phase, DrainPhase::Done);
    assert_eq!(terminated_notices(&h.take_notifications()), 1);
}
