//! What a follower keeps in its standby core besides Manager's stream: the
//! cluster's pools and hot-spare policies, applied as live settings after
//! every change, so that when this process wins the Lease the promoted
//! core's first round already places with the real pools and reconciles
//! spares against the real targets (a core without the policies would take
//! every live spare for an orphan); and what people said of the fleet's
//! nodes on their `NorskNode`s — a cordon (`spec.cordoned`, which a drain
//! that keeps its node sets too) and a declared inventory — so that the
//! first round places nothing on a node someone took out of service, and
//! sheds nothing from a server whose size only its declaration tells; and
//! the node tag changes the previous leader kept for a Manager that cannot
//! store them (`status.keptTags`: a consumed spare), so that a spare that
//! took a job is never taken for a live one again.
//! Nothing is written to the cluster: the leader's controllers report on
//! the resources.

use std::collections::{BTreeMap, BTreeSet};

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tokio::sync::watch;

use crate::automanager::{AutoManagerHandle, CommandError};
use crate::crd::{HotSparePolicy, NorskNode, PlacementPool};
use crate::model::{NodeId, NodeInventory};

use super::api_server::reflect;
use super::hot_spare::wanted;
use super::listed;
use super::pool::valid_pools;
use crate::decide::node::FLEET;

/// Keeps `core`'s pools, hot-spare specs and the intents people wrote on
/// the `NorskNode`s of `fleet` in line with the resources until aborted or
/// the core closes. `synced` turns true once all three kinds have been
/// listed and applied: a standby is promoted only then. The node intents
/// are applied again whenever the core's fleet changes, since a cordon
/// takes only on a node the core knows.
pub async fn keep_settings(client: Client, core: AutoManagerHandle, fleet: String, synced: watch::Sender<bool>) {
    let (pools, pool_events) = reflect(Api::<PlacementPool>::all(client.clone()), watcher::Config::default());
    let (policies, policy_events) = reflect(Api::<HotSparePolicy>::all(client.clone()), watcher::Config::default());
    let of_fleet = watcher::Config::default().labels(&format!("{FLEET}={fleet}"));
    let (nodes, node_events) = reflect(Api::<NorskNode>::all(client), of_fleet);
    let pool_events = pool_events.map(|e| e.map(drop));
    let policy_events = policy_events.map(|e| e.map(drop));
    let node_events = node_events.map(|e| e.map(drop));
    // The core's fleet changing is one more reason to look at the nodes.
    let fleet_changes = tokio_stream::wrappers::WatchStream::new(core.changes()).map(|_| Ok(()));
    let mut events = std::pin::pin!(futures::stream::select(
        futures::stream::select(pool_events, policy_events),
        futures::stream::select(node_events, fleet_changes),
    ));
    let mut held = NodeIntents::default();
    while let Some(event) = events.next().await {
        if let Err(e) = event {
            // The watchers retry by themselves; what is in force stands.
            tracing::debug!(error = %e, "watching pools, hot-spare policies and nodes while following");
            continue;
        }
        // Until every list is in, a partial set would drop pools (and
        // spares with them) or miss a cordon.
        if !(listed(&pools) && listed(&policies) && listed(&nodes)) {
            continue;
        }
        if !apply(&core, &pools, &policies).await {
            return;
        }
        let intents: Vec<(NodeId, bool, Option<NodeInventory>)> = nodes
            .state()
            .iter()
            .map(|n| {
                (
                    NodeId(n.spec.node_id.clone()),
                    n.spec.cordoned,
                    n.spec.inventory.clone(),
                )
            })
            .collect();
        if !held.apply(&core, intents).await {
            return;
        }
        let kept_tags = nodes
            .state()
            .iter()
            .filter_map(|n| {
                let kept = n.status.as_ref()?.kept_tags.clone()?;
                Some((NodeId(n.spec.node_id.clone()), kept))
            })
            .collect();
        core.keep_node_tags(kept_tags);
        synced.send_replace(true);
    }
}

/// What this standby has applied of the `NorskNode` specs: the cordons it
/// set and the inventories it declared. Only its own cordons are lifted
/// when a spec clears them (as the leader's spec controller does).
#[derive(Default)]
struct NodeIntents {
    cordoned: BTreeSet<NodeId>,
    declared: BTreeMap<NodeId, Option<NodeInventory>>,
}

impl NodeIntents {
    /// Brings the core to `intents` (node, `spec.cordoned`,
    /// `spec.inventory`); false once the core is closed. A node the core
    /// does not know yet is cordoned once it does (the next fleet change).
    async fn apply(&mut self, core: &AutoManagerHandle, intents: Vec<(NodeId, bool, Option<NodeInventory>)>) -> bool {
        for (node_id, cordoned, inventory) in intents {
            if self.declared.get(&node_id) != Some(&inventory) {
                if matches!(
                    core.declare_inventory(node_id.clone(), inventory.clone()).await,
                    Err(CommandError::Closed)
                ) {
                    return false;
                }
                self.declared.insert(node_id.clone(), inventory);
            }
            let result = match (cordoned, self.cordoned.contains(&node_id)) {
                (true, false) => core.cordon_node(node_id.clone()).await.map(|()| {
                    self.cordoned.insert(node_id);
                }),
                (false, true) => core.uncordon_node(node_id.clone()).await.map(|()| {
                    self.cordoned.remove(&node_id);
                }),
                _ => Ok(()),
            };
            if matches!(result, Err(CommandError::Closed)) {
                return false;
            }
        }
        true
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
