//! The `norsk-auto-manager operator` process itself: settings validated at
//! start with every problem listed, and a real run against the control
//! plane and the simulator — ready on `/readyz`, a bundle placed, a clean
//! exit on SIGTERM — and two processes handing over: the follower is ready
//! only with Manager's snapshot in its standby core, and takes over without
//! creating anything twice or losing a live spare. And what a monitoring
//! stack sees of it: `/metrics` passes `promtool check metrics`, the chart's
//! alerting rules pass `promtool check rules` and their unit tests, and a
//! real Prometheus scraping the running operator evaluates every alert and
//! dashboard expression without error (every panel with data).

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::await_condition;
use norsk_auto_manager::crd::{Bundle, NorskNode, PlacementPool};
use norsk_auto_manager::decide::node_status::node_resource_name;
use norsk_auto_manager::model::{NodeId, NodeInventory, NodePhase, tags};
use norsk_auto_manager::sim::{ClusterNode, SimConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::control_plane;
use crate::sim_support::{Sim, TIME_SCALE};

const BINARY: &str = env!("CARGO_BIN_EXE_norsk-auto-manager");
pub(crate) const WAIT: Duration = Duration::from_secs(90);
/// What a new leader logs as it waits out its predecessor's calls.
const FENCE_MESSAGE: &str = "won the Lease from another leader: waiting out its calls to Manager before acting";

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

pub(crate) async fn http_status(port: u16, path: &str) -> Option<String> {
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: operator\r\nConnection: close\r\n\r\n");
    socket.write_all(request.as_bytes()).await.ok()?;
    let mut answer = String::new();
    socket.read_to_string(&mut answer).await.ok()?;
    answer.lines().next().map(str::to_owned)
}

/// Installs the definitions and the pool `studio` (its cluster servers,
/// then elastic AWS); returns a fresh namespace and a simulator with one
/// cluster server `<ns>-a`.
pub(crate) async fn setup(cp: &control_plane::ControlPlane, prefix: &str) -> (String, Sim) {
    setup_with(cp, prefix, |_| {}).await
}

/// [`setup`], the simulator's config changed by `configure` (a published
/// Manager, images on the server).
async fn setup_with(
    cp: &control_plane::ControlPlane,
    prefix: &str,
    configure: impl FnOnce(&mut SimConfig),
) -> (String, Sim) {
    cp.install_definitions().await;
    let ns = cp.namespace(prefix).await;
    // Server-side apply: tests running at once may both make the pool.
    let pool: PlacementPool = yaml_serde::from_str(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: PlacementPool\nmetadata: {name: studio}\nspec:\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n    - {name: cloud, kind: aws, region: eu-west-1, scaleOut: elastic, maxNodes: 2, candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 4, totalCores: 4, capabilities: []}]}\n",
    )
    .unwrap();
    Api::<PlacementPool>::all(cp.client())
        .patch(
            "studio",
            &PatchParams::apply("norsk-process-test").force(),
            &Patch::Apply(&pool),
        )
        .await
        .expect("pool applies");
    let mut config = SimConfig {
        seed: 9,
        time_scale: TIME_SCALE,
        cluster_nodes: vec![ClusterNode {
            id: format!("{ns}-a"),
            tags: BTreeMap::from([(tags::POOL.to_owned(), "studio".to_owned())]),
            inventory: NodeInventory::local_server("studio", "rack-1", "r640", 8.0),
        }],
        ..SimConfig::default()
    };
    configure(&mut config);
    let sim = Sim::start_with(config).await;
    (ns, sim)
}

