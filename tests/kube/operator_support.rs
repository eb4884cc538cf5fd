//! The harness of the operator's tests (`operator.rs`, `drain.rs`,
//! `kubectl_plugin.rs`): the definitions and example pools installed once
//! per control plane, a simulator per test with two
//! cluster servers of `production`, an operator process in the test's
//! runtime, and waits on the API server bounded by a deadline.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::events::v1::Event;
use kube::runtime::wait::{Condition, await_condition};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use norsk_auto_manager::automanager::{AutoSettings, RunOptions};
use norsk_auto_manager::controller::leader::LeaseSettings;
use norsk_auto_manager::controller::process;
use norsk_auto_manager::controller::session::SessionSettings;
use norsk_auto_manager::crd::Bundle;
use norsk_auto_manager::manager::client::ClientSettings;
use norsk_auto_manager::model::{JobPhase, NodeInventory, tags};
use norsk_auto_manager::sim::{ClusterNode, SimConfig};
use norsk_auto_manager::telemetry::{Health, OperatorMetrics};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::control_plane;
use crate::sim_support::{Sim, TIME_SCALE};

/// How long a test waits for the API server to show an outcome.
pub const WAIT: Duration = Duration::from_secs(90);

/// The definitions and the example pools, installed once per control plane.
pub async fn installed() -> &'static control_plane::ControlPlane {
    let cp = control_plane::shared().await;
    cp.install_definitions().await;
    cp.once("example pools", || async {
        let pools = example("pools.yaml");
        cp.kubectl_apply("default", &pools).expect("pools apply");
    })
    .await;
    cp
}

