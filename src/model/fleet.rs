//! The fleet snapshot: every node with its inventory and the jobs placed on
//! it. It is what placement reads, what `plan --fleet` loads and what the
//! simulator's `snapshot` prints (so a captured fleet can be planned offline).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{BundleId, HostPort, JobId, NodeId, NodeInventory, NodePhase, SpareSpec};

/// A job placed on a node, with what it reserves there.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacedJob {
    /// The runtime job id.
    pub job_id: JobId,
    /// The bundle it was expanded from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<BundleId>,
    /// Replica index within the bundle.
    #[serde(default)]
    pub replica_index: u32,
    /// Job name within the bundle.
    #[serde(default)]
    pub job_name: String,
    /// The template it runs.
    #[serde(default)]
    pub template: String,
    /// vCPUs reserved.
    #[serde(default)]
    pub required_capacity: f64,
    /// Cores reserved.
    #[serde(default)]
    pub required_cores: u32,
    /// Host ports claimed.
    #[serde(default)]
    pub required_host_ports: Vec<HostPort>,
    /// GPU capacity reserved on device `gpuIndex`.
    #[serde(default)]
    pub required_gpu_capacity: f64,
    /// The GPU device the job was placed on.
    #[serde(default)]
    pub gpu_index: Option<u32>,
    /// The job holds the node exclusively (with its co-located peers).
    #[serde(default)]
    pub exclusive: bool,
}

/// One node of the fleet snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetNode {
    /// The node id.
    pub id: NodeId,
    /// The pool (provisioned nodes carry it as a tag; a cluster node must).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The tier; a cluster node without one belongs to its pool's fixed tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// Lifecycle phase.
    #[serde(default)]
    pub phase: NodePhase,
    /// No new placements land here.
    #[serde(default)]
    pub cordoned: bool,
    /// Excluded after repeated rejections.
    #[serde(default)]
    pub unhealthy: bool,
    /// Tagged as a hot spare.
    #[serde(default)]
    pub spare: bool,
    /// The spare's warmth and reservation.
    #[serde(default)]
    pub spare_spec: SpareSpec,
    /// Every tag of the node.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// What the worker advertises; `None` makes the node invisible to
    /// placement.
    #[serde(default)]
    pub inventory: Option<NodeInventory>,
    /// Jobs placed on the node.
    #[serde(default)]
    pub jobs: Vec<PlacedJob>,
}

impl FleetNode {
    /// An unconsumed spare: tagged spare and carrying no job. Only these
    /// count as reserve; a spare that took a job is an ordinary node.
    pub fn is_unconsumed_spare(&self) -> bool {
        self.spare && self.jobs.is_empty()
    }
}

/// The whole fleet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetSnapshot {
    /// Template name -> image references, what warmth is scored against.
    #[serde(default)]
    pub template_images: BTreeMap<String, Vec<String>>,
    /// Every node.
    #[serde(default)]
    pub nodes: Vec<FleetNode>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_fleet_format_parses() {
        let yaml = r#"
templateImages: {xyz: ["registry.example/encoder:1"]}
nodes:
  - id: node-a
    pool: production
    tier: reserved
    phase: running
    cordoned: false
    unhealthy: false
    spare: false
    spareSpec: {warmFor: [], reservedFor: [], exclusive: false}
    tags: {}
    inventory:
      kind: aws
      region: eu-west-1
      az: eu-west-1a
      instanceType: m5.xlarge
      totalCapacity: 4
      totalCores: 4
      utilizationCap: 1.0
      capabilities: []
      gpus: [{model: t4, totalCapacity: 1.0}]
      images: []
    jobs:
      - {jobId: "default/ch0/0/encode", bundle: default/ch0, replicaIndex: 0, jobName: encode,
         template: xyz, requiredCapacity: 2, requiredCores: 0, requiredHostPorts: ["1935/tcp"],
         requiredGpuCapacity: 0, gpuIndex: null, exclusive: false}
"#;
        let fleet: FleetSnapshot = yaml_serde::from_str(yaml).unwrap();
        let node = &fleet.nodes[0];
        assert_eq!(node.phase, NodePhase::Running);
        assert_eq!(node.inventory.as_ref().unwrap().gpus[0].model, "t4");
        assert_eq!(node.jobs[0].required_host_ports[0].to_string(), "1935/tcp");
        assert!(!node.is_unconsumed_spare());
    }
}
