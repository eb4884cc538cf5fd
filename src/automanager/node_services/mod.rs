//! Node services (experimental): a service configured in `nodeServices`
//! runs once on every node it applies to, placed eagerly — as soon as the
//! node is running — as a plain Manager job of its own per node
//! (`nodeService/<name>/<node>`, created with `CreateJob`, started with
//! `StartJob` on that node). `eager` is the one lifecycle that exists:
//! settings validation refuses `lazy` or anything else, and refuses a
//! non-empty `nodeServices` unless `experimental: { nodeServices: true }`
//! is set (`experimentalNotEnabled`), so nobody configures one by accident.
//!
//! A placed service whose instance stops (it failed, or something else
//! stopped it) or whose job is deleted is placed again after
//! `NODE_SERVICE_RETRY_BACKOFF_MS`, for as long as its node is up.
//!
//! Out of scope, because it is worker-side: a service's `provides[]`
//! reaching the view sibling jobs have of the node. Without that work in
//! the worker, the service is placed but no consumer can see what it
//! offers. A service's demands are not charged against placement either:
//! like any system daemon it belongs in the node's advertised
//! `reservedCapacity`.

pub(super) mod state;

pub use state::{
    EAGER_LIFECYCLE, NODE_SERVICE_RETRY_BACKOFF_MS, NODE_SERVICE_TAG, NODE_TAG, NodeServiceSpec, ServicePhase,
    node_service_job_id,
};

use std::collections::BTreeMap;

use crate::model::{InstanceKey, JobHistoryEntry, JobId, NodeId, NodePhase, RuntimeJob, Slot, UnixMillis, tags};

use super::facts::Facts;
use super::notification::Notification;
use super::outbox::{Outbox, Pending, SubsystemCall};
use super::protocol::{Rpc, RpcFailure, RpcFailureKind};
use super::settings::AutoSettings;
use super::subsystem::{Pass, Subsystem};
use state::{NodeServiceState, ServiceRequest};

impl NodeServiceState {
    /// Where each service stands, per node.
    pub(in crate::automanager) fn placements(&self) -> impl Iterator<Item = (&str, &NodeId, ServicePhase)> {
        self.placements
            .iter()
            .map(|((service, node), phase)| (service.as_str(), node, *phase))
    }

    /// Places every service on every running node it applies to and is not
    /// on yet, and forgets the nodes that are gone.
    fn place(&mut self, facts: &Facts, outbox: &mut Outbox, now: UnixMillis) {
        let retry_due = self.deadline().is_some_and(|at| at <= now);
        if facts.settings().node_services.is_empty() || (self.seen_epoch == Some(facts.capacity_epoch()) && !retry_due)
        {
            return;
        }
        self.seen_epoch = Some(facts.capacity_epoch());
        let fleet = &facts.fleet;
        self.placements
            .retain(|(_, node_id), _| fleet.get(node_id).is_some_and(|n| !n.is_going() && !n.terminated));
        let mut due = Vec::new();
        for service in &facts.settings().node_services {
            for node in fleet.iter() {
                let pool = node.tags.get(tags::POOL);
                let applies = pool.is_some_and(|p| {
                    facts.pools().get(p).is_some() && (service.pools.is_empty() || service.pools.contains(p))
                });
                if !applies || node.phase != NodePhase::Running || node.terminated {
                    continue;
                }
                let key = (service.name.clone(), node.id.clone());
                match self.placements.get(&key) {
                    None => due.push((service.clone(), node.id.clone())),
                    Some(ServicePhase::RetryAt(at)) if *at <= now => due.push((service.clone(), node.id.clone())),
                    Some(_) => {}
                }
            }
        }
        for (service, node_id) in due {
            let mut job_tags = BTreeMap::from([
                (NODE_SERVICE_TAG.to_owned(), service.name.clone()),
                (NODE_TAG.to_owned(), node_id.0.clone()),
            ]);
            if !service.provides.is_empty() {
                job_tags.insert("provides".to_owned(), service.provides.join(","));
            }
            self.placements
                .insert((service.name.clone(), node_id.clone()), ServicePhase::Creating);
            outbox.call(
                Rpc::CreateJob {
                    job_id: node_service_job_id(&service.name, &node_id),
                    template: service.template.clone(),
                    tags: job_tags,
                },
                Pending::Subsystem(SubsystemCall::NodeService(ServiceRequest::Create {
                    service: service.name,
                    node_id,
                })),
            );
        }
    }

