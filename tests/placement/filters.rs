//! One test per hard filter of the chain, in the spec's order: each proves
//! the filter rejects the node it must, with its typed reason and numbers,
//! and lets the node it must through.

use norsk_auto_manager::model::{HostPort, NodeId, NodePhase, OnRuntimeFailure};
use norsk_auto_manager::placement::{Filter, Name, PlacementRequest, RecoveryContext, Rejection};

use crate::support::*;

const TWO_NODES: &str = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, az: z1, totalCapacity: 4, totalCores: 4}}
  - {id: b, pool: p, tier: t, phase: running, inventory: {kind: aws, az: z1, totalCapacity: 4, totalCores: 4}}
";

const ONE_JOB: &str = "pool: p\njobs: [{jobName: j, requirements: {requiredCapacity: 1}}]";

#[test]
fn target_node_pin_rejects_every_other_node() {
    let view = view(ONE_FIXED_TIER, TWO_NODES);
    let spec = bundle(ONE_JOB);
    let id = bundle_id();
    let target = NodeId::from("b");
    let placement = place_with(&view, PlacementRequest::launch(&id, &spec, 0, "j").pinned_to(&target));
    assert_eq!(node_of(&placement), Some("b"));
    assert_eq!(rejection(&placement, "a"), Some(Rejection::NotTargetNode));
    assert_eq!(Rejection::NotTargetNode.filter(), Filter::TargetNode);
}

#[test]
fn nodes_of_another_pool_are_rejected() {
    let pools = "
- {name: p, tiers: [{name: t, kind: aws, scaleOut: fixed}]}
- {name: q, tiers: [{name: t, kind: aws, scaleOut: fixed}]}
";
    let fleet = "
nodes:
  - {id: a, pool: q, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 4}}
  - {id: b, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 4}}
";
    let placement = launch(&view(pools, fleet), &bundle(ONE_JOB), 0, "j");
    assert_eq!(node_of(&placement), Some("b"));
    assert_eq!(
        rejection(&placement, "a"),
        Some(Rejection::OtherPool {
            node_pool: Some(Name::from("q"))
        })
    );
}

#[test]
fn nodes_of_another_tier_are_rejected_while_a_tier_is_walked() {
    let pools = "
- name: p
  tiers:
    - {name: first, kind: aws, scaleOut: fixed}
    - {name: second, kind: aws, scaleOut: elastic, candidateInstanceTypes: [{instanceType: m, totalCapacity: 4}]}
";
    let fleet = "
nodes:
  - {id: a, pool: p, tier: second, phase: running, inventory: {kind: aws, totalCapacity: 4}}
  - {id: b, pool: p, tier: first, phase: running, inventory: {kind: aws, totalCapacity: 4}}
";
    let placement = launch(&view(pools, fleet), &bundle(ONE_JOB), 0, "j");
    assert_eq!(
        node_of(&placement),
        Some("b"),
        "the first tier wins while it has a survivor"
    );
    assert_eq!(
        rejection(&placement, "a"),
        Some(Rejection::OtherTier {
            node_tier: Some(Name::from("second"))
        })
    );
}

#[test]
fn recovery_excluded_nodes_are_rejected() {
    let view = view(ONE_FIXED_TIER, TWO_NODES);
    let spec = bundle(ONE_JOB);
    let id = bundle_id();
    let context = RecoveryContext {
        on_runtime_failure: Some(OnRuntimeFailure::PreferSpare),
        excluded_nodes: vec![NodeId::from("a")],
    };
    let placement = place_with(&view, PlacementRequest::launch(&id, &spec, 0, "j").recovering(&context));
    assert_eq!(node_of(&placement), Some("b"));
    assert_eq!(rejection(&placement, "a"), Some(Rejection::ExcludedByRecovery));
}

#[test]
fn nodes_without_inventory_stopping_or_unhealthy_are_unreachable() {
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running}
  - {id: b, pool: p, tier: t, phase: stopping, inventory: {kind: aws, totalCapacity: 4}}
  - {id: c, pool: p, tier: t, phase: running, unhealthy: true, inventory: {kind: aws, totalCapacity: 4}}
  - {id: d, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 4}}
