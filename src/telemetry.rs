//! The operator's telemetry: the Prometheus registry (prefix
//! `norsk_automanager_`, base units, `_total` counters, `_ratio` gauges for
//! fractions, low-cardinality labels — never a job or node id; plus the
//! standard `process_*` family), and the HTTP endpoints `/metrics`,
//! `/healthz` and `/readyz`. It owns no policy: controllers and the
//! notification follower count into it.
//!
//! `/metrics` negotiates its format like the Go client does: a scraper that
//! asks for `application/openmetrics-text` gets OpenMetrics 1.0; anything
//! else (a browser, `curl`, `promtool check metrics`) gets the Prometheus
//! text format 0.0.4, each with its own content type.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use std::sync::atomic::AtomicU64;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::automanager::metrics::Counters;
use crate::automanager::{Decision, Metrics as CoreMetrics, Notification};

/// Declares label sets: structs of `String` labels, each label named after
/// its field.
macro_rules! label_sets {
    ($($(#[$meta:meta])* $name:ident { $($(#[$label_meta:meta])* $label:ident),+ $(,)? })*) => {
        $(
            $(#[$meta])*
            #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
            pub struct $name {
                $($(#[$label_meta])* pub $label: String,)+
            }
        )*
    };
}

label_sets! {
    /// Labels naming a controller.
    ControllerLabels {
        /// `bundle`, `placementpool`, `hotsparepolicy`, `norsknode`.
        controller,
    }

    /// Labels of a failed reconcile.
    ErrorLabels {
        controller,
        /// The error's stable reason.
        reason,
    }

    /// Labels naming a notification kind (the seed callback without `on`).
    KindLabels {
        /// `placementDecision`, `jobUpdated`, `bundleBroken`, ...
        kind,
    }

    /// Labels of a placement outcome.
    ResultLabels {
        /// `placed`, `provision` or `noCapacity`.
        result,
    }

    /// Labels naming a drain's or migration's phase.
    PhaseLabels {
        /// The phase, as the spec names it (`migrating`, `stoppingSource`, ...).
        phase,
    }

    /// Labels of `manager_capability`.
    CapabilityLabels {
        /// The capability (`bundleStore`, `nodeTags`, ...).
        capability,
        /// `served` or `published`.
        mode,
    }

    /// Labels of `build_info`.
    BuildLabels {
        /// The crate version (`0.1.0`).
        version,
        /// The commit the binary was built from (`unknown` outside a checkout).
        revision,
    }

    /// Labels naming a pool.
    PoolLabels {
        pool,
    }

    /// Labels naming a pool and a kind of failure domain.
    HeadroomLabels {
        pool,
        /// `node`, `zone` or `provider`.
        kind,
    }

    /// Labels naming a pool, a kind of failure domain and its worst domain.
    WorstDomainLabels {
        pool,
        /// `node`, `zone` or `provider`.
        kind,
        /// The node id, zone or provider kind.
        domain,
    }
}

/// The version and commit the binary was built from, as `--version` prints
/// them: `0.1.0 (3f9c1e2a…)`.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("NORSK_REVISION"), ")");

/// The commit the binary was built from (`unknown` outside a checkout).
pub const REVISION: &str = env!("NORSK_REVISION");

/// Drains and migrations in flight, by what they are.
#[derive(Debug, Default)]
struct InFlight {
    drains: BTreeMap<String, String>,
    migrations: BTreeMap<String, String>,
}

/// Every metric the operator exports.
#[derive(Debug)]
pub struct OperatorMetrics {
    registry: Registry,
    /// Reconciles run, per controller.
    pub reconciles: Family<ControllerLabels, Counter>,
    /// Reconciles that failed, per controller and reason.
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    /// How long reconciles took, per controller.
    pub reconcile_duration: Family<ControllerLabels, Histogram>,
    /// Status writes, per controller (only when something changed).
    pub status_writes: Family<ControllerLabels, Counter>,
    /// Every notification of the core, per kind.
    pub notifications: Family<KindLabels, Counter>,
    /// Placement decisions by result.
    pub placements: Family<ResultLabels, Counter>,
    /// Placement runs (the core's `placementsAttempted`).
    pub placement_attempts: Counter,
    /// How placement runs ended (`placementsSucceeded`, `placementsFailed`,
    /// `placementsDispatchFailed`), by result.
    pub placement_results: Family<ResultLabels, Counter>,
    /// Worker rejections (`jobsRejected`).
    pub jobs_rejected: Counter,
    /// Bundles marked broken (`bundlesBroken`).
    pub bundle_breaks: Counter,
    /// Jobs dropped (`jobsDropped`).
    pub jobs_dropped: Counter,
    /// The core counters last carried over, with the start of the core
    /// they were read from.
    core_counters: Mutex<Option<(i64, Counters)>>,
    /// Events not published because the queue was full.
    pub events_dropped: Counter,
    /// Nodes per pool.
    pub pool_nodes: Family<PoolLabels, Gauge>,
    /// Live spares per pool.
    pub pool_live_spares: Family<PoolLabels, Gauge>,
    /// Reserved over usable capacity per pool, 0 to 1.
    pub pool_used_capacity_ratio: Family<PoolLabels, Gauge<f64, AtomicU64>>,
    /// `hotSpares[].targetCount` per pool (0 without a policy).
    pub pool_spare_target: Family<PoolLabels, Gauge>,
    /// 1 when the pool absorbs the loss of any single domain of the kind.
    pub headroom_absorbed: Family<HeadroomLabels, Gauge>,
    /// Domains of the kind whose loss the pool does not absorb.
    pub headroom_unabsorbed_domains: Family<HeadroomLabels, Gauge>,
    /// 1 for the worst domain of each pool and kind whose loss is not
    /// absorbed (one series per pool and kind at most).
    pub headroom_worst_domain: Family<WorstDomainLabels, Gauge>,
    /// Bundles currently broken (their production ended).
    pub bundles_broken: Gauge,
    /// Drains in flight, per phase.
    pub drains: Family<PhaseLabels, Gauge>,
    /// Drains ended, per final phase (`done`, `partial`, `failed`).
    pub drains_ended: Family<PhaseLabels, Counter>,
    /// Migrations in flight, per phase.
    pub migrations: Family<PhaseLabels, Gauge>,
    /// The phase of each drain (by node) and migration (by id) in flight,
    /// from which the two gauges are counted.
    in_flight: Mutex<InFlight>,
    /// 1 while the core's stream to Manager is up with its snapshot
    /// applied (a follower's standby core too).
    pub manager_connected: Gauge,
    /// 1 while this process leads.
    pub leader: Gauge,
    /// 1 for the way each capability beyond the published Manager API is
    /// carried out (`served` by Manager, or `published`: without it).
    pub manager_capability: Family<CapabilityLabels, Gauge>,
}

/// Registers each named metric of `$metrics` under its field's name, with
/// its help text, in the order given (the order `/metrics` lists them in).
macro_rules! register_fields {
    ($registry:ident, $metrics:ident { $($field:ident: $help:expr),* $(,)? }) => {
        $($registry.register(stringify!($field), $help, $metrics.$field.clone());)*
    };
}

/// Registers `build_info`: always 1, its labels naming the version and
/// commit the binary was built from.
fn register_build_info(registry: &mut Registry) {
    let build_info = Family::<BuildLabels, Gauge>::default();
    build_info
        .get_or_create(&BuildLabels {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            revision: REVISION.to_owned(),
        })
        .set(1);
    registry.register(
        "build_info",
        "Always 1; the labels name the version and commit the operator was built from",
        build_info,
    );
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl OperatorMetrics {
    /// A registry with every metric registered.
    pub fn new() -> Self {
        let mut root = Registry::default();
        root.register_collector(Box::new(ProcessCollector));
        let metrics = Self::unregistered();
        // The order of registration is the order `/metrics` lists them in.
        let registry = root.sub_registry_with_prefix("norsk_automanager");
        metrics.register_reconciles(registry);
        metrics.register_core(registry);
        metrics.register_pools(registry);
        register_build_info(registry);
        metrics.register_connection(registry);
        metrics.register_resources(registry);
        Self {
            registry: root,
            ..metrics
        }
    }

    /// Every metric at zero, none registered yet (the registry is empty).
    fn unregistered() -> Self {
        Self {
            registry: Registry::default(),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Family::new_with_constructor(
                (|| Histogram::new(exponential_buckets(0.001, 2.0, 14))) as fn() -> Histogram,
            ),
            status_writes: Family::default(),
            notifications: Family::default(),
            placements: Family::default(),
            placement_attempts: Counter::default(),
            placement_results: Family::default(),
            jobs_rejected: Counter::default(),
            bundle_breaks: Counter::default(),
            jobs_dropped: Counter::default(),
            core_counters: Mutex::default(),
            events_dropped: Counter::default(),
            pool_nodes: Family::default(),
            pool_live_spares: Family::default(),
            pool_used_capacity_ratio: Family::default(),
            pool_spare_target: Family::default(),
            headroom_absorbed: Family::default(),
            headroom_unabsorbed_domains: Family::default(),
            headroom_worst_domain: Family::default(),
            bundles_broken: Gauge::default(),
            drains: Family::default(),
            drains_ended: Family::default(),
            migrations: Family::default(),
            in_flight: Mutex::default(),
            manager_connected: Gauge::default(),
            leader: Gauge::default(),
            manager_capability: Family::default(),
        }
    }

    /// Registers what the controllers count of their reconciles.
    fn register_reconciles(&self, registry: &mut Registry) {
        register_fields!(
            registry,
            self {
                reconciles: "Reconciles run",
                reconcile_errors: "Reconciles that failed",
            }
        );
        registry.register_with_unit(
            "reconcile_duration",
            "How long reconciles took",
            Unit::Seconds,
            self.reconcile_duration.clone(),
        );
        registry.register(
            "status_writes",
            "Status writes (only when something changed)",
            self.status_writes.clone(),
        );
    }

    /// Registers what the core's notifications and counters count, and the
    /// Kubernetes Events not published.
    fn register_core(&self, registry: &mut Registry) {
        register_fields!(
            registry,
            self {
                notifications: "Notifications of the core, per kind",
                placements: "Placement decisions by result",
                placement_attempts: "Placement runs of the core",
                placement_results: "Placement runs by how they ended: succeeded (first wire call accepted), failed (nowhere found), dispatch_failed (first wire call refused)",
                jobs_rejected: "Jobs a worker rejected",
                bundle_breaks: "Bundles marked broken",
                jobs_dropped: "Jobs dropped",
                events_dropped: "Kubernetes Events not published (queue full)",
            }
        );
    }

    /// Registers the gauges of each pool: its nodes, its headroom, its
    /// spares and how full it is.
    fn register_pools(&self, registry: &mut Registry) {
        register_fields!(
            registry,
            self {
                pool_nodes: "Nodes of the pool not stopped",
                headroom_absorbed: "1 when the pool absorbs the loss of any single failure domain of the kind",
                headroom_unabsorbed_domains: "Failure domains of the kind whose loss the pool does not absorb",
                headroom_worst_domain: "1 for the failure domain of the kind whose loss does the pool the most harm",
                pool_live_spares: "Unconsumed hot spares of the pool",
                pool_used_capacity_ratio: "Reserved over usable capacity of the pool (0 to 1)",
            }
        );
    }

    /// Registers the gauges of this process's place: its stream to
    /// Manager, its leadership and how each capability is carried out.
    fn register_connection(&self, registry: &mut Registry) {
        register_fields!(
            registry,
            self {
                manager_connected: "1 while the core's stream to Manager is up with its snapshot applied (followers too)",
                leader: "1 while this process leads",
                manager_capability: "1 for how each capability beyond the published Manager API is carried out: served by Manager, or published (without the addition)",
            }
        );
    }

    /// Registers what the resources' controllers report: spares asked
    /// for, bundles broken, drains and migrations.
    fn register_resources(&self, registry: &mut Registry) {
        register_fields!(
            registry,
            self {
                pool_spare_target: "Hot spares the pool's HotSparePolicy asks for (0 without one)",
                bundles_broken: "Bundles whose production ended (broken until updated or deleted)",
                drains: "Drains in flight, per phase",
                drains_ended: "Drains ended, per final phase (done, partial, failed)",
                migrations: "Migrations in flight, per phase",
            }
        );
    }

    /// Counts one notification (every callback is countable by kind).
    pub fn count(&self, notification: &Notification) {
        let kind = serde_json::to_value(notification)
            .ok()
            .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_owned))
            .unwrap_or_default();
        self.notifications.get_or_create(&KindLabels { kind }).inc();
        match notification {
            Notification::PlacementDecision(info) => {
                let result = match info.decision {
                    Decision::Placed { .. } => "placed",
                    Decision::Provision { .. } => "provision",
                    Decision::NoCapacityInAnyPool => "noCapacity",
                };
                self.placements
                    .get_or_create(&ResultLabels {
                        result: result.to_owned(),
                    })
                    .inc();
            }
            Notification::DrainProgress(state) => {
                let phase = (!state.phase.is_final()).then(|| crate::model::wire_name(&state.phase));
                let was_in_flight = self.in_flight(|f| &mut f.drains, &self.drains, state.node_id.0.clone(), phase);
                // A final phase ends the drain once, however often it is repeated.
                if state.phase.is_final() && was_in_flight {
                    self.drains_ended
                        .get_or_create(&PhaseLabels {
                            phase: crate::model::wire_name(&state.phase),
                        })
                        .inc();
                }
            }
            Notification::MigrationPhase(state) => {
                let phase = state.is_in_flight().then(|| crate::model::wire_name(&state.phase));
                self.in_flight(
                    |f| &mut f.migrations,
                    &self.migrations,
                    state.migration_id.0.clone(),
                    phase,
                );
            }
            Notification::MigrationCompleted { migration_id, .. }
            | Notification::MigrationAborted { migration_id, .. } => {
                self.in_flight(|f| &mut f.migrations, &self.migrations, migration_id.0.clone(), None);
            }
            _ => {}
        }
    }

    /// Records `key` in `phase` (or ended, with `None`): the gauge of the
    /// phase it left goes down, the one it entered up. Whether `key` was in
    /// flight before.
    fn in_flight(
        &self,
        map: impl Fn(&mut InFlight) -> &mut BTreeMap<String, String>,
        gauge: &Family<PhaseLabels, Gauge>,
        key: String,
        phase: Option<String>,
    ) -> bool {
        let Ok(mut in_flight) = self.in_flight.lock() else {
            return false;
        };
        let held = map(&mut in_flight);
        let left = match phase {
            Some(phase) => {
                gauge.get_or_create(&PhaseLabels { phase: phase.clone() }).inc();
                held.insert(key, phase)
            }
            None => held.remove(&key),
        };
        let was = left.is_some();
        if let Some(phase) = left {
            gauge.get_or_create(&PhaseLabels { phase }).dec();
        }
        was
    }

    /// Sets the pool gauges and the broken-bundle count from the core's
    /// `metrics()`.
    pub fn pools(&self, metrics: &CoreMetrics) {
        self.bundles_broken
            .set(i64::try_from(metrics.broken_bundle_ids.len()).unwrap_or(i64::MAX));
        for pool in &metrics.pools {
            let labels = PoolLabels {
                pool: pool.pool_name.clone(),
            };
            self.pool_nodes.get_or_create(&labels).set(i64::from(pool.node_count));
            self.pool_live_spares
                .get_or_create(&labels)
                .set(i64::from(pool.live_spares));
            self.pool_spare_target
                .get_or_create(&labels)
                .set(i64::from(pool.spare_target));
            self.pool_used_capacity_ratio
                .get_or_create(&labels)
                .set(pool.used_capacity_fraction);
        }
        // Only the current worst domains: a domain that stopped being the
        // worst leaves no series behind.
        self.headroom_worst_domain.clear();
        for gauge in &metrics.headroom {
            let labels = HeadroomLabels {
                pool: gauge.pool_name.clone(),
                kind: gauge.kind.clone(),
            };
            self.headroom_absorbed
                .get_or_create(&labels)
                .set(i64::from(gauge.absorbed));
            self.headroom_unabsorbed_domains
                .get_or_create(&labels)
                .set(i64::from(gauge.unabsorbed_domains));
            if let Some(worst) = &gauge.worst {
                self.headroom_worst_domain
                    .get_or_create(&WorstDomainLabels {
                        pool: gauge.pool_name.clone(),
                        kind: gauge.kind.clone(),
                        domain: worst.clone(),
                    })
                    .set(1);
            }
        }
    }

    /// Carries the core's cumulative counters (`metrics()`) over to the
    /// operator's: each grows by what the core counted since the last
    /// reading. A core counts from zero from its start (a new session or
    /// term starts a new core), so a reading from another core than the
    /// last is counted whole, and the operator's counters never go back.
    pub fn core_counters(&self, metrics: &CoreMetrics) {
        let Ok(mut last) = self.core_counters.lock() else {
            return;
        };
        let now = &metrics.counters;
        let before = match last.as_ref() {
            Some((started_at, counters)) if *started_at == metrics.started_at => counters.clone(),
            _ => Counters::default(),
        };
        let grown = |now: u64, before: u64| now.saturating_sub(before);
        self.placement_attempts
            .inc_by(grown(now.placements_attempted, before.placements_attempted));
        for (result, now, before) in [
            ("succeeded", now.placements_succeeded, before.placements_succeeded),
            ("failed", now.placements_failed, before.placements_failed),
            (
                "dispatch_failed",
                now.placements_dispatch_failed,
                before.placements_dispatch_failed,
            ),
        ] {
            self.placement_results
                .get_or_create(&ResultLabels {
                    result: result.to_owned(),
                })
                .inc_by(grown(now, before));
        }
        self.jobs_rejected
            .inc_by(grown(now.jobs_rejected, before.jobs_rejected));
        self.bundle_breaks
            .inc_by(grown(now.bundles_broken, before.bundles_broken));
        self.jobs_dropped.inc_by(grown(now.jobs_dropped, before.jobs_dropped));
        *last = Some((metrics.started_at, now.clone()));
    }

    /// How many status writes `controller` made.
    pub fn status_writes_of(&self, controller: &str) -> u64 {
        self.status_writes
            .get_or_create(&ControllerLabels {
                controller: controller.to_owned(),
            })
            .get()
    }

    /// How many reconciles `controller` ran.
    pub fn reconciles_of(&self, controller: &str) -> u64 {
        self.reconciles
            .get_or_create(&ControllerLabels {
                controller: controller.to_owned(),
            })
            .get()
    }

    /// The OpenMetrics 1.0 text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The Prometheus text format 0.0.4 exposition.
    pub fn encode_prometheus_text(&self) -> String {
        prometheus_text(&self.encode())
    }
}

/// Rewrites an OpenMetrics exposition as Prometheus text format 0.0.4. The
/// two differ, for what this registry emits, in three ways: a counter's
/// family is named with its `_total` suffix in 0.0.4 (OpenMetrics names it
/// without), 0.0.4 has no `# UNIT` line and no `# EOF` terminator.
fn prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::BTreeSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let descriptor = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match descriptor {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(prefix);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                out.push(' ');
                out.push_str(tail);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The standard `process_*` metrics of this process, read from `/proc` on
/// each scrape (as the Go client's process collector reports them). A value
/// the platform does not offer is left out rather than reported as 0.
#[derive(Debug)]
struct ProcessCollector;

/// What `/proc/self/stat` and `/proc/self/status` say about this process.
#[derive(Debug, Default, PartialEq)]
struct ProcessStats {
    cpu_seconds: Option<f64>,
    start_time_seconds: Option<f64>,
    resident_bytes: Option<i64>,
    virtual_bytes: Option<i64>,
    threads: Option<i64>,
    open_fds: Option<i64>,
    max_fds: Option<i64>,
}

impl ProcessStats {
    fn read() -> Self {
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let ticks = (ticks > 0).then_some(ticks as f64);
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())
        });
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let mut stats = parse_proc(&stat, &status, ticks, boot);
        stats.open_fds = std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as i64);
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
            stats.max_fds = i64::try_from(limit.rlim_cur).ok();
        }
        stats
    }
}

