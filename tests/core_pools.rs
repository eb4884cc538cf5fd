//! Placement pools replaced live (what the `PlacementPool` controller does
//! on every change): a pool added is placed with at once, without a
//! reconnect; an invalid set is refused whole and the pools in force stay.

mod core_support;

use core_support::{Harness, bundle, settings};
use norsk_auto_manager::automanager::{Command, CommandError, Rpc};
use norsk_auto_manager::model::PlacementPool;

const LATE_BUNDLE: &str = "pool: late\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n";

fn pools_with(extra_yaml: &str) -> Vec<PlacementPool> {
    let mut pools = settings().placement_pools;
    pools.extend(serde_yaml::from_str::<Vec<PlacementPool>>(extra_yaml).expect("pool parses"));
    pools
}

#[test]
fn a_pool_added_live_accepts_bundles_at_once() {
    let mut h = Harness::hydrated();
    h.command(Command::CreateBundle(bundle("b1", LATE_BUNDLE)));
    assert!(
        matches!(h.take_replies()[..], [(_, Err(CommandError::InvalidBundle { .. }))]),
        "an unknown pool is refused"
    );
    h.command(Command::SetPlacementPools(pools_with(
        "- {name: late, tiers: [{name: aws, kind: aws, region: eu-west-1, candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 4, totalCores: 4}]}]}",
    )));
    assert_eq!(h.take_replies()[0].1, Ok(()));
    assert!(h.core.settings().placement_pools.iter().any(|p| p.name == "late"));
    h.command(Command::CreateBundle(bundle("b1", LATE_BUNDLE)));
    let calls = h.take_calls();
    assert!(
        calls
            .iter()
            .any(|(_, rpc)| matches!(rpc, Rpc::CreateBundle(b) if b.bundle_id.0 == "b1")),
        "{calls:?}"
    );
}

#[test]
fn an_invalid_pool_set_is_refused_whole_and_the_pools_in_force_stay() {
    let mut h = Harness::hydrated();
    let before = h.core.settings().placement_pools.clone();
    h.command(Command::SetPlacementPools(pools_with("- {name: empty, tiers: []}")));
    match &h.take_replies()[..] {
        [(_, Err(CommandError::InvalidSettings { errors }))] => {
            assert!(
                errors.iter().any(|e| e.path.starts_with("placementPools[1]")),
                "{errors:?}"
            );
        }
        other => panic!("expected InvalidSettings, got {other:?}"),
    }
    assert_eq!(h.core.settings().placement_pools, before);
}
