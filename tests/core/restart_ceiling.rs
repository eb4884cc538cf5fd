//! The restart ceiling over a trailing hour and the terminal verdicts: an
//! essential job past it breaks its bundle, a non-essential one is dropped
//! alone, `drop` never restarts; the history clears with a bundle update or
//! a node provisioned for the job, and is rebuilt from Manager's history.

use norsk_auto_manager::automanager::{Command, Rpc, RpcFailureKind};
use norsk_auto_manager::model::{
    JobHistoryEntry, ManagerEvent, NodeId, ProviderKind, RejectionCode, VerdictKind, tags,
};

use crate::support::scenario::*;
use crate::support::*;

#[test]
fn restart_ceiling_counts_a_trailing_hour() {
    let (mut h, job, _) = placed_and_running();
    for _ in 0..6 {
        assert_eq!(start_jobs(&fail_and_recover(&mut h, &job)).len(), 1);
    }
    // The seventh inside the hour would trip the ceiling of 6; an hour after
    // the first restart, one has aged out.
    h.advance(3_600_000 - 6 * 5_000);
    assert_eq!(start_jobs(&fail_and_recover(&mut h, &job)).len(), 1);
    assert!(h.core.broken_bundles().is_empty());
}

const RESILIENT: &str = "pool: production\nresiliencePolicy: {}\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1, maxRestartsPerHour: 2}}\n";

#[test]
fn essential_job_past_its_ceiling_breaks_its_bundle() {
    let mut h = Harness::hydrated();
    h.bundle("b", RESILIENT);
    h.start_all();
    let primary = job_id("b", 0, "encode");
    fail_and_recover(&mut h, &primary);
    fail_and_recover(&mut h, &primary);
    h.take_notifications();
    let calls = fail_and_recover(&mut h, &primary);
    assert!(start_jobs(&calls).is_empty(), "restarted past its ceiling");
    assert!(calls.iter().any(|(_, r)| matches!(
        r,
        Rpc::SetTerminalVerdict { job_id: None, verdict, .. } if verdict.kind == VerdictKind::Broken
    )));
    let kinds = kinds(&h.take_notifications());
    assert!(kinds.contains(&"bundleBroken".to_owned()));
    assert!(
        !kinds.contains(&"jobDropped".to_owned()),
        "an essential ceiling trip is not a drop"
    );
    // Every replica stops being placed.
    let backup = job_id("b", 1, "encode");
    let node = h.bound_node(&backup).unwrap();
    h.failed(&backup, &node);
    h.advance(60_000);
    assert!(start_jobs(&h.take_calls()).is_empty(), "a broken bundle was placed");
    let m = h.core.metrics(h.now);
    assert_eq!(m.counters.bundles_broken, 1);
    assert_eq!(m.broken_bundle_ids.len(), 1);
}

#[test]
fn non_essential_job_past_its_ceiling_is_dropped_alone() {
    let mut h = Harness::hydrated();
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: main, requirements: {requiredCapacity: 1}}\n  - {jobName: extra, requirements: {requiredCapacity: 1, essential: false, maxRestartsPerHour: 0}}\n",
    );
    h.start_all();
    h.take_notifications();
    let extra = job_id("b", 0, "extra");
    let calls = fail_and_recover(&mut h, &extra);
    assert!(start_jobs(&calls).is_empty());
    assert!(calls.iter().any(|(_, r)| matches!(
        r,
        Rpc::SetTerminalVerdict { job_id: Some(j), verdict, .. } if *j == extra && verdict.kind == VerdictKind::Dropped
    )));
    let kinds = kinds(&h.take_notifications());
    assert!(kinds.contains(&"jobDropped".to_owned()));
    assert!(!kinds.contains(&"bundleBroken".to_owned()));
    assert!(
        h.bound_node(&job_id("b", 0, "main")).is_some(),
        "the rest of the production stopped"
    );
    assert_eq!(h.core.metrics(h.now).counters.jobs_dropped, 1);
}

/// An update clears verdicts, so a verdict decided before one must not land
/// after it: each names the bundle generation it was decided for, and
/// Manager refuses it once the bundle has moved on.
#[test]
fn a_terminal_verdict_names_the_bundle_generation_it_was_decided_for() {
    let mut h = Harness::hydrated();
    let spec = "pool: production\njobs:\n  - {jobName: main, requirements: {requiredCapacity: 1}}\n  - {jobName: extra, requirements: {requiredCapacity: 1, essential: false, onRuntimeFailure: drop}}\n";
    let mut bundle = h.bundle("b", spec);
    h.start_all();
    let verdict_generation = |calls: &[(norsk_auto_manager::automanager::RequestId, Rpc)]| {
        calls.iter().find_map(|(_, r)| match r {
            Rpc::SetTerminalVerdict { generation, .. } => Some(*generation),
            _ => None,
        })
    };
    let extra = job_id("b", 0, "extra");
    let node = h.bound_node(&extra).unwrap();
    h.failed(&extra, &node);
    let calls = h.take_calls();
    assert_eq!(verdict_generation(&calls), Some(1));
    // Refused because the bundle moved on: moot, not an error.
    let verdict = calls
        .iter()
        .find(|(_, r)| matches!(r, Rpc::SetTerminalVerdict { .. }))
        .unwrap()
        .0;
    h.take_notifications();
    h.fail(verdict, RpcFailureKind::Rejected);
    assert!(!kinds(&h.take_notifications()).contains(&"error".to_owned()));
    bundle.generation = 2;
    h.event(ManagerEvent::BundleUpdated(bundle));
    h.ok_all();
    let node = h.bound_node(&extra).expect("the update revived the dropped job");
    h.running(&extra, &node);
    h.failed(&extra, &node);
    assert_eq!(verdict_generation(&h.take_calls()), Some(2));
}

