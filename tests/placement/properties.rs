//! Property tests of the engine's invariants over random fleets and
//! bundles: capacity, cores, GPU devices and host ports are never
//! over-committed; an exclusive job shares its node with its co-located
//! peers only; the result does not depend on the order of the nodes; a node
//! is provisioned only when no existing node of that tier survived; tiers
//! are walked in order; a pinned target never provisions; the trace changes
//! nothing; rankings kept across a burst decide exactly as the scan; the
//! candidate index decides exactly as the scan (`equivalence`).

use std::collections::{BTreeMap, HashMap};

use norsk_auto_manager::model::{
    BundleId, BundleSpec, FleetNode, FleetSnapshot, Gpu, HostPort, JobSpec, NodeId, NodeInventory, NodePhase,
    PlacedJob, PlacementPool, PortProtocol, ProviderKind, SpareSpec,
};
use norsk_auto_manager::placement::{
    FleetView, Outcome, PlacementRequest, PlanRow, PlannedOutcome, Rankings, RecoveryContext, SequentialNodeIds,
    TierDecision, Verdict, apply_placement, place, place_ranked, placed_job, plan_bundles, validate_pools,
};
use proptest::prelude::*;

const POOLS: &str = "
- name: main
  tiers:
    - {name: cluster, kind: local-servers, scaleOut: fixed}
    - name: reserved
      kind: aws
      scaleOut: elastic
      maxNodes: 3
      candidateInstanceTypes:
        - {instanceType: small, totalCapacity: 2, totalCores: 2}
        - {instanceType: gpu, totalCapacity: 4, totalCores: 4, capabilities: [gpu], gpus: [{model: t4, totalCapacity: 1}]}
    - name: spot
      kind: aws
      scaleOut: elastic
      launchMode: spot
      packingStrategy: spread
      candidateInstanceTypes: [{instanceType: big, totalCapacity: 8, totalCores: 8, capabilities: [sdi]}]
- name: dr
  tiers:
    - {name: oci, kind: oci, scaleOut: elastic, maxNodes: 2, candidateInstanceTypes: [{instanceType: flex, totalCapacity: 4, totalCores: 4}]}
";

fn pools() -> Vec<PlacementPool> {
    yaml_serde::from_str(POOLS).unwrap()
}

fn port(n: u16) -> HostPort {
    HostPort {
        port: 1000 + n,
        protocol: PortProtocol::Tcp,
    }
}

prop_compose! {
    fn node(i: usize)(
        place in 0..5usize,
        phase in prop_oneof![8 => Just(NodePhase::Running), 1 => Just(NodePhase::Starting), 1 => Just(NodePhase::Stopping)],
        cordoned in prop::bool::weighted(0.1),
        spare in prop::bool::weighted(0.2),
        reserved in prop::bool::ANY,
        exclusive in prop::bool::ANY,
        capacity in prop::sample::select(vec![1.0, 2.0, 4.0, 8.0]),
        cap in prop::sample::select(vec![0.5, 1.0, 2.0]),
        cores in prop::sample::select(vec![0u32, 2, 4, 8]),
        gpu_cap in prop::bool::ANY,
        sdi in prop::bool::weighted(0.3),
        gpus in 0..3usize,
        az in 0..3usize,
        warm in prop::bool::ANY,
        jobs in prop::collection::vec((prop::sample::select(vec![0.5, 1.0]), 0..6u16, prop::bool::weighted(0.3)), 0..4),
    ) -> FleetNode {
        let (pool, tier, kind) = [
            ("main", None, ProviderKind::LocalServers),
            ("main", Some("reserved"), ProviderKind::Aws),
            ("main", Some("spot"), ProviderKind::Aws),
            ("dr", Some("oci"), ProviderKind::Oci),
            ("ghost", None, ProviderKind::Aws),
        ][place];
        let mut capabilities = vec![];
        if gpu_cap { capabilities.push("gpu".to_owned()); }
        if sdi { capabilities.push("sdi".to_owned()); }
        let mut node = FleetNode {
            id: NodeId(format!("n{i:02}")),
            pool: Some(pool.to_owned()),
            tier: tier.map(str::to_owned),
            phase,
            cordoned,
            unhealthy: false,
            spare,
            spare_spec: SpareSpec { warm_for: vec![], reserved_for: if reserved { vec!["t1".to_owned()] } else { vec![] }, exclusive },
            tags: BTreeMap::new(),
            inventory: Some(NodeInventory {
                kind,
                region: "r".to_owned(),
                az: ["a", "b", "c"][az].to_owned(),
                instance_type: "x".to_owned(),
                total_capacity: capacity,
                total_cores: cores,
                utilization_cap: cap,
                reserved_capacity: 0.0,
                capabilities,
                gpus: vec![Gpu { model: "t4".to_owned(), total_capacity: 1.0 }; gpus],
                images: if warm { vec!["img1".to_owned()] } else { vec![] },
                nics: vec![],
            }),
            jobs: vec![],
        };
        // Background jobs, kept only while they fit (the fleet starts sound).
        let usable = capacity * if cap > 0.0 && cap <= 1.0 { cap } else { 1.0 };
        for (j, (size, p, gpu)) in jobs.into_iter().enumerate() {
            let used: f64 = node.jobs.iter().map(|j| j.required_capacity).sum();
            let taken = node.jobs.iter().any(|j| j.required_host_ports.contains(&port(p)));
            let gpu = gpu && gpus > 0 && !node.jobs.iter().any(|j| j.gpu_index == Some(0));
            if used + size > usable || taken {
                continue;
            }
            node.jobs.push(PlacedJob {
                job_id: format!("bg/{i}/{j}").as_str().into(),
                bundle: Some(BundleId::from("bg/other")),
                replica_index: 0,
                job_name: format!("bg{i}-{j}"),
                template: "t2".to_owned(),
                required_capacity: size,
                required_cores: 0,
                required_host_ports: vec![port(p)],
                required_gpu_capacity: if gpu { 0.5 } else { 0.0 },
                gpu_index: gpu.then_some(0),
                exclusive: false,
            });
        }
        node
    }
}

