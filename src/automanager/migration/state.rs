//! The saga's vocabulary and its state: ids, options, phases, the state
//! every phase transition is recorded in, the migrations in flight and the
//! most recent ended ones, and the steps relayed to a migration's
//! instances.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{InstanceKey, JobId, MigrationId, MigrationPhase, MigrationStrategy, NodeId, UnixMillis};

/// `CLOSE_ABORT_GRACE_MS`: how long `close()` holds the channel open for
/// the aborts of in-flight migrations to be sent (5 s at most; with nothing
/// in flight it closes at once).
pub const CLOSE_ABORT_GRACE_MS: u64 = 5_000;

/// How many ended migrations are kept for `migrationById` / `migrations()`
/// besides those in flight (the oldest ended ones are forgotten first).
pub const ENDED_MIGRATIONS_KEPT: usize = 1_024;

/// `migrateJob`'s options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MigrationOptions {
    /// The strategy; when absent, the job's declared one
    /// (`requirements.migrationStrategy`), else `stopThenStart`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strategy: Option<MigrationStrategy>,
    /// A hard pin: only this node may take the target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_node_id: Option<NodeId>,
    /// The target may take a spare exclusively reserved for other
    /// templates.
    pub override_reservation: bool,
}

/// How a migration ended, for whoever started it (a drain consults this).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum MigrationEnd {
    /// `done`: the job lives on the target.
    Completed,
    /// `aborted`: rolled back; the job is where it was.
    Aborted,
    /// `lost`: past the point of no return and not finished.
    Lost,
}

/// One phase transition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTransition {
    /// The phase entered.
    pub phase: MigrationPhase,
    /// When.
    pub at: UnixMillis,
}

/// A migration as the core knows it (`migrationById`, `onMigrationPhase`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationState {
    /// Its id.
    pub migration_id: MigrationId,
    /// The job moved.
    pub job_id: JobId,
    /// How it is carried out.
    pub strategy: MigrationStrategy,
    /// Why `strategy` is not the one asked for, when it is not (a handover
    /// run as overlap on a Manager that relays no migration signals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Where it is.
    pub phase: MigrationPhase,
    /// Every phase entered, with when, in order (the first is `placing`).
    pub transitions: Vec<PhaseTransition>,
    /// The node the job runs on.
    pub source_node_id: NodeId,
    /// The instance key it wears there.
    pub source_key: InstanceKey,
    /// The node placement chose for the target.
    pub target_node_id: NodeId,
    /// The key the target wears (`<slot>@<id>`).
    pub target_key: InstanceKey,
    /// The source has been told to stop (or to stop output): from here
    /// there is no rollback and the saga fails forward.
    pub past_point_of_no_return: bool,
    /// When the current phase's deadline (from the `migration` settings)
    /// expires; none once ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase_deadline: Option<UnixMillis>,
    /// Why it was aborted or lost, or how it failed forward.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The rest of the job's co-located group, each moving with it to the
    /// same target in a migration of its own (empty when the job moves
    /// alone): "groups are the unit of movement".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group: Vec<GroupPeer>,
}

impl MigrationState {
    /// When the migration started.
    pub fn started_at(&self) -> UnixMillis {
        self.transitions.first().map_or(0, |t| t.at)
    }

    /// When the current phase was entered.
    pub fn phase_entered_at(&self) -> UnixMillis {
        self.transitions.last().map_or(0, |t| t.at)
    }

    /// How it ended; none while in flight.
    pub fn end(&self) -> Option<MigrationEnd> {
        match self.phase {
            MigrationPhase::Done => Some(MigrationEnd::Completed),
            MigrationPhase::Aborted => Some(MigrationEnd::Aborted),
            MigrationPhase::Lost => Some(MigrationEnd::Lost),
            _ => None,
        }
    }

    /// Whether it is still in flight.
    pub fn is_in_flight(&self) -> bool {
        !self.phase.is_ended()
    }
}

