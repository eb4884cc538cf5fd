//! Drain / cordon / evict: taking a node out of service. A cordoned node
//! takes no new placements (the placement view reads the flag); a drain
//! cordons its node, starts a migration (the saga of `migrate_job`) for
//! every job bound to it, follows those migrations, and terminates the node
//! once it is empty — through the one terminate path, so `nodeTerminated`
//! fires once. At its timeout a drain ends `partial` (nothing terminated,
//! the node still cordoned), or, with `force`, terminates the node with its
//! stuck jobs on it; they are then recovered per their `onRuntimeFailure`
//! when Manager reports the node stopping.
//!
//! Groups are the unit of movement: the jobs of a co-located group on the
//! node are migrated together (see [`super::migration::group`]), each with
//! its own strategy, and a group that cannot move is `stuck` as a whole,
//! every member with the same reason. A job's strategy is the caller's
//! `strategyFor` for it, else the caller's default, else the one the job
//! declares (`requirements.migrationStrategy`), else `stopThenStart`.
//!
//! Outcomes are what happened to the jobs: a drain is `done` only when
//! every job left the node before it went (`migrated`, or `moved` some
//! other way). A job still on the node when it is terminated, or when it
//! stops under the drain, went down with it: it is `terminated` (never
//! `moved`), and the drain ends `partial` (terminated by the drain itself)
//! or `failed` (the node went under it), the reason naming those jobs.
//!
//! Maintenance drains extend the spec: a drain with `after: keep` empties
//! its node the same way but keeps it (cordoned, running) for planned work
//! instead of terminating it; it ends `done` once every job moved, and
//! `uncordonNode` returns the node to service. `keep` is asked for, never
//! assumed: a drain given none terminates its node as the spec's drain
//! does, a registered cluster server included (`onNodeTerminated` fires
//! once). A forced drain still terminates at its timeout, and an
//! interruption always terminates (the provider takes the node anyway).
//!
//! This module owns the drains and the cordon flag's meaning; it never
//! places a job itself (the saga does), and it never changes a binding.

pub(super) mod state;

use crate::model::{NodeId, UnixMillis};

use super::core::AutoManagerCore;
use super::facts::Facts;
use super::migration::state::{MigrationEnd, MigrationOptions, Migrations};
use super::notification::Notification;
use super::outbox::Outbox;
use super::protocol::{CommandError, RpcFailure, RpcFailureKind};
use state::{Drain, Drains};

pub use crate::model::{DrainAfter, DrainJobStatus, DrainPhase};
pub use state::{DEFAULT_DRAIN_TIMEOUT_MS, DrainJob, DrainOptions, DrainState, StrategyFor};

impl AutoManagerCore {
    /// `cordonNode`: no new placements land on the node.
    pub(super) fn cordon_node(&mut self, node_id: &NodeId) -> Result<(), CommandError> {
        if self.facts.fleet.cordon(node_id) {
            Ok(())
        } else {
            Err(CommandError::UnknownNode(node_id.clone()))
        }
    }

    /// `uncordonNode`: placements may land on the node again. A drain that
    /// has not issued its terminate is cancelled (its migrations in flight
    /// run to their end) and an interruption notice is withdrawn with it.
    pub(super) fn uncordon_node(&mut self, node_id: &NodeId) -> Result<(), CommandError> {
        self.drains.uncordon(&mut self.facts, &mut self.outbox, node_id)
    }

    /// `isCordoned`.
    pub fn is_cordoned(&self, node_id: &NodeId) -> bool {
        self.facts.fleet.get(node_id).is_some_and(|n| n.cordoned)
    }

    /// `drainStatus`: the node's running drain, or its last one.
    pub fn drain_status(&self, node_id: &NodeId) -> Option<&DrainState> {
        self.drains.get(node_id)
    }

    /// Every drain (running, or the last one of its node).
    pub fn drains(&self) -> impl Iterator<Item = &DrainState> {
        self.drains.iter()
    }

