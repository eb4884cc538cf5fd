//! One test per component of the lexicographic `PlacementKey`, each proving
//! the component decides when everything above it ties, plus the orderings
//! the spec promises between components.

use norsk_auto_manager::model::{OnRuntimeFailure, PackingStrategy};
use norsk_auto_manager::placement::{PlacementKey, PlacementRequest, RecoveryContext, ResilienceFlag};

use crate::support::*;

const ONE_JOB: &str = "pool: p\njobs: [{jobName: j, template: xyz, requirements: {requiredCapacity: 1}}]";

fn recovery(policy: Option<OnRuntimeFailure>) -> RecoveryContext {
    RecoveryContext {
        on_runtime_failure: policy,
        excluded_nodes: vec![],
    }
}

#[test]
fn backups_prefer_nodes_outside_the_primarys_failure_domains() {
    let pools = "- {name: p, tiers: [{name: t, kind: aws, scaleOut: fixed}]}\n";
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, az: z1, totalCapacity: 8}}
  - {id: b, pool: p, tier: t, phase: running, inventory: {kind: aws, az: z1, totalCapacity: 8}}
  - {id: c, pool: p, tier: t, phase: running, inventory: {kind: aws, az: z2, totalCapacity: 8}}
";
    let mut view = view(pools, fleet);
    let spec = bundle("pool: p\nresiliencePolicy: {sameNode: forbid, sameAz: forbid}\njobs: [{jobName: j}]");
    let primary = launch(&view, &spec, 0, "j");
    assert_eq!(node_of(&primary), Some("a"));
    apply(&mut view, &spec, 0, "j", &primary);
    let backup = launch(&view, &spec, 1, "j");
    assert_eq!(node_of(&backup), Some("c"), "outside the primary's node and AZ");
    assert!(backup.resilience.violations.is_empty());
}

#[test]
fn resilience_flags_are_best_effort_and_violations_are_reported() {
    let pools = "- {name: p, tiers: [{name: t, kind: aws, scaleOut: fixed}]}\n";
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, az: z1, totalCapacity: 8}}
  - {id: b, pool: p, tier: t, phase: running, inventory: {kind: aws, az: z1, totalCapacity: 8}}
";
    let mut view = view(pools, fleet);
    let spec = bundle(
        "pool: p\nresiliencePolicy: {sameNode: forbid, sameAz: forbid, sameCloud: forbid}\njobs: [{jobName: j}]",
    );
    let primary = launch(&view, &spec, 0, "j");
    apply(&mut view, &spec, 0, "j", &primary);
    let backup = launch(&view, &spec, 1, "j");
    assert_eq!(
        node_of(&backup),
        Some("b"),
        "fewer violations: the other node only shares AZ and cloud"
    );
    assert_eq!(
        backup.resilience.violations,
        vec![ResilienceFlag::SameAz, ResilienceFlag::SameCloud]
    );
    assert!(backup.resilience.is_degraded());
}

#[test]
fn a_booted_node_wins_over_one_still_launching() {
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: starting, inventory: {kind: aws, totalCapacity: 8}}
  - {id: b, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8}}
";
    assert_eq!(
        node_of(&launch(&view(ONE_FIXED_TIER, fleet), &bundle(ONE_JOB), 0, "j")),
        Some("b")
    );
}

const SPARE_AND_ORDINARY: &str = "
templateImages: {xyz: [img1, img2]}
nodes:
  - {id: a-spare, pool: p, tier: t, phase: running, spare: true, inventory: {kind: aws, totalCapacity: 8}}
  - {id: b-ordinary, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8}}
";

#[test]
fn a_launch_avoids_an_unconsumed_spare_unless_on_launch_allows_it() {
    let view = view(ONE_FIXED_TIER, SPARE_AND_ORDINARY);
    assert_eq!(node_of(&launch(&view, &bundle(ONE_JOB), 0, "j")), Some("b-ordinary"));
    let allow = bundle(&format!("onLaunch: allowSpare\n{ONE_JOB}"));
    assert_eq!(
        node_of(&launch(&view, &allow, 0, "j")),
        Some("a-spare"),
        "no penalty, and the id breaks the tie"
    );
}

#[test]
fn a_recovering_avoid_spare_job_ranks_spares_below_every_ordinary_node() {
    let view = view(ONE_FIXED_TIER, SPARE_AND_ORDINARY);
    let spec = bundle(ONE_JOB);
    let id = bundle_id();
    let context = recovery(Some(OnRuntimeFailure::AvoidSpare));
    let placement = place_with(&view, PlacementRequest::launch(&id, &spec, 0, "j").recovering(&context));
    assert_eq!(node_of(&placement), Some("b-ordinary"));
}