/// Every migration the core knows: those in flight and the most recent
/// ended ones.
#[derive(Clone, Debug, Default)]
pub(crate) struct Migrations {
    pub(super) by_id: BTreeMap<MigrationId, MigrationState>,
    /// Ended migrations, oldest first (forgotten past
    /// [`ENDED_MIGRATIONS_KEPT`]).
    pub(super) ended: std::collections::VecDeque<MigrationId>,
    /// Counts migrations started, for ids.
    pub(super) serial: u64,
    /// Migrations whose target's `StartJob` awaits its answer.
    pub(super) start_pending: std::collections::BTreeSet<MigrationId>,
    /// Aborted migrations whose target is stopped once its `StartJob` is
    /// answered (so the stop cannot overtake the start).
    pub(super) stop_when_started: std::collections::BTreeSet<MigrationId>,
    /// Migrations a `StartPreparedJob` of which went unanswered: Manager
    /// may have made the target although a later try is answered
    /// `NotFound` (a Manager without deferred start holds nothing prepared
    /// to start again: the operator's port made the start with the first
    /// try).
    pub(super) prepared_start_unheard: std::collections::BTreeSet<MigrationId>,
    /// Migrations whose target's `StartPreparedJob` was sent and not yet
    /// answered ok. A migration that completes meanwhile (its phase
    /// deadline, its source's end) moves the job onto a target Manager may
    /// yet never make: the binding says so
    /// ([`super::super::binding::Binding::prepared_start_awaited`]) until
    /// the start is answered ok or Manager reports the instance.
    pub(super) prepared_start_awaited: std::collections::BTreeSet<MigrationId>,
    /// Migrations whose source has been seen stopped.
    pub(super) source_stopped: std::collections::BTreeSet<MigrationId>,
    /// Members of a group waiting at its cut-over, with the step each takes
    /// once the whole group is ready.
    pub(super) parked: BTreeMap<MigrationId, CutOver>,
    /// Sources told to stop, by job, each until every stop addressed to
    /// it is answered and it is seen stopped. Until then the job is not
    /// placed again: a new instance in the same slot would wear the same
    /// key on the same node, and a stop still on its way to the source
    /// would reach it. One entry per instance (node and key), however often
    /// it is told: a stop sent again counts against the same entry.
    pub(super) stopping_sources: BTreeMap<JobId, Vec<SourceStop>>,
}

/// A source told to stop.
#[derive(Clone, Debug)]
pub(super) struct SourceStop {
    /// Where it runs.
    pub(super) node_id: NodeId,
    /// The key it wears.
    pub(super) instance_key: InstanceKey,
    /// Its `StopJob`s not yet answered (a stop is sent again when Manager
    /// did not hear it, or at a deadline).
    pub(super) unanswered: u32,
    /// Its `Stopped` is seen, or Manager no longer knows it.
    pub(super) stopped: bool,
}

impl SourceStop {
    pub(super) fn is(&self, node: &NodeId, key: &InstanceKey) -> bool {
        &self.node_id == node && &self.instance_key == key
    }

    /// Nothing is left to wait for: it is stopped and no stop addressed to
    /// it is still on its way.
    pub(super) fn settled(&self) -> bool {
        self.stopped && self.unanswered == 0
    }
}

/// Which call of a saga an RPC result answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MigrationCall {
    /// The target's `StartJob`.
    StartTarget,
    /// `StartPreparedJob` of the prepared target.
    StartPrepared,
    /// `StopJob` of the source.
    StopSource,
    /// `StopJob` of the target (abort).
    StopTarget,
    /// A `SendMigrationSignal`.
    Signal,
}

impl Migrations {
    /// One migration.
    pub(crate) fn get(&self, id: &MigrationId) -> Option<&MigrationState> {
        self.by_id.get(id)
    }

    pub(super) fn get_mut(&mut self, id: &MigrationId) -> Option<&mut MigrationState> {
        self.by_id.get_mut(id)
    }

    /// Every migration known, oldest first.
    pub(crate) fn all(&self) -> Vec<&MigrationState> {
        let mut all: Vec<&MigrationState> = self.by_id.values().collect();
        all.sort_by(|a, b| (a.started_at(), &a.migration_id).cmp(&(b.started_at(), &b.migration_id)));
        all
    }

    /// The ids of every migration in flight.
    pub(super) fn in_flight(&self) -> Vec<MigrationId> {
        self.by_id
            .values()
            .filter(|m| m.is_in_flight())
            .map(|m| m.migration_id.clone())
            .collect()
    }

    /// The most recent ended migration of `job`.
    pub(super) fn latest_ended_for(&self, job: &JobId) -> Option<&MigrationState> {
        self.ended
            .iter()
            .rev()
            .filter_map(|id| self.by_id.get(id))
            .find(|m| &m.job_id == job)
    }

    /// The earliest phase deadline of the migrations in flight.
    pub(crate) fn next_deadline(&self) -> Option<UnixMillis> {
        self.by_id.values().filter_map(|m| m.phase_deadline).min()
    }

    /// A fresh id and its tag: eight hex digits mixed from the job, a
    /// serial and the time (FNV-1a), never one already known.
    pub(super) fn next_id(&mut self, job: &JobId, now: UnixMillis) -> (MigrationId, u32) {
        loop {
            self.serial += 1;
            let mut hash: u32 = 0x811c_9dc5;
            let bytes = job.0.bytes().chain(self.serial.to_le_bytes()).chain(now.to_le_bytes());
            for byte in bytes {
                hash = (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193);
            }
            let id = MigrationId::of_tag(hash);
            if !self.by_id.contains_key(&id) {
                return (id, hash);
            }
        }
    }

