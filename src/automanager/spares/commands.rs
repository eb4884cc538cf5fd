//! The hot-spare commands: `spareSpec`, `updateHotSpareNode` and
//! `updateHotSpareSpecs`, and the `HotSpareSpecsDiff` the last returns.
//! The two updates are [`Command`]s like any other (refused with a
//! [`CommandError`]); the reconciler converges on the change in the same
//! step.
//!
//! [`Command`]: crate::automanager::protocol::Command

use std::collections::BTreeMap;

use crate::automanager::facts::Facts;
use crate::automanager::outbox::Outbox;
use crate::automanager::protocol::CommandError;
use crate::automanager::settings::{AutoSettingsErrorCode, AutoSettingsIssue};
use crate::model::{HotSpareSpec, NodeId, SpareSpec};

use super::diff::{HotSpareChange, HotSpareSpecsDiff, hot_spare_diff};
use super::state::{SpareState, is_spare_tagged};

/// `spareSpec(nodeId)`: what a live spare is warmed and reserved for;
/// `None` for a node that is not an unconsumed spare.
pub(in crate::automanager) fn spare_spec(facts: &Facts, node_id: &NodeId) -> Option<SpareSpec> {
    let node = facts.fleet.get(node_id)?;
    (is_spare_tagged(node) && !node.is_going() && !node.terminated).then(|| SpareSpec::from_tags(&node.tags))
}

impl SpareState {
    /// `updateHotSpareNode`: edits one live spare's `SpareSpec`, written to
    /// its tags (only the fields that changed).
    pub(in crate::automanager) fn update_node(
        &self,
        facts: &mut Facts,
        outbox: &mut Outbox,
        node_id: &NodeId,
        spec: &SpareSpec,
    ) -> Result<(), CommandError> {
        let Some(node) = facts.fleet.get(node_id) else {
            return Err(CommandError::UnknownNode(node_id.clone()));
        };
        let bound = facts.jobs.values().any(|r| r.is_bound_to(node_id));
        if !is_spare_tagged(node) || node.is_going() || node.terminated || bound {
            return Err(CommandError::NotASpare(node_id.clone()));
        }
        let before = SpareSpec::from_tags(&node.tags);
        write_spare_spec(facts, outbox, node_id, &before, spec);
        Ok(())
    }

    /// `updateHotSpareSpecs(list)`: replaces the whole `hotSpares` list
    /// without a reconnect. Validated as at boot (one entry per pool,
    /// every pool known) and rejected whole; otherwise the reconciler
    /// converges on it in this very step and the diff, keyed by pool, is
    /// returned.
    pub(in crate::automanager) fn update_specs(
        &mut self,
        facts: &mut Facts,
        outbox: &mut Outbox,
        specs: Vec<HotSpareSpec>,
    ) -> Result<HotSpareSpecsDiff, CommandError> {
        if let Err(refused) = facts.pools().validate_hot_spares(&specs) {
            let errors = refused
                .errors
                .into_iter()
                .map(|issue| AutoSettingsIssue {
                    code: AutoSettingsErrorCode::Placement(issue.code),
                    path: issue.path,
                    message: issue.message,
                })
                .collect();
            return Err(CommandError::InvalidSettings { errors });
        }
        let diff = hot_spare_diff(&facts.settings().hot_spares, &specs);
        for (pool, change) in &diff {
            // A changed entry converges at once, not after an old backoff.
            self.backoff.remove(pool);
            self.underflow.remove(pool);
            // Before hydration (a standby, or a core still waiting for its
            // snapshot) the list is only adopted: the live spares are not
            // all known yet, and those of a standby are the leader's to
            // re-tag.
            if facts.hydrated
                && let HotSpareChange::Changed { before, after, .. } = change
            {
                let accepted = facts.accepted_nodes();
                let live: Vec<NodeId> = facts.unconsumed_spares(pool, &accepted).map(|n| n.id.clone()).collect();
                for node_id in live {
                    write_spare_spec(facts, outbox, &node_id, &before.spare_spec(), &after.spare_spec());
                }
            }
        }
        facts.placed_with.set_hot_spares(specs);
        self.forced = true;
        Ok(diff)
    }
}

/// Writes the fields of `after` that differ from `before` to a spare's
/// tags, here at once (placement reads them) and on Manager.
fn write_spare_spec(facts: &mut Facts, outbox: &mut Outbox, node_id: &NodeId, before: &SpareSpec, after: &SpareSpec) {
    let (mut set, mut remove) = (BTreeMap::new(), Vec::new());
    for ((name, old), (_, new)) in before.tag_values().into_iter().zip(after.tag_values()) {
        match new {
            _ if old == new => {}
            Some(value) => {
                set.insert(name.to_owned(), value);
            }
            None => remove.push(name.to_owned()),
        }
    }
    if set.is_empty() && remove.is_empty() {
        return;
    }
    super::update_tags(facts, outbox, node_id, set, remove);
}
