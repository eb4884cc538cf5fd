//! Bundles: the unit of work a user submits. A bundle runs a primary copy
//! (replica 0) and, only when it carries a `resiliencePolicy`, one backup
//! (replica 1). Each copy holds the same jobs.

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{BundleId, BundleSchedule, JobSpec, OnLaunch, StartMode, UnixMillis};

/// A resilience flag: best-effort, never hard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ResilienceRule {
    /// The backup may share this failure domain with the primary.
    #[default]
    Allow,
    /// Keep the backup out of the primary's failure domain whenever any
    /// compliant node fits.
    Forbid,
}

/// `resiliencePolicy`: present means a backup replica is expanded.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ResiliencePolicy {
    /// Where the backup is placed (default: the bundle's pool).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Backup on the primary's node.
    pub same_node: ResilienceRule,
    /// Backup in the primary's availability zone.
    pub same_az: ResilienceRule,
    /// Backup in the primary's cloud (provider kind).
    pub same_cloud: ResilienceRule,
}

/// `intraReplicaPlacement.sameAz`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum IntraReplicaAz {
    /// Prefer a node sharing an AZ with a same-replica peer (the default).
    #[default]
    Soft,
    /// Only nodes sharing an AZ with placed same-replica peers.
    Hard,
    /// No AZ preference.
    Off,
}

/// `intraReplicaPlacement`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct IntraReplicaPlacement {
    /// Co-locate every job that declares neither `coLocateWith` nor
    /// `separateFrom`, as a hard rule.
    pub same_node_default: bool,
    /// `hard`, `soft` (default) or `off`.
    pub same_az: IntraReplicaAz,
}

/// Whether a bundle is live or being deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum BundleState {
    /// Running (every update sets this).
    #[default]
    Live,
    /// Manager's stop-then-delete saga is running.
    Deleting,
}

super::string_enum! {
    /// Where a job stands, in the words a Bundle's status uses (`jobs[].state`),
    /// decided by the core's own rules: its bundle's schedule and deletion, its
    /// binding's phase, its failure outcome, a manual job's desired state.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum JobPhase {
        /// Its bundle is being deleted on Manager.
        Deleting,
        /// Dropped by the failure policy (`onRuntimeFailure: drop`, or a
        /// non-essential job past its ceiling).
        Dropped,
        /// Its bundle is broken.
        Broken,
        /// Placed, but its window ended or it was stopped by request.
        Stopping,
        /// Placed on a node still launching.
        AwaitingNode,
        /// Its start was sent.
        Starting,
        /// Running.
        Running,
        /// Its window (or Manager's `post` state) is over.
        Ended,
        /// A `startMode: manual` job kept stopped.
        Dormant,
        /// Its bundle's schedule has not reached its placement lead.
        Scheduled,
        /// No tier can take it now; waiting for capacity.
        AwaitingCapacity,
        /// Not placed yet.
        Pending,
    }
}

impl JobPhase {
    /// Whether the job is meant to run now (so counts towards a bundle's
    /// readiness).
    pub fn is_wanted(self) -> bool {
        !matches!(
            self,
            Self::Dormant | Self::Dropped | Self::Stopping | Self::Ended | Self::Scheduled
        )
    }
}

/// A terminal verdict's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum VerdictKind {
    /// The production ended: no replica of the bundle is placed again.
    Broken,
    /// One non-essential job was taken out alone.
    Dropped,
}

/// A terminal verdict recorded on Manager.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TerminalVerdict {
    /// Broken or dropped.
    pub kind: VerdictKind,
    /// Why, in words a person can act on (for an invalid spec, the worker's).
    pub reason: String,
    /// When the verdict was reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<UnixMillis>,
}

