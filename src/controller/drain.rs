//! The `NodeDrain` controller: a resource starts `drainNode` (or, with
//! `spec.interruption`, `handleNodeInterruption`) once, and its status is
//! the core's `DrainState`. Deleting it before the drain has issued its
//! terminate cancels the drain (`uncordonNode`), behind the finalizer
//! `automanager.norsk.video/drain`. Every `drainProgress` notification
//! reconciles the drains. A drain the core starts by itself on Manager's
//! interruption notice is recorded as a `NodeDrain` too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::automanager::{
    CommandError, DrainOptions, DrainPhase, DrainState, InterruptionNotice, MigrationStrategy, NodeInterruptionState,
    StrategyFor,
};
use crate::crd::{self, DrainJobStatus, NodeDrain, NodeDrainStatus};
use crate::model::{self, NodeId};

use super::conditions::{self, Observed, READY, STALLED};
use super::node::{FLEET, MANAGED_BY};
use super::node_status::resource_name;
use super::{Context, ReconcileError, status};

/// The controller's name (metrics label, field manager suffix).
pub const CONTROLLER: &str = "nodedrain";
/// Held until the drain has ended or been cancelled.
pub const FINALIZER: &str = "automanager.norsk.video/drain";
/// How often a drain naming a node this fleet does not hold is looked at.
const UNKNOWN_NODE_RECHECK: Duration = Duration::from_secs(60);

/// A deleted drain for a node this fleet does not hold may lose its
/// finalizer only when no drain can still be running for it: it never
/// started, or it ended.
fn may_release(drain: &NodeDrain) -> bool {
    drain.meta().deletion_timestamp.is_some()
        && drain
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_none_or(|phase| matches!(phase, "done" | "partial" | "failed"))
}

/// Runs the controller until `shutdown` resolves; every drain is
/// reconciled again when `progressed` yields.
pub async fn run(
    ctx: Arc<Context>,
    progressed: impl Stream<Item = ()> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<NodeDrain> = Api::all(ctx.client.clone());
    Controller::new(api, watcher::Config::default())
        .with_config(Config::default().debounce(Duration::from_millis(200)))
        .reconcile_all_on(progressed)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}

fn error_policy(drain: Arc<NodeDrain>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    ctx.failed(CONTROLLER, &drain.name_any(), error)
}

