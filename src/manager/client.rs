//! The Norsk Manager client the core uses: channel set-up (plaintext or TLS
//! with rustls; CA, client certificate, bearer token), one method per RPC
//! with typed errors. The event stream with reconnect lives in `stream.rs`.

use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::proto::manager as pb;
use super::wire;
use crate::model::{Bundle, BundleId, BundleJobRef, InstanceKey, JobId, NodeId, TerminalVerdict};

/// TLS material for the Manager connection, as PEM text.
#[derive(Clone, Debug, Default)]
pub struct TlsSettings {
    /// CA bundle to trust; the system roots when absent.
    pub ca_pem: Option<String>,
    /// Client certificate and key for mutual TLS.
    pub client_identity_pem: Option<(String, String)>,
    /// The server name to verify, when it differs from the URL's host.
    pub domain: Option<String>,
}

/// How to reach Manager.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    /// `http://host:port` or `https://host:port`; a bare `host:port` means
    /// plaintext.
    pub url: String,
    /// TLS, required for `https://` URLs.
    pub tls: Option<TlsSettings>,
    /// Sent as `authorization: Bearer <token>` on every call.
    pub bearer_token: Option<String>,
    /// Connection establishment timeout.
    pub connect_timeout: Duration,
    /// Per-call deadline for unary RPCs.
    pub request_timeout: Duration,
}

impl ClientSettings {
    /// Plaintext settings for a URL with the default timeouts.
    pub fn plaintext(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            tls: None,
            bearer_token: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(15),
        }
    }
}

/// Why the client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL is not a usable endpoint.
    #[error("Manager URL {url:?} is invalid: {source}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why.
        source: tonic::transport::Error,
    },
    /// The TLS material was refused.
    #[error("Manager TLS settings are invalid: {0}")]
    InvalidTls(tonic::transport::Error),
    /// The bearer token cannot be sent as a header.
    #[error("Manager bearer token contains characters not allowed in a header")]
    InvalidToken,
}

/// How a failed call should be treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpcErrorKind {
    /// Manager could not be reached or timed out: retry with backoff.
    Transient,
    /// The provider has no capacity for that shape in that region: the tier
    /// cascade should try elsewhere.
    InsufficientCapacity,
    /// The thing named does not exist.
    NotFound,
    /// It exists already with a different spec.
    AlreadyExists,
    /// Manager refused the request as invalid or out of order.
    Rejected,
}

/// A failed Manager call. An addition to the published API that Manager
/// does not serve says so in plain words ([`super::extensions`]).
#[derive(Clone, Debug, thiserror::Error)]
#[error("{}", self.describe())]
pub struct RpcError {
    /// The RPC that failed.
    pub rpc: &'static str,
    /// The gRPC status code.
    pub code: tonic::Code,
    /// Manager's message.
    pub message: String,
}

impl RpcError {
    fn from_status(rpc: &'static str, status: tonic::Status) -> Self {
        Self {
            rpc,
            code: status.code(),
            message: status.message().to_owned(),
        }
    }

    /// Whether Manager lacks this RPC altogether: an addition to the
    /// published API answered `UNIMPLEMENTED`.
    pub fn is_missing_extension(&self) -> bool {
        self.code == tonic::Code::Unimplemented && !super::extensions::is_published(self.rpc)
    }

    fn describe(&self) -> String {
        if self.is_missing_extension() {
            super::extensions::missing_message(self.rpc)
        } else {
            format!("Manager {} failed ({:?}): {}", self.rpc, self.code, self.message)
        }
    }

    /// How the failure should be treated.
    pub fn kind(&self) -> RpcErrorKind {
        use tonic::Code;
        match self.code {
            Code::ResourceExhausted => RpcErrorKind::InsufficientCapacity,
            Code::NotFound => RpcErrorKind::NotFound,
            Code::AlreadyExists => RpcErrorKind::AlreadyExists,
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::Aborted
            | Code::Internal
            | Code::Cancelled => RpcErrorKind::Transient,
            _ => RpcErrorKind::Rejected,
        }
    }

