//! The `PlacementPool` controller. A sync task hands every valid
//! `PlacementPool` to the core as one set, live (no reconnect), after every
//! pool event (deletes included); a pool that does not validate is left out
//! and its status says why (`Stalled`), so one bad pool never blocks the
//! others. The controller writes each pool's status: nodes per tier,
//! prospective nodes, used capacity, live spares — from the core's read
//! model, the computation the pool gauges come from, recomputed when the
//! core's views change (at most once a second) and on fleet notifications.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::automanager::CommandError;
use crate::crd::PlacementPool;
use crate::model;

use super::api_server::{controller, reflect};
use super::status::StatusWriter;
use super::{Context, ReconcileError, listed};
use crate::decide::pool::{observe_pool, pool_conditions};
use crate::decide::{self, conditions};

/// The pool controller's name (metrics label, field manager suffix).
pub const POOL_CONTROLLER: &str = "placementpool";
/// Gauges are refreshed at least this often without a change.
const RESYNC: Duration = Duration::from_secs(60);
/// The most often a change of the core's views recomputes every pool.
const FOLLOW: Duration = Duration::from_secs(1);

/// What the controller shares with the sync task.
pub struct PoolContext {
    shared: Arc<Context>,
    pools: Store<PlacementPool>,
    /// Why the core last refused the whole set, if it did.
    refused: Mutex<Option<String>>,
}

/// Runs the sync task and the `PlacementPool` controller until `shutdown`
/// resolves; every pool's status is recomputed when `fleet_changed` yields.
pub async fn run_pools(
    ctx: Arc<Context>,
    fleet_changed: impl Stream<Item = ()> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<PlacementPool> = Api::all(ctx.client.clone());
    // Every watch event, deletes and the end of the initial list included
    // (so no pools at all is a set too). The watch backs off after a
    // failure: without it, it retried at once, forever, and an API server
    // outage spun a core.
    let (pools, pool_events) = reflect(api.clone(), watcher::Config::default());
    let pool_events = pool_events.filter_map(|e| async move {
        // Failures are retried by the watch; the API server's outage is said
        // by the client (see `api_server`).
        e.map_err(|e| tracing::debug!(error = %e, "watching placement pools"))
            .ok()
            .map(|_| ())
    });
    let pools_ctx = Arc::new(PoolContext {
        shared: ctx.clone(),
        pools,
        refused: Mutex::new(None),
    });
    let (wake_tx, wake_rx) = tokio::sync::mpsc::channel::<()>(1);
    let sync = sync(pools_ctx.clone(), pool_events, wake_tx);
    let controller = controller(api, watcher::Config::default(), Duration::from_millis(200))
        .reconcile_all_on(futures::stream::select_all([
            fleet_changed.boxed(),
            tokio_stream::wrappers::ReceiverStream::new(wake_rx).boxed(),
            super::core_changes(&ctx.core, FOLLOW).boxed(),
        ]))
        .graceful_shutdown_on(shutdown)
        .run(reconcile_pool, pool_error_policy, pools_ctx)
        .for_each(|_| async {});
    // The sync task ends with the controller (its stream never ends).
    tokio::select! {
        () = controller => {}
        () = sync => {}
    }
}

/// Hands the core the valid pools after every pool event; wakes the
/// controller to write what came of it.
async fn sync(ctx: Arc<PoolContext>, events: impl Stream<Item = ()>, wake: tokio::sync::mpsc::Sender<()>) {
    let mut events = std::pin::pin!(events);
    while events.next().await.is_some() {
        // Before the first full list the store is empty (or stale): the
        // set it gives would take every pool from the core.
        if !listed(&ctx.pools) {
            continue;
        }
        let shared = &ctx.shared;
        let (valid, _) = valid_pools(&ctx.pools);
        let Ok(in_force) = shared.core.read(|core| core.settings().placement_pools.clone()).await else {
            return;
        };
        let refusal = if in_force == valid {
            if !shared.pools_synced() {
                shared.pools_applied();
            }
            None
        } else {
            match shared.core.set_placement_pools(valid).await {
                Ok(()) => {
                    shared.pools_applied();
                    None
                }
                Err(CommandError::InvalidSettings { errors }) => {
                    // The pools are valid one by one; what the whole set
                    // fails on (a hot-spare policy naming a pool being
                    // removed, ...) is reported on every pool.
                    Some(errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
                }
                Err(CommandError::Closed) => return,
                Err(e) => Some(e.to_string()),
            }
        };
        *ctx.refused.lock().unwrap_or_else(PoisonError::into_inner) = refusal;
        // A full channel already holds the wake-up.
        let _ = wake.try_send(());
    }
}

fn pool_error_policy(pool: Arc<PlacementPool>, error: &ReconcileError, ctx: Arc<PoolContext>) -> Action {
    ctx.shared.failed(POOL_CONTROLLER, &pool.name_any(), error)
}

/// The pools handed to the core, and why a pool is left out of the set,
/// per pool name: [`decide::pool::valid_pools`] of the pools not being
/// deleted, each left out with the validation's own words.
pub(super) fn valid_pools(pools: &Store<PlacementPool>) -> (Vec<model::PlacementPool>, BTreeMap<String, String>) {
    let documents = pools
        .state()
        .into_iter()
        .filter(|p| p.meta().deletion_timestamp.is_none())
        .map(|p| (p.to_model(), ()));
    decide::pool::valid_pools(documents, |(), e| e.to_string())
}

#[tracing::instrument(skip_all, fields(pool = %pool.name_any()))]
async fn reconcile_pool(pool: Arc<PlacementPool>, ctx: Arc<PoolContext>) -> Result<Action, ReconcileError> {
    let key = pool.name_any();
    ctx.shared
        .reconciling(POOL_CONTROLLER, &key, reconcile_pool_once(pool, ctx.clone()))
        .await
}

/// One reconcile of the object, counted by [`reconcile_pool`].
async fn reconcile_pool_once(pool: Arc<PlacementPool>, ctx: Arc<PoolContext>) -> Result<Action, ReconcileError> {
    let shared = &ctx.shared;
    let name = pool.name_any();
    let model = pool.to_model();
    let (_, invalid) = valid_pools(&ctx.pools);
    let set_refused = ctx.refused.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let tiers: Vec<String> = pool.spec.tiers.iter().map(|t| t.name.clone()).collect();
    let pool_name = name.clone();
    let (observed, metrics, in_force) = shared
        .core
        .read(move |core| {
            let in_force = core.settings().placement_pools.contains(&model);
            (observe_pool(core, &pool_name, &tiers), core.metrics(), in_force)
        })
        .await?;
    shared.metrics.pools(&metrics);
    shared.metrics.core_counters(&metrics);
    let conditions = pool_conditions(invalid.get(&name).or(set_refused.as_ref()), in_force);
    let writer = StatusWriter::<PlacementPool>::new(shared, Api::all(shared.client.clone()), POOL_CONTROLLER);
    let previous = writer.known(&pool).unwrap_or_default();
    writer
        .merge_and_write(
            &pool,
            &previous,
            observed,
            conditions::with_reconciling(conditions, &[]),
        )
        .await?;
    Ok(Action::requeue(RESYNC))
}
