//! The spec's placement examples as scenarios: tiers and the cost cascade,
//! provisioning, where each copy is placed, intra-replica rules, spares at
//! launch and migration, each run through `plan_bundles` or `place` and
//! asserting where every job lands.

use norsk_auto_manager::model::{BundleId, BundleSpec, NodeId};
use norsk_auto_manager::placement::{
    NoProvisionReason, Outcome, PlacementRequest, PlanRow, PlannedOutcome, RecoveryContext, ResilienceFlag,
    SequentialNodeIds, TierDecision, plan_bundles,
};

use crate::support::*;

/// The quick start's `production` pool, plus the bundle example's `oci-fra`.
const QUICK_START: &str = "
- name: production
  tiers:
    - name: reserved
      kind: aws
      region: eu-west-1
      packingStrategy: binpack
      scaleOut: elastic
      launchMode: reserved
      maxNodes: 4
      candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 4, totalCores: 4, capabilities: []}]
    - name: on-demand
      kind: aws
      region: eu-west-1
      packingStrategy: binpack
      scaleOut: elastic
      candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 4, totalCores: 4, capabilities: []}]
- name: oci-fra
  tiers:
    - name: flex
      kind: oci
      region: eu-frankfurt-1
      scaleOut: elastic
      candidateInstanceTypes: [{instanceType: VM.Standard.E4.Flex, totalCapacity: 4, totalCores: 4}]
";

/// The bundle example of the spec.
const MY_CHANNEL: &str = "
pool: production
resiliencePolicy: {pool: oci-fra, sameNode: forbid, sameAz: forbid, sameCloud: allow}
jobs:
  - jobName: encode
    requirements:
      requiredCapacity: 2
      requiredCores: 2
      requiredCapabilities: []
      requiredHostPorts: [1935/tcp]
      onRuntimeFailure: preferSpare
";

fn plan(pools: &str, fleet: &str, bundles: &[(&str, &str)]) -> Vec<PlanRow> {
    let mut view = view(pools, fleet);
    let bundles: Vec<(BundleId, BundleSpec)> = bundles
        .iter()
        .map(|(id, yaml)| (BundleId::from(*id), bundle(yaml)))
        .collect();
    plan_bundles(&mut view, &bundles, true, &mut SequentialNodeIds::default()).expect("plan computes")
}

fn where_(row: &PlanRow) -> (PlannedOutcome, Option<&str>, Option<&str>) {
    (
        row.outcome,
        row.tier.as_deref(),
        row.node_id.as_ref().map(NodeId::as_str),
    )
}

