//! Starting a migration: the refusals (`not running`, `not
//! AutoManager-placed`, one already in flight), then the target through the
//! same placement path as any other job — requirements, host ports,
//! resilience, hot spares, provision-a-node — with the source node excluded
//! and an explicit target as a pin. "A migration passes no
//! `onRuntimeFailure` to placement: the reserve is protected by
//! reservation there, not by the spare penalty." The target is reserved on
//! its node beside the source from here on. A job of a co-located group
//! starts its whole group's migrations, onto one target placed for the
//! group (see [`super::group`]).

use super::Saga;
use crate::automanager::binding::{Binding, BindingPhase, MigrationClaim};
use crate::automanager::core::AutoManagerCore;
use crate::automanager::dispatch::{PlacementView, decision_of};
use crate::automanager::notification::{Notification, PlacementDecisionInfo};
use crate::automanager::outbox::Pending;
use crate::automanager::protocol::Rpc;
use crate::model::manager::Capability;
use crate::model::{InstanceKey, JobId, MigrationId, MigrationPhase, MigrationStrategy, NodePhase, Slot, UnixMillis};
use crate::placement::{
    FleetView, Outcome, PlacementRequest, RecoveryContext, SequentialNodeIds, apply_placement, place, placed_job,
};

use super::refusal::MigrationRefusal;
use super::state::{GroupPeer, MigrationCall, MigrationOptions, MigrationState};

/// Where placement put a target.
struct TargetPlacement {
    node_id: crate::model::NodeId,
    gpu_index: Option<u32>,
}

/// One placement of a migration's (or a group's) target, as the engine
/// decided it.
struct Placed {
    job_id: JobId,
    outcome: Outcome,
    resilience: crate::placement::ResilienceReport,
    target: TargetPlacement,
}

/// The bundle a migration's movers come from, and each mover's job name.
struct MovingBundle {
    bundle: crate::model::Bundle,
    replica_index: u32,
    names: Vec<String>,
}

/// One mover of a migration, as its target is placed.
struct MovingMember<'a> {
    job_id: &'a JobId,
    name: &'a str,
    /// The node a co-located group moves from (a group's members only).
    group_source: Option<&'a crate::model::NodeId>,
    /// Where the target must go: the first mover's own pin, or for the
    /// rest of a group, where the first mover went.
    pin: Option<&'a crate::model::NodeId>,
}

impl AutoManagerCore {
    /// `migrateJob`: places the target and dispatches its `StartJob` (or
    /// provisions its node); the saga then runs on Manager's events. A job
    /// of a co-located group moves with its group (see [`super::group`]):
    /// the id returned is the asked job's migration, whose state names the
    /// rest. The drain calls this for every job of the node it drains:
    /// consecutive calls with nothing else changing the fleet or the
    /// bindings in between reuse the placement view as the previous one
    /// left it.
    pub(crate) fn migrate_job(
        &mut self,
        job_id: &JobId,
        options: &MigrationOptions,
        now: UnixMillis,
    ) -> Result<MigrationId, MigrationRefusal> {
        // The caller's strategy moves the whole group; given none, each
        // member moves with the one it declares.
        let strategy = options.strategy;
        let started = self.migrate_with_group(job_id, options, &|_| strategy, now)?;
        // The asked job's migration comes first; one always starts when the
        // group was not refused.
        started
            .into_iter()
            .next()
            .map(|(_, id)| id)
            .ok_or_else(|| MigrationRefusal::NotRunning { job_id: job_id.clone() })
    }

