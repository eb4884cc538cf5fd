//! A migration this core did not see to its end — its predecessor closed
//! past the point of no return ("the target is left carrying the job, and
//! the next instance rebuilds the placement from history"), or the stream
//! broke and a fresh core was hydrated — leaves a target instance
//! (`<slot>@<8 hex>`) running beside, or instead of, the source. When the
//! bound instance stops or is stopped and history says such a target of
//! the job is live, the binding moves to it instead of ending: the job is
//! running, and placing it again would run it twice. A target of a
//! migration this core rolled back is not live (the core stops it), and
//! the node the binding leaves is released as any node a job leaves.

use crate::automanager::binding::{Binding, BindingPhase};
use crate::automanager::history::{instance_since, live_instances};
use crate::model::{InstanceKey, JobHistoryEntry, JobId, JobStopReason, MigrationId, MigrationPhase, NodeId};

use super::Saga;
use super::state::Migrations;

impl Migrations {
    /// Whether `key` names an instance of a migration this core follows
    /// (in any phase).
    pub(in crate::automanager) fn is_migration_instance(&self, key: &InstanceKey) -> bool {
        key.as_str()
            .split_once('@')
            .is_some_and(|(_, tag)| self.get(&MigrationId(tag.to_owned())).is_some())
    }

    /// `key` is the target of a migration this core (or its predecessor)
    /// rolled back: the core stops it, so it never carries the job.
    pub(in crate::automanager) fn is_rolled_back_target(&self, key: &InstanceKey) -> bool {
        key.as_str()
            .split_once('@')
            .and_then(|(_, tag)| self.get(&MigrationId(tag.to_owned())))
            .is_some_and(|m| m.phase == MigrationPhase::Aborted)
    }
}

impl Saga<'_> {
    /// The bound instance of a job with no migration in flight stops (on
    /// request, or without a failure being reported; while hydrating, for
    /// any reason — Manager's history says the target lived on after it,
    /// as after a migration that finished before the stream broke): true
    /// when a live migration target took over the binding.
    pub(super) fn rebind_to_live_target(&mut self, job: &JobId, entry: &JobHistoryEntry) -> bool {
        let (role, node) = match entry {
            JobHistoryEntry::Stopping {
                role,
                node_id,
                reason: JobStopReason::UserRequested,
                ..
            }
            | JobHistoryEntry::Stopped { role, node_id, .. } => (role, node_id.as_ref()),
            JobHistoryEntry::Stopping { role, node_id, .. } if !self.facts.hydrated => (role, node_id.as_ref()),
            _ => return false,
        };
        let Some(record) = self.facts.jobs.get(job).filter(|r| r.migration.is_none()) else {
            return false;
        };
        let Some(binding) = record.binding.as_ref() else {
            return false;
        };
        if &binding.instance_key != role || node.is_some_and(|n| n != &binding.node_id) {
            return false;
        }
        // A target this core rolled back is going. So, while a snapshot is
        // replayed, is one a predecessor's stop is on its way to: that
        // predecessor had found it a stray (or a start it undid), and
        // Manager's history cannot show the stop yet. Once hydrated, a
        // target this core is stopping as a stray still takes the binding
        // when its source's stop lands: it is the job's last live instance.
        let hydrated = self.facts.hydrated;
        let going = |key: &InstanceKey, node: &NodeId| {
            self.migrations.is_rolled_back_target(key) || (!hydrated && self.outbox.stopping(job, key, node))
        };
        let Some((key, node_id, phase)) = live_target(&record.job.history, role, &binding.node_id, going) else {
            return false;
        };
        // While hydrating, a target that never ran is one whose saga went
        // with a predecessor (its start deferred until the saga says so):
        // bound, the job would never run. It is stopped as a stray, and the
        // job placed again.
        if !self.facts.hydrated && phase != BindingPhase::Running {
            return false;
        }
        // While hydrating, the whole history is read at once: a target
        // created after the stop being read is a later migration's, not
        // the one that moved the job before this stop.
        let stopped_at = match entry {
            JobHistoryEntry::Stopping { at, .. } | JobHistoryEntry::Stopped { at, .. } => *at,
            _ => None,
        };
        if !self.facts.hydrated && stopped_at.is_some_and(|at| instance_since(&record.job.history, &key, &node_id) > at)
        {
            return false;
        }
        let (left, single_use) = (binding.node_id.clone(), record.job.spec.single_use);
        let usable = self
            .facts
            .fleet
            .get(&node_id)
            .is_some_and(|n| !n.is_going() && !n.terminated);
        if !usable {
            return false;
        }
        if let Some(mut record) = self.facts.jobs.get_mut(job) {
            record.binding = Some(Binding {
                node_id,
                instance_key: key,
                gpu_index: None,
                phase,
                uncounted: false,
                prepared_start_awaited: false,
            });
        }
        self.facts.release_node(self.outbox, &left, single_use);
        true
    }
}

/// The migration target of the job that is live at the end of `history`
/// (provisioned or running, not stopping or stopped), other than the
/// instance `stopping` on `node` and those `going`; the most recently
/// started one.
fn live_target(
    history: &[JobHistoryEntry],
    stopping: &InstanceKey,
    node: &NodeId,
    going: impl Fn(&InstanceKey, &NodeId) -> bool,
) -> Option<(InstanceKey, NodeId, BindingPhase)> {
    live_instances(history).into_iter().rev().find(|(k, at, _)| {
        (k != stopping || at != node) && k.as_str().contains('@') && k.slot_of() == stopping.slot_of() && !going(k, at)
    })
}
