//! `norsk-auto-manager standalone` end to end: the binary against the
//! simulator over loopback, following files of the operator's resource
//! documents, notifications read back as JSON lines, the status file and
//! stderr read as a user reads them — bundles placed and running, a drain
//! and a migration driven from files, a cordon from a `NorskNode`
//! document, a bad file beside a good one, a misspelt field refused, a
//! bundle refused until its pool arrives, a finished migration not redone
//! after a restart, the first notifications printed, a bad config refused.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use norsk_auto_manager::model::{NodeInventory, tags};
use norsk_auto_manager::sim::{ClusterNode, SimConfig};
use serde_json::Value;

use crate::sim_support::Sim;

const WAIT: Duration = Duration::from_secs(60);
/// How long a status check waits for a notification before reading the
/// file again (the file follows the core within a poll).
const RECHECK: Duration = Duration::from_millis(100);

fn cluster_node(id: &str) -> ClusterNode {
    ClusterNode {
        id: id.to_owned(),
        tags: BTreeMap::from([(tags::POOL.to_owned(), "production".to_owned())]),
        inventory: NodeInventory::local_server("site", "rack-1", "", 8.0),
    }
}

async fn sim_with(nodes: &[&str]) -> Sim {
    Sim::start_with(SimConfig {
        seed: 3,
        time_scale: 1000.0,
        cluster_nodes: nodes.iter().map(|id| cluster_node(id)).collect(),
        ..SimConfig::default()
    })
    .await
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

/// A bundle whose job should be dropped on failure, the field spelt
/// `failure` (`onRuntimeFaliure` when `failure` is `Faliure`): line 9,
/// column 9 holds the key.
fn drop_bundle_doc(name: &str, failure: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1
kind: Bundle
metadata: {{name: {name}}}
spec:
  pool: production
  jobs:
    - jobName: encode
      requirements:
        onRuntime{failure}: drop
"
    )
}

/// The child process, killed when dropped.
struct Standalone {
    child: Child,
    lines: mpsc::Receiver<String>,
    errors: mpsc::Receiver<String>,
    /// Every JSON line read so far.
    seen: RefCell<Vec<Value>>,
    /// Every stderr line read so far.
    stderr: RefCell<Vec<String>>,
    status_file: PathBuf,
}

impl Drop for Standalone {
    fn drop(&mut self) {
        // Best effort: the test is over either way.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads `reader` line by line into a channel, on a thread of its own.
fn forward(reader: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// A directory with `standalone.yaml` naming the simulator, `config`
/// lines added (what to follow), and a `resources` directory.
fn workspace(sim: &Sim, config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("resources")).unwrap();
    std::fs::write(
        dir.path().join("standalone.yaml"),
        format!(
            "settings: {{url: \"{}\", tracePlacements: false}}\n{config}",
            sim.handle.url()
        ),
    )
    .unwrap();
    dir
}

impl Standalone {
    fn start(dir: &Path) -> Standalone {
        let status_file = dir.join("status.json");
        let mut child = Command::new(env!("CARGO_BIN_EXE_norsk-auto-manager"))
            .args(["standalone", "--events", "json", "--poll-ms", "100", "--config"])
            .arg(dir.join("standalone.yaml"))
            .arg("--status-file")
            .arg(&status_file)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("standalone starts");
        let lines = forward(child.stdout.take().expect("stdout piped"));
        let errors = forward(child.stderr.take().expect("stderr piped"));
        Standalone {
            child,
            lines,
            errors,
            seen: RefCell::new(Vec::new()),
            stderr: RefCell::new(Vec::new()),
            status_file,
        }
    }

    /// Takes in what stderr printed so far.
    fn drain_stderr(&self) {
        while let Ok(line) = self.errors.try_recv() {
            self.stderr.borrow_mut().push(line);
        }
    }

    /// Waits at most `wait` for the next JSON line; none when it times out.
    fn next_line(&self, wait: Duration) -> Option<Value> {
        let line = self.lines.recv_timeout(wait).ok()?;
        let value: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        self.seen.borrow_mut().push(value.clone());
        Some(value)
    }

    /// The first JSON line from the `from`th on that satisfies `found`,
    /// reading more as needed.
    fn until_from(&self, from: usize, what: &str, found: impl Fn(&Value) -> bool) -> Value {
        if let Some(hit) = self.seen.borrow().iter().skip(from).find(|v| found(v)) {
            return hit.clone();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(value) = self.next_line(left) else {
                self.drain_stderr();
                let seen = self.seen.borrow();
                let last: Vec<&Value> = seen.iter().rev().take(10).collect();
                panic!(
                    "no {what} within {WAIT:?}; the last lines, newest first: {last:#?}\nstderr: {:#?}",
                    self.stderr.borrow()
                );
            };
            if found(&value) {
                return value;
            }
        }
    }

    /// The first JSON line ever printed that satisfies `found`.
    fn until(&self, what: &str, found: impl Fn(&Value) -> bool) -> Value {
        self.until_from(0, what, found)
    }

    /// How many JSON lines were read so far (to wait for later ones).
    fn mark(&self) -> usize {
        self.seen.borrow().len()
    }

    fn status(&self) -> Option<Value> {
        let text = std::fs::read_to_string(&self.status_file).ok()?;
        Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("the status file is not JSON ({e}): {text}")))
    }

