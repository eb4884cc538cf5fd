//! `norsk-auto-manager operator`: the Kubernetes operator process. Its
//! settings come from a file (the chart renders it into a ConfigMap) plus
//! flags and environment (Manager URL, TLS files, token, Lease, addresses),
//! validated at start with every problem listed at once. Pools and hot
//! spares are not settings here: they are the `PlacementPool` and
//! `HotSparePolicy` resources.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use serde::Deserialize;
use tokio::sync::watch;

use super::documents;
use crate::automanager::{AutoSettings, RunOptions, validate_auto_settings};
use crate::controller::api_server;
use crate::controller::leader::LeaseSettings;
use crate::controller::process;
use crate::controller::session::SessionSettings;
use crate::decide::node_status::DEFAULT_FLEET;
use crate::manager::client::{ClientSettings, TlsSettings};
use crate::telemetry::{self, Health, OperatorMetrics};

/// The longest process identity: it names the Lease's field manager
/// (`norsk-auto-manager/leader/<identity>`), which the API server caps at
/// 128 characters.
const MAX_IDENTITY: usize = 100;

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Arguments of `operator`; each flag also reads an environment variable.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Args {
    /// The settings file (YAML): `settings` (AutoSettings without pools and
    /// hot spares), optional `lease` and `metricsAddr`.
    #[arg(long, env = "NORSK_OPERATOR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Manager's address; overrides `settings.url`.
    #[arg(long, env = "NORSK_MANAGER_URL")]
    pub manager_url: Option<String>,
    /// PEM CA bundle to verify Manager with (system roots when absent).
    #[arg(long, env = "NORSK_MANAGER_CA_FILE")]
    pub manager_ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (with --manager-key-file).
    #[arg(long, env = "NORSK_MANAGER_CERT_FILE")]
    pub manager_cert_file: Option<PathBuf>,
    /// PEM client key for mutual TLS (with --manager-cert-file).
    #[arg(long, env = "NORSK_MANAGER_KEY_FILE")]
    pub manager_key_file: Option<PathBuf>,
    /// Bearer token sent to Manager.
    #[arg(long, env = "NORSK_MANAGER_TOKEN", hide_env_values = true)]
    pub manager_token: Option<String>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[arg(long, env = "NORSK_METRICS_ADDR")]
    pub metrics_addr: Option<String>,
    /// The Lease's namespace, where the leader also publishes its Manager
    /// status (a ConfigMap).
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// This process's identity in the election (the pod name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// The fleet (one Manager) this operator mirrors into `NorskNode`s.
    /// Its nodes' resources are named after the node ids in the default
    /// fleet and `<fleet>.<node id>` in any other, so several operators
    /// can share a cluster.
    #[arg(long, env = "NORSK_FLEET", default_value = DEFAULT_FLEET)]
    pub fleet: Option<String>,
    /// Reconcile only the `Bundle`s of this namespace (all when absent).
    #[arg(long, env = "NORSK_BUNDLE_NAMESPACE")]
    pub bundle_namespace: Option<String>,
    /// How logs are written.
    #[arg(long, value_enum, default_value = "text", env = "NORSK_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
}

/// The Lease section of the settings file.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct LeaseFile {
    /// The Lease's namespace (default: `POD_NAMESPACE`, then `default`).
    pub namespace: Option<String>,
    /// The Lease's name.
    pub name: String,
    /// Seconds the Lease is valid without renewal.
    pub duration_seconds: u64,
    /// Seconds before expiry the holder renews.
    pub grace_seconds: u64,
}

impl Default for LeaseFile {
    fn default() -> Self {
        Self {
            namespace: None,
            name: "norsk-auto-manager".to_owned(),
            duration_seconds: 15,
            grace_seconds: 5,
        }
    }
}

/// The settings file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct OperatorFile {
    /// The core's settings.
    pub settings: AutoSettings,
    /// Leader election.
    pub lease: LeaseFile,
    /// Where telemetry is served (default `0.0.0.0:8080`).
    pub metrics_addr: Option<String>,
    /// The server name to verify Manager's certificate against.
    pub manager_tls_domain: Option<String>,
}

/// Everything the process runs with, validated.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// The Lease.
    pub lease: LeaseSettings,
    /// The core and its Manager connection.
    pub session: SessionSettings,
    /// The telemetry address.
    pub metrics_addr: SocketAddr,
}

/// Every problem found in the settings, listed at once.
#[derive(Debug, thiserror::Error)]
#[error("invalid operator settings:\n  - {}", .0.join("\n  - "))]
pub struct ConfigErrors(pub Vec<String>);

