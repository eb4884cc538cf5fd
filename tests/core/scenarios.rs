//! Scenario tests of the AutoManager core, one per rule, on a virtual clock:
//! the test plays Manager (events in, RPC results back) and asserts what the
//! core asks Manager to do and what it notifies.

use norsk_auto_manager::automanager::{Command, CommandError, Input, Notification, RequestId, Rpc, RpcFailureKind};
use norsk_auto_manager::model::{
    InstanceKey, JobHistoryEntry, JobId, JobState, ManagerEvent, NodeId, NodeStopReason, ProviderKind, RejectionCode,
    SchedulePhase, Slot, VerdictKind, tags,
};

use crate::support::*;

const ONE_JOB: &str = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 2}}\n";

fn start_jobs(calls: &[(norsk_auto_manager::automanager::RequestId, Rpc)]) -> Vec<(String, String)> {
    calls
        .iter()
        .filter_map(|(_, rpc)| match rpc {
            Rpc::StartJob { job_id, node_id, .. } => Some((job_id.0.clone(), node_id.0.clone())),
            _ => None,
        })
        .collect()
}

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
fn no_second_dispatch_while_one_is_in_flight() {
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    let first = h.take_calls();
    assert_eq!(start_jobs(&first).len(), 1);
    let job = h.core.job(&job_id("b", 0, "encode")).unwrap().job.clone();
    h.event(ManagerEvent::JobUpdated(job.clone()));
    h.event(ManagerEvent::JobActive(job));
    h.advance(60_000);
    assert!(
        h.take_calls().is_empty(),
        "dispatched again while the first StartJob was in flight"
    );
    h.ok(first[0].0);
    h.advance(60_000);
    assert!(h.take_calls().is_empty());
}

#[test]
fn failed_dispatch_counts_as_dispatch_failed_and_is_retried() {
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    let (id, _) = h.take_calls().remove(0);
    h.fail(id, RpcFailureKind::Rejected);
    let m = h.core.metrics(h.now);
    assert_eq!(m.counters.placements_dispatch_failed, 1);
    assert_eq!(m.counters.placements_succeeded, 0);
    assert!(h.take_calls().is_empty(), "retried at once");
    h.advance(5_000);
    let retry = h.take_calls();
    assert_eq!(start_jobs(&retry).len(), 1);
    h.ok(retry[0].0);
    let m = h.core.metrics(h.now);
    assert_eq!(m.counters.placements_succeeded, 1);
    assert_eq!(m.counters.placements_attempted, 2);
}

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

fn empty_hydrated() -> Harness {
    let mut h = Harness::new();
    h.event(ManagerEvent::InitialDataComplete);
    h
}

fn create_node(
    calls: &[(norsk_auto_manager::automanager::RequestId, Rpc)],
) -> Option<(NodeId, ProviderKind, std::collections::BTreeMap<String, String>)> {
    calls.iter().find_map(|(_, rpc)| match rpc {
        Rpc::CreateNode {
            node_id,
            provider,
            tags,
            ..
        } => Some((node_id.clone(), *provider, tags.clone())),
        _ => None,
    })
}

/// A node id is never given to two machines: a core hydrated after a
/// stream break carries its process's naming on, and a standby promoted in a
/// new process names its nodes apart from the ones the old leader named —
/// even a node Manager has since forgotten.
#[test]
fn a_node_id_is_never_named_twice_across_stream_breaks_and_promotions() {
    use norsk_auto_manager::automanager::{AutoManagerCore, validate_auto_settings};
    // Manager's snapshot after it forgot every node: the bundle and its job.
    let hydrate = |h: &mut Harness, core: AutoManagerCore| -> NodeId {
        h.core = core;
        h.event(ManagerEvent::BundleUpdated(bundle("b", ONE_JOB)));
        for job in jobs_of(&bundle("b", ONE_JOB)) {
            h.event(ManagerEvent::JobActive(job));
        }
        h.event(ManagerEvent::InitialDataComplete);
        let calls = h.take_calls();
        let node = create_node(&calls).expect("a node is provisioned").0;
        // Manager refuses it (and so never holds it).
        for (id, _) in calls.iter().filter(|(_, rpc)| matches!(rpc, Rpc::CreateNode { .. })) {
            h.fail(*id, RpcFailureKind::InsufficientCapacity);
        }
        node
    };
    let valid = || validate_auto_settings(settings()).expect("settings are valid");
    let mut leader = Harness::new();
    let core = AutoManagerCore::new(valid(), leader.now);
    let first = hydrate(&mut leader, core);
    let successor = AutoManagerCore::succeeding(valid(), &leader.core);
    let second = hydrate(&mut leader, successor);
    assert_ne!(first, second, "the same process named a node twice");

    // A standby, started a moment later in a process of its own, is
    // promoted.
    let mut standby = Harness::new();
    standby.now += 1;
    let core = AutoManagerCore::new(valid(), standby.now);
    let third = hydrate(&mut standby, core);
    assert!(
        third != first && third != second,
        "the promoted standby named {third}, a node the old leader named"
    );

    // One started in the same millisecond as the leader: its salt (drawn
    // at random by the runtime) sets it apart; a successor keeps it.
    let mut twin = Harness::new();
    let core = AutoManagerCore::new(valid(), twin.now).salted(7);
    let fourth = hydrate(&mut twin, core);
    assert!(
        fourth != first && fourth != second,
        "a standby started in the leader's millisecond named {fourth}, a node the old leader named"
    );
    let successor = AutoManagerCore::succeeding(valid(), &twin.core);
    let fifth = hydrate(&mut twin, successor);
    assert_ne!(fourth, fifth, "the same salted process named a node twice");
    // `<pool>-<tier>-<process>-<serial>`
    let process = |node: &NodeId| node.as_str().split('-').nth(2).map(str::to_owned);
    assert_eq!(
        process(&fourth),
        process(&fifth),
        "a successor names its nodes as its process did"
    );
    for node in [&first, &second, &third, &fourth, &fifth] {
        assert!(node.as_str().starts_with("production-"), "{node}");
    }
}

#[test]
fn provisioning_creates_a_tagged_node_and_starts_the_job_when_it_starts() {
    let mut h = empty_hydrated();
    h.bundle("b", ONE_JOB);
    let calls = h.take_calls();
    let (node, provider, node_tags) = create_node(&calls).expect("a node is provisioned");
    assert_eq!(provider, ProviderKind::Aws);
    assert_eq!(node_tags[tags::POOL], "production");
    assert_eq!(node_tags[tags::TIER], "aws");
    assert_eq!(node_tags[tags::PROVISIONED_FOR], "b/0/encode");
    assert!(start_jobs(&calls).is_empty(), "started before the node exists");
    h.ok(calls[0].0);
    let t: Vec<(&str, &str)> = node_tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    h.provisioned_node_starts(node.as_str(), ProviderKind::Aws, &t);
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![("b/0/encode".to_owned(), node.0.clone())]
    );
    assert_eq!(h.core.metrics(h.now).counters.placements_succeeded, 1);
}

#[test]
fn later_jobs_are_placed_on_a_prospective_node() {
    let mut h = empty_hydrated();
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: a, requirements: {requiredCapacity: 2}}\n  - {jobName: c, requirements: {requiredCapacity: 2}}\n",
    );
    let calls = h.take_calls();
    let creates = calls
        .iter()
        .filter(|(_, r)| matches!(r, Rpc::CreateNode { .. }))
        .count();
    assert_eq!(
        creates, 1,
        "a second node was provisioned for a job that fits the first"
    );
    assert_eq!(h.bound_node(&job_id("b", 0, "a")), h.bound_node(&job_id("b", 0, "c")));
}

#[test]
fn jobs_of_a_provision_still_prospective_after_its_timeout_are_replaced() {
    let mut h = empty_hydrated();
    h.bundle("b", ONE_JOB);
    let calls = h.take_calls();
    let (first, _, _) = create_node(&calls).unwrap();
    h.ok(calls[0].0);
    h.take_notifications();
    h.advance(599_000);
    assert!(h.take_calls().is_empty(), "re-placed before provisionTimeoutMs");
    h.advance(1_000);
    let calls = h.take_calls();
    assert!(
        calls
            .iter()
            .any(|(_, r)| matches!(r, Rpc::TerminateNode { node_id } if *node_id == first)),
        "the node that never started was not terminated"
    );
    let (second, _, _) = create_node(&calls).expect("the job is re-placed");
    assert_ne!(second, first);
    let terminated: Vec<_> = h
        .take_notifications()
        .into_iter()
        .filter(|n| matches!(n, Notification::NodeTerminated { .. }))
        .collect();
    assert_eq!(terminated.len(), 1, "nodeTerminated fires once per node");
}

#[test]
fn failed_provision_leaves_no_phantom_node_and_spills_to_the_next_tier() {
    let mut h = empty_hydrated();
    h.bundle("b", ONE_JOB);
    let calls = h.take_calls();
    let (node, _, _) = create_node(&calls).unwrap();
    h.fail(calls[0].0, RpcFailureKind::InsufficientCapacity);
    assert!(!h.core.fleet().contains(&node), "a phantom node was kept");
    let (_, provider, node_tags) = create_node(&h.take_calls()).expect("the cascade went on");
    assert_eq!(provider, ProviderKind::Oci);
    assert_eq!(node_tags[tags::TIER], "oci");
    assert_eq!(h.core.metrics(h.now).counters.placements_dispatch_failed, 1);
}

