//! `norsk-auto-manager demo`: the AutoManager against an in-process
//! simulator on a compressed clock, started on `examples/` (its pools and
//! bundles), then driven through a scripted sequence — a
//! node lost and its jobs recovered, a region out of capacity so the tier
//! cascade spills, a job crash-looping until its ceiling breaks its bundle,
//! an invalid spec — printing a readable timeline, then a fleet table and
//! the metrics.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tokio::sync::broadcast;
use tonic::transport::Channel;

use super::plan::input::{read_bundles, read_pools};
use super::standalone::describe;
use crate::automanager::{AutoManager, AutoManagerHandle, AutoSettings, Notification, RunOptions};
use crate::manager::proto::manager::JobRejectionCode;
use crate::manager::proto::sim_admin::{self, sim_admin_client::SimAdminClient};
use crate::model::{Bundle, BundleId, BundleJobRef, JobHistoryEntry, JobId, NodeId, NodeInventory, tags};
use crate::sim::{ClusterNode, SimConfig, Simulator};

/// Arguments of `demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Simulated seconds per real second (the simulator and the core share
    /// the compressed clock).
    #[arg(long, default_value_t = 200.0)]
    pub time_scale: f64,
    /// Seed for the simulator's random choices.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The resource documents the demo starts from: `pools.yaml` and the
    /// `bundle-*.yaml` files.
    #[arg(long, default_value = "examples")]
    pub examples: PathBuf,
}

/// How long one scripted stage may take, in real time.
const STAGE_TIMEOUT: Duration = Duration::from_secs(20);

/// Why the demo failed.
#[derive(Debug, thiserror::Error)]
enum DemoError {
    #[error("the simulator did not start: {0}")]
    Sim(#[from] crate::sim::StartError),
    #[error("the AutoManager did not start: {0}")]
    Run(#[from] crate::automanager::RunError),
    #[error("the simulator's admin service failed: {0}")]
    Admin(String),
    #[error("{0}")]
    Stage(String),
    #[error("cannot read the examples: {0}")]
    Examples(#[from] super::plan::input::InputError),
}

/// Runs the scripted demo.
pub async fn run(args: Args) -> ExitCode {
    super::exit_code(demo(args).await)
}

fn cluster_node(id: &str) -> ClusterNode {
    ClusterNode {
        id: id.to_owned(),
        tags: BTreeMap::from([(tags::POOL.to_owned(), "production".to_owned())]),
        inventory: NodeInventory::local_server("studio", "rack-1", "r640", 8.0),
    }
}

fn bundle(name: &str, job_yaml: &str) -> Result<Bundle, DemoError> {
    let spec = yaml_serde::from_str(&format!("pool: production\njobs:\n  - {job_yaml}\n"))
        .map_err(|e| DemoError::Stage(format!("demo bundle {name}: {e}")))?;
    Ok(Bundle {
        bundle_id: BundleId(format!("demo/{name}")),
        spec,
        ..Bundle::default()
    })
}

/// What the timeline has seen.
struct Timeline {
    events: broadcast::Receiver<Notification>,
    start: Instant,
    scale: f64,
    running: BTreeMap<JobId, NodeId>,
    broken: BTreeSet<BundleId>,
}

impl Timeline {
    fn print(&self, line: &str) {
        let t = self.start.elapsed().as_secs_f64() * self.scale;
        println!("[{:>4}:{:04.1}] {line}", (t / 60.0) as u64, t % 60.0);
    }

    fn note(&mut self, notification: &Notification) {
        match notification {
            Notification::JobUpdated { job } => match job.history.last() {
                Some(JobHistoryEntry::Running {
                    node_id: Some(node), ..
                }) => {
                    self.running.insert(job.job_id.clone(), node.clone());
                    self.print(&format!("running      {} on {node}", job.job_id));
                }
                Some(JobHistoryEntry::Stopping { .. } | JobHistoryEntry::Stopped { .. }) => {
                    self.running.remove(&job.job_id);
                }
                _ => {}
            },
            Notification::BundleBroken { bundle_id, .. } => {
                self.broken.insert(bundle_id.clone());
                self.print(&describe(notification));
            }
            Notification::BundleUpdated { .. }
            | Notification::ConnectionStateChange { .. }
            | Notification::NodeStarting { .. }
            | Notification::JobDeleted { .. } => {}
            other => self.print(&describe(other)),
        }
    }

    /// Follows the timeline until `done` holds.
    async fn until(&mut self, what: &str, done: impl Fn(&Timeline) -> bool) -> Result<(), DemoError> {
        let deadline = tokio::time::Instant::now() + STAGE_TIMEOUT;
        while !done(self) {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Ok(n)) => self.note(&n),
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    return Err(DemoError::Stage("the AutoManager stopped".into()));
                }
                Err(_) => return Err(DemoError::Stage(format!("timed out waiting for {what}"))),
            }
        }
        Ok(())
    }
}

