//! The runtime-failure policy: what happens to a job whose instance was
//! lost (failed, rejected, or gone with its node), the restart ceiling as a
//! rate over a trailing hour, the spacing of consecutive recoveries, and
//! node health (repeated rejections make a node unhealthy for a while).
//!
//! Pure bookkeeping over timestamps handed in; it never decides placement.

use std::collections::VecDeque;

use crate::model::{JobHistoryEntry, JobStopReason, RejectionCode, Requirements, UnixMillis};

use super::settings::AutoSettings;

/// `MIN_RECOVERY_INTERVAL_MS`: consecutive recovery attempts for one job are
/// spaced at least this far apart.
pub const MIN_RECOVERY_INTERVAL_MS: i64 = 5_000;
/// The restart ceiling counts restarts over this trailing window (an hour).
pub const RESTART_WINDOW_MS: i64 = 3_600_000;
/// After a provider refuses a provision, the tier is not provisioned from
/// again for this long ("a failed provision leaves no phantom node and backs
/// off 60 s"), so the cascade spills to the next tier.
pub const PROVISION_FAILURE_BACKOFF_MS: i64 = 60_000;

/// How long the replacement of a failed instance waits for that instance's
/// `Stopped` when its node stays up. Both wear the same instance key, so the
/// replacement normally starts only once the failed one is gone; a worker
/// that never reports it must not hold the job off the air for good. Past
/// this the replacement is placed anyway (should Manager still hold the old
/// instance, the start is refused and retried like any failed dispatch).
/// The same grace bounds the wait for an instance Manager still holds on a
/// stopping node after refusing its replacement's start (`AlreadyExists`):
/// the job is tried again at most this often until the node's
/// `NodeStopped`.
pub const FAILED_INSTANCE_STOP_GRACE_MS: i64 = 30_000;

/// How an instance was lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LossCause {
    /// The job failed at runtime (or ended without being asked to).
    Failed,
    /// Its node stopped or is stopping.
    NodeLost,
    /// Its node was reclaimed by the provider after an interruption notice:
    /// recovered per `onRuntimeFailure`, but "none of it counts against the
    /// restart ceiling" (a job lost with a reclaimed node did not fail).
    Reclaimed,
    /// The worker refused to start it.
    Rejected {
        /// The worker's typed reason.
        code: RejectionCode,
        /// The worker's own words.
        detail: String,
    },
}

/// What becomes of a job after a loss.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailureVerdict {
    /// Re-place it (a restart was recorded against its ceiling).
    Restart,
    /// The runtime is terminal.
    Terminal {
        /// Why, in words a person can act on.
        reason: String,
        /// It was the restart ceiling (an essential job past it breaks its
        /// bundle without being reported as dropped).
        ceiling_reached: bool,
    },
}

/// Restarts of one job inside the trailing hour.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestartHistory {
    restarts: VecDeque<UnixMillis>,
}

impl RestartHistory {
    /// Restarts inside the hour before `now`.
    pub fn count(&self, now: UnixMillis) -> u32 {
        self.restarts.iter().filter(|&&at| at > now - RESTART_WINDOW_MS).count() as u32
    }

    /// Forgets every restart (a node provisioned for the job started, or its
    /// bundle was updated or deleted).
    pub fn clear(&mut self) {
        self.restarts.clear();
    }

    /// Adds a restart that happened at `at` (rebuilding the history from
    /// Manager's job history at hydration).
    pub fn replay(&mut self, at: UnixMillis) {
        self.record(at);
    }

    fn record(&mut self, now: UnixMillis) {
        while self.restarts.front().is_some_and(|&at| at <= now - RESTART_WINDOW_MS) {
            self.restarts.pop_front();
        }
        self.restarts.push_back(now);
    }
}

/// Judges a loss: an invalid spec is terminal on the first rejection (with
/// the worker's words), `drop` never restarts, and the re-placing policies
/// restart until the ceiling's rate is reached inside the trailing hour —
/// except after a reclaim, which restarts without being counted.
pub fn judge(
    settings: &AutoSettings,
    requirements: &Requirements,
    history: &mut RestartHistory,
    cause: &LossCause,
    now: UnixMillis,
) -> FailureVerdict {
    if let LossCause::Rejected {
        code: RejectionCode::InvalidSpec,
        detail,
    } = cause
    {
        return FailureVerdict::Terminal {
            reason: detail.clone(),
            ceiling_reached: false,
        };
    }
    let Some(ceiling) = settings.restart_ceiling(requirements) else {
        return FailureVerdict::Terminal {
            reason: "onRuntimeFailure is drop".to_owned(),
            ceiling_reached: false,
        };
    };
    if *cause == LossCause::Reclaimed {
        return FailureVerdict::Restart;
    }
    if history.count(now) >= ceiling {
        return FailureVerdict::Terminal {
            reason: format!("restart ceiling reached: {ceiling} restarts in the trailing hour"),
            ceiling_reached: true,
        };
    }
    history.record(now);
    FailureVerdict::Restart
}

