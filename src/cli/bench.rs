//! `norsk-auto-manager bench`: the placement benchmarks without criterion,
//! so the performance targets can be checked from a release build.
//! `placement` builds the synthetic workload and places its bundles one
//! after another (each seeing those before it); `fill` fills an empty fleet
//! with Karpenter's benchmark mix. Both print throughput, latency
//! percentiles and peak memory.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::placement::{FleetView, PlacementRequest, SequentialNodeIds, apply_placement, place, validate_pools};

pub mod karpenter;
pub mod workload;

/// Arguments of `bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to benchmark.
    #[command(subcommand)]
    pub target: Target,
}

/// The benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum Target {
    /// Sequential placements into a synthetic fleet.
    Placement(PlacementArgs),
    /// A from-scratch fill with Karpenter's scheduling-benchmark mix.
    Fill(FillArgs),
}

/// Arguments of `bench fill`.
#[derive(Debug, clap::Args)]
pub struct FillArgs {
    /// Jobs to place, into an empty fleet.
    #[arg(long, default_value_t = 50_000)]
    pub jobs: usize,
    /// Workload seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// `table` or `json`.
    #[arg(long, value_enum, default_value_t = crate::cli::plan::Output::Table)]
    pub output: crate::cli::plan::Output,
}

/// Arguments of `bench placement`.
#[derive(Debug, clap::Args)]
pub struct PlacementArgs {
    /// Fleet size.
    #[arg(long, default_value_t = 5_000)]
    pub nodes: usize,
    /// Jobs already placed in the fleet.
    #[arg(long, default_value_t = 50_000)]
    pub jobs: usize,
    /// Bundles placed one after another (every tenth has a backup too).
    #[arg(long, default_value_t = 10_000)]
    pub placements: usize,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Record the trace on every placement.
    #[arg(long)]
    pub trace: bool,
    /// `table` or `json`.
    #[arg(long, value_enum, default_value_t = crate::cli::plan::Output::Table)]
    pub output: crate::cli::plan::Output,
}

/// What one run measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Placements (each applied to the fleet) per second of wall time.
    pub placements_per_second: f64,
    /// Median time of one placement, in microseconds.
    pub p50_micros: f64,
    /// 99th percentile, in microseconds.
    pub p99_micros: f64,
    /// The process's peak resident set (`VmHWM`), when the OS reports it.
    pub peak_rss_bytes: Option<u64>,
}

