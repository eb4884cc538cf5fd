//! The Helm chart (`charts/norsk-auto-manager/`) against the real control plane (etcd +
//! kube-apiserver, see `support/control_plane.rs`): it lints, renders into objects the API
//! server accepts, refuses a typo in values, installs, ships the repository's CRDs, renders a
//! settings file the operator accepts — and its RBAC, bound to the operator's ServiceAccount,
//! is enough for the operator to run and publish its Manager status (and nothing more).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use norsk_auto_manager::automanager::{AutoSettings, RunOptions};
use norsk_auto_manager::cli::operator::{self, OperatorFile};
use norsk_auto_manager::controller::leader::LeaseSettings;
use norsk_auto_manager::controller::process;
use norsk_auto_manager::controller::session::SessionSettings;
use norsk_auto_manager::crd::{self, Bundle, HotSparePolicy, JobMigration, NodeDrain, NorskNode, PlacementPool};
use norsk_auto_manager::decide::manager_status::config_map_name;
use norsk_auto_manager::manager::client::ClientSettings;
use norsk_auto_manager::model::{NodeInventory, tags};
use norsk_auto_manager::sim::{ClusterNode, SimConfig};
use norsk_auto_manager::telemetry::{Health, OperatorMetrics};
use serde_json::json;
use tokio::sync::{OnceCell, watch};

use crate::control_plane;
use crate::sim_support::{Sim, TIME_SCALE};

/// How long a test waits for the API server to show an outcome.
const WAIT: Duration = Duration::from_secs(90);
/// Every install needs a Manager URL (or the simulator).
const URL: &str = "manager.url=http://manager.norsk.svc:6789";

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/norsk-auto-manager")
}

/// The definitions (from the chart's crds/) and the example pools, once per control plane.
async fn installed() -> &'static control_plane::ControlPlane {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    let cp = control_plane::shared().await;
    INSTALLED
        .get_or_init(|| async {
            let mut apply = cp.kubectl();
            apply
                .args(["apply", "--server-side", "-f"])
                .arg(chart_dir().join("crds"));
            let out = apply.output().expect("kubectl runs");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            cp.until_established().await;
            let pools = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/pools.yaml"))
                .expect("examples/pools.yaml");
            cp.kubectl_apply("default", &pools).expect("pools apply");
        })
        .await;
    cp
}