";
    let placement = launch(&view(ONE_FIXED_TIER, fleet), &bundle(ONE_JOB), 0, "j");
    assert_eq!(node_of(&placement), Some("d"));
    assert_eq!(rejection(&placement, "a"), Some(Rejection::NoInventory));
    assert_eq!(
        rejection(&placement, "b"),
        Some(Rejection::NotRunning {
            phase: NodePhase::Stopping
        })
    );
    assert_eq!(rejection(&placement, "c"), Some(Rejection::Unhealthy));
    assert!(rejection(&placement, "c").is_some_and(|r| r.filter() == Filter::Reachable));
}

#[test]
fn cordoned_nodes_take_no_new_placements() {
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, cordoned: true, inventory: {kind: aws, totalCapacity: 4}}
  - {id: b, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 4}}
";
    let placement = launch(&view(ONE_FIXED_TIER, fleet), &bundle(ONE_JOB), 0, "j");
    assert_eq!(node_of(&placement), Some("b"));
    assert_eq!(rejection(&placement, "a"), Some(Rejection::Cordoned));
}

#[test]
fn exclusively_reserved_spares_refuse_other_templates_unless_the_bundle_overrides() {
    let fleet = "
nodes:
  - {id: spare, pool: p, tier: t, phase: running, spare: true,
     spareSpec: {reservedFor: [xyz], exclusive: true}, inventory: {kind: aws, totalCapacity: 4}}
";
    let view = view(ONE_FIXED_TIER, fleet);
    let other = bundle("pool: p\njobs: [{jobName: j, template: other}]");
    let placement = launch(&view, &other, 0, "j");
    assert_eq!(node_of(&placement), None);
    assert_eq!(
        rejection(&placement, "spare"),
        Some(Rejection::ReservedForOtherTemplates)
    );

    let owner = bundle("pool: p\njobs: [{jobName: j, template: xyz}]");
    assert_eq!(node_of(&launch(&view, &owner, 0, "j")), Some("spare"));
    let overriding = bundle("pool: p\noverrideReservation: true\njobs: [{jobName: j, template: other}]");
    assert_eq!(node_of(&launch(&view, &overriding, 0, "j")), Some("spare"));
}

#[test]
fn nodes_lacking_a_required_capability_are_rejected() {
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 4, capabilities: [sdi]}}
  - {id: b, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 4, capabilities: [sdi, norsk.io/nvidia-gpu]}}
";
    let spec =
        bundle("pool: p\njobs: [{jobName: j, requirements: {requiredCapabilities: [norsk.io/nvidia-gpu, sdi]}}]");
    let placement = launch(&view(ONE_FIXED_TIER, fleet), &spec, 0, "j");
    assert_eq!(node_of(&placement), Some("b"));
    assert_eq!(
        rejection(&placement, "a"),
        Some(Rejection::MissingCapability {
            capability: Name::from("norsk.io/nvidia-gpu")
        })
    );
}

#[test]
fn free_capacity_is_total_times_utilization_cap_minus_reserved() {
    // 8 vCPU × 0.5 − 1 held outside placement − 1 placed = 2 free.
    let fleet = "
nodes:
  - id: a
    pool: p
    tier: t
    phase: running
    inventory: {kind: aws, totalCapacity: 8, utilizationCap: 0.5, reservedCapacity: 1}
    jobs: [{jobId: other, requiredCapacity: 1}]
";
    let view = view(ONE_FIXED_TIER, fleet);
    let too_big = launch(
        &view,
        &bundle("pool: p\njobs: [{jobName: j, requirements: {requiredCapacity: 2.5}}]"),
        0,
        "j",
    );
    assert_eq!(
        rejection(&too_big, "a"),
        Some(Rejection::InsufficientCapacity { needed: 2.5, free: 2.0 })
    );
    let fits = launch(
        &view,
        &bundle("pool: p\njobs: [{jobName: j, requirements: {requiredCapacity: 2}}]"),
        0,
        "j",
    );
    assert_eq!(node_of(&fits), Some("a"));
}

#[test]
fn a_utilization_cap_outside_zero_to_one_is_read_as_one() {
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 4, utilizationCap: 4}}
";
    let spec = bundle("pool: p\njobs: [{jobName: j, requirements: {requiredCapacity: 5}}]");
    let placement = launch(&view(ONE_FIXED_TIER, fleet), &spec, 0, "j");
    assert_eq!(
        rejection(&placement, "a"),
        Some(Rejection::InsufficientCapacity { needed: 5.0, free: 4.0 })
    );
}