#[tracing::instrument(skip_all, fields(drain = %drain.name_any(), node = %drain.spec.node_id))]
async fn reconcile(drain: Arc<NodeDrain>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let name = drain.name_any();
    let api: Api<NodeDrain> = Api::all(ctx.client.clone());
    let node_id = NodeId(drain.spec.node_id.clone());
    let known = ctx.core.inspect(move |core, _| core.fleet().contains(&node_id)).await?;
    if !known && !may_release(&drain) {
        // Not a node of this operator's fleet (yet): another operator's
        // drain, or one for a node still to appear. Leave it untouched.
        ctx.timed(CONTROLLER, started);
        return Ok(Action::requeue(UNKNOWN_NODE_RECHECK));
    }
    let result = finalizer(&api, FINALIZER, drain, |event| async {
        match event {
            FinalizerEvent::Apply(drain) => apply(&drain, &api, &ctx).await,
            FinalizerEvent::Cleanup(drain) => cleanup(&drain, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e) | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => ReconcileError::Finalizer {
            object: name.clone(),
            message: other.to_string(),
        },
    });
    ctx.timed(CONTROLLER, started);
    if result.is_ok() {
        ctx.succeeded(CONTROLLER, &name);
    }
    result
}

fn strategy(s: crd::MigrationStrategy) -> MigrationStrategy {
    match s {
        crd::MigrationStrategy::StopThenStart => MigrationStrategy::StopThenStart,
        crd::MigrationStrategy::Overlap => MigrationStrategy::Overlap,
        crd::MigrationStrategy::Handover => MigrationStrategy::Handover,
    }
}

/// Starts the drain once; afterwards only reads it.
async fn apply(drain: &NodeDrain, api: &Api<NodeDrain>, ctx: &Context) -> Result<Action, ReconcileError> {
    let node_id = NodeId(drain.spec.node_id.clone());
    let hydrated = ctx.core.inspect(|core, _| core.is_hydrated()).await?;
    if !hydrated {
        return Err(ReconcileError::NotHydrated);
    }
    let mut state = ctx.core.drain_status(node_id.clone()).await?;
    let mut refused = None;
    // A drain this resource started shows a `started` time in its status;
    // a resource whose drain has ended is not started again.
    let started_before = drain.status.as_ref().is_some_and(|s| s.started.is_some());
    if state.is_none() && !started_before {
        let strategy_for = StrategyFor::all(strategy(drain.spec.strategy));
        let outcome = match &drain.spec.interruption {
            Some(interruption) => {
                let notice = InterruptionNotice {
                    kind: match interruption.kind {
                        crd::InterruptionKind::SpotInterruption => model::InterruptionKind::SpotInterruption,
                        crd::InterruptionKind::Rebalance => model::InterruptionKind::Rebalance,
                    },
                    deadline: interruption
                        .deadline
                        .as_deref()
                        .and_then(|d| d.parse::<Timestamp>().ok())
                        .map(|t| t.as_millisecond()),
                    strategy_for,
                };
                ctx.core
                    .handle_node_interruption(node_id.clone(), notice)
                    .await
                    .map(|s| s.drain)
            }
            None => {
                let options = DrainOptions {
                    timeout_ms: drain.spec.timeout_seconds.map(|s| u64::from(s) * 1_000),
                    force: drain.spec.force,
                    strategy_for,
                };
                ctx.core.drain_node(node_id.clone(), options).await
            }
        };
        match outcome {
            Ok(s) => state = Some(s),
            Err(CommandError::Closed) => return Err(ReconcileError::ReadCore(crate::automanager::QueryError::Closed)),
            // An unknown node, a node already going: the drain waits for a
            // change of the resource.
            Err(e) => refused = Some(e.to_string()),
        }
    }
    let previous = ctx
        .known_status(
            CONTROLLER,
            &drain.name_any(),
            drain.meta().resource_version.as_ref(),
            drain.status.clone(),
        )
        .unwrap_or_default();
    let next = drain_status(&previous, state.as_ref(), refused, drain.meta().generation);
    if status::differs(&previous, &next, |s: &mut NodeDrainStatus| &mut s.conditions) {
        status::apply(api, &drain.name_any(), CONTROLLER, &next, &ctx.metrics).await?;
        ctx.wrote(
            CONTROLLER,
            &drain.name_any(),
            drain.meta().resource_version.clone(),
            &next,
        );
    }
    Ok(Action::await_change())
}

fn phase_name(phase: DrainPhase) -> String {
    serde_json::to_value(phase)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The status a drain state implies (what was recorded stands once the
/// core no longer holds the drain).
fn drain_status(
    previous: &NodeDrainStatus,
    state: Option<&DrainState>,
    refused: Option<String>,
    generation: Option<i64>,
) -> NodeDrainStatus {
    let mut next = previous.clone();
    if let Some(state) = state {
        next.phase = Some(phase_name(state.phase));
        next.started = Timestamp::from_millisecond(state.started).ok().map(|t| t.to_string());
        next.jobs = state
            .jobs
            .iter()
            .map(|j| DrainJobStatus {
                job_id: j.job_id.to_string(),
                status: serde_json::to_value(j.status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                migration_id: j.migration_id.as_ref().map(ToString::to_string),
                reason: j.reason.clone(),
            })
            .collect();
        next.reason.clone_from(&state.reason);
    }
    let observed = match (&refused, state.map(|s| s.phase)) {
        (Some(why), _) => vec![
            Observed::no(READY, "Refused", why.clone()),
            Observed::yes(STALLED, "Refused", why.clone()),
        ],
        (None, Some(DrainPhase::Done)) => vec![
            Observed::yes(READY, "Done", "the node is empty and terminated"),
            Observed::no(STALLED, "Done", ""),
        ],
        (None, Some(phase @ (DrainPhase::Partial | DrainPhase::Failed))) => {
            let why = next.reason.clone().unwrap_or_default();
            vec![
                Observed::no(READY, phase_name(phase), why.clone()),
                Observed::yes(STALLED, phase_name(phase), why),
            ]
        }
        (None, Some(phase)) => vec![
            Observed::no(READY, phase_name(phase), "the drain is running"),
            Observed::no(STALLED, phase_name(phase), ""),
        ],
        // The core no longer holds it: what was recorded stands.
        (None, None) => return next,
    };
    next.conditions = conditions::merge(
        &previous.conditions,
        conditions::with_reconciling(observed, &[]),
        generation,
    );
    next
}

/// Deleting the resource before the terminate cancels the drain.
async fn cleanup(drain: &NodeDrain, ctx: &Context) -> Result<Action, ReconcileError> {
    let node_id = NodeId(drain.spec.node_id.clone());
    let state = ctx.core.drain_status(node_id.clone()).await?;
    let cancellable = state.as_ref().is_some_and(|s| {
        matches!(
            s.phase,
            DrainPhase::Migrating | DrainPhase::Waiting | DrainPhase::Partial
        )
    });
    if cancellable {
        match ctx.core.uncordon_node(node_id).await {
            Ok(()) | Err(CommandError::Manager(_)) => {}
            Err(source) => {
                return Err(ReconcileError::Command {
                    action: "cancel the drain of",
                    object: drain.spec.node_id.clone(),
                    source,
                });
            }
        }
    }
    ctx.forget(CONTROLLER, &drain.name_any());
    Ok(Action::await_change())
}

/// Manager reported an interruption notice and the core started its forced
/// drain: the operator records it as a `NodeDrain` (named after the node),
/// so the drain in flight is visible with `kubectl get norsk`.
pub async fn record_interruption(ctx: &Context, fleet: &str, state: &NodeInterruptionState) {
    let kind = match state.kind {
        model::InterruptionKind::SpotInterruption => "spot-interruption",
        model::InterruptionKind::Rebalance => "rebalance",
        // A kind this build does not know has no resource shape; the drain
        // still runs in the core.
        _ => return,
    };
    let name = resource_name(state.node_id.as_str());
    let mut interruption = serde_json::json!({ "kind": kind });
    if let Some(deadline) = state.deadline.and_then(|d| Timestamp::from_millisecond(d).ok()) {
        interruption["deadline"] = serde_json::Value::String(deadline.to_string());
    }
    let object = serde_json::json!({
        "apiVersion": NodeDrain::api_version(&()),
        "kind": NodeDrain::kind(&()),
        "metadata": {"name": name, "labels": {MANAGED_BY: super::OPERATOR_NAME, FLEET: fleet}},
        "spec": {"nodeId": state.node_id.as_str(), "force": true, "interruption": interruption},
    });
    let api: Api<NodeDrain> = Api::all(ctx.client.clone());
    let params = PatchParams::apply(&status::field_manager(CONTROLLER)).force();
    if let Err(e) = api.patch(&name, &params, &Patch::Apply(&object)).await {
        tracing::warn!(node = %state.node_id, error = %e, "failed to record the interruption drain");
    }
}
