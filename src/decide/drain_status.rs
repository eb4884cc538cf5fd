//! What a `NodeDrain`'s status says: the core's `DrainState` (phase, jobs
//! with their status, migration and reason) and the conditions derived
//! from it — `Ready` once the drain is `done` (every job moved off),
//! `Stalled` when it ended `partial` or `failed` (with the reason; reason
//! `JobsLost` when jobs went down with the node), `Reconciling` while it
//! runs. Pure: the operator's controller and `standalone` feed it what the
//! core reports.

use k8s_openapi::jiff::Timestamp;

use crate::automanager::{DrainState, MigrationId};
use crate::crd::{DrainJobStatus, NodeDrainStatus};
use crate::model::{DrainAfter, DrainJobStatus as JobStatus, DrainPhase, NodeId, UnixMillis, wire_name};

use super::conditions::{Observed, READY, STALLED};

/// kstatus: the controller is working towards the wanted state.
pub const RECONCILING: &str = "Reconciling";

/// A core timestamp as RFC 3339.
pub fn rfc3339(at: UnixMillis) -> Option<String> {
    Timestamp::from_millisecond(at).ok().map(|t| t.to_string())
}

/// An RFC 3339 time as core milliseconds.
pub fn millis(rfc3339: &str) -> Option<UnixMillis> {
    rfc3339.parse::<Timestamp>().ok().map(|t| t.as_millisecond())
}

/// The status fields (conditions aside) a drain state becomes; `target`
/// names the target node of a job's migration, as the core reports it.
pub fn status_of(state: &DrainState, target: impl Fn(&MigrationId) -> Option<NodeId>) -> NodeDrainStatus {
    NodeDrainStatus {
        conditions: Vec::new(),
        phase: Some(state.phase),
        started: rfc3339(state.started),
        after: Some(state.after),
        jobs: state
            .jobs
            .iter()
            .map(|j| DrainJobStatus {
                job_id: j.job_id.to_string(),
                status: j.status,
                migration_id: j.migration_id.as_ref().map(ToString::to_string),
                target_node_id: j.migration_id.as_ref().and_then(&target).map(|n| n.to_string()),
                reason: j.reason.clone(),
            })
            .collect(),
        reason: state.reason.clone(),
    }
}

/// The jobs of a drain's status that went down with the node.
pub fn lost_jobs(status: &NodeDrainStatus) -> Vec<&str> {
    status
        .jobs
        .iter()
        .filter(|j| j.status == JobStatus::Terminated)
        .map(|j| j.job_id.as_str())
        .collect()
}

/// Whether every job of a drain's status moved off the node.
pub fn every_job_moved(status: &NodeDrainStatus) -> bool {
    status.jobs.iter().all(|j| j.status.left_the_node())
}

/// The conditions of a drain whose status is `status` (its phase none
/// before the drain started). `Ready` only for a drain that is `done` with
/// every job moved off: a job that went down with the node is never
/// reported as moved.
pub fn conditions_of(status: &NodeDrainStatus) -> Vec<Observed> {
    let why = status.reason.clone().unwrap_or_default();
    let lost = lost_jobs(status);
    let ended = match status.phase {
        Some(DrainPhase::Done) if every_job_moved(status) => {
            let message = if status.after == Some(DrainAfter::Keep) {
                "every job left the node; the node is kept cordoned and running (uncordon returns it to service)"
            } else {
                "every job left the node and the node was terminated"
            };
            return vec![
                Observed::yes(READY, "Drained", message),
                Observed::no(RECONCILING, "Drained", ""),
                Observed::no(STALLED, "Drained", ""),
            ];
        }
        Some(ended) if ended.is_final() => ended,
        Some(running) => {
            let running = wire_name(&running);
            let reason = camel(&running);
            return vec![
                Observed::no(READY, reason.clone(), format!("the drain is {running}")),
                Observed::yes(RECONCILING, reason, format!("the drain is {running}")),
                Observed::no(STALLED, "InProgress", ""),
            ];
        }
        None => {
            return vec![
                Observed::no(READY, "NotStarted", why.clone()),
                Observed::no(RECONCILING, "NotStarted", ""),
                Observed::yes(STALLED, "NotStarted", why),
            ];
        }
    };
    let reason = if !lost.is_empty() {
        "JobsLost"
    } else if ended == DrainPhase::Failed {
        "Failed"
    } else {
        "Partial"
    };
    let message = if why.is_empty() && !lost.is_empty() {
        format!("went down with the node: {}", lost.join(", "))
    } else {
        why
    };
    vec![
        Observed::no(READY, reason, message.clone()),
        Observed::no(RECONCILING, reason, ""),
        Observed::yes(STALLED, reason, message),
    ]
}

