//! The `PlacementPool` controller: every valid `PlacementPool` is handed to
//! the core as one set, live (no reconnect); a pool that does not validate
//! is left out and its status says why (`Stalled`), so one bad pool never
//! blocks the others. Status: nodes per tier, prospective nodes, used
//! capacity, live spares.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use crate::automanager::fleet::NodeState;
use crate::automanager::{AutoManagerCore, CommandError};
use crate::crd::{PlacementPool, PlacementPoolStatus, TierStatus};
use crate::model::{self, NodeId, tags};
use crate::placement::validate_pools;

use super::conditions::{self, Observed, READY, STALLED};
use super::{Context, ReconcileError, status};

/// The pool controller's name (metrics label, field manager suffix).
pub const POOL_CONTROLLER: &str = "placementpool";
/// Gauges are refreshed at least this often without a change.
const RESYNC: Duration = Duration::from_secs(60);

/// What a pool controller reconcile reads besides its object.
pub struct PoolContext {
    shared: Arc<Context>,
    pools: Store<PlacementPool>,
}

/// Runs the `PlacementPool` controller until `shutdown` resolves; every
/// pool is reconciled again when `fleet_changed` yields.
pub async fn run_pools(
    ctx: Arc<Context>,
    fleet_changed: impl Stream<Item = ()> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<PlacementPool> = Api::all(ctx.client.clone());
    // A deleted pool has no reconcile of its own: any pool event (deletes
    // included) reconciles every pool, and each hands the whole set over.
    let pool_events = watcher(api.clone(), watcher::Config::default())
        .touched_objects()
        .filter_map(|e| async move { e.ok().map(|_| ()) });
    let controller = Controller::new(api, watcher::Config::default())
        .with_config(Config::default().debounce(Duration::from_millis(200)));
    let pools = controller.store();
    let ctx = Arc::new(PoolContext { shared: ctx, pools });
    controller
        .reconcile_all_on(futures::stream::select(fleet_changed, pool_events))
        .graceful_shutdown_on(shutdown)
        .run(reconcile_pool, pool_error_policy, ctx)
        .for_each(|_| async {})
        .await;
}

fn pool_error_policy(pool: Arc<PlacementPool>, error: &ReconcileError, ctx: Arc<PoolContext>) -> Action {
    ctx.shared.failed(POOL_CONTROLLER, &pool.name_any(), error)
}

/// Why a pool is left out of the set, per pool name.
fn valid_pools(pools: &Store<PlacementPool>) -> (Vec<model::PlacementPool>, BTreeMap<String, String>) {
    let mut all: Vec<_> = pools
        .state()
        .into_iter()
        .filter(|p| p.meta().deletion_timestamp.is_none())
        .map(|p| p.to_model())
        .collect();
    all.sort_by(|a, b| a.name.cmp(&b.name));
    let mut invalid = BTreeMap::new();
    let valid = all
        .into_iter()
        .filter(|pool| match validate_pools(vec![pool.clone()]) {
            Ok(_) => true,
            Err(e) => {
                invalid.insert(pool.name.clone(), e.to_string());
                false
            }
        })
        .collect();
    (valid, invalid)
}

