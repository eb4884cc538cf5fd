//! The `sim` and `simctl` commands end to end, through the real binary.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

use std::time::Duration;

use norsk_auto_manager::manager::proto::manager::{
    self as pb, event_stream_event::Event, manager_client::ManagerClient,
};
use norsk_auto_manager::sim::SimSnapshot;

use crate::sim_support::Sim;

const BIN: &str = env!("CARGO_BIN_EXE_norsk-auto-manager");

async fn simctl(url: &str, args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command.args(["simctl", "--addr", url]).args(args);
    tokio::task::spawn_blocking(move || command.output().expect("simctl runs"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simctl_registers_a_cluster_node_and_prints_the_snapshot_with_its_fleet() {
    let sim = Sim::start().await;
    let url = sim.handle.url();
    let registered = simctl(
        &url,
        &[
            "register-node",
            "--id",
            "rack-1",
            "--pool",
            "studio",
            "--tier",
            "onprem",
            "--capacity",
            "32",
            "--cores",
            "16",
            "--region",
            "oslo",
            "--az",
            "oslo-1",
            "--capability",
            "norsk.io/nvidia-gpu",
            "--gpu",
            "t4:1",
            "--image",
            "registry.example/encoder:1",
        ],
    )
    .await;
    assert!(
        registered.status.success(),
        "{}",
        String::from_utf8_lossy(&registered.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&registered.stdout).unwrap();
    assert_eq!(answer["nodeId"], "rack-1");

    let out = simctl(&url, &["snapshot"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let snapshot: SimSnapshot = serde_json::from_slice(&out.stdout).expect("the snapshot is JSON");
    let node = &snapshot.fleet.nodes[0];
    assert_eq!(
        (node.id.as_str(), node.pool.as_deref(), node.tier.as_deref()),
        ("rack-1", Some("studio"), Some("onprem"))
    );
    let inventory = node.inventory.as_ref().unwrap();
    assert_eq!((inventory.total_capacity, inventory.total_cores), (32.0, 16));
    assert_eq!(inventory.gpus[0].model, "t4");
    assert_eq!(inventory.images, ["registry.example/encoder:1"]);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simctl_reports_an_unknown_node_on_stderr_and_exits_non_zero() {
    let sim = Sim::start().await;
    let out = simctl(&sim.handle.url(), &["kill-node", "ghost-7"]).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown node \"ghost-7\""), "{stderr}");
    assert!(out.stdout.is_empty());
    sim.shutdown().await;
}

/// Ends the `sim` process this test started.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sim_command_serves_its_cluster_nodes_at_the_address_it_prints_until_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.yaml");
    std::fs::write(
        &cluster,
        "- id: rack-9\n  tags: {pool: studio}\n  inventory: {kind: local-servers, totalCapacity: 8, totalCores: 8}\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args([
            "sim",
            "--listen",
            "127.0.0.1:0",
            "--seed",
            "3",
            "--time-scale",
            "1000",
            "--cluster",
        ])
        .arg(&cluster)
        .stdout(Stdio::piped())
        .spawn()
        .expect("sim starts");
    let stdout = child.stdout.take().unwrap();
    let sim = Running(child);
    let url = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("sim prints its address");
        line.trim().to_owned()
    })
    .await
    .unwrap();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let out = simctl(&url, &["snapshot"]).await;
    let snapshot: SimSnapshot = serde_json::from_slice(&out.stdout).expect("the snapshot is JSON");
    assert_eq!(snapshot.nodes[0].id.as_str(), "rack-9");

    // Ctrl-C ends open event streams and the process exits cleanly.
    let mut manager = ManagerClient::connect(url).await.unwrap();
    let mut events = manager
        .event_stream(pb::EventStreamRequest::default())
        .await
        .unwrap()
        .into_inner();
    while let Some(event) = events.message().await.unwrap() {
        if matches!(event.event, Some(Event::InitialDataComplete(_))) {
            break;
        }
    }
    let pid = i32::try_from(sim.0.id()).unwrap();
    // SAFETY: signals the child this test spawned, by its pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let ended = tokio::time::timeout(Duration::from_secs(10), events.message())
        .await
        .expect("the stream ends");
    assert!(!matches!(ended, Ok(Some(_))), "{ended:?}");
    let mut sim = sim;
    let status = tokio::task::spawn_blocking(move || sim.0.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
}
