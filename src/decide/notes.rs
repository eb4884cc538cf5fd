//! What the front ends learn from the core's notifications rather than
//! from its state: per job, the last placement decision in words and the
//! resilience rules its placement could not honour ("every seed callback
//! becomes a Kubernetes Event on the object it concerns"), and which
//! `Bundle` a notification is about, so its Event lands there and its status
//! is recomputed.

use std::collections::HashMap;

use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;

use crate::automanager::{Decision, Notification};
use crate::crd::Bundle;
use crate::model::{
    BundleId, DateTime, JobHistoryEntry, JobId, JobStopReason, NodeId, RuntimeJob, SchedulePhase, UnixMillis,
};

/// What notifications said about one job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobNotes {
    /// The last placement decision, in words.
    pub last_placement: Option<String>,
    /// The resilience rules the last placement could not honour.
    pub resilience_degraded: Option<String>,
}

/// Per job, what notifications said (kept while the operator runs; a new
/// leader starts empty and fills in as placements happen).
#[derive(Debug, Default)]
pub struct Notes {
    jobs: HashMap<JobId, JobNotes>,
}

impl Notes {
    /// Takes in one notification.
    pub fn record(&mut self, notification: &Notification) {
        match notification {
            Notification::PlacementDecision(info) => {
                // A new decision supersedes the old one's degradation; the
                // core reports a degradation right after its decision.
                let notes = self.jobs.entry(info.job_id.clone()).or_default();
                let mut words = describe_decision(&info.decision, info.recovery);
                // What decided it (a tier at maxNodes, no shape fitting, the
                // nodes' verdicts), when the decision carries its trace.
                if info.decision == Decision::NoCapacityInAnyPool
                    && let Some(trace) = &info.trace
                {
                    words = format!("{words}: {}", trace.why_not_placed());
                }
                notes.last_placement = Some(words);
                notes.resilience_degraded = None;
            }
            Notification::ResilienceDegraded { job_id, violations, .. } => {
                let words: Vec<String> = violations
                    .iter()
                    .map(|v| serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_owned)))
                    .map(Option::unwrap_or_default)
                    .collect();
                let text = if words.is_empty() {
                    "interruptible primary without a durable backup".to_owned()
                } else {
                    format!("forbidden {} not honoured", words.join(", "))
                };
                self.jobs.entry(job_id.clone()).or_default().resilience_degraded = Some(text);
            }
            Notification::JobDeleted { job_id } => {
                self.jobs.remove(job_id);
            }
            _ => {}
        }
    }

    /// What is known of `job`.
    pub fn job(&self, job: &JobId) -> JobNotes {
        self.jobs.get(job).cloned().unwrap_or_default()
    }
}

fn describe_decision(decision: &Decision, recovery: bool) -> String {
    let verb = if recovery { "re-placed" } else { "placed" };
    match decision {
        Decision::Placed {
            node_id, pool, tier, ..
        } => format!("{verb} on {node_id} (pool {pool}, tier {tier})"),
        Decision::Provision {
            node_id,
            pool,
            tier,
            instance_type,
            ..
        } => format!("{verb} on new {instance_type} node {node_id} (pool {pool}, tier {tier})"),
        Decision::NoCapacityInAnyPool => "no capacity in any pool".to_owned(),
    }
}

/// The `Bundle` resource of a bundle id (`<namespace>/<name>`); none for a
/// bundle this operator did not create from a resource.
pub fn bundle_ref(bundle_id: &BundleId) -> Option<ObjectRef<Bundle>> {
    let (namespace, name) = bundle_id.as_str().split_once('/')?;
    (!name.contains('/')).then(|| ObjectRef::new(name).within(namespace))
}

/// The `Bundle` resource a runtime job belongs to: job ids are
/// `<bundle id>/<replica>/<job name>` and resource names hold no `/`.
pub fn bundle_ref_of_job(job: &JobId) -> Option<ObjectRef<Bundle>> {
    let mut parts = job.as_str().splitn(3, '/');
    let (namespace, name) = (parts.next()?, parts.next()?);
    parts.next()?;
    Some(ObjectRef::new(name).within(namespace))
}

