//! Read-only queries of the core's state: the records, the placement view
//! and the what-ifs built on it (validation, admission, dry runs), and the
//! metrics with each pool's usage.

use std::collections::{BTreeMap, HashMap};

use crate::model::{Bundle, BundleId, BundleSpec, FleetSnapshot, JobId, PlacedJob, UnixMillis};
use crate::placement::{
    Admission, BundleValidation, FleetError, FleetView, Placement, PlacementError, Pools, place_dry_run,
    validate_bundle, validate_bundle_admission,
};

use super::AutoSettings;
use super::binding::JobRecord;
use super::core::AutoManagerCore;
use super::fleet::Fleet;
use super::metrics::{Metrics, PoolGauge, PoolUsage, TierUsage};
use super::view_cache::{ViewCache, placed_jobs};

impl AutoManagerCore {
    /// Whether `InitialDataComplete` has been seen.
    pub fn is_hydrated(&self) -> bool {
        self.hydrated
    }

    /// The settings in force.
    pub fn settings(&self) -> &AutoSettings {
        &self.settings
    }

    /// The fleet view.
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// Every bundle job's record.
    pub fn jobs(&self) -> impl Iterator<Item = &JobRecord> {
        self.jobs.values()
    }

    /// One job's record.
    pub fn job(&self, id: &JobId) -> Option<&JobRecord> {
        self.jobs.get(id)
    }

    /// The jobs bound to `node_id`.
    pub(super) fn jobs_bound_to(&self, node_id: &crate::model::NodeId) -> Vec<JobId> {
        self.jobs
            .values()
            .filter(|r| r.is_bound_to(node_id))
            .map(|r| r.job_id().clone())
            .collect()
    }

    /// The bundles Manager holds.
    pub fn bundles(&self) -> impl Iterator<Item = &Bundle> {
        self.bundles.values()
    }

    /// Broken bundles with their reasons.
    pub fn broken_bundles(&self) -> &BTreeMap<BundleId, String> {
        &self.broken
    }

    /// `templateImages`: what warmth is scored against.
    pub fn template_images(&self) -> &BTreeMap<String, Vec<String>> {
        &self.settings.template_images
    }

    /// The placement view of the fleet as it stands.
    pub fn view(&self) -> Result<FleetView, FleetError> {
        self.view_with(self.pools.clone())
    }

    pub(super) fn view_with(&self, pools: Pools) -> Result<FleetView, FleetError> {
        let snapshot = self
            .fleet
            .snapshot(&pools, self.placed_jobs(), &self.settings.template_images);
        FleetView::new(&snapshot, pools)
    }

    /// The fleet as placement reads it (the `plan` format): every node
    /// with what its bound jobs and migration targets reserve.
    pub fn fleet_snapshot(&self) -> FleetSnapshot {
        self.fleet
            .snapshot(&self.pools, self.placed_jobs(), &self.settings.template_images)
    }

    /// The kept placement view, brought up to date (built again when it
    /// cannot be).
    pub(super) fn synced_view(&mut self) -> Result<ViewCache, FleetError> {
        let (fleet, pools, jobs, images) = (&self.fleet, &self.pools, &self.jobs, &self.settings.template_images);
        match self
            .view_cache
            .take()
            .and_then(|cache| cache.sync(fleet, pools, jobs, images))
        {
            Some(cache) => Ok(cache),
            None => ViewCache::build(fleet, pools, jobs, images),
        }
    }

    /// What every bound job reserves, by node.
    pub(super) fn placed_jobs(&self) -> HashMap<&crate::model::NodeId, Vec<PlacedJob>> {
        placed_jobs(&self.jobs)
    }

    /// `validateBundle`: static shape and satisfiability.
    pub fn validate_bundle(&self, bundle: &BundleSpec) -> Result<BundleValidation, FleetError> {
        Ok(validate_bundle(&self.view()?, bundle))
    }

    /// `validateBundleAdmission`: would each replica place right now?
    pub fn validate_bundle_admission(
        &self,
        bundle_id: &BundleId,
        bundle: &BundleSpec,
    ) -> Result<Admission, FleetError> {
        Ok(validate_bundle_admission(&self.view()?, bundle_id, bundle))
    }

