//! What becomes of nodes: a lost node's jobs are recovered elsewhere,
//! repeated rejections make a node unhealthy until a job runs there or its
//! cooldown passes, a `singleUse` job's provisioned node is released once
//! empty, and stopped or terminated nodes are swept and forgotten.

use norsk_auto_manager::automanager::{Notification, Rpc, RpcFailureKind};
use norsk_auto_manager::model::{
    InstanceKey, JobHistoryEntry, ManagerEvent, NodeId, NodeStopReason, ProviderKind, RejectionCode, Slot, VerdictKind,
    tags,
};

use crate::support::scenario::*;
use crate::support::*;

#[test]
fn node_stopped_without_stopping_recovers_jobs() {
    let (mut h, job, node) = placed_and_running();
    h.event(ManagerEvent::NodeStopped(node.clone()));
    let starts = start_jobs(&h.take_calls());
    assert_eq!(starts, vec![(job.0.clone(), "b".to_owned())]);
    let decision = h.take_notifications().into_iter().find_map(|n| match n {
        Notification::PlacementDecision(info) => Some(info),
        _ => None,
    });
    assert!(decision.expect("placement ran").recovery, "not placed as a recovery");
}

#[test]
fn node_stopping_recovers_jobs_away_from_the_node() {
    let (mut h, job, node) = placed_and_running();
    assert_eq!(node.as_str(), "a");
    h.node_stopping("a", NodeStopReason::HealthPingTimeExceeded);
    assert_eq!(start_jobs(&h.take_calls()), vec![(job.0.clone(), "b".to_owned())]);
    h.event(ManagerEvent::NodeStopped(node));
    assert!(h.take_calls().is_empty(), "recovered twice for one node loss");
}

#[test]
fn repeated_rejections_make_a_node_unhealthy_until_a_job_runs_there() {
    let mut h = Harness::hydrated();
    h.bundle("x", ONE_JOB);
    h.ok_all();
    let x = job_id("x", 0, "encode");
    assert_eq!(h.bound_node(&x), Some(NodeId::from("a")));
    for other in ["o1", "o2", "o3"] {
        reject(&mut h, &job_id(other, 0, "j"), "a", RejectionCode::PortInUse, "busy");
    }
    assert!(kinds(&h.take_notifications()).contains(&"nodeUnhealthy".to_owned()));
    // `a` has room (2 of 4 used) and binpack prefers it, but it is excluded.
    h.bundle("y", ONE_JOB);
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![("y/0/encode".to_owned(), "b".to_owned())]
    );
    h.running(&x, &NodeId::from("a"));
    assert!(kinds(&h.take_notifications()).contains(&"nodeHealthy".to_owned()));
}

#[test]
fn unhealthy_node_is_readmitted_after_its_cooldown() {
    let mut h = Harness::hydrated();
    for other in ["o1", "o2", "o3"] {
        reject(&mut h, &job_id(other, 0, "j"), "a", RejectionCode::PortInUse, "busy");
    }
    h.take_notifications();
    h.advance(600_000);
    assert!(kinds(&h.take_notifications()).contains(&"nodeHealthy".to_owned()));
    h.bundle("y", ONE_JOB);
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![("y/0/encode".to_owned(), "a".to_owned())]
    );
}

#[test]
fn single_use_node_is_terminated_when_its_job_ends() {
    let mut h = empty_hydrated();
    h.bundle("b", SINGLE_USE);
    let calls = h.take_calls();
    let (node, _, node_tags) = create_node(&calls).unwrap();
    h.ok(calls[0].0);
    let t: Vec<(&str, &str)> = node_tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    h.provisioned_node_starts(node.as_str(), ProviderKind::Aws, &t);
    h.start_all();
    h.take_notifications();
    job_ends(&mut h, &job_id("b", 0, "encode"));
    assert!(
        h.take_calls()
            .iter()
            .any(|(_, r)| matches!(r, Rpc::TerminateNode { node_id } if *node_id == node))
    );
    assert!(kinds(&h.take_notifications()).contains(&"nodeTerminated".to_owned()));
}

