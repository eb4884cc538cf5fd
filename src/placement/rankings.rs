//! Rankings kept across a burst of placements.
//!
//! A node lost with 200 jobs on it means 200 placements in one round, and
//! most of them ask the same thing: same pool, same needs, same template,
//! same spare policy, the same failed node excluded. Walking every node of
//! the tier for each of them is the cost of a recovery burst. Between two
//! such placements only the node that took the previous job has changed, so
//! the ranking of every other node still stands.
//!
//! [`Rankings`] keeps, per request signature and tier, the survivors of the
//! filter chain in a heap ordered by [`PlacementKey`], and brings it up to
//! date from the view's change journal: each changed node is checked and
//! keyed again, its older entries become stale. The best survivor is the
//! first fresh entry. The result is exactly the scan's (a property test
//! compares them); only the work differs.
//!
//! A request shares rankings only when a node's verdict and key depend on
//! nothing but the node and the signature: no trace, no pin, no placed job
//! of its own replica (so no co-location, separation, peer AZ or group
//! exclusivity in play) and no resilience `forbid` flag with the other
//! replica placed. Anything else is ranked by the plain scan. When a node
//! is added to the view (a prospective node) every node's id rank may
//! shift, so the kept rankings are dropped and rebuilt on next use.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use crate::model::{HostPort, PackingStrategy};

use super::filter::check;
use super::fleet::{FleetView, Name, NodeIdx};
use super::key::{PlacementKey, key};
use super::request::{Demand, SparePolicy};

/// Rankings kept for one view across a burst of placements (see the module
/// docs). Give it to [`super::place_ranked`] for each placement of the
/// burst; dropping it costs nothing but the next burst's first scan.
#[derive(Debug, Default)]
pub struct Rankings {
    /// The view the rankings were taken on, and its node count then.
    view: Option<(u64, usize)>,
    tiers: HashMap<(Signature, usize), TierRanking>,
}

/// The best survivor of a tier.
pub(super) struct Best {
    pub key: PlacementKey,
    pub idx: NodeIdx,
    pub gpu_index: Option<u32>,
}

impl Rankings {
    /// Starts a burst on `view`: nothing is ranked yet (the first placement
    /// of each signature scans), and the view's change journal is cleared,
    /// so a view kept for a long time holds only one burst's changes.
    pub fn for_burst(view: &mut FleetView) -> Self {
        view.journal.clear();
        Self::default()
    }

    /// The best survivor of tier `tier` for `demand`, from the kept ranking;
    /// `None` when the demand cannot share rankings (the caller scans).
    pub(super) fn best(
        &mut self,
        view: &FleetView,
        demand: &Demand<'_>,
        tier: usize,
        packing: PackingStrategy,
    ) -> Option<Option<Best>> {
        let signature = Signature::of(view, demand)?;
        let current = (view.journal.identity(), view.node_count());
        if self.view != Some(current) {
            self.tiers.clear();
            self.view = Some(current);
        }
        let ranking = self.tiers.entry((signature, tier)).or_default();
        Some(ranking.best(view, demand, tier, packing))
    }
}

/// Everything a shareable demand's verdict and key depend on besides the
/// node itself.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Signature {
    pool: usize,
    excluded: Vec<NodeIdx>,
    template: String,
    warm_mask: u64,
    warm_wide: Vec<u32>,
    override_reservation: bool,
    spare_policy: SparePolicy,
    capabilities: Vec<Name>,
    capacity: u64,
    cores: u32,
    ports: Vec<HostPort>,
    gpu_asks: Vec<(u64, Option<String>)>,
    exclusive: bool,
    own_gpu: bool,
}

