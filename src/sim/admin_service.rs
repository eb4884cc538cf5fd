//! The `norsk.sim.admin.SimAdmin` gRPC service: fault injection and state
//! inspection. Each call is one world operation under the lock (or a signal
//! to the streams and timers); the rules live in the world.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::RequestError;
use super::inspect;
use super::published::Api;
use super::server::Shared;
use super::world::World;
use crate::manager::proto::sim_admin::{self, sim_admin_server::SimAdmin};

/// The admin service.
pub(crate) struct AdminService {
    shared: Arc<Shared>,
}

impl AdminService {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    fn call(&self, op: impl FnOnce(&mut World) -> Result<(), RequestError>) -> Result<Response<()>, Status> {
        let result = op(&mut self.shared.lock());
        result.map(Response::new).map_err(Status::from)
    }
}

#[tonic::async_trait]
impl SimAdmin for AdminService {
    async fn snapshot(&self, _: Request<()>) -> Result<Response<sim_admin::JsonDocument>, Status> {
        let snapshot = inspect::snapshot(&self.shared.lock());
        let json = serde_json::to_string_pretty(&snapshot)
            .map_err(|e| Status::internal(format!("failed to encode the snapshot as JSON: {e}")))?;
        Ok(Response::new(sim_admin::JsonDocument { json }))
    }

    async fn register_node(&self, req: Request<sim_admin::RegisterNodeRequest>) -> Result<Response<()>, Status> {
        self.call(|w| w.register_node(req.into_inner()))
    }

    async fn kill_node(&self, req: Request<sim_admin::NodeRef>) -> Result<Response<()>, Status> {
        self.call(|w| w.kill_node(&req.get_ref().node_id))
    }

    async fn stop_node(&self, req: Request<sim_admin::NodeRef>) -> Result<Response<()>, Status> {
        self.call(|w| w.stop_node(&req.get_ref().node_id))
    }

    async fn interrupt_node(&self, req: Request<sim_admin::InterruptNodeRequest>) -> Result<Response<()>, Status> {
        self.call(|w| w.interrupt_node(req.into_inner()))
    }

    async fn fail_job(&self, req: Request<sim_admin::JobRef>) -> Result<Response<()>, Status> {
        self.call(|w| w.fail_job(req.into_inner()))
    }

    async fn reject_job(&self, req: Request<sim_admin::RejectJobRequest>) -> Result<Response<()>, Status> {
        self.call(|w| w.reject_job(req.into_inner()))
    }

    async fn set_capacity(&self, req: Request<sim_admin::SetCapacityRequest>) -> Result<Response<()>, Status> {
        self.call(|w| w.set_capacity(req.into_inner()))
    }

    async fn rpc_fault(&self, req: Request<sim_admin::RpcFaultRequest>) -> Result<Response<()>, Status> {
        self.call(|w| w.set_rpc_fault(req.into_inner()))
    }

    async fn set_api(&self, req: Request<sim_admin::SetApiRequest>) -> Result<Response<()>, Status> {
        let api = if req.get_ref().published_api_only {
            Api::Published
        } else {
            Api::Full
        };
        self.shared.lock().set_api(api);
        // A new Manager version: its clients reconnect.
        self.shared.drop_streams();
        Ok(Response::new(()))
    }

    async fn drop_stream(&self, _: Request<()>) -> Result<Response<()>, Status> {
        self.shared.drop_streams();
        Ok(Response::new(()))
    }

    async fn set_time_scale(&self, req: Request<sim_admin::SetTimeScaleRequest>) -> Result<Response<()>, Status> {
        let response = self.call(|w| w.set_time_scale(req.get_ref().time_scale));
        self.shared.wake_timers();
        response
    }

    async fn inject_event(&self, req: Request<sim_admin::InjectEventRequest>) -> Result<Response<()>, Status> {
        let event = req
            .into_inner()
            .event
            .ok_or_else(|| Status::invalid_argument("InjectEvent.event is missing"))?;
        self.shared.lock().inject(event);
        Ok(Response::new(()))
    }

    async fn set_job_behaviour(&self, req: Request<sim_admin::SetJobBehaviourRequest>) -> Result<Response<()>, Status> {
        self.call(|w| w.set_job_behaviour(req.into_inner()))
    }
}
