//! The `NodeDrain` controller: a resource starts `drainNode` on the core
//! (`handleNodeInterruption` when it carries an interruption); its status
//! is the core's `DrainState` (see [`crate::decide::drain_status`]), rewritten on
//! every `drainProgress`; each migration the drain starts gets a
//! `JobMigration` owned by the drain. Deleting it before its terminate
//! cancels the drain (`uncordonNode`) behind the finalizer
//! `automanager.norsk.video/drain`.
//!
//! Restarts and leader changes lose nothing: a drain whose status says it
//! is in flight but which the (new) core does not run is started again —
//! the core's drain is idempotent per node — and an Event says it was
//! resumed; a drain that ended stays as its status says. A drain that ends
//! with its node still cordoned (`done` with `after: keep`, or `partial`)
//! hands the cordon to the node's `NorskNode` (`spec.cordoned: true`, as
//! `kubectl drain` sets a Node's `unschedulable`) before it records the
//! end: the cordon is then a person's to lift, and every later term, a
//! standby included, reads it from there rather than from a core's memory.
//! A `NodeDrain` with `mode: evict` or `terminate` acts at once instead
//! (see [`super::drain_at_once`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use crate::automanager::{AutoManagerHandle, CommandError, DrainPhase, DrainState, MigrationId};
use crate::crd::{
    DrainAfter, DrainMode, JobMigration, JobMigrationSpec, NodeDrain, NodeDrainSpec, NodeDrainStatus, NorskNode,
};
use crate::model::{NodeId, wire_name};

use super::drain_follow::{DrainContext, after_status, run_controller};
use super::error::{ApplyError, DecideError, ReadError, WriteStatusError};
use super::migration::{DRAIN, MIGRATION_ID};
use super::status::StatusWriter;
use super::{Context, ReconcileError};
use crate::decide::drain::{DrainCommand, drain_command, drain_refused};
use crate::decide::drain_status::{conditions_of, millis, rfc3339, status_of};
use crate::decide::node::{FLEET, MANAGED_BY};
use crate::decide::node_status::{node_resource_name, resource_name};

/// The controller's name (metrics label, field manager suffix).
pub const CONTROLLER: &str = "nodedrain";
/// Held until a drain deleted before its terminate has been cancelled.
pub const FINALIZER: &str = "automanager.norsk.video/drain";
/// A drain of a node this fleet does not (yet) hold is looked at again.
const UNKNOWN_NODE_RESYNC: Duration = Duration::from_secs(60);

/// Runs the controller until `shutdown` resolves; `notified` carries the
/// drains notifications were about.
pub async fn run(
    shared: Arc<DrainContext>,
    notified: impl Stream<Item = ObjectRef<NodeDrain>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<NodeDrain> = Api::all(shared.ctx.client.clone());
    run_controller(api, shared, notified, shutdown, reconcile, error_policy).await;
}

#[tracing::instrument(skip_all, fields(drain = %drain.name_any()))]
async fn reconcile(drain: Arc<NodeDrain>, shared: Arc<DrainContext>) -> Result<Action, ReconcileError> {
    let key = drain.name_any();
    shared
        .ctx
        .reconciling(CONTROLLER, &key, reconcile_once(drain, shared.clone()))
        .await
}

