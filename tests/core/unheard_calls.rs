//! Calls whose answer is lost, late or timed out: what a start, create or
//! terminate Manager may not have heard may have done is undone or sent
//! again, and a late answer never leaves an instance or a node running
//! that nothing counts (migration targets included).

use norsk_auto_manager::automanager::{Command, Notification, Rpc, RpcFailureKind};
use norsk_auto_manager::model::{InstanceKey, ManagerEvent, NodeId};

use crate::support::scenario::*;
use crate::support::*;

#[test]
fn a_start_manager_may_not_have_heard_is_undone_before_the_job_is_placed_again() {
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    let job = job_id("b", 0, "encode");
    let (id, first) = h.take_calls().remove(0);
    let Rpc::StartJob {
        instance_key, node_id, ..
    } = first
    else {
        panic!("a start")
    };
    // The call timed out: Manager may have created the instance or not.
    h.fail(id, RpcFailureKind::Transient);
    let m = h.core.metrics(h.now);
    assert_eq!(m.counters.placements_dispatch_failed, 1);
    assert!(h.bound_node(&job).is_none());
    let calls = h.take_calls();
    let stop = calls
        .iter()
        .find(|(_, rpc)| matches!(rpc, Rpc::StopJob { instance_key: k, node_id: n, .. } if *k == instance_key && *n == node_id))
        .expect("what the start may have created is stopped")
        .0;
    assert!(start_jobs(&calls).is_empty());
    h.advance(60_000);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "not placed again while that stop is on its way"
    );
    // Nothing was there.
    h.fail(stop, RpcFailureKind::NotFound);
    h.advance(5_000);
    assert_eq!(start_jobs(&h.take_calls()).len(), 1, "placed again once it is answered");
}

#[test]
fn a_terminate_manager_did_not_hear_is_sent_again_and_the_node_terminated_once() {
    let mut h = Harness::hydrated();
    h.command(Command::TerminateNode(NodeId::from("a")));
    let calls = h.take_calls();
    assert!(matches!(&calls[..], [(_, Rpc::TerminateNode { .. })]), "{calls:?}");
    h.take_notifications();
    h.fail(calls[0].0, RpcFailureKind::Transient);
    let again = h.take_calls();
    assert!(
        matches!(&again[..], [(_, Rpc::TerminateNode { node_id })] if node_id.as_str() == "a"),
        "told again: {again:?}"
    );
    assert!(
        !kinds(&h.take_notifications()).contains(&"nodeTerminated".to_owned()),
        "nodeTerminated fires once per node, when first issued"
    );
}

#[test]
fn a_node_created_after_its_provision_timed_out_is_terminated_once_it_exists() {
    let mut h = empty_hydrated();
    h.bundle("b", ONE_JOB);
    let create = h.take_calls();
    let (node, _, _) = create_node(&create).expect("a node is provisioned");
    // The create is slow: the provision times out and is given up on.
    h.advance(600_000);
    let terminate = h
        .take_calls()
        .into_iter()
        .find(|(_, r)| matches!(r, Rpc::TerminateNode { .. }))
        .expect("terminated past its provisionTimeoutMs");
    // Manager does not know the node yet; then the create goes through.
    h.fail(terminate.0, RpcFailureKind::NotFound);
    assert!(
        h.core.fleet().contains(&node),
        "forgotten while its create was on its way"
    );
    h.ok(create[0].0);
    assert!(
        h.take_calls()
            .iter()
            .any(|(_, r)| matches!(r, Rpc::TerminateNode { node_id } if *node_id == node)),
        "{node} exists now and would run on, leaked"
    );
}

/// A `stopThenStart` migration whose `startingTarget` deadline passed
/// before its `StartPreparedJob` was answered: the job was moved onto the
/// prepared target, and its start is still owed.
fn moved_onto_an_unstarted_prepared_target() -> (
    Harness,
    norsk_auto_manager::model::JobId,
    norsk_auto_manager::automanager::MigrationId,
    norsk_auto_manager::automanager::RequestId,
) {
    use crate::support::migration::*;
    use norsk_auto_manager::automanager::migration::DEFAULT_MIGRATION_START_TIMEOUT_MS;
    use norsk_auto_manager::automanager::{MigrationPhase, MigrationStrategy};
    let (mut h, job, _) = running_job();
    let id = migrate(&mut h, &job, MigrationStrategy::StopThenStart);
    calls(&mut h);
    prepared(&mut h, &id);
    calls(&mut h);
    source_stops(&mut h, &id);
    let start = h
        .take_calls()
        .into_iter()
        .find(|(_, rpc)| matches!(rpc, Rpc::StartPreparedJob { .. }))
        .expect("the prepared target is started")
        .0;
    h.advance(DEFAULT_MIGRATION_START_TIMEOUT_MS as i64);
    let s = state(&h, &id);
    assert_eq!(s.phase, MigrationPhase::Done, "failed forward onto the target");
    assert_eq!(bound(&h, &job), (s.target_node_id, s.target_key));
    h.take_notifications();
    (h, job, id, start)
}

