//! Resilience headroom, kept continuously when
//! `experimental.headroom` is on: after anything changes, and
//! once the fleet has been quiet for `HEADROOM_DEBOUNCE_MS` (or at most
//! `HEADROOM_MAX_WAIT_MS` after the first change), the tracker of
//! `placement::headroom` brings every node's verdict up to date from the
//! fleet as placement reads it; zones and provider kinds, whose what-ifs
//! each re-place a large part of the fleet, follow on their own cadence, at
//! most every `HEADROOM_WIDE_INTERVAL_MS` while changes keep coming. Per
//! pool and for the fleet: "survives the loss of any single node / zone /
//! provider kind", with the worst domain and why. A verdict that changes is
//! a `headroomChanged` notification.
//!
//! The analysis runs on the core's own pools, bundles and restart
//! ceilings (a job already at its ceiling would not come back), on the
//! virtual clock like everything else here: nothing sleeps.

pub(super) mod state;

pub use state::{HEADROOM_DEBOUNCE_MS, HEADROOM_MAX_WAIT_MS, HEADROOM_WIDE_INTERVAL_MS};

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{BundleId, BundleSpec, JobId, UnixMillis};
use crate::placement::headroom::{DomainKind, HeadroomReport, KindSummary};

use super::facts::Facts;
use super::metrics::HeadroomGauge;
use super::notification::Notification;
use super::outbox::{NoCall, Outbox};
use super::protocol::RpcFailure;
use super::subsystem::{Pass, Subsystem};
use super::view_cache::placed_jobs;
use state::{Fingerprint, HeadroomState};

impl HeadroomState {
    /// The last report, once one was computed.
    pub(in crate::automanager) fn report(&self) -> Option<&HeadroomReport> {
        self.report.as_ref()
    }

    /// How many recomputes ran: all, and those that refreshed the zone and
    /// provider verdicts.
    pub(in crate::automanager) fn recomputes(&self) -> (u64, u64) {
        (self.recomputes, self.wide_recomputes)
    }

    /// Recomputes the verdicts when what they read changed and the
    /// debounce has run out (or the zone and provider refresh is due), and
    /// notifies the verdicts that changed.
    fn recompute_when_due(&mut self, facts: &Facts, outbox: &mut Outbox, now: UnixMillis) {
        if !facts.settings().experimental.headroom {
            return;
        }
        let fingerprint = fingerprint(facts);
        if self.seen.as_ref() != Some(&fingerprint) {
            self.seen = Some(fingerprint);
            self.pending = Some(match self.pending {
                Some((first, _)) => (first, now),
                None => (now, now),
            });
        }
        let Some(due) = self.deadline() else {
            return;
        };
        if due > now {
            return;
        }
        let nodes_due = self.pending.take().is_some();
        let snapshot = facts.fleet.snapshot(
            facts.pools(),
            placed_jobs(&facts.jobs),
            &facts.settings().template_images,
        );
        let bundles: BTreeMap<BundleId, BundleSpec> = facts
            .bundles
            .values()
            .map(|b| (b.bundle_id.clone(), b.spec.clone()))
            .collect();
        let ceiling: BTreeSet<JobId> = facts
            .jobs
            .values()
            .filter(|r| {
                facts
                    .settings()
                    .restart_ceiling(&r.job.spec.requirements)
                    .is_some_and(|c| r.restarts.count(now) >= c)
            })
            .map(|r| r.job_id().clone())
            .collect();
        if nodes_due {
            match self.tracker.update(&snapshot, facts.pools(), &bundles, &ceiling) {
                Err(e) => {
                    return outbox.notify(Notification::Error {
                        message: format!("headroom not computed: {e}"),
                    });
                }
                Ok(stats) => {
                    self.recomputes += 1;
                    if stats.rebuilt {
                        self.wide_recomputes += 1;
                        self.wide_at = Some(now);
                    }
                }
            }
        }
        if self.wide_due().is_some_and(|at| at <= now) {
            self.tracker.refresh_wide();
            self.wide_recomputes += 1;
            self.wide_at = Some(now);
        }
        let report = self.tracker.report();
        let before = self.report.take();
        let was = before.as_ref().map(bundle_verdicts).unwrap_or_default();
        let now_verdicts = bundle_verdicts(&report);
        let changed: BTreeSet<&BundleId> = was
            .iter()
            .filter(|(b, v)| now_verdicts.get(*b) != Some(*v))
            .chain(now_verdicts.iter().filter(|(b, _)| !was.contains_key(*b)))
            .map(|(b, _)| *b)
            .collect();
        for bundle_id in changed {
            outbox.notify(Notification::BundleHeadroomChanged {
                bundle_id: bundle_id.clone(),
            });
        }
        for (scope, kind) in summaries(&report) {
            let was = before.as_ref().and_then(|b| {
                summaries(b)
                    .into_iter()
                    .find(|(s, k)| *s == scope && k.kind == kind.kind)
            });
            let changed = was.as_ref().is_none_or(|(_, w)| {
                w.survives != kind.survives || w.worst.as_ref().map(|x| &x.name) != kind.worst.as_ref().map(|x| &x.name)
            });
            if changed && (was.is_some() || !kind.survives) {
                outbox.notify(Notification::HeadroomChanged {
                    pool: scope,
                    domain_kind: kind.kind,
                    survives: kind.survives,
                    worst: kind.worst.as_ref().map(|w| w.name.clone()),
                    why: kind.worst.as_ref().map(|w| w.why.clone()),
                });
            }
        }
        self.report = Some(report);
    }

