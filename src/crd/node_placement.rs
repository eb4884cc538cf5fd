//! `NorskNode.status.placement`: the node exactly as the operator's
//! placement reads it, so the mirrored nodes of a fleet convert back into
//! the fleet snapshot the operator places on ([`NorskNode::fleet_node`],
//! [`fleet_snapshot`]): what `kubectl norsk plan` plans against. Pure; the
//! mirror (`decide::node_status`) writes it, the plugin reads it.

use std::collections::BTreeMap;

use kube::ResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::node::NorskNode;
use crate::model::{FleetNode, FleetSnapshot, HostPort, JobId, NodeId, NodeInventory, NodePhase, PlacedJob, SpareSpec};

/// The most placed jobs `status.placement.jobs` lists: 500 reservations are
/// about 110 KB, well inside an object's size limit however dense the node.
/// The reservations of the jobs past it are summed in
/// `status.placement.omitted`, so free capacity stays exact.
pub const MAX_LISTED_RESERVATIONS: usize = 500;
/// The job id the summed reservations of unlisted jobs are placed under.
const OMITTED_JOB_ID: &str = "(not listed)";

/// The node as the operator's placement sees it: every input of the node's
/// entry in a fleet snapshot (`norsk-auto-manager plan --fleet`).
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePlacementStatus {
    /// The lifecycle phase placement reads: `stopping` as soon as the
    /// operator has terminated the node, even before Manager reports it.
    #[serde(default)]
    pub phase: NodePhase,
    /// The pool (tag `pool`).
    pub pool: Option<String>,
    /// The tier (tag `tier`); a cluster node without one belongs to its
    /// pool's fixed tier.
    pub tier: Option<String>,
    /// No new placement lands here (cordoned by `spec.cordoned`, a drain or
    /// an interruption notice).
    #[serde(default)]
    pub cordoned: bool,
    /// Excluded from placement after repeated job rejections.
    #[serde(default)]
    pub unhealthy: bool,
    /// A hot spare (tag `spare`).
    #[serde(default)]
    pub spare: bool,
    /// The live spare's spec (tags `warmFor`, `reservedFor`, `exclusive`).
    #[serde(default)]
    pub spare_spec: SpareSpec,
    /// Every tag of the node on Manager.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// What placement takes the node to offer: the worker's advertised
    /// inventory or, where Manager reports none, what `spec.inventory`
    /// declares, else the shape it was provisioned as (or its fixed tier's
    /// first candidate). Absent: the node is invisible to placement.
    pub inventory: Option<NodeInventory>,
    /// For each template of the operator's `templateImages`, the images of
    /// it this node holds (what warmth is scored against); templates of
    /// which it holds none are left out.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub template_images: BTreeMap<String, Vec<String>>,
    /// What each job placed here reserves (a migration's target included),
    /// in job id order: the first 500; `omitted` sums the rest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<PlacedJob>,
    /// The summed reservations of the placed jobs past the first 500, so
    /// free capacity stays exact on however dense a node.
    pub omitted: Option<OmittedReservations>,
}

/// What the placed jobs a status does not list reserve, summed. Their
/// capacity, cores, GPU capacity and host ports count; who they are (bundle,
/// replica) is not known to a plan read from the status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OmittedReservations {
    /// How many placed jobs are not listed.
    pub jobs: u32,
    /// vCPUs they reserve.
    #[serde(default)]
    pub required_capacity: f64,
    /// Cores they reserve.
    #[serde(default)]
    pub required_cores: u32,
    /// GPU capacity they reserve, by device index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_gpu_capacity: Vec<f64>,
    /// GPU capacity they reserve on no known device (charged to every
    /// device, as placement charges such a job).
    #[serde(default)]
    pub required_gpu_capacity_unplaced: f64,
    /// Host ports they claim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_host_ports: Vec<HostPort>,
    /// One of them holds the node exclusively.
    #[serde(default)]
    pub exclusive: bool,
}

