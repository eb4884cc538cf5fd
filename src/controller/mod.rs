//! The kube-runtime controllers: thin translators between custom resources
//! and the AutoManager core. They turn resources into commands on the
//! core's handle and the core's read model ([`crate::automanager::ReadModel`])
//! into `status`; they decide nothing about placement and never see the
//! core's records. What a document change means, how a refusal is
//! classified and what a status reads are [`crate::decide`]'s, shared with
//! `standalone` and the plugin; the controllers carry them out. What each
//! owns:
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
//! - [`status`]: one writer of every kind's status (server-side apply,
//!   only when it changed); [`error`]: why a reconcile failed, per step.
//! - [`manager_status`]: writes the ConfigMap that tells people (and
//!   `kubectl norsk manager`) which Manager the leader drives, how it is
//!   connected and how each capability beyond the published API is carried
//!   out.
//! - [`leader`]: the `coordination.k8s.io` Lease; only the leader runs the
//!   core and the controllers; [`lease`]: what a Lease record means — who
//!   holds it, when a holder stops acting, when another may take over.
//! - [`api_server`]: how every watch retries when the API server fails it,
//!   and the client that says an outage once, not per request.
//!
//! Errors: an invalid object waits for a change (its status says why); a
//! transient failure requeues with jittered exponential backoff, counted
//! under the step that failed (see [`error`]).

pub mod api_server;
pub mod bundle;
pub mod drain;
mod drain_at_once;
pub mod drain_follow;
pub mod error;
pub mod events;
pub mod hot_spare;
mod hot_spare_events;
pub mod leader;
pub mod lease;
pub mod manager_status;
pub mod migration;
pub mod node;
mod notification_log;
pub mod pool;
pub mod process;
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

use crate::automanager::AutoManagerHandle;
use crate::backoff::Backoff;
use crate::telemetry::OperatorMetrics;

pub use self::error::ReconcileError;
use crate::decide::notes::Notes;