/// The bundle a notification is about, if any.
pub fn bundle_of(notification: &Notification) -> Option<ObjectRef<Bundle>> {
    match notification {
        Notification::JobUpdated { job } => bundle_ref_of_job(&job.job_id),
        Notification::JobInfo { job_id, .. }
        | Notification::JobDeleted { job_id }
        | Notification::JobRejected { job_id, .. }
        | Notification::JobDropped { job_id, .. }
        | Notification::PlacementFailed { job_id, .. }
        | Notification::ResilienceDegraded { job_id, .. } => bundle_ref_of_job(job_id),
        Notification::BundleUpdated { bundle } => bundle_ref(&bundle.bundle_id),
        Notification::BundleDeleted { bundle_id }
        | Notification::BundleBroken { bundle_id, .. }
        | Notification::BundleSchedule { bundle_id, .. }
        | Notification::BundleHeadroomChanged { bundle_id } => bundle_ref(bundle_id),
        Notification::BundleJobStarted { job_id } | Notification::BundleJobStopped { job_id } => {
            bundle_ref_of_job(job_id)
        }
        Notification::PlacementDecision(info) => bundle_ref(&info.bundle_id),
        _ => None,
    }
}

/// The Event of a schedule's phase change.
fn schedule_event(phase: SchedulePhase, next_phase: Option<SchedulePhase>, next_at: Option<UnixMillis>) -> Event {
    let then = match (next_phase, next_at) {
        (Some(next), Some(at)) => format!("; {} at {}", next.as_str(), DateTime::from_millis(at)),
        _ => String::new(),
    };
    let (reason, words) = match phase {
        SchedulePhase::Waiting => ("Scheduled", "rescheduled: waiting for its placement lead"),
        SchedulePhase::Placing => (
            "PlacingAhead",
            "the placement lead began: its jobs are placed ahead of the start",
        ),
        SchedulePhase::Live => ("Live", "the schedule's start: on air"),
        SchedulePhase::Ended => (
            "Ended",
            "the schedule's end: its jobs are completed and not placed again",
        ),
    };
    event(EventType::Normal, reason, "Schedule", format!("{words}{then}"))
}

fn event(type_: EventType, reason: &str, action: &str, note: String) -> Event {
    Event {
        type_,
        reason: reason.to_owned(),
        // events.k8s.io caps a note at 1 kB.
        note: Some(note.chars().take(1000).collect()),
        action: action.to_owned(),
        secondary: None,
    }
}

/// The Kubernetes Event a notification about a bundle becomes.
pub fn bundle_event(notification: &Notification) -> Option<Event> {
    use EventType::{Normal, Warning};
    Some(match notification {
        Notification::PlacementDecision(info) => {
            let what = describe_decision(&info.decision, info.recovery);
            let note = format!("job {} of replica {}: {what}", info.job_name, info.replica_index);
            match (&info.decision, info.recovery) {
                (Decision::NoCapacityInAnyPool, _) => event(Warning, "NoCapacity", "Place", note),
                (_, true) => event(Normal, "Recovered", "Place", note),
                (Decision::Provision { .. }, false) => event(Normal, "Provisioning", "Place", note),
                (Decision::Placed { .. }, false) => event(Normal, "Placed", "Place", note),
            }
        }
        Notification::PlacementFailed { job_id, reason } => {
            event(Warning, "PlacementFailed", "Place", format!("{job_id}: {reason}"))
        }
        Notification::JobUpdated { job } => job_event(job)?,
        Notification::JobRejected {
            job_id,
            role,
            node_id,
            code,
            detail,
            inventory,
        } => {
            // What the worker said it holds, beside why it refused.
            let holds = inventory.as_ref().map_or(String::new(), |i| {
                format!(
                    " (it holds {} capacity, {} cores, {} GPUs)",
                    i.total_capacity,
                    i.total_cores,
                    i.gpus.len()
                )
            });
            event(
                Warning,
                "JobRejected",
                "Start",
                format!("{node_id} refused {job_id} ({role}): {code:?}: {detail}{holds}"),
            )
        }
        Notification::JobDropped { job_id, reason } => {
            event(Warning, "JobDropped", "Recover", format!("{job_id}: {reason}"))
        }
        Notification::JobInfo { job_id, role, text } => {
            event(Normal, "JobInfo", "Run", format!("{job_id} ({role}): {text}"))
        }
        Notification::BundleBroken { reason, .. } => event(Warning, "BundleBroken", "Recover", reason.clone()),
        Notification::ResilienceDegraded {
            job_id,
            node_id,
            violations,
            interruptible_primary_without_durable_backup,
        } => event(
            Warning,
            "ResilienceDegraded",
            "Place",
            format!(
                "{job_id} on {node_id}: violates {violations:?}{}",
                if *interruptible_primary_without_durable_backup {
                    "; interruptible primary without a durable backup"
                } else {
                    ""
                }
            ),
        ),
        Notification::BundleDeleted { bundle_id } => {
            event(Normal, "Deleted", "Delete", format!("{bundle_id} removed from Manager"))
        }
        Notification::BundleSchedule {
            phase,
            next_phase,
            next_at,
            ..
        } => schedule_event(*phase, *next_phase, *next_at),
        Notification::BundleJobStarted { job_id } => event(
            Normal,
            "ManualStart",
            "Start",
            format!("{job_id} started: it is placed and runs until stopped"),
        ),
        Notification::BundleJobStopped { job_id } => event(
            Normal,
            "ManualStop",
            "Stop",
            format!("{job_id} stopped: dormant, its instance stopped and not recovered"),
        ),
        _ => return None,
    })
}