    /// Migrates `job_id` and every member of its co-located group that runs
    /// beside it, each with the strategy `strategy_of` gives it or, where it
    /// gives none, the one the member declares
    /// (`requirements.migrationStrategy`, else `stopThenStart`); returns
    /// each member's migration. Refused as a whole.
    pub(crate) fn migrate_with_group(
        &mut self,
        job_id: &JobId,
        options: &MigrationOptions,
        strategy_of: &dyn Fn(&JobId) -> Option<MigrationStrategy>,
        now: UnixMillis,
    ) -> Result<Vec<(JobId, MigrationId)>, MigrationRefusal> {
        let source = self.movable_source(job_id, options)?;
        let group = self.facts.moving_group(job_id, &source.node_id);
        let refused = |reason: String| MigrationRefusal::GroupCannotMove {
            job_id: job_id.clone(),
            group: group.clone(),
            reason,
        };
        // A group moves whole: not while another move of it is unfinished.
        if let Some((peer, id)) = self.facts.peer_still_moving(job_id) {
            return Err(refused(format!(
                "its co-located peer {peer} is still moving ({id}); the group moves again once it has arrived"
            )));
        }
        // The asked job first: it is its group's first mover.
        let mut members: Vec<(JobId, Binding)> = vec![(job_id.clone(), source.clone())];
        for peer in group.iter().filter(|j| *j != job_id) {
            match self.movable_source(peer, &MigrationOptions::default()) {
                Ok(binding) => members.push((peer.clone(), binding)),
                Err(refusal) => return Err(refused(refusal.to_string())),
            }
        }
        let movers: Vec<JobId> = members.iter().map(|(j, _)| j.clone()).collect();
        let (targets, kept) =
            self.place_targets(&movers, &source, options, now)
                .map_err(|refusal| match (refusal, movers.len()) {
                    (refusal, 1) => refusal,
                    (MigrationRefusal::NowhereToPlace { reason, .. }, _) => {
                        refused(format!("no target takes the whole group: {reason}"))
                    }
                    (refusal, _) => refused(refusal.to_string()),
                })?;
        let mut started: Vec<(JobId, MigrationId, InstanceKey)> = Vec::with_capacity(members.len());
        for ((member, binding), target) in members.iter().zip(&targets) {
            let record = self.facts.jobs.get(member);
            let replica = record.map_or(0, |r| r.bundle_ref.replica_index);
            let slot = binding
                .instance_key
                .slot_of()
                .unwrap_or_else(|| Slot::of_replica(replica));
            let (migration_id, tag) = self.migrations.next_id(member, now);
            let target_key = InstanceKey::migration_target(slot, tag);
            if let Some(mut record) = self.facts.jobs.get_mut(member) {
                record.migration = Some(MigrationClaim {
                    migration_id: migration_id.clone(),
                    target: Binding {
                        node_id: target.node_id.clone(),
                        instance_key: target_key.clone(),
                        gpu_index: target.gpu_index,
                        phase: BindingPhase::AwaitingNode,
                        uncounted: true,
                        prepared_start_awaited: false,
                    },
                });
            }
            started.push((member.clone(), migration_id, target_key));
        }
        for (((member, binding), target), (_, migration_id, target_key)) in members.iter().zip(&targets).zip(&started) {
            let group = started
                .iter()
                .filter(|(peer, _, _)| peer != member)
                .map(|(peer, id, _)| GroupPeer {
                    job_id: peer.clone(),
                    migration_id: id.clone(),
                })
                .collect();
            let (strategy, note) = self.strategy_for(member, strategy_of(member));
            self.migrations.insert(MigrationState {
                migration_id: migration_id.clone(),
                job_id: member.clone(),
                strategy,
                note,
                phase: MigrationPhase::Placing,
                transitions: Vec::new(),
                source_node_id: binding.node_id.clone(),
                source_key: binding.instance_key.clone(),
                target_node_id: target.node_id.clone(),
                target_key: target_key.clone(),
                past_point_of_no_return: false,
                phase_deadline: None,
                reason: None,
                group,
            });
        }
        for (_, migration_id, _) in &started {
            self.saga().enter_phase(migration_id, MigrationPhase::Placing, now);
        }
        for (_, migration_id, _) in &started {
            self.saga().dispatch_target_if_ready(migration_id, now);
        }
        // The kept view holds the targets just reserved and the facts now
        // hold their claims: it matches the facts as they stand.
        let revision = self.facts.revision();
        if let Some(cache) = self.view_cache.as_mut().filter(|_| kept) {
            cache.matched_at(revision);
        }
        Ok(started.into_iter().map(|(job, id, _)| (job, id)).collect())
    }

