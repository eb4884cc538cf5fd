//! The candidate index: the nodes of every tier filed so that a placement
//! visits only the nodes that can win, and stops as soon as no unvisited
//! node can beat the best found (the search is `placement::search`).
//!
//! A tier's nodes are partitioned into **profiles**: nodes that agree on
//! every property the filter chain and the key read from the node itself
//! apart from its free capacity and occupancy — launching, spare state and
//! reservation, capabilities, held template images, AZ, provider, usable
//! capacity, GPU devices. For one demand every node of a profile passes or
//! fails the same node-property filters and shares key components 1 to 6
//! and 8, so a profile is judged once. Each profile splits into
//! **classes** by what changes with the jobs a node holds but can still
//! reject it whole ([`ClassKey`]): its [`Occupancy`], which of the tier's
//! tracked host ports it has claimed, and how much room its roomiest GPU
//! device has left. A class keeps its nodes in key order — fill (fullest
//! first in a `binpack` tier, emptiest first under `spread`), then id
//! label — so within a class the first node that passes the chain is the
//! class's best, and "enough free capacity" is a bound on fill (`fill_of`
//! is monotone), which is where a class's walk starts or ends.
//!
//! A host port is tracked in a tier once [`TRACK_AT`] claims on it
//! accumulate there (a fixed ingest port such as 1935 claimed by every
//! channel): without it, a job asking for that port would walk past every
//! node that already claimed it, and those are the fullest.
//!
//! Nodes that are not reachable or are cordoned are in no class: the chain
//! rejects them whatever the demand. A node whose fill is not a number
//! cannot be ordered; it is kept aside and checked on every placement.
//!
//! The index is maintained in place by every change the view takes: a
//! reservation or release re-files its node (a new fill, perhaps a new
//! occupancy), a condition, inventory or membership change re-profiles it,
//! a new label re-files it. Nothing is ever rebuilt.

use std::collections::BTreeSet;

use foldhash::HashMap;
use std::hash::{Hash, Hasher};

use crate::model::{HostPort, NodePhase, PackingStrategy, ProviderKind};

use super::names::Name;
use super::node::{CapabilitySet, GpuDevice, Hot, NO_SLOT, NodeEntry, flag};
use super::{NodeIdx, Pools};

/// Claims on one host port within a tier past which the tier tracks it.
pub(crate) const TRACK_AT: u32 = 32;
/// How many host ports a tier tracks at most (one bit each in
/// [`ClassKey::claims`]).
const TRACKED_PORTS: usize = 8;
/// [`ClassKey::gpu_room`] counts the eighths of a device the roomiest GPU
/// device has free, up to this many.
pub(crate) const GPU_ROOM_STEPS: u8 = 8;

/// How a node is occupied, as the exclusivity filter and the spare
/// components of the key see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Occupancy {
    /// No job (an unconsumed spare, if tagged spare).
    Empty = 0,
    /// Jobs, none exclusive.
    Shared = 1,
    /// An exclusive job: only its co-located peers may join.
    Held = 2,
}

impl Occupancy {
    pub(crate) fn of(hot: &Hot) -> Self {
        if hot.exclusive_occupants > 0 {
            Occupancy::Held
        } else if hot.occupants > 0 {
            Occupancy::Shared
        } else {
            Occupancy::Empty
        }
    }
}

/// The flags a profile keeps: those the chain and the key read beyond
/// reachability and cordon, which decide whether a node is filed at all.
const PROFILE_FLAGS: u16 = flag::LAUNCHING | flag::SPARE | flag::RESERVED | flag::EXCLUSIVE_RESERVATION;

/// What the nodes of one profile share (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct Traits {
    pub slot: u32,
    /// [`PROFILE_FLAGS`] of the node's flags.
    pub flags: u16,
    pub reserved_for: Vec<String>,
    pub capabilities: CapabilitySet,
    /// Interned held template images, sorted.
    pub images: Vec<u32>,
    /// The low-id part of `images`, as [`Hot::images`] holds it.
    pub image_mask: u64,
    pub az: u32,
    pub kind: ProviderKind,
    /// The bits of the usable capacity: fill is a function of free capacity
    /// only among nodes of equal usable capacity.
    pub usable: u64,
    /// Each device's model and the bits of its total capacity.
    pub gpus: Vec<(Name, u64)>,
}

