//! What the equivalence property runs on: the pools, random fleets (node
//! and job descriptions) and random bundles.

use std::collections::{BTreeMap, BTreeSet};

use norsk_auto_manager::model::{
    BundleId, BundleSpec, FleetNode, Gpu, HostPort, JobSpec, NodeId, NodeInventory, NodePhase, PlacedJob,
    PlacementPool, PortProtocol, ProviderKind, SpareSpec,
};
use proptest::prelude::*;

const POOLS: &str = "
- name: main
  tiers:
    - {name: cluster, kind: local-servers, scaleOut: fixed}
    - name: reserved
      kind: aws
      scaleOut: elastic
      maxNodes: 4
      candidateInstanceTypes:
        - {instanceType: small, totalCapacity: 2, totalCores: 2}
        - {instanceType: gpu, totalCapacity: 4, totalCores: 4, capabilities: [gpu], gpus: [{model: t4, totalCapacity: 1}]}
    - name: spot
      kind: aws
      scaleOut: elastic
      launchMode: spot
      packingStrategy: spread
      candidateInstanceTypes: [{instanceType: big, totalCapacity: 8, totalCores: 8, capabilities: [sdi, c66]}]
- name: dr
  tiers:
    - {name: edge, kind: oci, scaleOut: fixed, packingStrategy: spread}
    - {name: oci, kind: oci, scaleOut: elastic, maxNodes: 2, candidateInstanceTypes: [{instanceType: flex, totalCapacity: 4, totalCores: 4}]}
";

/// Bundle ids the requests use; the snapshot holds jobs of some of them.
pub(super) const BUNDLES: usize = 6;
/// Job names of the request bundles.
pub(super) const JOB_NAMES: [&str; 4] = ["j0", "j1", "j2", "j3"];

pub(super) fn pools() -> Vec<PlacementPool> {
    yaml_serde::from_str(POOLS).unwrap()
}

pub(super) fn template_images() -> BTreeMap<String, Vec<String>> {
    BTreeMap::from([
        ("t1".to_owned(), vec!["img1".to_owned()]),
        ("t2".to_owned(), vec!["img2".to_owned(), "img3".to_owned()]),
        // Enough images that some ids lie past the hot mask's 64.
        ("t3".to_owned(), (0..70).map(|i| format!("w{i}")).collect()),
    ])
}

pub(super) fn port(n: u16) -> HostPort {
    HostPort {
        port: 1000 + n,
        protocol: if n.is_multiple_of(2) {
            PortProtocol::Tcp
        } else {
            PortProtocol::Udp
        },
    }
}

/// A job on a node of the snapshot or added later.
#[derive(Clone, Debug)]
pub(super) struct JobDesc {
    pub(super) bundle: Option<usize>,
    pub(super) replica: u32,
    pub(super) name: usize,
    pub(super) template: &'static str,
    pub(super) capacity: f64,
    pub(super) cores: u32,
    pub(super) ports: Vec<u16>,
    pub(super) gpu: Option<(f64, Option<u32>)>,
    pub(super) exclusive: bool,
}

prop_compose! {
    pub(super) fn job_desc(fuzzy: bool)(
        bundle in prop::option::weighted(0.6, 0..BUNDLES),
        replica in 0..2u32,
        name in 0..JOB_NAMES.len(),
        template in prop::sample::select(vec!["t1", "t2", "t3", "t4"]),
        capacity in if fuzzy {
            prop::sample::select(vec![0.0, 0.1, 0.3, 0.5, 0.7, 1.0, f64::INFINITY]).boxed()
        } else {
            prop::sample::select(vec![0.0, 0.5, 1.0, 2.0]).boxed()
        },
        cores in prop::sample::select(vec![0u32, 0, 1, 2]),
        ports in prop::collection::vec(0..6u16, 0..2),
        gpu in prop::option::weighted(0.3, (
            if fuzzy { prop::sample::select(vec![0.2, 0.25, 0.35]).boxed() } else { prop::sample::select(vec![0.25, 0.5]).boxed() },
            prop::option::of(0..3u32),
        )),
        exclusive in prop::bool::weighted(0.1),
    ) -> JobDesc {
        JobDesc { bundle, replica, name, template, capacity, cores, ports, gpu, exclusive }
    }
}