/// Pool `production` with one AWS tier offering two shapes, then OCI.
const TWO_SHAPES: &str = "
- name: production
  tiers:
    - name: aws
      kind: aws
      region: eu-west-1
      candidateInstanceTypes:
        - {instanceType: m5.2xlarge, totalCapacity: 8, totalCores: 8}
        - {instanceType: m5.xlarge, totalCapacity: 4, totalCores: 4}
    - name: oci
      kind: oci
      region: eu-frankfurt-1
      candidateInstanceTypes: [{instanceType: VM.Standard3.Flex, totalCapacity: 4, totalCores: 4}]
";

fn two_shapes_hydrated() -> Harness {
    let mut settings = crate::support::settings();
    settings.placement_pools = yaml_serde::from_str(TWO_SHAPES).unwrap();
    let mut h = Harness::with(settings);
    h.event(ManagerEvent::InitialDataComplete);
    h
}

/// The tier and shape of the first `CreateNode` among `calls`.
fn created_shape(calls: &[(norsk_auto_manager::automanager::RequestId, Rpc)]) -> Option<(String, String)> {
    calls.iter().find_map(|(_, rpc)| match rpc {
        Rpc::CreateNode {
            tags, instance_type, ..
        } => Some((tags[tags::TIER].clone(), instance_type.clone())),
        _ => None,
    })
}

#[test]
fn exhausted_offering_tries_the_tiers_next_shape_before_spilling() {
    let mut h = two_shapes_hydrated();
    h.bundle("b", ONE_JOB);
    let calls = h.take_calls();
    assert_eq!(created_shape(&calls), Some(("aws".into(), "m5.2xlarge".into())));
    h.fail(calls[0].0, RpcFailureKind::InsufficientCapacity);
    let calls = h.take_calls();
    assert_eq!(
        created_shape(&calls),
        Some(("aws".into(), "m5.xlarge".into())),
        "the same tier's next fitting shape is tried"
    );
    h.fail(calls[0].0, RpcFailureKind::InsufficientCapacity);
    let calls = h.take_calls();
    assert_eq!(
        created_shape(&calls),
        Some(("oci".into(), "VM.Standard3.Flex".into())),
        "with every shape of the tier exhausted the cascade spills"
    );
    h.fail(calls[0].0, RpcFailureKind::InsufficientCapacity);
    // Once PROVISION_FAILURE_BACKOFF_MS has passed the first shape is
    // offered again.
    h.advance(60_000);
    assert_eq!(
        created_shape(&h.take_calls()),
        Some(("aws".into(), "m5.2xlarge".into()))
    );
}

#[test]
fn a_refusal_other_than_capacity_holds_back_the_whole_tier() {
    let mut h = two_shapes_hydrated();
    h.bundle("b", ONE_JOB);
    let calls = h.take_calls();
    h.fail(calls[0].0, RpcFailureKind::Rejected);
    assert_eq!(
        created_shape(&h.take_calls()),
        Some(("oci".into(), "VM.Standard3.Flex".into())),
        "a tier that refused for another reason is skipped whole"
    );
}

#[test]
fn scheduled_start_is_placed_placement_lead_ahead() {
    let mut h = Harness::hydrated();
    let bundle = bundle("b", ONE_JOB);
    h.event(ManagerEvent::BundleUpdated(bundle.clone()));
    let mut job = jobs_of(&bundle).remove(0);
    job.state = JobState::Pre;
    job.start_date_time = Some(h.now + 10 * 60_000);
    h.event(ManagerEvent::JobPending(job));
    // The pool's cloud tiers lead by their default 5 minutes.
    h.advance(4 * 60_000 + 59_000);
    assert!(h.take_calls().is_empty(), "placed before placementLeadMs");
    h.advance(1_000);
    assert_eq!(start_jobs(&h.take_calls()).len(), 1);
}

fn placed_and_running() -> (Harness, norsk_auto_manager::model::JobId, NodeId) {
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    let started = h.start_all();
    let (job, node) = started[0].clone();
    h.take_notifications();
    (h, job, node)
}

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

/// Fails the job where it runs, lets the recovery interval pass, and
/// starts the re-placement; returns the calls made.
fn fail_and_recover(
    h: &mut Harness,
    job: &norsk_auto_manager::model::JobId,
) -> Vec<(norsk_auto_manager::automanager::RequestId, Rpc)> {
    let node = h.bound_node(job).expect("job is bound");
    h.failed(job, &node);
    h.advance(5_000);
    let calls = h.take_calls();
    for (id, rpc) in &calls {
        h.ok(*id);
        if let Rpc::StartJob { job_id, node_id, .. } = rpc {
            h.running(job_id, node_id);
        }
    }
    calls
}

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

fn reject(h: &mut Harness, job: &norsk_auto_manager::model::JobId, node: &str, code: RejectionCode, detail: &str) {
    h.event(ManagerEvent::JobRejected {
        job_id: job.clone(),
        role: norsk_auto_manager::model::InstanceKey("primary".into()),
        node_id: NodeId::from(node),
        code,
        detail: detail.into(),
        inventory: None,
    });
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
fn capacity_an_ended_job_gave_back_is_placed_on_again() {
    let mut h = Harness::hydrated();
    for b in ["b1", "b2", "b3", "b4"] {
        h.bundle(b, ONE_JOB);
    }
    let started = h.start_all();
    assert_eq!(started.len(), 4, "two 2-vCPU jobs on each 4-vCPU node");
    let (ended, node) = started
        .iter()
        .find(|(_, n)| n.as_str() == "a")
        .expect("one job on a")
        .clone();
    job_ends(&mut h, &ended);
    h.bundle("b5", ONE_JOB);
    let calls = h.take_calls();
    assert!(
        create_node(&calls).is_none(),
        "provisioned although {node} had room again"
    );
    assert_eq!(start_jobs(&calls), vec![("b5/0/encode".to_owned(), "a".to_owned())]);
}

const SINGLE_USE: &str = "pool: production\njobs:\n  - {jobName: encode, exclusive: true, singleUse: true, requirements: {requiredCapacity: 2}}\n";

fn job_ends(h: &mut Harness, job: &norsk_auto_manager::model::JobId) {
    let mut runtime = h.core.job(job).unwrap().job.clone();
    runtime.state = JobState::Post;
    h.event(ManagerEvent::JobOutOfWindow(runtime));
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
fn manual_start_mode_job_waits_for_start_bundle_job() {
    let mut h = Harness::hydrated();
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, startMode: manual, requirements: {requiredCapacity: 1}}\n",
    );
    assert!(h.take_calls().is_empty(), "a dormant job was placed");
    let job = job_id("b", 0, "encode");
    let reference = h.core.job(&job).unwrap().bundle_ref.clone();
    h.command(Command::StartBundleJob(reference));
    let calls = h.take_calls();
    assert!(matches!(calls[0].1, Rpc::StartBundleJob(_)));
    h.ok(calls[0].0);
    assert!(h.take_replies()[0].1.is_ok());
    let mut runtime = h.core.job(&job).unwrap().job.clone();
    runtime.dormant = false;
    h.event(ManagerEvent::JobUpdated(runtime));
    assert_eq!(start_jobs(&h.take_calls()).len(), 1);
}

#[test]
fn invalid_bundle_is_refused_without_calling_manager() {
    let mut h = Harness::hydrated();
    let bad = bundle("b", "pool: nowhere\njobs:\n  - {jobName: encode}\n");
    let id = h.command(Command::CreateBundle(bad));
    assert!(h.take_calls().is_empty());
    let replies = h.take_replies();
    assert_eq!(replies[0].0, id);
    assert!(matches!(replies[0].1, Err(CommandError::InvalidBundle { .. })));
}

#[test]
fn snapshot_after_close_is_not_hydrated() {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.bundle("b", ONE_JOB);
    h.input(Input::Close);
    h.event(ManagerEvent::InitialDataComplete);
    assert!(!h.core.is_hydrated());
    assert!(h.take_calls().is_empty());
    assert_eq!(h.next_deadline, None, "a timer survived close");
    h.command(Command::DeleteBundle("b".into()));
    assert!(matches!(h.take_replies()[0].1, Err(CommandError::Closed)));
}

#[test]
fn notification_kinds_are_callback_names_without_on() {
    let node_id = NodeId::from("a");
    let cases = [
        (
            Notification::NodeUnhealthy {
                node_id: node_id.clone(),
            },
            "nodeUnhealthy",
        ),
        (
            Notification::NodeTerminated {
                node_id: node_id.clone(),
            },
            "nodeTerminated",
        ),
        (
            Notification::BundleBroken {
                bundle_id: "b".into(),
                reason: "r".into(),
            },
            "bundleBroken",
        ),
        (
            Notification::PlacementFailed {
                job_id: job_id("b", 0, "j"),
                reason: "r".into(),
            },
            "placementFailed",
        ),
    ];
    for (notification, name) in cases {
        assert_eq!(kinds(&[notification]), vec![name.to_owned()]);
    }
}

