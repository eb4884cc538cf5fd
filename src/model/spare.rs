//! Hot-spare specifications, and how a live spare's `SpareSpec` is carried
//! in its node tags (`warmFor` / `reservedFor` comma-separated, `exclusive`
//! present only when true), so Manager keeps it across AutoManager restarts.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::tags;

/// One live spare's `SpareSpec`: what it is warmed and reserved for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct SpareSpec {
    /// Templates whose images are pre-pulled onto the spare.
    pub warm_for: Vec<String>,
    /// Templates that score the spare first.
    pub reserved_for: Vec<String>,
    /// With `reservedFor`, nobody else may take the spare (unless they set
    /// `overrideReservation`).
    pub exclusive: bool,
}

impl SpareSpec {
    /// The spec a node's tags carry (empty lists when a tag is absent).
    pub fn from_tags(node_tags: &BTreeMap<String, String>) -> Self {
        let list = |name: &str| {
            node_tags
                .get(name)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|t| !t.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        SpareSpec {
            warm_for: list(tags::WARM_FOR),
            reserved_for: list(tags::RESERVED_FOR),
            exclusive: node_tags.get(tags::EXCLUSIVE).is_some_and(|v| v == "true"),
        }
    }

    /// The tag value of each field: `None` for a field carried by the tag's
    /// absence (an empty list, `exclusive: false`). In the order
    /// `warmFor`, `reservedFor`, `exclusive`.
    pub fn tag_values(&self) -> [(&'static str, Option<String>); 3] {
        let list = |l: &[String]| (!l.is_empty()).then(|| l.join(","));
        [
            (tags::WARM_FOR, list(&self.warm_for)),
            (tags::RESERVED_FOR, list(&self.reserved_for)),
            (tags::EXCLUSIVE, self.exclusive.then(|| "true".to_owned())),
        ]
    }
}

/// The instance a pool's spares are provisioned as.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpareInstanceSpec {
    /// Instance type or shape.
    pub instance_type: String,
    /// Region; defaults to the pool's first elastic tier's region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

/// One `hotSpares[]` entry (the `HotSparePolicy` spec): the pool is the key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HotSpareSpec {
    /// The pool this entry keeps spares for (one entry per pool).
    pub pool: String,
    /// How many unconsumed spares to keep.
    pub target_count: u32,
    /// What each spare is provisioned as.
    pub spec: SpareInstanceSpec,
    /// Templates whose images are pre-pulled onto the spares.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warm_for: Vec<String>,
    /// Templates that score the spares first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_for: Vec<String>,
    /// Makes the reservation a guarantee.
    #[serde(default)]
    pub exclusive: bool,
}

impl HotSpareSpec {
    /// The `SpareSpec` a spare provisioned for this entry carries.
    pub fn spare_spec(&self) -> SpareSpec {
        SpareSpec {
            warm_for: self.warm_for.clone(),
            reserved_for: self.reserved_for.clone(),
            exclusive: self.exclusive,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spare_spec_round_trips_through_node_tags() {
        let spec = SpareSpec {
            warm_for: vec!["xyz".into(), "abc".into()],
            reserved_for: vec!["xyz".into()],
            exclusive: true,
        };
        let node_tags: BTreeMap<String, String> = spec
            .tag_values()
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_owned(), v?)))
            .collect();
        assert_eq!(node_tags["warmFor"], "xyz,abc");
        assert_eq!(SpareSpec::from_tags(&node_tags), spec);
        assert_eq!(SpareSpec::from_tags(&BTreeMap::new()), SpareSpec::default());
    }
}
