//! Hot spares and node services end to end: the AutoManager runtime against
//! the Manager simulator over loopback, both on a compressed clock.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use norsk_auto_manager::automanager::node_services::{NodeServiceSpec, ServicePhase};
use norsk_auto_manager::automanager::settings::Experimental;
use norsk_auto_manager::automanager::spares::{HotSpareChange, HotSpareField};
use norsk_auto_manager::automanager::{AutoManager, AutoManagerHandle, AutoSettings, Notification, RunOptions};
use norsk_auto_manager::manager::proto::sim_admin;
use norsk_auto_manager::model::{Bundle, BundleId, HotSpareSpec, NodeInventory, NodePhase, tags};
use norsk_auto_manager::sim::{ClusterNode, SimConfig, SimSnapshot};
use tokio::sync::broadcast;

use crate::sim_support::Sim;

const TIME_SCALE: f64 = 1000.0;
const WAIT: Duration = Duration::from_secs(60);

const POOLS: &str = "
- name: production
  tiers:
    - {name: cluster, kind: local-servers, scaleOut: fixed}
    - name: aws
      kind: aws
      region: eu-west-1
      candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 4, totalCores: 4}]
";

async fn start(
    settings: AutoSettings,
    cluster: &[&str],
) -> (Sim, AutoManagerHandle, broadcast::Receiver<Notification>) {
    let sim = Sim::start_with(SimConfig {
        seed: 5,
        time_scale: TIME_SCALE,
        cluster_nodes: cluster
            .iter()
            .map(|id| ClusterNode {
                id: (*id).to_owned(),
                tags: BTreeMap::from([(tags::POOL.to_owned(), "production".to_owned())]),
                inventory: NodeInventory::local_server("site", "rack-1", "", 4.0),
            })
            .collect(),
        ..SimConfig::default()
    })
    .await;
    let settings = AutoSettings {
        url: sim.handle.url(),
        placement_pools: yaml_serde::from_str(POOLS).expect("pools parse"),
        template_images: BTreeMap::from([("xyz".to_owned(), vec!["reg/xyz:1".to_owned()])]),
        trace_placements: false,
        ..settings
    };
    let (am, _join) = AutoManager::run_with(settings, RunOptions { time_scale: TIME_SCALE }).expect("runs");
    let events = am.subscribe();
    (sim, am, events)
}

/// Follows notifications until `done` holds (checked before each one).
async fn until<F: Future<Output = bool>>(events: &mut broadcast::Receiver<Notification>, mut done: impl FnMut() -> F) {
    let follow = async {
        while !done().await {
            match events.recv().await {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("the AutoManager stopped"),
            }
        }
    };
    tokio::time::timeout(WAIT, follow).await.expect("in time");
}

fn entry(target: u32, reserved_for: &[&str]) -> HotSpareSpec {
    HotSpareSpec {
        pool: "production".into(),
        target_count: target,
        spec: yaml_serde::from_str("{instanceType: m5.xlarge}").expect("spec parses"),
        warm_for: vec!["xyz".into()],
        reserved_for: reserved_for.iter().map(|s| (*s).to_owned()).collect(),
        exclusive: false,
    }
}

async fn live_spares(am: &AutoManagerHandle) -> u32 {
    let metrics = am.metrics().await.expect("metrics");
    metrics.pools.iter().map(|p| p.live_spares).sum()
}

