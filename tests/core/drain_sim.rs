//! Drains against the Manager simulator over loopback, both on a compressed
//! clock: a node with 20 jobs drained under each migration strategy ends
//! `done` with every job migrated and running once on the other node, a
//! node carrying co-located pairs drains them as units (each pair running
//! once, together, on one node), and a spot interruption with a two-minute
//! deadline empties its node before the provider reclaims it.

use std::collections::BTreeMap;
use std::time::Duration;

use norsk_auto_manager::automanager::interruption::SPOT_INTERRUPTION_DRAIN_MARGIN_MS;
use norsk_auto_manager::automanager::{
    DrainJobStatus, DrainOptions, DrainPhase, DrainState, MigrationStrategy, Notification, StrategyFor,
};
use norsk_auto_manager::manager::proto::{manager as pb, sim_admin};
use norsk_auto_manager::model::{Bundle, BundleId, JobHistoryEntry, JobId, NodeId};
use tokio::sync::broadcast;

use crate::sim_support::Sim;
use crate::support::runtime::{self, Setup, stop};

/// The scale the spec's interruption scenario names: 100 simulated
/// seconds per real one.
const TIME_SCALE: f64 = 100.0;
const WAIT: Duration = Duration::from_secs(60);
const JOBS: usize = 20;

/// Waits for the first notification `found` accepts.
async fn until<T>(
    what: &str,
    events: &mut broadcast::Receiver<Notification>,
    mut found: impl FnMut(&Notification) -> Option<T>,
) -> T {
    let follow = async {
        loop {
            match events.recv().await {
                Ok(n) => {
                    if let Some(t) = found(&n) {
                        return t;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => panic!("fell {n} notifications behind"),
                Err(broadcast::error::RecvError::Closed) => panic!("the AutoManager stopped"),
            }
        }
    };
    tokio::time::timeout(WAIT, follow)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// One encoder job per bundle.
const ONE_JOB: &str = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 0.5}}\n";

/// The flagship channel's pair: `package` co-located with `encode`.
const PAIR: &str = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n  - {jobName: package, coLocateWith: [encode], requirements: {requiredCapacity: 0.5}}\n";

/// Nodes `a` and `b`, and `JOBS` one-job bundles running on `a` (placed
/// while `b` was cordoned; `b` uncordoned after).
async fn twenty_jobs_on_a() -> Setup {
    bundles_on_a(JOBS, ONE_JOB, 1).await
}

/// Nodes `a` and `b`, and `bundles` bundles of `spec` (`jobs_each` jobs)
/// running on `a` (placed while `b` was cordoned; `b` uncordoned after).
async fn bundles_on_a(bundles: usize, spec: &str, jobs_each: usize) -> Setup {
    let Setup {
        sim,
        am,
        join,
        mut events,
    } = runtime::start(5, TIME_SCALE, &[("a", 16.0), ("b", 16.0)], |_| {}).await;
    // `b` can be cordoned once the core has hydrated it; until then each
    // attempt waits for the next notification.
    while am.cordon_node(NodeId::from("b")).await.is_err() {
        until("hydration", &mut events, |_| Some(())).await;
    }
    for i in 0..bundles {
        let bundle = Bundle {
            bundle_id: BundleId(format!("b{i}")),
            spec: yaml_serde::from_str(spec).expect("bundle parses"),
            ..Bundle::default()
        };
        am.create_bundle(bundle).await.expect("bundle accepted");
    }
    let mut running: BTreeMap<JobId, NodeId> = BTreeMap::new();
    until("every job running", &mut events, |n| {
        if let Notification::JobUpdated { job } = n
            && let Some(JobHistoryEntry::Running {
                node_id: Some(node), ..
            }) = job.history.last()
        {
            running.insert(job.job_id.clone(), node.clone());
        }
        (running.len() == bundles * jobs_each).then_some(())
    })
    .await;
    assert!(running.values().all(|n| n.as_str() == "a"), "placed on a: {running:?}");
    // Manager may report a job running before the core has the StartJob's
    // answer; until it does, the call is in flight and a drain would find the
    // job not yet running (stuck). Every answer is in once each placement
    // counts as succeeded.
    let placed = (bundles * jobs_each) as u64;
    tokio::time::timeout(WAIT, async {
        while am.metrics().await.expect("metrics").counters.placements_succeeded < placed {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("every StartJob answered");
    am.uncordon_node(NodeId::from("b")).await.expect("b uncordoned");
    Setup { sim, am, join, events }
}

/// Waits for the drain of `node` to end; returns its final state.
async fn drain_ended(events: &mut broadcast::Receiver<Notification>, node: &str) -> DrainState {
    until("the drain's end", events, |n| match n {
        Notification::DrainProgress(state) if state.node_id.as_str() == node && state.phase.is_final() => {
            Some((**state).clone())
        }
        _ => None,
    })
    .await
}

/// Instances per job on each node, in the simulator right now.
async fn instances(sim: &Sim) -> BTreeMap<JobId, Vec<NodeId>> {
    let mut on = BTreeMap::<JobId, Vec<NodeId>>::new();
    for node in sim.snapshot().await.nodes {
        for instance in node.instances {
            on.entry(instance.job_id).or_default().push(node.id.clone());
        }
    }
    on
}

async fn drain_twenty_jobs_under(strategy: MigrationStrategy) {
    let mut s = twenty_jobs_on_a().await;
    let started =
        s.am.drain_node(
            NodeId::from("a"),
            DrainOptions {
                strategy_for: StrategyFor::all(strategy),
                ..DrainOptions::default()
            },
        )
        .await
        .expect("the drain starts");
    assert_eq!(started.jobs.len(), JOBS);
    let ended = drain_ended(&mut s.events, "a").await;
    assert_eq!(ended.phase, DrainPhase::Done, "{ended:?}");
    assert!(
        ended.jobs.iter().all(|j| j.status == DrainJobStatus::Migrated),
        "{ended:?}"
    );
    assert_eq!(
        s.am.drain_status(NodeId::from("a")).await.expect("query"),
        Some(ended.clone()),
        "drainStatus reads what drainProgress reported"
    );
    assert!(s.am.is_cordoned(NodeId::from("a")).await.expect("query"));
    let on = instances(&s.sim).await;
    assert_eq!(on.len(), JOBS);
    assert!(
        on.values().all(|nodes| nodes == &vec![NodeId::from("b")]),
        "every job runs once, on b: {on:?}"
    );
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_twenty_jobs_drains_under_stop_then_start() {
    drain_twenty_jobs_under(MigrationStrategy::StopThenStart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_twenty_jobs_drains_under_overlap() {
    drain_twenty_jobs_under(MigrationStrategy::Overlap).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_twenty_jobs_drains_under_handover() {
    drain_twenty_jobs_under(MigrationStrategy::Handover).await;
}

/// Ten co-located pairs on `a`, drained under `strategy`: every pair moves
/// as a unit and runs once, together, on `b`.
async fn drain_co_located_pairs_under(strategy: MigrationStrategy) {
    const PAIRS: usize = 10;
    let mut s = bundles_on_a(PAIRS, PAIR, 2).await;
    let started =
        s.am.drain_node(
            NodeId::from("a"),
            DrainOptions {
                strategy_for: StrategyFor::all(strategy),
                ..DrainOptions::default()
            },
        )
        .await
        .expect("the drain starts");
    assert_eq!(started.jobs.len(), 2 * PAIRS);
    assert!(
        started.jobs.iter().all(|j| j.status == DrainJobStatus::Migrating),
        "every pair found a target: {started:?}"
    );
    let ended = drain_ended(&mut s.events, "a").await;
    assert_eq!(ended.phase, DrainPhase::Done, "{ended:?}");
    assert!(
        ended.jobs.iter().all(|j| j.status == DrainJobStatus::Migrated),
        "{ended:?}"
    );
    let on = instances(&s.sim).await;
    assert_eq!(on.len(), 2 * PAIRS);
    for i in 0..PAIRS {
        let encode = JobId(format!("b{i}/0/encode"));
        let package = JobId(format!("b{i}/0/package"));
        assert_eq!(on.get(&encode), Some(&vec![NodeId::from("b")]), "{on:?}");
        assert_eq!(on.get(&package), on.get(&encode), "pair b{i} runs together: {on:?}");
    }
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_co_located_pairs_drains_them_as_units_under_stop_then_start() {
    drain_co_located_pairs_under(MigrationStrategy::StopThenStart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_co_located_pairs_drains_them_as_units_under_overlap() {
    drain_co_located_pairs_under(MigrationStrategy::Overlap).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_co_located_pairs_drains_them_as_units_under_handover() {
    drain_co_located_pairs_under(MigrationStrategy::Handover).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_interruption_with_a_two_minute_deadline_empties_the_node_in_time() {
    let mut s = twenty_jobs_on_a().await;
    s.sim
        .admin
        .clone()
        .interrupt_node(sim_admin::InterruptNodeRequest {
            node_id: "a".into(),
            kind: pb::InterruptionKind::SpotInterruption as i32,
            deadline_s: 120.0,
        })
        .await
        .expect("notice sent");
    let interrupted = until("nodeInterrupted", &mut s.events, |n| match n {
        Notification::NodeInterrupted(state) => Some((**state).clone()),
        _ => None,
    })
    .await;
    assert!(interrupted.drain.force);
    let deadline = interrupted.deadline.expect("the notice carries its deadline");
    assert_eq!(
        interrupted.drain.started + interrupted.drain.timeout_ms as i64,
        deadline - SPOT_INTERRUPTION_DRAIN_MARGIN_MS as i64,
        "the drain times out SPOT_INTERRUPTION_DRAIN_MARGIN_MS before the deadline"
    );
    let ended = drain_ended(&mut s.events, "a").await;
    assert_eq!(ended.phase, DrainPhase::Done, "{ended:?}");
    assert!(
        ended.jobs.iter().all(|j| j.status == DrainJobStatus::Migrated),
        "every job migrated before the timeout: {ended:?}"
    );
    let on = instances(&s.sim).await;
    assert_eq!(on.len(), JOBS);
    assert!(on.values().all(|nodes| nodes == &vec![NodeId::from("b")]), "{on:?}");
    let notice = s.am.node_interruption(NodeId::from("a")).await.expect("query");
    assert_eq!(
        notice.map(|n| n.drain),
        Some(ended),
        "nodeInterruption reads the notice with its drain"
    );
    stop(s).await;
}