/// One reconcile of the object, counted by [`reconcile`].
async fn reconcile_once(drain: Arc<NodeDrain>, shared: Arc<DrainContext>) -> Result<Action, ReconcileError> {
    let ctx = &shared.ctx;
    let name = drain.name_any();
    let node = NodeId::from(drain.spec.node_id.as_str());
    let asked = node.clone();
    let (hydrated, known) = ctx
        .core
        .read(move |core| (core.is_hydrated(), core.knows_node(&asked)))
        .await?;
    if !hydrated {
        return Err(DecideError::NotHydrated.into());
    }
    let labelled = drain.labels().get(FLEET) == Some(&shared.fleet);
    if !known && !labelled {
        // Another fleet's node (operators of several fleets share the
        // cluster), or one Manager has not reported yet.
        return Ok(Action::requeue(UNKNOWN_NODE_RESYNC));
    }
    shared.drain_named(&node, &name);
    let api: Api<NodeDrain> = Api::all(ctx.client.clone());
    if !labelled && drain.meta().deletion_timestamp.is_none() {
        // Claim it for this fleet: it stays ours after the node has gone.
        let patch = serde_json::json!({"metadata": {"labels": {FLEET: shared.fleet}}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| ApplyError::Label {
                kind: "NodeDrain",
                name: name.clone(),
                label: FLEET,
                value: shared.fleet.clone(),
                source,
            })?;
        return Ok(Action::await_change());
    }
    finalizer(&api, FINALIZER, drain, |event| async {
        match event {
            FinalizerEvent::Apply(drain) => match drain.spec.mode.unwrap_or_default() {
                DrainMode::Drain => apply(&drain, &shared).await,
                at_once => super::drain_at_once::apply(&drain, &shared, at_once).await,
            },
            FinalizerEvent::Cleanup(drain) => cleanup(&drain, &shared).await,
        }
    })
    .await
    .map_err(|e| ReconcileError::of_finalizer(e, FINALIZER, &format!("NodeDrain {name}")))
}

fn error_policy(drain: Arc<NodeDrain>, error: &ReconcileError, shared: Arc<DrainContext>) -> Action {
    shared.ctx.failed(CONTROLLER, &drain.name_any(), error)
}

/// The controller's status writer.
pub(super) fn writer(ctx: &Context) -> StatusWriter<'_, NodeDrain> {
    StatusWriter::new(ctx, Api::all(ctx.client.clone()), CONTROLLER)
}

/// The status this controller last wrote (or the resource's).
pub(super) fn recorded(drain: &NodeDrain, shared: &DrainContext) -> NodeDrainStatus {
    writer(&shared.ctx).known(drain).unwrap_or_default()
}

/// The core's drain of the node when it is this resource's: one still
/// running, the ended one the status recorded, or — for a drain the
/// operator created for an interruption notice, which the core acted on
/// before the resource existed — the core's drain before anything was
/// recorded.
fn ours(core_drain: Option<DrainState>, drain: &NodeDrain, recorded: &NodeDrainStatus) -> Option<DrainState> {
    let created_for_notice = recorded.phase.is_none()
        && drain.spec.interruption.is_some()
        && drain.labels().get(MANAGED_BY).map(String::as_str) == Some(crate::decide::OPERATOR_NAME);
    core_drain.filter(|s| !s.phase.is_final() || created_for_notice || recorded.started == rfc3339(s.started))
}

async fn apply(drain: &NodeDrain, shared: &DrainContext) -> Result<Action, ReconcileError> {
    let node = NodeId::from(drain.spec.node_id.as_str());
    let recorded = recorded(drain, shared);
    let next = match ours(shared.ctx.core.drain_status(node.clone()).await?, drain, &recorded) {
        Some(state) => status_with_targets(&shared.ctx.core, &state, &recorded).await?,
        None if recorded.phase.is_some_and(DrainPhase::is_final) => return Ok(Action::await_change()),
        None => start(drain, shared, &recorded).await?,
    };
    create_migrations(drain, &next, shared).await;
    let ended = next.phase.is_none_or(DrainPhase::is_final);
    if leaves_node_cordoned(drain, &recorded, &next) {
        keep_cordon(drain, shared, &node).await?;
    }
    write_status(drain, shared, &recorded, next).await?;
    Ok(after_status(ended))
}

/// The drain ends now (it had not ended as `recorded`) with its node
/// running and cordoned: every job moved off a node it keeps, or jobs stuck
/// at a timeout that terminates nothing.
fn leaves_node_cordoned(drain: &NodeDrain, recorded: &NodeDrainStatus, next: &NodeDrainStatus) -> bool {
    let ends_now = !recorded.phase.is_some_and(DrainPhase::is_final);
    let kept = match next.phase {
        Some(DrainPhase::Done) => drain.spec.after == Some(DrainAfter::Keep),
        Some(DrainPhase::Partial) => true,
        _ => false,
    };
    ends_now && kept
}