/// What one fill measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FillReport {
    /// Jobs placed (each applied to the fleet).
    pub jobs: usize,
    /// Nodes the fill provisioned.
    pub nodes: usize,
    /// Jobs no tier could take.
    pub unplaced: usize,
    /// Wall time of the whole fill, in seconds.
    pub seconds: f64,
    /// Median time of one placement, in microseconds.
    pub p50_micros: f64,
    /// 99th percentile, in microseconds.
    pub p99_micros: f64,
    /// The process's peak resident set (`VmHWM`), when the OS reports it.
    pub peak_rss_bytes: Option<u64>,
}

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The workload's pools were refused.
    #[error("the workload's pools are invalid: {0}")]
    Settings(#[from] crate::placement::SettingsValidationError),
    /// The workload's fleet was refused.
    #[error("the workload's fleet is invalid: {0}")]
    Fleet(#[from] crate::placement::FleetError),
    /// A placement failed.
    #[error("a placement failed: {0}")]
    Placement(#[from] crate::placement::PlacementError),
    /// The report could not be written.
    #[error("cannot render the report: {0}")]
    Render(#[from] serde_json::Error),
    /// The report could not be written as YAML.
    #[error("cannot render the report as YAML: {0}")]
    Yaml(String),
}

/// Runs `bench`.
pub async fn run(args: Args) -> ExitCode {
    let rendered = match args.target {
        Target::Placement(args) => bench_placement(&args).and_then(|report| render(&report, args.output)),
        Target::Fill(args) => bench_fill(&args).and_then(|report| render_fill(&report, args.output)),
    };
    match rendered {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("bench: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Builds the workload and places its bundles one after another.
pub fn bench_placement(args: &PlacementArgs) -> Result<Report, BenchError> {
    let work = workload::workload(args.nodes, args.jobs, args.placements, args.seed);
    let mut view = FleetView::new(&work.fleet, validate_pools(work.pools)?)?;
    let mut ids = SequentialNodeIds::default();
    let mut timings = Vec::with_capacity(args.placements + args.placements / 10 + 1);
    let started = Instant::now();
    for (bundle_id, spec) in &work.bundles {
        for replica_index in 0..spec.replica_count() {
            for job in &spec.jobs {
                let request =
                    PlacementRequest::launch(bundle_id, spec, replica_index, &job.job_name).with_trace(args.trace);
                let one = Instant::now();
                let placement = place(&view, request, &mut ids)?;
                apply_placement(&mut view, &request, &placement.outcome)?;
                timings.push(one.elapsed());
            }
        }
    }
    let wall = started.elapsed();
    timings.sort_unstable();
    Ok(Report {
        placements_per_second: timings.len() as f64 / wall.as_secs_f64().max(f64::MIN_POSITIVE),
        p50_micros: micros(percentile(&timings, 0.50)),
        p99_micros: micros(percentile(&timings, 0.99)),
        peak_rss_bytes: peak_rss_bytes(),
    })
}

/// Fills an empty fleet with Karpenter's mix, every job in turn, each
/// seeing those before it (provisioned nodes included).
pub fn bench_fill(args: &FillArgs) -> Result<FillReport, BenchError> {
    let work = karpenter::karpenter_fill(args.jobs, args.seed);
    let mut view = FleetView::new(&work.fleet, validate_pools(work.pools)?)?;
    let mut ids = SequentialNodeIds::default();
    let mut timings = Vec::with_capacity(args.jobs);
    let mut unplaced = 0;
    let started = Instant::now();
    for (bundle_id, spec) in &work.bundles {
        for replica_index in 0..spec.replica_count() {
            for job in &spec.jobs {
                let request = PlacementRequest::launch(bundle_id, spec, replica_index, &job.job_name);
                let one = Instant::now();
                let placement = place(&view, request, &mut ids)?;
                apply_placement(&mut view, &request, &placement.outcome)?;
                timings.push(one.elapsed());
                unplaced += usize::from(placement.outcome == crate::placement::Outcome::NoCapacityInAnyPool);
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    timings.sort_unstable();
    Ok(FillReport {
        jobs: timings.len(),
        nodes: view.node_count(),
        unplaced,
        seconds,
        p50_micros: micros(percentile(&timings, 0.50)),
        p99_micros: micros(percentile(&timings, 0.99)),
        peak_rss_bytes: peak_rss_bytes(),
    })
}

fn render_fill(report: &FillReport, output: crate::cli::plan::Output) -> Result<String, BenchError> {
    let table = || {
        format!(
            "jobs         {} ({} unplaced)\nnodes        {}\ntotal        {:.3} s\np50          {:.1} µs\np99          {:.1} µs\npeak RSS     {}",
            report.jobs,
            report.unplaced,
            report.nodes,
            report.seconds,
            report.p50_micros,
            report.p99_micros,
            rss(report.peak_rss_bytes)
        )
    };
    render_as(report, output, table)
}

fn rss(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "unknown".to_owned(), |b| format!("{} MiB", b / (1024 * 1024)))
}

fn render(report: &Report, output: crate::cli::plan::Output) -> Result<String, BenchError> {
    let table = || {
        format!(
            "placements/s {:.0}\np50          {:.1} µs\np99          {:.1} µs\npeak RSS     {}",
            report.placements_per_second,
            report.p50_micros,
            report.p99_micros,
            rss(report.peak_rss_bytes)
        )
    };
    render_as(report, output, table)
}

/// A report as JSON, YAML or the `table` text (`wide` is the table).
fn render_as<T: serde::Serialize>(
    report: &T,
    output: crate::cli::plan::Output,
    table: impl FnOnce() -> String,
) -> Result<String, BenchError> {
    use crate::cli::plan::Output;
    Ok(match output {
        Output::Json => serde_json::to_string(report)?,
        Output::Yaml => serde_yaml::to_string(report).map_err(|e| BenchError::Yaml(e.to_string()))?,
        Output::Table | Output::Wide => table(),
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `VmHWM` from `/proc/self/status` (Linux); `None` elsewhere.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
