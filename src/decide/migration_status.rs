//! What a `JobMigration`'s status says: the saga's phase with a timestamp
//! per transition, source and target node and instance keys, whether the
//! point of no return has passed, the reason, the rest of the job's
//! co-located group moving with it, and conditions — `Ready` once `done`,
//! `Stalled` when `aborted` or `lost` (or refused), `Reconciling` while in
//! flight, each saying when the job moves with its group. Pure: the
//! operator's controller and `standalone` feed it what the core reports.

use crate::automanager::MigrationState;
use crate::crd::{GroupMemberStatus, JobMigrationStatus, PhaseTransition};
use crate::model::{MigrationPhase, UnixMillis, wire_name};

use super::conditions::{Observed, READY, STALLED};
use super::drain_status::{RECONCILING, camel, rfc3339};

/// The status fields (conditions aside) a migration state becomes.
pub fn status_of(state: &MigrationState) -> JobMigrationStatus {
    JobMigrationStatus {
        conditions: Vec::new(),
        migration_id: Some(state.migration_id.to_string()),
        phase: Some(state.phase),
        transitions: state
            .transitions
            .iter()
            .map(|t| PhaseTransition {
                phase: t.phase,
                at: rfc3339(t.at).unwrap_or_default(),
            })
            .collect(),
        source_node_id: Some(state.source_node_id.to_string()),
        target_node_id: Some(state.target_node_id.to_string()),
        source_instance_key: Some(state.source_key.to_string()),
        target_instance_key: Some(state.target_key.to_string()),
        point_of_no_return_passed: state.past_point_of_no_return,
        reason: state.reason.clone(),
        strategy: Some(state.strategy),
        note: state.note.clone(),
        group: state
            .group
            .iter()
            .map(|p| GroupMemberStatus {
                job_id: p.job_id.to_string(),
                migration_id: p.migration_id.to_string(),
            })
            .collect(),
    }
}

/// `" with its co-located group (a, b)"`, or nothing for a job moving alone.
pub fn group_words(group: &[GroupMemberStatus]) -> String {
    if group.is_empty() {
        return String::new();
    }
    let jobs: Vec<&str> = group.iter().map(|m| m.job_id.as_str()).collect();
    format!(" with its co-located group ({})", jobs.join(", "))
}

/// Whether `state` is the migration a status recorded: ids restart with
/// every core, so the job and the start time must match too.
pub fn is_recorded(state: &MigrationState, job_id: &str, recorded: &JobMigrationStatus) -> bool {
    state.job_id.as_str() == job_id
        && recorded
            .transitions
            .first()
            .is_none_or(|first| rfc3339(state.started_at()).as_deref() == Some(first.at.as_str()))
}

/// A recorded status moved on to `phase` at `at` for `reason`, without
/// the core (the migration was not found after a restart).
pub fn ended_without_core(
    recorded: &JobMigrationStatus,
    phase: MigrationPhase,
    at: UnixMillis,
    reason: String,
) -> JobMigrationStatus {
    let mut next = recorded.clone();
    next.phase = Some(phase);
    next.transitions.push(PhaseTransition {
        phase,
        at: rfc3339(at).unwrap_or_default(),
    });
    next.reason = Some(reason);
    next.conditions = Vec::new();
    next
}

/// How a migration recorded in flight ended when the core that ran it is
/// gone (`gone` says what ended it: "the operator's term ended").
#[derive(Clone, Debug, PartialEq)]
pub enum Unfollowed {
    /// `done`, `lost`, or already ended.
    Ended(JobMigrationStatus),
    /// Short of the point of no return: the job runs on its source. `status` records it
    /// `aborted`; a person's JobMigration is started again instead.
    RolledBack {
        /// The phase it was in.
        phase: MigrationPhase,
        /// The node the job stayed on.
        source: String,
        /// The status recording the rollback.
        status: JobMigrationStatus,
    },
}

