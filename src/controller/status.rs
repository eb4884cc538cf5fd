//! Writing `status`, the same way for every kind: the status a controller
//! knows an object holds, the next one merged with it (so a condition's
//! `lastTransitionTime` only moves when its status does), and a server-side
//! apply of the status subresource only when the two differ — one field
//! manager per controller, so each owns exactly the fields it writes — after
//! which the write is remembered. What a status says is computed elsewhere
//! (the `*_status` modules); this module never decides it.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use kube::core::object::HasStatus;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::crd::{
    BundleStatus, HotSparePolicyStatus, JobMigrationStatus, NodeDrainStatus, NorskNodeStatus, PlacementPoolStatus,
};
use crate::telemetry::ControllerLabels;

use super::Context;
use super::conditions::{self, Observed};
use super::error::WriteStatusError;

/// The field manager of `controller`'s writes.
pub fn field_manager(controller: &str) -> String {
    format!("{}/{controller}", super::OPERATOR_NAME)
}

/// A status the operator writes: fields computed from the core, and
/// conditions merged with the ones already written.
pub trait Status: Clone + Default + PartialEq + Serialize + DeserializeOwned {
    /// Its conditions.
    fn conditions(&self) -> &[Condition];
    /// Its conditions, to replace.
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
    /// Records the generation of the spec it was computed from, for kinds
    /// whose status says it (`observedGeneration`).
    fn observe_generation(&mut self, generation: Option<i64>);
}

macro_rules! status {
    ($($kind:ty),+ ; with observedGeneration) => {$(
        impl Status for $kind {
            fn conditions(&self) -> &[Condition] { &self.conditions }
            fn conditions_mut(&mut self) -> &mut Vec<Condition> { &mut self.conditions }
            fn observe_generation(&mut self, generation: Option<i64>) { self.observed_generation = generation; }
        }
    )+};
    ($($kind:ty),+) => {$(
        impl Status for $kind {
            fn conditions(&self) -> &[Condition] { &self.conditions }
            fn conditions_mut(&mut self) -> &mut Vec<Condition> { &mut self.conditions }
            fn observe_generation(&mut self, _: Option<i64>) {}
        }
    )+};
}

status!(BundleStatus, PlacementPoolStatus, HotSparePolicyStatus; with observedGeneration);
status!(NodeDrainStatus, JobMigrationStatus, NorskNodeStatus);

/// The status to write: `observed`'s fields, at `generation`, with
/// `conditions` merged into `previous`'s (a condition whose status did not
/// change keeps its transition time).
pub fn merged<S: Status>(previous: &S, mut observed: S, conditions: Vec<Observed>, generation: Option<i64>) -> S {
    observed.observe_generation(generation);
    *observed.conditions_mut() = conditions::merge(previous.conditions(), conditions, generation);
    observed
}

/// Whether `next` says something `previous` does not: any field, or a
/// condition's status, reason, message or generation (transition times
/// aside, which [`merged`] keeps anyway).
pub fn differs<S: Status>(previous: &S, next: &S) -> bool {
    let (mut a, mut b) = (previous.clone(), next.clone());
    let (ca, cb) = (std::mem::take(a.conditions_mut()), std::mem::take(b.conditions_mut()));
    !conditions::same(&ca, &cb) || a != b
}

/// When the status a controller last wrote stands for what an object holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recall {
    /// While the object in hand is still the version the write was computed
    /// from: the watch cache may not show the write yet, and every trigger
    /// arriving before it catches up would write the same status again.
    /// Once the object has moved on, it is read as it is.
    WhileUnchanged,
    /// Always: the object is read fresh, but its status also holds fields
    /// another field manager owns (a `NorskNode`'s `Cordoned`, written by
    /// the spec controller), which this controller's own status must not be
    /// compared against.
    Always,
}

/// The last status a controller wrote to an object, and the
/// resourceVersion of the object it was computed from.
struct Written {
    based_on: Option<String>,
    status: serde_json::Value,
}

/// What every controller wrote, by controller and object, for the term.
#[derive(Default)]
pub(super) struct Memory(Mutex<HashMap<String, Written>>);