#[test]
fn a_node_a_single_use_job_left_is_not_released_while_the_snapshot_shows_another_job_on_it() {
    // Replaying the snapshot, the single-use job's failure (it is dropped)
    // is read before its co-located peer's instance: whether the node is
    // empty is known only once every job has been read.
    let mut h = Harness::new();
    let node_tags = [
        (tags::POOL, "production"),
        (tags::TIER, "aws"),
        (tags::PROVISIONED_FOR, "b/0/encode"),
    ];
    h.event(ManagerEvent::NodeStarted(node_info("production-aws-3", &node_tags)));
    h.event(ManagerEvent::NodeInventory {
        node_id: NodeId::from("production-aws-3"),
        inventory: inventory(ProviderKind::Aws, 4.0),
    });
    let b = bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, exclusive: true, singleUse: true, requirements: {requiredCapacity: 2, essential: false, onRuntimeFailure: drop}}\n  - {jobName: package, coLocateWith: [encode], requirements: {requiredCapacity: 1}}\n",
    );
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    let node = Some(NodeId::from("production-aws-3"));
    let role = InstanceKey::slot(Slot::Primary);
    for mut job in jobs_of(&b) {
        job.history.push(JobHistoryEntry::Running {
            at: Some(h.now),
            role: role.clone(),
            node_id: node.clone(),
        });
        if job.job_id == job_id("b", 0, "encode") {
            job.history.push(JobHistoryEntry::Stopping {
                at: Some(h.now),
                role: role.clone(),
                node_id: node.clone(),
                reason: norsk_auto_manager::model::JobStopReason::JobFailed,
            });
            job.history.push(JobHistoryEntry::Stopped {
                at: Some(h.now),
                role: role.clone(),
                node_id: node.clone(),
            });
            job.terminal_verdict = Some(norsk_auto_manager::model::TerminalVerdict {
                kind: VerdictKind::Dropped,
                reason: "onRuntimeFailure is drop".into(),
                at: Some(h.now),
            });
        }
        h.event(ManagerEvent::JobActive(job));
    }
    h.event(ManagerEvent::InitialDataComplete);
    let terminates = |calls: &[(norsk_auto_manager::automanager::RequestId, Rpc)]| {
        calls.iter().any(|(_, r)| matches!(r, Rpc::TerminateNode { .. }))
    };
    assert!(!terminates(&h.take_calls()), "the node still carries a job");
    let package = job_id("b", 0, "package");
    assert_eq!(h.bound_node(&package), node);
    job_ends(&mut h, &package);
    assert!(terminates(&h.take_calls()), "released once its last job has left");
}

#[test]
fn single_use_never_terminates_a_cluster_node() {
    let mut h = Harness::hydrated();
    h.bundle("b", SINGLE_USE);
    h.start_all();
    job_ends(&mut h, &job_id("b", 0, "encode"));
    assert!(
        !h.take_calls()
            .iter()
            .any(|(_, r)| matches!(r, Rpc::TerminateNode { .. }))
    );
}

#[test]
fn stopped_nodes_are_swept_after_remove_stopped_nodes_after() {
    let mut h = Harness::hydrated();
    h.node_stopping("a", NodeStopReason::ProviderStop);
    h.event(ManagerEvent::NodeStopped(NodeId::from("a")));
    h.node_stopping("b", NodeStopReason::HealthPingTimeExceeded);
    h.event(ManagerEvent::NodeStopped(NodeId::from("b")));
    h.take_notifications();
    h.advance(3_599_000);
    assert!(h.core.fleet().contains(&NodeId::from("a")));
    h.advance(1_000);
    let terminates: Vec<_> = h
        .take_calls()
        .into_iter()
        .filter_map(|(_, r)| match r {
            Rpc::TerminateNode { node_id } => Some(node_id),
            _ => None,
        })
        .collect();
    assert_eq!(
        terminates,
        vec![NodeId::from("a")],
        "only the provider-stopped instance still exists"
    );
    assert!(!h.core.fleet().contains(&NodeId::from("a")));
    assert!(!h.core.fleet().contains(&NodeId::from("b")));
}

