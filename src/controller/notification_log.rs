//! What the operator's log says about the core's notifications: one line per
//! decision an on-call person needs (placements and recoveries, broken
//! bundles and dropped jobs, drains, migrations, interruptions, spare
//! shortfalls, Manager connection changes), with the ids as fields so a log
//! query can follow one job or node. Routine traffic (job and node updates,
//! audit entries) stays at debug, where every notification is logged whole.
//!
//! Each saga has a span of its own: a drain (`drain{node}`) from its first
//! progress to the phase it ends in, a migration (`migration{migration,job}`)
//! from its first phase to its completion or abort, so a log query (or a
//! tracing backend) follows one saga whole, and the span's close marks its
//! end.

use std::collections::HashMap;

use tracing::Span;

use crate::automanager::{Decision, MigrationId, Notification};
use crate::model::{DrainPhase, NodeId, UnixMillis, wire_name};

/// The log of one term's notifications, with the spans of the sagas in
/// flight.
#[derive(Debug)]
pub(super) struct NotificationLog {
    manager_url: String,
    /// By node and start: a drain cancelled without a final phase does not
    /// lend its span to the node's next drain.
    drains: HashMap<(NodeId, UnixMillis), Span>,
    migrations: HashMap<MigrationId, Span>,
}

impl NotificationLog {
    pub(super) fn new(manager_url: String) -> Self {
        Self {
            manager_url,
            drains: HashMap::new(),
            migrations: HashMap::new(),
        }
    }

    /// Logs `notification` inside its saga's span (opened by the saga's
    /// first notification, closed by its last).
    pub(super) fn log(&mut self, notification: &Notification) {
        let span = self.span_of(notification);
        {
            let _entered = span.as_ref().map(Span::enter);
            log(notification, &self.manager_url);
        }
        self.end_saga(notification);
    }

    fn span_of(&mut self, notification: &Notification) -> Option<Span> {
        match notification {
            Notification::DrainProgress(state) => Some(
                self.drains
                    .entry((state.node_id.clone(), state.started))
                    .or_insert_with(|| tracing::info_span!("drain", node = %state.node_id))
                    .clone(),
            ),
            Notification::MigrationPhase(state) => Some(
                self.migrations
                    .entry(state.migration_id.clone())
                    .or_insert_with(
                        || tracing::info_span!("migration", migration = %state.migration_id, job = %state.job_id),
                    )
                    .clone(),
            ),
            Notification::MigrationCompleted { migration_id, .. }
            | Notification::MigrationAborted { migration_id, .. } => self.migrations.get(migration_id).cloned(),
            _ => None,
        }
    }

    /// Closes the span of a saga `notification` ends.
    fn end_saga(&mut self, notification: &Notification) {
        match notification {
            Notification::DrainProgress(state) if state.phase.is_final() => {
                self.drains.remove(&(state.node_id.clone(), state.started));
            }
            Notification::MigrationCompleted { migration_id, .. }
            | Notification::MigrationAborted { migration_id, .. } => {
                self.migrations.remove(migration_id);
            }
            _ => {}
        }
    }
}

