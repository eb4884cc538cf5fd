//! A real, throwaway Kubernetes control plane (etcd + kube-apiserver) for integration tests.
//!
//! The binaries come from `e2e/control-plane/build.sh` (built from the Go module proxy and
//! cached outside the repository) or from the directory named by `NORSK_CP_BIN`.
//!
//! What runs is only the API server and its store: objects are validated (OpenAPI schema,
//! CEL), admitted, authorised (RBAC) and stored, and watches work. Nothing reconciles them:
//! there is no controller-manager, scheduler or kubelet, so namespaces are never finalised,
//! nothing is garbage-collected, no `default` ServiceAccount appears in a new namespace and no
//! pod ever runs. Tests that need a ServiceAccount create it (see
//! [`ControlPlane::service_account_client`]).
//!
//! One control plane serves the tests of one file ([`shared`]); each test takes a namespace
//! of its own ([`ControlPlane::namespace`]). The processes die with the test binary whatever
//! way it ends: they are killed at exit, and the kernel kills them should the binary itself be
//! killed (`PR_SET_PDEATHSIG`).
//!
//! Environment:
//! - `NORSK_CP_BIN`: directory holding `etcd`, `kube-apiserver`, `kubectl` and `helm`; when
//!   unset the build script is run (a no-op on a warm cache).
//! - `NORSK_CP_KEEP=1`: keep the working directory (certificates, kubeconfig, logs) after exit.
//! - `NORSK_CP_START_TIMEOUT`: seconds to wait for `/readyz` (default 120).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    fs::{self, File},
    io,
    net::TcpListener,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicU32, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        authentication::v1::{TokenRequest, TokenRequestSpec},
        core::v1::{Namespace, ServiceAccount},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, Config,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    config::{AuthInfo, KubeConfigOptions, Kubeconfig},
    runtime::wait::{await_condition, conditions},
};
use norsk_auto_manager::crd;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

const BINARIES: [&str; 4] = ["etcd", "kube-apiserver", "kubectl", "helm"];
/// Working directories are `$TMPDIR/norsk-cp-XXXXXX`, holding the owner's pid in `owner.pid`.
const DIR_PREFIX: &str = "norsk-cp-";
const OWNER_FILE: &str = "owner.pid";
/// Lines of each log shown when the control plane fails to start.
const LOG_TAIL_LINES: usize = 40;
/// How long the API server may take to serve a definition once it is applied.
const ESTABLISHED_WAIT: Duration = Duration::from_secs(90);

/// The control plane shared by the tests of the calling test's file, started on first use.
///
/// Files do not share one: the tests of a file make cluster-wide objects (pools, hot spare
/// policies, drains, nodes) that the operators another file's tests run would act on. The
/// file is the first segment of the running test's name (`operator::a_test` is in
/// `operator.rs`), which the test harness gives the thread the test runs on: call this from
/// the test itself, not from a task it spawns.
///
/// Panics (failing the calling test) when it cannot start; the message carries the tail of
/// the etcd and kube-apiserver logs. Later callers of the same file get the same failure
/// without retrying.
pub async fn shared() -> &'static ControlPlane {
    type Shared = tokio::sync::OnceCell<Result<ControlPlane, String>>;
    static BY_FILE: Mutex<BTreeMap<String, &'static Shared>> = Mutex::new(BTreeMap::new());
    let file = test_file();
    let shared: &'static Shared = BY_FILE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(file)
        .or_insert_with(|| Box::leak(Box::default()));
    match shared.get_or_init(ControlPlane::start).await {
        Ok(control_plane) => control_plane,
        Err(message) => panic!("control plane unavailable: {message}"),
    }
}

/// The file of the running test: the first segment of the name of its thread.
fn test_file() -> String {
    let thread = std::thread::current();
    let name = thread.name().unwrap_or_default();
    match name.split_once("::") {
        Some((file, _)) => file.to_owned(),
        None => panic!("control_plane::shared() called on thread {name:?}, not a test's own: call it from the test"),
    }
}

/// A running etcd + kube-apiserver pair with its working directory.
pub struct ControlPlane {
    dir: PathBuf,
    bin_dir: PathBuf,
    server: String,
    kubeconfig: PathBuf,
    ca_pem: String,
    config: Config,
    processes: Mutex<Vec<Process>>,
    /// How the API server was started, to start it again after
    /// [`ControlPlane::kill_api_server`].
    apiserver_args: Vec<String>,
    /// How many times the API server was started again.
    restarts: AtomicU32,
    /// What [`ControlPlane::once`] has installed.
    installed: tokio::sync::Mutex<BTreeSet<&'static str>>,
}