#[test]
fn a_terminated_node_manager_no_longer_knows_is_forgotten() {
    let mut h = empty_hydrated();
    h.bundle("b", ONE_JOB);
    let calls = h.take_calls();
    let (node, _, _) = create_node(&calls).unwrap();
    h.ok(calls[0].0);
    h.advance(600_000);
    let terminate = h
        .take_calls()
        .into_iter()
        .find(|(_, r)| matches!(r, Rpc::TerminateNode { .. }))
        .expect("terminated past its startup grace");
    assert!(h.core.fleet().contains(&node));
    h.fail(terminate.0, RpcFailureKind::NotFound);
    assert!(
        !h.core.fleet().contains(&node),
        "it would count against maxNodes forever"
    );
}

#[test]
fn a_single_use_job_s_node_is_released_once_its_co_located_peer_has_left_too() {
    let mut h = empty_hydrated();
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, exclusive: true, singleUse: true, requirements: {requiredCapacity: 2}}\n  - {jobName: package, coLocateWith: [encode], requirements: {requiredCapacity: 1}}\n",
    );
    let calls = h.take_calls();
    let (node, _, node_tags) = create_node(&calls).expect("one node for the pair");
    h.ok(calls[0].0);
    let t: Vec<(&str, &str)> = node_tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    h.provisioned_node_starts(node.as_str(), ProviderKind::Aws, &t);
    assert_eq!(h.start_all().len(), 2);
    let terminated = |calls: &[(norsk_auto_manager::automanager::RequestId, Rpc)]| {
        calls
            .iter()
            .any(|(_, r)| matches!(r, Rpc::TerminateNode { node_id } if *node_id == node))
    };
    job_ends(&mut h, &job_id("b", 0, "encode"));
    assert!(!terminated(&h.take_calls()), "terminated under its co-located peer");
    job_ends(&mut h, &job_id("b", 0, "package"));
    assert!(
        terminated(&h.take_calls()),
        "the single-use job's node is left for reuse once empty"
    );
}

#[test]
fn an_unhealthy_node_s_cooldown_is_the_timer_an_idle_core_waits_for() {
    let mut h = Harness::hydrated();
    assert_eq!(h.next_deadline, None, "an idle core asked to be woken");
    for other in ["o1", "o2", "o3"] {
        reject(&mut h, &job_id(other, 0, "j"), "a", RejectionCode::PortInUse, "busy");
    }
    assert!(kinds(&h.take_notifications()).contains(&"nodeUnhealthy".to_owned()));
    // `unhealthyCooldownMs` (default 10 min) is the next thing due, and
    // nothing sooner: the runtime sleeps until then.
    assert_eq!(h.next_deadline, Some(h.now + 600_000));
}

#[test]
fn a_single_rejection_does_not_mark_the_node() {
    let mut h = Harness::hydrated();
    reject(&mut h, &job_id("o1", 0, "j"), "a", RejectionCode::PortInUse, "busy");
    assert!(!kinds(&h.take_notifications()).contains(&"nodeUnhealthy".to_owned()));
    // `a` and `b` tie; the node id decides, so `a` still takes placements.
    h.bundle("y", ONE_JOB);
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![("y/0/encode".to_owned(), "a".to_owned())]
    );
}

#[test]
fn rejections_further_apart_than_rejection_backoff_ms_never_make_a_node_unhealthy() {
    let mut h = Harness::hydrated();
    // Three rejections (`rejectionEscalationCount`), but never three inside
    // 5 s (`rejectionBackoffMs`).
    for (i, other) in ["o1", "o2", "o3", "o4"].into_iter().enumerate() {
        if i > 0 {
            h.advance(3_000);
        }
        reject(&mut h, &job_id(other, 0, "j"), "a", RejectionCode::PortInUse, "busy");
    }
    assert!(!kinds(&h.take_notifications()).contains(&"nodeUnhealthy".to_owned()));
    h.bundle("y", ONE_JOB);
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![("y/0/encode".to_owned(), "a".to_owned())]
    );
}

#[test]
fn node_healthy_is_notified_only_when_an_exclusion_cleared() {
    let mut h = Harness::hydrated();
    h.bundle("x", ONE_JOB);
    h.start_all();
    assert!(
        !kinds(&h.take_notifications()).contains(&"nodeHealthy".to_owned()),
        "a job running on a node that was never excluded reported it healthy"
    );
}
