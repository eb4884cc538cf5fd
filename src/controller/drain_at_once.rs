//! The `NodeDrain` modes that act at once: `evict` (`evictNode`: cordon,
//! then terminate) and `terminate` (`terminateNode`: terminate without
//! cordoning). Nothing migrates and nothing waits for a timeout: the jobs
//! on the node go down with it and recover per their `onRuntimeFailure`.
//!
//! The terminate is issued once. The status records `terminating` as soon
//! as it is, and a later reconcile, a restart or the next leader reads that
//! phase and only waits for the outcome: `done` once Manager stops the node
//! (it reports it stopping or stopped, or no longer lists it), `failed`
//! when the core or Manager refused the terminate. There is nothing to
//! cancel, so the finalizer lets such a `NodeDrain` go without uncordoning
//! anything (see [`super::drain`]'s cleanup).

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use crate::automanager::CommandError;
use crate::crd::{DrainMode, NodeDrain, NodeDrainStatus};
use crate::model::{DrainPhase, NodeId, NodePhase, wire_name};

use super::ReconcileError;
use super::drain::{publish, recorded, writer};
use super::drain_follow::{DrainContext, after_status};
use super::error::ApplyError;
use crate::decide::conditions::{Observed, READY, STALLED};
use crate::decide::drain_status::{RECONCILING, conditions_of, rfc3339};

/// Reconciles an `evict` or `terminate` `NodeDrain`: issues its terminate
/// unless the status says it was, then follows it to its end.
pub(super) async fn apply(drain: &NodeDrain, shared: &DrainContext, mode: DrainMode) -> Result<Action, ReconcileError> {
    let node = NodeId::from(drain.spec.node_id.as_str());
    let recorded = recorded(drain, shared);
    let next = match recorded.phase {
        Some(phase) if phase.is_final() => return Ok(Action::await_change()),
        // Issued already, by this term or an earlier one: never again.
        Some(_) => settle(shared, &node, &recorded).await?,
        None => issue(drain, shared, mode, &node).await?,
    };
    let ended = next.phase.is_some_and(DrainPhase::is_final);
    if ended {
        let (type_, reason) = match next.phase {
            Some(DrainPhase::Done) => (EventType::Normal, "DrainDone"),
            _ => (EventType::Warning, "DrainFailed"),
        };
        let note = format!(
            "{} of {node} is {}: {}",
            mode_name(mode),
            next.phase.as_ref().map(wire_name).unwrap_or_default(),
            reason_of(&next)
        );
        publish(drain, shared, type_, reason, note);
    }
    let conditions = conditions_at_once(mode, &next);
    writer(&shared.ctx)
        .merge_and_write(drain, &recorded, next, conditions)
        .await?;
    Ok(after_status(ended))
}

/// Issues the terminate (cordoning first for `evict`); the status that
/// records it, or the refusal.
async fn issue(
    drain: &NodeDrain,
    shared: &DrainContext,
    mode: DrainMode,
    node: &NodeId,
) -> Result<NodeDrainStatus, ReconcileError> {
    let core = &shared.ctx.core;
    let asked = node.clone();
    let jobs: Vec<String> = core
        .node_views()
        .await?
        .into_iter()
        .find(|n| n.id == asked)
        .map(|n| n.jobs.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    // A refusal heard for an earlier terminate of the node is not this one's.
    shared.forget_refused_terminate(node);
    let result = match mode {
        DrainMode::Evict => core.evict_node(node.clone()).await,
        _ => core.terminate_node(node.clone()).await,
    };
    let started = rfc3339(Timestamp::now().as_millisecond());
    match result {
        Ok(()) => {
            let reason = issued_words(mode, &jobs);
            publish(
                drain,
                shared,
                EventType::Normal,
                if mode == DrainMode::Evict {
                    "NodeEvicted"
                } else {
                    "NodeTerminated"
                },
                format!("{node}: {reason}"),
            );
            Ok(NodeDrainStatus {
                phase: Some(DrainPhase::Terminating),
                started,
                reason: Some(reason),
                ..NodeDrainStatus::default()
            })
        }
        Err(e @ (CommandError::UnknownNode(_) | CommandError::NodeGone(_))) => Ok(NodeDrainStatus {
            phase: Some(DrainPhase::Failed),
            started,
            reason: Some(format!("the terminate was refused: {e}")),
            ..NodeDrainStatus::default()
        }),
        Err(source) => Err(ApplyError::Command {
            action: mode_name(mode),
            object: format!("node {node} (NodeDrain {})", drain.name_any()),
            source,
        }
        .into()),
    }
}

/// What became of a terminate issued earlier: `done` once Manager stops
/// the node or no longer lists it, `failed` once Manager refused it, else
/// still `terminating`.
async fn settle(
    shared: &DrainContext,
    node: &NodeId,
    recorded: &NodeDrainStatus,
) -> Result<NodeDrainStatus, ReconcileError> {
    let asked = node.clone();
    let phase = shared
        .ctx
        .core
        .node_views()
        .await?
        .into_iter()
        .find(|n| n.id == asked)
        .map(|n| n.phase);
    let issued = recorded.reason.clone().unwrap_or_default();
    let mut next = recorded.clone();
    match (phase, shared.refused_terminate(node)) {
        (None | Some(NodePhase::Stopping | NodePhase::Stopped), _) => {
            next.phase = Some(DrainPhase::Done);
            next.reason = Some(format!("Manager stopped the node ({issued})"));
        }
        (_, Some(why)) => {
            next.phase = Some(DrainPhase::Failed);
            next.reason = Some(format!("Manager refused the terminate: {why}"));
        }
        _ => {}
    }
    Ok(next)
}

/// `cordoned and terminated at once with 2 job(s) on it, which recover per
/// their onRuntimeFailure: a, b`.
fn issued_words(mode: DrainMode, jobs: &[String]) -> String {
    let what = if mode == DrainMode::Evict {
        "cordoned and terminated at once"
    } else {
        "terminated at once"
    };
    if jobs.is_empty() {
        format!("{what}, with no job on it")
    } else {
        format!(
            "{what} with {} job(s) on it, which recover per their onRuntimeFailure: {}",
            jobs.len(),
            jobs.join(", ")
        )
    }
}

fn mode_name(mode: DrainMode) -> &'static str {
    match mode {
        DrainMode::Evict => "evict",
        DrainMode::Terminate => "terminate",
        DrainMode::Drain => "drain",
    }
}

