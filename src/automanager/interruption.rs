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
//! The notices taken and their vocabulary are kept with the drains'
//! state (`drain::state`), since a notice is run as a drain; the drain
//! itself is `drain`'s.

pub use super::drain::state::{
    DEFAULT_REBALANCE_DRAIN_MS, DEFAULT_SPOT_INTERRUPTION_DRAIN_MS, InterruptionNotice, NodeInterruptionState,
    SPOT_INTERRUPTION_DRAIN_MARGIN_MS,
};

use crate::model::{DrainAfter, InterruptionKind, NodeId, UnixMillis};

use super::core::AutoManagerCore;
use super::drain::state::{DrainOptions, Notice, StrategyFor};
use super::notification::Notification;
use super::protocol::CommandError;

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
        let previous = self.drains.interruptions.take(node_id, taken);
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
            self.drains.interruptions.restore(node_id, previous);
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
            .relay(node_id, notice, noticed_at.unwrap_or(now));
    }

    /// The notices Manager relayed are acted on.
    pub(super) fn act_on_relayed_interruptions(&mut self, now: UnixMillis) {
        for (node_id, notice, noticed_at) in self.drains.interruptions.take_relayed() {
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
