//! The status to write for every kind, as data: the fields computed from the
//! core, at the spec's generation, with conditions merged into the ones the
//! resource already holds (so a condition's `lastTransitionTime` only moves
//! when its status does), and whether it says anything the previous one does
//! not. Writing it is the front end's business (`controller::status` in the
//! operator, the state file in `standalone`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::crd::{
    BundleStatus, HotSparePolicyStatus, JobMigrationStatus, NodeDrainStatus, NorskNodeStatus, PlacementPoolStatus,
};

use super::conditions::{self, Observed};

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

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::decide::conditions::{READY, RECONCILING};
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
}
