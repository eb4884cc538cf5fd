//! `kubectl-norsk`, the kubectl plugin: day-two commands on the operator's resources through
//! the API server, as the person running kubectl (their kubeconfig, their RBAC). It owns no
//! policy: `cordon` edits a `NorskNode`, `drain` / `interrupt` / `evict` / `terminate` create
//! a `NodeDrain`, `migrate`
//! a `JobMigration`, `start` / `stop` a manual job's `startedReplicas` on its `Bundle`, and
//! the operator does the rest; `plan` / `explain` run the placement
//! engine on the cluster's pools and bundles and the live fleet the operator mirrors into
//! `NorskNode`s (or a fleet snapshot file), as `norsk-auto-manager plan` does offline;
//! `manager` prints the Manager status the leading operator publishes.

mod drain;
pub mod manager;
mod migrate;
mod nodes;
pub mod plan;
mod start;

use std::fmt::Debug;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use futures::StreamExt;
use futures::stream::BoxStream;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::crd::{DrainAfter, DrainMode, InterruptionKind, MigrationStrategy};
use crate::decide::node_status::DEFAULT_FLEET;

pub use drain::{DrainEnd, at_once_resource, drain_resource, follow_drain, interruption_resource};
pub use migrate::{MigrationAnswer, migration_resource};
pub use nodes::set_cordoned;
pub use plan::{FleetSource, PlanWarning, Planned};
pub use start::{StartStop, StartStopAnswer, start_or_stop};

/// kubectl plugin for norsk-auto-manager.
#[derive(Debug, Parser)]
#[command(name = "kubectl-norsk", bin_name = "kubectl norsk", version = crate::telemetry::VERSION)]
pub struct Cli {
    /// Which cluster, as kubectl's own flags choose it.
    #[command(flatten)]
    pub kube: KubeArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// kubectl's connection flags, read the way kubectl reads them: `--kubeconfig`, else
/// `$KUBECONFIG` (a list of files, merged), else `~/.kube/config`, else the in-cluster
/// service account; `--context`, `--cluster` and `--user` override the current context's.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct KubeArgs {
    /// Path to the kubeconfig file to use.
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The kubeconfig cluster to use.
    #[arg(long, global = true)]
    pub cluster: Option<String>,
    /// The kubeconfig user to use.
    #[arg(long, global = true)]
    pub user: Option<String>,
    /// Namespace of bundles and migrations (default: the context's, else `default`).
    #[arg(short, long, global = true)]
    pub namespace: Option<String>,
    /// `plan` the bundles of every namespace.
    #[arg(short = 'A', long, global = true, conflicts_with = "namespace")]
    pub all_namespaces: bool,
}

impl KubeArgs {
    /// The client configuration these flags choose.
    pub async fn config(&self) -> Result<kube::Config, PluginError> {
        let options = kube::config::KubeConfigOptions {
            context: self.context.clone(),
            cluster: self.cluster.clone(),
            user: self.user.clone(),
        };
        let chosen = options.context.is_some() || options.cluster.is_some() || options.user.is_some();
        match &self.kubeconfig {
            Some(path) => {
                let file = kube::config::Kubeconfig::read_from(path).map_err(|e| PluginError::Kubeconfig {
                    what: path.display().to_string(),
                    why: e.to_string(),
                })?;
                kube::Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(|e| PluginError::Kubeconfig {
                        what: path.display().to_string(),
                        why: e.to_string(),
                    })
            }
            // A chosen context must come from a kubeconfig: no in-cluster fallback.
            None if chosen => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| PluginError::Kubeconfig {
                    what: "the kubeconfig ($KUBECONFIG or ~/.kube/config)".to_owned(),
                    why: e.to_string(),
                }),
            None => kube::Config::infer()
                .await
                .map_err(|e| PluginError::Connect(kube::Error::InferConfig(e))),
        }
    }
}

/// Where a command looks for namespaced resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One namespace.
    Namespace(String),
    /// Every namespace (`-A`; `plan` only).
    All,
}