#[test]
fn pool_gauges_are_computed_on_read() {
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    h.start_all();
    let pool = &h.core.metrics(h.now).pools[0];
    assert_eq!(pool.pool_name, "production");
    assert_eq!(pool.node_count, 2);
    assert!((pool.used_capacity_fraction - 0.25).abs() < 1e-9);
}

#[test]
fn placement_failure_is_reported_and_retried_when_capacity_appears() {
    let mut settings = settings();
    settings.placement_pools = yaml_serde::from_str(
        "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n",
    )
    .unwrap();
    let mut h = Harness::with(settings);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("b", ONE_JOB);
    assert!(kinds(&h.take_notifications()).contains(&"placementFailed".to_owned()));
    assert_eq!(h.core.metrics(h.now).counters.placements_failed, 1);
    h.advance(60_000);
    assert_eq!(
        h.core.metrics(h.now).counters.placements_failed,
        1,
        "retried with nothing changed"
    );
    h.cluster_node("a", 4.0);
    assert_eq!(start_jobs(&h.take_calls()).len(), 1);
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
fn a_backup_in_the_primarys_failure_domain_is_reported_as_degraded() {
    let mut settings = settings();
    settings.placement_pools = yaml_serde::from_str(
        "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n",
    )
    .unwrap();
    let mut h = Harness::with(settings);
    h.cluster_node("a", 8.0);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle(
        "b",
        "pool: production\nresiliencePolicy: {sameNode: forbid}\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n",
    );
    let degraded = h.take_notifications().into_iter().find_map(|n| match n {
        Notification::ResilienceDegraded { job_id, violations, .. } => Some((job_id, violations)),
        _ => None,
    });
    let (job, violations) = degraded.expect("resilienceDegraded fired");
    assert_eq!(job, job_id("b", 1, "encode"));
    assert_eq!(
        violations,
        vec![norsk_auto_manager::placement::ResilienceFlag::SameNode]
    );
    assert_eq!(
        start_jobs(&h.take_calls()).len(),
        2,
        "best-effort: the backup is placed anyway"
    );
}

#[test]
fn template_images_set_at_runtime_steer_placement_by_warmth() {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::NodeStarted(node_info(
        "warm",
        &[(tags::POOL, "production")],
    )));
    let mut inventory = inventory(ProviderKind::LocalServers, 4.0);
    inventory.images = vec!["registry.example/encoder:1".into()];
    h.event(ManagerEvent::NodeInventory {
        node_id: NodeId::from("warm"),
        inventory,
    });
    h.event(ManagerEvent::InitialDataComplete);
    let id = h.command(Command::SetTemplateImages(
        [("encoder".to_owned(), vec!["registry.example/encoder:1".to_owned()])].into(),
    ));
    assert_eq!(h.take_replies(), vec![(id, Ok(()))]);
    assert_eq!(h.core.template_images()["encoder"].len(), 1);
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, template: encoder, requirements: {requiredCapacity: 1}}\n",
    );
    // `a` would win on node id; the warm node holds the template's image.
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![("b/0/encode".to_owned(), "warm".to_owned())]
    );
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

// ---------------------------------------------------------------------------
// Scheduled bundles: placed `placementLeadMs` ahead of the start (the
// largest lead of the pool's tiers), completed at the end and never placed
// again, living again once rescheduled.

/// Pool `production` with one elastic AWS tier (lead: the cloud default).
const CLOUD_POOL: &str = "
- name: production
  tiers:
    - name: aws
      kind: aws
      region: eu-west-1
      candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 4, totalCores: 4}]
";

/// Pool `production` with only registered cluster servers (lead 0).
const CLUSTER_POOL: &str = "
- name: production
  tiers:
    - {name: cluster, kind: local-servers, scaleOut: fixed}
";

fn with_pools(pools: &str) -> Harness {
    let mut settings = settings();
    settings.placement_pools = yaml_serde::from_str(pools).expect("pools parse");
    Harness::with(settings)
}

/// A one-job bundle booked from `start` (to `end`).
fn scheduled(start: i64, end: Option<i64>) -> String {
    let end = end.map(|e| format!(", end: '{}'", rfc3339(e))).unwrap_or_default();
    format!(
        "pool: production\nschedule: {{start: '{}'{end}}}\njobs:\n  - {{jobName: encode, requirements: {{requiredCapacity: 2}}}}\n",
        rfc3339(start)
    )
}

fn schedule_phases(notifications: &[Notification]) -> Vec<SchedulePhase> {
    notifications
        .iter()
        .filter_map(|n| match n {
            Notification::BundleSchedule { phase, .. } => Some(*phase),
            _ => None,
        })
        .collect()
}

#[test]
fn a_scheduled_bundle_on_a_cloud_tier_is_placed_its_five_minute_lead_ahead_and_not_before() {
    let mut h = with_pools(CLOUD_POOL);
    h.event(ManagerEvent::InitialDataComplete);
    let start = h.now + 20 * 60_000;
    h.bundle("b", &scheduled(start, None));
    assert!(h.take_calls().is_empty(), "placed twenty minutes ahead");
    let view = h.core.schedule_view(&"b".into(), h.now).expect("scheduled");
    assert_eq!(
        (view.phase, view.placing_from),
        (SchedulePhase::Waiting, start - 300_000)
    );
    h.advance(15 * 60_000 - 1);
    assert!(h.take_calls().is_empty(), "placed before placementLeadMs");
    h.advance(1);
    let calls = h.take_calls();
    assert!(
        create_node(&calls).is_some(),
        "a node is provisioned five minutes ahead: {calls:?}"
    );
}

#[test]
fn a_scheduled_bundle_on_a_cluster_tier_is_placed_at_its_start_and_not_before() {
    let mut h = with_pools(CLUSTER_POOL);
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    let start = h.now + 10 * 60_000;
    h.bundle("b", &scheduled(start, None));
    h.advance(10 * 60_000 - 1);
    assert!(h.take_calls().is_empty(), "a cluster tier's lead is 0");
    h.advance(1);
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![("b/0/encode".to_owned(), "a".to_owned())]
    );
}

#[test]
fn a_mixed_cascade_is_placed_at_its_largest_lead_and_still_takes_its_cheaper_cluster_tier() {
    // Cluster servers, then AWS and OCI (5 minutes each).
    let mut h = Harness::hydrated();
    let start = h.now + 10 * 60_000;
    h.bundle("b", &scheduled(start, None));
    h.advance(5 * 60_000 - 1);
    assert!(h.take_calls().is_empty(), "placed before the cloud tiers' lead");
    h.advance(1);
    let calls = h.take_calls();
    assert!(create_node(&calls).is_none(), "the cheaper cluster tier was skipped");
    let starts = start_jobs(&calls);
    assert_eq!(starts.len(), 1);
    assert!(["a", "b"].contains(&starts[0].1.as_str()), "{starts:?}");
}

#[test]
fn a_provision_for_a_scheduled_start_times_out_after_twice_its_lead() {
    let mut h =
        with_pools(&CLOUD_POOL.replace("region: eu-west-1", "region: eu-west-1\n      placementLeadMs: 900000"));
    h.event(ManagerEvent::InitialDataComplete);
    let start = h.now + 60 * 60_000;
    h.bundle("b", &scheduled(start, None));
    h.advance(45 * 60_000);
    let calls = h.take_calls();
    let (first, _, _) = create_node(&calls).expect("provisioned fifteen minutes ahead");
    h.ok(calls[0].0);
    // provisionTimeoutMs: max(placementLeadMs, 5 min) x 2 = 30 minutes.
    h.advance(30 * 60_000 - 1);
    assert!(h.take_calls().is_empty(), "re-placed before provisionTimeoutMs");
    h.advance(1);
    let calls = h.take_calls();
    assert!(
        calls
            .iter()
            .any(|(_, r)| matches!(r, Rpc::TerminateNode { node_id } if *node_id == first)),
        "the node that never started was not terminated: {calls:?}"
    );
    assert!(
        create_node(&calls).is_some_and(|(n, _, _)| n != first),
        "the job is re-placed"
    );
}

#[test]
fn a_schedule_moves_from_waiting_to_placing_live_and_ended_and_says_so_at_each_change() {
    let mut h = Harness::hydrated();
    let start = h.now + 10 * 60_000;
    let end = start + 10 * 60_000;
    h.bundle("b", &scheduled(start, Some(end)));
    assert!(
        schedule_phases(&h.take_notifications()).is_empty(),
        "a first sight is no change"
    );
    h.advance(5 * 60_000);
    h.start_all();
    h.advance(5 * 60_000);
    h.advance(10 * 60_000);
    assert_eq!(
        schedule_phases(&h.take_notifications()),
        [SchedulePhase::Placing, SchedulePhase::Live, SchedulePhase::Ended]
    );
    let view = h.core.schedule_view(&"b".into(), h.now).expect("scheduled");
    assert_eq!((view.phase, view.next), (SchedulePhase::Ended, None));
}

