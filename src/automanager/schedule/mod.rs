//! Scheduled bundles in the core: when a scheduled job may be placed, the
//! phase of each bundle's schedule (read by the status, notified when it
//! changes, woken for), and the end — at it every job of the bundle is
//! completed (Manager's `CompleteJob`: its instances stop, it moves to
//! `POST`) and is never placed again, until an update gives the bundle a new
//! schedule (Manager re-dates its jobs and they live again).
//!
//! The placement lead (`placementLeadMs`) is a property of a tier, but a
//! job is placed through its pool's whole cascade, cheapest tier first, and
//! which tier takes it is only known once it is placed. So a scheduled job
//! is placed from `start − lead`, the lead being the **largest** of its
//! pool's tiers (the pool of its replica: the backup's may differ), and its
//! placement then walks every tier in order as any placement does:
//!
//! - a cloud-only pool is placed 5 minutes ahead (the cloud default), long
//!   enough to boot a node before the start;
//! - a cluster-only pool (`local-servers`, lead 0) is placed at the start:
//!   its servers are there already;
//! - a mixed cascade is placed at its cloud tiers' lead and still tries the
//!   cheaper cluster tier first, so no cheaper tier is ever skipped. A job
//!   that lands on a cluster server runs there a few minutes early (on a
//!   server already paid for); waiting for the cluster tier's own lead
//!   instead would, whenever the cluster is full, spill to the cloud tier
//!   at the start and put the channel on air late by a node's boot.
//!
//! A provision made for a scheduled job times out as any other, after its
//! tier's `provisionTimeoutMs` (default `max(placementLeadMs, 5 min) × 2`).
//! A job running when its schedule is moved later keeps running: only the
//! end, a stop or a deletion takes a channel off the air.

pub(super) mod state;

pub use state::{COMPLETE_RETRY_MS, ScheduleView};

use std::collections::BTreeMap;

use crate::model::{Bundle, BundleId, BundleState, JobId, JobState, SchedulePhase, UnixMillis};

use super::facts::Facts;
use super::notification::Notification;
use super::outbox::{Outbox, Pending, SubsystemCall};
use super::protocol::{Rpc, RpcFailure, RpcFailureKind};
use super::subsystem::{Pass, Subsystem};
use state::Schedules;

impl Facts {
    /// The placement lead of a replica: the largest `placementLeadMs` of
    /// the tiers of the pool it is placed from (see the module docs).
    pub(super) fn placement_lead_ms(&self, bundle: &Bundle, replica_index: u32) -> u64 {
        let pool = bundle.spec.pool_for_replica(replica_index);
        self.pools().get(pool).map_or(0, |p| {
            p.tiers
                .iter()
                .map(|t| t.effective_placement_lead_ms())
                .max()
                .unwrap_or(0)
        })
    }

    /// When the earliest replica of a scheduled bundle starts being placed.
    fn placing_from(&self, bundle: &Bundle) -> Option<UnixMillis> {
        let start = bundle.spec.schedule.as_ref()?.start.millis();
        let lead = (0..bundle.spec.replica_count())
            .map(|r| self.placement_lead_ms(bundle, r))
            .max()
            .unwrap_or(0);
        Some(start.saturating_sub(i64::try_from(lead).unwrap_or(i64::MAX)))
    }

    /// The schedule of `bundle_id` at `now`, if it has one.
    pub(super) fn schedule_view(&self, bundle_id: &BundleId, now: UnixMillis) -> Option<ScheduleView> {
        let bundle = self.bundles.get(bundle_id)?;
        let schedule = bundle.spec.schedule.as_ref()?;
        let placing_from = self.placing_from(bundle)?;
        let (phase, next) = schedule.phase_at(placing_from, now);
        Some(ScheduleView {
            placing_from,
            start: schedule.start.millis(),
            end: schedule.end_millis(),
            phase,
            next,
        })
    }

    /// Whether the bundle's schedule has ended at `now` (its jobs are not
    /// placed again).
    pub(super) fn schedule_ended(&self, bundle_id: &BundleId, now: UnixMillis) -> bool {
        self.bundles
            .get(bundle_id)
            .and_then(|b| b.spec.schedule.as_ref())
            .is_some_and(|s| s.has_ended(now))
    }
}