fn fleet() -> impl Strategy<Value = FleetSnapshot> {
    (0..10usize).prop_flat_map(|n| {
        (0..n).map(node).collect::<Vec<_>>().prop_map(|nodes| FleetSnapshot {
            template_images: BTreeMap::from([("t1".to_owned(), vec!["img1".to_owned()])]),
            nodes,
        })
    })
}

prop_compose! {
    fn job(i: usize)(
        size in prop::sample::select(vec![0.5, 1.0, 2.0, 3.0]),
        cores in prop::sample::select(vec![0u32, 0, 1, 2]),
        gpu in prop::bool::weighted(0.2),
        sdi in prop::bool::weighted(0.1),
        ports in prop::collection::vec(0..6u16, 0..2),
        exclusive in prop::bool::weighted(0.15),
        co_locate in prop::bool::weighted(0.25),
        separate in prop::bool::weighted(0.1),
        template in prop::sample::select(vec!["t1", "t2"]),
    ) -> JobSpec {
        let mut ports: Vec<HostPort> = ports.into_iter().map(port).collect();
        ports.sort();
        ports.dedup();
        let mut spec: JobSpec = yaml_serde::from_str(&format!("{{jobName: j{i}, template: {template}}}")).unwrap();
        spec.requirements.required_capacity = size;
        spec.requirements.required_cores = cores;
        spec.requirements.required_gpu_capacity = if gpu { 0.5 } else { 0.0 };
        if gpu { spec.requirements.required_capabilities.push("gpu".to_owned()); }
        if sdi { spec.requirements.required_capabilities.push("sdi".to_owned()); }
        spec.requirements.required_host_ports = ports;
        spec.exclusive = exclusive;
        if i > 0 && co_locate { spec.co_locate_with.push(format!("j{}", i - 1)); }
        if i > 0 && separate && !co_locate { spec.separate_from.push(format!("j{}", i - 1)); }
        spec
    }
}

prop_compose! {
    fn bundle()(
        jobs in (1..4usize).prop_flat_map(|n| (0..n).map(job).collect::<Vec<_>>()),
        backup in prop::sample::select(vec![None, Some(None), Some(Some("dr"))]),
        flags in (prop::bool::ANY, prop::bool::ANY, prop::bool::ANY),
        same_node_default in prop::bool::weighted(0.2),
        same_az in prop::sample::select(vec!["soft", "hard", "off"]),
        allow_spare in prop::bool::ANY,
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
            "pool: main\n{resilience}intraReplicaPlacement: {{sameNodeDefault: {same_node_default}, sameAz: {same_az}}}\nonLaunch: {}\njobs: []\n",
            if allow_spare { "allowSpare" } else { "avoidSpare" }
        )).unwrap();
        spec.jobs = jobs;
        spec
    }
}