/// A bundle live from now to an hour from now, placed and running; returns
/// the harness at its end (its `CompleteJob` answered), the job and node.
fn at_its_end() -> (
    Harness,
    norsk_auto_manager::model::Bundle,
    norsk_auto_manager::model::JobId,
    NodeId,
) {
    let mut h = Harness::hydrated();
    let end = h.now + 60 * 60_000;
    let bundle = h.bundle("b", &scheduled(h.now, Some(end)));
    let (job, node) = h.start_all().remove(0);
    h.advance(60 * 60_000 - 1);
    assert!(
        !h.take_calls().iter().any(|(_, r)| matches!(r, Rpc::CompleteJob { .. })),
        "completed before its end"
    );
    h.advance(1);
    let calls = h.take_calls();
    let completes: Vec<_> = calls
        .iter()
        .filter(|(_, r)| matches!(r, Rpc::CompleteJob { job_id } if *job_id == job))
        .collect();
    assert_eq!(completes.len(), 1, "{calls:?}");
    h.ok(completes[0].0);
    (h, bundle, job, node)
}

#[test]
fn a_scheduled_bundle_is_completed_at_its_end_and_never_placed_again() {
    let (mut h, _, job, node) = at_its_end();
    // Manager stops the instance before it reports the job out of its
    // window: the job is not placed again meanwhile.
    h.history(
        &job,
        JobHistoryEntry::Stopping {
            at: Some(h.now),
            role: InstanceKey("primary".into()),
            node_id: Some(node.clone()),
            reason: norsk_auto_manager::model::JobStopReason::UserRequested,
        },
    );
    h.stopped(&job, &node, InstanceKey("primary".into()));
    assert_eq!(h.bound_node(&job), None);
    h.advance(60_000);
    assert!(start_jobs(&h.take_calls()).is_empty(), "an ended job was placed again");
    let mut runtime = h.core.job(&job).unwrap().job.clone();
    runtime.state = JobState::Post;
    h.event(ManagerEvent::JobUpdated(runtime));
    h.advance(24 * 3_600_000);
    assert!(h.take_calls().is_empty(), "an ended job was placed or completed again");
}

#[test]
fn a_bundle_given_a_later_end_after_it_ended_lives_again() {
    let (mut h, mut bundle, job, node) = at_its_end();
    h.history(
        &job,
        JobHistoryEntry::Stopping {
            at: Some(h.now),
            role: InstanceKey("primary".into()),
            node_id: Some(node),
            reason: norsk_auto_manager::model::JobStopReason::UserRequested,
        },
    );
    let mut runtime = h.core.job(&job).unwrap().job.clone();
    runtime.state = JobState::Post;
    h.event(ManagerEvent::JobUpdated(runtime.clone()));
    h.take_calls();
    let schedule = bundle.spec.schedule.as_mut().unwrap();
    schedule.end = Some(norsk_auto_manager::model::DateTime::from_millis(h.now + 3_600_000));
    h.command(Command::UpdateBundle(bundle.clone()));
    let calls = h.take_calls();
    assert!(matches!(calls[0].1, Rpc::UpdateBundle(_)), "{calls:?}");
    h.ok(calls[0].0);
    // Manager stores the new schedule and re-dates the job.
    bundle.generation = 2;
    h.event(ManagerEvent::BundleUpdated(bundle));
    runtime.state = JobState::Active;
    h.event(ManagerEvent::JobUpdated(runtime));
    assert_eq!(
        start_jobs(&h.take_calls()).len(),
        1,
        "the rescheduled bundle was not placed"
    );
    let view = h.core.schedule_view(&"b".into(), h.now).unwrap();
    assert_eq!(view.phase, SchedulePhase::Live);
}

// ---------------------------------------------------------------------------
// Manual jobs started and stopped as a desired state (`startedReplicas`, or
// `startBundleJob` / `stopBundleJob`), never as a revision of the bundle.

const MANUAL: &str = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n  - {jobName: record, startMode: manual, requirements: {requiredCapacity: 1}}\n";

fn with_started(bundle: &norsk_auto_manager::model::Bundle, replicas: &[u32]) -> norsk_auto_manager::model::Bundle {
    let mut bundle = bundle.clone();
    bundle.spec.jobs[1].started_replicas = replicas.to_vec();
    bundle
}

fn only_call(
    calls: &[(norsk_auto_manager::automanager::RequestId, Rpc)],
    what: &str,
    matches: impl Fn(&Rpc) -> bool,
) -> norsk_auto_manager::automanager::RequestId {
    let found: Vec<_> = calls.iter().filter(|(_, r)| matches(r)).collect();
    assert_eq!(found.len(), 1, "one {what} expected: {calls:?}");
    found[0].0
}

#[test]
fn a_manual_job_is_started_and_stopped_from_the_bundle_spec_without_a_revision() {
    let mut h = Harness::hydrated();
    let bundle = h.bundle("b", MANUAL);
    h.start_all();
    let encode = job_id("b", 0, "encode");
    let encode_node = h.bound_node(&encode);
    let record = job_id("b", 0, "record");
    let id = h.command(Command::UpdateBundle(with_started(&bundle, &[0])));
    let calls = h.take_calls();
    assert!(
        !calls.iter().any(|(_, r)| matches!(r, Rpc::UpdateBundle(_))),
        "starting a manual job is no revision: {calls:?}"
    );
    let toggle = only_call(
        &calls,
        "StartBundleJob",
        |r| matches!(r, Rpc::StartBundleJob(j) if j.job_name == "record"),
    );
    assert_eq!(h.take_replies(), vec![(id, Ok(()))]);
    h.ok(toggle);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "placed before Manager took it out of dormant"
    );
    h.dormant(&record, false);
    let started = h.start_all();
    let (_, node) = started
        .iter()
        .find(|(j, _)| *j == record)
        .cloned()
        .expect("the started job is placed");

    h.command(Command::UpdateBundle(with_started(&bundle, &[])));
    let calls = h.take_calls();
    assert!(
        !calls.iter().any(|(_, r)| matches!(r, Rpc::UpdateBundle(_))),
        "{calls:?}"
    );
    only_call(
        &calls,
        "StopBundleJob",
        |r| matches!(r, Rpc::StopBundleJob(j) if j.job_name == "record"),
    );
    only_call(
        &calls,
        "StopJob",
        |r| matches!(r, Rpc::StopJob { job_id, node_id, .. } if *job_id == record && *node_id == node),
    );
    for (id, _) in calls {
        h.ok(id);
    }
    h.dormant(&record, true);
    h.history(
        &record,
        JobHistoryEntry::Stopping {
            at: Some(h.now),
            role: InstanceKey("primary".into()),
            node_id: Some(node.clone()),
            reason: norsk_auto_manager::model::JobStopReason::UserRequested,
        },
    );
    h.advance(10 * 60_000);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "a stopped manual job was placed again"
    );
    assert_eq!(h.bound_node(&record), None);
    assert_eq!(h.bound_node(&encode), encode_node, "the other job was touched");
    assert_eq!(
        h.core.applied_spec(&"b".into()).unwrap().jobs[1].started_replicas,
        Vec::<u32>::new()
    );
}

#[test]
fn stopping_a_running_manual_job_stops_its_instance_and_it_is_not_recovered() {
    let mut h = Harness::hydrated();
    h.bundle("b", MANUAL);
    h.start_all();
    let record = job_id("b", 0, "record");
    let reference = h.core.job(&record).unwrap().bundle_ref.clone();
    let start = h.command(Command::StartBundleJob(reference.clone()));
    h.ok_all();
    assert_eq!(h.take_replies(), vec![(start, Ok(()))]);
    h.dormant(&record, false);
    let (_, node) = h.start_all().remove(0);
    let stop = h.command(Command::StopBundleJob(reference));
    let calls = h.take_calls();
    let toggle = only_call(&calls, "StopBundleJob", |r| matches!(r, Rpc::StopBundleJob(_)));
    h.ok(toggle);
    assert_eq!(h.take_replies(), vec![(stop, Ok(()))]);
    let calls = h.take_calls();
    let stop_job = only_call(
        &calls,
        "StopJob",
        |r| matches!(r, Rpc::StopJob { job_id, node_id, .. } if *job_id == record && *node_id == node),
    );
    h.ok(stop_job);
    assert!(
        h.take_notifications()
            .iter()
            .any(|n| matches!(n, Notification::BundleJobStopped { job_id } if *job_id == record))
    );
    // The instance is gone before Manager reports the job dormant: it is
    // still not recovered.
    h.history(
        &record,
        JobHistoryEntry::Stopping {
            at: Some(h.now),
            role: InstanceKey("primary".into()),
            node_id: Some(node.clone()),
            reason: norsk_auto_manager::model::JobStopReason::UserRequested,
        },
    );
    h.stopped(&record, &node, InstanceKey("primary".into()));
    h.advance(60_000);
    assert!(start_jobs(&h.take_calls()).is_empty(), "the stopped job was recovered");
    h.dormant(&record, true);
    h.advance(60_000);
    assert!(h.take_calls().is_empty());
    assert!(h.core.is_dormant(h.core.job(&record).unwrap()));
}

