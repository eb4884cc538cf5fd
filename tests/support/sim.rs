//! Shared harness for the simulator tests: an in-process simulator on a
//! loopback port at a high time scale, the generated tonic clients, and an
//! event reader that waits with a timeout (never a fixed sleep).

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::time::Duration;

use norsk_auto_manager::manager::proto::common;
use norsk_auto_manager::manager::proto::manager::{
    self as pb, event_stream_event::Event, manager_client::ManagerClient,
};
use norsk_auto_manager::manager::proto::sim_admin::{self, sim_admin_client::SimAdminClient};
use norsk_auto_manager::sim::{SimConfig, SimHandle, SimSnapshot, Simulator};
use tonic::transport::Channel;
use tonic::{Status, Streaming};

/// Simulated seconds per real second in tests: a 30 s keepalive is 30 ms.
pub const TIME_SCALE: f64 = 1000.0;
/// How long a test waits for an event before failing.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A running simulator with clients for both services.
pub struct Sim {
    pub handle: SimHandle,
    pub manager: ManagerClient<Channel>,
    pub admin: SimAdminClient<Channel>,
}

impl Sim {
    /// A simulator with the built-in catalogue, seed 7.
    pub async fn start() -> Sim {
        Sim::start_with(SimConfig {
            seed: 7,
            time_scale: TIME_SCALE,
            ..SimConfig::default()
        })
        .await
    }

    /// A simulator with `config`.
    pub async fn start_with(config: SimConfig) -> Sim {
        let handle = Simulator::start(config).await.expect("simulator starts");
        let channel = Channel::from_shared(handle.url())
            .unwrap()
            .connect()
            .await
            .expect("connects");
        Sim {
            handle,
            manager: ManagerClient::new(channel.clone()),
            admin: SimAdminClient::new(channel),
        }
    }

    /// Opens an event stream.
    pub async fn events(&self) -> Events {
        let stream = self
            .manager
            .clone()
            .event_stream(pb::EventStreamRequest::default())
            .await
            .unwrap();
        Events {
            stream: stream.into_inner(),
        }
    }

    /// The admin snapshot, parsed.
    pub async fn snapshot(&self) -> SimSnapshot {
        let json = self.admin.clone().snapshot(()).await.unwrap().into_inner().json;
        serde_json::from_str(&json).expect("snapshot is JSON")
    }

    /// Registers a cluster node with `vcpus` and no GPUs.
    pub async fn register(&self, node_id: &str, vcpus: f64) {
        self.admin
            .clone()
            .register_node(cluster_node(node_id, vcpus))
            .await
            .unwrap();
    }

    /// Creates a plain job.
    pub async fn create_job(&self, job_id: &str) {
        let job = pb::Job {
            job_id: Some(common::JobId { job_id: job_id.into() }),
            state: pb::job::JobState::Active as i32,
            ..Default::default()
        };
        self.manager.clone().create_job(job).await.unwrap();
    }

    /// Starts `job_id` under `role` on `node_id`.
    pub async fn start_job(&self, job_id: &str, role: &str, node_id: &str) -> Result<(), Status> {
        self.manager
            .clone()
            .start_job(start_request(job_id, role, node_id))
            .await
            .map(|_| ())
    }

    pub async fn shutdown(self) {
        self.handle.shutdown().await.expect("simulator shuts down cleanly");
    }
}

/// A cluster node registration.
pub fn cluster_node(node_id: &str, vcpus: f64) -> sim_admin::RegisterNodeRequest {
    sim_admin::RegisterNodeRequest {
        node_id: node_id.into(),
        tags: [("pool".to_owned(), "studio".to_owned())].into(),
        inventory: Some(pb::NodeInventory {
            provider: pb::ProviderKind::LocalServers as i32,
            region: "oslo".into(),
            availability_zone: "oslo-1".into(),
            total_capacity: vcpus,
            total_cores: vcpus as u32,
            utilization_cap: 1.0,
            ..Default::default()
        }),
    }
}

/// A StartJob request.
pub fn start_request(job_id: &str, role: &str, node_id: &str) -> pb::StartJobRequest {
    pb::StartJobRequest {
        job_id: Some(common::JobId { job_id: job_id.into() }),
        role: role.into(),
        node_id: Some(common::NodeId {
            node_id: node_id.into(),
        }),
        ..Default::default()
    }
}

/// An AWS node request.
pub fn aws_node(node_id: &str, region: &str, instance_type: &str) -> pb::CreateAwsNodeRequest {
    pb::CreateAwsNodeRequest {
        node_id: Some(common::NodeId {
            node_id: node_id.into(),
        }),
        region: region.into(),
        instance_type: instance_type.into(),
        ..Default::default()
    }
}