#[test]
fn pinned_cores_are_counted_against_total_cores() {
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8, totalCores: 4},
     jobs: [{jobId: other, requiredCores: 3}]}
";
    let spec = bundle("pool: p\njobs: [{jobName: j, requirements: {requiredCores: 2}}]");
    let placement = launch(&view(ONE_FIXED_TIER, fleet), &spec, 0, "j");
    assert_eq!(
        rejection(&placement, "a"),
        Some(Rejection::InsufficientCores { needed: 2, free: 1 })
    );
}

#[test]
fn host_ports_are_exclusive_per_node() {
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 4},
     jobs: [{jobId: other, requiredHostPorts: [1935/tcp]}]}
  - {id: b, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 4},
     jobs: [{jobId: other2, requiredHostPorts: [1935/udp]}]}
";
    let spec = bundle("pool: p\njobs: [{jobName: j, requirements: {requiredHostPorts: [1935/tcp]}}]");
    let placement = launch(&view(ONE_FIXED_TIER, fleet), &spec, 0, "j");
    let port: HostPort = "1935/tcp".parse().unwrap();
    assert_eq!(rejection(&placement, "a"), Some(Rejection::HostPortTaken { port }));
    assert_eq!(node_of(&placement), Some("b"), "udp 1935 is another port");
}

#[test]
fn gpu_capacity_is_reserved_per_device_from_placed_jobs() {
    let fleet = "
nodes:
  - id: a
    pool: p
    tier: t
    phase: running
    inventory: {kind: aws, totalCapacity: 8, gpus: [{model: t4, totalCapacity: 1}, {model: t4, totalCapacity: 1}]}
    jobs:
      - {jobId: x, requiredGpuCapacity: 0.6, gpuIndex: 0}
      - {jobId: y, requiredGpuCapacity: 0.3, gpuIndex: 1}
";
    let view = view(ONE_FIXED_TIER, fleet);
    // 0.4 fits device 0 exactly (0.4 free) and device 1 (0.7 free): the
    // tighter device is chosen, keeping room on the other.
    let fits = launch(
        &view,
        &bundle("pool: p\njobs: [{jobName: j, requirements: {requiredGpuCapacity: 0.4}}]"),
        0,
        "j",
    );
    assert!(matches!(
        fits.outcome,
        norsk_auto_manager::placement::Outcome::Placed { gpu_index: Some(0), .. }
    ));
    // 0.8 fits no device although 1.1 is free across the node.
    let too_big = launch(
        &view,
        &bundle("pool: p\njobs: [{jobName: j, requirements: {requiredGpuCapacity: 0.8}}]"),
        0,
        "j",
    );
    assert_eq!(
        rejection(&too_big, "a"),
        Some(Rejection::NoGpuFits {
            needed: 0.8,
            largest_free: 0.7
        })
    );
    let wrong_model =
        bundle("pool: p\njobs: [{jobName: j, requirements: {requiredGpuCapacity: 0.1, requiredGpuModel: a10}}]");
    assert_eq!(
        rejection(&launch(&view, &wrong_model, 0, "j"), "a"),
        Some(Rejection::NoGpuFits {
            needed: 0.1,
            largest_free: 0.0
        })
    );
}

#[test]
fn two_jobs_are_never_double_booked_onto_one_gpu() {
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8, gpus: [{model: t4, totalCapacity: 1}]}}
";
    let mut view = view(ONE_FIXED_TIER, fleet);
    let spec = bundle(
        "pool: p\njobs: [{jobName: j1, requirements: {requiredGpuCapacity: 0.6}}, {jobName: j2, requirements: {requiredGpuCapacity: 0.6}}]",
    );
    let first = launch(&view, &spec, 0, "j1");
    assert_eq!(node_of(&first), Some("a"));
    apply(&mut view, &spec, 0, "j1", &first);
    let second = launch(&view, &spec, 0, "j2");
    assert!(rejection(&second, "a").is_some_and(|r| r.filter() == Filter::GpuFit));
}

#[test]
fn an_exclusive_job_needs_a_node_without_other_jobs_and_keeps_it() {
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8}, jobs: [{jobId: other}]}
  - {id: b, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8}}
