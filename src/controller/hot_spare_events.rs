//! What a live change of the spare policies did, said on each
//! `HotSparePolicy` whose pool it touched: `updateHotSpareSpecs` returns
//! what changed, keyed by pool (`HotSpareSpecsDiff`), and each pool's
//! change becomes one Normal Event naming the fields that changed, as
//! they were and as they are. Each kind of change has its own reason: the
//! event recorder folds Events of one reason on one object into a series
//! that keeps the first note. Pure: the controller publishes the Events.

use crate::automanager::spares::{HotSpareChange, HotSpareField};
use crate::model::HotSpareSpec;

/// The Event's reason for `change`: `SparePolicyInForce` (a new entry),
/// `SparePolicyChanged`, `SparePolicyRemoved`.
pub fn reason(change: &HotSpareChange) -> &'static str {
    match change {
        HotSpareChange::Added { .. } => "SparePolicyInForce",
        HotSpareChange::Changed { .. } => "SparePolicyChanged",
        HotSpareChange::Removed { .. } => "SparePolicyRemoved",
    }
}

/// What one pool's change did, in the words of the `HotSparePolicy`
/// fields.
pub fn change_note(pool: &str, change: &HotSpareChange) -> String {
    match change {
        HotSpareChange::Added { entry } => format!(
            "spares of pool {pool} are kept from now on: {}",
            every_field(entry).join(", ")
        ),
        HotSpareChange::Removed { .. } => {
            format!("no spares are kept for pool {pool} any more: its unconsumed spares are reaped")
        }
        HotSpareChange::Changed { before, after, fields } => {
            let changes: Vec<String> = fields
                .iter()
                .map(|field| {
                    format!(
                        "{} {} -> {}",
                        field_name(*field),
                        value(before, *field),
                        value(after, *field)
                    )
                })
                .collect();
            format!("spares of pool {pool} changed live: {}", changes.join(", "))
        }
    }
}

fn every_field(entry: &HotSpareSpec) -> Vec<String> {
    [
        HotSpareField::TargetCount,
        HotSpareField::Spec,
        HotSpareField::WarmFor,
        HotSpareField::ReservedFor,
        HotSpareField::Exclusive,
    ]
    .into_iter()
    .map(|field| format!("{} {}", field_name(field), value(entry, field)))
    .collect()
}

fn field_name(field: HotSpareField) -> &'static str {
    match field {
        HotSpareField::TargetCount => "targetCount",
        HotSpareField::Spec => "spec",
        HotSpareField::WarmFor => "warmFor",
        HotSpareField::ReservedFor => "reservedFor",
        HotSpareField::Exclusive => "exclusive",
    }
}

fn value(entry: &HotSpareSpec, field: HotSpareField) -> String {
    match field {
        HotSpareField::TargetCount => entry.target_count.to_string(),
        HotSpareField::Spec => match &entry.spec.region {
            Some(region) => format!("{} in {region}", entry.spec.instance_type),
            None => entry.spec.instance_type.clone(),
        },
        HotSpareField::WarmFor => format!("[{}]", entry.warm_for.join(", ")),
        HotSpareField::ReservedFor => format!("[{}]", entry.reserved_for.join(", ")),
        HotSpareField::Exclusive => entry.exclusive.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SpareInstanceSpec;

    fn entry(target_count: u32, warm_for: &[&str], exclusive: bool) -> HotSpareSpec {
        HotSpareSpec {
            pool: "production".to_owned(),
            target_count,
            spec: SpareInstanceSpec {
                instance_type: "m5.xlarge".to_owned(),
                region: Some("eu-west-1".to_owned()),
            },
            warm_for: warm_for.iter().map(|s| (*s).to_owned()).collect(),
            exclusive,
            ..HotSpareSpec::default()
        }
    }

    #[test]
    fn a_changed_policy_names_each_changed_field_as_it_was_and_is() {
        let change = HotSpareChange::Changed {
            before: entry(1, &["encoder"], false),
            after: entry(2, &["encoder", "packager"], true),
            fields: vec![
                HotSpareField::TargetCount,
                HotSpareField::WarmFor,
                HotSpareField::Exclusive,
            ],
        };
        assert_eq!(
            change_note("production", &change),
            "spares of pool production changed live: targetCount 1 -> 2, warmFor [encoder] -> [encoder, packager], exclusive false -> true"
        );
    }

    #[test]
    fn an_added_policy_says_everything_it_asks_and_a_removed_one_that_its_spares_go() {
        let added = HotSpareChange::Added {
            entry: entry(1, &[], false),
        };
        assert_eq!(
            change_note("production", &added),
            "spares of pool production are kept from now on: targetCount 1, spec m5.xlarge in eu-west-1, warmFor [], reservedFor [], exclusive false"
        );
        let removed = HotSpareChange::Removed {
            entry: entry(1, &[], false),
        };
        assert!(change_note("production", &removed).contains("reaped"));
    }
}