    /// A stable, low-cardinality name for metrics and Events.
    pub fn reason(&self) -> &'static str {
        match self.kind() {
            RpcErrorKind::Transient => "managerUnavailable",
            RpcErrorKind::InsufficientCapacity => "insufficientCapacity",
            RpcErrorKind::NotFound => "notFound",
            RpcErrorKind::AlreadyExists => "alreadyExists",
            RpcErrorKind::Rejected => "rejected",
        }
    }
}

/// Adds the bearer token to every call.
#[derive(Clone)]
pub struct BearerAuth(Option<MetadataValue<Ascii>>);

impl Interceptor for BearerAuth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            req.metadata_mut().insert("authorization", token.clone());
        }
        Ok(req)
    }
}

type Inner = pb::manager_client::ManagerClient<InterceptedService<Channel, BearerAuth>>;

/// What a node is created as.
#[derive(Clone, Debug)]
pub struct CreateNode {
    /// The node id, chosen by the caller so a repeated call is idempotent.
    pub node_id: NodeId,
    /// Tags (pool, tier, spare, ...).
    pub tags: std::collections::BTreeMap<String, String>,
    /// Region.
    pub region: String,
    /// OCI: the availability domain (empty: Manager chooses one of the
    /// region's, which only a Manager with the additions can).
    pub availability_domain: String,
    /// Instance type (AWS) or shape (OCI).
    pub instance_type: String,
    /// `on-demand`, `spot`, `reserved` (empty: on-demand).
    pub launch_mode: String,
    /// AWS: the root volume to launch with (an addition; a published
    /// Manager ignores it and the launch template sizes the volume).
    pub root_volume: Option<crate::model::RootVolume>,
}

/// A start of one job instance.
#[derive(Clone, Debug)]
pub struct StartJob {
    pub job_id: JobId,
    /// The instance key the instance wears.
    pub instance_key: InstanceKey,
    /// Where.
    pub node_id: NodeId,
    /// The GPU device placement chose.
    pub gpu_index: Option<u32>,
    /// Create without starting (answered by `job_prepared`).
    pub defer_start: bool,
    /// The slot told to the runtime in `NORSK_RUNTIME_ROLE`.
    pub runtime_role: String,
    /// The migration this start belongs to.
    pub migration_id: Option<String>,
}

/// A connected (lazily) Manager client. Cheap to clone; clones share the
/// channel.
#[derive(Clone)]
pub struct ManagerClient {
    inner: Inner,
    request_timeout: Duration,
    url: String,
}