/// The plugin's commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Place the namespace's bundles (or the named ones) on the live fleet with the cluster's
    /// pools and hot spares, as if placed now: the same table as `norsk-auto-manager plan`.
    Plan {
        /// The fleet to place on.
        #[command(flatten)]
        fleet: FleetArgs,
        /// Only these bundles.
        bundles: Vec<String>,
        /// `table`, `wide` (with each job's current node and whether the plan moves it),
        /// `json` or `yaml`.
        #[arg(short, long, value_enum, default_value_t = crate::cli::plan::Output::Table)]
        output: crate::cli::plan::Output,
    },
    /// Whether the fleet would absorb the loss of each node (or of the named node, zone, tier,
    /// provider kind or pool): every lost job placed again by the operator's own rules, with
    /// the cluster's pools, hot spares and every namespace's bundles. Exit 0 when every loss
    /// is absorbed, 1 when one is not.
    Headroom {
        /// The fleet to analyse.
        #[command(flatten)]
        fleet: FleetArgs,
        /// The domains to take away (none: every node, zone and provider kind).
        #[command(flatten)]
        domains: crate::cli::headroom::DomainArgs,
        /// `table`, `wide` (every lost job's fate), `json` or `yaml`.
        #[arg(short, long, value_enum, default_value_t = crate::cli::plan::Output::Table)]
        output: crate::cli::plan::Output,
        /// Trace every placement that finds nowhere and print it.
        #[arg(long)]
        explain: bool,
    },
    /// Why a bundle's jobs are where they are: the last placement the operator recorded for
    /// each job, then the placement trace against the live fleet (or --fleet), node by node.
    Explain {
        /// The bundle.
        bundle: String,
        /// Only this job.
        job: Option<String>,
        /// The fleet to trace the placement against.
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Which Manager each fleet's leading operator drives, whether its stream is up, and how
    /// each capability beyond the published Manager API is carried out: `served` by Manager, or
    /// `published` (the operator does the same with the published API) and what you lose then.
    /// Read from the status ConfigMap the leader publishes in its namespace. Exit 0 when one is
    /// found, 1 when no leader has published one.
    Manager {
        /// Only this fleet (the operator's `--fleet`, the chart's `fleet`).
        #[arg(long, visible_alias = "fleet-name")]
        fleet: Option<String>,
        /// Look in this namespace only (the operator's) rather than in every namespace: for
        /// those who may list ConfigMaps there only.
        #[arg(long)]
        operator_namespace: Option<String>,
        /// `table`, `wide` (adds what the operator does instead of each capability taken the
        /// published way), `json` or `yaml`.
        #[arg(short, long, value_enum, default_value_t = crate::cli::plan::Output::Table)]
        output: crate::cli::plan::Output,
    },
    /// No new placement on the node; its jobs stay.
    Cordon {
        /// The NorskNode (resource name or Manager node id).
        node: String,
    },
    /// Placement may use the node again.
    Uncordon {
        /// The NorskNode (resource name or Manager node id).
        node: String,
    },
    /// Drain a node: its jobs migrated elsewhere, then the node terminated (or, with
    /// `--keep`, kept cordoned for maintenance). Follows the drain until it ends (exit 0
    /// when done, 1 when partial or failed).
    Drain {
        /// The NorskNode (resource name or Manager node id).
        node: String,
        /// Seconds before stuck jobs end the drain partial (operator default 600).
        #[arg(long)]
        timeout: Option<u32>,
        /// Terminate at the timeout even with jobs left.
        #[arg(long)]
        force: bool,
        /// How every job moves; when absent, each job moves with the strategy its Bundle
        /// declares (`requirements.migrationStrategy`), else stop-then-start.
        #[arg(long, value_enum)]
        strategy: Option<Strategy>,
        /// A maintenance drain: keep the emptied node, cordoned and running, for planned
        /// work (`uncordon` returns it to service).
        #[arg(long, conflicts_with = "terminate")]
        keep: bool,
        /// Terminate the emptied node (the default, for every node).
        #[arg(long)]
        terminate: bool,
        /// Create the drain and return.
        #[arg(long)]
        no_wait: bool,
    },
    /// Evict a node: cordon it, then terminate it at once, without migrating its jobs (they
    /// go down with it and recover per their onRuntimeFailure). Waits until Manager stopped
    /// the node (exit 0) or the terminate was refused (exit 1).
    Evict {
        /// The NorskNode (resource name or Manager node id).
        node: String,
        /// Create the NodeDrain and return.
        #[arg(long)]
        no_wait: bool,
    },
    /// Terminate a node at once, without cordoning it or migrating its jobs (they go down
    /// with it and recover per their onRuntimeFailure). Waits like `evict`.
    Terminate {
        /// The NorskNode (resource name or Manager node id).
        node: String,
        /// Create the NodeDrain and return.
        #[arg(long)]
        no_wait: bool,
    },
    /// Move one running job of a bundle to another node (with its co-located group). Waits
    /// until the operator accepts (exit 0) or refuses (exit 1) the migration.
    Migrate {
        /// The bundle.
        bundle: String,
        /// The job's name in the bundle.
        job: String,
        /// 0 for the primary replica, 1 for the backup.
        #[arg(long, default_value_t = 0)]
        replica: u32,
        /// The target node (placement chooses when absent).
        #[arg(long)]
        to: Option<String>,
        /// How the job (and its group) moves; when absent, each job moves with the strategy
        /// its Bundle declares (`requirements.migrationStrategy`), else stop-then-start.
        #[arg(long, value_enum)]
        strategy: Option<Strategy>,
        /// May take an exclusively reserved spare.
        #[arg(long)]
        override_reservation: bool,
        /// Create the migration and return, without waiting for the operator to accept or
        /// refuse it.
        #[arg(long)]
        no_wait: bool,
    },
    /// Start a `startMode: manual` job: adds its replicas to the Bundle's `startedReplicas`
    /// (the desired state) and waits until the operator has started them (exit 0), or says
    /// why it cannot (exit 1). Under GitOps, change `startedReplicas` in Git instead.
    Start(ManualJobArgs),
    /// Stop a `startMode: manual` job: takes its replicas from the Bundle's `startedReplicas`
    /// and waits until the operator has stopped them, their instances included (exit 0).
    Stop(ManualJobArgs),
    /// Print the shell completion script of `kubectl-norsk`:
    /// `source <(kubectl-norsk completion bash)`.
    Completion {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Tell the operator a provider is taking the node back: a forced drain sized to the
    /// deadline. Follows it like `drain`.
    Interrupt {
        /// The NorskNode (resource name or Manager node id).
        node: String,
        /// The provider's notice.
        #[arg(long, value_enum, default_value = "spot-interruption")]
        kind: Notice,
        /// When the node is reclaimed (RFC 3339; the kind's default when absent).
        #[arg(long)]
        deadline: Option<String>,
        /// How every job moves; when absent, each job moves with the strategy its Bundle
        /// declares (`requirements.migrationStrategy`), else stop-then-start.
        #[arg(long, value_enum)]
        strategy: Option<Strategy>,
        /// Create the drain and return.
        #[arg(long)]
        no_wait: bool,
    },
}

impl Command {
    /// The command's name, as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Plan { .. } => "plan",
            Command::Explain { .. } => "explain",
            Command::Headroom { .. } => "headroom",
            Command::Manager { .. } => "manager",
            Command::Cordon { .. } => "cordon",
            Command::Uncordon { .. } => "uncordon",
            Command::Drain { .. } => "drain",
            Command::Evict { .. } => "evict",
            Command::Terminate { .. } => "terminate",
            Command::Migrate { .. } => "migrate",
            Command::Start(_) => "start",
            Command::Stop(_) => "stop",
            Command::Interrupt { .. } => "interrupt",
            Command::Completion { .. } => "completion",
        }
    }
}

