//! The simulation's Manager as a published Norsk Manager (1.0.384) with the
//! operator's port in front of it (`src/manager/port/`): the core is told
//! and answered what the port and such a Manager tell and answer, not what
//! a Manager with the AutoManager additions would.
//!
//! - Every capability is reported published (`Input::ManagerCapabilities`)
//!   before each connection's first event.
//! - Nodes report no inventory. A person declares what a cluster server
//!   holds (`Command::DeclareInventory`: before it connects, after, on a
//!   later step, or never — it is then the fixed tier's first candidate,
//!   [`SERVER`]); a provisioned node is known by the shape it was created
//!   with.
//! - A worker's refusal is the job failing (`JOB_FAILED` in its history),
//!   never `JobRejected` (see `Model::instance_rejected`).
//! - A deferred start is kept by the port, which tells it prepared at once
//!   and makes it on Manager only at `StartPreparedJob`; a stop of a start
//!   it keeps only forgets it.
//! - Node tags change only in the port (told as `NodeTagsUpdated`), over
//!   the tags Manager created the node with.
//! - `SendMigrationSignal` is not implemented (see `Model::answer_migration`).
//!
//! A new operator process (a promoted standby) has a new port: the tag
//! changes and the deferred starts the old one kept are gone with it, and
//! the declarations are handed to it again.

use norsk_auto_manager::automanager::{Command, Input, RequestId, Rpc, RpcFailureKind};
use norsk_auto_manager::model::manager::Capabilities;
use norsk_auto_manager::model::{InstanceKey, JobHistoryEntry, JobId, ManagerEvent, NodeId, ProviderKind, tags};
use rand::Rng;

use super::{Instance, ManagerNode, Model};
use crate::support::node_info;

/// Which Manager the model plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Api {
    /// One with the AutoManager additions.
    Full,
    /// A published 1.0.384 Manager behind the operator's port.
    Published,
}

impl Api {
    /// The word `CORE_SIM_MODE` and a failure's replay use.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Published => "published",
        }
    }

    /// The Managers a run plays each seed against (`CORE_SIM_MODE`:
    /// `full`, `published`, or `both`, the default; see docs/testing.md).
    pub(super) fn from_env() -> Vec<Self> {
        match std::env::var("CORE_SIM_MODE").as_deref() {
            Ok("full") => vec![Self::Full],
            Ok("published") => vec![Self::Published],
            Ok("both") | Err(_) => vec![Self::Full, Self::Published],
            Ok(other) => panic!("CORE_SIM_MODE is full, published or both, not {other:?}"),
        }
    }
}

/// A shape of the fixed tier's candidates.
pub(super) struct ServerShape {
    pub(super) capacity: f64,
    pub(super) cores: u32,
}

/// What a cluster server nobody declared is taken to be on a published
/// Manager: the fixed tier's first candidate. Every server the model
/// registers holds at least this (a person's word on their servers is
/// true), with no GPU or capability the operator could count on.
pub(super) const SERVER: ServerShape = ServerShape {
    capacity: 2.0,
    cores: 1,
};

impl ServerShape {
    /// The shape as a `candidateInstanceTypes` entry.
    pub(super) fn yaml(&self) -> String {
        format!(
            "{{instanceType: server, totalCapacity: {}, totalCores: {}}}",
            self.capacity, self.cores
        )
    }
}

/// What the operator can know a node holds.
pub(super) struct Known<'a> {
    pub(super) capacity: f64,
    pub(super) cores: u32,
    pub(super) gpu: f64,
    pub(super) capabilities: &'a [String],
}

impl ManagerNode {
    /// A cluster server (not provisioned for a tier).
    pub(super) fn is_server(&self) -> bool {
        !self.created_tags.iter().any(|(k, _)| k == tags::TIER)
    }

    /// What the operator can know this node holds: what it is (its
    /// worker's inventory, a person's declaration, the shape it was
    /// created with) — or, on a published Manager, for a server nobody
    /// declared, [`SERVER`].
    pub(super) fn known(&self, published: bool) -> Known<'_> {
        if published && self.is_server() && !self.declared {
            return Known {
                capacity: SERVER.capacity,
                cores: SERVER.cores,
                gpu: 0.0,
                capabilities: &[],
            };
        }
        Known {
            capacity: self.capacity,
            cores: self.cores,
            gpu: self.gpu,
            capabilities: &self.capabilities,
        }
    }
}

impl Model {
    /// What the port found Manager to serve, for the core before a
    /// connection's first event. None for a Manager with every addition:
    /// the core takes them as served until told otherwise.
    pub(super) fn capabilities(&self) -> Option<Input> {
        (self.api == Api::Published).then(|| Input::ManagerCapabilities(Capabilities::default()))
    }

    /// A cluster server connects to a published Manager, which says
    /// nothing of its size: a person declares it before it connects, after,
    /// on a later step ([`Model::declare_a_server`]), or never.
    pub(super) fn server_connected(&mut self, node_id: NodeId, node: ManagerNode) {
        let declared_when = self.rng.random_range(0..4);
        self.nodes.insert(node_id.clone(), node);
        if declared_when == 0 {
            self.declare(&node_id);
        }
        self.h.event(ManagerEvent::NodeStarted(node_info(
            node_id.as_str(),
            &[(tags::POOL, "production")],
        )));
        if declared_when == 1 {
            self.declare(&node_id);
        }
    }