#[test]
fn the_quick_start_pool_spills_to_on_demand_past_the_reservation() {
    let whole_node = "pool: production\njobs: [{jobName: encode, requirements: {requiredCapacity: 4}}]";
    let bundles: Vec<(String, &str)> = (0..5).map(|i| (format!("default/ch{i}"), whole_node)).collect();
    let bundles: Vec<(&str, &str)> = bundles.iter().map(|(id, y)| (id.as_str(), *y)).collect();
    let rows = plan(QUICK_START, "nodes: []", &bundles);
    let tiers: Vec<_> = rows
        .iter()
        .map(|r| (r.outcome, r.tier.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(
        tiers,
        vec![
            (PlannedOutcome::Provision, "reserved"),
            (PlannedOutcome::Provision, "reserved"),
            (PlannedOutcome::Provision, "reserved"),
            (PlannedOutcome::Provision, "reserved"),
            (PlannedOutcome::Provision, "on-demand"),
        ]
    );
    // The fifth walked the reservation first and found it at its cap, the
    // four prospective nodes counting.
    let trace = rows[4].trace.as_ref().unwrap();
    assert_eq!(
        trace.tiers[0].decision,
        TierDecision::NotProvisioned {
            why: NoProvisionReason::AtMaxNodes { nodes: 4, max_nodes: 4 }
        }
    );
    assert_eq!(rows[4].instance_type.as_deref(), Some("m5.xlarge"));
}

#[test]
fn a_provision_adds_a_prospective_node_that_later_placements_use() {
    let half_node = "pool: production\njobs: [{jobName: encode, requirements: {requiredCapacity: 2}}]";
    let rows = plan(
        QUICK_START,
        "nodes: []",
        &[("default/a", half_node), ("default/b", half_node)],
    );
    assert_eq!(
        where_(&rows[0]),
        (
            PlannedOutcome::Provision,
            Some("reserved"),
            Some("production-reserved-1")
        )
    );
    assert_eq!(
        where_(&rows[1]),
        (PlannedOutcome::Placed, Some("reserved"), Some("production-reserved-1"))
    );
}

#[test]
fn the_primary_comes_from_the_bundles_pool_and_the_backup_from_the_resilience_pool() {
    let fleet = "
nodes:
  - {id: aws-1, pool: production, tier: reserved, phase: running, inventory: {kind: aws, az: eu-west-1a, totalCapacity: 4, totalCores: 4}}
  - {id: oci-1, pool: oci-fra, tier: flex, phase: running, inventory: {kind: oci, az: fra-ad-1, totalCapacity: 4, totalCores: 4}}
";
    let rows = plan(QUICK_START, fleet, &[("default/my-channel-1", MY_CHANNEL)]);
    assert_eq!(rows.len(), 2, "a resilience policy expands one backup");
    assert_eq!(
        where_(&rows[0]),
        (PlannedOutcome::Placed, Some("reserved"), Some("aws-1"))
    );
    assert_eq!((rows[1].replica_index, rows[1].pool.as_deref()), (1, Some("oci-fra")));
    assert_eq!(where_(&rows[1]), (PlannedOutcome::Placed, Some("flex"), Some("oci-1")));
    assert!(rows[1].resilience_violations.is_empty());
}

#[test]
fn without_a_resilience_pool_the_backup_comes_from_the_bundles_pool() {
    let fleet = "
nodes:
  - {id: a, pool: production, tier: reserved, phase: running, inventory: {kind: aws, az: z1, totalCapacity: 4}}
  - {id: b, pool: production, tier: reserved, phase: running, inventory: {kind: aws, az: z2, totalCapacity: 4}}
";
    let spec = "pool: production\nresiliencePolicy: {sameNode: forbid}\njobs: [{jobName: j, requirements: {requiredCapacity: 1}}]";
    let rows = plan(QUICK_START, fleet, &[("default/x", spec)]);
    assert_eq!(where_(&rows[0]).2, Some("a"));
    assert_eq!(
        where_(&rows[1]).2,
        Some("b"),
        "sameNode forbid keeps the backup off the primary's node"
    );
}

#[test]
fn a_bundle_without_a_resilience_policy_runs_one_copy() {
    let spec = "pool: production\njobs: [{jobName: j}]";
    assert_eq!(plan(QUICK_START, "nodes: []", &[("default/x", spec)]).len(), 1);
}

#[test]
fn a_backup_is_placed_anyway_inside_a_forbidden_domain_when_nothing_compliant_fits() {
    let fleet = "
nodes:
  - {id: only, pool: production, tier: reserved, phase: running, inventory: {kind: aws, az: z1, totalCapacity: 8}}
";
    let pools = "- {name: production, tiers: [{name: reserved, kind: aws, scaleOut: fixed}]}\n";
    let spec = "pool: production\nresiliencePolicy: {sameNode: forbid, sameAz: forbid}\njobs: [{jobName: j, requirements: {requiredCapacity: 1}}]";
    let rows = plan(pools, fleet, &[("default/x", spec)]);
    assert_eq!(
        where_(&rows[1]),
        (PlannedOutcome::Placed, Some("reserved"), Some("only"))
    );
    assert_eq!(
        rows[1].resilience_violations,
        vec![ResilienceFlag::SameNode, ResilienceFlag::SameAz]
    );
}

#[test]
fn an_interruptible_primary_without_a_durable_backup_is_reported() {
    let pools = "
- {name: spot, tiers: [{name: s, kind: aws, scaleOut: fixed, launchMode: spot}]}
- {name: spot2, tiers: [{name: s, kind: oci, scaleOut: fixed, reliability: interruptible}]}
- {name: steady, tiers: [{name: d, kind: oci, scaleOut: fixed, launchMode: on-demand}]}
";
    let fleet = "
nodes:
  - {id: a, pool: spot, tier: s, phase: running, inventory: {kind: aws, totalCapacity: 8}}
  - {id: b, pool: spot2, tier: s, phase: running, inventory: {kind: oci, totalCapacity: 8}}
  - {id: c, pool: steady, tier: d, phase: running, inventory: {kind: oci, totalCapacity: 8}}
";
    let fragile = "pool: spot\nresiliencePolicy: {pool: spot2}\njobs: [{jobName: j}]";
    let safe = "pool: spot\nresiliencePolicy: {pool: steady}\njobs: [{jobName: j}]";
    let rows = plan(pools, fleet, &[("default/fragile", fragile), ("default/safe", safe)]);
    assert!(rows[1].interruptible_primary_without_durable_backup);
    assert!(!rows[3].interruptible_primary_without_durable_backup);
}

#[test]
fn a_pinned_target_never_provisions() {
    let fleet = "
nodes:
  - {id: full, pool: production, tier: reserved, phase: running, inventory: {kind: aws, totalCapacity: 1}}
";
    let view = view(QUICK_START, fleet);
    let spec = bundle("pool: production\njobs: [{jobName: j, requirements: {requiredCapacity: 2}}]");
    let id = bundle_id();
    let target = NodeId::from("full");
    let placement = place_with(&view, PlacementRequest::launch(&id, &spec, 0, "j").pinned_to(&target));
    assert_eq!(placement.outcome, Outcome::NoCapacityInAnyPool);
    let trace = placement.trace.unwrap();
    assert!(trace.tiers.iter().all(|t| t.decision
        == TierDecision::NotProvisioned {
            why: NoProvisionReason::PinnedTarget
        }));
}

#[test]
fn no_capacity_in_any_pool_when_every_tier_is_exhausted() {
    let pools = "
- name: p
  tiers:
    - {name: cluster, kind: local-servers, scaleOut: fixed}
    - {name: cloud, kind: aws, scaleOut: elastic, maxNodes: 0, candidateInstanceTypes: [{instanceType: m, totalCapacity: 4}]}
";
    let fleet = "
nodes:
  - {id: s1, pool: p, phase: running, inventory: {kind: local-servers, totalCapacity: 2}}
";
    let rows = plan(
        pools,
        fleet,
        &[(
            "default/x",
            "pool: p\njobs: [{jobName: j, requirements: {requiredCapacity: 3}}]",
        )],
    );
    assert_eq!(rows[0].outcome, PlannedOutcome::NoCapacityInAnyPool);
    let trace = rows[0].trace.as_ref().unwrap();
    assert_eq!(
        trace.tiers.iter().map(|t| t.tier.as_str()).collect::<Vec<_>>(),
        vec!["cluster", "cloud"]
    );
}

#[test]
fn an_untagged_cluster_node_belongs_to_its_pools_fixed_tier() {
    let pools = "
- name: p
  tiers:
    - {name: cloud, kind: aws, scaleOut: elastic, candidateInstanceTypes: [{instanceType: m, totalCapacity: 4}]}
    - {name: cluster, kind: local-servers, scaleOut: fixed}
";
    let fleet = "
nodes:
  - {id: s1, pool: p, phase: running, inventory: {kind: local-servers, totalCapacity: 8}}
";
    let rows = plan(
        pools,
        fleet,
        &[(
            "default/x",
            "pool: p\njobs: [{jobName: j, requirements: {requiredCapacity: 6}}]",
        )],
    );
    // The cloud tier comes first but its only shape is too small; the
    // cascade reaches the cluster tier, where the untagged node is.
    assert_eq!(where_(&rows[0]), (PlannedOutcome::Placed, Some("cluster"), Some("s1")));
}

#[test]
fn the_first_candidate_shape_that_fits_is_provisioned() {
    let pools = "
- name: p
  tiers:
    - name: cloud
      kind: aws
      scaleOut: elastic
      candidateInstanceTypes:
        - {instanceType: small, totalCapacity: 2, totalCores: 2}
        - {instanceType: gpu, totalCapacity: 8, capabilities: [norsk.io/nvidia-gpu]}
        - {instanceType: large, totalCapacity: 8, totalCores: 8}
        - {instanceType: larger, totalCapacity: 16, totalCores: 16}
";
    let spec = "pool: p\njobs: [{jobName: j, requirements: {requiredCapacity: 4, requiredCores: 4}}]";
    let rows = plan(pools, "nodes: []", &[("default/x", spec)]);
    assert_eq!(
        rows[0].instance_type.as_deref(),
        Some("large"),
        "gpu lacks the cores; larger comes later"
    );
}

#[test]
fn the_first_mover_of_a_co_located_group_sizes_its_node_for_the_whole_group() {
    let pools = "
- name: p
  tiers:
    - name: cloud
      kind: aws
      scaleOut: elastic
      candidateInstanceTypes:
        - {instanceType: m5.xlarge, totalCapacity: 4}
        - {instanceType: m5.2xlarge, totalCapacity: 8}
";
    let spec = "
pool: p
jobs:
  - {jobName: encode, requirements: {requiredCapacity: 3}}
  - {jobName: audio, requirements: {requiredCapacity: 1}}
  - {jobName: package, coLocateWith: [encode], requirements: {requiredCapacity: 3}}
";
    let rows = plan(pools, "nodes: []", &[("default/x", spec)]);
    let order: Vec<&str> = rows.iter().map(|r| r.job_name.as_str()).collect();
    assert_eq!(
        order,
        vec!["encode", "package", "audio"],
        "co-located groups are placed together"
    );
    assert_eq!(rows[0].instance_type.as_deref(), Some("m5.2xlarge"));
    assert_eq!(
        where_(&rows[1]),
        (PlannedOutcome::Placed, Some("cloud"), Some("p-cloud-1"))
    );
}

#[test]
fn same_node_default_co_locates_rule_less_jobs_as_a_hard_rule() {
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 2}}
  - {id: b, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8}}