/// One event stream.
pub struct Events {
    stream: Streaming<pb::EventStreamEvent>,
}

impl Events {
    /// The next event or the status the stream ended with.
    pub async fn next_result(&mut self) -> Result<Option<Event>, Status> {
        match tokio::time::timeout(EVENT_TIMEOUT, self.stream.message()).await {
            Ok(Ok(Some(event))) => Ok(event.event),
            Ok(Ok(None)) => Ok(None),
            Ok(Err(status)) => Err(status),
            Err(_) => panic!("no event within {EVENT_TIMEOUT:?}"),
        }
    }

    /// The next event.
    pub async fn next(&mut self) -> Event {
        match self.next_result().await {
            Ok(Some(event)) => event,
            other => panic!("stream ended: {other:?}"),
        }
    }

    /// Events up to and including `initial_data_complete`.
    pub async fn snapshot(&mut self) -> Vec<Event> {
        self.until(|e| matches!(e, Event::InitialDataComplete(_)).then_some(()))
            .await
            .1
    }

    /// Reads until `found` matches; returns its answer and every event read
    /// (including the matching one).
    pub async fn until<T>(&mut self, mut found: impl FnMut(&Event) -> Option<T>) -> (T, Vec<Event>) {
        let mut seen = Vec::new();
        loop {
            let event = self.next().await;
            let answer = found(&event);
            seen.push(event);
            if let Some(answer) = answer {
                return (answer, seen);
            }
        }
    }
}

/// The node id of a node event, if it is one.
pub fn node_of(event: &Event) -> Option<&str> {
    fn id(n: &Option<common::NodeId>) -> Option<&str> {
        n.as_ref().map(|n| n.node_id.as_str())
    }
    fn meta(m: &Option<common::NodeMetadata>) -> Option<&str> {
        m.as_ref().and_then(|m| id(&m.node_id))
    }
    match event {
        Event::NodeStarting(n) => meta(&n.node_metadata),
        Event::NodeStarted(n) => meta(&n.node_metadata),
        Event::NodeStopping(n) => id(&n.node_id),
        Event::NodeStopped(n) => id(&n.node_id),
        Event::NodeInventory(n) => n.inventory.as_ref().and_then(|i| id(&i.node_id)),
        Event::NodeTagsUpdated(n) => id(&n.node_id),
        Event::NodeInterruptionNotice(n) => id(&n.node_id),
        Event::ImagesPrefetched(n) => id(&n.node_id),
        _ => None,
    }
}

/// A short name for an event's kind.
pub fn kind(event: &Event) -> &'static str {
    match event {
        Event::NodeRunning(_) => "node_running",
        Event::JobActive(_) => "job_active",
        Event::InitialDataComplete(_) => "initial_data_complete",
        Event::JobUpdated(_) => "job_updated",
        Event::JobDeleted(_) => "job_deleted",
        Event::JobPending(_) => "job_pending",
        Event::JobOutOfWindow(_) => "job_out_of_window",
        Event::NodeStarting(_) => "node_starting",
        Event::NodeStarted(_) => "node_started",
        Event::NodeStopping(_) => "node_stopping",
        Event::NodeStopped(_) => "node_stopped",
        Event::PhysicalNodeConnected(_) => "physical_node_connected",
        Event::ProviderHealthChange(_) => "provider_health_change",
        Event::JobInfo(_) => "job_info",
        Event::BundleUpdated(_) => "bundle_updated",
        Event::BundleDeleted(_) => "bundle_deleted",
        Event::NodeInventory(_) => "node_inventory",
        Event::JobRejected(_) => "job_rejected",
        Event::JobPrepared(_) => "job_prepared",
        Event::MigrationSignal(_) => "migration_signal",
        Event::NodeInterruptionNotice(_) => "node_interruption_notice",
        Event::ImagesPrefetched(_) => "images_prefetched",
        Event::AuditAppended(_) => "audit_appended",
        Event::NodeTagsUpdated(_) => "node_tags_updated",
    }
}

/// The job of a job event with its last history entry.
pub fn job_update(event: &Event) -> Option<(&str, Option<&pb::job_history_entry::HistoryEntry>)> {
    let jwh = match event {
        Event::JobUpdated(j) => j.job_with_history.as_ref(),
        Event::JobActive(j) => j.job_with_history.as_ref(),
        Event::JobPending(j) => j.job_with_history.as_ref(),
        _ => None,
    }?;
    let job_id = jwh.job.as_ref()?.job_id.as_ref()?.job_id.as_str();
    Some((job_id, jwh.history_entry.last().and_then(|e| e.history_entry.as_ref())))
}
