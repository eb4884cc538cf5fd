//! The kube-runtime controllers: thin translators between custom resources
//! and the AutoManager core. They turn resources into commands on the
//! core's handle and the core's state into `status`; they decide nothing
//! about placement. What each owns:
//!
//! - [`bundle`]: `Bundle` -> create/update on Manager, the stop-then-delete
//!   finalizer, per replica and job status, conditions.
//! - [`pool`]: `PlacementPool` -> the core's pools, live; pool status.
//! - [`hot_spare`]: `HotSparePolicy` -> the core's hot-spare list, live;
//!   spare counts, `Stalled` for an unknown pool.
//! - [`node`]: `NorskNode` — the fleet mirrored into resources; cordon and
//!   spare edits handed to the core.
//! - [`drain`] / [`migration`]: `NodeDrain` and `JobMigration` -> drains
//!   and migrations on the core, followed by [`drain_follow`].
//! - [`notes`]: what the core's notifications say, as Events and as the
//!   status facts the core does not keep.
//! - [`resilience`]: a Bundle's `Resilient` condition, from the core's
//!   headroom report.
//! - [`conditions`]: `metav1.Condition` bookkeeping; [`status`]: writing
//!   status with server-side apply, only when it changed.
//! - [`leader`]: the `coordination.k8s.io` Lease; only the leader runs the
//!   core and the controllers.
//!
//! Errors: an invalid object waits for a change (its status says why); a
//! transient failure requeues with exponential backoff.

pub mod bundle;
pub mod bundle_status;
pub mod conditions;
pub mod drain;
pub mod drain_follow;
pub mod drain_status;
pub mod events;
pub mod hot_spare;
pub mod leader;
pub mod migration;
pub mod migration_status;
pub mod node;
pub mod node_status;
pub mod notes;
mod notification_log;
pub mod pool;
pub mod process;
pub mod resilience;
pub mod session;
pub mod standby;
pub mod status;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::controller::Action;
use kube::runtime::events::Event;
use tokio::sync::{mpsc, watch};

use crate::automanager::{AutoManagerHandle, CommandError, QueryError};
use crate::backoff::Backoff;
use crate::telemetry::OperatorMetrics;

use self::notes::Notes;

/// The name the operator reports Events and leases under.
pub const OPERATOR_NAME: &str = "norsk-auto-manager";
/// How many Events may wait to be published before new ones are dropped
/// (counted in `norsk_automanager_events_dropped_total`): Events explain,
/// they must never hold back the loop.
const EVENT_QUEUE: usize = 4096;
/// The first retry after a transient failure; doubled per failure.
const FIRST_RETRY: Duration = Duration::from_millis(250);
/// The longest wait between retries.
const MAX_RETRY: Duration = Duration::from_secs(300);

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The core could not be read.
    #[error("failed to read the AutoManager core: {0}")]
    ReadCore(#[from] QueryError),
    /// The core has not yet hydrated from Manager's snapshot.
    #[error("the AutoManager core has not hydrated from Manager yet")]
    NotHydrated,
    /// A command on the core (and Manager) failed for a reason that may pass.
    #[error("failed to {action} {object}: {source}")]
    Command {
        /// What was attempted.
        action: &'static str,
        /// The object.
        object: String,
        /// Why.
        source: CommandError,
    },
    /// The pools have not yet been handed to the core this term.
    #[error("waiting for the PlacementPools to be handed to the core")]
    PoolsNotSynced,
    /// Manager is still running the stop-then-delete saga.
    #[error("bundle {0} is still being deleted on Manager")]
    StillDeleting(String),
    /// The status write was refused.
    #[error("failed to write the status of {object}: {source}")]
    WriteStatus {
        /// The object.
        object: String,
        /// Why.
        source: kube::Error,
    },
    /// Adding or removing the finalizer failed.
    #[error("failed to run the finalizer of {object}: {message}")]
    Finalizer {
        /// The object.
        object: String,
        /// Why.
        message: String,
    },
}

impl ReconcileError {
    /// A stable, low-cardinality reason for metrics and Events.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::ReadCore(_) => "ReadCore",
            Self::NotHydrated => "NotHydrated",
            Self::PoolsNotSynced => "PoolsNotSynced",
            Self::Command { .. } => "ManagerCommand",
            Self::StillDeleting(_) => "StillDeleting",
            Self::WriteStatus { .. } => "WriteStatus",
            Self::Finalizer { .. } => "Finalizer",
        }
    }
}

/// `regarding` with the uid of the object it names, read from the API server when the
/// reference lacks it. `kubectl describe` lists only the Events whose `regarding.uid` is the
/// object's own, so an Event without one is invisible there. When the object cannot be read
/// (gone already, no access) the reference is kept as it is: `kubectl get events` still
/// shows the Event.
async fn with_uid(client: &Client, mut regarding: ObjectReference) -> ObjectReference {
    if regarding.uid.is_some() {
        return regarding;
    }
    let (Some(api_version), Some(kind), Some(name)) = (&regarding.api_version, &regarding.kind, &regarding.name) else {
        return regarding;
    };
    let (group, version) = match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version.as_str()),
    };
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let api: Api<DynamicObject> = match &regarding.namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    match api.get_metadata_opt(name).await {
        Ok(Some(object)) => regarding.uid = object.metadata.uid,
        Ok(None) => {}
        Err(e) => tracing::debug!(error = %e, %kind, %name, "cannot read the uid of an Event's object"),
    }
    regarding
}