/// The manual job `start` and `stop` act on.
#[derive(Clone, Debug, clap::Args)]
pub struct ManualJobArgs {
    /// The bundle.
    pub bundle: String,
    /// The manual job's name in the bundle.
    pub job: String,
    /// Only this replica (0 the primary, 1 the backup); every replica when absent.
    #[arg(long)]
    pub replica: Option<u32>,
    /// Patch the Bundle and return.
    #[arg(long)]
    pub no_wait: bool,
}

/// Prints how a followed resource ended, after its name (`nodedrain/x`):
/// what it achieved on stdout (exit 0), or why it did not on stderr (exit 1).
fn report_end(resource: &str, end: Result<String, String>) -> ExitCode {
    match end {
        Ok(done) => {
            println!("{resource} {done}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("{resource} {why}");
            ExitCode::FAILURE
        }
    }
}

/// The fleet `plan` and `explain` place on: the live one unless `--fleet` names a file.
#[derive(Clone, Debug, clap::Args)]
pub struct FleetArgs {
    /// A fleet snapshot file (`norsk-auto-manager simctl snapshot`'s `fleet`, YAML or JSON)
    /// to place on instead of the live fleet.
    #[arg(long)]
    pub fleet: Option<PathBuf>,
    /// The operator's fleet name (its `--fleet`, the chart's `fleet`): the live fleet is the
    /// NorskNodes it mirrors under this name.
    #[arg(long, default_value = DEFAULT_FLEET, conflicts_with = "fleet")]
    pub fleet_name: String,
}

impl FleetArgs {
    /// The file when `--fleet` names one, else the live fleet of `--fleet-name`.
    pub fn source(self) -> FleetSource {
        match self.fleet {
            Some(file) => FleetSource::File(file),
            None => FleetSource::Live(self.fleet_name),
        }
    }
}

/// `--strategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Strategy {
    /// Target prepared, source stopped, target started.
    StopThenStart,
    /// Target started; once running, the source stopped.
    Overlap,
    /// The job hands over at a point both instances agree on.
    Handover,
}

