//! Hydration: Manager's snapshot is replayed through the ordinary
//! callbacks and nothing is placed before it is complete; instances running
//! are rebound from their history, and a node still launching, or a
//! migration target, takes a job only where the history says it must.

use norsk_auto_manager::automanager::{Input, Rpc};
use norsk_auto_manager::model::{
    InstanceKey, JobHistoryEntry, JobId, JobState, ManagerEvent, NodeId, ProviderKind, Slot, VerdictKind, tags,
};

use crate::support::scenario::*;
use crate::support::*;

#[test]
fn nothing_is_placed_before_initial_data_complete() {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.bundle("b", ONE_JOB);
    assert!(h.take_calls().is_empty(), "placed before the snapshot was complete");
    assert_eq!(h.next_deadline, None, "a timer ran before hydration");
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![("b/0/encode".to_owned(), "a".to_owned())]
    );
}

#[test]
fn snapshot_is_replayed_through_the_ordinary_callbacks() {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.bundle("b", ONE_JOB);
    let kinds = kinds(&h.take_notifications());
    for expected in ["nodeStarted", "bundleUpdated", "jobUpdated"] {
        assert!(
            kinds.iter().any(|k| k == expected),
            "{expected} not replayed: {kinds:?}"
        );
    }
}

#[test]
fn hydration_rebinds_instances_from_history_without_dispatching_again() {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    let bundle = bundle("b", ONE_JOB);
    h.event(ManagerEvent::BundleUpdated(bundle.clone()));
    let mut job = jobs_of(&bundle).remove(0);
    job.history.push(JobHistoryEntry::Running {
        at: None,
        role: norsk_auto_manager::model::InstanceKey("primary".into()),
        node_id: Some(NodeId::from("a")),
    });
    h.event(ManagerEvent::JobActive(job));
    h.event(ManagerEvent::InitialDataComplete);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "a running job was started twice"
    );
    assert_eq!(h.bound_node(&job_id("b", 0, "encode")), Some(NodeId::from("a")));
}

#[test]
fn a_node_still_launching_for_a_job_takes_it_back_at_hydration() {
    let mut h = Harness::new();
    h.bundle("b", ONE_JOB);
    let job = job_id("b", 0, "encode");
    let node_tags = hydrated_with_a_node_launching_for(&mut h, &job);
    assert!(
        h.take_calls().is_empty(),
        "a second node was provisioned for a job whose node is launching"
    );
    assert_eq!(h.bound_node(&job), Some(NodeId::from("production-aws-9")));
    h.provisioned_node_starts("production-aws-9", ProviderKind::Aws, &node_tags);
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![(job.0.clone(), "production-aws-9".to_owned())]
    );
}

/// Manager's snapshot ends with `production-aws-9` launching for `job`;
/// returns the node's tags.
fn hydrated_with_a_node_launching_for<'j>(
    h: &mut Harness,
    job: &'j norsk_auto_manager::model::JobId,
) -> [(&'static str, &'j str); 3] {
    let node_tags = [
        (tags::POOL, "production"),
        (tags::TIER, "aws"),
        (tags::PROVISIONED_FOR, job.as_str()),
    ];
    h.event(ManagerEvent::NodeStarting(node_info("production-aws-9", &node_tags)));
    h.event(ManagerEvent::InitialDataComplete);
    node_tags
}

/// A node launching for `job` is in Manager's snapshot: hydration does
/// not bind the job there, and the node starts with nothing to run.
fn a_launching_node_leaves_the_job_alone(h: &mut Harness, job: &norsk_auto_manager::model::JobId) {
    let node_tags = hydrated_with_a_node_launching_for(h, job);
    assert_eq!(h.bound_node(job), None);
    h.provisioned_node_starts("production-aws-9", ProviderKind::Aws, &node_tags);
    assert!(start_jobs(&h.take_calls()).is_empty());
}

#[test]
fn a_node_still_launching_for_a_job_of_a_broken_bundle_does_not_take_it_back_at_hydration() {
    // "Stops placing every replica of it": a node provisioned for the job
    // before the bundle broke starts with nothing to run.
    let mut h = Harness::new();
    let mut broken = bundle("b", ONE_JOB);
    broken.terminal_verdict = Some(norsk_auto_manager::model::TerminalVerdict {
        kind: VerdictKind::Broken,
        reason: "restart ceiling reached".into(),
        at: None,
    });
    h.event(ManagerEvent::BundleUpdated(broken.clone()));
    for job in jobs_of(&broken) {
        h.event(ManagerEvent::JobActive(job));
    }
    a_launching_node_leaves_the_job_alone(&mut h, &job_id("b", 0, "encode"));
}

#[test]
fn a_node_still_launching_for_a_job_whose_window_is_over_does_not_take_it_back_at_hydration() {
    // The job's window ended while its node launched: bound there, it would
    // hold a job that never starts (and split it from the co-located peers
    // placed without it).
    let mut h = Harness::new();
    let b = bundle("b", ONE_JOB);
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    for mut job in jobs_of(&b) {
        job.state = JobState::Post;
        h.event(ManagerEvent::JobOutOfWindow(job));
    }
    a_launching_node_leaves_the_job_alone(&mut h, &job_id("b", 0, "encode"));
}

