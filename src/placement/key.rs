//! `PlacementKey`: how the survivors of the filter chain are ranked.
//!
//! The key is lexicographic, the spec's nine components in order, with no
//! weights: a component decides only when every component above it tied.
//! Each field holds the component's natural value (a count, a flag, a fill
//! fraction) and [`PlacementKey::cmp`] orients it, so `a < b` means "a wins":
//!
//! | # | component | wins |
//! |---|---|---|
//! | 1 | `resilienceViolations` | fewer `forbid` domains violated (backups) |
//! | 2 | `prospective` | booted over still launching |
//! | 3 | `avoidedSpare` | not an unconsumed spare the policy in force avoids |
//! | 4 | `warmth` | more of the template's images held |
//! | 5 | `reservationMatch` | an empty spare reserved for the template |
//! | 6 | `preferredSpare` | an unconsumed spare, recovering with `preferSpare` |
//! | 7 | `packing` | fuller under `binpack`, emptier under `spread` |
//! | 8 | `sameAz` | sharing an AZ with a same-replica peer (soft) |
//! | 9 | node id | lexicographic, for determinism (compared by the node's
//! |   |   | label in node-id order, so no id is read while ranking) |

use std::cmp::Ordering;

use serde::Serialize;

use crate::model::{IntraReplicaAz, PackingStrategy, ProviderKind};

use super::filter::shares_az;
use super::fleet::{FleetView, NodeEntry, NodeIdx, Traits, flag};
use super::request::{Demand, SparePolicy};

/// The rank of one surviving node (see the module docs for the order).
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementKey {
    /// 1. How many `forbid` resilience domains the node violates.
    pub resilience_violations: u8,
    /// 2. The node is still launching (prospective or starting).
    pub prospective: bool,
    /// 3. The node is an unconsumed spare and the policy in force avoids
    ///    spares.
    pub avoided_spare: bool,
    /// 4. How many of the job's template images the node holds.
    pub warmth: u32,
    /// 5. The node is an unconsumed spare reserved for the job's template.
    pub reservation_match: bool,
    /// 6. The node is an unconsumed spare and the recovering job says
    ///    `preferSpare`.
    pub preferred_spare: bool,
    /// 7. The node's fill (reserved / usable capacity) before the job.
    pub fill: f64,
    /// 7. How the tier packs: `binpack` ranks the fuller node first,
    ///    `spread` the emptier.
    pub packing: PackingStrategy,
    /// 8. `sameAz: soft` and the node shares no AZ with a placed peer of the
    ///    replica.
    pub outside_peer_az: bool,
    /// 9. The node's label in node-id order: labels sort like the ids
    ///    (lexicographic; the trace names the node beside its key).
    pub node_order: u32,
}

impl PlacementKey {
    #[inline]
    fn packing_order(&self, other: &Self) -> Ordering {
        match self.packing {
            PackingStrategy::Binpack => other.fill.total_cmp(&self.fill),
            PackingStrategy::Spread => self.fill.total_cmp(&other.fill),
        }
    }
}

impl PlacementKey {
    /// Components 1 to 6 alone, lexicographically; `Less` is better. Every
    /// node of one profile of the candidate index shares them.
    #[inline]
    pub(crate) fn cmp_leading(&self, other: &Self) -> Ordering {
        self.resilience_violations
            .cmp(&other.resilience_violations)
            .then(self.prospective.cmp(&other.prospective))
            .then(self.avoided_spare.cmp(&other.avoided_spare))
            .then(other.warmth.cmp(&self.warmth))
            .then(other.reservation_match.cmp(&self.reservation_match))
            .then(other.preferred_spare.cmp(&self.preferred_spare))
    }
}

impl Ord for PlacementKey {
    /// Lexicographic over the nine components; `Less` wins.
    #[inline]
    fn cmp(&self, other: &Self) -> Ordering {
        self.cmp_leading(other)
            .then_with(|| self.packing_order(other))
            .then(self.outside_peer_az.cmp(&other.outside_peer_az))
            .then(self.node_order.cmp(&other.node_order))
    }
}

impl PartialOrd for PlacementKey {
    #[inline]
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for PlacementKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for PlacementKey {}

/// What the key reads of a node besides its fill and id label: one node's
/// own facts, or those of a profile of the candidate index, which hold for
/// each of its nodes that carries no job of the demand's bundle.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Facts<'a> {
    /// The node itself; `None` for a profile, whose nodes are none of the
    /// nodes holding the demand's peers or its other replica.
    pub node: Option<NodeIdx>,
    /// Its [`flag`] bits.
    pub flags: u16,
    /// It carries no job (so a tagged spare is unconsumed).
    pub empty: bool,
    pub az: u32,
    pub kind: ProviderKind,
    /// Held template images with low ids, as a mask.
    pub image_mask: u64,
    /// Where the lists are: read only when a component needs them, so
    /// ranking a node rarely touches more than its hot part.
    pub lists: Lists<'a>,
}

