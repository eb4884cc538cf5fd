//! Jobs dispatched per second through gRPC against the simulator (target:
//! at least 2,000/s): 2,000 one-job bundles created concurrently on a
//! running AutoManager, timed from the first `CreateBundle` until every job's
//! `StartJob` has been answered (`placementsSucceeded` reaches 2,000); and
//! the dispatch alone, from the first placement decision to the last answer.
//! Each sample starts a fresh simulator and AutoManager outside the timing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use norsk_auto_manager::automanager::{AutoManager, AutoSettings, Notification, RunOptions};
use norsk_auto_manager::model::{Bundle, BundleId, NodeInventory, tags};
use norsk_auto_manager::sim::{ClusterNode, SimConfig, Simulator};
use tokio::sync::broadcast;

const JOBS: usize = 2_000;

fn cluster_node(i: usize) -> ClusterNode {
    ClusterNode {
        id: format!("n{i}"),
        tags: BTreeMap::from([(tags::POOL.to_owned(), "production".to_owned())]),
        inventory: NodeInventory::local_server("site", "rack-1", "", 512.0),
    }
}

/// How long one run took: from the first `CreateBundle`, and from the
/// first placement decision (the first `StartJob` follows it at once), until
/// every job's `StartJob` has been answered.
struct Run {
    total: Duration,
    dispatch: Duration,
}

async fn one_run() -> Run {
    let sim = Simulator::start(SimConfig {
        time_scale: 1_000.0,
        cluster_nodes: (0..8).map(cluster_node).collect(),
        ..SimConfig::default()
    })
    .await
    .expect("simulator starts");
    let settings = AutoSettings {
        url: sim.url(),
        placement_pools: yaml_serde::from_str(
            "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n",
        )
        .expect("pools parse"),
        trace_placements: false,
        ..AutoSettings::default()
    };
    let (am, join) = AutoManager::run_with(settings, RunOptions { time_scale: 1_000.0 }).expect("runs");
    let spec: norsk_auto_manager::model::BundleSpec =
        yaml_serde::from_str("pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n")
            .expect("bundle parses");
    let mut notifications = am.subscribe();
    let first_decision = tokio::spawn(async move {
        loop {
            match notifications.recv().await {
                Ok(Notification::PlacementDecision(_)) => return Some(Instant::now()),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let started = Instant::now();
    let creates: Vec<_> = (0..JOBS)
        .map(|i| {
            let am = am.clone();
            let bundle = Bundle {
                bundle_id: BundleId(format!("b{i}")),
                spec: spec.clone(),
                ..Bundle::default()
            };
            tokio::spawn(async move { am.create_bundle(bundle).await })
        })
        .collect();
    for create in creates {
        create.await.expect("task").expect("bundle accepted");
    }
    while am.metrics().await.expect("metrics").counters.placements_succeeded < JOBS as u64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let done = Instant::now();
    let first = first_decision.await.expect("task").expect("a placement was decided");
    am.close().await;
    join.await.expect("loop ends");
    sim.shutdown().await.expect("simulator stops");
    Run {
        total: done - started,
        dispatch: done - first,
    }
}

fn dispatch(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("core_grpc");
    group.throughput(Throughput::Elements(JOBS as u64));
    group.sample_size(10);
    group.bench_function("bundles_created_and_jobs_dispatched_2000", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| runtime.block_on(one_run()).total).sum())
    });
    group.bench_function("jobs_dispatched_2000_from_first_start", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| runtime.block_on(one_run()).dispatch).sum())
    });
    group.finish();
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