#[test]
fn inputs_fed_together_are_one_step_with_the_outcome_of_feeding_them_one_by_one() {
    let snapshot = || {
        let bundle = bundle("b", ONE_JOB);
        let mut events = vec![
            ManagerEvent::NodeStarted(node_info("a", &[(tags::POOL, "production")])),
            ManagerEvent::NodeInventory {
                node_id: NodeId::from("a"),
                inventory: inventory(ProviderKind::LocalServers, 4.0),
            },
            ManagerEvent::BundleUpdated(bundle.clone()),
        ];
        events.extend(jobs_of(&bundle).into_iter().map(ManagerEvent::JobActive));
        events.push(ManagerEvent::InitialDataComplete);
        events
    };
    let mut one_by_one = Harness::new();
    for event in snapshot() {
        one_by_one.event(event);
    }
    let mut together = Harness::new();
    let inputs = snapshot().into_iter().map(|e| Input::Event(Box::new(e)));
    let step = together.core.handle_all(inputs, together.now);
    let starts = |calls: Vec<(norsk_auto_manager::automanager::RequestId, Rpc)>| start_jobs(&calls);
    let batched: Vec<_> = step
        .actions
        .into_iter()
        .filter_map(|a| match a {
            norsk_auto_manager::automanager::Action::Call { id, rpc } => Some((id, rpc)),
            _ => None,
        })
        .collect();
    assert_eq!(starts(batched), starts(one_by_one.take_calls()));
    assert_eq!(
        together.core.metrics(together.now).counters.placements_attempted,
        1,
        "placed more than once for one batch"
    );
}

#[test]
fn an_older_snapshot_of_a_job_delivered_late_changes_nothing() {
    // Manager's history only grows and a window only moves on: a snapshot
    // of a job from before its latest news is stale, not a new state.
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    let job = job_id("b", 0, "encode");
    let before_running = h.core.job(&job).expect("known").job.clone();
    let (_, node) = h.start_all().remove(0);
    h.take_notifications();
    h.event(ManagerEvent::JobUpdated(before_running.clone()));
    h.advance(60_000);
    assert!(h.take_calls().is_empty(), "a stale snapshot moved the job");
    assert_eq!(h.bound_node(&job), Some(node.clone()));
    assert!(
        h.core
            .job(&job)
            .and_then(|r| r.binding.as_ref())
            .is_some_and(|b| b.phase == norsk_auto_manager::automanager::binding::BindingPhase::Running),
        "still running where it runs"
    );
    // Its window ends; the snapshot from while it was active comes late.
    let active = h.core.job(&job).expect("known").job.clone();
    job_ends(&mut h, &job);
    h.take_calls();
    h.event(ManagerEvent::JobUpdated(active));
    h.advance(60_000);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "a job whose window ended was placed again by a stale snapshot"
    );
}

/// Nodes `a` and `b` and a one-job bundle whose job's history, as Manager
/// holds it, is `history(now)`, fed to a core that is still hydrating.
fn hydrating_with_history(
    history: impl FnOnce(norsk_auto_manager::model::UnixMillis) -> Vec<JobHistoryEntry>,
) -> (Harness, JobId) {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    let b = bundle("b", ONE_JOB);
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    let mut runtime = jobs_of(&b).remove(0);
    runtime.history.extend(history(h.now));
    h.event(ManagerEvent::JobActive(runtime));
    (h, job_id("b", 0, "encode"))
}

#[test]
fn a_migration_target_that_never_ran_is_not_taken_for_the_placement_by_a_core_that_does_not_follow_its_saga() {
    // A stop-then-start migration: the old leader stopped the source and
    // died before it started the target (created with its start deferred).
    // Bound to the target, the job would never run; the new leader stops
    // it and places the job again.
    let primary = InstanceKey::slot(Slot::Primary);
    let target = InstanceKey(format!("{}@0ld7a29e", primary.as_str()));
    let (mut h, job) = hydrating_with_history(|now| {
        vec![
            JobHistoryEntry::Running {
                at: Some(now),
                role: primary.clone(),
                node_id: Some(NodeId::from("a")),
            },
            JobHistoryEntry::Provisioned {
                at: Some(now),
                role: target.clone(),
                node_id: Some(NodeId::from("b")),
            },
            JobHistoryEntry::Stopping {
                at: Some(now),
                role: primary.clone(),
                node_id: Some(NodeId::from("a")),
                reason: norsk_auto_manager::model::JobStopReason::UserRequested,
            },
            JobHistoryEntry::Stopped {
                at: Some(now),
                role: primary.clone(),
                node_id: Some(NodeId::from("a")),
            },
        ]
    });
    h.event(ManagerEvent::JobPrepared {
        job_id: job.clone(),
        role: target.clone(),
        node_id: NodeId::from("b"),
    });
    h.event(ManagerEvent::InitialDataComplete);
    let calls = h.take_calls();
    assert!(
        calls.iter().any(|(_, r)| matches!(
            r,
            Rpc::StopJob { job_id, instance_key, .. } if *job_id == job && *instance_key == target
        )),
        "the target no saga will start is stopped: {calls:?}"
    );
    assert_ne!(
        h.core
            .job(&job)
            .and_then(|r| r.binding.as_ref())
            .map(|b| b.instance_key.clone()),
        Some(target.clone()),
        "not bound to it"
    );
    for (id, _) in &calls {
        h.ok(*id);
    }
    h.stopped(&job, &NodeId::from("b"), target);
    let calls = h.take_calls();
    assert_eq!(start_jobs(&calls).len(), 1, "the job is placed again: {calls:?}");
}