/// How many Events may wait to be published before new ones are dropped
/// (counted in `norsk_automanager_events_dropped_total`): Events explain,
/// they must never hold back the loop.
const EVENT_QUEUE: usize = 4096;
/// The first retry after a transient failure; doubled per failure.
const FIRST_RETRY: Duration = Duration::from_millis(250);
/// The longest wait between retries.
const MAX_RETRY: Duration = Duration::from_secs(300);

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
    pub core: AutoManagerHandle,
    /// Counters and gauges.
    pub metrics: Arc<OperatorMetrics>,
    notes: Mutex<Notes>,
    events: mpsc::Sender<(Event, ObjectReference)>,
    failures: Mutex<HashMap<String, Backoff>>,
    /// What each controller last wrote to each object (see
    /// [`status::StatusWriter`]).
    written: status::Memory,
    /// Bumped whenever the pool controller changes the core's pools.
    pools: watch::Sender<u64>,
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
        let mut recorder = events::Publisher::new(client.clone(), crate::decide::OPERATOR_NAME.to_owned(), instance);
        let lookup = client.clone();
        let publisher = tokio::spawn(async move {
            while let Some((event, regarding)) = queue.recv().await {
                let regarding = with_uid(&lookup, regarding).await;
                if let Err(e) = recorder.publish(&event, &regarding).await {
                    if api_server::unreachable(&e) {
                        tracing::debug!(error = %e, reason = %event.reason, "failed to publish an Event");
                    } else {
                        tracing::warn!(error = %e, reason = %event.reason, "failed to publish an Event");
                    }
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
            written: status::Memory::default(),
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

    fn failures(&self) -> MutexGuard<'_, HashMap<String, Backoff>> {
        self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A reconcile of `key` succeeded: its backoff starts over.
    pub fn succeeded(&self, controller: &str, key: &str) {
        self.failures().remove(&format!("{controller}/{key}"));
    }

    /// A reconcile of `key` failed: requeue after the next delay of its
    /// backoff (doubling from `FIRST_RETRY` up to `MAX_RETRY`, jittered: the
    /// objects one API server outage failed together retry apart).
    pub fn failed(&self, controller: &str, key: &str, error: &ReconcileError) -> Action {
        Action::requeue(self.retry_after(controller, key, error))
    }

    /// A failure of `key` outside a kube-runtime controller (a task that
    /// retries by itself): counted and said as [`failed`](Self::failed)
    /// does, and the delay before the retry, from the same backoff.
    pub fn retry_after(&self, controller: &str, key: &str, error: &ReconcileError) -> Duration {
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
            .or_insert_with(|| Backoff::new(FIRST_RETRY, MAX_RETRY).with_jitter(crate::backoff::seed()))
            .next_delay();
        // A reconcile that only waits, or failed for an API server outage the
        // client has said already, is not worth a warning each retry.
        if error.is_waiting() || api_server::unreachable(error) {
            tracing::debug!(controller, object = key, error = %error, retry_in = ?delay, "reconcile failed");
        } else {
            tracing::warn!(controller, object = key, error = %error, retry_in = ?delay, "reconcile failed");
        }
        delay
    }

    /// Runs one reconcile of `key` and counts it as every controller
    /// does: `reconciles_total` and the duration whatever the outcome (a
    /// failure, an early return and a success are each one reconcile; the
    /// failures are also in `reconcile_errors_total`, counted by the error
    /// policy), and the key's backoff started over after a success.
    pub async fn reconciling<T>(
        &self,
        controller: &str,
        key: &str,
        reconcile: impl Future<Output = Result<T, ReconcileError>>,
    ) -> Result<T, ReconcileError> {
        let started = std::time::Instant::now();
        let result = reconcile.await;
        self.timed(controller, started);
        if result.is_ok() {
            self.succeeded(controller, key);
        }
        result
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

/// Yields once the core's views may have changed (a new revision, see
/// [`crate::automanager::ReadModel`]), at most once per `every`: a busy core
/// takes a step per event, and a status recomputed per step would be work
/// thrown away. The last change of a burst is never missed: a change during
/// the pause is yielded right after it.
pub(crate) fn core_changes(
    core: &AutoManagerHandle,
    every: Duration,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold((core.changes(), false), move |(mut changes, paused)| async move {
        if paused {
            tokio::time::sleep(every).await;
        }
        changes.changed().await.ok()?;
        Some(((), (changes, true)))
    })
}

/// Whether the store holds its kind's first full list.
pub(crate) fn listed<K>(store: &kube::runtime::reflector::Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    futures::FutureExt::now_or_never(store.wait_until_ready()).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::automanager::{AutoManager, AutoSettings, RunOptions};
    use crate::controller::error::DecideError;
    use crate::manager::client::ClientSettings;

    /// `reconciles_total` means the same for every controller: each run is
    /// one reconcile, whether it succeeds, returns early or fails, and only
    /// a success starts the key's backoff over.
    #[tokio::test]
    async fn every_reconcile_is_counted_once_whatever_its_outcome() {
        // Nothing is reached: the client and the core connect lazily.
        let url = "http://127.0.0.1:9";
        let client = Client::try_from(kube::Config::new(url.parse().unwrap())).expect("client");
        let (core, core_task) = AutoManager::standby_with_client(
            AutoSettings {
                url: url.to_owned(),
                ..AutoSettings::default()
            },
            RunOptions::default(),
            ClientSettings::plaintext(url.to_owned()),
        )
        .expect("core");
        let metrics = Arc::new(OperatorMetrics::new());
        let (ctx, publisher) = Context::new(client, core.clone(), metrics.clone(), None);
        let done = ctx.reconciling("c", "k", async { Ok::<_, ReconcileError>(()) }).await;
        assert!(done.is_ok());
        let failed = ctx
            .reconciling("c", "k", async { Err::<(), _>(DecideError::NotHydrated.into()) })
            .await;
        let error = failed.expect_err("the failure is returned");
        assert_eq!(metrics.reconciles_of("c"), 2, "a failure is a reconcile too");
        // The error policy counts the failure and backs off.
        for _ in 0..2 {
            ctx.retry_after("c", "k", &error);
        }
        assert!(
            ctx.retry_after("c", "k", &error) > FIRST_RETRY,
            "the backoff grows while the key fails"
        );
        ctx.reconciling("c", "k", async { Ok::<_, ReconcileError>(()) })
            .await
            .expect("ok");
        assert_eq!(metrics.reconciles_of("c"), 3);
        assert!(
            ctx.retry_after("c", "k", &error) <= FIRST_RETRY,
            "a success starts the backoff over"
        );
        core.close().await;
        let _ = core_task.await;
        publisher.abort();
    }
}
