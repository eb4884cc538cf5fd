//! Publishing `events.k8s.io/v1` Events, one per distinct happening.
//!
//! kube's `Recorder` folds every Event with the same reason, action and object into
//! one series whatever its note says, so `kubectl describe` showed `Recovered (x4)`
//! with the first recovery's node while the job had since moved three times. Here the
//! note is part of what makes two Events the same: a series counts only true repeats
//! (the same reason, action, type, object and note within [`SERIES_WINDOW`]).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};

/// How long an Event stays open for repeats; a repeat after that is a new Event.
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// What makes two Events the same happening.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    type_: &'static str,
    reason: String,
    action: String,
    note: Option<String>,
    /// apiVersion, kind, namespace, name and uid of the object.
    regarding: [Option<String>; 5],
}

impl Key {
    fn of(event: &Event, regarding: &ObjectReference) -> Self {
        Self {
            type_: type_name(event.type_),
            reason: event.reason.clone(),
            action: event.action.clone(),
            note: event.note.clone(),
            regarding: [
                regarding.api_version.clone(),
                regarding.kind.clone(),
                regarding.namespace.clone(),
                regarding.name.clone(),
                regarding.uid.clone(),
            ],
        }
    }
}

/// An Event already written: its name and how often it happened.
struct Written {
    namespace: String,
    name: String,
    count: i32,
    last: Timestamp,
}

fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// Writes Events as one controller instance.
pub struct Publisher {
    client: Client,
    controller: String,
    instance: String,
    written: HashMap<Key, Written>,
}

impl Publisher {
    /// A publisher reporting as `controller` (`instance`: this process, e.g. its Pod).
    pub fn new(client: Client, controller: String, instance: Option<String>) -> Self {
        Self {
            client,
            instance: instance.unwrap_or_else(|| controller.clone()),
            controller,
            written: HashMap::new(),
        }
    }

    /// Publishes `event` about `regarding`: a new Event, or the next count of the same
    /// one within the window. Events land in the object's namespace (`default` for a
    /// cluster-scoped object).
    pub async fn publish(&mut self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        self.written.retain(|_, w| w.last + SERIES_WINDOW > now);
        let key = Key::of(event, regarding);
        if let Some(written) = self.written.get_mut(&key) {
            written.count += 1;
            written.last = now;
            let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &written.namespace);
            let patch = serde_json::json!({
                "series": EventSeries { count: written.count, last_observed_time: MicroTime(now) },
            });
            api.patch(&written.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            return Ok(());
        }
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let object = K8sEvent {
            metadata: ObjectMeta {
                // As kubectl and the controllers of Kubernetes name theirs: the object and
                // the time, unique per object.
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(&self.controller),
                    now.as_nanosecond()
                )),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            type_: Some(type_name(event.type_).to_owned()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..K8sEvent::default()
        };
        let created = api.create(&PostParams::default(), &object).await?;
        if let Some(name) = created.metadata.name {
            self.written.insert(
                key,
                Written {
                    namespace,
                    name,
                    count: 1,
                    last: now,
                },
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(reason: &str, note: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.to_owned(),
            note: Some(note.to_owned()),
            action: "Place".to_owned(),
            secondary: None,
        }
    }

    fn bundle() -> ObjectReference {
        ObjectReference {
            api_version: Some("automanager.norsk.video/v1alpha1".to_owned()),
            kind: Some("Bundle".to_owned()),
            name: Some("ch1".to_owned()),
            namespace: Some("default".to_owned()),
            uid: Some("u-1".to_owned()),
            ..ObjectReference::default()
        }
    }

    #[test]
    fn a_different_note_is_a_different_event() {
        let first = Key::of(&event("Recovered", "re-placed on node-4"), &bundle());
        let second = Key::of(&event("Recovered", "re-placed on node-5"), &bundle());
        assert_ne!(first, second);
    }

    #[test]
    fn the_same_note_on_the_same_object_is_a_repeat() {
        let first = Key::of(&event("Recovered", "re-placed on node-4"), &bundle());
        assert_eq!(first, Key::of(&event("Recovered", "re-placed on node-4"), &bundle()));
        let mut other = bundle();
        other.uid = Some("u-2".to_owned());
        assert_ne!(first, Key::of(&event("Recovered", "re-placed on node-4"), &other));
    }
}
