//! A from-scratch fill modelled on Karpenter's own scheduling benchmark
//! (`scheduling_benchmark_test.go` in kubernetes-sigs/karpenter): its 400
//! instance types (`fake-it-N`, N+1 vCPU) and its diverse pod mix, six
//! kinds in equal parts, translated into bundles for one pool of one
//! elastic `binpack` tier, starting from an empty fleet:
//!
//! | Karpenter pod | bundle |
//! |---|---|
//! | generic | one job |
//! | topology spread over zones | a primary and a backup, `sameAz: forbid` |
//! | topology spread over hosts | a primary and a backup, `sameNode: forbid` |
//! | affinity to a host | two co-located jobs (`coLocateWith`) |
//! | affinity to a zone | two jobs, `intraReplicaPlacement.sameAz: soft` |
//! | anti-affinity to hosts | three jobs kept apart (`separateFrom`) |
//!
//! Each job asks for one of the benchmark's CPU requests (100m, 250m, 500m,
//! 1, 1.5 vCPU). Deterministic for a seed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::model::{BundleId, BundleSpec, FleetSnapshot, InstanceShape, PlacementPool};

use super::workload::Workload;

/// The benchmark's instance types: `fake-it-N` with N+1 vCPU (and cores).
const INSTANCE_TYPES: usize = 400;

/// Karpenter's `randomCPU()`, in vCPU.
const CPU_REQUESTS: [f64; 5] = [0.1, 0.25, 0.5, 1.0, 1.5];

/// The pool, an empty fleet and bundles holding `jobs` jobs in all.
pub fn karpenter_fill(jobs: usize, seed: u64) -> Workload {
    let mut rng = StdRng::seed_from_u64(seed);
    // A constant the test below parses: it cannot fail at run time.
    let mut pool: PlacementPool = serde_yaml::from_str(
        "{name: karpenter, tiers: [{name: default, kind: aws, region: us-west-2, scaleOut: elastic, packingStrategy: binpack}]}",
    )
    .expect("the fill's pool parses");
    pool.tiers[0].candidate_instance_types = (0..INSTANCE_TYPES)
        .map(|i| InstanceShape {
            instance_type: format!("fake-it-{i}"),
            total_capacity: (i + 1) as f64,
            total_cores: (i + 1) as u32,
            ..InstanceShape::default()
        })
        .collect();
    let mut bundles = Vec::new();
    let mut placed = 0;
    while placed < jobs {
        let kind = bundles.len() % 6;
        let spec = bundle(kind, jobs - placed, &mut rng);
        placed += spec.jobs.len() * spec.replica_count() as usize;
        bundles.push((BundleId(format!("karpenter/b{}", bundles.len())), spec));
    }
    Workload {
        pools: vec![pool],
        fleet: FleetSnapshot::default(),
        bundles,
    }
}

/// A bundle of the given kind (see the module docs), with no more than
/// `room` jobs.
fn bundle(kind: usize, room: usize, rng: &mut StdRng) -> BundleSpec {
    let mut cpu = || CPU_REQUESTS[rng.random_range(0..CPU_REQUESTS.len())];
    let job = |name: &str, cpu: f64, rule: &str| {
        format!("{{jobName: {name}, template: app, requirements: {{requiredCapacity: {cpu}}}{rule}}}")
    };
    let yaml = match (kind, room) {
        (1, 2..) => format!(
            "pool: karpenter\nresiliencePolicy: {{sameAz: forbid}}\njobs: [{}]",
            job("zone-spread", cpu(), "")
        ),
        (2, 2..) => format!(
            "pool: karpenter\nresiliencePolicy: {{sameNode: forbid}}\njobs: [{}]",
            job("host-spread", cpu(), "")
        ),
        (3, 2..) => format!(
            "pool: karpenter\njobs: [{}, {}]",
            job("host-a", cpu(), ""),
            job("host-b", cpu(), ", coLocateWith: [host-a]")
        ),
        (4, 2..) => format!(
            "pool: karpenter\nintraReplicaPlacement: {{sameAz: soft}}\njobs: [{}, {}]",
            job("zone-a", cpu(), ""),
            job("zone-b", cpu(), "")
        ),
        (5, 3..) => format!(
            "pool: karpenter\njobs: [{}, {}, {}]",
            job("apart-a", cpu(), ""),
            job("apart-b", cpu(), ", separateFrom: [apart-a]"),
            job("apart-c", cpu(), ", separateFrom: [apart-a, apart-b]")
        ),
        _ => format!("pool: karpenter\njobs: [{}]", job("generic", cpu(), "")),
    };
    // Built from the constants above: it cannot fail at run time.
    serde_yaml::from_str(&yaml).expect("the fill's bundles parse")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{FleetView, validate_pools};

    #[test]
    fn the_fill_holds_exactly_the_jobs_asked_for_in_all_six_kinds() {
        let work = karpenter_fill(1_000, 42);
        let jobs: usize = work
            .bundles
            .iter()
            .map(|(_, s)| s.jobs.len() * s.replica_count() as usize)
            .sum();
        assert_eq!(jobs, 1_000);
        let kinds: std::collections::BTreeSet<&str> =
            work.bundles.iter().map(|(_, s)| s.jobs[0].job_name.as_str()).collect();
        assert_eq!(kinds.len(), 6, "{kinds:?}");
        assert_eq!(work.pools[0].tiers[0].candidate_instance_types.len(), INSTANCE_TYPES);
        let view = FleetView::new(&work.fleet, validate_pools(work.pools).unwrap()).unwrap();
        assert_eq!(view.node_count(), 0);
    }
}