";
    let mut view = view(ONE_FIXED_TIER, fleet);
    let spec = bundle("pool: p\njobs: [{jobName: solo, exclusive: true}, {jobName: other}]");
    let solo = launch(&view, &spec, 0, "solo");
    assert_eq!(rejection(&solo, "a"), Some(Rejection::NodeNotEmpty { other_jobs: 1 }));
    assert_eq!(node_of(&solo), Some("b"));
    apply(&mut view, &spec, 0, "solo", &solo);
    let other = launch(&view, &spec, 0, "other");
    assert_eq!(rejection(&other, "b"), Some(Rejection::HeldExclusively));
}

#[test]
fn an_exclusive_job_shares_its_node_with_co_located_peers_only() {
    let mut view = view(ONE_FIXED_TIER, TWO_NODES);
    let spec = bundle("pool: p\njobs: [{jobName: solo, exclusive: true}, {jobName: peer, coLocateWith: [solo]}]");
    let solo = launch(&view, &spec, 0, "solo");
    apply(&mut view, &spec, 0, "solo", &solo);
    let peer = launch(&view, &spec, 0, "peer");
    assert_eq!(node_of(&peer), node_of(&solo));
}

#[test]
fn co_located_jobs_share_a_node_and_separated_jobs_never_do() {
    let mut view = view(ONE_FIXED_TIER, TWO_NODES);
    let spec = bundle(
        "pool: p\njobs: [{jobName: enc}, {jobName: pkg, coLocateWith: [enc]}, {jobName: mon, separateFrom: [enc]}]",
    );
    let enc = launch(&view, &spec, 0, "enc");
    assert_eq!(node_of(&enc), Some("a"));
    apply(&mut view, &spec, 0, "enc", &enc);
    let pkg = launch(&view, &spec, 0, "pkg");
    assert_eq!(node_of(&pkg), Some("a"));
    assert_eq!(
        rejection(&pkg, "b"),
        Some(Rejection::AwayFromCoLocatedPeer {
            peer: Name::from("enc")
        })
    );
    let mon = launch(&view, &spec, 0, "mon");
    assert_eq!(node_of(&mon), Some("b"));
    assert_eq!(
        rejection(&mon, "a"),
        Some(Rejection::HostsSeparatedPeer {
            peer: Name::from("enc")
        })
    );
}

#[test]
fn hard_same_az_keeps_a_replica_in_the_az_of_its_placed_jobs() {
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, az: z1, totalCapacity: 2}}
  - {id: b, pool: p, tier: t, phase: running, inventory: {kind: aws, az: z2, totalCapacity: 2}}
  - {id: c, pool: p, tier: t, phase: running, inventory: {kind: aws, az: z1, totalCapacity: 2}}
";
    let mut view = view(ONE_FIXED_TIER, fleet);
    let spec = bundle(
        "pool: p\nintraReplicaPlacement: {sameAz: hard}\njobs: [{jobName: one, requirements: {requiredCapacity: 2}}, {jobName: two, requirements: {requiredCapacity: 2}}]",
    );
    let one = launch(&view, &spec, 0, "one");
    assert_eq!(node_of(&one), Some("a"));
    apply(&mut view, &spec, 0, "one", &one);
    let two = launch(&view, &spec, 0, "two");
    assert_eq!(node_of(&two), Some("c"));
    assert_eq!(
        rejection(&two, "b"),
        Some(Rejection::OutsidePeerAz {
            peer_az: Some(Name::from("z1")),
            node_az: Some(Name::from("z2"))
        })
    );
}

