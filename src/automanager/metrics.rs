//! `metrics()`: cumulative counters since `startedAt` and per-pool gauges
//! computed at call time. `placementsSucceeded` counts a dispatched wire
//! call; a decision whose `StartJob` / `CreateAwsNode` / `CreateOciNode`
//! then fails counts under `placementsDispatchFailed` instead.

use serde::Serialize;

use crate::model::{BundleId, UnixMillis};

/// The cumulative counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    /// Placement runs.
    pub placements_attempted: u64,
    /// Placements whose first wire call succeeded.
    pub placements_succeeded: u64,
    /// Placements that found nowhere (or could not be attempted).
    pub placements_failed: u64,
    /// Placements whose first wire call failed.
    pub placements_dispatch_failed: u64,
    /// Worker rejections.
    pub jobs_rejected: u64,
    /// Bundles marked broken.
    pub bundles_broken: u64,
    /// Jobs dropped.
    pub jobs_dropped: u64,
}

/// One pool's gauges.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolGauge {
    /// The pool.
    pub pool_name: String,
    /// Nodes of the pool not stopped (launching ones included).
    pub node_count: u32,
    /// Unconsumed spares.
    pub live_spares: u32,
    /// `hotSpares[].targetCount` for the pool.
    pub spare_target: u32,
    /// Capacity reserved by bound jobs over usable capacity, 0 when none.
    pub used_capacity_fraction: f64,
}

/// One tier's share of a pool's usage.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TierUsage {
    /// The tier's name.
    pub name: String,
    /// Nodes of the tier that are up.
    pub nodes: u32,
    /// Nodes of the tier asked for and not yet started.
    pub prospective_nodes: u32,
    /// Capacity reserved by placed jobs (migration targets included) over
    /// the tier's usable capacity, 0 when it has none.
    pub used_capacity_fraction: f64,
}

/// A pool's usage by the core's own rules: the pool gauges and the
/// `PlacementPool` status are both this one computation, so they never
/// disagree (a migration's target counts on both).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolUsage {
    /// The gauges `metrics()` reports for the pool.
    pub gauge: PoolGauge,
    /// Per tier named, in the order given.
    pub tiers: Vec<TierUsage>,
}

/// What `metrics()` returns.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metrics {
    /// When this AutoManager started.
    pub started_at: UnixMillis,
    /// Now minus `startedAt`.
    pub uptime_ms: i64,
    /// The counters.
    #[serde(flatten)]
    pub counters: Counters,
    /// Per pool.
    pub pools: Vec<PoolGauge>,
    /// Bundles currently broken.
    pub broken_bundle_ids: Vec<BundleId>,
    /// Per pool and kind of failure domain, the headroom verdict; empty
    /// while headroom is not computed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headroom: Vec<HeadroomGauge>,
}

/// One pool's headroom against one kind of failure domain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeadroomGauge {
    /// The pool.
    pub pool_name: String,
    /// `node`, `zone` or `provider`.
    pub kind: String,
    /// The loss of any single domain of the kind is absorbed.
    pub absorbed: bool,
    /// Domains of the kind whose loss is not absorbed.
    pub unabsorbed_domains: u32,
    /// The worst of those, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst: Option<String>,
}