/// Runs `command` with `input` on stdin: stdout on success, else stderr.
fn run(mut command: Command, input: &str) -> Result<String, String> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes()).map_err(|e| format!("stdin: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("wait: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `helm template RELEASE chart -n NAMESPACE ARGS...`.
fn template(cp: &control_plane::ControlPlane, release: &str, namespace: &str, args: &[&str]) -> Result<String, String> {
    let mut helm = cp.helm();
    helm.args(["template", release])
        .arg(chart_dir())
        .args(["-n", namespace])
        .args(args);
    run(helm, "")
}

#[tokio::test]
async fn chart_passes_helm_lint() {
    let cp = control_plane::shared().await;
    let mut helm = cp.helm();
    helm.args(["lint", "--strict"]).arg(chart_dir()).args(["--set", URL]);
    let out = run(helm, "").unwrap_or_else(|e| panic!("helm lint failed:\n{e}"));
    assert!(out.contains("0 chart(s) failed"), "{out}");
    let mut helm = cp.helm();
    helm.args(["show", "readme"]).arg(chart_dir());
    let readme = run(helm, "").unwrap_or_else(|e| panic!("helm show readme failed:\n{e}"));
    assert!(readme.contains("| `manager.url` |"), "helm show readme:\n{readme}");
}

#[tokio::test]
async fn the_chart_renders_with_its_defaults_and_its_notes_say_what_is_missing() {
    let cp = control_plane::shared().await;
    let rendered = template(cp, "defaults", "norsk-system", &[]).unwrap_or_else(|e| panic!("render: {e}"));
    assert!(rendered.contains("kind: Deployment"), "{rendered}");
    let mut helm = cp.helm();
    helm.args(["install", "defaults"])
        .arg(chart_dir())
        .args(["-n", "norsk-system", "--dry-run=client"]);
    let notes = run(helm, "").unwrap_or_else(|e| panic!("dry run: {e}"));
    assert!(
        notes.contains("WARNING: no Manager to drive. Set manager.url"),
        "{notes}"
    );
    assert!(notes.contains("settings.url: no Manager address given"), "{notes}");
    let mut helm = cp.helm();
    helm.args(["install", "defaults"])
        .arg(chart_dir())
        .args(["-n", "norsk-system", "--dry-run=client", "--set", URL]);
    let notes = run(helm, "").unwrap_or_else(|e| panic!("dry run: {e}"));
    assert!(!notes.contains("WARNING"), "{notes}");
}

#[tokio::test]
async fn a_disruption_budget_is_rendered_only_when_it_allows_a_disruption() {
    let cp = control_plane::shared().await;
    let budgets = |args: &[&str]| {
        let mut all = vec!["--set", URL];
        all.extend_from_slice(args);
        let rendered = template(cp, "pdb", "norsk-system", &all).unwrap_or_else(|e| panic!("render: {e}"));
        yaml_serde::Deserializer::from_str(&rendered)
            .filter_map(|d| serde::Deserialize::deserialize(d).ok())
            .filter(|d: &serde_json::Value| d["kind"] == "PodDisruptionBudget")
            .collect::<Vec<_>>()
    };
    let default = budgets(&[]);
    assert_eq!(default.len(), 1, "two replicas keep one available");
    // A Manager outage makes every replica unready: they may still be evicted.
    assert_eq!(default[0]["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    assert!(
        budgets(&["--set", "replicaCount=1"]).is_empty(),
        "one replica: a budget would block every drain"
    );
    assert!(budgets(&["--set", "podDisruptionBudget.enabled=false"]).is_empty());
}

#[tokio::test]
async fn rendered_chart_is_accepted_by_the_api_server() {
    let cp = installed().await;
    let ns = cp.namespace("render").await;
    for args in [
        vec!["--include-crds", "--set", URL],
        vec![
            "--set",
            "simulator.enabled=true",
            "--set",
            "manager.tls.secretName=manager-tls",
        ],
        vec![
            "--set",
            URL,
            "--set",
            "manager.tls.secretName=manager-tls",
            "--set",
            "manager.tls.clientCertificate=true",
            "--set",
            "manager.token.secretName=manager-token",
            "--set",
            "podDisruptionBudget.enabled=false",
        ],
    ] {
        let rendered = template(cp, "render", &ns, &args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let mut kubectl = cp.kubectl();
        kubectl.args(["apply", "--dry-run=server", "-n", &ns, "-f", "-"]);
        run(kubectl, &rendered).unwrap_or_else(|e| panic!("the API server refused {args:?}:\n{e}"));
    }
}

#[tokio::test]
async fn a_typo_in_values_fails_install() {
    let cp = installed().await;
    let ns = cp.namespace("typo").await;
    for typo in [
        "replicaCont=3",
        "manager.ur=http://m:1",
        "metrics.serviceMonitor.enable=true",
        "lease.nam=x",
        // Inside the core's settings too: refused at install, not at the operator's start.
        "settings.maxRestartPerHour=3",
        "settings.migration.placingTimeout=1",
    ] {
        let mut helm = cp.helm();
        helm.args(["install", "typo"])
            .arg(chart_dir())
            .args(["-n", &ns, "--set", URL, "--set", typo]);
        let error = run(helm, "").expect_err(typo);
        assert!(error.contains("additional properties"), "{typo}: {error}");
    }
    // A wrong type or value is refused too, before anything reaches the cluster.
    let error = template(cp, "typo", &ns, &["--set", URL, "--set", "logFormat=xml"]).expect_err("logFormat=xml");
    assert!(error.contains("logFormat"), "{error}");
    let error = template(
        cp,
        "typo",
        &ns,
        &["--set", URL, "--set", "settings.placementPools[0].name=x"],
    )
    .expect_err("pools in settings");
    assert!(error.contains("settings"), "{error}");
    let error = template(cp, "typo", &ns, &["--set", URL, "--set", "settings.pendingWindow=soon"])
        .expect_err("a word for a number");
    assert!(error.contains("/settings/pendingWindow"), "{error}");
}

#[tokio::test]
async fn chart_installs_with_two_leader_elected_replicas() {
    let cp = installed().await;
    let ns = cp.namespace("install").await;
    let mut helm = cp.helm();
    helm.args(["install", "nam"])
        .arg(chart_dir())
        .args(["-n", &ns, "--set", "simulator.enabled=true"]);
    run(helm, "").unwrap_or_else(|e| panic!("helm install failed:\n{e}"));
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(cp.client(), &ns);
    let operator = deployments
        .get("nam-norsk-auto-manager")
        .await
        .expect("operator Deployment");
    let spec = operator.spec;
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.expect("pod spec");
    let container = &pod.containers[0];
    assert_eq!(container.args.as_deref().unwrap_or_default()[0], "operator");
    let env: BTreeMap<_, _> = container
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value_from.is_some()))
        .collect();
    // The election needs each pod's name and namespace.
    assert_eq!(env.get("POD_NAME"), Some(&true));
    assert_eq!(env.get("POD_NAMESPACE"), Some(&true));
    let security = container.security_context.clone().expect("securityContext");
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.capabilities.and_then(|c| c.drop), Some(vec!["ALL".to_owned()]));
    assert_eq!(
        pod.security_context.and_then(|s| s.seccomp_profile).map(|s| s.type_),
        Some("RuntimeDefault".to_owned())
    );
    let probe_path = |p: Option<&k8s_openapi::api::core::v1::Probe>| {
        p.and_then(|p| p.http_get.as_ref()).and_then(|h| h.path.clone())
    };
    assert_eq!(
        probe_path(container.liveness_probe.as_ref()).as_deref(),
        Some("/healthz")
    );
    assert_eq!(
        probe_path(container.readiness_probe.as_ref()).as_deref(),
        Some("/readyz")
    );
    let simulator = deployments
        .get("nam-norsk-auto-manager-sim")
        .await
        .expect("simulator Deployment");
    let sim_args = simulator.spec.template.spec.expect("sim pod").containers[0]
        .args
        .clone()
        .unwrap_or_default();
    assert_eq!(sim_args[0], "sim");
}

#[test]
fn chart_crds_are_the_repository_crds() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let names = |dir: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("crds dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&repo), names(&chart_dir().join("crds")));
    for name in names(&repo) {
        let a = std::fs::read(repo.join(&name)).expect("repo CRD");
        let b = std::fs::read(chart_dir().join("crds").join(&name)).expect("chart CRD");
        assert!(
            a == b,
            "charts/norsk-auto-manager/crds/{name} differs from crds/{name}: copy it over"
        );
    }
}

#[tokio::test]
async fn rendered_settings_file_is_one_the_operator_accepts() {
    let cp = control_plane::shared().await;
    let rendered = template(
        cp,
        "cfg",
        "ops",
        &[
            "--set",
            URL,
            "--set",
            "settings.pendingWindow=30",
            "--set",
            "settings.tracePlacements=false",
            "--set",
            "manager.tlsDomain=manager.norsk",
            "-s",
            "templates/configmap.yaml",
        ],
    )
    .expect("render");
    let config_map: k8s_openapi::api::core::v1::ConfigMap = yaml_serde::from_str(&rendered).expect("a ConfigMap");
    let text = config_map
        .data
        .and_then(|d| d.get("operator.yaml").cloned())
        .expect("operator.yaml");
    let file: OperatorFile = yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    assert_eq!(file.settings.pending_window, 30);
    assert!(!file.settings.trace_placements);
    assert_eq!(file.lease.namespace.as_deref(), Some("ops"));
    let path = std::env::temp_dir().join(format!("norsk-chart-settings-{}.yaml", std::process::id()));
    let args = operator::Args {
        config: Some(path.clone()),
        identity: Some("cfg-0".to_owned()),
        ..operator::Args::default()
    };
    let config = operator::resolve(&args, |p| {
        if p == path {
            Ok(text.clone())
        } else {
            std::fs::read_to_string(p)
        }
    })
    .unwrap_or_else(|e| panic!("{e}:\n{text}"));
    assert_eq!(config.session.settings.url, "http://manager.norsk.svc:6789");
    assert_eq!(config.metrics_addr.port(), 8080);
    assert_eq!(config.lease.name, "norsk-auto-manager");
}

/// Applies the chart's ServiceAccount and RBAC (release `release` in `ns`, the operator of the
/// fleet `ns`) and returns a client with the ServiceAccount's token.
async fn operator_identity(cp: &control_plane::ControlPlane, release: &str, ns: &str) -> Client {
    let fleet = format!("fleet={ns}");
    let rbac = template(
        cp,
        release,
        ns,
        &[
            "--set",
            URL,
            "--set",
            &fleet,
            "-s",
            "templates/rbac.yaml",
            "-s",
            "templates/serviceaccount.yaml",
        ],
    )
    .expect("render RBAC");
    cp.kubectl_apply(ns, &rbac).expect("RBAC applies");
    cp.service_account_client(ns, &format!("{release}-norsk-auto-manager"))
        .await
}

fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 => {}
        other => panic!("{what} should be forbidden, got {other:?}"),
    }
}

