//! The AutoManager runtime against the simulator as a published Norsk
//! Manager (1.0.384, no additions): the operator stores and expands bundles
//! itself, knows nodes by the shape they were created or declared with,
//! keeps spare marks and deferred starts, and the core's policy runs
//! unchanged on top. Each test asserts what a user sees: which job runs
//! where, once, and what Manager holds.

use std::collections::BTreeMap;
use std::time::Duration;

use norsk_auto_manager::automanager::{AutoManager, MigrationOptions, MigrationPhase, Notification, RunOptions};
use norsk_auto_manager::manager::port::{Capability, KeptTags, Mode};
use norsk_auto_manager::manager::proto::sim_admin;
use norsk_auto_manager::model::{
    Bundle, BundleId, JobHistoryEntry, JobId, MigrationId, MigrationStrategy, NodeId, NodeInventory, TerminalVerdict,
    VerdictKind, runtime_job_id,
};
use norsk_auto_manager::sim::SimConfig;
use tokio::sync::broadcast;

use crate::sim_support::Sim;
use crate::support::runtime::{Setup, cluster_node, one_job_bundle, stop};

const TIME_SCALE: f64 = 1000.0;
const WAIT: Duration = Duration::from_secs(60);

/// Pool `production`: cluster servers declared as 8-vCPU machines on its
/// fixed tier (a published Manager says nothing of their size).
const POOLS: &str = "- name: production\n  tiers:\n    - name: cluster\n      kind: local-servers\n      scaleOut: fixed\n      candidateInstanceTypes: [{instanceType: server, totalCapacity: 8, totalCores: 8}]\n";

async fn published_sim(nodes: &[&str]) -> Sim {
    Sim::start_with(SimConfig {
        seed: 5,
        time_scale: TIME_SCALE,
        published_api_only: true,
        cluster_nodes: nodes.iter().map(|id| cluster_node(id, 8.0)).collect(),
        ..SimConfig::default()
    })
    .await
}

fn run(sim: Sim) -> Setup {
    let settings = norsk_auto_manager::automanager::AutoSettings {
        url: sim.handle.url(),
        placement_pools: yaml_serde::from_str(POOLS).expect("pools parse"),
        trace_placements: false,
        ..Default::default()
    };
    let (am, join) = AutoManager::run_with(settings, RunOptions { time_scale: TIME_SCALE }).expect("runs");
    let events = am.subscribe();
    Setup { sim, am, join, events }
}

fn bundle(i: usize, vcpus: f64) -> Bundle {
    one_job_bundle(&format!("ns/b{i}"), vcpus)
}

fn job(i: usize) -> JobId {
    runtime_job_id(&BundleId(format!("ns/b{i}")), 0, "encode")
}

/// Running instances per job in the simulator: (instance key, node).
async fn instances(sim: &Sim) -> BTreeMap<JobId, Vec<(String, NodeId)>> {
    let mut running: BTreeMap<JobId, Vec<(String, NodeId)>> = BTreeMap::new();
    for node in sim.snapshot().await.nodes {
        for instance in node.instances {
            running
                .entry(instance.job_id)
                .or_default()
                .push((instance.role, node.id.clone()));
        }
    }
    running
}

