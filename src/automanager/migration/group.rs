//! Groups are the unit of movement: migrating a job of a co-located group
//! (`coLocateWith`, closed transitively, or `sameNodeDefault`) moves every
//! member of the group that runs beside it, together, onto one target.
//!
//! The design, in the order a group migration runs:
//!
//! 1. **Who moves.** The group of the job asked for, in its replica, as
//!    first placement computes it ([`crate::placement`]'s groups), less the
//!    members not bound to the job's node (a dormant `startMode: manual`
//!    job, a dropped one, one not placed yet): they follow their peers when
//!    they are placed. A member bound there that is not running, or is
//!    already migrating, refuses the whole group — a group moves whole or
//!    not at all. So does any member still migrating from an earlier move
//!    (one that completed ahead of the rest is already on the target, its
//!    peers still on their way): a second move would split the group.
//! 2. **One target for the group.** The job asked for is placed first as
//!    its group's first mover: its request says the group is moving off
//!    the source (`PlacementRequest::moving_group_from`), so the members'
//!    instances there are not placed peers and the engine sizes the node for
//!    the group's summed requirements (capacity, cores, host ports, GPU
//!    asks, capabilities, exclusivity) exactly as first placement does, and
//!    may provision a node for it. `separateFrom` keeps the group off every
//!    node holding a job it must be kept apart from (a peer's target
//!    reserved by an earlier migration included); `exclusive` keeps it off
//!    every node with company outside the group. Every other member is then
//!    placed pinned to that target (so each gets its own GPU device and
//!    reservation). Nothing is provisioned or reserved until every member
//!    has its place: a group that does not fit leaves no trace.
//! 3. **Its own strategy per job.** Each member gets a migration of its own
//!    (its own id, target instance key and phases) with its own strategy:
//!    the caller's for the job asked for, `strategyFor` per job in a drain.
//!    Each state names the rest of the group (`MigrationState::group`), so
//!    a `migrateJob` of one member says that its group moves with it.
//! 4. **A coordinated cut-over.** Every member runs up to the step before
//!    its point of no return on its own — `stopThenStart` until its target
//!    is prepared, `overlap` until its target runs, `handover` until its
//!    target is ready (the payload kept) — and waits there in
//!    `awaitingGroup` until every other member has arrived (or has already
//!    completed). Then every member crosses its point of no return in the
//!    same step: the sources are told to stop (or to stop output) together.
//!    Before that point nothing is lost, so a member whose target fails
//!    (rejected, a deadline passed, a refusal, an abort asked) rolls the
//!    whole group back and every source keeps running where it was; after
//!    it every member fails forward, as a single migration does.
//!    `awaitingGroup` has no deadline of its own: the members it waits for
//!    each have theirs, and a member that ends releases the rest.
//!    A member whose own *source* fails first is settled alone, as a single
//!    migration is (onto its target when that runs, else recovered), and the
//!    rest of the group moves on without it. Once part of the group runs
//!    away from the source that way, a rollback would split the group: a
//!    member that then fails short of its target fails forward instead (its
//!    source stopped, the job placed afresh beside its group, the migration
//!    `lost`). A source node that goes under a group is settled member by
//!    member (a running target takes its job, the rest are recovered).
//! 5. **The source released last.** A member's `done` releases its source
//!    node only when nothing is bound there any more, so the node a group
//!    leaves is released when its last member has moved (a `singleUse`
//!    member's node is terminated then).
//!
//! A member waiting to be placed while its group moves (not yet placed,
//! or recovering) is held until the group's migrations end, then placed
//! beside the group wherever it landed.
//!
//! A group that cannot move is refused as a whole, with the reason: which
//! member stopped it, or which rule and tier rejected which node with what
//! numbers (see [`crate::placement::Trace::why_not_placed`]). A drain marks
//! every member of such a group `stuck` with that reason.

use crate::automanager::binding::{BindingPhase, JobRecord};
use crate::automanager::facts::Facts;

use super::Saga;
use crate::model::{JobId, MigrationId, MigrationPhase, NodeId, UnixMillis, runtime_job_id};
use crate::placement::JobGroups;