#[tokio::test]
async fn operator_runs_as_the_charts_service_account() {
    let cp = installed().await;
    let ns = cp.namespace("rbac").await;
    let client = operator_identity(cp, "rbac", &ns).await;
    let sim = Sim::start_with(SimConfig {
        seed: 9,
        time_scale: TIME_SCALE,
        cluster_nodes: vec![ClusterNode {
            id: format!("{ns}-a"),
            tags: BTreeMap::from([(tags::POOL.to_owned(), "production".to_owned())]),
            inventory: NodeInventory::local_server("studio", "rack-1", "r640", 8.0),
        }],
        ..SimConfig::default()
    })
    .await;
    let (stop, stopped) = watch::channel(false);
    let lease = LeaseSettings {
        namespace: ns.clone(),
        name: "norsk-auto-manager".to_owned(),
        identity: "rbac-0".to_owned(),
        duration_s: 4,
        grace_s: 1,
    };
    let session = SessionSettings {
        settings: AutoSettings {
            url: sim.handle.url(),
            ..AutoSettings::default()
        },
        manager: ClientSettings::plaintext(sim.handle.url()),
        options: RunOptions { time_scale: TIME_SCALE },
        instance: Some("rbac-0".to_owned()),
        bundle_namespace: Some(ns.clone()),
        status_namespace: ns.clone(),
        template_images: None,
        fleet: ns.clone(),
    };
    let task = tokio::spawn(process::run(
        client,
        lease,
        session,
        Arc::new(OperatorMetrics::new()),
        Arc::new(Health::default()),
        stopped,
    ));
    let bundle = "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {name: rbac}\nspec:\n  pool: production\n  jobs:\n    - {jobName: encode, template: encoder, requirements: {requiredCapacity: 2}}\n";
    cp.kubectl_apply(&ns, bundle).expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let ready = tokio::time::timeout(
        WAIT,
        await_condition(bundles.clone(), "rbac", |b: Option<&Bundle>| {
            b.and_then(|b| b.status.as_ref())
                .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        }),
    )
    .await
    .expect("the bundle became Ready under the chart's RBAC")
    .expect("watch")
    .expect("bundle exists");
    // The finalizer went on (patch) and comes off on delete (patch + finalizers).
    assert!(!ready.finalizers().is_empty());
    let leases: Api<Lease> = Api::namespaced(cp.client(), &ns);
    let holder = leases
        .get("norsk-auto-manager")
        .await
        .expect("the Lease was created")
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("rbac-0"));
    // The fleet mirror created the node and wrote its status (NorskNode create + status).
    let nodes: Api<NorskNode> = Api::all(cp.client());
    let selector = format!("automanager.norsk.video/fleet={ns}");
    let mut mirrored = watcher(nodes, watcher::Config::default().labels(&selector))
        .default_backoff()
        .applied_objects()
        .boxed();
    let with_status = tokio::time::timeout(WAIT, async {
        // Watch errors (an expired resource version) are retried by the watcher.
        while let Some(node) = mirrored.next().await {
            if node.is_ok_and(|n| n.status.is_some()) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(with_status, Ok(true), "no NorskNode of fleet {ns} got a status");
    // The leader published its Manager status (ConfigMap create + patch, by name).
    let config_maps: Api<ConfigMap> = Api::namespaced(cp.client(), &ns);
    let published = tokio::time::timeout(
        WAIT,
        await_condition(config_maps, &config_map_name(&ns), |c: Option<&ConfigMap>| {
            c.and_then(|c| c.data.as_ref())
                .is_some_and(|d| d.get("connection").is_some_and(|c| c == "ready"))
        }),
    )
    .await;
    assert!(
        matches!(published, Ok(Ok(Some(_)))),
        "no Manager status published under the chart's RBAC: {published:?}"
    );
    bundles.delete("rbac", &DeleteParams::default()).await.expect("delete");
    let uid = ready.uid().unwrap_or_default();
    tokio::time::timeout(WAIT, await_condition(bundles, "rbac", conditions::is_deleted(&uid)))
        .await
        .expect("the finalizer came off under the chart's RBAC")
        .expect("watch");
    let _ = stop.send(true);
    task.await.expect("operator task").expect("operator ran");
    sim.shutdown().await;
}

fn erased<K: Resource<DynamicType = ()>>() -> ApiResource {
    ApiResource::erase::<K>(&())
}

#[tokio::test]
async fn charts_rbac_covers_every_kinds_status_and_events_and_nothing_else() {
    let cp = installed().await;
    let ns = cp.namespace("rbac-kinds").await;
    let client = operator_identity(cp, "kinds", &ns).await;
    let objects = format!(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: NodeDrain\nmetadata: {{name: {ns}-drain}}\nspec: {{nodeId: {ns}-a}}\n---\n\
         apiVersion: automanager.norsk.video/v1alpha1\nkind: JobMigration\nmetadata: {{name: move}}\nspec: {{bundle: b, jobName: encode}}\n---\n\
         apiVersion: automanager.norsk.video/v1alpha1\nkind: HotSparePolicy\nmetadata: {{name: production}}\nspec: {{pool: production, targetCount: 0, spec: {{instanceType: m5.xlarge, region: eu-west-1}}}}\n"
    );
    cp.kubectl_apply(&ns, &objects).expect("objects apply");
    let status = |kind: &str| {
        json!({
            "apiVersion": crd::API_VERSION,
            "kind": kind,
            "status": {"conditions": [{
                "type": "Ready", "status": "False", "reason": "Checking", "message": "",
                "lastTransitionTime": "2026-11-29T10:00:00Z"
            }]},
        })
    };
    let apply = PatchParams::apply("norsk-chart-test").force();
    for (resource, namespaced, name) in [
        (erased::<PlacementPool>(), false, "production".to_owned()),
        (erased::<HotSparePolicy>(), false, "production".to_owned()),
        (erased::<NodeDrain>(), false, format!("{ns}-drain")),
        (erased::<JobMigration>(), true, "move".to_owned()),
    ] {
        let api: Api<DynamicObject> = if namespaced {
            Api::namespaced_with(client.clone(), &ns, &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        api.list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("list {}: {e}", resource.plural));
        let patch = status(&resource.kind);
        api.patch_status(&name, &apply, &Patch::Apply(&patch))
            .await
            .unwrap_or_else(|e| panic!("patch {}/status: {e}", resource.plural));
        // Specs belong to people: the operator writes only status.
        if !matches!(resource.kind.as_str(), "NodeDrain" | "JobMigration") {
            forbidden(
                api.patch(&name, &apply, &Patch::Apply(&patch)).await,
                &format!("patching a {} spec", resource.kind),
            );
        }
        forbidden(
            api.delete(&name, &DeleteParams::default()).await,
            &format!("deleting a {}", resource.kind),
        );
    }
    // The operator records the drains and migrations it starts itself (an
    // interruption notice, a drain's migrations) by applying new objects.
    let drains: Api<NodeDrain> = Api::all(client.clone());
    let recorded = json!({
        "apiVersion": crd::API_VERSION, "kind": "NodeDrain",
        "metadata": {"name": format!("{ns}-reclaim")},
        "spec": {"nodeId": format!("{ns}-b"), "force": true, "interruption": {"kind": "spot-interruption"}},
    });
    drains
        .patch(&format!("{ns}-reclaim"), &apply, &Patch::Apply(&recorded))
        .await
        .expect("the operator records an interruption's NodeDrain");
    let migrations: Api<JobMigration> = Api::namespaced(client.clone(), &ns);
    let recorded = json!({
        "apiVersion": crd::API_VERSION, "kind": "JobMigration",
        "metadata": {"name": "drain-3f9c1e2a"},
        "spec": {"bundle": "b", "replicaIndex": 0, "jobName": "encode", "strategy": "overlap"},
    });
    migrations
        .patch("drain-3f9c1e2a", &apply, &Patch::Apply(&recorded))
        .await
        .expect("the operator records a drain's JobMigration");
    // Events: created, then the same again patched into a series.
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "norsk-auto-manager".to_owned(),
            instance: Some("kinds-0".to_owned()),
        },
    );
    let regarding = ObjectReference {
        api_version: Some(crd::API_VERSION.to_owned()),
        kind: Some("JobMigration".to_owned()),
        name: Some("move".to_owned()),
        namespace: Some(ns.clone()),
        ..ObjectReference::default()
    };
    for _ in 0..2 {
        recorder
            .publish(
                &Event {
                    type_: EventType::Normal,
                    reason: "Checking".to_owned(),
                    note: Some("RBAC check".to_owned()),
                    action: "Check".to_owned(),
                    secondary: None,
                },
                &regarding,
            )
            .await
            .expect("publish an Event");
    }
    // Nothing outside: no Secrets (anywhere), no other Lease, no new pools.
    let secrets: Api<Secret> = Api::all(client.clone());
    forbidden(
        secrets.list(&ListParams::default()).await,
        "listing Secrets cluster-wide",
    );
    let own_secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    forbidden(own_secrets.get("manager-token").await, "reading a Secret");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    forbidden(leases.get("someone-else").await, "reading another Lease");
    // The Manager status: its own ConfigMap, created and patched by server-side apply, and no
    // other (not another fleet's, not one of the release's).
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let status = |name: &str| {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name}, "data": {"fleet": ns},
        })
    };
    let own = config_map_name(&ns);
    for _ in 0..2 {
        config_maps
            .patch(&own, &apply, &Patch::Apply(&status(&own)))
            .await
            .expect("the leader applies its Manager status");
    }
    let other = config_map_name("another-fleet");
    forbidden(
        config_maps.patch(&other, &apply, &Patch::Apply(&status(&other))).await,
        "writing another fleet's Manager status",
    );
    forbidden(config_maps.get(&own).await, "reading the Manager status back");
    forbidden(
        config_maps.list(&ListParams::default()).await,
        "listing the release namespace's ConfigMaps",
    );
    let elsewhere: Api<Lease> = Api::namespaced(client.clone(), "default");
    forbidden(
        elsewhere.create(&PostParams::default(), &Lease::default()).await,
        "creating a Lease outside the release namespace",
    );
    let pools: Api<PlacementPool> = Api::all(client);
    forbidden(
        pools
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": crd::API_VERSION, "kind": "PlacementPool",
                    "metadata": {"name": format!("{ns}-pool")}, "spec": {"tiers": []}
                }))
                .expect("a pool"),
            )
            .await,
        "creating a PlacementPool",
    );
}

