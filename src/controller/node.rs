//! `NorskNode`: the operator mirrors every node of the core's fleet into a
//! resource (created when the node appears, status kept current, deleted
//! once the core sweeps the node after `removeStoppedNodesAfter`). Fleet
//! changes are coalesced — a burst of node events is one round — and each
//! round writes only what changed, at most `MAX_WRITES_PER_ROUND` objects
//! with `CONCURRENT_WRITES` in flight; the rest follows in the next round.
//!
//! People edit `spec.cordoned`, `spec.spare` and `spec.inventory`; a second
//! controller hands those to the core (`cordonNode` / `uncordonNode`,
//! `updateHotSpareNode`, a declared inventory) and reports the first two as
//! conditions under its own field manager.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tokio::sync::{mpsc, watch};

use crate::automanager::CommandError;
use crate::crd::{NorskNode, NorskNodeStatus};
use crate::model::NodeId;

use crate::decide::OPERATOR_NAME;
use crate::decide::conditions::{self, Observed};
use crate::decide::node::{
    BY_SPEC, CORDON_REFUSED, CORDONED, CordonStep, FLEET, MANAGED_BY, apply_inventory, apply_spare_spec, cordon_done,
    cordon_refused, cordon_step,
};
use crate::decide::node_status::mirrored_nodes;
use crate::decide::status::{differs, merged};

use super::error::{ApplyError, ReadError};
use super::status::{self, Recall, StatusWriter};
use super::{Context, ReconcileError};

/// The mirror's name (metrics label, field manager suffix).
pub const MIRROR: &str = "norsknode";
/// The spec controller's name.
pub const SPEC_CONTROLLER: &str = "norsknode-spec";
/// How soon a refused cordon is tried again.
const CORDON_RETRY: Duration = Duration::from_secs(2);
/// How long fleet changes are gathered into one round.
const COALESCE: Duration = Duration::from_millis(500);
/// A round runs at least this often without a change.
const RESYNC: Duration = Duration::from_secs(60);
/// The most objects one round writes.
const MAX_WRITES_PER_ROUND: usize = 200;
/// Writes in flight at once.
const CONCURRENT_WRITES: usize = 8;

/// Mirrors the fleet named `fleet` until `shutdown` resolves; a round
/// follows every burst on `changed`, and every change of the settings
/// file's `template_images` (which `status.placement` shows per node).
pub async fn mirror(
    ctx: Arc<Context>,
    fleet: String,
    mut changed: mpsc::Receiver<()>,
    template_images: Option<watch::Receiver<BTreeMap<String, Vec<String>>>>,
    shutdown: impl Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut kept_tags = ctx.core.kept_node_tags();
    let (_fixed, unchanging) = watch::channel(BTreeMap::new());
    let mut template_images = template_images.unwrap_or(unchanging);
    loop {
        tokio::select! {
            _ = changed.recv() => {}
            // Recorded at once: the next leader starts from them.
            Ok(()) = kept_tags.changed() => {}
            Ok(()) = template_images.changed() => {}
            () = tokio::time::sleep(RESYNC) => {}
            () = &mut shutdown => return,
        }
        tokio::select! {
            () = tokio::time::sleep(COALESCE) => {}
            () = &mut shutdown => return,
        }
        while changed.try_recv().is_ok() {}
        match ctx.reconciling(MIRROR, "fleet", round(&ctx, &fleet)).await {
            // Writes left over: another round soon, not a burst now.
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => {
                ctx.failed(MIRROR, "fleet", &e);
            }
        }
    }
}

/// The mirror's status writer. It compares against what it wrote itself
/// ([`Recall::Always`]): the status it lists also holds the spec
/// controller's conditions.
fn mirror_writer(ctx: &Context) -> StatusWriter<'_, NorskNode> {
    StatusWriter::new(ctx, Api::all(ctx.client.clone()), MIRROR).recalling(Recall::Always)
}

