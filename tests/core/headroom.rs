//! Resilience headroom against the core itself: the analysis's verdict on
//! a node's loss is what the core does when the node is lost, and the
//! continuous recompute waits out its debounce.

use std::collections::BTreeSet;

use norsk_auto_manager::automanager::binding::BindingPhase;
use norsk_auto_manager::automanager::headroom::{HEADROOM_DEBOUNCE_MS, HEADROOM_MAX_WAIT_MS};
use norsk_auto_manager::automanager::{AutoSettings, Notification};
use norsk_auto_manager::model::{JobId, ManagerEvent, NodeId};
use norsk_auto_manager::placement::headroom::{DomainVerdict, Fate};

use crate::support::*;

/// Pool `production` of cluster nodes only: nothing is provisioned, so a
/// lost job either finds room on the nodes left or none.
const CLUSTER: &str = "
- name: production
  tiers:
    - {name: cluster, kind: local-servers, scaleOut: fixed}
";

fn headroom_settings() -> AutoSettings {
    let mut settings = settings();
    settings.placement_pools = yaml_serde::from_str(CLUSTER).expect("pools parse");
    settings.experimental.headroom = true;
    settings
}

/// A tiny deterministic generator, so a failing fleet replays.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n.max(1)
    }
}

/// Answers every call and reports each started instance running, until
/// the core asks for nothing more.
fn settle(h: &mut Harness) {
    for _ in 0..20 {
        if h.start_all().is_empty() && h.take_calls().is_empty() {
            return;
        }
    }
}

fn running_on(h: &Harness, job: &JobId) -> Option<NodeId> {
    h.core
        .job(job)
        .and_then(|r| r.binding.as_ref())
        .filter(|b| b.phase == BindingPhase::Running)
        .map(|b| b.node_id.clone())
}

/// A random hydrated fleet of cluster nodes carrying random bundles (one
/// job, a co-located pair, a backup kept off its primary's node), every
/// job placed and running.
fn random_fleet(rng: &mut Lcg) -> (Harness, Vec<String>) {
    let mut h = Harness::with(headroom_settings());
    let nodes: Vec<String> = (0..3 + rng.below(4)).map(|n| format!("n{n}")).collect();
    for node in &nodes {
        h.cluster_node(node, [4.0, 6.0, 8.0][rng.below(3)]);
    }
    h.event(ManagerEvent::InitialDataComplete);
    for b in 0..nodes.len() * 2 {
        let capacity = 1 + rng.below(3);
        let spec = match rng.below(3) {
            0 => format!(
                "pool: production\nresiliencePolicy: {{sameNode: forbid}}\njobs: [{{jobName: encode, requirements: {{requiredCapacity: {capacity}}}}}]"
            ),
            1 => format!(
                "pool: production\njobs:\n- {{jobName: encode, requirements: {{requiredCapacity: {capacity}}}}}\n- {{jobName: package, coLocateWith: [encode], requirements: {{requiredCapacity: 1}}}}\n"
            ),
            _ => {
                format!("pool: production\njobs: [{{jobName: encode, requirements: {{requiredCapacity: {capacity}}}}}]")
            }
        };
        h.bundle(&format!("b{b}"), &spec);
        settle(&mut h);
    }
    (h, nodes)
}