#[test]
fn a_prepared_target_the_job_was_moved_onto_is_started_again_when_manager_did_not_hear_its_start() {
    use crate::support::migration::*;
    let (mut h, job, id, start) = moved_onto_an_unstarted_prepared_target();
    h.fail(start, RpcFailureKind::Transient);
    let s = state(&h, &id);
    let again: Vec<_> = h
        .take_calls()
        .into_iter()
        .filter(|(_, rpc)| matches!(rpc, Rpc::StartPreparedJob { instance_key, node_id, .. } if *instance_key == s.target_key && *node_id == s.target_node_id))
        .collect();
    assert_eq!(again.len(), 1, "the prepared target is told to start again");
    h.ok(again[0].0);
    target_runs(&mut h, &id);
    assert_eq!(bound(&h, &job), (s.target_node_id, s.target_key));
    assert!(
        h.core
            .job(&job)
            .and_then(|r| r.binding.as_ref())
            .is_some_and(|b| b.phase == norsk_auto_manager::automanager::binding::BindingPhase::Running)
    );
}

#[test]
fn a_prepared_target_the_job_was_moved_onto_that_cannot_start_is_stopped_and_the_job_placed_again() {
    use crate::support::migration::*;
    use norsk_auto_manager::automanager::recovery::MIN_RECOVERY_INTERVAL_MS;
    let (mut h, job, id, start) = moved_onto_an_unstarted_prepared_target();
    h.fail(start, RpcFailureKind::Rejected);
    let s = state(&h, &id);
    let after: Vec<Rpc> = h.take_calls().into_iter().map(|(_, rpc)| rpc).collect();
    assert_eq!(
        stops(&after),
        vec![(s.target_key.clone(), s.target_node_id.clone())],
        "the prepared instance is not left on its node"
    );
    assert!(h.bound_node(&job).is_none(), "the job no longer counts as placed there");
    h.advance(MIN_RECOVERY_INTERVAL_MS);
    let placed = start_jobs(&h.take_calls());
    assert_eq!(placed.len(), 1, "the job is placed again: {placed:?}");
    assert_eq!(placed[0].0, job.0);
    let b = h.core.job(&job).and_then(|r| r.binding.as_ref()).expect("bound again");
    assert_ne!(
        b.instance_key, s.target_key,
        "placed under its slot, not the stopped target's key"
    );
    let restarts = h.core.job(&job).map(|r| r.restarts.count(h.now));
    assert_eq!(restarts, Some(0), "a refused start counts no restart");
}

#[test]
fn a_node_created_although_its_create_timed_out_is_terminated_once_it_appears() {
    let mut h = empty_hydrated();
    h.bundle("b", ONE_JOB);
    let calls = h.take_calls();
    let (node, _, tags) = create_node(&calls).expect("a node is provisioned");
    // The call timed out: the provision is given up, the node forgotten.
    h.fail(calls[0].0, RpcFailureKind::Transient);
    assert!(!h.core.fleet().contains(&node), "no phantom node");
    h.take_calls();
    h.take_notifications();
    // Manager had carried the create out after all.
    let t: Vec<(&str, &str)> = tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    h.event(ManagerEvent::NodeStarting(node_info(node.as_str(), &t)));
    let calls = h.take_calls();
    assert!(
        calls
            .iter()
            .any(|(_, r)| matches!(r, Rpc::TerminateNode { node_id } if *node_id == node)),
        "the node created although its create failed is terminated: {calls:?}"
    );
    let terminated = h
        .take_notifications()
        .into_iter()
        .filter(|n| matches!(n, Notification::NodeTerminated { .. }))
        .count();
    assert_eq!(terminated, 1);
    assert_ne!(
        h.bound_node(&job_id("b", 0, "encode")),
        Some(node),
        "nothing is placed on it"
    );
}