    /// The strategy `job_id` moves with when its caller gives `given`: the
    /// caller's, else the one the job declares
    /// (`requirements.migrationStrategy`), else `stopThenStart` — and, when
    /// the Manager at hand cannot carry that out, what is done instead and
    /// why: a handover needs Manager to relay migration signals, and runs
    /// as overlap (target started, then the source stopped) without them.
    fn strategy_for(&self, job_id: &JobId, given: Option<MigrationStrategy>) -> (MigrationStrategy, Option<String>) {
        let asked = match self.facts.jobs.get(job_id) {
            Some(record) => record.job.requirements().migration_strategy_or(given),
            None => given.unwrap_or_default(),
        };
        if asked == MigrationStrategy::Handover && !self.manager.serves(Capability::MigrationSignals) {
            let note = "handover runs as overlap: Manager does not relay migration signals (the target starts, \
                        then the source stops, without a cooperative cut-over)";
            return (MigrationStrategy::Overlap, Some(note.to_owned()));
        }
        (asked, None)
    }

    /// The running instance `job_id` would move from, or why it cannot
    /// move: the saga's refusals.
    fn movable_source(&self, job_id: &JobId, options: &MigrationOptions) -> Result<Binding, MigrationRefusal> {
        // Nothing is placed before Manager's snapshot is complete.
        if !self.facts.hydrated {
            return Err(MigrationRefusal::NotHydrated { job_id: job_id.clone() });
        }
        let record = self
            .facts
            .jobs
            .get(job_id)
            .ok_or_else(|| MigrationRefusal::NotAutoManagerPlaced { job_id: job_id.clone() })?;
        if let Some(claim) = &record.migration {
            return Err(MigrationRefusal::AlreadyMigrating {
                job_id: job_id.clone(),
                migration_id: claim.migration_id.clone(),
            });
        }
        if record.dropped || record.job.terminal_verdict.is_some() {
            return Err(MigrationRefusal::JobDropped { job_id: job_id.clone() });
        }
        let source = record
            .binding
            .clone()
            .filter(|b| b.phase == BindingPhase::Running && record.in_flight.is_none())
            .ok_or_else(|| MigrationRefusal::NotRunning { job_id: job_id.clone() })?;
        if self.facts.broken.contains_key(&record.bundle_ref.bundle_id) {
            return Err(MigrationRefusal::BundleBroken {
                job_id: job_id.clone(),
                bundle_id: record.bundle_ref.bundle_id.clone(),
            });
        }
        if options.target_node_id.as_ref() == Some(&source.node_id) {
            return Err(MigrationRefusal::TargetIsSource {
                job_id: job_id.clone(),
                node_id: source.node_id,
            });
        }
        Ok(source)
    }

    /// Places the targets of `members` (one job, or a co-located group with
    /// its first mover first): the ordinary engine, in a migration's context
    /// (the source excluded, no `onRuntimeFailure`), pinned when asked. A
    /// group's first mover is sized for the whole group; the others are
    /// pinned to its target. Nothing is provisioned or kept reserved unless
    /// every member found its place. With the targets comes whether the
    /// kept view holds them reserved (and nothing else new).
    fn place_targets(
        &mut self,
        members: &[JobId],
        source: &Binding,
        options: &MigrationOptions,
        now: UnixMillis,
    ) -> Result<(Vec<TargetPlacement>, bool), MigrationRefusal> {
        let Some(first) = members.first() else {
            return Ok((Vec::new(), false));
        };
        let nowhere = |reason: String| MigrationRefusal::NowhereToPlace {
            job_id: first.clone(),
            reason,
        };
        let moving = self.moving_members(members)?;
        let mut view = self.migration_view(now).map_err(nowhere)?;
        let mut placed: Vec<Placed> = Vec::with_capacity(members.len());
        for (member, name) in members.iter().zip(&moving.names) {
            // The first mover goes where it is pinned (if it is); the rest
            // of its group goes where it went.
            let pin = placed
                .first()
                .map(|p| &p.target.node_id)
                .or(options.target_node_id.as_ref())
                .cloned();
            let member = MovingMember {
                job_id: member,
                name,
                group_source: (members.len() > 1).then_some(&source.node_id),
                pin: pin.as_ref(),
            };
            match self.place_target(&mut view, &moving, &member, source, options) {
                Ok(one) => placed.push(one),
                Err((reason, reserved)) => {
                    self.abandon_view(view, reserved || !placed.is_empty());
                    self.counters.placements_failed += 1;
                    return Err(nowhere(reason));
                }
            }
        }
        let provisioned = self.commit_targets(&placed, now);
        let kept = self.keep_view(view, provisioned, &placed, &moving);
        Ok((placed.into_iter().map(|one| one.target).collect(), kept))
    }

