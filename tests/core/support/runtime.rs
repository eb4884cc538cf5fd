//! The AutoManager runtime against the Manager simulator over loopback, both
//! on one compressed clock: cluster servers of pool `production`, the runtime
//! started against them, and both stopped cleanly.

use std::collections::BTreeMap;

use norsk_auto_manager::automanager::{AutoManager, AutoManagerHandle, AutoSettings, Notification, RunOptions};
use norsk_auto_manager::model::{Bundle, BundleId, NodeInventory, tags};
use norsk_auto_manager::sim::{ClusterNode, SimConfig};
use tokio::sync::broadcast;

use crate::sim_support::Sim;

/// A cluster server of pool `production` with `vcpus`.
pub fn cluster_node(id: &str, vcpus: f64) -> ClusterNode {
    ClusterNode {
        id: id.to_owned(),
        tags: BTreeMap::from([(tags::POOL.to_owned(), "production".to_owned())]),
        inventory: NodeInventory::local_server("site", "rack-1", "", vcpus),
    }
}

/// The runtime's settings against `sim`: pool `production` with one fixed
/// tier of cluster servers, placements untraced.
pub fn settings(sim: &Sim) -> AutoSettings {
    AutoSettings {
        url: sim.handle.url(),
        placement_pools: yaml_serde::from_str(
            "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n",
        )
        .expect("pools parse"),
        trace_placements: false,
        ..AutoSettings::default()
    }
}

/// A bundle `id` of one job `encode` asking `vcpus` in pool `production`.
pub fn one_job_bundle(id: &str, vcpus: f64) -> Bundle {
    Bundle {
        bundle_id: BundleId(id.to_owned()),
        spec: yaml_serde::from_str(&format!(
            "pool: production\njobs:\n  - {{jobName: encode, requirements: {{requiredCapacity: {vcpus}}}}}\n"
        ))
        .expect("bundle parses"),
        ..Bundle::default()
    }
}

/// A simulator, the runtime against it, and the runtime's notifications.
pub struct Setup {
    pub sim: Sim,
    pub am: AutoManagerHandle,
    pub join: tokio::task::JoinHandle<()>,
    pub events: broadcast::Receiver<Notification>,
}

/// A simulator with `seed` and the cluster servers `nodes` (id, vCPUs) at
/// `time_scale`, and the runtime on the same clock with [`settings`] as
/// `tune` leaves them.
pub async fn start(seed: u64, time_scale: f64, nodes: &[(&str, f64)], tune: impl FnOnce(&mut AutoSettings)) -> Setup {
    let sim = Sim::start_with(SimConfig {
        seed,
        time_scale,
        cluster_nodes: nodes.iter().map(|(id, v)| cluster_node(id, *v)).collect(),
        ..SimConfig::default()
    })
    .await;
    let mut settings = settings(&sim);
    tune(&mut settings);
    let (am, join) = AutoManager::run_with(settings, RunOptions { time_scale }).expect("runs");
    let events = am.subscribe();
    Setup { sim, am, join, events }
}

/// Closes the runtime, waits for its loop to end and shuts the simulator down.
pub async fn stop(setup: Setup) {
    setup.am.close().await;
    setup.join.await.expect("the loop ends cleanly");
    setup.sim.shutdown().await;
}
