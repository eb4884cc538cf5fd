//! The operator at scale against the real API server (ignored by default:
//! it prints a report rather than asserting timings). 1,000 `Bundle`s are
//! created at once; the report says how long until every one was `Ready`
//! and how many status writes each took (the target is at most 3 on this
//! happy path; the count is asserted, the time only printed).
//!
//! `cargo test --release --test kube operator_scale:: -- --ignored --nocapture`

use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use norsk_auto_manager::automanager::{AutoSettings, RunOptions};
use norsk_auto_manager::controller::leader::LeaseSettings;
use norsk_auto_manager::controller::process;
use norsk_auto_manager::controller::session::SessionSettings;
use norsk_auto_manager::crd::Bundle;
use norsk_auto_manager::manager::client::ClientSettings;
use norsk_auto_manager::model::{NodeInventory, tags};
use norsk_auto_manager::sim::{ClusterNode, SimConfig};
use norsk_auto_manager::telemetry::{Health, OperatorMetrics};
use tokio::sync::watch;

use crate::control_plane;
use crate::sim_support::{Sim, TIME_SCALE};

const BUNDLES: usize = 1_000;
const NODES: usize = 16;
const WAIT: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a report, not a check: run with --ignored --nocapture"]
async fn a_thousand_bundles_applied_at_once_become_ready() {
    let cp = control_plane::shared().await;
    cp.install_definitions().await;
    let ns = cp.namespace("scale").await;
    cp.kubectl_apply(
        &ns,
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: PlacementPool\nmetadata: {name: scale}\nspec:\n  tiers: [{name: cluster, kind: local-servers, scaleOut: fixed}]\n",
    )
    .expect("pool applies");
    let sim = Sim::start_with(SimConfig {
        seed: 3,
        time_scale: TIME_SCALE,
        cluster_nodes: (0..NODES)
            .map(|i| ClusterNode {
                id: format!("{ns}-{i}"),
                tags: BTreeMap::from([(tags::POOL.to_owned(), "scale".to_owned())]),
                inventory: NodeInventory::local_server("site", format!("rack-{}", i % 4), "big", 64.0),
            })
            .collect(),
        ..SimConfig::default()
    })
    .await;
    let metrics = Arc::new(OperatorMetrics::new());
    let (stop, stopped) = watch::channel(false);
    let operator = tokio::spawn(process::run(
        cp.client(),
        LeaseSettings {
            namespace: ns.clone(),
            name: "norsk-auto-manager".to_owned(),
            identity: "scale-0".to_owned(),
            duration_s: 15,
            grace_s: 5,
        },
        SessionSettings {
            settings: AutoSettings {
                url: sim.handle.url(),
                trace_placements: false,
                ..AutoSettings::default()
            },
            manager: ClientSettings::plaintext(sim.handle.url()),
            options: RunOptions { time_scale: TIME_SCALE },
            instance: Some("scale-0".to_owned()),
            bundle_namespace: Some(ns.clone()),
            status_namespace: ns.clone(),
            template_images: None,
            fleet: ns.clone(),
        },
        metrics.clone(),
        Arc::new(Health::default()),
        stopped,
    ));
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let ready_watch = watcher(bundles.clone(), watcher::Config::default()).applied_objects();
    let started = Instant::now();
    stream::iter(0..BUNDLES)
        .map(|i| {
            let bundles = bundles.clone();
            async move {
                let bundle: Bundle = yaml_serde::from_str(&format!(
                    "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {{name: b{i}}}\nspec:\n  pool: scale\n  jobs: [{{jobName: encode, requirements: {{requiredCapacity: 0.5}}}}]\n"
                ))
                .unwrap();
                bundles.create(&PostParams::default(), &bundle).await.unwrap();
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let created = started.elapsed();
    let mut ready = std::collections::BTreeSet::new();
    tokio::time::timeout(WAIT, async {
        let mut events = pin!(ready_watch);
        while let Some(b) = events.try_next().await.unwrap() {
            let is_ready = b
                .status
                .as_ref()
                .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if is_ready {
                ready.insert(b.name_any());
                if ready.len() == BUNDLES {
                    return;
                }
            }
        }
    })
    .await
    .expect("every bundle Ready");
    let all_ready = started.elapsed();
    let writes = metrics.status_writes_of("bundle");
    println!(
        "{BUNDLES} bundles: created in {:.1} s, all Ready after {:.1} s; {writes} status writes ({:.2} per bundle); {} reconciles",
        created.as_secs_f64(),
        all_ready.as_secs_f64(),
        writes as f64 / BUNDLES as f64,
        metrics.reconciles_of("bundle"),
    );
    assert!(
        writes as usize <= 3 * BUNDLES,
        "more than 3 status writes per bundle: {writes}"
    );
    let _ = stop.send(true);
    operator.await.unwrap().unwrap();
    sim.shutdown().await;
}
