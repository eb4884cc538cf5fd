//! The resilience-headroom workload shared by `bench headroom` and the
//! criterion benchmark: the placement workload's fleet (one pool of three
//! tiers, capabilities, host ports, GPUs, AZs, spares), every job a
//! one-job bundle whose spec asks what its reservation holds, so every
//! job a loss takes can be placed again; and one more placement at a time
//! for the incremental update.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::model::{BundleId, BundleSpec, FleetSnapshot, runtime_job_id};
use crate::placement::headroom::{Context, DomainKind, Headroom, Selection, Tracker};
use crate::placement::{
    FleetView, Outcome, PlacementRequest, Pools, SequentialNodeIds, place, placed_job, validate_pools,
};

use super::{BenchError, micros, peak_rss_bytes, percentile, rss, workload};

/// A fleet whose every job has its bundle's spec.
#[derive(Clone, Debug)]
pub struct HeadroomWorkload {
    /// The validated pools.
    pub pools: Pools,
    pub fleet: FleetSnapshot,
    /// A spec for every bundle the fleet carries.
    pub bundles: BTreeMap<BundleId, BundleSpec>,
    view: FleetView,
}

impl HeadroomWorkload {
    /// `nodes` nodes carrying up to `jobs` jobs (each where it fits).
    pub fn new(nodes: usize, jobs: usize, seed: u64) -> Self {
        let work = workload::workload(nodes, jobs, 0, seed);
        // Constants: the workload's own pools and fleet are valid (its
        // tests hold them so).
        let pools = validate_pools(work.pools).expect("the workload's pools are valid");
        let mut fleet = work.fleet;
        let mut bundles = BTreeMap::new();
        let mut n = 0;
        for node in &mut fleet.nodes {
            for job in &mut node.jobs {
                n += 1;
                let bundle = BundleId(format!("background/j{n}"));
                let ports: Vec<String> = job.required_host_ports.iter().map(|p| p.to_string()).collect();
                let gpu = if job.required_gpu_capacity > 0.0 {
                    format!(
                        ", requiredGpuCapacity: {}, requiredCapabilities: [norsk.io/nvidia-gpu]",
                        job.required_gpu_capacity
                    )
                } else {
                    String::new()
                };
                let yaml = format!(
                    "pool: production\njobs: [{{jobName: encode, template: encoder, requirements: {{requiredCapacity: {}, requiredHostPorts: [{}]{gpu}}}}}]",
                    job.required_capacity,
                    ports.join(", ")
                );
                let spec: BundleSpec = yaml_serde::from_str(&yaml).expect("the workload's bundles parse");
                job.job_id = runtime_job_id(&bundle, 0, "encode");
                job.bundle = Some(bundle.clone());
                job.replica_index = 0;
                bundles.insert(bundle, spec);
            }
        }
        let view = FleetView::new(&fleet, pools.clone()).expect("the workload's fleet is valid");
        HeadroomWorkload {
            pools,
            fleet,
            bundles,
            view,
        }
    }
}

/// The workload's fleet and bundles with one more one-job bundle
/// (`extra/<n>`, 1 vCPU) placed where placement puts it.
pub fn one_more_job(work: &HeadroomWorkload, n: usize) -> (FleetSnapshot, BTreeMap<BundleId, BundleSpec>) {
    let bundle = BundleId(format!("extra/{n}"));
    let spec: BundleSpec = yaml_serde::from_str(
        "pool: production\njobs: [{jobName: encode, template: encoder, requirements: {requiredCapacity: 1}}]",
    )
    .expect("a constant bundle parses");
    let mut fleet = work.fleet.clone();
    let mut bundles = work.bundles.clone();
    let request = PlacementRequest::launch(&bundle, &spec, 0, "encode");
    if let Ok(placement) = place(&work.view, request, &mut SequentialNodeIds::default())
        && let Outcome::Placed { node_id, gpu_index, .. } = placement.outcome
        && let Some(node) = fleet.nodes.iter_mut().find(|n| n.id == node_id)
    {
        node.jobs.push(placed_job(&bundle, 0, &spec.jobs[0], gpu_index));
    }
    bundles.insert(bundle, spec);
    (fleet, bundles)
}

/// Arguments of `bench headroom`.
#[derive(Debug, clap::Args)]
pub struct HeadroomArgs {
    /// Fleet size.
    #[arg(long, default_value_t = 1_000)]
    pub nodes: usize,
    /// Jobs placed in the fleet.
    #[arg(long, default_value_t = 10_000)]
    pub jobs: usize,
    /// Incremental updates, each after one more placement.
    #[arg(long, default_value_t = 100)]
    pub updates: usize,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// `table` or `json`.
    #[arg(long, value_enum, default_value_t = crate::cli::plan::Output::Table)]
    pub output: crate::cli::plan::Output,
}

