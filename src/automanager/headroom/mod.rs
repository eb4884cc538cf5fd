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

use super::core::AutoManagerCore;
use super::metrics::HeadroomGauge;
use super::notification::Notification;
use state::Fingerprint;

impl AutoManagerCore {
    /// The last headroom report, once one was computed.
    pub fn headroom(&self) -> Option<&HeadroomReport> {
        self.headroom.report.as_ref()
    }

    /// Notes a change, and recomputes headroom once the debounce is over.
    pub(super) fn step_headroom(&mut self, now: UnixMillis) {
        if !self.settings.experimental.headroom {
            return;
        }
        let fingerprint = self.fingerprint();
        if self.headroom.seen.as_ref() != Some(&fingerprint) {
            self.headroom.seen = Some(fingerprint);
            self.headroom.pending = Some(match self.headroom.pending {
                Some((first, _)) => (first, now),
                None => (now, now),
            });
        }
        let Some(due) = self.headroom_deadline() else {
            return;
        };
        if due > now {
            return;
        }
        let nodes_due = self.headroom.pending.take().is_some();
        let snapshot = self.fleet_snapshot();
        let bundles: BTreeMap<BundleId, BundleSpec> = self
            .bundles
            .values()
            .map(|b| (b.bundle_id.clone(), b.spec.clone()))
            .collect();
        let ceiling: BTreeSet<JobId> = self
            .jobs
            .values()
            .filter(|r| {
                self.settings
                    .restart_ceiling(&r.job.spec.requirements)
                    .is_some_and(|c| r.restarts.count(now) >= c)
            })
            .map(|r| r.job_id().clone())
            .collect();
        if nodes_due {
            match self.headroom.tracker.update(&snapshot, &self.pools, &bundles, &ceiling) {
                Err(e) => {
                    return self.notify(Notification::Error {
                        message: format!("headroom not computed: {e}"),
                    });
                }
                Ok(stats) => {
                    self.headroom.recomputes += 1;
                    // A rebuild analyses every domain, zones and providers too.
                    if stats.rebuilt {
                        self.headroom.wide_recomputes += 1;
                        self.headroom.wide_at = Some(now);
                    }
                }
            }
        }
        if self.wide_due().is_some_and(|at| at <= now) {
            self.headroom.tracker.refresh_wide();
            self.headroom.wide_recomputes += 1;
            self.headroom.wide_at = Some(now);
        }
        let report = self.headroom.tracker.report();
        let before = self.headroom.report.take();
        let was = before.as_ref().map(bundle_verdicts).unwrap_or_default();
        let now_verdicts = bundle_verdicts(&report);
        let changed: BTreeSet<&BundleId> = was
            .iter()
            .filter(|(b, v)| now_verdicts.get(*b) != Some(*v))
            .chain(now_verdicts.iter().filter(|(b, _)| !was.contains_key(*b)))
            .map(|(b, _)| *b)
            .collect();
        for bundle_id in changed {
            self.notify(Notification::BundleHeadroomChanged {
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
            // The first verdict is news only when it is bad.
            if changed && (was.is_some() || !kind.survives) {
                self.notify(Notification::HeadroomChanged {
                    pool: scope,
                    domain_kind: kind.kind,
                    survives: kind.survives,
                    worst: kind.worst.as_ref().map(|w| w.name.clone()),
                    why: kind.worst.as_ref().map(|w| w.why.clone()),
                });
            }
        }
        self.headroom.report = Some(report);
    }

    /// The headroom gauges of `metrics()`: per pool and kind of domain,
    /// from the last report.
    pub(super) fn headroom_gauges(&self) -> Vec<HeadroomGauge> {
        let Some(report) = &self.headroom.report else {
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

    /// How many times headroom was recomputed: node verdicts, and zone
    /// and provider verdicts.
    pub fn headroom_recomputes(&self) -> (u64, u64) {
        (self.headroom.recomputes, self.headroom.wide_recomputes)
    }

    /// When headroom is next recomputed, if a change waits.
    pub(super) fn headroom_deadline(&self) -> Option<UnixMillis> {
        let nodes = self
            .headroom
            .pending
            .map(|(first, last)| (last + HEADROOM_DEBOUNCE_MS).min(first + HEADROOM_MAX_WAIT_MS));
        nodes.into_iter().chain(self.wide_due()).min()
    }

    /// When the stale zone and provider verdicts are next recomputed:
    /// `HEADROOM_WIDE_INTERVAL_MS` after they were last.
    fn wide_due(&self) -> Option<UnixMillis> {
        if !self.headroom.tracker.wide_stale() {
            return None;
        }
        Some(
            self.headroom
                .wide_at
                .map_or(UnixMillis::MIN, |at| at + HEADROOM_WIDE_INTERVAL_MS),
        )
    }

    fn fingerprint(&self) -> Fingerprint {
        Fingerprint {
            capacity_epoch: self.capacity_epoch(),
            revisions: self.fleet.iter().map(|n| n.revision).fold(0, u64::wrapping_add),
            bindings: {
                use std::hash::{Hash, Hasher};
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                for record in self.jobs.values() {
                    if let Some(binding) = &record.binding {
                        record.job_id().hash(&mut hasher);
                        binding.node_id.hash(&mut hasher);
                    }
                }
                hasher.finish()
            },
            generations: self.bundles.values().map(|b| b.generation).fold(0, u64::wrapping_add),
            pools: self.pools.clone(),
        }
    }
}

/// Per bundle, every node loss touching it and whether the bundle's part
/// of it is absorbed.
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