struct Process {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl ControlPlane {
    /// Starts a control plane of its own (most tests want [`shared`] instead). Dropping it
    /// stops the processes and removes the working directory.
    pub async fn start() -> Result<ControlPlane, String> {
        let bin_dir = locate_binaries()?;
        let timeout = std::env::var("NORSK_CP_START_TIMEOUT")
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_secs(120));
        // Free ports are found by binding port 0 and releasing it, so another process can
        // take one before etcd or the API server binds it: try again with new ports then.
        let mut attempt = 1;
        loop {
            match Self::start_once(&bin_dir, timeout).await {
                Ok(control_plane) => return Ok(control_plane),
                Err(failure) if failure.port_clash && attempt < 3 => attempt += 1,
                Err(failure) => return Err(failure.message),
            }
        }
    }

    async fn start_once(bin_dir: &Path, timeout: Duration) -> Result<ControlPlane, StartFailure> {
        remove_abandoned_dirs();
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(|e| StartFailure::plain(format!("cannot create a temp dir: {e}")))?
            .keep();
        // From here on `control_plane` owns the directory and the processes, so every early
        // return below cleans up through its Drop.
        let mut control_plane = ControlPlane {
            dir: dir.clone(),
            bin_dir: bin_dir.to_owned(),
            server: String::new(),
            kubeconfig: dir.join("kubeconfig"),
            ca_pem: String::new(),
            config: Config::new("https://127.0.0.1".parse().expect("static URL")),
            processes: Mutex::new(Vec::new()),
            apiserver_args: Vec::new(),
            restarts: AtomicU32::new(0),
            installed: tokio::sync::Mutex::new(BTreeSet::new()),
        };
        control_plane.launch(timeout).await?;
        Ok(control_plane)
    }

    async fn launch(&mut self, timeout: Duration) -> Result<(), StartFailure> {
        let dir = self.dir.clone();
        let io_err = |what: &str, e: io::Error| StartFailure::plain(format!("{what}: {e}"));
        fs::write(dir.join(OWNER_FILE), std::process::id().to_string()).map_err(|e| io_err(OWNER_FILE, e))?;

        let pki = Pki::generate().map_err(|e| StartFailure::plain(format!("certificates: {e}")))?;
        let pki_dir = dir.join("pki");
        fs::create_dir_all(&pki_dir).map_err(|e| io_err("create pki dir", e))?;
        for (name, contents) in [
            ("ca.crt", &pki.ca_cert),
            ("apiserver.crt", &pki.serving_cert),
            ("apiserver.key", &pki.serving_key),
            ("admin.crt", &pki.admin_cert),
            ("admin.key", &pki.admin_key),
            ("sa.key", &pki.sa_key),
            ("sa.pub", &pki.sa_pub),
        ] {
            fs::write(pki_dir.join(name), contents).map_err(|e| io_err(name, e))?;
        }
        self.ca_pem = pki.ca_cert.clone();

        let etcd_client_port = free_port().map_err(|e| io_err("free port", e))?;
        let etcd_peer_port = free_port().map_err(|e| io_err("free port", e))?;
        let apiserver_port = free_port().map_err(|e| io_err("free port", e))?;
        self.server = format!("https://127.0.0.1:{apiserver_port}");
        let etcd_url = format!("http://127.0.0.1:{etcd_client_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");

        let mut etcd = Command::new(self.bin_dir.join("etcd"));
        etcd.args([
            "--name=norsk-test",
            &format!("--data-dir={}", dir.join("etcd").display()),
            &format!("--listen-client-urls={etcd_url}"),
            &format!("--advertise-client-urls={etcd_url}"),
            &format!("--listen-peer-urls={peer_url}"),
            &format!("--initial-advertise-peer-urls={peer_url}"),
            &format!("--initial-cluster=norsk-test={peer_url}"),
            // The data is thrown away after the run: durability only costs time.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]);
        self.spawn("etcd", etcd)?;

        let pki_path = |name: &str| pki_dir.join(name).display().to_string();
        self.apiserver_args = [
            &format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            &format!("--secure-port={apiserver_port}"),
            // Only used for files the server would otherwise write under /var/run.
            &format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            &format!("--tls-cert-file={}", pki_path("apiserver.crt")),
            &format!("--tls-private-key-file={}", pki_path("apiserver.key")),
            &format!("--client-ca-file={}", pki_path("ca.crt")),
            "--authorization-mode=RBAC",
            &format!("--service-account-issuer={}", self.server),
            &format!("--service-account-key-file={}", pki_path("sa.pub")),
            &format!("--service-account-signing-key-file={}", pki_path("sa.key")),
            "--service-cluster-ip-range=10.0.0.0/24",
            // No controller-manager runs, so nothing would create the default ServiceAccount
            // that this plugin requires of every pod.
            "--disable-admission-plugins=ServiceAccount",
            // Less to set up at start; request fairness is not what these tests exercise.
            "--enable-priority-and-fairness=false",
            // There are no nodes or endpoints to reconcile the `kubernetes` Service against.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--allow-privileged=true",
        ]
        .map(|a| a.to_string())
        .to_vec();
        let mut apiserver = Command::new(self.bin_dir.join("kube-apiserver"));
        apiserver.args(&self.apiserver_args);
        self.spawn("kube-apiserver", apiserver)?;

        let kubeconfig = format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: norsk-test\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
             users:\n\
             - name: admin\n  user:\n    client-certificate: {cert}\n    client-key: {key}\n\
             contexts:\n\
             - name: norsk-test\n  context:\n    cluster: norsk-test\n    user: admin\n    namespace: default\n\
             current-context: norsk-test\n",
            server = self.server,
            ca = pki_path("ca.crt"),
            cert = pki_path("admin.crt"),
            key = pki_path("admin.key"),
        );
        fs::write(&self.kubeconfig, kubeconfig).map_err(|e| io_err("kubeconfig", e))?;
        let parsed = Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| StartFailure::plain(format!("read kubeconfig: {e}")))?;
        self.config = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
            .await
            .map_err(|e| StartFailure::plain(format!("kubeconfig to config: {e}")))?;

        self.wait_ready(timeout).await
    }