#[test]
fn filters_run_in_the_spec_order() {
    // A cordoned node that is also full and lacks a capability is reported
    // as cordoned: the first failing filter names the rejection.
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, cordoned: true, inventory: {kind: aws, totalCapacity: 1}}
";
    let spec =
        bundle("pool: p\njobs: [{jobName: j, requirements: {requiredCapacity: 2, requiredCapabilities: [sdi]}}]");
    assert_eq!(
        rejection(&launch(&view(ONE_FIXED_TIER, fleet), &spec, 0, "j"), "a"),
        Some(Rejection::Cordoned)
    );
    let order = [
        Filter::TargetNode,
        Filter::Pool,
        Filter::Tier,
        Filter::RecoveryExclusion,
        Filter::Reachable,
        Filter::Cordoned,
        Filter::ExclusiveReservation,
        Filter::Capabilities,
        Filter::Capacity,
        Filter::Cores,
        Filter::HostPorts,
        Filter::GpuFit,
        Filter::Exclusivity,
        Filter::IntraReplica,
        Filter::IntraReplicaAz,
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn capabilities_beyond_the_sixty_fourth_are_checked_too() {
    let many: Vec<String> = (0..70).map(|i| format!("c{i}")).collect();
    let fleet = format!(
        "
nodes:
  - {{id: a, pool: p, tier: t, phase: running, inventory: {{kind: aws, totalCapacity: 4, capabilities: [{}]}}}}
  - {{id: b, pool: p, tier: t, phase: running, inventory: {{kind: aws, totalCapacity: 4, capabilities: [{}]}}}}
",
        many[..69].join(", "),
        many.join(", ")
    );
    let spec = bundle("pool: p\njobs: [{jobName: j, requirements: {requiredCapabilities: [c3, c69]}}]");
    let placement = launch(&view(ONE_FIXED_TIER, &fleet), &spec, 0, "j");
    assert_eq!(node_of(&placement), Some("b"));
    assert_eq!(
        rejection(&placement, "a"),
        Some(Rejection::MissingCapability {
            capability: Name::from("c69")
        })
    );
}

#[test]
fn a_job_within_the_capacity_tolerance_of_the_free_capacity_fits() {
    // `CAPACITY_EPSILON` (1e-9): fractional sums that land a hair above a
    // node's capacity still fit, up to and including the tolerance.
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 4}}
";
    let view = view(ONE_FIXED_TIER, fleet);
    let at_tolerance = launch(
        &view,
        &bundle("pool: p\njobs: [{jobName: j, requirements: {requiredCapacity: 4.000000001}}]"),
        0,
        "j",
    );
    assert_eq!(node_of(&at_tolerance), Some("a"));
    let past_it = launch(
        &view,
        &bundle("pool: p\njobs: [{jobName: j, requirements: {requiredCapacity: 4.00000001}}]"),
        0,
        "j",
    );
    assert_eq!(
        rejection(&past_it, "a"),
        Some(Rejection::InsufficientCapacity {
            needed: 4.00000001,
            free: 4.0
        })
    );
}

#[test]
fn a_job_pinning_exactly_the_free_cores_fits() {
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8, totalCores: 4},
     jobs: [{jobId: other, requiredCores: 3}]}
";
    let spec = bundle("pool: p\njobs: [{jobName: j, requirements: {requiredCores: 1}}]");
    let placement = launch(&view(ONE_FIXED_TIER, fleet), &spec, 0, "j");
    assert_eq!(node_of(&placement), Some("a"));
}

#[test]
fn a_gpu_ask_takes_the_tightest_device_that_fits_the_lowest_index_on_a_tie() {
    let gpu_of = |placement: &norsk_auto_manager::placement::Placement| match placement.outcome {
        norsk_auto_manager::placement::Outcome::Placed { gpu_index, .. } => gpu_index,
        _ => None,
    };
    let ask = bundle("pool: p\njobs: [{jobName: j, requirements: {requiredGpuCapacity: 0.4}}]");
    // Device 1 (0.4 free) is tighter than device 0 (0.7 free): it is taken,
    // keeping the roomier device for a larger ask.
    let tighter_second = "
nodes:
  - id: a
    pool: p
    tier: t
    phase: running
    inventory: {kind: aws, totalCapacity: 8, gpus: [{model: t4, totalCapacity: 1}, {model: t4, totalCapacity: 1}]}
    jobs:
      - {jobId: x, requiredGpuCapacity: 0.3, gpuIndex: 0}
      - {jobId: y, requiredGpuCapacity: 0.6, gpuIndex: 1}
";
    assert_eq!(
        gpu_of(&launch(&view(ONE_FIXED_TIER, tighter_second), &ask, 0, "j")),
        Some(1)
    );
    // Two devices equally free: the lower index.
    let tied = "
nodes:
  - id: a
    pool: p
    tier: t
    phase: running
    inventory: {kind: aws, totalCapacity: 8, gpus: [{model: t4, totalCapacity: 1}, {model: t4, totalCapacity: 1}]}
";
    assert_eq!(gpu_of(&launch(&view(ONE_FIXED_TIER, tied), &ask, 0, "j")), Some(0));
}
