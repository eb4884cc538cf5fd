//! Planning a list of bundles against a fleet, offline: every replica of
//! every bundle in order (replica 0 then 1; jobs in spec order with
//! co-located groups together), each placement seeing the reservations of
//! those before it. A provision adds its prospective node, so later
//! placements can use it. This is what `norsk-auto-manager plan` prints.

use crate::model::{BundleId, BundleSpec, NodeId};

use super::PlacementError;
use super::engine::{ProspectiveNodeIds, ResilienceFlag, apply_placement, place_ranked};
use super::fleet::{FleetError, FleetView};
use super::groups::JobGroups;
use super::rankings::Rankings;
use super::request::PlacementRequest;
use super::trace::Trace;
use super::validate::{BundleIssue, validate_bundle};

/// What became of one job of one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum PlannedOutcome {
    /// Placed on an existing (or earlier prospective) node.
    Placed,
    /// A node would be provisioned for it.
    Provision,
    /// Nowhere in the pool.
    NoCapacityInAnyPool,
    /// The bundle failed validation.
    Invalid,
}

/// One row of a plan: one job of one replica.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanRow {
    pub bundle: BundleId,
    /// 0 primary, 1 backup.
    pub replica_index: u32,
    /// The job.
    pub job_name: String,
    /// What became of it.
    pub outcome: PlannedOutcome,
    /// The node (prospective, for a provision).
    pub node_id: Option<NodeId>,
    /// The pool placed into.
    pub pool: Option<String>,
    /// The tier placed into.
    pub tier: Option<String>,
    /// The shape provisioned.
    pub instance_type: Option<String>,
    /// The GPU device chosen.
    pub gpu_index: Option<u32>,
    /// `forbid` resilience flags the placement violates.
    pub resilience_violations: Vec<ResilienceFlag>,
    /// The primary is on interruptible capacity and the backup is not
    /// durable.
    pub interruptible_primary_without_durable_backup: bool,
    /// Validation errors (outcome `invalid`).
    pub errors: Vec<BundleIssue>,
    /// Validation warnings (capacity misses against a cluster pool).
    pub warnings: Vec<BundleIssue>,
    /// The placement trace, when asked for.
    pub trace: Option<Trace>,
}

/// Why a plan could not be computed. Bundles are validated first, so this
/// means the view and the bundles disagree in a way validation cannot see.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The engine refused a request.
    #[error("placing {bundle} replica {replica_index} job {job_name:?} failed: {source}")]
    Placement {
        bundle: BundleId,
        /// The replica.
        replica_index: u32,
        /// The job.
        job_name: String,
        /// Why.
        source: PlacementError,
    },
    /// A placement could not be applied to the plan's fleet.
    #[error("applying the placement of {bundle} job {job_name:?} failed: {source}")]
    Apply {
        bundle: BundleId,
        /// The job.
        job_name: String,
        /// Why.
        source: FleetError,
    },
}

/// Plans `bundles` in order against `view`, which accumulates every
/// placement and prospective node.
pub fn plan_bundles(
    view: &mut FleetView,
    bundles: &[(BundleId, BundleSpec)],
    trace: bool,
    ids: &mut dyn ProspectiveNodeIds,
) -> Result<Vec<PlanRow>, PlanError> {
    let mut rows = Vec::new();
    let mut rankings = Rankings::for_burst();
    for (bundle_id, spec) in bundles {
        let validation = validate_bundle(view, spec);
        let order = JobGroups::of(spec).placement_order();
        let row = |replica_index: u32, job_name: &str, outcome: PlannedOutcome| PlanRow {
            bundle: bundle_id.clone(),
            replica_index,
            job_name: job_name.to_owned(),
            outcome,
            node_id: None,
            pool: None,
            tier: None,
            instance_type: None,
            gpu_index: None,
            resilience_violations: Vec::new(),
            interruptible_primary_without_durable_backup: false,
            errors: Vec::new(),
            warnings: validation.warnings.clone(),
            trace: None,
        };
        if !validation.errors.is_empty() {
            let names: Vec<&str> = order.iter().map(|&j| spec.jobs[j].job_name.as_str()).collect();
            let names = if names.is_empty() { vec![""] } else { names };
            for replica_index in 0..spec.replica_count() {
                for name in &names {
                    let mut invalid = row(replica_index, name, PlannedOutcome::Invalid);
                    invalid.errors = validation.errors.clone();
                    rows.push(invalid);
                }
            }
            continue;
        }
        for replica_index in 0..spec.replica_count() {
            for &j in &order {
                let job_name = spec.jobs[j].job_name.as_str();
                let request = PlacementRequest::launch(bundle_id, spec, replica_index, job_name).with_trace(trace);
                let placement =
                    place_ranked(view, request, ids, &mut rankings).map_err(|source| PlanError::Placement {
                        bundle: bundle_id.clone(),
                        replica_index,
                        job_name: job_name.to_owned(),
                        source,
                    })?;
                apply_placement(view, &request, &placement.outcome).map_err(|source| PlanError::Apply {
                    bundle: bundle_id.clone(),
                    job_name: job_name.to_owned(),
                    source,
                })?;
                let mut planned = match placement.outcome.destination() {
                    Some(to) => {
                        let outcome = if to.instance_type.is_some() {
                            PlannedOutcome::Provision
                        } else {
                            PlannedOutcome::Placed
                        };
                        PlanRow {
                            node_id: Some(to.node_id.clone()),
                            pool: Some(to.pool.to_owned()),
                            tier: Some(to.tier.to_owned()),
                            instance_type: to.instance_type.map(str::to_owned),
                            gpu_index: to.gpu_index,
                            ..row(replica_index, job_name, outcome)
                        }
                    }
                    None => row(replica_index, job_name, PlannedOutcome::NoCapacityInAnyPool),
                };
                planned.resilience_violations = placement.resilience.violations;
                planned.interruptible_primary_without_durable_backup =
                    placement.resilience.interruptible_primary_without_durable_backup;
                planned.trace = placement.trace;
                rows.push(planned);
            }
        }
    }
    Ok(rows)
}