fn heading(title: &str) {
    println!("\n== {title}");
}

async fn demo(args: Args) -> Result<(), DemoError> {
    let sim = Simulator::start(SimConfig {
        seed: args.seed,
        time_scale: args.time_scale,
        cluster_nodes: vec![cluster_node("studio-1"), cluster_node("studio-2")],
        ..SimConfig::default()
    })
    .await?;
    let admin = SimAdminClient::new(
        Channel::from_shared(sim.url())
            .map_err(|e| DemoError::Admin(e.to_string()))?
            .connect()
            .await
            .map_err(|e| DemoError::Admin(e.to_string()))?,
    );
    let settings = AutoSettings {
        url: sim.url(),
        placement_pools: read_pools(&args.examples.join("pools.yaml"))?,
        trace_placements: false,
        ..AutoSettings::default()
    };
    let (am, join) = AutoManager::run_with(
        settings,
        RunOptions {
            time_scale: args.time_scale,
        },
    )?;
    let mut timeline = Timeline {
        events: am.subscribe(),
        start: Instant::now(),
        scale: args.time_scale,
        running: BTreeMap::new(),
        broken: BTreeSet::new(),
    };
    let examples = example_bundles(&args.examples)?;
    let outcome = script(&am, admin.clone(), &mut timeline, examples).await;
    if outcome.is_ok() {
        report(&am, admin).await?;
    }
    am.close().await;
    if let Err(e) = join.await {
        eprintln!("error: the AutoManager loop failed: {e}");
    }
    sim.shutdown().await?;
    outcome
}

async fn admin_call<T>(call: impl Future<Output = Result<T, tonic::Status>>) -> Result<T, DemoError> {
    call.await.map_err(|s| DemoError::Admin(s.message().to_owned()))
}

/// The bundles of `examples/bundle-*.yaml`, in file order.
fn example_bundles(dir: &Path) -> Result<Vec<Bundle>, DemoError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| DemoError::Stage(format!("cannot list {}: {e}", dir.display())))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("bundle-") && n.ends_with(".yaml"))
        })
        .collect();
    files.sort();
    let mut bundles = Vec::new();
    for file in files {
        for (bundle_id, spec) in read_bundles(&file)? {
            bundles.push(Bundle {
                bundle_id,
                spec,
                ..Bundle::default()
            });
        }
    }
    Ok(bundles)
}

/// Jobs of the demo's own bundles (not the examples') that are running.
fn demo_running(t: &Timeline) -> impl Iterator<Item = (&JobId, &NodeId)> {
    t.running.iter().filter(|(job, _)| job.as_str().starts_with("demo/"))
}

