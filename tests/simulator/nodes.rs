//! Node lifecycle: launches against the catalogue and its capacity,
//! idempotent creates, keepalive outages, termination, interruption and
//! reclaim, determinism for a seed.

use norsk_auto_manager::manager::proto::common;
use norsk_auto_manager::manager::proto::manager::{
    self as pb, event_stream_event::Event, job_history_entry::HistoryEntry, job_history_job_stopping, node_stopping,
};
use norsk_auto_manager::manager::proto::sim_admin;
use norsk_auto_manager::model::{InterruptionKind, NodePhase, ProviderKind};
use norsk_auto_manager::sim::{SimConfig, SimSnapshot};
use tonic::Code;

use crate::sim_support::{Events, Sim, TIME_SCALE, aws_node, job_update, kind, node_of};

async fn booted(sim: &Sim, node_id: &str) {
    let mut events = sim.events().await;
    events.snapshot().await;
    sim.manager
        .clone()
        .create_aws_node(aws_node(node_id, "eu-west-1", "m5.xlarge"))
        .await
        .unwrap();
    events
        .until(|e| (matches!(e, Event::NodeInventory(_)) && node_of(e) == Some(node_id)).then_some(()))
        .await;
}

#[tokio::test]
async fn an_aws_node_starts_after_provisioning_with_its_catalogue_inventory_in_a_region_az() {
    let sim = Sim::start().await;
    booted(&sim, "n1").await;
    let snapshot = sim.snapshot().await;
    let node = &snapshot.nodes[0];
    assert_eq!(node.phase, NodePhase::Running);
    let inventory = node.inventory.as_ref().unwrap();
    assert_eq!(
        (inventory.kind, inventory.total_capacity, inventory.total_cores),
        (ProviderKind::Aws, 4.0, 4)
    );
    assert!(
        ["eu-west-1a", "eu-west-1b", "eu-west-1c"].contains(&inventory.az.as_str()),
        "{}",
        inventory.az
    );
    assert_eq!(snapshot.fleet.nodes[0].inventory.as_ref(), Some(inventory));
    sim.shutdown().await;
}