use super::state::{CutOver, MigrationStep};
use super::wind_down::Target;

impl Facts {
    /// Every member of `job`'s co-located group in its replica, in spec
    /// order, `job` included (alone when it belongs to no group).
    pub(crate) fn group_of(&self, job: &JobId) -> Vec<JobId> {
        let alone = || vec![job.clone()];
        let Some(record) = self.jobs.get(job) else {
            return alone();
        };
        let job_ref = &record.bundle_ref;
        let Some(bundle) = self.bundles.get(&job_ref.bundle_id) else {
            return alone();
        };
        let Some(index) = bundle.spec.jobs.iter().position(|j| j.job_name == job_ref.job_name) else {
            return alone();
        };
        JobGroups::of(&bundle.spec)
            .members(index)
            .map(|i| runtime_job_id(&bundle.bundle_id, job_ref.replica_index, &bundle.spec.jobs[i].job_name))
            .collect()
    }

    /// The members of `job`'s co-located group that move with it off
    /// `source`, in spec order, `job` included: those of its replica bound
    /// to `source`. A job of no group moves alone.
    pub(crate) fn moving_group(&self, job: &JobId, source: &NodeId) -> Vec<JobId> {
        self.group_of(job)
            .into_iter()
            .filter(|member| member == job || self.jobs.get(member).is_some_and(|r| r.is_bound_to(source)))
            .collect()
    }

    /// A member of `job`'s co-located group (other than `job`) whose
    /// migration is still in flight, with that migration: while one is, the
    /// group is mid-move — part of it may already run on the target, part
    /// still on the source — and no member starts a move of its own, which
    /// would place it apart from where the group ends up.
    pub(super) fn peer_still_moving(&self, job: &JobId) -> Option<(JobId, MigrationId)> {
        self.group_of(job)
            .into_iter()
            .filter(|member| member != job)
            .find_map(|member| {
                let id = self.jobs.get(&member)?.migration.as_ref()?.migration_id.clone();
                Some((member, id))
            })
    }

    /// Whether `record`'s job, waiting to be placed, waits for its
    /// co-located group to finish moving first: placed beside a member
    /// mid-migration it could land on the node the group is leaving, or on
    /// a target the group does not reach. It is placed wherever the group
    /// ends up.
    pub(crate) fn waits_for_group_move(&self, record: &JobRecord) -> bool {
        let r = &record.bundle_ref;
        let Some(bundle) = self.bundles.get(&r.bundle_id) else {
            return false;
        };
        let migrating = |name: &str| {
            self.jobs
                .get(&runtime_job_id(&r.bundle_id, r.replica_index, name))
                .is_some_and(|peer| peer.migration.is_some())
        };
        // Cheap first: is anything of this replica migrating at all?
        if !bundle
            .spec
            .jobs
            .iter()
            .any(|j| j.job_name != r.job_name && migrating(&j.job_name))
        {
            return false;
        }
        self.group_of(record.job_id())
            .iter()
            .filter(|member| *member != record.job_id())
            .any(|member| self.jobs.get(member).is_some_and(|peer| peer.migration.is_some()))
    }
}

