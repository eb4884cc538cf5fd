//! The candidate index decides exactly as the full scan: on random fleets
//! (every pool, tier and phase, spares and reservations, cordons, health,
//! capabilities and images beyond the first 64 ids, GPU models, AZs,
//! over-committed and zero-capacity nodes) under random runs of requests
//! (launches, recoveries with exclusions, pins, group moves, co-location,
//! separation, peer AZs, resilience, exclusive jobs, ports, GPU asks)
//! interleaved with releases, condition changes, and nodes added, replaced
//! and removed, every untraced placement (the index) returns the traced
//! one's decision (the scan over every node). Where the numbers are exact,
//! a view built afresh from the same fleet decides the same as well, so
//! the index maintained in place is the index a rebuild would make.
//!
//! The default run covers `EQUIVALENCE_CASES` (10,000) fleets and request
//! runs; set `PROPTEST_CASES` for a deeper one, e.g.
//! `PROPTEST_CASES=200000 cargo test --release --test placement_properties
//! the_index_decides`.

use std::collections::{BTreeMap, BTreeSet};

use norsk_auto_manager::model::{
    BundleId, BundleSpec, FleetNode, FleetSnapshot, Gpu, HostPort, JobSpec, NodeId, NodeInventory, NodePhase,
    OnRuntimeFailure, PlacedJob, PlacementPool, PortProtocol, ProviderKind, SpareSpec,
};
use norsk_auto_manager::placement::{
    FleetView, Outcome, Placement, PlacementRequest, RecoveryContext, SequentialNodeIds, apply_placement, place,
    placed_job, validate_pools,
};
use proptest::prelude::*;

/// Fleets and request runs in the default run.
const EQUIVALENCE_CASES: u32 = 10_000;

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
const BUNDLES: usize = 6;
/// Job names of the request bundles.
const JOB_NAMES: [&str; 4] = ["j0", "j1", "j2", "j3"];

fn pools() -> Vec<PlacementPool> {
    serde_yaml::from_str(POOLS).unwrap()
}

fn template_images() -> BTreeMap<String, Vec<String>> {
    BTreeMap::from([
        ("t1".to_owned(), vec!["img1".to_owned()]),
        ("t2".to_owned(), vec!["img2".to_owned(), "img3".to_owned()]),
        // Enough images that some ids lie past the hot mask's 64.
        ("t3".to_owned(), (0..70).map(|i| format!("w{i}")).collect()),
    ])
}