    /// `terminateNode`: terminate without cordoning.
    pub(super) fn terminate_node(&mut self, node_id: &NodeId) -> Result<(), CommandError> {
        let node = self
            .facts
            .fleet
            .get(node_id)
            .ok_or_else(|| CommandError::UnknownNode(node_id.clone()))?;
        if !node.terminated {
            self.terminate(node_id);
            self.follow_drain(node_id);
        }
        Ok(())
    }

    /// `evictNode`: cordon, then terminate at once; the jobs on it recover
    /// per their `onRuntimeFailure` when Manager reports it stopping.
    pub(super) fn evict_node(&mut self, node_id: &NodeId) -> Result<(), CommandError> {
        self.cordon_node(node_id)?;
        self.terminate_node(node_id)
    }

    /// `drainNode`: cordons the node and starts a migration for every job
    /// bound to it. One drain per node: while one runs, this returns it
    /// unchanged.
    pub(super) fn drain_node(
        &mut self,
        node_id: &NodeId,
        options: DrainOptions,
        now: UnixMillis,
    ) -> Result<(), CommandError> {
        if self.drains.running(node_id) {
            return Ok(());
        }
        let node = self
            .facts
            .fleet
            .get(node_id)
            .ok_or_else(|| CommandError::UnknownNode(node_id.clone()))?;
        if node.terminated || node.is_going() {
            return Err(CommandError::NodeGone(node_id.clone()));
        }
        let after = options.after.unwrap_or_default();
        self.cordon_node(node_id)?;
        let bound = self.facts.jobs_bound_to(node_id);
        let mut jobs: Vec<DrainJob> = Vec::with_capacity(bound.len());
        for job_id in bound {
            // Already taken with its co-located group.
            if jobs.iter().any(|j| j.job_id == job_id) {
                continue;
            }
            if let Some(bundle_id) = self
                .facts
                .jobs
                .get(&job_id)
                .map(|r| &r.bundle_ref.bundle_id)
                .filter(|b| self.facts.broken.contains_key(*b))
            {
                // "A broken bundle ... stops placing every replica of it":
                // no target is placed for it either.
                jobs.push(DrainJob {
                    reason: Some(format!("its bundle {bundle_id} is broken")),
                    job_id,
                    status: DrainJobStatus::Stuck,
                    migration_id: None,
                });
                continue;
            }
            // A co-located group moves as a unit, each job with its own
            // strategy; refused, the whole group is stuck with the reason.
            let group = self.facts.moving_group(&job_id, node_id);
            let strategy_for = &options.strategy_for;
            match self.migrate_with_group(
                &job_id,
                &MigrationOptions::default(),
                &|job| strategy_for.given(job),
                now,
            ) {
                Ok(started) => jobs.extend(started.into_iter().map(|(job_id, migration_id)| DrainJob {
                    job_id,
                    status: DrainJobStatus::Migrating,
                    migration_id: Some(migration_id),
                    reason: None,
                })),
                // Refused (not running, not placed here, already migrating)
                // or nowhere to place the target: stuck where it is.
                Err(refusal) => {
                    let reason = refusal.to_string();
                    jobs.extend(
                        group
                            .into_iter()
                            .filter(|member| !jobs.iter().any(|j| &j.job_id == member))
                            .map(|job_id| DrainJob {
                                job_id,
                                status: DrainJobStatus::Stuck,
                                migration_id: None,
                                reason: Some(reason.clone()),
                            })
                            .collect::<Vec<_>>(),
                    );
                }
            }
        }
        let timeout_ms = options.timeout_ms.unwrap_or(DEFAULT_DRAIN_TIMEOUT_MS);
        let migrating = jobs.iter().any(|j| j.status == DrainJobStatus::Migrating);
        let state = DrainState {
            node_id: node_id.clone(),
            phase: if migrating {
                DrainPhase::Migrating
            } else {
                DrainPhase::Waiting
            },
            started: now,
            timeout_ms,
            force: options.force,
            after,
            jobs,
            reason: None,
        };
        self.notify(Notification::DrainProgress(Box::new(state.clone())));
        let deadline = now.saturating_add(timeout_ms.min(i64::MAX as u64) as i64);
        self.drains.begin(node_id, Drain { state, deadline });
        self.follow_drain(node_id);
        Ok(())
    }

