//! Bundle validation before submission: `validateBundle` (static shape:
//! pool refs, job-name uniqueness, placement-rule consistency,
//! exclusive/single-use groups, capability satisfiability),
//! `validateBundleAdmission` ("would each replica place right now?") and
//! `placeDryRun` (one job through the engine with the trace, without
//! acting).
//!
//! Errors mean the submission must be rejected. Warnings are capacity
//! misses against a pool with a fixed (cluster) tier, where workers may join
//! later: surfaced, but submission is allowed.

use std::collections::HashSet;
use std::fmt;

use serde::Serialize;

use crate::model::{BundleId, BundleSpec, ScaleOut};

use super::PlacementError;
use super::engine::{Outcome, Placement, SequentialNodeIds, apply_placement, place, shape_fits};
use super::filter::{CAPACITY_EPSILON, fit_gpus};
use super::fleet::{FleetView, GpuDevice, NodeIdx, flag};
use super::groups::{JobGroups, separated};
use super::request::{Needs, PlacementRequest};

/// A bundle problem's stable code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum BundleIssueCode {
    /// `pool` or `resiliencePolicy.pool` names no configured pool.
    UnknownPool,
    /// The bundle has no jobs.
    NoJobs,
    /// A job has an empty name.
    EmptyJobName,
    /// Two jobs share a name.
    DuplicateJobName,
    /// `coLocateWith` / `separateFrom` names no job of the bundle.
    UnknownPeer,
    /// A job names itself in `coLocateWith` / `separateFrom`.
    SelfReference,
    /// Two jobs are co-located (directly, transitively or by
    /// `sameNodeDefault`) and separated at once.
    ContradictoryPlacementRules,
    /// `singleUse` without `exclusive`.
    SingleUseRequiresExclusive,
    /// A `singleUse` job in a co-located group: terminating its node when
    /// it ends would take its peers with it.
    SingleUseInGroup,
    /// A requirement outside its range (negative or non-finite capacity, GPU
    /// capacity outside (0, 1]).
    InvalidRequirement,
    /// One job lists a host port twice.
    DuplicateHostPort,
    /// Co-located jobs claim the same host port: they can never share a
    /// node.
    HostPortConflictInGroup,
    /// `backupParameterOverrides` names no job of the bundle.
    UnknownBackupOverrideJob,
    /// `backupParameterOverrides` without a `resiliencePolicy` (no backup
    /// exists to apply them to). A warning.
    BackupOverridesWithoutBackup,
    /// No node and no candidate shape of the pool could ever take the job
    /// (or its co-located group), and the pool has no cluster tier.
    Unsatisfiable,
    /// No current node or shape takes the job, but the pool has a cluster
    /// tier where workers may join later. A warning.
    NoClusterNodeFits,
    /// `schedule.end` is not after `schedule.start`.
    ScheduleEndsBeforeStart,
    /// `startedReplicas` on a job that is not `startMode: manual`.
    StartedAutoJob,
    /// `startedReplicas` names a replica the bundle does not have (or one
    /// twice).
    UnknownStartedReplica,
}

/// One bundle problem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BundleIssue {
    /// The stable code.
    pub code: BundleIssueCode,
    /// Where in the bundle spec, e.g. `jobs[1].coLocateWith`.
    pub path: String,
    /// What is wrong, in words a person can act on.
    pub message: String,
}

impl fmt::Display for BundleIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// What `validate_bundle` found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BundleValidation {
    /// The submission must be rejected.
    pub errors: Vec<BundleIssue>,
    /// Surface, but allow submission.
    pub warnings: Vec<BundleIssue>,
}

impl BundleValidation {
    fn error(&mut self, code: BundleIssueCode, path: impl Into<String>, message: String) {
        self.errors.push(BundleIssue {
            code,
            path: path.into(),
            message,
        });
    }

    fn warning(&mut self, code: BundleIssueCode, path: impl Into<String>, message: String) {
        self.warnings.push(BundleIssue {
            code,
            path: path.into(),
            message,
        });
    }
}

/// A job of a replica that would not place now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unplaceable {
    /// 0 primary, 1 backup.
    pub replica_index: u32,
    /// The job.
    pub job_name: String,
    /// Why (`noCapacityInAnyPool`, or the engine's error).
    pub reason: String,
}