#[test]
fn starting_and_stopping_a_manual_job_keeps_restart_history_and_the_broken_mark() {
    let mut h = Harness::hydrated();
    let bundle = h.bundle("b", MANUAL);
    h.start_all();
    let encode = job_id("b", 0, "encode");
    let record = job_id("b", 0, "record");
    fail_and_recover(&mut h, &encode);
    let restarts = |h: &Harness| h.core.job(&encode).unwrap().restarts.count(h.now);
    assert_eq!(restarts(&h), 1);
    h.command(Command::UpdateBundle(with_started(&bundle, &[0])));
    h.ok_all();
    h.dormant(&record, false);
    h.start_all();
    assert_eq!(restarts(&h), 1, "starting a manual job cleared the restart history");
    h.command(Command::UpdateBundle(with_started(&bundle, &[])));
    h.ok_all();
    assert_eq!(restarts(&h), 1, "stopping a manual job cleared the restart history");

    let on = h.bound_node(&encode).unwrap();
    reject(&mut h, &encode, &on.0, RejectionCode::InvalidSpec, "bad");
    assert_eq!(h.core.broken_bundles().len(), 1);
    h.ok_all();
    h.command(Command::UpdateBundle(with_started(&bundle, &[0])));
    let calls = h.take_calls();
    assert!(
        !calls.iter().any(|(_, r)| matches!(r, Rpc::UpdateBundle(_))),
        "{calls:?}"
    );
    for (id, _) in calls {
        h.ok(id);
    }
    assert_eq!(
        h.core.broken_bundles().len(),
        1,
        "starting a manual job revived a broken bundle"
    );
    h.dormant(&record, false);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "a job of a broken bundle was placed"
    );
}

#[test]
fn start_bundle_job_of_an_auto_job_or_a_missing_replica_is_refused_with_the_reason() {
    let mut h = Harness::hydrated();
    h.bundle("b", MANUAL);
    let encode = h.core.job(&job_id("b", 0, "encode")).unwrap().bundle_ref.clone();
    h.command(Command::StartBundleJob(encode));
    let mut backup = h.core.job(&job_id("b", 0, "record")).unwrap().bundle_ref.clone();
    backup.replica_index = 1;
    h.command(Command::StopBundleJob(backup));
    let replies = h.take_replies();
    assert!(
        matches!(replies[0].1, Err(CommandError::NotManualJob { .. })),
        "{replies:?}"
    );
    assert!(
        matches!(replies[1].1, Err(CommandError::UnknownBundleJob { .. })),
        "{replies:?}"
    );
    let message = replies[0].1.clone().unwrap_err().to_string();
    assert!(message.contains("startMode auto"), "{message}");
    assert!(
        !h.take_calls()
            .iter()
            .any(|(_, r)| matches!(r, Rpc::StartBundleJob(_) | Rpc::StopBundleJob(_))),
        "a refused toggle reached Manager"
    );
}

#[test]
fn a_start_asked_before_the_bundles_events_arrive_is_kept() {
    let mut h = Harness::hydrated();
    let bundle = bundle("b", MANUAL);
    let create = h.command(Command::CreateBundle(bundle.clone()));
    let calls = h.take_calls();
    h.ok(calls[0].0);
    let record = norsk_auto_manager::model::BundleJobRef {
        bundle_id: "b".into(),
        replica_index: 0,
        job_name: "record".into(),
    };
    let start = h.command(Command::StartBundleJob(record));
    let calls = h.take_calls();
    let toggle = only_call(&calls, "StartBundleJob", |r| matches!(r, Rpc::StartBundleJob(_)));
    h.ok(toggle);
    assert_eq!(h.take_replies(), vec![(create, Ok(())), (start, Ok(()))]);
    // Manager's news of the creation and the start come after.
    h.event(ManagerEvent::BundleUpdated(bundle.clone()));
    for mut job in jobs_of(&bundle) {
        job.dormant = false;
        h.event(ManagerEvent::JobActive(job));
    }
    let calls = h.take_calls();
    assert!(
        !calls.iter().any(|(_, r)| matches!(r, Rpc::StopBundleJob(_))),
        "the start was undone: {calls:?}"
    );
    assert_eq!(start_jobs(&calls).len(), 2, "both jobs are placed");
}

#[test]
fn a_fresh_core_after_a_stream_break_answers_a_start_in_flight_and_keeps_what_is_wanted() {
    let mut h = Harness::hydrated();
    let bundle = h.bundle("b", MANUAL);
    h.start_all();
    let record = job_id("b", 0, "record");
    let reference = h.core.job(&record).unwrap().bundle_ref.clone();
    let start = h.command(Command::StartBundleJob(reference));
    let toggle = only_call(&h.take_calls(), "StartBundleJob", |r| {
        matches!(r, Rpc::StartBundleJob(_))
    });
    // The stream breaks with the start in flight; a fresh core hydrates
    // from the new snapshot, where Manager already holds the job started.
    let valid = norsk_auto_manager::automanager::validate_auto_settings(settings()).expect("settings are valid");
    h.core = norsk_auto_manager::automanager::AutoManagerCore::succeeding(valid, &h.core);
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    h.event(ManagerEvent::BundleUpdated(bundle.clone()));
    for mut job in jobs_of(&bundle) {
        job.dormant = false;
        h.event(ManagerEvent::JobActive(job));
    }
    h.event(ManagerEvent::InitialDataComplete);
    h.ok(toggle);
    assert_eq!(h.take_replies(), vec![(start, Ok(()))], "the start was never answered");
    let calls = h.take_calls();
    assert!(
        !calls.iter().any(|(_, r)| matches!(r, Rpc::StopBundleJob(_))),
        "{calls:?}"
    );
    assert!(start_jobs(&calls).iter().any(|(j, _)| *j == record.0), "{calls:?}");
    assert_eq!(h.core.applied_spec(&"b".into()).unwrap().jobs[1].started_replicas, [0]);
}

#[test]
fn a_node_this_core_terminated_no_longer_counts_against_max_nodes_once_it_has_stopped() {
    let mut settings = settings();
    settings.placement_pools = yaml_serde::from_str(&POOLS.replace(
        "      provisionTimeoutMs: 600000\n",
        "      provisionTimeoutMs: 600000\n      maxNodes: 1\n",
    ))
    .expect("pools parse");
    let mut h = Harness::with(settings);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("b", ONE_JOB);
    let calls = h.take_calls();
    let (node, _, node_tags) = create_node(&calls).expect("provisioned on aws");
    assert_eq!(node_tags[tags::TIER], "aws");
    h.ok(calls[0].0);
    let t: Vec<(&str, &str)> = node_tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    h.provisioned_node_starts(node.as_str(), ProviderKind::Aws, &t);
    h.start_all();
    job_ends(&mut h, &job_id("b", 0, "encode"));
    h.command(Command::TerminateNode(node.clone()));
    h.ok_all();
    h.node_stopping(node.as_str(), NodeStopReason::UserRequested);
    h.event(ManagerEvent::NodeStopped(node.clone()));
    h.bundle("c", ONE_JOB);
    let calls = h.take_calls();
    let (again, _, again_tags) = create_node(&calls).expect("a node is provisioned for the next job");
    assert_eq!(
        again_tags[tags::TIER],
        "aws",
        "{again}: the stopped node still counted against the aws tier's maxNodes"
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

#[test]
fn a_node_provisioned_and_forgotten_before_the_next_placement_is_never_placed_on() {
    let mut h = empty_hydrated();
    h.bundle("b", ONE_JOB);
    let calls = h.take_calls();
    let (node, _, _) = create_node(&calls).expect("a node is provisioned");
    h.ok(calls[0].0);
    // Its job ends before it starts: the empty launching node is released,
    // and Manager no longer knows it.
    job_ends(&mut h, &job_id("b", 0, "encode"));
    let terminate = h
        .take_calls()
        .into_iter()
        .find(|(_, r)| matches!(r, Rpc::TerminateNode { node_id } if *node_id == node))
        .expect("the empty launching node is released");
    h.fail(terminate.0, RpcFailureKind::NotFound);
    assert!(!h.core.fleet().contains(&node));
    h.bundle("c", ONE_JOB);
    let calls = h.take_calls();
    let again = create_node(&calls).map(|(n, _, _)| n);
    assert!(
        again.as_ref().is_some_and(|n| *n != node),
        "the next job went to the forgotten node: bound to {:?}, provisioned {again:?}",
        h.bound_node(&job_id("c", 0, "encode"))
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
fn a_bundle_whose_delete_manager_took_is_not_placed_again_before_its_jobs_are_deleted() {
    let mut h = Harness::hydrated();
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 2, onRuntimeFailure: drop}}\n",
    );
    let job = job_id("b", 0, "encode");
    let (_, node) = h.start_all().remove(0);
    h.failed(&job, &node);
    assert!(
        h.take_notifications()
            .iter()
            .any(|n| matches!(n, Notification::JobDropped { .. }))
    );
    h.take_calls();
    let command = h.command(Command::DeleteBundle("b".into()));
    let (id, rpc) = h.take_calls().remove(0);
    assert!(matches!(rpc, Rpc::DeleteBundle(_)));
    h.ok(id);
    assert_eq!(h.take_replies(), vec![(command, Ok(()))]);
    h.advance(60_000);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "a job of a bundle being deleted is not placed again, dropped mark cleared or not"
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

#[test]
fn a_start_still_on_its_way_when_the_stream_breaks_keeps_its_job_and_its_room_in_the_successor() {
    // The successor hydrates from a snapshot Manager took before the start
    // landed: the job shows placed nowhere. Its gate stays shut (no second
    // start of it), its node's room stays held (another job goes
    // elsewhere), and the start's late answer binds it where it landed.
    let mut h = Harness::hydrated();
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 3}}\n",
    );
    let job = job_id("b", 0, "encode");
    let (start, node) = h
        .take_calls()
        .into_iter()
        .find_map(|(id, rpc)| match rpc {
            Rpc::StartJob { node_id, .. } => Some((id, node_id)),
            _ => None,
        })
        .expect("the job is dispatched");
    h.reconnect();
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "no second start of a job whose start is on its way"
    );
    h.bundle(
        "c",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 3}}\n",
    );
    let placed = start_jobs(&h.take_calls());
    assert_eq!(placed.len(), 1, "{placed:?}");
    assert_ne!(placed[0].1, node.0, "the room the start holds is not given away");
    h.ok(start);
    assert_eq!(h.bound_node(&job), Some(node));
    assert!(
        !h.take_calls().iter().any(|(_, rpc)| matches!(rpc, Rpc::StopJob { .. })),
        "the start that landed is the job's placement, not an orphan"
    );
}

