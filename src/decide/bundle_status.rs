//! A `Bundle`'s status computed from the core's read model: pure, run on
//! the core's own task through [`AutoManagerHandle::read`], so the status is
//! one consistent reading between two steps of the core.
//!
//! [`AutoManagerHandle::read`]: crate::automanager::AutoManagerHandle::read

use std::collections::BTreeMap;

use crate::automanager::ReadModel;
use crate::automanager::schedule::ScheduleView;
use crate::crd::{BundleStatus, JobStatus, ReplicaStatus, ScheduleStatus};
use crate::model::{BundleId, BundleSpec, BundleState, DateTime, JobId, JobPhase, SchedulePhase, runtime_job_id};
use crate::placement::Admission;

use super::conditions::{self, Observed, READY, STALLED};
use super::notes::{JobNotes, Notes};
use super::resilience::{ReplicaPlacement, resilient};
use super::status::merged;

/// Every job holds a placement.
pub const PLACED: &str = "Placed";
/// A placement could not honour the resilience policy.
pub const DEGRADED: &str = "Degraded";
/// The bundle ended terminally (`onBundleBroken`).
pub const BROKEN: &str = "Broken";
/// What admission against the fleet found (`validateBundleAdmission`).
pub const ADMITTED: &str = "Admitted";

/// The status the core's state implies (conditions without timestamps).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservedBundle {
    /// Per replica, its jobs.
    pub replicas: Vec<ReplicaStatus>,
    /// The primary replica's first placed job's node.
    pub primary_node: Option<String>,
    /// The backup replica's first placed job's node.
    pub backup_node: Option<String>,
    /// The broken reason.
    pub broken: Option<String>,
    /// A scheduled bundle's phase and what comes next.
    pub schedule: Option<ScheduleStatus>,
    /// `Ready`, `Placed`, `Degraded`, `Broken`, `Resilient` (while the
    /// bundle is on air or placing), and `Admitted` when asked.
    pub conditions: Vec<Observed>,
}

/// A schedule as the status shows it.
fn schedule_status(view: &ScheduleView) -> ScheduleStatus {
    ScheduleStatus {
        phase: view.phase,
        placing_from: DateTime::from_millis(view.placing_from),
        start: DateTime::from_millis(view.start),
        end: view.end.map(DateTime::from_millis),
        next_phase: view.next.map(|n| n.phase),
        next_transition_time: view.next.map(|n| DateTime::from_millis(n.at)),
    }
}

/// Whether admission is worth checking against the fleet: it builds a
/// placement view, so it runs for a new spec or while jobs are unplaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmissionCheck {
    /// Run `validateBundle` and `validateBundleAdmission`.
    Check,
    /// Every job was placed at the last reading; keep what was found.
    Skip,
}

/// How many replicas a bundle has: a primary, and a backup when it has a
/// resilience policy.
pub fn replica_count(spec: &BundleSpec) -> u32 {
    if spec.resilience_policy.is_some() { 2 } else { 1 }
}

