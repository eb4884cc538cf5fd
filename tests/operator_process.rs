//! The `norsk-auto-manager operator` process itself: settings validated at
//! start with every problem listed, and a real run against the control
//! plane and the simulator — ready on `/readyz`, a bundle placed, a clean
//! exit on SIGTERM.

#[path = "support/control_plane.rs"]
mod control_plane;
mod sim_support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use norsk_auto_manager::crd::{self, Bundle};
use norsk_auto_manager::model::{NodeInventory, tags};
use norsk_auto_manager::sim::{ClusterNode, SimConfig};
use sim_support::{Sim, TIME_SCALE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BINARY: &str = env!("CARGO_BIN_EXE_norsk-auto-manager");
const WAIT: Duration = Duration::from_secs(90);

#[test]
fn invalid_settings_are_all_listed_and_the_process_exits() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("operator.yaml");
    std::fs::write(
        &config,
        "settings:\n  rejectionBackoffMs: 0\nlease: {durationSeconds: 2, graceSeconds: 3}\n",
    )
    .unwrap();
    let out = Command::new(BINARY)
        .args(["operator", "--config"])
        .arg(&config)
        .args(["--manager-cert-file", "/nowhere/cert.pem"])
        .env_remove("POD_NAME")
        .env_remove("NORSK_MANAGER_URL")
        .output()
        .expect("the binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for expected in [
        "settings.url",
        "settings.rejectionBackoffMs",
        "--manager-cert-file /nowhere/cert.pem",
        "go together",
        "graceSeconds",
        "--identity",
    ] {
        assert!(stderr.contains(expected), "{expected:?} missing from:\n{stderr}");
    }
}

async fn http_status(port: u16, path: &str) -> Option<String> {
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: operator\r\nConnection: close\r\n\r\n");
    socket.write_all(request.as_bytes()).await.ok()?;
    let mut answer = String::new();
    socket.read_to_string(&mut answer).await.ok()?;
    answer.lines().next().map(str::to_owned)
}

#[tokio::test]
async fn the_operator_process_becomes_ready_places_a_bundle_and_stops_on_sigterm() {
    let cp = control_plane::shared().await;
    let crds: Api<CustomResourceDefinition> = Api::all(cp.client());
    for definition in crd::definitions() {
        let name = definition.metadata.name.clone().unwrap();
        crds.patch(
            &name,
            &PatchParams::apply("norsk-process-test").force(),
            &Patch::Apply(&definition),
        )
        .await
        .unwrap();
        tokio::time::timeout(
            WAIT,
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap()
        .unwrap();
    }
    let ns = cp.namespace("process").await;
    cp.kubectl_apply(
        &ns,
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: PlacementPool\nmetadata: {name: studio}\nspec:\n  tiers: [{name: cluster, kind: local-servers, scaleOut: fixed}]\n",
    )
    .expect("pool applies");
    let sim = Sim::start_with(SimConfig {
        seed: 9,
        time_scale: TIME_SCALE,
        cluster_nodes: vec![ClusterNode {
            id: format!("{ns}-a"),
            tags: BTreeMap::from([(tags::POOL.to_owned(), "studio".to_owned())]),
            inventory: NodeInventory::local_server("studio", "rack-1", "r640", 8.0),
        }],
        ..SimConfig::default()
    })
    .await;
    // A free port for the telemetry endpoint.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("operator.yaml");
    std::fs::write(
        &config,
        format!("settings:\n  tracePlacements: false\nmetricsAddr: 127.0.0.1:{port}\n"),
    )
    .unwrap();
    let mut child = Command::new(BINARY)
        .args(["operator", "--config"])
        .arg(&config)
        .args(["--manager-url", &sim.handle.url()])
        .args(["--identity", "process-0", "--lease-namespace", &ns])
        .args(["--bundle-namespace", &ns, "--fleet", &ns, "--log-format", "json"])
        .env("KUBECONFIG", cp.kubeconfig())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the operator starts");
    let ready = tokio::time::timeout(WAIT, async {
        loop {
            if http_status(port, "/readyz").await.is_some_and(|l| l.contains(" 200 ")) {
                return;
            }
            // The process starts on its own clock; poll its endpoint.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    if ready.is_err() {
        let _ = child.kill();
        panic!("the operator never became ready");
    }
    cp.kubectl_apply(
        &ns,
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {name: live}\nspec:\n  pool: studio\n  jobs: [{jobName: encode, requirements: {requiredCapacity: 2}}]\n",
    )
    .expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let placed = tokio::time::timeout(
        WAIT,
        await_condition(bundles, "live", |b: Option<&Bundle>| {
            b.and_then(|b| b.status.as_ref())
                .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        }),
    )
    .await;
    let metrics = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok();
    // SAFETY: the pid is our own child's, still running (not yet waited for).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().expect("the operator exits");
    let placed = placed
        .expect("the bundle is Ready in time")
        .expect("watch")
        .expect("bundle exists");
    assert_eq!(placed.status.and_then(|s| s.primary_node), Some(format!("{ns}-a")));
    assert!(metrics);
    assert!(status.success(), "the operator exited with {status}");
    sim.shutdown().await;
}
