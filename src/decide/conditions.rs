//! `metav1.Condition` bookkeeping shared by every kind and front end: conditions are
//! computed afresh from what the core reports, then merged with the ones
//! already on the resource so `lastTransitionTime` only moves when a
//! condition's status does. A status is written only when it differs from
//! what the resource holds, ignoring those timestamps.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// The root condition every kind carries (kstatus reads it).
pub const READY: &str = "Ready";
/// kstatus: the controller cannot make progress without a change.
pub const STALLED: &str = "Stalled";
/// kstatus: the controller is still working towards Ready.
pub const RECONCILING: &str = "Reconciling";

/// A condition as computed now (no timestamp yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The condition type (`Ready`, `Placed`, ...).
    pub type_: &'static str,
    /// True or false.
    pub status: bool,
    /// Nobody can tell yet (`status: Unknown`); `status` is then false.
    pub unknown: bool,
    /// A CamelCase reason.
    pub reason: String,
    /// What a person reads.
    pub message: String,
}

impl Observed {
    /// A condition that holds.
    pub fn yes(type_: &'static str, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: true,
            unknown: false,
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// A condition that does not hold.
    pub fn no(type_: &'static str, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: false,
            unknown: false,
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// A condition nobody can tell yet (`Unknown`).
    pub fn unknown(type_: &'static str, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            unknown: true,
            ..Self::no(type_, reason, message)
        }
    }

    /// The condition's `status` as the API writes it.
    pub fn status_name(&self) -> &'static str {
        match (self.unknown, self.status) {
            (true, _) => "Unknown",
            (false, true) => "True",
            (false, false) => "False",
        }
    }
}

/// `observed` plus `Reconciling`, which kstatus readers (Flux, cli-utils)
/// need to tell work in progress from a settled state: true while `Ready`
/// is false and nothing says the object is stuck (`Stalled`, or one of
/// `terminal`, such as a Bundle's `Broken`), with `Ready`'s reason and
/// message; absent otherwise.
pub fn with_reconciling(mut observed: Vec<Observed>, terminal: &[&str]) -> Vec<Observed> {
    let holds = |type_: &str| observed.iter().any(|o| o.type_ == type_ && o.status);
    let stuck = holds(STALLED) || terminal.iter().any(|t| holds(t));
    let waiting = observed.iter().find(|o| o.type_ == READY && !o.status).cloned();
    if let (Some(ready), false) = (waiting, stuck) {
        observed.push(Observed::yes(RECONCILING, ready.reason, ready.message));
    }
    observed
}

/// The conditions to write: each observed one, keeping the transition time
/// of the previous condition of its type when its status did not change.
pub fn merge(previous: &[Condition], observed: Vec<Observed>, generation: Option<i64>) -> Vec<Condition> {
    let now = Time(Timestamp::now());
    observed
        .into_iter()
        .map(|o| {
            let status = o.status_name().to_owned();
            let last_transition_time = previous
                .iter()
                .find(|c| c.type_ == o.type_ && c.status == status)
                .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
            Condition {
                type_: o.type_.to_owned(),
                status,
                reason: o.reason,
                // The API server requires a message field; an empty one is fine.
                message: o.message,
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
}

/// Whether two condition lists say the same (timestamps aside).
pub fn same(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.type_ == y.type_
                && x.status == y.status
                && x.reason == y.reason
                && x.message == y.message
                && x.observed_generation == y.observed_generation
        })
}

/// The condition of `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn old(type_: &str, status: &str, at: i64) -> Condition {
        Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: "Before".to_owned(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::from_second(at).unwrap()),
        }
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let previous = [old(READY, "True", 100), old("Placed", "True", 200)];
        let merged = merge(
            &previous,
            vec![
                Observed::yes(READY, "Running", "all jobs running"),
                Observed::no("Placed", "AwaitingCapacity", "no tier could place"),
            ],
            Some(2),
        );
        assert_eq!(merged[0].last_transition_time, previous[0].last_transition_time);
        assert_ne!(merged[1].last_transition_time, previous[1].last_transition_time);
        assert_eq!(merged[1].observed_generation, Some(2));
    }

    #[test]
    fn an_unknown_condition_is_written_unknown_and_its_time_moves_when_it_becomes_known() {
        let previous = [old("Resilient", "Unknown", 100)];
        let unknown = merge(
            &previous,
            vec![Observed::unknown("Resilient", "HeadroomNotComputed", "")],
            Some(1),
        );
        assert_eq!(unknown[0].status, "Unknown");
        assert_eq!(unknown[0].last_transition_time, previous[0].last_transition_time);
        let known = merge(&previous, vec![Observed::yes("Resilient", "LossAbsorbed", "")], Some(1));
        assert_eq!(known[0].status, "True");
        assert_ne!(known[0].last_transition_time, previous[0].last_transition_time);
    }

    #[test]
    fn same_ignores_timestamps_but_not_reasons() {
        let a = [old(READY, "True", 1)];
        let b = [old(READY, "True", 2)];
        assert!(same(&a, &b));
        let mut c = b.clone();
        c[0].reason = "After".to_owned();
        assert!(!same(&a, &c));
    }

    #[test]
    fn reconciling_while_ready_is_false_and_nothing_is_stuck() {
        let types = |observed: Vec<Observed>| -> Vec<(&'static str, bool)> {
            observed.into_iter().map(|o| (o.type_, o.status)).collect()
        };
        let placing = with_reconciling(vec![Observed::no(READY, "Placing", "0 of 1 jobs placed")], &[]);
        assert_eq!(types(placing.clone()), [(READY, false), (RECONCILING, true)]);
        assert_eq!(placing[1].reason, "Placing");
        let ready = with_reconciling(vec![Observed::yes(READY, "Running", "")], &[]);
        assert_eq!(types(ready), [(READY, true)]);
        let stalled = with_reconciling(
            vec![
                Observed::no(READY, "Refused", "why"),
                Observed::yes(STALLED, "Refused", "why"),
            ],
            &[],
        );
        assert_eq!(types(stalled), [(READY, false), (STALLED, true)]);
        let broken = with_reconciling(
            vec![
                Observed::no(READY, "Broken", "why"),
                Observed::yes("Broken", "BundleBroken", "why"),
            ],
            &["Broken"],
        );
        assert_eq!(types(broken), [(READY, false), ("Broken", true)]);
    }
}
