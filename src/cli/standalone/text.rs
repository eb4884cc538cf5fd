//! `--events text`: one readable line per notification.

use crate::automanager::{Decision, Notification, PlacementDecisionInfo};

/// A readable line for a notification.
pub fn describe(notification: &Notification) -> String {
    match notification {
        Notification::ConnectionStateChange { state } => format!("manager      {state}"),
        Notification::Error { message } => format!("error        {message}"),
        Notification::JobUpdated { job } => format!("job          {} {:?}", job.job_id, job.state),
        Notification::JobInfo { job_id, text, .. } => format!("job info     {job_id}: {text}"),
        Notification::JobDeleted { job_id } => format!("job deleted  {job_id}"),
        Notification::JobRejected {
            job_id,
            node_id,
            code,
            detail,
            ..
        } => format!("rejected     {job_id} on {node_id}: {code:?} {detail}"),
        Notification::JobDropped { job_id, reason } => format!("dropped      {job_id}: {reason}"),
        Notification::NodeStarting { node } => format!("node         {} starting", node.node_id),
        Notification::NodeStarted { node } => format!("node         {} started", node.node_id),
        Notification::NodeStopping { node_id, reason } => format!("node         {node_id} stopping ({reason:?})"),
        Notification::NodeStopped { node_id } => format!("node         {node_id} stopped"),
        Notification::NodeTerminated { node_id } => format!("node         {node_id} terminated"),
        Notification::TerminateRefused { node_id, reason } => {
            format!("node         {node_id} terminate refused: {reason}")
        }
        Notification::NodeUnhealthy { node_id } => format!("node         {node_id} unhealthy"),
        Notification::NodeHealthy { node_id } => format!("node         {node_id} healthy"),
        Notification::BundleUpdated { bundle } => format!("bundle       {} updated", bundle.bundle_id),
        Notification::BundleDeleted { bundle_id } => format!("bundle       {bundle_id} deleted"),
        Notification::BundleBroken { bundle_id, reason } => format!("BROKEN       {bundle_id}: {reason}"),
        Notification::BundleSchedule {
            bundle_id,
            phase,
            next_phase,
            next_at,
        } => match (next_phase, next_at) {
            (Some(next), Some(at)) => format!(
                "schedule     {bundle_id} {} (then {} at {})",
                phase.as_str(),
                next.as_str(),
                crate::model::DateTime::from_millis(*at)
            ),
            _ => format!("schedule     {bundle_id} {}", phase.as_str()),
        },
        Notification::BundleJobStarted { job_id } => format!("started      {job_id}"),
        Notification::BundleJobStopped { job_id } => format!("stopped      {job_id}"),
        Notification::PlacementDecision(info) => placement(info),
        Notification::PlacementFailed { job_id, reason } => format!("unplaced     {job_id}: {reason}"),
        Notification::ResilienceDegraded { job_id, violations, .. } => format!("degraded     {job_id}: {violations:?}"),
        Notification::SpareUnderflow {
            pool,
            effective,
            target,
        } => {
            format!("spares       {pool} short: {effective} of {target}")
        }
        Notification::BundleHeadroomChanged { bundle_id } => {
            format!("headroom     bundle {bundle_id}: what a node loss does to it changed")
        }
        Notification::HeadroomChanged {
            pool,
            domain_kind,
            survives,
            worst,
            why,
        } => headroom(
            pool.as_deref(),
            domain_kind.as_str(),
            *survives,
            worst.as_deref(),
            why.as_deref(),
        ),
        Notification::ImagesPrefetched { node_id, results } => {
            format!("prefetched   {node_id}: {} image(s)", results.len())
        }
        Notification::AuditAppended { entry } => format!("audit        {} {}", entry.action, entry.subject),
        Notification::ManagerCapabilities { capabilities } => format!(
            "MANAGER      {}",
            capabilities
                .iter()
                .map(|(c, m)| format!("{c}={m}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Notification::DrainProgress(state) => format!(
            "drain        {} {:?} ({} job(s))",
            state.node_id,
            state.phase,
            state.jobs.len()
        ),
        Notification::NodeInterrupted(state) => {
            format!(
                "interrupted  {} {:?}, drain {:?}",
                state.node_id, state.kind, state.drain.phase
            )
        }
        Notification::MigrationPhase(state) => format!(
            "migration    {} {}: {:?} ({} -> {})",
            state.migration_id, state.job_id, state.phase, state.source_node_id, state.target_node_id
        ),
        Notification::MigrationCompleted { migration_id, job_id } => {
            format!("migrated     {job_id} ({migration_id})")
        }
        Notification::MigrationAborted {
            migration_id,
            job_id,
            reason,
            lost,
        } => {
            let verb = if *lost { "mig. lost" } else { "mig. abort" };
            format!("{verb:<12} {job_id} ({migration_id}): {reason}")
        }
    }
}

/// A placement decision's line: where the job went, or that it found no room.
fn placement(info: &PlacementDecisionInfo) -> String {
    let verb = if info.recovery { "recovered" } else { "placed" };
    match &info.decision {
        Decision::Placed { node_id, tier, .. } => format!("{verb:<12} {} on {node_id} ({tier})", info.job_id),
        Decision::Provision {
            node_id,
            tier,
            instance_type,
            ..
        } => format!("{verb:<12} {} on new {instance_type} {node_id} ({tier})", info.job_id),
        Decision::NoCapacityInAnyPool => format!("{verb:<12} {} nowhere: no capacity", info.job_id),
    }
}

/// A headroom verdict's line, for a pool or (without one) the fleet: the
/// loss of any single domain of `kind` absorbed, or the worst one and why not.
fn headroom(pool: Option<&str>, kind: &str, survives: bool, worst: Option<&str>, why: Option<&str>) -> String {
    let scope = pool.map_or_else(|| "fleet".to_owned(), |p| format!("pool {p}"));
    if survives {
        format!("headroom     {scope} survives the loss of any single {kind}")
    } else {
        format!(
            "HEADROOM     {scope} cannot absorb the loss of {kind} {}: {}",
            worst.unwrap_or("?"),
            why.unwrap_or("")
        )
    }
}
