//! The synthetic placement workload shared by `bench placement` and the
//! criterion benchmarks: a fleet of `nodes` nodes in one pool of three tiers
//! (cluster servers, reserved and on-demand EC2) carrying `placed_jobs`
//! jobs, with capabilities, host ports, GPUs, AZs, held images and hot
//! spares mixed in; plus a stream of bundles to place. Deterministic for a
//! seed.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::model::{
    BundleId, BundleSpec, FleetNode, FleetSnapshot, Gpu, HostPort, NodeId, NodeInventory, NodePhase, PlacedJob,
    PlacementPool, ProviderKind, SpareSpec,
};

/// Pools, fleet and the bundles to place.
#[derive(Clone, Debug)]
pub struct Workload {
    /// One pool, `production`, with tiers `cluster`, `reserved`, `on-demand`.
    pub pools: Vec<PlacementPool>,
    pub fleet: FleetSnapshot,
    /// Bundles to place one after another.
    pub bundles: Vec<(BundleId, BundleSpec)>,
}

const POOLS: &str = r#"
- name: production
  tiers:
    - {name: cluster, kind: local-servers, scaleOut: fixed, packingStrategy: binpack}
    - name: reserved
      kind: aws
      region: eu-west-1
      scaleOut: elastic
      launchMode: reserved
      packingStrategy: binpack
      candidateInstanceTypes:
        - {instanceType: m5.2xlarge, totalCapacity: 8, totalCores: 8}
        - {instanceType: g4dn.xlarge, totalCapacity: 4, totalCores: 4, capabilities: [norsk.io/nvidia-gpu], gpus: [{model: t4, totalCapacity: 1}]}
    - name: on-demand
      kind: aws
      region: eu-west-1
      scaleOut: elastic
      launchMode: spot
      packingStrategy: spread
      candidateInstanceTypes:
        - {instanceType: m5.2xlarge, totalCapacity: 8, totalCores: 8}
        - {instanceType: c5.4xlarge, totalCapacity: 16, totalCores: 16, capabilities: [sdi]}
        - {instanceType: g4dn.xlarge, totalCapacity: 4, totalCores: 4, capabilities: [norsk.io/nvidia-gpu], gpus: [{model: t4, totalCapacity: 1}]}
"#;

const ENCODER_IMAGE: &str = "registry.example/encoder:1";

/// Builds the workload: `nodes` nodes carrying up to `placed_jobs` jobs
/// (each placed only where it fits), and `placements` single-job bundles
/// (every tenth with a backup, so slightly more placements than bundles).
pub fn workload(nodes: usize, placed_jobs: usize, placements: usize, seed: u64) -> Workload {
    let mut rng = StdRng::seed_from_u64(seed);
    // A constant the tests below parse: it cannot fail at run time.
    let pools: Vec<PlacementPool> = yaml_serde::from_str(POOLS).expect("the workload's pools parse");
    let mut fleet_nodes: Vec<FleetNode> = (0..nodes).map(|i| node(i, &mut rng)).collect();
    for j in 0..placed_jobs {
        let n = rng.random_range(0..fleet_nodes.len().max(1));
        if let Some(node) = fleet_nodes.get_mut(n) {
            place_background_job(node, j, &mut rng);
        }
    }
    let mut template_images = BTreeMap::new();
    template_images.insert("encoder".to_owned(), vec![ENCODER_IMAGE.to_owned()]);
    template_images.insert("packager".to_owned(), vec!["registry.example/packager:1".to_owned()]);
    let bundles = (0..placements)
        .map(|i| (BundleId(format!("bench/b{i}")), bundle(i)))
        .collect();
    Workload {
        pools,
        fleet: FleetSnapshot {
            template_images,
            nodes: fleet_nodes,
        },
        bundles,
    }
}