/// `labels` holds every pair of `selector`.
fn selects(selector: &serde_json::Value, labels: &serde_json::Value) -> bool {
    selector
        .as_object()
        .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

#[tokio::test]
async fn metrics_service_monitor_and_budget_select_only_the_operator_pods() {
    let cp = control_plane::shared().await;
    let rendered = template(
        cp,
        "sel",
        "ops",
        &[
            "--set",
            "simulator.enabled=true",
            "--set",
            "metrics.serviceMonitor.enabled=true",
        ],
    )
    .expect("render");
    let documents: Vec<serde_json::Value> = yaml_serde::Deserializer::from_str(&rendered)
        .filter_map(|d| serde::Deserialize::deserialize(d).ok())
        .filter(|d: &serde_json::Value| d.is_object())
        .collect();
    let find = |kind: &str, name: &str| {
        documents
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
    };
    let operator_pods = &find("Deployment", "sel-norsk-auto-manager")["spec"]["template"]["metadata"]["labels"];
    let sim_pods = &find("Deployment", "sel-norsk-auto-manager-sim")["spec"]["template"]["metadata"]["labels"];
    let service = find("Service", "sel-norsk-auto-manager-metrics");
    let budget = find("PodDisruptionBudget", "sel-norsk-auto-manager");
    let monitor = find("ServiceMonitor", "sel-norsk-auto-manager");
    for (what, selector) in [
        ("metrics Service", &service["spec"]["selector"]),
        ("PodDisruptionBudget", &budget["spec"]["selector"]["matchLabels"]),
    ] {
        assert!(selects(selector, operator_pods), "{what} misses the operator pods");
        assert!(!selects(selector, sim_pods), "{what} selects the simulator pods");
    }
    let monitored = &monitor["spec"]["selector"]["matchLabels"];
    assert!(
        selects(monitored, &service["metadata"]["labels"]),
        "the ServiceMonitor misses the metrics Service"
    );
    let sim_service = find("Service", "sel-norsk-auto-manager-sim");
    assert!(
        !selects(monitored, &sim_service["metadata"]["labels"]),
        "the ServiceMonitor scrapes the simulator"
    );
}

#[tokio::test]
async fn the_alerting_rules_and_the_dashboard_ship_as_their_files_only_when_asked_for() {
    let cp = control_plane::shared().await;
    let documents = |args: &[&str]| -> Vec<serde_json::Value> {
        let mut all = vec!["--set", URL];
        all.extend_from_slice(args);
        let rendered = template(cp, "mon", "ops", &all).unwrap_or_else(|e| panic!("render: {e}"));
        yaml_serde::Deserializer::from_str(&rendered)
            .filter_map(|d| serde::Deserialize::deserialize(d).ok())
            .filter(|d: &serde_json::Value| d.is_object())
            .collect()
    };
    let monitoring = |docs: &[serde_json::Value]| {
        docs.iter()
            .filter(|d| d["kind"] == "PrometheusRule" || d["metadata"]["name"] == "mon-norsk-auto-manager-dashboard")
            .count()
    };
    assert_eq!(monitoring(&documents(&[])), 0, "off by default");
    let docs = documents(&[
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.prometheusRule.labels.release=kube-prometheus-stack",
        "--set",
        "metrics.dashboard.enabled=true",
    ]);
    let rule = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    assert_eq!(rule["metadata"]["labels"]["release"], "kube-prometheus-stack");
    let file: serde_json::Value =
        yaml_serde::from_str(&std::fs::read_to_string(chart_dir().join("files/alerts.yaml")).unwrap()).unwrap();
    assert_eq!(
        rule["spec"], file,
        "the PrometheusRule carries files/alerts.yaml as it is"
    );
    let dashboard = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "mon-norsk-auto-manager-dashboard")
        .expect("the dashboard ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: serde_json::Value =
        serde_json::from_str(dashboard["data"]["norsk-auto-manager.json"].as_str().unwrap()).unwrap();
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(chart_dir().join("files/dashboard.json")).unwrap()).unwrap();
    assert_eq!(shipped, file);
}