";
    let spec = "
pool: p
intraReplicaPlacement: {sameNodeDefault: true}
jobs:
  - {jobName: one, requirements: {requiredCapacity: 2}}
  - {jobName: two, requirements: {requiredCapacity: 2}}
  - {jobName: apart, separateFrom: [one], requirements: {requiredCapacity: 1}}
";
    let rows = plan(ONE_FIXED_TIER, fleet, &[("default/x", spec)]);
    // "one" would fit alone on the fuller-after node a, but it sizes for
    // "two" too, so both land on b; "apart" is kept off b.
    assert_eq!(where_(&rows[0]).2, Some("b"));
    assert_eq!(where_(&rows[1]).2, Some("b"));
    assert_eq!(where_(&rows[2]).2, Some("a"));
}

#[test]
fn a_co_located_job_never_provisions_away_from_its_placed_peer() {
    let pools = "
- name: p
  tiers:
    - {name: cloud, kind: aws, scaleOut: elastic, candidateInstanceTypes: [{instanceType: m, totalCapacity: 4}]}
";
    let fleet = "
nodes:
  - {id: a, pool: p, tier: cloud, phase: running, inventory: {kind: aws, totalCapacity: 4},
     jobs: [{jobId: default/x/0/encode, bundle: default/x, replicaIndex: 0, jobName: encode, requiredCapacity: 3}]}
";
    let spec = "pool: p\njobs: [{jobName: encode, requirements: {requiredCapacity: 3}}, {jobName: package, coLocateWith: [encode], requirements: {requiredCapacity: 2}}]";
    let view = view(pools, fleet);
    let spec = bundle(spec);
    let id = BundleId::from("default/x");
    let placement = place_with(&view, PlacementRequest::launch(&id, &spec, 0, "package"));
    assert_eq!(placement.outcome, Outcome::NoCapacityInAnyPool);
    assert_eq!(
        placement.trace.unwrap().tiers[0].decision,
        TierDecision::NotProvisioned {
            why: NoProvisionReason::CoLocatedPeerPlaced
        }
    );
}

