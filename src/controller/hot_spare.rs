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
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use crate::automanager::spares::HotSpareSpecsDiff;
use crate::automanager::{CommandError, ReadModel};
use crate::crd::{HotSparePolicy, HotSparePolicyStatus};
use crate::model::HotSpareSpec;

use super::api_server::watch_backoff;
use super::conditions::{self, Observed, READY, STALLED};
use super::error::DecideError;
use super::status::StatusWriter;
use super::{Context, ReconcileError, listed};

/// The controller's name (metrics label, field manager suffix).
pub const CONTROLLER: &str = "hotsparepolicy";
/// The policy's spec is the one the core reconciles spares with.
pub const APPLIED: &str = "Applied";
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
    let (policies, writer) = reflector::store();
    // The watch backs off after a failure: without it, it retried at once,
    // forever, and an API server outage spun a core.
    let policy_events = reflector::reflector(
        writer,
        watcher(api.clone(), watcher::Config::default()).backoff(watch_backoff()),
    )
    .touched_objects()
    .filter_map(|e| async move {
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
    let controller = Controller::new(api, watcher::Config::default())
        .trigger_backoff(watch_backoff())
        .with_config(Config::default().debounce(Duration::from_millis(200)))
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
    let mut specs: Vec<HotSpareSpec> = policies
        .state()
        .iter()
        .filter(|p| p.meta().deletion_timestamp.is_none() && known.contains(&p.spec.0.pool))
        .map(|p| p.spec.0.clone())
        .collect();
    specs.sort_by(|a, b| a.pool.cmp(&b.pool));
    specs
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

fn rfc3339(at_ms: i64) -> Option<String> {
    Timestamp::from_millisecond(at_ms).ok().map(|t| t.to_string())
}

/// A policy's status read from the core (conditions apart, without
/// timestamps): its spare counts and last underflow; `Ready` once its spec
/// is the one in force, `Stalled` when it names a pool the core does not
/// run with, and why the core refused the list (`refused`) otherwise.
pub fn observe_policy(
    core: ReadModel<'_>,
    spec: &HotSpareSpec,
    refused: Option<String>,
) -> (HotSparePolicyStatus, Vec<Observed>) {
    let pool = &spec.pool;
    let known = core.settings().placement_pools.iter().any(|p| &p.name == pool);
    let in_force = core.settings().hot_spares.iter().any(|s| s == spec);
    let spare_status = core.hot_spares().into_iter().find(|s| &s.pool == pool);
    let conditions = if !known {
        let why = format!("pool {pool:?} is not a PlacementPool in force; create it or fix spec.pool");
        vec![
            Observed::no(READY, "UnknownPool", why.clone()),
            Observed::yes(STALLED, "UnknownPool", why),
            Observed::no(APPLIED, "UnknownPool", ""),
        ]
    } else if in_force {
        vec![
            Observed::yes(READY, "InForce", format!("the core keeps spares for pool {pool}")),
            Observed::no(STALLED, "InForce", ""),
            Observed::yes(APPLIED, "InForce", ""),
        ]
    } else {
        let why = refused.unwrap_or_else(|| "not yet handed to the core".to_owned());
        vec![
            Observed::no(READY, "NotInForce", why.clone()),
            Observed::no(STALLED, "NotInForce", ""),
            Observed::no(APPLIED, "NotInForce", why),
        ]
    };
    let status = HotSparePolicyStatus {
        observed_generation: None,
        conditions: Vec::new(),
        live_spares: spare_status.as_ref().map_or(0, |s| s.live),
        provisioning_spares: spare_status.as_ref().map_or(0, |s| s.provisioning),
        consumed_spares: spare_status
            .as_ref()
            .map_or(0, |s| u32::try_from(s.consumed).unwrap_or(u32::MAX)),
        last_underflow: spare_status
            .as_ref()
            .and_then(|s| s.last_underflow_at)
            .and_then(rfc3339),
    };
    (status, conditions)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixture::{TestCore, said, settings};
    use crate::model::SpareInstanceSpec;

    fn spec(pool: &str) -> HotSpareSpec {
        HotSpareSpec {
            pool: pool.to_owned(),
            target_count: 1,
            spec: SpareInstanceSpec {
                instance_type: "m5.xlarge".to_owned(),
                region: None,
            },
            ..HotSpareSpec::default()
        }
    }

    #[test]
    fn a_policy_naming_an_unknown_pool_stalls_and_says_how_to_fix_it() {
        let test = TestCore::hydrated(&[("a", 4.0)]);
        let (status, conditions) = observe_policy(test.read(), &spec("studio"), None);
        let why = "pool \"studio\" is not a PlacementPool in force; create it or fix spec.pool";
        assert_eq!(
            said(&conditions),
            [
                (READY, "False", "UnknownPool", why),
                (STALLED, "True", "UnknownPool", why),
                (APPLIED, "False", "UnknownPool", ""),
            ]
        );
        assert_eq!(
            (status.live_spares, status.provisioning_spares, status.consumed_spares),
            (0, 0, 0)
        );
        assert_eq!(status.last_underflow, None);
    }

    #[test]
    fn a_policy_not_yet_in_force_says_why_the_core_refused_it() {
        let test = TestCore::hydrated(&[("a", 4.0)]);
        let (_, waiting) = observe_policy(test.read(), &spec("production"), None);
        assert_eq!(
            said(&waiting),
            [
                (READY, "False", "NotInForce", "not yet handed to the core"),
                (STALLED, "False", "NotInForce", ""),
                (APPLIED, "False", "NotInForce", "not yet handed to the core"),
            ]
        );
        let refusal = "hotSpares[0].spec.instanceType: a hot spare needs an instance type".to_owned();
        let (_, refused) = observe_policy(test.read(), &spec("production"), Some(refusal.clone()));
        assert_eq!(refused[0].message, refusal);
        assert_eq!(refused[2].message, refusal);
    }

    #[test]
    fn a_policy_in_force_is_ready_and_applied() {
        let test = TestCore::hydrated_with(
            crate::automanager::AutoSettings {
                hot_spares: vec![spec("production")],
                ..settings()
            },
            &[("a", 4.0)],
        );
        let (status, conditions) = observe_policy(test.read(), &spec("production"), Some("stale".to_owned()));
        assert_eq!(
            said(&conditions),
            [
                (READY, "True", "InForce", "the core keeps spares for pool production"),
                (STALLED, "False", "InForce", ""),
                (APPLIED, "True", "InForce", ""),
            ]
        );
        assert_eq!((status.live_spares, status.consumed_spares), (0, 0));
    }

    #[test]
    fn an_underflow_is_shown_as_an_rfc3339_time() {
        assert_eq!(rfc3339(1_700_000_000_000).as_deref(), Some("2023-11-14T22:13:20Z"));
    }
}