/// The bundle spec as users write it (a bundle without its id).
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
// Shape rules the API server enforces itself (CEL), each naming the field
// it is about (`fieldPath`); what needs the fleet is reported on the
// resource's status instead. The messages name the rule, not the offending
// job: a `messageExpression` listing names loops over the jobs again and
// exceeds the API server's cost budget for message expressions many times
// over; the operator's own validation names them.
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.jobs.all(j, self.jobs.exists_one(k, k.jobName == j.jobName))",
     "message": "job names must be unique within a bundle",
     "fieldPath": ".jobs"},
    {"rule": "self.jobs.all(j, !has(j.coLocateWith) || j.coLocateWith.all(n, n != j.jobName && self.jobs.exists(k, k.jobName == n)))",
     "message": "coLocateWith must name other jobs of this bundle",
     "fieldPath": ".jobs"},
    {"rule": "self.jobs.all(j, !has(j.separateFrom) || j.separateFrom.all(n, n != j.jobName && self.jobs.exists(k, k.jobName == n)))",
     "message": "separateFrom must name other jobs of this bundle",
     "fieldPath": ".jobs"},
    {"rule": "self.jobs.all(j, !has(j.coLocateWith) || !has(j.separateFrom) || j.coLocateWith.all(n, !(n in j.separateFrom)))",
     "message": "a job cannot both co-locate with and separate from the same job",
     "fieldPath": ".jobs"},
    {"rule": "!has(self.backupParameterOverrides) || self.backupParameterOverrides.all(n, self.jobs.exists(k, k.jobName == n))",
     "message": "backupParameterOverrides must be keyed by job names of this bundle",
     "fieldPath": ".backupParameterOverrides"},
    {"rule": "self.jobs.all(j, !has(j.startedReplicas) || j.startedReplicas.all(r, r == 0 || has(self.resiliencePolicy)))",
     "message": "startedReplicas must name replicas the bundle has: 0 (the primary) and, with a resiliencePolicy, 1 (the backup)",
     "fieldPath": ".jobs"}
]))]
pub struct BundleSpec {
    /// The one pool the primary is placed into.
    pub pool: String,
    /// Present: a backup replica is expanded too.
    pub resilience_policy: Option<ResiliencePolicy>,
    /// The jobs of each replica, in order.
    // Bounds keep the CEL rules above within the API server's cost budget.
    #[schemars(length(min = 1, max = 32))]
    pub jobs: Vec<JobSpec>,
    /// Rules between jobs of one replica.
    #[serde(default)]
    pub intra_replica_placement: IntraReplicaPlacement,
    /// Whether the first placement may take an unconsumed hot spare.
    #[serde(default)]
    pub on_launch: OnLaunch,
    /// May take a spare exclusively reserved for other templates.
    #[serde(default)]
    pub override_reservation: bool,
    /// Parameter values that differ on the backup, keyed by job name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32))]
    pub backup_parameter_overrides: BTreeMap<String, BTreeMap<String, String>>,
    /// When the production runs: placed ahead of `start`, completed at
    /// `end`. Absent: it runs from its creation until it is deleted.
    pub schedule: Option<BundleSchedule>,
}

/// A replica of a job, by index and name (`startedReplicas` entries).
pub type ReplicaJob = (u32, String);

impl BundleSpec {
    /// `replicaCount`: derived, never set — 2 with a resilience policy, else 1.
    pub fn replica_count(&self) -> u32 {
        if self.resilience_policy.is_some() { 2 } else { 1 }
    }

    /// The pool a replica is placed from: the backup's
    /// `resiliencePolicy.pool` when set, else the bundle's pool.
    pub fn pool_for_replica(&self, replica_index: u32) -> &str {
        if replica_index > 0
            && let Some(pool) = self.resilience_policy.as_ref().and_then(|r| r.pool.as_deref())
        {
            return pool;
        }
        &self.pool
    }

    /// A job's parameters on a replica, with `backupParameterOverrides`
    /// applied on the backup.
    pub fn parameters_for(&self, replica_index: u32, job: &JobSpec) -> BTreeMap<String, String> {
        let mut params = job.parameters.clone();
        if replica_index > 0
            && let Some(overrides) = self.backup_parameter_overrides.get(&job.job_name)
        {
            params.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        params
    }

    /// The job spec named `job_name`.
    pub fn job(&self, job_name: &str) -> Option<&JobSpec> {
        self.jobs.iter().find(|j| j.job_name == job_name)
    }

    /// Whether `job_name` is a `startMode: manual` job of this bundle.
    pub fn is_manual(&self, job_name: &str) -> bool {
        self.job(job_name).is_some_and(|j| j.start_mode == StartMode::Manual)
    }

    /// The replicas of manual jobs the spec wants started (entries of auto
    /// jobs and of replicas the bundle does not have are left out: they
    /// are validation errors, never something to start).
    pub fn started(&self) -> BTreeSet<ReplicaJob> {
        let replicas = self.replica_count();
        self.jobs
            .iter()
            .filter(|j| j.start_mode == StartMode::Manual)
            .flat_map(|j| {
                j.started_replicas
                    .iter()
                    .filter(move |&&r| r < replicas)
                    .map(move |&r| (r, j.job_name.clone()))
            })
            .collect()
    }

    /// The spec with `started` as its manual jobs' `startedReplicas` (in
    /// replica order).
    pub fn with_started(&self, started: &BTreeSet<ReplicaJob>) -> BundleSpec {
        let mut spec = self.clone();
        for job in &mut spec.jobs {
            job.started_replicas = started
                .iter()
                .filter(|(_, name)| name == &job.job_name)
                .map(|(r, _)| *r)
                .collect();
        }
        spec
    }

    /// Whether the two specs are the same revision: equal apart from which
    /// manual jobs are started. Starting and stopping is not a revision.
    pub fn same_revision(&self, other: &BundleSpec) -> bool {
        let none = BTreeSet::new();
        self.with_started(&none) == other.with_started(&none)
    }

    /// Whether applying `other` over this spec changes nothing: the same
    /// revision with the same manual jobs started (in whatever order
    /// `startedReplicas` lists them).
    pub fn same_applied(&self, other: &BundleSpec) -> bool {
        self.same_revision(other) && self.started() == other.started()
    }
}

/// A bundle as Manager stores it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bundle {
    /// The bundle id (`namespace/name` for bundles from Kubernetes).
    pub bundle_id: BundleId,
    /// What the user asked for.
    #[serde(flatten)]
    pub spec: BundleSpec,
    /// Live or deleting.
    #[serde(default)]
    pub state: BundleState,
    /// Set when the production ended; cleared by an update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_verdict: Option<TerminalVerdict>,
    /// Manager's generation counter, bumped on every accepted spec change.
    #[serde(default)]
    pub generation: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> BundleSpec {
        yaml_serde::from_str(
            "pool: production\nresiliencePolicy: {pool: oci-fra, sameNode: forbid}\njobs:\n  - jobName: encode\n    parameters: {bitrate: '5000'}\nbackupParameterOverrides: {encode: {bitrate: '3000'}}\n",
        )
        .unwrap()
    }

