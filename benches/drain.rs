//! Draining a node with 100 jobs under `overlap` against the simulator at
//! time scale 100 (target: at most 2 s of wall time): timed from the
//! `drainNode` call until its `drainProgress` reports `done` (every job
//! migrated, the node terminated). The jobs are 100 single-job bundles, or
//! 50 bundles of a co-located pair (`package` `coLocateWith: [encode]`),
//! each pair moved as a unit. Each sample starts a fresh simulator and
//! AutoManager, places the 100 jobs on the node and waits for them to run,
//! all outside the timing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use norsk_auto_manager::automanager::{
    AutoManager, AutoSettings, DrainOptions, DrainPhase, MigrationStrategy, Notification, RunOptions, StrategyFor,
};
use norsk_auto_manager::model::{Bundle, BundleId, JobHistoryEntry, NodeId, NodeInventory, tags};
use norsk_auto_manager::sim::{ClusterNode, SimConfig, Simulator};
use tokio::sync::broadcast;

const JOBS: usize = 100;
const TIME_SCALE: f64 = 100.0;

fn cluster_node(id: &str) -> ClusterNode {
    ClusterNode {
        id: id.to_owned(),
        tags: BTreeMap::from([(tags::POOL.to_owned(), "production".to_owned())]),
        inventory: NodeInventory::local_server("site", "rack-1", "", 64.0),
    }
}

/// The next notification `found` accepts.
async fn until<T>(
    events: &mut broadcast::Receiver<Notification>,
    mut found: impl FnMut(&Notification) -> Option<T>,
) -> T {
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
}

async fn one_drain(pairs: bool) -> Duration {
    let sim = Simulator::start(SimConfig {
        time_scale: TIME_SCALE,
        cluster_nodes: vec![cluster_node("a"), cluster_node("b")],
        ..SimConfig::default()
    })
    .await
    .expect("simulator starts");
    let settings = AutoSettings {
        url: sim.url(),
        placement_pools: serde_yaml::from_str(
            "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n",
        )
        .expect("pools parse"),
        trace_placements: false,
        ..AutoSettings::default()
    };
    let (am, join) = AutoManager::run_with(settings, RunOptions { time_scale: TIME_SCALE }).expect("runs");
    let mut events = am.subscribe();
    // `b` can be cordoned once the core has hydrated it; until then each
    // attempt waits for the next notification.
    while am.cordon_node(NodeId::from("b")).await.is_err() {
        until(&mut events, |_| Some(())).await;
    }
    let (spec, bundles) = if pairs {
        (
            "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 0.5}}\n  - {jobName: package, coLocateWith: [encode], requirements: {requiredCapacity: 0.5}}\n",
            JOBS / 2,
        )
    } else {
        (
            "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 0.5}}\n",
            JOBS,
        )
    };
    let spec: norsk_auto_manager::model::BundleSpec = serde_yaml::from_str(spec).expect("bundle parses");
    for i in 0..bundles {
        let bundle = Bundle {
            bundle_id: BundleId(format!("b{i}")),
            spec: spec.clone(),
            ..Bundle::default()
        };
        am.create_bundle(bundle).await.expect("bundle accepted");
    }
    let mut running = BTreeSet::new();
    until(&mut events, |n| {
        if let Notification::JobUpdated { job } = n
            && matches!(job.history.last(), Some(JobHistoryEntry::Running { .. }))
        {
            running.insert(job.job_id.clone());
        }
        (running.len() == JOBS).then_some(())
    })
    .await;
    am.uncordon_node(NodeId::from("b")).await.expect("b uncordoned");
    let started = Instant::now();
    am.drain_node(
        NodeId::from("a"),
        DrainOptions {
            strategy_for: StrategyFor::all(MigrationStrategy::Overlap),
            ..DrainOptions::default()
        },
    )
    .await
    .expect("the drain starts");
    let phase = until(&mut events, |n| match n {
        Notification::DrainProgress(state) if state.phase.is_final() => Some(state.phase),
        _ => None,
    })
    .await;
    let took = started.elapsed();
    assert_eq!(phase, DrainPhase::Done, "the drain ended {phase:?}");
    am.close().await;
    join.await.expect("loop ends");
    sim.shutdown().await.expect("simulator stops");
    took
}

fn drain(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("drain");
    group.sample_size(10);
    group.bench_function("node_with_100_jobs_overlap_time_scale_100", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| runtime.block_on(one_drain(false))).sum())
    });
    group.bench_function("node_with_50_co_located_pairs_overlap_time_scale_100", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| runtime.block_on(one_drain(true))).sum())
    });
    group.finish();
}

criterion_group!(benches, drain);
criterion_main!(benches);
