//! What a successor core carries over from a disposed predecessor that
//! Manager's snapshot cannot say (see [`super`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::automanager::binding::{Binding, JobRecord};
use crate::automanager::fleet::Provisioned;
use crate::automanager::protocol::RequestId;
use crate::automanager::recovery::RestartHistory;
use crate::model::{BundleId, InstanceKey, JobId, NodeId};

/// What a successor core takes up from its predecessor once hydrated: the
/// AutoManager's own decisions about nodes Manager's snapshot shows, and
/// the starts still on their way.
#[derive(Clone, Debug, Default)]
pub(in crate::automanager) struct Inheritance {
    /// Starts (and the stops undoing timed-out ones) still on their way.
    pub(super) starts: Vec<InheritedStart>,
    /// Its own marks on the nodes it knew.
    pub(super) nodes: BTreeMap<NodeId, NodeMarks>,
    /// The records of its jobs with a migration in flight: the saga
    /// carries on, so the job's record (binding, the target's claim, the
    /// history it has applied) does too, and only what Manager's snapshot
    /// adds to the job's history is applied.
    pub(super) migrating: BTreeMap<JobId, JobRecord>,
    /// Instances (job, key, node) a stop is on its way to (one undoing a
    /// timed-out start, or a migration's stop of its source or target):
    /// Manager's history may show them, but they are going, and never taken
    /// for the job's placement while hydrating.
    pub(super) undoing: BTreeSet<(JobId, InstanceKey, NodeId)>,
    /// What it knew of each job that Manager's history does not say,
    /// for the generation of the bundle it knew.
    pub(super) jobs: BTreeMap<JobId, CarriedJob>,
    /// Its broken bundles, each with the generation it was decided for:
    /// announced already (`bundleBroken`), they stand whether or not the
    /// verdict's write reached Manager before the snapshot, until the
    /// bundle is updated or deleted.
    pub(super) broken: BTreeMap<BundleId, (String, u64)>,
}

impl Inheritance {
    /// Whether a stop of instance `key` of `job_id` on `node_id` was on its
    /// way when the predecessor was disposed.
    pub(in crate::automanager) fn undoes(&self, job_id: &JobId, key: &InstanceKey, node_id: &NodeId) -> bool {
        self.undoing.contains(&(job_id.clone(), key.clone(), node_id.clone()))
    }

    /// Whether the predecessor left `job_id` with a migration in flight.
    pub(in crate::automanager) fn left_migrating(&self, job_id: &JobId) -> bool {
        self.migrating.contains_key(job_id)
    }

    /// The record of a job the predecessor left with a migration in
    /// flight, taken once.
    pub(in crate::automanager) fn take_migrating(&mut self, job_id: &JobId) -> Option<JobRecord> {
        self.migrating.remove(job_id)
    }
}

/// A start (or a stop undoing one) a successor inherits on its way.
#[derive(Clone, Debug)]
pub(in crate::automanager) struct InheritedStart {
    pub(in crate::automanager) id: RequestId,
    pub(in crate::automanager) job_id: JobId,
    /// It held its job's in-flight gate. A job has one gate, naming the
    /// call its predecessor awaited; a call issued before it (a stray's
    /// stop at hydration, then the shedding of an over-committed node's
    /// instance of the same job) lost the gate to the later one, and its
    /// answer is handled without opening the gate. Handing the gate to
    /// whichever call comes first instead would leave the start the
    /// predecessor awaited unbound, its instance nobody's placement.
    pub(in crate::automanager) holds_gate: bool,
    /// The binding a start holding the gate was for.
    pub(in crate::automanager) binding: Option<Binding>,
}

/// What a successor takes up of one of its predecessor's jobs, while the
/// job's bundle is still at `generation`.
#[derive(Clone, Debug)]
pub(in crate::automanager) struct CarriedJob {
    pub(in crate::automanager) generation: u64,
    /// Its restart history as counted (a node provisioned for the job
    /// started, a loss Manager records as something else — history cannot
    /// say), and how many of the history's entries that count (runtime
    /// failures, spec changes) it had read: the count carries on, plus
    /// those read since.
    pub(in crate::automanager) restarts: RestartHistory,
    pub(in crate::automanager) counted: usize,
    /// Where it was bound (a dispatched or running instance): replaying
    /// history alone cannot tell which of two live instances is the job's
    /// (a migration that failed forward while the source's stop was on its
    /// way leaves both), so this stands while history shows it live.
    pub(in crate::automanager) binding: Option<Binding>,
    /// Dropped (announced with `jobDropped`, whether or not its verdict
    /// reached Manager).
    pub(in crate::automanager) dropped: bool,
}

/// What an AutoManager decided about a node, which Manager's snapshot does
/// not say.
#[derive(Clone, Debug, Default)]
pub(in crate::automanager) struct NodeMarks {
    /// It provisioned the node, and how.
    pub(in crate::automanager) provisioned: Option<Provisioned>,
    /// It terminated the node.
    pub(in crate::automanager) terminated: bool,
    /// A single-use job left it: released once empty.
    pub(in crate::automanager) release_when_empty: bool,
}