/// Why a `NorskNode` does not convert into a node of a fleet snapshot.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum NodeStatusError {
    /// The status carries no `placement`.
    #[error("no status.placement: the operator has not mirrored this node yet, or predates it")]
    NotMirrored,
    /// The object does not read as a `NorskNode`.
    #[error("not a NorskNode as this version reads it: {0}")]
    Undecodable(String),
    /// Another `NorskNode` of the fleet mirrors the same node id: which one
    /// tells the truth cannot be known, so neither is planned on.
    #[error("NorskNode {other} of this fleet mirrors the same node id; neither is planned on")]
    MirroredTwice {
        /// The other resource's name.
        other: String,
    },
    /// A capacity or reservation below zero.
    #[error("status.placement.{field} is {value}; it cannot be negative")]
    Negative {
        /// The field's path under `status.placement`.
        field: String,
        value: f64,
    },
}

impl NodePlacementStatus {
    /// What `node` reads as, with the images of each of `template_images`
    /// it holds. Jobs past [`MAX_LISTED_RESERVATIONS`] are summed into
    /// `omitted`.
    pub fn of(node: &FleetNode, template_images: &BTreeMap<String, Vec<String>>) -> Self {
        let listed = node.jobs.len().min(MAX_LISTED_RESERVATIONS);
        let (jobs, rest) = node.jobs.split_at(listed);
        Self {
            phase: node.phase,
            pool: node.pool.clone(),
            tier: node.tier.clone(),
            cordoned: node.cordoned,
            unhealthy: node.unhealthy,
            spare: node.spare,
            spare_spec: node.spare_spec.clone(),
            tags: node.tags.clone(),
            inventory: node.inventory.clone(),
            template_images: held_template_images(node.inventory.as_ref(), template_images),
            jobs: jobs.to_vec(),
            omitted: (!rest.is_empty()).then(|| OmittedReservations::of(rest)),
        }
    }

    fn check(&self) -> Result<(), NodeStatusError> {
        let mut values: Vec<(String, f64)> = Vec::new();
        if let Some(inventory) = &self.inventory {
            values.push(("inventory.totalCapacity".to_owned(), inventory.total_capacity));
            values.push(("inventory.reservedCapacity".to_owned(), inventory.reserved_capacity));
            for (i, gpu) in inventory.gpus.iter().enumerate() {
                values.push((format!("inventory.gpus[{i}].totalCapacity"), gpu.total_capacity));
            }
        }
        for (i, job) in self.jobs.iter().enumerate() {
            values.push((format!("jobs[{i}].requiredCapacity"), job.required_capacity));
            values.push((format!("jobs[{i}].requiredGpuCapacity"), job.required_gpu_capacity));
        }
        if let Some(omitted) = &self.omitted {
            values.push(("omitted.requiredCapacity".to_owned(), omitted.required_capacity));
            values.push((
                "omitted.requiredGpuCapacityUnplaced".to_owned(),
                omitted.required_gpu_capacity_unplaced,
            ));
            for (i, capacity) in omitted.required_gpu_capacity.iter().enumerate() {
                values.push((format!("omitted.requiredGpuCapacity[{i}]"), *capacity));
            }
        }
        match values.into_iter().find(|(_, value)| *value < 0.0) {
            Some((field, value)) => Err(NodeStatusError::Negative { field, value }),
            None => Ok(()),
        }
    }
}

/// For each template, the images of it `inventory` holds (templates of
/// which it holds none left out): enough for warmth, which counts only the
/// template's images a node holds.
fn held_template_images(
    inventory: Option<&NodeInventory>,
    template_images: &BTreeMap<String, Vec<String>>,
) -> BTreeMap<String, Vec<String>> {
    let Some(inventory) = inventory.filter(|i| !i.images.is_empty()) else {
        return BTreeMap::new();
    };
    template_images
        .iter()
        .filter_map(|(template, images)| {
            let held: Vec<String> = images
                .iter()
                .filter(|i| inventory.images.contains(i))
                .cloned()
                .collect();
            (!held.is_empty()).then(|| (template.clone(), held))
        })
        .collect()
}

