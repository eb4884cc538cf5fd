//! Spot interruption / rebalance: when a provider says it is taking a node
//! back, the node is run down ahead of the deadline as a forced drain with
//! a timeout cut to fit, and the jobs lost with the reclaimed node are
//! recovered without counting against the restart ceiling ("N reclaims
//! never break a bundle"). Driven by Manager's `nodeInterruptionNotice`
//! event or called directly (`handleNodeInterruption`).
//!
//! Co-located groups move as units there too, and a job the deadline
//! catches on the node is reported `terminated` with it: a drain cut short
//! by its deadline is never `done`.
//!
//! This module owns the notices taken; the drain itself is `drain`'s.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{InterruptionKind, NodeId, UnixMillis};

use super::core::AutoManagerCore;
use super::drain::{DrainAfter, DrainOptions, DrainState, StrategyFor};
use super::fleet::Fleet;
use super::{CommandError, Notification};

/// `SPOT_INTERRUPTION_DRAIN_MARGIN_MS`: a drain for a notice with a
/// deadline times out this long before it (30 s).
pub const SPOT_INTERRUPTION_DRAIN_MARGIN_MS: u64 = 30_000;
/// `DEFAULT_SPOT_INTERRUPTION_DRAIN_MS`: a spot interruption without a
/// deadline drains for this long (90 s, EC2's two-minute warning less the
/// margin).
pub const DEFAULT_SPOT_INTERRUPTION_DRAIN_MS: u64 = 90_000;
/// `DEFAULT_REBALANCE_DRAIN_MS`: a rebalance recommendation without a
/// deadline drains for this long (5 min).
pub const DEFAULT_REBALANCE_DRAIN_MS: u64 = 5 * 60_000;

/// `handleNodeInterruption`'s notice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterruptionNotice {
    /// `spot-interruption` or `rebalance`.
    pub kind: InterruptionKind,
    /// When the provider reclaims the node, if it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<UnixMillis>,
    /// Per-job migration strategy, as for `drainNode`.
    #[serde(default)]
    pub strategy_for: StrategyFor,
}

impl InterruptionNotice {
    /// The drain's timeout for a notice taken at `now`: `deadline − now −
    /// SPOT_INTERRUPTION_DRAIN_MARGIN_MS` (never below zero), or the kind's
    /// default without a deadline.
    pub fn drain_timeout_ms(&self, now: UnixMillis) -> u64 {
        match self.deadline {
            Some(deadline) => {
                let left = deadline.saturating_sub(now).max(0) as u64;
                left.saturating_sub(SPOT_INTERRUPTION_DRAIN_MARGIN_MS)
            }
            None => match self.kind {
                InterruptionKind::Rebalance => DEFAULT_REBALANCE_DRAIN_MS,
                // A kind this build does not know is read as the more
                // urgent one: the node may go at any moment.
                InterruptionKind::SpotInterruption | InterruptionKind::Unknown(_) => DEFAULT_SPOT_INTERRUPTION_DRAIN_MS,
            },
        }
    }
}

/// `NodeInterruptionState`: what `nodeInterrupted` reports and
/// `nodeInterruption` reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInterruptionState {
    pub node_id: NodeId,
    /// The last notice's kind. Written as `interruptionKind`: a notification
    /// line's `kind` is the callback's name (`nodeInterrupted`), and a key
    /// may appear only once in a JSON object.
    #[serde(rename = "interruptionKind")]
    pub kind: InterruptionKind,
    /// The provider's deadline, if it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<UnixMillis>,
    /// When the notice was taken.
    pub noticed_at: UnixMillis,
    /// The drain it started or tightened.
    pub drain: DrainState,
}

/// A notice taken for a node.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Notice {
    kind: InterruptionKind,
    deadline: Option<UnixMillis>,
    noticed_at: UnixMillis,
}

/// The notices taken, by node, until the node leaves the fleet or an
/// uncordon withdraws it.
#[derive(Clone, Debug, Default)]
pub(super) struct Interruptions {
    by_node: BTreeMap<NodeId, Notice>,
    /// Notices Manager relayed, not yet acted on.
    relayed: Vec<(NodeId, InterruptionNotice, UnixMillis)>,
}

