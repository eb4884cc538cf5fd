//! The vendor's own client against the simulator serving the published API
//! only: `vendor-client/check.js` drives it with `@norskvideo/norsk-api`
//! 1.0.384 (the generated Node client Norsk publishes) and must create, find
//! and start a job and read the event stream without meeting a field or an
//! event that client does not know. The packages are installed with `npm ci`
//! from the pinned lockfile into a temporary directory under the target
//! directory. The test needs Node.js, npm and the npm registry; without them
//! it fails and says so.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use norsk_auto_manager::sim::SimConfig;

use crate::sim_support::{Sim, TIME_SCALE};

/// The script and its pinned dependencies.
const CLIENT_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/simulator/vendor-client");
const CLIENT_FILES: [&str; 3] = ["package.json", "package-lock.json", "check.js"];
/// `npm ci` downloads from the registry on a machine with an empty cache.
const INSTALL_LIMIT: Duration = Duration::from_secs(300);
const CHECK_LIMIT: Duration = Duration::from_secs(120);

/// Runs `program args` in `dir`, its output going to `<dir>/<log>`, and
/// panics with that output unless it exits 0 within `limit`.
async fn run(dir: &Path, program: &str, args: &[&str], log: &str, limit: Duration) {
    let log_path: PathBuf = dir.join(log);
    let output = File::create(&log_path).expect("log file");
    let mut child = Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(output.try_clone().expect("log file"))
        .stderr(output)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `{program}` ({e}): this test drives the simulator with the vendor's Node \
                 client and needs Node.js (20 or later) and npm on PATH"
            )
        });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`{program} {}` did not finish within {limit:?}:\n{}",
                args.join(" "),
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        status.success(),
        "`{program} {}` failed ({status}):\n{text}",
        args.join(" ")
    );
    println!("{program} {} ({:?}):\n{text}", args.join(" "), started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vendor_client_creates_finds_and_starts_a_job_on_the_published_simulator() {
    let work = tempfile::Builder::new()
        .prefix("vendor-client-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a work directory");
    for file in CLIENT_FILES {
        std::fs::copy(Path::new(CLIENT_DIR).join(file), work.path().join(file)).expect("copy the client");
    }
    run(
        work.path(),
        "npm",
        &["ci", "--ignore-scripts", "--no-audit", "--no-fund"],
        "npm-ci.log",
        INSTALL_LIMIT,
    )
    .await;

    let sim = Sim::start_with(SimConfig {
        seed: 7,
        time_scale: TIME_SCALE,
        published_api_only: true,
        ..SimConfig::default()
    })
    .await;
    let address = sim.handle.addr().to_string();
    run(work.path(), "node", &["check.js", &address], "check.log", CHECK_LIMIT).await;
    // What the client did is what the simulator holds.
    let snapshot = sim.snapshot().await;
    let running: Vec<_> = snapshot
        .nodes
        .iter()
        .flat_map(|node| {
            node.instances
                .iter()
                .map(move |i| (i.job_id.0.as_str(), node.id.0.as_str()))
        })
        .collect();
    assert_eq!(running, [("vendor-client-j1", "vendor-client-n1")]);
    sim.shutdown().await;
}