/// One round: create, update and delete what differs. Whether writes were
/// left for the next round.
async fn round(ctx: &Context, fleet: &str) -> Result<bool, ReconcileError> {
    let Some(mut desired) = ctx
        .core
        .read({
            let fleet = fleet.to_owned();
            move |core| core.is_hydrated().then(|| mirrored_nodes(core, &fleet))
        })
        .await?
    else {
        return Ok(false);
    };
    let kept_tags = ctx.core.kept_node_tags().borrow().clone();
    for node in desired.values_mut() {
        node.status.kept_tags = kept_tags.get(&node.node_id).cloned();
    }
    let api: Api<NorskNode> = Api::all(ctx.client.clone());
    let writer = mirror_writer(ctx);
    let selector = format!("{MANAGED_BY}={},{FLEET}={fleet}", OPERATOR_NAME);
    let existing: BTreeMap<String, NorskNode> = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| ReadError::List {
            kind: "NorskNode",
            selector: Some(selector),
            source,
        })?
        .items
        .into_iter()
        .map(|n| (n.name_any(), n))
        .collect();
    let mut writes = Vec::new();
    for (name, node) in desired.iter() {
        let current = existing.get(name);
        let previous = writer.known_as(name, current).unwrap_or_default();
        let next = merged(&previous, node.status.clone(), node.conditions.clone(), None);
        if current.is_none() || differs(&previous, &next) {
            writes.push(Write::Mirror {
                fleet: fleet.to_owned(),
                name: name.clone(),
                create: current.is_none(),
                node_id: node.node_id.clone(),
                status: Box::new(next),
            });
        }
    }
    for name in existing.keys().filter(|name| !desired.contains_key(*name)) {
        writes.push(Write::Delete { name: name.clone() });
    }
    let more = writes.len() > MAX_WRITES_PER_ROUND;
    writes.truncate(MAX_WRITES_PER_ROUND);
    let results: Vec<_> = stream::iter(writes)
        .map(|w| w.run(&api, &writer))
        .buffer_unordered(CONCURRENT_WRITES)
        .collect()
        .await;
    match results.into_iter().find_map(Result::err) {
        Some(e) => Err(e),
        None => Ok(more),
    }
}

enum Write {
    Mirror {
        fleet: String,
        name: String,
        create: bool,
        node_id: NodeId,
        status: Box<NorskNodeStatus>,
    },
    Delete {
        name: String,
    },
}

impl Write {
    /// Carries the write out; `writer` remembers the status now held (none
    /// once deleted).
    async fn run(self, api: &Api<NorskNode>, writer: &StatusWriter<'_, NorskNode>) -> Result<(), ReconcileError> {
        match self {
            Write::Mirror {
                fleet,
                name,
                create,
                node_id,
                status,
            } => {
                if create {
                    // Only the operator's own fields: `spec.cordoned` and
                    // `spec.spare` stay with whoever set them.
                    let object = serde_json::json!({
                        "apiVersion": NorskNode::api_version(&()),
                        "kind": NorskNode::kind(&()),
                        "metadata": {"name": name, "labels": {MANAGED_BY: OPERATOR_NAME, FLEET: fleet}},
                        "spec": {"nodeId": node_id.as_str()},
                    });
                    let params = PatchParams::apply(&status::field_manager(MIRROR)).force();
                    api.patch(&name, &params, &Patch::Apply(&object))
                        .await
                        .map_err(|source| ApplyError::Create {
                            kind: "NorskNode",
                            name: name.clone(),
                            source,
                        })?;
                }
                writer.put(&name, None, &status).await?;
                Ok(())
            }
            Write::Delete { name } => match api.delete(&name, &Default::default()).await {
                Ok(_) => {
                    writer.forget(&name);
                    Ok(())
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    writer.forget(&name);
                    Ok(())
                }
                Err(source) => Err(ApplyError::Delete {
                    kind: "NorskNode",
                    name,
                    source,
                }
                .into()),
            },
        }
    }
}

