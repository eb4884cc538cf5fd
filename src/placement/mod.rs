//! The placement engine: where a job of a bundle replica runs. PURE: no
//! I/O, no clock, no async; it reads a [`FleetView`] and returns a decision.
//!
//! - [`settings`]: validating pools, tiers and hot spares ([`Pools`]).
//! - [`FleetView`]: the fleet with in-plan reservations, and the candidate
//!   index an untraced placement searches (`fleet::index`, `search`).
//! - [`place`]: the tier walk, the hard filter chain ([`Filter`]), the
//!   lexicographic [`PlacementKey`], provisioning, the [`Trace`] (a traced
//!   placement scans every node); [`place_ranked`] the same within a burst
//!   ([`Rankings`]).
//! - [`validate_bundle`], [`validate_bundle_admission`], [`place_dry_run`].
//! - [`headroom`]: what-if loss analysis (a node, zone, tier, provider kind
//!   or pool taken away and its jobs placed again) on a copy of the view.
//! - [`plan_bundles`]: every replica of every bundle in order, each placement
//!   seeing those before it (what `norsk-auto-manager plan` prints).

mod engine;
mod filter;
mod fleet;
mod groups;
pub mod headroom;
mod key;
mod plan;
mod rankings;
mod replay;
mod request;
mod search;
pub mod settings;
mod trace;
mod validate;

pub use engine::{
    Destination, Outcome, Placement, ProspectiveNodeIds, ResilienceFlag, ResilienceReport, SequentialNodeIds,
    apply_placement, place, place_ranked, placed_job,
};
pub use filter::{Filter, Rejection, RejectionOf};
pub use fleet::{FleetError, FleetView, Name};
pub(crate) use groups::JobGroups;
pub use key::PlacementKey;
pub use plan::{PlanError, PlanRow, PlannedOutcome, plan_bundles};
pub use rankings::Rankings;
pub use request::{PlacementRequest, RecoveryContext};
pub use settings::{
    Pools, SettingsErrorCode, SettingsIssue, SettingsValidationError, validate_pools, validate_settings,
};
pub use trace::{NoProvisionReason, NodeTrace, TierDecision, TierTrace, Trace, Verdict};
pub use validate::{
    Admission, BundleIssue, BundleIssueCode, BundleValidation, Unplaceable, place_dry_run, validate_bundle,
    validate_bundle_admission,
};

/// Why a placement could not even be attempted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The replica's pool is not configured.
    #[error("pool {pool:?} is not configured")]
    UnknownPool {
        /// The pool named.
        pool: String,
    },
    /// The bundle has no job of that name.
    #[error("the bundle has no job {job_name:?}")]
    UnknownJob {
        /// The job named.
        job_name: String,
    },
    /// The bundle has no such replica (a backup needs a resilience policy).
    #[error("replica {replica_index} does not exist; the bundle has {replica_count}")]
    NoSuchReplica {
        /// The replica asked for.
        replica_index: u32,
        /// How many the bundle has.
        replica_count: u32,
    },
}