impl OmittedReservations {
    fn of(jobs: &[PlacedJob]) -> Self {
        let mut sum = Self {
            jobs: u32::try_from(jobs.len()).unwrap_or(u32::MAX),
            ..Self::default()
        };
        for job in jobs {
            sum.required_capacity += job.required_capacity;
            sum.required_cores = sum.required_cores.saturating_add(job.required_cores);
            sum.exclusive |= job.exclusive;
            sum.required_host_ports.extend(&job.required_host_ports);
            if job.required_gpu_capacity > 0.0 {
                match job.gpu_index.and_then(|i| usize::try_from(i).ok()) {
                    Some(device) => {
                        if sum.required_gpu_capacity.len() <= device {
                            sum.required_gpu_capacity.resize(device + 1, 0.0);
                        }
                        sum.required_gpu_capacity[device] += job.required_gpu_capacity;
                    }
                    None => sum.required_gpu_capacity_unplaced += job.required_gpu_capacity,
                }
            }
        }
        sum
    }

    /// The sums as placed jobs placement can reserve: one for capacity,
    /// cores, ports and exclusivity, one per GPU device in use, one for GPU
    /// capacity on no known device.
    fn placed_jobs(&self) -> Vec<PlacedJob> {
        let unlisted = |suffix: String| PlacedJob {
            job_id: JobId(format!("{OMITTED_JOB_ID}{suffix}")),
            ..PlacedJob::default()
        };
        let devices = self
            .required_gpu_capacity
            .iter()
            .enumerate()
            .filter(|(_, capacity)| **capacity > 0.0)
            .map(|(device, capacity)| PlacedJob {
                required_gpu_capacity: *capacity,
                gpu_index: u32::try_from(device).ok(),
                ..unlisted(format!("/gpu/{device}"))
            });
        let unplaced = (self.required_gpu_capacity_unplaced > 0.0).then(|| PlacedJob {
            required_gpu_capacity: self.required_gpu_capacity_unplaced,
            ..unlisted("/gpu".to_owned())
        });
        std::iter::once(PlacedJob {
            required_capacity: self.required_capacity,
            required_cores: self.required_cores,
            required_host_ports: self.required_host_ports.clone(),
            exclusive: self.exclusive,
            ..unlisted(String::new())
        })
        .chain(devices)
        .chain(unplaced)
        .collect()
    }
}

impl NorskNode {
    /// The node of a fleet snapshot this resource mirrors, exactly as the
    /// operator's placement sees it (unlisted jobs' reservations summed
    /// into placeholder jobs).
    pub fn fleet_node(&self) -> Result<FleetNode, NodeStatusError> {
        let placement = self
            .status
            .as_ref()
            .and_then(|s| s.placement.as_ref())
            .ok_or(NodeStatusError::NotMirrored)?;
        placement.check()?;
        let mut jobs = placement.jobs.clone();
        jobs.extend(placement.omitted.iter().flat_map(OmittedReservations::placed_jobs));
        Ok(FleetNode {
            id: NodeId(self.spec.node_id.clone()),
            pool: placement.pool.clone(),
            tier: placement.tier.clone(),
            phase: placement.phase,
            cordoned: placement.cordoned,
            unhealthy: placement.unhealthy,
            spare: placement.spare,
            spare_spec: placement.spare_spec.clone(),
            tags: placement.tags.clone(),
            inventory: placement.inventory.clone(),
            jobs,
        })
    }
}

/// A `NorskNode` left out of a fleet snapshot, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct SkippedNode {
    /// The resource name.
    pub name: String,
    /// Manager's node id (`spec.nodeId`), when the object could be read.
    pub node_id: Option<String>,
    /// Why it was left out.
    pub reason: NodeStatusError,
}

