//! Writing `status`, the same way for every kind: the status a controller
//! knows an object holds, the next one merged with it (so a condition's
//! `lastTransitionTime` only moves when its status does), and a server-side
//! apply of the status subresource only when the two differ — one field
//! manager per controller, so each owns exactly the fields it writes — after
//! which the write is remembered. What a status says is computed elsewhere
//! (the `*_status` modules); this module never decides it.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use kube::api::{Patch, PatchParams};
use kube::core::object::HasStatus;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::decide::conditions::Observed;
use crate::decide::status::{Status, differs, merged};
use crate::telemetry::ControllerLabels;

use super::Context;
use super::error::WriteStatusError;

/// The field manager of `controller`'s writes.
pub fn field_manager(controller: &str) -> String {
    format!("{}/{controller}", crate::decide::OPERATOR_NAME)
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
    use super::*;

    #[test]
    fn field_managers_are_named_after_the_operator_and_the_controller() {
        assert_eq!(field_manager("bundle"), "norsk-auto-manager/bundle");
    }
}