fn bundles() -> impl Strategy<Value = Vec<(BundleId, BundleSpec)>> {
    prop::collection::vec(bundle(), 1..4).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, s)| (BundleId(format!("default/b{i}")), s))
            .collect()
    })
}

fn plan(fleet: &FleetSnapshot, bundles: &[(BundleId, BundleSpec)], trace: bool) -> Vec<PlanRow> {
    let mut view = FleetView::new(fleet, validate_pools(pools()).unwrap()).unwrap();
    plan_bundles(&mut view, bundles, trace, &mut SequentialNodeIds::default()).unwrap()
}

/// What one node holds at the end of a plan.
#[derive(Default)]
struct Load {
    usable: f64,
    cores: u32,
    gpus: Vec<f64>,
    capacity: f64,
    used_cores: u32,
    gpu_used: HashMap<u32, f64>,
    ports: Vec<HostPort>,
    jobs: Vec<(BundleId, u32, String, bool)>,
}

fn loads(fleet: &FleetSnapshot, bundles: &[(BundleId, BundleSpec)], rows: &[PlanRow]) -> HashMap<String, Load> {
    let mut loads: HashMap<String, Load> = HashMap::new();
    for node in &fleet.nodes {
        let inventory = node.inventory.as_ref().unwrap();
        let cap = if inventory.utilization_cap > 0.0 && inventory.utilization_cap <= 1.0 {
            inventory.utilization_cap
        } else {
            1.0
        };
        let load = loads.entry(node.id.to_string()).or_default();
        load.usable = inventory.total_capacity * cap;
        load.cores = inventory.total_cores;
        load.gpus = inventory.gpus.iter().map(|g| g.total_capacity).collect();
        for job in &node.jobs {
            load.capacity += job.required_capacity;
            load.ports.extend(&job.required_host_ports);
            if let Some(i) = job.gpu_index {
                *load.gpu_used.entry(i).or_default() += job.required_gpu_capacity;
            }
            load.jobs.push((
                job.bundle.clone().unwrap(),
                job.replica_index,
                job.job_name.clone(),
                job.exclusive,
            ));
        }
    }
    let pools = pools();
    for row in rows {
        let (Some(node), true) = (
            &row.node_id,
            matches!(row.outcome, PlannedOutcome::Placed | PlannedOutcome::Provision),
        ) else {
            continue;
        };
        let spec = &bundles.iter().find(|(id, _)| *id == row.bundle).unwrap().1;
        let job = spec.job(&row.job_name).unwrap();
        let load = loads.entry(node.to_string()).or_default();
        if row.outcome == PlannedOutcome::Provision {
            let tier = pools
                .iter()
                .flat_map(|p| &p.tiers)
                .find(|t| Some(&t.name) == row.tier.as_ref())
                .unwrap();
            let shape = tier
                .candidate_instance_types
                .iter()
                .find(|s| Some(&s.instance_type) == row.instance_type.as_ref())
                .unwrap();
            load.usable = shape.total_capacity;
            load.cores = shape.total_cores;
            load.gpus = shape.gpus.iter().map(|g| g.total_capacity).collect();
        }
        load.capacity += job.requirements.required_capacity;
        load.used_cores += job.requirements.required_cores;
        load.ports.extend(&job.requirements.required_host_ports);
        if let Some(i) = row.gpu_index {
            *load.gpu_used.entry(i).or_default() += job.requirements.required_gpu_capacity;
        }
        load.jobs.push((
            row.bundle.clone(),
            row.replica_index,
            row.job_name.clone(),
            job.exclusive,
        ));
    }
    loads
}