impl std::fmt::Display for SkippedNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "norsknode/{}", self.name)?;
        if let Some(id) = self.node_id.as_deref().filter(|id| *id != self.name) {
            write!(f, " (node {id})")?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// The fleet snapshot of mirrored `nodes`: every node that converts, in
/// node id order, and the template images they hold (together, what warmth
/// needs of the operator's `templateImages`); each node that does not
/// convert, with why.
pub fn fleet_snapshot<'a>(nodes: impl IntoIterator<Item = &'a NorskNode>) -> (FleetSnapshot, Vec<SkippedNode>) {
    let mut snapshot = FleetSnapshot::default();
    let mut skipped = Vec::new();
    let mut nodes_by_id: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for node in nodes {
        match node.fleet_node() {
            Ok(fleet_node) => {
                nodes_by_id
                    .entry(fleet_node.id.0.clone())
                    .or_default()
                    .push(node.name_any());
                let held = node
                    .status
                    .iter()
                    .flat_map(|s| &s.placement)
                    .flat_map(|p| &p.template_images);
                for (template, images) in held {
                    let known = snapshot.template_images.entry(template.clone()).or_default();
                    for image in images {
                        if !known.contains(image) {
                            known.push(image.clone());
                        }
                    }
                }
                snapshot.nodes.push(fleet_node);
            }
            Err(reason) => skipped.push(SkippedNode {
                name: node.name_any(),
                node_id: Some(node.spec.node_id.clone()),
                reason,
            }),
        }
    }
    snapshot.nodes.sort_by(|a, b| a.id.cmp(&b.id));
    leave_out_mirrored_twice(&mut snapshot, nodes_by_id, &mut skipped);
    (snapshot, skipped)
}