/// Logs `notification` at the level its meaning calls for.
fn log(notification: &Notification, manager_url: &str) {
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
        } => {
            tracing::warn!(job = %job_id, node = %node_id, code = wire_name(&code), detail, "the worker rejected a job")
        }
        Notification::ResilienceDegraded {
            job_id,
            node_id,
            violations,
            ..
        } => tracing::warn!(
            job = %job_id, node = %node_id, violations = ?violations, "resilience degraded"
        ),
        Notification::HeadroomChanged {
            pool,
            domain_kind,
            survives,
            worst,
            why,
        } => {
            let pool = pool.as_deref().unwrap_or("");
            let kind = domain_kind.as_str();
            if *survives {
                tracing::info!(pool, kind, "headroom: the loss of any single {kind} would be absorbed")
            } else {
                tracing::warn!(
                    pool,
                    kind,
                    worst = worst.as_deref().unwrap_or(""),
                    why = why.as_deref().unwrap_or(""),
                    "headroom: the fleet cannot absorb the loss of a {kind}"
                )
            }
        }
        Notification::SpareUnderflow {
            pool,
            effective,
            target,
        } => {
            tracing::warn!(pool, effective, target, "hot spares under target")
        }
        // Logged where it is found (the port), once per connection.
        Notification::ManagerCapabilities { .. } => {}
        Notification::NodeStopping { node_id, reason } => {
            tracing::info!(node = %node_id, reason = wire_name(&reason), "node stopping")
        }
        Notification::NodeUnhealthy { node_id } => tracing::warn!(node = %node_id, "node unhealthy"),
        Notification::NodeInterrupted(state) => tracing::warn!(
            node = %state.node_id, interruption = wire_name(&state.kind), deadline = state.deadline,
            "node interrupted: draining it before the deadline"
        ),
        Notification::DrainProgress(state) => {
            let phase = wire_name(&state.phase);
            let (node, jobs) = (state.node_id.as_str(), state.jobs.len());
            let reason = state.reason.as_deref().unwrap_or_default();
            match state.phase {
                DrainPhase::Partial | DrainPhase::Failed => tracing::warn!(node, phase, jobs, reason, "drain ended"),
                DrainPhase::Done => tracing::info!(node, phase, jobs, "drain ended"),
                _ => tracing::info!(node, phase, jobs, "drain"),
            }
        }
        Notification::MigrationPhase(state) => tracing::info!(
            migration = %state.migration_id, job = %state.job_id, strategy = wire_name(&state.strategy),
            phase = wire_name(&state.phase), source = %state.source_node_id, target = %state.target_node_id,
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

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use serde_json::{Value, json};
    use tracing_subscriber::fmt::format::FmtSpan;

    use super::*;

    /// Every line written, shared with the subscriber.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lines").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The JSON lines `notifications` log, with span opens and closes.
    fn logged(notifications: &[Notification]) -> Vec<Value> {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_span_events(FmtSpan::NEW | FmtSpan::CLOSE)
            .with_writer(move || writer.clone())
            .finish();
        // The log outlives the subscriber: the spans of sagas still in
        // flight are not closed in what it captured.
        let _still_open = tracing::subscriber::with_default(subscriber, || {
            let mut log = NotificationLog::new("http://manager:6790".to_owned());
            for n in notifications {
                log.log(n);
            }
            log
        });
        let bytes = lines.0.lock().expect("lines").clone();
        String::from_utf8(bytes)
            .expect("utf-8")
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }

    fn drain(phase: &str, started: u64) -> Notification {
        Notification::DrainProgress(
            serde_json::from_value(json!({
                "nodeId": "node-a", "phase": phase, "started": started, "timeoutMs": 600000,
                "force": false, "after": "terminate",
                "jobs": [{"jobId": "ns/ch1/0/encode", "status": "migrating", "migrationId": "0000002a"}]
            }))
            .expect("a drain state"),
        )
    }

    fn migration(phase: &str) -> Notification {
        Notification::MigrationPhase(
            serde_json::from_value(json!({
                "migrationId": "0000002a", "jobId": "ns/ch1/0/encode", "strategy": "overlap",
                "phase": phase, "transitions": [{"phase": "placing", "at": 1}],
                "sourceNodeId": "node-a", "sourceKey": "0@1", "targetNodeId": "node-b", "targetKey": "0@2",
                "pastPointOfNoReturn": false
            }))
            .expect("a migration state"),
        )
    }

    fn spans_named<'a>(lines: &'a [Value], name: &str, message: &str) -> Vec<&'a Value> {
        lines
            .iter()
            .filter(|l| l["span"]["name"] == name && l["fields"]["message"] == message)
            .collect()
    }

    #[test]
    fn each_saga_logs_inside_one_span_closed_when_the_saga_ends() {
        let lines = logged(&[
            drain("migrating", 1),
            migration("placing"),
            migration("starting"),
            drain("migrating", 1),
            Notification::MigrationCompleted {
                migration_id: MigrationId("0000002a".to_owned()),
                job_id: "ns/ch1/0/encode".into(),
            },
            drain("done", 1),
            drain("migrating", 2),
        ]);
        // Two drains of node-a (started 1 and 2): two spans, the first closed.
        assert_eq!(spans_named(&lines, "drain", "new").len(), 2, "{lines:#?}");
        assert_eq!(spans_named(&lines, "drain", "close").len(), 1, "{lines:#?}");
        assert_eq!(spans_named(&lines, "migration", "new").len(), 1, "{lines:#?}");
        assert_eq!(spans_named(&lines, "migration", "close").len(), 1, "{lines:#?}");
        // Every saga line carries its span's ids.
        let in_span = |name: &str, message: &str| {
            lines
                .iter()
                .filter(|l| l["fields"]["message"] == message)
                .all(|l| l["span"]["name"] == name)
        };
        assert!(
            in_span("drain", "drain") && in_span("drain", "drain ended"),
            "{lines:#?}"
        );
        assert!(in_span("migration", "migration") && in_span("migration", "migration done"));
        let done = lines
            .iter()
            .find(|l| l["fields"]["message"] == "migration done")
            .expect("logged");
        assert_eq!(done["span"]["migration"], "0000002a");
        assert_eq!(done["span"]["job"], "ns/ch1/0/encode");
        assert_eq!(
            lines
                .iter()
                .find(|l| l["fields"]["message"] == "drain ended")
                .map(|l| &l["span"]["node"]),
            Some(&json!("node-a"))
        );
    }
}
