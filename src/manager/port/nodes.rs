//! Node tags the operator keeps when Manager cannot write them
//! (`UpdateNodeTags`): a spare that took a job loses its spare tags, a
//! spare's reservation changes. The changes are kept here as an overlay on
//! the tags Manager reports, applied to every node event before the core
//! reads it and told at once as `node_tags_updated`, so the core sees the
//! tags it asked for whichever Manager it speaks to. A node created as a
//! spare is tagged as one by `CreateAwsNode` / `CreateOciNode` itself,
//! which every Manager serves.

use std::collections::{BTreeMap, BTreeSet};

use crate::manager::proto::common;
use crate::manager::proto::manager::{self as pb, event_stream_event::Event};

/// The tag changes asked for one node.
#[derive(Clone, Debug, Default)]
struct Overlay {
    set: BTreeMap<String, String>,
    removed: BTreeSet<String>,
}

impl Overlay {
    fn apply(&self, tags: &mut std::collections::HashMap<String, String>) {
        for name in &self.removed {
            tags.remove(name);
        }
        tags.extend(self.set.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
}

/// The tags Manager reports per node and the changes asked on top of them.
#[derive(Debug, Default)]
pub struct NodeTags {
    /// Manager's own tags of every node it told of.
    reported: BTreeMap<String, std::collections::HashMap<String, String>>,
    overlays: BTreeMap<String, Overlay>,
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
        let reported = self.reported.get(node_id)?;
        let overlay = self.overlays.entry(node_id.to_owned()).or_default();
        for name in remove {
            overlay.set.remove(name);
            overlay.removed.insert(name.clone());
        }
        for (name, value) in set {
            overlay.removed.remove(name);
            overlay.set.insert(name.clone(), value.clone());
        }
        let mut tags = reported.clone();
        overlay.apply(&mut tags);
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
    /// changes asked; a stopped node is forgotten.
    pub fn seen(&mut self, event: &mut Event) {
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
            }
            Event::PhysicalNodeConnected(pb::PhysicalNodeConnected { node: Some(node), .. }) => {
                self.overlaid(node.id.clone(), &mut node.tags);
            }
            Event::NodeStopped(pb::NodeStopped { node_id: Some(id) }) => {
                self.reported.remove(&id.node_id);
                self.overlays.remove(&id.node_id);
            }
            _ => {}
        }
    }

    fn overlaid(&mut self, node_id: String, tags: &mut std::collections::HashMap<String, String>) {
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
}
