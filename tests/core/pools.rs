//! Placement pools replaced live (what the `PlacementPool` controller does
//! on every change): a pool added is placed with at once, without a
//! reconnect; an invalid set is refused whole and the pools in force stay.

use norsk_auto_manager::automanager::{Command, CommandError, Rpc};
use norsk_auto_manager::model::PlacementPool;

use crate::support::{Harness, bundle, settings};

const LATE_BUNDLE: &str = "pool: late\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n";

fn pools_with(extra_yaml: &str) -> Vec<PlacementPool> {
    let mut pools = settings().placement_pools;
    pools.extend(yaml_serde::from_str::<Vec<PlacementPool>>(extra_yaml).expect("pool parses"));
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

/// Runs the AutoManager against the simulator: pools replaced live survive
/// a broken stream (the fresh core hydrated from the new snapshot places
/// with them, not with the pools it was started with).
#[tokio::test]
async fn pools_replaced_live_survive_a_reconnect() {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use crate::sim_support::{Sim, TIME_SCALE};
    use norsk_auto_manager::automanager::{AutoManager, AutoSettings, Notification, RunOptions};
    use norsk_auto_manager::model::{BundleId, JobHistoryEntry, NodeId, NodeInventory, tags};
    use norsk_auto_manager::sim::{ClusterNode, SimConfig};

    let wait = Duration::from_secs(60);
    let sim = Sim::start_with(SimConfig {
        seed: 4,
        time_scale: TIME_SCALE,
        cluster_nodes: vec![ClusterNode {
            id: "late-1".to_owned(),
            tags: BTreeMap::from([(tags::POOL.to_owned(), "late".to_owned())]),
            inventory: NodeInventory::local_server("site", "rack-1", "", 8.0),
        }],
        ..SimConfig::default()
    })
    .await;
    let (am, join) = AutoManager::run_with(
        AutoSettings {
            url: sim.handle.url(),
            trace_placements: false,
            ..settings()
        },
        RunOptions { time_scale: TIME_SCALE },
    )
    .expect("runs");
    let mut events = am.subscribe();
    am.set_placement_pools(pools_with(
        "- {name: late, tiers: [{name: cluster, kind: local-servers, scaleOut: fixed}]}",
    ))
    .await
    .expect("pools accepted");
    sim.admin.clone().drop_stream(()).await.expect("stream dropped");
    // Whether the bundle is created before or after the new snapshot is
    // hydrated, it only runs if the fresh core knows pool `late`.
    let create = async {
        loop {
            match am.create_bundle(bundle("late-bundle", LATE_BUNDLE)).await {
                Ok(()) => return,
                // The new stream is still connecting.
                Err(CommandError::Manager(_)) => tokio::task::yield_now().await,
                Err(e) => panic!("refused: {e}"),
            }
        }
    };
    tokio::time::timeout(wait, create).await.expect("created");
    let running = async {
        loop {
            if let Ok(Notification::JobUpdated { job }) = events.recv().await
                && job.job_id.0.starts_with(BundleId::from("late-bundle").as_str())
                && let Some(JobHistoryEntry::Running { node_id, .. }) = job.history.last()
            {
                return node_id.clone();
            }
        }
    };
    let node = tokio::time::timeout(wait, running).await.expect("the job runs");
    assert_eq!(node, Some(NodeId::from("late-1")));
    am.close().await;
    join.await.expect("loop ends");
    sim.shutdown().await;
}
