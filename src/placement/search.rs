//! The indexed search: the best survivor of one tier for a demand, visiting
//! only the nodes that can win (`fleet::index` says how they are filed).
//!
//! It decides exactly as the full scan does: every node it visits goes
//! through the same filter chain and is ranked by the same key; the index
//! only tells which nodes need no visit.
//!
//! 1. The nodes holding a job of the demand's bundle, and the tier's
//!    unordered nodes, are visited one by one: they are the only nodes a
//!    co-location, separation, peer-AZ, group-exclusivity or resilience
//!    `sameNode` rule treats differently from the rest of their profile.
//! 2. Every other node of a profile passes or fails the node-property
//!    filters together and shares its key but for fill and id. A class the
//!    chain rejects whole is skipped: a capability or GPU model the profile
//!    lacks, `sameAz: hard` outside the peers' AZ, a spare exclusively
//!    reserved for other templates, a node held by an exclusive job, an
//!    occupied node for an exclusive job, a tracked host port the demand
//!    asks for already claimed, no GPU device with room for the largest
//!    GPU ask.
//! 3. The other classes are walked best leading components first. A class
//!    holds its nodes in key order; the walk starts (binpack) or ends
//!    (spread) at the fill that still leaves room for the demand, and stops
//!    at the first node whose key cannot beat the best found — so at the
//!    class's first survivor. The search stops at the first class whose
//!    leading components are worse than the best found.
//!
//! What it still visits beyond the winner are the nodes rejected for what
//! the index does not tell apart: an untracked host port, cores, the GPU
//! room within a class's eighth of a device, a recovery's excluded node.

use std::cmp::Ordering;

use crate::model::PackingStrategy;

use super::filter::{CAPACITY_EPSILON, check, shares_az};
use super::fleet::{
    ClassKey, Entry, FleetView, GPU_ROOM_STEPS, NodeIdx, Occupancy, Traits, fill_of, fill_order, flag, order_fill,
};
use super::key::{Facts, Lists, PlacementKey, key, key_of};
use super::request::Demand;

/// The best survivor of a tier.
#[derive(Clone, Copy, Debug)]
pub(super) struct Best {
    pub key: PlacementKey,
    pub idx: NodeIdx,
    pub gpu_index: Option<u32>,
}

/// The search's working space, reused from one search to the next.
#[derive(Debug)]
pub(super) struct Scratch {
    classes: Vec<Class>,
    /// How many of the best survivors a search keeps in `podium` (at
    /// least one: the winner; kept so by the constructors).
    pub(super) keep: usize,
    /// The last search's best survivors, best first: its `keep` best, or
    /// every survivor when fewer. A search prunes only once it holds
    /// `keep`, so a podium shorter than that is every survivor there was.
    pub(super) podium: Vec<Best>,
}

impl Default for Scratch {
    /// No room set aside; the winner alone is kept.
    fn default() -> Self {
        Scratch {
            classes: Vec::new(),
            keep: 1,
            podium: Vec::with_capacity(1),
        }
    }
}

impl Scratch {
    /// Each search keeps its `keep` best survivors. The room for the
    /// classes is made by the first search, for the view's largest tier:
    /// a burst that never searches (a what-if decided from its last run)
    /// allocates none.
    pub(super) fn keeping(keep: usize) -> Self {
        Scratch {
            classes: Vec::new(),
            keep: keep.max(1),
            podium: Vec::with_capacity(keep.max(1)),
        }
    }

    /// The survivor a search has to beat to enter the podium, once full.
    fn bar(&self) -> Option<&Best> {
        (self.podium.len() >= self.keep).then(|| self.podium.last()).flatten()
    }

    /// Enters a survivor in the podium, in key order, dropping the one that
    /// falls off the end.
    fn enter(&mut self, best: Best) {
        // The winner alone (every placement but a what-if's): it beat the
        // one held.
        if self.keep <= 1 {
            match self.podium.first_mut() {
                Some(held) => *held = best,
                None => self.podium.push(best),
            }
            return;
        }
        if self.podium.iter().any(|b| b.idx == best.idx) {
            return;
        }
        let at = self.podium.partition_point(|b| b.key < best.key);
        if at >= self.keep {
            return;
        }
        self.podium.insert(at, best);
        self.podium.truncate(self.keep);
    }
}

/// How full the winner of `podium` (best first; `complete` when it holds
/// every survivor of the deciding tier) may be and still win, every other
/// node as it is: without bound when it is the only survivor or beat the
/// runner-up on a component ranked before packing; under `spread`, while
/// it stays emptier than the runner-up (a tie may go either way); `None`
/// when that cannot be told (`binpack`, where fuller only ranks better, or
/// no runner-up recorded).
pub(super) fn winner_fill_limit(podium: &[Best], complete: bool) -> Option<f64> {
    match podium {
        [_] if complete => Some(f64::INFINITY),
        [winner, runner_up, ..] if winner.key.cmp_leading(&runner_up.key) == Ordering::Less => Some(f64::INFINITY),
        [winner, runner_up, ..] if winner.key.packing == PackingStrategy::Spread => Some(runner_up.key.fill),
        _ => None,
    }
}