#[test]
fn a_bundle_broken_before_the_stream_breaks_stays_broken_in_the_successor_while_its_verdict_is_on_its_way() {
    // `bundleBroken` was announced; the snapshot was taken before the
    // verdict's write landed, so it shows the bundle without a verdict.
    // The outcome stands until the bundle is updated or deleted.
    let mut h = Harness::hydrated();
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 2, onRuntimeFailure: drop}}\n",
    );
    let (job, node) = h.start_all().remove(0);
    h.failed(&job, &node);
    let bundle = norsk_auto_manager::model::BundleId("b".into());
    assert!(h.core.broken_bundles().contains_key(&bundle));
    let write = h
        .take_calls()
        .into_iter()
        .find(|(_, rpc)| matches!(rpc, Rpc::SetTerminalVerdict { .. }))
        .expect("the verdict is written");
    h.reconnect();
    assert!(
        h.core.broken_bundles().contains_key(&bundle),
        "announced broken, the bundle stays broken in the successor"
    );
    h.cluster_node("c", 8.0);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "no job of a broken bundle is placed again"
    );
    h.ok(write.0);
    assert!(h.core.broken_bundles().contains_key(&bundle));
}

#[test]
fn an_instance_a_timed_out_start_made_is_not_the_jobs_in_a_successor_while_its_undoing_stop_is_on_its_way() {
    // The start failed ambiguously and took effect: Manager's history shows
    // the instance, and the stop undoing it is still on its way when the
    // stream breaks. The successor must not bind the job to an instance
    // that is going (the room it takes was given back).
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    let job = job_id("b", 0, "encode");
    let (start, node) = h
        .take_calls()
        .into_iter()
        .find_map(|(id, rpc)| match rpc {
            Rpc::StartJob { node_id, .. } => Some((id, node_id)),
            _ => None,
        })
        .expect("the job is dispatched");
    h.fail(start, RpcFailureKind::Transient);
    let undo = h
        .take_calls()
        .into_iter()
        .find(|(_, rpc)| matches!(rpc, Rpc::StopJob { node_id, .. } if *node_id == node))
        .expect("the instance the start may have made is stopped");
    h.history(
        &job,
        JobHistoryEntry::Provisioned {
            at: Some(h.now),
            role: InstanceKey::slot(Slot::Primary),
            node_id: Some(node.clone()),
        },
    );
    h.reconnect();
    assert_eq!(h.bound_node(&job), None, "an instance being undone is not the job's");
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "not placed before the stop is answered"
    );
    h.ok(undo.0);
    h.stopped(&job, &node, InstanceKey::slot(Slot::Primary));
    h.advance(norsk_auto_manager::automanager::recovery::MIN_RECOVERY_INTERVAL_MS);
    assert_eq!(start_jobs(&h.take_calls()).len(), 1, "placed again once it is gone");
}

#[test]
fn a_successor_keeps_counting_restarts_against_the_same_ceiling_a_node_loss_included() {
    // A restart after a node loss counts against the ceiling, but Manager's
    // history records it as the node stopping, not as a failure: a count
    // rebuilt from history alone would forget it. The successor carries
    // its predecessor's count on.
    let mut h = Harness::hydrated();
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 2, maxRestartsPerHour: 1}}\n",
    );
    let (job, first) = h.start_all().remove(0);
    h.node_stopping(first.as_str(), NodeStopReason::HealthPingTimeExceeded);
    h.advance(norsk_auto_manager::automanager::recovery::MIN_RECOVERY_INTERVAL_MS);
    let (_, second) = h.start_all().remove(0);
    assert_ne!(second, first);
    h.reconnect();
    h.take_notifications();
    h.failed(&job, &second);
    h.advance(norsk_auto_manager::automanager::recovery::MIN_RECOVERY_INTERVAL_MS);
    assert!(
        kinds(&h.take_notifications()).contains(&"bundleBroken".to_owned()),
        "the second restart in the hour is past the ceiling of one"
    );
    assert!(start_jobs(&h.take_calls()).is_empty());
}

#[test]
fn a_forced_drain_still_terminates_its_node_at_the_timeout_after_the_stream_breaks() {
    // A drain is this AutoManager's own work, not in Manager's snapshot:
    // the successor carries it on with its deadline.
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("b", ONE_JOB);
    let started = h.start_all();
    assert_eq!(started.len(), 1);
    let id = h.command(Command::DrainNode {
        node_id: NodeId::from("a"),
        options: norsk_auto_manager::automanager::DrainOptions {
            timeout_ms: Some(60_000),
            force: true,
            after: Some(norsk_auto_manager::automanager::DrainAfter::Terminate),
            ..Default::default()
        },
    });
    assert!(
        h.take_replies()
            .iter()
            .any(|(reply, result)| *reply == id && result.is_ok())
    );
    h.ok_all();
    h.advance(10_000);
    h.reconnect();
    h.ok_all();
    h.advance(51_000);
    let terminated: Vec<NodeId> = h
        .take_calls()
        .into_iter()
        .filter_map(|(_, rpc)| match rpc {
            Rpc::TerminateNode { node_id } => Some(node_id),
            _ => None,
        })
        .collect();
    assert_eq!(terminated, vec![NodeId::from("a")], "the forced drain ends on time");
}

/// A promoted standby, hydrated from Manager's snapshot, in which a spare
/// its predecessor provisioned (tagged for this AutoManager's pool and
/// cloud tier, not for a job) has started and now carries a `singleUse`
/// job.
fn promoted_with_a_single_use_job_on_a_predecessors_spare() -> (Harness, norsk_auto_manager::model::JobId, NodeId) {
    let mut h = Harness::new();
    let node = NodeId::from("production-aws-old-1");
    let node_tags = [(tags::POOL, "production"), (tags::TIER, "aws")];
    h.event(ManagerEvent::NodeStarted(node_info(node.as_str(), &node_tags)));
    h.event(ManagerEvent::NodeInventory {
        node_id: node.clone(),
        inventory: inventory(ProviderKind::Aws, 4.0),
    });
    let b = bundle("b", SINGLE_USE);
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    let job = job_id("b", 0, "encode");
    for mut runtime in jobs_of(&b) {
        runtime.history.push(JobHistoryEntry::Running {
            at: Some(h.now),
            role: InstanceKey::slot(Slot::Primary),
            node_id: Some(node.clone()),
        });
        h.event(ManagerEvent::JobActive(runtime));
    }
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(h.bound_node(&job), Some(node.clone()));
    (h, job, node)
}

#[test]
fn a_promoted_core_releases_a_single_use_jobs_node_its_predecessor_provisioned() {
    // "singleUse: the node is terminated when the job finishes" holds for a
    // node the old leader provisioned: its pool and cloud-tier tags name it
    // this AutoManager's, whichever process asked for it.
    let (mut h, job, node) = promoted_with_a_single_use_job_on_a_predecessors_spare();
    assert!(h.take_calls().is_empty(), "the running job is left alone");
    job_ends(&mut h, &job);
    assert!(
        h.take_calls()
            .iter()
            .any(|(_, r)| matches!(r, Rpc::TerminateNode { node_id } if *node_id == node)),
        "the single-use job's node is released"
    );
}