    /// `placeDryRun`: one job of one replica through the engine, with the
    /// trace, without acting.
    pub fn place_dry_run(
        &self,
        bundle_id: &BundleId,
        bundle: &BundleSpec,
        replica_index: u32,
        job_name: &str,
    ) -> Result<Result<Placement, PlacementError>, FleetError> {
        let view = self.view()?;
        Ok(place_dry_run(&view, bundle_id, bundle, replica_index, job_name))
    }

    /// `metrics()`: counters since `startedAt`, pool gauges computed now.
    pub fn metrics(&self, now: UnixMillis) -> Metrics {
        let placed = self.placed_jobs();
        let pools = self
            .pools
            .iter()
            .map(|pool| self.usage_with(&placed, &pool.name, &[]).gauge)
            .collect();
        Metrics {
            started_at: self.started_at,
            uptime_ms: now - self.started_at,
            counters: self.counters.clone(),
            pools,
            broken_bundle_ids: self.broken.keys().cloned().collect(),
            headroom: self.headroom_gauges(),
        }
    }

    /// Pool `pool`'s usage, with tiers `tier_names` apart: its nodes not
    /// going (launching ones included), live spares by the spare
    /// reconciler's own rule (so the gauge and the `HotSparePolicy` status
    /// agree), and capacity reserved by placed jobs, migration targets
    /// included, over usable capacity.
    pub fn pool_usage(&self, pool: &str, tier_names: &[String]) -> PoolUsage {
        self.usage_with(&self.placed_jobs(), pool, tier_names)
    }

    /// [`Self::pool_usage`] with the placed jobs already gathered, so
    /// `metrics()` gathers them once for every pool.
    fn usage_with(
        &self,
        placed: &HashMap<&crate::model::NodeId, Vec<PlacedJob>>,
        pool: &str,
        tier_names: &[String],
    ) -> PoolUsage {
        let mut gauge = PoolGauge {
            pool_name: pool.to_owned(),
            node_count: 0,
            live_spares: self.spare_count(pool).live,
            spare_target: self
                .settings
                .hot_spares
                .iter()
                .find(|s| s.pool == pool)
                .map_or(0, |s| s.target_count),
            used_capacity_fraction: 0.0,
        };
        let mut tiers: Vec<(TierUsage, f64, f64)> = tier_names
            .iter()
            .map(|name| {
                let tier = TierUsage {
                    name: name.clone(),
                    nodes: 0,
                    prospective_nodes: 0,
                    used_capacity_fraction: 0.0,
                };
                (tier, 0.0, 0.0)
            })
            .collect();
        let (mut used_all, mut usable_all) = (0.0, 0.0);
        let members = self.fleet.iter().filter(|n| {
            n.tags.get(crate::model::tags::POOL).map(String::as_str) == Some(pool) && !n.is_going() && !n.terminated
        });
        for node in members {
            gauge.node_count += 1;
            let usable = node.inventory.as_ref().map_or(0.0, |i| i.usable_capacity());
            let used: f64 = placed
                .get(&node.id)
                .map_or(0.0, |j| j.iter().map(|p| p.required_capacity).sum());
            used_all += used;
            usable_all += usable;
            let tier = node.tags.get(crate::model::tags::TIER);
            if let Some((t, u, c)) = tiers.iter_mut().find(|(t, _, _)| Some(&t.name) == tier) {
                if node.is_launching() {
                    t.prospective_nodes += 1;
                } else {
                    t.nodes += 1;
                }
                *u += used;
                *c += usable;
            }
        }
        let fraction = |used: f64, usable: f64| if usable > 0.0 { used / usable } else { 0.0 };
        gauge.used_capacity_fraction = fraction(used_all, usable_all);
        PoolUsage {
            gauge,
            tiers: tiers
                .into_iter()
                .map(|(t, used, usable)| TierUsage {
                    used_capacity_fraction: fraction(used, usable),
                    ..t
                })
                .collect(),
        }
    }
}