/// Sets `spec.cordoned` of the drained node's `NorskNode`, so the cordon
/// outlives this term's core. Done once, as the drain ends: a person who
/// uncordons the node afterwards is not overruled.
async fn keep_cordon(drain: &NodeDrain, shared: &DrainContext, node: &NodeId) -> Result<(), ReconcileError> {
    let name = node_resource_name(&shared.fleet, node.as_str());
    let api: Api<NorskNode> = Api::all(shared.ctx.client.clone());
    let patch = serde_json::json!({"spec": {"cordoned": true}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| ApplyError::SetField {
            kind: "NorskNode",
            name: name.clone(),
            field: "spec.cordoned",
            source,
        })?;
    publish(
        drain,
        shared,
        EventType::Normal,
        "NodeKeptCordoned",
        format!(
            "{node} stays cordoned: NorskNode {name} has spec.cordoned set; uncordoning it returns the node to service"
        ),
    );
    Ok(())
}

/// The status `state` becomes, each migrating job with its migration's
/// target as the core reports it (or as last recorded, once the core has
/// forgotten a finished migration).
async fn status_with_targets(
    core: &AutoManagerHandle,
    state: &DrainState,
    recorded: &NodeDrainStatus,
) -> Result<NodeDrainStatus, ReadError> {
    let targets: HashMap<MigrationId, NodeId> = if state.jobs.iter().any(|j| j.migration_id.is_some()) {
        core.migrations()
            .await?
            .into_iter()
            .map(|m| (m.migration_id, m.target_node_id))
            .collect()
    } else {
        HashMap::new()
    };
    let mut status = status_of(state, |id| targets.get(id).cloned());
    for job in status.jobs.iter_mut().filter(|j| j.target_node_id.is_none()) {
        job.target_node_id = recorded
            .jobs
            .iter()
            .find(|r| r.job_id == job.job_id && r.migration_id == job.migration_id && r.migration_id.is_some())
            .and_then(|r| r.target_node_id.clone());
    }
    Ok(status)
}

/// Sends the command a `NodeDrain`'s `spec` becomes (see
/// [`drain_command`]) to `core`; the drain's state.
async fn start_drain(core: &AutoManagerHandle, spec: &NodeDrainSpec) -> Result<DrainState, CommandError> {
    match drain_command(spec) {
        DrainCommand::Interruption(node, notice) => core.handle_node_interruption(node, notice).await.map(|s| s.drain),
        DrainCommand::Drain(node, options) => core.drain_node(node, options).await,
    }
}

/// Starts the drain (again, when the status says it was in flight under a
/// previous leader or core).
async fn start(
    drain: &NodeDrain,
    shared: &DrainContext,
    recorded: &NodeDrainStatus,
) -> Result<NodeDrainStatus, ReconcileError> {
    let ctx = &shared.ctx;
    let result = start_drain(&ctx.core, &drain.spec).await;
    let resumed = recorded.phase;
    match (result, resumed) {
        (Ok(state), resumed) => {
            if let Some(phase) = resumed {
                publish(
                    drain,
                    shared,
                    EventType::Normal,
                    "DrainResumed",
                    format!(
                        "the drain was {} when the operator's previous term ended: started again",
                        wire_name(&phase)
                    ),
                );
            }
            Ok(status_with_targets(&ctx.core, &state, recorded).await?)
        }
        (Err(e), Some(phase)) if drain_refused(&e) => {
            // The node went while no operator followed the drain: a
            // terminate already issued did its work; anything else did not.
            let mut next = recorded.clone();
            let (outcome, reason) = if phase == DrainPhase::Terminating {
                (DrainPhase::Done, "the node was terminated while the operator was away")
            } else {
                (
                    DrainPhase::Failed,
                    "the node left the fleet while the operator was away",
                )
            };
            next.phase = Some(outcome);
            next.reason = Some(format!("{reason} (recorded phase {})", wire_name(&phase)));
            Ok(next)
        }
        (Err(e), None) if drain_refused(&e) => Ok(NodeDrainStatus {
            reason: Some(e.to_string()),
            ..NodeDrainStatus::default()
        }),
        (Err(source), _) => Err(ApplyError::Command {
            action: "drain",
            object: format!("node {} (NodeDrain {})", drain.spec.node_id, drain.name_any()),
            source,
        }
        .into()),
    }
}

/// Publishes an Event about `drain`.
pub(super) fn publish(drain: &NodeDrain, shared: &DrainContext, type_: EventType, reason: &str, note: String) {
    shared.ctx.publish(
        Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: "Drain".to_owned(),
            secondary: None,
        },
        ObjectRef::<NodeDrain>::new(&drain.name_any()).into(),
    );
}

