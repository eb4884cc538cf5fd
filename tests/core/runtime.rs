//! The AutoManager runtime against the Manager simulator over loopback,
//! both on a compressed clock: bundles placed and running, a killed node's
//! jobs recovered elsewhere, and a dropped stream answered by a fresh core
//! hydrated from the new snapshot with nothing lost or duplicated; a
//! standby that follows without acting and leads at once when promoted.

use std::collections::BTreeMap;
use std::time::Duration;

use norsk_auto_manager::automanager::{AutoManager, Notification, RunOptions};
use norsk_auto_manager::manager::client::ClientSettings;
use norsk_auto_manager::manager::proto::sim_admin;
use norsk_auto_manager::model::{Bundle, BundleId, JobHistoryEntry, JobId, NodeId, NodePhase};
use tokio::sync::broadcast;

use crate::sim_support::Sim;
use crate::support::runtime::{self, Setup, one_job_bundle, settings, stop};

const TIME_SCALE: f64 = 1000.0;
const WAIT: Duration = Duration::from_secs(60);

async fn start(nodes: &[(&str, f64)]) -> Setup {
    runtime::start(11, TIME_SCALE, nodes, |_| {}).await
}

fn bundle(i: usize, vcpus: f64) -> Bundle {
    one_job_bundle(&format!("b{i}"), vcpus)
}

/// Follows notifications until `done` holds for the jobs currently running
/// (job -> node, from each job's latest history entry).
async fn until_running(
    events: &mut broadcast::Receiver<Notification>,
    running: &mut BTreeMap<JobId, NodeId>,
    done: impl Fn(&BTreeMap<JobId, NodeId>) -> bool,
) {
    let follow = async {
        while !done(running) {
            match events.recv().await {
                Ok(Notification::JobUpdated { job }) => match job.history.last() {
                    Some(JobHistoryEntry::Running {
                        node_id: Some(node), ..
                    }) => {
                        running.insert(job.job_id.clone(), node.clone());
                    }
                    Some(JobHistoryEntry::Provisioned { .. }) | None => {}
                    Some(_) => {
                        running.remove(&job.job_id);
                    }
                },
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => panic!("fell {n} notifications behind"),
                Err(broadcast::error::RecvError::Closed) => panic!("the AutoManager stopped"),
            }
        }
    };
    tokio::time::timeout(WAIT, follow)
        .await
        .unwrap_or_else(|_| panic!("timed out; running: {}", running.len()));
}

/// Waits for the stream to break and come back (`transientFailure`, then
/// `ready` once the new snapshot is hydrated).
async fn reconnected(events: &mut broadcast::Receiver<Notification>) {
    let follow = async {
        let mut broke = false;
        loop {
            if let Ok(Notification::ConnectionStateChange { state }) = events.recv().await {
                broke |= state == "transientFailure";
                if broke && state == "ready" {
                    return;
                }
            }
        }
    };
    tokio::time::timeout(WAIT, follow).await.expect("the stream came back");
}

