//! What the providers recently could not supply, and the pools placement
//! sees because of it.
//!
//! A provision refused for lack of capacity (`InsufficientInstanceCapacity`)
//! marks its *offering* — provider, region, instance type, launch mode —
//! exhausted for `PROVISION_FAILURE_BACKOFF_MS`. Every tier offering it
//! drops that shape for the time being, so the next fitting shape of the
//! same tier is tried before the cascade spills to the next tier; a tier
//! left with no shape is capped at its current node count. Any other
//! refusal holds back the whole tier the same way ("a failed provision
//! leaves no phantom node and backs off").

use crate::model::{LaunchMode, NodePhase, ProviderKind, UnixMillis, tags};
use crate::placement::{Pools, validate_pools};

use super::core::AutoManagerCore;
use super::fleet::{Offering, Provisioned};
use super::protocol::RpcFailureKind;
use super::recovery::PROVISION_FAILURE_BACKOFF_MS;

impl AutoManagerCore {
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
        self.tier_backoff
            .values()
            .chain(self.exhausted_offerings.values())
            .any(|&until| until > now)
    }

    /// The pools as placement sees them at `now`: exhausted offerings
    /// dropped from their tiers, held-back tiers (and tiers left without a
    /// shape) capped at their current node count.
    pub(super) fn effective_pools(&self, now: UnixMillis) -> Result<Pools, String> {
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
                    let live = self.fleet.iter().filter(|n| {
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
    /// placement sees have grown (see [`AutoManagerCore::capacity_epoch`]).
    pub(super) fn expire_held_back(&mut self, now: UnixMillis) {
        let before = self.tier_backoff.len() + self.exhausted_offerings.len();
        self.tier_backoff.retain(|_, until| *until > now);
        self.exhausted_offerings.retain(|_, until| *until > now);
        if self.tier_backoff.len() + self.exhausted_offerings.len() != before {
            self.placed_with_revision += 1;
        }
    }
}
