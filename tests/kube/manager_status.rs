//! The leader's Manager status against the real API server: an operator driving a published
//! (1.0.384) Manager publishes that `bundleStore` takes the published way and what a user loses,
//! `kubectl norsk manager` prints it, and when Manager is upgraded under the operator the status
//! says `served`. Without a published status the command fails, saying why; refused the list,
//! it names the permission.

use std::process::Output;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use norsk_auto_manager::decide::manager_status::config_map_name;
use norsk_auto_manager::manager::proto::sim_admin;
use norsk_auto_manager::model::manager::Capability;
use norsk_auto_manager::plugin::{self, Command, PluginError};
use norsk_auto_manager::sim::SimConfig;

use crate::control_plane;
use crate::operator_support::{Operator, cluster_node_in, installed, until};
use crate::sim_support::{Sim, TIME_SCALE};

/// `kubectl-norsk ARGS` as the cluster's admin.
fn kubectl_norsk(cp: &control_plane::ControlPlane, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-norsk"))
        .arg("--kubeconfig")
        .arg(cp.kubeconfig())
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("kubectl-norsk runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The mode the status ConfigMap gives `capability`.
fn mode_of(config_map: &ConfigMap, capability: Capability) -> Option<&str> {
    config_map
        .data
        .as_ref()?
        .get(&format!("capability.{capability}"))
        .map(String::as_str)
}

/// The MODE and WITHOUT IT cells of `capability`'s row in `kubectl norsk manager`'s table.
fn row_of(table: &str, capability: Capability) -> Option<(String, String)> {
    let row = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(capability.as_str()))?;
    let rest = row[capability.as_str().len()..].trim_start();
    let (mode, lost) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    Some((mode.to_owned(), lost.trim().to_owned()))
}

#[tokio::test]
async fn a_leader_on_a_published_manager_says_what_users_lose_and_an_upgrade_shows_as_served() {
    let cp = installed().await;
    let ns = cp.namespace("manager-status").await;
    let sim = Sim::start_with(SimConfig {
        seed: 13,
        time_scale: TIME_SCALE,
        cluster_nodes: vec![cluster_node_in(&format!("{ns}-a"), "rack-1", "production")],
        published_api_only: true,
        ..SimConfig::default()
    })
    .await;
    // Its fleet is named after the namespace: the ConfigMap is this test's alone.
    let operator = Operator::start(cp, &ns, &sim, "status-0").await;
    let config_maps: Api<ConfigMap> = Api::namespaced(cp.client(), &ns);
    let name = config_map_name(&ns);
    let published = until(
        &config_maps,
        &name,
        "bundleStore published while connected",
        |c: Option<&ConfigMap>| {
            c.is_some_and(|c| {
                mode_of(c, Capability::BundleStore) == Some("published")
                    && c.data
                        .as_ref()
                        .is_some_and(|d| d.get("connection").is_some_and(|s| s == "ready"))
            })
        },
    )
    .await;
    let labels = published.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["automanager.norsk.video/status"], "manager");
    assert_eq!(labels["automanager.norsk.video/fleet"], ns);
    let data = published.data.clone().unwrap_or_default();
    assert_eq!(data["leader"], "status-0");
    assert_eq!(data["manager"], sim.handle.url());
    let (instead, lost) = Capability::BundleStore.without();
    assert_eq!(data["capability.bundleStore.instead"], instead);
    assert_eq!(data["capability.bundleStore.lost"], lost);

    let out = kubectl_norsk(cp, &["manager", "--fleet", &ns]);
    let table = text(&out.stdout);
    assert!(out.status.success(), "exit {:?}: {}", out.status, text(&out.stderr));
    assert!(table.contains(&format!("Fleet:      {ns}\n")), "{table}");
    assert!(
        table.contains(&format!("Manager:    {}\n", sim.handle.url())),
        "{table}"
    );
    assert!(table.contains("Connection: ready\n"), "{table}");
    assert!(table.contains("Leader:     status-0\n"), "{table}");
    assert!(table.contains(&format!("configmap {ns}/{name}")), "{table}");
    assert_eq!(
        row_of(&table, Capability::BundleStore),
        Some(("published".to_owned(), lost.to_owned())),
        "{table}"
    );
    let out = kubectl_norsk(cp, &["manager", "--fleet", &ns, "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let manager = &json["managers"][0];
    assert_eq!(manager["fleet"], ns.as_str());
    assert_eq!(manager["leader"], "status-0");
    assert_eq!(manager["capabilities"][0]["capability"], "bundleStore");
    assert_eq!(manager["capabilities"][0]["mode"], "published");
    assert_eq!(
        json["managers"].as_array().map(Vec::len),
        Some(1),
        "one fleet asked for"
    );

    // Manager upgraded to the full API under the running operator.
    sim.admin
        .clone()
        .set_api(sim_admin::SetApiRequest {
            published_api_only: false,
        })
        .await
        .expect("Manager switched");
    let served = until(
        &config_maps,
        &name,
        "every capability served",
        |c: Option<&ConfigMap>| c.is_some_and(|c| Capability::ALL.iter().all(|k| mode_of(c, *k) == Some("served"))),
    )
    .await;
    let data = served.data.unwrap_or_default();
    assert!(
        !data.keys().any(|k| k.ends_with(".lost") || k.ends_with(".instead")),
        "nothing is lost once Manager serves everything: {data:?}"
    );
    let out = kubectl_norsk(cp, &["manager", "--fleet", &ns]);
    let table = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        row_of(&table, Capability::BundleStore),
        Some(("served".to_owned(), "-".to_owned())),
        "{table}"
    );
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn kubectl_norsk_manager_fails_when_no_leader_has_published_its_status() {
    let cp = installed().await;
    let ns = cp.namespace("no-manager-status").await;
    // A fleet no operator runs (the control plane is shared with tests whose operators do).
    let out = kubectl_norsk(cp, &["manager", "--fleet", &ns]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "no norsk-auto-manager leader has published its Manager status for fleet {ns:?}: \
             is the operator running and leading?"
        )),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing on stdout: {}", text(&out.stdout));
    // A namespace where no operator runs.
    let out = kubectl_norsk(cp, &["manager", "--operator-namespace", &ns, "-o", "json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(&format!("in namespace {ns}: is the operator running")),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn kubectl_norsk_manager_refused_the_list_names_the_permission() {
    let cp = installed().await;
    let ns = cp.namespace("manager-status-forbidden").await;
    // A ServiceAccount bound to nothing.
    let client = cp.service_account_client(&ns, "nobody").await;
    let command = |operator_namespace: Option<&str>| Command::Manager {
        fleet: None,
        operator_namespace: operator_namespace.map(str::to_owned),
        output: norsk_auto_manager::cli::plan::Output::Table,
    };
    match plugin::run(client.clone(), &ns, command(None)).await {
        Err(e @ PluginError::ManagerStatusForbidden { namespace: None }) => {
            let message = e.to_string();
            assert!(message.contains("list configmaps, cluster-wide"), "{message}");
            assert!(message.contains("--operator-namespace"), "{message}");
        }
        other => panic!("expected ManagerStatusForbidden, got {other:?}"),
    }
    match plugin::run(client, &ns, command(Some(&ns))).await {
        Err(e @ PluginError::ManagerStatusForbidden { namespace: Some(_) }) => {
            let message = e.to_string();
            assert!(message.contains(&format!("list configmaps in {ns}")), "{message}");
        }
        other => panic!("expected ManagerStatusForbidden, got {other:?}"),
    }
}
