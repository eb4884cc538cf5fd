//! Resilience headroom benchmarks (the performance targets; figures, not
//! timed tests): the full single-node-loss analysis of a 1,000-node fleet
//! carrying 10,000 jobs (every node taken away in turn and its jobs placed
//! again), the tracker's incremental update after one placement (node
//! verdicts; target 10 ms), and the refresh of its zone and provider
//! verdicts that follows on its own cadence. The workload is the one
//! `norsk-auto-manager bench headroom` runs.

use std::collections::BTreeSet;
use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use norsk_auto_manager::cli::bench::headroom::{HeadroomWorkload, one_more_job};
use norsk_auto_manager::placement::headroom::{Context, DomainKind, Headroom, Selection, Tracker};

fn full_analysis(c: &mut Criterion) {
    let work = HeadroomWorkload::new(1_000, 10_000, 1);
    let mut headroom = Headroom::new(&work.fleet, work.pools.clone()).expect("the workload's fleet is valid");
    let none = BTreeSet::new();
    let context = Context {
        bundles: &work.bundles,
        at_restart_ceiling: &none,
    };
    let mut group = c.benchmark_group("headroom");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    group.bench_function("every single-node loss of 1000 nodes / 10000 jobs", |b| {
        b.iter(|| {
            black_box(
                headroom
                    .analyse(context, &Selection::Kinds(vec![DomainKind::Node]), false)
                    .expect("analysis runs"),
            )
        })
    });
    group.finish();
}

fn incremental_update(c: &mut Criterion) {
    let work = HeadroomWorkload::new(1_000, 10_000, 1);
    let none = BTreeSet::new();
    let mut tracker = Tracker::new();
    tracker
        .update(&work.fleet, &work.pools, &work.bundles, &none)
        .expect("the workload's fleet is valid");
    let mut group = c.benchmark_group("headroom");
    group.sample_size(20);
    let mut n = 0;
    group.bench_function("tracker update after one placement (1000 nodes / 10000 jobs)", |b| {
        b.iter_batched(
            || {
                n += 1;
                let (fleet, bundles) = one_more_job(&work, n);
                (tracker.clone(), fleet, bundles)
            },
            // The inputs are handed back, so dropping them (a whole
            // tracker, fleet and specs) is not timed as part of the update.
            |(mut tracker, fleet, bundles)| {
                let stats = black_box(tracker.update(&fleet, &work.pools, &bundles, &none));
                (stats, tracker, fleet, bundles)
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn wide_refresh(c: &mut Criterion) {
    let work = HeadroomWorkload::new(1_000, 10_000, 1);
    let none = BTreeSet::new();
    let mut tracker = Tracker::new();
    tracker
        .update(&work.fleet, &work.pools, &work.bundles, &none)
        .expect("the workload's fleet is valid");
    let (fleet, bundles) = one_more_job(&work, 1);
    tracker
        .update(&fleet, &work.pools, &bundles, &none)
        .expect("the workload's fleet is valid");
    let mut group = c.benchmark_group("headroom");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    group.bench_function("zone and provider refresh (1000 nodes / 10000 jobs)", |b| {
        b.iter_batched(
            || tracker.clone(),
            |mut tracker| (black_box(tracker.refresh_wide()), tracker),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, full_analysis, incremental_update, wide_refresh);
criterion_main!(benches);
