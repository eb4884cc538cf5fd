//! Placement pools: ordered lists of tiers, the cost cascade.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Gpu, ProviderKind};

/// Five minutes: the default `placementLeadMs` of a cloud tier.
pub const DEFAULT_CLOUD_PLACEMENT_LEAD_MS: u64 = 5 * 60_000;

/// `packingStrategy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PackingStrategy {
    /// Fuller nodes first.
    #[default]
    Binpack,
    /// Emptier nodes first.
    Spread,
}

/// `scaleOut`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ScaleOut {
    /// Provisions from `candidateInstanceTypes`.
    #[default]
    Elastic,
    /// Pre-registered cluster nodes (at most one such tier per pool).
    Fixed,
}

/// `launchMode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
pub enum LaunchMode {
    /// Pay as you go.
    #[serde(rename = "on-demand")]
    OnDemand,
    /// Interruptible spare cloud capacity.
    #[serde(rename = "spot")]
    Spot,
    /// Reserved instances.
    #[serde(rename = "reserved")]
    Reserved,
}

impl LaunchMode {
    /// The spec's name for the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            LaunchMode::OnDemand => "on-demand",
            LaunchMode::Spot => "spot",
            LaunchMode::Reserved => "reserved",
        }
    }
}

/// Whether the provider may take the capacity back: `durable` or
/// `interruptible` (spot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Reliability {
    /// Capacity the provider does not take back.
    Durable,
    /// Capacity the provider may reclaim (spot).
    Interruptible,
}

/// A root volume for AWS nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RootVolume {
    /// Size in GiB.
    pub size_gib: u32,
    /// EBS volume type (e.g. `gp3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_type: Option<String>,
}

/// One shape a tier can provision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceShape {
    /// Instance type or shape name.
    pub instance_type: String,
    /// vCPUs the node will advertise (more than 0).
    #[schemars(range(min = 0), extend("exclusiveMinimum" = true))]
    pub total_capacity: f64,
    /// Cores the node will advertise.
    #[serde(default)]
    pub total_cores: u32,
    /// Capabilities the node will advertise.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// GPU devices the node will advertise. Without them a job asking for
    /// fractional GPU capacity cannot be sized onto this shape.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<Gpu>,
}

impl InstanceShape {
    /// What a node of this shape will advertise once it boots: what placement
    /// plans on while the node is still prospective (no AZ, images or NICs
    /// known yet; the whole capacity usable).
    pub fn prospective_inventory(&self, kind: ProviderKind, region: String) -> super::NodeInventory {
        super::NodeInventory {
            kind,
            region,
            az: String::new(),
            instance_type: self.instance_type.clone(),
            total_capacity: self.total_capacity,
            total_cores: self.total_cores,
            utilization_cap: 1.0,
            reserved_capacity: 0.0,
            capabilities: self.capabilities.clone(),
            gpus: self.gpus.clone(),
            images: Vec::new(),
            nics: Vec::new(),
        }
    }
}

/// `PlacementTier`: one homogeneous capacity segment.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.scaleOut) && self.scaleOut == 'fixed' || has(self.candidateInstanceTypes) && size(self.candidateInstanceTypes) > 0",
     "messageExpression": "'tier ' + self.name + ' is elastic (scaleOut: elastic, the default) but lists no candidateInstanceTypes: it could never provision a node; add at least one shape, or make it scaleOut: fixed'",
     "fieldPath": ".candidateInstanceTypes"}
]))]
pub struct PlacementTier {
    /// Unique within the pool; provisioned nodes are tagged with it.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// `aws`, `oci` or `local-servers`.
    pub kind: ProviderKind,
    /// Region (cloud tiers).
    pub region: Option<String>,
    /// OCI: the availability domain nodes are created in (for example
    /// `EU-FRANKFURT-1-AD-1`). A Manager that speaks only the published API
    /// needs it: its `CreateOciNode` names a domain, not a region. Without
    /// it, a Manager with the AutoManager additions chooses a domain of
    /// `region`.
    pub availability_domain: Option<String>,
    /// `binpack` or `spread`.
    #[serde(default)]
    pub packing_strategy: PackingStrategy,
    /// `elastic` or `fixed`.
    #[serde(default)]
    pub scale_out: ScaleOut,
    /// `on-demand`, `spot` or `reserved`.
    pub launch_mode: Option<LaunchMode>,
    /// `durable` or `interruptible` (default: interruptible for spot).
    pub reliability: Option<Reliability>,
    /// A tier at its cap cannot provision; the cascade spills to the next.
    pub max_nodes: Option<u32>,
    /// AWS root volume.
    pub root_volume: Option<RootVolume>,
    /// How far ahead of a scheduled start to place (5 min cloud, 0 cluster).
    /// A scheduled job is placed the largest lead of its pool's tiers ahead,
    /// then through the whole cascade, cheapest tier first.
    #[schemars(range(max = 86_400_000))]
    pub placement_lead_ms: Option<u64>,
    /// How long a provision may stay prospective before its jobs are
    /// re-placed (default `max(placementLeadMs, 5 min) × 2`).
    #[schemars(range(min = 1_000, max = 86_400_000))]
    pub provision_timeout_ms: Option<u64>,
    /// Shapes to provision, first fitting wins. On a fixed tier nothing is
    /// provisioned: its first shape is what the tier's cluster servers are
    /// taken to be when Manager reports no inventory for them (the
    /// published Manager API does not).
    #[serde(default)]
    pub candidate_instance_types: Vec<InstanceShape>,
}