/// The values table of the chart's README, generated from `values.yaml`: one
/// row per key, its default, and the comment lines above it (a comment above
/// a section names the section; its keys get rows of their own).
fn values_table(values: &str) -> String {
    let mut rows = vec!["| Key | Default | Description |".to_owned(), "|---|---|---|".to_owned()];
    // (indent, key, documented): a key under a documented section needs no comment of its own.
    let mut path: Vec<(usize, String, bool)> = Vec::new();
    let mut comment: Vec<String> = Vec::new();
    let lines: Vec<&str> = values.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(text) = trimmed.strip_prefix('#') {
            comment.push(text.trim().to_owned());
            continue;
        }
        if trimmed.is_empty() {
            // A blank line ends a comment that belongs to no key.
            comment.clear();
            continue;
        }
        let Some((key, value)) = trimmed.split_once(':') else {
            continue;
        };
        if key.starts_with("- ") || indent > 0 && path.is_empty() {
            continue;
        }
        while path.last().is_some_and(|(depth, _, _)| *depth >= indent) {
            path.pop();
        }
        let full: Vec<&str> = path.iter().map(|(_, k, _)| k.as_str()).chain([key]).collect();
        let full = full.join(".");
        let value = value.trim();
        let child_follows = value.is_empty()
            && lines[i + 1..]
                .iter()
                .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
                .is_some_and(|next| next.len() - next.trim_start().len() > indent);
        let description = comment.join(" ").replace('|', "\\|");
        comment.clear();
        let section_documented = path.iter().any(|(_, _, documented)| *documented);
        assert!(
            !description.is_empty() || section_documented,
            "values.yaml: `{full}` has no comment saying what it does"
        );
        if child_follows {
            path.push((indent, key.to_owned(), !description.is_empty()));
            if !description.is_empty() {
                rows.push(format!("| `{full}` | | {description} |"));
            }
        } else {
            let default = if value.is_empty() { "\"\"" } else { value };
            rows.push(format!(
                "| `{full}` | `{}` | {description} |",
                default.replace('|', "\\|")
            ));
        }
    }
    rows.join("\n") + "\n"
}