    /// The status file once it satisfies `found`.
    fn status_until(&self, what: &str, found: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let status = self.status();
            if let Some(status) = status.as_ref().filter(|s| found(s)) {
                return status.clone();
            }
            if Instant::now() >= deadline {
                self.drain_stderr();
                let seen = self.seen.borrow();
                let last: Vec<String> = seen.iter().rev().take(30).rev().map(ToString::to_string).collect();
                panic!(
                    "no {what} in the status file within {WAIT:?}: {status:#?}\nthe last notifications:\n{}\nstderr:\n{}",
                    last.join("\n"),
                    self.stderr.borrow().join("\n")
                );
            }
            self.next_line(RECHECK);
        }
    }

    /// The first stderr line that satisfies `found`.
    fn stderr_until(&self, what: &str, found: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            self.drain_stderr();
            if let Some(hit) = self.stderr.borrow().iter().find(|l| found(l)) {
                return hit.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .errors
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {what} on stderr within {WAIT:?}: {:#?}", self.stderr.borrow()));
            self.stderr.borrow_mut().push(line);
        }
    }

    /// The stderr lines so far that satisfy `found`.
    fn stderr_lines(&self, found: impl Fn(&str) -> bool) -> Vec<String> {
        self.drain_stderr();
        self.stderr.borrow().iter().filter(|l| found(l)).cloned().collect()
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

/// Where the status file says `job` of bundle `bundle` (`default/ch1`) runs.
fn node_of(status: &Value, bundle: &str) -> Option<String> {
    let job = &status["bundles"][bundle]["replicas"][0]["jobs"][0];
    (job["state"] == "running").then(|| job["node"].as_str().map(str::to_owned))?
}

/// Where Manager (the simulator) runs `job`: the node of its last history
/// entry, when that is `running`.
async fn running_node(sim: &Sim, job: &str) -> Option<String> {
    let snapshot = sim.snapshot().await;
    let json = serde_json::to_value(&snapshot).unwrap();
    let job = json["jobs"].as_array()?.iter().find(|j| j["jobId"] == job)?;
    let last = job["history"].as_array()?.last()?;
    (last["entry"] == "running").then(|| last["node_id"].as_str().map(str::to_owned))?
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_applies_and_follows_a_bundle_directory_printing_json_lines() {
    let sim = sim_with(&["n1", "n2"]).await;
    // The config shape before every kind was followed: a pools file and a
    // `bundles` directory.
    let dir = workspace(&sim, "pools: pools.yaml\nbundles: resources\n");
    let bundles = dir.path().join("resources");
    std::fs::write(dir.path().join("pools.yaml"), POOLS).unwrap();
    std::fs::write(bundles.join("ch1.yaml"), bundle_doc("ch1")).unwrap();
    let standalone = Standalone::start(dir.path());

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_notifications_are_printed_connecting_ready_and_the_first_spare_underflow() {
    let sim = sim_with(&["n1"]).await;
    let dir = workspace(&sim, "resources: resources\n");
    std::fs::write(dir.path().join("resources/pools.yaml"), POOLS).unwrap();
    // A cluster-only pool cannot provision spares: the reconciler reports
    // the shortfall after hydration.
    std::fs::write(
        dir.path().join("resources/spares.yaml"),
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: HotSparePolicy\nmetadata: {name: production}\nspec:\n  pool: production\n  targetCount: 1\n  spec: {instanceType: r640}\n",
    )
    .unwrap();
    let standalone = Standalone::start(dir.path());

    let first = standalone.next_line(WAIT).expect("a first line");
    assert_eq!(
        first,
        serde_json::json!({"kind": "connectionStateChange", "state": "connecting"})
    );
    standalone.until("ready", |v| {
        v["kind"] == "connectionStateChange" && v["state"] == "ready"
    });
    let underflow = standalone.until("spareUnderflow", |v| v["kind"] == "spareUnderflow");
    assert_eq!(underflow["pool"], "production");
    assert_eq!(
        (underflow["effective"].as_u64(), underflow["target"].as_u64()),
        (Some(0), Some(1))
    );
    drop(standalone);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_drives_a_migration_and_a_drain_from_files() {
    let sim = sim_with(&["n1", "n2", "n3"]).await;
    let dir = workspace(&sim, "resources: resources\n");
    let resources = dir.path().join("resources");
    std::fs::write(resources.join("pools.yaml"), POOLS).unwrap();
    std::fs::write(resources.join("ch1.yaml"), bundle_doc("ch1")).unwrap();
    let standalone = Standalone::start(dir.path());
    let status = standalone.status_until("ch1 running", |s| node_of(s, "default/ch1").is_some());
    let source = node_of(&status, "default/ch1").unwrap();

    // A JobMigration document moves the job.
    std::fs::write(
        resources.join("move-ch1.yaml"),
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: JobMigration\nmetadata: {name: move-ch1}\nspec: {bundle: ch1, jobName: encode}\n",
    )
    .unwrap();
    let status = standalone.status_until("the migration done", |s| {
        s["jobMigrations"]["default/move-ch1"]["phase"] == "done" && node_of(s, "default/ch1").is_some()
    });
    let migration = &status["jobMigrations"]["default/move-ch1"];
    assert_eq!(migration["sourceNodeId"].as_str(), Some(source.as_str()));
    let target = migration["targetNodeId"].as_str().unwrap().to_owned();
    assert_ne!(target, source);
    assert_eq!(condition(migration, "Ready")["status"], "True");
    assert_eq!(node_of(&status, "default/ch1").as_deref(), Some(target.as_str()));
    assert_eq!(
        running_node(&sim, "default/ch1/0/encode").await.as_deref(),
        Some(target.as_str())
    );

    // A NodeDrain document empties the job's node and keeps it, cordoned,
    // for maintenance (`after: keep`; without it the node is terminated).
    std::fs::write(
        resources.join("drain.yaml"),
        format!("apiVersion: automanager.norsk.video/v1alpha1\nkind: NodeDrain\nmetadata: {{name: drain-{target}}}\nspec: {{nodeId: {target}, after: keep}}\n"),
    )
    .unwrap();
    let drain_name = format!("drain-{target}");
    let status = standalone.status_until("the drain done", |s| s["nodeDrains"][&drain_name]["phase"] == "done");
    let drain = &status["nodeDrains"][&drain_name];
    assert_eq!(drain["after"], "keep");
    assert_eq!(drain["jobs"][0]["jobId"], "default/ch1/0/encode");
    assert_eq!(drain["jobs"][0]["status"], "migrated");
    assert_eq!(condition(drain, "Ready")["status"], "True");
    let status = standalone.status_until("ch1 off the drained node", |s| {
        node_of(s, "default/ch1").is_some_and(|n| n != target)
    });
    assert_eq!(status["nodes"][&target]["cordoned"], true);
    let now_on = running_node(&sim, "default/ch1/0/encode").await.expect("ch1 runs");
    assert_ne!(now_on, target);
    // The drain was reported as it went.
    standalone.until("drainProgress done", |v| {
        v["kind"] == "drainProgress" && v["phase"] == "done"
    });
    drop(standalone);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_norsk_node_document_cordons_its_node_and_removing_it_uncordons() {
    let sim = sim_with(&["n1", "n2"]).await;
    let dir = workspace(&sim, "resources: resources\n");
    let resources = dir.path().join("resources");
    std::fs::write(resources.join("pools.yaml"), POOLS).unwrap();
    std::fs::write(
        resources.join("n1.yaml"),
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: NorskNode\nmetadata: {name: n1}\nspec: {nodeId: n1, cordoned: true}\n",
    )
    .unwrap();
    let standalone = Standalone::start(dir.path());
    let status = standalone.status_until("n1 cordoned", |s| s["nodes"]["n1"]["cordoned"] == true);
    let cordoned = condition(&status["nodes"]["n1"], "Cordoned");
    assert_eq!(
        (&cordoned["status"], &cordoned["reason"]),
        (&"True".into(), &"Spec".into())
    );
    assert_eq!(status["nodes"]["n2"]["cordoned"], false);

    // Both nodes are empty: only the cordon keeps the bundle off n1 (the
    // id breaks a tie).
    std::fs::write(resources.join("ch1.yaml"), bundle_doc("ch1")).unwrap();
    let decision = standalone.until("ch1 placed", |v| {
        v["kind"] == "placementDecision" && v["jobId"] == "default/ch1/0/encode"
    });
    assert_eq!(decision["decision"]["nodeId"], "n2");

    std::fs::remove_file(resources.join("n1.yaml")).unwrap();
    standalone.status_until("n1 uncordoned", |s| s["nodes"]["n1"]["cordoned"] == false);
    drop(standalone);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_beside_a_good_one_is_reported_once_and_the_good_bundle_runs() {
    let sim = sim_with(&["n1", "n2"]).await;
    let dir = workspace(&sim, "resources: resources\n");
    let resources = dir.path().join("resources");
    std::fs::write(resources.join("pools.yaml"), POOLS).unwrap();
    std::fs::write(resources.join("ch1.yaml"), bundle_doc("ch1")).unwrap();
    std::fs::write(resources.join("ch2.yaml"), drop_bundle_doc("ch2", "Faliure")).unwrap();
    let standalone = Standalone::start(dir.path());

    standalone.until("ch1 running", |v| running_on_a_node(v, "default/ch1/0/encode"));
    let error = standalone.stderr_until("the error of ch2.yaml", |l| l.contains("ch2.yaml"));
    assert!(
        error.contains(
            "ch2.yaml: document 1 (Bundle default/ch2): spec.jobs[0].requirements.onRuntimeFaliure: unknown field"
        ),
        "{error}"
    );
    assert!(error.contains("at line 9 column 9"), "{error}");
    let status = standalone.status_until("ch2.yaml's error", |s| {
        s["files"].as_array().is_some_and(|f| {
            f.iter()
                .any(|f| f["file"].as_str().is_some_and(|p| p.ends_with("ch2.yaml")))
        })
    });
    let file = status["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["file"].as_str().unwrap().ends_with("ch2.yaml"))
        .unwrap();
    let problem = &file["error"]["documents"][0]["problems"][0];
    assert_eq!(problem["path"], "spec.jobs[0].requirements.onRuntimeFaliure");
    assert_eq!(
        (problem["line"].as_u64(), problem["column"].as_u64()),
        (Some(9), Some(9))
    );
    assert!(status["bundles"].get("default/ch2").is_none(), "{status:#}");

    // Many polls later (a third bundle placed and running), the error was
    // printed once.
    std::fs::write(resources.join("ch3.yaml"), bundle_doc("ch3")).unwrap();
    standalone.until("ch3 running", |v| running_on_a_node(v, "default/ch3/0/encode"));
    assert_eq!(standalone.stderr_lines(|l| l.contains("ch2.yaml")).len(), 1);

    // Fixing the file applies it.
    std::fs::write(resources.join("ch2.yaml"), drop_bundle_doc("ch2", "Failure")).unwrap();
    standalone.until("ch2 running", |v| running_on_a_node(v, "default/ch2/0/encode"));

    // A good file that turns bad keeps its last good content in force: ch1
    // is not deleted.
    let mark = standalone.mark();
    std::fs::write(resources.join("ch1.yaml"), bundle_doc("ch1").replace("pool:", "pol:")).unwrap();
    let error = standalone.stderr_until("the error of ch1.yaml", |l| l.contains("ch1.yaml"));
    assert!(error.contains("spec: missing field `pool`"), "{error}");
    assert!(error.contains("its last good content stays in force"), "{error}");
    std::fs::write(resources.join("ch4.yaml"), bundle_doc("ch4")).unwrap();
    standalone.until_from(mark, "ch4 running", |v| running_on_a_node(v, "default/ch4/0/encode"));
    assert!(
        !standalone.seen.borrow()[mark..]
            .iter()
            .any(|v| v["kind"] == "bundleDeleted" && v["bundleId"] == "default/ch1"),
        "ch1 was deleted"
    );
    let status = standalone.status_until("ch1 still running", |s| node_of(s, "default/ch1").is_some());
    assert_eq!(condition(&status["bundles"]["default/ch1"], "Ready")["status"], "True");
    drop(standalone);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_field_is_refused_and_the_job_is_not_given_the_default() {
    let sim = sim_with(&["n1"]).await;
    let dir = workspace(&sim, "resources: resources\n");
    let resources = dir.path().join("resources");
    std::fs::write(resources.join("pools.yaml"), POOLS).unwrap();
    std::fs::write(resources.join("ch2.yaml"), drop_bundle_doc("ch2", "Faliure")).unwrap();
    std::fs::write(resources.join("ch1.yaml"), bundle_doc("ch1")).unwrap();
    let standalone = Standalone::start(dir.path());
    standalone.until("ch1 running", |v| running_on_a_node(v, "default/ch1/0/encode"));
    let snapshot = sim.snapshot().await;
    assert!(
        !snapshot.bundles.iter().any(|b| b.bundle_id.as_str() == "default/ch2"),
        "the misspelt bundle reached Manager"
    );

    std::fs::write(resources.join("ch2.yaml"), drop_bundle_doc("ch2", "Failure")).unwrap();
    let updated = standalone.until("ch2 on Manager", |v| {
        v["kind"] == "bundleUpdated" && v["bundle"]["bundleId"] == "default/ch2"
    });
    assert_eq!(updated["bundle"]["jobs"][0]["requirements"]["onRuntimeFailure"], "drop");
    drop(standalone);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_naming_an_unknown_pool_is_refused_once_and_runs_when_the_pool_arrives() {
    let sim = sim_with(&["n1"]).await;
    let dir = workspace(&sim, "resources: resources\n");
    let resources = dir.path().join("resources");
    std::fs::write(resources.join("ch1.yaml"), bundle_doc("ch1")).unwrap();
    let standalone = Standalone::start(dir.path());
    let error = standalone.stderr_until("ch1 refused", |l| l.contains("ch1.yaml"));
    assert!(
        error.contains("ch1.yaml: document 1 (Bundle default/ch1): refused (InvalidBundle): spec.pool:"),
        "{error}"
    );
    assert!(error.contains("at line 5 column 3"), "{error}");
    let status = standalone.status_until("ch1 stalled", |s| {
        condition(&s["bundles"]["default/ch1"], "Stalled")["status"] == "True"
    });
    assert_eq!(
        condition(&status["bundles"]["default/ch1"], "Ready")["reason"],
        "InvalidBundle"
    );

    std::fs::write(resources.join("pools.yaml"), POOLS).unwrap();
    standalone.until("ch1 running", |v| running_on_a_node(v, "default/ch1/0/encode"));
    assert_eq!(
        standalone.stderr_lines(|l| l.contains("refused (InvalidBundle)")).len(),
        1
    );
    drop(standalone);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_does_not_start_a_finished_migration_again() {
    let sim = sim_with(&["n1", "n2"]).await;
    let dir = workspace(&sim, "resources: resources\n");
    let resources = dir.path().join("resources");
    std::fs::write(resources.join("pools.yaml"), POOLS).unwrap();
    std::fs::write(resources.join("ch1.yaml"), bundle_doc("ch1")).unwrap();
    std::fs::write(
        resources.join("move-ch1.yaml"),
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: JobMigration\nmetadata: {name: move-ch1}\nspec: {bundle: ch1, jobName: encode}\n",
    )
    .unwrap();
    let first = Standalone::start(dir.path());
    first.until("ch1 running", |v| running_on_a_node(v, "default/ch1/0/encode"));
    // Refused while the job was not yet running, the migration waits for a
    // change of its document.
    std::fs::write(
        resources.join("move-ch1.yaml"),
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: JobMigration\nmetadata: {name: move-ch1}\nspec: {bundle: ch1, jobName: encode, overrideReservation: true}\n",
    )
    .unwrap();
    let status = first.status_until("the migration done", |s| {
        s["jobMigrations"]["default/move-ch1"]["phase"] == "done"
    });
    let target = status["jobMigrations"]["default/move-ch1"]["targetNodeId"].clone();
    first.status_until("ch1 on its target", |s| {
        node_of(s, "default/ch1").as_deref() == target.as_str()
    });
    drop(first);

    let second = Standalone::start(dir.path());
    second.until("ready", |v| {
        v["kind"] == "connectionStateChange" && v["state"] == "ready"
    });
    std::fs::write(resources.join("ch2.yaml"), bundle_doc("ch2")).unwrap();
    second.until("ch2 running", |v| running_on_a_node(v, "default/ch2/0/encode"));
    assert!(
        !second.seen.borrow().iter().any(|v| v["kind"] == "migrationPhase"),
        "the finished migration was started again"
    );
    let status = second.status_until("ch2 in the status", |s| node_of(s, "default/ch2").is_some());
    assert_eq!(status["jobMigrations"]["default/move-ch1"]["phase"], "done");
    assert_eq!(node_of(&status, "default/ch1").as_deref(), target.as_str());
    drop(second);
    sim.shutdown().await;
}

/// On a published Manager (no bundle store, no inventories) `standalone`
/// expands each Bundle document into tagged Manager jobs itself, places on
/// the servers its pool declares, and a new process rebuilds from
/// Manager's jobs and the directory: the running job is adopted, not
/// started again, and removing the document deletes the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_published_manager_standalone_expands_bundles_and_a_restart_adopts_them() {
    let sim = Sim::start_with(SimConfig {
        seed: 3,
        time_scale: 1000.0,
        published_api_only: true,
        cluster_nodes: ["n1", "n2"].iter().map(|id| cluster_node(id)).collect(),
        ..SimConfig::default()
    })
    .await;
    let dir = workspace(&sim, "resources: resources\n");
    let resources = dir.path().join("resources");
    // A published Manager says nothing of a server's size: the pool's
    // fixed tier declares it.
    std::fs::write(
        resources.join("pools.yaml"),
        POOLS.replace(
            "scaleOut: fixed}",
            "scaleOut: fixed, candidateInstanceTypes: [{instanceType: server, totalCapacity: 8, totalCores: 8}]}",
        ),
    )
    .unwrap();
    std::fs::write(resources.join("ch1.yaml"), bundle_doc("ch1")).unwrap();
    let first = Standalone::start(dir.path());
    first.until("ch1 running", |v| running_on_a_node(v, "default/ch1/0/encode"));
    let snapshot = sim.snapshot().await;
    assert!(snapshot.bundles.is_empty(), "a published Manager stores no bundle");
    let job = snapshot
        .jobs
        .iter()
        .find(|j| j.job_id.0 == "default/ch1/0/encode")
        .expect("the bundle's job is a Manager job");
    assert_eq!(
        job.tags.get("automanager.norsk.video/bundle").map(String::as_str),
        Some("default/ch1"),
        "tagged with its bundle: {:?}",
        job.tags
    );
    let node = running_node(&sim, "default/ch1/0/encode").await.expect("runs");
    // A start again would add to the job's history.
    let history = |snapshot: &norsk_auto_manager::sim::SimSnapshot| {
        let json = serde_json::to_value(snapshot).unwrap();
        json["jobs"]
            .as_array()
            .and_then(|jobs| jobs.iter().find(|j| j["jobId"] == "default/ch1/0/encode"))
            .and_then(|j| j["history"].as_array().cloned())
            .unwrap_or_default()
    };
    let before = history(&sim.snapshot().await);
    drop(first);

    let second = Standalone::start(dir.path());
    second.until("ch1 running again under the new process", |v| {
        running_on_a_node(v, "default/ch1/0/encode")
    });
    assert_eq!(
        running_node(&sim, "default/ch1/0/encode").await.as_deref(),
        Some(node.as_str())
    );
    assert_eq!(history(&sim.snapshot().await), before, "nothing was started again");
    drop(second);

    // The document removed while no standalone ran: the next one finds
    // Manager running a job of a bundle nobody wants, and deletes it.
    std::fs::remove_file(resources.join("ch1.yaml")).unwrap();
    let third = Standalone::start(dir.path());
    let gone = async {
        while sim
            .snapshot()
            .await
            .jobs
            .iter()
            .any(|j| j.job_id.0 == "default/ch1/0/encode")
        {
            tokio::time::sleep(RECHECK).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), gone)
        .await
        .expect("the Manager job of the removed document is deleted");
    drop(third);
    sim.shutdown().await;
}

#[test]
fn a_config_with_an_unknown_key_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("standalone.yaml"),
        "settings: {url: \"http://127.0.0.1:1\"}\nresorces: resources\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_norsk-auto-manager"))
        .args(["standalone", "--config"])
        .arg(dir.path().join("standalone.yaml"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown field `resorces`"), "{stderr}");
    assert!(stderr.contains("at line 2 column 1"), "{stderr}");
}

/// A bundle with an auto `encode` and a manual `record`, `record` started
/// on the replicas listed (none: the field left out).
fn manual_bundle_doc(started: &[u32]) -> String {
    let started = if started.is_empty() {
        String::new()
    } else {
        format!(", startedReplicas: {started:?}")
    };
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1
kind: Bundle
metadata: {{name: show, namespace: default}}
spec:
  pool: production
  jobs:
    - {{jobName: encode, requirements: {{requiredCapacity: 1}}}}
    - {{jobName: record, startMode: manual, requirements: {{requiredCapacity: 1}}{started}}}
"
    )
}

/// The state the status file gives job `job` of `default/show`'s primary.
fn show_job_state(status: &Value, job: &str) -> Option<String> {
    status["bundles"]["default/show"]["replicas"][0]["jobs"]
        .as_array()?
        .iter()
        .find(|j| j["jobName"] == job)
        .and_then(|j| j["state"].as_str().map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_job_is_started_and_stopped_by_editing_its_started_replicas_in_the_file() {
    let sim = sim_with(&["n1", "n2"]).await;
    let dir = workspace(&sim, "resources: resources\n");
    let resources = dir.path().join("resources");
    std::fs::write(resources.join("pools.yaml"), POOLS).unwrap();
    std::fs::write(resources.join("show.yaml"), manual_bundle_doc(&[])).unwrap();
    let standalone = Standalone::start(dir.path());
    let status = standalone.status_until("encode running, record dormant", |s| {
        show_job_state(s, "encode").as_deref() == Some("running")
            && show_job_state(s, "record").as_deref() == Some("dormant")
    });
    assert!(
        running_node(&sim, "default/show/0/record").await.is_none(),
        "{status:#}"
    );

    std::fs::write(resources.join("show.yaml"), manual_bundle_doc(&[0])).unwrap();
    standalone.until("record running", |v| running_on_a_node(v, "default/show/0/record"));
    standalone.status_until("record running in the status", |s| {
        show_job_state(s, "record").as_deref() == Some("running")
    });
    let encode_on = running_node(&sim, "default/show/0/encode").await.expect("encode runs");

    std::fs::write(resources.join("show.yaml"), manual_bundle_doc(&[])).unwrap();
    standalone.status_until("record dormant again", |s| {
        show_job_state(s, "record").as_deref() == Some("dormant")
    });
    // Its instance went with it; the encoder was not touched (no revision).
    let deadline = Instant::now() + WAIT;
    while running_node(&sim, "default/show/0/record").await.is_some() {
        assert!(Instant::now() < deadline, "record's instance still runs");
        standalone.next_line(RECHECK);
    }
    assert_eq!(running_node(&sim, "default/show/0/encode").await, Some(encode_on));
    let bundle = sim
        .snapshot()
        .await
        .bundles
        .into_iter()
        .find(|b| b.bundle_id.0 == "default/show")
        .unwrap();
    assert_eq!(
        bundle.generation, 1,
        "starting and stopping a manual job is not a revision"
    );
    drop(standalone);
    sim.shutdown().await;
}

fn sized_bundle_doc(name: &str, capacity: f64) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1
kind: Bundle
metadata: {{name: {name}, namespace: default}}
spec:
  pool: production
  jobs:
    - {{jobName: encode, requirements: {{requiredCapacity: {capacity}}}}}
"
    )
}

/// The status file's headroom verdict on the loss of node `node`: `None`
/// while absorbed (or not computed), else why.
fn not_absorbed<'s>(status: &'s Value, node: &str) -> Option<&'s Value> {
    status["headroom"]["notAbsorbed"]
        .as_array()?
        .iter()
        .find(|d| d["kind"] == "node" && d["name"] == node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_file_reports_headroom_for_the_fleet_each_pool_and_each_bundle() {
    let sim = sim_with(&["n1", "n2"]).await;
    let dir = workspace(&sim, "resources: resources\n");
    std::fs::write(
        dir.path().join("standalone.yaml"),
        format!(
            "settings: {{url: \"{}\", tracePlacements: false, experimental: {{headroom: true}}}}\nresources: resources\n",
            sim.handle.url()
        ),
    )
    .unwrap();
    let resources = dir.path().join("resources");
    std::fs::write(resources.join("pools.yaml"), POOLS).unwrap();
    std::fs::write(resources.join("small.yaml"), sized_bundle_doc("small", 1.0)).unwrap();
    let standalone = Standalone::start(dir.path());

    // One small job on two 8-vCPU nodes: either loss is absorbed.
    let status = standalone.status_until("headroom: every node loss absorbed", |s| {
        s["headroom"]["fleet"]
            .as_array()
            .and_then(|k| k.iter().find(|k| k["kind"] == "node"))
            .is_some_and(|k| k["survives"] == true && k["domains"] == 2)
    });
    let pool = &status["placementPools"]["production"]["headroom"];
    let node_kind = pool
        .as_array()
        .and_then(|k| k.iter().find(|k| k["kind"] == "node"))
        .unwrap_or_else(|| panic!("the pool's status has node headroom: {pool}"));
    assert_eq!(
        (node_kind["survives"].clone(), node_kind["absorbed"].clone()),
        (Value::Bool(true), 2.into())
    );
    let status = standalone.status_until("small is resilient", |s| {
        condition(&s["bundles"]["default/small"], "Resilient")["status"] == "True"
    });
    assert_eq!(
        condition(&status["bundles"]["default/small"], "Resilient")["reason"],
        "LossAbsorbed"
    );

    // Two 6-vCPU jobs, one per node: neither node's loss can be absorbed.
    std::fs::write(resources.join("big1.yaml"), sized_bundle_doc("big1", 6.0)).unwrap();
    std::fs::write(resources.join("big2.yaml"), sized_bundle_doc("big2", 6.0)).unwrap();
    let status = standalone.status_until("headroom: a node loss not absorbed", |s| {
        let big1 = node_of(s, "default/big1");
        big1.is_some_and(|node| not_absorbed(s, &node).is_some())
            && condition(&s["bundles"]["default/big1"], "Resilient")["status"] == "False"
    });
    let node = node_of(&status, "default/big1").expect("big1 is placed");
    let why = not_absorbed(&status, &node).expect("its loss is not absorbed")["why"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(why.contains("default/big1"), "{why}");
    let resilient = condition(&status["bundles"]["default/big1"], "Resilient");
    assert_eq!(resilient["reason"], "LossNotAbsorbed");
    assert!(
        resilient["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("node {node}"))),
        "{resilient}"
    );
    let pool_nodes = status["placementPools"]["production"]["headroom"]
        .as_array()
        .and_then(|k| k.iter().find(|k| k["kind"] == "node").cloned())
        .expect("node headroom");
    assert_eq!(pool_nodes["survives"], false, "{pool_nodes}");
    assert!(pool_nodes["worst"]["name"].is_string(), "{pool_nodes}");
    drop(standalone);
    sim.shutdown().await;
}
