//! What the core keeps of schedules between steps, and the schedule as
//! the status reads it.

use std::collections::BTreeMap;

use crate::automanager::recovery::MIN_RECOVERY_INTERVAL_MS;
use crate::model::{BundleId, JobId, SchedulePhase, ScheduleTransition, UnixMillis};

/// A `CompleteJob` that was answered without the job reaching `POST` is
/// sent again this long after its answer.
pub const COMPLETE_RETRY_MS: i64 = MIN_RECOVERY_INTERVAL_MS;

/// A bundle's schedule as the status reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleView {
    /// When placement starts (the start less the placement lead).
    pub placing_from: UnixMillis,
    pub start: UnixMillis,
    /// The end, if any.
    pub end: Option<UnixMillis>,
    /// Where the schedule stands now.
    pub phase: SchedulePhase,
    /// The next phase and when it comes.
    pub next: Option<ScheduleTransition>,
}

/// What the core keeps of schedules between steps.
#[derive(Clone, Debug, Default)]
pub(in crate::automanager) struct Schedules {
    /// The phase each scheduled bundle was last seen in: a change is
    /// notified (`bundleSchedule`). A bundle seen for the first time is
    /// recorded without a notification; its status shows the phase.
    pub(super) phases: BTreeMap<BundleId, SchedulePhase>,
    /// `CompleteJob` per job of an ended bundle: `None` while in flight,
    /// else when it was answered.
    pub(super) completions: BTreeMap<JobId, Option<UnixMillis>>,
}

impl Schedules {
    /// The bundle is gone.
    pub(in crate::automanager) fn forget(&mut self, bundle_id: &BundleId) {
        self.phases.remove(bundle_id);
    }

    /// The answer to a `CompleteJob`.
    pub(in crate::automanager) fn answered(&mut self, job_id: &JobId, now: UnixMillis) {
        if let Some(call) = self.completions.get_mut(job_id) {
            *call = Some(now);
        }
    }
}