    #[test]
    fn replica_count_is_derived_from_the_resilience_policy() {
        let mut s = spec();
        assert_eq!(s.replica_count(), 2);
        s.resilience_policy = None;
        assert_eq!(s.replica_count(), 1);
    }

    #[test]
    fn backup_is_placed_from_the_resilience_pool() {
        let s = spec();
        assert_eq!(s.pool_for_replica(0), "production");
        assert_eq!(s.pool_for_replica(1), "oci-fra");
    }

    #[test]
    fn backup_parameter_overrides_apply_to_the_backup_only() {
        let s = spec();
        let job = &s.jobs[0];
        assert_eq!(s.parameters_for(0, job)["bitrate"], "5000");
        assert_eq!(s.parameters_for(1, job)["bitrate"], "3000");
    }

    #[test]
    fn started_replicas_are_a_desired_state_outside_the_revision() {
        let mut s: BundleSpec = yaml_serde::from_str(
            "pool: p\nresiliencePolicy: {}\njobs:\n  - {jobName: encode}\n  - {jobName: record, startMode: manual, startedReplicas: [1, 0]}\n",
        )
        .unwrap();
        let started = s.started();
        assert_eq!(
            started,
            BTreeSet::from([(0, "record".to_owned()), (1, "record".to_owned())])
        );
        let stopped = s.with_started(&BTreeSet::new());
        assert!(stopped.jobs[1].started_replicas.is_empty());
        assert!(s.same_revision(&stopped), "starting and stopping is not a revision");
        assert!(!s.same_applied(&stopped));
        assert!(
            s.same_applied(&s.with_started(&started)),
            "the order of startedReplicas is no change"
        );
        s.jobs[0].requirements.required_capacity = 2.0;
        assert!(!s.same_revision(&stopped));
        assert_eq!(s.with_started(&started).jobs[1].started_replicas, [0, 1]);
    }

    #[test]
    fn entries_of_auto_jobs_or_missing_replicas_are_never_started() {
        let s: BundleSpec = yaml_serde::from_str(
            "pool: p\njobs:\n  - {jobName: encode, startedReplicas: [0]}\n  - {jobName: record, startMode: manual, startedReplicas: [0, 1]}\n",
        )
        .unwrap();
        assert_eq!(s.started(), BTreeSet::from([(0, "record".to_owned())]));
    }

    #[test]
    fn omitted_fields_take_the_spec_defaults() {
        let s = spec();
        assert_eq!(s.on_launch, OnLaunch::AvoidSpare);
        assert_eq!(s.intra_replica_placement.same_az, IntraReplicaAz::Soft);
        assert_eq!(s.jobs[0].start_mode, crate::model::StartMode::Auto);
        assert!(s.jobs[0].requirements.is_essential());
    }

    #[test]
    fn the_job_phase_schema_lists_every_serde_name() {
        assert_eq!(
            crate::model::schema_names::<JobPhase>(),
            crate::model::serde_names(JobPhase::ALL)
        );
    }
}
