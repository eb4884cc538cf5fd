//! `norsk-auto-manager standalone --config FILE [--events json|text]
//! [--status-file PATH]`: the embedder's use of the library without
//! Kubernetes, with the operator's surface. It follows files of the same
//! resource documents the operator reconciles — `PlacementPool`,
//! `HotSparePolicy`, `Bundle`, `NorskNode` (`spec.cordoned`, `spec.spare`),
//! `NodeDrain` and `JobMigration` — with the operator's semantics for each
//! (see [`apply`]): a document added creates, changed updates, removed
//! deletes or undoes. Every notification is printed as a JSON line or a
//! readable line, subscribed before the core starts (nothing it emits at
//! start is missed), and `--status-file` holds what the operator would
//! write to each resource's status (see [`status`]).
//!
//! The config names the Manager and the settings (`settings`), and what to
//! follow: `resources`, a directory (every `*.yaml` / `*.yml` file in it;
//! `bundles` is the earlier name of the key), and optionally `pools` and
//! `hotSpares`, files followed the same way (any kind may be in any
//! file). Paths are relative to the config file. Pools and hot spares are
//! documents, never `settings.placementPools` / `settings.hotSpares`.
//!
//! Input is decoded as strictly as the API server admits it, and each file
//! stands alone (see [`follow`]): a bad file is reported once per change —
//! file, document, resource, field, line and column — its last good
//! content stays in force, and every other file carries on.

mod apply;
mod follow;
mod status;
mod text;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::{broadcast, mpsc};

use self::apply::{Applier, wanted_settings};
use self::follow::{Files, Source};
use self::status::Status;
pub use self::text::describe;
use super::documents;
use crate::automanager::{
    AutoManager, AutoSettings, Notification, QueryError, RunError, RunOptions, validate_auto_settings,
};
use crate::model::{HotSpareSpec, PlacementPool};

/// How soon after a notification the status is read again (notifications
/// come in bursts: one reading per burst).
const STATUS_AFTER_NOTIFICATION: Duration = Duration::from_millis(200);

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
    /// How often the followed files are read again, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    pub poll_ms: u64,
    /// Where the status of every resource is written (JSON, replaced
    /// whole whenever it changes).
    #[arg(long)]
    pub status_file: Option<PathBuf>,
}

/// The standalone config file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StandaloneConfig {
    /// `AutoSettings` (url, pendingWindow, failurePolicies, ...); pools and
    /// hot spares are documents in the followed files.
    pub settings: AutoSettings,
    /// A directory of resource documents of any kind (`*.yaml`, `*.yml`).
    #[serde(default, alias = "bundles")]
    pub resources: Option<PathBuf>,
    /// A file of resource documents (by custom, the `PlacementPool`s).
    #[serde(default)]
    pub pools: Option<PathBuf>,
    /// A file of resource documents (by custom, the `HotSparePolicy`s).
    #[serde(default)]
    pub hot_spares: Option<PathBuf>,
}