    /// The bundle and the job names of a migration's movers: refused when a
    /// member or the bundle is not known.
    fn moving_members(&self, members: &[JobId]) -> Result<MovingBundle, MigrationRefusal> {
        let first = &members[0];
        let nowhere = |reason: String| MigrationRefusal::NowhereToPlace {
            job_id: first.clone(),
            reason,
        };
        let record = self
            .facts
            .jobs
            .get(first)
            .ok_or_else(|| nowhere("the job is unknown".to_owned()))?;
        let replica_index = record.bundle_ref.replica_index;
        let bundle = self
            .facts
            .bundles
            .get(&record.bundle_ref.bundle_id)
            .cloned()
            .ok_or_else(|| MigrationRefusal::NotAutoManagerPlaced { job_id: first.clone() })?;
        let mut names = Vec::with_capacity(members.len());
        for member in members {
            let name = self
                .facts
                .jobs
                .get(member)
                .map(|r| r.bundle_ref.job_name.clone())
                .ok_or_else(|| nowhere(format!("job {member} is unknown")))?;
            names.push(name);
        }
        Ok(MovingBundle {
            bundle,
            replica_index,
            names,
        })
    }

    /// The view a migration's targets are placed in. Held-back tiers and
    /// exhausted offerings shape the pools as in a placement round (a view
    /// of its own then); otherwise the kept view, which keeps the target's
    /// reservation.
    fn migration_view(&mut self, now: UnixMillis) -> Result<PlacementView, String> {
        if self.facts.placed_with.capacity_held_back(now) {
            let pools = self.facts.placed_with.effective_pools(&self.facts.fleet, now)?;
            return Ok(PlacementView::Once(Box::new(
                self.view_with(pools).map_err(|e| e.to_string())?,
            )));
        }
        // A view nothing has changed under since the last migration noted
        // it (consecutive migrations: a drain's, a burst of `migrateJob`s)
        // is used as it is.
        let revision = self.facts.revision();
        let kept = match self.view_cache.take() {
            Some(cache) if cache.matches(revision) => cache,
            other => {
                self.view_cache = other;
                self.synced_view().map_err(|e| e.to_string())?
            }
        };
        Ok(PlacementView::Kept(Box::new(kept)))
    }

    /// Places one mover's target in `view` and reserves it there, saying
    /// the decision (and a failure, as any placement's) as it goes; the
    /// reason it found no place otherwise, and whether the view may hold
    /// part of a reservation that did not go through.
    fn place_target(
        &mut self,
        view: &mut PlacementView,
        moving: &MovingBundle,
        member: &MovingMember<'_>,
        source: &Binding,
        options: &MigrationOptions,
    ) -> Result<Placed, (String, bool)> {
        let bundle = &moving.bundle;
        let context = RecoveryContext {
            on_runtime_failure: None,
            excluded_nodes: vec![source.node_id.clone()],
        };
        let mut request = PlacementRequest::launch(&bundle.bundle_id, &bundle.spec, moving.replica_index, member.name)
            .recovering(&context)
            .with_trace(self.facts.settings().trace_placements);
        request.override_reservation |= options.override_reservation;
        if let Some(from) = member.group_source {
            request = request.moving_group_from(from);
        }
        if let Some(pin) = member.pin {
            request = request.pinned_to(pin);
        }
        self.counters.placements_attempted += 1;
        let placement =
            place(view.fleet_view(), request, &mut self.facts.node_ids).map_err(|e| (e.to_string(), false))?;
        self.notify(Notification::PlacementDecision(Box::new(PlacementDecisionInfo {
            job_id: member.job_id.clone(),
            bundle_id: bundle.bundle_id.clone(),
            replica_index: moving.replica_index,
            job_name: member.name.to_owned(),
            // A move, not a re-placement after a loss.
            recovery: false,
            decision: decision_of(&placement.outcome),
            trace: placement.trace.clone(),
        })));
        let (node_id, gpu_index) = match &placement.outcome {
            Outcome::Placed { node_id, gpu_index, .. } | Outcome::Provision { node_id, gpu_index, .. } => {
                (node_id.clone(), *gpu_index)
            }
            Outcome::NoCapacityInAnyPool => {
                let why = match &placement.trace {
                    Some(trace) => trace.why_not_placed(),
                    None => why_not_placed(view.fleet_view(), request),
                };
                let reason = format!("noCapacityInAnyPool ({why})");
                // "A typed failure callback (also surfaces via onError)".
                self.notify(Notification::Error {
                    message: format!("placement of {} failed: {reason}", member.job_id),
                });
                self.notify(Notification::PlacementFailed {
                    job_id: member.job_id.clone(),
                    reason: reason.clone(),
                });
                return Err((reason, false));
            }
        };
        apply_placement(view.fleet_view(), &request, &placement.outcome)
            .map_err(|e| (format!("the target could not be reserved: {e}"), true))?;
        Ok(Placed {
            job_id: member.job_id.clone(),
            outcome: placement.outcome,
            resilience: placement.resilience,
            target: TargetPlacement { node_id, gpu_index },
        })
    }