    /// Before a hydrated step's timers and placement round: cordons carried
    /// from a disposed core take effect, and the interruption notices Manager
    /// relayed are acted on.
    pub(super) fn prepare_drains(&mut self, now: UnixMillis) {
        for node_id in self.drains.take_carried_cordons() {
            let _ = self.facts.fleet.cordon(&node_id);
        }
        self.act_on_relayed_interruptions(now);
    }

    /// Brings every running drain up to date (see [`Drains::follow_all`]).
    pub(super) fn follow_drains(&mut self) {
        self.drains
            .follow_all(&mut self.facts, &mut self.outbox, &self.migrations);
    }

    fn follow_drain(&mut self, node_id: &NodeId) {
        self.drains
            .follow(&mut self.facts, &mut self.outbox, &self.migrations, node_id);
    }

    /// Drains whose timeout has passed (see [`Drains::expire`]).
    pub(super) fn expire_drains(&mut self, now: UnixMillis) {
        self.drains
            .expire(&mut self.facts, &mut self.outbox, &self.migrations, now);
    }

    /// Manager answered a `TerminateNode` (see [`Drains::terminate_settled`]).
    pub(super) fn drain_terminate_settled(&mut self, node_id: &NodeId, failure: Option<&RpcFailure>) {
        self.drains.terminate_settled(&mut self.outbox, node_id, failure);
    }
}

impl Drains {
    /// `uncordonNode`: placements may land on the node again. A drain that
    /// has not issued its terminate is cancelled (its migrations in flight
    /// run to their end) and an interruption notice is withdrawn with it.
    fn uncordon(&mut self, facts: &mut Facts, outbox: &mut Outbox, node_id: &NodeId) -> Result<(), CommandError> {
        // Capacity coming back is counted by the fleet: a job that found
        // nowhere may fit now.
        facts
            .fleet
            .uncordon(node_id)
            .ok_or_else(|| CommandError::UnknownNode(node_id.clone()))?;
        let cancelled = self
            .by_node
            .get_mut(node_id)
            .filter(|d| !d.state.phase.is_final() && !d.terminate_issued());
        if let Some(drain) = cancelled {
            drain.state.phase = DrainPhase::Failed;
            drain.state.reason = Some("cancelled: the node was uncordoned".to_owned());
            let state = drain.state.clone();
            self.interruptions.withdraw(node_id);
            outbox.notify(Notification::DrainProgress(Box::new(state)));
        }
        Ok(())
    }

    /// Brings every running drain up to date with its jobs and migrations;
    /// terminates the nodes that are empty. Runs at the end of every step.
    fn follow_all(&mut self, facts: &mut Facts, outbox: &mut Outbox, migrations: &Migrations) {
        for node_id in self.running_nodes() {
            self.follow(facts, outbox, migrations, &node_id);
        }
        // What is kept of a node goes with it: its last drain and its notice.
        let fleet = &facts.fleet;
        if self
            .by_node
            .iter()
            .any(|(n, d)| d.state.phase.is_final() && !fleet.contains(n))
        {
            self.by_node
                .retain(|n, d| !d.state.phase.is_final() || fleet.contains(n));
        }
        self.interruptions.forget_missing(fleet);
    }

