//! `norsk-auto-manager standalone --config FILE [--events json|text]`: the
//! embedder's use of the library without Kubernetes. The config names the
//! Manager and the settings, a file of `PlacementPool` documents, optionally
//! a file of `HotSparePolicy` documents, and a directory of `Bundle`
//! documents (the operator's own resource files). The bundles are applied,
//! the directory is followed (a new document creates, a changed one
//! updates, a removed one deletes), and every notification is printed as a
//! JSON line or a readable line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::broadcast;

use super::plan::input::{InputError, read_bundles, read_hot_spares, read_pools};
use crate::automanager::{
    AutoManager, AutoManagerHandle, AutoSettings, CommandError, Notification, RpcFailureKind, RunError,
};
use crate::model::{Bundle, BundleId, BundleSpec};

/// How notifications are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EventFormat {
    /// One JSON object per line, `kind` naming the callback.
    Json,
    /// One readable line per notification.
    Text,
}

/// Arguments of `standalone`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The standalone config (YAML).
    #[arg(long)]
    pub config: PathBuf,
    /// How notifications are printed.
    #[arg(long, value_enum, default_value = "json")]
    pub events: EventFormat,
    /// How often the bundle directory is re-read, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    pub poll_ms: u64,
}

/// The standalone config file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StandaloneConfig {
    /// `AutoSettings` (url, pendingWindow, failurePolicies, ...); pools and
    /// hot spares come from the files below.
    pub settings: AutoSettings,
    /// A file of `PlacementPool` documents.
    pub pools: PathBuf,
    /// A file of `HotSparePolicy` documents.
    #[serde(default)]
    pub hot_spares: Option<PathBuf>,
    /// A directory of `Bundle` documents (`*.yaml`, `*.yml`).
    pub bundles: PathBuf,
}