/// The best survivor of tier `tier` for `demand`, as the scan would find it;
/// `scratch.podium` holds it and the runners-up after it.
pub(super) fn best_in_tier(
    view: &FleetView,
    demand: &Demand<'_>,
    tier: usize,
    packing: PackingStrategy,
    scratch: &mut Scratch,
) -> Option<Best> {
    scratch.podium.clear();
    let index = view.index.tier(demand.pool, tier)?;
    let visit = |idx: NodeIdx, scratch: &mut Scratch| {
        if let Ok(gpu_index) = check(view, idx, demand, tier) {
            let key = key(view, idx, demand, packing);
            if scratch.bar().is_none_or(|b| key < b.key) {
                scratch.enter(Best { key, idx, gpu_index });
            }
        }
    };
    for &o in view.bundle_occupants(demand.request.bundle_id) {
        visit(view.occupants[o as usize].node, scratch);
    }
    for &idx in &index.unordered {
        visit(idx, scratch);
    }
    // Nothing finite fits a demand for infinite capacity.
    let Some(min_free) = min_free(demand.needs.capacity) else {
        return scratch.podium.first().copied();
    };
    // The tracked host ports the demand asks for, as class claims.
    let asked_ports = index
        .tracked
        .iter()
        .enumerate()
        .filter(|(_, port)| demand.needs.ports.contains(port))
        .fold(0u8, |mask, (bit, _)| mask | 1 << bit);
    let largest_gpu_ask = demand.needs.gpu_asks.iter().map(|a| a.capacity).reduce(f64::max);
    let mut classes = std::mem::take(&mut scratch.classes);
    classes.clear();
    if classes.capacity() == 0 {
        // The first search of a burst: room for the largest tier's classes.
        classes.reserve(view.index.most_classes());
    }
    for &p in &index.profiles {
        let profile = view.index.profile(p);
        let traits = &profile.traits;
        if !admits(view, demand, traits) {
            continue;
        }
        let fill_bound = fill_order(fill_of(traits.usable(), min_free), packing);
        for (c, class) in profile.classes.iter().enumerate() {
            let ClassKey {
                occupancy,
                claims,
                gpu_room,
            } = class.key;
            let empty = occupancy == Occupancy::Empty;
            let rejected = class.entries.is_empty()
                || occupancy == Occupancy::Held
                || (occupancy == Occupancy::Shared && demand.needs.exclusive)
                || claims & asked_ports != 0
                || largest_gpu_ask.is_some_and(|ask| !gpu_room_fits(gpu_room, ask))
                || (empty
                    && traits.has(flag::EXCLUSIVE_RESERVATION)
                    && !demand.request.override_reservation
                    && !traits.reserved_for.contains(&demand.job.template));
            if rejected {
                continue;
            }
            let facts = Facts {
                node: None,
                flags: traits.flags,
                empty,
                az: traits.az,
                kind: traits.kind,
                image_mask: traits.image_mask,
                lists: Lists::Profile(traits),
            };
            classes.push(Class {
                key: key_of(view, demand, &facts, packing),
                profile: p,
                class: c,
                fill_bound,
            });
        }
    }
    // Fill and label are 0 in every class key: this orders by the leading
    // components, then the soft-AZ component.
    classes.sort_unstable_by_key(|c| c.key);
    for class in classes.iter() {
        if scratch
            .bar()
            .is_some_and(|b| b.key.cmp_leading(&class.key) == Ordering::Less)
        {
            break;
        }
        let entries = &view.index.profile(class.profile).classes[class.class].entries;
        let walk = match packing {
            PackingStrategy::Binpack => entries.range(Entry::first_at(class.fill_bound)..),
            PackingStrategy::Spread => entries.range(..=Entry::last_at(class.fill_bound)),
        };
        for entry in walk {
            let next = PlacementKey {
                fill: order_fill(entry.order, packing),
                node_order: entry.label,
                ..class.key
            };
            if scratch.bar().is_some_and(|b| b.key <= next) {
                break;
            }
            visit(entry.idx, scratch);
        }
    }
    scratch.classes = classes;
    scratch.podium.first().copied()
}

/// One class to walk, with the key its nodes share.
#[derive(Debug)]
struct Class {
    key: PlacementKey,
    profile: u32,
    /// Its position among the profile's classes.
    class: usize,
    /// The [`Entry::order`] of the fullest a node of the class can be and
    /// still have room for the demand: where a binpack walk starts and a
    /// spread walk ends.
    fill_bound: u64,
}

/// Whether the nodes of a profile can pass the node-property filters the
/// profile decides for all of them: capabilities, GPU model, hard AZ.
fn admits(view: &FleetView, demand: &Demand<'_>, traits: &Traits) -> bool {
    let needs = &demand.needs;
    needs.held_by(&traits.capabilities)
        && needs.gpu_asks.iter().all(|ask| {
            traits
                .gpus
                .iter()
                .any(|(model, _)| ask.model.as_deref().is_none_or(|m| m == model.as_str()))
        })
        && (demand.same_az != crate::model::IntraReplicaAz::Hard
            || demand.peers.iter().all(|p| shares_az(view, None, traits.az, p.node)))
}

/// Whether a node whose roomiest GPU device has `room` (see
/// [`ClassKey::gpu_room`]) may fit a GPU ask of `ask`: every ask needs a
/// device with that much free, less the tolerance.
fn gpu_room_fits(room: u8, ask: f64) -> bool {
    room >= GPU_ROOM_STEPS || ask <= f64::from(room + 1) / f64::from(GPU_ROOM_STEPS) + 2.0 * CAPACITY_EPSILON
}

/// The least free capacity a node can have and still pass the capacity
/// filter (`needed ≤ free + CAPACITY_EPSILON`), with room to spare for
/// rounding; `None` when no finite capacity passes.
fn min_free(needed: f64) -> Option<f64> {
    let least = needed - CAPACITY_EPSILON - (needed.abs() + CAPACITY_EPSILON) * 1e-12;
    least.is_finite().then_some(least)
}