    /// Brings one drain up to date with its jobs and migrations; terminates
    /// its node once it is empty.
    fn follow(&mut self, facts: &mut Facts, outbox: &mut Outbox, migrations: &Migrations, node_id: &NodeId) {
        let Some(drain) = self.by_node.get(node_id) else {
            return;
        };
        if drain.state.phase.is_final() || drain.terminate_issued() {
            return;
        }
        let mut state = drain.state.clone();
        // A job that leaves the node because the node goes has gone down
        // with it: `terminated`, never `moved`.
        let node_went = facts.fleet.get(node_id).is_none_or(|n| n.terminated || n.is_going());
        for job in &mut state.jobs {
            let on_node = facts.jobs.get(&job.job_id).is_some_and(|r| r.is_bound_to(node_id));
            match job.status {
                DrainJobStatus::Migrating => {
                    let migration = job.migration_id.as_ref().and_then(|id| migrations.get(id));
                    match migration.map(|m| (m.end(), &m.reason)) {
                        Some((None, _)) => {}
                        Some((Some(MigrationEnd::Completed), _)) => job.status = DrainJobStatus::Migrated,
                        // Aborted (or lost past its point of no return) with
                        // the job still here: stuck until the timeout.
                        Some((Some(end), reason)) if on_node => {
                            job.status = DrainJobStatus::Stuck;
                            job.reason = Some(reason.clone().unwrap_or_else(|| format!("migration {end:?}")));
                        }
                        Some((Some(end), reason)) => {
                            let why = reason.clone().unwrap_or_else(|| format!("migration {end:?}"));
                            if node_went {
                                job.status = DrainJobStatus::Terminated;
                                job.reason = Some(format!("went down with the node ({why})"));
                            } else {
                                job.status = DrainJobStatus::Moved;
                                job.reason = Some(format!("left the node otherwise: its migration ended ({why})"));
                            }
                        }
                        None if node_went => {
                            job.status = DrainJobStatus::Terminated;
                            job.reason = Some("went down with the node".to_owned());
                        }
                        None => job.status = DrainJobStatus::Moved,
                    }
                }
                DrainJobStatus::Stuck if !on_node && node_went => {
                    job.status = DrainJobStatus::Terminated;
                    job.reason = Some(format!(
                        "went down with the node{}",
                        job.reason
                            .as_ref()
                            .map(|r| format!(" (stuck: {r})"))
                            .unwrap_or_default()
                    ));
                }
                DrainJobStatus::Stuck if !on_node => {
                    job.status = DrainJobStatus::Moved;
                    job.reason = None;
                }
                _ => {}
            }
        }
        // The drain's own jobs first; the whole job table (and the
        // migration targets) only once they have all left.
        let empty = !state
            .jobs
            .iter()
            .any(|j| matches!(j.status, DrainJobStatus::Migrating | DrainJobStatus::Stuck))
            && !facts.jobs.values().any(|r| r.is_bound_to(node_id))
            && !facts.hosts_migration_target(node_id);
        match facts.fleet.get(node_id) {
            None => {
                mark_terminated(&mut state);
                state.phase = DrainPhase::Failed;
                state.reason = Some(format!(
                    "the node left the fleet before the drain finished{}",
                    lost_words(&state)
                ));
            }
            // Terminated outside the drain's own emptying (a forced
            // timeout, `terminateNode`, `evictNode`, a provision's startup
            // grace): every job still on it goes down with it.
            Some(n) if n.terminated => {
                mark_terminated(&mut state);
                state.phase = DrainPhase::Terminating;
            }
            Some(n) if n.is_going() => {
                mark_terminated(&mut state);
                state.phase = DrainPhase::Failed;
                state.reason = Some(format!(
                    "the node stopped before the drain finished{}",
                    lost_words(&state)
                ));
            }
            // A maintenance drain is done here: every job moved, the node
            // stays cordoned and running.
            Some(_) if empty && state.after == DrainAfter::Keep => state.phase = DrainPhase::Done,
            Some(_) if empty => {
                state.phase = DrainPhase::Terminating;
                facts.terminate(outbox, node_id);
            }
            Some(_) if state.jobs.iter().any(|j| j.status == DrainJobStatus::Migrating) => {
                state.phase = DrainPhase::Migrating;
            }
            Some(_) => state.phase = DrainPhase::Waiting,
        }
        self.publish(outbox, node_id, state);
    }

