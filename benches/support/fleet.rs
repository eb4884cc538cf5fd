//! The fleet the core benchmarks run on: a hydrated core of cluster nodes,
//! one hot node and running one-job bundles, built through the ordinary
//! event path (shared by `core` and `migration`).

use std::collections::BTreeMap;

use norsk_auto_manager::automanager::{Action, AutoManagerCore, AutoSettings, Input, validate_auto_settings};
use norsk_auto_manager::model::{
    Bundle, BundleId, BundleJobRef, BundleSpec, InstanceKey, JobHistoryEntry, JobState, ManagerEvent, NodeId, NodeInfo,
    NodeInventory, ProviderMetadata, RuntimeJob, runtime_job_id, tags,
};

pub const NOW: i64 = 1_000_000;

pub fn event(core: &mut AutoManagerCore, event: ManagerEvent) -> Vec<Action> {
    core.handle(Input::Event(Box::new(event)), NOW).actions
}

pub fn node(core: &mut AutoManagerCore, id: &str, vcpus: f64) {
    let info = NodeInfo {
        node_id: NodeId::from(id),
        tags: BTreeMap::from([(tags::POOL.to_owned(), "production".to_owned())]),
        created_at: None,
        provider: ProviderMetadata::Unknown,
    };
    event(core, ManagerEvent::NodeStarted(info));
    event(
        core,
        ManagerEvent::NodeInventory {
            node_id: NodeId::from(id),
            inventory: NodeInventory::local_server(String::new(), format!("az{}", id.len() % 3), String::new(), vcpus),
        },
    );
}

/// A running bundle job on `node`, as Manager's snapshot carries it.
pub fn running_job(bundle: &Bundle, node: &str) -> RuntimeJob {
    let spec = bundle.spec.jobs[0].clone();
    RuntimeJob {
        job_id: runtime_job_id(&bundle.bundle_id, 0, &spec.job_name),
        state: JobState::Active,
        tags: BTreeMap::new(),
        start_date_time: None,
        bundle_ref: Some(BundleJobRef {
            bundle_id: bundle.bundle_id.clone(),
            replica_index: 0,
            job_name: spec.job_name.clone(),
        }),
        spec,
        context: None,
        dormant: false,
        terminal_verdict: None,
        history: vec![JobHistoryEntry::Running {
            at: None,
            role: InstanceKey("primary".into()),
            node_id: Some(NodeId::from(node)),
        }],
    }
}

/// A hydrated core: `nodes` cluster nodes of 16 vCPUs, plus node `hot`
/// (256 vCPUs) running `hot_jobs` one-vCPU jobs, plus `spread_jobs` jobs
/// spread over the fleet.
pub fn fleet(nodes: usize, hot_jobs: usize, spread_jobs: usize) -> AutoManagerCore {
    let settings = AutoSettings {
        url: "bench:1".into(),
        placement_pools: yaml_serde::from_str(
            "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n",
        )
        .expect("pools parse"),
        trace_placements: false,
        ..AutoSettings::default()
    };
    let mut core = AutoManagerCore::new(validate_auto_settings(settings).expect("valid"), NOW);
    for n in 0..nodes {
        node(&mut core, &format!("n{n:05}"), 16.0);
    }
    node(&mut core, "hot", 256.0);
    let spec: BundleSpec =
        yaml_serde::from_str("pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n")
            .expect("bundle parses");
    for i in 0..hot_jobs + spread_jobs {
        let bundle = Bundle {
            bundle_id: BundleId(format!("b{i}")),
            spec: spec.clone(),
            ..Bundle::default()
        };
        let host = if i < hot_jobs {
            "hot".to_owned()
        } else {
            format!("n{:05}", i % nodes)
        };
        event(&mut core, ManagerEvent::BundleUpdated(bundle.clone()));
        event(&mut core, ManagerEvent::JobActive(running_job(&bundle, &host)));
    }
    event(&mut core, ManagerEvent::InitialDataComplete);
    core
}
