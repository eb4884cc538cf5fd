//! What a follower keeps in its standby core besides Manager's stream: the
//! cluster's pools and hot-spare policies, applied as live settings after
//! every change, so that when this process wins the Lease the promoted
//! core's first round already places with the real pools and reconciles
//! spares against the real targets (a core without the policies would take
//! every live spare for an orphan). Nothing is written to the cluster: the
//! leader's controllers report on the resources.

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use crate::automanager::{AutoManagerHandle, CommandError};
use crate::crd::{HotSparePolicy, PlacementPool};

use super::api_server::watch_backoff;
use super::hot_spare::wanted;
use super::listed;
use super::pool::valid_pools;

/// Keeps `core`'s pools and hot-spare specs in line with the resources
/// until aborted or the core closes. `synced` turns true once both kinds
/// have been listed and applied: a standby is promoted only then.
pub async fn keep_settings(client: Client, core: AutoManagerHandle, synced: watch::Sender<bool>) {
    let (pools, pool_writer) = reflector::store();
    let (policies, policy_writer) = reflector::store();
    let pool_events = reflector::reflector(
        pool_writer,
        watcher(Api::<PlacementPool>::all(client.clone()), watcher::Config::default()).backoff(watch_backoff()),
    )
    .map(|e| e.map(drop));
    let policy_events = reflector::reflector(
        policy_writer,
        watcher(Api::<HotSparePolicy>::all(client), watcher::Config::default()).backoff(watch_backoff()),
    )
    .map(|e| e.map(drop));
    let mut events = std::pin::pin!(futures::stream::select(pool_events, policy_events));
    while let Some(event) = events.next().await {
        if let Err(e) = event {
            // The watchers retry by themselves; what is in force stands.
            tracing::debug!(error = %e, "watching pools and hot-spare policies while following");
            continue;
        }
        // Until both lists are in, a partial set would drop pools (and
        // spares with them).
        if !(listed(&pools) && listed(&policies)) {
            continue;
        }
        if !apply(&core, &pools, &policies).await {
            return;
        }
        synced.send_replace(true);
    }
}

/// Applies the valid pools, then the specs of policies naming a pool in
/// force; false once the core is closed. A set the core refuses is the
/// leader's to report.
async fn apply(core: &AutoManagerHandle, pools: &Store<PlacementPool>, policies: &Store<HotSparePolicy>) -> bool {
    let (valid, _) = valid_pools(pools);
    let Ok((in_force, mut specs)) = core
        .read(|core| {
            (
                core.settings().placement_pools.clone(),
                core.settings().hot_spares.clone(),
            )
        })
        .await
    else {
        return false;
    };
    if in_force != valid && matches!(core.set_placement_pools(valid.clone()).await, Err(CommandError::Closed)) {
        return false;
    }
    let known: Vec<String> = valid.iter().map(|p| p.name.clone()).collect();
    let want = wanted(policies, &known);
    specs.sort_by(|a, b| a.pool.cmp(&b.pool));
    !(specs != want && matches!(core.update_hot_spare_specs(want).await, Err(CommandError::Closed)))
}