/// Parses `/proc/<pid>/stat` (CPU ticks and start time after the command
/// name in parentheses, which may itself hold spaces) and the `VmRSS`,
/// `VmSize` and `Threads` lines of `/proc/<pid>/status`.
fn parse_proc(stat: &str, status: &str, ticks: Option<f64>, boot: Option<f64>) -> ProcessStats {
    // Fields after the command: state is field 3, utime 14, stime 15,
    // starttime 22 (1-based, proc(5)).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    let kib = |key: &str| {
        status.lines().find_map(|l| {
            let value = l.strip_prefix(key)?.trim().strip_suffix(" kB")?;
            value.trim().parse::<i64>().ok().map(|v| v * 1024)
        })
    };
    ProcessStats {
        cpu_seconds: ticks.and_then(|t| Some((field(14)? + field(15)?) / t)),
        start_time_seconds: ticks.and_then(|t| Some(boot? + field(22)? / t)),
        resident_bytes: kib("VmRSS:"),
        virtual_bytes: kib("VmSize:"),
        threads: status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:")?.trim().parse().ok()),
        open_fds: None,
        max_fds: None,
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = ProcessStats::read();
        if let Some(v) = stats.cpu_seconds {
            let counter = ConstCounter::new(v);
            let metric = encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds",
                Some(&Unit::Seconds),
                counter.metric_type(),
            )?;
            counter.encode(metric)?;
        }
        let gauges: [(&str, &str, Option<Unit>, Option<f64>); 6] = [
            (
                "process_start_time",
                "Start time of the process since the Unix epoch in seconds",
                Some(Unit::Seconds),
                stats.start_time_seconds,
            ),
            (
                "process_resident_memory",
                "Resident memory size in bytes",
                Some(Unit::Bytes),
                stats.resident_bytes.map(|v| v as f64),
            ),
            (
                "process_virtual_memory",
                "Virtual memory size in bytes",
                Some(Unit::Bytes),
                stats.virtual_bytes.map(|v| v as f64),
            ),
            (
                "process_threads",
                "Number of OS threads in the process",
                None,
                stats.threads.map(|v| v as f64),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                None,
                stats.open_fds.map(|v| v as f64),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                None,
                stats.max_fds.map(|v| v as f64),
            ),
        ];
        for (name, help, unit, value) in gauges {
            let Some(value) = value else { continue };
            let gauge = ConstGauge::new(value);
            let metric = encoder.encode_descriptor(name, help, unit.as_ref(), gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

/// What `/healthz` and `/readyz` answer from.
#[derive(Debug, Default)]
pub struct Health {
    /// The core holds Manager's snapshot (a follower's standby core too):
    /// this process can lead at once.
    pub hydrated: AtomicBool,
    /// The core's stream to Manager is up.
    pub connected: AtomicBool,
    /// This process holds the Lease.
    pub leading: AtomicBool,
}

impl Health {
    /// Ready: hydrated and, when leading, connected to Manager.
    pub fn is_ready(&self) -> bool {
        let leading = self.leading.load(Ordering::Relaxed);
        self.hydrated.load(Ordering::Relaxed) && (!leading || self.connected.load(Ordering::Relaxed))
    }
}

type Shared = (Arc<OperatorMetrics>, Arc<Health>);

/// The content type of an OpenMetrics 1.0 text exposition.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of a Prometheus text format 0.0.4 exposition.
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

async fn metrics((metrics, _): Shared, headers: HeaderMap) -> impl IntoResponse {
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if openmetrics {
        ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], metrics.encode())
    } else {
        (
            [(header::CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE)],
            metrics.encode_prometheus_text(),
        )
    }
}