/// Reads the bundle `bundle_id` with `spec` from the core's read model.
/// `notes` holds what notifications said about each job.
pub fn observe(
    core: ReadModel<'_>,
    bundle_id: &BundleId,
    spec: &BundleSpec,
    notes: &BTreeMap<JobId, JobNotes>,
    check: AdmissionCheck,
) -> ObservedBundle {
    let deleting = core.bundle(bundle_id).is_some_and(|b| b.state == BundleState::Deleting);
    let broken = core.broken(bundle_id).map(str::to_owned);
    let schedule = core.schedule(bundle_id);
    let mut observed = ObservedBundle {
        broken: broken.clone(),
        schedule: schedule.as_ref().map(schedule_status),
        ..ObservedBundle::default()
    };
    let mut tally = Tally::default();
    let mut placements = Vec::new();
    for index in 0..replica_count(spec) {
        let (replica, placement, node) = observe_replica(core, bundle_id, spec, notes, index, &mut tally);
        let first_node = if index == 0 {
            &mut observed.primary_node
        } else {
            &mut observed.backup_node
        };
        if first_node.is_none() {
            *first_node = node;
        }
        observed.replicas.push(replica);
        placements.push(placement);
    }
    let off_air = off_air(schedule.as_ref());
    let on_air = off_air.is_none();
    let conditions = &mut observed.conditions;
    conditions.extend(tally.conditions(broken.as_deref(), deleting, off_air));
    if !deleting && broken.is_none() && on_air {
        conditions.push(resilient(core.headroom(), bundle_id, &placements));
    }
    // A bundle whose every job is placed was admitted in fact: admission
    // against today's fleet (its own jobs on it) must not contradict Ready.
    if tally.placed == tally.active && tally.active > 0 && on_air && !deleting {
        conditions.push(Observed::yes(ADMITTED, "Placed", "every job is placed"));
    } else if check == AdmissionCheck::Check && !deleting {
        conditions.push(admission(core, bundle_id, spec));
    }
    observed
}

/// What a bundle's jobs add up to, for its conditions.
#[derive(Default)]
struct Tally {
    /// Jobs that are to run now (the others do not count towards Ready).
    active: usize,
    /// Of those, the placed ones.
    placed: usize,
    /// Of those, the running ones.
    running: usize,
    /// Each job waiting for capacity, with why.
    awaiting_capacity: Vec<String>,
    /// Each job whose placement did not honour its resilience rules, with why.
    degraded: Vec<String>,
}

impl Tally {
    /// `Ready`, `Placed`, `Degraded` and `Broken`, given the broken reason,
    /// whether Manager is deleting the bundle, and why a scheduled bundle
    /// is off air (`off_air`).
    fn conditions(&self, broken: Option<&str>, deleting: bool, off_air: Option<(&str, String)>) -> Vec<Observed> {
        let (active, placed, running) = (self.active, self.placed, self.running);
        let ready = match (broken, deleting, &off_air) {
            (Some(reason), _, _) => Observed::no(READY, "Broken", reason),
            (None, true, _) => Observed::no(READY, "Deleting", "Manager's stop-then-delete saga is running"),
            (None, false, Some((reason, message))) => Observed::yes(READY, *reason, message.clone()),
            (None, false, None) if running == active => {
                Observed::yes(READY, "Running", format!("{running} of {active} jobs running"))
            }
            (None, false, None) if placed == active => {
                Observed::no(READY, "Starting", format!("{running} of {active} jobs running"))
            }
            (None, false, None) => Observed::no(READY, "Placing", format!("{placed} of {active} jobs placed")),
        };
        let placed_condition = if let Some((reason, message)) = off_air {
            Observed::no(PLACED, reason, message)
        } else if placed == active {
            Observed::yes(PLACED, "Placed", format!("{placed} of {active} jobs placed"))
        } else if !self.awaiting_capacity.is_empty() {
            Observed::no(
                PLACED,
                "AwaitingCapacity",
                format!("no tier could place or provision {}", self.awaiting_capacity.join(", ")),
            )
        } else {
            Observed::no(PLACED, "Pending", format!("{placed} of {active} jobs placed"))
        };
        let degraded = if self.degraded.is_empty() {
            Observed::no(DEGRADED, "ResilienceHonoured", "")
        } else {
            Observed::yes(DEGRADED, "ResilienceDegraded", self.degraded.join("; "))
        };
        let broken = match broken {
            Some(reason) => Observed::yes(BROKEN, "BundleBroken", reason),
            None => Observed::no(BROKEN, "NotBroken", ""),
        };
        vec![ready, placed_condition, degraded, broken]
    }
}

