//! `PlacementPool` and `HotSparePolicy` documents: the core's pools and
//! hot-spare list, handed over live as whole sets.

use std::collections::{BTreeMap, BTreeSet};

use super::Applier;
use crate::automanager::{CommandError, QueryError};
use crate::cli::documents::{FieldPath, Segment};
use crate::cli::standalone::follow::Files;
use crate::crd;
use crate::decide::bundle::INVALID_BUNDLE;
use crate::decide::hot_spare::wanted_specs;
use crate::decide::pool::valid_pools;
use crate::model::{self, HotSpareSpec};

/// The pools and policies wanted, as the core takes them: each pool that
/// validates alone (sorted by name), the others with why they are left
/// out; and the policies naming one of those pools (sorted by pool).
pub fn wanted_settings(files: &Files) -> (Vec<model::PlacementPool>, BTreeMap<String, String>, Vec<HotSpareSpec>) {
    let documents = files
        .each::<crd::PlacementPool>()
        .map(|(wanted, pool)| (pool.to_model(), wanted));
    let (valid, left_out) = valid_pools(documents, |wanted, e| {
        let problems: Vec<String> = e
            .errors
            .iter()
            .map(|issue| wanted.problem(document_path(&issue.path), &issue.message).to_string())
            .collect();
        problems.join("; ")
    });
    let known: BTreeSet<&str> = valid.iter().map(|p| p.name.as_str()).collect();
    let policies = files.each::<crd::HotSparePolicy>().map(|(_, policy)| &policy.spec.0);
    let spares = wanted_specs(policies, |pool| known.contains(pool));
    (valid, left_out, spares)
}

/// A settings issue's path (`placementPools[0].tiers[1].name`,
/// `hotSpares[0].spec`) in its document: the entry's fields are the
/// resource's `spec`, a pool's name its `metadata.name`.
fn document_path(issue_path: &str) -> FieldPath {
    let path = FieldPath::parse(issue_path);
    let rest = match path.0.as_slice() {
        [Segment::Key(_), Segment::Index(_), rest @ ..] => rest,
        other => other,
    };
    match rest {
        [Segment::Key(name)] if name == "name" => FieldPath::of(&["metadata", "name"]),
        rest => FieldPath(rest.to_vec()).under(&FieldPath::of(&["spec"])),
    }
}

impl Applier {
    pub(super) async fn apply_settings(&mut self, files: &Files) -> Result<(), QueryError> {
        let (pools, left_out, spares) = wanted_settings(files);
        self.report_left_out(left_out);
        let (in_force, mut live) = self
            .core
            .read(|core| {
                (
                    core.settings().placement_pools.clone(),
                    core.settings().hot_spares.clone(),
                )
            })
            .await?;
        if pools != in_force {
            self.pools.refused = match self.core.set_placement_pools(pools).await {
                Ok(()) => {
                    // A bundle refused for naming an unknown pool is tried
                    // again once the pools change.
                    for record in self.bundles.values_mut() {
                        record.refused.take_if(|r| r.reason == INVALID_BUNDLE);
                    }
                    None
                }
                Err(CommandError::Closed) => return Err(QueryError::Closed),
                Err(CommandError::InvalidSettings { errors }) => {
                    Some(errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
                }
                Err(e) => Some(e.to_string()),
            };
            let message = self
                .pools
                .refused
                .as_ref()
                .map(|why| format!("the PlacementPools were refused as a set, the pools in force stay: {why}"));
            self.report("PlacementPools", message, "in force");
        }
        let known: BTreeSet<String> = self
            .core
            .read(|core| core.settings().placement_pools.iter().map(|p| p.name.clone()).collect())
            .await?;
        for (wanted, policy) in files.each::<crd::HotSparePolicy>() {
            let pool = &policy.spec.0.pool;
            let waiting = (!known.contains(pool)).then(|| {
                format!(
                    "{}: {}",
                    wanted.origin(),
                    wanted.problem(
                        FieldPath::of(&["spec", "pool"]),
                        format!("pool {pool:?} is not a PlacementPool in force; the policy waits for it")
                    )
                )
            });
            self.report(&wanted.resource.key().to_string(), waiting, "its pool is in force");
        }
        let spares: Vec<HotSpareSpec> = spares.into_iter().filter(|s| known.contains(&s.pool)).collect();
        live.sort_by(|a, b| a.pool.cmp(&b.pool));
        if spares != live {
            self.spares_refused = match self.core.update_hot_spare_specs(spares).await {
                Ok(_) => None,
                Err(CommandError::Closed) => return Err(QueryError::Closed),
                Err(e) => Some(e.to_string()),
            };
            let message = self
                .spares_refused
                .as_ref()
                .map(|why| format!("the HotSparePolicies were refused as a list, the specs in force stay: {why}"));
            self.report("HotSparePolicies", message, "in force");
        }
        Ok(())
    }
}