impl From<Strategy> for MigrationStrategy {
    fn from(strategy: Strategy) -> Self {
        match strategy {
            Strategy::StopThenStart => MigrationStrategy::StopThenStart,
            Strategy::Overlap => MigrationStrategy::Overlap,
            Strategy::Handover => MigrationStrategy::Handover,
        }
    }
}

/// `interrupt --kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Notice {
    /// A spot instance is reclaimed.
    SpotInterruption,
    /// A rebalance recommendation.
    Rebalance,
}

impl From<Notice> for InterruptionKind {
    fn from(notice: Notice) -> Self {
        match notice {
            Notice::SpotInterruption => InterruptionKind::SpotInterruption,
            Notice::Rebalance => InterruptionKind::Rebalance,
        }
    }
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// No kubeconfig or in-cluster configuration.
    #[error("cannot reach the cluster: {0}")]
    Connect(#[from] kube::Error),
    /// The kubeconfig (or the context, cluster or user asked for) could not be used.
    #[error("cannot use {what}: {why}")]
    Kubeconfig {
        /// The file or flag.
        what: String,
        /// Why.
        why: String,
    },
    /// `-A` with a command that acts on one resource.
    #[error("--all-namespaces applies to plan only: {0} acts on one resource; name its namespace with -n")]
    AllNamespaces(&'static str),
    /// No NorskNode has that name or node id.
    #[error("no NorskNode named {0:?} or with spec.nodeId {0:?}")]
    UnknownNode(String),
    /// A request was refused.
    #[error("{action}: {source}")]
    Request {
        /// What was attempted.
        action: String,
        /// The API server's answer.
        source: kube::Error,
    },
    /// The drain's watch ended before the drain did.
    #[error("lost track of NodeDrain {0}")]
    LostDrain(String),
    /// The migration's watch ended before the operator answered.
    #[error("lost track of JobMigration {0}")]
    LostMigration(String),
    /// No Bundle of that name in the namespace.
    #[error("no Bundle {0}")]
    UnknownBundle(String),
    /// The Bundle has no job of that name.
    #[error("bundle {bundle} has no job {job:?}")]
    UnknownJob {
        bundle: String,
        /// The job asked for.
        job: String,
    },
    /// `start` / `stop` of a job that is not `startMode: manual`.
    #[error(
        "job {job} of bundle {bundle} is startMode auto: it runs whenever its bundle does; only manual jobs are started and stopped"
    )]
    NotManualJob { bundle: String, job: String },
    /// `--replica` names a replica the bundle does not have.
    #[error("bundle {bundle} has no replica {replica}: {}", replicas_words(*.replicas))]
    UnknownReplica {
        bundle: String,
        /// The replica asked for.
        replica: u32,
        /// How many it has.
        replicas: u32,
    },
    /// Every patch lost a race with another edit of the Bundle.
    #[error("bundle {0} kept changing while it was patched; try again")]
    Contended(String),
    /// The bundle's watch ended before the operator answered.
    #[error("lost track of Bundle {0}")]
    LostBundle(String),
    /// Planning failed.
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    /// No leader has published its Manager status (where and for the fleet asked).
    #[error(
        "no norsk-auto-manager leader has published its Manager status{}{}: is the operator running and leading?",
        .fleet.as_ref().map(|f| format!(" for fleet {f:?}")).unwrap_or_default(),
        .namespace.as_ref().map(|n| format!(" in namespace {n}")).unwrap_or_default()
    )]
    NoManagerStatus {
        /// The fleet asked for (every fleet when absent).
        fleet: Option<String>,
        /// The namespace looked in (every namespace when absent).
        namespace: Option<String>,
    },
    /// Listing the ConfigMaps the Manager status is published in was refused.
    #[error("{}", manager_status_forbidden(.namespace.as_deref()))]
    ManagerStatusForbidden {
        /// The namespace listed (every namespace when absent).
        namespace: Option<String>,
    },
    /// The Manager status could not be printed as asked.
    #[error("cannot print the Manager status: {0}")]
    PrintManagerStatus(serde_json::Error),
}