/// Where [`Facts`] find every held template image and the spare's
/// `reservedFor`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Lists<'a> {
    /// The node's own entry.
    Node(&'a NodeEntry),
    /// A profile's traits.
    Profile(&'a Traits),
}

impl Lists<'_> {
    /// Interned held template images, sorted.
    fn images(&self) -> &[u32] {
        match self {
            Lists::Node(entry) => &entry.images,
            Lists::Profile(traits) => &traits.images,
        }
    }

    fn reserved_for(&self) -> &[String] {
        match self {
            Lists::Node(entry) => &entry.reserved_for,
            Lists::Profile(traits) => &traits.reserved_for,
        }
    }
}

impl<'a> Facts<'a> {
    /// The facts of node `idx`.
    pub(crate) fn of(view: &'a FleetView, idx: NodeIdx) -> Self {
        let hot = view.hot(idx);
        let node = view.node(idx);
        Facts {
            node: Some(idx),
            flags: hot.flags,
            empty: hot.occupants == 0,
            az: hot.az,
            kind: hot.kind,
            image_mask: hot.images,
            lists: Lists::Node(node),
        }
    }
}

/// The resilience flags node `idx` would violate, as a bit set of
/// [`SAME_NODE`], [`SAME_AZ`] and [`SAME_CLOUD`].
#[inline]
pub(crate) fn resilience_violations(view: &FleetView, idx: NodeIdx, demand: &Demand<'_>) -> u8 {
    let hot = view.hot(idx);
    violations(view, demand, Some(idx), hot.az, hot.kind)
}

/// The resilience flags a node (`node`, or any node holding no job of the
/// bundle) in `az` and of provider `kind` would violate.
fn violations(view: &FleetView, demand: &Demand<'_>, node: Option<NodeIdx>, az: u32, kind: ProviderKind) -> u8 {
    let Some(resilience) = &demand.resilience else {
        return 0;
    };
    let mut violated = 0;
    for &other in &resilience.other_replica {
        if resilience.same_node && node == Some(other) {
            violated |= SAME_NODE;
        }
        if resilience.same_az && shares_az(view, node, az, other) {
            violated |= SAME_AZ;
        }
        if resilience.same_cloud && view.hot(other).kind == kind {
            violated |= SAME_CLOUD;
        }
    }
    violated
}

/// Bit of a `sameNode` violation.
pub(crate) const SAME_NODE: u8 = 1;
/// Bit of a `sameAz` violation.
pub(crate) const SAME_AZ: u8 = 2;
/// Bit of a `sameCloud` violation.
pub(crate) const SAME_CLOUD: u8 = 4;

/// The key of node `idx` for `demand` in a tier packed by `packing`.
pub(crate) fn key(view: &FleetView, idx: NodeIdx, demand: &Demand<'_>, packing: PackingStrategy) -> PlacementKey {
    let hot = view.hot(idx);
    PlacementKey {
        fill: hot.fill,
        node_order: hot.rank,
        ..key_of(view, demand, &Facts::of(view, idx), packing)
    }
}

/// The key of a node with these facts, its fill and id label left at 0.
pub(crate) fn key_of(
    view: &FleetView,
    demand: &Demand<'_>,
    facts: &Facts<'_>,
    packing: PackingStrategy,
) -> PlacementKey {
    let has = |bit: u16| facts.flags & bit != 0;
    // "Only an unconsumed spare (tagged, carrying no job) counts as reserve."
    let unconsumed_spare = has(flag::SPARE) && facts.empty;
    let wide_warmth = demand
        .warm_wide
        .iter()
        .filter(|i| facts.lists.images().binary_search(i).is_ok())
        .count();
    let warmth = (demand.warm_mask & facts.image_mask).count_ones() + wide_warmth as u32;
    let outside_peer_az = demand.same_az == IntraReplicaAz::Soft
        && !demand.peers.is_empty()
        && !demand
            .peers
            .iter()
            .any(|p| shares_az(view, facts.node, facts.az, p.node));
    PlacementKey {
        resilience_violations: violations(view, demand, facts.node, facts.az, facts.kind).count_ones() as u8,
        prospective: has(flag::LAUNCHING),
        avoided_spare: unconsumed_spare && demand.spare_policy == SparePolicy::Avoid,
        warmth,
        reservation_match: unconsumed_spare
            && has(flag::RESERVED)
            && facts.lists.reserved_for().contains(&demand.job.template),
        preferred_spare: unconsumed_spare && demand.spare_policy == SparePolicy::Prefer,
        fill: 0.0,
        packing,
        outside_peer_az,
        node_order: 0,
    }
}

impl std::fmt::Display for PlacementKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let packing = match self.packing {
            PackingStrategy::Binpack => "binpack",
            PackingStrategy::Spread => "spread",
        };
        write!(
            f,
            "violations={} prospective={} avoidedSpare={} warmth={} reservationMatch={} preferredSpare={} fill={:.3} ({packing}) outsidePeerAz={}",
            self.resilience_violations,
            self.prospective,
            self.avoided_spare,
            self.warmth,
            self.reservation_match,
            self.preferred_spare,
            self.fill,
            self.outside_peer_az
        )
    }
}