/// `validateBundleAdmission`'s answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Admission {
    /// Every replica would place (or provision) now.
    Ok,
    /// The bundle is invalid.
    ValidationErrors { errors: Vec<BundleIssue> },
    /// Some jobs would find nowhere to go.
    NoCapacity {
        /// Those jobs.
        unplaceable: Vec<Unplaceable>,
    },
}

/// Validates a bundle's static shape against the configured pools and, for
/// satisfiability, the fleet's nodes and the pools' candidate shapes.
pub fn validate_bundle(view: &FleetView, bundle: &BundleSpec) -> BundleValidation {
    let mut found = BundleValidation::default();
    check_pools(view, bundle, &mut found);
    check_jobs(bundle, &mut found);
    check_groups(bundle, &mut found);
    check_overrides(bundle, &mut found);
    check_schedule(bundle, &mut found);
    check_started(bundle, &mut found);
    if found.errors.is_empty() {
        check_satisfiable(view, bundle, &mut found);
    }
    found
}

/// "Would each replica place right now?": validation, then every job of
/// every replica through the engine in plan order, each seeing the ones
/// before it (on a copy of the view; nothing is kept).
pub fn validate_bundle_admission(view: &FleetView, bundle_id: &BundleId, bundle: &BundleSpec) -> Admission {
    let validation = validate_bundle(view, bundle);
    if !validation.errors.is_empty() {
        return Admission::ValidationErrors {
            errors: validation.errors,
        };
    }
    let mut scratch = view.clone();
    let mut ids = SequentialNodeIds::default();
    let mut unplaceable = Vec::new();
    let order = JobGroups::of(bundle).placement_order();
    for replica_index in 0..bundle.replica_count() {
        for &j in &order {
            let job_name = bundle.jobs[j].job_name.as_str();
            let request = PlacementRequest::launch(bundle_id, bundle, replica_index, job_name);
            let reason = match place(&scratch, request, &mut ids) {
                Ok(Placement {
                    outcome: Outcome::NoCapacityInAnyPool,
                    ..
                }) => Some("noCapacityInAnyPool".to_owned()),
                Ok(placement) => apply_placement(&mut scratch, &request, &placement.outcome)
                    .err()
                    .map(|e| e.to_string()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(reason) = reason {
                unplaceable.push(Unplaceable {
                    replica_index,
                    job_name: job_name.to_owned(),
                    reason,
                });
            }
        }
    }
    if unplaceable.is_empty() {
        Admission::Ok
    } else {
        Admission::NoCapacity { unplaceable }
    }
}

/// One job of one replica through the engine with the trace on, without
/// acting.
pub fn place_dry_run(
    view: &FleetView,
    bundle_id: &BundleId,
    bundle: &BundleSpec,
    replica_index: u32,
    job_name: &str,
) -> Result<Placement, PlacementError> {
    let request = PlacementRequest::launch(bundle_id, bundle, replica_index, job_name).with_trace(true);
    place(view, request, &mut SequentialNodeIds::default())
}

fn check_pools(view: &FleetView, bundle: &BundleSpec, found: &mut BundleValidation) {
    if view.pools().get(&bundle.pool).is_none() {
        found.error(
            BundleIssueCode::UnknownPool,
            "pool",
            format!("pool {:?} is not configured", bundle.pool),
        );
    }
    if let Some(pool) = bundle.resilience_policy.as_ref().and_then(|r| r.pool.as_ref())
        && view.pools().get(pool).is_none()
    {
        found.error(
            BundleIssueCode::UnknownPool,
            "resiliencePolicy.pool",
            format!("backup pool {pool:?} is not configured"),
        );
    }
}

fn check_jobs(bundle: &BundleSpec, found: &mut BundleValidation) {
    if bundle.jobs.is_empty() {
        found.error(
            BundleIssueCode::NoJobs,
            "jobs",
            "a bundle needs at least one job".to_owned(),
        );
    }
    let names: HashSet<&str> = bundle.jobs.iter().map(|j| j.job_name.as_str()).collect();
    let mut seen = HashSet::new();
    for (i, job) in bundle.jobs.iter().enumerate() {
        let path = format!("jobs[{i}]");
        if job.job_name.trim().is_empty() {
            found.error(
                BundleIssueCode::EmptyJobName,
                format!("{path}.jobName"),
                "a job needs a name".to_owned(),
            );
        } else if !seen.insert(job.job_name.as_str()) {
            found.error(
                BundleIssueCode::DuplicateJobName,
                format!("{path}.jobName"),
                format!("job name {:?} is used twice", job.job_name),
            );
        }
        for (field, peers) in [
            ("coLocateWith", &job.co_locate_with),
            ("separateFrom", &job.separate_from),
        ] {
            for peer in peers {
                if *peer == job.job_name {
                    found.error(
                        BundleIssueCode::SelfReference,
                        format!("{path}.{field}"),
                        format!("job {:?} names itself", job.job_name),
                    );
                } else if !names.contains(peer.as_str()) {
                    found.error(
                        BundleIssueCode::UnknownPeer,
                        format!("{path}.{field}"),
                        format!(
                            "job {:?} names {peer:?}, which is not a job of this bundle",
                            job.job_name
                        ),
                    );
                }
            }
        }
        if job.single_use && !job.exclusive {
            found.error(
                BundleIssueCode::SingleUseRequiresExclusive,
                format!("{path}.singleUse"),
                format!("job {:?} is singleUse, which requires exclusive: true", job.job_name),
            );
        }
        check_requirements(job, &path, found);
    }
}

/// The same rule the CRD's CEL holds: an end comes after the start.
fn check_schedule(bundle: &BundleSpec, found: &mut BundleValidation) {
    if let Some(schedule) = &bundle.schedule
        && let Some(end) = schedule.end
        && end <= schedule.start
    {
        found.error(
            BundleIssueCode::ScheduleEndsBeforeStart,
            "schedule.end",
            format!(
                "schedule.end must be after schedule.start: {end} is not after {}",
                schedule.start
            ),
        );
    }
}

/// The same rules the CRD holds: `startedReplicas` only on manual jobs,
/// naming replicas the bundle has, each once.
fn check_started(bundle: &BundleSpec, found: &mut BundleValidation) {
    let replicas = bundle.replica_count();
    for (i, job) in bundle.jobs.iter().enumerate() {
        if job.started_replicas.is_empty() {
            continue;
        }
        let path = format!("jobs[{i}].startedReplicas");
        if job.start_mode != crate::model::StartMode::Manual {
            found.error(
                BundleIssueCode::StartedAutoJob,
                path.clone(),
                format!(
                    "job {:?} is startMode auto: it runs whenever its bundle does; startedReplicas is for manual jobs",
                    job.job_name
                ),
            );
        }
        let mut seen = HashSet::new();
        for &replica in &job.started_replicas {
            if replica >= replicas {
                let has = if replicas == 1 {
                    "only replica 0 (no resiliencePolicy, so no backup)"
                } else {
                    "replicas 0 and 1"
                };
                found.error(
                    BundleIssueCode::UnknownStartedReplica,
                    path.clone(),
                    format!("job {:?} names replica {replica}; the bundle has {has}", job.job_name),
                );
            } else if !seen.insert(replica) {
                found.error(
                    BundleIssueCode::UnknownStartedReplica,
                    path.clone(),
                    format!("job {:?} names replica {replica} twice", job.job_name),
                );
            }
        }
    }
}

fn check_requirements(job: &crate::model::JobSpec, path: &str, found: &mut BundleValidation) {
    let needs = &job.requirements;
    if !needs.required_capacity.is_finite() || needs.required_capacity < 0.0 {
        found.error(
            BundleIssueCode::InvalidRequirement,
            format!("{path}.requirements.requiredCapacity"),
            format!(
                "requiredCapacity must be a number of vCPUs >= 0, got {}",
                needs.required_capacity
            ),
        );
    }
    let gpu = needs.required_gpu_capacity;
    if !gpu.is_finite() || !(0.0..=1.0).contains(&gpu) {
        found.error(
            BundleIssueCode::InvalidRequirement,
            format!("{path}.requirements.requiredGpuCapacity"),
            format!("requiredGpuCapacity is a fraction of one device in [0, 1], got {gpu}"),
        );
    }
    let mut ports = HashSet::new();
    for port in &needs.required_host_ports {
        if !ports.insert(port) {
            found.error(
                BundleIssueCode::DuplicateHostPort,
                format!("{path}.requirements.requiredHostPorts"),
                format!("host port {port} is listed twice"),
            );
        }
    }
}

fn check_groups(bundle: &BundleSpec, found: &mut BundleValidation) {
    let groups = JobGroups::of(bundle);
    for (i, a) in bundle.jobs.iter().enumerate() {
        let path = format!("jobs[{i}]");
        for (j, b) in bundle.jobs.iter().enumerate().skip(i + 1) {
            if !groups.together(i, j) {
                continue;
            }
            if separated(a, b) {
                found.error(
                    BundleIssueCode::ContradictoryPlacementRules,
                    format!("{path}.separateFrom"),
                    format!(
                        "jobs {:?} and {:?} are both co-located and separated",
                        a.job_name, b.job_name
                    ),
                );
            }
            let b_ports = &b.requirements.required_host_ports;
            if let Some(port) = a.requirements.required_host_ports.iter().find(|p| b_ports.contains(p)) {
                found.error(
                    BundleIssueCode::HostPortConflictInGroup,
                    format!("{path}.requirements.requiredHostPorts"),
                    format!(
                        "co-located jobs {:?} and {:?} both claim host port {port}",
                        a.job_name, b.job_name
                    ),
                );
            }
        }
        if a.single_use && groups.members(i).count() > 1 {
            found.error(
                BundleIssueCode::SingleUseInGroup,
                format!("{path}.singleUse"),
                format!(
                    "single-use job {:?} is co-located with other jobs; its node is terminated when it ends",
                    a.job_name
                ),
            );
        }
    }
}

fn check_overrides(bundle: &BundleSpec, found: &mut BundleValidation) {
    for name in bundle.backup_parameter_overrides.keys() {
        if bundle.job(name).is_none() {
            found.error(
                BundleIssueCode::UnknownBackupOverrideJob,
                format!("backupParameterOverrides.{name}"),
                format!("{name:?} is not a job of this bundle"),
            );
        }
    }
    if !bundle.backup_parameter_overrides.is_empty() && bundle.resilience_policy.is_none() {
        found.warning(
            BundleIssueCode::BackupOverridesWithoutBackup,
            "backupParameterOverrides",
            "there is no backup replica without a resiliencePolicy; the overrides are unused".to_owned(),
        );
    }
}

/// Every co-located group (as its first mover sizes it) must fit some node
/// of the replica's pool or some candidate shape of an elastic tier.
fn check_satisfiable(view: &FleetView, bundle: &BundleSpec, found: &mut BundleValidation) {
    let mut pools: Vec<&str> = (0..bundle.replica_count())
        .map(|r| bundle.pool_for_replica(r))
        .collect();
    pools.dedup();
    let groups = JobGroups::of(bundle);
    for pool_name in pools {
        let (Some(pool_idx), Some(pool)) = (view.pools().index_of(pool_name), view.pools().get(pool_name)) else {
            continue;
        };
        for (i, job) in bundle.jobs.iter().enumerate() {
            if groups.members(i).next() != Some(i) {
                continue;
            }
            let needs = Needs::of(view, groups.members(i).map(|m| &bundle.jobs[m]));
            let shape_fits_any = pool
                .tiers
                .iter()
                .filter(|t| t.scale_out == ScaleOut::Elastic)
                .any(|t| t.candidate_instance_types.iter().any(|s| shape_fits(s, &needs)));
            let node_fits_any = (0..pool.tiers.len())
                .flat_map(|t| view.tier_nodes(pool_idx, t))
                .any(|&n| could_ever_fit(view, n, &needs));
            if shape_fits_any || node_fits_any {
                continue;
            }
            let path = format!("jobs[{i}].requirements");
            let what = format!(
                "job {:?} (with its co-located group: {} vCPU, {} cores, capabilities {:?}) fits no node or shape of pool {pool_name:?}",
                job.job_name,
                needs.capacity,
                needs.cores,
                needs.capabilities.iter().map(|(_, n)| n.as_str()).collect::<Vec<_>>()
            );
            if pool.fixed_tier().is_some() {
                found.warning(
                    BundleIssueCode::NoClusterNodeFits,
                    path,
                    format!("{what}; cluster workers may join later"),
                );
            } else {
                found.error(BundleIssueCode::Unsatisfiable, path, what);
            }
        }
    }
}

/// Whether node `idx`, emptied, would take `needs` (its totals, not what
/// is free now).
fn could_ever_fit(view: &FleetView, idx: NodeIdx, needs: &Needs) -> bool {
    let hot = view.hot(idx);
    let node = view.node(idx);
    let empty_gpus: Vec<GpuDevice> = node.gpus.iter().map(|g| GpuDevice { used: 0.0, ..g.clone() }).collect();
    hot.has(flag::INVENTORY)
        && needs.capacity <= node.usable + CAPACITY_EPSILON
        && needs.cores <= u32::from(hot.total_cores)
        && needs.held_by(&node.capabilities)
        && fit_gpus(&empty_gpus, &needs.gpu_asks).is_ok()
}
