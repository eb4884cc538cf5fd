//! `norsk-auto-manager sim`: serve the Manager simulator until Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::sim::{Catalog, ClusterNode, SimConfig, SimTls, Simulator, StartError};

/// Arguments of `sim`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to serve the Manager and admin services on.
    #[arg(long, default_value = "127.0.0.1:6789")]
    pub listen: SocketAddr,
    /// Seed for every random choice (latencies, zones, addresses).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Simulated seconds per real second; every delay is divided by it.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// A YAML or JSON catalogue of regions and instance types replacing the
    /// built-in one.
    #[arg(long)]
    pub catalog: Option<PathBuf>,
    /// A YAML list of cluster nodes ({id, tags, inventory}) to register at
    /// start.
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// Serve TLS with this PEM certificate chain (needs --tls-key).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this PEM CA (mutual TLS).
    #[arg(long, requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,
    /// Require `authorization: Bearer <token>` on Manager calls.
    #[arg(long, env = "NORSK_SIM_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Serve only the published Norsk Manager API (1.0.384), as an older
    /// Manager does: every AutoManager extension answers UNIMPLEMENTED, no
    /// message carries an added field or event, added request fields are
    /// ignored, and a worker's rejection shows as the job failing.
    #[arg(long)]
    pub published_api_only: bool,
}

fn read(path: &PathBuf) -> Result<String, StartError> {
    std::fs::read_to_string(path).map_err(|source| StartError::ReadFile {
        path: path.clone(),
        source,
    })
}

/// Runs the simulator until interrupted; prints the URL it serves on.
pub async fn run(args: Args) -> ExitCode {
    super::exit_code(serve(args).await)
}

async fn serve(args: Args) -> Result<(), StartError> {
    let catalog = match &args.catalog {
        Some(path) => Catalog::load(path)?,
        None => Catalog::builtin(),
    };
    let cluster_nodes = match &args.cluster {
        Some(path) => ClusterNode::load_all(path)?,
        None => vec![],
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(SimTls {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
            client_ca_pem: args.client_ca.as_ref().map(read).transpose()?,
        }),
        _ => None,
    };
    let handle = Simulator::start(SimConfig {
        listen: args.listen,
        seed: args.seed,
        time_scale: args.time_scale,
        catalog,
        cluster_nodes,
        tls,
        bearer_token: args.token,
        published_api_only: args.published_api_only,
    })
    .await?;
    println!("{}", handle.url());
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("error: cannot wait for Ctrl-C ({e}); stopping");
    }
    handle.shutdown().await
}