#[test]
fn the_chart_readme_lists_every_value_as_values_yaml_documents_it() {
    let values = std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap();
    let readme_path = chart_dir().join("README.md");
    let readme = std::fs::read_to_string(&readme_path).expect("the chart has a README (helm show readme)");
    let (start, end) = ("<!-- values:start -->\n", "<!-- values:end -->");
    let (before, rest) = readme.split_once(start).expect("the values markers");
    let (_, after) = rest.split_once(end).expect("the values end marker");
    let expected = format!("{before}{start}{}{end}{after}", values_table(&values));
    if readme != expected && std::env::var_os("UPDATE_CHART_README").is_some() {
        std::fs::write(&readme_path, &expected).unwrap();
        return;
    }
    assert!(
        readme == expected,
        "charts/norsk-auto-manager/README.md's values table is stale: run \
         UPDATE_CHART_README=1 cargo test --test kube the_chart_readme"
    );
    // Every top-level key of values.schema.json has a row.
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap()).unwrap();
    for key in schema["properties"].as_object().unwrap().keys() {
        assert!(
            readme.contains(&format!("| `{key}")),
            "values.schema.json's {key} has no row in the chart README"
        );
    }
}

/// crane's directory: `NORSK_CRANE_BIN`, else `e2e/registry/build.sh` (built from the Go
/// module proxy and cached on first use, like the control plane).
fn crane() -> PathBuf {
    if let Some(dir) = std::env::var_os("NORSK_CRANE_BIN") {
        return PathBuf::from(dir).join("crane");
    }
    let out = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/registry/build.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("bash runs");
    assert!(out.status.success(), "e2e/registry/build.sh failed (see above)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().expect("the bin directory").trim()).join("crane")
}

/// A loopback OCI registry (crane's, in memory) until dropped.
struct Registry(std::process::Child, u16);

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_chart_is_published_to_an_oci_registry_and_installs_from_it() {
    let cp = installed().await;
    let ns = cp.namespace("oci").await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let registry = Registry(
        Command::new(crane())
            .args(["registry", "serve", "--address", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("crane starts"),
        port,
    );
    let dir = tempfile::tempdir().unwrap();
    let mut package = cp.helm();
    package.args(["package"]).arg(chart_dir()).arg("-d").arg(dir.path());
    run(package, "").unwrap_or_else(|e| panic!("helm package failed:\n{e}"));
    let chart: yaml_serde::Value =
        yaml_serde::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap()).unwrap();
    let version = chart["version"].as_str().expect("a chart version").to_owned();
    let packaged = dir.path().join(format!("norsk-auto-manager-{version}.tgz"));
    let remote = format!("oci://127.0.0.1:{}/charts", registry.1);
    // The registry is another process: push until it listens (bounded).
    let mut pushed = Err(String::new());
    for _ in 0..50 {
        let mut push = cp.helm();
        push.arg("push").arg(&packaged).arg(&remote).arg("--plain-http");
        pushed = run(push, "");
        if pushed.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    pushed.unwrap_or_else(|e| panic!("helm push failed:\n{e}"));
    // What the registry holds is a Helm chart artifact under the chart's version.
    let mut manifest = Command::new(crane());
    manifest
        .args(["manifest", "--insecure"])
        .arg(format!("127.0.0.1:{}/charts/norsk-auto-manager:{version}", registry.1));
    let manifest: serde_json::Value =
        serde_json::from_str(&run(manifest, "").unwrap_or_else(|e| panic!("crane manifest failed:\n{e}"))).unwrap();
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.cncf.helm.config.v1+json"
    );
    let mut install = cp.helm();
    install
        .args(["install", "published"])
        .arg(format!("{remote}/norsk-auto-manager"))
        .args([
            "--version",
            &version,
            "--plain-http",
            "-n",
            &ns,
            "--set",
            URL,
            "--skip-crds",
        ]);
    let installed = run(install, "").unwrap_or_else(|e| panic!("helm install from the registry failed:\n{e}"));
    assert!(installed.contains("STATUS: deployed"), "{installed}");
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(cp.client(), &ns);
    let operator = deployments
        .get("published-norsk-auto-manager")
        .await
        .expect("the operator Deployment of the release installed from the registry");
    let labels = operator.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("helm.sh/chart").map(String::as_str),
        Some(format!("norsk-auto-manager-{version}").as_str())
    );
}

#[test]
fn the_values_schema_types_settings_exactly_as_the_operator_reads_them() {
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap()).unwrap();
    let expected = norsk_auto_manager::automanager::chart_settings_schema();
    assert!(
        schema["properties"]["settings"] == expected,
        "values.schema.json's settings drifted from AutoSettings; its entry should be:\n{}",
        serde_json::to_string_pretty(&expected).unwrap()
    );
}