async fn ready((_, health): Shared) -> StatusCode {
    if health.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the
/// task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics_: Arc<OperatorMetrics>,
    health: Arc<Health>,
) -> std::io::Result<()> {
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(s): State<Shared>, headers: HeaderMap| metrics(s, headers)),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|State(s): State<Shared>| ready(s)))
        .with_state((metrics_, health));
    axum::serve(listener, app).await
}

/// Binds the telemetry address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Whether a flag is set (shared with the health endpoints).
pub fn set(flag: &AtomicBool, value: bool) {
    flag.store(value, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: operator\r\nConnection: close\r\n\r\n");
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        socket.read_to_string(&mut answer).await.unwrap();
        answer
    }

    fn core_metrics(started_at: i64, succeeded: u64) -> CoreMetrics {
        CoreMetrics {
            started_at,
            uptime_ms: 0,
            counters: Counters {
                placements_attempted: succeeded + 1,
                placements_succeeded: succeeded,
                placements_failed: 1,
                ..Counters::default()
            },
            pools: Vec::new(),
            broken_bundle_ids: Vec::new(),
            headroom: Vec::new(),
        }
    }

    #[test]
    fn the_core_counters_only_grow_across_readings_and_a_new_core() {
        let metrics = OperatorMetrics::new();
        let succeeded = |m: &OperatorMetrics| {
            m.placement_results
                .get_or_create(&ResultLabels {
                    result: "succeeded".to_owned(),
                })
                .get()
        };
        metrics.core_counters(&core_metrics(1, 2));
        metrics.core_counters(&core_metrics(1, 2));
        assert_eq!((succeeded(&metrics), metrics.placement_attempts.get()), (2, 3));
        metrics.core_counters(&core_metrics(1, 5));
        assert_eq!(succeeded(&metrics), 5);
        // The next term's core counts from zero: what it counted is added.
        metrics.core_counters(&core_metrics(9, 1));
        assert_eq!((succeeded(&metrics), metrics.placement_attempts.get()), (6, 8));
        let text = metrics.encode_prometheus_text();
        assert!(
            text.contains("norsk_automanager_placement_results_total{result=\"succeeded\"} 6"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn metrics_health_and_readiness_are_served() {
        let metrics = Arc::new(OperatorMetrics::new());
        metrics.count(&Notification::BundleBroken {
            bundle_id: crate::model::BundleId("ns/ch1".into()),
            reason: "crash loop".into(),
        });
        metrics.manager_connected.set(1);
        let health = Arc::new(Health::default());
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, metrics.clone(), health.clone()));

        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(
            get(addr, "/readyz").await.starts_with("HTTP/1.1 503"),
            "not ready before hydration"
        );
        set(&health.hydrated, true);
        assert!(
            get(addr, "/readyz").await.starts_with("HTTP/1.1 200"),
            "a hydrated follower is ready"
        );
        set(&health.leading, true);
        assert!(
            get(addr, "/readyz").await.starts_with("HTTP/1.1 503"),
            "a leader without Manager is not ready"
        );
        set(&health.connected, true);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        let text = get(addr, "/metrics").await;
        assert!(
            text.contains("norsk_automanager_notifications_total{kind=\"bundleBroken\"} 1"),
            "{text}"
        );
        assert!(text.contains("norsk_automanager_manager_connected 1"), "{text}");
        server.abort();
    }

    async fn get_accepting(addr: SocketAddr, accept: &str) -> String {
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request =
            format!("GET /metrics HTTP/1.1\r\nHost: operator\r\nAccept: {accept}\r\nConnection: close\r\n\r\n");
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        socket.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn metrics_are_openmetrics_when_asked_for_and_prometheus_text_otherwise() {
        let metrics = Arc::new(OperatorMetrics::new());
        metrics
            .reconciles
            .get_or_create(&ControllerLabels {
                controller: "bundle".into(),
            })
            .inc();
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, metrics, Arc::new(Health::default())));

        // What Prometheus sends when it prefers OpenMetrics.
        let om = get_accepting(
            addr,
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        )
        .await;
        let (head, body) = om.split_once("\r\n\r\n").unwrap();
        assert!(
            head.to_lowercase()
                .contains("content-type: application/openmetrics-text; version=1.0.0; charset=utf-8"),
            "{head}"
        );
        assert!(body.contains("# TYPE norsk_automanager_reconciles counter"), "{body}");
        assert!(body.trim_end().ends_with("# EOF"), "{body}");

        let text = get_accepting(addr, "*/*").await;
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.to_lowercase()
                .contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        assert!(body.contains("# HELP norsk_automanager_reconciles_total "), "{body}");
        assert!(
            body.contains("# TYPE norsk_automanager_reconciles_total counter"),
            "{body}"
        );
        assert!(
            body.contains("norsk_automanager_reconciles_total{controller=\"bundle\"} 1"),
            "{body}"
        );
        assert!(!body.contains("# EOF") && !body.contains("# UNIT"), "{body}");
        assert!(body.contains("norsk_automanager_build_info{version=\""), "{body}");
        assert!(body.contains("process_resident_memory_bytes "), "{body}");
        server.abort();
    }

    #[test]
    fn prometheus_text_names_counter_families_with_their_suffix_and_drops_unit_and_eof() {
        let om = "# HELP x_reconcile_duration_seconds How long.\n# TYPE x_reconcile_duration_seconds histogram\n# UNIT x_reconcile_duration_seconds seconds\nx_reconcile_duration_seconds_sum 0.0\n# HELP x_runs Runs.\n# TYPE x_runs counter\nx_runs_total 3\n# HELP x_up Up.\n# TYPE x_up gauge\nx_up 1\n# EOF\n";
        assert_eq!(
            prometheus_text(om),
            "# HELP x_reconcile_duration_seconds How long.\n# TYPE x_reconcile_duration_seconds histogram\nx_reconcile_duration_seconds_sum 0.0\n# HELP x_runs_total Runs.\n# TYPE x_runs_total counter\nx_runs_total 3\n# HELP x_up Up.\n# TYPE x_up gauge\nx_up 1\n"
        );
    }

    #[test]
    fn process_figures_are_read_from_proc_even_with_spaces_in_the_command() {
        let stat = "4242 (norsk auto) S 1 4242 4242 0 -1 4194560 1 0 0 0 250 50 0 0 20 0 12 0 1000 123456 789";
        let status = "Name:\tnorsk\nVmSize:\t  20480 kB\nVmRSS:\t   1024 kB\nThreads:\t12\n";
        let stats = parse_proc(stat, status, Some(100.0), Some(1_700_000_000.0));
        assert_eq!(stats.cpu_seconds, Some(3.0));
        assert_eq!(stats.start_time_seconds, Some(1_700_000_010.0));
        assert_eq!(stats.resident_bytes, Some(1024 * 1024));
        assert_eq!(stats.virtual_bytes, Some(20480 * 1024));
        assert_eq!(stats.threads, Some(12));
        assert_eq!(parse_proc("", "", None, None), ProcessStats::default());
    }

    fn drain(node: &str, phase: &str) -> Notification {
        Notification::DrainProgress(Box::new(
            serde_json::from_value(serde_json::json!({
                "nodeId": node, "phase": phase, "started": 0, "timeoutMs": 600000, "force": false, "jobs": [],
            }))
            .unwrap(),
        ))
    }

    fn migration(id: &str, phase: &str) -> Notification {
        Notification::MigrationPhase(Box::new(
            serde_json::from_value(serde_json::json!({
                "migrationId": id, "jobId": "ns/ch1/0/encode", "strategy": "overlap", "phase": phase,
                "transitions": [], "sourceNodeId": "a", "sourceKey": "primary", "targetNodeId": "b",
                "targetKey": format!("primary@{id}"), "pastPointOfNoReturn": false,
            }))
            .unwrap(),
        ))
    }

    #[test]
    fn drains_and_migrations_in_flight_are_counted_by_phase() {
        let metrics = OperatorMetrics::new();
        metrics.count(&drain("a", "migrating"));
        metrics.count(&drain("b", "migrating"));
        metrics.count(&migration("3f9c1e2a", "starting"));
        let text = metrics.encode();
        assert!(
            text.contains("norsk_automanager_drains{phase=\"migrating\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("norsk_automanager_migrations{phase=\"starting\"} 1"),
            "{text}"
        );
        metrics.count(&drain("a", "done"));
        metrics.count(&drain("b", "terminating"));
        metrics.count(&Notification::MigrationCompleted {
            migration_id: crate::automanager::MigrationId("3f9c1e2a".into()),
            job_id: crate::model::JobId("ns/ch1/0/encode".into()),
        });
        let text = metrics.encode();
        assert!(
            text.contains("norsk_automanager_drains{phase=\"migrating\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("norsk_automanager_drains{phase=\"terminating\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("norsk_automanager_migrations{phase=\"starting\"} 0"),
            "{text}"
        );
        assert!(
            !text.contains("norsk_automanager_drains{phase=\"done\"}"),
            "an ended drain is not in flight: {text}"
        );
        metrics.count(&drain("a", "done"));
        let text = metrics.encode();
        assert!(
            text.contains("norsk_automanager_drains_ended_total{phase=\"done\"} 1"),
            "a repeated final phase ends the drain once: {text}"
        );
    }
}