/// What every controller shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// The core.
    pub core: AutoManagerHandle,
    /// Counters and gauges.
    pub metrics: Arc<OperatorMetrics>,
    notes: Mutex<Notes>,
    events: mpsc::Sender<(Event, ObjectReference)>,
    failures: Mutex<HashMap<String, Backoff>>,
    written: Mutex<HashMap<String, Written>>,
    /// Bumped whenever the pool controller changes the core's pools.
    pools: watch::Sender<u64>,
}

/// The last status a controller wrote to an object, and the
/// resourceVersion of the object it was computed from.
struct Written {
    based_on: Option<String>,
    status: serde_json::Value,
}

impl Context {
    /// A context; the returned task publishes queued Events until every
    /// sender is gone.
    pub fn new(
        client: Client,
        core: AutoManagerHandle,
        metrics: Arc<OperatorMetrics>,
        instance: Option<String>,
    ) -> (Arc<Self>, tokio::task::JoinHandle<()>) {
        let (events, mut queue) = mpsc::channel::<(Event, ObjectReference)>(EVENT_QUEUE);
        let mut recorder = events::Publisher::new(client.clone(), OPERATOR_NAME.to_owned(), instance);
        let lookup = client.clone();
        let publisher = tokio::spawn(async move {
            while let Some((event, regarding)) = queue.recv().await {
                let regarding = with_uid(&lookup, regarding).await;
                if let Err(e) = recorder.publish(&event, &regarding).await {
                    tracing::warn!(error = %e, reason = %event.reason, "failed to publish an Event");
                }
            }
        });
        let context = Arc::new(Self {
            client,
            core,
            metrics,
            notes: Mutex::new(Notes::default()),
            events,
            failures: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            pools: watch::Sender::new(0),
        });
        (context, publisher)
    }

    /// The pool controller handed the core a new set of pools (or found
    /// the set in force right for the first time).
    pub fn pools_applied(&self) {
        self.pools.send_modify(|generation| *generation += 1);
    }

    /// Whether the core has been given the pools at least once this term:
    /// until then a bundle naming a pool would be refused for nothing.
    pub fn pools_synced(&self) -> bool {
        *self.pools.borrow() > 0
    }

    /// Yields each time the pools change.
    pub fn pool_changes(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        use futures::StreamExt;
        tokio_stream::wrappers::WatchStream::from_changes(self.pools.subscribe()).map(|_| ())
    }

    /// The notification notes (a poisoned lock still holds usable notes:
    /// they are only ever replaced whole per job).
    pub fn notes(&self) -> MutexGuard<'_, Notes> {
        self.notes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues an Event on `regarding`.
    pub fn publish(&self, event: Event, regarding: ObjectReference) {
        if self.events.try_send((event, regarding)).is_err() {
            self.metrics.events_dropped.inc();
        }
    }

    fn written(&self) -> MutexGuard<'_, HashMap<String, Written>> {
        self.written.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The status `key` holds as far as `controller` knows. The watch cache
    /// may not yet show this controller's last write: while the object in
    /// hand is still the version that write was computed from, the written
    /// status is the current one (else every trigger arriving before the
    /// watch catches up would write the same status again).
    pub fn known_status<S: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        controller: &str,
        key: &str,
        resource_version: Option<&String>,
        cached: Option<S>,
    ) -> Option<S> {
        let written = self.written();
        match written.get(&format!("{controller}/{key}")) {
            Some(w) if w.based_on.as_ref() == resource_version => serde_json::from_value(w.status.clone()).ok(),
            _ => cached,
        }
    }

    /// Remembers that `controller` wrote `status` to `key`, computed from
    /// the object at `resource_version`.
    pub fn wrote(&self, controller: &str, key: &str, resource_version: Option<String>, status: &impl serde::Serialize) {
        if let Ok(status) = serde_json::to_value(status) {
            self.written().insert(
                format!("{controller}/{key}"),
                Written {
                    based_on: resource_version,
                    status,
                },
            );
        }
    }

    /// Forgets what was written to a deleted object.
    pub fn forget(&self, controller: &str, key: &str) {
        self.written().remove(&format!("{controller}/{key}"));
    }

    fn failures(&self) -> MutexGuard<'_, HashMap<String, Backoff>> {
        self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A reconcile of `key` succeeded: its backoff starts over.
    pub fn succeeded(&self, controller: &str, key: &str) {
        self.failures().remove(&format!("{controller}/{key}"));
    }

    /// A reconcile of `key` failed: requeue after the next delay of its
    /// backoff (doubling from `FIRST_RETRY` up to `MAX_RETRY`).
    pub fn failed(&self, controller: &str, key: &str, error: &ReconcileError) -> Action {
        self.metrics
            .reconcile_errors
            .get_or_create(&crate::telemetry::ErrorLabels {
                controller: controller.to_owned(),
                reason: error.reason().to_owned(),
            })
            .inc();
        let delay = self
            .failures()
            .entry(format!("{controller}/{key}"))
            .or_insert_with(|| Backoff::new(FIRST_RETRY, MAX_RETRY))
            .next_delay();
        if !matches!(
            error,
            ReconcileError::NotHydrated | ReconcileError::PoolsNotSynced | ReconcileError::StillDeleting(_)
        ) {
            tracing::warn!(controller, object = key, error = %error, retry_in = ?delay, "reconcile failed");
        }
        Action::requeue(delay)
    }

    /// Counts a reconcile and its duration.
    pub fn timed(&self, controller: &str, started: std::time::Instant) {
        let labels = crate::telemetry::ControllerLabels {
            controller: controller.to_owned(),
        };
        self.metrics.reconciles.get_or_create(&labels).inc();
        self.metrics
            .reconcile_duration
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
    }
}

/// Whether the store holds its kind's first full list.
pub(crate) fn listed<K>(store: &kube::runtime::reflector::Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    futures::FutureExt::now_or_never(store.wait_until_ready()).is_some()
}
