//! What a `PlacementPool`'s status says: nodes per tier, prospective
//! nodes, used capacity, live spares and headroom, from the core's read
//! model (the computation the pool gauges come from), and its conditions —
//! `Stalled` with why it was left out or refused, `Ready` once the core
//! places with it. The operator's controller and `standalone` both show it.

use std::collections::BTreeMap;

use crate::automanager::ReadModel;
use crate::crd::{DomainHeadroomStatus, PlacementPoolStatus, TierStatus, WorstDomainStatus};
use crate::model::PlacementPool;
use crate::placement::headroom::PoolHeadroom;
use crate::placement::{SettingsValidationError, validate_pools};

use super::conditions::{Observed, READY, STALLED};

/// A pool's conditions: `Stalled` with why it was left out or refused
/// (`refused`), else `Ready` once the core places with it.
pub fn pool_conditions(refused: Option<&String>, in_force: bool) -> Vec<Observed> {
    match (refused, in_force) {
        (Some(why), _) => vec![
            Observed::no(READY, "InvalidPool", why.clone()),
            Observed::yes(STALLED, "InvalidPool", why.clone()),
        ],
        (None, true) => vec![
            Observed::yes(READY, "InForce", "the core places with this pool"),
            Observed::no(STALLED, "InForce", ""),
        ],
        (None, false) => vec![
            Observed::no(READY, "Pending", "not yet handed to the core"),
            Observed::no(STALLED, "Pending", ""),
        ],
    }
}

/// The pools a front end hands the core, from the documents it holds
/// (each a pool and where it came from): every pool that validates alone,
/// sorted by name, and per pool name left out, why — in the words
/// `describe` gives the validation's issues (the operator quotes them,
/// `standalone` points at the document's fields). One bad pool never
/// blocks the others: what the whole set fails on is the core's to say.
pub fn valid_pools<D>(
    documents: impl IntoIterator<Item = (PlacementPool, D)>,
    describe: impl Fn(&D, &SettingsValidationError) -> String,
) -> (Vec<PlacementPool>, BTreeMap<String, String>) {
    let mut valid = Vec::new();
    let mut left_out = BTreeMap::new();
    for (pool, document) in documents {
        match validate_pools(vec![pool.clone()]) {
            Ok(_) => valid.push(pool),
            Err(e) => {
                left_out.insert(pool.name.clone(), describe(&document, &e));
            }
        }
    }
    valid.sort_by(|a, b| a.name.cmp(&b.name));
    (valid, left_out)
}

fn fraction(value: f64) -> f64 {
    // Three decimals: finer is noise, and every change would be a write.
    (value * 1000.0).round() / 1000.0
}

/// A pool's status from the core's usage of it (conditions left to the
/// caller): the computation the pool gauges come from.
pub fn observe_pool(core: ReadModel<'_>, pool: &str, tier_names: &[String]) -> PlacementPoolStatus {
    let usage = core.pool_usage(pool, tier_names);
    PlacementPoolStatus {
        nodes: usage.gauge.node_count,
        used_capacity_fraction: fraction(usage.gauge.used_capacity_fraction),
        live_spares: usage.gauge.live_spares,
        tiers: usage
            .tiers
            .into_iter()
            .map(|t| TierStatus {
                name: t.name,
                nodes: t.nodes,
                prospective_nodes: t.prospective_nodes,
                used_capacity_fraction: fraction(t.used_capacity_fraction),
            })
            .collect(),
        headroom: core
            .headroom()
            .and_then(|report| report.pool(pool))
            .map(headroom_status)
            .unwrap_or_default(),
        ..PlacementPoolStatus::default()
    }
}

/// A pool's headroom as its status shows it, per kind of failure domain.
pub fn headroom_status(pool: &PoolHeadroom) -> Vec<DomainHeadroomStatus> {
    pool.kinds
        .iter()
        .map(|kind| DomainHeadroomStatus {
            kind: kind.kind.as_str().to_owned(),
            domains: kind.domains,
            absorbed: kind.absorbed,
            survives: kind.survives,
            worst: kind.worst.as_ref().map(|w| WorstDomainStatus {
                name: w.name.clone(),
                dark_bundles: w.dark_bundles,
                unplaced_jobs: w.unplaced_jobs,
                why: w.why.clone(),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::fixture::{ONE_JOB, TestCore, said};
    use crate::placement::headroom::{DomainKind, KindSummary, WorstDomain};

    #[test]
    fn a_pool_left_out_stalls_with_why_and_one_in_force_is_ready() {
        let why = "tier cluster: maxNodes must be at least 1".to_owned();
        assert_eq!(
            said(&pool_conditions(Some(&why), true)),
            [
                (READY, "False", "InvalidPool", why.as_str()),
                (STALLED, "True", "InvalidPool", why.as_str()),
            ]
        );
        assert_eq!(
            said(&pool_conditions(None, true)),
            [
                (READY, "True", "InForce", "the core places with this pool"),
                (STALLED, "False", "InForce", ""),
            ]
        );
        assert_eq!(
            said(&pool_conditions(None, false)),
            [
                (READY, "False", "Pending", "not yet handed to the core"),
                (STALLED, "False", "Pending", ""),
            ]
        );
    }

    #[test]
    fn a_pools_status_counts_its_nodes_per_tier_and_the_capacity_its_jobs_use() {
        let mut test = TestCore::hydrated(&[("a", 4.0), ("b", 4.0)]);
        test.bundle("ns/ch1", ONE_JOB);
        let status = observe_pool(test.read(), "production", &["cluster".to_owned()]);
        assert_eq!((status.nodes, status.live_spares), (2, 0));
        // Half a vCPU of eight, to three decimals.
        assert_eq!(status.used_capacity_fraction, 0.063);
        assert_eq!(
            status.tiers,
            [TierStatus {
                name: "cluster".to_owned(),
                nodes: 2,
                prospective_nodes: 0,
                used_capacity_fraction: 0.063,
            }]
        );
        // Headroom is off by default: nothing said.
        assert!(status.headroom.is_empty());
        assert!(status.conditions.is_empty());
    }

    #[test]
    fn headroom_is_shown_per_kind_of_failure_domain_with_the_worst_and_why() {
        let pool = PoolHeadroom {
            pool: "production".to_owned(),
            kinds: vec![KindSummary {
                kind: DomainKind::Zone,
                domains: 3,
                absorbed: 2,
                survives: false,
                worst: Some(WorstDomain {
                    name: "az1".to_owned(),
                    dark_bundles: 1,
                    unplaced_jobs: 2,
                    why: "no capacity in any tier".to_owned(),
                }),
            }],
        };
        let shown = headroom_status(&pool);
        assert_eq!(shown.len(), 1);
        let zone = &shown[0];
        assert_eq!(
            (zone.kind.as_str(), zone.domains, zone.absorbed, zone.survives),
            ("zone", 3, 2, false)
        );
        let worst = zone.worst.as_ref().expect("the worst zone");
        assert_eq!(
            (
                worst.name.as_str(),
                worst.dark_bundles,
                worst.unplaced_jobs,
                worst.why.as_str()
            ),
            ("az1", 1, 2, "no capacity in any tier")
        );
    }
}
