//! The end-to-end scenario of `e2e/scenario.txt` — the one `e2e/kind/run.sh` runs on kind —
//! against the real control plane: the simulator in-process with the kind values' fleet,
//! the operator in-process under the chart's RBAC, faults through the `simctl` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::wait::await_condition;
use norsk_auto_manager::automanager::{AutoSettings, RunOptions};
use norsk_auto_manager::cli::Cli;
use norsk_auto_manager::controller::leader::LeaseSettings;
use norsk_auto_manager::controller::process;
use norsk_auto_manager::controller::session::SessionSettings;
use norsk_auto_manager::crd::{Bundle, PlacementPool};
use norsk_auto_manager::manager::client::ClientSettings;
use norsk_auto_manager::sim::{ClusterNode, SimConfig};
use norsk_auto_manager::telemetry::{Health, OperatorMetrics};
use serde::Deserialize;
use tokio::sync::watch;

use crate::control_plane;
use crate::sim_support::{Sim, TIME_SCALE};

/// How long one step may take.
const WAIT: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One line of `e2e/scenario.txt`.
#[derive(Debug)]
enum Step {
    Apply(String),
    Ready(String, String),
    Fault(Vec<String>),
    KillPrimary(String, String),
    MovedOff(String, String),
}

fn scenario() -> Vec<Step> {
    let text = std::fs::read_to_string(repo().join("e2e/scenario.txt")).expect("e2e/scenario.txt");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
            match (words[0].as_str(), &words[1..]) {
                ("apply", [file]) => Step::Apply(file.clone()),
                ("ready", [kind, name]) => Step::Ready(kind.clone(), name.clone()),
                ("fault", args) if !args.is_empty() => Step::Fault(args.to_vec()),
                ("kill-primary", [kind, name]) => Step::KillPrimary(kind.clone(), name.clone()),
                ("moved-off", [kind, name]) => Step::MovedOff(kind.clone(), name.clone()),
                _ => panic!("e2e/scenario.txt: cannot read {line:?}"),
            }
        })
        .collect()
}

#[derive(Deserialize)]
struct KindValues {
    simulator: SimulatorValues,
}

#[derive(Deserialize)]
struct SimulatorValues {
    cluster: Vec<ClusterNode>,
}

/// The fleet the kind scenario's simulator starts with.
fn kind_fleet() -> Vec<ClusterNode> {
    let text = std::fs::read_to_string(repo().join("e2e/values.yaml")).expect("e2e/values.yaml");
    yaml_serde::from_str::<KindValues>(&text)
        .expect("simulator.cluster of e2e/values.yaml")
        .simulator
        .cluster
}

