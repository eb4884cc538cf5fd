//! The event stream: snapshot, `initial_data_complete` once, then live
//! events; several streams at once; `drop-stream` and a fresh snapshot.

use norsk_auto_manager::manager::proto::manager::{self as pb, event_stream_event::Event};
use norsk_auto_manager::sim::{ClusterNode, SimConfig};
use tonic::Code;

use crate::sim_support::{Sim, TIME_SCALE, aws_node, kind, node_of};

fn bundle(id: &str) -> pb::Bundle {
    pb::Bundle {
        bundle_id: id.into(),
        pool: "studio".into(),
        jobs: vec![pb::BundleJobSpec {
            job_name: "encode".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn stream_replays_the_snapshot_then_initial_data_complete_once_then_live_events() {
    let cluster: Vec<ClusterNode> = yaml_serde::from_str(
        "- id: rack-1\n  tags: {pool: studio}\n  inventory: {kind: local-servers, totalCapacity: 16, totalCores: 16}\n",
    )
    .unwrap();
    let sim = Sim::start_with(SimConfig {
        seed: 1,
        time_scale: TIME_SCALE,
        cluster_nodes: cluster,
        ..Default::default()
    })
    .await;
    sim.manager.clone().create_bundle(bundle("ch1")).await.unwrap();

    let mut events = sim.events().await;
    let snapshot = events.snapshot().await;
    let kinds: Vec<_> = snapshot.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "node_started",
            "node_inventory",
            "bundle_updated",
            "job_active",
            "initial_data_complete"
        ],
        "snapshot order"
    );
    let Event::NodeStarted(started) = &snapshot[0] else {
        unreachable!()
    };
    let tags = &started.node_metadata.as_ref().unwrap().tags;
    assert_eq!(tags["pool"], "studio", "tags ride in the node metadata");

    sim.manager
        .clone()
        .create_aws_node(aws_node("n1", "eu-west-1", "m5.xlarge"))
        .await
        .unwrap();
    let (_, live) = events
        .until(|e| matches!(e, Event::NodeInventory(_)).then_some(()))
        .await;
    let live_kinds: Vec<_> = live.iter().map(kind).filter(|k| *k != "audit_appended").collect();
    assert_eq!(live_kinds, ["node_starting", "node_started", "node_inventory"]);
    assert!(live.iter().all(|e| !matches!(e, Event::InitialDataComplete(_))));
    sim.shutdown().await;
}

#[tokio::test]
async fn concurrent_streams_each_receive_every_live_event() {
    let sim = Sim::start().await;
    let mut first = sim.events().await;
    let mut second = sim.events().await;
    first.snapshot().await;
    second.snapshot().await;
    sim.register("rack-1", 8.0).await;
    for events in [&mut first, &mut second] {
        let (node, _) = events
            .until(|e| matches!(e, Event::NodeStarted(_)).then(|| node_of(e).map(str::to_owned)))
            .await;
        assert_eq!(node.as_deref(), Some("rack-1"));
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn drop_stream_ends_open_streams_and_a_new_stream_snapshots_the_current_state() {
    let sim = Sim::start().await;
    let mut events = sim.events().await;
    events.snapshot().await;
    sim.register("rack-1", 8.0).await;
    events
        .until(|e| matches!(e, Event::NodeInventory(_)).then_some(()))
        .await;

    sim.admin.clone().drop_stream(()).await.unwrap();
    let ended = loop {
        match events.next_result().await {
            Ok(Some(_)) => continue,
            other => break other,
        }
    };
    assert_eq!(ended.unwrap_err().code(), Code::Unavailable);

    sim.register("rack-2", 8.0).await;
    let mut fresh = sim.events().await;
    let snapshot = fresh.snapshot().await;
    let started: Vec<_> = snapshot
        .iter()
        .filter(|e| matches!(e, Event::NodeStarted(_)))
        .filter_map(node_of)
        .collect();
    assert_eq!(started, ["rack-1", "rack-2"]);
    let completes = snapshot
        .iter()
        .filter(|e| matches!(e, Event::InitialDataComplete(_)))
        .count();
    assert_eq!(completes, 1);
    sim.shutdown().await;
}