/// Why `standalone` stopped.
#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    /// The config file could not be read.
    #[error("{}: {message}", file.display())]
    Config {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A resource file could not be read.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The AutoManager refused to start.
    #[error(transparent)]
    Run(#[from] RunError),
}

/// Runs until Ctrl-C.
pub async fn run(args: Args) -> ExitCode {
    match standalone(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn standalone(args: Args) -> Result<(), StandaloneError> {
    let config_file = args.config.clone();
    let text = std::fs::read_to_string(&config_file).map_err(|e| StandaloneError::Config {
        file: config_file.clone(),
        message: e.to_string(),
    })?;
    let config: StandaloneConfig = serde_yaml::from_str(&text).map_err(|e| StandaloneError::Config {
        file: config_file.clone(),
        message: e.to_string(),
    })?;
    let base = config_file.parent().unwrap_or(Path::new("."));
    let mut settings = config.settings;
    settings.placement_pools = read_pools(&base.join(&config.pools))?;
    if let Some(file) = &config.hot_spares {
        settings.hot_spares = read_hot_spares(&base.join(file))?;
    }
    let bundles_dir = base.join(&config.bundles);
    let (am, join) = AutoManager::run(settings)?;
    let printer = tokio::spawn(print(am.subscribe(), args.events));
    let mut applied = BTreeMap::new();
    let mut poll = tokio::time::interval(Duration::from_millis(args.poll_ms.max(100)));
    loop {
        tokio::select! {
            _ = poll.tick() => follow(&am, &bundles_dir, &mut applied).await,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    am.close().await;
    // The loop and the printer end with the AutoManager; a panic in either
    // is reported, not hidden.
    if let Err(e) = join.await {
        eprintln!("error: the AutoManager loop failed: {e}");
    }
    printer.abort();
    Ok(())
}

/// Every bundle document of the directory, by id.
fn read_dir(dir: &Path) -> Result<BTreeMap<BundleId, BundleSpec>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut bundles = BTreeMap::new();
    for file in files {
        for (id, spec) in read_bundles(&file).map_err(|e| e.to_string())? {
            bundles.insert(id, spec);
        }
    }
    Ok(bundles)
}

/// Brings Manager in line with the directory: creates, updates, deletes.
async fn follow(am: &AutoManagerHandle, dir: &Path, applied: &mut BTreeMap<BundleId, BundleSpec>) {
    let wanted = match read_dir(dir) {
        Ok(wanted) => wanted,
        Err(message) => return eprintln!("error: bundles not read: {message}"),
    };
    for (id, spec) in &wanted {
        if applied.get(id) == Some(spec) {
            continue;
        }
        let bundle = Bundle {
            bundle_id: id.clone(),
            spec: spec.clone(),
            ..Bundle::default()
        };
        let result = if applied.contains_key(id) {
            am.update_bundle(bundle).await
        } else {
            match am.create_bundle(bundle.clone()).await {
                // Manager has it from an earlier run: bring it up to date.
                Err(CommandError::Manager(f)) if f.kind == RpcFailureKind::AlreadyExists => {
                    am.update_bundle(bundle).await
                }
                other => other,
            }
        };
        match result {
            Ok(()) => {
                applied.insert(id.clone(), spec.clone());
            }
            Err(e) => eprintln!("error: bundle {id} not applied: {e}"),
        }
    }
    let gone: Vec<BundleId> = applied.keys().filter(|id| !wanted.contains_key(*id)).cloned().collect();
    for id in gone {
        match am.delete_bundle(id.clone()).await {
            Ok(()) => {
                applied.remove(&id);
            }
            Err(e) => eprintln!("error: bundle {id} not deleted: {e}"),
        }
    }
}

async fn print(mut notifications: broadcast::Receiver<Notification>, format: EventFormat) {
    loop {
        match notifications.recv().await {
            Ok(notification) => match format {
                EventFormat::Json => match serde_json::to_string(&notification) {
                    Ok(line) => println!("{line}"),
                    Err(e) => eprintln!("error: notification not printable: {e}"),
                },
                EventFormat::Text => println!("{}", describe(&notification)),
            },
            Err(broadcast::error::RecvError::Lagged(n)) => eprintln!("warning: {n} notifications skipped"),
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// A readable line for a notification.
pub fn describe(notification: &Notification) -> String {
    use crate::automanager::Decision;
    match notification {
        Notification::ConnectionStateChange { state } => format!("manager      {state}"),
        Notification::Error { message } => format!("error        {message}"),
        Notification::JobUpdated { job } => format!("job          {} {:?}", job.job_id, job.state),
        Notification::JobInfo { job_id, text, .. } => format!("job info     {job_id}: {text}"),
        Notification::JobDeleted { job_id } => format!("job deleted  {job_id}"),
        Notification::JobRejected {
            job_id,
            node_id,
            code,
            detail,
            ..
        } => format!("rejected     {job_id} on {node_id}: {code:?} {detail}"),
        Notification::JobDropped { job_id, reason } => format!("dropped      {job_id}: {reason}"),
        Notification::NodeStarting { node } => format!("node         {} starting", node.node_id),
        Notification::NodeStarted { node } => format!("node         {} started", node.node_id),
        Notification::NodeStopping { node_id, reason } => format!("node         {node_id} stopping ({reason:?})"),
        Notification::NodeStopped { node_id } => format!("node         {node_id} stopped"),
        Notification::NodeTerminated { node_id } => format!("node         {node_id} terminated"),
        Notification::NodeUnhealthy { node_id } => format!("node         {node_id} unhealthy"),
        Notification::NodeHealthy { node_id } => format!("node         {node_id} healthy"),
        Notification::BundleUpdated { bundle } => format!("bundle       {} updated", bundle.bundle_id),
        Notification::BundleDeleted { bundle_id } => format!("bundle       {bundle_id} deleted"),
        Notification::BundleBroken { bundle_id, reason } => format!("BROKEN       {bundle_id}: {reason}"),
        Notification::BundleSchedule {
            bundle_id,
            phase,
            next_phase,
            next_at,
        } => match (next_phase, next_at) {
            (Some(next), Some(at)) => format!(
                "schedule     {bundle_id} {} (then {} at {})",
                phase.as_str(),
                next.as_str(),
                crate::model::DateTime::from_millis(*at)
            ),
            _ => format!("schedule     {bundle_id} {}", phase.as_str()),
        },
        Notification::BundleJobStarted { job_id } => format!("started      {job_id}"),
        Notification::BundleJobStopped { job_id } => format!("stopped      {job_id}"),
        Notification::PlacementDecision(info) => {
            let verb = if info.recovery { "recovered" } else { "placed" };
            match &info.decision {
                Decision::Placed { node_id, tier, .. } => format!("{verb:<12} {} on {node_id} ({tier})", info.job_id),
                Decision::Provision {
                    node_id,
                    tier,
                    instance_type,
                    ..
                } => format!("{verb:<12} {} on new {instance_type} {node_id} ({tier})", info.job_id),
                Decision::NoCapacityInAnyPool => format!("{verb:<12} {} nowhere: no capacity", info.job_id),
            }
        }
        Notification::PlacementFailed { job_id, reason } => format!("unplaced     {job_id}: {reason}"),
        Notification::ResilienceDegraded { job_id, violations, .. } => format!("degraded     {job_id}: {violations:?}"),
        Notification::SpareUnderflow {
            pool,
            effective,
            target,
        } => {
            format!("spares       {pool} short: {effective} of {target}")
        }
        Notification::ImagesPrefetched { node_id, results } => {
            format!("prefetched   {node_id}: {} image(s)", results.len())
        }
        Notification::AuditAppended { entry } => format!("audit        {} {}", entry.action, entry.subject),
        Notification::ManagerLacksExtension { message, .. } => format!("MANAGER      {message}"),
        Notification::DrainProgress(state) => format!(
            "drain        {} {:?} ({} job(s))",
            state.node_id,
            state.phase,
            state.jobs.len()
        ),
        Notification::NodeInterrupted(state) => {
            format!(
                "interrupted  {} {:?}, drain {:?}",
                state.node_id, state.kind, state.drain.phase
            )
        }
        Notification::MigrationPhase(state) => format!(
            "migration    {} {}: {:?} ({} -> {})",
            state.migration_id, state.job_id, state.phase, state.source_node_id, state.target_node_id
        ),
        Notification::MigrationCompleted { migration_id, job_id } => {
            format!("migrated     {job_id} ({migration_id})")
        }
        Notification::MigrationAborted {
            migration_id,
            job_id,
            reason,
            lost,
        } => {
            let verb = if *lost { "mig. lost" } else { "mig. abort" };
            format!("{verb:<12} {job_id} ({migration_id}): {reason}")
        }
    }
}
