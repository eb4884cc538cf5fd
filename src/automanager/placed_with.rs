//! What the fleet is placed with: the settings and pools in force, and what
//! the providers recently could not supply.
//!
//! A provision refused for lack of capacity (`InsufficientInstanceCapacity`)
//! marks its *offering* — provider, region, instance type, launch mode —
//! exhausted for `PROVISION_FAILURE_BACKOFF_MS`. Every tier offering it
//! drops that shape for the time being, so the next fitting shape of the
//! same tier is tried before the cascade spills to the next tier; a tier
//! left with no shape is capped at its current node count. Any other
//! refusal holds back the whole tier the same way ("a failed provision
//! leaves no phantom node and backs off").
//!
//! Every change that lets placement see more (new pools or template images,
//! a hold-back served) is counted in [`PlacedWith::revision`] by the
//! mutator that makes it, which is why the fields are private.

use std::collections::BTreeMap;

use crate::model::{HotSpareSpec, LaunchMode, NodePhase, ProviderKind, UnixMillis, tags};
use crate::placement::{Pools, validate_pools};

use super::fleet::{Fleet, Offering, Provisioned};
use super::protocol::RpcFailureKind;
use super::recovery::PROVISION_FAILURE_BACKOFF_MS;
use super::settings::{AutoSettings, ValidSettings};

/// See the module docs.
#[derive(Clone, Debug)]
pub(super) struct PlacedWith {
    settings: AutoSettings,
    pools: Pools,
    /// (pool, tier) -> until when provisioning there is held back.
    tier_backoff: BTreeMap<(String, String), UnixMillis>,
    /// Offerings a provider had no capacity for -> until when they are
    /// skipped.
    exhausted_offerings: BTreeMap<Offering, UnixMillis>,
    /// Counts the changes that let placement see more.
    revision: u64,
}

impl PlacedWith {
    pub(super) fn new(valid: ValidSettings) -> Self {
        Self {
            settings: valid.settings,
            pools: valid.pools,
            tier_backoff: BTreeMap::new(),
            exhausted_offerings: BTreeMap::new(),
            revision: 0,
        }
    }

    pub(super) fn settings(&self) -> &AutoSettings {
        &self.settings
    }

    pub(super) fn pools(&self) -> &Pools {
        &self.pools
    }

    /// See the module docs.
    pub(super) fn revision(&self) -> u64 {
        self.revision
    }

    /// The settings and pools in force, as a successor core is built with
    /// (what was changed live survives a reconnect).
    pub(super) fn valid_settings(&self) -> ValidSettings {
        ValidSettings {
            settings: self.settings.clone(),
            pools: self.pools.clone(),
        }
    }

    /// `setTemplateImages`: placement sees the new images at once.
    pub(super) fn set_template_images(&mut self, images: BTreeMap<String, Vec<String>>) {
        self.settings.template_images = images;
        self.revision += 1;
    }

    /// New validated settings (new pools): the kept view sees them and is
    /// built again, and jobs waiting for capacity are retried against them.
    pub(super) fn set(&mut self, valid: ValidSettings) {
        self.settings = valid.settings;
        self.pools = valid.pools;
        self.revision += 1;
    }

    /// The hot-spare specs in force. Placement does not read them, so this
    /// is no revision.
    pub(super) fn set_hot_spares(&mut self, specs: Vec<HotSpareSpec>) {
        self.settings.hot_spares = specs;
    }

    /// A provision of `provisioned` was refused with `kind`.
    pub(super) fn provision_refused(&mut self, provisioned: &Provisioned, kind: RpcFailureKind, now: UnixMillis) {
        let until = now + PROVISION_FAILURE_BACKOFF_MS;
        if kind != RpcFailureKind::InsufficientCapacity {
            self.tier_backoff
                .insert((provisioned.pool.clone(), provisioned.tier.clone()), until);
            return;
        }
        let launch_mode = self
            .pools
            .get(&provisioned.pool)
            .and_then(|p| p.tiers.iter().find(|t| t.name == provisioned.tier))
            .and_then(|t| t.launch_mode);
        let offering = Offering {
            kind: provisioned.kind,
            region: provisioned.region.clone(),
            instance_type: provisioned.instance_type.clone(),
            launch_mode,
        };
        self.exhausted_offerings.insert(offering, until);
    }

    /// Whether some tier or offering is held back at `now`.
    pub(super) fn capacity_held_back(&self, now: UnixMillis) -> bool {
        self.holds().any(|until| until > now)
    }

    /// When each hold-back ends.
    pub(super) fn holds(&self) -> impl Iterator<Item = UnixMillis> + '_ {
        self.tier_backoff
            .values()
            .chain(self.exhausted_offerings.values())
            .copied()
    }

    /// The pools as placement sees them at `now` over `fleet`: exhausted
    /// offerings dropped from their tiers, held-back tiers (and tiers left
    /// without a shape) capped at their current node count.
    pub(super) fn effective_pools(&self, fleet: &Fleet, now: UnixMillis) -> Result<Pools, String> {
        if !self.capacity_held_back(now) {
            return Ok(self.pools.clone());
        }
        let exhausted = |kind: ProviderKind, region: &str, instance_type: &str, launch_mode: Option<LaunchMode>| {
            self.exhausted_offerings.iter().any(|(o, &until)| {
                until > now
                    && o.kind == kind
                    && o.region == region
                    && o.instance_type == instance_type
                    && o.launch_mode == launch_mode
            })
        };
        let mut pools: Vec<_> = self.pools.iter().cloned().collect();
        for pool in &mut pools {
            for tier in &mut pool.tiers {
                let region = tier.region.clone().unwrap_or_default();
                let offered: Vec<_> = tier
                    .candidate_instance_types
                    .iter()
                    .filter(|s| !exhausted(tier.kind, &region, &s.instance_type, tier.launch_mode))
                    .cloned()
                    .collect();
                let held_back = self
                    .tier_backoff
                    .get(&(pool.name.clone(), tier.name.clone()))
                    .is_some_and(|&until| until > now);
                if held_back || (offered.is_empty() && !tier.candidate_instance_types.is_empty()) {
                    let live = fleet.iter().filter(|n| {
                        n.tags.get(tags::POOL) == Some(&pool.name)
                            && n.tags.get(tags::TIER) == Some(&tier.name)
                            && n.phase != NodePhase::Stopped
                    });
                    tier.max_nodes = Some(live.count() as u32);
                } else {
                    tier.candidate_instance_types = offered;
                }
            }
        }
        validate_pools(pools).map_err(|e| e.to_string())
    }

    /// Forgets what has served its time; when something was, the pools
    /// placement sees have grown (a revision).
    pub(super) fn expire_held_back(&mut self, now: UnixMillis) {
        let before = self.tier_backoff.len() + self.exhausted_offerings.len();
        self.tier_backoff.retain(|_, until| *until > now);
        self.exhausted_offerings.retain(|_, until| *until > now);
        if self.tier_backoff.len() + self.exhausted_offerings.len() != before {
            self.revision += 1;
        }
    }
}