    /// Every member has its place: the node is provisioned (for the first
    /// mover, which sized it) and a degraded resilience said. True when a
    /// node was provisioned.
    fn commit_targets(&mut self, placed: &[Placed], now: UnixMillis) -> bool {
        let mut provisioned = false;
        for one in placed {
            if let Outcome::Provision {
                node_id,
                pool,
                tier,
                instance_type,
                ..
            } = &one.outcome
            {
                self.provision(
                    &one.job_id,
                    node_id,
                    pool.clone(),
                    tier.clone(),
                    instance_type.clone(),
                    now,
                );
                provisioned = true;
            }
            self.notify_if_degraded(&one.job_id, &one.target.node_id, &one.resilience);
        }
        provisioned
    }

    /// Keeps the view the targets were placed in, with their reservations,
    /// for the next round: true when it was kept. A view that gained a
    /// prospective node no longer matches what it remembers of the fleet:
    /// it is built again next round.
    fn keep_view(&mut self, view: PlacementView, provisioned: bool, placed: &[Placed], moving: &MovingBundle) -> bool {
        let (bundle, replica_index) = (&moving.bundle, moving.replica_index);
        match view {
            PlacementView::Kept(mut cache) if !provisioned => {
                for (one, name) in placed.iter().zip(&moving.names) {
                    if let Some(spec) = bundle.spec.job(name) {
                        let reserved = placed_job(&bundle.bundle_id, replica_index, spec, one.target.gpu_index);
                        cache.reserved_target(one.job_id.clone(), one.target.node_id.clone(), reserved);
                    }
                }
                self.view_cache = Some(*cache);
                true
            }
            _ => {
                self.view_cache = None;
                false
            }
        }
    }

    /// A placement of targets that did not go through: the kept view is put
    /// back when nothing was reserved in it, else dropped (it holds what
    /// was not kept) and built again next round.
    fn abandon_view(&mut self, view: PlacementView, reserved: bool) {
        match view {
            PlacementView::Kept(cache) if !reserved => self.view_cache = Some(*cache),
            _ => self.view_cache = None,
        }
    }
}

