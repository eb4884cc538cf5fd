//! The decision layer every front end shares: pure functions, per resource
//! kind, that say what a document change means for the core (create,
//! update, delete, nothing; which command), how the core's refusals are
//! classified, and what a resource's status and conditions read from the
//! core's read model. No kube client, no I/O, no clock of its own: the
//! operator's controllers ([`crate::controller`]), `standalone`
//! (`crate::cli::standalone`) and the `kubectl norsk` plugin
//! ([`crate::plugin`]) all call these, so they cannot disagree on what a
//! document means. What each owns:
//!
//! - [`bundle`]: what a `Bundle` document change means and how a refusal
//!   is classified; [`bundle_status`]: its status, per replica and job,
//!   and conditions; [`resilience`]: its `Resilient` condition.
//! - [`pool`] / [`hot_spare`]: `PlacementPool` and `HotSparePolicy`
//!   status and conditions.
//! - [`node`]: what a `NorskNode`'s cordon and spare edits ask and the
//!   conditions their outcomes become; [`node_status`]: what a
//!   `NorskNode` mirrors of the fleet, and a node's resource name.
//! - [`drain`] / [`migration`]: the command a `NodeDrain` or
//!   `JobMigration` becomes and which answers refuse it;
//!   [`drain_status`] / [`migration_status`]: their status and
//!   conditions.
//! - [`notes`]: what the core's notifications say, as Events and as the
//!   status facts the core does not keep.
//! - [`conditions`]: `metav1.Condition` bookkeeping; [`status`]: the
//!   status to write, conditions merged, and whether it changed.
//! - [`manager_status`]: what the Manager status ConfigMap says, and its
//!   keys.

pub mod bundle;
pub mod bundle_status;
pub mod conditions;
pub mod drain;
pub mod drain_status;
#[cfg(test)]
pub(crate) mod fixture;
pub mod hot_spare;
pub mod manager_status;
pub mod migration;
pub mod migration_status;
pub mod node;
pub mod node_status;
pub mod notes;
pub mod pool;
pub mod resilience;
pub mod status;

/// The name the operator reports Events and leases under, and the value of
/// the managed-by label on what it creates.
pub const OPERATOR_NAME: &str = "norsk-auto-manager";
