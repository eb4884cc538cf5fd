//! The operator's telemetry: the Prometheus registry (prefix
//! `norsk_automanager_`, base units, `_total` counters, low-cardinality
//! labels — never a job or node id), and the HTTP endpoints `/metrics`,
//! `/healthz` and `/readyz`. It owns no policy: controllers and the
//! notification follower count into it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::automanager::{Decision, Metrics as CoreMetrics, Notification};

/// Labels naming a controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `bundle`, `placementpool`, `hotsparepolicy`, `norsknode`.
    pub controller: String,
}

/// Labels of a failed reconcile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The controller.
    pub controller: String,
    /// The error's stable reason.
    pub reason: String,
}

/// Labels naming a notification kind (the seed callback without `on`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `placementDecision`, `jobUpdated`, `bundleBroken`, ...
    pub kind: String,
}

/// Labels of a placement outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `placed`, `provision` or `noCapacity`.
    pub result: String,
}

/// Labels naming a drain's or migration's phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// The phase, as the spec names it (`migrating`, `stoppingSource`, ...).
    pub phase: String,
}

/// Labels naming a pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// The pool.
    pub pool: String,
}

/// Drains and migrations in flight, by what they are.
#[derive(Debug, Default)]
struct InFlight {
    drains: BTreeMap<String, String>,
    migrations: BTreeMap<String, String>,
}

/// The spec's name of a phase (its JSON form).
fn phase_name(phase: impl serde::Serialize) -> String {
    serde_json::to_value(phase)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
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
    /// Events not published because the queue was full.
    pub events_dropped: Counter,
    /// Nodes per pool.
    pub pool_nodes: Family<PoolLabels, Gauge>,
    /// Live spares per pool.
    pub pool_live_spares: Family<PoolLabels, Gauge>,
    /// Used capacity fraction per pool, in thousandths.
    pub pool_used_capacity_permille: Family<PoolLabels, Gauge>,
    /// Drains in flight, per phase.
    pub drains: Family<PhaseLabels, Gauge>,
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
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl OperatorMetrics {
    /// A registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("norsk_automanager");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let reconcile_duration = Family::<ControllerLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.001, 2.0, 14))) as fn() -> Histogram,
        );
        let status_writes = Family::<ControllerLabels, Counter>::default();
        let notifications = Family::<KindLabels, Counter>::default();
        let placements = Family::<ResultLabels, Counter>::default();
        let events_dropped = Counter::default();
        let pool_nodes = Family::<PoolLabels, Gauge>::default();
        let pool_live_spares = Family::<PoolLabels, Gauge>::default();
        let pool_used_capacity_permille = Family::<PoolLabels, Gauge>::default();
        let manager_connected = Gauge::default();
        let leader = Gauge::default();
        let drains = Family::<PhaseLabels, Gauge>::default();
        let migrations = Family::<PhaseLabels, Gauge>::default();
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        registry.register("reconcile_errors", "Reconciles that failed", reconcile_errors.clone());
        registry.register_with_unit(
            "reconcile_duration",
            "How long reconciles took",
            prometheus_client::registry::Unit::Seconds,
            reconcile_duration.clone(),
        );
        registry.register(
            "status_writes",
            "Status writes (only when something changed)",
            status_writes.clone(),
        );
        registry.register(
            "notifications",
            "Notifications of the core, per kind",
            notifications.clone(),
        );
        registry.register("placements", "Placement decisions by result", placements.clone());
        registry.register(
            "events_dropped",
            "Kubernetes Events not published (queue full)",
            events_dropped.clone(),
        );
        registry.register("pool_nodes", "Nodes of the pool not stopped", pool_nodes.clone());
        registry.register(
            "pool_live_spares",
            "Unconsumed hot spares of the pool",
            pool_live_spares.clone(),
        );
        registry.register(
            "pool_used_capacity_permille",
            "Reserved over usable capacity of the pool, in thousandths",
            pool_used_capacity_permille.clone(),
        );
        registry.register(
            "manager_connected",
            "1 while the core's stream to Manager is up with its snapshot applied (followers too)",
            manager_connected.clone(),
        );
        registry.register("leader", "1 while this process leads", leader.clone());
        registry.register("drains", "Drains in flight, per phase", drains.clone());
        registry.register("migrations", "Migrations in flight, per phase", migrations.clone());
        Self {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            status_writes,
            notifications,
            placements,
            events_dropped,
            pool_nodes,
            pool_live_spares,
            pool_used_capacity_permille,
            drains,
            migrations,
            in_flight: Mutex::default(),
            manager_connected,
            leader,
        }
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
                let phase = (!state.phase.is_final()).then(|| phase_name(state.phase));
                self.in_flight(|f| &mut f.drains, &self.drains, state.node_id.0.clone(), phase);
            }
            Notification::MigrationPhase(state) => {
                let phase = state.is_in_flight().then(|| phase_name(state.phase));
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
    /// phase it left goes down, the one it entered up.
    fn in_flight(
        &self,
        map: impl Fn(&mut InFlight) -> &mut BTreeMap<String, String>,
        gauge: &Family<PhaseLabels, Gauge>,
        key: String,
        phase: Option<String>,
    ) {
        let Ok(mut in_flight) = self.in_flight.lock() else {
            return;
        };
        let held = map(&mut in_flight);
        let left = match phase {
            Some(phase) => {
                gauge.get_or_create(&PhaseLabels { phase: phase.clone() }).inc();
                held.insert(key, phase)
            }
            None => held.remove(&key),
        };
        if let Some(phase) = left {
            gauge.get_or_create(&PhaseLabels { phase }).dec();
        }
    }

    /// Sets the pool gauges from the core's `metrics()`.
    pub fn pools(&self, metrics: &CoreMetrics) {
        for pool in &metrics.pools {
            let labels = PoolLabels {
                pool: pool.pool_name.clone(),
            };
            self.pool_nodes.get_or_create(&labels).set(i64::from(pool.node_count));
            self.pool_live_spares
                .get_or_create(&labels)
                .set(i64::from(pool.live_spares));
            self.pool_used_capacity_permille
                .get_or_create(&labels)
                .set((pool.used_capacity_fraction * 1000.0).round() as i64);
        }
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

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
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
    /// Ready: hydrated and, when leading, connected.
    pub fn is_ready(&self) -> bool {
        self.hydrated.load(Ordering::Relaxed)
            && (self.connected.load(Ordering::Relaxed) || !self.leading.load(Ordering::Relaxed))
    }
}

type Shared = (Arc<OperatorMetrics>, Arc<Health>);

async fn metrics((metrics, _): Shared) -> String {
    metrics.encode()
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
        .route("/metrics", get(|State(s): State<Shared>| metrics(s)))
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
            !text.contains("phase=\"done\""),
            "an ended drain is not in flight: {text}"
        );
    }
}