#[test]
fn a_migration_target_that_ran_takes_the_job_over_when_a_hydrating_core_sees_its_source_stop() {
    // The migration finished before the stream broke (the target ran, then
    // the source stopped): the job runs on the target, not placed again.
    let primary = InstanceKey::slot(Slot::Primary);
    let target = InstanceKey(format!("{}@0ld7a29e", primary.as_str()));
    let (mut h, job) = hydrating_with_history(|now| {
        vec![
            JobHistoryEntry::Running {
                at: Some(now),
                role: primary.clone(),
                node_id: Some(NodeId::from("a")),
            },
            JobHistoryEntry::Running {
                at: Some(now),
                role: target.clone(),
                node_id: Some(NodeId::from("b")),
            },
            JobHistoryEntry::Stopped {
                at: Some(now),
                role: primary.clone(),
                node_id: Some(NodeId::from("a")),
            },
        ]
    });
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(h.bound_node(&job), Some(NodeId::from("b")));
    assert!(start_jobs(&h.take_calls()).is_empty(), "the job runs on its target");
}

#[test]
fn a_node_launching_for_a_job_does_not_take_it_back_at_hydration_when_its_co_located_peers_run_elsewhere() {
    // "Co-located jobs share a node." The old leader's starts of the
    // peers landed on `a`, and a node it asked for `encode` is still
    // launching: bound there, `encode` would split from its group.
    let mut h = Harness::new();
    h.cluster_node("a", 8.0);
    let b = bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n  - {jobName: package, coLocateWith: [encode], requirements: {requiredCapacity: 1}}\n",
    );
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    let encode = job_id("b", 0, "encode");
    let package = job_id("b", 0, "package");
    let mut jobs = jobs_of(&b);
    jobs[1].history.push(JobHistoryEntry::Running {
        at: Some(h.now),
        role: InstanceKey::slot(Slot::Primary),
        node_id: Some(NodeId::from("a")),
    });
    for job in jobs {
        h.event(ManagerEvent::JobActive(job));
    }
    let launching = NodeId::from("production-aws-old-1");
    let mut info = node_info(
        launching.as_str(),
        &[
            (tags::POOL, "production"),
            (tags::TIER, "aws"),
            (tags::PROVISIONED_FOR, encode.as_str()),
        ],
    );
    info.created_at = Some(h.now);
    h.event(ManagerEvent::NodeStarting(info));
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(h.bound_node(&package), Some(NodeId::from("a")));
    assert_eq!(
        h.bound_node(&encode),
        Some(NodeId::from("a")),
        "placed with its group, not held for the launching node"
    );
}

#[test]
fn a_hydrating_core_never_hands_a_job_to_a_migration_target_created_after_the_stop_it_reads() {
    // The job failed on `a`, was recovered on `b`, and a later migration's
    // target (aborted, its stop never landed) runs on `a`. Reading the old
    // failure, the core must not move the job to that later target: the
    // job runs on `b`, and the target is stopped.
    let primary = InstanceKey::slot(Slot::Primary);
    let target = InstanceKey(format!("{}@0ld7a29e", primary.as_str()));
    let (a, bn) = (NodeId::from("a"), NodeId::from("b"));
    let (mut h, job) = hydrating_with_history(|t| {
        vec![
            JobHistoryEntry::Running {
                at: Some(t - 50_000),
                role: primary.clone(),
                node_id: Some(a.clone()),
            },
            JobHistoryEntry::Stopping {
                at: Some(t - 40_000),
                role: primary.clone(),
                node_id: Some(a.clone()),
                reason: norsk_auto_manager::model::JobStopReason::JobFailed,
            },
            JobHistoryEntry::Stopped {
                at: Some(t - 40_000),
                role: primary.clone(),
                node_id: Some(a.clone()),
            },
            JobHistoryEntry::Running {
                at: Some(t - 30_000),
                role: primary.clone(),
                node_id: Some(bn.clone()),
            },
            JobHistoryEntry::Running {
                at: Some(t - 10_000),
                role: target.clone(),
                node_id: Some(a.clone()),
            },
        ]
    });
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(h.bound_node(&job), Some(bn), "the job stays where it was recovered");
    let calls = h.take_calls();
    assert!(
        calls.iter().any(|(_, r)| matches!(
            r,
            Rpc::StopJob { instance_key, node_id, .. } if *instance_key == target && *node_id == a
        )),
        "the later target is stopped: {calls:?}"
    );
}