#[test]
fn a_promoted_core_terminates_a_predecessors_launching_node_at_its_provision_deadline_from_its_creation() {
    // The old leader asked for the node; its provision deadline went with
    // its process. The new leader holds it to `provisionTimeoutMs` counted
    // from when Manager created it, not from the promotion.
    let mut h = Harness::new();
    let timeout = 600_000;
    let node = NodeId::from("production-aws-old-2");
    let mut info = node_info(node.as_str(), &[(tags::POOL, "production"), (tags::TIER, "aws")]);
    let created = h.now - timeout + 60_000;
    info.created_at = Some(created);
    h.event(ManagerEvent::NodeStarting(info));
    h.event(ManagerEvent::InitialDataComplete);
    let terminated = |h: &mut Harness| {
        h.take_calls()
            .iter()
            .any(|(_, r)| matches!(r, Rpc::TerminateNode { node_id } if *node_id == node))
    };
    assert!(!terminated(&mut h), "terminated before its deadline");
    assert_eq!(
        h.next_deadline,
        Some(created + timeout),
        "the core wakes at the deadline"
    );
    h.advance(60_000);
    assert!(terminated(&mut h), "a node that never started is not left launching");
}

#[test]
fn a_promoted_core_stops_a_predecessors_stray_instance_at_hydration() {
    // The old leader moved the job (or prepared a migration target) and
    // its last start landed after it was gone: Manager holds a second
    // instance that is neither the job's placement nor any migration's.
    // Left alone, the job would run on two nodes.
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    let b = bundle("b", ONE_JOB);
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    let job = job_id("b", 0, "encode");
    let primary = InstanceKey::slot(Slot::Primary);
    let stray = InstanceKey(format!("{}@0ld7a29e", primary.as_str()));
    let mut runtime = jobs_of(&b).remove(0);
    runtime.history.push(JobHistoryEntry::Running {
        at: Some(h.now),
        role: primary.clone(),
        node_id: Some(NodeId::from("a")),
    });
    runtime.history.push(JobHistoryEntry::Provisioned {
        at: Some(h.now),
        role: stray.clone(),
        node_id: Some(NodeId::from("b")),
    });
    h.event(ManagerEvent::JobActive(runtime));
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(h.bound_node(&job), Some(NodeId::from("a")), "the placement stands");
    let calls = h.take_calls();
    assert!(
        calls.iter().any(|(_, r)| matches!(
            r,
            Rpc::StopJob { job_id, instance_key, node_id, .. }
                if *job_id == job && *instance_key == stray && node_id.as_str() == "b"
        )),
        "the stray instance is stopped: {calls:?}"
    );
    assert!(
        !calls
            .iter()
            .any(|(_, r)| matches!(r, Rpc::StopJob { instance_key, .. } if *instance_key == primary)),
        "the job's own instance keeps running"
    );
}

#[test]
fn a_strays_stop_on_its_way_keeps_it_from_carrying_the_job_after_a_stream_break() {
    // The promoted core is stopping a predecessor's stray instance on `b`
    // when the job's own instance on `a` fails and the job is dropped.
    // The stream then breaks before Manager carried out the stop: the
    // successor reads a history in which the stray still runs after the
    // job's instance stopped, the way a migration target that took over
    // reads. It is no such target — a stop is on its way to it — so the
    // dropped job stays unbound and the node it is going from is nobody's.
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    let b = bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1, essential: false, onRuntimeFailure: drop}}\n",
    );
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    let job = job_id("b", 0, "encode");
    let primary = InstanceKey::slot(Slot::Primary);
    let stray = InstanceKey(format!("{}@0ld7a29e", primary.as_str()));
    let mut runtime = jobs_of(&b).remove(0);
    for (key, node) in [(&primary, "a"), (&stray, "b")] {
        runtime.history.push(JobHistoryEntry::Running {
            at: Some(h.now),
            role: key.clone(),
            node_id: Some(NodeId::from(node)),
        });
    }
    h.event(ManagerEvent::JobActive(runtime));
    h.event(ManagerEvent::InitialDataComplete);
    let stops = h.take_calls();
    assert!(
        stops
            .iter()
            .any(|(_, r)| matches!(r, Rpc::StopJob { instance_key, .. } if *instance_key == stray)),
        "the stray's stop is on its way: {stops:?}"
    );
    h.advance(1_000);
    h.failed(&job, &NodeId::from("a"));
    assert_eq!(h.bound_node(&job), None, "the job is dropped");
    h.reconnect();
    assert_eq!(
        h.bound_node(&job),
        None,
        "the stray a stop is on its way to does not take the job over"
    );
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "a dropped job is not started again"
    );
}

/// A core following Manager (a standby, or a fresh process hydrating) whose
/// job runs on `a`: node `a` goes before the core is hydrated — after its
/// leader died, so no one judged the loss.
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
fn jobs_kept_apart_found_on_one_node_at_hydration_are_parted_the_newest_placed_again() {
    // The old leader migrated `j0` off `a` (`stopThenStart`): its stop of
    // the source was never confirmed when the phase deadlines moved the job
    // onto its target, and it placed `j1` — kept apart from `j0` — on `a`,
    // then died. Manager gave the stop up and the target's late start is a
    // stray: the new leader finds `j0` and `j1` running side by side on
    // `a`, against a hard rule. The newest is stopped and placed again,
    // nothing counted as a failure; `j0` keeps running.
    let mut h = Harness::new();
    h.cluster_node("a", 8.0);
    h.cluster_node("b", 8.0);
    let b = bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: j0, requirements: {requiredCapacity: 2}}\n  - {jobName: j1, separateFrom: [j0], requirements: {requiredCapacity: 2}}\n",
    );
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    let a = NodeId::from("a");
    for (mut runtime, at) in jobs_of(&b).into_iter().zip([h.now - 60_000, h.now]) {
        runtime.history.push(JobHistoryEntry::Running {
            at: Some(at),
            role: InstanceKey::slot(Slot::Primary),
            node_id: Some(a.clone()),
        });
        h.event(ManagerEvent::JobActive(runtime));
    }
    h.event(ManagerEvent::InitialDataComplete);
    let (j0, j1) = (job_id("b", 0, "j0"), job_id("b", 0, "j1"));
    assert_eq!(h.bound_node(&j0), Some(a.clone()), "the oldest stays");
    let calls = h.take_calls();
    let stop = calls
        .iter()
        .find(|(_, r)| matches!(r, Rpc::StopJob { job_id, node_id, .. } if *job_id == j1 && *node_id == a));
    let Some((stop, _)) = stop else {
        panic!("the newest is stopped on the node it shares with the job it is kept apart from: {calls:?}");
    };
    assert!(
        !calls
            .iter()
            .any(|(_, r)| matches!(r, Rpc::StopJob { job_id, .. } if *job_id == j0)),
        "the oldest keeps running"
    );
    let notes = h.take_notifications();
    assert!(
        notes
            .iter()
            .any(|n| matches!(n, Notification::Error { message } if message.contains("kept apart"))),
        "the operator is told why: {notes:?}"
    );
    h.ok(*stop);
    h.stopped(&j1, &a, InstanceKey::slot(Slot::Primary));
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![(j1.0.clone(), "b".to_owned())],
        "placed again apart from j0"
    );
    assert!(
        h.core.job(&j1).is_some_and(|r| r.restarts.count(h.now) == 0),
        "not counted against the restart ceiling"
    );
}

#[test]
fn a_node_running_more_than_it_holds_at_hydration_keeps_its_oldest_instance_and_places_the_newest_again() {
    // The old leader stopped `old` on `a` and placed `new` in its room; the
    // stop never landed. Both run on a node that holds one: the newest is
    // stopped and placed again, and nothing is counted as a failure.
    let mut h = Harness::new();
    h.cluster_node("a", 2.0);
    h.cluster_node("b", 2.0);
    let old = bundle("old", ONE_JOB);
    let new = bundle("new", ONE_JOB);
    for (b, at) in [(&old, h.now - 60_000), (&new, h.now)] {
        h.event(ManagerEvent::BundleUpdated(b.clone()));
        let mut runtime = jobs_of(b).remove(0);
        runtime.history.push(JobHistoryEntry::Running {
            at: Some(at),
            role: InstanceKey::slot(Slot::Primary),
            node_id: Some(NodeId::from("a")),
        });
        h.event(ManagerEvent::JobActive(runtime));
    }
    h.event(ManagerEvent::InitialDataComplete);
    let (old_job, new_job) = (job_id("old", 0, "encode"), job_id("new", 0, "encode"));
    assert_eq!(h.bound_node(&old_job), Some(NodeId::from("a")), "the oldest stays");
    let calls = h.take_calls();
    let stop = calls.iter().find(
        |(_, r)| matches!(r, Rpc::StopJob { job_id, node_id, .. } if *job_id == new_job && node_id.as_str() == "a"),
    );
    let Some((stop, _)) = stop else {
        panic!("the newest instance is stopped: {calls:?}");
    };
    assert!(
        !calls
            .iter()
            .any(|(_, r)| matches!(r, Rpc::StopJob { job_id, .. } if *job_id == old_job)),
        "the oldest keeps running"
    );
    h.ok(*stop);
    h.stopped(&new_job, &NodeId::from("a"), InstanceKey::slot(Slot::Primary));
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![(new_job.0.clone(), "b".to_owned())],
        "placed again where there is room"
    );
    assert!(
        h.core.job(&new_job).is_some_and(|r| r.restarts.count(h.now) == 0),
        "not counted against the restart ceiling"
    );
}

