//! The hot-spare commands: `spareSpec`, `updateHotSpareNode` and
//! `updateHotSpareSpecs`, and the `HotSpareSpecsDiff` the last returns.
//! The two updates are [`Command`]s like any other (refused with a
//! [`CommandError`]); the reconciler converges on the change in the same
//! step.
//!
//! [`Command`]: super::super::Command

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::{HotSpareSpec, NodeId, SpareSpec};

use super::super::core::{AutoManagerCore, Pending};
use super::super::settings::{AutoSettingsErrorCode, AutoSettingsIssue};
use super::super::{CommandError, Rpc};
use super::{SpareRequest, is_spare_tagged};

/// A field of a `hotSpares[]` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum HotSpareField {
    /// `targetCount`.
    TargetCount,
    /// `spec` (instance type, region): applies to spares provisioned from
    /// now on.
    Spec,
    /// `warmFor`.
    WarmFor,
    /// `reservedFor`.
    ReservedFor,
    /// `exclusive`.
    Exclusive,
}

/// What `updateHotSpareSpecs` changed for one pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "camelCase")]
pub enum HotSpareChange {
    /// A new entry: its spares are provisioned.
    Added { entry: HotSpareSpec },
    /// An entry gone: its unconsumed spares are reaped as orphans.
    Removed {
        /// The entry as it was.
        entry: HotSpareSpec,
    },
    /// An entry changed.
    Changed {
        /// As it was.
        before: HotSpareSpec,
        /// As it is now.
        after: HotSpareSpec,
        /// The fields that differ.
        fields: Vec<HotSpareField>,
    },
}

/// `HotSpareSpecsDiff`: what `updateHotSpareSpecs` changed, keyed by pool
/// (pools whose entry stayed the same are absent).
pub type HotSpareSpecsDiff = BTreeMap<String, HotSpareChange>;

impl AutoManagerCore {
    /// `spareSpec(nodeId)`: what a live spare is warmed and reserved for;
    /// `None` for a node that is not an unconsumed spare.
    pub fn spare_spec(&self, node_id: &NodeId) -> Option<SpareSpec> {
        let node = self.fleet.get(node_id)?;
        (is_spare_tagged(node) && !node.is_going() && !node.terminated).then(|| SpareSpec::from_tags(&node.tags))
    }

    /// `updateHotSpareNode`: edits one live spare's `SpareSpec`, written to
    /// its tags (only the fields that changed).
    pub(in super::super) fn update_hot_spare_node(
        &mut self,
        node_id: &NodeId,
        spec: &SpareSpec,
    ) -> Result<(), CommandError> {
        let Some(node) = self.fleet.get(node_id) else {
            return Err(CommandError::UnknownNode(node_id.clone()));
        };
        let bound = self.jobs.values().any(|r| r.is_bound_to(node_id));
        if !is_spare_tagged(node) || node.is_going() || node.terminated || bound {
            return Err(CommandError::NotASpare(node_id.clone()));
        }
        let before = SpareSpec::from_tags(&node.tags);
        self.write_spare_spec(node_id, &before, spec);
        Ok(())
    }

    /// `updateHotSpareSpecs(list)`: replaces the whole `hotSpares` list
    /// without a reconnect. Validated as at boot (one entry per pool,
    /// every pool known) and rejected whole; otherwise the reconciler
    /// converges on it in this very step and the diff, keyed by pool, is
    /// returned.
    pub(in super::super) fn update_hot_spare_specs(
        &mut self,
        specs: Vec<HotSpareSpec>,
    ) -> Result<HotSpareSpecsDiff, CommandError> {
        if let Err(refused) = self.pools.validate_hot_spares(&specs) {
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
        let diff = hot_spare_diff(&self.settings.hot_spares, &specs);
        for (pool, change) in &diff {
            // A changed entry converges at once, not after an old backoff.
            self.spares.backoff.remove(pool);
            self.spares.underflow.remove(pool);
            // Before hydration (a standby, or a core still waiting for its
            // snapshot) the list is only adopted: the live spares are not
            // all known yet, and those of a standby are the leader's to
            // re-tag.
            if self.hydrated
                && let HotSpareChange::Changed { before, after, .. } = change
            {
                let accepted = self.accepted_nodes();
                let live: Vec<NodeId> = self.unconsumed_spares(pool, &accepted).map(|n| n.id.clone()).collect();
                for node_id in live {
                    self.write_spare_spec(&node_id, &before.spare_spec(), &after.spare_spec());
                }
            }
        }
        self.settings.hot_spares = specs;
        self.spares.forced = true;
        Ok(diff)
    }

    /// Writes the fields of `after` that differ from `before` to a spare's
    /// tags, here at once (placement reads them) and on Manager.
    fn write_spare_spec(&mut self, node_id: &NodeId, before: &SpareSpec, after: &SpareSpec) {
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
        self.update_tags(node_id, set, remove);
    }

    pub(super) fn update_tags(&mut self, node_id: &NodeId, set: BTreeMap<String, String>, remove: Vec<String>) {
        if let Some(node) = self.fleet.get_mut(node_id) {
            node.tags.extend(set.clone());
            for name in &remove {
                node.tags.remove(name);
            }
        }
        self.fleet_epoch += 1;
        self.call(
            Rpc::UpdateNodeTags {
                node_id: node_id.clone(),
                set,
                remove,
            },
            Pending::Spare(SpareRequest::Tags {
                node_id: node_id.clone(),
            }),
        );
    }
}

/// What changed between two `hotSpares` lists, keyed by pool.
pub fn hot_spare_diff(before: &[HotSpareSpec], after: &[HotSpareSpec]) -> HotSpareSpecsDiff {
    let old: BTreeMap<&str, &HotSpareSpec> = before.iter().map(|e| (e.pool.as_str(), e)).collect();
    let new: BTreeMap<&str, &HotSpareSpec> = after.iter().map(|e| (e.pool.as_str(), e)).collect();
    let mut diff = BTreeMap::new();
    for (pool, entry) in &old {
        if !new.contains_key(pool) {
            diff.insert(
                (*pool).to_owned(),
                HotSpareChange::Removed {
                    entry: (*entry).clone(),
                },
            );
        }
    }
    for (pool, entry) in &new {
        let change = match old.get(pool) {
            None => HotSpareChange::Added {
                entry: (*entry).clone(),
            },
            Some(previous) => {
                let fields: Vec<HotSpareField> = [
                    (previous.target_count != entry.target_count, HotSpareField::TargetCount),
                    (previous.spec != entry.spec, HotSpareField::Spec),
                    (previous.warm_for != entry.warm_for, HotSpareField::WarmFor),
                    (previous.reserved_for != entry.reserved_for, HotSpareField::ReservedFor),
                    (previous.exclusive != entry.exclusive, HotSpareField::Exclusive),
                ]
                .into_iter()
                .filter_map(|(changed, field)| changed.then_some(field))
                .collect();
                if fields.is_empty() {
                    continue;
                }
                HotSpareChange::Changed {
                    before: (*previous).clone(),
                    after: (*entry).clone(),
                    fields,
                }
            }
        };
        diff.insert((*pool).to_owned(), change);
    }
    diff
}
