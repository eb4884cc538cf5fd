//! Writing `status` with server-side apply: one field manager per
//! controller, so each owns exactly the fields it writes, and the caller
//! only calls this when the computed status differs from the stored one.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ReconcileError;
use crate::telemetry::{ControllerLabels, OperatorMetrics};

/// The field manager of `controller`'s status writes.
pub fn field_manager(controller: &str) -> String {
    format!("{}/{controller}", super::OPERATOR_NAME)
}

/// Applies `status` to `name` as `controller`'s field manager (forcing: the
/// controller is the only writer of its status fields).
pub async fn apply<K>(
    api: &Api<K>,
    name: &str,
    controller: &str,
    status: &impl Serialize,
    metrics: &OperatorMetrics,
) -> Result<(), ReconcileError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    let params = PatchParams::apply(&field_manager(controller)).force();
    api.patch_status(name, &params, &Patch::Apply(&patch))
        .await
        .map_err(|source| ReconcileError::WriteStatus {
            object: name.to_owned(),
            source,
        })?;
    metrics
        .status_writes
        .get_or_create(&ControllerLabels {
            controller: controller.to_owned(),
        })
        .inc();
    Ok(())
}

/// Whether `next` says something `previous` does not: any field, or a
/// condition's status, reason, message or generation (transition times
/// aside, which `conditions::merge` keeps anyway).
pub fn differs<S: Clone + PartialEq>(
    previous: &S,
    next: &S,
    conditions: impl Fn(&mut S) -> &mut Vec<Condition>,
) -> bool {
    let (mut a, mut b) = (previous.clone(), next.clone());
    let (ca, cb) = (std::mem::take(conditions(&mut a)), std::mem::take(conditions(&mut b)));
    !super::conditions::same(&ca, &cb) || a != b
}
