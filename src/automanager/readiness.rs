//! When a job may be placed: never while bound, in flight, terminal,
//! dormant, waiting for capacity that has not moved, or held by a
//! migration or its group's move; otherwise from the instant its recovery
//! spacing, a failed instance's stop and its schedule's placement lead
//! allow.

use crate::model::{BundleState, JobState, NodePhase, UnixMillis};

use super::binding::{AwaitedStop, JobRecord, StopWait};
use super::core::AutoManagerCore;
use super::recovery::{FAILED_INSTANCE_STOP_GRACE_MS, MIN_RECOVERY_INTERVAL_MS};

/// When a job may be placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Readiness {
    At(UnixMillis),
    Never,
}

impl AutoManagerCore {
    /// The job is not to run again: dropped (by this core, or by a verdict
    /// Manager holds) or its bundle broken.
    pub(super) fn is_terminal(&self, record: &JobRecord) -> bool {
        record.dropped
            || record.job.terminal_verdict.is_some()
            || self.facts.broken.contains_key(&record.bundle_ref.bundle_id)
    }

    /// Whether the job may run at all: not terminal, not a manual job kept
    /// stopped, its bundle's schedule not ended.
    pub(super) fn may_run(&self, record: &JobRecord, now: UnixMillis) -> bool {
        !self.is_terminal(record)
            && !self.is_dormant(record)
            && !self.facts.schedule_ended(&record.bundle_ref.bundle_id, now)
    }

    /// When a job may be placed (see the rules in `dispatch`): never while
    /// bound, dormant (or a manual job its bundle keeps stopped), terminal,
    /// or after its bundle's schedule ended; a scheduled one
    /// `placementLeadMs` ahead of its start (see `schedule`).
    pub(super) fn readiness(&self, record: &JobRecord, now: UnixMillis) -> Readiness {
        if record.binding.is_some()
            || record.in_flight.is_some()
            || !self.may_run(record, now)
            || record.awaiting_capacity_since == Some(self.facts.capacity_epoch())
            || self.migrations.holds_placement_of(record.job_id())
            || self.facts.waits_for_group_move(record)
        {
            return Readiness::Never;
        }
        // A failed instance still stopping wears the key its replacement
        // would: the replacement waits for its `Stopped` (or for its node to
        // go), and is placed in the step that brings either — or, failing
        // both, `FAILED_INSTANCE_STOP_GRACE_MS` after the failure.
        let stop_wait = self
            .awaited_stop(record)
            .map(|s| s.instance.since + FAILED_INSTANCE_STOP_GRACE_MS);
        let Some(bundle) = self.facts.bundles.get(&record.bundle_ref.bundle_id) else {
            return Readiness::Never;
        };
        if bundle.state != BundleState::Live {
            return Readiness::Never;
        }
        // `MIN_RECOVERY_INTERVAL_MS` between consecutive recovery attempts,
        // however the previous one ended.
        let not_before = match (&record.recovery, record.last_recovery_at) {
            (Some(_), Some(last)) => record.not_before.max(last + MIN_RECOVERY_INTERVAL_MS),
            _ => record.not_before,
        };
        let not_before = not_before.max(stop_wait.unwrap_or(UnixMillis::MIN));
        let at = match (record.job.state, record.job.start_date_time) {
            (JobState::Active, _) => not_before,
            // A scheduled start is placed `placementLeadMs` ahead.
            (JobState::Pre, Some(start)) => {
                let lead = self.facts.placement_lead_ms(bundle, record.bundle_ref.replica_index);
                not_before.max(start.saturating_sub(i64::try_from(lead).unwrap_or(i64::MAX)))
            }
            _ => return Readiness::Never,
        };
        Readiness::At(at)
    }

    /// The instance a job's replacement waits for: a failed one still
    /// stopping on a node still up, or one Manager still holds on a node
    /// that is stopping (until that node's `NodeStopped`).
    pub(super) fn awaited_stop<'r>(&self, record: &'r JobRecord) -> Option<&'r AwaitedStop> {
        record.stopping.as_ref().filter(|s| {
            let node = self.facts.fleet.get(&s.instance.node_id);
            match s.wait {
                StopWait::FailedOnLiveNode => node.is_some_and(|n| !n.is_going() && !n.terminated),
                StopWait::LostWithStoppingNode => false,
                StopWait::HeldOnStoppingNode => node.is_some_and(|n| n.phase != NodePhase::Stopped),
            }
        })
    }
}
