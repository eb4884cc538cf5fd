//! A core following Manager (a standby, or a fresh process hydrating)
//! adopts what runs, and once it leads judges what no leader acted on: a
//! node lost meanwhile (per `onRuntimeFailure`, counted against the restart
//! ceiling unless a bundle update came after) and a `drop` verdict that
//! landed on an instance it adopted.

use norsk_auto_manager::automanager::{CommandError, Notification, Rpc};
use norsk_auto_manager::model::{InstanceKey, JobHistoryEntry, JobId, ManagerEvent, NodeId, Slot, VerdictKind, tags};

use crate::support::scenario::*;
use crate::support::*;

/// A core following Manager's snapshot (cluster nodes `a`, `b`) that has
/// adopted bundle `b`'s job `encode` (spec `spec`) running on `a`; with the
/// job's runtime as Manager sent it.
fn adopted_while_following(spec: &str) -> (Harness, JobId, norsk_auto_manager::model::RuntimeJob) {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    let b = bundle("b", spec);
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    let job = job_id("b", 0, "encode");
    let mut runtime = jobs_of(&b).remove(0);
    runtime.history.push(JobHistoryEntry::Running {
        at: Some(h.now),
        role: InstanceKey::slot(Slot::Primary),
        node_id: Some(NodeId::from("a")),
    });
    h.event(ManagerEvent::JobActive(runtime.clone()));
    assert_eq!(
        h.bound_node(&job),
        Some(NodeId::from("a")),
        "adopted from Manager's history"
    );
    (h, job, runtime)
}

/// A core following Manager (a standby, or a fresh process hydrating) whose
/// job runs on `a`: node `a` goes before the core is hydrated — after its
/// leader died, so no one judged the loss.
fn lost_while_following(spec: &str) -> (Harness, JobId) {
    let (mut h, job, _) = adopted_while_following(spec);
    h.advance(1_000);
    h.event(ManagerEvent::NodeStopped(NodeId::from("a")));
    (h, job)
}

#[test]
fn a_loss_no_leader_judged_is_judged_once_hydrated_drop_ends_the_job() {
    // "`drop` has no ceiling entry: it never restarts." A standby promoted
    // after its leader died must not start the job afresh as if it had
    // never run.
    let (mut h, job) = lost_while_following(
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1, essential: false, onRuntimeFailure: drop}}\n",
    );
    assert!(
        h.take_notifications()
            .iter()
            .all(|n| !matches!(n, Notification::JobDropped { .. }))
    );
    h.event(ManagerEvent::InitialDataComplete);
    let notifications = h.take_notifications();
    assert!(
        notifications
            .iter()
            .any(|n| matches!(n, Notification::JobDropped { job_id, .. } if *job_id == job)),
        "the loss is judged: {notifications:?}"
    );
    let calls = h.take_calls();
    assert!(
        start_jobs(&calls).is_empty(),
        "a dropped job is not started again: {calls:?}"
    );
    assert!(calls.iter().any(|(_, r)| matches!(
        r,
        Rpc::SetTerminalVerdict { job_id: Some(j), verdict, .. } if *j == job && verdict.kind == VerdictKind::Dropped
    )));
}

#[test]
fn a_loss_no_leader_judged_ends_a_drop_job_even_with_a_node_launching_for_it() {
    // A node the dead leader asked for the job (an aborted migration's
    // target, say) was asked for before the loss: it is no placement
    // after it. "`drop` never restarts": the job ends, the node is not
    // its.
    let (mut h, job) = lost_while_following(
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1, essential: false, onRuntimeFailure: drop}}\n",
    );
    let mut info = node_info(
        "production-aws-old-1",
        &[
            (tags::POOL, "production"),
            (tags::TIER, "aws"),
            (tags::PROVISIONED_FOR, job.as_str()),
        ],
    );
    info.created_at = Some(h.now - 500);
    h.event(ManagerEvent::NodeStarting(info));
    h.event(ManagerEvent::InitialDataComplete);
    let notifications = h.take_notifications();
    assert!(
        notifications
            .iter()
            .any(|n| matches!(n, Notification::JobDropped { job_id, .. } if *job_id == job)),
        "the loss is judged: {notifications:?}"
    );
    assert_eq!(h.bound_node(&job), None, "a dropped job holds no node");
    let calls = h.take_calls();
    assert!(
        start_jobs(&calls).is_empty(),
        "a dropped job is not started again: {calls:?}"
    );
}

#[test]
fn a_loss_no_leader_judged_is_judged_once_hydrated_and_counts_against_the_ceiling() {
    // The re-placing policies recover the job away from the lost node, and
    // the loss counts: with a ceiling of one, the next loss breaks the
    // bundle.
    let (mut h, job) = lost_while_following(
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1, maxRestartsPerHour: 1}}\n",
    );
    h.event(ManagerEvent::InitialDataComplete);
    let calls = h.take_calls();
    assert_eq!(
        start_jobs(&calls),
        vec![(job.0.clone(), "b".to_owned())],
        "recovered on the node that is left"
    );
    h.ok_all();
    h.running(&job, &NodeId::from("b"));
    h.advance(10_000);
    h.failed(&job, &NodeId::from("b"));
    let notifications = h.take_notifications();
    assert!(
        notifications
            .iter()
            .any(|n| matches!(n, Notification::BundleBroken { bundle_id, .. } if bundle_id.as_str() == "b")),
        "the loss while following counted: the second one is past the ceiling: {notifications:?}"
    );
}