async fn script(
    am: &AutoManagerHandle,
    mut admin: SimAdminClient<Channel>,
    t: &mut Timeline,
    examples: Vec<Bundle>,
) -> Result<(), DemoError> {
    let create = |b: Bundle| async move { am.create_bundle(b).await.map_err(|e| DemoError::Stage(e.to_string())) };

    heading("The example bundles: a cross-cloud channel with its OCI backup, a GPU transcode");
    let mut expected = 0;
    for bundle in examples {
        expected += bundle.spec.jobs.len() * bundle.spec.replica_count() as usize;
        create(bundle).await?;
    }
    t.until("every example job running", |t| t.running.len() == expected)
        .await?;

    heading("Four channels placed on the studio's cluster servers");
    for i in 0..4 {
        create(bundle(
            &format!("ch{i}"),
            "{jobName: encode, requirements: {requiredCapacity: 2}}",
        )?)
        .await?;
    }
    t.until("four channels running", |t| demo_running(t).count() == 4)
        .await?;

    heading("A studio server dies; its channels are recovered on the other");
    let victim = demo_running(t)
        .map(|(_, node)| node.clone())
        .next()
        .ok_or_else(|| DemoError::Stage("nothing runs".into()))?;
    t.print(&format!("kill         {victim}"));
    admin_call(admin.kill_node(sim_admin::NodeRef {
        node_id: victim.0.clone(),
    }))
    .await?;
    t.until("the channels recovered", |t| {
        demo_running(t).count() == 4 && demo_running(t).all(|(_, n)| *n != victim)
    })
    .await?;

    heading("eu-west-1 has no m5.xlarge left: the reserved tier spills to on-demand");
    admin_call(admin.set_capacity(sim_admin::SetCapacityRequest {
        region: "eu-west-1".into(),
        instance_type: "m5.xlarge".into(),
        available: 0,
    }))
    .await?;
    create(bundle("big", "{jobName: encode, requirements: {requiredCapacity: 4}}")?).await?;
    let big = JobId("demo/big/0/encode".into());
    t.until("the big channel running on on-demand", |t| t.running.contains_key(&big))
        .await?;

    heading("A job crash-loops until its restart ceiling breaks its bundle");
    create(bundle(
        "crashy",
        "{jobName: encode, requirements: {requiredCapacity: 1, maxRestartsPerHour: 2}}",
    )?)
    .await?;
    let crashy = JobId("demo/crashy/0/encode".into());
    let crashy_bundle = BundleId("demo/crashy".into());
    while !t.broken.contains(&crashy_bundle) {
        t.until("the crashy job running", |t| {
            t.running.contains_key(&crashy) || t.broken.contains(&crashy_bundle)
        })
        .await?;
        if t.broken.contains(&crashy_bundle) {
            break;
        }
        t.print(&format!("crash        {crashy}"));
        admin_call(admin.fail_job(sim_admin::JobRef {
            job_id: crashy.0.clone(),
            ..Default::default()
        }))
        .await?;
        t.until("the crash noticed", |t| !t.running.contains_key(&crashy))
            .await?;
    }

    heading("A worker refuses a job as an invalid spec: terminal on the first rejection");
    let mut bad = bundle(
        "badspec",
        "{jobName: encode, startMode: manual, requirements: {requiredCapacity: 1}}",
    )?;
    bad.spec.jobs[0].template = "encoder-h266".into();
    create(bad).await?;
    admin_call(admin.reject_job(sim_admin::RejectJobRequest {
        job_id: "demo/badspec/0/encode".into(),
        code: JobRejectionCode::JobRejectedInvalidSpec as i32,
        detail: "unknown codec h266".into(),
        times: 1,
    }))
    .await?;
    am.start_bundle_job(BundleJobRef {
        bundle_id: BundleId("demo/badspec".into()),
        replica_index: 0,
        job_name: "encode".into(),
    })
    .await
    .map_err(|e| DemoError::Stage(e.to_string()))?;
    let badspec = BundleId("demo/badspec".into());
    t.until("the invalid spec ending its bundle", |t| t.broken.contains(&badspec))
        .await
}

async fn report(am: &AutoManagerHandle, mut admin: SimAdminClient<Channel>) -> Result<(), DemoError> {
    heading("Fleet");
    let json = admin_call(admin.snapshot(())).await?.into_inner().json;
    let snapshot: crate::sim::SimSnapshot =
        serde_json::from_str(&json).map_err(|e| DemoError::Admin(format!("snapshot unreadable: {e}")))?;
    println!("{:<28} {:<14} {:<20} {:<10} jobs", "node", "provider", "type", "phase");
    for node in &snapshot.nodes {
        println!(
            "{:<28} {:<14} {:<20} {:<10} {}",
            node.id.as_str(),
            node.provider.as_str(),
            node.instance_type,
            format!("{:?}", node.phase).to_lowercase(),
            node.instances.len()
        );
    }
    heading("Metrics");
    let metrics = am.metrics().await.map_err(|e| DemoError::Stage(e.to_string()))?;
    let c = &metrics.counters;
    println!(
        "placements attempted {} succeeded {} failed {} dispatch-failed {}",
        c.placements_attempted, c.placements_succeeded, c.placements_failed, c.placements_dispatch_failed
    );
    let broken: Vec<&str> = metrics.broken_bundle_ids.iter().map(BundleId::as_str).collect();
    println!(
        "jobs rejected {} dropped {}; bundles broken {} ({})",
        c.jobs_rejected,
        c.jobs_dropped,
        c.bundles_broken,
        broken.join(", ")
    );
    for pool in &metrics.pools {
        println!(
            "pool {}: {} nodes, {:.0}% of capacity used",
            pool.pool_name,
            pool.node_count,
            pool.used_capacity_fraction * 100.0
        );
    }
    Ok(())
}