/// Whether two jobs of a bundle are co-located (the transitive closure of
/// `coLocateWith`, plus `sameNodeDefault`).
fn co_located(spec: &BundleSpec, a: &str, b: &str) -> bool {
    let rule_less = |j: &JobSpec| j.co_locate_with.is_empty() && j.separate_from.is_empty();
    let mut group = vec![a.to_owned()];
    loop {
        let before = group.len();
        for job in &spec.jobs {
            let linked = job.co_locate_with.iter().any(|p| group.contains(p))
                || group.contains(&job.job_name) && !job.co_locate_with.is_empty()
                || spec.intra_replica_placement.same_node_default
                    && rule_less(job)
                    && spec.jobs.iter().any(|o| group.contains(&o.job_name) && rule_less(o));
            if linked {
                for name in std::iter::once(&job.job_name).chain(&job.co_locate_with) {
                    if !group.contains(name) {
                        group.push(name.clone());
                    }
                }
            }
        }
        if group.len() == before {
            return group.iter().any(|n| n == b);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn nothing_is_ever_over_committed_and_exclusive_jobs_keep_to_their_peers(fleet in fleet(), bundles in bundles()) {
        let rows = plan(&fleet, &bundles, false);
        for (node, load) in loads(&fleet, &bundles, &rows) {
            prop_assert!(load.capacity <= load.usable + 1e-9, "{node}: capacity {} of {}", load.capacity, load.usable);
            prop_assert!(load.used_cores <= load.cores, "{node}: cores {} of {}", load.used_cores, load.cores);
            for (device, used) in &load.gpu_used {
                let total = load.gpus.get(*device as usize).copied().unwrap_or(0.0);
                prop_assert!(*used <= total + 1e-9, "{node}: gpu {device} {used} of {total}");
            }
            let mut ports = load.ports.clone();
            ports.sort();
            let count = ports.len();
            ports.dedup();
            prop_assert_eq!(ports.len(), count, "{}: a host port claimed twice", node);
            for (bundle, replica, name, exclusive) in &load.jobs {
                if !exclusive { continue; }
                let spec = &bundles.iter().find(|(id, _)| id == bundle).unwrap().1;
                for (other_bundle, other_replica, other, _) in &load.jobs {
                    prop_assert!(
                        other_bundle == bundle && other_replica == replica && co_located(spec, name, other),
                        "{node}: exclusive {bundle}/{name} shares with {other_bundle}/{other}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_plan_does_not_depend_on_the_order_of_the_nodes(fleet in fleet(), bundles in bundles(), rotate in 0..10usize) {
        let mut shuffled = fleet.clone();
        shuffled.nodes.reverse();
        let n = shuffled.nodes.len();
        if n > 0 { shuffled.nodes.rotate_left(rotate % n); }
        prop_assert_eq!(plan(&fleet, &bundles, true), plan(&shuffled, &bundles, true));
    }

    #[test]
    fn tiers_are_walked_in_order_and_provisioning_happens_only_when_no_node_survives(fleet in fleet(), bundles in bundles()) {
        let pools = pools();
        for row in plan(&fleet, &bundles, true) {
            let Some(trace) = &row.trace else { continue };
            let spec = &bundles.iter().find(|(id, _)| *id == row.bundle).unwrap().1;
            let pool = pools.iter().find(|p| p.name == spec.pool_for_replica(row.replica_index)).unwrap();
            let walked: Vec<&str> = trace.tiers.iter().map(|t| t.tier.as_str()).collect();
            let order: Vec<&str> = pool.tiers.iter().map(|t| t.name.as_str()).take(walked.len()).collect();
            prop_assert_eq!(walked, order);
            for (i, tier) in trace.tiers.iter().enumerate() {
                let survivors = tier.nodes.iter().filter(|n| matches!(n.verdict, Verdict::Survived { .. })).count();
                let last = i + 1 == trace.tiers.len();
                match &tier.decision {
                    TierDecision::Placed { .. } => prop_assert!(survivors > 0 && last),
                    TierDecision::Provision { .. } => prop_assert!(survivors == 0 && last),
                    TierDecision::NotProvisioned { .. } => prop_assert_eq!(survivors, 0),
                }
            }
        }
    }

    #[test]
    fn a_pinned_target_never_provisions_and_the_trace_changes_nothing(
        fleet in fleet(),
        bundles in bundles(),
        pin in prop::option::of(0..12usize),
    ) {
        let view = FleetView::new(&fleet, validate_pools(pools()).unwrap()).unwrap();
        let target = pin.map(|p| NodeId(format!("n{p:02}")));
        for (id, spec) in &bundles {
            for job in &spec.jobs {
                let mut request = PlacementRequest::launch(id, spec, 0, &job.job_name);
                if let Some(target) = &target {
                    request = request.pinned_to(target);
                }
                let quiet = place(&view, request, &mut SequentialNodeIds::default()).unwrap();
                let traced = place(&view, request.with_trace(true), &mut SequentialNodeIds::default()).unwrap();
                prop_assert_eq!(&quiet.outcome, &traced.outcome);
                prop_assert_eq!(&quiet.resilience, &traced.resilience);
                if target.is_some() {
                    let provisioned = matches!(quiet.outcome, Outcome::Provision { .. });
                    prop_assert!(!provisioned, "pinned to {:?}, provisioned", target);
                }
            }
        }
    }
}

/// One step of a burst against a view.
#[derive(Clone, Debug)]
enum Step {
    /// Place job `job` of replica `replica` of spec `spec` under bundle id
    /// `id` (ids repeat, so some jobs have placed peers), recovering away
    /// from node `excluded` when set; the outcome is applied to the view.
    Place {
        spec: usize,
        id: usize,
        replica: u32,
        job: usize,
        excluded: Option<usize>,
    },
    /// Release the `nth` job placed so far.
    Release(usize),
    /// Change node `node`'s phase and health.
    Condition(usize, NodePhase, bool),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..3usize, 0..8usize, 0..2u32, 0..3usize, prop::option::weighted(0.5, 0..12usize))
            .prop_map(|(spec, id, replica, job, excluded)| Step::Place { spec, id, replica, job, excluded }),
        2 => (0..20usize).prop_map(Step::Release),
        1 => (
            0..12usize,
            prop_oneof![Just(NodePhase::Running), Just(NodePhase::Starting), Just(NodePhase::Stopping)],
            prop::bool::weighted(0.2),
        )
            .prop_map(|(node, phase, unhealthy)| Step::Condition(node, phase, unhealthy)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn kept_rankings_decide_exactly_as_the_scan(
        fleet in fleet(),
        specs in prop::collection::vec(bundle(), 3),
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let mut view = FleetView::new(&fleet, validate_pools(pools()).unwrap()).unwrap();
        let mut rankings = Rankings::for_burst();
        let mut placed = Vec::new();
        let ids: Vec<BundleId> = (0..8).map(|i| BundleId(format!("default/p{i}"))).collect();
        for step in steps {
            match step {
                Step::Place { spec, id, replica, job, excluded } => {
                    let spec = &specs[spec];
                    let Some(job) = spec.jobs.get(job % spec.jobs.len()) else { continue };
                    let replica = replica % spec.replica_count();
                    let context = RecoveryContext {
                        on_runtime_failure: None,
                        excluded_nodes: excluded.map(|n| NodeId(format!("n{n:02}"))).into_iter().collect(),
                    };
                    let mut request = PlacementRequest::launch(&ids[id], spec, replica, &job.job_name);
                    if excluded.is_some() {
                        request = request.recovering(&context);
                    }
                    let scanned = place(&view, request, &mut SequentialNodeIds::default()).unwrap();
                    let ranked = place_ranked(&view, request, &mut SequentialNodeIds::default(), &mut rankings).unwrap();
                    prop_assert_eq!(&ranked, &scanned);
                    apply_placement(&mut view, &request, &scanned.outcome).unwrap();
                    let node = match &scanned.outcome {
                        Outcome::Placed { node_id, gpu_index, .. } | Outcome::Provision { node_id, gpu_index, .. } => {
                            Some((node_id.clone(), *gpu_index))
                        }
                        Outcome::NoCapacityInAnyPool => None,
                    };
                    if let Some((node_id, gpu_index)) = node {
                        placed.push((node_id, placed_job(&ids[id], replica, job, gpu_index)));
                    }
                }
                Step::Release(nth) => {
                    if !placed.is_empty() {
                        let (node_id, job) = placed.remove(nth % placed.len());
                        view.release(&node_id, &job).unwrap();
                    }
                }
                Step::Condition(node, phase, unhealthy) => {
                    let id = NodeId(format!("n{node:02}"));
                    if view.contains(&id) {
                        view.set_condition(&id, phase, unhealthy).unwrap();
                    }
                }
            }
        }
    }
}