/// `migrating` -> `Migrating` (condition reasons are CamelCase).
pub fn camel(name: &str) -> String {
    let mut chars = name.chars();
    chars
        .next()
        .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

/// The jobs whose status changed between two drain states, as `job: was ->
/// now` (for the `DrainProgress` Event).
pub fn job_changes(before: Option<&DrainState>, after: &DrainState) -> Vec<String> {
    after
        .jobs
        .iter()
        .filter_map(|job| {
            let was = before.and_then(|b| b.jobs.iter().find(|j| j.job_id == job.job_id));
            match was {
                Some(was) if was.status == job.status => None,
                Some(was) => Some(format!(
                    "{}: {} -> {}",
                    job.job_id,
                    wire_name(&was.status),
                    wire_name(&job.status)
                )),
                None => Some(format!("{}: {}", job.job_id, wire_name(&job.status))),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::automanager::DrainJob;
    use crate::decide::fixture::{in_flight, said, stalled_for};

    fn drain(phase: DrainPhase, jobs: &[(&str, JobStatus)]) -> DrainState {
        DrainState {
            node_id: "n1".into(),
            phase,
            started: 1_700_000_000_000,
            timeout_ms: 600_000,
            force: false,
            after: Default::default(),
            jobs: jobs
                .iter()
                .map(|(id, status)| DrainJob {
                    job_id: (*id).into(),
                    status: *status,
                    migration_id: None,
                    reason: None,
                })
                .collect(),
            reason: None,
        }
    }

    #[test]
    fn status_carries_the_drain_state_in_wire_names() {
        let status = status_of(
            &drain(DrainPhase::Migrating, &[("ns/b/0/enc", JobStatus::Migrating)]),
            |_| None,
        );
        let wire = serde_json::to_value(&status).unwrap();
        assert_eq!(wire["phase"], "migrating");
        assert_eq!(wire["jobs"][0]["status"], "migrating");
        assert_eq!(status.started.as_deref(), Some("2023-11-14T22:13:20Z"));
        assert_eq!(status.started.as_deref().and_then(millis), Some(1_700_000_000_000));
    }

    #[test]
    fn each_migrated_job_names_the_node_it_went_to() {
        let mut state = drain(
            DrainPhase::Done,
            &[("ns/b/0/enc", JobStatus::Migrated), ("ns/b/0/pkg", JobStatus::Stuck)],
        );
        state.jobs[0].migration_id = Some(MigrationId("m-1".to_owned()));
        let status = status_of(&state, |id| (id.as_str() == "m-1").then(|| NodeId::from("n7")));
        assert_eq!(status.jobs[0].target_node_id.as_deref(), Some("n7"));
        assert_eq!(status.jobs[1].target_node_id, None);
    }

    #[test]
    fn only_a_done_drain_is_ready_and_an_ended_one_stalls_with_its_reason() {
        let ready = |c: &[Observed]| c.iter().any(|c| c.type_ == READY && c.status);
        let stalled = |c: &[Observed]| c.iter().find(|c| c.type_ == STALLED && c.status).cloned();
        assert!(ready(&conditions_of(&at(DrainPhase::Done, None))));
        let partial = conditions_of(&at(DrainPhase::Partial, Some("job x stuck")));
        assert!(!ready(&partial));
        assert_eq!(stalled(&partial).map(|c| c.message), Some("job x stuck".to_owned()));
        let running = conditions_of(&at(DrainPhase::Waiting, None));
        assert!(
            running
                .iter()
                .any(|c| c.type_ == RECONCILING && c.status && c.reason == "Waiting")
        );
        assert!(stalled(&running).is_none());
    }

    #[test]
    fn a_kept_drain_is_ready_and_says_the_node_stays_cordoned() {
        let mut state = drain(DrainPhase::Done, &[("ns/b/0/enc", JobStatus::Migrated)]);
        state.after = DrainAfter::Keep;
        let status = status_of(&state, |_| None);
        assert_eq!(serde_json::to_value(&status).unwrap()["after"], "keep");
        let ready = conditions_of(&status)
            .into_iter()
            .find(|c| c.type_ == READY && c.status)
            .expect("ready");
        assert!(ready.message.contains("kept cordoned and running"), "{}", ready.message);
    }

    fn at(phase: DrainPhase, reason: Option<&str>) -> NodeDrainStatus {
        NodeDrainStatus {
            phase: Some(phase),
            reason: reason.map(str::to_owned),
            ..NodeDrainStatus::default()
        }
    }

    #[test]
    fn a_drain_that_lost_jobs_with_its_node_is_never_ready() {
        let mut lost = status_of(
            &drain(
                DrainPhase::Partial,
                &[
                    ("ns/ch1/0/encode", JobStatus::Terminated),
                    ("ns/ch1/0/package", JobStatus::Migrated),
                ],
            ),
            |_| None,
        );
        lost.reason = Some("the node was terminated with 1 job(s) still on it".to_owned());
        let conditions = conditions_of(&lost);
        assert!(!conditions.iter().any(|c| c.type_ == READY && c.status));
        let stalled = conditions.iter().find(|c| c.type_ == STALLED).expect("Stalled");
        assert!(stalled.status);
        assert_eq!(stalled.reason, "JobsLost");
        assert_eq!(lost_jobs(&lost), vec!["ns/ch1/0/encode"]);
        // Even a status that says `done` is not Ready while a job went down.
        lost.phase = Some(DrainPhase::Done);
        assert!(!conditions_of(&lost).iter().any(|c| c.type_ == READY && c.status));
    }

    #[test]
    fn a_drain_the_core_refused_to_start_stalls_with_why() {
        let refused = NodeDrainStatus {
            reason: Some("no node n9 in the fleet".to_owned()),
            ..NodeDrainStatus::default()
        };
        assert_eq!(
            said(&conditions_of(&refused)),
            stalled_for("NotStarted", "no node n9 in the fleet")
        );
    }

    #[test]
    fn a_failed_drain_stalls_failed_with_its_reason() {
        let failed = at(DrainPhase::Failed, Some("uncordoned before its terminate"));
        assert_eq!(
            said(&conditions_of(&failed)),
            stalled_for("Failed", "uncordoned before its terminate")
        );
    }

    #[test]
    fn a_drain_in_flight_is_reconciling_in_its_phase() {
        assert_eq!(
            said(&conditions_of(&at(DrainPhase::Migrating, None))),
            in_flight("Migrating", "the drain is migrating")
        );
    }

    #[test]
    fn a_done_drain_that_terminates_says_the_node_was_terminated() {
        let mut state = drain(
            DrainPhase::Done,
            &[("ns/b/0/enc", JobStatus::Migrated), ("ns/b/0/pkg", JobStatus::Moved)],
        );
        state.after = DrainAfter::Terminate;
        let status = status_of(&state, |_| None);
        assert!(every_job_moved(&status));
        assert_eq!(
            said(&conditions_of(&status))[0],
            (
                READY,
                "True",
                "Drained",
                "every job left the node and the node was terminated"
            )
        );
    }

    #[test]
    fn only_done_partial_and_failed_end_a_drain() {
        use DrainPhase::*;
        assert!([Done, Partial, Failed].into_iter().all(DrainPhase::is_final));
        assert!(![Waiting, Migrating, Terminating].into_iter().any(DrainPhase::is_final));
        assert_eq!(camel("terminating"), "Terminating");
    }

    #[test]
    fn job_changes_name_each_transition() {
        let before = drain(DrainPhase::Migrating, &[("a", JobStatus::Migrating)]);
        let after = drain(DrainPhase::Waiting, &[("a", JobStatus::Migrated)]);
        assert_eq!(job_changes(Some(&before), &after), vec!["a: migrating -> migrated"]);
        assert!(job_changes(Some(&after), &after).is_empty());
    }
}