/// A resource file applied into the test's namespace (the kind run uses `default`).
fn manifest(file: &str) -> String {
    std::fs::read_to_string(repo().join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .lines()
        .filter(|l| !l.trim_start().starts_with("namespace:"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn api(client: kube::Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    match kind {
        "bundle" => Api::namespaced_with(client, ns, &ApiResource::erase::<Bundle>(&())),
        "placementpool" => Api::all_with(client, &ApiResource::erase::<PlacementPool>(&())),
        other => panic!("e2e/scenario.txt: no kind {other:?} in this test"),
    }
}

fn is_ready(object: &DynamicObject) -> bool {
    object.data["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

async fn wait_for(api: &Api<DynamicObject>, name: &str, what: &str, cond: impl Fn(&DynamicObject) -> bool) {
    let found = tokio::time::timeout(
        WAIT,
        await_condition(api.clone(), name, move |o: Option<&DynamicObject>| o.is_some_and(&cond)),
    )
    .await;
    if !matches!(found, Ok(Ok(Some(_)))) {
        let now = api.get_opt(name).await.ok().flatten().map(|o| o.data);
        panic!("{name} never became {what}; it is {now:#?}");
    }
}

/// Runs `norsk-auto-manager simctl ARGS` against the simulator, as the kind script does.
async fn simctl(sim: &Sim, args: &[String]) {
    let addr = sim.handle.url();
    let argv = ["norsk-auto-manager", "simctl", "--addr", addr.as_str()]
        .into_iter()
        .map(str::to_owned)
        .chain(args.iter().cloned());
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("simctl {args:?}: {e}"));
    assert_eq!(
        norsk_auto_manager::cli::run(cli).await,
        ExitCode::SUCCESS,
        "simctl {args:?}"
    );
}

/// The operator's client: the chart's ServiceAccount with the chart's RBAC, for an operator of
/// `fleet` (its Manager status is named after it).
async fn chart_identity(cp: &control_plane::ControlPlane, ns: &str, release: &str, fleet: &str) -> kube::Client {
    let mut helm = cp.helm();
    helm.args(["template", release])
        .arg(repo().join("charts/norsk-auto-manager"))
        .args(["-n", ns, "--values"])
        .arg(repo().join("e2e/values.yaml"))
        .args(["--set", &format!("fleet={fleet}")])
        .args(["-s", "templates/rbac.yaml", "-s", "templates/serviceaccount.yaml"]);
    let out = helm.output().expect("helm runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    cp.kubectl_apply(ns, &String::from_utf8_lossy(&out.stdout))
        .expect("RBAC applies");
    cp.service_account_client(ns, &format!("{release}-norsk-auto-manager"))
        .await
}

#[tokio::test]
async fn kind_scenario_passes_against_the_real_api_server() {
    run_scenario("e2e", "default", false).await;
}

/// The same scenario against a published Manager (no AutoManager
/// additions), in a fleet of its own so the two runs' NorskNodes differ.
#[tokio::test]
async fn kind_scenario_passes_against_a_published_manager() {
    run_scenario("e2e-published", "published", true).await;
}

async fn run_scenario(prefix: &str, fleet: &str, published_api_only: bool) {
    let cp = control_plane::shared().await;
    cp.install_definitions().await;
    let ns = cp.namespace(prefix).await;
    // A release of its own: the chart's cluster-wide RBAC is named after it.
    let client = chart_identity(cp, &ns, prefix, fleet).await;
    let sim = Sim::start_with(SimConfig {
        seed: 11,
        time_scale: TIME_SCALE,
        cluster_nodes: kind_fleet(),
        published_api_only,
        ..SimConfig::default()
    })
    .await;
    let (stop, stopped) = watch::channel(false);
    let operator = tokio::spawn(process::run(
        client,
        LeaseSettings {
            namespace: ns.clone(),
            name: "norsk-auto-manager".to_owned(),
            identity: "e2e-0".to_owned(),
            duration_s: 4,
            grace_s: 1,
        },
        SessionSettings {
            settings: AutoSettings {
                url: sim.handle.url(),
                ..AutoSettings::default()
            },
            manager: ClientSettings::plaintext(sim.handle.url()),
            options: RunOptions { time_scale: TIME_SCALE },
            instance: Some("e2e-0".to_owned()),
            bundle_namespace: Some(ns.clone()),
            status_namespace: ns.clone(),
            template_images: None,
            fleet: fleet.to_owned(),
        },
        Arc::new(OperatorMetrics::new()),
        Arc::new(Health::default()),
        stopped,
    ));
    let steps = scenario();
    let mut killed: Option<String> = None;
    assert!(
        steps.iter().any(|s| matches!(s, Step::KillPrimary(..))),
        "the scenario injects no fault"
    );
    for step in steps {
        match &step {
            Step::Apply(file) => {
                // The other scenario may create the same cluster-wide pool at
                // the same moment: the loser of that race applies again.
                let mut applied = cp.kubectl_apply(&ns, &manifest(file));
                if applied.as_ref().is_err_and(|e| e.contains("AlreadyExists")) {
                    applied = cp.kubectl_apply(&ns, &manifest(file));
                }
                applied.unwrap_or_else(|e| panic!("{step:?}: {e}"));
            }
            Step::Ready(kind, name) => {
                wait_for(&api(cp.client(), &ns, kind), name, "Ready", is_ready).await;
            }
            Step::Fault(args) => simctl(&sim, args).await,
            Step::KillPrimary(kind, name) => {
                let object = api(cp.client(), &ns, kind).get(name).await.expect("get");
                let node = object.data["status"]["primaryNode"].as_str().map(str::to_owned);
                let node = node.unwrap_or_else(|| panic!("{kind}/{name} has no primary node"));
                simctl(&sim, &["kill-node".to_owned(), node.clone()]).await;
                killed = Some(node);
            }
            Step::MovedOff(kind, name) => {
                let node = killed.clone().expect("moved-off follows a kill-primary");
                wait_for(&api(cp.client(), &ns, kind), name, "moved off", move |o| {
                    let primary = o.data["status"]["primaryNode"].as_str();
                    primary.is_some_and(|p| p != node) && is_ready(o)
                })
                .await;
            }
        }
    }
    let _ = stop.send(true);
    operator.await.expect("operator task").expect("operator ran");
    sim.shutdown().await;
}