/// A migration `recorded` in flight whose core is gone, given the node its
/// job is bound to now (`node`): `done` when that is the recorded target,
/// rolled back when it is the source short of the point of no return (closing a core
/// rolls back what has not passed it), else `lost`; the reason says which and from what
/// phase. A status with no phase (a drain's migration never written) is `lost`.
pub fn unfollowed(recorded: &JobMigrationStatus, node: Option<String>, now: UnixMillis, gone: &str) -> Unfollowed {
    let Some(phase) = recorded.phase else {
        return Unfollowed::Ended(ended_without_core(
            recorded,
            MigrationPhase::Lost,
            now,
            format!("started before {gone} and not inherited: nothing of it was recorded"),
        ));
    };
    if phase.is_ended() {
        return Unfollowed::Ended(recorded.clone());
    }
    let during = wire_name(&phase);
    let on_target = node.is_some() && node == recorded.target_node_id;
    let on_source = node.is_some() && node == recorded.source_node_id;
    if on_target {
        Unfollowed::Ended(ended_without_core(
            recorded,
            MigrationPhase::Done,
            now,
            format!("{gone} during {during} and the migration finished meanwhile: the job runs on its target"),
        ))
    } else if on_source && !recorded.point_of_no_return_passed {
        let source = node.unwrap_or_default();
        let status = ended_without_core(
            recorded,
            MigrationPhase::Aborted,
            now,
            format!(
                "{gone} during {during}, before the point of no return: rolled back, the job runs on its source {source}"
            ),
        );
        Unfollowed::RolledBack { phase, source, status }
    } else {
        let whereabouts = node.map_or_else(|| "no node".to_owned(), |n| format!("node {n}"));
        Unfollowed::Ended(ended_without_core(
            recorded,
            MigrationPhase::Lost,
            now,
            format!(
                "{gone} during {during} and the saga was not inherited: failed forward, the job is where Manager's history puts it ({whereabouts})"
            ),
        ))
    }
}