#[test]
fn the_analysis_of_a_node_s_loss_is_what_the_core_does_when_the_node_is_lost() {
    let mut compared = 0;
    let mut dark = 0;
    for seed in 0..60u64 {
        let mut rng = Lcg(seed);
        let (mut h, nodes) = random_fleet(&mut rng);
        // Jobs that found no room are left waiting: the analysis runs on
        // the fleet as it is.
        h.advance(HEADROOM_MAX_WAIT_MS + 1);
        let report = h.core.headroom().expect("headroom computed").clone();
        let node = &nodes[rng.below(nodes.len())];
        let Some(verdict): Option<DomainVerdict> = report.node(node).cloned() else {
            panic!("seed {seed}: no verdict on node {node}: {:?}", report.fleet);
        };
        h.event(ManagerEvent::NodeStopped(NodeId::from(node.as_str())));
        settle(&mut h);
        for bundle in &verdict.bundles {
            for job in &bundle.jobs {
                let now = running_on(&h, &job.job_id);
                match &job.fate {
                    Fate::Placed {
                        node_id: Some(node_id), ..
                    } => assert_eq!(
                        now.as_ref(),
                        Some(node_id),
                        "seed {seed}: the analysis of {node}'s loss re-places {} on {node_id}; the core has it on {now:?}",
                        job.job_id
                    ),
                    // Kept on its outcome: a node of the (only) tier takes it.
                    Fate::Placed { node_id: None, .. } => assert!(
                        now.as_ref().is_some_and(|n| n.as_str() != node),
                        "seed {seed}: the analysis of {node}'s loss re-places {}; the core has it on {now:?}",
                        job.job_id
                    ),
                    Fate::Provision { .. } => panic!("seed {seed}: a fixed tier provisions nothing"),
                    Fate::Dark { reason } => {
                        dark += 1;
                        assert_eq!(
                            now, None,
                            "seed {seed}: the analysis of {node}'s loss says {} goes dark ({reason}); the core runs it",
                            job.job_id
                        );
                    }
                }
                compared += 1;
            }
            if !bundle.on_air {
                let running: BTreeSet<String> = h
                    .core
                    .jobs()
                    .filter(|r| r.bundle_ref.bundle_id == bundle.bundle)
                    .filter(|r| running_on(&h, r.job_id()).is_some())
                    .map(|r| r.job_id().to_string())
                    .collect();
                let replicas: BTreeSet<u32> = h
                    .core
                    .jobs()
                    .filter(|r| r.bundle_ref.bundle_id == bundle.bundle && running_on(&h, r.job_id()).is_some())
                    .map(|r| r.bundle_ref.replica_index)
                    .collect();
                let essential_all: bool = replicas.iter().any(|&replica| {
                    h.core
                        .jobs()
                        .filter(|r| r.bundle_ref.bundle_id == bundle.bundle && r.bundle_ref.replica_index == replica)
                        .all(|r| running_on(&h, r.job_id()).is_some())
                });
                assert!(
                    !essential_all,
                    "seed {seed}: the analysis of {node}'s loss takes {} off the air; the core runs {running:?}",
                    bundle.bundle
                );
            }
        }
    }
    assert!(compared > 100, "the fleets lose enough jobs to compare ({compared})");
    assert!(dark > 0, "some losses are not absorbed ({dark} jobs go dark)");
}

fn headroom_notifications(h: &mut Harness) -> usize {
    h.take_notifications()
        .iter()
        .filter(|n| {
            matches!(
                n,
                Notification::HeadroomChanged { .. } | Notification::BundleHeadroomChanged { .. }
            )
        })
        .count()
}

#[test]
fn changes_within_the_debounce_are_recomputed_once_after_it() {
    let mut h = Harness::with(headroom_settings());
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle(
        "first",
        "pool: production\njobs: [{jobName: encode, requirements: {requiredCapacity: 1}}]",
    );
    settle(&mut h);
    h.advance(HEADROOM_MAX_WAIT_MS + 1);
    let (before, _) = h.core.headroom_recomputes();
    assert!(before >= 1, "headroom computed once the fleet settled");
    h.take_notifications();

    // Three bundles, each arriving within the debounce of the last.
    for (n, capacity) in [(1, 1), (2, 1), (3, 3)] {
        h.advance(HEADROOM_DEBOUNCE_MS / 4);
        h.bundle(
            &format!("more{n}"),
            &format!("pool: production\njobs: [{{jobName: encode, requirements: {{requiredCapacity: {capacity}}}}}]"),
        );
        settle(&mut h);
    }
    assert_eq!(
        h.core.headroom_recomputes().0,
        before,
        "nothing is recomputed while changes keep coming within the debounce"
    );
    h.advance(HEADROOM_DEBOUNCE_MS + 1);
    assert_eq!(
        h.core.headroom_recomputes().0,
        before + 1,
        "one recompute once the fleet was quiet for the debounce"
    );
    // Now a's loss cannot be absorbed (3 + 1 + 1 + 1 of 4 and 4): the
    // verdict changed, and says so.
    assert!(headroom_notifications(&mut h) > 0, "the changed verdict is notified");
    h.advance(HEADROOM_DEBOUNCE_MS * 10);
    assert_eq!(h.core.headroom_recomputes().0, before + 1, "no change, no recompute");
}
