//! Nodes and what they advertise.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{NodeId, UnixMillis};

/// Where a node's capacity comes from (a tier's `kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ProviderKind {
    /// Amazon EC2.
    #[serde(rename = "aws")]
    Aws,
    /// Oracle Cloud Infrastructure.
    #[serde(rename = "oci")]
    Oci,
    /// Pre-registered cluster nodes.
    #[serde(rename = "local-servers")]
    LocalServers,
}

impl ProviderKind {
    /// Whether nodes of this kind are provisioned from a cloud (and so may be
    /// terminated as `singleUse`).
    pub fn is_cloud(self) -> bool {
        !matches!(self, ProviderKind::LocalServers)
    }

    /// The spec's name for the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Aws => "aws",
            ProviderKind::Oci => "oci",
            ProviderKind::LocalServers => "local-servers",
        }
    }
}

/// One GPU device of a node. Capacity is in fractions of a device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// The device model (e.g. `t4`).
    #[serde(default)]
    pub model: String,
    /// 1.0 is one whole device (more than 0).
    #[schemars(range(min = 0), extend("exclusiveMinimum" = true))]
    pub total_capacity: f64,
}

/// A network interface a worker advertises.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Nic {
    /// Interface name.
    pub name: String,
    /// Link speed in Mbit/s.
    #[serde(default)]
    pub speed_mbps: u64,
}

/// What a worker advertises. A node without one is invisible to placement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeInventory {
    /// `aws`, `oci` or `local-servers`.
    pub kind: ProviderKind,
    /// Cloud region (or site, for cluster nodes).
    #[serde(default)]
    pub region: String,
    /// Availability zone / domain.
    #[serde(default)]
    pub az: String,
    /// Instance type or shape.
    #[serde(default)]
    pub instance_type: String,
    /// vCPUs.
    pub total_capacity: f64,
    /// Integer cores available for pinning.
    #[serde(default)]
    pub total_cores: u32,
    /// Fraction (0, 1] of `totalCapacity` placement may use.
    #[serde(default = "one")]
    pub utilization_cap: f64,
    /// Capacity held outside placement (system daemons).
    #[serde(default)]
    pub reserved_capacity: f64,
    /// Capabilities the node offers (`norsk.io/nvidia-gpu`, ...).
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// GPU devices, indexed by position.
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    /// Image references the node already holds.
    #[serde(default)]
    pub images: Vec<String>,
    /// Network interfaces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<Nic>,
}

fn one() -> f64 {
    1.0
}

impl NodeInventory {
    /// A plain cluster (`local-servers`) server of `vcpus` vCPUs and as many
    /// cores, all of it usable, advertising nothing else yet.
    pub fn local_server(
        region: impl Into<String>,
        az: impl Into<String>,
        instance_type: impl Into<String>,
        vcpus: f64,
    ) -> Self {
        Self {
            kind: ProviderKind::LocalServers,
            region: region.into(),
            az: az.into(),
            instance_type: instance_type.into(),
            total_capacity: vcpus,
            total_cores: vcpus as u32,
            utilization_cap: 1.0,
            reserved_capacity: 0.0,
            capabilities: Vec::new(),
            gpus: Vec::new(),
            images: Vec::new(),
            nics: Vec::new(),
        }
    }

    /// Capacity placement may hand out before any job is placed:
    /// `totalCapacity × utilizationCap − reserved`.
    pub fn usable_capacity(&self) -> f64 {
        (self.total_capacity * self.utilization_cap - self.reserved_capacity).max(0.0)
    }
}

/// A node's lifecycle phase as AutoManager sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum NodePhase {
    /// Asked for, not yet reported by Manager (placement may plan on it).
    Prospective,
    /// Manager reported it starting.
    #[default]
    Starting,
    /// Booted and connected.
    Running,
    /// Going away (`NodeStopping`).
    Stopping,
    /// Gone (`NodeStopped`).
    Stopped,
}

/// What Manager's node metadata says about who provides a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "provider")]
pub enum ProviderMetadata {
    /// An EC2 instance.
    Aws {
        /// Instance type.
        instance_type: String,
        /// Region.
        region: String,
    },
    /// An OCI instance.
    Oci,
    /// Manager's test provider.
    Test {
        /// Instance type.
        instance_type: String,
        /// Region.
        region: String,
    },
    /// No provider metadata, or a provider this build does not know (kept,
    /// not rejected).
    Unknown,
}

/// A node as Manager's events describe it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    pub node_id: NodeId,
    /// Tags (pool, tier, spare, warmFor, reservedFor, exclusive, ...).
    pub tags: BTreeMap<String, String>,
    /// When Manager created it.
    pub created_at: Option<UnixMillis>,
    /// Provider details.
    pub provider: ProviderMetadata,
}

/// Tag names AutoManager writes on nodes it provisions or manages.
pub mod tags {
    /// The pool a node belongs to.
    pub const POOL: &str = "pool";
    /// The tier a node was provisioned for.
    pub const TIER: &str = "tier";
    /// `true` on a hot spare.
    pub const SPARE: &str = "spare";
    /// Comma-separated templates whose images a spare pre-pulls.
    pub const WARM_FOR: &str = "warmFor";
    /// Comma-separated templates a spare is reserved for.
    pub const RESERVED_FOR: &str = "reservedFor";
    /// `true` when the reservation is a guarantee.
    pub const EXCLUSIVE: &str = "exclusive";
    /// The instance type or shape a node was provisioned as: with its pool
    /// and tier, what it can hold when Manager sends no inventory.
    pub const INSTANCE_TYPE: &str = "instanceType";
    /// Set by Manager when a provider interruption notice arrived.
    pub const INTERRUPTION: &str = "interruption";
    /// The bundle job a node was provisioned for (restart history clears
    /// when it starts).
    pub const PROVISIONED_FOR: &str = "provisionedFor";
}