    /// The gauges of the last report.
    pub(in crate::automanager) fn gauges(&self) -> Vec<HeadroomGauge> {
        let Some(report) = &self.report else {
            return Vec::new();
        };
        report
            .pools
            .iter()
            .flat_map(|pool| {
                pool.kinds.iter().map(|kind| HeadroomGauge {
                    pool_name: pool.pool.clone(),
                    kind: kind.kind.as_str().to_owned(),
                    absorbed: kind.survives,
                    unabsorbed_domains: kind.domains.saturating_sub(kind.absorbed),
                    worst: kind.worst.as_ref().map(|w| w.name.clone()),
                })
            })
            .collect()
    }

    /// When a recompute is next due: the debounce of the pending change,
    /// or the zone and provider refresh.
    fn deadline(&self) -> Option<UnixMillis> {
        let nodes = self
            .pending
            .map(|(first, last)| (last + HEADROOM_DEBOUNCE_MS).min(first + HEADROOM_MAX_WAIT_MS));
        nodes.into_iter().chain(self.wide_due()).min()
    }

    fn wide_due(&self) -> Option<UnixMillis> {
        if !self.tracker.wide_stale() {
            return None;
        }
        Some(
            self.wide_at
                .map_or(UnixMillis::MIN, |at| at + HEADROOM_WIDE_INTERVAL_MS),
        )
    }
}

/// What headroom reads of the facts, summed up cheaply.
fn fingerprint(facts: &Facts) -> Fingerprint {
    Fingerprint {
        capacity_epoch: facts.capacity_epoch(),
        revisions: facts.fleet.iter().map(|n| n.revision).fold(0, u64::wrapping_add),
        bindings: {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            for record in facts.jobs.values() {
                if let Some(binding) = &record.binding {
                    record.job_id().hash(&mut hasher);
                    binding.node_id.hash(&mut hasher);
                }
            }
            hasher.finish()
        },
        generations: facts.bundles.values().map(|b| b.generation).fold(0, u64::wrapping_add),
        pools: facts.pools().clone(),
    }
}

fn bundle_verdicts(report: &HeadroomReport) -> BTreeMap<&BundleId, Vec<(&str, bool)>> {
    let mut verdicts: BTreeMap<&BundleId, Vec<(&str, bool)>> = BTreeMap::new();
    for verdict in report.domains.iter().filter(|d| d.domain.kind == DomainKind::Node) {
        for fate in &verdict.bundles {
            verdicts
                .entry(&fate.bundle)
                .or_default()
                .push((verdict.domain.name.as_str(), fate.absorbed()));
        }
    }
    verdicts
}

/// Every summary of a report with its scope: `None` for the fleet, else
/// the pool.
fn summaries(report: &HeadroomReport) -> Vec<(Option<String>, KindSummary)> {
    let fleet = report.fleet.iter().map(|k| (None, k.clone()));
    let pools = report
        .pools
        .iter()
        .flat_map(|p| p.kinds.iter().map(move |k| (Some(p.pool.clone()), k.clone())));
    fleet.chain(pools).collect()
}

impl Subsystem for HeadroomState {
    type Call = NoCall;
    const PASS: Pass = Pass::Last;

    fn answered(
        &mut self,
        call: NoCall,
        _result: Result<(), RpcFailure>,
        _facts: &mut Facts,
        _outbox: &mut Outbox,
        _now: UnixMillis,
    ) {
        match call {}
    }

    fn step(&mut self, facts: &mut Facts, outbox: &mut Outbox, now: UnixMillis) {
        self.recompute_when_due(facts, outbox, now);
    }

    fn next_deadline(&self, _facts: &Facts, _now: UnixMillis) -> Option<UnixMillis> {
        self.deadline()
    }
}