impl Traits {
    fn of(hot: &Hot, entry: &NodeEntry) -> Self {
        Traits {
            slot: hot.slot,
            flags: hot.flags & PROFILE_FLAGS,
            reserved_for: entry.reserved_for.clone(),
            capabilities: entry.capabilities.clone(),
            images: entry.images.clone(),
            image_mask: hot.images,
            az: hot.az,
            kind: hot.kind,
            usable: entry.usable.to_bits(),
            gpus: entry
                .gpus
                .iter()
                .map(|g| (g.model.clone(), g.total.to_bits()))
                .collect(),
        }
    }

    /// Whether these are node `hot`/`entry`'s traits (what [`Traits::of`]
    /// would make of it), without making them.
    fn describe(&self, hot: &Hot, entry: &NodeEntry) -> bool {
        self.slot == hot.slot
            && self.flags == hot.flags & PROFILE_FLAGS
            && self.az == hot.az
            && self.kind == hot.kind
            && self.image_mask == hot.images
            && self.usable == entry.usable.to_bits()
            && self.reserved_for == entry.reserved_for
            && self.capabilities == entry.capabilities
            && self.images == entry.images
            && self.gpus.len() == entry.gpus.len()
            && self
                .gpus
                .iter()
                .zip(&entry.gpus)
                .all(|((model, total), g)| *model == g.model && *total == g.total.to_bits())
    }

    /// A hash of a node's traits, so a node finds its profile without its
    /// traits being copied out first.
    fn fingerprint(hot: &Hot, entry: &NodeEntry) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        (hot.slot, hot.flags & PROFILE_FLAGS, hot.az, hot.kind, hot.images).hash(&mut h);
        entry.usable.to_bits().hash(&mut h);
        entry.reserved_for.hash(&mut h);
        entry.capabilities.hash(&mut h);
        entry.images.hash(&mut h);
        for g in &entry.gpus {
            (&g.model, g.total.to_bits()).hash(&mut h);
        }
        h.finish()
    }

    pub(crate) fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    pub(crate) fn usable(&self) -> f64 {
        f64::from_bits(self.usable)
    }
}

/// Which class of its profile a node is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClassKey {
    pub occupancy: Occupancy,
    /// Bit `i` set: the node claims the tier's `i`-th tracked host port.
    pub claims: u8,
    /// `k` below [`GPU_ROOM_STEPS`]: the roomiest device has less than
    /// `(k + 1) / 8` of a device free; at it, a whole device or more.
    pub gpu_room: u8,
}

/// How much room the roomiest of `devices` has, as [`ClassKey::gpu_room`]
/// counts it.
pub(crate) fn gpu_room(devices: &[GpuDevice]) -> u8 {
    let roomiest = devices.iter().map(GpuDevice::free).fold(f64::NEG_INFINITY, f64::max);
    (1..=GPU_ROOM_STEPS)
        .take_while(|&k| roomiest >= f64::from(k) / f64::from(GPU_ROOM_STEPS))
        .count() as u8
}

/// One profile and its nodes, by class.
#[derive(Clone, Debug)]
pub(crate) struct Profile {
    pub traits: Traits,
    pub classes: Vec<Class>,
}

/// The nodes of one profile in one class, in key order.
#[derive(Clone, Debug)]
pub(crate) struct Class {
    pub key: ClassKey,
    pub entries: BTreeSet<Entry>,
}

/// A node as a class orders it: by `order` (its fill, oriented by the
/// tier's packing so that ascending is best first), then by id label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Entry {
    pub order: u64,
    pub label: u32,
    pub idx: NodeIdx,
}