#[test]
fn a_spare_that_took_a_job_is_an_ordinary_node() {
    let fleet = "
nodes:
  - {id: a-spare, pool: p, tier: t, phase: running, spare: true, inventory: {kind: aws, totalCapacity: 8}, jobs: [{jobId: x}]}
  - {id: b-ordinary, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8}}
";
    // Both are ordinary now; binpack prefers the fuller one.
    assert_eq!(
        node_of(&launch(&view(ONE_FIXED_TIER, fleet), &bundle(ONE_JOB), 0, "j")),
        Some("a-spare")
    );
}

#[test]
fn avoiding_a_spare_outranks_warmth() {
    let fleet = "
templateImages: {xyz: [img1]}
nodes:
  - {id: a-spare, pool: p, tier: t, phase: running, spare: true, inventory: {kind: aws, totalCapacity: 8, images: [img1]}}
  - {id: b-cold, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8}}
";
    assert_eq!(
        node_of(&launch(&view(ONE_FIXED_TIER, fleet), &bundle(ONE_JOB), 0, "j")),
        Some("b-cold")
    );
}

#[test]
fn the_node_holding_more_template_images_wins() {
    let fleet = "
templateImages: {xyz: [img1, img2]}
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8, images: [img1, unrelated]}}
  - {id: b, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8, images: [img2, img1]}}
";
    let placement = launch(&view(ONE_FIXED_TIER, fleet), &bundle(ONE_JOB), 0, "j");
    assert_eq!(node_of(&placement), Some("b"));
}

#[test]
fn a_still_empty_spare_reserved_for_the_template_wins() {
    let fleet = "
nodes:
  - {id: a-spare, pool: p, tier: t, phase: running, spare: true, inventory: {kind: aws, totalCapacity: 8}}
  - {id: b-reserved, pool: p, tier: t, phase: running, spare: true, spareSpec: {reservedFor: [xyz]},
     inventory: {kind: aws, totalCapacity: 8}}
";
    let view = view(ONE_FIXED_TIER, fleet);
    let spec = bundle(ONE_JOB);
    let id = bundle_id();
    // A migration: no spare policy, so only the reservation decides.
    let context = recovery(None);
    let placement = place_with(&view, PlacementRequest::launch(&id, &spec, 0, "j").recovering(&context));
    assert_eq!(node_of(&placement), Some("b-reserved"));
}

#[test]
fn a_recovering_prefer_spare_job_takes_a_spare_first_among_equals() {
    // The ordinary node is fuller (binpack would take it) and first by id:
    // only the preference can pick the spare.
    let fleet = "
nodes:
  - {id: a-ordinary, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8}, jobs: [{jobId: x, requiredCapacity: 4}]}
  - {id: b-spare, pool: p, tier: t, phase: running, spare: true, inventory: {kind: aws, totalCapacity: 8}}
";
    let view = view(ONE_FIXED_TIER, fleet);
    let spec = bundle(ONE_JOB);
    let id = bundle_id();
    let prefer = recovery(Some(OnRuntimeFailure::PreferSpare));
    let placement = place_with(&view, PlacementRequest::launch(&id, &spec, 0, "j").recovering(&prefer));
    assert_eq!(node_of(&placement), Some("b-spare"));
    let migration = recovery(None);
    let placement = place_with(
        &view,
        PlacementRequest::launch(&id, &spec, 0, "j").recovering(&migration),
    );
    assert_eq!(
        node_of(&placement),
        Some("a-ordinary"),
        "a migration passes no preference"
    );
}

#[test]
fn warmth_outranks_the_spare_preference() {
    let fleet = "
templateImages: {xyz: [img1]}
nodes:
  - {id: a-spare, pool: p, tier: t, phase: running, spare: true, inventory: {kind: aws, totalCapacity: 8}}
  - {id: b-warm, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8, images: [img1]}}
";
    let view = view(ONE_FIXED_TIER, fleet);
    let spec = bundle(ONE_JOB);
    let id = bundle_id();
    let context = recovery(Some(OnRuntimeFailure::PreferSpare));
    let placement = place_with(&view, PlacementRequest::launch(&id, &spec, 0, "j").recovering(&context));
    assert_eq!(node_of(&placement), Some("b-warm"));
}

#[test]
fn binpack_fills_the_fuller_node_and_spread_the_emptier() {
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8}, jobs: [{jobId: x, requiredCapacity: 1}]}
  - {id: b, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8}, jobs: [{jobId: y, requiredCapacity: 4}]}