/// The Event of a job's latest history entry: running, stopping (a
/// warning unless a person asked for the stop) or stopped; none for
/// another entry.
fn job_event(job: &RuntimeJob) -> Option<Event> {
    use EventType::{Normal, Warning};
    let id = &job.job_id;
    Some(match job.history.last()? {
        JobHistoryEntry::Running { role, node_id, .. } => event(
            Normal,
            "JobRunning",
            "Run",
            format!("{id} running as {role} on {}", node_or_unknown(node_id.as_ref())),
        ),
        JobHistoryEntry::Stopping {
            role, node_id, reason, ..
        } => {
            let type_ = if matches!(reason, JobStopReason::UserRequested) {
                Normal
            } else {
                Warning
            };
            event(
                type_,
                "JobStopping",
                "Run",
                format!(
                    "{id} ({role}) stopping on {}: {reason:?}",
                    node_or_unknown(node_id.as_ref())
                ),
            )
        }
        JobHistoryEntry::Stopped { role, node_id, .. } => event(
            Normal,
            "JobStopped",
            "Run",
            format!("{id} ({role}) stopped on {}", node_or_unknown(node_id.as_ref())),
        ),
        _ => return None,
    })
}

/// The pool a headroom verdict is about and the Event it becomes on its
/// `PlacementPool`: `HeadroomLost` (a warning naming the worst domain and
/// why) or `HeadroomRestored`. The fleet-wide verdict has no resource.
pub fn pool_event(notification: &Notification) -> Option<(&str, Event)> {
    let Notification::HeadroomChanged {
        pool: Some(pool),
        domain_kind,
        survives,
        worst,
        why,
    } = notification
    else {
        return None;
    };
    let kind = domain_kind.as_str();
    let event = if *survives {
        event(
            EventType::Normal,
            "HeadroomRestored",
            "Analyse",
            format!("the pool absorbs the loss of any single {kind}"),
        )
    } else {
        event(
            EventType::Warning,
            "HeadroomLost",
            "Analyse",
            format!(
                "the pool cannot absorb the loss of {kind} {}: {}",
                worst.as_deref().unwrap_or("?"),
                why.as_deref().unwrap_or("")
            ),
        )
    };
    Some((pool.as_str(), event))
}

/// A node in words for its Events: what it is, where, and which pool and tier it serves.
fn describe_node(node: &crate::model::NodeInfo) -> String {
    use crate::model::{ProviderMetadata, tags};
    let what = match &node.provider {
        ProviderMetadata::Aws { instance_type, region } => format!("an AWS {instance_type} in {region}"),
        ProviderMetadata::Test { instance_type, region } => format!("a {instance_type} in {region}"),
        ProviderMetadata::Oci => "an OCI instance".to_owned(),
        ProviderMetadata::Unknown => "a node".to_owned(),
    };
    match (node.tags.get(tags::POOL), node.tags.get(tags::TIER)) {
        (Some(pool), Some(tier)) => format!("{what} (pool {pool}, tier {tier})"),
        (Some(pool), None) => format!("{what} (pool {pool})"),
        _ => what,
    }
}