/// Resolves the file, flags and environment into a validated config,
/// reading files with `read` (so it can be tested without a disk).
pub fn resolve(args: &Args, read: impl Fn(&Path) -> std::io::Result<String>) -> Result<OperatorConfig, ConfigErrors> {
    let mut errors = Vec::new();
    let file = match &args.config {
        Some(path) => match read(path).map(|text| documents::strict::decode::<OperatorFile>(&text)) {
            Ok(Ok(file)) => file,
            Ok(Err(problems)) => {
                errors.extend(problems.iter().map(|p| format!("{}: {p}", path.display())));
                OperatorFile::default()
            }
            Err(e) => {
                errors.push(format!("{}: {e}", path.display()));
                OperatorFile::default()
            }
        },
        None => OperatorFile::default(),
    };
    let mut settings = file.settings;
    if let Some(url) = &args.manager_url {
        settings.url.clone_from(url);
    }
    if !settings.placement_pools.is_empty() {
        errors.push("settings.placementPools: pools are PlacementPool resources, not settings".to_owned());
    }
    if !settings.hot_spares.is_empty() {
        errors.push("settings.hotSpares: hot spares are HotSparePolicy resources, not settings".to_owned());
    }
    if let Err(e) = validate_auto_settings(settings.clone()) {
        errors.extend(e.errors.iter().map(|issue| format!("settings.{issue}")));
    }
    let mut pem = |flag: &str, path: &Option<PathBuf>| {
        path.as_ref().and_then(|p| match read(p) {
            Ok(text) => Some(text),
            Err(e) => {
                errors.push(format!("{flag} {}: {e}", p.display()));
                None
            }
        })
    };
    let ca = pem("--manager-ca-file", &args.manager_ca_file);
    let cert = pem("--manager-cert-file", &args.manager_cert_file);
    let key = pem("--manager-key-file", &args.manager_key_file);
    if args.manager_cert_file.is_some() != args.manager_key_file.is_some() {
        errors.push("--manager-cert-file and --manager-key-file go together (mutual TLS)".to_owned());
    }
    let tls_wanted = args.manager_ca_file.is_some() || args.manager_cert_file.is_some();
    let tls = (tls_wanted || settings.url.starts_with("https://")).then(|| TlsSettings {
        ca_pem: ca,
        client_identity_pem: cert.zip(key),
        domain: file.manager_tls_domain.clone(),
    });
    let metrics_text = args
        .metrics_addr
        .clone()
        .or(file.metrics_addr)
        .unwrap_or_else(|| "0.0.0.0:8080".to_owned());
    let metrics_addr = metrics_text.parse::<SocketAddr>().map_err(|e| {
        errors.push(format!("metricsAddr {metrics_text:?}: {e}"));
    });
    let lease = file.lease;
    if lease.duration_seconds == 0 || lease.grace_seconds == 0 || lease.grace_seconds >= lease.duration_seconds {
        errors.push(format!(
            "lease: graceSeconds ({}) must be positive and below durationSeconds ({})",
            lease.grace_seconds, lease.duration_seconds
        ));
    }
    if lease.name.trim().is_empty() {
        errors.push("lease.name: a Lease needs a name".to_owned());
    }
    let identity = args.identity.clone().unwrap_or_default();
    if identity.trim().is_empty() {
        errors.push("--identity (POD_NAME): every operator process needs a unique identity".to_owned());
    } else if identity.len() > MAX_IDENTITY {
        // It names the Lease's field manager, which the API server caps.
        errors.push(format!(
            "--identity (POD_NAME): at most {MAX_IDENTITY} characters, not {}",
            identity.len()
        ));
    }
    let Ok(metrics_addr) = metrics_addr else {
        return Err(ConfigErrors(errors));
    };
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    let manager = ClientSettings {
        tls,
        bearer_token: args.manager_token.clone(),
        ..ClientSettings::plaintext(settings.url.clone())
    };
    // The operator's own namespace: its Lease and its Manager status.
    let namespace = args
        .lease_namespace
        .clone()
        .or(lease.namespace)
        .unwrap_or_else(|| "default".to_owned());
    Ok(OperatorConfig {
        lease: LeaseSettings {
            namespace: namespace.clone(),
            name: lease.name,
            identity: identity.clone(),
            duration_s: lease.duration_seconds,
            grace_s: lease.grace_seconds,
        },
        session: SessionSettings {
            settings,
            manager,
            options: RunOptions::default(),
            instance: Some(identity),
            bundle_namespace: args.bundle_namespace.clone(),
            fleet: args.fleet.clone().unwrap_or_else(|| DEFAULT_FLEET.to_owned()),
            status_namespace: namespace,
            // Set by `run`, which follows the file.
            template_images: None,
        },
        metrics_addr,
    })
}

/// kube's client logs every request that fails as an error of its own (an
/// API server outage became thousands of lines a second), and each watch
/// the API server drops as a warning: the operator says an outage once
/// instead (`controller::api_server`), and the watches resume by
/// themselves. `RUST_LOG` naming `kube_client` brings kube's lines back.
const KUBE_CLIENT_QUIET: [&str; 2] = ["kube_client::client::builder=off", "kube_client::client=error"];

