//! Placement and provisioning: one dispatch at a time and a failed one
//! retried, warmth and resilience reported, and on elastic tiers a node
//! provisioned, tagged and used by later jobs, the offering's next shape
//! or tier tried when refused, `maxNodes`, `rootVolume` and the provision
//! timeout.

use norsk_auto_manager::automanager::{Command, Notification, Rpc, RpcFailureKind};
use norsk_auto_manager::model::{ManagerEvent, NodeId, NodeStopReason, ProviderKind, tags};

use crate::support::scenario::*;
use crate::support::*;

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