fn reason_of(status: &NodeDrainStatus) -> &str {
    status.reason.as_deref().unwrap_or_default()
}

/// The conditions of an `evict` or `terminate`: `Ready` once Manager
/// stopped the node — the jobs that were on it were meant to go down with
/// it, so, unlike a drain's, this is no loss — and otherwise a drain's
/// (`Reconciling` while terminating, `Stalled` with the reason once failed).
fn conditions_at_once(mode: DrainMode, status: &NodeDrainStatus) -> Vec<Observed> {
    if status.phase != Some(DrainPhase::Done) {
        return conditions_of(status);
    }
    let message = format!("{}: {}", mode_name(mode), reason_of(status));
    vec![
        Observed::yes(READY, "Terminated", message),
        Observed::no(RECONCILING, "Terminated", ""),
        Observed::no(STALLED, "Terminated", ""),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::fixture::said;

    fn at(phase: DrainPhase, reason: &str) -> NodeDrainStatus {
        NodeDrainStatus {
            phase: Some(phase),
            reason: Some(reason.to_owned()),
            ..NodeDrainStatus::default()
        }
    }

    #[test]
    fn an_eviction_names_the_jobs_that_recover_per_their_on_runtime_failure() {
        assert_eq!(
            issued_words(DrainMode::Evict, &["ns/b/0/enc".to_owned()]),
            "cordoned and terminated at once with 1 job(s) on it, which recover per their onRuntimeFailure: ns/b/0/enc"
        );
        assert_eq!(
            issued_words(DrainMode::Terminate, &[]),
            "terminated at once, with no job on it"
        );
    }

    #[test]
    fn a_done_eviction_is_ready_though_its_jobs_went_down_with_the_node() {
        let done = at(
            DrainPhase::Done,
            "Manager stopped the node (cordoned and terminated at once)",
        );
        assert_eq!(
            said(&conditions_at_once(DrainMode::Evict, &done)),
            [
                (
                    READY,
                    "True",
                    "Terminated",
                    "evict: Manager stopped the node (cordoned and terminated at once)"
                ),
                (RECONCILING, "False", "Terminated", ""),
                (STALLED, "False", "Terminated", ""),
            ]
        );
    }

    #[test]
    fn a_terminate_in_flight_reconciles_and_a_refused_one_stalls_with_why() {
        let terminating = conditions_at_once(DrainMode::Terminate, &at(DrainPhase::Terminating, "terminated at once"));
        assert!(terminating.iter().any(|c| c.type_ == RECONCILING && c.status));
        let failed = conditions_at_once(
            DrainMode::Terminate,
            &at(DrainPhase::Failed, "Manager refused the terminate: no"),
        );
        assert_eq!(
            said(&failed)[2],
            (STALLED, "True", "Failed", "Manager refused the terminate: no")
        );
    }
}