#[test]
fn a_loss_no_leader_judged_before_its_bundle_was_updated_does_not_count_after_the_update() {
    // "The history clears when the bundle is updated": a loss seen while
    // following, then an update, leaves nothing counted. With a ceiling of
    // one, one failure after the update is a restart, not a break.
    let (mut h, job) = lost_while_following(
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1, maxRestartsPerHour: 1}}\n",
    );
    let mut updated = h
        .core
        .bundles()
        .find(|b| b.bundle_id.as_str() == "b")
        .expect("bundle known")
        .clone();
    updated.generation += 1;
    h.event(ManagerEvent::BundleUpdated(updated));
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(start_jobs(&h.take_calls()).len(), 1, "placed again after the update");
    h.ok_all();
    let node = h.bound_node(&job).expect("placed");
    h.running(&job, &node);
    h.advance(10_000);
    h.failed(&job, &node);
    let notifications = h.take_notifications();
    assert!(
        notifications
            .iter()
            .all(|n| !matches!(n, Notification::BundleBroken { .. })),
        "the loss before the update does not count: {notifications:?}"
    );
}

#[test]
fn a_loss_its_leader_recovered_before_promotion_is_not_judged_again() {
    // The leader saw the loss and placed the job on `b` (Manager's history
    // shows the new instance): it judged the loss, and its successor must
    // not count it a second time.
    let (mut h, job) = lost_while_following(
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1, maxRestartsPerHour: 1}}\n",
    );
    h.history(
        &job,
        JobHistoryEntry::Provisioned {
            at: Some(h.now),
            role: InstanceKey::slot(Slot::Primary),
            node_id: Some(NodeId::from("b")),
        },
    );
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(h.bound_node(&job), Some(NodeId::from("b")));
    assert!(start_jobs(&h.take_calls()).is_empty(), "nothing to recover");
    h.running(&job, &NodeId::from("b"));
    h.advance(10_000);
    h.failed(&job, &NodeId::from("b"));
    let notifications = h.take_notifications();
    assert!(
        !notifications
            .iter()
            .any(|n| matches!(n, Notification::BundleBroken { .. })),
        "one loss of this core's own counted: {notifications:?}"
    );
}

#[test]
fn a_drop_verdict_that_lands_on_a_job_a_successor_adopted_stops_its_instance_and_the_job_does_not_move() {
    // A leader dropped the job, but a start of it (a migration's target)
    // landed after that leader was gone, and its successor adopted the
    // instance. "`drop` never restarts": once the verdict Manager holds
    // reaches the successor, the instance is stopped, and the job is
    // neither moved nor placed again until its bundle is updated.
    let (mut h, job, runtime) = adopted_while_following(DROP_JOB);
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(h.bound_node(&job), Some(NodeId::from("a")), "adopted");
    h.take_calls();
    h.event(ManagerEvent::JobUpdated(dropped(runtime, h.now)));
    stays_stopped(h, &job);
}

#[test]
fn a_drop_verdict_that_lands_while_a_successor_follows_stops_the_instance_once_it_leads() {
    // The same, with the verdict reaching the successor before Manager's
    // initial data is complete: a follower makes no calls, so the
    // instance is stopped as it takes over, and the job is not bound.
    let (mut h, job, runtime) = adopted_while_following(DROP_JOB);
    h.event(ManagerEvent::JobUpdated(dropped(runtime, h.now)));
    assert_eq!(h.bound_node(&job), None, "a dropped job holds no node");
    assert!(h.take_calls().is_empty(), "a follower makes no calls");
    h.event(ManagerEvent::InitialDataComplete);
    stays_stopped(h, &job);
}

const DROP_JOB: &str = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1, essential: false, onRuntimeFailure: drop}}\n";

/// `runtime` with the drop verdict Manager holds.
fn dropped(
    mut runtime: norsk_auto_manager::model::RuntimeJob,
    at: norsk_auto_manager::model::UnixMillis,
) -> norsk_auto_manager::model::RuntimeJob {
    runtime.terminal_verdict = Some(norsk_auto_manager::model::TerminalVerdict {
        kind: VerdictKind::Dropped,
        reason: "onRuntimeFailure is drop".into(),
        at: Some(at),
    });
    runtime
}

/// The dropped job's instance on node `a` is being stopped, the job holds
/// no node, a move of it is refused, and it is not placed again.
fn stays_stopped(mut h: Harness, job: &JobId) {
    let calls = h.take_calls();
    assert!(
        calls
            .iter()
            .any(|(_, rpc)| matches!(rpc, Rpc::StopJob { job_id, node_id, .. }
            if job_id == job && node_id.as_str() == "a")),
        "the dropped job's instance is stopped: {calls:?}"
    );
    assert_eq!(h.bound_node(job), None, "a dropped job holds no node");
    use crate::support::migration::{options, try_migrate};
    use norsk_auto_manager::automanager::{MigrationRefusal, MigrationStrategy};
    assert_eq!(
        try_migrate(&mut h, job, options(MigrationStrategy::Overlap)),
        Err(CommandError::Migration(MigrationRefusal::JobDropped {
            job_id: job.clone()
        }))
    );
    for (id, _) in &calls {
        h.ok(*id);
    }
    h.stopped(job, &NodeId::from("a"), InstanceKey::slot(Slot::Primary));
    h.advance(60_000);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "a dropped job is not placed again"
    );
}
