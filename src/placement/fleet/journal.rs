//! Which nodes of a view changed, in order, so rankings kept across a burst
//! of placements re-score only those nodes (see `placement::rankings`).
//!
//! Every journal has an identity of its own: a cloned view gets a fresh one,
//! so rankings kept for one view are never trusted on another that has since
//! diverged from it.

use std::sync::atomic::{AtomicU64, Ordering};

use super::NodeIdx;

static NEXT_IDENTITY: AtomicU64 = AtomicU64::new(1);

fn fresh_identity() -> u64 {
    NEXT_IDENTITY.fetch_add(1, Ordering::Relaxed)
}

/// The change log of one view.
#[derive(Debug)]
pub(crate) struct Journal {
    identity: u64,
    /// The absolute position of `changed[0]`.
    base: usize,
    changed: Vec<NodeIdx>,
}

impl Default for Journal {
    fn default() -> Self {
        Journal {
            identity: fresh_identity(),
            base: 0,
            changed: Vec::new(),
        }
    }
}

impl Clone for Journal {
    fn clone(&self) -> Self {
        Journal {
            identity: fresh_identity(),
            base: self.base,
            changed: self.changed.clone(),
        }
    }
}

impl Journal {
    /// Node `idx` changed (a reservation, a release, a new condition).
    pub(crate) fn record(&mut self, idx: NodeIdx) {
        self.changed.push(idx);
    }

    /// Which view this is.
    pub(crate) fn identity(&self) -> u64 {
        self.identity
    }

    /// The absolute position after the last change.
    pub(crate) fn end(&self) -> usize {
        self.base + self.changed.len()
    }

    /// The nodes changed since absolute position `from`, or `None` when the
    /// journal was cleared past it.
    pub(crate) fn since(&self, from: usize) -> Option<&[NodeIdx]> {
        self.changed.get(from.checked_sub(self.base)?..)
    }

    /// Forgets the changes so far (rankings that had not read them are
    /// rebuilt), so a long-lived view's journal stays bounded.
    pub(crate) fn clear(&mut self) {
        self.base += self.changed.len();
        self.changed.clear();
    }
}