    fn spawn(&self, name: &'static str, command: Command) -> Result<(), StartFailure> {
        self.spawn_logged(name, command, self.dir.join(format!("{name}.log")))
    }

    fn spawn_logged(&self, name: &'static str, command: Command, log: PathBuf) -> Result<(), StartFailure> {
        let child = spawn_tied_to_process(command, &log)
            .map_err(|e| StartFailure::plain(format!("cannot start {name}: {e}")))?;
        self.processes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Process { name, child, log });
        Ok(())
    }

    async fn wait_ready(&self, timeout: Duration) -> Result<(), StartFailure> {
        let started = Instant::now();
        let client = Client::try_from(self.config.clone()).map_err(|e| StartFailure::plain(format!("client: {e}")))?;
        let mut last;
        loop {
            if let Some((name, status)) = self.exited() {
                return Err(self.failure(format!("{name} exited ({status}) during start")));
            }
            let request = http::Request::get("/readyz").body(Vec::new()).expect("static request");
            match tokio::time::timeout(Duration::from_secs(5), client.request_text(request)).await {
                Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
                Ok(Ok(body)) => last = body,
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "request timed out".into(),
            }
            if started.elapsed() > timeout {
                return Err(self.failure(format!(
                    "kube-apiserver not ready after {timeout:?}; last /readyz answer: {last}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn exited(&self) -> Option<(&'static str, ExitStatus)> {
        let mut processes = self.processes.lock().unwrap_or_else(|p| p.into_inner());
        processes
            .iter_mut()
            .find_map(|p| p.child.try_wait().ok().flatten().map(|s| (p.name, s)))
    }

    fn failure(&self, message: String) -> StartFailure {
        let logs = self.log_tails(LOG_TAIL_LINES);
        let port_clash = logs.contains("address already in use");
        StartFailure {
            message: format!(
                "{message}\n(working directory {}; NORSK_CP_KEEP=1 keeps it)\n{logs}",
                self.dir.display()
            ),
            port_clash,
        }
    }

    /// The last `lines` lines of every process log, for failure messages.
    pub fn log_tails(&self, lines: usize) -> String {
        let processes = self.processes.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        for p in processes.iter() {
            let text = fs::read_to_string(&p.log).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            let tail = &all[all.len().saturating_sub(lines)..];
            let _ = writeln!(out, "----- last {} lines of {} -----", tail.len(), p.log.display());
            for line in tail {
                let _ = writeln!(out, "{line}");
            }
        }
        out
    }

    /// A new client authenticated as the cluster admin (`system:masters`). Clients are cheap;
    /// make one per test, since a client is bound to the async runtime it first runs on.
    pub fn client(&self) -> Client {
        Client::try_from(self.config.clone()).expect("client from the control plane config")
    }

    /// Runs `install` the first time a test of this control plane asks for `what`; later
    /// calls wait until it has run, then return. One that panicked counts as not run.
    pub async fn once<F: Future<Output = ()>>(&self, what: &'static str, install: impl FnOnce() -> F) {
        let mut installed = self.installed.lock().await;
        if !installed.contains(what) {
            install().await;
            installed.insert(what);
        }
    }

    /// Applies the operator's definitions (server-side) and waits until the API server
    /// serves them; once per control plane.
    pub async fn install_definitions(&self) {
        self.once("definitions", || async {
            let crds: Api<CustomResourceDefinition> = Api::all(self.client());
            for definition in crd::definitions() {
                let name = definition.metadata.name.clone().unwrap_or_default();
                crds.patch(
                    &name,
                    &PatchParams::apply("norsk-test").force(),
                    &Patch::Apply(&definition),
                )
                .await
                .unwrap_or_else(|e| panic!("the API server refused {name}: {e}"));
            }
            self.until_established().await;
        })
        .await;
    }

    /// Waits until the API server serves each of the operator's definitions, however they
    /// were applied.
    pub async fn until_established(&self) {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client());
        for definition in crd::definitions() {
            let name = definition.metadata.name.clone().unwrap_or_default();
            tokio::time::timeout(
                ESTABLISHED_WAIT,
                await_condition(crds.clone(), &name, conditions::is_crd_established()),
            )
            .await
            .unwrap_or_else(|_| panic!("{name} not established in time"))
            .expect("watch the definition");
        }
    }

    /// Kills the API server as an outage would (SIGKILL; etcd keeps running and keeps the
    /// data). [`ControlPlane::restart_api_server`] brings it back on the same address. Only
    /// for a control plane no other test shares at the same time.
    pub fn kill_api_server(&self) {
        let mut processes = self.processes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = processes.iter().position(|p| p.name == "kube-apiserver") {
            let mut server = processes.remove(at);
            kill_group(server.child.id());
            let _ = server.child.wait();
            forget_pid(server.child.id());
        }
    }

    /// Starts the API server again with the same settings, on the same address, and waits
    /// until it serves. Panics (failing the test) when it does not come back.
    pub async fn restart_api_server(&self) {
        let restart = self.restarts.fetch_add(1, Ordering::Relaxed) + 1;
        let mut apiserver = Command::new(self.bin_dir.join("kube-apiserver"));
        apiserver.args(&self.apiserver_args);
        let log = self.dir.join(format!("kube-apiserver-{restart}.log"));
        let ready = match self.spawn_logged("kube-apiserver", apiserver, log) {
            Ok(()) => self.wait_ready(Duration::from_secs(120)).await,
            Err(e) => Err(e),
        };
        if let Err(failure) = ready {
            panic!("the API server did not come back: {}", failure.message);
        }
    }

    /// The API server's address (`127.0.0.1:<port>`).
    pub fn server_address(&self) -> &str {
        self.server.trim_start_matches("https://")
    }

    /// A kubeconfig for the admin that reaches the API server at `address` (a proxy in front
    /// of it, say) instead; the server's certificate is valid for any port of 127.0.0.1.
    pub fn kubeconfig_via(&self, address: &str, path: &Path) {
        let text = fs::read_to_string(&self.kubeconfig).expect("the kubeconfig is readable");
        let text = text.replace(&self.server, &format!("https://{address}"));
        fs::write(path, text).expect("the kubeconfig is written");
    }

    /// Path of a kubeconfig for the admin, valid while the control plane runs.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Path of one of the control plane's binaries (`kubectl`, `helm`, ...).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    /// Creates a namespace with a unique name starting with `prefix` and returns its name.
    pub async fn namespace(&self, prefix: &str) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let name = format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let namespaces: Api<Namespace> = Api::all(self.client());
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        name
    }

    /// Creates ServiceAccount `name` in `namespace` (if missing), mints a token for it with
    /// the TokenRequest API and returns a client authenticated with that token. It has the
    /// rights RBAC gives it: none beyond discovery until a test binds a role.
    pub async fn service_account_client(&self, namespace: &str, name: &str) -> Client {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client(), namespace);
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        match accounts.create(&PostParams::default(), &account).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => panic!("create ServiceAccount {namespace}/{name}: {e}"),
        }
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..Default::default()
            }),
            ..Default::default()
        };
        let token = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|e| panic!("token for ServiceAccount {namespace}/{name}: {e}"))
            .status
            .and_then(|status| status.token)
            .expect("TokenRequest answered without a token");
        let mut config = self.config.clone();
        config.auth_info = AuthInfo {
            token: Some(token.into()),
            ..Default::default()
        };
        config.default_namespace = namespace.to_owned();
        Client::try_from(config).expect("client for a ServiceAccount token")
    }

    /// A `kubectl` command bound to this control plane as admin.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(self.bin("kubectl"));
        command
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            // Keep kubectl's discovery cache out of the user's home directory.
            .arg(format!("--cache-dir={}", self.dir.join("kubectl-cache").display()));
        command
    }

    /// Runs `kubectl apply -n <namespace> -f -` on `manifest`: stdout on success, else the
    /// error output (where the API server's message ends up).
    pub fn kubectl_apply(&self, namespace: &str, manifest: &str) -> Result<String, String> {
        let mut command = self.kubectl();
        command.args(["apply", "-n", namespace, "-f", "-"]);
        let output = run_with_stdin(command, manifest).map_err(|e| format!("run kubectl: {e}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    /// A `helm` command bound to this control plane as admin, with its caches and settings
    /// kept in the working directory.
    pub fn helm(&self) -> Command {
        let mut command = Command::new(self.bin("helm"));
        let home = self.dir.join("helm");
        command
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()));
        command
    }

    fn stop(&mut self) {
        let mut processes = self.processes.lock().unwrap_or_else(|p| p.into_inner());
        for p in processes.iter_mut() {
            kill_group(p.child.id());
            let _ = p.child.wait();
            forget_pid(p.child.id());
        }
        processes.clear();
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
        if !keep_dir() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

struct StartFailure {
    message: String,
    port_clash: bool,
}

impl StartFailure {
    fn plain(message: String) -> Self {
        StartFailure {
            message,
            port_clash: false,
        }
    }
}

fn keep_dir() -> bool {
    std::env::var_os("NORSK_CP_KEEP").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Finds the directory with the control-plane binaries: `NORSK_CP_BIN`, else the last line
/// printed by the build script (which builds them on a cold cache: minutes, once).
fn locate_binaries() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("NORSK_CP_BIN") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/control-plane/build.sh");
            // The script's progress goes to our stderr: a cold build takes a while and
            // should not look like a hang.
            let output = Command::new("bash")
                .arg(&script)
                .stdin(Stdio::null())
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
            if !output.status.success() {
                return Err(format!(
                    "{} failed ({}); see its output above, or point NORSK_CP_BIN at a \
                     directory with etcd, kube-apiserver, kubectl and helm",
                    script.display(),
                    output.status
                ));
            }
            let stdout = String::from_utf8_lossy(&output.stdout);
            let last = stdout.lines().rev().find(|l| !l.trim().is_empty());
            PathBuf::from(last.ok_or("build script printed no bin directory")?.trim())
        }
    };
    for name in BINARIES {
        if !dir.join(name).is_file() {
            return Err(format!("{} has no {name}", dir.display()));
        }
    }
    Ok(dir)
}