/// A node's health: rejections inside `rejectionBackoffMs`, and the end of
/// its exclusion when unhealthy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeHealth {
    rejections: VecDeque<UnixMillis>,
    unhealthy_until: Option<UnixMillis>,
}

impl NodeHealth {
    /// Whether the node is excluded from placement.
    pub fn is_unhealthy(&self) -> bool {
        self.unhealthy_until.is_some()
    }

    /// When the exclusion lapses, if excluded.
    pub fn unhealthy_until(&self) -> Option<UnixMillis> {
        self.unhealthy_until
    }

    /// Counts a rejection; true when it made the node unhealthy
    /// (`rejectionEscalationCount` inside `rejectionBackoffMs`).
    pub fn record_rejection(&mut self, settings: &AutoSettings, now: UnixMillis) -> bool {
        let window = settings.rejection_backoff_ms as i64;
        while self.rejections.front().is_some_and(|&at| at <= now - window) {
            self.rejections.pop_front();
        }
        self.rejections.push_back(now);
        if self.unhealthy_until.is_none() && self.rejections.len() as u32 >= settings.rejection_escalation_count {
            self.rejections.clear();
            self.unhealthy_until = Some(now + settings.unhealthy_cooldown_ms as i64);
            return true;
        }
        false
    }

    /// A job reached running on the node; true when that cleared an
    /// exclusion.
    pub fn job_running(&mut self) -> bool {
        self.rejections.clear();
        self.unhealthy_until.take().is_some()
    }

    /// True when the cooldown has passed and cleared an exclusion.
    pub fn expire(&mut self, now: UnixMillis) -> bool {
        if self.unhealthy_until.is_some_and(|until| until <= now) {
            self.unhealthy_until = None;
            return true;
        }
        false
    }
}

/// The time of a runtime failure the restart history counts, if `entry`
/// is one.
fn failure_at(entry: &JobHistoryEntry) -> Option<UnixMillis> {
    match entry {
        JobHistoryEntry::Stopping {
            at: Some(at),
            reason: JobStopReason::JobFailed | JobStopReason::UnknownJob | JobStopReason::Unknown(_),
            ..
        } => Some(*at),
        _ => None,
    }
}

/// Whether a history entry is one the restart history reads (see
/// [`replay_restart`]).
pub(super) fn counts_for_restarts(entry: &JobHistoryEntry) -> bool {
    matches!(entry, JobHistoryEntry::Updated { .. }) || failure_at(entry).is_some()
}

/// One entry of a job's history as the restart history reads it: a runtime
/// failure counts, a spec change clears.
pub(super) fn replay_restart(restarts: &mut RestartHistory, entry: &JobHistoryEntry) {
    if matches!(entry, JobHistoryEntry::Updated { .. }) {
        restarts.clear();
    } else if let Some(at) = failure_at(entry) {
        restarts.replay(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_older_than_an_hour_are_not_counted() {
        let mut h = RestartHistory::default();
        h.record(0);
        h.record(1_000);
        assert_eq!(h.count(1_000), 2);
        assert_eq!(h.count(RESTART_WINDOW_MS + 500), 1);
        assert_eq!(h.count(RESTART_WINDOW_MS + 1_000), 0);
    }

    #[test]
    fn a_reclaim_restarts_without_counting_against_the_ceiling() {
        let settings = AutoSettings::default();
        let requirements = Requirements::default();
        let mut h = RestartHistory::default();
        for at in 0..10 {
            assert_eq!(
                judge(&settings, &requirements, &mut h, &LossCause::Reclaimed, at),
                FailureVerdict::Restart
            );
        }
        assert_eq!(h.count(10), 0);
    }

    #[test]
    fn rejections_outside_the_backoff_window_do_not_escalate() {
        let settings = AutoSettings::default();
        let mut health = NodeHealth::default();
        assert!(!health.record_rejection(&settings, 0));
        assert!(!health.record_rejection(&settings, 3_000));
        assert!(!health.record_rejection(&settings, 6_000));
        assert!(health.record_rejection(&settings, 7_000));
        assert!(health.is_unhealthy());
    }
}