/// Instances per job in the simulator right now.
async fn instances(sim: &Sim) -> BTreeMap<JobId, usize> {
    let mut count = BTreeMap::new();
    for node in sim.snapshot().await.nodes {
        for instance in node.instances {
            *count.entry(instance.job_id).or_insert(0) += 1;
        }
    }
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_bundles_are_placed_and_run() {
    let mut s = start(&[("n1", 64.0), ("n2", 64.0), ("n3", 64.0), ("n4", 64.0)]).await;
    for i in 0..200 {
        s.am.create_bundle(bundle(i, 1.0)).await.expect("bundle accepted");
    }
    let mut running = BTreeMap::new();
    until_running(&mut s.events, &mut running, |r| r.len() == 200).await;
    let counts = instances(&s.sim).await;
    assert_eq!(counts.len(), 200);
    assert!(counts.values().all(|&n| n == 1), "a job runs twice: {counts:?}");
    let metrics = s.am.metrics().await.expect("metrics");
    assert_eq!(metrics.counters.placements_succeeded, 200);
    assert_eq!(metrics.counters.placements_dispatch_failed, 0);
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_has_its_jobs_recovered_elsewhere() {
    let mut s = start(&[("n1", 8.0), ("n2", 8.0), ("n3", 8.0)]).await;
    for i in 0..6 {
        s.am.create_bundle(bundle(i, 2.0)).await.expect("bundle accepted");
    }
    let mut running = BTreeMap::new();
    until_running(&mut s.events, &mut running, |r| r.len() == 6).await;
    let victim = running.values().next().expect("a node hosts jobs").clone();
    s.sim
        .admin
        .clone()
        .kill_node(sim_admin::NodeRef {
            node_id: victim.0.clone(),
        })
        .await
        .expect("node killed");
    until_running(&mut s.events, &mut running, |r| {
        r.len() == 6 && r.values().all(|node| *node != victim)
    })
    .await;
    let counts = instances(&s.sim).await;
    assert!(counts.values().all(|&n| n == 1), "a job runs twice: {counts:?}");
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_hydrates_a_fresh_core_with_nothing_lost_or_duplicated() {
    let mut s = start(&[("n1", 16.0), ("n2", 16.0)]).await;
    for i in 0..10 {
        s.am.create_bundle(bundle(i, 1.0)).await.expect("bundle accepted");
    }
    let mut running = BTreeMap::new();
    until_running(&mut s.events, &mut running, |r| r.len() == 10).await;
    s.sim.admin.clone().drop_stream(()).await.expect("stream dropped");
    reconnected(&mut s.events).await;
    // A bundle created after the break is placed by the fresh core.
    s.am.create_bundle(bundle(10, 1.0)).await.expect("bundle accepted");
    until_running(&mut s.events, &mut running, |r| r.len() == 11).await;
    let counts = instances(&s.sim).await;
    assert_eq!(counts.len(), 11);
    assert!(counts.values().all(|&n| n == 1), "a job was duplicated: {counts:?}");
    let metrics = s.am.metrics().await.expect("metrics");
    assert_eq!(
        metrics.counters.placements_attempted, 11,
        "hydrated jobs were placed again"
    );
    stop(s).await;
}

/// Polls until `holds` (a query of a core through its handle) is true.
async fn until<F: Future<Output = bool>>(what: &str, holds: impl Fn() -> F) {
    let poll = async {
        while !holds().await {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(WAIT, poll)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting until {what}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_follows_without_acting_and_leads_at_once_when_promoted() {
    let mut s = start(&[("n1", 8.0), ("n2", 8.0), ("n3", 8.0)]).await;
    let (standby, standby_join) = AutoManager::standby_with_client(
        settings(&s.sim),
        RunOptions { time_scale: TIME_SCALE },
        ClientSettings::plaintext(s.sim.handle.url()),
    )
    .expect("standby starts");
    let mut standby_events = standby.subscribe();
    for i in 0..6 {
        s.am.create_bundle(bundle(i, 2.0)).await.expect("bundle accepted");
    }
    let mut running = BTreeMap::new();
    until_running(&mut s.events, &mut running, |r| r.len() == 6).await;
    // The standby has followed every placement the leader made, without
    // leaving its hydration phase.
    let placed = running.clone();
    until("the standby sees every job bound", || async {
        for (job, node) in &placed {
            if standby.node_of(job.clone()).await.expect("standby answers").as_ref() != Some(node) {
                return false;
            }
        }
        true
    })
    .await;
    // A command to a standby waits for its promotion.
    let held = tokio::spawn({
        let standby = standby.clone();
        async move { standby.create_bundle(bundle(6, 2.0)).await }
    });
    // The leader goes; a node is lost while nobody leads.
    s.am.close().await;
    s.join.await.expect("the leader's loop ends cleanly");
    let victim = running.values().next().expect("a node hosts jobs").clone();
    s.sim
        .admin
        .clone()
        .kill_node(sim_admin::NodeRef {
            node_id: victim.0.clone(),
        })
        .await
        .expect("node killed");
    let lost: Vec<JobId> = running
        .iter()
        .filter(|(_, n)| **n == victim)
        .map(|(j, _)| j.clone())
        .collect();
    running.retain(|_, node| *node != victim);
    until("the standby sees the node stopped", || async {
        let nodes = standby.node_views().await.expect("standby answers");
        nodes.iter().any(|n| n.id == victim && n.phase == NodePhase::Stopped)
    })
    .await;
    let before = standby.metrics().await.expect("metrics");
    assert_eq!(before.counters.placements_attempted, 0, "a standby placed");
    assert!(!held.is_finished(), "a standby served a command before its promotion");
    assert!(
        !standby.is_hydrated().await.expect("query"),
        "a standby left its hydration phase by itself"
    );
    // Promoted: it decides at once from what it followed — the lost jobs
    // and the held bundle are placed, nothing else is placed again.
    standby.promote().await.expect("promoted");
    assert!(standby.is_hydrated().await.expect("query"));
    held.await
        .expect("task")
        .expect("the held bundle is accepted once promoted");
    until_running(&mut standby_events, &mut running, |r| {
        r.len() == 7 && r.values().all(|node| *node != victim)
    })
    .await;
    let counts = instances(&s.sim).await;
    assert_eq!(counts.len(), 7);
    assert!(counts.values().all(|&n| n == 1), "a job runs twice: {counts:?}");
    let after = standby.metrics().await.expect("metrics");
    assert_eq!(
        after.counters.placements_attempted,
        lost.len() as u64 + 1,
        "jobs the standby followed were placed again"
    );
    standby.close().await;
    standby_join.await.expect("the standby's loop ends cleanly");
    s.sim.shutdown().await;
}

fn show(started: &str) -> Bundle {
    Bundle {
        bundle_id: BundleId("show".into()),
        spec: yaml_serde::from_str(&format!(
            "pool: production\njobs:\n  - {{jobName: encode, requirements: {{requiredCapacity: 1}}}}\n  - {{jobName: record, startMode: manual, startedReplicas: {started}, requirements: {{requiredCapacity: 1}}}}\n"
        ))
        .expect("bundle parses"),
        ..Bundle::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_applied_through_the_handle_starts_and_stops_its_manual_jobs_across_a_reconnect() {
    let mut s = start(&[("n1", 8.0)]).await;
    s.am.create_bundle(show("[0]")).await.expect("bundle accepted");
    let record = JobId("show/0/record".into());
    let mut running = BTreeMap::new();
    until_running(&mut s.events, &mut running, |r| r.len() == 2).await;
    // A fresh core after a stream break keeps wanting what the spec said.
    s.sim.admin.clone().drop_stream(()).await.expect("stream dropped");
    reconnected(&mut s.events).await;
    assert_eq!(
        instances(&s.sim).await.get(&record),
        Some(&1),
        "the started job was stopped"
    );
    s.am.update_bundle(show("[]")).await.expect("update accepted");
    until_running(&mut s.events, &mut running, |r| {
        r.len() == 1 && !r.contains_key(&record)
    })
    .await;
    tokio::time::timeout(WAIT, async {
        while instances(&s.sim).await.contains_key(&record) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the stopped job's instance is gone");
    let snapshot = s.sim.snapshot().await;
    assert_eq!(
        snapshot.bundles.iter().map(|b| b.generation).collect::<Vec<_>>(),
        [1],
        "starting and stopping sent a revision"
    );
    assert_eq!(instances(&s.sim).await.get(&JobId("show/0/encode".into())), Some(&1));
    stop(s).await;
}

/// The pending window each event stream the runtime opened asked for.
async fn pending_windows(setup: &Setup) -> Vec<i32> {
    until("an event stream is opened", || async {
        !setup.sim.snapshot().await.pending_windows_s.is_empty()
    })
    .await;
    setup.sim.snapshot().await.pending_windows_s
}

#[tokio::test]
async fn the_event_stream_asks_manager_for_the_pending_window_widened_to_the_longest_placement_lead() {
    // A fixed tier places with no lead: `pendingWindow` as given.
    let setup = runtime::start(3, TIME_SCALE, &[("n1", 8.0)], |s| s.pending_window = 600).await;
    assert_eq!(pending_windows(&setup).await, vec![600]);
    stop(setup).await;
    // A tier placing 15 minutes ahead of a scheduled start: Manager must
    // announce the job at least that early, whatever `pendingWindow` says.
    let setup = runtime::start(3, TIME_SCALE, &[("n1", 8.0)], |s| {
        s.pending_window = 60;
        s.placement_pools = yaml_serde::from_str(
            "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed, placementLeadMs: 900000}\n",
        )
        .expect("pools parse");
    })
    .await;
    assert_eq!(pending_windows(&setup).await, vec![900]);
    stop(setup).await;
}