impl Schedules {
    /// Notifies phase changes and completes the jobs of every bundle whose
    /// schedule has ended.
    fn follow(&mut self, facts: &Facts, outbox: &mut Outbox, now: UnixMillis) {
        let scheduled = facts
            .bundles
            .values()
            .filter(|b| b.state == BundleState::Live)
            .filter_map(|b| Some((b.bundle_id.clone(), facts.schedule_view(&b.bundle_id, now)?)));
        let mut phases = BTreeMap::new();
        for (bundle_id, view) in scheduled {
            let seen = self.phases.get(&bundle_id).copied();
            if seen.is_some_and(|p| p != view.phase) {
                outbox.notify(Notification::BundleSchedule {
                    bundle_id: bundle_id.clone(),
                    phase: view.phase,
                    next_phase: view.next.map(|n| n.phase),
                    next_at: view.next.map(|n| n.at),
                });
            }
            if view.phase == SchedulePhase::Ended {
                self.complete_jobs_of(facts, &bundle_id, outbox, now);
            }
            phases.insert(bundle_id, view.phase);
        }
        self.phases = phases;
        // A job that reached `POST`, or left, needs no more calls.
        let jobs = &facts.jobs;
        self.completions
            .retain(|job_id, _| jobs.get(job_id).is_some_and(|r| r.job.state != JobState::Post));
    }

    /// `CompleteJob` for every job of an ended bundle not yet completed,
    /// one call in flight per job, again `COMPLETE_RETRY_MS` after an
    /// answer that did not complete it.
    fn complete_jobs_of(&mut self, facts: &Facts, bundle_id: &BundleId, outbox: &mut Outbox, now: UnixMillis) {
        let due: Vec<JobId> = facts
            .jobs
            .values()
            .filter(|r| &r.bundle_ref.bundle_id == bundle_id && r.job.state != JobState::Post)
            .map(|r| r.job_id().clone())
            .filter(|job_id| match self.completions.get(job_id) {
                None => true,
                Some(None) => false,
                Some(Some(answered)) => answered + COMPLETE_RETRY_MS <= now,
            })
            .collect();
        for job_id in due {
            self.completions.insert(job_id.clone(), None);
            outbox.call(
                Rpc::CompleteJob { job_id: job_id.clone() },
                Pending::Subsystem(SubsystemCall::Schedule(job_id)),
            );
        }
    }

    /// What Manager answered to a `CompleteJob`.
    pub(in crate::automanager) fn complete_result(
        &mut self,
        job_id: &JobId,
        result: Result<(), RpcFailure>,
        outbox: &mut Outbox,
        now: UnixMillis,
    ) {
        match result {
            // The job is gone: nothing is left to end.
            Err(failure) if failure.kind == RpcFailureKind::NotFound => {
                self.completions.remove(job_id);
            }
            Err(failure) => {
                self.answered(job_id, now);
                outbox.notify(Notification::Error {
                    message: format!(
                        "completing {job_id} at its schedule's end failed (tried again in {} s): {}",
                        COMPLETE_RETRY_MS / 1_000,
                        failure.message
                    ),
                });
            }
            Ok(()) => self.answered(job_id, now),
        }
    }

    /// When a schedule changes phase next, or a `CompleteJob` is due again.
    pub(in crate::automanager) fn deadlines<'a>(
        &'a self,
        facts: &'a Facts,
        now: UnixMillis,
    ) -> impl Iterator<Item = UnixMillis> + 'a {
        let transitions = facts
            .bundles
            .keys()
            .filter_map(move |id| facts.schedule_view(id, now)?.next.map(|n| n.at));
        let retries = self
            .completions
            .values()
            .filter_map(|answered| answered.map(|at| at + COMPLETE_RETRY_MS))
            .filter(move |&at| at > now);
        transitions.chain(retries)
    }
}

impl Subsystem for Schedules {
    /// The job a `CompleteJob` ends.
    type Call = JobId;
    const PASS: Pass = Pass::BeforePlacement;

    fn answered(
        &mut self,
        job_id: JobId,
        result: Result<(), RpcFailure>,
        _facts: &mut Facts,
        outbox: &mut Outbox,
        now: UnixMillis,
    ) {
        self.complete_result(&job_id, result, outbox, now);
    }

    fn step(&mut self, facts: &mut Facts, outbox: &mut Outbox, now: UnixMillis) {
        self.follow(facts, outbox, now);
    }

    fn next_deadline(&self, facts: &Facts, now: UnixMillis) -> Option<UnixMillis> {
        self.deadlines(facts, now).min()
    }

    /// The phases seen, so a reconnect does not announce them again;
    /// calls are not carried.
    fn carried(&self) -> Self {
        Self {
            phases: self.phases.clone(),
            ..Self::default()
        }
    }
}
