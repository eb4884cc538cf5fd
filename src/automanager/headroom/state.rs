//! The headroom the core keeps: its tracker, the verdicts last
//! announced, and when the next recompute is due.

use crate::model::UnixMillis;
use crate::placement::headroom::{HeadroomReport, Tracker};

/// How long the fleet must stay unchanged before headroom is recomputed.
pub const HEADROOM_DEBOUNCE_MS: i64 = 2_000;
/// The longest a change waits for its recompute while changes keep coming.
pub const HEADROOM_MAX_WAIT_MS: i64 = 10_000;
/// The longest zone and provider verdicts stay stale after a node
/// recompute: they are recomputed at most this often.
pub const HEADROOM_WIDE_INTERVAL_MS: i64 = 30_000;

/// The headroom state the core keeps.
#[derive(Clone, Debug, Default)]
pub(in crate::automanager) struct HeadroomState {
    pub(super) tracker: Tracker,
    /// What the last recompute saw, to tell a change.
    pub(super) seen: Option<Fingerprint>,
    /// The first and the latest change not yet recomputed.
    pub(super) pending: Option<(UnixMillis, UnixMillis)>,
    /// When the zone and provider verdicts were last recomputed.
    pub(super) wide_at: Option<UnixMillis>,
    pub(super) report: Option<HeadroomReport>,
    /// Recomputes made (node verdicts brought up to date), and of those
    /// the ones that refreshed zones and providers too.
    pub(super) recomputes: u64,
    pub(super) wide_recomputes: u64,
}

/// A cheap summary of what headroom reads: when it moves, something headroom
/// depends on may have changed.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Fingerprint {
    pub(super) capacity_epoch: u64,
    pub(super) revisions: u64,
    pub(super) bindings: u64,
    pub(super) generations: u64,
    pub(super) pools: crate::placement::Pools,
}