";
    let binpack = "- {name: p, tiers: [{name: t, kind: aws, scaleOut: fixed, packingStrategy: binpack}]}\n";
    let spread = "- {name: p, tiers: [{name: t, kind: aws, scaleOut: fixed, packingStrategy: spread}]}\n";
    assert_eq!(
        node_of(&launch(&view(binpack, fleet), &bundle(ONE_JOB), 0, "j")),
        Some("b")
    );
    assert_eq!(
        node_of(&launch(&view(spread, fleet), &bundle(ONE_JOB), 0, "j")),
        Some("a")
    );
}

#[test]
fn soft_same_az_prefers_the_az_of_a_placed_peer() {
    let fleet = "
nodes:
  - {id: a, pool: p, tier: t, phase: running, inventory: {kind: aws, az: z1, totalCapacity: 2}}
  - {id: b, pool: p, tier: t, phase: running, inventory: {kind: aws, az: z2, totalCapacity: 2}}
  - {id: c, pool: p, tier: t, phase: running, inventory: {kind: aws, az: z1, totalCapacity: 2}}
";
    let mut view = view(ONE_FIXED_TIER, fleet);
    let spec = bundle(
        "pool: p\njobs: [{jobName: one, requirements: {requiredCapacity: 2}}, {jobName: two, requirements: {requiredCapacity: 1}}]",
    );
    let one = launch(&view, &spec, 0, "one");
    apply(&mut view, &spec, 0, "one", &one);
    // b and c are equally empty; c shares z1 with "one" on a.
    assert_eq!(node_of(&launch(&view, &spec, 0, "two")), Some("c"));
    let off = bundle(
        "pool: p\nintraReplicaPlacement: {sameAz: off}\njobs: [{jobName: one, requirements: {requiredCapacity: 2}}, {jobName: two, requirements: {requiredCapacity: 1}}]",
    );
    let mut view = crate::support::view(ONE_FIXED_TIER, fleet);
    let one = launch(&view, &off, 0, "one");
    apply(&mut view, &off, 0, "one", &one);
    assert_eq!(
        node_of(&launch(&view, &off, 0, "two")),
        Some("b"),
        "no preference: the id decides"
    );
}

#[test]
fn the_node_id_breaks_every_remaining_tie() {
    let fleet = "
nodes:
  - {id: node-b, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8}}
  - {id: node-a, pool: p, tier: t, phase: running, inventory: {kind: aws, totalCapacity: 8}}
";
    assert_eq!(
        node_of(&launch(&view(ONE_FIXED_TIER, fleet), &bundle(ONE_JOB), 0, "j")),
        Some("node-a")
    );
}

/// A key whose component `c` (1-9) is `better` or not, and every other
/// component set to `others_better`.
fn key_with(c: usize, better: bool, others_better: bool) -> PlacementKey {
    let pick = |i: usize| {
        if i == c {
            better
        } else if i < c {
            true
        } else {
            others_better
        }
    };
    PlacementKey {
        resilience_violations: if pick(1) { 0 } else { 1 },
        prospective: !pick(2),
        avoided_spare: !pick(3),
        warmth: if pick(4) { 2 } else { 1 },
        reservation_match: pick(5),
        preferred_spare: pick(6),
        fill: if pick(7) { 0.9 } else { 0.1 },
        packing: PackingStrategy::Binpack,
        outside_peer_az: !pick(8),
        node_order: if pick(9) { 0 } else { 1 },
    }
}

#[test]
fn each_key_component_decides_only_when_every_component_above_it_ties() {
    for c in 1..=9 {
        // Equal above c, better at c, worse at every component below it:
        // it must still win.
        let winner = key_with(c, true, false);
        let loser = key_with(c, false, true);
        assert!(winner < loser, "component {c} must decide: {winner} vs {loser}");
    }
}

#[test]
fn warmth_counts_every_template_image_however_many_there_are() {
    let images: Vec<String> = (0..70).map(|i| format!("img{i}")).collect();
    let fleet = format!(
        "
templateImages: {{xyz: [{}]}}
nodes:
  - {{id: a, pool: p, tier: t, phase: running, inventory: {{kind: aws, totalCapacity: 8, images: [img1]}}}}
  - {{id: b, pool: p, tier: t, phase: running, inventory: {{kind: aws, totalCapacity: 8, images: [img1, img69]}}}}
",
        images.join(", ")
    );
    let placement = launch(&view(ONE_FIXED_TIER, &fleet), &bundle(ONE_JOB), 0, "j");
    assert_eq!(node_of(&placement), Some("b"));
}