/// Replica `index` of the bundle: its jobs' status, where it runs, and the
/// node of its first placed job; each job counted into `tally`.
fn observe_replica(
    core: ReadModel<'_>,
    bundle_id: &BundleId,
    spec: &BundleSpec,
    notes: &BTreeMap<JobId, JobNotes>,
    index: u32,
    tally: &mut Tally,
) -> (ReplicaStatus, ReplicaPlacement, Option<String>) {
    let mut jobs = Vec::new();
    let mut first_node = None;
    let mut placement = ReplicaPlacement {
        index,
        placed: true,
        nodes: Vec::new(),
    };
    for job in &spec.jobs {
        let job_id = runtime_job_id(bundle_id, index, &job.job_name);
        let view = core.job(bundle_id, &job_id);
        let job_notes = notes.get(&job_id).cloned().unwrap_or_default();
        // Jobs that are not to run now do not count towards Ready.
        if view.phase.is_wanted() {
            tally.active += 1;
            tally.placed += usize::from(view.node.is_some());
            tally.running += usize::from(view.phase == JobPhase::Running);
            if view.phase == JobPhase::AwaitingCapacity {
                tally.awaiting_capacity.push(format!(
                    "{}/{} ({})",
                    index,
                    job.job_name,
                    why_awaiting(core, bundle_id, spec, index, &job.job_name, &job_notes)
                ));
            }
        }
        if let Some(why) = &job_notes.resilience_degraded {
            tally.degraded.push(format!("{index}/{}: {why}", job.job_name));
        }
        match &view.node {
            Some((node, zone)) if !placement.nodes.iter().any(|(n, _)| n == node.as_str()) => {
                placement.nodes.push((node.to_string(), zone.clone()));
            }
            Some(_) => {}
            None => placement.placed = false,
        }
        let node = view.node.as_ref().map(|(n, _)| n.to_string());
        if first_node.is_none() {
            first_node.clone_from(&node);
        }
        jobs.push(JobStatus {
            job_name: job.job_name.clone(),
            job_id: job_id.to_string(),
            node,
            instance_key: view.instance_key.as_ref().map(ToString::to_string),
            state: view.phase,
            restarts_in_last_hour: view.restarts_in_last_hour,
            gpu_index: view.gpu_index,
            last_placement: job_notes.last_placement,
            resilience_degraded: job_notes.resilience_degraded,
        });
    }
    (ReplicaStatus { index, jobs }, placement, first_node)
}

/// Why a scheduled bundle is off air — waiting for its placement lead, or
/// past its end — as `Ready`'s reason and message; none while it is not
/// (or has no schedule).
fn off_air(schedule: Option<&ScheduleView>) -> Option<(&'static str, String)> {
    match schedule {
        Some(s) if s.phase == SchedulePhase::Waiting => Some((
            "Scheduled",
            format!(
                "scheduled: placing from {}, on air at {}{}",
                DateTime::from_millis(s.placing_from),
                DateTime::from_millis(s.start),
                s.end
                    .map(|e| format!(" until {}", DateTime::from_millis(e)))
                    .unwrap_or_default()
            ),
        )),
        Some(ScheduleView {
            phase: SchedulePhase::Ended,
            end: Some(end),
            ..
        }) => Some((
            "Ended",
            format!(
                "ended at {}: its jobs were completed and are not placed again",
                DateTime::from_millis(*end)
            ),
        )),
        _ => None,
    }
}

/// What keeps a job waiting for capacity, tier by tier: from its last
/// decision's trace when placements are traced, else from a traced dry run
/// on the fleet as it is now (the same engine, nothing placed).
fn why_awaiting(
    core: ReadModel<'_>,
    bundle_id: &BundleId,
    spec: &BundleSpec,
    replica_index: u32,
    job_name: &str,
    notes: &JobNotes,
) -> String {
    if let Some(why) = notes.last_placement.as_ref().filter(|w| w.contains(": tier ")) {
        return why.clone();
    }
    let traced = core
        .place_dry_run(bundle_id, spec, replica_index, job_name)
        .ok()
        .and_then(Result::ok)
        .and_then(|placement| placement.trace);
    match traced {
        Some(trace) => format!("no capacity in any pool: {}", trace.why_not_placed()),
        None => notes
            .last_placement
            .clone()
            .unwrap_or_else(|| "no capacity in any pool".to_owned()),
    }
}