/// Polls the simulator until `holds` of its running instances.
async fn until_instances(sim: &Sim, what: &str, holds: impl Fn(&BTreeMap<JobId, Vec<(String, NodeId)>>) -> bool) {
    let poll = async {
        loop {
            let running = instances(sim).await;
            if holds(&running) {
                return running;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(WAIT, poll).await.is_err() {
        panic!("timed out waiting until {what}; running: {:?}", instances(sim).await);
    }
}

fn each_once(running: &BTreeMap<JobId, Vec<(String, NodeId)>>, n: usize) -> bool {
    running.len() == n && running.values().all(|i| i.len() == 1)
}

async fn until_notified(
    events: &mut broadcast::Receiver<Notification>,
    what: &str,
    holds: impl Fn(&Notification) -> bool,
) {
    let follow = async {
        loop {
            match events.recv().await {
                Ok(n) if holds(&n) => return,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("the AutoManager stopped"),
            }
        }
    };
    tokio::time::timeout(WAIT, follow)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_published_manager_bundles_run_as_tagged_jobs_and_a_lost_node_is_recovered() {
    let s = run(published_sim(&["n1", "n2", "n3"]).await);
    for i in 0..6 {
        s.am.create_bundle(bundle(i, 2.0)).await.expect("bundle accepted");
    }
    until_instances(&s.sim, "six jobs run once each", |r| each_once(r, 6)).await;
    let caps = s.am.capabilities().borrow().clone();
    assert!(
        Capability::ALL.iter().all(|c| caps.mode(*c) == Mode::Published),
        "every addition is done without Manager: {}",
        caps.summary()
    );
    // Manager holds plain jobs whose tags say which bundle, replica and job
    // each is.
    let snapshot = s.sim.snapshot().await;
    assert!(snapshot.bundles.is_empty(), "a published Manager stores no bundle");
    let stored = snapshot
        .jobs
        .iter()
        .find(|j| j.job_id == job(3))
        .expect("the job is stored");
    assert_eq!(stored.tags["automanager.norsk.video/bundle"], "ns/b3");
    assert_eq!(stored.tags["automanager.norsk.video/replica"], "0");
    assert_eq!(stored.tags["automanager.norsk.video/job"], "encode");
    assert_eq!(stored.tags["automanager.norsk.video/revision"], "1");

    let running = instances(&s.sim).await;
    let victim = running[&job(0)][0].1.clone();
    s.sim
        .admin
        .clone()
        .kill_node(sim_admin::NodeRef {
            node_id: victim.0.clone(),
        })
        .await
        .expect("node killed");
    until_instances(&s.sim, "every job runs once, none on the killed node", |r| {
        each_once(r, 6) && r.values().all(|i| i[0].1 != victim)
    })
    .await;
    stop(s).await;
}

/// A Manager that cannot say whether it serves an addition (it is starting,
/// or a proxy in front of it is failing) is not streamed from: an addition
/// that is only a field would be dropped by a published Manager without a
/// word, so the operator waits for every answer before it acts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stream_opens_until_manager_has_answered_every_capability() {
    let sim = Sim::start_with(SimConfig {
        seed: 5,
        time_scale: TIME_SCALE,
        cluster_nodes: vec![cluster_node("n1", 8.0)],
        ..SimConfig::default()
    })
    .await;
    let fault = sim_admin::RpcFaultRequest {
        rpc: "StartPreparedJob".into(),
        failure_rate: 1.0,
        ..Default::default()
    };
    sim.admin.clone().rpc_fault(fault.clone()).await.expect("fault set");
    let mut s = run(sim);
    let follow = async {
        loop {
            match s.events.recv().await {
                Ok(Notification::ConnectionStateChange { state }) if state == "transientFailure" => return,
                Ok(Notification::ConnectionStateChange { state }) => {
                    assert_ne!(state, "ready", "the stream opened with a capability unanswered")
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("the AutoManager stopped"),
            }
        }
    };
    tokio::time::timeout(WAIT, follow)
        .await
        .expect("the connection is retried");
    s.sim
        .admin
        .clone()
        .rpc_fault(sim_admin::RpcFaultRequest { clear: true, ..fault })
        .await
        .expect("fault cleared");
    until_notified(
        &mut s.events,
        "the stream once Manager answers",
        |n| matches!(n, Notification::ConnectionStateChange { state } if state == "ready"),
    )
    .await;
    let caps = s.am.capabilities().borrow().clone();
    assert!(
        Capability::ALL.iter().all(|c| caps.mode(*c) == Mode::Served),
        "a full Manager serves every addition: {}",
        caps.summary()
    );
    s.am.create_bundle(bundle(0, 2.0)).await.expect("bundle accepted");
    until_instances(&s.sim, "the job runs", |r| each_once(r, 1)).await;
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_operator_adopts_what_a_published_manager_runs_and_moves_nothing() {
    let s = run(published_sim(&["n1", "n2"]).await);
    for i in 0..4 {
        s.am.create_bundle(bundle(i, 2.0)).await.expect("bundle accepted");
    }
    until_instances(&s.sim, "four jobs run", |r| each_once(r, 4)).await;
    let before = instances(&s.sim).await;
    s.am.close().await;
    s.join.await.expect("the loop ends cleanly");

    // A new process knows nothing but Manager's jobs and the resources.
    let mut s = run(s.sim);
    until_notified(
        &mut s.events,
        "the new stream",
        |n| matches!(n, Notification::ConnectionStateChange { state } if state == "ready"),
    )
    .await;
    for i in 0..4 {
        s.am.create_bundle(bundle(i, 2.0)).await.expect("bundle accepted again");
    }
    for i in 0..4 {
        let adopted = async {
            while s.am.node_of(job(i)).await.expect("query").is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(WAIT, adopted)
            .await
            .expect("the job is known where it runs");
    }
    assert_eq!(
        instances(&s.sim).await,
        before,
        "every instance kept running where it was"
    );
    let metrics = s.am.metrics().await.expect("metrics");
    assert_eq!(metrics.counters.placements_attempted, 0, "nothing was placed again");
    let stored = s.sim.snapshot().await.jobs;
    assert!(
        stored
            .iter()
            .all(|j| j.tags.get("automanager.norsk.video/revision").map(String::as_str) == Some("1")),
        "an unchanged bundle is not rewritten"
    );
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_updated_and_deleted_on_a_published_manager() {
    let mut s = run(published_sim(&["n1", "n2"]).await);
    s.am.create_bundle(bundle(0, 2.0)).await.expect("bundle accepted");
    until_instances(&s.sim, "the job runs", |r| each_once(r, 1)).await;
    s.am.update_bundle(bundle(0, 3.0)).await.expect("update accepted");
    let revised = async {
        loop {
            let jobs = s.sim.snapshot().await.jobs;
            if jobs
                .iter()
                .any(|j| j.tags.get("automanager.norsk.video/revision").map(String::as_str) == Some("2"))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(WAIT, revised)
        .await
        .expect("Manager's job is at revision 2");

    s.am.delete_bundle(BundleId("ns/b0".into()))
        .await
        .expect("delete accepted");
    until_notified(
        &mut s.events,
        "the bundle deleted",
        |n| matches!(n, Notification::BundleDeleted { bundle_id } if bundle_id.0 == "ns/b0"),
    )
    .await;
    until_instances(&s.sim, "nothing runs", BTreeMap::is_empty).await;
    let gone = async {
        while !s.sim.snapshot().await.jobs.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(WAIT, gone)
        .await
        .expect("Manager holds no job of it");
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_on_a_published_manager_stop_then_start_overlap_and_handover_as_overlap() {
    let mut s = run(published_sim(&["n1", "n2"]).await);
    for i in 0..3 {
        s.am.create_bundle(bundle(i, 2.0)).await.expect("bundle accepted");
    }
    until_instances(&s.sim, "three jobs run", |r| each_once(r, 3)).await;
    for (i, strategy) in [
        (0, MigrationStrategy::StopThenStart),
        (1, MigrationStrategy::Overlap),
        (2, MigrationStrategy::Handover),
    ] {
        let from = instances(&s.sim).await[&job(i)][0].1.clone();
        let id: MigrationId =
            s.am.migrate_job(
                job(i),
                MigrationOptions {
                    strategy: Some(strategy),
                    ..MigrationOptions::default()
                },
            )
            .await
            .expect("migration starts");
        until_notified(&mut s.events, "the migration done", |n| {
            matches!(n, Notification::MigrationPhase(m) if m.migration_id == id
                && matches!(m.phase, MigrationPhase::Done | MigrationPhase::Aborted | MigrationPhase::Lost))
        })
        .await;
        let state = s.am.migration_by_id(id.clone()).await.expect("query").expect("known");
        assert_eq!(state.phase, MigrationPhase::Done, "{strategy:?}: {state:?}");
        // Without migration signals a handover is carried out as overlap,
        // and says so.
        if strategy == MigrationStrategy::Handover {
            assert_eq!(state.strategy, MigrationStrategy::Overlap);
            assert!(
                state
                    .note
                    .as_deref()
                    .is_some_and(|n| n.starts_with("handover runs as overlap")),
                "{state:?}"
            );
        } else {
            assert_eq!((state.strategy, state.note.as_deref()), (strategy, None));
        }
        until_instances(&s.sim, "the job runs once, elsewhere", |r| {
            r.get(&job(i)).is_some_and(|i| i.len() == 1 && i[0].1 != from)
        })
        .await;
    }
    let history = s.sim.snapshot().await.jobs;
    let moved = history.iter().find(|j| j.job_id == job(0)).expect("stored");
    assert!(
        moved
            .history
            .iter()
            .any(|e| matches!(e, JobHistoryEntry::Running { role, .. } if role.0.contains('@'))),
        "the target ran under its own key"
    );
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_server_is_placed_on_only_once_its_size_is_declared() {
    // A pool whose fixed tier says nothing of its servers: on a published
    // Manager their size is unknown until a person declares it.
    let sim = published_sim(&["small", "big"]).await;
    let settings = norsk_auto_manager::automanager::AutoSettings {
        url: sim.handle.url(),
        placement_pools: yaml_serde::from_str(
            "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n",
        )
        .expect("pools parse"),
        trace_placements: false,
        ..Default::default()
    };
    let (am, join) = AutoManager::run_with(settings, RunOptions { time_scale: TIME_SCALE }).expect("runs");
    let mut s = Setup {
        events: am.subscribe(),
        sim,
        am,
        join,
    };
    until_notified(
        &mut s.events,
        "the stream",
        |n| matches!(n, Notification::ConnectionStateChange { state } if state == "ready"),
    )
    .await;
    // Declared before anything asks for room; "small" stays unknown.
    let declared = NodeInventory::local_server("studio", "rack-1", "r640", 8.0);
    s.am.declare_inventory(NodeId("big".into()), Some(declared))
        .await
        .expect("declared");
    for i in 0..3 {
        s.am.create_bundle(bundle(i, 2.0)).await.expect("bundle accepted");
    }
    until_instances(&s.sim, "three jobs run", |r| each_once(r, 3)).await;
    let running = instances(&s.sim).await;
    assert!(
        running.values().all(|i| i[0].1 == NodeId("big".into())),
        "only the declared server takes jobs: {running:?}"
    );
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_broken_under_one_operator_stays_broken_under_the_next() {
    let sim = published_sim(&["n1"]).await;
    let settings = |sim: &Sim| norsk_auto_manager::automanager::AutoSettings {
        url: sim.handle.url(),
        placement_pools: yaml_serde::from_str(POOLS).expect("pools parse"),
        trace_placements: false,
        max_restarts_per_hour: Some(1),
        ..Default::default()
    };
    let (am, join) = AutoManager::run_with(settings(&sim), RunOptions { time_scale: TIME_SCALE }).expect("runs");
    let mut s = Setup {
        events: am.subscribe(),
        sim,
        am,
        join,
    };
    s.am.create_bundle(bundle(0, 2.0)).await.expect("bundle accepted");
    // The job crashes until its restart ceiling breaks the bundle.
    let crash = async {
        loop {
            until_instances(&s.sim, "the job runs", |r| each_once(r, 1)).await;
            let _ = s
                .sim
                .admin
                .clone()
                .fail_job(sim_admin::JobRef {
                    job_id: job(0).0,
                    ..Default::default()
                })
                .await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        () = crash => {}
        () = until_notified(&mut s.events, "the bundle broken", |n| matches!(n, Notification::BundleBroken { .. })) => {}
    }
    let reason =
        s.am.read(|core| core.broken(&BundleId("ns/b0".into())).map(str::to_owned))
            .await
            .expect("read")
            .expect("broken");
    s.am.close().await;
    s.join.await.expect("the loop ends cleanly");

    // The next operator applies the Bundle with the verdict its status
    // records: on a Manager that keeps no verdicts, it stays broken.
    let (am, join) = AutoManager::run_with(settings(&s.sim), RunOptions { time_scale: TIME_SCALE }).expect("runs");
    let mut next = Setup {
        events: am.subscribe(),
        sim: s.sim,
        am,
        join,
    };
    until_notified(
        &mut next.events,
        "the stream",
        |n| matches!(n, Notification::ConnectionStateChange { state } if state == "ready"),
    )
    .await;
    let recorded = Bundle {
        terminal_verdict: Some(TerminalVerdict {
            kind: VerdictKind::Broken,
            reason: reason.clone(),
            at: None,
        }),
        ..bundle(0, 2.0)
    };
    next.am.create_bundle(recorded).await.expect("bundle accepted");
    let id = BundleId("ns/b0".into());
    let still = next
        .am
        .read(move |core| core.broken(&id).map(str::to_owned))
        .await
        .expect("read");
    assert_eq!(still.as_deref(), Some(reason.as_str()), "the bundle is still broken");
    // Nothing starts it again.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        instances(&next.sim).await.is_empty(),
        "a broken bundle's job was started again"
    );
    assert_eq!(
        next.am.metrics().await.expect("metrics").counters.placements_attempted,
        0
    );
    stop(next).await;
}

/// Forgets the notifications received so far.
fn drain(events: &mut broadcast::Receiver<Notification>) {
    while !matches!(
        events.try_recv(),
        Err(broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed)
    ) {}
}

/// Waits until Manager is heard with every capability in `mode` and the
/// stream that follows is open (the events drained before the switch).
async fn until_every_capability(s: &mut Setup, mode: Mode) {
    let mut caps = s.am.capabilities();
    tokio::time::timeout(
        WAIT,
        caps.wait_for(|c| Capability::ALL.iter().all(|cap| c.mode(*cap) == mode)),
    )
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for every capability {mode:?}"))
    .expect("the AutoManager runs");
    until_notified(
        &mut s.events,
        "the stream to the changed Manager",
        |n| matches!(n, Notification::ConnectionStateChange { state } if state == "ready"),
    )
    .await;
}

/// Manager upgraded and downgraded under a running operator (a new
/// Manager version on the same database): no running job is lost or
/// moved, nothing is placed again, and what a person does next — a new
/// Bundle, a deleted one, a lost node — is carried out the way the Manager
/// at hand allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_switched_between_full_and_published_keeps_every_job_where_it_runs() {
    let sim = Sim::start_with(SimConfig {
        seed: 5,
        time_scale: TIME_SCALE,
        cluster_nodes: ["n1", "n2", "n3"].iter().map(|id| cluster_node(id, 8.0)).collect(),
        ..SimConfig::default()
    })
    .await;
    let mut s = run(sim);
    for i in 0..4 {
        s.am.create_bundle(bundle(i, 2.0)).await.expect("bundle accepted");
    }
    until_instances(&s.sim, "four jobs run once each", |r| each_once(r, 4)).await;
    let before = instances(&s.sim).await;
    let placed = s.am.metrics().await.expect("metrics").counters.placements_attempted;
    let admin = s.sim.admin.clone();
    let set_api = |published_api_only| {
        let mut admin = admin.clone();
        async move {
            admin
                .set_api(sim_admin::SetApiRequest { published_api_only })
                .await
                .expect("Manager switched");
        }
    };

    // Downgraded: Manager keeps the jobs, not the bundles.
    drain(&mut s.events);
    set_api(true).await;
    until_every_capability(&mut s, Mode::Published).await;
    assert!(
        s.sim.snapshot().await.bundles.is_empty(),
        "a published Manager stores no bundle"
    );
    for i in 0..4 {
        assert!(
            s.am.node_of(job(i)).await.expect("query").is_some(),
            "b{i} is known where it runs"
        );
    }
    assert_eq!(
        instances(&s.sim).await,
        before,
        "every instance kept running where it was"
    );
    // The operator carries on with its own store.
    s.am.create_bundle(bundle(4, 2.0)).await.expect("bundle accepted");
    s.am.delete_bundle(BundleId("ns/b0".into()))
        .await
        .expect("bundle deleted");
    until_instances(&s.sim, "b4 runs and b0 is gone", |r| {
        r.contains_key(&job(4)) && !r.contains_key(&job(0)) && each_once(r, 4)
    })
    .await;
    let after_downgrade = instances(&s.sim).await;
    assert!(
        (1..4).all(|i| after_downgrade[&job(i)] == before[&job(i)]),
        "b1..b3 never moved: {after_downgrade:?}"
    );

    // Upgraded: the bundles are handed to Manager's store, which adopts
    // the jobs as they run.
    drain(&mut s.events);
    set_api(false).await;
    until_every_capability(&mut s, Mode::Served).await;
    let stored: Vec<String> = s
        .sim
        .snapshot()
        .await
        .bundles
        .iter()
        .map(|b| b.bundle_id.0.clone())
        .collect();
    assert_eq!(
        stored,
        ["ns/b1", "ns/b2", "ns/b3", "ns/b4"],
        "Manager stores every live bundle"
    );
    assert_eq!(
        instances(&s.sim).await,
        after_downgrade,
        "every instance kept running where it was"
    );
    assert_eq!(
        s.am.metrics().await.expect("metrics").counters.placements_attempted,
        placed + 1,
        "only the new bundle was placed"
    );

    // And the core still drives: a lost node's job is recovered.
    let victim = after_downgrade[&job(1)][0].1.clone();
    s.sim
        .admin
        .clone()
        .kill_node(sim_admin::NodeRef {
            node_id: victim.0.clone(),
        })
        .await
        .expect("node killed");
    until_instances(&s.sim, "b1 runs again, not on the killed node", |r| {
        each_once(r, 4) && r[&job(1)][0].1 != victim
    })
    .await;
    stop(s).await;
}

/// Manager upgraded while no operator ran (both restarted in one
/// maintenance): the new operator finds Manager's store empty and the jobs
/// it expanded itself running; applying the Bundles hands them to Manager,
/// which adopts the jobs where they run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_started_on_an_upgraded_manager_adopts_the_jobs_it_expanded_before() {
    let s = run(published_sim(&["n1", "n2"]).await);
    for i in 0..4 {
        s.am.create_bundle(bundle(i, 2.0)).await.expect("bundle accepted");
    }
    until_instances(&s.sim, "four jobs run", |r| each_once(r, 4)).await;
    let before = instances(&s.sim).await;
    s.am.close().await;
    s.join.await.expect("the loop ends cleanly");
    upgrade(&s.sim).await;

    let mut s = run(s.sim);
    until_every_capability(&mut s, Mode::Served).await;
    for i in 0..4 {
        s.am.create_bundle(bundle(i, 2.0)).await.expect("bundle accepted again");
    }
    for i in 0..4 {
        let adopted = async {
            while s.am.node_of(job(i)).await.expect("query").is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(WAIT, adopted)
            .await
            .expect("the job is known where it runs");
    }
    assert_eq!(s.sim.snapshot().await.bundles.len(), 4, "Manager stores every bundle");
    assert_eq!(
        instances(&s.sim).await,
        before,
        "every instance kept running where it was"
    );
    let metrics = s.am.metrics().await.expect("metrics");
    assert_eq!(metrics.counters.placements_attempted, 0, "nothing was placed again");
    stop(s).await;
}

/// Node tag changes a predecessor kept (read back from the `NorskNode`s)
/// show on the node at once, and are written to Manager once it can store
/// them; from then on the operator keeps nothing of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_node_tags_show_on_the_node_and_are_handed_to_a_manager_that_stores_tags() {
    let mut s = run(published_sim(&["n1", "n2"]).await);
    until_every_capability(&mut s, Mode::Published).await;
    let tags_of = |am: norsk_auto_manager::automanager::AutoManagerHandle, node: &'static str| async move {
        am.read(move |core| {
            core.nodes()
                .into_iter()
                .find(|n| n.id.as_str() == node)
                .map(|n| n.tags.clone())
        })
        .await
        .expect("query")
    };
    let kept = KeptTags {
        set: BTreeMap::from([("rack-note".to_owned(), "swap-psu".to_owned())]),
        ..KeptTags::default()
    };
    s.am.keep_node_tags(BTreeMap::from([(NodeId("n1".into()), kept.clone())]));
    let shown = async {
        loop {
            let tags = tags_of(s.am.clone(), "n1").await.unwrap_or_default();
            if tags.get("rack-note").is_some_and(|v| v == "swap-psu") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(WAIT, shown)
        .await
        .expect("the kept tag shows on the node");
    assert_eq!(
        s.am.kept_node_tags().borrow().get(&NodeId("n1".into())),
        Some(&kept),
        "kept, to be recorded for the next leader"
    );
    assert_eq!(note_on_manager(&s.sim).await, None, "a published Manager stores no tag");

    upgrade(&s.sim).await;
    until_every_capability(&mut s, Mode::Served).await;
    let handed = async {
        while note_on_manager(&s.sim).await.is_none() || !s.am.kept_node_tags().borrow().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(WAIT, handed)
        .await
        .expect("the kept tag is written to Manager and no longer kept");
    assert_eq!(note_on_manager(&s.sim).await.as_deref(), Some("swap-psu"));
    stop(s).await;
}

/// Manager's own `rack-note` tag of node n1.
async fn note_on_manager(sim: &Sim) -> Option<String> {
    sim.snapshot()
        .await
        .nodes
        .iter()
        .find(|n| n.id.as_str() == "n1")
        .and_then(|n| n.tags.get("rack-note").cloned())
}

/// Manager upgraded in place: it serves every addition from now on.
async fn upgrade(sim: &Sim) {
    sim.admin
        .clone()
        .set_api(sim_admin::SetApiRequest {
            published_api_only: false,
        })
        .await
        .expect("Manager upgraded");
}