/// Takes every node id mirrored by more than one resource out of
/// `snapshot`, each copy reported with the other's name.
fn leave_out_mirrored_twice(
    snapshot: &mut FleetSnapshot,
    names: BTreeMap<String, Vec<String>>,
    skipped: &mut Vec<SkippedNode>,
) {
    for (node_id, names) in names.into_iter().filter(|(_, names)| names.len() > 1) {
        snapshot.nodes.retain(|n| n.id.0 != node_id);
        for (i, name) in names.iter().enumerate() {
            let other = names[if i == 0 { 1 } else { 0 }].clone();
            skipped.push(SkippedNode {
                name: name.clone(),
                node_id: Some(node_id.clone()),
                reason: NodeStatusError::MirroredTwice { other },
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{NorskNodeSpec, NorskNodeStatus};
    use crate::model::{BundleId, Gpu, ProviderKind};

    fn gpu_node() -> FleetNode {
        let spare_spec = SpareSpec {
            warm_for: vec!["encoder".to_owned()],
            reserved_for: vec!["transcoder".to_owned()],
            exclusive: true,
        };
        let mut tags: BTreeMap<String, String> = [("pool", "production"), ("tier", "on-demand"), ("spare", "true")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        for (tag, value) in spare_spec.tag_values() {
            if let Some(value) = value {
                tags.insert(tag.to_owned(), value);
            }
        }
        FleetNode {
            id: NodeId("aws/i-0gpu".to_owned()),
            pool: Some("production".to_owned()),
            tier: Some("on-demand".to_owned()),
            phase: NodePhase::Running,
            cordoned: true,
            unhealthy: true,
            spare: true,
            spare_spec,
            tags,
            inventory: Some(NodeInventory {
                kind: ProviderKind::Aws,
                region: "eu-west-1".to_owned(),
                az: "eu-west-1b".to_owned(),
                instance_type: "g4dn.12xlarge".to_owned(),
                total_capacity: 48.0,
                total_cores: 24,
                utilization_cap: 0.9,
                reserved_capacity: 1.5,
                capabilities: vec!["norsk.io/nvidia-gpu".to_owned()],
                gpus: vec![
                    Gpu {
                        model: "t4".to_owned(),
                        total_capacity: 1.0,
                    },
                    Gpu {
                        model: "a10g".to_owned(),
                        total_capacity: 2.0,
                    },
                ],
                images: vec!["registry.example/encoder:1".to_owned(), "base:1".to_owned()],
                nics: Vec::new(),
            }),
            jobs: vec![
                placed("news", 0, "encode", 4.0, None),
                placed("news", 1, "transcode", 2.0, Some((1, 0.5))),
            ],
        }
    }

    fn placed(bundle: &str, replica: u32, job: &str, capacity: f64, gpu: Option<(u32, f64)>) -> PlacedJob {
        PlacedJob {
            job_id: JobId(format!("studio/{bundle}/{replica}/{job}")),
            bundle: Some(BundleId(format!("studio/{bundle}"))),
            replica_index: replica,
            job_name: job.to_owned(),
            template: job.to_owned(),
            required_capacity: capacity,
            required_cores: 1,
            required_host_ports: vec!["1935/tcp".parse().unwrap()],
            required_gpu_capacity: gpu.map_or(0.0, |(_, c)| c),
            gpu_index: gpu.map(|(i, _)| i),
            exclusive: false,
        }
    }

    /// `node` mirrored, as the operator writes it and the API server returns it (JSON).
    fn mirrored(node: &FleetNode, template_images: &BTreeMap<String, Vec<String>>) -> NorskNode {
        let mut resource = NorskNode::new(
            "mirrored",
            NorskNodeSpec {
                node_id: node.id.0.clone(),
                ..NorskNodeSpec::default()
            },
        );
        resource.status = Some(NorskNodeStatus {
            placement: Some(NodePlacementStatus::of(node, template_images)),
            ..NorskNodeStatus::default()
        });
        let json = serde_json::to_string(&resource).unwrap();
        serde_json::from_str(&json).unwrap()
    }

    #[test]
    fn a_mirrored_node_converts_back_into_the_same_fleet_node() {
        let node = gpu_node();
        assert_eq!(mirrored(&node, &BTreeMap::new()).fleet_node(), Ok(node));
        let bare = FleetNode {
            id: NodeId("cluster-1".to_owned()),
            pool: None,
            tier: None,
            phase: NodePhase::Starting,
            cordoned: false,
            unhealthy: false,
            spare: false,
            spare_spec: SpareSpec::default(),
            tags: BTreeMap::new(),
            inventory: None,
            jobs: Vec::new(),
        };
        assert_eq!(mirrored(&bare, &BTreeMap::new()).fleet_node(), Ok(bare));
    }

    #[test]
    fn a_status_lists_at_most_the_bound_and_sums_the_rest_so_capacity_stays_exact() {
        let mut node = gpu_node();
        node.jobs = (0..MAX_LISTED_RESERVATIONS as u32 + 3)
            .map(|i| placed(&format!("b{i:04}"), 0, "encode", 0.01, Some((i % 3, 0.001))))
            .collect();
        node.jobs.last_mut().unwrap().exclusive = true;
        let status = NodePlacementStatus::of(&node, &BTreeMap::new());
        assert_eq!(status.jobs.len(), MAX_LISTED_RESERVATIONS);
        let omitted = status.omitted.clone().expect("the rest summed");
        assert_eq!(omitted.jobs, 3);
        assert!(omitted.exclusive);
        assert_eq!(omitted.required_host_ports.len(), 3);
        let back = mirrored(&node, &BTreeMap::new()).fleet_node().unwrap();
        let total = |jobs: &[PlacedJob]| jobs.iter().map(|j| j.required_capacity).sum::<f64>();
        assert!((total(&back.jobs) - total(&node.jobs)).abs() < 1e-9);
        let cores = |jobs: &[PlacedJob]| jobs.iter().map(|j| j.required_cores).sum::<u32>();
        assert_eq!(cores(&back.jobs), cores(&node.jobs));
        for device in 0..3 {
            let on = |jobs: &[PlacedJob]| {
                jobs.iter()
                    .filter(|j| j.gpu_index == Some(device))
                    .map(|j| j.required_gpu_capacity)
                    .sum::<f64>()
            };
            assert!((on(&back.jobs) - on(&node.jobs)).abs() < 1e-9, "device {device}");
        }
        assert!(back.jobs.iter().any(|j| j.exclusive && j.job_id.0 == OMITTED_JOB_ID));
    }

    #[test]
    fn a_node_reports_the_template_images_it_holds_and_the_fleet_gathers_them() {
        let templates = BTreeMap::from([
            (
                "encoder".to_owned(),
                vec![
                    "registry.example/encoder:1".to_owned(),
                    "registry.example/encoder-lib:1".to_owned(),
                ],
            ),
            ("packager".to_owned(), vec!["registry.example/packager:1".to_owned()]),
        ]);
        let warm = mirrored(&gpu_node(), &templates);
        let held = &warm
            .status
            .as_ref()
            .unwrap()
            .placement
            .as_ref()
            .unwrap()
            .template_images;
        assert_eq!(
            held,
            &BTreeMap::from([("encoder".to_owned(), vec!["registry.example/encoder:1".to_owned()])])
        );
        let mut other = gpu_node();
        other.id = NodeId("aws/i-0other".to_owned());
        other.inventory.as_mut().unwrap().images = vec!["registry.example/encoder-lib:1".to_owned()];
        let (snapshot, skipped) = fleet_snapshot([&mirrored(&other, &templates), &warm]);
        assert!(skipped.is_empty());
        assert_eq!(snapshot.nodes[0].id.0, "aws/i-0gpu", "node id order");
        assert_eq!(snapshot.template_images.len(), 1);
        let sorted = |images: &[String]| {
            let mut images = images.to_vec();
            images.sort();
            images
        };
        assert_eq!(
            sorted(&snapshot.template_images["encoder"]),
            sorted(&templates["encoder"])
        );
    }

    #[test]
    fn a_node_without_placement_or_with_a_negative_capacity_is_skipped_with_why() {
        let unmirrored = NorskNode::new(
            "fresh",
            NorskNodeSpec {
                node_id: "fresh".to_owned(),
                ..NorskNodeSpec::default()
            },
        );
        assert_eq!(unmirrored.fleet_node(), Err(NodeStatusError::NotMirrored));
        let mut node = gpu_node();
        node.jobs[1].required_capacity = -2.0;
        let broken = mirrored(&node, &BTreeMap::new());
        let good = mirrored(&gpu_node(), &BTreeMap::new());
        let (snapshot, skipped) = fleet_snapshot([&unmirrored, &broken, &good]);
        assert_eq!(snapshot.nodes.len(), 1);
        assert_eq!(skipped.len(), 2);
        assert_eq!(
            skipped[1].reason,
            NodeStatusError::Negative {
                field: "jobs[1].requiredCapacity".to_owned(),
                value: -2.0
            }
        );
        let said = skipped[1].to_string();
        assert!(
            said.starts_with("norsknode/mirrored (node aws/i-0gpu): status.placement.jobs[1].requiredCapacity is -2"),
            "{said}"
        );
    }

    #[test]
    fn a_node_id_mirrored_twice_is_left_out_with_both_copies_named() {
        let first = mirrored(&gpu_node(), &BTreeMap::new());
        let mut second = mirrored(&gpu_node(), &BTreeMap::new());
        second.metadata.name = Some("by-hand".to_owned());
        let mut other = gpu_node();
        other.id = crate::model::NodeId::from("other");
        let other = mirrored(&other, &BTreeMap::new());
        let (snapshot, skipped) = fleet_snapshot([&first, &second, &other]);
        assert_eq!(
            snapshot.nodes.iter().map(|n| n.id.0.as_str()).collect::<Vec<_>>(),
            vec!["other"]
        );
        let reasons: Vec<(String, NodeStatusError)> = skipped.into_iter().map(|s| (s.name, s.reason)).collect();
        assert_eq!(
            reasons,
            vec![
                (
                    "mirrored".to_owned(),
                    NodeStatusError::MirroredTwice {
                        other: "by-hand".to_owned()
                    }
                ),
                (
                    "by-hand".to_owned(),
                    NodeStatusError::MirroredTwice {
                        other: "mirrored".to_owned()
                    }
                ),
            ]
        );
    }
}