/// An example file, with its namespaces removed so it applies into the
/// test's namespace.
pub fn example(name: &str) -> String {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(name))
        .expect("example readable");
    text.lines()
        .filter(|l| !l.trim_start().starts_with("namespace:"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A cluster server of `pool`.
pub fn cluster_node_in(id: &str, az: &str, pool: &str) -> ClusterNode {
    ClusterNode {
        id: id.to_owned(),
        tags: BTreeMap::from([(tags::POOL.to_owned(), pool.to_owned())]),
        inventory: NodeInventory::local_server("studio", az, "r640", 8.0),
    }
}

/// A simulator with two cluster servers of `production`, `<ns>-a` and
/// `<ns>-b` (node names are cluster-wide once mirrored).
pub async fn simulator(ns: &str) -> Sim {
    simulator_in(ns, "production").await
}

/// The same with the two servers in `pool`.
pub async fn simulator_in(ns: &str, pool: &str) -> Sim {
    Sim::start_with(SimConfig {
        seed: 5,
        time_scale: TIME_SCALE,
        cluster_nodes: vec![
            cluster_node_in(&format!("{ns}-a"), "rack-1", pool),
            cluster_node_in(&format!("{ns}-b"), "rack-2", pool),
        ],
        ..SimConfig::default()
    })
    .await
}

/// One operator process, in this test's runtime.
pub struct Operator {
    pub metrics: Arc<OperatorMetrics>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Operator {
    pub async fn start(cp: &control_plane::ControlPlane, ns: &str, sim: &Sim, identity: &str) -> Operator {
        Self::start_with(cp, ns, sim, identity, AutoSettings::default()).await
    }

    /// With `settings` (their URL replaced by the simulator's).
    pub async fn start_with(
        cp: &control_plane::ControlPlane,
        ns: &str,
        sim: &Sim,
        identity: &str,
        settings: AutoSettings,
    ) -> Operator {
        let metrics = Arc::new(OperatorMetrics::new());
        let (stop, stopped) = watch::channel(false);
        let lease = LeaseSettings {
            namespace: ns.to_owned(),
            name: "norsk-auto-manager".to_owned(),
            identity: identity.to_owned(),
            duration_s: 15,
            grace_s: 5,
        };
        let session = SessionSettings {
            settings: AutoSettings {
                url: sim.handle.url(),
                trace_placements: false,
                ..settings
            },
            manager: ClientSettings::plaintext(sim.handle.url()),
            options: RunOptions { time_scale: TIME_SCALE },
            instance: Some(identity.to_owned()),
            bundle_namespace: Some(ns.to_owned()),
            status_namespace: ns.to_owned(),
            template_images: None,
            fleet: ns.to_owned(),
        };
        let client = cp.client();
        let m = metrics.clone();
        let task = tokio::spawn(async move {
            process::run(client, lease, session, m, Arc::new(Health::default()), stopped)
                .await
                .expect("operator runs");
        });
        Operator { metrics, stop, task }
    }

    pub fn is_leading(&self) -> bool {
        self.metrics.leader.get() == 1
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.expect("operator stops cleanly");
    }
}

/// Waits for an Event in `namespace` that `matches` (a watch, bounded by
/// `WAIT`); `what` names it in the failure.
pub async fn event_where(
    cp: &control_plane::ControlPlane,
    namespace: &str,
    what: &str,
    matches: impl Fn(&Event) -> bool,
) -> Event {
    let events = watcher(
        Api::<Event>::namespaced(cp.client(), namespace),
        watcher::Config::default(),
    )
    .applied_objects();
    tokio::time::timeout(WAIT, async {
        let mut events = std::pin::pin!(events);
        while let Some(e) = events.try_next().await.expect("watch events") {
            if matches(&e) {
                return e;
            }
        }
        panic!("the event watch ended")
    })
    .await
    .unwrap_or_else(|_| panic!("no {what}"))
}

/// Waits until `cond` holds for `name` (a watch, bounded by `WAIT`).
pub async fn until<K>(api: &Api<K>, name: &str, what: &str, cond: impl Condition<K>) -> K
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    match tokio::time::timeout(WAIT, await_condition(api.clone(), name, cond)).await {
        Ok(Ok(Some(object))) => object,
        Ok(Ok(None)) => panic!("{name} is gone while waiting for {what}"),
        Ok(Err(e)) => panic!("watch of {name} failed: {e}"),
        Err(_) => {
            let now = api.get_opt(name).await.ok().flatten();
            panic!("{name} never reached {what}; it is {now:#?}")
        }
    }
}

pub fn condition(bundle: &Bundle, type_: &str) -> Option<(String, String)> {
    bundle
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

pub fn is_ready(bundle: Option<&Bundle>) -> bool {
    bundle.is_some_and(|b| condition(b, "Ready").is_some_and(|(s, _)| s == "True"))
}

/// A PlacementPool `name` of one fixed tier of cluster servers.
pub fn cluster_pool(name: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: PlacementPool\nmetadata: {{name: {name}}}\nspec:\n  tiers: [{{name: cluster, kind: local-servers, scaleOut: fixed}}]\n"
    )
}

/// A one-job bundle on the cluster tier of `production`.
pub fn small_bundle(name: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}}}\nspec:\n  pool: production\n  jobs:\n    - {{jobName: encode, template: encoder, requirements: {{requiredCapacity: 2}}}}\n"
    )
}

/// A bundle on the cluster tier of `production` with an auto job `encode`
/// and a manual job `record`, started on the replicas in `started`.
pub fn manual_bundle(name: &str, started: &[u32]) -> String {
    let started = if started.is_empty() {
        String::new()
    } else {
        format!(", startedReplicas: {started:?}")
    };
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}}}\nspec:\n  pool: production\n  jobs:\n    - {{jobName: encode, template: encoder, requirements: {{requiredCapacity: 1}}}}\n    - {{jobName: record, template: recorder, startMode: manual{started}, requirements: {{requiredCapacity: 1}}}}\n"
    )
}

/// The state and node the status gives `job` of the primary replica.
pub fn primary_job(bundle: Option<&Bundle>, job: &str) -> Option<(JobPhase, Option<String>)> {
    bundle?
        .status
        .as_ref()?
        .replicas
        .iter()
        .find(|r| r.index == 0)?
        .jobs
        .iter()
        .find(|j| j.job_name == job)
        .map(|j| (j.state, j.node.clone()))
}

/// The nodes the simulator runs instances of `job_id` on.
pub async fn instances_of(sim: &Sim, job_id: &str) -> Vec<String> {
    sim.snapshot()
        .await
        .nodes
        .iter()
        .filter(|n| n.instances.iter().any(|i| i.job_id.0 == job_id))
        .map(|n| n.id.0.clone())
        .collect()
}