impl Entry {
    /// The first entry a class can hold at `order` or after.
    pub(crate) fn first_at(order: u64) -> Self {
        Entry {
            order,
            label: 0,
            idx: 0,
        }
    }

    /// The last entry a class can hold at `order` or before.
    pub(crate) fn last_at(order: u64) -> Self {
        Entry {
            order,
            label: u32::MAX,
            idx: NodeIdx::MAX,
        }
    }
}

/// `fill` as an ascending sort key: the lower, the better the tier ranks it.
/// Follows [`f64::total_cmp`], the order the key compares fills by.
pub(crate) fn fill_order(fill: f64, packing: PackingStrategy) -> u64 {
    let bits = fill.to_bits();
    let ascending = if bits >> 63 == 1 { !bits } else { bits | 1 << 63 };
    match packing {
        PackingStrategy::Binpack => !ascending,
        PackingStrategy::Spread => ascending,
    }
}

/// The fill an [`Entry::order`] was made from.
pub(crate) fn order_fill(order: u64, packing: PackingStrategy) -> f64 {
    let ascending = match packing {
        PackingStrategy::Binpack => !order,
        PackingStrategy::Spread => order,
    };
    f64::from_bits(if ascending >> 63 == 1 {
        ascending & !(1 << 63)
    } else {
        !ascending
    })
}

/// One tier's part of the index.
#[derive(Clone, Debug, Default)]
pub(crate) struct TierIndex {
    pub packing: PackingStrategy,
    /// The tier's profiles, in the order they appeared.
    pub profiles: Vec<u32>,
    /// The host ports the tier tracks, in the order they were taken up.
    pub tracked: Vec<HostPort>,
    /// Claims per host port by the tier's nodes.
    claims: HashMap<HostPort, u32>,
    /// Filed nodes whose fill is not a number: checked on every placement.
    pub unordered: Vec<NodeIdx>,
    /// Nodes of the tier not yet stopped, prospective ones included: what
    /// counts against `maxNodes`.
    pub counted: u32,
}

/// Where one node is filed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Filing {
    /// In no class: unreachable, cordoned, or of no tier.
    Nowhere,
    /// In class `class` (a position in its profile's classes) of profile
    /// `profile`.
    Class { profile: u32, class: u32, entry: Entry },
    /// Aside, in its tier's `unordered`.
    Unordered,
}

/// The candidate index of a view (see the module docs).
#[derive(Clone, Debug, Default)]
pub(crate) struct FleetIndex {
    /// `[pool][tier]`.
    tiers: Vec<Vec<TierIndex>>,
    profiles: Vec<Profile>,
    /// Profiles by [`Traits::fingerprint`].
    by_fingerprint: HashMap<u64, Vec<u32>>,
    /// Per node: its profile (`u32::MAX` when it is filed nowhere), its
    /// filing, and the slot it counts in against `maxNodes`.
    profile_of: Vec<u32>,
    filing: Vec<Filing>,
    counted_in: Vec<u32>,
}

const NO_PROFILE: u32 = u32::MAX;

impl FleetIndex {
    /// An empty index for `pools`' tiers.
    pub(crate) fn new(pools: &Pools) -> Self {
        FleetIndex {
            tiers: pools
                .iter()
                .map(|p| {
                    p.tiers
                        .iter()
                        .map(|t| TierIndex {
                            packing: t.packing_strategy,
                            ..TierIndex::default()
                        })
                        .collect()
                })
                .collect(),
            ..FleetIndex::default()
        }
    }

    pub(crate) fn tier(&self, pool: usize, tier: usize) -> Option<&TierIndex> {
        self.tiers.get(pool)?.get(tier)
    }

    /// How many classes the tier with the most has.
    pub(crate) fn most_classes(&self) -> usize {
        let classes = |tier: &TierIndex| -> usize {
            tier.profiles
                .iter()
                .map(|&p| self.profiles[p as usize].classes.len())
                .sum()
        };
        self.tiers.iter().flatten().map(classes).max().unwrap_or(0)
    }