/// What `manager` needs, when it was refused the list of ConfigMaps in `namespace` (every
/// namespace when absent), and where else it could look.
fn manager_status_forbidden(namespace: Option<&str>) -> String {
    match namespace {
        None => "you may not list configmaps in every namespace, which `kubectl norsk manager` \
                 needs to find the Manager status (the permission: list configmaps, cluster-wide; \
                 `kubectl auth can-i list configmaps -A`); name the operator's namespace with \
                 --operator-namespace if you may list configmaps there"
            .to_owned(),
        Some(namespace) => format!(
            "you may not list configmaps in namespace {namespace}, which `kubectl norsk manager \
             --operator-namespace {namespace}` needs to read the Manager status (the permission: \
             list configmaps in {namespace}; `kubectl auth can-i list configmaps -n {namespace}`)"
        ),
    }
}

/// What replicas a bundle with `count` of them has, in words.
fn replicas_words(count: u32) -> &'static str {
    if count > 1 {
        "it has replicas 0 (the primary) and 1 (the backup)"
    } else {
        "it has only replica 0 (no resiliencePolicy, so no backup)"
    }
}

/// Each version of the object `name` the API server applies, as it
/// changes. A watch error (an expired resource version, a dropped
/// connection) is logged, naming the object as `what`, and passed over: the
/// watcher re-lists, its backoff keeping that from spinning while the API
/// server is away.
fn watch_named<K>(api: &Api<K>, name: &str, what: &'static str) -> BoxStream<'static, K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let name = name.to_owned();
    watcher(api.clone(), config)
        .default_backoff()
        .applied_objects()
        .filter_map(move |next| {
            let object = match next {
                Ok(object) => Some(object),
                Err(source) => {
                    tracing::debug!(%name, error = %source, "watch of the {what} interrupted; resuming");
                    None
                }
            };
            std::future::ready(object)
        })
        .boxed()
}

impl PluginError {
    fn request(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| Self::Request { action, source }
    }
}

