//! What the core keeps of manual jobs between steps: the replicas that
//! should run, and the calls bringing Manager to that state.

use std::collections::{BTreeMap, BTreeSet};

use crate::automanager::protocol::CommandId;
use crate::automanager::recovery::MIN_RECOVERY_INTERVAL_MS;
use crate::model::{BundleId, BundleJobRef, InstanceKey, JobId, ReplicaJob, UnixMillis};

/// A `StartBundleJob` / `StopBundleJob` (or a stopped manual job's
/// `StopJob`) answered without Manager reaching the wanted state is sent
/// again this long after its answer.
pub const TOGGLE_RETRY_MS: i64 = MIN_RECOVERY_INTERVAL_MS;

/// One `StartBundleJob` / `StopBundleJob`.
#[derive(Clone, Debug)]
pub(super) struct Toggle {
    /// Start (true) or stop.
    pub(super) start: bool,
    /// `None` while in flight, else when it was answered.
    pub(super) answered: Option<UnixMillis>,
    /// Commands answered with its outcome.
    pub(super) waiting: Vec<CommandId>,
    /// A command's edit of the wanted set, made once Manager accepted it.
    pub(super) wants: Option<(BundleId, ReplicaJob)>,
}

/// What the core keeps of manual jobs between steps.
#[derive(Clone, Debug, Default)]
pub(in crate::automanager) struct ManualStarts {
    /// Per bundle, the replicas of its manual jobs that should run.
    pub(super) wanted: BTreeMap<BundleId, BTreeSet<ReplicaJob>>,
    /// Toggles per job.
    pub(super) toggles: BTreeMap<JobId, Toggle>,
    /// `StopJob` of an unwanted job's instance: its key, and `None` while in
    /// flight, else when it was answered.
    pub(super) stops: BTreeMap<JobId, (InstanceKey, Option<UnixMillis>)>,
}

impl ManualStarts {
    /// What a fresh core after a stream break carries on: the wanted sets,
    /// and the toggles still in flight, whose answers reach the new core
    /// and answer the commands waiting on them. Everything else the new
    /// core works out again from the new snapshot.
    pub(in crate::automanager) fn carried_from(previous: &ManualStarts) -> ManualStarts {
        ManualStarts {
            wanted: previous.wanted.clone(),
            toggles: previous
                .toggles
                .iter()
                .filter(|(_, t)| t.answered.is_none())
                .map(|(id, t)| (id.clone(), t.clone()))
                .collect(),
            stops: BTreeMap::new(),
        }
    }

    /// The bundle is gone.
    pub(in crate::automanager) fn forget(&mut self, bundle_id: &BundleId) {
        self.wanted.remove(bundle_id);
    }

    /// Replaces the wanted set of a bundle (its spec was applied).
    pub(in crate::automanager) fn want(&mut self, bundle_id: BundleId, started: BTreeSet<ReplicaJob>) {
        self.wanted.insert(bundle_id, started);
    }

    /// Whether the wanted set of the job's bundle keeps it stopped.
    pub(super) fn holds_stopped(&self, bundle_id: &BundleId, replica: &ReplicaJob) -> bool {
        self.wanted.get(bundle_id).is_some_and(|w| !w.contains(replica))
    }
}

pub(super) fn replica_job(r: &BundleJobRef) -> ReplicaJob {
    (r.replica_index, r.job_name.clone())
}
