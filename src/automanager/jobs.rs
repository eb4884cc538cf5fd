//! The core's job records, and the count of the capacity their placements
//! gave back.
//!
//! A job holds capacity where it is bound and, while a migration is in
//! flight, where its target is. Whenever such a hold ends or moves, capacity
//! may have appeared: a job that found nowhere is tried again. Every change
//! to a record goes through [`JobMut`], which compares what the record held
//! before and after and counts a release itself when it is let go, so no
//! caller can end a binding and forget to say so.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::ops::{Deref, DerefMut};

use crate::model::{JobId, NodeId};

use super::binding::JobRecord;

/// Every job record, by id. Reading goes through `Deref` to the map;
/// changing goes through the methods below.
#[derive(Clone, Debug, Default)]
pub(super) struct Jobs {
    records: BTreeMap<JobId, JobRecord>,
    /// Counts the holds that ended or moved.
    released: Cell<u64>,
    /// Counts the times records were handed out to change, added or
    /// removed: it moves on every change (and on some that change nothing).
    revision: u64,
}

/// The capacity a record holds: its binding's node and GPU, and its
/// migration target's, each as a fingerprint (a guard taken on every record
/// of a large fleet must not copy node ids).
type Holds = [Option<u64>; 2];

fn holds(record: &JobRecord) -> Holds {
    let fingerprint = |node_id: &NodeId, gpu: Option<u32>| {
        let mut hasher = DefaultHasher::new();
        (node_id, gpu).hash(&mut hasher);
        hasher.finish()
    };
    [
        record.binding.as_ref().map(|b| fingerprint(&b.node_id, b.gpu_index)),
        record.migration_target().map(|t| fingerprint(&t.node_id, t.gpu_index)),
    ]
}

/// Whether going from `before` to `after` gave capacity back.
fn released(before: &Holds, after: &Holds) -> bool {
    before.iter().zip(after).any(|(b, a)| b.is_some() && b != a)
}

impl Jobs {
    /// How many holds have ended or moved so far.
    pub(super) fn released(&self) -> u64 {
        self.released.get()
    }

    /// Moves on every change to a record (see the field).
    pub(super) fn revision(&self) -> u64 {
        self.revision
    }

    /// The record of `id`, to change.
    pub(super) fn get_mut(&mut self, id: &JobId) -> Option<JobMut<'_>> {
        self.revision += 1;
        let record = self.records.get_mut(id)?;
        Some(JobMut::new(record, &self.released))
    }

    /// Every record, to change, in id order.
    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = JobMut<'_>> {
        self.revision += 1;
        let released = &self.released;
        self.records.values_mut().map(move |r| JobMut::new(r, released))
    }

    /// The record of `id`, made by `make` when there is none.
    pub(super) fn get_or_insert_with(&mut self, id: &JobId, make: impl FnOnce() -> JobRecord) -> JobMut<'_> {
        self.revision += 1;
        let record = self.records.entry(id.clone()).or_insert_with(make);
        JobMut::new(record, &self.released)
    }

    /// Puts `record` in place of what `id` had.
    pub(super) fn insert(&mut self, id: JobId, record: JobRecord) -> Option<JobRecord> {
        self.revision += 1;
        let after = holds(&record);
        let old = self.records.insert(id, record);
        if old.as_ref().is_some_and(|old| released(&holds(old), &after)) {
            self.count_release();
        }
        old
    }

    /// Forgets `id`; what it held is given back.
    pub(super) fn remove(&mut self, id: &JobId) -> Option<JobRecord> {
        let old = self.records.remove(id)?;
        self.revision += 1;
        if holds(&old).iter().any(Option::is_some) {
            self.count_release();
        }
        Some(old)
    }

    fn count_release(&self) {
        self.released.set(self.released.get() + 1);
    }
}

impl Deref for Jobs {
    type Target = BTreeMap<JobId, JobRecord>;

    fn deref(&self) -> &Self::Target {
        &self.records
    }
}

/// A job record being changed; when it is let go, a hold it gave up or
/// moved is counted.
pub(super) struct JobMut<'a> {
    record: &'a mut JobRecord,
    before: Holds,
    released: &'a Cell<u64>,
}

impl<'a> JobMut<'a> {
    fn new(record: &'a mut JobRecord, released: &'a Cell<u64>) -> Self {
        Self {
            before: holds(record),
            record,
            released,
        }
    }
}

impl Deref for JobMut<'_> {
    type Target = JobRecord;

    fn deref(&self) -> &JobRecord {
        self.record
    }
}

impl DerefMut for JobMut<'_> {
    fn deref_mut(&mut self) -> &mut JobRecord {
        self.record
    }
}

impl Drop for JobMut<'_> {
    fn drop(&mut self) {
        if released(&self.before, &holds(self.record)) {
            self.released.set(self.released.get() + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::automanager::binding::{Binding, BindingPhase};
    use crate::model::{BundleId, BundleJobRef, InstanceKey, JobState, RuntimeJob};

    fn record(id: &JobId) -> JobRecord {
        let bundle_ref = BundleJobRef {
            bundle_id: BundleId::from("b"),
            replica_index: 0,
            job_name: "encode".into(),
        };
        let job = RuntimeJob {
            job_id: id.clone(),
            state: JobState::Active,
            tags: BTreeMap::new(),
            start_date_time: None,
            bundle_ref: Some(bundle_ref.clone()),
            spec: yaml_serde::from_str("{jobName: encode, template: encoder}").expect("a constant spec parses"),
            context: None,
            dormant: false,
            terminal_verdict: None,
            history: Vec::new(),
        };
        JobRecord::new(job, bundle_ref)
    }

    fn bind(record: &mut JobRecord, node: &str) {
        record.binding = Some(Binding {
            node_id: NodeId::from(node),
            instance_key: InstanceKey(format!("{node}-key")),
            gpu_index: None,
            phase: BindingPhase::Dispatched,
            uncounted: false,
            prepared_start_awaited: false,
        });
    }

    #[test]
    fn a_binding_that_ends_or_moves_is_counted_and_one_that_starts_or_changes_phase_is_not() {
        let mut jobs = Jobs::default();
        let id = JobId::from("b/0/encode");
        jobs.insert(id.clone(), record(&id));
        bind(&mut jobs.get_mut(&id).expect("inserted"), "n1");
        assert_eq!(jobs.released(), 0, "a new binding gives nothing back");
        if let Some(binding) = jobs.get_mut(&id).expect("inserted").binding.as_mut() {
            binding.phase = BindingPhase::Running;
        }
        assert_eq!(jobs.released(), 0, "a phase change gives nothing back");
        bind(&mut jobs.get_mut(&id).expect("inserted"), "n2");
        assert_eq!(jobs.released(), 1, "a move gives n1's capacity back");
        for mut record in jobs.values_mut() {
            record.binding = None;
        }
        assert_eq!(jobs.released(), 2, "an unbinding gives n2's capacity back");
        bind(&mut jobs.get_mut(&id).expect("inserted"), "n3");
        jobs.remove(&id);
        assert_eq!(jobs.released(), 3, "a bound job forgotten gives its capacity back");
    }
}
