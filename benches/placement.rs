//! Placement benchmarks (the performance targets; figures, not timed
//! tests): one placement into a 5,000-node fleet with 50,000 placed jobs
//! with the trace off and on, 10,000 placements one after another into that
//! fleet, how one placement's cost grows with fleet size, and a
//! from-scratch fill of 50,000 jobs with Karpenter's benchmark mix. The
//! workloads are the ones `norsk-auto-manager bench placement` and `bench
//! fill` run.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use norsk_auto_manager::cli::bench::karpenter::karpenter_fill;
use norsk_auto_manager::cli::bench::workload::workload;
use norsk_auto_manager::model::{BundleId, BundleSpec};
use norsk_auto_manager::placement::{
    FleetView, PlacementRequest, SequentialNodeIds, apply_placement, place, validate_pools,
};

fn fixture(nodes: usize, jobs: usize, placements: usize) -> (FleetView, Vec<(BundleId, BundleSpec)>) {
    let work = workload(nodes, jobs, placements, 1);
    let pools = validate_pools(work.pools).expect("the workload's pools are valid");
    (
        FleetView::new(&work.fleet, pools).expect("the workload's fleet is valid"),
        work.bundles,
    )
}

/// Places the bundles' primaries in turn (a mix of requirements), without
/// keeping them: every iteration sees the same fleet.
fn place_one(c: &mut Criterion) {
    let (view, bundles) = fixture(5_000, 50_000, 10);
    let mut group = c.benchmark_group("placement/one of 5000 nodes");
    for trace in [false, true] {
        let name = if trace { "trace on" } else { "trace off" };
        group.bench_function(name, |b| {
            let mut ids = SequentialNodeIds::default();
            let mut i = 0;
            b.iter(|| {
                let (id, spec) = &bundles[i % bundles.len()];
                i += 1;
                let request = PlacementRequest::launch(id, spec, 0, &spec.jobs[0].job_name).with_trace(trace);
                black_box(place(&view, request, &mut ids))
            })
        });
    }
    group.finish();
}

/// 10,000 bundles placed one after another, each seeing those before it.
fn place_sequentially(c: &mut Criterion) {
    let (view, bundles) = fixture(5_000, 50_000, 10_000);
    let placements: u64 = bundles
        .iter()
        .map(|(_, s)| u64::from(s.replica_count()) * s.jobs.len() as u64)
        .sum();
    let mut group = c.benchmark_group("placement/sequential");
    group.sample_size(10);
    group.throughput(Throughput::Elements(placements));
    group.bench_function("10000 bundles into 5000 nodes", |b| {
        b.iter_batched(
            || view.clone(),
            |mut view| {
                let mut ids = SequentialNodeIds::default();
                for (id, spec) in &bundles {
                    for replica in 0..spec.replica_count() {
                        for job in &spec.jobs {
                            let request = PlacementRequest::launch(id, spec, replica, &job.job_name);
                            let placement = place(&view, request, &mut ids).expect("the workload places");
                            apply_placement(&mut view, &request, &placement.outcome).expect("placements apply");
                        }
                    }
                }
                view
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

/// One placement (trace off) as the fleet grows tenfold twice, ten jobs per
/// node throughout.
fn scaling(c: &mut Criterion) {
    let mut group = c.benchmark_group("placement/scaling");
    for nodes in [500, 5_000, 50_000] {
        let (view, bundles) = fixture(nodes, nodes * 10, 10);
        group.bench_with_input(BenchmarkId::from_parameter(nodes), &nodes, |b, _| {
            let mut ids = SequentialNodeIds::default();
            let mut i = 0;
            b.iter(|| {
                let (id, spec) = &bundles[i % bundles.len()];
                i += 1;
                black_box(place(
                    &view,
                    PlacementRequest::launch(id, spec, 0, &spec.jobs[0].job_name),
                    &mut ids,
                ))
            })
        });
    }
    group.finish();
}

/// 50,000 jobs of Karpenter's mix into an empty fleet, each seeing those
/// before it (the nodes provisioned included).
fn fill(c: &mut Criterion) {
    const JOBS: usize = 50_000;
    let work = karpenter_fill(JOBS, 42);
    let pools = validate_pools(work.pools).expect("the fill's pool is valid");
    let mut group = c.benchmark_group("placement/fill");
    group.sample_size(10);
    group.throughput(Throughput::Elements(JOBS as u64));
    group.bench_function("50000 jobs of the karpenter mix", |b| {
        b.iter_batched(
            || FleetView::new(&work.fleet, pools.clone()).expect("an empty fleet is valid"),
            |mut view| {
                let mut ids = SequentialNodeIds::default();
                for (id, spec) in &work.bundles {
                    for replica in 0..spec.replica_count() {
                        for job in &spec.jobs {
                            let request = PlacementRequest::launch(id, spec, replica, &job.job_name);
                            let placement = place(&view, request, &mut ids).expect("the fill places");
                            apply_placement(&mut view, &request, &placement.outcome).expect("placements apply");
                        }
                    }
                }
                view
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    targets = place_one, place_sequentially, scaling, fill
}
criterion_main!(benches);
