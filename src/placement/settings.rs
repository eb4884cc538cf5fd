//! Settings validation for placement pools, their tiers and hot spares.
//!
//! Owns the checks `AutoManager.run` makes up front and the `Pools` value
//! that only a successful validation produces: the engine never sees a pool
//! list with duplicate names or two fixed tiers. Every problem is listed at
//! once (the seed's `AutoSettingsValidationError`), never only the first.

use std::collections::{HashMap, HashSet};
use std::fmt;

use serde::Serialize;

use crate::model::{HotSpareSpec, PlacementPool, ProviderKind, ScaleOut};

/// A settings problem's stable code (the seed's names, camelCase).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SettingsErrorCode {
    /// A pool has an empty name.
    EmptyPoolName,
    /// Two pools share a name.
    DuplicatePoolName,
    /// A pool lists no tiers.
    NoTiers,
    /// A tier has an empty name.
    EmptyTierName,
    /// Two tiers of one pool share a name (provisioned nodes are tagged with
    /// it, so it must be unique).
    DuplicateTier,
    /// More than one `fixed` tier in a pool ("at most one such tier per
    /// pool": untagged cluster nodes must belong to exactly one).
    MultipleFixedTiers,
    /// An elastic tier has no `candidateInstanceTypes` to provision from.
    NoCandidateInstanceTypes,
    /// A candidate shape has no name, or a capacity that is not a positive
    /// number.
    InvalidInstanceShape,
    /// `rootVolume` on a tier that is not `aws` ("aws only").
    RootVolumeNotAws,
    /// `hotSpares[].pool` names no configured pool.
    UnknownPool,
    /// Two `hotSpares` entries for one pool (the pool is the key).
    DuplicateHotSparePool,
    /// A hot-spare entry without an instance type.
    EmptySpareInstanceType,
}

/// One settings problem: its code, where it is, and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SettingsIssue {
    /// The stable code.
    pub code: SettingsErrorCode,
    /// Where, e.g. `placementPools[0].tiers[1].name`.
    pub path: String,
    /// What is wrong, in words a person can act on.
    pub message: String,
}

impl fmt::Display for SettingsIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({:?})", self.path, self.message, self.code)
    }
}

/// Settings were refused; every problem found is listed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid placement settings: {}", list(.errors))]
pub struct SettingsValidationError {
    /// Every problem, in the order the settings list them.
    pub errors: Vec<SettingsIssue>,
}

fn list(errors: &[SettingsIssue]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// A validated pool list, indexed by name. Only [`validate_pools`] and
/// [`validate_settings`] build one, so every holder may rely on unique pool
/// and tier names and at most one fixed tier per pool.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pools {
    pools: Vec<PlacementPool>,
    by_name: HashMap<String, usize>,
}

impl Pools {
    /// The pool named `name`.
    pub fn get(&self, name: &str) -> Option<&PlacementPool> {
        self.index_of(name).map(|i| &self.pools[i])
    }

    /// The position of the pool named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The pool at `index` (as [`Pools::index_of`] returned).
    pub fn at(&self, index: usize) -> Option<&PlacementPool> {
        self.pools.get(index)
    }

    /// Every pool, in settings order.
    pub fn iter(&self) -> impl Iterator<Item = &PlacementPool> {
        self.pools.iter()
    }

    /// Checks a `hotSpares` list against these pools: one entry per pool,
    /// every pool known. Used at start and by `updateHotSpareSpecs`, which
    /// rejects the list whole.
    pub fn validate_hot_spares(&self, hot_spares: &[HotSpareSpec]) -> Result<(), SettingsValidationError> {
        let mut errors = Vec::new();
        self.check_hot_spares(hot_spares, &mut errors);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(SettingsValidationError { errors })
        }
    }

    fn check_hot_spares(&self, hot_spares: &[HotSpareSpec], errors: &mut Vec<SettingsIssue>) {
        let mut seen = HashSet::new();
        for (i, entry) in hot_spares.iter().enumerate() {
            let path = format!("hotSpares[{i}]");
            if self.get(&entry.pool).is_none() {
                errors.push(issue(
                    SettingsErrorCode::UnknownPool,
                    format!("{path}.pool"),
                    format!("hot spares name pool {:?}, which is not configured", entry.pool),
                ));
            }
            if !seen.insert(entry.pool.as_str()) {
                errors.push(issue(
                    SettingsErrorCode::DuplicateHotSparePool,
                    format!("{path}.pool"),
                    format!(
                        "pool {:?} already has a hot-spare entry; one entry per pool",
                        entry.pool
                    ),
                ));
            }
            if entry.spec.instance_type.trim().is_empty() {
                errors.push(issue(
                    SettingsErrorCode::EmptySpareInstanceType,
                    format!("{path}.spec.instanceType"),
                    "a hot spare needs an instance type to be provisioned as".to_owned(),
                ));
            }
        }
    }
}

