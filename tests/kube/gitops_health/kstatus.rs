//! A kstatus reader: the rules sigs.k8s.io/cli-utils (`pkg/kstatus`) documents for custom
//! resources, which GitOps tools (Flux, `kpt live status`, `kubectl wait`-style waiters)
//! use to tell whether an applied resource has settled.
//!
//! In order:
//! 1. `metadata.deletionTimestamp` set: Terminating.
//! 2. `status.observedGeneration` (else, for kinds without one, the `Ready` condition's
//!    `observedGeneration`) below `metadata.generation`: InProgress — the status describes
//!    an older spec.
//! 3. `Reconciling` True: InProgress. `Stalled` True: Failed (abnormal-true conditions).
//! 4. `Ready` present: True is Current, anything else InProgress (the readiness rule Flux
//!    layers on kstatus).
//! 5. No status yet: InProgress (a custom resource nobody has reconciled has not settled).

use serde_json::Value;

/// What a kstatus reader concludes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Settled: the spec is realised.
    Current,
    /// Still converging.
    InProgress,
    /// Cannot converge without a change.
    Failed,
    /// Being deleted.
    Terminating,
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
}

fn holds(object: &Value, type_: &str) -> bool {
    condition(object, type_)
        .and_then(|c| c.get("status"))
        .and_then(Value::as_str)
        == Some("True")
}

/// The kstatus verdict on `object` (a resource as JSON).
pub fn compute(object: &Value) -> Status {
    if object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
    {
        return Status::Terminating;
    }
    let generation = object.pointer("/metadata/generation").and_then(Value::as_i64);
    let observed = object
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64)
        .or_else(|| condition(object, "Ready")?.get("observedGeneration")?.as_i64());
    if let (Some(generation), Some(observed)) = (generation, observed)
        && observed < generation
    {
        return Status::InProgress;
    }
    if holds(object, "Reconciling") {
        return Status::InProgress;
    }
    if holds(object, "Stalled") {
        return Status::Failed;
    }
    match condition(object, "Ready") {
        Some(_) if holds(object, "Ready") => Status::Current,
        _ => Status::InProgress,
    }
}
