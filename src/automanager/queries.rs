//! Read-only queries of the core's state: the records, the placement view
//! and the what-ifs built on it (validation, admission, dry runs), and the
//! metrics with each pool's usage; each job as the edges read it
//! ([`JobView`]) and each node ([`NodeView`]).

use std::collections::{BTreeMap, HashMap};

use crate::model::{
    Bundle, BundleId, BundleSpec, BundleState, FleetNode, FleetSnapshot, InstanceKey, JobId, JobPhase, JobState,
    NodeId, NodeInventory, NodePhase, PlacedJob, ProviderKind, SchedulePhase, SpareSpec, UnixMillis, tags,
};
use crate::placement::headroom::HeadroomReport;
use crate::placement::{
    Admission, BundleValidation, FleetError, FleetView, Placement, PlacementError, Pools, place_dry_run,
    validate_bundle, validate_bundle_admission,
};

use super::binding::{BindingPhase, JobRecord};
use super::core::AutoManagerCore;
use super::facts::Facts;
use super::fleet::Fleet;
use super::metrics::{Metrics, PoolGauge, PoolUsage, TierUsage};
use super::node_services::state::ServicePhase;
use super::schedule::state::ScheduleView;
use super::settings::AutoSettings;
use super::spares::commands::spare_spec;
use super::spares::state::HotSpareStatus;
use super::view_cache::{ViewCache, placed_jobs};

impl AutoManagerCore {
    /// Whether `InitialDataComplete` has been seen.
    pub fn is_hydrated(&self) -> bool {
        self.facts.hydrated
    }

    /// How many steps the core has taken (see [`super::views`]).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The settings in force.
    pub fn settings(&self) -> &AutoSettings {
        self.facts.settings()
    }

    /// The fleet view.
    pub fn fleet(&self) -> &Fleet {
        &self.facts.fleet
    }

    /// Whether the fleet holds node `node_id`.
    pub fn knows_node(&self, node_id: &NodeId) -> bool {
        self.facts.fleet.contains(node_id)
    }

    /// The node job `job_id` is placed on, if any.
    pub fn node_of(&self, job_id: &JobId) -> Option<&NodeId> {
        self.facts.jobs.get(job_id)?.binding.as_ref().map(|b| &b.node_id)
    }

    /// Every bundle job's record.
    pub fn jobs(&self) -> impl Iterator<Item = &JobRecord> {
        self.facts.jobs.values()
    }

    /// One job's record.
    pub fn job(&self, id: &JobId) -> Option<&JobRecord> {
        self.facts.jobs.get(id)
    }

    /// The bundles Manager holds.
    pub fn bundles(&self) -> impl Iterator<Item = &Bundle> {
        self.facts.bundles.values()
    }

    /// Broken bundles with their reasons.
    pub fn broken_bundles(&self) -> &BTreeMap<BundleId, String> {
        &self.facts.broken
    }

    /// `templateImages`: what warmth is scored against.
    pub fn template_images(&self) -> &BTreeMap<String, Vec<String>> {
        &self.facts.settings().template_images
    }

    /// The placement view of the fleet as it stands.
    pub fn view(&self) -> Result<FleetView, FleetError> {
        self.view_with(self.facts.pools().clone())
    }

    pub(super) fn view_with(&self, pools: Pools) -> Result<FleetView, FleetError> {
        let snapshot = self
            .facts
            .fleet
            .snapshot(&pools, self.placed_jobs(), &self.facts.settings().template_images);
        FleetView::new(&snapshot, pools)
    }

    /// The fleet as placement reads it (the `plan` format): every node
    /// with what its bound jobs and migration targets reserve.
    pub fn fleet_snapshot(&self) -> FleetSnapshot {
        self.facts.fleet.snapshot(
            self.facts.pools(),
            self.placed_jobs(),
            &self.facts.settings().template_images,
        )
    }

