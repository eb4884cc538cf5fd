//! Plain domain types shared by everything: ids, bundles, job requirements,
//! nodes and inventories, tiers and pools, spare specs, the fleet snapshot.
//!
//! This module owns vocabulary only. It never imports `kube`, `tonic`,
//! `tokio` or a clock; time arrives as a value ([`UnixMillis`]). The types
//! serialise with the spec's field names (camelCase) and derive
//! `JsonSchema`, so the custom resources, the settings file, `plan`'s input
//! and the simulator's snapshot all share one definition.

mod bundle;
mod event;
mod fleet;
mod ids;
mod job;
mod node;
mod pool;
mod schedule;
mod spare;

pub use bundle::*;
pub use event::*;
pub use fleet::*;
pub use ids::*;
pub use job::*;
pub use node::*;
pub use pool::*;
pub use schedule::*;
pub use spare::*;

/// Milliseconds since the Unix epoch. The core never reads a clock; every
/// instant is passed in as one of these.
pub type UnixMillis = i64;