    /// A person declares a server nobody had declared.
    pub(super) fn declare_a_server(&mut self) {
        let undeclared: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.is_server() && !n.declared)
            .map(|(id, _)| id.clone())
            .collect();
        if let Some(node) = self.pick(undeclared) {
            self.declare(&node);
        }
    }

    /// A person declares what `node_id` truly holds (a NorskNode's
    /// `spec.inventory`).
    fn declare(&mut self, node_id: &NodeId) {
        let Some(node) = self.nodes.get_mut(node_id) else {
            return;
        };
        node.declared = true;
        let inventory = node.inventory(ProviderKind::LocalServers);
        self.command(Command::DeclareInventory {
            node_id: node_id.clone(),
            inventory: Some(inventory),
        });
    }

    /// Every declaration, handed to a promoted standby (it applies them as
    /// it follows, as the live settings they are).
    pub(super) fn declare_again(&mut self) {
        let declared: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.declared)
            .map(|(id, _)| id.clone())
            .collect();
        for node in declared {
            self.declare(&node);
        }
    }

    /// The deferred start of `job`'s instance `key` the port keeps, if it
    /// keeps one: its node.
    fn kept(&self, job: &JobId, key: &InstanceKey) -> Option<&NodeId> {
        self.instances
            .get(&(job.clone(), key.clone()))
            .filter(|i| i.kept)
            .map(|i| &i.node)
    }

    /// The port forgets the deferred start of `job`'s instance `key`.
    pub(super) fn forget_kept(&mut self, job: &JobId, key: &InstanceKey) {
        if self.kept(job, key).is_some() {
            self.instances.remove(&(job.clone(), key.clone()));
        }
    }

    /// Whether the port answers `rpc` itself, never asking Manager: on a
    /// published Manager, a tag change, a prefetch, a deferred start, the
    /// stop of a deferred start it keeps, or the start of one it does not
    /// keep there.
    pub(super) fn port_local(&self, rpc: &Rpc) -> bool {
        if self.api == Api::Full {
            return false;
        }
        match rpc {
            Rpc::UpdateNodeTags { .. } | Rpc::PrefetchImages { .. } => true,
            Rpc::StartMigrationTarget { defer_start, .. } => *defer_start,
            Rpc::StopJob {
                job_id, instance_key, ..
            } => self.kept(job_id, instance_key).is_some(),
            Rpc::StartPreparedJob {
                job_id,
                instance_key,
                node_id,
            } => self.kept(job_id, instance_key) != Some(node_id),
            _ => false,
        }
    }

    /// The port's own answer to a call [`Model::port_local`] says it
    /// answers.
    pub(super) fn answer_in_port(&mut self, id: RequestId, rpc: Rpc) {
        match rpc {
            // Kept over the tags Manager reports for a node it has told of,
            // and told as Manager's addition would have.
            Rpc::UpdateNodeTags { node_id, set, remove } => {
                let Some(node) = self.nodes.get_mut(&node_id) else {
                    return self.fail(id, RpcFailureKind::NotFound);
                };
                node.tags.retain(|(k, _)| !set.contains_key(k) && !remove.contains(k));
                node.tags.extend(set);
                let tags = node.tags.iter().cloned().collect();
                self.h.event(ManagerEvent::NodeTagsUpdated { node_id, tags });
                self.ok(id);
            }
            // Nothing is pulled: a spare is warm with what it holds.
            Rpc::PrefetchImages { .. } => self.ok(id),
            // Kept, wherever it was asked for (the port does not follow
            // nodes), and told prepared at once. The event and the answer
            // reach the core on separate ways, in either order.
            Rpc::StartMigrationTarget {
                job_id,
                instance_key,
                node_id,
                ..
            } => {
                let key = (job_id.clone(), instance_key.clone());
                if self.instances.get(&key).is_none_or(|i| i.kept) {
                    let held = !self.node_runs(&node_id);
                    self.instances.insert(
                        key,
                        Instance {
                            node: node_id.clone(),
                            running: false,
                            deferred: true,
                            held,
                            prepared: true,
                            kept: true,
                        },
                    );
                }
                let prepared = ManagerEvent::JobPrepared {
                    job_id,
                    role: instance_key,
                    node_id,
                };
                if self.rng.random_bool(0.5) {
                    self.h.event(prepared);
                    self.ok(id);
                } else {
                    self.ok(id);
                    self.h.event(prepared);
                }
            }
            // Forgotten: nothing ran.
            Rpc::StopJob {
                job_id, instance_key, ..
            } => {
                self.forget_kept(&job_id, &instance_key);
                self.ok(id);
            }
            // None kept on that node (the port takes out one kept
            // elsewhere all the same).
            Rpc::StartPreparedJob {
                job_id, instance_key, ..
            } => {
                self.forget_kept(&job_id, &instance_key);
                self.fail(id, RpcFailureKind::NotFound);
            }
            other => unreachable!("Manager answers {other:?}"),
        }
    }

    /// `StartPreparedJob` of a start the port keeps on `node_id`: it takes
    /// the start out and asks Manager to make it, as it was asked for
    /// (`StartJob`).
    pub(super) fn start_kept(&mut self, id: RequestId, job_id: &JobId, key: InstanceKey, node_id: NodeId) {
        self.forget_kept(job_id, &key);
        if !self.node_runs(&node_id) || self.ended.contains(job_id) {
            return self.fail(id, RpcFailureKind::NotFound);
        }
        self.create_instance(job_id, &key, &node_id, false);
        self.accept(id);
        self.h.history(
            job_id,
            JobHistoryEntry::Provisioned {
                at: Some(self.h.now),
                role: key,
                node_id: Some(node_id),
            },
        );
    }
}