impl Saga<'_> {
    /// Migration `id` reached the step before its point of no return. Alone,
    /// or once every other member of its group waits here too (or has
    /// ended), every waiting member crosses it now; otherwise it waits
    /// (`awaitingGroup`).
    pub(super) fn cut_over(&mut self, id: &MigrationId, step: CutOver, now: UnixMillis) {
        let Some(state) = self.migrations.get(id).filter(|m| m.is_in_flight()) else {
            return;
        };
        if state.group.is_empty() {
            return self.cross(id, step, now);
        }
        self.migrations.parked.insert(id.clone(), step);
        if !self.release_group_if_ready(id, now) {
            self.enter_phase(id, MigrationPhase::AwaitingGroup, now);
        }
    }

    /// When every member of `id`'s group (itself included) waits at the
    /// cut-over or has ended, the waiting ones cross their point of no
    /// return, together; true when they did.
    pub(super) fn release_group_if_ready(&mut self, id: &MigrationId, now: UnixMillis) -> bool {
        let Some(state) = self.migrations.get(id) else {
            return false;
        };
        let members: Vec<MigrationId> = std::iter::once(id.clone())
            .chain(state.group.iter().map(|p| p.migration_id.clone()))
            .collect();
        let ready = members.iter().all(|member| {
            self.migrations.parked.contains_key(member)
                || self.migrations.get(member).is_none_or(|m| m.phase.is_ended())
        });
        if !ready || !members.iter().any(|m| self.migrations.parked.contains_key(m)) {
            return false;
        }
        for member in members {
            if let Some(step) = self.migrations.parked.remove(&member) {
                self.cross(&member, step, now);
            }
        }
        true
    }

    /// The point of no return: the source told to stop, or to stop output.
    fn cross(&mut self, id: &MigrationId, step: CutOver, now: UnixMillis) {
        match step {
            CutOver::StopSource => {
                self.stop_source(id);
                self.enter_phase(id, MigrationPhase::StoppingSource, now);
            }
            CutOver::StopOutputAt(payload) => {
                self.signal(id, MigrationStep::StopOutputAt(payload));
                self.enter_phase(id, MigrationPhase::StoppingOutput, now);
            }
        }
    }

    /// Migration `id` of a group was rolled back: so is every other member
    /// still in flight (none has passed its point of no return before the
    /// whole group was ready), and each source keeps running beside the
    /// others.
    pub(super) fn roll_back_group(&mut self, id: &MigrationId, reason: &str, now: UnixMillis) {
        let Some(state) = self.migrations.get(id) else {
            return;
        };
        let job = state.job_id.clone();
        let peers: Vec<MigrationId> = state.group.iter().map(|p| p.migration_id.clone()).collect();
        let why = format!("its co-located peer {job} did not move ({reason}): the group stays together");
        for peer in peers {
            self.roll_back_alone(&peer, &why, Target::Stop, now);
        }
    }

    /// Whether a member of `id`'s co-located group already runs away from
    /// `id`'s source (one that completed onto the target when its own source
    /// failed, one recovered elsewhere, one placed beside the group's target
    /// meanwhile): rolling `id` back would split the group.
    pub(super) fn group_left_source(&self, id: &MigrationId) -> bool {
        let Some(state) = self.migrations.get(id) else {
            return false;
        };
        self.facts
            .group_of(&state.job_id)
            .iter()
            .filter(|member| **member != state.job_id)
            .any(|member| {
                self.facts
                    .jobs
                    .get(member)
                    .and_then(|r| r.binding.as_ref())
                    .is_some_and(|b| b.node_id != state.source_node_id)
            })
    }

    /// A member that cannot reach its target after part of its group has
    /// left the source: rolled back it would stay apart from its group, so
    /// it fails forward instead. Its target is stopped, its source stopped,
    /// and the job placed afresh (away from the source, as any migration
    /// that did not finish) beside its group; the migration ends `lost`.
    pub(super) fn rejoin_group(&mut self, id: &MigrationId, reason: &str, target: Target, now: UnixMillis) {
        let Some((state, claim)) = self.in_flight(id) else {
            return;
        };
        let (job_id, source_node) = (state.job_id.clone(), state.source_node_id.clone());
        let dispatched = claim.target.phase != BindingPhase::AwaitingNode;
        let reason = format!(
            "{reason}; its co-located group has left {source_node}: the source is stopped and the job placed \
             afresh beside the group"
        );
        self.signal(id, MigrationStep::Abort(reason.clone()));
        self.wind_down_target(id, target, dispatched);
        self.stop_source(id);
        self.lost_and_placed_afresh(id, &job_id, source_node, &reason, now);
        self.release_group_if_ready(id, now);
    }

    /// Whether any member of migration `id`'s group (itself included) is
    /// `singleUse`: the node the group leaves is terminated, not kept, once
    /// the last member has gone.
    pub(super) fn group_single_use(&self, id: &MigrationId) -> bool {
        let Some(state) = self.migrations.get(id) else {
            return false;
        };
        std::iter::once(&state.job_id)
            .chain(state.group.iter().map(|p| &p.job_id))
            .any(|job| self.facts.jobs.get(job).is_some_and(|r| r.job.spec.single_use))
    }
}