impl Saga<'_> {
    /// The target's `StartJob`, once its node runs: created with
    /// `deferStart` for `stopThenStart` (`preparing`), started otherwise
    /// (`starting`). It wears `<slot>@<id>` and is told its slot in
    /// `NORSK_RUNTIME_ROLE`.
    pub(super) fn dispatch_target_if_ready(&mut self, id: &MigrationId, now: UnixMillis) {
        let Some((state, claim)) = self.in_flight(id) else {
            return;
        };
        let target = &claim.target;
        let node_runs = self
            .facts
            .fleet
            .get(&target.node_id)
            .is_some_and(|n| n.phase == NodePhase::Running && !n.terminated);
        if state.phase != MigrationPhase::Placing || target.phase != BindingPhase::AwaitingNode || !node_runs {
            return;
        }
        let defer_start = state.strategy == MigrationStrategy::StopThenStart;
        let rpc = Rpc::StartMigrationTarget {
            job_id: state.job_id.clone(),
            instance_key: target.instance_key.clone(),
            node_id: target.node_id.clone(),
            gpu_index: target.gpu_index,
            runtime_role: target
                .instance_key
                .slot_of()
                .map_or_else(|| target.instance_key.0.clone(), |s| s.as_str().to_owned()),
            defer_start,
            migration_id: id.clone(),
        };
        let job_id = state.job_id.clone();
        self.migrations.start_pending.insert(id.clone());
        self.outbox.call(
            rpc,
            Pending::Migration {
                migration_id: id.clone(),
                call: MigrationCall::StartTarget,
            },
        );
        if let Some(mut record) = self.facts.jobs.get_mut(&job_id)
            && let Some(claim) = record.migration.as_mut()
        {
            claim.target.phase = BindingPhase::Dispatched;
        }
        let next = if defer_start {
            MigrationPhase::Preparing
        } else {
            MigrationPhase::Starting
        };
        self.enter_phase(id, next, now);
    }
}

/// Why `request` finds no place in `view`, in words: the same placement
/// again with its trace on (a failed placement changes nothing, so it
/// fails the same way).
fn why_not_placed(view: &FleetView, request: PlacementRequest<'_>) -> String {
    match place(view, request.with_trace(true), &mut SequentialNodeIds::default()) {
        Ok(placement) => placement
            .trace
            .map_or_else(|| "no tier placed or provisioned".to_owned(), |t| t.why_not_placed()),
        Err(e) => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use crate::automanager::core::AutoManagerCore;
    use crate::automanager::migration::state::MigrationOptions;
    use crate::automanager::protocol::{Command, CommandId, Input};
    use crate::automanager::testing::{ONE_JOB, TestCore};
    use crate::model::{BundleId, JobId, ManagerEvent, runtime_job_id};

    fn job(bundle: &str) -> JobId {
        runtime_job_id(&BundleId::from(bundle), 0, "encode")
    }

    fn migrate(n: u64, bundle: &str) -> Input {
        Input::Command {
            id: CommandId(n),
            command: Command::MigrateJob {
                job_id: job(bundle),
                options: MigrationOptions::default(),
            },
        }
    }

    /// Three running one-job bundles on three nodes.
    fn fleet() -> TestCore {
        let mut t = TestCore::hydrated(&[("a", 4.0), ("b", 4.0), ("c", 4.0)]);
        for bundle in ["one", "two", "three"] {
            t.bundle(bundle, ONE_JOB);
        }
        t.start_all();
        t
    }

    fn syncs(core: &AutoManagerCore) -> u64 {
        core.view_cache.as_ref().expect("a kept view").syncs()
    }

    #[test]
    fn consecutive_migrations_reuse_the_kept_view_until_a_fact_changes() {
        // Two migrations in a row: the second places on the view the first
        // left, without bringing it up to date again.
        let mut t = fleet();
        let now = t.now;
        let core = t.core_mut();
        let before = syncs(core);
        core.handle_all([migrate(1, "one"), migrate(2, "two")], now);
        assert_eq!(syncs(core), before + 1, "one bring-up-to-date for both migrations");
        assert!(core.job(&job("one")).and_then(|r| r.migration.as_ref()).is_some());
        assert!(core.job(&job("two")).and_then(|r| r.migration.as_ref()).is_some());

        // Anything that changes a fact in between (here Manager telling of
        // a job again) makes the second bring it up to date.
        let mut t = fleet();
        let now = t.now;
        let core = t.core_mut();
        let before = syncs(core);
        let again = core.job(&job("three")).expect("job three is known").job.clone();
        let told = Input::Event(Box::new(ManagerEvent::JobUpdated(again)));
        core.handle_all([migrate(1, "one"), told, migrate(2, "two")], now);
        assert_eq!(syncs(core), before + 2, "the second migration saw the change");
    }
}
