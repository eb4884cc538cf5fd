//! Plain domain types shared by everything: ids, bundles, job requirements,
//! nodes and inventories, tiers and pools, spare specs, the fleet snapshot.
//!
//! This module owns vocabulary only. It never imports `kube`, `tonic`,
//! `tokio` or a clock; time arrives as a value ([`UnixMillis`]). The types
//! serialise with the spec's field names (camelCase) and derive
//! `JsonSchema`, so the custom resources, the settings file, `plan`'s input
//! and the simulator's snapshot all share one definition.

/// Declares a unit enum whose variants are listed once: the enum itself,
/// `ALL` (every variant, in declaration order) and its `JsonSchema`, a
/// string with one `const` per variant, named as serde names it — the form
/// the CRD generator folds into `enum` (and `nullable` for an optional
/// field). The schema has no description of its own: the API server's form
/// of an optional enum takes the enum's description over the field's, and
/// each field that holds one says what it means there. Declaring the enum
/// here keeps a variant from being added without a place in the schema.
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $ty:ident {
            $($(#[$variant_meta:meta])* $variant:ident),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $ty {
            $($(#[$variant_meta])* $variant),+
        }

        impl $ty {
            /// Every variant, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];
        }

        impl schemars::JsonSchema for $ty {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($ty).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                let one_of: Vec<serde_json::Value> = Self::ALL
                    .iter()
                    .map(|v| serde_json::json!({"type": "string", "const": v}))
                    .collect();
                schemars::json_schema!({ "oneOf": one_of })
            }
        }
    };
}
pub(crate) use string_enum;

/// Implements `Serialize` and `Deserialize` for a type written as one
/// string: its `Display` form out, its `FromStr` parse in, the parse
/// error's words becoming the deserialization error.
macro_rules! string_serde {
    ($ty:ty) => {
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <String as serde::Deserialize>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
use string_serde;

mod bundle;
mod drain;
mod event;
mod fleet;
mod ids;
mod job;
pub mod manager;
mod migration;
mod node;
mod pool;
mod schedule;
mod spare;

pub use bundle::*;
pub use drain::*;
pub use event::*;
pub use fleet::*;
pub use ids::*;
pub use job::*;
pub use migration::*;
pub use node::*;
pub use pool::*;
pub use schedule::*;
pub use spare::*;

/// Milliseconds since the Unix epoch. The core never reads a clock; every
/// instant is passed in as one of these.
pub type UnixMillis = i64;

/// The spec's name of a unit variant (a phase, a status, a kind): its
/// serialised form, as the wire, the callbacks and every status carry it.
/// Empty for a value that does not serialise as a string.
pub fn wire_name(value: &impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

/// The `const` of each `oneOf` entry of `T`'s schema, in order: what a
/// hand-written enum schema lists, for a test to hold against
/// [`serde_names`].
#[cfg(test)]
pub(crate) fn schema_names<T: schemars::JsonSchema>() -> Vec<String> {
    schemars::schema_for!(T)
        .get("oneOf")
        .and_then(|v| v.as_array())
        .unwrap()
        .iter()
        .map(|v| v["const"].as_str().unwrap().to_owned())
        .collect()
}

/// What serde names each of `values`.
#[cfg(test)]
pub(crate) fn serde_names<T: serde::Serialize>(values: &[T]) -> Vec<String> {
    values.iter().map(wire_name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wire_name_is_the_serialised_name_and_empty_for_what_is_not_a_name() {
        assert_eq!(wire_name(&NodePhase::Prospective), "prospective");
        assert_eq!(wire_name(&NodePhase::Running), "running");
        assert_eq!(wire_name(&42), "");
    }
}
