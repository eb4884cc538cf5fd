//! Node-id order without renumbering. Every node carries a label
//! ([`super::Hot::rank`]) that sorts exactly like its id, so ranking compares
//! two integers and never reads an id (the key's last component, "node id,
//! lexicographic, for determinism").
//!
//! Labels are spread evenly over the `u32` range when the view is built. A
//! node added later takes the midpoint between its neighbours' labels; only
//! when those are adjacent is a window around it spread out again, the
//! window doubled until it leaves room between every two labels (order
//! maintenance). Adding a node therefore moves a handful of labels, not
//! every node's position, and the candidate index re-files only the nodes
//! whose label moved.

use super::{FleetView, NodeIdx};

/// Labels lie strictly between these bounds.
const FLOOR: u64 = 0;
const CEILING: u64 = 1 << 32;
/// The room a re-spread window leaves between two neighbouring labels, so
/// the next few nodes added there take midpoints again.
const MIN_GAP: u64 = 64;

impl FleetView {
    /// Labels every node of the id order evenly.
    pub(super) fn label_in_order(&mut self) {
        let labels = spread(FLOOR, CEILING, self.order.len());
        for (&idx, label) in self.order.iter().zip(labels) {
            self.hot[idx as usize].rank = label;
        }
    }

    /// Puts node `idx` into the id order with a label of its own. Returns
    /// the other nodes whose label moved to make room (usually none).
    pub(super) fn insert_in_order(&mut self, idx: NodeIdx) -> Vec<NodeIdx> {
        let at = self.order_position(idx);
        self.order.insert(at, idx);
        let len = self.order.len();
        let label = |view: &Self, pos: usize| u64::from(view.hot[view.order[pos] as usize].rank);
        let below = if at > 0 { label(self, at - 1) } else { FLOOR };
        let above = if at + 1 < len { label(self, at + 1) } else { CEILING };
        if above - below >= 2 {
            // Below CEILING, so it fits.
            self.hot[idx as usize].rank = (below + (above - below) / 2) as u32;
            return Vec::new();
        }
        let mut half = 1;
        loop {
            let lo = at.saturating_sub(half);
            let hi = (at + half + 1).min(len);
            let floor = if lo > 0 { label(self, lo - 1) } else { FLOOR };
            let ceiling = if hi < len { label(self, hi) } else { CEILING };
            let roomy = (ceiling - floor) / ((hi - lo) as u64 + 1) >= MIN_GAP;
            if roomy || (lo == 0 && hi == len) {
                let mut moved = Vec::with_capacity(hi - lo);
                for (pos, label) in (lo..hi).zip(spread(floor, ceiling, hi - lo)) {
                    let node = self.order[pos];
                    self.hot[node as usize].rank = label;
                    if node != idx {
                        moved.push(node);
                    }
                }
                return moved;
            }
            half *= 2;
        }
    }

    /// Takes node `idx` out of the id order (its label's room stays free).
    pub(super) fn remove_from_order(&mut self, idx: NodeIdx) {
        let at = self.order_position(idx);
        if self.order.get(at) == Some(&idx) {
            self.order.remove(at);
        }
    }

    /// Where node `idx`'s id sorts in the id order.
    fn order_position(&self, idx: NodeIdx) -> usize {
        let nodes = &self.nodes;
        let id = &nodes[idx as usize].id;
        self.order.partition_point(|&i| nodes[i as usize].id < *id)
    }
}

/// `count` labels evenly between `floor` and `ceiling`, both excluded. The
/// view numbers its nodes with `u32`, so `count` stays below the room
/// between the bounds and every step is at least 1.
fn spread(floor: u64, ceiling: u64, count: usize) -> impl Iterator<Item = u32> {
    let step = ((ceiling - floor) / (count as u64 + 1)).max(1);
    (1..=count as u64).map(move |i| (floor + i * step) as u32)
}

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn spread_labels_lie_strictly_between_their_bounds_in_order() {
        let labels: Vec<u32> = spread(10, 20, 4).collect();
        assert_eq!(labels, vec![12, 14, 16, 18]);
        let all: Vec<u32> = spread(0, 1 << 32, 3).collect();
        assert_eq!(all, vec![1 << 30, 2 << 30, 3 << 30]);
    }
}