#[test]
fn a_migration_target_whose_start_timed_out_is_stopped_with_the_migration() {
    use crate::support::migration::*;
    use norsk_auto_manager::automanager::{MigrationPhase, MigrationStrategy};
    let (mut h, job, source) = running_job();
    let id = migrate(&mut h, &job, MigrationStrategy::Overlap);
    let start = h
        .take_calls()
        .into_iter()
        .find(|(_, rpc)| matches!(rpc, Rpc::StartMigrationTarget { .. }))
        .expect("the target is started")
        .0;
    h.fail(start, RpcFailureKind::Transient);
    let s = state(&h, &id);
    assert_eq!(s.phase, MigrationPhase::Aborted);
    let after: Vec<Rpc> = h.take_calls().into_iter().map(|(_, rpc)| rpc).collect();
    assert!(
        stops(&after).contains(&(s.target_key.clone(), s.target_node_id.clone())),
        "a target Manager may have created is stopped: {after:?}"
    );
    assert_eq!(h.bound_node(&job), Some(source), "the source keeps running");
}

#[test]
fn a_late_failed_start_of_a_target_a_later_migration_is_moving_leaves_the_job_to_that_migration() {
    // "A job runs on one node": the answer to an earlier migration's start
    // arrives after a later migration took that instance as its source. It
    // must not end the binding under the later migration (the job would be
    // placed afresh beside that migration's target, on two nodes).
    use crate::support::migration::*;
    use norsk_auto_manager::automanager::MigrationStrategy;
    let (mut h, job, first, start) = moved_onto_an_unstarted_prepared_target();
    // Its start was not heard and is sent again; the target runs before
    // that second start is answered.
    h.fail(start, RpcFailureKind::Transient);
    let start = h
        .take_calls()
        .into_iter()
        .find(|(_, rpc)| matches!(rpc, Rpc::StartPreparedJob { .. }))
        .expect("the prepared target is told to start again")
        .0;
    target_runs(&mut h, &first);
    let second = migrate(&mut h, &job, MigrationStrategy::StopThenStart);
    calls(&mut h);
    prepared(&mut h, &second);
    calls(&mut h);
    source_stops(&mut h, &second);
    let restart = h
        .take_calls()
        .into_iter()
        .find(|(_, rpc)| matches!(rpc, Rpc::StartPreparedJob { .. }))
        .expect("the second migration starts its prepared target")
        .0;
    // Manager no longer has the first target: it was the second's source,
    // stopped.
    h.fail(start, RpcFailureKind::NotFound);
    let s = state(&h, &second);
    assert_eq!(
        bound(&h, &job),
        (s.source_node_id.clone(), s.source_key.clone()),
        "the job stays with the migration moving it"
    );
    h.advance(norsk_auto_manager::automanager::recovery::MIN_RECOVERY_INTERVAL_MS);
    let after = h.take_calls();
    assert!(
        start_jobs(&after).is_empty(),
        "the job was placed afresh while its migration moves it: {after:?}"
    );
    assert!(state(&h, &second).is_in_flight(), "the later migration carries on");
    h.ok(restart);
    target_runs(&mut h, &second);
    let s = state(&h, &second);
    assert_eq!(bound(&h, &job), (s.target_node_id, s.target_key));
    h.advance(60_000);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "the job runs once, on the later migration's target"
    );
}

#[test]
fn a_start_accepted_after_its_job_left_the_window_is_stopped_not_left_running() {
    // "No orphan instance": the start was in flight when the job's window
    // ended; Manager accepted it all the same. The instance it created is
    // stopped, not left running with no job to count it.
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    let job = job_id("b", 0, "encode");
    let (start, key, node) = h
        .take_calls()
        .into_iter()
        .find_map(|(id, rpc)| match rpc {
            Rpc::StartJob {
                instance_key, node_id, ..
            } => Some((id, instance_key, node_id)),
            _ => None,
        })
        .expect("the job is dispatched");
    job_ends(&mut h, &job);
    h.take_calls();
    h.ok(start);
    let stops: Vec<(InstanceKey, NodeId)> = h
        .take_calls()
        .into_iter()
        .filter_map(|(_, rpc)| match rpc {
            Rpc::StopJob {
                instance_key, node_id, ..
            } => Some((instance_key, node_id)),
            _ => None,
        })
        .collect();
    assert_eq!(
        stops,
        vec![(key, node)],
        "the instance the late start created is stopped"
    );
}