fn port(n: u16) -> HostPort {
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
struct JobDesc {
    bundle: Option<usize>,
    replica: u32,
    name: usize,
    template: &'static str,
    capacity: f64,
    cores: u32,
    ports: Vec<u16>,
    gpu: Option<(f64, Option<u32>)>,
    exclusive: bool,
}

prop_compose! {
    fn job_desc(fuzzy: bool)(
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
    fn placed(&self, node: usize, j: usize) -> PlacedJob {
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
struct NodeDesc {
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
    jobs: Vec<JobDesc>,
}

prop_compose! {
    fn node_desc(fuzzy: bool)(
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
    fn node(&self, id: &str, serial: usize, taken: &mut BTreeSet<(BundleId, u32, String)>) -> FleetNode {
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

fn identity(job: &PlacedJob) -> (BundleId, u32, String) {
    (
        job.bundle.clone().unwrap_or_default(),
        job.replica_index,
        job.job_name.clone(),
    )
}

fn bundle_id(b: usize) -> BundleId {
    BundleId(format!("default/p{b}"))
}

/// Node ids: short, so nodes added later sort between the ones there.
fn node_id(n: usize) -> String {
    format!("{}{}", ["a", "b", "c", "d", "e"][n % 5], n / 5)
}

/// A node advertising capabilities `c0`..`c69`, cordoned and sorting first,
/// so the capabilities the requests ask for get ids past the hot mask's 64.
fn wide_capability_node() -> FleetNode {
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
    fn job_spec(i: usize, fuzzy: bool)(
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
        let mut spec: JobSpec = serde_yaml::from_str(&format!("{{jobName: {}, template: {template}}}", JOB_NAMES[i])).unwrap();
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
    fn bundle_spec(fuzzy: bool)(
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
        let mut spec: BundleSpec = serde_yaml::from_str(&format!(
            "pool: {pool}\n{resilience}intraReplicaPlacement: {{sameNodeDefault: {same_node_default}, sameAz: {same_az}}}\nonLaunch: {}\noverrideReservation: {override_reservation}\njobs: []\n",
            if allow_spare { "allowSpare" } else { "avoidSpare" }
        )).unwrap();
        spec.jobs = jobs;
        spec
    }
}

/// One step of a run against the view.
#[derive(Clone, Debug)]
enum Step {
    /// Place job `job` of replica `replica` of bundle `bundle` (spec
    /// `spec`), maybe recovering with a policy and excluded nodes, pinned,
    /// or moving its group off a node; nodes are picked by position.
    Place {
        spec: usize,
        bundle: usize,
        replica: u32,
        job: usize,
        recovery: Option<(Option<OnRuntimeFailure>, Vec<usize>)>,
        pin: Option<usize>,
        moving: Option<usize>,
    },
    /// Release the `nth` job placed so far.
    Release(usize),
    /// Change a node's phase and health.
    Condition(usize, NodePhase, bool),
    /// Add a node with id `node_id(n)` (if no node has it yet).
    Add(usize, NodeDesc),
    /// Describe a node anew (its jobs kept).
    Replace(usize, NodeDesc),
    /// Remove a node and its jobs.
    Remove(usize),
    /// Add `count` nodes like this one whose ids each sort just after the
    /// last, until the room between two id labels runs out; each holds one
    /// job claiming the same host port, until the tier tracks the port.
    Crowd(usize, usize, NodeDesc),
}

fn step(fuzzy: bool) -> impl Strategy<Value = Step> {
    let node = || prop::option::weighted(0.15, 0..40usize);
    prop_oneof![
        10 => (
            0..3usize,
            0..BUNDLES,
            0..2u32,
            0..JOB_NAMES.len(),
            prop::option::weighted(0.4, (
                prop::option::of(prop::sample::select(vec![OnRuntimeFailure::AvoidSpare, OnRuntimeFailure::PreferSpare, OnRuntimeFailure::Drop])),
                prop::collection::vec(0..40usize, 0..2),
            )),
            node(),
            node(),
        )
            .prop_map(|(spec, bundle, replica, job, recovery, pin, moving)| Step::Place { spec, bundle, replica, job, recovery, pin, moving }),
        2 => (0..64usize).prop_map(Step::Release),
        1 => (
            0..40usize,
            prop_oneof![Just(NodePhase::Running), Just(NodePhase::Starting), Just(NodePhase::Stopping), Just(NodePhase::Stopped)],
            prop::bool::weighted(0.2),
        )
            .prop_map(|(node, phase, unhealthy)| Step::Condition(node, phase, unhealthy)),
        1 => (0..60usize, node_desc(fuzzy)).prop_map(|(n, desc)| Step::Add(n, desc)),
        1 => (0..40usize, node_desc(fuzzy)).prop_map(|(n, desc)| Step::Replace(n, desc)),
        1 => (0..40usize).prop_map(Step::Remove),
        1 => (0..60usize, 30..40usize, node_desc(fuzzy)).prop_map(|(n, count, desc)| Step::Crowd(n, count, desc)),
    ]
}

/// Whether the run is fuzzy, whether the fleet holds the wide-capability
/// node, the fleet's nodes, the bundles and the steps.
type World = (bool, bool, Vec<(usize, NodeDesc)>, Vec<BundleSpec>, Vec<Step>);

/// A fleet and a run of steps; `fuzzy` runs use inexact and infinite
/// capacities, where only the index and the scan are compared.
fn world() -> impl Strategy<Value = World> {
    prop::bool::weighted(0.25).prop_flat_map(|fuzzy| {
        (
            Just(fuzzy),
            prop::bool::weighted(0.3),
            prop::collection::vec((0..60usize, node_desc(fuzzy)), 0..10),
            prop::collection::vec(bundle_spec(fuzzy), 3),
            prop::collection::vec(step(fuzzy), 1..24),
        )
    })
}

/// The run's state: the view maintained in place, and the fleet it should
/// equal, from which a fresh view can be built.
struct Run {
    view: FleetView,
    fleet: BTreeMap<String, FleetNode>,
    placed: Vec<(NodeId, PlacedJob)>,
    taken: BTreeSet<(BundleId, u32, String)>,
    serial: usize,
}

impl Run {
    fn snapshot(&self) -> FleetSnapshot {
        FleetSnapshot {
            template_images: template_images(),
            nodes: self.fleet.values().cloned().collect(),
        }
    }

    fn ids(&self) -> Vec<String> {
        self.fleet.keys().cloned().collect()
    }

    fn pick(&self, n: usize) -> Option<String> {
        let ids = self.ids();
        (!ids.is_empty()).then(|| ids[n % ids.len()].clone())
    }
}

fn decision(placement: &Placement) -> (&Outcome, &norsk_auto_manager::placement::ResilienceReport) {
    (&placement.outcome, &placement.resilience)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(EQUIVALENCE_CASES),
        max_shrink_iters: 4096,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_index_decides_exactly_as_the_scan_of_every_node((fuzzy, wide, nodes, specs, steps) in world()) {
        let pools = validate_pools(pools()).unwrap();
        let mut run = Run {
            view: FleetView::new(&FleetSnapshot::default(), pools.clone()).unwrap(),
            fleet: BTreeMap::new(),
            placed: Vec::new(),
            taken: BTreeSet::new(),
            serial: 0,
        };
        if wide {
            run.fleet.insert("_wide".to_owned(), wide_capability_node());
        }
        for (n, desc) in &nodes {
            run.serial += 1;
            let id = node_id(*n);
            if !run.fleet.contains_key(&id) {
                let node = desc.node(&id, run.serial, &mut run.taken);
                run.fleet.insert(id, node);
            }
        }
        run.view = FleetView::new(&run.snapshot(), pools.clone()).unwrap();
        for node in run.fleet.values() {
            run.placed.extend(node.jobs.iter().map(|j| (node.id.clone(), j.clone())));
        }
        for step in steps {
            match step {
                Step::Place { spec, bundle, replica, job, recovery, pin, moving } => {
                    let spec = &specs[spec];
                    let Some(job) = spec.jobs.get(job % spec.jobs.len()) else { continue };
                    let replica = replica % spec.replica_count();
                    let bundle_id = bundle_id(bundle);
                    if run.taken.contains(&(bundle_id.clone(), replica, job.job_name.clone())) {
                        continue;
                    }
                    let context = recovery.as_ref().map(|(policy, excluded)| RecoveryContext {
                        on_runtime_failure: *policy,
                        excluded_nodes: excluded.iter().filter_map(|&n| run.pick(n)).map(NodeId).collect(),
                    });
                    let pin = pin.map(|n| NodeId(run.pick(n).unwrap_or_else(|| "absent".to_owned())));
                    let moving = moving.and_then(|n| run.pick(n)).map(NodeId);
                    let mut request = PlacementRequest::launch(&bundle_id, spec, replica, &job.job_name);
                    if let Some(context) = &context {
                        request = request.recovering(context);
                    }
                    if let Some(pin) = &pin {
                        request = request.pinned_to(pin);
                    }
                    if let Some(moving) = &moving {
                        request = request.moving_group_from(moving);
                    }
                    let indexed = place(&run.view, request, &mut SequentialNodeIds::default()).unwrap();
                    let scanned = place(&run.view, request.with_trace(true), &mut SequentialNodeIds::default()).unwrap();
                    prop_assert_eq!(decision(&indexed), decision(&scanned), "the index against the scan");
                    if !fuzzy && !co_location_ambiguous(&run, &bundle_id, replica, spec) {
                        let fresh = FleetView::new(&run.snapshot(), pools.clone()).unwrap();
                        let rebuilt = place(&fresh, request, &mut SequentialNodeIds::default()).unwrap();
                        prop_assert_eq!(decision(&indexed), decision(&rebuilt), "the maintained index against a rebuilt one");
                    }
                    apply_placement(&mut run.view, &request, &scanned.outcome).unwrap();
                    let (node_id, gpu_index) = match &scanned.outcome {
                        Outcome::Placed { node_id, gpu_index, .. } => (node_id.clone(), *gpu_index),
                        Outcome::Provision { node_id, pool, tier, instance_type, gpu_index } => {
                            run.fleet.insert(node_id.to_string(), prospective(node_id, pool, tier, instance_type));
                            (node_id.clone(), *gpu_index)
                        }
                        Outcome::NoCapacityInAnyPool => continue,
                    };
                    let placed = placed_job(&bundle_id, replica, job, gpu_index);
                    run.taken.insert(identity(&placed));
                    if let Some(node) = run.fleet.get_mut(node_id.as_str()) {
                        node.jobs.push(placed.clone());
                    }
                    run.placed.push((node_id, placed));
                }
                Step::Release(nth) => {
                    if run.placed.is_empty() {
                        continue;
                    }
                    let (node_id, job) = run.placed.remove(nth % run.placed.len());
                    run.view.release(&node_id, &job).unwrap();
                    run.taken.remove(&identity(&job));
                    if let Some(node) = run.fleet.get_mut(node_id.as_str()) {
                        node.jobs.retain(|j| identity(j) != identity(&job));
                    }
                }
                Step::Condition(n, phase, unhealthy) => {
                    let Some(id) = run.pick(n) else { continue };
                    run.view.set_condition(&NodeId::from(id.as_str()), phase, unhealthy).unwrap();
                    let node = run.fleet.get_mut(&id).unwrap();
                    node.phase = phase;
                    node.unhealthy = unhealthy;
                }
                Step::Add(n, desc) => {
                    let id = node_id(n);
                    if run.fleet.contains_key(&id) {
                        continue;
                    }
                    run.serial += 1;
                    let node = desc.node(&id, run.serial, &mut run.taken);
                    run.view.add_node(&node).unwrap();
                    run.placed.extend(node.jobs.iter().map(|j| (node.id.clone(), j.clone())));
                    run.fleet.insert(id, node);
                }
                Step::Replace(n, desc) => {
                    let Some(id) = run.pick(n) else { continue };
                    let kept = std::mem::take(&mut run.fleet.get_mut(&id).unwrap().jobs);
                    let mut node = desc.node(&id, 0, &mut BTreeSet::new());
                    node.jobs = kept;
                    run.view.replace_node(&node).unwrap();
                    run.fleet.insert(id, node);
                }
                Step::Crowd(n, count, mut desc) => {
                    desc.jobs = vec![JobDesc {
                        bundle: None,
                        replica: 0,
                        name: 0,
                        template: "t2",
                        capacity: 0.5,
                        cores: 0,
                        ports: vec![0],
                        gpu: None,
                        exclusive: false,
                    }];
                    for i in 1..=count {
                        let id = format!("{}{}", node_id(n), "~".repeat(i));
                        if run.fleet.contains_key(&id) {
                            continue;
                        }
                        run.serial += 1;
                        let node = desc.node(&id, run.serial, &mut run.taken);
                        run.view.add_node(&node).unwrap();
                        run.placed.extend(node.jobs.iter().map(|j| (node.id.clone(), j.clone())));
                        run.fleet.insert(id, node);
                    }
                }
                Step::Remove(n) => {
                    let Some(id) = run.pick(n) else { continue };
                    run.view.remove_node(&NodeId::from(id.as_str())).unwrap();
                    let node = run.fleet.remove(&id).unwrap();
                    for job in &node.jobs {
                        run.taken.remove(&identity(job));
                    }
                    run.placed.retain(|(n, _)| n.as_str() != id);
                }
            }
        }
    }
}

/// Whether jobs of the replica sit on several nodes while its spec
/// co-locates: which placed member a job must join then follows the order
/// the jobs were reserved in, which a rebuilt view does not keep.
fn co_location_ambiguous(run: &Run, bundle: &BundleId, replica: u32, spec: &BundleSpec) -> bool {
    let co_locates =
        spec.intra_replica_placement.same_node_default || spec.jobs.iter().any(|j| !j.co_locate_with.is_empty());
    let nodes: BTreeSet<&NodeId> = run
        .placed
        .iter()
        .filter(|(_, j)| j.bundle.as_ref() == Some(bundle) && j.replica_index == replica)
        .map(|(n, _)| n)
        .collect();
    co_locates && nodes.len() > 1
}

/// The node a provision adds, as the view describes it.
fn prospective(node_id: &NodeId, pool: &str, tier: &str, instance_type: &str) -> FleetNode {
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
