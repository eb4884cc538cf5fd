//! `norsk-auto-manager standalone` end to end: the binary against the
//! simulator over loopback, bundles from a directory of resource documents,
//! notifications read back as JSON lines — a bundle placed and running, a
//! new file applied, a removed file deleted.

mod sim_support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use norsk_auto_manager::model::{NodeInventory, tags};
use norsk_auto_manager::sim::{ClusterNode, SimConfig};
use serde_json::Value;
use sim_support::Sim;

const WAIT: Duration = Duration::from_secs(60);

fn cluster_node(id: &str) -> ClusterNode {
    ClusterNode {
        id: id.to_owned(),
        tags: BTreeMap::from([(tags::POOL.to_owned(), "production".to_owned())]),
        inventory: NodeInventory::local_server("site", "rack-1", "", 8.0),
    }
}

const POOLS: &str = "apiVersion: automanager.norsk.video/v1alpha1
kind: PlacementPool
metadata: {name: production}
spec:
  tiers:
    - {name: cluster, kind: local-servers, scaleOut: fixed}
";

fn bundle_doc(name: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1
kind: Bundle
metadata: {{name: {name}, namespace: default}}
spec:
  pool: production
  jobs:
    - {{jobName: encode, requirements: {{requiredCapacity: 1}}}}
"
    )
}

/// The child process, killed when dropped.
struct Standalone {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Drop for Standalone {
    fn drop(&mut self) {
        // Best effort: the test is over either way.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Standalone {
    /// Reads JSON lines until one satisfies `found`.
    fn until(&self, what: &str, found: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {what} within {WAIT:?}"));
            let value: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            if found(&value) {
                return value;
            }
        }
    }
}

fn running_on_a_node(v: &Value, job: &str) -> bool {
    v["kind"] == "jobUpdated"
        && v["job"]["jobId"] == job
        && v["job"]["history"]
            .as_array()
            .and_then(|h| h.last())
            .is_some_and(|last| last["entry"] == "running")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_applies_and_follows_a_bundle_directory_printing_json_lines() {
    let sim = Sim::start_with(SimConfig {
        seed: 3,
        time_scale: 1000.0,
        cluster_nodes: vec![cluster_node("n1"), cluster_node("n2")],
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let bundles = dir.path().join("bundles");
    std::fs::create_dir(&bundles).unwrap();
    std::fs::write(dir.path().join("pools.yaml"), POOLS).unwrap();
    std::fs::write(bundles.join("ch1.yaml"), bundle_doc("ch1")).unwrap();
    std::fs::write(
        dir.path().join("standalone.yaml"),
        format!(
            "settings: {{url: \"{}\", tracePlacements: false}}\npools: pools.yaml\nbundles: bundles\n",
            sim.handle.url()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_norsk-auto-manager"))
        .args(["standalone", "--events", "json", "--poll-ms", "100", "--config"])
        .arg(dir.path().join("standalone.yaml"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("standalone starts");
    let stdout = child.stdout.take().expect("stdout piped");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let standalone = Standalone { child, lines };

    let decision = standalone.until("placementDecision for ch1", |v| {
        v["kind"] == "placementDecision" && v["jobId"] == "default/ch1/0/encode"
    });
    assert_eq!(decision["decision"]["decision"], "placed");
    standalone.until("ch1 running", |v| running_on_a_node(v, "default/ch1/0/encode"));

    std::fs::write(bundles.join("ch2.yaml"), bundle_doc("ch2")).unwrap();
    standalone.until("ch2 running", |v| running_on_a_node(v, "default/ch2/0/encode"));

    std::fs::remove_file(bundles.join("ch1.yaml")).unwrap();
    standalone.until("ch1 deleted", |v| {
        v["kind"] == "bundleDeleted" && v["bundleId"] == "default/ch1"
    });
    drop(standalone);
    sim.shutdown().await;
}
