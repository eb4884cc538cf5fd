//! Node tags the operator keeps when Manager cannot write them
//! (`UpdateNodeTags`): a spare that took a job loses its spare tags, a
//! spare's reservation changes. The changes are kept here as an overlay on
//! the tags Manager reports, applied to every node event before the core
//! reads it and told at once as `node_tags_updated`, so the core sees the
//! tags it asked for whichever Manager it speaks to. A node created as a
//! spare is tagged as one by `CreateAwsNode` / `CreateOciNode` itself,
//! which every Manager serves.

use std::collections::{BTreeMap, HashMap};

use crate::manager::proto::common;
use crate::manager::proto::manager::{self as pb, event_stream_event::Event};
use crate::model::NodeId;
use crate::model::manager::KeptTags;

/// The tags Manager reports per node and the changes asked on top of them.
#[derive(Debug, Default)]
pub struct NodeTags {
    /// Manager's own tags of every node it told of.
    reported: BTreeMap<String, HashMap<String, String>>,
    overlays: BTreeMap<String, KeptTags>,
}

impl NodeTags {
    /// `UpdateNodeTags`: the node's whole tag set after the change, as
    /// Manager's `node_tags_updated` would tell it; `None` for a node
    /// Manager has not told of (Manager answers `NOT_FOUND`).
    pub fn update(
        &mut self,
        node_id: &str,
        set: &BTreeMap<String, String>,
        remove: &[String],
    ) -> Option<pb::EventStreamEvent> {
        self.reported.get(node_id)?;
        self.overlays.entry(node_id.to_owned()).or_default().change(set, remove);
        self.told(node_id)
    }

    /// Changes a predecessor kept (read back from the `NorskNode`s): taken
    /// for a node this port has kept nothing for yet, since what this port
    /// asked itself is newer. Returns what to tell for the nodes Manager
    /// has told of already; the others are shown changed when it does.
    pub fn keep(&mut self, kept: BTreeMap<NodeId, KeptTags>) -> Vec<pb::EventStreamEvent> {
        let mut told = Vec::new();
        for (node_id, tags) in kept {
            if tags.is_empty() || self.overlays.contains_key(node_id.as_str()) {
                continue;
            }
            self.overlays.insert(node_id.0.clone(), tags);
            told.extend(self.told(node_id.as_str()));
        }
        told
    }

    /// Every node's kept changes, for the `NorskNode`s' status.
    pub fn kept(&self) -> BTreeMap<NodeId, KeptTags> {
        self.overlays
            .iter()
            .filter(|(_, tags)| !tags.is_empty())
            .map(|(id, tags)| (NodeId(id.clone()), tags.clone()))
            .collect()
    }

    /// Forgets the node's changes: Manager stores them now.
    pub fn forget(&mut self, node_id: &NodeId) {
        self.overlays.remove(node_id.as_str());
    }

    /// The node's tags as `node_tags_updated` tells them; `None` for a node
    /// Manager has not told of.
    fn told(&self, node_id: &str) -> Option<pb::EventStreamEvent> {
        let mut tags = self.reported.get(node_id)?.clone();
        if let Some(overlay) = self.overlays.get(node_id) {
            overlay.apply(&mut tags);
        }
        Some(pb::EventStreamEvent {
            event: Some(Event::NodeTagsUpdated(pb::NodeTagsUpdated {
                node_id: Some(common::NodeId {
                    node_id: node_id.to_owned(),
                }),
                tags,
            })),
        })
    }

    /// A node event from Manager: its tags recorded and shown with the
    /// changes asked; a stopped node is forgotten. True when what is kept
    /// changed (a stopped node's changes dropped).
    pub fn seen(&mut self, event: &mut Event) -> bool {
        match event {
            Event::NodeStarting(pb::NodeStarting {
                node_metadata: Some(meta),
            })
            | Event::NodeStarted(pb::NodeStarted {
                node_metadata: Some(meta),
                ..
            })
            | Event::NodeRunning(pb::NodeRunning {
                node_metadata: Some(meta),
                ..
            }) => {
                let id = meta.node_id.as_ref().map(|n| n.node_id.clone()).unwrap_or_default();
                self.overlaid(id, &mut meta.tags);
                false
            }
            Event::PhysicalNodeConnected(pb::PhysicalNodeConnected { node: Some(node), .. }) => {
                self.overlaid(node.id.clone(), &mut node.tags);
                false
            }
            Event::NodeStopped(pb::NodeStopped { node_id: Some(id) }) => {
                self.reported.remove(&id.node_id);
                self.overlays.remove(&id.node_id).is_some()
            }
            _ => false,
        }
    }

