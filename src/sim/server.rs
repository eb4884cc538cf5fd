//! Starting and stopping the simulator: one tonic server on one listener
//! serving both the Manager service and the admin service, plus the task
//! that fires the world's timers. [`Simulator::start`] is what tests,
//! benchmarks, the demo and `norsk-auto-manager sim` call.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Status;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use super::RequestError;
use super::admin_service::AdminService;
use super::catalog::{Catalog, CatalogError};
use super::clock::valid_scale;
use super::manager_service::ManagerService;
use super::published::Api;
use super::world::World;
use crate::manager::proto::manager::manager_server::ManagerServer;
use crate::manager::proto::sim_admin::{self, sim_admin_server::SimAdminServer};
use crate::manager::wire::inventory_to_pb;
use crate::model::{NodeId, NodeInventory};

/// How the simulator starts.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Where to listen (port 0 picks a free port; see [`SimHandle::addr`]).
    pub listen: SocketAddr,
    /// Seeds every random choice: latencies, zones, addresses.
    pub seed: u64,
    /// Simulated seconds per real second; every delay is divided by it.
    pub time_scale: f64,
    /// The clouds' regions and instance types.
    pub catalog: Catalog,
    /// Cluster (`local-servers`) nodes registered at start.
    pub cluster_nodes: Vec<ClusterNode>,
    /// Serve TLS instead of plaintext.
    pub tls: Option<SimTls>,
    /// Require `authorization: Bearer <token>` on every Manager call (the
    /// admin service stays open: it is a test tool).
    pub bearer_token: Option<String>,
    /// Serve only the published Manager API (1.0.384): every AutoManager
    /// extension answers `UNIMPLEMENTED`, no message carries an added field
    /// or event, and the world shows a worker's rejection or a provider's
    /// notice as a published Manager does (see [`super::published`]).
    pub published_api_only: bool,
}

/// TLS for the simulator, as PEM text.
#[derive(Debug, Clone)]
pub struct SimTls {
    /// The serving certificate chain.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
    /// When set, clients must present a certificate signed by this CA.
    pub client_ca_pem: Option<String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            seed: 0,
            time_scale: 1.0,
            catalog: Catalog::builtin(),
            cluster_nodes: vec![],
            tls: None,
            bearer_token: None,
            published_api_only: false,
        }
    }
}

/// A cluster node to pre-register (`sim --cluster FILE` is a YAML list of
/// these).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterNode {
    /// The node id.
    pub id: String,
    /// Its tags (`pool`, `tier`, ...).
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// What its worker advertises.
    pub inventory: NodeInventory,
}

impl ClusterNode {
    /// Reads a YAML (or JSON) list of cluster nodes.
    pub fn load_all(path: &Path) -> Result<Vec<ClusterNode>, StartError> {
        let text = std::fs::read_to_string(path).map_err(|source| StartError::ReadCluster {
            path: path.to_owned(),
            source,
        })?;
        yaml_serde::from_str(&text).map_err(|source| StartError::ParseCluster {
            path: path.to_owned(),
            source,
        })
    }

    /// The admin request that registers it.
    pub fn to_request(&self) -> sim_admin::RegisterNodeRequest {
        sim_admin::RegisterNodeRequest {
            node_id: self.id.clone(),
            tags: self.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            inventory: Some(inventory_to_pb(&NodeId(self.id.clone()), &self.inventory)),
        }
    }
}