/// A test binary killed with SIGKILL runs no exit hook: its processes die with it (see
/// below) but its working directory stays. The next run removes those whose owner is gone.
fn remove_abandoned_dirs() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let path = entry.path();
        let Some(pid) = fs::read_to_string(path.join(OWNER_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn run_with_stdin(mut command: Command, input: &str) -> io::Result<Output> {
    use std::io::Write as _;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().expect("piped stdin").write_all(input.as_bytes())?;
    child.wait_with_output()
}

/// Throwaway certificates: a CA, the API server's serving certificate, an admin client
/// certificate and the ServiceAccount token signing key, all ECDSA P-256.
struct Pki {
    ca_cert: String,
    serving_cert: String,
    serving_key: String,
    admin_cert: String,
    admin_key: String,
    sa_key: String,
    sa_pub: String,
}

impl Pki {
    fn generate() -> Result<Pki, rcgen::Error> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "norsk-test-ca");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

        let serving_key = KeyPair::generate()?;
        let mut serving = CertificateParams::new(vec![
            "127.0.0.1".to_owned(),
            "localhost".to_owned(),
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
        ])?;
        serving.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &ca)?;

        // The API server maps a client certificate's CN to the user and O to its groups;
        // system:masters bypasses authorisation, like a kubeadm admin.conf.
        let admin_key = KeyPair::generate()?;
        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin.distinguished_name.push(DnType::CommonName, "admin");
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &ca)?;

        let sa_key = KeyPair::generate()?;
        Ok(Pki {
            ca_cert: ca.pem(),
            serving_cert: serving_cert.pem(),
            serving_key: serving_key.serialize_pem(),
            admin_cert: admin_cert.pem(),
            admin_key: admin_key.serialize_pem(),
            sa_key: sa_key.serialize_pem(),
            sa_pub: sa_key.public_key_pem(),
        })
    }
}

