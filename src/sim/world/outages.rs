//! Nodes going away without being asked: a worker that dies silently
//! (found only by the keepalive), a worker that drops its connection, and a
//! provider that announces an interruption and reclaims the node at its
//! deadline. These are what `kill-node`, `stop-node` and `interrupt-node`
//! inject.

use super::{
    Action, KEEPALIVE_TIMEOUT_MS, RECLAIM_MS, SPOT_INTERRUPTION_DEADLINE_MS, World, node_ref, required, timestamp,
};
use crate::manager::proto::manager::{self as pb, event_stream_event::Event, node_stopping};
use crate::manager::proto::sim_admin;
use crate::model::{NodePhase, tags};
use crate::sim::RequestError;
use crate::sim::published::Api;

impl World {
    /// `kill-node`: the worker dies without a word. Manager only notices
    /// when the keepalive times out, and then reports the node stopped
    /// without a `NodeStopping`.
    pub fn kill_node(&mut self, node_id: &str) -> Result<(), RequestError> {
        let node = self.node_mut(node_id)?;
        if node.silent {
            return Ok(());
        }
        node.silent = true;
        self.schedule(KEEPALIVE_TIMEOUT_MS, Action::NodeGone(node_id.to_owned()));
        Ok(())
    }

    /// `stop-node`: the worker drops its connection: `NodeStopping`
    /// (health ping time exceeded) now, `NodeStopped` after the keepalive
    /// timeout.
    pub fn stop_node(&mut self, node_id: &str) -> Result<(), RequestError> {
        let node = self.node_mut(node_id)?;
        if node.silent || node.phase == NodePhase::Stopping {
            return Ok(());
        }
        node.silent = true;
        self.begin_stopping(node_id, node_stopping::Reason::HealthPingTimeExceeded, false);
        self.schedule(KEEPALIVE_TIMEOUT_MS, Action::NodeGone(node_id.to_owned()));
        Ok(())
    }

    /// `interrupt-node`: the provider's notice, relayed with the node tagged
    /// `interruption=<kind>` and audited; a notice with a deadline ends in a
    /// reclaim.
    pub fn interrupt_node(&mut self, req: sim_admin::InterruptNodeRequest) -> Result<(), RequestError> {
        let node_id = required(&req.node_id, "node_id")?;
        let kind = pb::InterruptionKind::try_from(req.kind)
            .ok()
            .filter(|k| *k != pb::InterruptionKind::Unknown)
            .ok_or_else(|| RequestError::InvalidField {
                field: "kind",
                why: format!("{} is neither a spot interruption nor a rebalance", req.kind),
            })?;
        if !(req.deadline_s.is_finite() && req.deadline_s >= 0.0) {
            return Err(RequestError::InvalidField {
                field: "deadline",
                why: format!("{} is not a number of seconds from now", req.deadline_s),
            });
        }
        let node = self.node(node_id)?;
        if node.phase == NodePhase::Stopping {
            return Err(RequestError::FailedPrecondition {
                what: format!("interrupt node {node_id:?}"),
                why: "it is already stopping".to_owned(),
            });
        }
        let in_ms = if req.deadline_s > 0.0 {
            Some((req.deadline_s * 1000.0) as i64)
        } else if kind == pb::InterruptionKind::SpotInterruption {
            Some(SPOT_INTERRUPTION_DEADLINE_MS)
        } else {
            // A rebalance recommendation carries no deadline.
            None
        };
        // The published API relays no notice: a 1.0.384 Manager only sees
        // the node go when the provider takes it.
        if self.api == Api::Full {
            self.relay_interruption(node_id, kind, in_ms)?;
        }
        if let Some(ms) = in_ms {
            self.schedule(ms, Action::Reclaim(node_id.to_owned()));
        }
        Ok(())
    }

    /// The notice, the node tagged `interruption=<kind>`, the audit entry.
    fn relay_interruption(
        &mut self,
        node_id: &str,
        kind: pb::InterruptionKind,
        in_ms: Option<i64>,
    ) -> Result<(), RequestError> {
        let now = self.now();
        let notice = pb::NodeInterruptionNotice {
            node_id: node_ref(node_id),
            kind: kind as i32,
            deadline: in_ms.map(|ms| timestamp(now.saturating_add(ms))),
            noticed_at: Some(timestamp(now)),
        };
        let kind_name = match kind {
            pb::InterruptionKind::SpotInterruption => "spot-interruption",
            _ => "rebalance",
        };
        let node = self.node_mut(node_id)?;
        node.interruption = Some(notice.clone());
        node.metadata
            .tags
            .insert(tags::INTERRUPTION.to_owned(), kind_name.to_owned());
        let tags = node.metadata.tags.clone();
        self.emit(Event::NodeInterruptionNotice(notice));
        self.emit(Event::NodeTagsUpdated(pb::NodeTagsUpdated {
            node_id: node_ref(node_id),
            tags,
        }));
        let mut details = vec![("kind", kind_name.to_owned())];
        if let Some(ms) = in_ms {
            details.push(("deadlineMs", (now.saturating_add(ms)).to_string()));
        }
        self.audit("node.interruption", node_id, &details);
        Ok(())
    }

    /// The interruption deadline passed: the provider terminates the node.
    pub(super) fn reclaim(&mut self, node_id: &str) {
        let Some(node) = self.nodes.get(node_id) else { return };
        if node.phase == NodePhase::Stopping {
            return;
        }
        self.begin_stopping(node_id, node_stopping::Reason::ProviderTerminate, true);
        let after = self.delay(RECLAIM_MS);
        self.schedule(after, Action::NodeGone(node_id.to_owned()));
    }
}