impl Interruptions {
    pub(super) fn get(&self, node: &NodeId) -> Option<(InterruptionKind, Option<UnixMillis>, UnixMillis)> {
        self.by_node.get(node).map(|n| (n.kind, n.deadline, n.noticed_at))
    }

    /// `uncordonNode` withdraws the notice with the drain.
    pub(super) fn withdraw(&mut self, node: &NodeId) {
        self.by_node.remove(node);
    }

    /// Notices for nodes the fleet no longer holds are forgotten (their jobs
    /// have long been recovered).
    pub(super) fn forget_missing(&mut self, fleet: &Fleet) {
        if self.by_node.keys().any(|n| !fleet.contains(n)) {
            self.by_node.retain(|n, _| fleet.contains(n));
        }
    }
}

impl AutoManagerCore {
    /// `handleNodeInterruption`: a forced drain with its timeout cut to fit
    /// the deadline; a notice for a node already draining keeps that drain
    /// and tightens its timeout. `nodeInterrupted` fires once per call, once
    /// the node is cordoned and its drain started or tightened.
    pub(super) fn handle_node_interruption(
        &mut self,
        node_id: &NodeId,
        notice: InterruptionNotice,
        noticed_at: UnixMillis,
        now: UnixMillis,
    ) -> Result<(), CommandError> {
        let timeout_ms = notice.drain_timeout_ms(now);
        let deadline = now.saturating_add(timeout_ms as i64);
        // The notice is taken first, so a job lost at once is already known
        // to be lost to a reclaim.
        let taken = Notice {
            kind: notice.kind,
            deadline: notice.deadline,
            noticed_at,
        };
        let previous = self.drains.interruptions.by_node.insert(node_id.clone(), taken);
        let running = self.drains.get(node_id).is_some_and(|d| !d.phase.is_final());
        let drained = if running {
            if self.drains.tighten(node_id, deadline)
                && let Some(state) = self.drains.get(node_id).cloned()
            {
                self.notify(Notification::DrainProgress(Box::new(state)));
            }
            Ok(())
        } else {
            let options = DrainOptions {
                timeout_ms: Some(timeout_ms),
                force: true,
                strategy_for: notice.strategy_for,
                // The provider takes the node: nothing to keep.
                after: Some(DrainAfter::Terminate),
            };
            self.drain_node(node_id, options, now)
        };
        if let Err(e) = drained {
            match previous {
                Some(notice) => self.drains.interruptions.by_node.insert(node_id.clone(), notice),
                None => self.drains.interruptions.by_node.remove(node_id),
            };
            return Err(e);
        }
        if let Some(state) = self.node_interruption(node_id) {
            self.notify(Notification::NodeInterrupted(Box::new(state)));
        }
        Ok(())
    }

    /// Manager relayed a worker's interruption notice: acted on at the end
    /// of the step, once hydrated (a notice replayed from the snapshot
    /// waits until the jobs on its node are known).
    pub(super) fn interruption_noticed(
        &mut self,
        node_id: NodeId,
        kind: InterruptionKind,
        deadline: Option<UnixMillis>,
        noticed_at: Option<UnixMillis>,
        now: UnixMillis,
    ) {
        let notice = InterruptionNotice {
            kind,
            deadline,
            strategy_for: StrategyFor::default(),
        };
        self.drains
            .interruptions
            .relayed
            .push((node_id, notice, noticed_at.unwrap_or(now)));
    }

    /// The notices Manager relayed are acted on.
    pub(super) fn act_on_relayed_interruptions(&mut self, now: UnixMillis) {
        for (node_id, notice, noticed_at) in std::mem::take(&mut self.drains.interruptions.relayed) {
            if let Err(e) = self.handle_node_interruption(&node_id, notice, noticed_at, now) {
                self.notify(Notification::Error {
                    message: format!("interruption notice for {node_id} not acted on: {e}"),
                });
            }
        }
    }

    /// `nodeInterruption`: the notice taken for the node, with its drain.
    pub fn node_interruption(&self, node_id: &NodeId) -> Option<NodeInterruptionState> {
        let (kind, deadline, noticed_at) = self.drains.interruptions.get(node_id)?;
        Some(NodeInterruptionState {
            node_id: node_id.clone(),
            kind,
            deadline,
            noticed_at,
            drain: self.drains.get(node_id)?.clone(),
        })
    }
}
