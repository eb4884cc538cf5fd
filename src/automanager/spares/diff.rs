//! What `updateHotSpareSpecs` returns: what changed between two
//! `hotSpares` lists, keyed by pool.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::HotSpareSpec;

/// A field of a `hotSpares[]` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum HotSpareField {
    /// `targetCount`.
    TargetCount,
    /// `spec` (instance type, region): applies to spares provisioned from
    /// now on.
    Spec,
    /// `warmFor`.
    WarmFor,
    /// `reservedFor`.
    ReservedFor,
    /// `exclusive`.
    Exclusive,
}

/// What `updateHotSpareSpecs` changed for one pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "camelCase")]
pub enum HotSpareChange {
    /// A new entry: its spares are provisioned.
    Added { entry: HotSpareSpec },
    /// An entry gone: its unconsumed spares are reaped as orphans.
    Removed {
        /// The entry as it was.
        entry: HotSpareSpec,
    },
    /// An entry changed.
    Changed {
        /// As it was.
        before: HotSpareSpec,
        /// As it is now.
        after: HotSpareSpec,
        /// The fields that differ.
        fields: Vec<HotSpareField>,
    },
}

/// `HotSpareSpecsDiff`: what `updateHotSpareSpecs` changed, keyed by pool
/// (pools whose entry stayed the same are absent).
pub type HotSpareSpecsDiff = BTreeMap<String, HotSpareChange>;

/// What changed between two `hotSpares` lists, keyed by pool.
pub fn hot_spare_diff(before: &[HotSpareSpec], after: &[HotSpareSpec]) -> HotSpareSpecsDiff {
    let old: BTreeMap<&str, &HotSpareSpec> = before.iter().map(|e| (e.pool.as_str(), e)).collect();
    let new: BTreeMap<&str, &HotSpareSpec> = after.iter().map(|e| (e.pool.as_str(), e)).collect();
    let mut diff = BTreeMap::new();
    for (pool, entry) in &old {
        if !new.contains_key(pool) {
            diff.insert(
                (*pool).to_owned(),
                HotSpareChange::Removed {
                    entry: (*entry).clone(),
                },
            );
        }
    }
    for (pool, entry) in &new {
        let change = match old.get(pool) {
            None => HotSpareChange::Added {
                entry: (*entry).clone(),
            },
            Some(previous) => {
                let fields: Vec<HotSpareField> = [
                    (previous.target_count != entry.target_count, HotSpareField::TargetCount),
                    (previous.spec != entry.spec, HotSpareField::Spec),
                    (previous.warm_for != entry.warm_for, HotSpareField::WarmFor),
                    (previous.reserved_for != entry.reserved_for, HotSpareField::ReservedFor),
                    (previous.exclusive != entry.exclusive, HotSpareField::Exclusive),
                ]
                .into_iter()
                .filter_map(|(changed, field)| changed.then_some(field))
                .collect();
                if fields.is_empty() {
                    continue;
                }
                HotSpareChange::Changed {
                    before: (*previous).clone(),
                    after: (*entry).clone(),
                    fields,
                }
            }
        };
        diff.insert((*pool).to_owned(), change);
    }
    diff
}