/// The node a notification is about and the Event it becomes on its
/// `NorskNode`. Every Event carries a note.
pub fn node_event(notification: &Notification) -> Option<(&NodeId, Event)> {
    use EventType::{Normal, Warning};
    Some(match notification {
        Notification::NodeStarting { node } => (
            &node.node_id,
            event(
                Normal,
                "Starting",
                "Provision",
                format!("starting {}", describe_node(node)),
            ),
        ),
        Notification::NodeStarted { node } => (
            &node.node_id,
            event(
                Normal,
                "Started",
                "Provision",
                format!("{} is up and connected", describe_node(node)),
            ),
        ),
        Notification::NodeStopping { node_id, reason } => {
            (node_id, event(Warning, "Stopping", "Run", format!("{reason:?}")))
        }
        Notification::NodeStopped { node_id } => (
            node_id,
            event(Normal, "Stopped", "Run", "Manager reports the node gone".to_owned()),
        ),
        Notification::NodeTerminated { node_id } => (
            node_id,
            event(
                Normal,
                "Terminated",
                "Terminate",
                "this operator terminated the node".to_owned(),
            ),
        ),
        Notification::NodeUnhealthy { node_id } => (
            node_id,
            event(
                Warning,
                "Unhealthy",
                "Place",
                "excluded from placement after repeated job rejections".to_owned(),
            ),
        ),
        Notification::NodeHealthy { node_id } => (
            node_id,
            event(
                Normal,
                "Healthy",
                "Place",
                "placement may use the node again".to_owned(),
            ),
        ),
        Notification::JobRejected {
            job_id,
            node_id,
            code,
            detail,
            ..
        } => (
            node_id,
            event(
                Warning,
                "JobRejected",
                "Start",
                format!("refused {job_id}: {code:?}: {detail}"),
            ),
        ),
        _ => return None,
    })
}

fn node_or_unknown(node: Option<&NodeId>) -> String {
    node.map_or_else(|| "an unknown node".to_owned(), ToString::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_s_headroom_verdict_becomes_an_event_on_its_pool_and_the_fleet_s_none() {
        use crate::placement::headroom::DomainKind;
        let lost = Notification::HeadroomChanged {
            pool: Some("studio".to_owned()),
            domain_kind: DomainKind::Node,
            survives: false,
            worst: Some("n1".to_owned()),
            why: Some("bundle b goes dark".to_owned()),
        };
        let (pool, event) = pool_event(&lost).expect("an Event");
        assert_eq!((pool, event.reason.as_str()), ("studio", "HeadroomLost"));
        assert_eq!(event.type_, EventType::Warning);
        assert_eq!(
            event.note.as_deref(),
            Some("the pool cannot absorb the loss of node n1: bundle b goes dark")
        );
        let restored = Notification::HeadroomChanged {
            pool: Some("studio".to_owned()),
            domain_kind: DomainKind::Zone,
            survives: true,
            worst: None,
            why: None,
        };
        assert_eq!(
            pool_event(&restored).map(|(_, e)| e.reason),
            Some("HeadroomRestored".to_owned())
        );
        let fleet = Notification::HeadroomChanged {
            pool: None,
            domain_kind: DomainKind::Node,
            survives: false,
            worst: Some("n1".to_owned()),
            why: None,
        };
        assert!(pool_event(&fleet).is_none());
    }

    #[test]
    fn a_runtime_job_id_names_its_bundle_resource() {
        let r = bundle_ref_of_job(&JobId("ns/ch1/0/encode".into())).unwrap();
        assert_eq!(r.name, "ch1");
        assert_eq!(r.namespace.as_deref(), Some("ns"));
        assert!(bundle_ref_of_job(&JobId("plain".into())).is_none());
        assert!(bundle_ref(&BundleId("b1".into())).is_none());
    }

    #[test]
    fn a_node_starting_and_started_say_what_the_node_is() {
        let node = crate::model::NodeInfo {
            node_id: NodeId::from("production-reserved-4"),
            tags: [("pool", "production"), ("tier", "reserved")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            created_at: None,
            provider: crate::model::ProviderMetadata::Aws {
                instance_type: "m5.xlarge".to_owned(),
                region: "eu-west-1".to_owned(),
            },
        };
        let starting = Notification::NodeStarting { node: node.clone() };
        let (_, starting) = node_event(&starting).expect("an Event");
        assert_eq!(
            starting.note.as_deref(),
            Some("starting an AWS m5.xlarge in eu-west-1 (pool production, tier reserved)")
        );
        let started = Notification::NodeStarted { node };
        let (_, started) = node_event(&started).expect("an Event");
        assert!(started.note.is_some_and(|n| n.ends_with("is up and connected")));
    }
}