fn issue(code: SettingsErrorCode, path: String, message: String) -> SettingsIssue {
    SettingsIssue { code, path, message }
}

/// Validates pools and hot spares together, listing every problem at once.
pub fn validate_settings(
    pools: Vec<PlacementPool>,
    hot_spares: &[HotSpareSpec],
) -> Result<Pools, SettingsValidationError> {
    let mut errors = Vec::new();
    let validated = check_pools(pools, &mut errors);
    validated.check_hot_spares(hot_spares, &mut errors);
    if errors.is_empty() {
        Ok(validated)
    } else {
        Err(SettingsValidationError { errors })
    }
}

/// Validates a pool list on its own.
pub fn validate_pools(pools: Vec<PlacementPool>) -> Result<Pools, SettingsValidationError> {
    validate_settings(pools, &[])
}

fn check_pools(pools: Vec<PlacementPool>, errors: &mut Vec<SettingsIssue>) -> Pools {
    let mut by_name = HashMap::new();
    for (i, pool) in pools.iter().enumerate() {
        let path = format!("placementPools[{i}]");
        if pool.name.trim().is_empty() {
            errors.push(issue(
                SettingsErrorCode::EmptyPoolName,
                format!("{path}.name"),
                "a pool needs a name for bundles to refer to".to_owned(),
            ));
        } else if by_name.insert(pool.name.clone(), i).is_some() {
            errors.push(issue(
                SettingsErrorCode::DuplicatePoolName,
                format!("{path}.name"),
                format!("pool {:?} is defined twice", pool.name),
            ));
        }
        check_tiers(pool, &path, errors);
    }
    Pools { pools, by_name }
}

fn check_tiers(pool: &PlacementPool, path: &str, errors: &mut Vec<SettingsIssue>) {
    if pool.tiers.is_empty() {
        errors.push(issue(
            SettingsErrorCode::NoTiers,
            format!("{path}.tiers"),
            format!("pool {:?} has no tiers to place into", pool.name),
        ));
    }
    let mut names = HashSet::new();
    let mut fixed = 0;
    for (t, tier) in pool.tiers.iter().enumerate() {
        let tier_path = format!("{path}.tiers[{t}]");
        if tier.name.trim().is_empty() {
            errors.push(issue(
                SettingsErrorCode::EmptyTierName,
                format!("{tier_path}.name"),
                format!(
                    "a tier of pool {:?} has no name; provisioned nodes are tagged with it",
                    pool.name
                ),
            ));
        } else if !names.insert(tier.name.as_str()) {
            errors.push(issue(
                SettingsErrorCode::DuplicateTier,
                format!("{tier_path}.name"),
                format!("pool {:?} lists tier {:?} twice", pool.name, tier.name),
            ));
        }
        match tier.scale_out {
            ScaleOut::Fixed => {
                fixed += 1;
                if fixed == 2 {
                    errors.push(issue(
                        SettingsErrorCode::MultipleFixedTiers,
                        format!("{tier_path}.scaleOut"),
                        format!(
                            "pool {:?} has more than one fixed tier; at most one is allowed",
                            pool.name
                        ),
                    ));
                }
            }
            ScaleOut::Elastic if tier.candidate_instance_types.is_empty() => errors.push(issue(
                SettingsErrorCode::NoCandidateInstanceTypes,
                format!("{tier_path}.candidateInstanceTypes"),
                format!("elastic tier {:?} has no instance types to provision", tier.name),
            )),
            ScaleOut::Elastic => {}
        }
        if tier.root_volume.is_some() && tier.kind != ProviderKind::Aws {
            errors.push(issue(
                SettingsErrorCode::RootVolumeNotAws,
                format!("{tier_path}.rootVolume"),
                format!(
                    "rootVolume applies to aws tiers only; tier {:?} is {}",
                    tier.name,
                    tier.kind.as_str()
                ),
            ));
        }
        for (s, shape) in tier.candidate_instance_types.iter().enumerate() {
            let shape_path = format!("{tier_path}.candidateInstanceTypes[{s}]");
            let gpus_ok = shape
                .gpus
                .iter()
                .all(|g| g.total_capacity.is_finite() && g.total_capacity > 0.0);
            if shape.instance_type.trim().is_empty()
                || !shape.total_capacity.is_finite()
                || shape.total_capacity <= 0.0
                || !gpus_ok
            {
                errors.push(issue(
                    SettingsErrorCode::InvalidInstanceShape,
                    shape_path,
                    format!(
                        "a candidate shape needs an instanceType, a positive totalCapacity and positive GPU sizes (got {:?}, {})",
                        shape.instance_type, shape.total_capacity
                    ),
                ));
            }
        }
    }
}
