//! The verdicts summed up: per domain kind, for the fleet and for each
//! pool, "survives the loss of any single one: yes / no", with the worst
//! domain and why.

use serde::Serialize;

use super::{DomainKind, DomainVerdict};

/// Every domain's verdict and what they add up to.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeadroomReport {
    /// Per kind, over the whole fleet.
    pub fleet: Vec<KindSummary>,
    /// Per pool: the same over the part of each loss that falls on the
    /// pool's nodes.
    pub pools: Vec<PoolHeadroom>,
    /// Every domain analysed, by kind then name.
    pub domains: Vec<DomainVerdict>,
}

/// One kind of domain, summed up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindSummary {
    pub kind: DomainKind,
    /// Domains of the kind analysed.
    pub domains: u32,
    /// Of those, losses absorbed.
    pub absorbed: u32,
    /// The loss of any single domain of the kind is absorbed.
    pub survives: bool,
    /// The worst loss, when one is not absorbed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst: Option<WorstDomain>,
}

/// The loss that does the most harm.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorstDomain {
    /// The domain's name.
    pub name: String,
    /// Bundles it takes off the air.
    pub dark_bundles: u32,
    /// Lost jobs not placed again.
    pub unplaced_jobs: u32,
    /// Why, in words.
    pub why: String,
}

/// One pool's headroom.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolHeadroom {
    pub pool: String,
    /// Per kind.
    pub kinds: Vec<KindSummary>,
}

impl HeadroomReport {
    /// Sums up `domains` for the fleet and for each of `pools`.
    pub fn of(mut domains: Vec<DomainVerdict>, pools: &[String]) -> Self {
        domains.sort_by(|a, b| a.domain.cmp(&b.domain));
        let fleet = summarise(domains.iter().cloned());
        let pools = pools
            .iter()
            .map(|pool| PoolHeadroom {
                pool: pool.clone(),
                kinds: summarise(domains.iter().filter_map(|d| d.within_pool(pool))),
            })
            .collect();
        HeadroomReport { fleet, pools, domains }
    }

    /// The fleet's summary for `kind`.
    pub fn fleet_kind(&self, kind: DomainKind) -> Option<&KindSummary> {
        self.fleet.iter().find(|k| k.kind == kind)
    }

    /// A pool's headroom.
    pub fn pool(&self, pool: &str) -> Option<&PoolHeadroom> {
        self.pools.iter().find(|p| p.pool == pool)
    }

    /// The verdict on one node's loss.
    pub fn node(&self, node: &str) -> Option<&DomainVerdict> {
        self.domains
            .iter()
            .find(|d| d.domain.kind == DomainKind::Node && d.domain.name == node)
    }
}

fn summarise(domains: impl Iterator<Item = DomainVerdict>) -> Vec<KindSummary> {
    let mut kinds: Vec<KindSummary> = Vec::new();
    let mut worst: Vec<Option<(usize, usize, String, String)>> = Vec::new();
    for verdict in domains {
        let at = match kinds.iter().position(|k| k.kind == verdict.domain.kind) {
            Some(at) => at,
            None => {
                kinds.push(KindSummary {
                    kind: verdict.domain.kind,
                    domains: 0,
                    absorbed: 0,
                    survives: true,
                    worst: None,
                });
                worst.push(None);
                kinds.len() - 1
            }
        };
        let kind = &mut kinds[at];
        kind.domains += 1;
        if verdict.absorbed {
            kind.absorbed += 1;
            continue;
        }
        kind.survives = false;
        let harm = (verdict.dark_bundles(), verdict.unplaced_jobs());
        // More bundles dark first, then more jobs unplaced, then the first
        // name (domains come in name order, so ties keep the first).
        if worst[at].as_ref().is_none_or(|(b, j, _, _)| harm > (*b, *j)) {
            worst[at] = Some((
                harm.0,
                harm.1,
                verdict.domain.name.clone(),
                verdict.why().unwrap_or_default(),
            ));
        }
    }
    for (kind, worst) in kinds.iter_mut().zip(worst) {
        kind.worst = worst.map(|(dark, unplaced, name, why)| WorstDomain {
            name,
            dark_bundles: dark as u32,
            unplaced_jobs: unplaced as u32,
            why,
        });
    }
    kinds.sort_by_key(|k| k.kind);
    kinds
}