impl ManagerClient {
    /// Builds the channel. The connection is made on first use and re-made
    /// by the channel after failures.
    pub fn connect_lazy(settings: &ClientSettings) -> Result<Self, ConnectError> {
        let url = if settings.url.contains("://") {
            settings.url.clone()
        } else {
            format!("http://{}", settings.url)
        };
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|source| ConnectError::InvalidUrl {
                url: settings.url.clone(),
                source,
            })?
            .connect_timeout(settings.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(20))
            .keep_alive_while_idle(true);
        if url.starts_with("https://") || settings.tls.is_some() {
            let tls = settings.tls.clone().unwrap_or_default();
            let mut config = ClientTlsConfig::new();
            config = match &tls.ca_pem {
                Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
                None => config.with_native_roots(),
            };
            if let Some((cert, key)) = &tls.client_identity_pem {
                config = config.identity(Identity::from_pem(cert, key));
            }
            if let Some(domain) = &tls.domain {
                config = config.domain_name(domain.clone());
            }
            endpoint = endpoint.tls_config(config).map_err(ConnectError::InvalidTls)?;
        }
        let token = settings
            .bearer_token
            .as_ref()
            .map(|t| {
                format!("Bearer {t}")
                    .parse::<MetadataValue<Ascii>>()
                    .map_err(|_| ConnectError::InvalidToken)
            })
            .transpose()?;
        let channel = endpoint.connect_lazy();
        Ok(Self {
            inner: pb::manager_client::ManagerClient::with_interceptor(channel, BearerAuth(token))
                .max_decoding_message_size(64 * 1024 * 1024),
            request_timeout: settings.request_timeout,
            url: settings.url.clone(),
        })
    }

    /// The address it calls, as configured.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        req.set_timeout(self.request_timeout);
        req
    }

    /// Opens the event stream (the caller handles reconnects; see
    /// `stream.rs`).
    pub async fn event_stream(
        &self,
        pending_window_s: i32,
    ) -> Result<tonic::Streaming<pb::EventStreamEvent>, RpcError> {
        let mut inner = self.inner.clone();
        inner
            .event_stream(pb::EventStreamRequest { pending_window_s })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| RpcError::from_status("EventStream", s))
    }

    /// Stores a bundle; Manager expands it into runtime jobs.
    pub async fn create_bundle(&self, bundle: &Bundle) -> Result<Vec<JobId>, RpcError> {
        let req = self.request(wire::bundle_to_pb(bundle));
        job_ids("CreateBundle", self.inner.clone().create_bundle(req)).await
    }

    /// Replaces a bundle's spec; always `state: live`.
    pub async fn update_bundle(&self, bundle: &Bundle) -> Result<Vec<JobId>, RpcError> {
        let req = self.request(update_request(bundle));
        job_ids("UpdateBundle", self.inner.clone().update_bundle(req)).await
    }

    /// Starts Manager's stop-then-delete saga for a bundle.
    pub async fn delete_bundle(&self, bundle: &BundleId) -> Result<(), RpcError> {
        let req = self.request(pb::BundleId {
            bundle_id: bundle.0.clone(),
        });
        unit("DeleteBundle", self.inner.clone().delete_bundle(req)).await
    }

    /// Stores a plain (non-bundle) job, active: what a node service runs on
    /// one node. Creating the identical job again is a no-op on Manager.
    pub async fn create_job(
        &self,
        job: &JobId,
        template: &str,
        tags: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), RpcError> {
        let req = self.request(pb::Job {
            job_id: Some(wire::job_id_to_pb(job)),
            tags: tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            template: template.to_owned(),
            state: pb::job::JobState::Active as i32,
            ..Default::default()
        });
        unit("CreateJob", self.inner.clone().create_job(req)).await
    }

    /// `CreateJob` of a job as given (the port's expansion of a bundle on a
    /// Manager without a bundle store).
    pub async fn create_job_as(&self, job: pb::Job) -> Result<(), RpcError> {
        unit("CreateJob", self.inner.clone().create_job(self.request(job))).await
    }

    /// `UpdateJob` (published): replaces a stored job.
    pub async fn update_job(&self, job: pb::Job) -> Result<(), RpcError> {
        unit("UpdateJob", self.inner.clone().update_job(self.request(job))).await
    }

    /// `DeleteJob` (published).
    pub async fn delete_job(&self, job: &JobId) -> Result<(), RpcError> {
        let req = self.request(wire::job_id_to_pb(job));
        unit("DeleteJob", self.inner.clone().delete_job(req)).await
    }

    /// Whether Manager serves the addition `method`: it is called with an
    /// empty request, which a Manager serving it refuses without effect and
    /// one without it answers `UNIMPLEMENTED`. An error is a Manager that
    /// did not answer the question: unreachable, or refusing the caller.
    pub async fn probe(&self, method: &'static str) -> Result<bool, RpcError> {
        let mut inner = self.inner.clone();
        // Calls `rpc` with an empty `request`; only whether it answered counts.
        macro_rules! empty_call {
            ($rpc:ident, $request:ty) => {
                inner.$rpc(self.request(<$request>::default())).await.map(drop)
            };
        }
        let answer = match method {
            "DeleteBundle" => empty_call!(delete_bundle, pb::BundleId),
            "UpdateNodeTags" => empty_call!(update_node_tags, pb::UpdateNodeTagsRequest),
            "StartPreparedJob" => empty_call!(start_prepared_job, pb::StartPreparedJobRequest),
            "SendMigrationSignal" => empty_call!(send_migration_signal, pb::MigrationSignalRequest),
            "PrefetchImages" => empty_call!(prefetch_images, pb::PrefetchImagesRequest),
            "SetTerminalVerdict" => empty_call!(set_terminal_verdict, pb::SetTerminalVerdictRequest),
            _ => return Ok(super::extensions::is_published(method)),
        };
        match answer {
            Err(status) if status.code() == tonic::Code::Unimplemented => Ok(false),
            // Unreachable, or refused before the method was looked at (a
            // wrong token): Manager has not said whether it serves it.
            Err(status)
                if RpcError::from_status(method, status.clone()).kind() == RpcErrorKind::Transient
                    || matches!(
                        status.code(),
                        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
                    ) =>
            {
                Err(RpcError::from_status(method, status))
            }
            _ => Ok(true),
        }
    }

    /// Activates a dormant (`startMode: manual`) job.
    pub async fn start_bundle_job(&self, job: &BundleJobRef) -> Result<(), RpcError> {
        let req = self.request(job_ref_to_pb(job));
        unit("StartBundleJob", self.inner.clone().start_bundle_job(req)).await
    }

    /// Flips a job back to dormant.
    pub async fn stop_bundle_job(&self, job: &BundleJobRef) -> Result<(), RpcError> {
        let req = self.request(job_ref_to_pb(job));
        unit("StopBundleJob", self.inner.clone().stop_bundle_job(req)).await
    }

    /// `CompleteJob` (published): the job's window is over; Manager stops
    /// its instances and moves it to `POST`.
    pub async fn complete_job(&self, job: &JobId) -> Result<(), RpcError> {
        let req = self.request(wire::job_id_to_pb(job));
        unit("CompleteJob", self.inner.clone().complete_job(req)).await
    }

    /// Starts (or, with `defer_start`, prepares) an instance on a node.
    pub async fn start_job(&self, start: &StartJob) -> Result<(), RpcError> {
        let req = self.request(pb::StartJobRequest {
            job_id: Some(wire::job_id_to_pb(&start.job_id)),
            role: start.instance_key.0.clone(),
            node_id: Some(wire::node_id_to_pb(&start.node_id)),
            gpu_index: start.gpu_index,
            defer_start: start.defer_start,
            runtime_role: start.runtime_role.clone(),
            migration_id: start.migration_id.clone().unwrap_or_default(),
        });
        unit("StartJob", self.inner.clone().start_job(req)).await
    }

    /// Starts an instance created with `defer_start`.
    pub async fn start_prepared_job(&self, job: &JobId, key: &InstanceKey, node: &NodeId) -> Result<(), RpcError> {
        let req = self.request(pb::StartPreparedJobRequest {
            job_id: Some(wire::job_id_to_pb(job)),
            role: key.0.clone(),
            node_id: Some(wire::node_id_to_pb(node)),
        });
        unit("StartPreparedJob", self.inner.clone().start_prepared_job(req)).await
    }

    /// Stops one instance.
    pub async fn stop_job(&self, job: &JobId, key: &InstanceKey, node: &NodeId) -> Result<(), RpcError> {
        let req = self.request(pb::StopJobRequest {
            job_id: Some(wire::job_id_to_pb(job)),
            role: key.0.clone(),
            node_id: Some(wire::node_id_to_pb(node)),
        });
        unit("StopJob", self.inner.clone().stop_job(req)).await
    }

    /// Provisions an EC2 node.
    pub async fn create_aws_node(&self, node: &CreateNode) -> Result<(), RpcError> {
        let req = self.request(pb::CreateAwsNodeRequest {
            node_id: Some(wire::node_id_to_pb(&node.node_id)),
            tags: node.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            region: node.region.clone(),
            instance_type: node.instance_type.clone(),
            launch_mode: node.launch_mode.clone(),
            root_volume_gib: node.root_volume.as_ref().map_or(0, |v| v.size_gib),
            root_volume_type: node
                .root_volume
                .as_ref()
                .and_then(|v| v.volume_type.clone())
                .unwrap_or_default(),
            ..Default::default()
        });
        unit("CreateAwsNode", self.inner.clone().create_aws_node(req)).await
    }

    /// Provisions an OCI node.
    pub async fn create_oci_node(&self, node: &CreateNode) -> Result<(), RpcError> {
        let req = self.request(pb::CreateOciNodeRequest {
            node_id: Some(wire::node_id_to_pb(&node.node_id)),
            tags: node.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            shape: node.instance_type.clone(),
            availability_domain: node.availability_domain.clone(),
            region: node.region.clone(),
            launch_mode: node.launch_mode.clone(),
            ..Default::default()
        });
        unit("CreateOciNode", self.inner.clone().create_oci_node(req)).await
    }

    /// Terminates a node.
    pub async fn terminate_node(&self, node: &NodeId) -> Result<(), RpcError> {
        let req = self.request(wire::node_id_to_pb(node));
        unit("TerminateNode", self.inner.clone().terminate_node(req)).await
    }

    /// Sets and removes node tags.
    pub async fn update_node_tags(
        &self,
        node: &NodeId,
        set: &std::collections::BTreeMap<String, String>,
        remove: &[String],
    ) -> Result<(), RpcError> {
        let req = self.request(pb::UpdateNodeTagsRequest {
            node_id: Some(wire::node_id_to_pb(node)),
            set: set.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            remove: remove.to_vec(),
        });
        unit("UpdateNodeTags", self.inner.clone().update_node_tags(req)).await
    }

    /// Asks a node to pull images.
    pub async fn prefetch_images(&self, node: &NodeId, images: &[String]) -> Result<(), RpcError> {
        let req = self.request(pb::PrefetchImagesRequest {
            node_id: Some(wire::node_id_to_pb(node)),
            images: images.to_vec(),
        });
        unit("PrefetchImages", self.inner.clone().prefetch_images(req)).await
    }

    /// Relays one migration step.
    pub async fn send_migration_signal(&self, signal: pb::MigrationSignalRequest) -> Result<(), RpcError> {
        let req = self.request(signal);
        unit("SendMigrationSignal", self.inner.clone().send_migration_signal(req)).await
    }

    /// Records a terminal verdict for a bundle (or, with a job, a dropped
    /// job), decided for the bundle's `generation`: Manager refuses it once
    /// the bundle has been updated past it (0: unconditional).
    pub async fn set_terminal_verdict(
        &self,
        bundle: &BundleId,
        job: Option<&JobId>,
        verdict: &TerminalVerdict,
        generation: u64,
    ) -> Result<(), RpcError> {
        let req = self.request(pb::SetTerminalVerdictRequest {
            bundle_id: bundle.0.clone(),
            job_id: job.map(wire::job_id_to_pb),
            verdict: Some(wire::verdict_to_pb(verdict)),
            generation,
        });
        unit("SetTerminalVerdict", self.inner.clone().set_terminal_verdict(req)).await
    }
}