/// A `JobMigration` for each migration the drain started, owned by the
/// drain and adopted (not started again) by the migration controller.
async fn create_migrations(drain: &NodeDrain, next: &NodeDrainStatus, shared: &DrainContext) {
    let Some(owner) = drain.controller_owner_ref(&()) else {
        return;
    };
    for job in &next.jobs {
        let Some(migration_id) = &job.migration_id else {
            continue;
        };
        // Job ids are `<namespace>/<bundle>/<replica>/<job name>`.
        let parts: Vec<&str> = job.job_id.splitn(4, '/').collect();
        let [namespace, bundle, replica, job_name] = parts[..] else {
            continue;
        };
        if shared.namespace.as_deref().is_some_and(|n| n != namespace) {
            continue;
        }
        let Ok(replica_index) = replica.parse::<u32>() else {
            continue;
        };
        // Migration ids restart with every core: the drain's start tells
        // a resumed drain's migrations from the previous term's.
        let started = next.started.as_deref().and_then(millis).unwrap_or_default();
        let name = resource_name(&format!("{bundle}-{replica}-{job_name}-{migration_id}-{started:x}"));
        let key = format!("{namespace}/{name}");
        if shared.created(&key) {
            continue;
        }
        // The strategy the core chose (the drain's, else the job's own):
        // the record says how the job actually moves.
        let strategy = match shared.ctx.core.migration_by_id(MigrationId(migration_id.clone())).await {
            Ok(Some(state)) => Some(state.strategy),
            _ => drain.spec.strategy,
        };
        let migration = JobMigration {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.to_owned()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY.to_owned(), crate::decide::OPERATOR_NAME.to_owned()),
                    (DRAIN.to_owned(), drain.name_any()),
                ])),
                annotations: Some(BTreeMap::from([(MIGRATION_ID.to_owned(), migration_id.clone())])),
                owner_references: Some(vec![owner.clone()]),
                ..ObjectMeta::default()
            },
            spec: JobMigrationSpec {
                bundle: bundle.to_owned(),
                replica_index,
                job_name: job_name.to_owned(),
                strategy,
                target_node_id: None,
                override_reservation: false,
                abort: false,
            },
            status: None,
        };
        let api: Api<JobMigration> = Api::namespaced(shared.ctx.client.clone(), namespace);
        match api.create(&PostParams::default(), &migration).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                tracing::warn!(migration = %key, error = %e, "failed to create the JobMigration of a drain");
                shared.not_created(&key);
            }
        }
    }
}

/// Writes `next`, with its conditions, when it differs from the status
/// `previous` that the resource holds.
async fn write_status(
    drain: &NodeDrain,
    shared: &DrainContext,
    previous: &NodeDrainStatus,
    next: NodeDrainStatus,
) -> Result<(), WriteStatusError> {
    let conditions = conditions_of(&next);
    writer(&shared.ctx)
        .merge_and_write(drain, previous, next, conditions)
        .await?;
    Ok(())
}

/// The finalizer: a drain deleted before its terminate is cancelled
/// (`uncordonNode` ends it `failed` and the node takes placements again).
/// An evict or terminate cancels nothing: it acts at once, and the core's
/// drain of its node, should one run, is another `NodeDrain`'s.
async fn cleanup(drain: &NodeDrain, shared: &DrainContext) -> Result<Action, ReconcileError> {
    let ctx = &shared.ctx;
    let name = drain.name_any();
    let node = NodeId::from(drain.spec.node_id.as_str());
    if drain.spec.mode.is_some_and(DrainMode::is_at_once) {
        writer(ctx).forget(&name);
        shared.drain_gone(&node);
        return Ok(Action::await_change());
    }
    let recorded = recorded(drain, shared);
    let core_drain = ours(ctx.core.drain_status(node.clone()).await?, drain, &recorded);
    let phase = core_drain.as_ref().map(|s| s.phase).or(recorded.phase);
    let before_terminate = phase.is_some_and(|phase| !phase.is_final() && phase != DrainPhase::Terminating);
    if before_terminate {
        match ctx.core.uncordon_node(node.clone()).await {
            Ok(()) | Err(CommandError::UnknownNode(_) | CommandError::NodeGone(_)) => {}
            Err(source) => {
                return Err(ApplyError::Command {
                    action: "cancel the drain of",
                    object: format!("node {node} (NodeDrain {name})"),
                    source,
                }
                .into());
            }
        }
        publish(
            drain,
            shared,
            EventType::Normal,
            "DrainCancelled",
            format!("deleted before its terminate: {node} uncordoned"),
        );
    }
    writer(ctx).forget(&name);
    shared.drain_gone(&node);
    Ok(Action::await_change())
}
