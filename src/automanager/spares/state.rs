//! The reconciler's state and its vocabulary: the spare tags, the status
//! per pool, what its calls were for, and the count of a pool's
//! unconsumed spares.

use std::collections::{BTreeMap, BTreeSet};

use crate::automanager::fleet::NodeState;
use crate::model::{NodeId, UnixMillis, tags};

/// `SPARE_PROVISION_RETRY_BACKOFF_MS`: after a failed spare provision the
/// pool's next attempt waits this long (60 s).
pub const SPARE_PROVISION_RETRY_BACKOFF_MS: i64 = 60_000;

/// The tags that make a node a spare; a spare that took a job loses them.
pub(super) const SPARE_TAGS: [&str; 4] = [tags::SPARE, tags::WARM_FOR, tags::RESERVED_FOR, tags::EXCLUSIVE];

/// One pool's spares as the reconciler sees them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HotSpareStatus {
    pub pool: String,
    /// `targetCount`.
    pub target: u32,
    /// Unconsumed spares that have booted (one whose job's start Manager
    /// has not accepted yet is still unconsumed).
    pub live: u32,
    /// Unconsumed spares still launching.
    pub provisioning: u32,
    /// While short of the target: the effective count last reported by
    /// `spareUnderflow`.
    pub underflow: Option<u32>,
    /// When `spareUnderflow` last fired for the pool.
    pub last_underflow_at: Option<UnixMillis>,
    /// Spares that took a job (Manager accepted its start there, and they
    /// became ordinary nodes) since start.
    pub consumed: u64,
    /// Spare provisioning for the pool is held back until then.
    pub backoff_until: Option<UnixMillis>,
}

/// What a reconciler RPC was for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::automanager) enum SpareRequest {
    Provision { node_id: NodeId, pool: String },
    Prefetch { node_id: NodeId, images: Vec<String> },
    Tags { node_id: NodeId },
}

/// Image pulls asked of one spare.
#[derive(Clone, Debug, Default)]
pub(super) struct Pulls {
    /// Asked for, not settled yet.
    pub(super) requested: BTreeSet<String>,
    /// Settled `ok: false`: the spare stays cold for these.
    pub(super) failed: BTreeSet<String>,
}

/// The reconciler's state.
#[derive(Clone, Debug, Default)]
pub(in crate::automanager) struct SpareState {
    /// When the next periodic pass is due (none before the first pass).
    pub(super) next_tick: Option<UnixMillis>,
    /// The capacity epoch as the last pass left it.
    pub(super) seen_epoch: Option<u64>,
    /// A pass is due regardless (the specs changed).
    pub(super) forced: bool,
    /// Pool -> until when its spare provisioning is held back.
    pub(super) backoff: BTreeMap<String, UnixMillis>,
    /// Pool -> the last `spareUnderflow` fired, so a pass that changes
    /// nothing does not repeat it before the next tick.
    pub(super) underflow: BTreeMap<String, (u32, u32)>,
    /// Pool -> when `spareUnderflow` last fired.
    pub(super) underflow_at: BTreeMap<String, UnixMillis>,
    /// Pool -> spares that took a job since start.
    pub(super) consumed: BTreeMap<String, u64>,
    /// `lastActivity`: when each node last started, advertised or pulled.
    pub(super) activity: BTreeMap<NodeId, UnixMillis>,
    /// The image pulls asked of each spare.
    pub(super) pulls: BTreeMap<NodeId, Pulls>,
}

/// Whether a node is tagged as a spare.
pub(in crate::automanager) fn is_spare_tagged(node: &NodeState) -> bool {
    node.tags.get(tags::SPARE).is_some_and(|v| v == "true")
}

/// A pool's unconsumed spares, as the reconciler, `HotSparePolicy` status and
/// the pool gauges all count them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::automanager) struct SpareCount {
    /// Booted.
    pub(in crate::automanager) live: u32,
    /// Still launching.
    pub(in crate::automanager) provisioning: u32,
}