/// Why the simulator could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The time scale is zero, negative or not a number.
    #[error("invalid time scale {0}: it must be a positive number")]
    TimeScale(f64),
    /// The catalogue is inconsistent.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The cluster file could not be read.
    #[error("failed to read cluster nodes {path}: {source}")]
    ReadCluster {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The cluster file is not a list of nodes.
    #[error("failed to parse cluster nodes {path}: {source}")]
    ParseCluster {
        /// The file.
        path: PathBuf,
        /// Why.
        source: yaml_serde::Error,
    },
    /// A cluster node was refused.
    #[error("failed to register cluster node {id:?}: {source}")]
    RegisterCluster {
        /// The node.
        id: String,
        /// Why.
        source: RequestError,
    },
    /// The listener could not be bound.
    #[error("failed to listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A file named on the command line could not be read.
    #[error("failed to read {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The TLS material was refused.
    #[error("invalid TLS settings: {0}")]
    Tls(tonic::transport::Error),
    /// The bearer token cannot be compared with a header value.
    #[error("the bearer token contains characters not allowed in a header")]
    Token,
    /// The gRPC server failed.
    #[error("simulator server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// The server task panicked or was cancelled.
    #[error("simulator server task ended abnormally: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// State shared by both services and the timer task.
pub(crate) struct Shared {
    world: Mutex<World>,
    wake: Arc<Notify>,
    dropped: watch::Sender<u64>,
    shutdown: watch::Receiver<bool>,
}

impl Shared {
    /// The world, locked. A panic while it was held (a bug) must not stop
    /// the simulator from serving, so a poisoned lock is used as is.
    pub fn lock(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes the timer task (the next deadline or the scale changed).
    pub fn wake_timers(&self) {
        self.wake.notify_one();
    }

    /// Ends every open event stream with UNAVAILABLE.
    pub fn drop_streams(&self) {
        self.dropped.send_modify(|generation| *generation += 1);
    }

    /// A receiver that changes when streams are dropped.
    pub fn drop_signal(&self) -> watch::Receiver<u64> {
        self.dropped.subscribe()
    }

    /// A receiver that changes when the simulator shuts down.
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }

    /// Applies the injected fault for `rpc`, if any: waits its delay, then
    /// fails the call when the draw says so.
    pub async fn fault(&self, rpc: &str) -> Result<(), Status> {
        let verdict = self.lock().rpc_fault(rpc);
        if !verdict.delay.is_zero() {
            tokio::time::sleep(verdict.delay).await;
        }
        if verdict.fail {
            return Err(RequestError::InjectedFault { rpc: rpc.to_owned() }.into());
        }
        Ok(())
    }
}

/// The simulator.
pub struct Simulator;

impl Simulator {
    /// Binds `config.listen`, registers the cluster nodes and serves the
    /// Manager and admin services until [`SimHandle::shutdown`].
    pub async fn start(config: SimConfig) -> Result<SimHandle, StartError> {
        if !valid_scale(config.time_scale) {
            return Err(StartError::TimeScale(config.time_scale));
        }
        config.catalog.validate()?;
        let wake = Arc::new(Notify::new());
        let api = if config.published_api_only {
            Api::Published
        } else {
            Api::Full
        };
        let mut world = World::new(config.catalog, config.seed, config.time_scale, wake.clone(), api);
        for node in &config.cluster_nodes {
            world
                .register_node(node.to_request())
                .map_err(|source| StartError::RegisterCluster {
                    id: node.id.clone(),
                    source,
                })?;
        }
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| StartError::Bind {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            world: Mutex::new(world),
            wake,
            dropped: watch::channel(0).0,
            shutdown: shutdown_rx.clone(),
        });
        let timers = tokio::spawn(run_timers(shared.clone(), shutdown_rx.clone()));
        let mut until_shutdown = shutdown_rx;
        let mut builder = tonic::transport::Server::builder();
        let scheme = if let Some(tls) = &config.tls {
            let mut server_tls = ServerTlsConfig::new().identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem));
            if let Some(ca) = &tls.client_ca_pem {
                server_tls = server_tls.client_ca_root(Certificate::from_pem(ca));
            }
            builder = builder.tls_config(server_tls).map_err(StartError::Tls)?;
            "https"
        } else {
            "http"
        };
        let expected: Option<MetadataValue<Ascii>> = config
            .bearer_token
            .as_ref()
            .map(|t| format!("Bearer {t}").parse().map_err(|_| StartError::Token))
            .transpose()?;
        let check_token = move |req: tonic::Request<()>| match &expected {
            Some(token) if req.metadata().get("authorization") != Some(token) => {
                Err(Status::unauthenticated("missing or wrong bearer token"))
            }
            _ => Ok(req),
        };
        let server = builder
            .layer(super::published::PublishedOnlyLayer { shared: shared.clone() })
            .add_service(ManagerServer::with_interceptor(
                ManagerService::new(shared.clone()),
                check_token,
            ))
            .add_service(SimAdminServer::new(AdminService::new(shared)))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
                // Either the flag flips or the sender is gone: both mean stop.
                let _ = until_shutdown.changed().await;
            });
        let server = tokio::spawn(server);
        Ok(SimHandle {
            addr,
            scheme,
            shutdown: shutdown_tx,
            server,
            timers,
        })
    }
}

/// A running simulator. Dropping the handle stops it too, without waiting.
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    scheme: &'static str,
    shutdown: watch::Sender<bool>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    timers: JoinHandle<()>,
}

impl SimHandle {
    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL a client connects to (`http://127.0.0.1:6789`).
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Ends every stream, stops serving and waits until the server is done.
    pub async fn shutdown(self) -> Result<(), StartError> {
        // The receivers may already be gone if the server failed; the join
        // below reports that.
        let _ = self.shutdown.send(true);
        self.timers.await?;
        self.server.await??;
        Ok(())
    }
}

/// Fires due timers, sleeping (in real time) until the next one or until
/// woken because an earlier one was scheduled or the scale changed.
async fn run_timers(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let wait = shared.lock().fire_due();
        let sleep = async {
            match wait {
                Some(wait) => tokio::time::sleep(wait).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sleep => {}
            _ = shared.wake.notified() => {}
            _ = shutdown.changed() => return,
        }
    }
}