/// Awaits a call whose answer carries nothing, naming the RPC in its error.
async fn unit<T>(
    rpc: &'static str,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<(), RpcError> {
    call.await.map(drop).map_err(|s| RpcError::from_status(rpc, s))
}

/// The runtime jobs a bundle call's acknowledgement names.
async fn job_ids(
    rpc: &'static str,
    call: impl std::future::Future<Output = Result<tonic::Response<pb::BundleAck>, tonic::Status>>,
) -> Result<Vec<JobId>, RpcError> {
    let ack = call.await.map_err(|s| RpcError::from_status(rpc, s))?.into_inner();
    Ok(ack.job_ids.into_iter().map(|j| JobId(j.job_id)).collect())
}

fn job_ref_to_pb(job: &BundleJobRef) -> pb::BundleJobRef {
    pb::BundleJobRef {
        bundle_id: job.bundle_id.0.clone(),
        replica_index: job.replica_index,
        job_name: job.job_name.clone(),
    }
}

/// What `UpdateBundle` sends: the spec with `state: live` and no verdict,
/// whatever the bundle was — a spec update is a revival by definition.
fn update_request(bundle: &Bundle) -> pb::Bundle {
    pb::Bundle {
        state: pb::BundleState::Live as i32,
        terminal_verdict: None,
        ..wire::bundle_to_pb(bundle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BundleState, TerminalVerdict, VerdictKind};

    #[test]
    fn an_update_sends_state_live_and_no_verdict_whatever_the_bundle_was() {
        let bundle = Bundle {
            bundle_id: "ns/ch1".into(),
            state: BundleState::Deleting,
            terminal_verdict: Some(TerminalVerdict {
                kind: VerdictKind::Broken,
                reason: "crash loop".into(),
                at: None,
            }),
            ..Bundle::default()
        };
        let sent = update_request(&bundle);
        assert_eq!(sent.state, pb::BundleState::Live as i32, "state: live");
        assert_eq!(sent.terminal_verdict, None);
        assert_eq!(sent.bundle_id, "ns/ch1");
    }
}