/// Runs the command with the kubeconfig's client; prints errors and returns the exit code.
pub async fn main(cli: Cli) -> ExitCode {
    // Needs no cluster.
    if let Command::Completion { shell } = cli.command {
        return crate::cli::print_completion::<Cli>(shell, "kubectl-norsk");
    }
    let result = async {
        let config = cli.kube.config().await?;
        let scope = if cli.kube.all_namespaces {
            Scope::All
        } else {
            Scope::Namespace(
                cli.kube
                    .namespace
                    .clone()
                    .unwrap_or_else(|| config.default_namespace.clone()),
            )
        };
        let client = Client::try_from(config)?;
        run_in(client, &scope, cli.command).await
    }
    .await;
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The plan on stdout, what it left out on stderr.
fn print_planned(planned: &Planned) -> ExitCode {
    for warning in &planned.warnings {
        eprintln!("warning: {warning}");
    }
    print!("{}", planned.text);
    ExitCode::SUCCESS
}

/// Runs one command against `client`; bundles and migrations live in `namespace`.
pub async fn run(client: Client, namespace: &str, command: Command) -> Result<ExitCode, PluginError> {
    run_in(client, &Scope::Namespace(namespace.to_owned()), command).await
}

/// Runs one command against `client` in `scope`.
pub async fn run_in(client: Client, scope: &Scope, command: Command) -> Result<ExitCode, PluginError> {
    let namespace = match (scope, &command) {
        (Scope::All, Command::Plan { fleet, bundles, output }) => {
            let planned = plan::plan(client, None, &fleet.clone().source(), bundles, *output).await?;
            return Ok(print_planned(&planned));
        }
        // Cluster-wide whatever the namespace: a node carries every namespace's jobs, and
        // the operator's namespace is not the user's.
        (_, Command::Headroom { .. } | Command::Manager { .. }) => "",
        (Scope::All, other) => return Err(PluginError::AllNamespaces(other.name())),
        (Scope::Namespace(namespace), _) => namespace.as_str(),
    };
    let command_name = command.name();
    match command {
        Command::Completion { shell } => Ok(crate::cli::print_completion::<Cli>(shell, "kubectl-norsk")),
        Command::Plan { fleet, bundles, output } => {
            let planned = plan::plan(client, Some(namespace), &fleet.source(), &bundles, output).await?;
            Ok(print_planned(&planned))
        }
        Command::Headroom {
            fleet,
            domains,
            output,
            explain,
        } => {
            let found = plan::headroom(client, &fleet.source(), &domains.selection(), output, explain).await?;
            print_planned(&found.planned);
            Ok(if found.absorbed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Manager {
            fleet,
            operator_namespace,
            output,
        } => {
            let found = manager::find(client, fleet.as_deref(), operator_namespace.as_deref()).await?;
            let text = manager::render(&found, output, k8s_openapi::jiff::Timestamp::now())
                .map_err(PluginError::PrintManagerStatus)?;
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain { bundle, job, fleet } => {
            let planned = plan::explain(client, namespace, &fleet.source(), &bundle, job.as_deref()).await?;
            Ok(print_planned(&planned))
        }
        command @ (Command::Cordon { .. }
        | Command::Uncordon { .. }
        | Command::Drain { .. }
        | Command::Evict { .. }
        | Command::Terminate { .. }
        | Command::Interrupt { .. }) => run_on_node(client, command).await,
        Command::Migrate {
            bundle,
            job,
            replica,
            to,
            strategy,
            override_reservation,
            no_wait,
        } => {
            let migration = migration_resource(
                &bundle,
                &job,
                replica,
                to,
                strategy.map(Into::into),
                override_reservation,
            );
            migrate::create_and_wait(client, namespace, migration, no_wait).await
        }
        Command::Start(ManualJobArgs {
            bundle,
            job,
            replica,
            no_wait,
        })
        | Command::Stop(ManualJobArgs {
            bundle,
            job,
            replica,
            no_wait,
        }) => {
            let request = StartStop {
                bundle,
                job,
                replica,
                start: matches!(command_name, "start"),
            };
            start_or_stop(client, namespace, request, no_wait).await
        }
    }
}

/// Runs one of the commands that act on a node (`cordon`, `uncordon`,
/// `drain`, `evict`, `terminate`, `interrupt`), which [`run_in`] hands over.
async fn run_on_node(client: Client, command: Command) -> Result<ExitCode, PluginError> {
    match command {
        Command::Cordon { node } => {
            let name = set_cordoned(client, &node, true).await?;
            println!("norsknode/{name} cordoned");
            Ok(ExitCode::SUCCESS)
        }
        Command::Uncordon { node } => {
            let name = set_cordoned(client, &node, false).await?;
            println!("norsknode/{name} uncordoned");
            Ok(ExitCode::SUCCESS)
        }
        Command::Drain {
            node,
            timeout,
            force,
            strategy,
            keep,
            terminate,
            no_wait,
        } => {
            let node_id = nodes::node_id(client.clone(), &node).await?;
            let after = match (keep, terminate) {
                (true, _) => Some(DrainAfter::Keep),
                (_, true) => Some(DrainAfter::Terminate),
                _ => None,
            };
            let drain = drain_resource(&node_id, timeout, force, strategy.map(Into::into), after);
            drain::create_and_follow(client, drain, no_wait).await
        }
        Command::Evict { node, no_wait } => {
            let node_id = nodes::node_id(client.clone(), &node).await?;
            drain::create_and_follow_at_once(client, at_once_resource(&node_id, DrainMode::Evict), no_wait).await
        }
        Command::Terminate { node, no_wait } => {
            let node_id = nodes::node_id(client.clone(), &node).await?;
            drain::create_and_follow_at_once(client, at_once_resource(&node_id, DrainMode::Terminate), no_wait).await
        }
        Command::Interrupt {
            node,
            kind,
            deadline,
            strategy,
            no_wait,
        } => {
            let node_id = nodes::node_id(client.clone(), &node).await?;
            let drain = interruption_resource(&node_id, kind.into(), deadline, strategy.map(Into::into));
            drain::create_and_follow(client, drain, no_wait).await
        }
        other => unreachable!("{} does not act on a node", other.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet_of(args: &[&str]) -> Result<FleetSource, clap::Error> {
        let cli = Cli::try_parse_from(args)?;
        match cli.command {
            Command::Plan { fleet, .. } | Command::Explain { fleet, .. } => Ok(fleet.source()),
            other => panic!("not a plan: {other:?}"),
        }
    }

    #[test]
    fn start_and_stop_name_a_bundle_a_job_and_optionally_one_replica() {
        let cli = Cli::try_parse_from(["kubectl-norsk", "start", "match-final", "record", "--replica", "1"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Start(ManualJobArgs { ref bundle, ref job, replica: Some(1), no_wait: false }) if bundle == "match-final" && job == "record"
        ));
        let cli = Cli::try_parse_from(["kubectl-norsk", "stop", "match-final", "record", "--no-wait"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Stop(ManualJobArgs {
                replica: None,
                no_wait: true,
                ..
            })
        ));
        assert!(
            Cli::try_parse_from(["kubectl-norsk", "start", "match-final"]).is_err(),
            "the job is required"
        );
    }

    #[test]
    fn manager_looks_everywhere_for_every_fleet_unless_one_is_named() {
        let cli = Cli::try_parse_from(["kubectl-norsk", "manager"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Manager {
                fleet: None,
                operator_namespace: None,
                output: crate::cli::plan::Output::Table
            }
        ));
        for flag in ["--fleet", "--fleet-name"] {
            let cli = Cli::try_parse_from(["kubectl-norsk", "manager", flag, "eu", "-o", "json"]).unwrap();
            assert!(matches!(
                cli.command,
                Command::Manager { fleet: Some(ref f), output: crate::cli::plan::Output::Json, .. } if f == "eu"
            ));
        }
        let cli = Cli::try_parse_from(["kubectl-norsk", "manager", "--operator-namespace", "norsk-system"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Manager { operator_namespace: Some(ref n), .. } if n == "norsk-system"
        ));
    }

    #[test]
    fn plan_and_explain_place_on_the_live_default_fleet_unless_a_file_is_named() {
        assert_eq!(
            fleet_of(&["kubectl-norsk", "plan"]).unwrap(),
            FleetSource::Live("default".to_owned())
        );
        assert_eq!(
            fleet_of(&["kubectl-norsk", "explain", "ch1", "--fleet-name", "eu"]).unwrap(),
            FleetSource::Live("eu".to_owned())
        );
        assert_eq!(
            fleet_of(&["kubectl-norsk", "plan", "ch1", "--fleet", "fleet.yaml"]).unwrap(),
            FleetSource::File("fleet.yaml".into())
        );
        assert!(fleet_of(&["kubectl-norsk", "plan", "--fleet", "f.yaml", "--fleet-name", "eu"]).is_err());
    }
}