/// Runs the controller of what people edit on the `NorskNode`s of `fleet`
/// until `shutdown` resolves. Only this fleet's: operators of several
/// fleets share a cluster, and another's core holds none of these nodes.
pub async fn run_spec(ctx: Arc<Context>, fleet: String, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let api: Api<NorskNode> = Api::all(ctx.client.clone());
    super::api_server::controller(
        api,
        watcher::Config::default().labels(&format!("{FLEET}={fleet}")),
        Duration::from_millis(200),
    )
    .graceful_shutdown_on(shutdown)
    .run(reconcile_spec, spec_error_policy, ctx)
    .for_each(|_| async {})
    .await;
}

fn spec_error_policy(node: Arc<NorskNode>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    ctx.failed(SPEC_CONTROLLER, &node.name_any(), error)
}

/// `spec.cordoned` -> `cordonNode` / `uncordonNode`. Only what this
/// controller cordoned is uncordoned when the spec is cleared: a node a
/// drain cordoned stays cordoned (uncordoning would cancel the drain).
async fn apply_cordon(ctx: &Context, node: &NorskNode) -> Result<Observed, ReconcileError> {
    let node_id = NodeId(node.spec.node_id.clone());
    let cordoned = ctx.core.is_cordoned(node_id.clone()).await?;
    let by_spec = node
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, CORDONED))
        .is_some_and(|c| c.status == "True" && c.reason == BY_SPEC);
    let (action, outcome) = match cordon_step(node.spec.cordoned, cordoned, by_spec) {
        CordonStep::Stay(observed) => return Ok(observed),
        CordonStep::Cordon => ("cordon", ctx.core.cordon_node(node_id.clone()).await.map(|()| true)),
        CordonStep::Uncordon => (
            "uncordon",
            ctx.core.uncordon_node(node_id.clone()).await.map(|()| false),
        ),
    };
    Ok(match outcome {
        Ok(cordoned) => cordon_done(cordoned),
        Err(source @ CommandError::Closed) => {
            return Err(ApplyError::Command {
                action,
                object: format!("node {node_id}"),
                source,
            }
            .into());
        }
        Err(e) => cordon_refused(&e),
    })
}

#[tracing::instrument(skip_all, fields(node = %node.spec.node_id))]
async fn reconcile_spec(node: Arc<NorskNode>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let key = node.name_any();
    ctx.reconciling(SPEC_CONTROLLER, &key, reconcile_spec_once(node, ctx.clone()))
        .await
}

/// One reconcile of the object, counted by [`reconcile_spec`].
async fn reconcile_spec_once(node: Arc<NorskNode>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let name = node.name_any();
    apply_inventory(
        &ctx.core,
        NodeId(node.spec.node_id.clone()),
        node.spec.inventory.clone(),
    )
    .await?;
    let mut observed = vec![apply_cordon(&ctx, &node).await?];
    // A cordon refused because the core does not hold the node yet (a term
    // whose stream is still coming up) is tried again: nothing else would
    // wake this object.
    let retry = observed.iter().any(|o| o.reason == CORDON_REFUSED);
    observed.extend(apply_spare_spec(&ctx.core, NodeId(node.spec.node_id.clone()), node.spec.spare.clone()).await?);
    let types: Vec<&str> = observed.iter().map(|o| o.type_).collect();
    let previous: Vec<_> = node
        .status
        .as_ref()
        .map(|s| {
            s.conditions
                .iter()
                .filter(|c| types.contains(&c.type_.as_str()))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let next = conditions::merge(&previous, observed, node.meta().generation);
    if !conditions::same(&previous, &next) {
        // A list-map keyed by type: this manager owns `Cordoned` and
        // `SpareSpecApplied`, the mirror owns `Ready`.
        StatusWriter::<NorskNode>::new(&ctx, Api::all(ctx.client.clone()), SPEC_CONTROLLER)
            .apply(&name, &serde_json::json!({"conditions": next}))
            .await?;
    }
    Ok(if retry {
        Action::requeue(CORDON_RETRY)
    } else {
        Action::await_change()
    })
}
