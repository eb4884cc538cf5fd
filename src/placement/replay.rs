//! A placement decided again from an earlier search of the same request,
//! when only some nodes can have changed since.
//!
//! The indexed search can keep, besides the winner, the best survivors of
//! its deciding tier (its podium, see [`super::Rankings::keeping`]). Asked
//! the same request later, on a view where only the nodes `changed` may
//! differ (their jobs, their description, or they came or went), the
//! decision follows without a search:
//!
//! - an unchanged node ranks as it did against every other unchanged node,
//!   and one that did not survive still does not; so the first podium
//!   node not changed is the best unchanged survivor of the deciding tier,
//!   and no unchanged node of an earlier tier survives;
//! - each changed node is run through the filter chain and ranked afresh;
//! - an earlier tier that could not provision is asked again.
//!
//! The winner is the best of those in the earliest tier with a survivor.
//! Whenever that cannot be told (every podium node changed, an earlier tier
//! could now provision, a rule naming the only candidates), the answer is
//! "search": never a guess.

use crate::model::{PackingStrategy, PlacementTier};

use super::PlacementError;
use super::engine::{Outcome, candidates, provisioning};
use super::filter::check;
use super::fleet::{FleetView, NO_SLOT, NodeIdx};
use super::key::key;
use super::request::{Demand, PlacementRequest};
use super::search::{Best, winner_fill_limit};

/// What an earlier search of a request found in its deciding tier.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Podium {
    /// The deciding tier of the replica's pool.
    pub tier: usize,
    /// Its best survivors, best first (the first is the winner).
    pub nodes: Vec<NodeIdx>,
    /// `nodes` is every survivor the tier had.
    pub complete: bool,
    /// How full the winner may get, every other node as it is, and still
    /// win: `None` when that cannot be told (see
    /// `search::winner_fill_limit`). What lets the headroom tracker keep a
    /// `spread` decision when only the winner took a job since.
    pub winner_fill_limit: Option<f64>,
}

/// The placement of `request` on `view`, decided from `podium` (see the
/// module docs), with the podium it leaves (at most `keep` nodes);
/// `Ok(None)` when only a search can decide it.
pub(crate) fn replace(
    view: &FleetView,
    request: PlacementRequest<'_>,
    podium: &Podium,
    changed: &[NodeIdx],
    keep: usize,
) -> Result<Option<(Outcome, Podium)>, PlacementError> {
    let demand = Demand::compile(view, request)?;
    if candidates(&demand).is_some() || podium.nodes.is_empty() {
        return Ok(None);
    }
    let Some(pool) = view.pools().at(demand.pool) else {
        return Ok(None);
    };
    let Some(deciding) = pool.tiers.get(podium.tier) else {
        return Ok(None);
    };
    let fresh = fresh_survivors(view, &demand, changed, podium.tier, &pool.tiers);
    let earliest = fresh.iter().map(|(t, _)| *t).min().unwrap_or(podium.tier);
    // An earlier tier with no survivor is where a provision would come
    // from: asked again, as its node count may have changed.
    for t in 0..earliest {
        if provisioning(view, &demand, t, &pool.tiers[t]).is_ok() {
            return Ok(None);
        }
    }
    let (tier, mut ranked, complete) = if earliest < podium.tier {
        // No unchanged node of this tier survived before, nor does now.
        let ranked: Vec<Best> = fresh
            .into_iter()
            .filter(|(t, _)| *t == earliest)
            .map(|(_, b)| b)
            .collect();
        (earliest, ranked, true)
    } else {
        let Some(ranked) = podium_survivors(view, &demand, podium, changed, fresh, deciding.packing_strategy) else {
            return Ok(None);
        };
        (podium.tier, ranked, podium.complete)
    };
    ranked.sort_by_key(|b| b.key);
    let complete = complete && ranked.len() <= keep;
    ranked.truncate(keep.max(1));
    let Some(winner) = ranked.first().copied() else {
        return Ok(None);
    };
    let outcome = Outcome::Placed {
        node_id: view.node(winner.idx).id.clone(),
        pool: pool.name.clone(),
        tier: pool.tiers[tier].name.clone(),
        gpu_index: winner.gpu_index,
    };
    let podium = Podium {
        tier,
        nodes: ranked.iter().map(|b| b.idx).collect(),
        complete,
        winner_fill_limit: winner_fill_limit(&ranked, complete),
    };
    Ok(Some((outcome, podium)))
}

/// The changed nodes of the request's pool that survive now, in the
/// deciding tier `upto` or before, each with its tier.
fn fresh_survivors(
    view: &FleetView,
    demand: &Demand<'_>,
    changed: &[NodeIdx],
    upto: usize,
    tiers: &[PlacementTier],
) -> Vec<(usize, Best)> {
    let packing = |t: usize| tiers.get(t).map_or(PackingStrategy::Binpack, |t| t.packing_strategy);
    let mut fresh: Vec<(usize, Best)> = Vec::new();
    for &idx in changed {
        let slot = view.hot(idx).slot;
        if slot == NO_SLOT || (slot >> 16) as usize != demand.pool {
            continue;
        }
        let t = (slot & 0xffff) as usize;
        if t > upto || fresh.iter().any(|(_, b)| b.idx == idx) {
            continue;
        }
        if let Ok(gpu_index) = check(view, idx, demand, t) {
            let key = key(view, idx, demand, packing(t));
            fresh.push((t, Best { key, idx, gpu_index }));
        }
    }
    fresh
}

/// The survivors of the deciding tier, unranked: the podium's unchanged
/// nodes, ranked afresh, and the `fresh` ones of the tier that rank where
/// the podium can tell. `None` when only a search can tell: an unchanged
/// node no longer passes, or none is left.
fn podium_survivors(
    view: &FleetView,
    demand: &Demand<'_>,
    podium: &Podium,
    changed: &[NodeIdx],
    fresh: Vec<(usize, Best)>,
    packing: PackingStrategy,
) -> Option<Vec<Best>> {
    let mut ranked = Vec::new();
    for &idx in podium.nodes.iter().filter(|i| !changed.contains(i)) {
        // Unchanged, so it passes as before; if not, something this does
        // not follow changed: search.
        let gpu_index = check(view, idx, demand, podium.tier).ok()?;
        let key = key(view, idx, demand, packing);
        ranked.push(Best { key, idx, gpu_index });
    }
    let bar = ranked.iter().map(|b| b.key).max()?;
    // Past the last unchanged node the podium held, a changed node would
    // rank among survivors it never recorded.
    ranked.extend(
        fresh
            .into_iter()
            .filter(|(t, b)| *t == podium.tier && (podium.complete || b.key < bar))
            .map(|(_, b)| b),
    );
    Some(ranked)
}