impl Signature {
    /// The signature of a demand that can share rankings, or `None`.
    fn of(view: &FleetView, demand: &Demand<'_>) -> Option<Signature> {
        let request = &demand.request;
        let resilience_inert = demand
            .resilience
            .as_ref()
            .is_none_or(|r| r.other_replica.is_empty() || !(r.same_node || r.same_az || r.same_cloud));
        let own_replica_placed = view
            .bundle_occupants(request.bundle_id)
            .iter()
            .any(|&o| view.occupants[o as usize].replica == request.replica_index);
        if request.trace
            || demand.pin.is_some()
            || demand.co_located_with.is_some()
            || !demand.peers.is_empty()
            || !resilience_inert
            || own_replica_placed
        {
            return None;
        }
        let needs = &demand.needs;
        let mut excluded = demand.excluded.clone();
        excluded.sort_unstable();
        excluded.dedup();
        Some(Signature {
            pool: demand.pool,
            excluded,
            template: demand.job.template.clone(),
            warm_mask: demand.warm_mask,
            warm_wide: demand.warm_wide.clone(),
            override_reservation: request.override_reservation,
            spare_policy: demand.spare_policy,
            capabilities: needs.capabilities.iter().map(|(_, name)| name.clone()).collect(),
            capacity: needs.capacity.to_bits(),
            cores: needs.cores,
            ports: needs.ports.clone(),
            gpu_asks: needs
                .gpu_asks
                .iter()
                .map(|ask| (ask.capacity.to_bits(), ask.model.clone()))
                .collect(),
            exclusive: needs.exclusive,
            own_gpu: demand.own_gpu,
        })
    }
}

/// One signature's survivors of one tier.
#[derive(Debug, Default)]
struct TierRanking {
    /// Whether the tier has been scanned since the rankings were (re)made.
    scanned: bool,
    heap: BinaryHeap<Reverse<Ranked>>,
    /// The latest stamp of each node checked again since the scan; an
    /// entry with another stamp is stale (absent: 0, the scan's).
    stamps: HashMap<NodeIdx, u32>,
    last_stamp: u32,
    /// The journal position read up to.
    seen: usize,
}

#[derive(Clone, Copy, Debug)]
struct Ranked {
    key: PlacementKey,
    idx: NodeIdx,
    gpu_index: Option<u32>,
    stamp: u32,
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key.cmp(&other.key).then(self.stamp.cmp(&other.stamp))
    }
}

impl TierRanking {
    fn best(&mut self, view: &FleetView, demand: &Demand<'_>, tier: usize, packing: PackingStrategy) -> Option<Best> {
        // Stale entries pile up as nodes change; past twice the tier's size
        // a fresh scan is cheaper than carrying them.
        let bloated = self.heap.len() > 2 * view.tier_nodes(demand.pool, tier).len() + 64;
        match view.journal.since(self.seen) {
            Some(changed) if self.scanned && !bloated => {
                for &idx in changed {
                    self.last_stamp += 1;
                    self.stamps.insert(idx, self.last_stamp);
                    self.push(view, demand, tier, packing, idx, self.last_stamp);
                }
            }
            _ => self.scan(view, demand, tier, packing),
        }
        self.seen = view.journal.end();
        while let Some(Reverse(top)) = self.heap.peek() {
            if self.stamps.get(&top.idx).copied().unwrap_or(0) == top.stamp {
                return Some(Best {
                    key: top.key,
                    idx: top.idx,
                    gpu_index: top.gpu_index,
                });
            }
            self.heap.pop();
        }
        None
    }

    fn scan(&mut self, view: &FleetView, demand: &Demand<'_>, tier: usize, packing: PackingStrategy) {
        self.heap.clear();
        self.stamps.clear();
        self.last_stamp = 0;
        self.scanned = true;
        let survivors = view.tier_nodes(demand.pool, tier).iter().filter_map(|&idx| {
            let gpu_index = check(view, idx, demand, tier).ok()?;
            Some(Reverse(Ranked {
                key: key(view, idx, demand, packing),
                idx,
                gpu_index,
                stamp: 0,
            }))
        });
        self.heap = survivors.collect::<Vec<_>>().into();
    }

    fn push(
        &mut self,
        view: &FleetView,
        demand: &Demand<'_>,
        tier: usize,
        packing: PackingStrategy,
        idx: NodeIdx,
        stamp: u32,
    ) {
        if let Ok(gpu_index) = check(view, idx, demand, tier) {
            self.heap.push(Reverse(Ranked {
                key: key(view, idx, demand, packing),
                idx,
                gpu_index,
                stamp,
            }));
        }
    }
}