    /// Drains whose timeout has passed: `partial`, or with `force` the node
    /// terminated with its stuck jobs on it.
    fn expire(&mut self, facts: &mut Facts, outbox: &mut Outbox, migrations: &Migrations, now: UnixMillis) {
        let due: Vec<NodeId> = self
            .by_node
            .iter()
            .filter(|(_, d)| !d.state.phase.is_final() && !d.terminate_issued() && d.deadline <= now)
            .map(|(n, _)| n.clone())
            .collect();
        for node_id in due {
            self.follow(facts, outbox, migrations, &node_id);
            let Some(drain) = self.by_node.get(&node_id) else {
                continue;
            };
            if drain.state.phase.is_final() || drain.terminate_issued() {
                continue;
            }
            if drain.state.force {
                facts.terminate(outbox, &node_id);
                self.follow(facts, outbox, migrations, &node_id);
                continue;
            }
            let mut state = drain.state.clone();
            // The drain's outcome is fixed here: a migration still in flight
            // runs to its end, but the job is reported stuck where it was.
            for job in &mut state.jobs {
                if job.status == DrainJobStatus::Migrating {
                    job.status = DrainJobStatus::Stuck;
                    job.reason = Some("its migration was still in flight at the timeout".to_owned());
                }
            }
            let stuck = state.jobs.iter().filter(|j| j.status == DrainJobStatus::Stuck).count();
            state.phase = DrainPhase::Partial;
            state.reason = Some(format!(
                "timed out after {} ms with {stuck} job(s) stuck",
                state.timeout_ms
            ));
            self.publish(outbox, &node_id, state);
        }
    }

    /// Manager answered a `TerminateNode`: a drain waiting on it is `done`,
    /// or `failed` when Manager refused (a node Manager no longer knows is
    /// gone, which is what was asked).
    fn terminate_settled(&mut self, outbox: &mut Outbox, node_id: &NodeId, failure: Option<&RpcFailure>) {
        let Some(drain) = self
            .by_node
            .get(node_id)
            .filter(|d| d.state.phase == DrainPhase::Terminating)
        else {
            return;
        };
        let mut state = drain.state.clone();
        match failure {
            Some(f) if f.kind != RpcFailureKind::NotFound => {
                state.phase = DrainPhase::Failed;
                state.reason = Some(format!("terminating the node failed: {}", f.message));
            }
            // "Done" only when every job moved: a job that went down with
            // the node makes the drain `failed` (`partial` keeps the spec's
            // meaning: nothing terminated, the node still cordoned).
            _ if state.jobs.iter().any(|j| !j.status.left_the_node()) => {
                state.phase = DrainPhase::Failed;
                state.reason = Some(format!("the node was terminated{}", lost_words(&state)));
            }
            _ => state.phase = DrainPhase::Done,
        }
        self.publish(outbox, node_id, state);
    }

    /// Stores a drain's new state and fires `drainProgress` if it changed.
    fn publish(&mut self, outbox: &mut Outbox, node_id: &NodeId, state: DrainState) {
        let Some(drain) = self.by_node.get_mut(node_id) else {
            return;
        };
        if drain.state != state {
            drain.state = state.clone();
            outbox.notify(Notification::DrainProgress(Box::new(state)));
        }
    }
}

/// Jobs still migrating or stuck when the node's terminate was issued (or
/// when it went) go down with it.
fn mark_terminated(state: &mut DrainState) {
    for job in &mut state.jobs {
        if matches!(job.status, DrainJobStatus::Migrating | DrainJobStatus::Stuck) {
            job.status = DrainJobStatus::Terminated;
            job.reason = Some("still on the node when it was terminated".to_owned());
        }
    }
}

/// `" with N job(s) still on it, which recover per their onRuntimeFailure:
/// a, b"`, or nothing when every job had left.
fn lost_words(state: &DrainState) -> String {
    let lost: Vec<String> = state
        .jobs
        .iter()
        .filter(|j| j.status == DrainJobStatus::Terminated)
        .map(|j| j.job_id.to_string())
        .collect();
    if lost.is_empty() {
        return String::new();
    }
    format!(
        " with {} job(s) still on it, which recover per their onRuntimeFailure: {}",
        lost.len(),
        lost.join(", ")
    )
}
