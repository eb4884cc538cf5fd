//! What the operator's log says about the core's notifications: one line per
//! decision an on-call person needs (placements and recoveries, broken
//! bundles and dropped jobs, drains, migrations, interruptions, spare
//! shortfalls, Manager connection changes), with the ids as fields so a log
//! query can follow one job or node. Routine traffic (job and node updates,
//! audit entries) stays at debug, where every notification is logged whole.

use crate::automanager::{Decision, Notification};

/// The spec's name of a phase or kind (its JSON form).
fn name(value: impl serde::Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Logs `notification` at the level its meaning calls for.
pub(super) fn log(notification: &Notification, manager_url: &str) {
    match notification {
        // The stream itself logs opening (with the snapshot) and losing it.
        Notification::ConnectionStateChange { state } if state == "shutdown" => {
            tracing::info!(manager = manager_url, "Manager connection closed")
        }
        Notification::PlacementDecision(info) => {
            let (bundle, replica, job) = (info.bundle_id.as_str(), info.replica_index, info.job_name.as_str());
            let what = if info.recovery { "recovery" } else { "placement" };
            match &info.decision {
                Decision::Placed {
                    node_id, pool, tier, ..
                } => tracing::info!(
                    bundle, replica, job, node = %node_id, pool, tier, what, "placed"
                ),
                Decision::Provision {
                    node_id,
                    pool,
                    tier,
                    instance_type,
                    ..
                } => tracing::info!(
                    bundle, replica, job, node = %node_id, pool, tier, instance_type, what,
                    "placed on a node being provisioned"
                ),
                Decision::NoCapacityInAnyPool => {
                    tracing::warn!(bundle, replica, job, what, "no capacity in any pool")
                }
            }
        }
        Notification::PlacementFailed { job_id, reason } => {
            tracing::warn!(job = %job_id, reason, "placement failed")
        }
        Notification::BundleBroken { bundle_id, reason } => {
            tracing::error!(bundle = %bundle_id, reason, "bundle broken: its production ended")
        }
        Notification::JobDropped { job_id, reason } => tracing::warn!(job = %job_id, reason, "job dropped"),
        Notification::JobRejected {
            job_id,
            node_id,
            code,
            detail,
            ..
        } => tracing::warn!(job = %job_id, node = %node_id, code = name(code), detail, "the worker rejected a job"),
        Notification::ResilienceDegraded {
            job_id,
            node_id,
            violations,
            ..
        } => tracing::warn!(
            job = %job_id, node = %node_id, violations = ?violations, "resilience degraded"
        ),
        Notification::SpareUnderflow {
            pool,
            effective,
            target,
        } => {
            tracing::warn!(pool, effective, target, "hot spares under target")
        }
        // Logged where it is found (the runtime), once per RPC.
        Notification::ManagerLacksExtension { .. } => {}
        Notification::NodeStopping { node_id, reason } => {
            tracing::info!(node = %node_id, reason = name(reason), "node stopping")
        }
        Notification::NodeUnhealthy { node_id } => tracing::warn!(node = %node_id, "node unhealthy"),
        Notification::NodeInterrupted(state) => tracing::warn!(
            node = %state.node_id, interruption = name(state.kind), deadline = state.deadline,
            "node interrupted: draining it before the deadline"
        ),
        Notification::DrainProgress(state) => {
            let phase = name(state.phase);
            let (node, jobs) = (state.node_id.as_str(), state.jobs.len());
            let reason = state.reason.as_deref().unwrap_or_default();
            match phase.as_str() {
                "partial" | "failed" => tracing::warn!(node, phase, jobs, reason, "drain ended"),
                "done" => tracing::info!(node, phase, jobs, "drain ended"),
                _ => tracing::info!(node, phase, jobs, "drain"),
            }
        }
        Notification::MigrationPhase(state) => tracing::info!(
            migration = %state.migration_id, job = %state.job_id, strategy = name(state.strategy),
            phase = name(state.phase), source = %state.source_node_id, target = %state.target_node_id,
            "migration"
        ),
        Notification::MigrationCompleted { migration_id, job_id } => {
            tracing::info!(migration = %migration_id, job = %job_id, "migration done")
        }
        Notification::MigrationAborted {
            migration_id,
            job_id,
            reason,
            lost,
        } => tracing::warn!(migration = %migration_id, job = %job_id, reason, lost, "migration aborted"),
        _ => {}
    }
}