    fn overlaid(&mut self, node_id: String, tags: &mut HashMap<String, String>) {
        self.reported.insert(node_id.clone(), tags.clone());
        if let Some(overlay) = self.overlays.get(&node_id) {
            overlay.apply(tags);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(node: &str, tags: &[(&str, &str)]) -> Event {
        Event::NodeStarted(pb::NodeStarted {
            node_metadata: Some(common::NodeMetadata {
                node_id: Some(common::NodeId { node_id: node.into() }),
                tags: tags.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
                ..Default::default()
            }),
            running_node_metadata: None,
        })
    }

    fn tags_of(event: &Event) -> BTreeMap<String, String> {
        match event {
            Event::NodeStarted(e) => e.node_metadata.as_ref().unwrap().tags.clone().into_iter().collect(),
            Event::NodeTagsUpdated(e) => e.tags.clone().into_iter().collect(),
            _ => panic!("not a node event"),
        }
    }

    #[test]
    fn a_spare_that_took_a_job_stays_untagged_when_manager_tells_of_it_again() {
        let mut nodes = NodeTags::default();
        assert!(
            nodes.update("n1", &BTreeMap::new(), &["spare".into()]).is_none(),
            "unknown node"
        );
        let mut event = started("n1", &[("pool", "p"), ("spare", "true")]);
        nodes.seen(&mut event);
        let told = nodes
            .update("n1", &BTreeMap::from([("x".into(), "1".into())]), &["spare".into()])
            .expect("a known node");
        let expected = BTreeMap::from([("pool".to_owned(), "p".to_owned()), ("x".to_owned(), "1".to_owned())]);
        assert_eq!(tags_of(told.event.as_ref().unwrap()), expected);
        // Manager tells of the node again with the tags it was created with.
        let mut again = started("n1", &[("pool", "p"), ("spare", "true")]);
        nodes.seen(&mut again);
        assert_eq!(tags_of(&again), expected);
        // Once it stopped, a node of the same name starts afresh.
        nodes.seen(&mut Event::NodeStopped(pb::NodeStopped {
            node_id: Some(common::NodeId { node_id: "n1".into() }),
        }));
        let mut reborn = started("n1", &[("spare", "true")]);
        nodes.seen(&mut reborn);
        assert_eq!(tags_of(&reborn)["spare"], "true");
    }

    #[test]
    fn changes_a_predecessor_kept_show_on_the_node_unless_this_port_changed_it_since() {
        let mut nodes = NodeTags::default();
        let mut event = started("n1", &[("pool", "p"), ("spare", "true")]);
        nodes.seen(&mut event);
        let consumed = KeptTags {
            removed: ["spare".to_owned()].into(),
            ..KeptTags::default()
        };
        let reserved = KeptTags {
            set: BTreeMap::from([("reserved".to_owned(), "x".to_owned())]),
            ..KeptTags::default()
        };
        let told = nodes.keep(BTreeMap::from([
            (NodeId("n1".into()), consumed.clone()),
            (NodeId("n3".into()), consumed.clone()),
        ]));
        // Told at once for the node Manager told of; n3 waits for Manager.
        assert_eq!(told.len(), 1);
        assert_eq!(
            tags_of(told[0].event.as_ref().unwrap()),
            BTreeMap::from([("pool".to_owned(), "p".to_owned())])
        );
        let mut later = started("n3", &[("spare", "true")]);
        nodes.seen(&mut later);
        assert!(!tags_of(&later).contains_key("spare"));
        // What this port kept is newer than a predecessor's record.
        assert!(nodes.keep(BTreeMap::from([(NodeId("n1".into()), reserved)])).is_empty());
        assert_eq!(nodes.kept()[&NodeId("n1".into())], consumed);
        // Handed to a Manager that stores tags: no longer kept.
        nodes.forget(&NodeId("n1".into()));
        assert_eq!(nodes.kept().keys().collect::<Vec<_>>(), [&NodeId("n3".into())]);
    }
}