// ---------------------------------------------------------------------------------------
// Child processes that cannot outlive the test binary.
//
// Each child gets its own process group (so one signal reaches anything it starts) and
// asks the kernel for SIGKILL when its parent goes away (PR_SET_PDEATHSIG). That "parent"
// is the thread that forked, not the process: were a test's thread to spawn the control
// plane, the processes would die when that test ends. So one thread, alive until the
// process exits, does all the spawning. A normal exit (tests passed or failed) also kills
// them explicitly from an atexit hook, which then removes the working directories.
// ---------------------------------------------------------------------------------------

struct SpawnRequest {
    command: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("control-plane-spawner".into())
            .spawn(move || {
                // The sender lives in a static, so this loop only ends with the process.
                for mut request in rx {
                    let _ = request.reply.send(request.command.spawn());
                }
            })
            .expect("spawn the control-plane spawner thread");
        // SAFETY: registering a plain extern "C" function with no captured state.
        unsafe {
            libc::atexit(kill_all_at_exit);
        }
        tx
    })
}

/// Pids (= process group ids) of the children still running, for the atexit hook.
static LIVE: Mutex<Vec<u32>> = Mutex::new(Vec::new());
/// Working directories of control planes never dropped (the shared ones), for the atexit hook.
static DIRS_AT_EXIT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn spawn_tied_to_process(mut command: Command, log: &Path) -> io::Result<Child> {
    let out = File::create(log)?;
    let err = out.try_clone()?;
    let parent = std::process::id();
    command.stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
    // SAFETY: the hook runs between fork and exec and only makes async-signal-safe calls.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect: then nobody would kill us.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let (reply, answer) = mpsc::channel();
    spawner()
        .send(SpawnRequest { command, reply })
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    let child = answer
        .recv()
        .map_err(|_| io::Error::other("spawner thread did not answer"))??;
    LIVE.lock().unwrap_or_else(|p| p.into_inner()).push(child.id());
    if let Some(dir) = log.parent() {
        let mut dirs = DIRS_AT_EXIT.lock().unwrap_or_else(|p| p.into_inner());
        if !dirs.iter().any(|d| d == dir) {
            dirs.push(dir.to_owned());
        }
    }
    Ok(child)
}

fn kill_group(pid: u32) {
    // SAFETY: kill(2) with a negative pid signals the process group the child leads.
    unsafe {
        libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
    }
}

fn forget_pid(pid: u32) {
    LIVE.lock().unwrap_or_else(|p| p.into_inner()).retain(|p| *p != pid);
}

extern "C" fn kill_all_at_exit() {
    // try_lock: never block process exit on a lock some other thread held when it ended.
    if let Ok(live) = LIVE.try_lock() {
        for pid in live.iter() {
            kill_group(*pid);
        }
        for pid in live.iter() {
            let mut status = 0;
            // SAFETY: reaping our own child; the pid came from Child::id().
            unsafe {
                libc::waitpid(*pid as libc::pid_t, &mut status, 0);
            }
        }
    }
    if !keep_dir()
        && let Ok(dirs) = DIRS_AT_EXIT.try_lock()
    {
        for dir in dirs.iter() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}