/// The conditions of a migration whose status is `status` (its phase none
/// before it started, when it was refused).
pub fn conditions_of(status: &JobMigrationStatus) -> Vec<Observed> {
    let why = status.reason.clone().unwrap_or_default();
    let with = group_words(&status.group);
    match status.phase {
        Some(MigrationPhase::Done) => vec![
            Observed::yes(READY, "Migrated", format!("the job runs on the target{with}")),
            Observed::no(RECONCILING, "Migrated", ""),
            Observed::no(STALLED, "Migrated", why),
        ],
        Some(ended @ (MigrationPhase::Aborted | MigrationPhase::Lost)) => {
            let reason = camel(&wire_name(&ended));
            vec![
                Observed::no(READY, reason.clone(), why.clone()),
                Observed::no(RECONCILING, reason.clone(), ""),
                Observed::yes(STALLED, reason, why),
            ]
        }
        Some(running) => {
            let running = wire_name(&running);
            let reason = camel(&running);
            let moving = format!("the migration is {running}{with}");
            vec![
                Observed::no(READY, reason.clone(), moving.clone()),
                Observed::yes(RECONCILING, reason, moving),
                Observed::no(STALLED, "InProgress", why),
            ]
        }
        None => vec![
            Observed::no(READY, "Refused", why.clone()),
            Observed::no(RECONCILING, "Refused", ""),
            Observed::yes(STALLED, "Refused", why),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::automanager::migration::PhaseTransition as CoreTransition;
    use crate::automanager::{MigrationId, MigrationStrategy};
    use crate::decide::fixture::{in_flight, said, stalled_for};
    use crate::model::InstanceKey;

    fn state(phase: MigrationPhase) -> MigrationState {
        MigrationState {
            migration_id: MigrationId::of_tag(1),
            job_id: "ns/b/0/enc".into(),
            strategy: MigrationStrategy::Overlap,
            note: None,
            phase,
            transitions: vec![
                CoreTransition {
                    phase: MigrationPhase::Placing,
                    at: 1_000,
                },
                CoreTransition { phase, at: 2_000 },
            ],
            source_node_id: "a".into(),
            source_key: InstanceKey("primary@1".to_owned()),
            target_node_id: "b".into(),
            target_key: InstanceKey("primary@2".to_owned()),
            past_point_of_no_return: false,
            phase_deadline: None,
            reason: None,
            group: Vec::new(),
        }
    }

    #[test]
    fn status_lists_every_phase_with_its_time() {
        let status = status_of(&state(MigrationPhase::Starting));
        let phases: Vec<_> = status.transitions.iter().map(|t| wire_name(&t.phase)).collect();
        assert_eq!(phases, ["placing", "starting"]);
        assert_eq!(status.transitions[1].at, "1970-01-01T00:00:02Z");
        assert_eq!(status.target_instance_key.as_deref(), Some("primary@2"));
    }

    #[test]
    fn a_migration_of_another_core_with_the_same_id_is_not_the_recorded_one() {
        let recorded = status_of(&state(MigrationPhase::Starting));
        let mut other = state(MigrationPhase::Placing);
        assert!(is_recorded(&other, "ns/b/0/enc", &recorded));
        other.transitions[0].at = 5_000;
        assert!(!is_recorded(&other, "ns/b/0/enc", &recorded));
        assert!(!is_recorded(&state(MigrationPhase::Placing), "ns/b/0/other", &recorded));
    }

    fn at(phase: MigrationPhase, reason: Option<&str>) -> JobMigrationStatus {
        JobMigrationStatus {
            phase: Some(phase),
            reason: reason.map(str::to_owned),
            ..JobMigrationStatus::default()
        }
    }

    #[test]
    fn only_done_is_ready_and_lost_stalls_with_its_reason() {
        assert!(
            conditions_of(&at(MigrationPhase::Done, None))
                .iter()
                .any(|c| c.type_ == READY && c.status)
        );
        let lost = conditions_of(&at(MigrationPhase::Lost, Some("restarted in stoppingSource")));
        assert!(
            lost.iter()
                .any(|c| c.type_ == STALLED && c.status && c.reason == "Lost")
        );
        assert!(!lost.iter().any(|c| c.type_ == READY && c.status));
    }

    #[test]
    fn a_migration_the_core_refused_stalls_with_the_refusal() {
        let refused = JobMigrationStatus {
            reason: Some("job ns/b/0/enc is not running".to_owned()),
            ..JobMigrationStatus::default()
        };
        assert_eq!(
            said(&conditions_of(&refused)),
            stalled_for("Refused", "job ns/b/0/enc is not running")
        );
    }

    #[test]
    fn an_aborted_migration_stalls_aborted_and_one_in_flight_reconciles() {
        assert_eq!(
            said(&conditions_of(&at(MigrationPhase::Aborted, Some("spec.abort set")))),
            stalled_for("Aborted", "spec.abort set")
        );
        assert_eq!(
            said(&conditions_of(&status_of(&state(MigrationPhase::Starting)))),
            in_flight("Starting", "the migration is starting")
        );
    }

    #[test]
    fn a_migration_ended_without_its_core_records_the_end_as_a_transition() {
        let recorded = status_of(&state(MigrationPhase::Starting));
        let ended = ended_without_core(&recorded, MigrationPhase::Lost, 3_000, "gone".to_owned());
        assert_eq!(ended.phase, Some(MigrationPhase::Lost));
        assert!(MigrationPhase::Lost.is_ended());
        assert!(!MigrationPhase::Starting.is_ended());
        let last = ended.transitions.last().expect("a transition");
        assert_eq!(
            (last.phase, last.at.as_str()),
            (MigrationPhase::Lost, "1970-01-01T00:00:03Z")
        );
        assert_eq!(ended.transitions.len(), recorded.transitions.len() + 1);
        assert_eq!(ended.reason.as_deref(), Some("gone"));
        assert_eq!(ended.source_node_id.as_deref(), Some("a"));
    }

    #[test]
    fn a_migration_whose_core_is_gone_ends_from_where_its_job_runs() {
        let recorded = status_of(&state(MigrationPhase::Starting));
        let ended = |node: Option<&str>| unfollowed(&recorded, node.map(str::to_owned), 9_000, "the core went");
        let Unfollowed::Ended(done) = ended(Some("b")) else {
            panic!("done on its target")
        };
        assert_eq!(done.phase, Some(MigrationPhase::Done));
        assert_eq!(
            done.transitions.last().map(|t| t.at.as_str()),
            Some("1970-01-01T00:00:09Z")
        );
        let Unfollowed::RolledBack { phase, source, status } = ended(Some("a")) else {
            panic!("rolled back on its source")
        };
        assert_eq!((phase, source.as_str()), (MigrationPhase::Starting, "a"));
        assert_eq!(status.phase, Some(MigrationPhase::Aborted));
        let Unfollowed::Ended(lost) = ended(None) else {
            panic!("lost")
        };
        assert_eq!(lost.phase, Some(MigrationPhase::Lost));
        assert!(
            lost.reason
                .as_deref()
                .is_some_and(|r| r.starts_with("the core went during starting"))
        );
        // Past the point of no return, the source is no rollback.
        let mut past = recorded.clone();
        past.point_of_no_return_passed = true;
        let Unfollowed::Ended(lost) = unfollowed(&past, Some("a".to_owned()), 9_000, "the core went") else {
            panic!("lost")
        };
        assert_eq!(lost.phase, Some(MigrationPhase::Lost));
        // An ended record stays as it is.
        assert_eq!(
            unfollowed(&done, None, 10_000, "again"),
            Unfollowed::Ended(done.clone())
        );
    }

    #[test]
    fn a_job_moving_with_its_group_says_so_in_status_and_conditions() {
        let mut moving = state(MigrationPhase::AwaitingGroup);
        moving.group = vec![crate::automanager::GroupPeer {
            job_id: "ns/b/0/package".into(),
            migration_id: MigrationId::of_tag(2),
        }];
        let status = status_of(&moving);
        assert_eq!(status.phase, Some(MigrationPhase::AwaitingGroup));
        assert_eq!(status.group[0].job_id, "ns/b/0/package");
        assert_eq!(status.group[0].migration_id, "00000002");
        let reconciling = conditions_of(&status)
            .into_iter()
            .find(|c| c.type_ == RECONCILING)
            .expect("Reconciling");
        assert_eq!(
            reconciling.message,
            "the migration is awaitingGroup with its co-located group (ns/b/0/package)"
        );
    }
}