fn init_logs(format: LogFormat) {
    let asked = std::env::var(tracing_subscriber::EnvFilter::DEFAULT_ENV).unwrap_or_default();
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if !asked.contains("kube_client") {
        for directive in KUBE_CLIENT_QUIET.iter().filter_map(|d| d.parse().ok()) {
            filter = filter.add_directive(directive);
        }
    }
    // Logs go to stderr, as Kubernetes components write them; colour only
    // on a terminal: a file or a log collector gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    // A second initialisation (tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Runs the operator until Ctrl-C or SIGTERM.
pub async fn run(args: Args) -> ExitCode {
    init_logs(args.log_format.unwrap_or(LogFormat::Text));
    let config = match resolve(&args, |p| std::fs::read_to_string(p)) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        revision = telemetry::REVISION,
        identity = %config.lease.identity,
        manager = %config.session.manager.url,
        fleet = %config.session.fleet,
        bundle_namespace = config.session.bundle_namespace.as_deref().unwrap_or("(all)"),
        lease = %format!("{}/{}", config.lease.namespace, config.lease.name),
        metrics = %config.metrics_addr,
        "norsk-auto-manager operator starting"
    );
    let client = match kube::Config::infer().await {
        Ok(kube_config) => api_server::client(kube_config),
        Err(e) => Err(kube::Error::InferConfig(e)),
    };
    let client = match client {
        Ok(client) => client,
        Err(e) => {
            eprintln!("error: no Kubernetes client: {e}");
            return ExitCode::FAILURE;
        }
    };
    let metrics = Arc::new(OperatorMetrics::new());
    let health = Arc::new(Health::default());
    let listener = match telemetry::bind(config.metrics_addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("error: cannot serve telemetry on {}: {e}", config.metrics_addr);
            return ExitCode::FAILURE;
        }
    };
    let server = tokio::spawn(telemetry::serve(listener, metrics.clone(), health.clone()));
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    // `settings.templateImages` follows the file while the process runs.
    let mut config = config;
    let (images, images_rx) = watch::channel(config.session.settings.template_images.clone());
    config.session.template_images = Some(images_rx);
    let file = tokio::spawn(super::settings_file::follow(args.clone(), config.clone(), images));
    let result = process::run(client, config.lease, config.session, metrics, health, stopped).await;
    file.abort();
    server.abort();
    super::exit_code(result)
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = term => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(config: &str) -> Args {
        Args {
            config: Some(PathBuf::from(config)),
            identity: Some("operator-0".to_owned()),
            ..Args::default()
        }
    }

    #[test]
    fn every_settings_problem_is_listed_at_once() {
        let file = "settings:\n  url: ''\n  rejectionEscalationCount: 0\nlease: {durationSeconds: 5, graceSeconds: 5}\nmetricsAddr: nowhere\n";
        let mut a = args("operator.yaml");
        a.identity = None;
        a.manager_cert_file = Some(PathBuf::from("cert.pem"));
        let e = resolve(&a, |p| {
            if p == Path::new("operator.yaml") {
                Ok(file.to_owned())
            } else {
                Err(std::io::Error::from(std::io::ErrorKind::NotFound))
            }
        })
        .unwrap_err();
        let text = e.to_string();
        for expected in [
            "settings.url",
            "settings.rejectionEscalationCount",
            "--manager-cert-file cert.pem",
            "go together",
            "metricsAddr",
            "graceSeconds",
            "--identity",
        ] {
            assert!(text.contains(expected), "{expected:?} missing from {text}");
        }
    }

    #[test]
    fn an_identity_too_long_to_name_the_lease_field_manager_is_refused() {
        let mut a = args("operator.yaml");
        a.identity = Some("p".repeat(MAX_IDENTITY + 1));
        let e = resolve(&a, |_| Ok(String::new())).unwrap_err();
        assert!(e.to_string().contains("at most 100 characters"), "{e}");
        a.identity = Some("p".repeat(MAX_IDENTITY));
        let problems = resolve(&a, |_| Ok(String::new()))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!problems.contains("--identity"), "{problems}");
    }

    #[test]
    fn flags_override_the_file_and_tls_follows_the_ca_file() {
        let mut a = args("operator.yaml");
        a.manager_url = Some("https://manager:6790".to_owned());
        a.manager_ca_file = Some(PathBuf::from("ca.pem"));
        a.manager_token = Some("secret".to_owned());
        let config = resolve(&a, |p| {
            Ok(if p == Path::new("ca.pem") {
                "CA"
            } else {
                "settings: {url: 'localhost:1'}\n"
            }
            .to_owned())
        })
        .unwrap();
        assert_eq!(config.session.manager.url, "https://manager:6790");
        assert_eq!(config.session.manager.tls.unwrap().ca_pem.as_deref(), Some("CA"));
        assert_eq!(config.session.manager.bearer_token.as_deref(), Some("secret"));
        assert_eq!(config.lease.identity, "operator-0");
    }

    #[test]
    fn pools_in_the_settings_file_are_refused() {
        let file = "settings:\n  url: localhost:1\n  placementPools: [{name: p, tiers: [{name: t, kind: local-servers, scaleOut: fixed}]}]\n";
        let e = resolve(&args("f"), |_| Ok(file.to_owned())).unwrap_err();
        assert!(e.to_string().contains("PlacementPool resources"), "{e}");
    }
}