#[test]
fn drop_policy_never_restarts() {
    let mut h = Harness::hydrated();
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1, onRuntimeFailure: drop}}\n",
    );
    h.start_all();
    h.take_notifications();
    let calls = fail_and_recover(&mut h, &job_id("b", 0, "encode"));
    assert!(start_jobs(&calls).is_empty(), "a drop job was restarted");
    let kinds = kinds(&h.take_notifications());
    assert!(kinds.contains(&"jobDropped".to_owned()));
    assert!(
        kinds.contains(&"bundleBroken".to_owned()),
        "an essential drop ends the production"
    );
}

#[test]
fn broken_mark_clears_when_the_bundle_is_updated() {
    let mut h = Harness::hydrated();
    let mut bundle = h.bundle("b", ONE_JOB);
    h.ok_all();
    reject(
        &mut h,
        &job_id("b", 0, "encode"),
        "a",
        RejectionCode::InvalidSpec,
        "bad",
    );
    assert_eq!(h.core.broken_bundles().len(), 1);
    h.ok_all();
    bundle.generation = 2;
    h.command(Command::UpdateBundle(bundle));
    assert_eq!(
        h.core.broken_bundles().len(),
        1,
        "revived before Manager accepted the update"
    );
    let calls = h.take_calls();
    assert!(matches!(calls[0].1, Rpc::UpdateBundle(_)));
    h.ok(calls[0].0);
    assert!(h.core.broken_bundles().is_empty());
    assert_eq!(
        start_jobs(&h.take_calls()).len(),
        1,
        "the revived bundle was not placed"
    );
}

#[test]
fn restart_history_clears_when_a_node_provisioned_for_the_job_starts() {
    let mut settings = settings();
    settings.max_restarts_per_hour = Some(1);
    let mut h = Harness::with(settings);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("b", ONE_JOB);
    let job = job_id("b", 0, "encode");
    let start_on_new_node = |h: &mut Harness| {
        let calls = h.take_calls();
        let (node, _, node_tags) = create_node(&calls).expect("provisions");
        for (id, _) in &calls {
            h.ok(*id);
        }
        let t: Vec<(&str, &str)> = node_tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        h.provisioned_node_starts(node.as_str(), ProviderKind::Aws, &t);
        h.start_all();
        node
    };
    let first = start_on_new_node(&mut h);
    h.failed(&job, &first);
    // One restart used; the re-placement provisions (the failed node is
    // excluded) and that node, provisioned for the job, clears the history.
    let second = start_on_new_node(&mut h);
    assert_ne!(first, second);
    h.advance(5_000);
    h.failed(&job, &second);
    assert!(h.core.broken_bundles().is_empty(), "the history was not cleared");
}

#[test]
fn restart_history_survives_rehydration_from_manager_history() {
    let mut settings = settings();
    settings.max_restarts_per_hour = Some(2);
    let mut h = Harness::with(settings);
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    let bundle = bundle("b", ONE_JOB);
    h.event(ManagerEvent::BundleUpdated(bundle.clone()));
    let mut job = jobs_of(&bundle).remove(0);
    let role = norsk_auto_manager::model::InstanceKey("primary".into());
    for (at, node) in [(h.now - 20_000, "a"), (h.now - 10_000, "b")] {
        job.history.push(JobHistoryEntry::Stopping {
            at: Some(at),
            role: role.clone(),
            node_id: Some(NodeId::from(node)),
            reason: norsk_auto_manager::model::JobStopReason::JobFailed,
        });
    }
    job.history.push(JobHistoryEntry::Running {
        at: Some(h.now - 5_000),
        role,
        node_id: Some(NodeId::from("a")),
    });
    let id = job.job_id.clone();
    h.event(ManagerEvent::JobActive(job));
    h.event(ManagerEvent::InitialDataComplete);
    h.failed(&id, &NodeId::from("a"));
    assert_eq!(
        h.core.broken_bundles().len(),
        1,
        "the two failures before the reconnect were forgotten"
    );
}

