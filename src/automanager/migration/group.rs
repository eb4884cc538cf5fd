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
//!    not at all.
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
//!    Before that point nothing is lost, so a member that fails (its target
//!    rejected, a deadline passed, an abort asked) rolls the whole group
//!    back and every source keeps running where it was; after it every
//!    member fails forward, as a single migration does. `awaitingGroup`
//!    has no deadline of its own: the members it waits for each have theirs.
//!    A source node that goes under a group is settled member by member (a
//!    running target takes its job, the rest are recovered).
//! 5. **The source released last.** A member's `done` releases its source
//!    node only when nothing is bound there any more, so the node a group
//!    leaves is released when its last member has moved (a `singleUse`
//!    member's node is terminated then).
//!
//! A group that cannot move is refused as a whole, with the reason: which
//! member stopped it, or which rule and tier rejected which node with what
//! numbers (see [`crate::placement::Trace::why_not_placed`]). A drain marks
//! every member of such a group `stuck` with that reason.

use serde::{Deserialize, Serialize};

use crate::model::{JobId, NodeId, UnixMillis, runtime_job_id};
use crate::placement::JobGroups;

use super::wind_down::Target;
use super::{MigrationId, MigrationPhase};
use crate::automanager::MigrationStep;
use crate::automanager::core::AutoManagerCore;

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

impl AutoManagerCore {
    /// The members of `job`'s co-located group that move with it off
    /// `source`, in spec order, `job` included: those of its replica bound
    /// to `source`. A job of no group moves alone.
    pub(crate) fn moving_group(&self, job: &JobId, source: &NodeId) -> Vec<JobId> {
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
        let members: Vec<JobId> = JobGroups::of(&bundle.spec)
            .members(index)
            .map(|i| runtime_job_id(&bundle.bundle_id, job_ref.replica_index, &bundle.spec.jobs[i].job_name))
            .filter(|member| member == job || self.jobs.get(member).is_some_and(|r| r.is_bound_to(source)))
            .collect();
        if members.is_empty() { alone() } else { members }
    }

    /// Migration `id` reached the step before its point of no return. Alone,
    /// or once every other member of its group waits here too (or has
    /// completed), every waiting member crosses it now; otherwise it waits
    /// (`awaitingGroup`).
    pub(super) fn cut_over(&mut self, id: &MigrationId, step: CutOver, now: UnixMillis) {
        let Some(state) = self.migrations.get(id).filter(|m| m.is_in_flight()) else {
            return;
        };
        let peers: Vec<MigrationId> = state.group.iter().map(|p| p.migration_id.clone()).collect();
        if peers.is_empty() {
            return self.cross(id, step, now);
        }
        self.migrations.parked.insert(id.clone(), step);
        let all_ready = peers.iter().all(|peer| {
            self.migrations.parked.contains_key(peer)
                || self.migrations.get(peer).is_none_or(|m| m.phase.is_ended())
        });
        if !all_ready {
            self.enter_phase(id, MigrationPhase::AwaitingGroup, now);
            return;
        }
        for member in std::iter::once(id.clone()).chain(peers) {
            if let Some(step) = self.migrations.parked.remove(&member) {
                self.cross(&member, step, now);
            }
        }
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

    /// Whether any member of migration `id`'s group (itself included) is
    /// `singleUse`: the node the group leaves is terminated, not kept, once
    /// the last member has gone.
    pub(super) fn group_single_use(&self, id: &MigrationId) -> bool {
        let Some(state) = self.migrations.get(id) else {
            return false;
        };
        std::iter::once(&state.job_id)
            .chain(state.group.iter().map(|p| &p.job_id))
            .any(|job| self.jobs.get(job).is_some_and(|r| r.job.spec.single_use))
    }
}