impl Memory {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Written>> {
        // Entries are only ever replaced whole: a poisoned map is usable.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One controller's writer of one kind's status (`K`): see the module
/// documentation for the steps.
pub struct StatusWriter<'a, K> {
    ctx: &'a Context,
    api: Api<K>,
    controller: &'static str,
    recall: Recall,
}

impl<'a, K> StatusWriter<'a, K>
where
    K: Resource<DynamicType = ()> + HasStatus + Clone + DeserializeOwned + std::fmt::Debug,
    K::Status: Status,
{
    /// `controller`'s writer through `api` (scoped to the objects'
    /// namespace for a namespaced kind), recalling what it wrote
    /// [`Recall::WhileUnchanged`].
    pub fn new(ctx: &'a Context, api: Api<K>, controller: &'static str) -> Self {
        Self {
            ctx,
            api,
            controller,
            recall: Recall::WhileUnchanged,
        }
    }

    /// The same writer, recalling what it wrote as `recall` says.
    pub fn recalling(self, recall: Recall) -> Self {
        Self { recall, ..self }
    }

    fn key(&self, name: &str) -> String {
        match self.api.namespace() {
            Some(namespace) => format!("{}/{namespace}/{name}", self.controller),
            None => format!("{}/{name}", self.controller),
        }
    }

    /// The status `object` holds as far as this controller knows: what it
    /// last wrote there (see [`Recall`]), else the object's own.
    pub fn known(&self, object: &K) -> Option<K::Status> {
        self.known_as(&object.name_any(), Some(object))
    }

    /// The status the object `name` holds as far as this controller knows,
    /// `object` being what was read of it (none when it does not exist).
    pub fn known_as(&self, name: &str, object: Option<&K>) -> Option<K::Status> {
        let cached = object.and_then(|o| o.status().cloned());
        let version = object.and_then(|o| o.meta().resource_version.as_ref());
        let memory = self.ctx.written.lock();
        match memory.get(&self.key(name)) {
            Some(w) if self.recall == Recall::Always || w.based_on.as_ref() == version => {
                serde_json::from_value(w.status.clone()).ok()
            }
            _ => cached,
        }
    }

    /// Writes `next` to `object` unless it says what `previous` (the
    /// [`known`](Self::known) status) says. Whether it wrote.
    pub async fn write(&self, object: &K, previous: &K::Status, next: &K::Status) -> Result<bool, WriteStatusError> {
        if !differs(previous, next) {
            return Ok(false);
        }
        self.put(&object.name_any(), object.meta().resource_version.clone(), next)
            .await?;
        Ok(true)
    }

    /// Merges `observed` and `conditions` into `previous` (the
    /// [`known`](Self::known) status, see [`merged`]) and writes the result
    /// to `object` unless nothing of substance changed. Whether it wrote.
    pub async fn merge_and_write(
        &self,
        object: &K,
        previous: &K::Status,
        observed: K::Status,
        conditions: Vec<Observed>,
    ) -> Result<bool, WriteStatusError> {
        let next = merged(previous, observed, conditions, object.meta().generation);
        self.write(object, previous, &next).await
    }

    /// Writes `next` to the object `name`, computed from its version
    /// `based_on`, and remembers it.
    pub async fn put(&self, name: &str, based_on: Option<String>, next: &K::Status) -> Result<(), WriteStatusError> {
        self.apply(name, next).await?;
        if let Ok(status) = serde_json::to_value(next) {
            self.ctx
                .written
                .lock()
                .insert(self.key(name), Written { based_on, status });
        }
        Ok(())
    }

    /// Applies `status` (the whole status, or the part this controller
    /// owns) to the object `name` as this controller's field manager,
    /// forcing: the controller is the only writer of its status fields.
    pub async fn apply(&self, name: &str, status: &impl Serialize) -> Result<(), WriteStatusError> {
        let patch = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "status": status,
        });
        let params = PatchParams::apply(&field_manager(self.controller)).force();
        self.api
            .patch_status(name, &params, &Patch::Apply(&patch))
            .await
            .map_err(|source| WriteStatusError {
                kind: K::kind(&()).into_owned(),
                name: name.to_owned(),
                source,
            })?;
        self.ctx
            .metrics
            .status_writes
            .get_or_create(&ControllerLabels {
                controller: self.controller.to_owned(),
            })
            .inc();
        Ok(())
    }

    /// Forgets what was written to the object `name` (it is gone).
    pub fn forget(&self, name: &str) {
        self.ctx.written.lock().remove(&self.key(name));
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::controller::conditions::{READY, RECONCILING};
    use crate::model::DrainPhase;

    fn pool(nodes: u32, conditions: Vec<Condition>) -> PlacementPoolStatus {
        PlacementPoolStatus {
            nodes,
            conditions,
            ..PlacementPoolStatus::default()
        }
    }

    fn ready(reason: &str, since: i64) -> Condition {
        Condition {
            type_: READY.to_owned(),
            status: "True".to_owned(),
            reason: reason.to_owned(),
            message: String::new(),
            observed_generation: Some(3),
            last_transition_time: Time(Timestamp::from_second(since).expect("a time")),
        }
    }

    #[test]
    fn merged_records_the_generation_and_keeps_an_unchanged_conditions_transition_time() {
        let previous = pool(1, vec![ready("InForce", 100)]);
        let next = merged(
            &previous,
            pool(2, Vec::new()),
            vec![
                Observed::yes(READY, "InForce", ""),
                Observed::yes(RECONCILING, "Placing", "0 of 1"),
            ],
            Some(4),
        );
        assert_eq!(next.nodes, 2);
        assert_eq!(next.observed_generation, Some(4));
        let types: Vec<_> = next.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, [READY, RECONCILING]);
        assert_eq!(next.conditions[0].observed_generation, Some(4));
        assert_eq!(
            next.conditions[0].last_transition_time,
            previous.conditions[0].last_transition_time
        );
    }

    #[test]
    fn a_kind_without_observed_generation_stamps_it_on_its_conditions_only() {
        let next = merged(
            &NodeDrainStatus::default(),
            NodeDrainStatus {
                phase: Some(DrainPhase::Migrating),
                ..NodeDrainStatus::default()
            },
            vec![Observed::no(READY, "Migrating", "the drain is migrating")],
            Some(2),
        );
        assert_eq!(next.phase, Some(DrainPhase::Migrating));
        assert_eq!(next.conditions[0].status, "False");
        assert_eq!(next.conditions[0].observed_generation, Some(2));
    }

    #[test]
    fn only_a_change_of_substance_differs() {
        let before = pool(1, vec![ready("InForce", 100)]);
        // A transition time alone is no change worth a write.
        assert!(!differs(&before, &pool(1, vec![ready("InForce", 200)])));
        assert!(differs(&before, &pool(2, vec![ready("InForce", 100)])));
        assert!(differs(&before, &pool(1, vec![ready("Pending", 100)])));
        assert!(differs(&before, &pool(1, Vec::new())));
    }

    #[test]
    fn field_managers_are_named_after_the_operator_and_the_controller() {
        assert_eq!(field_manager("bundle"), "norsk-auto-manager/bundle");
    }
}