fn node(i: usize, rng: &mut StdRng) -> FleetNode {
    // 20% cluster servers, 50% reserved, 30% on-demand; 1 in 10 reserved or
    // on-demand nodes has a GPU; 1 in 50 reserved nodes is a hot spare.
    let roll = rng.random_range(0..100);
    let (tier, kind, capacity, capabilities) = match roll {
        0..20 => (None, ProviderKind::LocalServers, 16.0, vec!["sdi".to_owned()]),
        20..70 => (Some("reserved"), ProviderKind::Aws, 8.0, vec![]),
        _ => (Some("on-demand"), ProviderKind::Aws, 8.0, vec![]),
    };
    let gpu = tier.is_some() && rng.random_bool(0.1);
    let spare = tier == Some("reserved") && !gpu && rng.random_bool(0.02);
    let mut capabilities = capabilities;
    if gpu {
        capabilities.push("norsk.io/nvidia-gpu".to_owned());
    }
    let images = if rng.random_bool(0.5) {
        vec![ENCODER_IMAGE.to_owned()]
    } else {
        vec![]
    };
    FleetNode {
        id: NodeId(format!("node-{i:06}")),
        pool: Some("production".to_owned()),
        tier: tier.map(str::to_owned),
        phase: if rng.random_bool(0.02) {
            NodePhase::Starting
        } else {
            NodePhase::Running
        },
        cordoned: rng.random_bool(0.01),
        unhealthy: false,
        spare,
        spare_spec: SpareSpec {
            warm_for: vec!["encoder".to_owned()],
            reserved_for: if spare { vec!["encoder".to_owned()] } else { vec![] },
            exclusive: spare && rng.random_bool(0.5),
        },
        tags: BTreeMap::new(),
        inventory: Some(NodeInventory {
            kind,
            region: "eu-west-1".to_owned(),
            az: format!("eu-west-1{}", ['a', 'b', 'c'][rng.random_range(0..3)]),
            instance_type: if gpu { "g4dn.xlarge" } else { "m5.2xlarge" }.to_owned(),
            total_capacity: capacity,
            total_cores: capacity as u32,
            utilization_cap: 1.0,
            reserved_capacity: 0.0,
            capabilities,
            gpus: if gpu {
                vec![Gpu {
                    model: "t4".to_owned(),
                    total_capacity: 1.0,
                }]
            } else {
                vec![]
            },
            images,
            nics: vec![],
        }),
        jobs: Vec::new(),
    }
}

fn place_background_job(node: &mut FleetNode, j: usize, rng: &mut StdRng) {
    if node.spare {
        return;
    }
    let Some(inventory) = &node.inventory else {
        return;
    };
    let capacity = [0.25, 0.5, 1.0, 1.0, 2.0][rng.random_range(0..5)];
    let used: f64 = node.jobs.iter().map(|j| j.required_capacity).sum();
    if used + capacity > inventory.total_capacity {
        return;
    }
    let gpu = !inventory.gpus.is_empty() && rng.random_bool(0.5);
    let used_gpu: f64 = node.jobs.iter().map(|j| j.required_gpu_capacity).sum();
    let port = HostPort {
        port: 10_000 + (j % 50_000) as u16,
        protocol: crate::model::PortProtocol::Udp,
    };
    let bundle = BundleId(format!("background/b{}", j / 2));
    node.jobs.push(PlacedJob {
        job_id: crate::model::runtime_job_id(&bundle, (j % 2) as u32, "encode"),
        bundle: Some(bundle),
        replica_index: (j % 2) as u32,
        job_name: "encode".to_owned(),
        template: "encoder".to_owned(),
        required_capacity: capacity,
        required_cores: 0,
        required_host_ports: vec![port],
        required_gpu_capacity: if gpu && used_gpu + 0.25 <= 1.0 { 0.25 } else { 0.0 },
        gpu_index: (gpu && used_gpu + 0.25 <= 1.0).then_some(0),
        exclusive: false,
    });
}

fn bundle(i: usize) -> BundleSpec {
    let yaml = match i % 10 {
        0..4 => format!(
            "pool: production\njobs: [{{jobName: encode, template: encoder, requirements: {{requiredCapacity: 1, requiredHostPorts: [{}/tcp]}}}}]",
            20_000 + i % 40_000
        ),
        4 | 5 => "pool: production\njobs: [{jobName: package, template: packager, requirements: {requiredCapacity: 0.5}}]".to_owned(),
        6 => "pool: production\njobs: [{jobName: transcode, template: encoder, requirements: {requiredCapacity: 1, requiredGpuCapacity: 0.25, requiredCapabilities: [norsk.io/nvidia-gpu]}}]".to_owned(),
        7 | 8 => "pool: production\njobs: [{jobName: ingest, template: encoder, requirements: {requiredCapacity: 2, requiredCores: 2, requiredCapabilities: [sdi]}}]".to_owned(),
        _ => "pool: production\nresiliencePolicy: {sameNode: forbid, sameAz: forbid}\njobs: [{jobName: encode, template: encoder, requirements: {requiredCapacity: 1, requiredHostPorts: [1935/tcp]}}]".to_owned(),
    };
    // Constants the tests below parse: they cannot fail at run time.
    yaml_serde::from_str(&yaml).expect("the workload's bundles parse")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{FleetView, validate_pools};

    #[test]
    fn the_workload_is_deterministic_and_builds_a_valid_fleet() {
        let a = workload(200, 2_000, 10, 7);
        let b = workload(200, 2_000, 10, 7);
        assert_eq!(a.fleet, b.fleet);
        assert_eq!(a.bundles.len(), 10);
        let jobs: usize = a.fleet.nodes.iter().map(|n| n.jobs.len()).sum();
        assert!(jobs > 1_000, "most background jobs fit ({jobs})");
        let pools = validate_pools(a.pools).unwrap();
        assert!(FleetView::new(&a.fleet, pools).is_ok());
    }
}
