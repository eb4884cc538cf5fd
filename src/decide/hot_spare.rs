//! What a `HotSparePolicy`'s status says, read from the core: its spare
//! counts and last underflow, `Ready` and `Applied` once its spec is the one
//! in force, `Stalled` when it names a pool the core does not run with. The
//! operator's controller and `standalone` both show it.

use k8s_openapi::jiff::Timestamp;

use crate::automanager::ReadModel;
use crate::crd::HotSparePolicyStatus;
use crate::model::HotSpareSpec;

use super::conditions::{Observed, READY, STALLED};

/// The policy's spec is the one the core reconciles spares with.
pub const APPLIED: &str = "Applied";

/// The specs handed to the core: those of the policies naming a pool
/// `known` says is there, sorted by pool (the order the core keeps them in).
pub fn wanted_specs<'a>(
    specs: impl IntoIterator<Item = &'a HotSpareSpec>,
    known: impl Fn(&str) -> bool,
) -> Vec<HotSpareSpec> {
    let mut wanted: Vec<HotSpareSpec> = specs.into_iter().filter(|s| known(&s.pool)).cloned().collect();
    wanted.sort_by(|a, b| a.pool.cmp(&b.pool));
    wanted
}

fn rfc3339(at_ms: i64) -> Option<String> {
    Timestamp::from_millisecond(at_ms).ok().map(|t| t.to_string())
}

/// A policy's status read from the core (conditions apart, without
/// timestamps): its spare counts and last underflow; `Ready` once its spec
/// is the one in force, `Stalled` when it names a pool the core does not
/// run with, and why the core refused the list (`refused`) otherwise.
pub fn observe_policy(
    core: ReadModel<'_>,
    spec: &HotSpareSpec,
    refused: Option<String>,
) -> (HotSparePolicyStatus, Vec<Observed>) {
    let pool = &spec.pool;
    let known = core.settings().placement_pools.iter().any(|p| &p.name == pool);
    let in_force = core.settings().hot_spares.iter().any(|s| s == spec);
    let spare_status = core.hot_spares().into_iter().find(|s| &s.pool == pool);
    let conditions = if !known {
        let why = format!("pool {pool:?} is not a PlacementPool in force; create it or fix spec.pool");
        vec![
            Observed::no(READY, "UnknownPool", why.clone()),
            Observed::yes(STALLED, "UnknownPool", why),
            Observed::no(APPLIED, "UnknownPool", ""),
        ]
    } else if in_force {
        vec![
            Observed::yes(READY, "InForce", format!("the core keeps spares for pool {pool}")),
            Observed::no(STALLED, "InForce", ""),
            Observed::yes(APPLIED, "InForce", ""),
        ]
    } else {
        let why = refused.unwrap_or_else(|| "not yet handed to the core".to_owned());
        vec![
            Observed::no(READY, "NotInForce", why.clone()),
            Observed::no(STALLED, "NotInForce", ""),
            Observed::no(APPLIED, "NotInForce", why),
        ]
    };
    let status = HotSparePolicyStatus {
        observed_generation: None,
        conditions: Vec::new(),
        live_spares: spare_status.as_ref().map_or(0, |s| s.live),
        provisioning_spares: spare_status.as_ref().map_or(0, |s| s.provisioning),
        consumed_spares: spare_status
            .as_ref()
            .map_or(0, |s| u32::try_from(s.consumed).unwrap_or(u32::MAX)),
        last_underflow: spare_status
            .as_ref()
            .and_then(|s| s.last_underflow_at)
            .and_then(rfc3339),
    };
    (status, conditions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::fixture::{TestCore, said, settings};
    use crate::model::SpareInstanceSpec;

    fn spec(pool: &str) -> HotSpareSpec {
        HotSpareSpec {
            pool: pool.to_owned(),
            target_count: 1,
            spec: SpareInstanceSpec {
                instance_type: "m5.xlarge".to_owned(),
                region: None,
            },
            ..HotSpareSpec::default()
        }
    }

    #[test]
    fn a_policy_naming_an_unknown_pool_stalls_and_says_how_to_fix_it() {
        let test = TestCore::hydrated(&[("a", 4.0)]);
        let (status, conditions) = observe_policy(test.read(), &spec("studio"), None);
        let why = "pool \"studio\" is not a PlacementPool in force; create it or fix spec.pool";
        assert_eq!(
            said(&conditions),
            [
                (READY, "False", "UnknownPool", why),
                (STALLED, "True", "UnknownPool", why),
                (APPLIED, "False", "UnknownPool", ""),
            ]
        );
        assert_eq!(
            (status.live_spares, status.provisioning_spares, status.consumed_spares),
            (0, 0, 0)
        );
        assert_eq!(status.last_underflow, None);
    }

    #[test]
    fn a_policy_not_yet_in_force_says_why_the_core_refused_it() {
        let test = TestCore::hydrated(&[("a", 4.0)]);
        let (_, waiting) = observe_policy(test.read(), &spec("production"), None);
        assert_eq!(
            said(&waiting),
            [
                (READY, "False", "NotInForce", "not yet handed to the core"),
                (STALLED, "False", "NotInForce", ""),
                (APPLIED, "False", "NotInForce", "not yet handed to the core"),
            ]
        );
        let refusal = "hotSpares[0].spec.instanceType: a hot spare needs an instance type".to_owned();
        let (_, refused) = observe_policy(test.read(), &spec("production"), Some(refusal.clone()));
        assert_eq!(refused[0].message, refusal);
        assert_eq!(refused[2].message, refusal);
    }

    #[test]
    fn a_policy_in_force_is_ready_and_applied() {
        let test = TestCore::hydrated_with(
            crate::automanager::AutoSettings {
                hot_spares: vec![spec("production")],
                ..settings()
            },
            &[("a", 4.0)],
        );
        let (status, conditions) = observe_policy(test.read(), &spec("production"), Some("stale".to_owned()));
        assert_eq!(
            said(&conditions),
            [
                (READY, "True", "InForce", "the core keeps spares for pool production"),
                (STALLED, "False", "InForce", ""),
                (APPLIED, "True", "InForce", ""),
            ]
        );
        assert_eq!((status.live_spares, status.consumed_spares), (0, 0));
    }

    #[test]
    fn an_underflow_is_shown_as_an_rfc3339_time() {
        assert_eq!(rfc3339(1_700_000_000_000).as_deref(), Some("2023-11-14T22:13:20Z"));
    }
}