#[test]
fn a_job_pinned_by_hard_same_az_does_not_provision_a_node_of_unknown_az() {
    let pools = "
- name: p
  tiers:
    - {name: cloud, kind: aws, scaleOut: elastic, candidateInstanceTypes: [{instanceType: m, totalCapacity: 4}]}
";
    let fleet = "
nodes:
  - {id: a, pool: p, tier: cloud, phase: running, inventory: {kind: aws, az: z1, totalCapacity: 4},
     jobs: [{jobId: default/x/0/one, bundle: default/x, replicaIndex: 0, jobName: one, requiredCapacity: 4}]}
";
    let spec = "pool: p\nintraReplicaPlacement: {sameAz: hard}\njobs: [{jobName: one, requirements: {requiredCapacity: 4}}, {jobName: two, requirements: {requiredCapacity: 1}}]";
    let view = view(pools, fleet);
    let spec = bundle(spec);
    let id = BundleId::from("default/x");
    let placement = place_with(&view, PlacementRequest::launch(&id, &spec, 0, "two"));
    assert_eq!(placement.outcome, Outcome::NoCapacityInAnyPool);
}

#[test]
fn an_exclusive_reservation_sends_other_templates_to_provisioning() {
    // The spec's hot-spare example: reservedFor xyz, exclusive.
    let fleet = "
nodes:
  - {id: spare-1, pool: production, tier: reserved, phase: running, spare: true,
     spareSpec: {warmFor: [xyz], reservedFor: [xyz], exclusive: true},
     inventory: {kind: aws, totalCapacity: 4, totalCores: 4}}
";
    let other = "pool: production\njobs: [{jobName: j, template: abc, requirements: {requiredCapacity: 1}}]";
    let own = "pool: production\nonLaunch: allowSpare\njobs: [{jobName: j, template: xyz, requirements: {requiredCapacity: 1}}]";
    let rows = plan(QUICK_START, fleet, &[("default/other", other), ("default/own", own)]);
    assert_eq!(
        where_(&rows[0]),
        (
            PlannedOutcome::Provision,
            Some("reserved"),
            Some("production-reserved-1")
        )
    );
    // "own" may take the spare: reserved for its template, and allowSpare
    // lifts the launch penalty; it outranks the prospective node.
    assert_eq!(
        where_(&rows[1]),
        (PlannedOutcome::Placed, Some("reserved"), Some("spare-1"))
    );
}

#[test]
fn a_migration_excludes_its_source_and_can_be_pinned() {
    let fleet = "
nodes:
  - {id: src, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8},
     jobs: [{jobId: default/b/0/j, bundle: default/b, replicaIndex: 0, jobName: j, requiredCapacity: 1}]}
  - {id: dst1, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8}}
  - {id: dst2, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8}}
";
    let view = view(ONE_FIXED_TIER, fleet);
    let spec = bundle("pool: p\njobs: [{jobName: j, requirements: {requiredCapacity: 1}}]");
    let id = bundle_id();
    let migration = RecoveryContext {
        on_runtime_failure: None,
        excluded_nodes: vec![NodeId::from("src")],
    };
    let moved = place_with(
        &view,
        PlacementRequest::launch(&id, &spec, 0, "j").recovering(&migration),
    );
    assert_eq!(node_of(&moved), Some("dst1"));
    let target = NodeId::from("dst2");
    let pinned = place_with(
        &view,
        PlacementRequest::launch(&id, &spec, 0, "j")
            .recovering(&migration)
            .pinned_to(&target),
    );
    assert_eq!(node_of(&pinned), Some("dst2"));
}
