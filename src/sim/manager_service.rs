//! The `norsk.api.manager.Manager` gRPC service over the simulated world.
//! Each call applies any injected RPC fault, then runs one world operation
//! under the lock; the rules live in the world, not here. When the simulator
//! serves the published API only, the requests and answers of the published
//! RPCs pass through [`Api::carry`] on their way in and out, so the world
//! never sees an added field and a client never receives one.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::RequestError;
use super::published::{Api, Published};
use super::server::Shared;
use super::stream::{self, EventStream, StatusStream};
use super::world::World;
use crate::manager::proto::common;
use crate::manager::proto::manager::{self as pb, manager_server::Manager};

/// The Manager service.
pub(crate) struct ManagerService {
    shared: Arc<Shared>,
}

impl ManagerService {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// The API spoken now (the world's; `SetApi` changes it).
    fn api(&self) -> Api {
        self.shared.lock().api()
    }

    async fn call<T>(
        &self,
        rpc: &str,
        op: impl FnOnce(&mut World) -> Result<T, RequestError>,
    ) -> Result<Response<T>, Status> {
        self.shared.fault(rpc).await?;
        let result = op(&mut self.shared.lock());
        result.map(Response::new).map_err(Status::from)
    }

    /// A request of a published RPC as the world sees it. A Manager without
    /// the additions ignores the fields it does not know, as any protobuf
    /// server ignores unknown fields.
    fn request<M: Published>(&self, req: Request<M>) -> Result<M, Status> {
        Ok(self.api().carry(req.into_inner())?)
    }

    /// An answer of a published RPC as it leaves.
    fn answer<M: Published>(&self, answer: Response<M>) -> Result<Response<M>, Status> {
        Ok(Response::new(self.api().carry(answer.into_inner())?))
    }
}

type JobSearchStream = tokio_stream::Iter<std::vec::IntoIter<Result<pb::CurrentJob, Status>>>;

#[tonic::async_trait]
impl Manager for ManagerService {
    type CreateStatusChannelStream = StatusStream;
    type JobSearchStream = JobSearchStream;
    type EventStreamStream = EventStream;

    async fn create_status_channel(&self, _: Request<()>) -> Result<Response<StatusStream>, Status> {
        self.shared.fault("CreateStatusChannel").await?;
        Ok(Response::new(stream::open_status_channel(&self.shared, self.api())))
    }

    async fn create_job(&self, req: Request<pb::Job>) -> Result<Response<pb::JobHash>, Status> {
        let job = self.request(req)?;
        self.answer(self.call("CreateJob", |w| w.create_job(job)).await?)
    }

    async fn update_job(&self, req: Request<pb::Job>) -> Result<Response<pb::JobHash>, Status> {
        let job = self.request(req)?;
        self.answer(self.call("UpdateJob", |w| w.update_job(job)).await?)
    }

    async fn delete_job(&self, req: Request<common::JobId>) -> Result<Response<()>, Status> {
        let job = self.request(req)?;
        self.call("DeleteJob", |w| w.delete_job(&job.job_id)).await
    }

    async fn job_search(&self, req: Request<pb::JobSearchRequest>) -> Result<Response<JobSearchStream>, Status> {
        let search = self.request(req)?;
        let found = self.call("JobSearch", |w| w.job_search(&search)).await?.into_inner();
        let api = self.api();
        let found = found
            .into_iter()
            .map(|job| api.carry(job).map_err(Status::from))
            .collect::<Vec<_>>();
        Ok(Response::new(tokio_stream::iter(found)))
    }

    async fn create_aws_node(&self, req: Request<pb::CreateAwsNodeRequest>) -> Result<Response<()>, Status> {
        let node = self.request(req)?;
        self.call("CreateAwsNode", |w| w.create_aws_node(node)).await
    }

    async fn create_oci_node(&self, req: Request<pb::CreateOciNodeRequest>) -> Result<Response<()>, Status> {
        let node = self.request(req)?;
        self.call("CreateOciNode", |w| w.create_oci_node(node)).await
    }