/// What notifications said of each job of `bundle_id` (`spec`), by job.
/// Notes live in memory: a new leader (or process) has none until the next
/// placement, so what the `previous` status recorded stands meanwhile.
pub fn job_notes(
    notes: &Notes,
    bundle_id: &BundleId,
    spec: &BundleSpec,
    previous: Option<&BundleStatus>,
) -> BTreeMap<JobId, JobNotes> {
    (0..replica_count(spec))
        .flat_map(|r| spec.jobs.iter().map(move |j| runtime_job_id(bundle_id, r, &j.job_name)))
        .map(|id| {
            let mut known = notes.job(&id);
            if known == JobNotes::default() {
                known = recorded(previous, &id);
            }
            (id, known)
        })
        .collect()
}

/// What a status recorded of a job's last placement and degradation.
fn recorded(status: Option<&BundleStatus>, job: &JobId) -> JobNotes {
    status
        .into_iter()
        .flat_map(|s| &s.replicas)
        .flat_map(|r| &r.jobs)
        .find(|j| j.job_id == job.as_str())
        .map(|j| JobNotes {
            last_placement: j.last_placement.clone(),
            resilience_degraded: j.resilience_degraded.clone(),
        })
        .unwrap_or_default()
}

/// Whether to check admission for a bundle whose last status is
/// `previous`: again for a changed spec or while a job is unplaced.
pub fn admission_check(previous: Option<&BundleStatus>, same_spec: bool) -> AdmissionCheck {
    let placed_before = previous
        .and_then(|s| conditions::find(&s.conditions, PLACED))
        .is_some_and(|c| c.status == "True");
    if placed_before && same_spec {
        AdmissionCheck::Skip
    } else {
        AdmissionCheck::Check
    }
}

/// Keeps what admission found last time (`previous`'s `Admitted`) in an
/// observation made without the check.
pub fn keep_admitted(observed: &mut ObservedBundle, previous: Option<&BundleStatus>) {
    if observed.conditions.iter().any(|c| c.type_ == ADMITTED) {
        return;
    }
    if let Some(admitted) = previous.and_then(|s| conditions::find(&s.conditions, ADMITTED)) {
        observed.conditions.push(Observed {
            type_: ADMITTED,
            status: admitted.status == "True",
            unknown: admitted.status == "Unknown",
            reason: admitted.reason.clone(),
            message: admitted.message.clone(),
        });
    }
}

/// What a bundle the core (or Manager) refused observes: `Ready` false
/// with `reason` and `message`, and `Stalled` — it waits for its spec to
/// change.
pub fn refused(reason: &str, message: String) -> ObservedBundle {
    let ready = Observed::no(READY, reason, message.clone());
    ObservedBundle {
        conditions: vec![ready, Observed::yes(STALLED, reason, message)],
        ..ObservedBundle::default()
    }
}

/// The status to write for `observed`, given the `previous` status
/// (whose conditions keep their transition times where nothing changed)
/// and the resource's generation.
pub fn status_of(previous: &BundleStatus, observed: ObservedBundle, generation: Option<i64>) -> BundleStatus {
    let fields = BundleStatus {
        observed_generation: None,
        conditions: Vec::new(),
        primary_node: observed.primary_node,
        backup_node: observed.backup_node,
        replicas: observed.replicas,
        broken: observed.broken,
        schedule: observed.schedule,
    };
    merged(
        previous,
        fields,
        conditions::with_reconciling(observed.conditions, &[BROKEN]),
        generation,
    )
}