/// One operator process with its telemetry port.
pub(crate) struct Process {
    pub(crate) child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Process {
    pub(crate) fn spawn(cp: &control_plane::ControlPlane, ns: &str, sim: &Sim, identity: &str) -> Process {
        Self::spawn_with(ns, sim, identity, cp.kubeconfig())
    }

    /// [`Process::spawn`], reaching the API server as `kubeconfig` says.
    pub(crate) fn spawn_with(ns: &str, sim: &Sim, identity: &str, kubeconfig: &std::path::Path) -> Process {
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
            format!(
                "settings:\n  tracePlacements: false\nmetricsAddr: 127.0.0.1:{port}\nlease: {{durationSeconds: 3, graceSeconds: 1}}\n"
            ),
        )
        .unwrap();
        let child = Command::new(BINARY)
            .args(["operator", "--config"])
            .arg(&config)
            .args(["--manager-url", &sim.handle.url()])
            .args(["--identity", identity, "--lease-namespace", ns])
            .args(["--bundle-namespace", ns, "--fleet", ns, "--log-format", "json"])
            .env("KUBECONFIG", kubeconfig)
            // What an operator logs by default, whatever the test runs with.
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("operator.log")).unwrap())
            .spawn()
            .expect("the operator starts");
        Process { child, port, _dir: dir }
    }

    /// Rewrites its settings file with `edit`, as the kubelet updates a
    /// mounted ConfigMap after an edit.
    pub(crate) fn edit_config(&self, edit: impl FnOnce(&str) -> String) {
        let path = self._dir.path().join("operator.yaml");
        let text = std::fs::read_to_string(&path).expect("the settings file");
        // Written beside and renamed over, as the kubelet swaps its files.
        let next = self._dir.path().join("operator.yaml.next");
        std::fs::write(&next, edit(&text)).expect("written");
        std::fs::rename(&next, &path).expect("renamed");
    }

    /// How many lines it has logged so far.
    pub(crate) fn log_line_count(&self) -> usize {
        std::fs::read_to_string(self._dir.path().join("operator.log"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// The CPU time it has used so far (user and system, from
    /// `/proc/<pid>/stat`).
    pub(crate) fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).expect("the process runs");
        // The command name may hold spaces: the fields follow its `)`.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after `)`.
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        Duration::from_secs_f64(ticks as f64 / per_second)
    }

    /// Whether it says it leads (`norsk_automanager_leader`), read from its
    /// own telemetry endpoint (which needs no API server).
    pub(crate) async fn says_it_leads(&self) -> Option<bool> {
        let (_, body) = http_get(self.port, "/metrics", "*/*").await?;
        body.lines()
            .find(|l| l.starts_with("norsk_automanager_leader "))
            .map(|l| l.ends_with(" 1"))
    }

    /// Its JSON log lines so far.
    pub(crate) fn log_lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self._dir.path().join("operator.log"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {l}")))
            .collect()
    }

    /// The first log line whose message is `message`.
    pub(crate) fn logged(&self, message: &str) -> serde_json::Value {
        let lines = self.log_lines();
        lines
            .iter()
            .find(|l| l["fields"]["message"] == message)
            .cloned()
            .unwrap_or_else(|| panic!("no {message:?} line in the log:\n{lines:#?}"))
    }

    /// Whether `/readyz` answers `code` within [`WAIT`].
    async fn readyz_becomes(&self, code: &str) -> bool {
        let wanted = format!(" {code} ");
        tokio::time::timeout(WAIT, async {
            loop {
                if http_status(self.port, "/readyz")
                    .await
                    .is_some_and(|l| l.contains(&wanted))
                {
                    return;
                }
                // The process starts on its own clock; poll its endpoint.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .is_ok()
    }

    /// Waits until `/readyz` answers 200.
    pub(crate) async fn ready(&mut self) {
        if !self.readyz_becomes("200").await {
            let _ = self.child.kill();
            panic!("the operator never became ready");
        }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: the pid is our own child's, not yet waited for.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // A test that failed midway must not leave an operator running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn bundle(name: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}}}\nspec:\n  pool: studio\n  jobs: [{{jobName: encode, requirements: {{requiredCapacity: 2}}}}]\n"
    )
}

pub(crate) async fn until_ready(cp: &control_plane::ControlPlane, ns: &str, name: &str) -> Bundle {
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), ns);
    tokio::time::timeout(
        WAIT,
        await_condition(bundles, name, |b: Option<&Bundle>| {
            b.and_then(|b| b.status.as_ref())
                .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        }),
    )
    .await
    .expect("the bundle is Ready in time")
    .expect("watch")
    .expect("bundle exists")
}

#[tokio::test]
async fn the_operator_process_becomes_ready_places_a_bundle_and_stops_on_sigterm() {
    let cp = control_plane::shared().await;
    let (ns, sim) = setup(cp, "process").await;
    let mut operator = Process::spawn(cp, &ns, &sim, "process-0");
    operator.ready().await;
    cp.kubectl_apply(&ns, &bundle("live")).expect("bundle applies");
    let placed = until_ready(cp, &ns, "live").await;
    assert_eq!(placed.status.and_then(|s| s.primary_node), Some(format!("{ns}-a")));
    // What an on-call person reads: who started, against which Manager, and
    // each decision with its ids as fields.
    let start = operator.logged("norsk-auto-manager operator starting");
    assert_eq!(start["level"], "INFO");
    assert_eq!(start["fields"]["identity"], "process-0");
    assert_eq!(start["fields"]["manager"], sim.handle.url());
    assert_eq!(start["fields"]["revision"].as_str().map(str::len), Some(40), "{start}");
    let ready = operator.logged("Manager event stream open, snapshot received");
    assert_eq!(ready["fields"]["manager"], sim.handle.url());
    let placement = operator.logged("placed");
    assert_eq!(placement["fields"]["bundle"], format!("{ns}/live"));
    assert_eq!(placement["fields"]["job"], "encode");
    assert_eq!(placement["fields"]["node"], format!("{ns}-a"));
    assert_eq!(placement["fields"]["pool"], "studio");
    let metrics = http_status(operator.port, "/metrics").await;
    assert!(metrics.is_some_and(|l| l.contains(" 200 ")));
    operator.signal(libc::SIGTERM);
    let status = operator.child.wait().expect("the operator exits");
    assert!(status.success(), "the operator exited with {status}");
    sim.shutdown().await;
}

#[tokio::test]
async fn a_killed_leader_is_replaced_and_nothing_is_created_twice() {
    let cp = control_plane::shared().await;
    let (ns, sim) = setup(cp, "handover").await;
    let mut first = Process::spawn(cp, &ns, &sim, "handover-0");
    let mut second = Process::spawn(cp, &ns, &sim, "handover-1");
    first.ready().await;
    second.ready().await;
    cp.kubectl_apply(&ns, &bundle("before")).expect("bundle applies");
    until_ready(cp, &ns, "before").await;
    // A live spare, kept by the leader for the cluster-wide policy (the
    // other processes of this binary keep one in their own simulators).
    cp.kubectl_apply(
        &ns,
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: HotSparePolicy\nmetadata: {name: studio}\nspec: {pool: studio, targetCount: 1, spec: {instanceType: m5.xlarge, region: eu-west-1}}\n",
    )
    .expect("policy applies");
    let spare =
        tokio::time::timeout(WAIT, async {
            loop {
                let running =
                    sim.snapshot().await.nodes.into_iter().find(|n| {
                        n.phase == NodePhase::Running && n.tags.get(tags::SPARE).is_some_and(|v| v == "true")
                    });
                if let Some(node) = running {
                    return node.id;
                }
                // The operator is another process; poll the simulator.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the leader keeps a live spare");
    let leases: Api<Lease> = Api::namespaced(cp.client(), &ns);
    let holder = |lease: Lease| lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    let leader = holder(leases.get("norsk-auto-manager").await.expect("the Lease exists"));
    let killed_identity = leader.clone();
    let (killed, follower, survivor) = match leader.as_str() {
        "handover-0" => (&mut first, &second, "handover-1"),
        "handover-1" => (&mut second, &first, "handover-0"),
        other => panic!("unexpected Lease holder {other:?}"),
    };
    // The first leader of a fresh Lease had no predecessor to wait out.
    let fenced = |p: &Process| p.log_lines().iter().any(|l| l["fields"]["message"] == FENCE_MESSAGE);
    assert!(
        !fenced(killed),
        "the first leader waited for a predecessor it never had"
    );
    // No goodbye: the Lease is not released and must expire.
    killed.signal(libc::SIGKILL);
    let _ = killed.child.wait();
    cp.kubectl_apply(&ns, &bundle("after")).expect("bundle applies");
    until_ready(cp, &ns, "after").await;
    assert_eq!(holder(leases.get("norsk-auto-manager").await.unwrap()), survivor);
    // The survivor waited out the killed leader's calls before it acted.
    // It waited out the Manager request timeout (15 s) from when the killed
    // leader stopped acting, which it could tell to within its look at the
    // Lease (every second).
    let fence = follower.logged(FENCE_MESSAGE);
    let waited = fence["fields"]["wait_s"].as_f64().unwrap_or_default();
    assert!((13.0..=15.0).contains(&waited), "{fence}");
    assert_eq!(fence["fields"]["predecessor"], killed_identity, "{fence}");
    let snapshot = sim.snapshot().await;
    let mut bundles: Vec<_> = snapshot.bundles.iter().map(|b| b.bundle_id.0.clone()).collect();
    bundles.sort();
    assert_eq!(bundles, vec![format!("{ns}/after"), format!("{ns}/before")]);
    assert_eq!(snapshot.jobs.len(), 2, "a job was created twice: {:?}", snapshot.jobs);
    // The new leader's first round knew the policy: the spare stays, and
    // no other node was made.
    let mut nodes: Vec<_> = snapshot.nodes.iter().map(|n| (n.id.clone(), n.phase)).collect();
    nodes.sort_by(|a, b| a.0.cmp(&b.0));
    let mut kept = vec![
        (NodeId(format!("{ns}-a")), NodePhase::Running),
        (spare, NodePhase::Running),
    ];
    kept.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(nodes, kept, "the fleet changed over the handover");
    sim.shutdown().await;
}

/// A TCP proxy in front of the API server that cuts off whoever reaches it
/// through the proxy, as a network partition does: from the cut on nothing
/// passes either way, and connections hang rather than fail.
struct Partition {
    address: String,
    cut: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Partition {
    async fn start(upstream: &str) -> Partition {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (cut, cut_rx) = tokio::sync::watch::channel(false);
        let upstream = upstream.to_owned();
        let task = tokio::spawn(async move {
            // Dropped with the proxy: every connection goes with it.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut cut = cut_rx.clone();
                let upstream = upstream.clone();
                connections.spawn(async move {
                    if !*cut.borrow()
                        && let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await
                    {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => return,
                            _ = cut.wait_for(|c| *c) => {}
                        }
                    }
                    // Silence: the sockets stay open, nothing more passes.
                    std::future::pending::<()>().await;
                    drop(inbound);
                });
            }
        });
        Partition { address, cut, task }
    }

    fn cut(&self) {
        self.cut.send_replace(true);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn log_time(line: &serde_json::Value) -> k8s_openapi::jiff::Timestamp {
    line["timestamp"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("a log line without a timestamp: {line}"))
}

#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_stops_acting_before_its_lease_can_pass_to_another() {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};

    let cp = control_plane::shared().await;
    let (ns, sim) = setup(cp, "partition").await;
    let partition = Partition::start(cp.server_address()).await;
    let dir = tempfile::tempdir().unwrap();
    let through_partition = dir.path().join("kubeconfig");
    cp.kubeconfig_via(&partition.address, &through_partition);
    let mut cut_off = Process::spawn_with(&ns, &sim, "partition-0", &through_partition);
    cut_off.ready().await;
    cp.kubectl_apply(&ns, &bundle("before")).expect("bundle applies");
    until_ready(cp, &ns, "before").await;
    let mut other = Process::spawn(cp, &ns, &sim, "partition-1");
    other.ready().await;
    let leases: Api<Lease> = Api::namespaced(cp.client(), &ns);
    let holder = |lease: &Lease| lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
    assert_eq!(
        holder(&leases.get("norsk-auto-manager").await.expect("the Lease exists")).as_deref(),
        Some("partition-0")
    );
    // Every version of the Lease from now on, until the other holds it.
    let versions = watcher(
        leases.clone(),
        watcher::Config::default().fields("metadata.name=norsk-auto-manager"),
    )
    .default_backoff()
    .applied_objects();
    let mut versions = std::pin::pin!(versions);
    let first = versions.next().await.expect("the watch runs").expect("the Lease");
    let renewed = |lease: &Lease| lease.spec.as_ref().and_then(|s| s.renew_time.clone()).map(|t| t.0);
    let mut last_renewal = renewed(&first).expect("a renewal");
    partition.cut();
    let taken = tokio::time::timeout(WAIT, async {
        while let Some(lease) = versions.next().await {
            let Ok(lease) = lease else { continue };
            match holder(&lease).as_deref() {
                Some("partition-0") => last_renewal = renewed(&lease).unwrap_or(last_renewal),
                Some("partition-1") => return lease,
                _ => {}
            }
        }
        panic!("the Lease watch ended")
    })
    .await
    .expect("the other process takes the Lease");
    let expiry = last_renewal + k8s_openapi::jiff::SignedDuration::from_secs(3);
    let acquired = taken
        .spec
        .as_ref()
        .and_then(|s| s.acquire_time.clone())
        .expect("an acquire time")
        .0;
    // The cut-off leader stopped acting before its Lease could expire, and
    // said why; the other took over only after.
    let gave_up = cut_off.logged("could not renew the Lease in time: stopped leading before it expires; leading again once a renewal gets through and no one else took it");
    let stopped = log_time(&cut_off.logged("no longer leading"));
    assert!(
        stopped < expiry,
        "the cut-off leader stopped at {stopped}, after its Lease expired at {expiry}"
    );
    assert!(log_time(&gave_up) <= stopped);
    assert!(
        stopped < acquired,
        "stopped at {stopped}, the Lease was taken at {acquired}"
    );
    assert_eq!(cut_off.says_it_leads().await, Some(false));
    // The new leader waits out the old one's calls to Manager, then acts.
    cp.kubectl_apply(&ns, &bundle("after")).expect("bundle applies");
    until_ready(cp, &ns, "after").await;
    let fence = other.logged(FENCE_MESSAGE);
    assert_eq!(fence["fields"]["predecessor"], "partition-0", "{fence}");
    assert!(log_time(&other.logged("leading: promoting the standby core and starting the controllers")) > stopped);
    assert_eq!(other.says_it_leads().await, Some(true));
    let snapshot = sim.snapshot().await;
    assert_eq!(snapshot.jobs.len(), 2, "a job was created twice: {:?}", snapshot.jobs);
    drop(partition);
    sim.shutdown().await;
}

/// `promtool` or `prometheus`: from `NORSK_PROMETHEUS_BIN` (a directory),
/// else from `PATH` (Debian's `prometheus` package installs both; on a
/// Debian machine run as root it is installed on first use, as the control
/// plane is built on first use).
fn prometheus_tool(name: &str) -> std::path::PathBuf {
    let find = || {
        let dirs = std::env::var_os("NORSK_PROMETHEUS_BIN")
            .map(|d| vec![std::path::PathBuf::from(d)])
            .unwrap_or_else(|| std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).collect());
        dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
    };
    static INSTALL: std::sync::Once = std::sync::Once::new();
    if find().is_none() && std::env::var_os("NORSK_PROMETHEUS_BIN").is_none() {
        INSTALL.call_once(|| {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } == 0 && std::path::Path::new("/usr/bin/apt-get").exists() {
                eprintln!("installing Debian's prometheus package for the monitoring tests");
                let _ = Command::new("sh")
                    .args([
                        "-c",
                        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus",
                    ])
                    .stdout(Stdio::null())
                    .status();
            }
        });
    }
    find().unwrap_or_else(|| {
        panic!(
            "{name} not found: install Debian's prometheus package (apt-get install prometheus), \
             or point NORSK_PROMETHEUS_BIN at a directory holding prometheus and promtool"
        )
    })
}

fn repo_path(relative: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// GET over HTTP/1.0 (no chunked answers): the status line and the body.
pub(crate) async fn http_get(port: u16, path_and_query: &str, accept: &str) -> Option<(String, String)> {
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {path_and_query} HTTP/1.0\r\nHost: localhost\r\nAccept: {accept}\r\n\r\n");
    socket.write_all(request.as_bytes()).await.ok()?;
    let mut answer = String::new();
    socket.read_to_string(&mut answer).await.ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    Some((head.to_owned(), body.to_owned()))
}

/// Percent-encodes a PromQL expression for a query string.
fn query_escape(expr: &str) -> String {
    expr.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server of its own, scraping one operator every second.
struct Prometheus {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(operator_port: u16) -> Prometheus {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [{rules}]\nscrape_configs:\n  - job_name: norsk-auto-manager\n    static_configs: [{{targets: ['127.0.0.1:{operator_port}']}}]\n",
                rules = repo_path("charts/norsk-auto-manager/files/alerts.yaml").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(prometheus_tool("prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        Prometheus { child, port, dir }
    }

    /// The `data` of a successful API answer; any other answer fails the
    /// test with what Prometheus said.
    async fn api(&self, path_and_query: &str) -> serde_json::Value {
        let (head, body) = http_get(self.port, path_and_query, "application/json")
            .await
            .unwrap_or_else(|| panic!("prometheus did not answer {path_and_query}\n{}", self.log()));
        let answer: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path_and_query}: {e}: {head}\n{body}"));
        assert_eq!(answer["status"], "success", "{path_and_query}: {answer}");
        answer["data"].clone()
    }

    async fn query(&self, expr: &str) -> Vec<serde_json::Value> {
        let data = self.api(&format!("/api/v1/query?query={}", query_escape(expr))).await;
        data["result"].as_array().cloned().unwrap_or_default()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_tool(mut command: Command) -> String {
    let out = command.output().expect("the tool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{command:?} failed:\n{text}");
    text
}

#[tokio::test]
async fn a_real_prometheus_scrapes_the_operator_and_every_alert_and_dashboard_query_evaluates() {
    // The rule file and its unit tests, as promtool sees them.
    let rules = repo_path("charts/norsk-auto-manager/files/alerts.yaml");
    let mut check = Command::new(prometheus_tool("promtool"));
    check.args(["check", "rules"]).arg(&rules);
    run_tool(check);
    let mut test = Command::new(prometheus_tool("promtool"));
    test.args(["test", "rules", "alerts_test.yaml"])
        .current_dir(repo_path("tests/monitoring"));
    run_tool(test);

    let cp = control_plane::shared().await;
    let (ns, sim) = setup(cp, "monitoring").await;
    let mut operator = Process::spawn(cp, &ns, &sim, "monitoring-0");
    operator.ready().await;
    cp.kubectl_apply(&ns, &bundle("watched")).expect("bundle applies");
    until_ready(cp, &ns, "watched").await;

    // The exposition as a scraper that does not ask for OpenMetrics gets it.
    // The pool gauges are set by the pool controller's own reconcile, which
    // may come a moment after the bundle is ready: read until every family
    // is there (bounded), then check what was read.
    let families = [
        "norsk_automanager_build_info{",
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "norsk_automanager_pool_used_capacity_ratio{pool=\"studio\"}",
        "norsk_automanager_leader 1",
        "norsk_automanager_manager_connected 1",
        "norsk_automanager_placement_results_total{result=\"succeeded\"}",
    ];
    let deadline = tokio::time::Instant::now() + WAIT;
    let (head, body) = loop {
        let (head, body) = http_get(operator.port, "/metrics", "*/*")
            .await
            .expect("/metrics answers");
        if families.iter().all(|f| body.contains(f)) || tokio::time::Instant::now() >= deadline {
            break (head, body);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let mut lint = Command::new(prometheus_tool("promtool"));
    lint.args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = lint.spawn().expect("promtool runs");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), body.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics:\n{}{}\n--- the exposition:\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for family in families {
        assert!(body.contains(family), "{family:?} missing from:\n{body}");
    }

    let prometheus = Prometheus::start(operator.port);
    // Ready, the target up, and enough scrapes for every rate() window.
    let scraped = tokio::time::timeout(WAIT, async {
        loop {
            if let Some((head, _)) = http_get(prometheus.port, "/-/ready", "*/*").await
                && head.contains(" 200 ")
            {
                let up = prometheus
                    .query("count_over_time(up{job=\"norsk-auto-manager\"}[1m]) >= 5 and up == 1")
                    .await;
                if !up.is_empty() {
                    return;
                }
            }
            // Prometheus is another process on its own clock.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    assert!(
        scraped.is_ok(),
        "the operator was never scraped five times:\n{}",
        prometheus.log()
    );
    // The operator's own counters moved while Prometheus watched.
    cp.kubectl_apply(&ns, &bundle("second")).expect("bundle applies");
    until_ready(cp, &ns, "second").await;

    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_path("charts/norsk-auto-manager/files/dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    let mut empty = Vec::new();
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            // Grafana's range variable, at this scrape interval.
            let expr = target["expr"]
                .as_str()
                .expect("expr")
                .replace("$__rate_interval", "30s");
            if prometheus.query(&expr).await.is_empty() {
                empty.push(format!("{}: {expr}", panel["title"]));
            }
        }
    }
    assert!(empty.is_empty(), "panels without data:\n{}", empty.join("\n"));

    let alerts: serde_json::Value = yaml_serde::from_str(&std::fs::read_to_string(&rules).unwrap()).unwrap();
    let mut names = Vec::new();
    for rule in alerts["groups"][0]["rules"].as_array().expect("rules") {
        // Evaluates (an error fails `api`); a healthy operator raises none.
        let firing = prometheus.query(rule["expr"].as_str().expect("expr")).await;
        assert!(
            firing.is_empty(),
            "{} fires on a healthy operator: {firing:?}",
            rule["alert"]
        );
        names.push(rule["alert"].as_str().unwrap().to_owned());
    }
    // Prometheus loaded the same rules and evaluates them without error.
    let loaded = prometheus.api("/api/v1/rules").await;
    let loaded: Vec<(String, String, String)> = loaded["groups"][0]["rules"]
        .as_array()
        .expect("loaded rules")
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap_or_default().to_owned(),
                r["health"].as_str().unwrap_or_default().to_owned(),
                r["lastError"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String, String)> = names
        .iter()
        .map(|n| (n.clone(), "ok".to_owned(), String::new()))
        .collect();
    assert_eq!(loaded, expected);
    drop(prometheus);
    drop(operator);
    sim.shutdown().await;
}

#[tokio::test]
async fn on_a_published_manager_bundles_become_ready_and_the_operator_says_how_it_works() {
    let cp = control_plane::shared().await;
    let (ns, sim) = setup_with(cp, "published", |c| c.published_api_only = true).await;
    let mut operator = Process::spawn(cp, &ns, &sim, "published-0");
    operator.ready().await;
    for name in ["first", "second"] {
        cp.kubectl_apply(&ns, &bundle(name)).expect("bundle applies");
    }
    for name in ["first", "second"] {
        until_ready(cp, &ns, name).await;
    }
    // Manager stores no bundle: each is a job of its own, tagged with the
    // bundle, replica and job it is.
    let snapshot = sim.snapshot().await;
    assert!(snapshot.bundles.is_empty());
    let tagged: Vec<_> = snapshot
        .jobs
        .iter()
        .filter_map(|j| j.tags.get("automanager.norsk.video/bundle"))
        .collect();
    assert_eq!(tagged.len(), 2, "{:?}", snapshot.jobs);
    // Ready, and it says which way each capability is carried out.
    assert!(
        operator.readyz_becomes("200").await,
        "/readyz is 200 on a published Manager"
    );
    let (_, metrics) = http_get(operator.port, "/metrics", "*/*")
        .await
        .expect("/metrics answers");
    assert!(
        metrics.contains(r#"norsk_automanager_manager_capability{capability="bundleStore",mode="published"} 1"#),
        "{metrics}"
    );
    let said: Vec<_> = operator
        .log_lines()
        .into_iter()
        .filter(|l| l["fields"]["message"] == "Manager capabilities")
        .collect();
    assert!(
        said.iter().any(|l| l["fields"]["capabilities"]
            .as_str()
            .is_some_and(|c| c.contains("bundleStore=published"))),
        "{said:#?}"
    );
    sim.shutdown().await;
}

/// `settings.templateImages` edited in the settings file (a ConfigMap
/// update) takes effect without a restart: the node that holds the new
/// image shows it as warmth on its NorskNode; an invalid edit is reported
/// and changes nothing.
#[tokio::test]
async fn template_images_edited_in_the_settings_file_apply_without_a_restart() {
    let cp = control_plane::shared().await;
    let (ns, sim) = setup_with(cp, "images", |c| {
        c.cluster_nodes[0].inventory.images = vec!["reg/encoder:2".to_owned()];
    })
    .await;
    let mut operator = Process::spawn(cp, &ns, &sim, "images-0");
    operator.ready().await;
    let nodes: Api<NorskNode> = Api::all(cp.client());
    let name = node_resource_name(&ns, &format!("{ns}-a"));
    let warm_for = |n: &NorskNode| {
        n.status
            .as_ref()
            .and_then(|s| s.placement.as_ref())
            .map(|p| p.template_images.clone())
            .unwrap_or_default()
    };
    let mirrored = tokio::time::timeout(
        WAIT,
        await_condition(nodes.clone(), &name, |n: Option<&NorskNode>| {
            n.is_some_and(|n| n.status.as_ref().is_some_and(|s| s.placement.is_some()))
        }),
    )
    .await
    .expect("the server is mirrored")
    .expect("watch")
    .expect("node");
    assert!(warm_for(&mirrored).is_empty(), "no template images yet");

    operator.edit_config(|text| {
        text.replace(
            "settings:\n",
            "settings:\n  templateImages: {encoder: [\"reg/encoder:2\", \"reg/sidecar:1\"]}\n",
        )
    });
    let warm = tokio::time::timeout(
        WAIT,
        await_condition(nodes.clone(), &name, |n: Option<&NorskNode>| {
            n.is_some_and(|n| !warm_for(n).is_empty())
        }),
    )
    .await
    .expect("the new template images show on the node")
    .expect("watch")
    .expect("node");
    assert_eq!(
        warm_for(&warm),
        BTreeMap::from([("encoder".to_owned(), vec!["reg/encoder:2".to_owned()])]),
        "the node holds the encoder image it has of the template's two"
    );
    operator.logged("settings.templateImages changed: applied live");

    // A typo: reported once, nothing of it applied.
    operator.edit_config(|text| text.replace("templateImages:", "templateImage:"));
    let invalid =
        "the settings file changed and is invalid: nothing of the change is applied; the settings in force stay";
    tokio::time::timeout(WAIT, async {
        while !operator.log_lines().iter().any(|l| l["fields"]["message"] == invalid) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("the invalid file is reported");
    let error = operator.logged(invalid);
    assert!(
        error["fields"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("templateImage")),
        "the report names what is wrong: {error}"
    );
    let still = nodes.get(&name).await.expect("node");
    assert_eq!(warm_for(&still), warm_for(&warm), "the images in force stay");
    operator.signal(libc::SIGTERM);
    let _ = operator.child.wait();
    sim.shutdown().await;
}