/// Why `standalone` stopped.
#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    /// The config file could not be read.
    #[error("{}: {message}", file.display())]
    Config {
        file: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The AutoManager refused to start.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The AutoManager's loop ended on its own.
    #[error("the AutoManager stopped: {0}")]
    Stopped(#[from] QueryError),
}

/// Runs until Ctrl-C or SIGTERM.
pub async fn run(args: Args) -> ExitCode {
    super::exit_code(standalone(args).await)
}

/// Reads the config (strictly) and names what it follows.
fn read_config(file: &Path) -> Result<(AutoSettings, Vec<Source>), StandaloneError> {
    let refused = |message: String| StandaloneError::Config {
        file: file.to_owned(),
        message,
    };
    let text = std::fs::read_to_string(file).map_err(|e| refused(e.to_string()))?;
    let config: StandaloneConfig = documents::strict::decode(&text)
        .map_err(|problems| refused(problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")))?;
    let mut problems = Vec::new();
    if !config.settings.placement_pools.is_empty() {
        problems.push("settings.placementPools: pools are PlacementPool documents in the followed files".to_owned());
    }
    if !config.settings.hot_spares.is_empty() {
        problems.push("settings.hotSpares: hot spares are HotSparePolicy documents in the followed files".to_owned());
    }
    let base = file.parent().unwrap_or(Path::new("."));
    let mut sources = Vec::new();
    sources.extend(config.pools.map(|p| Source::File(base.join(p))));
    sources.extend(config.hot_spares.map(|p| Source::File(base.join(p))));
    sources.extend(config.resources.map(|p| Source::Directory(base.join(p))));
    if sources.is_empty() {
        problems.push("nothing to follow: name a `resources` directory (or `pools` / `hotSpares` files)".to_owned());
    }
    if problems.is_empty() {
        Ok((config.settings, sources))
    } else {
        Err(refused(problems.join("; ")))
    }
}

/// The settings the core starts with: the pools and policies the files
/// hold, so that the first decisions (the spare reconciler after
/// hydration above all: spares of a pool with no policy are reaped) see
/// them. A set the core refuses as a whole starts without the policies,
/// then without the pools; the first round reports the refusal.
fn start_settings(base: AutoSettings, pools: Vec<PlacementPool>, spares: Vec<HotSpareSpec>) -> AutoSettings {
    let candidates = [(pools.clone(), spares), (pools, Vec::new())];
    for (placement_pools, hot_spares) in candidates {
        let settings = AutoSettings {
            placement_pools,
            hot_spares,
            ..base.clone()
        };
        if validate_auto_settings(settings.clone()).is_ok() {
            return settings;
        }
    }
    base
}

async fn standalone(args: Args) -> Result<(), StandaloneError> {
    let (settings, sources) = read_config(&args.config)?;
    let mut files = Files::new(sources);
    files.scan();
    let (pools, left_out, spares) = wanted_settings(&files);
    let settings = start_settings(settings, pools, spares);
    // Subscribed before the loop starts: the first `connecting`, `ready`
    // and `spareUnderflow` are printed too.
    let (am, notifications, join) = AutoManager::run_subscribed(settings, RunOptions::default())?;
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let printer = tokio::spawn(print(notifications, args.events, seen_tx));
    let mut applier = Applier::new(am.clone(), left_out);
    let mut status = Status::new(args.status_file.clone());
    let recorded = status.recorded();
    applier.resume(&recorded, &files);
    status.resume(&recorded, &applier);
    let mut poll = tokio::time::interval(Duration::from_millis(args.poll_ms.max(100)));
    let mut due: Option<tokio::time::Instant> = None;
    let mut stop = std::pin::pin!(stop_signal());
    let outcome = loop {
        let wake = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = poll.tick() => {
                files.scan();
                if let Err(e) = applier.apply(&files).await {
                    break Err(e);
                }
                if let Err(e) = status.refresh(&am, &files, &mut applier).await {
                    break Err(e);
                }
                due = None;
            }
            Some(notification) = seen.recv() => {
                status.notes.record(&notification);
                due.get_or_insert_with(|| tokio::time::Instant::now() + STATUS_AFTER_NOTIFICATION);
            }
            () = wake => {
                due = None;
                if let Err(e) = status.refresh(&am, &files, &mut applier).await {
                    break Err(e);
                }
            }
            () = &mut stop => break Ok(()),
        }
    };
    am.close().await;
    // The loop ends with the AutoManager; a panic in it is reported, not
    // hidden.
    if let Err(e) = join.await {
        eprintln!("error: the AutoManager loop failed: {e}");
    }
    // The last senders go with the handles: the printer prints what the
    // close sent, then ends.
    drop(applier);
    drop(am);
    if let Err(e) = printer.await {
        eprintln!("error: the notification printer failed: {e}");
    }
    Ok(outcome?)
}

/// Ctrl-C, or (on Unix) SIGTERM: the ways a service is asked to stop.
async fn stop_signal() {
    #[cfg(unix)]
    if let Ok(mut terminate) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        return;
    }
    // Without a signal handler Ctrl-C still stops; a failure to install it
    // leaves only the process's end.
    let _ = tokio::signal::ctrl_c().await;
}

/// Prints every notification as `format` says and hands it on (the
/// status keeps what notifications say about jobs).
async fn print(
    mut notifications: broadcast::Receiver<Notification>,
    format: EventFormat,
    seen: mpsc::UnboundedSender<Notification>,
) {
    loop {
        match notifications.recv().await {
            Ok(notification) => {
                match format {
                    EventFormat::Json => match serde_json::to_string(&notification) {
                        Ok(line) => println!("{line}"),
                        Err(e) => eprintln!("error: notification not printable: {e}"),
                    },
                    EventFormat::Text => println!("{}", describe(&notification)),
                }
                // The main loop may have ended; printing goes on regardless.
                let _ = seen.send(notification);
            }
            Err(broadcast::error::RecvError::Lagged(n)) => eprintln!("warning: {n} notifications skipped"),
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}