impl PlacementTier {
    /// `reliability`, defaulting to interruptible for spot, durable otherwise.
    pub fn effective_reliability(&self) -> Reliability {
        self.reliability.unwrap_or(match self.launch_mode {
            Some(LaunchMode::Spot) => Reliability::Interruptible,
            _ => Reliability::Durable,
        })
    }

    /// `placementLeadMs`: 5 min for cloud tiers, 0 for cluster tiers.
    pub fn effective_placement_lead_ms(&self) -> u64 {
        self.placement_lead_ms.unwrap_or(if self.kind.is_cloud() {
            DEFAULT_CLOUD_PLACEMENT_LEAD_MS
        } else {
            0
        })
    }

    /// `provisionTimeoutMs`: default `max(placementLeadMs, 5 min) × 2`.
    pub fn effective_provision_timeout_ms(&self) -> u64 {
        self.provision_timeout_ms
            .unwrap_or_else(|| self.effective_placement_lead_ms().max(DEFAULT_CLOUD_PLACEMENT_LEAD_MS) * 2)
    }
}

/// `PlacementPool`: an ordered list of tiers, cheapest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementPool {
    /// The pool name bundles refer to.
    pub name: String,
    /// Tiers in cascade order.
    pub tiers: Vec<PlacementTier>,
}

impl PlacementPool {
    /// The pool's fixed tier (at most one), which untagged cluster nodes of
    /// the pool belong to.
    pub fn fixed_tier(&self) -> Option<&PlacementTier> {
        self.tiers.iter().find(|t| t.scale_out == ScaleOut::Fixed)
    }

    /// The first elastic tier (where hot spares are provisioned).
    pub fn first_elastic_tier(&self) -> Option<&PlacementTier> {
        self.tiers.iter().find(|t| t.scale_out == ScaleOut::Elastic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(kind: ProviderKind) -> PlacementTier {
        PlacementTier {
            name: "t".into(),
            kind,
            region: None,
            availability_domain: None,
            packing_strategy: PackingStrategy::Binpack,
            scale_out: ScaleOut::Elastic,
            launch_mode: None,
            reliability: None,
            max_nodes: None,
            root_volume: None,
            placement_lead_ms: None,
            provision_timeout_ms: None,
            candidate_instance_types: vec![],
        }
    }

    #[test]
    fn spot_defaults_to_interruptible_and_others_to_durable() {
        let mut t = tier(ProviderKind::Aws);
        assert_eq!(t.effective_reliability(), Reliability::Durable);
        t.launch_mode = Some(LaunchMode::Spot);
        assert_eq!(t.effective_reliability(), Reliability::Interruptible);
        t.reliability = Some(Reliability::Durable);
        assert_eq!(t.effective_reliability(), Reliability::Durable);
    }

    #[test]
    fn placement_lead_is_five_minutes_for_cloud_and_zero_for_cluster() {
        assert_eq!(tier(ProviderKind::Oci).effective_placement_lead_ms(), 300_000);
        assert_eq!(tier(ProviderKind::LocalServers).effective_placement_lead_ms(), 0);
    }

    #[test]
    fn provision_timeout_defaults_to_twice_the_larger_of_lead_and_five_minutes() {
        assert_eq!(
            tier(ProviderKind::LocalServers).effective_provision_timeout_ms(),
            600_000
        );
        let mut t = tier(ProviderKind::Aws);
        t.placement_lead_ms = Some(900_000);
        assert_eq!(t.effective_provision_timeout_ms(), 1_800_000);
        t.provision_timeout_ms = Some(42);
        assert_eq!(t.effective_provision_timeout_ms(), 42);
    }
}
