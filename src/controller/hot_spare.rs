//! The `HotSparePolicy` controller. A sync task hands the core the specs of
//! every policy that names a pool in force, as one list
//! (`updateHotSpareSpecs`, live), whenever a policy changes (deletes
//! included) or the pools do. The controller writes each policy's status
//! from the core's `hot_spare_status`: live / provisioning / consumed
//! spares and the last underflow; `Stalled` when the policy names a pool
//! the core does not run with; `Applied` once its spec is in force. What a
//! live change did (the core's `HotSpareSpecsDiff`) is a Normal Event on
//! each policy whose pool it touched (see [`super::hot_spare_events`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use crate::automanager::CommandError;
use crate::automanager::spares::HotSpareSpecsDiff;
use crate::crd::HotSparePolicy;
use crate::model::HotSpareSpec;

use super::api_server::{controller, reflect};
use super::error::DecideError;
use super::status::StatusWriter;
use super::{Context, ReconcileError, listed};
use crate::decide::conditions;
use crate::decide::hot_spare::{observe_policy, wanted_specs};

/// The controller's name (metrics label, field manager suffix).
pub const CONTROLLER: &str = "hotsparepolicy";
/// Spare counts are refreshed at least this often without a change.
const RESYNC: Duration = Duration::from_secs(60);

/// What the controller shares with the sync task.
pub struct SpareContext {
    shared: Arc<Context>,
    /// Why the core last refused the list, if it did.
    refused: Mutex<Option<String>>,
}

/// Runs the sync task and the controller until `shutdown` resolves; every
/// policy's status is recomputed when `fleet_changed` yields.
pub async fn run(
    ctx: Arc<Context>,
    fleet_changed: impl Stream<Item = ()> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<HotSparePolicy> = Api::all(ctx.client.clone());
    let spares = Arc::new(SpareContext {
        shared: ctx.clone(),
        refused: Mutex::new(None),
    });
    // The watch backs off after a failure: without it, it retried at once,
    // forever, and an API server outage spun a core.
    let (policies, policy_events) = reflect(api.clone(), watcher::Config::default());
    let policy_events = policy_events.touched_objects().filter_map(|e| async move {
        // Failures are retried by the watch; the API server's outage is said
        // by the client (see `api_server`).
        e.map_err(|e| tracing::debug!(error = %e, "watching hot-spare policies"))
            .ok()
            .map(|_| ())
    });
    let (applied_tx, applied_rx) = tokio::sync::mpsc::channel::<()>(1);
    let sync = sync(
        spares.clone(),
        policies,
        futures::stream::select(policy_events, ctx.pool_changes()),
        applied_tx,
    );
    let controller = controller(api, watcher::Config::default(), Duration::from_millis(200))
        .reconcile_all_on(futures::stream::select(
            futures::stream::select(fleet_changed, ctx.pool_changes()),
            tokio_stream::wrappers::ReceiverStream::new(applied_rx),
        ))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, spares)
        .for_each(|_| async {});
    // The sync task ends with the controller (its streams never end).
    tokio::select! {
        () = controller => {}
        () = sync => {}
    }
}

/// The specs of every live policy naming a pool in `known`, by pool.
pub(super) fn wanted(policies: &Store<HotSparePolicy>, known: &[String]) -> Vec<HotSpareSpec> {
    let live = policies.state();
    let specs = live
        .iter()
        .filter(|p| p.meta().deletion_timestamp.is_none())
        .map(|p| &p.spec.0);
    wanted_specs(specs, |pool| known.iter().any(|k| k == pool))
}

/// Hands the core the wanted list on every change; tells the controller.
async fn sync(
    ctx: Arc<SpareContext>,
    policies: Store<HotSparePolicy>,
    changes: impl Stream<Item = ()>,
    applied: tokio::sync::mpsc::Sender<()>,
) {
    let mut changes = std::pin::pin!(changes);
    while changes.next().await.is_some() {
        // Before the first full list an empty store would clear the specs,
        // and the core would reap every live spare as an orphan.
        if !listed(&policies) {
            continue;
        }
        let shared = &ctx.shared;
        if !shared.pools_synced() {
            continue;
        }
        let Ok((known, mut live)) = shared
            .core
            .read(|core| {
                let known: Vec<String> = core.settings().placement_pools.iter().map(|p| p.name.clone()).collect();
                (known, core.settings().hot_spares.clone())
            })
            .await
        else {
            return;
        };
        live.sort_by(|a, b| a.pool.cmp(&b.pool));
        let specs = wanted(&policies, &known);
        if specs == live {
            continue;
        }
        let refusal = match shared.core.update_hot_spare_specs(specs).await {
            Ok(diff) => {
                tell_changes(shared, &policies, &diff);
                None
            }
            Err(CommandError::Closed) => return,
            Err(e) => Some(e.to_string()),
        };
        *ctx.refused.lock().unwrap_or_else(PoisonError::into_inner) = refusal;
        // A full channel already holds the wake-up.
        let _ = applied.try_send(());
    }
}

/// A Normal Event on each live policy whose pool `diff` touched, saying
/// what changed (a removed entry's policy is usually gone: then nobody is
/// told).
fn tell_changes(shared: &Context, policies: &Store<HotSparePolicy>, diff: &HotSpareSpecsDiff) {
    for (pool, change) in diff {
        let note = super::hot_spare_events::change_note(pool, change);
        for policy in policies.state().iter().filter(|p| &p.spec.0.pool == pool) {
            shared.publish(
                Event {
                    type_: EventType::Normal,
                    reason: super::hot_spare_events::reason(change).to_owned(),
                    note: Some(note.chars().take(1000).collect()),
                    action: "UpdateSpares".to_owned(),
                    secondary: None,
                },
                reflector::ObjectRef::from_obj(policy.as_ref()).into(),
            );
        }
    }
}

fn error_policy(policy: Arc<HotSparePolicy>, error: &ReconcileError, ctx: Arc<SpareContext>) -> Action {
    ctx.shared.failed(CONTROLLER, &policy.name_any(), error)
}

#[tracing::instrument(skip_all, fields(policy = %policy.name_any()))]
async fn reconcile(policy: Arc<HotSparePolicy>, ctx: Arc<SpareContext>) -> Result<Action, ReconcileError> {
    let key = policy.name_any();
    ctx.shared
        .reconciling(CONTROLLER, &key, reconcile_once(policy, ctx.clone()))
        .await
}

/// One reconcile of the object, counted by [`reconcile`].
async fn reconcile_once(policy: Arc<HotSparePolicy>, ctx: Arc<SpareContext>) -> Result<Action, ReconcileError> {
    let shared = &ctx.shared;
    let spec = policy.spec.0.clone();
    if !shared.pools_synced() {
        // Every pool would look unknown before the first hand-over.
        return Err(DecideError::PoolsNotSynced.into());
    }
    let refused = ctx.refused.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let (observed, conditions) = shared
        .core
        .read(move |core| observe_policy(core, &spec, refused))
        .await?;
    let writer = StatusWriter::<HotSparePolicy>::new(shared, Api::all(shared.client.clone()), CONTROLLER);
    let previous = writer.known(&policy).unwrap_or_default();
    writer
        .merge_and_write(
            &policy,
            &previous,
            observed,
            conditions::with_reconciling(conditions, &[]),
        )
        .await?;
    Ok(Action::requeue(RESYNC))
}
