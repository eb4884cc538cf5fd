//! The node services' vocabulary (`nodeServices[]` entries, the tags
//! their jobs carry) and where each stands on each node.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{JobId, NodeId, UnixMillis};

/// The one lifecycle that exists.
pub const EAGER_LIFECYCLE: &str = "eager";
/// How long a node service whose create or start failed waits before it is
/// tried again on that node.
pub const NODE_SERVICE_RETRY_BACKOFF_MS: i64 = 60_000;
/// The tag naming the service on its jobs.
pub const NODE_SERVICE_TAG: &str = "nodeService";
/// The tag naming the node a service job runs on.
pub const NODE_TAG: &str = "node";

/// One `nodeServices[]` entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeServiceSpec {
    /// Unique among the services; part of each of its job ids.
    pub name: String,
    /// When it is placed: only `eager` (on every node it applies to, as
    /// soon as the node runs) exists.
    #[serde(default = "eager")]
    pub lifecycle: String,
    /// The template the service runs.
    pub template: String,
    /// The pools whose nodes it runs on; empty: every configured pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<String>,
    /// What it offers the jobs beside it (reaching them is worker-side).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub provides: Vec<String>,
}

pub(super) fn eager() -> String {
    EAGER_LIFECYCLE.to_owned()
}

/// Where one service stands on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ServicePhase {
    /// `CreateJob` sent.
    Creating,
    /// `StartJob` sent.
    Starting,
    /// Started on the node.
    Placed,
    /// Create or start failed; tried again at this instant.
    RetryAt(UnixMillis),
}

/// What a node-service RPC was for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::automanager) enum ServiceRequest {
    Create { service: String, node_id: NodeId },
    Start { service: String, node_id: NodeId },
}

/// (service, node) -> phase.
#[derive(Clone, Debug, Default)]
pub(in crate::automanager) struct NodeServiceState {
    pub(super) placements: BTreeMap<(String, NodeId), ServicePhase>,
    /// The capacity epoch as the last round left it: nodes only come and go
    /// when it moves.
    pub(super) seen_epoch: Option<u64>,
}

/// The job a service runs on one node.
pub fn node_service_job_id(service: &str, node: &NodeId) -> JobId {
    JobId(format!("nodeService/{service}/{node}"))
}