    /// Whether `job` waits for a migration's source to stop before it may
    /// be placed again.
    pub(crate) fn holds_placement_of(&self, job: &JobId) -> bool {
        self.stopping_sources.contains_key(job)
    }

    /// An instance of `job` stopped: if it is a source being waited for,
    /// that wait is over once no stop addressed to it is on its way.
    pub(super) fn source_seen_stopped(&mut self, job: &JobId, role: &InstanceKey, node: Option<&NodeId>) {
        self.settle_source(job, |stop| {
            if &stop.instance_key == role && node.is_none_or(|n| n == &stop.node_id) {
                stop.stopped = true;
            }
        });
    }

    /// One of the `StopJob`s addressed to the source of `id` was answered;
    /// `gone` when Manager no longer knows it (nothing left to see stop).
    pub(super) fn source_stop_answered(&mut self, id: &MigrationId, gone: bool) {
        let Some(m) = self.by_id.get(id) else {
            return;
        };
        let (job, node, key) = (m.job_id.clone(), m.source_node_id.clone(), m.source_key.clone());
        self.settle_source(&job, |stop| {
            if stop.is(&node, &key) {
                stop.unanswered = stop.unanswered.saturating_sub(1);
                stop.stopped |= gone;
            }
        });
    }

    /// Applies `change` to each source of `job` waited for, and forgets
    /// those it settled.
    pub(super) fn settle_source(&mut self, job: &JobId, change: impl FnMut(&mut SourceStop)) {
        let Some(stops) = self.stopping_sources.get_mut(job) else {
            return;
        };
        stops.iter_mut().for_each(change);
        stops.retain(|stop| !stop.settled());
        if stops.is_empty() {
            self.stopping_sources.remove(job);
        }
    }

    /// Whether the source of `id` was told to stop and is not yet seen
    /// stopped.
    pub(super) fn awaits_source_stop(&self, id: &MigrationId) -> bool {
        self.by_id.get(id).is_some_and(|m| {
            self.stopping_sources.get(&m.job_id).is_some_and(|stops| {
                stops
                    .iter()
                    .any(|s| !s.stopped && s.is(&m.source_node_id, &m.source_key))
            })
        })
    }

    /// The migrations a fresh core carries on from a disposed one (after a
    /// stream break): all of them, the sagas in flight with what each waits
    /// for.
    pub(crate) fn carried_from(previous: &Migrations) -> Self {
        previous.clone()
    }

    /// Sources on a node that is gone are not waited for.
    pub(super) fn forget_sources_on(&mut self, node: &NodeId) {
        for stops in self.stopping_sources.values_mut() {
            stops.retain(|s| &s.node_id != node);
        }
        self.stopping_sources.retain(|_, stops| !stops.is_empty());
    }

    pub(super) fn insert(&mut self, state: MigrationState) {
        self.by_id.insert(state.migration_id.clone(), state);
    }

    /// Remembers that `id` ended; the oldest ended ones past
    /// [`ENDED_MIGRATIONS_KEPT`] are forgotten.
    pub(super) fn mark_ended(&mut self, id: &MigrationId) {
        self.ended.push_back(id.clone());
        self.source_stopped.remove(id);
        self.parked.remove(id);
        while self.ended.len() > ENDED_MIGRATIONS_KEPT {
            if let Some(old) = self.ended.pop_front() {
                self.by_id.remove(&old);
                self.prepared_start_unheard.remove(&old);
                self.prepared_start_awaited.remove(&old);
            }
        }
    }
}

/// A step the core relays to a migration's instances.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigrationStep {
    /// Both instances are told a migration of this strategy is starting.
    Propose(MigrationStrategy),
    /// Handover: the source stops output at the target's (opaque) payload.
    StopOutputAt(Vec<u8>),
    /// Handover: the target applies from the source's reported position.
    ApplyFrom(String),
    /// Rollback before the point of no return; both keys are told.
    Abort(String),
}

/// Another member of a migrating co-located group, as each member's state
/// names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupPeer {
    /// The member.
    pub job_id: JobId,
    /// Its own migration, to the same target.
    pub migration_id: MigrationId,
}

/// What a member waiting at its group's cut-over does once the whole group
/// is ready: its point of no return.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum CutOver {
    /// `stopThenStart` (target prepared) and `overlap` (target running):
    /// the source is told to stop.
    StopSource,
    /// `handover` (target ready): the source stops output at the target's
    /// payload.
    StopOutputAt(Vec<u8>),
}