#[tokio::test]
async fn creating_the_same_aws_node_twice_creates_one_node() {
    let sim = Sim::start().await;
    let mut events = sim.events().await;
    events.snapshot().await;
    for _ in 0..2 {
        sim.manager
            .clone()
            .create_aws_node(aws_node("n1", "eu-west-1", "m5.xlarge"))
            .await
            .unwrap();
    }
    let (_, seen) = events.until(|e| matches!(e, Event::NodeStarted(_)).then_some(())).await;
    assert_eq!(seen.iter().filter(|e| kind(e) == "node_starting").count(), 1);
    let snapshot = sim.snapshot().await;
    assert_eq!(snapshot.nodes.len(), 1);
    assert_eq!(snapshot.capacity[0].in_use, 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_region_without_capacity_answers_insufficient_instance_capacity() {
    let sim = Sim::start().await;
    let capacity = sim_admin::SetCapacityRequest {
        region: "eu-west-1".into(),
        instance_type: "m5.xlarge".into(),
        available: 0,
    };
    sim.admin.clone().set_capacity(capacity.clone()).await.unwrap();
    let err = sim
        .manager
        .clone()
        .create_aws_node(aws_node("n1", "eu-west-1", "m5.xlarge"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message().contains("InsufficientInstanceCapacity"),
        "{}",
        err.message()
    );
    // Another type in the region, and the same type elsewhere, still launch.
    sim.manager
        .clone()
        .create_aws_node(aws_node("n2", "eu-west-1", "m5.large"))
        .await
        .unwrap();
    sim.manager
        .clone()
        .create_aws_node(aws_node("n3", "us-east-1", "m5.xlarge"))
        .await
        .unwrap();
    sim.admin
        .clone()
        .set_capacity(sim_admin::SetCapacityRequest {
            available: 1,
            ..capacity
        })
        .await
        .unwrap();
    sim.manager
        .clone()
        .create_aws_node(aws_node("n1", "eu-west-1", "m5.xlarge"))
        .await
        .unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn a_killed_node_is_reported_stopped_after_the_keepalive_without_stopping_first() {
    let sim = Sim::start().await;
    sim.register("rack-1", 8.0).await;
    sim.create_job("j1").await;
    sim.start_job("j1", "primary", "rack-1").await.unwrap();
    let mut events = sim.events().await;
    events.snapshot().await;
    sim.admin
        .clone()
        .kill_node(sim_admin::NodeRef {
            node_id: "rack-1".into(),
        })
        .await
        .unwrap();
    let (_, seen) = events.until(|e| matches!(e, Event::NodeStopped(_)).then_some(())).await;
    assert!(
        !seen.iter().any(|e| kind(e) == "node_stopping"),
        "{:?}",
        seen.iter().map(kind).collect::<Vec<_>>()
    );
    let (stopped, _) = events
        .until(|e| job_update(e).map(|(_, h)| matches!(h, Some(HistoryEntry::JobStopped(_)))))
        .await;
    assert!(stopped, "the instance on the dead node is stopped");
    assert!(sim.snapshot().await.nodes.is_empty());
    sim.shutdown().await;
}

#[tokio::test]
async fn a_stopped_worker_is_reported_stopping_at_once_then_stopped_after_the_keepalive() {
    let sim = Sim::start().await;
    sim.register("rack-1", 8.0).await;
    let mut events = sim.events().await;
    events.snapshot().await;
    sim.admin
        .clone()
        .stop_node(sim_admin::NodeRef {
            node_id: "rack-1".into(),
        })
        .await
        .unwrap();
    let Event::NodeStopping(stopping) = events.next().await else {
        panic!("node_stopping first")
    };
    assert_eq!(stopping.reason, node_stopping::Reason::HealthPingTimeExceeded as i32);
    let Event::NodeStopped(stopped) = events.next().await else {
        panic!("then node_stopped")
    };
    assert_eq!(stopped.node_id.unwrap().node_id, "rack-1");
    sim.shutdown().await;
}

#[tokio::test]
async fn terminating_a_node_stops_its_instances_then_the_node_and_releases_its_capacity() {
    let sim = Sim::start().await;
    booted(&sim, "n1").await;
    sim.admin
        .clone()
        .set_capacity(sim_admin::SetCapacityRequest {
            region: "eu-west-1".into(),
            instance_type: "m5.xlarge".into(),
            available: 0,
        })
        .await
        .unwrap();
    sim.create_job("j1").await;
    sim.start_job("j1", "primary", "n1").await.unwrap();
    let mut events = sim.events().await;
    events.snapshot().await;
    sim.manager
        .clone()
        .terminate_node(common::NodeId { node_id: "n1".into() })
        .await
        .unwrap();
    let (_, seen) = events.until(|e| matches!(e, Event::NodeStopped(_)).then_some(())).await;
    let node_stopping = seen
        .iter()
        .position(|e| kind(e) == "node_stopping")
        .expect("node_stopping");
    let Event::NodeStopping(stopping) = &seen[node_stopping] else {
        unreachable!()
    };
    assert_eq!(stopping.reason, node_stopping::Reason::UserRequested as i32);
    let (instance_stopping, reason) = seen
        .iter()
        .enumerate()
        .find_map(|(at, e)| match job_update(e) {
            Some((_, Some(HistoryEntry::JobStopping(s)))) => Some((at, s.reason)),
            _ => None,
        })
        .expect("the instance stops");
    assert_eq!(
        reason,
        job_history_job_stopping::Reason::JobStoppedNodeTerminated as i32
    );
    assert!(node_stopping < instance_stopping && instance_stopping < seen.len() - 1);
    // The released launch is available again.
    sim.manager
        .clone()
        .create_aws_node(aws_node("n2", "eu-west-1", "m5.xlarge"))
        .await
        .unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn a_spot_interruption_is_noticed_tagged_audited_and_ends_in_a_provider_reclaim() {
    let sim = Sim::start().await;
    booted(&sim, "n1").await;
    let mut events = sim.events().await;
    events.snapshot().await;
    let interrupt = sim_admin::InterruptNodeRequest {
        node_id: "n1".into(),
        kind: pb::InterruptionKind::SpotInterruption as i32,
        deadline_s: 0.0,
    };
    sim.admin.clone().interrupt_node(interrupt).await.unwrap();
    let (_, seen) = events.until(|e| matches!(e, Event::NodeStopped(_)).then_some(())).await;
    let kinds: Vec<_> = seen.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "node_interruption_notice",
            "node_tags_updated",
            "audit_appended",
            "node_stopping",
            "node_stopped"
        ]
    );
    let Event::NodeInterruptionNotice(notice) = &seen[0] else {
        unreachable!()
    };
    let (deadline, noticed) = (notice.deadline.unwrap(), notice.noticed_at.unwrap());
    assert_eq!(
        deadline.seconds - noticed.seconds,
        120,
        "a spot interruption's default warning"
    );
    let Event::NodeTagsUpdated(tags) = &seen[1] else {
        unreachable!()
    };
    assert_eq!(tags.tags["interruption"], "spot-interruption");
    let Event::NodeStopping(stopping) = &seen[3] else {
        unreachable!()
    };
    assert_eq!(stopping.reason, node_stopping::Reason::ProviderTerminate as i32);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_rebalance_notice_carries_no_deadline_and_leaves_the_node_running() {
    let sim = Sim::start().await;
    sim.register("rack-1", 8.0).await;
    let interrupt = sim_admin::InterruptNodeRequest {
        node_id: "rack-1".into(),
        kind: pb::InterruptionKind::Rebalance as i32,
        deadline_s: 0.0,
    };
    sim.admin.clone().interrupt_node(interrupt).await.unwrap();
    let snapshot = sim.snapshot().await;
    let interruption = snapshot.nodes[0].interruption.as_ref().unwrap();
    assert_eq!(
        (interruption.kind, interruption.deadline),
        (InterruptionKind::Rebalance, None)
    );
    assert_eq!(snapshot.nodes[0].phase, NodePhase::Running);
    // A reconnecting client learns of the pending notice from the snapshot.
    let mut events = sim.events().await;
    assert!(
        events
            .snapshot()
            .await
            .iter()
            .any(|e| kind(e) == "node_interruption_notice")
    );
    sim.shutdown().await;
}

/// The next inventory a node advertises on the stream.
async fn next_inventory(events: &mut Events) -> pb::NodeInventory {
    let (inventory, _) = events
        .until(|e| match e {
            Event::NodeInventory(i) => i.inventory.clone(),
            _ => None,
        })
        .await;
    inventory
}

#[tokio::test]
async fn an_oci_node_lands_in_the_availability_domain_it_names() {
    let sim = Sim::start().await;
    let mut events = sim.events().await;
    events.snapshot().await;
    let request = pb::CreateOciNodeRequest {
        node_id: Some(common::NodeId { node_id: "o1".into() }),
        availability_domain: "EU-FRANKFURT-1-AD-2".into(),
        shape: "VM.Standard2.4".into(),
        ..Default::default()
    };
    sim.manager.clone().create_oci_node(request).await.unwrap();
    let inventory = next_inventory(&mut events).await;
    assert_eq!(inventory.region, "eu-frankfurt-1");
    assert_eq!(inventory.availability_zone, "EU-FRANKFURT-1-AD-2");
    assert_eq!(inventory.total_capacity, 8.0);
    sim.shutdown().await;
}

#[tokio::test]
async fn an_oci_node_asked_for_by_region_gets_one_of_its_domains() {
    let sim = Sim::start().await;
    let mut events = sim.events().await;
    events.snapshot().await;
    let request = pb::CreateOciNodeRequest {
        node_id: Some(common::NodeId { node_id: "o2".into() }),
        region: "eu-frankfurt-1".into(),
        shape: "VM.Standard2.4".into(),
        ..Default::default()
    };
    sim.manager.clone().create_oci_node(request).await.unwrap();
    let inventory = next_inventory(&mut events).await;
    assert_eq!(inventory.region, "eu-frankfurt-1");
    assert!(
        inventory.availability_zone.starts_with("EU-FRANKFURT-1-AD-"),
        "{}",
        inventory.availability_zone
    );
    // Neither a region nor a domain: refused, saying what is missing.
    let status = sim
        .manager
        .clone()
        .create_oci_node(pb::CreateOciNodeRequest {
            node_id: Some(common::NodeId { node_id: "o3".into() }),
            shape: "VM.Standard2.4".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("availabilityDomain or region"),
        "{}",
        status.message()
    );
    sim.shutdown().await;
}

async fn fleet_of_seed(seed: u64) -> SimSnapshot {
    let sim = Sim::start_with(SimConfig {
        seed,
        time_scale: TIME_SCALE,
        ..Default::default()
    })
    .await;
    let mut events = sim.events().await;
    events.snapshot().await;
    for i in 0..6 {
        sim.manager
            .clone()
            .create_aws_node(aws_node(&format!("n{i}"), "us-east-1", "c5.2xlarge"))
            .await
            .unwrap();
    }
    let mut inventories = 0;
    events
        .until(|e| {
            inventories += usize::from(kind(e) == "node_inventory");
            (inventories == 6).then_some(())
        })
        .await;
    let snapshot = sim.snapshot().await;
    sim.shutdown().await;
    snapshot
}

#[tokio::test]
async fn the_same_seed_builds_the_same_fleet() {
    let zones = |s: &SimSnapshot| {
        s.nodes
            .iter()
            .map(|n| n.inventory.clone().unwrap().az)
            .collect::<Vec<_>>()
    };
    let (a, b, c) = (
        fleet_of_seed(42).await,
        fleet_of_seed(42).await,
        fleet_of_seed(43).await,
    );
    assert_eq!(zones(&a), zones(&b));
    assert_ne!(zones(&a), zones(&c), "another seed picks other zones");
}