    /// When a failed service placement is next tried.
    fn deadline(&self) -> Option<UnixMillis> {
        self.placements
            .values()
            .filter_map(|p| match p {
                ServicePhase::RetryAt(at) => Some(*at),
                _ => None,
            })
            .min()
    }

    /// The result of a node-service RPC: a created job is started on its
    /// node; a failure is tried again after `NODE_SERVICE_RETRY_BACKOFF_MS`.
    fn rpc_result(
        &mut self,
        request: ServiceRequest,
        result: Result<(), RpcFailure>,
        outbox: &mut Outbox,
        now: UnixMillis,
    ) {
        let (service, node_id, started) = match request {
            ServiceRequest::Create { service, node_id } => (service, node_id, false),
            ServiceRequest::Start { service, node_id } => (service, node_id, true),
        };
        let key = (service.clone(), node_id.clone());
        if !self.placements.contains_key(&key) {
            // The node went meanwhile.
            return;
        }
        // A job created by a previous instance is there already: start it.
        let result = result.or_else(|f| match f.kind {
            RpcFailureKind::AlreadyExists if !started => Ok(()),
            _ => Err(f),
        });
        let phase = match result {
            Ok(()) if started => ServicePhase::Placed,
            Ok(()) => {
                let job_id = node_service_job_id(&service, &node_id);
                let instance_key = InstanceKey::slot(Slot::of_replica(0));
                outbox.call(
                    Rpc::StartJob {
                        job_id,
                        runtime_role: instance_key.0.clone(),
                        instance_key,
                        node_id: node_id.clone(),
                        gpu_index: None,
                    },
                    Pending::Subsystem(SubsystemCall::NodeService(ServiceRequest::Start {
                        service,
                        node_id: node_id.clone(),
                    })),
                );
                ServicePhase::Starting
            }
            Err(failure) => {
                outbox.notify(Notification::Error {
                    message: format!(
                        "placing node service {} on {node_id} failed: {}",
                        key.0, failure.message
                    ),
                });
                ServicePhase::RetryAt(now + NODE_SERVICE_RETRY_BACKOFF_MS)
            }
        };
        self.placements.insert(key, phase);
    }

    /// A plain Manager job changed (or, with `job` `None`, `job_id` was
    /// deleted): a placed node service whose instance stopped is placed
    /// again after `NODE_SERVICE_RETRY_BACKOFF_MS`.
    pub(in crate::automanager) fn job_changed(
        &mut self,
        settings: &AutoSettings,
        job_id: &JobId,
        job: Option<&RuntimeJob>,
        outbox: &mut Outbox,
        now: UnixMillis,
    ) {
        let Some(key) = self.key(settings, job_id) else {
            return;
        };
        if self.placements.get(&key) != Some(&ServicePhase::Placed) {
            return;
        }
        let ended = job.is_none_or(|j| {
            matches!(
                j.history.last(),
                Some(JobHistoryEntry::Stopping { .. } | JobHistoryEntry::Stopped { .. })
            )
        });
        if !ended {
            return;
        }
        outbox.notify(Notification::Error {
            message: format!(
                "node service {} on {} stopped; placing it again in {NODE_SERVICE_RETRY_BACKOFF_MS} ms",
                key.0, key.1
            ),
        });
        self.placements
            .insert(key, ServicePhase::RetryAt(now + NODE_SERVICE_RETRY_BACKOFF_MS));
    }

    /// The (service, node) a node-service job id names, if it is one of
    /// these placements.
    fn key(&self, settings: &AutoSettings, job_id: &JobId) -> Option<(String, NodeId)> {
        let rest = job_id.0.strip_prefix("nodeService/")?;
        settings.node_services.iter().find_map(|service| {
            let node = rest.strip_prefix(service.name.as_str())?.strip_prefix('/')?;
            let key = (service.name.clone(), NodeId::from(node));
            self.placements.contains_key(&key).then_some(key)
        })
    }
}

impl Subsystem for NodeServiceState {
    type Call = ServiceRequest;
    const PASS: Pass = Pass::AfterPlacement;

    fn answered(
        &mut self,
        request: ServiceRequest,
        result: Result<(), RpcFailure>,
        _facts: &mut Facts,
        outbox: &mut Outbox,
        now: UnixMillis,
    ) {
        self.rpc_result(request, result, outbox, now);
    }

    fn step(&mut self, facts: &mut Facts, outbox: &mut Outbox, now: UnixMillis) {
        self.place(facts, outbox, now);
    }

    fn next_deadline(&self, _facts: &Facts, _now: UnixMillis) -> Option<UnixMillis> {
        self.deadline()
    }
}
