//! Recovery of a failed or rejected runtime: the replacement waits for the
//! failed instance to stop (up to its grace), attempts are spaced by
//! `MIN_RECOVERY_INTERVAL_MS`, and it keeps away from the node it failed on
//! unless nowhere else fits; an invalid spec is terminal, any other
//! rejection re-placed.

use norsk_auto_manager::automanager::{Notification, RpcFailureKind};
use norsk_auto_manager::model::{InstanceKey, ManagerEvent, NodeId, ProviderKind, RejectionCode};

use crate::support::scenario::*;
use crate::support::*;

#[test]
fn consecutive_recoveries_are_spaced_by_min_recovery_interval() {
    let (mut h, job, node) = placed_and_running();
    h.failed(&job, &node);
    let calls = h.take_calls();
    let starts = start_jobs(&calls);
    assert_eq!(starts.len(), 1, "the first recovery waits for nothing");
    h.ok(calls[0].0);
    let second = NodeId(starts[0].1.clone());
    h.running(&job, &second);
    h.advance(1_000);
    h.failed(&job, &second);
    h.advance(3_000);
    assert!(
        h.take_calls().is_empty(),
        "recovered twice inside MIN_RECOVERY_INTERVAL_MS"
    );
    h.advance(1_000);
    assert_eq!(start_jobs(&h.take_calls()).len(), 1);
}

#[test]
fn replacement_waits_for_the_failed_instance_to_stop() {
    let (mut h, job, node) = placed_and_running();
    h.failing(&job, &node);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "the replacement was started while the failed instance (same instance key) was still stopping"
    );
    assert!(
        kinds(&h.take_notifications()).iter().all(|k| k != "placementDecision"),
        "placed before the failed instance stopped"
    );
    h.stopped(&job, &node, InstanceKey("primary".into()));
    let starts = start_jobs(&h.take_calls());
    assert_eq!(
        starts.len(),
        1,
        "the replacement starts as soon as the failed instance has stopped"
    );
    assert_ne!(
        starts[0].1, node.0,
        "the replacement went back to the node it failed on"
    );
}

#[test]
fn replacement_of_a_stopping_instance_starts_once_its_node_is_gone() {
    let (mut h, job, node) = placed_and_running();
    h.failing(&job, &node);
    assert!(start_jobs(&h.take_calls()).is_empty());
    h.event(ManagerEvent::NodeStopped(node.clone()));
    assert_eq!(
        start_jobs(&h.take_calls()).len(),
        1,
        "the node's loss ended the failed instance"
    );
}

#[test]
fn replacement_waits_for_a_silent_failed_instance_only_up_to_its_grace() {
    let (mut h, job, node) = placed_and_running();
    h.failing(&job, &node);
    h.take_notifications();
    // FAILED_INSTANCE_STOP_GRACE_MS: the worker never reports Stopped.
    h.advance(29_999);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "started before the grace ran out"
    );
    h.advance(1);
    let starts = start_jobs(&h.take_calls());
    assert_eq!(starts.len(), 1, "the replacement waited for good");
    assert_ne!(starts[0].1, node.0);
    let errors: Vec<_> = h
        .take_notifications()
        .into_iter()
        .filter_map(|n| match n {
            Notification::Error { message } => Some(message),
            _ => None,
        })
        .collect();
    assert!(
        errors.iter().any(|m| m.contains("did not report Stopped")),
        "the silent instance was not reported: {errors:?}"
    );
}

#[test]
fn invalid_spec_is_terminal_on_first_rejection() {
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    h.ok_all();
    h.take_notifications();
    let job = job_id("b", 0, "encode");
    reject(&mut h, &job, "a", RejectionCode::InvalidSpec, "unknown codec h266");
    h.advance(60_000);
    assert!(start_jobs(&h.take_calls()).is_empty(), "an invalid spec was retried");
    let notes = h.take_notifications();
    let dropped = notes.iter().find_map(|n| match n {
        Notification::JobDropped { reason, .. } => Some(reason.clone()),
        _ => None,
    });
    assert_eq!(dropped.as_deref(), Some("unknown codec h266"), "not the worker's words");
    assert!(
        notes
            .iter()
            .any(|n| matches!(n, Notification::BundleBroken { reason, .. } if reason == "unknown codec h266"))
    );
    assert_eq!(h.core.metrics(h.now).counters.jobs_rejected, 1);
}

#[test]
fn a_rejected_job_is_re_placed_on_another_node() {
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    h.ok_all();
    let job = job_id("b", 0, "encode");
    reject(&mut h, &job, "a", RejectionCode::PortInUse, "1935/tcp in use");
    assert_eq!(start_jobs(&h.take_calls()), vec![(job.0.clone(), "b".to_owned())]);
}

#[test]
fn a_recovery_keeps_away_from_the_failed_node_after_a_refused_provision() {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("b", ONE_JOB);
    let job = job_id("b", 0, "encode");
    h.start_all();
    h.failed(&job, &NodeId::from("a"));
    let calls = h.take_calls();
    let (aws, _, _) = create_node(&calls).expect("the recovery provisions: `a` is excluded");
    h.fail(calls[0].0, RpcFailureKind::InsufficientCapacity);
    h.advance(5_000);
    let calls = h.take_calls();
    assert!(start_jobs(&calls).is_empty(), "sent back to the node it failed on");
    let (oci, provider, _) = create_node(&calls).expect("the cascade spills on");
    assert_ne!(oci, aws);
    assert_eq!(provider, ProviderKind::Oci);
}

#[test]
fn a_recovery_with_nowhere_else_to_go_returns_to_the_node_it_failed_on() {
    // The recovery keeps off the node the job failed on while another can
    // take it; when none can, the next attempt (MIN_RECOVERY_INTERVAL_MS
    // on) may use it, rather than leaving the channel dark while that
    // node could carry it.
    use norsk_auto_manager::automanager::recovery::MIN_RECOVERY_INTERVAL_MS;
    let mut settings = settings();
    settings.placement_pools = yaml_serde::from_str(
        "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n",
    )
    .unwrap();
    let mut h = Harness::with(settings);
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("b", ONE_JOB);
    let (job, node) = h.start_all().remove(0);
    h.take_notifications();
    h.failed(&job, &node);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "not straight back onto the node it failed on"
    );
    assert!(kinds(&h.take_notifications()).contains(&"placementFailed".to_owned()));
    h.advance(MIN_RECOVERY_INTERVAL_MS);
    let placed = start_jobs(&h.take_calls());
    assert_eq!(placed.len(), 1, "placed again once nowhere else could take it");
    assert_eq!(h.bound_node(&job), Some(node));
}
