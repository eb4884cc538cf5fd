//! What the simulated workers answer beyond starting and stopping jobs:
//! node tags (Manager-side metadata the worker reports back), image
//! prefetch (an image ref containing "unavailable" fails to pull), and the
//! worker side of a cooperative handover. Injected job behaviour decides
//! whether an instance cooperates, refuses, or never answers.

use super::{Action, PREFETCH_MS, SIGNAL_MS, World, job_id_of, job_ref, node_id_of, node_ref, required};
use crate::manager::proto::manager::{
    self as pb, event_stream_event::Event, migration_signal_event, migration_signal_request,
};
use crate::manager::proto::sim_admin::JobBehaviour;
use crate::model::NodePhase;
use crate::sim::RequestError;

/// An image reference containing this cannot be pulled.
const UNAVAILABLE_IMAGE_MARKER: &str = "unavailable";

impl World {
    /// `UpdateNodeTags`: sets then removes tags; answered with the whole
    /// tag set.
    pub fn update_node_tags(&mut self, req: pb::UpdateNodeTagsRequest) -> Result<(), RequestError> {
        let node_id = required(node_id_of(&req.node_id), "node_id")?.to_owned();
        if req.set.keys().chain(req.remove.iter()).any(String::is_empty) {
            return Err(RequestError::InvalidField {
                field: "tags",
                why: "a tag name is empty".to_owned(),
            });
        }
        let node = self.node_mut(&node_id)?;
        node.metadata.tags.extend(req.set);
        for name in &req.remove {
            node.metadata.tags.remove(name);
        }
        let tags = node.metadata.tags.clone();
        self.emit(Event::NodeTagsUpdated(pb::NodeTagsUpdated {
            node_id: node_ref(&node_id),
            tags,
        }));
        Ok(())
    }

    /// `PrefetchImages`: the node pulls the images; `images_prefetched`
    /// after the pull time.
    pub fn prefetch_images(&mut self, req: pb::PrefetchImagesRequest) -> Result<(), RequestError> {
        let node_id = required(node_id_of(&req.node_id), "node_id")?.to_owned();
        if req.images.is_empty() {
            return Err(RequestError::MissingField("images"));
        }
        self.running_node(&node_id)?;
        let after = self.delay(PREFETCH_MS);
        self.schedule(
            after,
            Action::ImagesPulled {
                node: node_id,
                images: req.images,
            },
        );
        Ok(())
    }

    /// The pull finished: per-image results; pulled images join the node's
    /// inventory (`node_inventory`), which is what warmth is scored on.
    pub(super) fn images_pulled(&mut self, node_id: &str, images: &[String]) {
        let Some(node) = self.nodes.get_mut(node_id) else {
            return;
        };
        if node.phase != NodePhase::Running || node.silent {
            return;
        }
        let mut results = Vec::new();
        let mut changed = false;
        for image in images {
            let error = if image.is_empty() {
                Some("empty image reference".to_owned())
            } else if image.contains(UNAVAILABLE_IMAGE_MARKER) {
                Some(format!("pull {image}: manifest unknown"))
            } else {
                None
            };
            if error.is_none()
                && let Some(inventory) = node.inventory.as_mut()
                && !inventory.images.contains(image)
            {
                inventory.images.push(image.clone());
                changed = true;
            }
            results.push(pb::ImagePrefetchResult {
                image: image.clone(),
                ok: error.is_none(),
                error: error.unwrap_or_default(),
            });
        }
        let inventory = node.inventory.clone();
        self.emit(Event::ImagesPrefetched(pb::ImagesPrefetched {
            node_id: node_ref(node_id),
            results,
        }));
        if changed {
            self.emit(Event::NodeInventory(pb::NodeInventoryUpdated { inventory }));
        }
    }

    /// `SendMigrationSignal`: relays a handover step to the instance that
    /// must answer it. `propose(HANDOVER)` -> the target answers
    /// `target_ready`; `stop_output_at` -> the source answers
    /// `source_stopped_at`; `apply_from` -> the target answers
    /// `target_applied`; an abort is acknowledged without an answer, as is
    /// a proposal of a strategy that needs no cooperation.
    pub fn send_migration_signal(&mut self, req: pb::MigrationSignalRequest) -> Result<(), RequestError> {
        let migration_id = required(&req.migration_id, "migration_id")?.to_owned();
        let job_id = required(job_id_of(&req.job_id), "job_id")?.to_owned();
        self.job(&job_id)?;
        let signal = req.signal.ok_or(RequestError::MissingField("signal"))?;
        let (from_key, answer) = match signal {
            migration_signal_request::Signal::Propose(strategy)
                if strategy == pb::MigrationStrategy::Handover as i32 =>
            {
                let target = required(&req.target_key, "target_key")?.to_owned();
                let payload = format!("{job_id}@{target}:ready").into_bytes();
                (target, migration_signal_event::Signal::TargetReady(payload))
            }
            migration_signal_request::Signal::Propose(_) | migration_signal_request::Signal::AbortReason(_) => {
                return Ok(());
            }
            migration_signal_request::Signal::StopOutputAt(_) => {
                let source = required(&req.source_key, "source_key")?.to_owned();
                let position = format!("pts:{}", self.now());
                (source, migration_signal_event::Signal::SourceStoppedAt(position))
            }
            migration_signal_request::Signal::ApplyFrom(_) => {
                let target = required(&req.target_key, "target_key")?.to_owned();
                (target, migration_signal_event::Signal::TargetApplied(()))
            }
        };
        if !self.instances.contains_key(&(job_id.clone(), from_key.clone())) {
            return Err(RequestError::UnknownInstance {
                job: job_id,
                role: from_key,
            });
        }
        let answer = match self.behaviour(&job_id) {
            JobBehaviour::HangHandover => return Ok(()),
            JobBehaviour::RefuseHandover => migration_signal_event::Signal::Refused(format!(
                "instance {from_key} of {job_id} does not support handover"
            )),
            _ => answer,
        };
        let event = pb::MigrationSignalEvent {
            migration_id,
            job_id: job_ref(&job_id),
            from_key,
            signal: Some(answer),
        };
        let after = self.delay(SIGNAL_MS);
        self.schedule(after, Action::MigrationAnswer(event));
        Ok(())
    }

    /// The instance answers, if it is still there to answer.
    pub(super) fn migration_answer(&mut self, answer: pb::MigrationSignalEvent) {
        let key = (job_id_of(&answer.job_id).to_owned(), answer.from_key.clone());
        if self.instances.contains_key(&key) {
            self.emit(Event::MigrationSignal(answer));
        }
    }
}
