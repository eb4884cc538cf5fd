//! Rules of the spec that are plain to state and easy to lose: a placement
//! decision carries its whole trace when traces are on, Manager's
//! informational events reach the subscriber as they came, and the runtime
//! stays answerable to a subscriber that never reads and to a second
//! `close()`.

use std::collections::BTreeMap;
use std::time::Duration;

use norsk_auto_manager::automanager::{AutoManager, Notification, RunOptions};
use norsk_auto_manager::model::{AuditEntry, InstanceKey, JobId, ManagerEvent};
use norsk_auto_manager::placement::Verdict;
use norsk_auto_manager::sim::SimConfig;

use crate::sim_support::Sim;
use crate::support::runtime::{cluster_node, one_job_bundle};
use crate::support::{Harness, settings};

const JOB: &str = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n";

fn decisions(notifications: &[Notification]) -> Vec<&norsk_auto_manager::automanager::PlacementDecisionInfo> {
    notifications
        .iter()
        .filter_map(|n| match n {
            Notification::PlacementDecision(d) => Some(d.as_ref()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_placement_decision_carries_every_nodes_verdict_when_traces_are_on() {
    let mut h = Harness::with(norsk_auto_manager::automanager::AutoSettings {
        trace_placements: true,
        ..settings()
    });
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 0.5);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("ch1", JOB);
    h.start_all();
    let notifications = h.take_notifications();
    let decided = decisions(&notifications);
    assert_eq!(decided.len(), 1, "one job, one decision");
    let trace = decided[0].trace.as_ref().expect("the trace is carried");
    let walked = &trace.tiers[0];
    let verdicts: BTreeMap<&str, bool> = walked
        .nodes
        .iter()
        .map(|n| (n.node_id.0.as_str(), matches!(n.verdict, Verdict::Rejected { .. })))
        .collect();
    assert_eq!(
        verdicts,
        BTreeMap::from([("a", false), ("b", true)]),
        "a ranked, b (too small) rejected"
    );

    // Off (the default): no trace.
    let mut h = Harness::hydrated();
    h.bundle("ch1", JOB);
    h.start_all();
    let notifications = h.take_notifications();
    assert!(decisions(&notifications).iter().all(|d| d.trace.is_none()));
}

#[test]
fn job_info_job_deleted_and_audit_entries_reach_the_subscriber_as_manager_sent_them() {
    let mut h = Harness::hydrated();
    h.bundle("ch1", JOB);
    h.start_all();
    h.take_notifications();
    let job = JobId::from("ch1/0/encode");
    h.event(ManagerEvent::JobInfo {
        job_id: job.clone(),
        role: InstanceKey("primary".into()),
        text: "bitrate lowered to 4 Mb/s".into(),
    });
    let entry = AuditEntry {
        at: Some(h.now),
        actor: "operator@example".into(),
        action: "job.update".into(),
        subject: "ch1/0/encode".into(),
        details: BTreeMap::from([("field".to_owned(), "bitrate".to_owned())]),
    };
    h.event(ManagerEvent::AuditAppended(entry.clone()));
    h.event(ManagerEvent::JobDeleted(job.clone()));
    let told = h.take_notifications();
    assert!(told.contains(&Notification::JobInfo {
        job_id: job.clone(),
        role: InstanceKey("primary".into()),
        text: "bitrate lowered to 4 Mb/s".into(),
    }));
    assert!(told.contains(&Notification::AuditAppended { entry }));
    assert!(told.contains(&Notification::JobDeleted { job_id: job }));
}

/// A subscriber that never reads falls behind (it is told it lagged when it
/// reads at last); the loop never waits for it, and a second `close()`
/// is as harmless as the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_never_reads_never_holds_the_loop_and_close_twice_is_harmless() {
    let sim = Sim::start_with(SimConfig {
        time_scale: 1000.0,
        cluster_nodes: (0..4).map(|i| cluster_node(&format!("n{i}"), 64.0)).collect(),
        ..SimConfig::default()
    })
    .await;
    let settings = norsk_auto_manager::automanager::AutoSettings {
        url: sim.handle.url(),
        placement_pools: yaml_serde::from_str(
            "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n",
        )
        .expect("pools parse"),
        ..Default::default()
    };
    let (am, join) = AutoManager::run_with(settings, RunOptions { time_scale: 1000.0 }).expect("runs");
    let mut stalled = am.subscribe();
    // Far more notifications than a subscriber's buffer holds.
    let count = 800;
    for i in 0..count {
        am.create_bundle(one_job_bundle(&format!("ns/b{i}"), 0.25))
            .await
            .expect("bundle accepted");
    }
    let placed = async {
        loop {
            let running: usize = sim.snapshot().await.nodes.iter().map(|n| n.instances.len()).sum();
            if running == count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(120), placed)
        .await
        .expect("every bundle runs while the subscriber reads nothing");
    assert!(
        am.node_of(JobId::from("ns/b0/0/encode"))
            .await
            .expect("the loop answers")
            .is_some(),
        "the loop answers queries"
    );
    assert!(
        matches!(
            stalled.try_recv(),
            Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_))
        ),
        "the stalled subscriber is told it fell behind"
    );
    am.close().await;
    am.close().await;
    tokio::time::timeout(Duration::from_secs(30), join)
        .await
        .expect("the loop ends")
        .expect("cleanly");
}

#[test]
fn a_rejection_reaches_the_subscriber_with_the_inventory_the_worker_sent() {
    let mut h = Harness::hydrated();
    h.bundle("b", JOB);
    h.ok_all();
    h.take_notifications();
    let job = crate::support::job_id("b", 0, "encode");
    let node = h.bound_node(&job).expect("placed");
    let holds = crate::support::inventory(norsk_auto_manager::model::ProviderKind::LocalServers, 6.0);
    h.event(ManagerEvent::JobRejected {
        job_id: job.clone(),
        role: InstanceKey("primary".into()),
        node_id: node.clone(),
        code: norsk_auto_manager::model::RejectionCode::InsufficientCapacity,
        detail: "no room left".into(),
        inventory: Some(holds.clone()),
    });
    let told = h.take_notifications().into_iter().find_map(|n| match n {
        Notification::JobRejected { job_id, inventory, .. } if job_id == job => Some(inventory),
        _ => None,
    });
    assert_eq!(told, Some(Some(holds)), "onJobRejected carries what the worker holds");
}

#[test]
fn a_failed_placement_is_also_said_as_an_error() {
    let mut h = Harness::hydrated();
    h.bundle(
        "big",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1000}}\n",
    );
    let notes = h.take_notifications();
    let job = crate::support::job_id("big", 0, "encode");
    assert!(
        notes
            .iter()
            .any(|n| matches!(n, Notification::PlacementFailed { job_id, .. } if *job_id == job)),
        "onPlacementFailed: {notes:?}"
    );
    assert!(
        notes.iter().any(|n| matches!(
            n,
            Notification::Error { message } if message.contains(job.as_str()) && message.contains("placement")
        )),
        "the failure also surfaces via onError: {notes:?}"
    );
}
