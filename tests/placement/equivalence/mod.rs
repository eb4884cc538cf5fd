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
//! `PROPTEST_CASES=200000 cargo test --release --test placement
//! the_index_decides`.

mod generate;

use std::collections::{BTreeMap, BTreeSet};

use generate::{
    BUNDLES, JOB_NAMES, JobDesc, NodeDesc, bundle_id, bundle_spec, identity, node_desc, node_id, pools, prospective,
    template_images, wide_capability_node,
};
use norsk_auto_manager::model::{
    BundleId, BundleSpec, FleetNode, FleetSnapshot, NodeId, NodePhase, OnRuntimeFailure, PlacedJob,
};
use norsk_auto_manager::placement::{
    FleetView, Outcome, Placement, PlacementRequest, RecoveryContext, SequentialNodeIds, apply_placement, place,
    placed_job, validate_pools,
};
use proptest::prelude::*;

/// Fleets and request runs in the default run.
const EQUIVALENCE_CASES: u32 = 10_000;

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

    /// Node `id` described by `desc` joins the fleet and the kept view.
    fn add(&mut self, id: String, desc: &NodeDesc) {
        self.serial += 1;
        let node = desc.node(&id, self.serial, &mut self.taken);
        self.view.add_node(&node).unwrap();
        self.placed
            .extend(node.jobs.iter().map(|j| (node.id.clone(), j.clone())));
        self.fleet.insert(id, node);
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
                    if !run.fleet.contains_key(&id) {
                        run.add(id, &desc);
                    }
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
                        if !run.fleet.contains_key(&id) {
                            run.add(id, &desc);
                        }
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