async fn reconcile_pool(pool: Arc<PlacementPool>, ctx: Arc<PoolContext>) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let shared = &ctx.shared;
    let name = pool.name_any();
    let (valid, invalid) = valid_pools(&ctx.pools);
    let in_force = shared
        .core
        .inspect(|core, _| core.settings().placement_pools.clone())
        .await?;
    let mut refused = invalid.get(&name).cloned();
    if in_force == valid {
        if !shared.pools_synced() {
            shared.pools_applied();
        }
    } else {
        match shared.core.set_placement_pools(valid).await {
            Ok(()) => shared.pools_applied(),
            Err(CommandError::InvalidSettings { errors }) => {
                // The pools are valid one by one; what the whole set fails
                // on (a name twice, ...) is reported on every pool.
                refused = Some(errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "));
            }
            Err(source) => {
                return Err(ReconcileError::Command {
                    action: "set the placement pools for",
                    object: name,
                    source,
                });
            }
        }
    }
    let tiers: Vec<String> = pool.spec.tiers.iter().map(|t| t.name.clone()).collect();
    let pool_name = name.clone();
    let (observed, metrics) = shared
        .core
        .inspect(move |core, now| (observe_pool(core, &pool_name, &tiers), core.metrics(now)))
        .await?;
    shared.metrics.pools(&metrics);
    let conditions = match &refused {
        Some(why) => vec![
            Observed::no(READY, "InvalidPool", why.clone()),
            Observed::yes(STALLED, "InvalidPool", why.clone()),
        ],
        None => vec![
            Observed::yes(READY, "InForce", "the core places with this pool"),
            Observed::no(STALLED, "InForce", ""),
        ],
    };
    let generation = pool.meta().generation;
    let version = pool.meta().resource_version.clone();
    let previous = shared
        .known_status(POOL_CONTROLLER, &name, version.as_ref(), pool.status.clone())
        .unwrap_or_default();
    let next = PlacementPoolStatus {
        observed_generation: generation,
        conditions: conditions::merge(&previous.conditions, conditions, generation),
        ..observed
    };
    if status::differs(&previous, &next, |s: &mut PlacementPoolStatus| &mut s.conditions) {
        let api: Api<PlacementPool> = Api::all(shared.client.clone());
        status::apply(&api, &name, POOL_CONTROLLER, &next, &shared.metrics).await?;
        shared.wrote(POOL_CONTROLLER, &name, version, &next);
    }
    shared.timed(POOL_CONTROLLER, started);
    shared.succeeded(POOL_CONTROLLER, &name);
    Ok(Action::requeue(RESYNC))
}

/// The capacity bound jobs reserve, by node.
fn reserved_by_node(core: &AutoManagerCore) -> BTreeMap<NodeId, f64> {
    let mut reserved = BTreeMap::new();
    for record in core.jobs() {
        if let Some(binding) = &record.binding {
            *reserved.entry(binding.node_id.clone()).or_insert(0.0) += record.job.requirements().required_capacity;
        }
    }
    reserved
}

fn members<'a>(core: &'a AutoManagerCore, pool: &'a str) -> impl Iterator<Item = &'a NodeState> {
    core.fleet()
        .iter()
        .filter(move |n| n.tags.get(tags::POOL).map(String::as_str) == Some(pool) && !n.is_going() && !n.terminated)
}

fn is_spare(node: &NodeState) -> bool {
    node.tags.get(tags::SPARE).is_some_and(|v| v == "true")
}

fn fraction(used: f64, usable: f64) -> f64 {
    // Three decimals: finer is noise, and every change would be a write.
    if usable > 0.0 {
        (used / usable * 1000.0).round() / 1000.0
    } else {
        0.0
    }
}

/// A pool's status from the core's fleet (conditions left to the caller).
fn observe_pool(core: &AutoManagerCore, pool: &str, tier_names: &[String]) -> PlacementPoolStatus {
    let reserved = reserved_by_node(core);
    let mut status = PlacementPoolStatus::default();
    let (mut used_all, mut usable_all) = (0.0, 0.0);
    let mut tiers: Vec<(TierStatus, f64, f64)> = tier_names
        .iter()
        .map(|name| {
            (
                TierStatus {
                    name: name.clone(),
                    ..TierStatus::default()
                },
                0.0,
                0.0,
            )
        })
        .collect();
    for node in members(core, pool) {
        let used = reserved.get(&node.id).copied().unwrap_or(0.0);
        let usable = node
            .inventory
            .as_ref()
            .map_or(0.0, model::NodeInventory::usable_capacity);
        status.nodes += 1;
        used_all += used;
        usable_all += usable;
        if is_spare(node) && !node.is_launching() && used == 0.0 {
            status.live_spares += 1;
        }
        let tier = node.tags.get(tags::TIER);
        if let Some((t, u, c)) = tiers.iter_mut().find(|(t, _, _)| Some(&t.name) == tier) {
            if node.is_launching() {
                t.prospective_nodes += 1;
            } else {
                t.nodes += 1;
            }
            *u += used;
            *c += usable;
        }
    }
    status.used_capacity_fraction = fraction(used_all, usable_all);
    status.tiers = tiers
        .into_iter()
        .map(|(t, used, usable)| TierStatus {
            used_capacity_fraction: fraction(used, usable),
            ..t
        })
        .collect();
    status
}