    async fn update_physical_node(&self, req: Request<pb::UpdatePhysicalNodeRequest>) -> Result<Response<()>, Status> {
        let node = self.request(req)?;
        self.call("UpdatePhysicalNode", |w| w.update_physical_node(&node.id))
            .await
    }

    async fn terminate_node(&self, req: Request<common::NodeId>) -> Result<Response<()>, Status> {
        let node = self.request(req)?;
        self.call("TerminateNode", |w| w.terminate_node(&node.node_id)).await
    }

    async fn start_job(&self, req: Request<pb::StartJobRequest>) -> Result<Response<()>, Status> {
        let start = self.request(req)?;
        self.call("StartJob", |w| w.start_job(start)).await
    }

    async fn stop_job(&self, req: Request<pb::StopJobRequest>) -> Result<Response<()>, Status> {
        let stop = self.request(req)?;
        self.call("StopJob", |w| w.stop_job(stop)).await
    }

    async fn complete_job(&self, req: Request<common::JobId>) -> Result<Response<()>, Status> {
        let job = self.request(req)?;
        self.call("CompleteJob", |w| w.complete_job(&job.job_id)).await
    }

    async fn event_stream(&self, req: Request<pb::EventStreamRequest>) -> Result<Response<EventStream>, Status> {
        self.shared.fault("EventStream").await?;
        self.shared.lock().stream_opened(req.get_ref().pending_window_s);
        Ok(Response::new(stream::open_event_stream(&self.shared, self.api())))
    }

    async fn create_bundle(&self, req: Request<pb::Bundle>) -> Result<Response<pb::BundleAck>, Status> {
        self.call("CreateBundle", |w| w.create_bundle(req.into_inner())).await
    }

    async fn update_bundle(&self, req: Request<pb::Bundle>) -> Result<Response<pb::BundleAck>, Status> {
        self.call("UpdateBundle", |w| w.update_bundle(req.into_inner())).await
    }

    async fn delete_bundle(&self, req: Request<pb::BundleId>) -> Result<Response<()>, Status> {
        self.call("DeleteBundle", |w| w.delete_bundle(&req.get_ref().bundle_id))
            .await
    }

    async fn start_bundle_job(&self, req: Request<pb::BundleJobRef>) -> Result<Response<()>, Status> {
        self.call("StartBundleJob", |w| w.set_bundle_job_dormant(req.get_ref(), false))
            .await
    }

    async fn stop_bundle_job(&self, req: Request<pb::BundleJobRef>) -> Result<Response<()>, Status> {
        self.call("StopBundleJob", |w| w.set_bundle_job_dormant(req.get_ref(), true))
            .await
    }

    async fn start_prepared_job(&self, req: Request<pb::StartPreparedJobRequest>) -> Result<Response<()>, Status> {
        self.call("StartPreparedJob", |w| w.start_prepared_job(req.into_inner()))
            .await
    }

    async fn send_migration_signal(&self, req: Request<pb::MigrationSignalRequest>) -> Result<Response<()>, Status> {
        self.call("SendMigrationSignal", |w| w.send_migration_signal(req.into_inner()))
            .await
    }

    async fn update_node_tags(&self, req: Request<pb::UpdateNodeTagsRequest>) -> Result<Response<()>, Status> {
        self.call("UpdateNodeTags", |w| w.update_node_tags(req.into_inner()))
            .await
    }

    async fn prefetch_images(&self, req: Request<pb::PrefetchImagesRequest>) -> Result<Response<()>, Status> {
        self.call("PrefetchImages", |w| w.prefetch_images(req.into_inner()))
            .await
    }

    async fn set_terminal_verdict(&self, req: Request<pb::SetTerminalVerdictRequest>) -> Result<Response<()>, Status> {
        self.call("SetTerminalVerdict", |w| w.set_terminal_verdict(req.into_inner()))
            .await
    }
}
