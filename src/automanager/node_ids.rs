//! How the nodes this core provisions are named.

use crate::model::NodeId;
use crate::placement::{FleetView, ProspectiveNodeIds};

/// Prospective node ids: `<pool>-<tier>-<process>-<serial>`. The process
/// part is the AutoManager's start time (milliseconds) and a salt the runtime
/// draws at random, in base 36: the same for every core one process hydrates
/// and different for a standby promoted in its place (even one started in
/// the same millisecond), whose serials start again: a node id is never given to two
/// machines, so a forgotten node's `NorskNode` (its cordon, its history)
/// never passes to a new one. The serial counts up for the process's life and
/// skips ids the fleet holds; the same inputs always name the same nodes.
#[derive(Clone, Debug)]
pub(super) struct NodeIds {
    /// The process part (kept by a successor).
    pub(super) process: u64,
    /// The last serial given out (kept by a successor).
    serial: u64,
}

/// The id of node `serial` of `pool`'s `tier`, named by `process`.
fn node_id(pool: &str, tier: &str, process: u64, serial: u64) -> NodeId {
    let mut n = process;
    let mut process = Vec::new();
    loop {
        process.push(char::from_digit((n % 36) as u32, 36).unwrap_or('0'));
        n /= 36;
        if n == 0 {
            break;
        }
    }
    let process: String = process.iter().rev().collect();
    NodeId(format!("{pool}-{tier}-{process}-{serial}"))
}

impl NodeIds {
    /// Ids named by `process`, from the first serial.
    pub(super) fn new(process: u64) -> Self {
        Self { process, serial: 0 }
    }

    /// The next id of a node in `pool`'s `tier` that is not `taken`.
    pub(super) fn fresh(&mut self, pool: &str, tier: &str, taken: impl Fn(&NodeId) -> bool) -> NodeId {
        loop {
            self.serial += 1;
            let id = node_id(pool, tier, self.process, self.serial);
            if !taken(&id) {
                return id;
            }
        }
    }
}

impl ProspectiveNodeIds for NodeIds {
    fn prospective_node_id(&mut self, view: &FleetView, pool: &str, tier: &str) -> NodeId {
        self.fresh(pool, tier, |id| view.contains(id))
    }
}