#[test]
fn a_broken_bundle_s_replica_waiting_for_its_node_is_never_started_there() {
    let mut h = empty_hydrated();
    h.bundle(
        "b",
        "pool: production\nresiliencePolicy: {sameNode: forbid}\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 3, maxRestartsPerHour: 0}}\n",
    );
    let calls = h.take_calls();
    let provisions: Vec<(NodeId, Vec<(String, String)>)> = calls
        .iter()
        .filter_map(|(_, rpc)| match rpc {
            Rpc::CreateNode { node_id, tags, .. } => Some((node_id.clone(), tags.clone().into_iter().collect())),
            _ => None,
        })
        .collect();
    assert_eq!(provisions.len(), 2, "a node each for the primary and the backup");
    for (id, _) in &calls {
        h.ok(*id);
    }
    let node_for = |job: &str| {
        provisions
            .iter()
            .find(|(_, t)| t.iter().any(|(k, v)| k == tags::PROVISIONED_FOR && v == job))
            .cloned()
            .expect("a node provisioned for the job")
    };
    let (primary_node, primary_tags) = node_for("b/0/encode");
    let (backup_node, backup_tags) = node_for("b/1/encode");
    let t: Vec<(&str, &str)> = primary_tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    h.provisioned_node_starts(primary_node.as_str(), ProviderKind::Aws, &t);
    h.start_all();
    // The primary fails past its ceiling: the production ends.
    h.failed(&job_id("b", 0, "encode"), &primary_node);
    assert!(kinds(&h.take_notifications()).contains(&"bundleBroken".to_owned()));
    let t: Vec<(&str, &str)> = backup_tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    h.provisioned_node_starts(backup_node.as_str(), ProviderKind::Aws, &t);
    let calls = h.take_calls();
    assert!(
        start_jobs(&calls).is_empty(),
        "a replica of a broken bundle started: {calls:?}"
    );
    assert!(
        calls
            .iter()
            .any(|(_, r)| matches!(r, Rpc::TerminateNode { node_id } if *node_id == backup_node)),
        "the node launched for the backup is released: {calls:?}"
    );
}

#[test]
fn restart_history_clears_when_a_node_provisioned_for_the_job_starts_not_when_manager_says_again_that_it_runs() {
    let mut settings = settings();
    settings.max_restarts_per_hour = Some(1);
    let mut h = Harness::with(settings);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("b", ONE_JOB);
    let job = job_id("b", 0, "encode");
    let calls = h.take_calls();
    let (node, _, node_tags) = create_node(&calls).expect("provisions");
    for (id, _) in &calls {
        h.ok(*id);
    }
    let t: Vec<(&str, &str)> = node_tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    h.provisioned_node_starts(node.as_str(), ProviderKind::Aws, &t);
    h.start_all();
    h.cluster_node("c", 4.0);
    // One restart used; the recovery goes to the cluster node.
    h.failed(&job, &node);
    h.advance(5_000);
    assert_eq!(h.start_all(), vec![(job.clone(), NodeId::from("c"))]);
    // Manager repeats that the provisioned node runs: it did not start again.
    h.event(ManagerEvent::NodeStarted(node_info(node.as_str(), &t)));
    h.advance(5_000);
    h.failed(&job, &NodeId::from("c"));
    assert_eq!(
        h.core.broken_bundles().len(),
        1,
        "the restart before the repeated event still counts"
    );
}

#[test]
fn the_restart_ceiling_counts_restarts_over_a_trailing_hour_of_sixty_minutes() {
    // "maxRestartsPerHour ... counted over a trailing hour": two restarts
    // 20 minutes apart, then a third failure 50 minutes after the first is
    // still inside the hour (terminal at a ceiling of 2); a failure more
    // than an hour after the earlier ones restarts again.
    const MINUTE: i64 = 60_000;
    let ceiling_hit = |calls: &[(norsk_auto_manager::automanager::RequestId, Rpc)]| {
        calls
            .iter()
            .any(|(_, r)| matches!(r, Rpc::SetTerminalVerdict { verdict, .. } if verdict.kind == VerdictKind::Broken))
    };
    let mut h = Harness::hydrated();
    h.bundle("b", RESILIENT);
    h.start_all();
    let primary = job_id("b", 0, "encode");
    fail_and_recover(&mut h, &primary);
    h.advance(20 * MINUTE);
    fail_and_recover(&mut h, &primary);
    h.advance(30 * MINUTE);
    let calls = fail_and_recover(&mut h, &primary);
    assert!(
        ceiling_hit(&calls) && start_jobs(&calls).is_empty(),
        "a third restart 50 minutes after the first is inside the trailing hour"
    );

    let mut h = Harness::hydrated();
    h.bundle("b", RESILIENT);
    h.start_all();
    fail_and_recover(&mut h, &primary);
    fail_and_recover(&mut h, &primary);
    h.advance(61 * MINUTE);
    let calls = fail_and_recover(&mut h, &primary);
    assert!(
        !ceiling_hit(&calls) && start_jobs(&calls).len() == 1,
        "restarts more than an hour old no longer count: {calls:?}"
    );
}