impl JobDesc {
    pub(super) fn placed(&self, node: usize, j: usize) -> PlacedJob {
        let (bundle, job_name) = match self.bundle {
            Some(b) => (bundle_id(b), JOB_NAMES[self.name].to_owned()),
            None => (BundleId::from("bg/other"), format!("bg-{node}-{j}")),
        };
        let mut ports: Vec<HostPort> = self.ports.iter().map(|&p| port(p)).collect();
        ports.sort();
        ports.dedup();
        PlacedJob {
            job_id: format!("{bundle}/{}/{job_name}", self.replica).as_str().into(),
            bundle: Some(bundle),
            replica_index: self.replica,
            job_name,
            template: self.template.to_owned(),
            required_capacity: self.capacity,
            required_cores: self.cores,
            required_host_ports: ports,
            required_gpu_capacity: self.gpu.map_or(0.0, |(c, _)| c),
            gpu_index: self.gpu.and_then(|(_, i)| i),
            exclusive: self.exclusive,
        }
    }
}

/// A node's description, its id given when it joins.
#[derive(Clone, Debug)]
pub(super) struct NodeDesc {
    place: usize,
    phase: NodePhase,
    cordoned: bool,
    unhealthy: bool,
    inventory: bool,
    spare: bool,
    reserved_for: Vec<&'static str>,
    exclusive: bool,
    kind: Option<ProviderKind>,
    capacity: f64,
    cap: f64,
    reserved: f64,
    cores: u32,
    capabilities: Vec<&'static str>,
    gpus: Vec<(&'static str, f64)>,
    az: usize,
    images: Vec<&'static str>,
    pub(super) jobs: Vec<JobDesc>,
}

prop_compose! {
    pub(super) fn node_desc(fuzzy: bool)(
        place in 0..8usize,
        phase in prop_oneof![
            6 => Just(NodePhase::Running),
            1 => Just(NodePhase::Starting),
            1 => Just(NodePhase::Prospective),
            1 => Just(NodePhase::Stopping),
            1 => Just(NodePhase::Stopped),
        ],
        cordoned in prop::bool::weighted(0.1),
        unhealthy in prop::bool::weighted(0.1),
        inventory in prop::bool::weighted(0.95),
        spare in prop::bool::weighted(0.25),
        reserved_for in prop::sample::select(vec![vec![], vec![], vec!["t1"], vec!["t1", "t2"], vec!["t3"]]),
        exclusive in prop::bool::ANY,
        kind in prop::option::weighted(0.2, prop::sample::select(vec![ProviderKind::Aws, ProviderKind::Oci, ProviderKind::LocalServers])),
        capacity in prop::sample::select(vec![0.0, 1.0, 2.0, 4.0, 4.0, 8.0]),
        cap in if fuzzy {
            prop::sample::select(vec![0.3, 0.5, 1.0, 2.0, 0.0]).boxed()
        } else {
            prop::sample::select(vec![0.5, 1.0, 1.0, 2.0, 0.0]).boxed()
        },
        reserved in prop::sample::select(vec![0.0, 0.0, 0.0, 1.0]),
        cores in prop::sample::select(vec![0u32, 2, 4, 8]),
        capabilities in prop::sample::subsequence(vec!["gpu", "sdi", "c66", "c5"], 0..=4),
        gpus in prop::collection::vec((
            prop::sample::select(vec!["t4", "a10"]),
            if fuzzy { prop::sample::select(vec![1.0, 0.7, 0.45]).boxed() } else { prop::sample::select(vec![1.0, 0.5, 0.75]).boxed() },
        ), 0..3),
        az in 0..4usize,
        images in prop::sample::subsequence(vec!["img1", "img2", "img3", "w3", "w66", "w69"], 0..=4),
        jobs in prop::collection::vec(job_desc(fuzzy), 0..4),
    ) -> NodeDesc {
        NodeDesc {
            place, phase, cordoned, unhealthy, inventory, spare, reserved_for, exclusive, kind, capacity, cap,
            reserved, cores, capabilities, gpus, az, images, jobs,
        }
    }
}

impl NodeDesc {
    /// The node as a snapshot holds it; jobs whose identity `taken` already
    /// holds are left out (a job is placed once).
    pub(super) fn node(&self, id: &str, serial: usize, taken: &mut BTreeSet<(BundleId, u32, String)>) -> FleetNode {
        let (pool, tier, kind) = [
            (Some("main"), None, ProviderKind::LocalServers),
            (Some("main"), Some("cluster"), ProviderKind::LocalServers),
            (Some("main"), Some("reserved"), ProviderKind::Aws),
            (Some("main"), Some("spot"), ProviderKind::Aws),
            (Some("dr"), Some("edge"), ProviderKind::Oci),
            (Some("dr"), Some("oci"), ProviderKind::Oci),
            (Some("ghost"), None, ProviderKind::Aws),
            (Some("main"), Some("nowhere"), ProviderKind::Aws),
        ][self.place];
        let jobs = self
            .jobs
            .iter()
            .enumerate()
            .map(|(j, job)| job.placed(serial, j))
            .filter(|job| taken.insert(identity(job)))
            .collect();
        FleetNode {
            id: NodeId::from(id),
            pool: pool.map(str::to_owned),
            tier: tier.map(str::to_owned),
            phase: self.phase,
            cordoned: self.cordoned,
            unhealthy: self.unhealthy,
            spare: self.spare,
            spare_spec: SpareSpec {
                warm_for: vec![],
                reserved_for: self.reserved_for.iter().map(|t| (*t).to_owned()).collect(),
                exclusive: self.exclusive,
            },
            tags: BTreeMap::new(),
            inventory: self.inventory.then(|| NodeInventory {
                kind: self.kind.unwrap_or(kind),
                region: "r".to_owned(),
                az: ["a", "b", "c", ""][self.az].to_owned(),
                instance_type: "x".to_owned(),
                total_capacity: self.capacity,
                total_cores: self.cores,
                utilization_cap: self.cap,
                reserved_capacity: self.reserved,
                capabilities: self.capabilities.iter().map(|c| (*c).to_owned()).collect(),
                gpus: self
                    .gpus
                    .iter()
                    .map(|&(model, total)| Gpu {
                        model: model.to_owned(),
                        total_capacity: total,
                    })
                    .collect(),
                images: self.images.iter().map(|i| (*i).to_owned()).collect(),
                nics: vec![],
            }),
            jobs,
        }
    }
}

pub(super) fn identity(job: &PlacedJob) -> (BundleId, u32, String) {
    (
        job.bundle.clone().unwrap_or_default(),
        job.replica_index,
        job.job_name.clone(),
    )
}

pub(super) fn bundle_id(b: usize) -> BundleId {
    BundleId(format!("default/p{b}"))
}

/// Node ids: short, so nodes added later sort between the ones there.
pub(super) fn node_id(n: usize) -> String {
    format!("{}{}", ["a", "b", "c", "d", "e"][n % 5], n / 5)
}

/// A node advertising capabilities `c0`..`c69`, cordoned and sorting first,
/// so the capabilities the requests ask for get ids past the hot mask's 64.
pub(super) fn wide_capability_node() -> FleetNode {
    FleetNode {
        id: NodeId::from("_wide"),
        pool: Some("main".to_owned()),
        tier: None,
        phase: NodePhase::Running,
        cordoned: true,
        unhealthy: false,
        spare: false,
        spare_spec: SpareSpec::default(),
        tags: BTreeMap::new(),
        inventory: Some(NodeInventory {
            kind: ProviderKind::LocalServers,
            region: "r".to_owned(),
            az: "a".to_owned(),
            instance_type: "x".to_owned(),
            total_capacity: 8.0,
            total_cores: 8,
            utilization_cap: 1.0,
            reserved_capacity: 0.0,
            capabilities: (0..70).map(|i| format!("c{i}")).collect(),
            gpus: vec![],
            images: vec![],
            nics: vec![],
        }),
        jobs: vec![],
    }
}

prop_compose! {
    pub(super) fn job_spec(i: usize, fuzzy: bool)(
        size in prop::sample::select(vec![0.0, 0.5, 1.0, 2.0, 3.0]),
        cores in prop::sample::select(vec![0u32, 0, 1, 2]),
        gpu in prop::option::weighted(0.2, (
            if fuzzy { prop::sample::select(vec![0.3, 0.5, 0.65]).boxed() } else { prop::sample::select(vec![0.25, 0.5]).boxed() },
            prop::option::of(prop::sample::select(vec!["t4", "a10"])),
        )),
        capabilities in prop::sample::subsequence(vec!["gpu", "sdi", "c66", "c5", "nope"], 0..=2),
        ports in prop::collection::vec(0..6u16, 0..2),
        exclusive in prop::bool::weighted(0.15),
        co_locate in prop::bool::weighted(0.25),
        separate in prop::bool::weighted(0.15),
        template in prop::sample::select(vec!["t1", "t2", "t3", "t4"]),
    ) -> JobSpec {
        let mut ports: Vec<HostPort> = ports.into_iter().map(port).collect();
        ports.sort();
        ports.dedup();
        let mut spec: JobSpec = yaml_serde::from_str(&format!("{{jobName: {}, template: {template}}}", JOB_NAMES[i])).unwrap();
        spec.requirements.required_capacity = size;
        spec.requirements.required_cores = cores;
        if let Some((capacity, model)) = gpu {
            spec.requirements.required_gpu_capacity = capacity;
            spec.requirements.required_gpu_model = model.map(str::to_owned);
        }
        spec.requirements.required_capabilities = capabilities.into_iter().map(str::to_owned).collect();
        spec.requirements.required_host_ports = ports;
        spec.exclusive = exclusive;
        if i > 0 && co_locate { spec.co_locate_with.push(JOB_NAMES[i - 1].to_owned()); }
        if i > 0 && separate && !co_locate { spec.separate_from.push(JOB_NAMES[i - 1].to_owned()); }
        spec
    }
}

prop_compose! {
    pub(super) fn bundle_spec(fuzzy: bool)(
        jobs in (1..=JOB_NAMES.len()).prop_flat_map(move |n| (0..n).map(|i| job_spec(i, fuzzy)).collect::<Vec<_>>()),
        backup in prop::sample::select(vec![None, Some(None), Some(Some("dr")), Some(Some("main"))]),
        flags in (prop::bool::ANY, prop::bool::ANY, prop::bool::ANY),
        same_node_default in prop::bool::weighted(0.2),
        same_az in prop::sample::select(vec!["soft", "hard", "off"]),
        allow_spare in prop::bool::ANY,
        override_reservation in prop::bool::weighted(0.2),
        pool in prop::sample::select(vec!["main", "main", "dr"]),
    ) -> BundleSpec {
        let rule = |forbid: bool| if forbid { "forbid" } else { "allow" };
        let resilience = match backup {
            None => String::new(),
            Some(pool) => format!(
                "resiliencePolicy: {{{}sameNode: {}, sameAz: {}, sameCloud: {}}}\n",
                pool.map(|p| format!("pool: {p}, ")).unwrap_or_default(),
                rule(flags.0), rule(flags.1), rule(flags.2)
            ),
        };
        let mut spec: BundleSpec = yaml_serde::from_str(&format!(
            "pool: {pool}\n{resilience}intraReplicaPlacement: {{sameNodeDefault: {same_node_default}, sameAz: {same_az}}}\nonLaunch: {}\noverrideReservation: {override_reservation}\njobs: []\n",
            if allow_spare { "allowSpare" } else { "avoidSpare" }
        )).unwrap();
        spec.jobs = jobs;
        spec
    }
}

/// The node a provision adds, as the view describes it.
pub(super) fn prospective(node_id: &NodeId, pool: &str, tier: &str, instance_type: &str) -> FleetNode {
    let pools = pools();
    let spec = pools
        .iter()
        .find(|p| p.name == pool)
        .and_then(|p| p.tiers.iter().find(|t| t.name == tier))
        .unwrap();
    let shape = spec
        .candidate_instance_types
        .iter()
        .find(|s| s.instance_type == instance_type)
        .unwrap();
    FleetNode {
        id: node_id.clone(),
        pool: Some(pool.to_owned()),
        tier: Some(tier.to_owned()),
        phase: NodePhase::Prospective,
        cordoned: false,
        unhealthy: false,
        spare: false,
        spare_spec: SpareSpec::default(),
        tags: BTreeMap::new(),
        inventory: Some(shape.prospective_inventory(spec.kind, spec.region.clone().unwrap_or_default())),
        jobs: vec![],
    }
}