/// What `bench headroom` measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeadroomReport {
    /// Nodes analysed.
    pub nodes: usize,
    /// Jobs the fleet carries.
    pub jobs: usize,
    /// Every single-node loss analysed from scratch, in milliseconds.
    pub full_analysis_millis: f64,
    /// Of those, losses absorbed.
    pub absorbed: usize,
    /// An incremental update after one placement: median, milliseconds.
    pub update_p50_millis: f64,
    /// 99th percentile, milliseconds.
    pub update_p99_millis: f64,
    /// Node verdicts an update recomputed, on average.
    pub nodes_recomputed_mean: f64,
    /// Their placements an update decided from the last run's podium
    /// (no search), on average.
    pub placements_replayed_mean: f64,
    /// Their placements an update searched for, on average.
    pub placements_searched_mean: f64,
    /// Node verdicts an update kept on their outcome alone (a job may land
    /// on another node of the same tier), on average.
    pub outcome_kept_mean: f64,
    /// Zones and provider kinds recomputed after the updates
    /// ([`Tracker::refresh_wide`], on its own cadence), milliseconds.
    pub wide_refresh_millis: f64,
    /// Zone and provider verdicts that refresh recomputed.
    pub wide_domains: usize,
    /// Peak resident memory of the process, when known.
    pub peak_rss_bytes: Option<u64>,
}

/// Builds the workload, analyses every single-node loss, then times the
/// tracker's update after each of `updates` placements.
pub fn bench_headroom(args: &HeadroomArgs) -> Result<HeadroomReport, BenchError> {
    let work = HeadroomWorkload::new(args.nodes, args.jobs, args.seed);
    let none = BTreeSet::new();
    let context = Context {
        bundles: &work.bundles,
        at_restart_ceiling: &none,
    };
    let mut headroom =
        Headroom::new(&work.fleet, work.pools.clone()).map_err(|e| BenchError::Headroom(e.to_string()))?;
    let started = Instant::now();
    let verdicts = headroom
        .analyse(context, &Selection::Kinds(vec![DomainKind::Node]), false)
        .map_err(|e| BenchError::Headroom(e.to_string()))?;
    let full = started.elapsed();
    let mut tracker = Tracker::new();
    tracker.update(&work.fleet, &work.pools, &work.bundles, &none)?;
    let mut timings: Vec<Duration> = Vec::with_capacity(args.updates);
    let mut recomputed = 0;
    let (mut replayed, mut searched, mut kept) = (0, 0, 0);
    let mut current = work.clone();
    for n in 0..args.updates {
        let (fleet, bundles) = one_more_job(&current, n);
        let one = Instant::now();
        let stats = tracker.update(&fleet, &current.pools, &bundles, &none)?;
        timings.push(one.elapsed());
        recomputed += stats.nodes_recomputed;
        replayed += stats.placements_replayed;
        searched += stats.placements_searched;
        kept += stats.outcome_kept;
        current.view = FleetView::new(&fleet, current.pools.clone())?;
        current.fleet = fleet;
        current.bundles = bundles;
    }
    timings.sort_unstable();
    let wide = Instant::now();
    let wide_domains = tracker.refresh_wide();
    let wide_refresh = wide.elapsed();
    Ok(HeadroomReport {
        nodes: verdicts.len(),
        jobs: work.fleet.nodes.iter().map(|n| n.jobs.len()).sum(),
        full_analysis_millis: full.as_secs_f64() * 1e3,
        absorbed: verdicts.iter().filter(|v| v.absorbed).count(),
        update_p50_millis: micros(percentile(&timings, 0.50)) / 1e3,
        update_p99_millis: micros(percentile(&timings, 0.99)) / 1e3,
        nodes_recomputed_mean: recomputed as f64 / args.updates.max(1) as f64,
        placements_replayed_mean: replayed as f64 / args.updates.max(1) as f64,
        placements_searched_mean: searched as f64 / args.updates.max(1) as f64,
        outcome_kept_mean: kept as f64 / args.updates.max(1) as f64,
        wide_refresh_millis: wide_refresh.as_secs_f64() * 1e3,
        wide_domains,
        peak_rss_bytes: peak_rss_bytes(),
    })
}

/// The report for people.
pub(super) fn table(report: &HeadroomReport) -> String {
    format!(
        "nodes          {}\njobs           {}\nevery loss     {:.1} ms ({} absorbed)\nupdate p50     {:.2} ms\nupdate p99     {:.2} ms\nrecomputed     {:.1} node verdicts per update ({:.0} placements replayed, {:.0} searched; {:.1} kept on their outcome)\nwide refresh   {:.1} ms ({} zones and provider kinds)\npeak RSS       {}",
        report.nodes,
        report.jobs,
        report.full_analysis_millis,
        report.absorbed,
        report.update_p50_millis,
        report.update_p99_millis,
        report.nodes_recomputed_mean,
        report.placements_replayed_mean,
        report.placements_searched_mean,
        report.outcome_kept_mean,
        report.wide_refresh_millis,
        report.wide_domains,
        rss(report.peak_rss_bytes)
    )
}
