//! One node as placement sees it, split in two: [`Hot`], the few numbers
//! and bits every placement reads for every node of a tier (kept small and
//! contiguous, so a scan of thousands of nodes stays in cache), and
//! [`NodeEntry`], everything else (names, port list, GPU devices, jobs),
//! read only for the nodes the hot part does not already decide.

use crate::model::{HostPort, NodeId, NodePhase, PortProtocol, ProviderKind};

use super::names::Name;

/// Flag bits of [`Hot::flags`].
pub(crate) mod flag {
    /// The node advertises an inventory.
    pub const INVENTORY: u16 = 1;
    /// Stopping or stopped.
    pub const GONE: u16 = 1 << 1;
    /// Excluded after repeated rejections.
    pub const UNHEALTHY: u16 = 1 << 2;
    /// No new placements.
    pub const CORDONED: u16 = 1 << 3;
    /// Tagged spare.
    pub const SPARE: u16 = 1 << 4;
    /// The spare's `reservedFor` is non-empty and `exclusive`.
    pub const EXCLUSIVE_RESERVATION: u16 = 1 << 5;
    /// The spare's `reservedFor` is non-empty.
    pub const RESERVED: u16 = 1 << 6;
    /// Prospective or starting.
    pub const LAUNCHING: u16 = 1 << 7;
    /// On durable capacity (the tier's `reliability`).
    pub const DURABLE: u16 = 1 << 8;
}

/// No resolved pool and tier.
pub(crate) const NO_SLOT: u32 = u32::MAX;
/// No known AZ.
pub(crate) const NO_AZ: u32 = u32::MAX;

/// Packs a pool and tier index into [`Hot::slot`].
pub(crate) fn slot(pool: usize, tier: usize) -> u32 {
    match (u16::try_from(pool), u16::try_from(tier)) {
        (Ok(pool), Ok(tier)) if pool < u16::MAX => (u32::from(pool) << 16) | u32::from(tier),
        _ => NO_SLOT,
    }
}

/// The bit a host port sets in [`Hot::ports`]. A clear bit proves the port
/// free; a set bit sends the check to the node's port list.
pub(crate) fn port_bit(port: &HostPort) -> u64 {
    let proto = match port.protocol {
        PortProtocol::Tcp => 0,
        PortProtocol::Udp => 1,
    };
    1 << ((u32::from(port.port) * 2 + proto) % 64)
}

/// The part of a node every placement reads: exactly one cache line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(crate) struct Hot {
    /// Free capacity: `totalCapacity × utilizationCap − reserved − placed`.
    pub free: f64,
    /// Reserved over usable capacity (1 with none usable), kept current by
    /// every reservation so ranking never divides.
    pub fill: f64,
    /// Capabilities with ids below 64 (the node's full set is in its entry).
    pub capabilities: u64,
    /// [`port_bit`] of every claimed host port.
    pub ports: u64,
    /// Held template images with ids below 64.
    pub images: u64,
    /// [`slot`] of the node's pool and tier.
    pub slot: u32,
    /// Interned AZ, or [`NO_AZ`].
    pub az: u32,
    /// The node's label in node-id order (see `fleet::order`): comparing
    /// ranks is comparing ids lexicographically, without reading the ids.
    pub rank: u32,
    /// Cores, saturating at 65535 (no worker has that many).
    pub total_cores: u16,
    pub used_cores: u16,
    /// Jobs on the node (in-plan reservations included), saturating: only
    /// "none" and "some" decide anything, and the entry holds the list.
    pub occupants: u16,
    /// Of which exclusive, saturating likewise.
    pub exclusive_occupants: u16,
    /// [`flag`] bits.
    pub flags: u16,
    pub kind: ProviderKind,
}

const _: () = assert!(std::mem::size_of::<Hot>() == 64);

/// A core count as [`Hot`] holds it.
pub(crate) fn cores(count: u32) -> u16 {
    u16::try_from(count).unwrap_or(u16::MAX)
}

impl Hot {
    pub(crate) fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    pub(crate) fn free_cores(&self) -> u32 {
        u32::from(self.total_cores.saturating_sub(self.used_cores))
    }

    /// Sets [`Hot::fill`] from the node's usable capacity.
    pub(crate) fn refill(&mut self, usable: f64) {
        self.fill = fill_of(usable, self.free);
    }

    pub(crate) fn az(&self) -> Option<u32> {
        (self.az != NO_AZ).then_some(self.az)
    }
}

/// The fill of a node with `usable` capacity of which `free` is free:
/// reserved over usable, 1 with none usable. Monotone: more free never
/// means fuller, which is what lets the candidate index turn "enough free
/// capacity" into a bound on fill.
pub(crate) fn fill_of(usable: f64, free: f64) -> f64 {
    if usable > 0.0 {
        ((usable - free) / usable).clamp(0.0, 1.0)
    } else {
        1.0
    }
}

/// One GPU device and what placed jobs reserve on it.
#[derive(Clone, Debug)]
pub(crate) struct GpuDevice {
    pub model: Name,
    pub total: f64,
    pub used: f64,
}

impl GpuDevice {
    pub(crate) fn free(&self) -> f64 {
        self.total - self.used
    }
}

/// A set of interned capability ids (no trailing empty word, so equal sets
/// are equal values).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct CapabilitySet(Vec<u64>);

impl CapabilitySet {
    pub(crate) fn insert(&mut self, id: u32) {
        let word = (id / 64) as usize;
        if self.0.len() <= word {
            self.0.resize(word + 1, 0);
        }
        self.0[word] |= 1 << (id % 64);
    }

    pub(crate) fn contains(&self, id: u32) -> bool {
        self.0
            .get((id / 64) as usize)
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }

    /// The ids below 64, as one word.
    pub(crate) fn low_word(&self) -> u64 {
        self.0.first().copied().unwrap_or(0)
    }
}

/// The rest of a node.
#[derive(Clone, Debug)]
pub(crate) struct NodeEntry {
    pub id: NodeId,
    /// `totalCapacity × utilizationCap − reserved`.
    pub usable: f64,
    /// The pool and tier the node belongs to, as named (for the trace).
    pub pool_name: Option<Name>,
    pub tier_name: Option<Name>,
    pub phase: NodePhase,
    pub reserved_for: Vec<String>,
    pub capabilities: CapabilitySet,
    /// Interned ids of held images that some template names, sorted.
    pub images: Vec<u32>,
    pub gpus: Vec<GpuDevice>,
    pub ports: Vec<HostPort>,
    pub occupants: Vec<u32>,
}