    /// The kept placement view, brought up to date (built again when it
    /// cannot be).
    pub(super) fn synced_view(&mut self) -> Result<ViewCache, FleetError> {
        let (fleet, pools, jobs, images) = (
            &self.facts.fleet,
            self.facts.pools(),
            &self.facts.jobs,
            &self.facts.settings().template_images,
        );
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
        placed_jobs(&self.facts.jobs)
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
            .facts
            .pools()
            .iter()
            .map(|pool| self.usage_with(&placed, &pool.name, &[]).gauge)
            .collect();
        Metrics {
            started_at: self.started_at,
            uptime_ms: now - self.started_at,
            counters: self.counters.clone(),
            pools,
            broken_bundle_ids: self.facts.broken.keys().cloned().collect(),
            headroom: self.subsystems.headroom.gauges(),
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
            live_spares: self.facts.spare_count(pool).live,
            spare_target: self
                .facts
                .settings()
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
        let members = self.facts.fleet.iter().filter(|n| {
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

/// One job as the edges read it (see [`AutoManagerCore::job_view`]).
#[derive(Clone, Debug, PartialEq)]
pub struct JobView {
    /// Where it stands.
    pub phase: JobPhase,
    /// The node it is placed on, with its zone when the node reports one.
    pub node: Option<(NodeId, Option<String>)>,
    /// Its instance key there.
    pub instance_key: Option<InstanceKey>,
    /// The GPU it holds there.
    pub gpu_index: Option<u32>,
    /// Restarts counted against its ceiling over the trailing hour.
    pub restarts_in_last_hour: u32,
}

impl AutoManagerCore {
    /// Job `job_id` of bundle `bundle_id` as the edges read it at `now`; a
    /// job Manager has not announced yet is `pending` (or `scheduled`,
    /// `deleting` by its bundle).
    pub fn job_view(&self, bundle_id: &BundleId, job_id: &JobId, now: UnixMillis) -> JobView {
        let deleting = self
            .facts
            .bundles
            .get(bundle_id)
            .is_some_and(|b| b.state == BundleState::Deleting);
        let broken = self.facts.broken.contains_key(bundle_id);
        let schedule = self.schedule_view(bundle_id, now).map(|s| s.phase);
        let Some(record) = self.facts.jobs.get(job_id) else {
            let phase = match schedule {
                _ if deleting => JobPhase::Deleting,
                Some(SchedulePhase::Waiting) => JobPhase::Scheduled,
                _ => JobPhase::Pending,
            };
            return JobView {
                phase,
                node: None,
                instance_key: None,
                gpu_index: None,
                restarts_in_last_hour: 0,
            };
        };
        let ended = schedule == Some(SchedulePhase::Ended) || record.job.state == JobState::Post;
        let dormant = self.is_dormant(record);
        let binding = record.binding.as_ref();
        let phase = match binding.map(|b| b.phase) {
            _ if deleting => JobPhase::Deleting,
            _ if record.dropped => JobPhase::Dropped,
            _ if broken => JobPhase::Broken,
            Some(_) if ended || dormant => JobPhase::Stopping,
            Some(BindingPhase::AwaitingNode) => JobPhase::AwaitingNode,
            Some(BindingPhase::Dispatched) => JobPhase::Starting,
            Some(BindingPhase::Running) => JobPhase::Running,
            None if ended => JobPhase::Ended,
            None if dormant => JobPhase::Dormant,
            None if schedule == Some(SchedulePhase::Waiting) => JobPhase::Scheduled,
            None if record.awaiting_capacity_since.is_some() => JobPhase::AwaitingCapacity,
            None => JobPhase::Pending,
        };
        JobView {
            phase,
            node: binding.map(|b| {
                let zone = self
                    .facts
                    .fleet
                    .get(&b.node_id)
                    .and_then(|n| n.inventory.as_ref())
                    .map(|i| i.az.clone())
                    .filter(|az| !az.is_empty());
                (b.node_id.clone(), zone)
            }),
            instance_key: binding.map(|b| b.instance_key.clone()),
            gpu_index: binding.and_then(|b| b.gpu_index),
            restarts_in_last_hour: record.restarts.count(now),
        }
    }
}

/// One node as the edges read it (see [`AutoManagerCore::node_views`]).
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    pub id: NodeId,
    pub tags: BTreeMap<String, String>,
    pub phase: NodePhase,
    /// What it reported of itself, once it has.
    pub inventory: Option<NodeInventory>,
    /// Its tier, provider kind, instance type and region: from its tags and
    /// inventory, or, before it reports them, from what this AutoManager
    /// asked for when it provisioned it.
    pub tier: Option<String>,
    pub provider: Option<ProviderKind>,
    pub instance_type: Option<String>,
    pub region: Option<String>,
    /// Excluded from placement after repeated job rejections.
    pub unhealthy: bool,
    /// The jobs placed on it, in id order.
    pub jobs: Vec<JobId>,
    /// The node exactly as placement reads it (tags included), every bound
    /// job's and migration target's reservation counted; absent for a node
    /// placement does not see.
    pub placement: Option<FleetNode>,
}

impl AutoManagerCore {
    /// Every node of the fleet as the edges read it, in id order. A node
    /// swept after it stopped is not here.
    pub fn node_views(&self) -> Vec<NodeView> {
        let mut jobs: BTreeMap<&NodeId, Vec<JobId>> = BTreeMap::new();
        for record in self.facts.jobs.values() {
            if let Some(binding) = &record.binding {
                jobs.entry(&binding.node_id).or_default().push(record.job_id().clone());
            }
        }
        let mut snapshot: BTreeMap<NodeId, FleetNode> = self
            .fleet_snapshot()
            .nodes
            .into_iter()
            .map(|n| (n.id.clone(), n))
            .collect();
        self.facts
            .fleet
            .iter()
            .map(|node| {
                let inventory = node.inventory.as_ref();
                let provisioned = node.provisioned.as_ref();
                NodeView {
                    id: node.id.clone(),
                    tags: node.tags.clone(),
                    phase: node.phase,
                    inventory: node.inventory.clone(),
                    tier: node
                        .tags
                        .get(tags::TIER)
                        .cloned()
                        .or_else(|| provisioned.map(|p| p.tier.clone())),
                    provider: inventory.map(|i| i.kind).or_else(|| provisioned.map(|p| p.kind)),
                    instance_type: inventory
                        .map(|i| i.instance_type.clone())
                        .filter(|t| !t.is_empty())
                        .or_else(|| provisioned.map(|p| p.instance_type.clone())),
                    region: inventory
                        .map(|i| i.region.clone())
                        .or_else(|| provisioned.map(|p| p.region.clone())),
                    unhealthy: node.health.is_unhealthy(),
                    jobs: jobs.remove(&node.id).unwrap_or_default(),
                    // The snapshot leaves tags out (placement reads the
                    // fields derived from them); the view shows them.
                    placement: snapshot.remove(&node.id).map(|fleet_node| FleetNode {
                        tags: node.tags.clone(),
                        ..fleet_node
                    }),
                }
            })
            .collect()
    }
}

impl Facts {
    /// The jobs bound to `node_id`.
    pub(super) fn jobs_bound_to(&self, node_id: &crate::model::NodeId) -> Vec<JobId> {
        self.jobs
            .values()
            .filter(|r| r.is_bound_to(node_id))
            .map(|r| r.job_id().clone())
            .collect()
    }

    /// Whether a migration target is placed on `node` (a node hosting one
    /// is not released as empty).
    pub(super) fn hosts_migration_target(&self, node: &crate::model::NodeId) -> bool {
        self.jobs
            .values()
            .any(|r| r.migration_target().is_some_and(|t| &t.node_id == node))
    }
}

impl AutoManagerCore {
    /// The schedule of `bundle_id` at `now`, if it has one.
    pub fn schedule_view(&self, bundle_id: &BundleId, now: UnixMillis) -> Option<ScheduleView> {
        self.facts.schedule_view(bundle_id, now)
    }

    /// Where each node service stands, per node.
    pub fn node_service_placements(&self) -> impl Iterator<Item = (&str, &NodeId, ServicePhase)> {
        self.subsystems.node_services.placements()
    }

    /// The last headroom report, once one was computed.
    pub fn headroom(&self) -> Option<&HeadroomReport> {
        self.subsystems.headroom.report()
    }

    /// How many headroom recomputes ran: all, and the zone and provider
    /// refreshes among them.
    pub fn headroom_recomputes(&self) -> (u64, u64) {
        self.subsystems.headroom.recomputes()
    }

    /// Per `hotSpares[]` entry: its live and provisioning spares, its
    /// target, the last underflow and any provision backoff (what a
    /// `HotSparePolicy` status shows).
    pub fn hot_spare_status(&self) -> Vec<HotSpareStatus> {
        self.subsystems.spares.status(&self.facts)
    }

    /// `spareSpec(nodeId)`: what a live spare is warmed and reserved for;
    /// `None` for a node that is not an unconsumed spare.
    pub fn spare_spec(&self, node_id: &NodeId) -> Option<SpareSpec> {
        spare_spec(&self.facts, node_id)
    }
}