/// `Admitted`: validation warnings and `noCapacity` need the fleet, so the
/// API server cannot refuse them; they are reported here instead.
fn admission(core: ReadModel<'_>, bundle_id: &BundleId, spec: &BundleSpec) -> Observed {
    let warnings = match core.validate_bundle(spec) {
        Ok(found) => found.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
        Err(e) => return Observed::no(ADMITTED, "FleetUnreadable", e.to_string()),
    };
    match core.validate_bundle_admission(bundle_id, spec) {
        Ok(Admission::Ok) if warnings.is_empty() => Observed::yes(ADMITTED, "Admitted", ""),
        Ok(Admission::Ok) => Observed::yes(ADMITTED, "AdmittedWithWarnings", warnings.join("; ")),
        Ok(Admission::ValidationErrors { errors }) => Observed::no(
            ADMITTED,
            "InvalidBundle",
            errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
        ),
        Ok(Admission::NoCapacity { unplaceable }) => Observed::no(
            ADMITTED,
            "NoCapacity",
            unplaceable
                .iter()
                .map(|u| format!("{}/{}: {}", u.replica_index, u.job_name, u.reason))
                .chain(warnings)
                .collect::<Vec<_>>()
                .join("; "),
        ),
        Err(e) => Observed::no(ADMITTED, "FleetUnreadable", e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::decide::conditions::RECONCILING;
    use crate::decide::fixture::{ONE_JOB, TestCore, said};

    /// The conditions as `(type, status, reason, message)`.
    fn condition<'a>(conditions: &'a [Observed], type_: &str) -> &'a Observed {
        conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap_or_else(|| panic!("no {type_} in {conditions:?}"))
    }

    /// The condition `type_` as `(status, reason, message)`.
    fn said_of<'a>(conditions: &'a [Observed], type_: &str) -> (&'a str, &'a str, &'a str) {
        let c = condition(conditions, type_);
        (c.status_name(), c.reason.as_str(), c.message.as_str())
    }

    fn observed(test: &TestCore, id: &str, spec: &BundleSpec) -> ObservedBundle {
        observe(
            test.read(),
            &BundleId::from(id),
            spec,
            &BTreeMap::new(),
            AdmissionCheck::Check,
        )
    }

    #[test]
    fn a_bundle_placed_and_starting_is_placed_but_not_yet_ready() {
        let mut test = TestCore::hydrated(&[("a", 4.0)]);
        let spec = test.bundle("ns/ch1", ONE_JOB);
        let bundle = observed(&test, "ns/ch1", &spec);
        let job = &bundle.replicas[0].jobs[0];
        assert_eq!(
            (job.job_id.as_str(), job.node.as_deref(), job.state),
            ("ns/ch1/0/encode", Some("a"), JobPhase::Starting)
        );
        assert!(job.instance_key.is_some());
        assert_eq!(bundle.primary_node.as_deref(), Some("a"));
        assert_eq!(bundle.backup_node, None);
        assert_eq!(
            said(&bundle.conditions)[..4],
            [
                (READY, "False", "Starting", "0 of 1 jobs running"),
                (PLACED, "True", "Placed", "1 of 1 jobs placed"),
                (DEGRADED, "False", "ResilienceHonoured", ""),
                (BROKEN, "False", "NotBroken", ""),
            ]
        );
        assert_eq!(condition(&bundle.conditions, ADMITTED).reason, "Placed");
    }

    #[test]
    fn a_bundle_whose_every_job_runs_is_ready() {
        let mut test = TestCore::hydrated(&[("a", 4.0)]);
        let spec = test.bundle("ns/ch1", ONE_JOB);
        test.start_all();
        let bundle = observed(&test, "ns/ch1", &spec);
        assert_eq!(bundle.replicas[0].jobs[0].state, JobPhase::Running);
        assert_eq!(
            said_of(&bundle.conditions, READY),
            ("True", "Running", "1 of 1 jobs running")
        );
    }

    #[test]
    fn a_job_no_tier_can_place_awaits_capacity_and_the_bundle_says_which() {
        let mut test = TestCore::hydrated(&[("a", 1.0)]);
        let spec = test.bundle(
            "ns/big",
            "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 2}}\n",
        );
        let bundle = observed(&test, "ns/big", &spec);
        let job = &bundle.replicas[0].jobs[0];
        assert_eq!((job.node.as_deref(), job.state), (None, JobPhase::AwaitingCapacity));
        assert_eq!(
            said_of(&bundle.conditions, READY),
            ("False", "Placing", "0 of 1 jobs placed")
        );
        let placed = condition(&bundle.conditions, PLACED);
        assert_eq!(
            (placed.status_name(), placed.reason.as_str()),
            ("False", "AwaitingCapacity")
        );
        assert!(
            placed
                .message
                .starts_with("no tier could place or provision 0/encode ("),
            "{}",
            placed.message
        );
        let admitted = condition(&bundle.conditions, ADMITTED);
        assert_eq!(
            (admitted.status_name(), admitted.reason.as_str()),
            ("False", "NoCapacity")
        );
        assert!(admitted.message.starts_with("0/encode: "), "{}", admitted.message);
    }

    #[test]
    fn a_bundle_with_a_resilience_policy_has_a_backup_replica() {
        let mut test = TestCore::hydrated(&[("a", 4.0), ("b", 4.0)]);
        let spec = test.bundle(
            "ns/ch1",
            "pool: production\nresiliencePolicy: {sameNode: forbid}\njobs:\n  - {jobName: encode, requirements: \
             {requiredCapacity: 0.5}}\n",
        );
        assert_eq!(replica_count(&spec), 2);
        let bundle = observed(&test, "ns/ch1", &spec);
        let indexes: Vec<u32> = bundle.replicas.iter().map(|r| r.index).collect();
        assert_eq!(indexes, [0, 1]);
        assert_eq!(bundle.replicas[1].jobs[0].job_id, "ns/ch1/1/encode");
        assert!(bundle.backup_node.is_some());
        assert_ne!(bundle.primary_node, bundle.backup_node);
        assert_eq!(condition(&bundle.conditions, PLACED).message, "2 of 2 jobs placed");
    }

    #[test]
    fn a_bundle_the_core_does_not_hold_is_pending() {
        let test = TestCore::hydrated(&[("a", 4.0)]);
        let spec: BundleSpec = yaml_serde::from_str(ONE_JOB).expect("a bundle");
        let bundle = observed(&test, "ns/new", &spec);
        assert_eq!(bundle.replicas[0].jobs[0].state, JobPhase::Pending);
        assert_eq!(
            said_of(&bundle.conditions, PLACED),
            ("False", "Pending", "0 of 1 jobs placed")
        );
    }

    #[test]
    fn a_refused_bundle_is_not_ready_and_stalls_with_the_refusal() {
        let bundle = refused("InvalidBundle", "job encode: unknown template".to_owned());
        assert_eq!(
            said(&bundle.conditions),
            [
                (READY, "False", "InvalidBundle", "job encode: unknown template"),
                (STALLED, "True", "InvalidBundle", "job encode: unknown template"),
            ]
        );
        assert!(bundle.replicas.is_empty());
    }

    fn written(type_: &str, status: &str, reason: &str, since: i64) -> Condition {
        Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::from_second(since).expect("a time")),
        }
    }

    #[test]
    fn the_status_adds_reconciling_while_not_ready_and_keeps_unchanged_transition_times() {
        let previous = BundleStatus {
            conditions: vec![written(READY, "False", "Placing", 100)],
            ..BundleStatus::default()
        };
        let placing = ObservedBundle {
            primary_node: Some("a".to_owned()),
            conditions: vec![Observed::no(READY, "Starting", "0 of 1 jobs running")],
            ..ObservedBundle::default()
        };
        let status = status_of(&previous, placing, Some(2));
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(status.primary_node.as_deref(), Some("a"));
        let types: Vec<_> = status
            .conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(types, [(READY, "False"), (RECONCILING, "True")]);
        assert_eq!(status.conditions[1].reason, "Starting");
        assert_eq!(
            status.conditions[0].last_transition_time,
            previous.conditions[0].last_transition_time
        );
    }

    #[test]
    fn a_broken_bundle_is_not_reconciling() {
        let broken = ObservedBundle {
            broken: Some("restart ceiling".to_owned()),
            conditions: vec![
                Observed::no(READY, "Broken", "restart ceiling"),
                Observed::yes(BROKEN, "BundleBroken", "restart ceiling"),
            ],
            ..ObservedBundle::default()
        };
        let status = status_of(&BundleStatus::default(), broken, Some(1));
        assert_eq!(status.broken.as_deref(), Some("restart ceiling"));
        assert!(!status.conditions.iter().any(|c| c.type_ == RECONCILING));
    }

    #[test]
    fn admission_is_checked_again_for_a_new_spec_or_while_a_job_is_unplaced() {
        let placed = BundleStatus {
            conditions: vec![written(PLACED, "True", "Placed", 1)],
            ..BundleStatus::default()
        };
        let unplaced = BundleStatus {
            conditions: vec![written(PLACED, "False", "AwaitingCapacity", 1)],
            ..BundleStatus::default()
        };
        assert_eq!(admission_check(Some(&placed), true), AdmissionCheck::Skip);
        assert_eq!(admission_check(Some(&placed), false), AdmissionCheck::Check);
        assert_eq!(admission_check(Some(&unplaced), true), AdmissionCheck::Check);
        assert_eq!(admission_check(None, true), AdmissionCheck::Check);
    }

    #[test]
    fn an_observation_without_the_check_keeps_what_admission_found_last() {
        let previous = BundleStatus {
            conditions: vec![Condition {
                message: "gpu capability is on no node".to_owned(),
                ..written(ADMITTED, "True", "AdmittedWithWarnings", 1)
            }],
            ..BundleStatus::default()
        };
        let mut observed = ObservedBundle::default();
        keep_admitted(&mut observed, Some(&previous));
        assert_eq!(
            said(&observed.conditions),
            [(ADMITTED, "True", "AdmittedWithWarnings", "gpu capability is on no node")]
        );
        // What the observation found itself stands.
        let mut checked = ObservedBundle {
            conditions: vec![Observed::no(ADMITTED, "NoCapacity", "0/encode: too big")],
            ..ObservedBundle::default()
        };
        keep_admitted(&mut checked, Some(&previous));
        assert_eq!(
            said(&checked.conditions),
            [(ADMITTED, "False", "NoCapacity", "0/encode: too big")]
        );
    }

    #[test]
    fn job_notes_come_from_notifications_else_from_what_the_status_recorded() {
        let spec: BundleSpec = yaml_serde::from_str(ONE_JOB).expect("a bundle");
        let bundle = BundleId::from("ns/ch1");
        let previous = BundleStatus {
            replicas: vec![ReplicaStatus {
                index: 0,
                jobs: vec![JobStatus {
                    job_name: "encode".to_owned(),
                    job_id: "ns/ch1/0/encode".to_owned(),
                    node: None,
                    instance_key: None,
                    state: JobPhase::Pending,
                    restarts_in_last_hour: 0,
                    gpu_index: None,
                    last_placement: Some("placed on a (pool production, tier cluster)".to_owned()),
                    resilience_degraded: None,
                }],
            }],
            ..BundleStatus::default()
        };
        let notes = job_notes(&Notes::default(), &bundle, &spec, Some(&previous));
        let job = JobId::from("ns/ch1/0/encode");
        assert_eq!(
            notes[&job].last_placement.as_deref(),
            Some("placed on a (pool production, tier cluster)")
        );
        assert_eq!(notes.len(), 1);
        assert_eq!(
            job_notes(&Notes::default(), &bundle, &spec, None)[&job],
            JobNotes::default()
        );
    }
}