/// Running spare-tagged nodes as the simulator (Manager) has them: their
/// tags and the images they hold.
fn sim_spares(snapshot: &SimSnapshot) -> Vec<(BTreeMap<String, String>, Vec<String>)> {
    snapshot
        .nodes
        .iter()
        .filter(|n| n.phase == NodePhase::Running && n.tags.get(tags::SPARE).is_some_and(|v| v == "true"))
        .map(|n| {
            let images = n.inventory.as_ref().map(|i| i.images.clone()).unwrap_or_default();
            (n.tags.clone(), images)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_spares_converge_after_update_hot_spare_specs() {
    let (sim, am, mut events) = start(
        AutoSettings {
            hot_spares: vec![entry(1, &[])],
            ..AutoSettings::default()
        },
        &[],
    )
    .await;
    until(&mut events, || async { live_spares(&am).await == 1 }).await;
    let snapshot = sim.snapshot().await;
    let first = snapshot
        .nodes
        .iter()
        .find(|n| n.tags.get(tags::SPARE).is_some_and(|v| v == "true"))
        .map(|n| n.id.clone())
        .expect("the spare is on Manager");
    let mut edited = am.spare_spec(first.clone()).await.expect("query").expect("a spare");
    assert_eq!(edited.warm_for, ["xyz"]);
    edited.reserved_for = vec!["other".into()];
    am.update_hot_spare_node(first.clone(), edited.clone())
        .await
        .expect("a live spare");
    until(&mut events, || async {
        let snapshot = sim.snapshot().await;
        snapshot
            .nodes
            .iter()
            .any(|n| n.id == first && n.tags.get(tags::RESERVED_FOR).map(String::as_str) == Some("other"))
    })
    .await;
    assert_eq!(am.spare_spec(first).await.expect("query"), Some(edited));

    let diff = am
        .update_hot_spare_specs(vec![entry(3, &["xyz"])])
        .await
        .expect("valid");
    let Some(HotSpareChange::Changed { fields, .. }) = diff.get("production") else {
        panic!("production changed: {diff:?}");
    };
    assert_eq!(fields, &[HotSpareField::TargetCount, HotSpareField::ReservedFor]);
    until(&mut events, || async {
        let snapshot = sim.snapshot().await;
        let spares = sim_spares(&snapshot);
        live_spares(&am).await == 3
            && spares.len() == 3
            && spares
                .iter()
                .all(|(t, _)| t.get(tags::RESERVED_FOR).map(String::as_str) == Some("xyz"))
            && spares
                .iter()
                .all(|(_, images)| images.contains(&"reg/xyz:1".to_owned()))
    })
    .await;

    am.update_hot_spare_specs(vec![entry(1, &["xyz"])])
        .await
        .expect("valid");
    until(&mut events, || async {
        live_spares(&am).await == 1 && sim_spares(&sim.snapshot().await).len() == 1
    })
    .await;

    let diff = am.update_hot_spare_specs(vec![]).await.expect("valid");
    assert!(matches!(diff.get("production"), Some(HotSpareChange::Removed { .. })));
    until(&mut events, || async {
        live_spares(&am).await == 0 && sim_spares(&sim.snapshot().await).is_empty()
    })
    .await;
    am.close().await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_service_is_placed_eagerly_on_every_node_against_the_simulator() {
    let (sim, am, mut events) = start(
        AutoSettings {
            node_services: vec![NodeServiceSpec {
                name: "agent".into(),
                lifecycle: "eager".into(),
                template: "agent".into(),
                pools: vec![],
                provides: vec!["metrics".into()],
            }],
            experimental: Experimental {
                node_services: true,
                ..Experimental::default()
            },
            ..AutoSettings::default()
        },
        &["rack-a", "rack-b"],
    )
    .await;
    until(&mut events, || async {
        let placed = am.node_service_placements().await.expect("query");
        let running: Vec<(String, String)> = sim
            .snapshot()
            .await
            .nodes
            .iter()
            .flat_map(|n| {
                n.instances
                    .iter()
                    .filter(|i| i.phase == "running")
                    .map(|i| (n.id.0.clone(), i.job_id.0.clone()))
            })
            .collect();
        placed.len() == 2
            && placed.iter().all(|(_, _, p)| *p == ServicePhase::Placed)
            && running
                == vec![
                    ("rack-a".to_owned(), "nodeService/agent/rack-a".to_owned()),
                    ("rack-b".to_owned(), "nodeService/agent/rack-b".to_owned()),
                ]
    })
    .await;
    am.close().await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_worker_costs_one_spare_the_one_that_carries_its_job() {
    let (sim, am, mut events) = start(
        AutoSettings {
            hot_spares: vec![HotSpareSpec {
                reserved_for: vec![],
                warm_for: vec![],
                ..entry(2, &[])
            }],
            ..AutoSettings::default()
        },
        &["rack-a"],
    )
    .await;
    until(&mut events, || async { live_spares(&am).await == 2 }).await;
    let bundle = Bundle {
        bundle_id: BundleId("ch".into()),
        spec: yaml_serde::from_str(
            "pool: production\njobs: [{jobName: encode, requirements: {requiredCapacity: 2, onRuntimeFailure: preferSpare}}]",
        )
        .expect("bundle parses"),
        ..Bundle::default()
    };
    am.create_bundle(bundle).await.expect("bundle accepted");
    let runs_on = |snapshot: &SimSnapshot| -> Vec<String> {
        snapshot
            .nodes
            .iter()
            .filter(|n| {
                n.instances
                    .iter()
                    .any(|i| i.job_id.0 == "ch/0/encode" && i.phase == "running")
            })
            .map(|n| n.id.0.clone())
            .collect()
    };
    until(&mut events, || async { runs_on(&sim.snapshot().await) == ["rack-a"] }).await;

    // rack-a's worker drops: NodeStopping now, NodeStopped after Manager's
    // keepalive. Until then Manager still holds the instance there.
    sim.admin
        .clone()
        .stop_node(sim_admin::NodeRef {
            node_id: "rack-a".into(),
        })
        .await
        .expect("worker dropped");
    until(&mut events, || async {
        let snapshot = sim.snapshot().await;
        let on = runs_on(&snapshot);
        on.len() == 1 && on[0] != "rack-a" && live_spares(&am).await == 2
    })
    .await;
    let snapshot = sim.snapshot().await;
    let carrier = runs_on(&snapshot).remove(0);
    let aws: Vec<_> = snapshot
        .nodes
        .iter()
        .filter(|n| n.phase == NodePhase::Running && n.tags.get(tags::TIER).is_some_and(|t| t == "aws"))
        .collect();
    for node in &aws {
        let spare = node.tags.get(tags::SPARE).is_some_and(|v| v == "true");
        let carries = node.instances.iter().any(|i| i.phase == "running");
        assert!(
            spare != carries,
            "{}: spare {spare}, carries a job {carries}: every aws node is a spare or runs the job",
            node.id
        );
    }
    assert!(
        aws.iter().any(|n| n.id.0 == carrier),
        "recovered onto a spare: {carrier}"
    );
    let status = am.hot_spare_status().await.expect("status");
    assert_eq!(status[0].consumed, 1, "one spare consumed, the one carrying the job");
    assert_eq!((status[0].live, status[0].underflow), (2, None));
    am.close().await;
    sim.shutdown().await;
}