    pub(crate) fn profile(&self, profile: u32) -> &Profile {
        &self.profiles[profile as usize]
    }

    /// Everything about node `idx` the index reads has changed (it is new,
    /// or its condition, inventory or membership changed): files it again
    /// from scratch.
    pub(crate) fn reprofile(&mut self, idx: NodeIdx, hot: &Hot, entry: &NodeEntry) {
        let i = idx as usize;
        if self.profile_of.len() <= i {
            self.profile_of.resize(i + 1, NO_PROFILE);
            self.filing.resize(i + 1, Filing::Nowhere);
            self.counted_in.resize(i + 1, NO_SLOT);
        }
        let counted = if entry.phase == NodePhase::Stopped {
            NO_SLOT
        } else {
            hot.slot
        };
        if counted != self.counted_in[i] {
            if let Some(tier) = self.tier_mut(self.counted_in[i]) {
                tier.counted -= 1;
            }
            if let Some(tier) = self.tier_mut(counted) {
                tier.counted += 1;
            }
            self.counted_in[i] = counted;
        }
        let eligible = hot.has(flag::INVENTORY)
            && !hot.has(flag::GONE)
            && !hot.has(flag::UNHEALTHY)
            && !hot.has(flag::CORDONED)
            && self.tier_mut(hot.slot).is_some();
        self.profile_of[i] = if eligible {
            self.profile_for(hot, entry)
        } else {
            NO_PROFILE
        };
        self.refile(idx, hot, entry);
    }

    /// Node `idx`'s fill, jobs or label changed: moves it to its place.
    pub(crate) fn refile(&mut self, idx: NodeIdx, hot: &Hot, entry: &NodeEntry) {
        let i = idx as usize;
        let Some(&profile) = self.profile_of.get(i) else {
            return;
        };
        let wanted = if profile == NO_PROFILE {
            Filing::Nowhere
        } else if hot.fill.is_nan() {
            Filing::Unordered
        } else {
            let Some(tier) = self.tier_of(hot.slot) else {
                return;
            };
            let key = ClassKey {
                occupancy: Occupancy::of(hot),
                claims: tier
                    .tracked
                    .iter()
                    .enumerate()
                    .filter(|(_, port)| entry.ports.contains(port))
                    .fold(0, |mask, (bit, _)| mask | 1 << bit),
                gpu_room: gpu_room(&entry.gpus),
            };
            let order = fill_order(hot.fill, tier.packing);
            let classes = &mut self.profiles[profile as usize].classes;
            let class = match classes.iter().position(|c| c.key == key) {
                Some(class) => class,
                None => {
                    classes.push(Class {
                        key,
                        entries: BTreeSet::new(),
                    });
                    classes.len() - 1
                }
            };
            Filing::Class {
                profile,
                class: class as u32,
                entry: Entry {
                    order,
                    label: hot.rank,
                    idx,
                },
            }
        };
        let filed = self.filing[i];
        if filed == wanted {
            return;
        }
        match filed {
            Filing::Nowhere => {}
            Filing::Class { profile, class, entry } => {
                self.profiles[profile as usize].classes[class as usize]
                    .entries
                    .remove(&entry);
            }
            Filing::Unordered => {
                for tier in self.tiers.iter_mut().flatten() {
                    tier.unordered.retain(|&n| n != idx);
                }
            }
        }
        match wanted {
            Filing::Nowhere => {}
            Filing::Class { profile, class, entry } => {
                self.profiles[profile as usize].classes[class as usize]
                    .entries
                    .insert(entry);
            }
            Filing::Unordered => {
                if let Some(tier) = self.tier_mut(hot.slot) {
                    tier.unordered.push(idx);
                }
            }
        }
        self.filing[i] = wanted;
    }