#[test]
fn a_start_awaited_when_the_stream_breaks_binds_its_job_in_the_successor_while_an_earlier_stop_of_the_job_is_on_its_way()
 {
    // A new leader found two instances of `new` it must stop: a migration
    // target a predecessor's late call made on `b`, and its instance on
    // `a`, a node running more than it holds. The stop on `a` landed and
    // `new` was started on `b`; the stream broke with that start and the
    // stop of the stray target still on their way. The start is what the
    // successor awaits for the job: when it lands the job runs on `b`, once,
    // as the core says.
    let primary = InstanceKey::slot(Slot::Primary);
    let target = InstanceKey(format!("{}@0ld7a29e", primary.as_str()));
    let (a, b) = (NodeId::from("a"), NodeId::from("b"));
    let mut h = Harness::new();
    h.cluster_node("a", 2.0);
    h.cluster_node("b", 2.0);
    let old = bundle("old", ONE_JOB);
    let new = bundle("new", ONE_JOB);
    for (bundle, at) in [(&old, h.now - 60_000), (&new, h.now)] {
        h.event(ManagerEvent::BundleUpdated(bundle.clone()));
        let mut runtime = jobs_of(bundle).remove(0);
        runtime.history.push(JobHistoryEntry::Running {
            at: Some(at),
            role: primary.clone(),
            node_id: Some(a.clone()),
        });
        h.event(ManagerEvent::JobActive(runtime));
    }
    let new_job = job_id("new", 0, "encode");
    let mut runtime = h.core.job(&new_job).expect("job known").job.clone();
    runtime.history.push(JobHistoryEntry::Provisioned {
        at: Some(h.now),
        role: target.clone(),
        node_id: Some(b.clone()),
    });
    h.event(ManagerEvent::JobActive(runtime));
    h.event(ManagerEvent::InitialDataComplete);
    let stop_on = |calls: &[(RequestId, Rpc)], key: &InstanceKey, node: &NodeId| {
        calls.iter().find_map(|(id, rpc)| match rpc {
            Rpc::StopJob {
                job_id,
                instance_key,
                node_id,
            } if *job_id == new_job && instance_key == key && node_id == node => Some(*id),
            _ => None,
        })
    };
    let calls = h.take_calls();
    let stray_stop = stop_on(&calls, &target, &b).expect("the stray target is stopped");
    let shed = stop_on(&calls, &primary, &a).expect("the newest instance on the over-committed node is stopped");
    h.ok(shed);
    h.stopped(&new_job, &a, primary.clone());
    let calls = h.take_calls();
    let start = calls
        .iter()
        .find_map(|(id, rpc)| {
            matches!(rpc, Rpc::StartJob { job_id, node_id, .. } if *job_id == new_job && *node_id == b).then_some(*id)
        })
        .unwrap_or_else(|| panic!("placed again where there is room: {calls:?}"));
    h.reconnect();
    h.ok(start);
    h.history(
        &new_job,
        JobHistoryEntry::Running {
            at: Some(h.now),
            role: primary.clone(),
            node_id: Some(b.clone()),
        },
    );
    assert_eq!(
        h.bound_node(&new_job),
        Some(b.clone()),
        "the start that landed is the job's placement"
    );
    h.ok(stray_stop);
    h.stopped(&new_job, &b, target);
    let calls = h.take_calls();
    assert!(
        !calls
            .iter()
            .any(|(_, rpc)| matches!(rpc, Rpc::StartJob { job_id, .. } if *job_id == new_job)),
        "the job runs once, not started again: {calls:?}"
    );
    assert!(
        stop_on(&calls, &primary, &b).is_none(),
        "its instance is not stopped as an orphan: {calls:?}"
    );
    assert_eq!(h.bound_node(&new_job), Some(b));
}

#[test]
fn a_co_located_group_split_across_nodes_at_hydration_is_placed_back_together() {
    // "Co-located jobs share a node." The old leader moved `package` off
    // `a` and its stop of the new instance on `b` never landed; nothing is
    // migrating. The group stays where its oldest instance runs, and
    // `package` is stopped on `b` to be placed with it.
    let mut h = Harness::new();
    h.cluster_node("a", 8.0);
    h.cluster_node("b", 8.0);
    let b = bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n  - {jobName: package, coLocateWith: [encode], requirements: {requiredCapacity: 1}}\n",
    );
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    let encode = job_id("b", 0, "encode");
    let package = job_id("b", 0, "package");
    let mut jobs = jobs_of(&b);
    for (job, (node, at)) in jobs.iter_mut().zip([("a", h.now - 60_000), ("b", h.now)]) {
        job.history.push(JobHistoryEntry::Running {
            at: Some(at),
            role: InstanceKey::slot(Slot::Primary),
            node_id: Some(NodeId::from(node)),
        });
    }
    for job in jobs {
        h.event(ManagerEvent::JobActive(job));
    }
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(h.bound_node(&encode), Some(NodeId::from("a")));
    let calls = h.take_calls();
    let Some((stop, _)) = calls.iter().find(
        |(_, r)| matches!(r, Rpc::StopJob { job_id, node_id, .. } if *job_id == package && node_id.as_str() == "b"),
    ) else {
        panic!("the member apart from its group is stopped: {calls:?}");
    };
    h.ok(*stop);
    h.stopped(&package, &NodeId::from("b"), InstanceKey::slot(Slot::Primary));
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![(package.0.clone(), "a".to_owned())],
        "placed with its group"
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

/// A cluster node of pool `production` with 8 vCPUs and one GPU device.
fn gpu_node(h: &mut Harness, id: &str) {
    h.event(ManagerEvent::NodeStarted(node_info(id, &[(tags::POOL, "production")])));
    let mut inventory = inventory(ProviderKind::LocalServers, 8.0);
    inventory.gpus = vec![norsk_auto_manager::model::Gpu {
        model: "t4".into(),
        total_capacity: 1.0,
    }];
    h.event(ManagerEvent::NodeInventory {
        node_id: NodeId::from(id),
        inventory,
    });
}

#[test]
fn a_successor_stops_the_newest_instance_a_gpu_cannot_hold_and_places_it_again() {
    // A leader undid a start whose answer was lost (its stop never landed)
    // and gave the GPU to another job; its successor finds both on the
    // node's one device. No device is ever double-booked: the newest
    // instance is stopped, and its job placed again where a GPU is free.
    let mut h = Harness::new();
    gpu_node(&mut h, "a");
    gpu_node(&mut h, "b");
    let spec = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1, requiredGpuCapacity: 0.6}}\n";
    let mut runtimes = Vec::new();
    for (i, name) in ["older", "newer"].into_iter().enumerate() {
        let b = bundle(name, spec);
        h.event(ManagerEvent::BundleUpdated(b.clone()));
        let mut runtime = jobs_of(&b).remove(0);
        runtime.history.push(JobHistoryEntry::Running {
            at: Some(h.now + i as i64),
            role: InstanceKey::slot(Slot::Primary),
            node_id: Some(NodeId::from("a")),
        });
        runtimes.push(runtime);
    }
    for runtime in runtimes {
        h.event(ManagerEvent::JobActive(runtime));
    }
    h.event(ManagerEvent::InitialDataComplete);
    let (older, newer) = (job_id("older", 0, "encode"), job_id("newer", 0, "encode"));
    let calls = h.take_calls();
    assert!(
        calls
            .iter()
            .any(|(_, rpc)| matches!(rpc, Rpc::StopJob { job_id, node_id, .. }
            if *job_id == newer && node_id.as_str() == "a")),
        "the newer instance is stopped: {calls:?}"
    );
    assert_eq!(h.bound_node(&older), Some(NodeId::from("a")), "the older one stays");
    for (id, _) in &calls {
        h.ok(*id);
    }
    h.stopped(&newer, &NodeId::from("a"), InstanceKey::slot(Slot::Primary));
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![(newer.0.clone(), "b".to_owned())],
        "placed again where a GPU is free"
    );
}

#[test]
fn a_node_provisioned_for_an_aws_tier_asks_for_the_tiers_root_volume() {
    let mut settings = crate::support::settings();
    settings.placement_pools = yaml_serde::from_str(
        "- name: production\n  tiers:\n    - name: aws\n      kind: aws\n      region: eu-west-1\n      rootVolume: {sizeGib: 200, volumeType: gp3}\n      candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 4, totalCores: 4}]\n",
    )
    .unwrap();
    let mut h = Harness::with(settings);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("b", ONE_JOB);
    let asked = h.take_calls().into_iter().find_map(|(_, rpc)| match rpc {
        Rpc::CreateNode { root_volume, .. } => Some(root_volume),
        _ => None,
    });
    assert_eq!(
        asked,
        Some(Some(norsk_auto_manager::model::RootVolume {
            size_gib: 200,
            volume_type: Some("gp3".into()),
        })),
        "the tier's rootVolume is sent with the node's creation"
    );
}