    /// A node of slot `slot` claimed (`true`) or gave back a host port.
    /// Returns true when the tier starts tracking the port: every node of
    /// the tier must then be re-filed.
    pub(crate) fn port_claim(&mut self, slot: u32, port: HostPort, claimed: bool) -> bool {
        let Some(tier) = self.tier_mut(slot) else {
            return false;
        };
        let count = tier.claims.entry(port).or_insert(0);
        if claimed {
            *count += 1;
        } else {
            *count = count.saturating_sub(1);
        }
        let take_up = *count >= TRACK_AT && tier.tracked.len() < TRACKED_PORTS && !tier.tracked.contains(&port);
        if take_up {
            tier.tracked.push(port);
        }
        take_up
    }

    /// Node `idx` left the view.
    pub(crate) fn forget(&mut self, idx: NodeIdx, hot: &Hot, entry: &NodeEntry) {
        let i = idx as usize;
        if i >= self.profile_of.len() {
            return;
        }
        self.profile_of[i] = NO_PROFILE;
        self.refile(idx, hot, entry);
        if let Some(tier) = self.tier_mut(self.counted_in[i]) {
            tier.counted -= 1;
        }
        self.counted_in[i] = NO_SLOT;
    }

    /// The label node `idx` is filed under, if it is in a class.
    #[cfg(test)]
    pub(crate) fn filed_label(&self, idx: NodeIdx) -> Option<u32> {
        match self.filing.get(idx as usize)? {
            Filing::Class { entry, .. } => Some(entry.label),
            Filing::Nowhere | Filing::Unordered => None,
        }
    }

    /// The profile of a node, made when it is the first of its kind.
    fn profile_for(&mut self, hot: &Hot, entry: &NodeEntry) -> u32 {
        let fingerprint = Traits::fingerprint(hot, entry);
        let same = self.by_fingerprint.get(&fingerprint).and_then(|profiles| {
            profiles
                .iter()
                .copied()
                .find(|&p| self.profiles[p as usize].traits.describe(hot, entry))
        });
        if let Some(profile) = same {
            return profile;
        }
        let traits = Traits::of(hot, entry);
        let profile = self.profiles.len() as u32;
        if let Some(tier) = self.tier_mut(traits.slot) {
            tier.profiles.push(profile);
        }
        self.by_fingerprint.entry(fingerprint).or_default().push(profile);
        self.profiles.push(Profile {
            traits,
            classes: Vec::new(),
        });
        profile
    }

    fn tier_of(&self, slot: u32) -> Option<&TierIndex> {
        if slot == NO_SLOT {
            return None;
        }
        self.tier((slot >> 16) as usize, (slot & 0xffff) as usize)
    }

    fn tier_mut(&mut self, slot: u32) -> Option<&mut TierIndex> {
        if slot == NO_SLOT {
            return None;
        }
        self.tiers
            .get_mut((slot >> 16) as usize)?
            .get_mut((slot & 0xffff) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_room_counts_the_eighths_the_roomiest_device_has_free() {
        let device = |total: f64, used: f64| GpuDevice {
            model: Name::from("t4"),
            total,
            used,
        };
        assert_eq!(gpu_room(&[]), 0);
        assert_eq!(gpu_room(&[device(1.0, 1.0)]), 0);
        assert_eq!(gpu_room(&[device(1.0, 0.75), device(1.0, 0.5)]), 4);
        assert_eq!(gpu_room(&[device(1.0, 0.8)]), 1);
        assert_eq!(gpu_room(&[device(2.0, 0.0)]), GPU_ROOM_STEPS);
    }

    #[test]
    fn fill_orders_follow_the_packing_and_round_trip() {
        let fills = [0.0, 0.25, 0.5, 1.0];
        for packing in [PackingStrategy::Binpack, PackingStrategy::Spread] {
            let orders: Vec<u64> = fills.iter().map(|&f| fill_order(f, packing)).collect();
            for (&fill, &order) in fills.iter().zip(&orders) {
                assert_eq!(order_fill(order, packing), fill);
            }
            let ascending = orders.windows(2).all(|w| w[0] < w[1]);
            assert_eq!(ascending, packing == PackingStrategy::Spread, "{packing:?}");
        }
    }
}
