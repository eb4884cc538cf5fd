//! The simulation's checker: a reference of what the spec allows, fed only
//! by the inputs the model sends (losses, bundle updates, nodes starting,
//! commands) and the actions the core emits (calls, notifications,
//! replies) — never by the core's own counters — and the invariants it
//! holds the core to, each tied to its spec rule:
//!
//! - **Restart ceiling** (runtime failure policy): the reference counts each
//!   loss of a job's instance over a trailing hour, clears the count when a
//!   node provisioned for the job starts and when its bundle is updated or
//!   deleted, counts no loss to a reclaim (a node under an interruption
//!   notice), and
//!   says what each loss must bring: a re-placement, or — an invalid spec
//!   on the first rejection, `drop`, or past `maxRestartsPerHour` (the
//!   job's, else its policy's, else the flat one, else 6) — the terminal
//!   outcome: `jobDropped` for a non-essential job (and for `drop` and an
//!   invalid spec), `bundleBroken` for an essential one. The core's
//!   outcomes must match, step by step; a dropped job or a broken bundle is
//!   never placed again until the bundle is updated.
//! - **One node per job** (migration: "during the overlap the job is
//!   reserved on both nodes"): Manager never holds two live instances of a
//!   job (not stopping, not told to stop) outside a migration in flight of
//!   which they are the source and the target; checked at every instance
//!   Manager creates and after every step.
//! - **No orphan instance**: every live instance Manager holds is the job's
//!   placement of record or its migration target, as the core says.
//! - **Capacity, cores, GPU, capabilities and ports** (capacity
//!   contracts): on every node, what Manager runs there and every start on
//!   its way to it fit the node's capacity, cores and GPU, land only where
//!   the capabilities they require are, and no host port is claimed twice.
//! - **Kept apart** (`separateFrom`, a hard rule): no running instance of a
//!   job shares a node with one of a job of its replica it is kept apart
//!   from.
//! - **No leaked node** (`provisionTimeoutMs`): a node the core asked for
//!   that has not started within its tier's timeout has been terminated.
//! - **Single-use nodes released** (`singleUse`): a cloud node a single-use
//!   job ran on is terminated once nothing is left on it.
//! - **Drains** (drain / cordon): `partial` terminates nothing and leaves
//!   the node cordoned; `failed` only when `uncordonNode` cancelled it, or
//!   its node stopped, left the fleet (its create failed) or was
//!   terminated; a drain past its timeout has ended, or — forced —
//!   terminated its node; one drain per node.
//! - **Recovery spacing** (`MIN_RECOVERY_INTERVAL_MS`): consecutive
//!   recovery placements of a job are at least 5 s apart.
//! - **Liveness**: once faults stop and the fleet settles, every job the
//!   spec keeps live runs where the core says it does, unless no node could
//!   hold it.
//!
//! It also holds the core's published views to what they must say: no job
//! bound to a node that is gone or over-committed, a drain `done` only with
//! every job moved, a co-located group never split outside a cut-over, a
//! job never left running nowhere before its migration's point of no
//! return, spare counts agreeing across the reconciler, the status and the
//! pool gauge.

use std::collections::{BTreeMap, BTreeSet};

use norsk_auto_manager::automanager::binding::Binding;
use norsk_auto_manager::automanager::recovery::MIN_RECOVERY_INTERVAL_MS;
use norsk_auto_manager::automanager::{
    Action, AutoManagerCore, Command, CommandId, Decision, DrainAfter, DrainPhase, DrainState, MigrationId,
    MigrationState, Notification, RequestId, Rpc,
};
use norsk_auto_manager::model::{
    Bundle, BundleId, InstanceKey, JobId, JobSpec, NodeId, OnRuntimeFailure, Requirements, UnixMillis,
};

use super::{AWS_PROVISION_TIMEOUT_MS, Instance, ManagerNode, NodePhase};

/// The spec's default restart ceiling.
const DEFAULT_MAX_RESTARTS_PER_HOUR: u32 = 6;
/// The trailing hour the ceiling counts over.
const HOUR_MS: i64 = 3_600_000;

/// How an instance was lost, as the model reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Loss {
    /// It failed at runtime (Manager's job history records it).
    Failed,
    /// The worker refused it, not for its spec (the refusal reaches the
    /// stream as `JobRejected` alone; the history does not record it).
    Refused,
    /// The worker refused it as `JOB_REJECTED_INVALID_SPEC`.
    InvalidSpec,
    /// Its node stopped or is stopping.
    NodeLost,
}

/// What Manager holds, as the model knows it.
pub(super) struct ManagerView<'a> {
    pub(super) now: UnixMillis,
    pub(super) nodes: &'a BTreeMap<NodeId, ManagerNode>,
    pub(super) instances: &'a BTreeMap<(JobId, InstanceKey), Instance>,
    pub(super) pending: &'a [(RequestId, UnixMillis, Rpc)],
    pub(super) bundles: &'a BTreeMap<BundleId, Bundle>,
    pub(super) spares_untagged: u64,
    /// The `aws` tier's `maxNodes` as last commanded.
    pub(super) aws_max_nodes: usize,
    /// A published Manager: nodes are known by what people declared and
    /// what they were created as (see `super::published`).
    pub(super) published: bool,
}

impl ManagerView<'_> {
    /// Whether a `StopJob` for the instance is on its way.
    fn told_to_stop(&self, job: &JobId, key: &InstanceKey, node: &NodeId) -> bool {
        self.pending.iter().any(|(_, _, rpc)| {
            matches!(rpc, Rpc::StopJob { job_id, instance_key, node_id }
                if job_id == job && instance_key == key && node_id == node)
        })
    }

    /// The instances that run or are about to: not held on a stopping
    /// node, not told to stop.
    fn live(&self) -> impl Iterator<Item = (&JobId, &InstanceKey, &Instance)> {
        self.instances
            .iter()
            .filter(|((job, key), i)| !i.held && !self.told_to_stop(job, key, &i.node))
            .map(|((job, key), i)| (job, key, i))
    }

    /// Starts on their way to a node (`StartJob`, `StartMigrationTarget`):
    /// (job, key, node).
    fn starting(&self) -> impl Iterator<Item = (&JobId, &InstanceKey, &NodeId)> {
        self.pending.iter().filter_map(|(_, _, rpc)| match rpc {
            Rpc::StartJob {
                job_id,
                instance_key,
                node_id,
                ..
            }
            | Rpc::StartMigrationTarget {
                job_id,
                instance_key,
                node_id,
                ..
            } => Some((job_id, instance_key, node_id)),
            _ => None,
        })
    }

    fn spec_of(&self, job: &JobId) -> Option<&JobSpec> {
        spec_of(self.bundles, job)
    }
}

/// The spec of `job` (`<bundle>/<replica>/<name>`) in the bundles Manager
/// holds.
fn spec_of<'a>(bundles: &'a BTreeMap<BundleId, Bundle>, job: &JobId) -> Option<&'a JobSpec> {
    let (bundle, rest) = job.as_str().split_once('/')?;
    let name = rest.split_once('/')?.1;
    bundles
        .get(&BundleId::from(bundle))?
        .spec
        .jobs
        .iter()
        .find(|j| j.job_name == name)
}

fn bundle_of(job: &JobId) -> BundleId {
    BundleId::from(job.as_str().split('/').next().unwrap_or_default())
}

/// The settings' restart ceilings.
#[derive(Clone, Debug, Default)]
struct Ceilings {
    prefer_spare: Option<u32>,
    avoid_spare: Option<u32>,
    flat: Option<u32>,
}

impl Ceilings {
    /// Read from the settings' YAML (`failurePolicies`,
    /// `maxRestartsPerHour`).
    fn parse(yaml: &str) -> Self {
        let value: yaml_serde::Value = yaml_serde::from_str(yaml).unwrap_or_default();
        let ceiling = |v: &yaml_serde::Value| v.get("maxRestartsPerHour").and_then(|c| c.as_u64()).map(|c| c as u32);
        let policy = |name: &str| value.get("failurePolicies").and_then(|p| p.get(name)).and_then(ceiling);
        Self {
            prefer_spare: policy("preferSpare"),
            avoid_spare: policy("avoidSpare"),
            flat: ceiling(&value),
        }
    }

    /// "per job via `requirements.maxRestartsPerHour`, per policy via
    /// `failurePolicies`, else the flat `maxRestartsPerHour`" (default 6);
    /// none for `drop`.
    fn of(&self, requirements: &Requirements) -> Option<u32> {
        let policy = match requirements.on_runtime_failure {
            OnRuntimeFailure::PreferSpare => self.prefer_spare,
            OnRuntimeFailure::AvoidSpare => self.avoid_spare,
            OnRuntimeFailure::Drop => return None,
        };
        Some(
            requirements
                .max_restarts_per_hour
                .or(policy)
                .or(self.flat)
                .unwrap_or(DEFAULT_MAX_RESTARTS_PER_HOUR),
        )
    }
}

/// Whether the failure policy judges a loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Judgement {
    /// Not the job's placement of record, or a source its migration
    /// carries on from.
    Not,
    Judged,
    /// Either is right (see [`Reference::judged`]).
    Uncertain,
}

/// What the failure policy makes of a loss, before any count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
    /// The job ends (`drop`, an invalid spec).
    Ends,
    /// Nothing is counted (a node under an interruption notice).
    Uncounted,
    /// The loss counts against this ceiling.
    Counts(u32),
}

/// What the spec allows, followed from inputs and emitted actions.
pub(super) struct Reference {
    /// Each judged loss is traced (`CORE_SIM_TRACE`).
    pub(super) trace: bool,
    /// The Manager is a published one: it relays no migration signal, so
    /// none is sent and no handover runs.
    pub(super) published: bool,
    ceilings: Ceilings,
    /// Migrations in flight as the core announced them (`migrationPhase`).
    migrations: BTreeMap<MigrationId, MigrationState>,
    /// The targets of migrations that ended: one whose start was still on
    /// its way may yet be created, and is stopped as soon as it is.
    ended_targets: BTreeSet<(JobId, InstanceKey, NodeId)>,
    /// Of those, the targets of migrations that ended without moving the
    /// job there (aborted, or lost past the point of no return).
    abandoned_targets: BTreeSet<(JobId, InstanceKey, NodeId)>,
    /// Per job: its counted restarts since the last clear, each with
    /// whether Manager's job history records it (a runtime failure).
    restarts: BTreeMap<JobId, Vec<(UnixMillis, bool)>>,
    /// Per job: the runtime failures Manager's job history records since
    /// the bundle was last updated. A promoted standby rebuilds the ceiling
    /// from that history alone: it cannot know the losses the history does
    /// not record (a node lost, a start refused), nor that a node
    /// provisioned for the job started since (its start time is not in
    /// Manager's snapshot).
    recorded: BTreeMap<JobId, Vec<UnixMillis>>,
    /// Per job, after a promotion: failures the history records that the
    /// spec had already cleared (a node provisioned for the job started).
    /// The new leader may count them or not; the ceiling is then reached
    /// somewhere between the spec's own count and that count plus these.
    uncertain: BTreeMap<JobId, Vec<UnixMillis>>,
    /// This step: the terminal outcomes a promoted leader may announce,
    /// counting its uncertain failures (the job dropped, or its bundle
    /// broken with the job).
    allowed_dropped: BTreeSet<JobId>,
    allowed_broken: BTreeMap<BundleId, JobId>,
    /// Jobs the spec has dropped and bundles it has broken, until the
    /// bundle is updated.
    dropped: BTreeSet<JobId>,
    broken: BTreeSet<BundleId>,
    /// This step: the terminal outcomes the spec calls for, and those the
    /// core announced.
    expected_dropped: BTreeSet<JobId>,
    expected_broken: BTreeSet<BundleId>,
    seen_dropped: BTreeSet<JobId>,
    seen_broken: BTreeSet<BundleId>,
    /// Nodes under an interruption notice: what is lost with them is
    /// reclaimed, not failed.
    interrupted: BTreeSet<NodeId>,
    /// Nodes Manager reported stopping or stopped.
    lost_nodes: BTreeSet<NodeId>,
    /// The command whose reply is still to come.
    command: Option<(CommandId, Command)>,
    /// Nodes the core asked Manager to create, with when.
    created: BTreeMap<NodeId, UnixMillis>,
    /// Nodes the core asked Manager to terminate, with when it last did.
    terminated: BTreeMap<NodeId, UnixMillis>,
    /// Cloud nodes an instance of a single-use job was created on.
    single_use_hosts: BTreeSet<NodeId>,
    /// Each job's last recovery placement.
    last_recovery: BTreeMap<JobId, UnixMillis>,
    /// Drains not ended, as last announced (`drainProgress`).
    running_drains: BTreeMap<NodeId, DrainState>,
    /// Jobs whose window is over.
    ended: BTreeSet<JobId>,
    /// Jobs being re-placed, with the node their re-placement keeps away
    /// from (where the instance was lost, or the source a lost migration
    /// left), until Manager accepts a start of them.
    excluded: BTreeMap<JobId, NodeId>,
}

impl Reference {
    /// A reference for settings whose ceilings `ceilings` (YAML) gives.
    pub(super) fn new(ceilings: &str) -> Self {
        Self {
            trace: false,
            published: false,
            ceilings: Ceilings::parse(ceilings),
            migrations: BTreeMap::new(),
            ended_targets: BTreeSet::new(),
            abandoned_targets: BTreeSet::new(),
            restarts: BTreeMap::new(),
            recorded: BTreeMap::new(),
            uncertain: BTreeMap::new(),
            allowed_dropped: BTreeSet::new(),
            allowed_broken: BTreeMap::new(),
            dropped: BTreeSet::new(),
            broken: BTreeSet::new(),
            expected_dropped: BTreeSet::new(),
            expected_broken: BTreeSet::new(),
            seen_dropped: BTreeSet::new(),
            seen_broken: BTreeSet::new(),
            interrupted: BTreeSet::new(),
            lost_nodes: BTreeSet::new(),
            command: None,
            created: BTreeMap::new(),
            terminated: BTreeMap::new(),
            single_use_hosts: BTreeSet::new(),
            last_recovery: BTreeMap::new(),
            running_drains: BTreeMap::new(),
            ended: BTreeSet::new(),
            excluded: BTreeMap::new(),
        }
    }

    /// The migration in flight of `job`, as last announced.
    fn in_flight_of(&self, job: &JobId) -> Option<&MigrationState> {
        self.migrations.values().find(|m| &m.job_id == job)
    }

    /// Whether the loss of instance `key` of `job` on `node` is one the
    /// failure policy judges: it is the job's placement of record (the core
    /// told Manager to start it there, or placed it on that node), and not
    /// a migration's source the saga carries on from — one past its point
    /// of no return, or whose target already runs.
    ///
    /// The target of a migration that ended without moving the job there,
    /// whose stop never landed, is no placement of record; but Manager's
    /// history does not record how a migration ended, so a successor sees
    /// that instance, having run, as the job's only placement and adopts
    /// it. Its loss is then the successor's to judge — unless a start its
    /// predecessor made after the migration ended lands first and places
    /// the job again. The spec allows either: the loss is uncertain.
    pub(super) fn judged(
        &self,
        job: &JobId,
        key: &InstanceKey,
        node: &NodeId,
        binding: Option<&Binding>,
        target_runs: &dyn Fn(&MigrationState) -> bool,
    ) -> Judgement {
        let Some(binding) = binding.filter(|b| &b.node_id == node && &b.instance_key == key) else {
            return Judgement::Not;
        };
        if self
            .abandoned_targets
            .contains(&(job.clone(), key.clone(), node.clone()))
        {
            return Judgement::Uncertain;
        }
        match self.in_flight_of(job) {
            Some(m) if m.source_node_id == binding.node_id && m.source_key == binding.instance_key => {
                if m.past_point_of_no_return || target_runs(m) {
                    Judgement::Not
                } else {
                    Judgement::Judged
                }
            }
            _ => Judgement::Judged,
        }
    }

    /// A loss of `job` on `node` at `now` the core may judge or not (see
    /// [`Self::judged`]): the terminal outcome counting it is allowed, not
    /// expected, and it counts as an uncertain failure from here on.
    pub(super) fn uncertain_loss(&mut self, job: &JobId, spec: &JobSpec, loss: Loss, node: &NodeId, now: UnixMillis) {
        if self.dropped.contains(job) {
            return;
        }
        let requirements = &spec.requirements;
        // As `loss` judges it, the failure counted as uncertain.
        let terminal = match self.policy(loss, spec, node) {
            Policy::Ends => true,
            Policy::Uncounted => false,
            Policy::Counts(ceiling) => {
                let counted = self
                    .restarts
                    .get(job)
                    .into_iter()
                    .flatten()
                    .filter(|&&(at, _)| at > now - HOUR_MS)
                    .count();
                let uncertain = self.uncertain.entry(job.clone()).or_default();
                uncertain.retain(|&at| at > now - HOUR_MS);
                let reached = (counted + uncertain.len()) as u32 >= ceiling;
                uncertain.push(now);
                reached
            }
        };
        if self.trace {
            eprintln!(
                "{now} reference: {job} lost on {node}, uncertain: {}, may end it {terminal}",
                self.restarts_of(job)
            );
        }
        if terminal {
            if requirements.essential.unwrap_or(true) {
                self.allowed_broken.insert(bundle_of(job), job.clone());
            }
            self.allowed_dropped.insert(job.clone());
        }
    }

    /// What the failure policy makes of a loss of a job of `spec` on
    /// `node`, before any count.
    fn policy(&self, loss: Loss, spec: &JobSpec, node: &NodeId) -> Policy {
        match (loss, self.ceilings.of(&spec.requirements)) {
            // "An invalid spec is terminal on the first rejection."
            (Loss::InvalidSpec, _) => Policy::Ends,
            // "`drop` has no ceiling entry: it never restarts."
            (_, None) => Policy::Ends,
            // "None of it counts against the restart ceiling."
            (Loss::NodeLost, Some(_)) if self.interrupted.contains(node) => Policy::Uncounted,
            (_, Some(ceiling)) => Policy::Counts(ceiling),
        }
    }

    /// A judged loss of `job` on `node` at `now`: what the spec says comes
    /// of it. Its re-placement keeps away from `node`.
    pub(super) fn loss(&mut self, job: &JobId, spec: &JobSpec, loss: Loss, node: &NodeId, now: UnixMillis) {
        // A job that has ended already ends no more.
        if self.dropped.contains(job) {
            return;
        }
        self.excluded.insert(job.clone(), node.clone());
        let requirements = &spec.requirements;
        // Terminal, and whether it was the ceiling.
        let terminal = match self.policy(loss, spec, node) {
            Policy::Ends => Some(false),
            Policy::Uncounted => None,
            Policy::Counts(ceiling) => {
                let restarts = self.restarts.entry(job.clone()).or_default();
                restarts.retain(|&(at, _)| at > now - HOUR_MS);
                let uncertain = self.uncertain.get_mut(job).map_or(0, |u| {
                    u.retain(|&at| at > now - HOUR_MS);
                    u.len()
                });
                if restarts.len() as u32 >= ceiling {
                    Some(true)
                } else {
                    if (restarts.len() + uncertain) as u32 >= ceiling {
                        // A promoted leader that counts the failures its
                        // history shows may end the job here.
                        if requirements.essential.unwrap_or(true) {
                            self.allowed_broken.insert(bundle_of(job), job.clone());
                        } else {
                            self.allowed_dropped.insert(job.clone());
                        }
                    }
                    restarts.push((now, loss == Loss::Failed));
                    None
                }
            }
        };
        if self.trace {
            eprintln!(
                "{now} reference: {job} lost ({loss:?}) on {node}: {}, terminal {terminal:?}",
                self.restarts_of(job)
            );
        }
        let Some(ceiling_reached) = terminal else {
            return;
        };
        self.dropped.insert(job.clone());
        let essential = requirements.essential.unwrap_or(true);
        if !ceiling_reached || !essential {
            self.expected_dropped.insert(job.clone());
        }
        let bundle = bundle_of(job);
        if essential && self.broken.insert(bundle.clone()) {
            self.expected_broken.insert(bundle);
        }
    }

    /// "The history clears when the bundle is updated", and so does its
    /// broken mark (and with it its jobs' drops). An outcome not announced
    /// yet (a loss a new leader, still following the stream, has yet to
    /// judge) never will be: the update supersedes it.
    pub(super) fn bundle_updated(&mut self, bundle: &BundleId) {
        let (seen_dropped, seen_broken) = (&self.seen_dropped, &self.seen_broken);
        self.expected_dropped
            .retain(|job| &bundle_of(job) != bundle || seen_dropped.contains(job));
        if !seen_broken.contains(bundle) {
            self.expected_broken.remove(bundle);
        }
        self.broken.remove(bundle);
        self.excluded.retain(|job, _| &bundle_of(job) != bundle);
        self.dropped.retain(|job| &bundle_of(job) != bundle);
        self.restarts.retain(|job, _| &bundle_of(job) != bundle);
        self.recorded.retain(|job, _| &bundle_of(job) != bundle);
        self.uncertain.retain(|job, _| &bundle_of(job) != bundle);
    }

    /// Manager's history of `job` records a runtime failure at `at`
    /// (whether or not the spec judges it: a promoted leader reads every
    /// one).
    pub(super) fn failure_recorded(&mut self, job: &JobId, at: UnixMillis) {
        self.recorded.entry(job.clone()).or_default().push(at);
    }

    /// The event stream broke and a successor core hydrated from Manager's
    /// snapshot (the bundles and jobs Manager holds a verdict on). What the
    /// successor knows:
    ///
    /// - each job's restarts are what they were (the successor carries its
    ///   predecessor's count on: Manager's history cannot say when a node
    ///   provisioned for the job started) — so this reference keeps its own;
    /// - a bundle broken, a job dropped, stays so until its bundle is
    ///   updated or deleted: announced once, an outcome is not taken back
    ///   because its verdict's write had not reached Manager yet, and one
    ///   Manager holds stands too;
    /// - no recovery is under way: no exclusion, no spacing to keep.
    pub(super) fn reconnected(&mut self, broken: &BTreeSet<BundleId>, dropped: &BTreeSet<JobId>) {
        self.broken.extend(broken.iter().cloned());
        self.dropped.extend(dropped.iter().cloned());
        self.excluded.clear();
        self.last_recovery.clear();
    }

    /// The leader's process is gone, and a standby takes over: what it
    /// counted and was told that Manager does not hold goes with it — its
    /// terminal outcomes among them, but for those Manager holds (`broken`,
    /// `dropped`). From here on — while the new leader still follows the
    /// stream, before it acts — losses are the new leader's to judge.
    pub(super) fn promoting(
        &mut self,
        broken: &BTreeSet<BundleId>,
        dropped: &BTreeSet<JobId>,
        single_use_ran_on: &BTreeSet<NodeId>,
    ) {
        self.broken.clone_from(broken);
        self.dropped.clone_from(dropped);
        // A node a single-use job left is released by whoever knows it
        // ran there: the new leader only by the job's history (a deleted
        // bundle's jobs are gone with it).
        self.single_use_hosts.retain(|node| single_use_ran_on.contains(node));
        // The restart ceiling is rebuilt from Manager's job history: the
        // runtime failures it records count on, the losses it does not are
        // forgotten with the process that counted them; failures the spec
        // had cleared are uncertain.
        for restarts in self.restarts.values_mut() {
            restarts.retain(|&(_, recorded)| recorded);
        }
        self.uncertain = self
            .recorded
            .iter()
            .map(|(job, recorded)| {
                let mut counted: Vec<UnixMillis> = self
                    .restarts
                    .get(job)
                    .into_iter()
                    .flatten()
                    .map(|&(at, _)| at)
                    .collect();
                let cleared = recorded
                    .iter()
                    .filter(|at| match counted.iter().position(|c| c == *at) {
                        Some(i) => {
                            counted.swap_remove(i);
                            false
                        }
                        None => true,
                    })
                    .copied()
                    .collect();
                (job.clone(), cleared)
            })
            .collect();
        // An interruption notice the old leader was handed by command (the
        // embedder's direct call) went with it: what its node loses from now
        // on counts against the ceiling, as the new leader counts it.
        self.interrupted.clear();
        // So did its migrations: a loss of a source is judged as any loss,
        // and a target its late call still creates is the next leader's to
        // stop.
        for (_, m) in std::mem::take(&mut self.migrations) {
            self.ended_targets.insert((m.job_id, m.target_key, m.target_node_id));
        }
    }

    /// A standby is promoted in place of a leader that is gone: drains,
    /// migrations and interruption notices were the old leader's own and
    /// end with it; what Manager holds stands.
    pub(super) fn promoted(
        &mut self,
        broken: &BTreeSet<BundleId>,
        dropped: &BTreeSet<JobId>,
        created: &BTreeMap<NodeId, UnixMillis>,
    ) {
        // The verdicts of the old leader's that landed while the new one
        // followed, beside the outcomes of losses the new one judges: one
        // Manager holds by the time the new leader acts is not announced
        // again.
        self.expected_broken.retain(|bundle| !broken.contains(bundle));
        self.expected_dropped.retain(|job| !dropped.contains(job));
        self.broken.extend(broken.iter().cloned());
        self.dropped.extend(dropped.iter().cloned());
        // The new leader cannot know when its predecessor asked for a node,
        // only when Manager created it: its provision deadline runs from
        // then.
        for (node, asked) in &mut self.created {
            if let Some(&at) = created.get(node) {
                *asked = (*asked).max(at);
            }
        }
        self.running_drains.clear();
        self.migrations.clear();
        self.command = None;
    }

    /// Whether the spec has broken `job`'s bundle.
    pub(super) fn is_broken(&self, job: &JobId) -> bool {
        self.broken.contains(&bundle_of(job))
    }

    /// "The history clears when a node provisioned for the job starts."
    pub(super) fn provisioned_node_started(&mut self, job: &JobId) {
        self.restarts.remove(job);
        self.uncertain.remove(job);
    }

    /// Manager created an instance of `job` on `node`.
    pub(super) fn instance_created(&mut self, node: &NodeId, single_use: bool) {
        if single_use && self.created.contains_key(node) {
            self.single_use_hosts.insert(node.clone());
        }
    }

    /// Manager reported `node` stopping or stopped.
    pub(super) fn node_lost(&mut self, node: &NodeId) {
        self.lost_nodes.insert(node.clone());
    }

    /// Manager forgot `node`.
    pub(super) fn node_gone(&mut self, node: &NodeId) {
        self.interrupted.remove(node);
        self.created.remove(node);
        self.single_use_hosts.remove(node);
    }

    /// Manager refused to create `node`: it leaves nothing behind.
    /// A terminate of `node` by a leader that is gone was never carried
    /// out: the node stands, and is its successor's to judge.
    pub(super) fn termination_undone(&mut self, node: &NodeId) {
        self.terminated.remove(node);
    }

    pub(super) fn provision_refused(&mut self, node: &NodeId) {
        self.created.remove(node);
        self.create_failed(node);
    }

    /// The core was told the create of `node` failed (whether or not
    /// Manager carried it out): for the core, the node left its fleet.
    pub(super) fn create_failed(&mut self, node: &NodeId) {
        self.lost_nodes.insert(node.clone());
    }

    /// Manager accepted a start of `job`: its re-placement is done.
    pub(super) fn started(&mut self, job: &JobId) {
        self.excluded.remove(job);
    }

    /// The job's window is over.
    pub(super) fn job_ended(&mut self, job: &JobId) {
        self.ended.insert(job.clone());
        // A job deleted before the core acted on its loss (a new leader
        // still following the stream) has no drop left to announce.
        if !self.seen_dropped.contains(job) {
            self.expected_dropped.remove(job);
        }
    }

    /// The model issued `command` as `id`.
    pub(super) fn commanded(&mut self, id: CommandId, command: Command) {
        self.command = Some((id, command));
    }

    /// Before Manager creates instance `key` of `job` on `node`: no other
    /// live instance of the job may run beside it, but a migration's source
    /// beside its target.
    pub(super) fn may_create(
        &self,
        job: &JobId,
        key: &InstanceKey,
        node: &NodeId,
        instances: &BTreeMap<(JobId, InstanceKey), Instance>,
        pending: &[(RequestId, UnixMillis, Rpc)],
    ) -> Result<(), String> {
        let stopping = |k: &InstanceKey, n: &NodeId| {
            pending.iter().any(|(_, _, rpc)| {
                matches!(rpc, Rpc::StopJob { job_id, instance_key, node_id }
                    if job_id == job && instance_key == k && node_id == n)
            })
        };
        // The target of a migration that has ended: stopped as soon as it
        // is created (checked after the step).
        if self.ended_targets.contains(&(job.clone(), key.clone(), node.clone())) {
            return Ok(());
        }
        let migration = self
            .in_flight_of(job)
            .filter(|m| &m.target_key == key && &m.target_node_id == node);
        for ((j, k), i) in instances.range((job.clone(), InstanceKey(String::new()))..) {
            if j != job {
                break;
            }
            // The target of a migration that has ended is stopped as soon
            // as it is created: by the core that ended the migration, or —
            // created by a call of a leader that is gone — by its successor
            // once it acts (checked after the step).
            let ended_target = self.ended_targets.contains(&(job.clone(), k.clone(), i.node.clone()));
            if i.held || stopping(k, &i.node) || ended_target {
                continue;
            }
            let its_source = migration.is_some_and(|m| &m.source_key == k && m.source_node_id == i.node);
            if !its_source {
                return Err(format!(
                    "{job} started on {node} as {key} while running on {} as {k}",
                    i.node
                ));
            }
        }
        Ok(())
    }

    /// One action the core emitted at `at`: what the reference learns from
    /// it, and the rules it must keep there and then.
    pub(super) fn observe(
        &mut self,
        at: UnixMillis,
        action: &Action,
        core: &AutoManagerCore,
        took_out_of_service: bool,
    ) -> Result<(), String> {
        match action {
            Action::Notify(notification) => self.observe_notification(at, notification, core, took_out_of_service),
            Action::Reply { command, result } => {
                if let Some((id, issued)) = self.command.take() {
                    if id != *command {
                        self.command = Some((id, issued));
                    } else if result.is_ok()
                        && let Command::HandleNodeInterruption { node_id, .. } = issued
                    {
                        self.interrupted.insert(node_id);
                    }
                }
                Ok(())
            }
            Action::Answer { command, .. } => {
                if self.command.as_ref().is_some_and(|(id, _)| id == command) {
                    self.command = None;
                }
                Ok(())
            }
            Action::Call { rpc, .. } => self.observe_call(at, rpc),
        }
    }

    fn observe_call(&mut self, at: UnixMillis, rpc: &Rpc) -> Result<(), String> {
        match rpc {
            Rpc::CreateNode { node_id, .. } => {
                self.created.insert(node_id.clone(), at);
            }
            Rpc::TerminateNode { node_id } => {
                self.terminated.insert(node_id.clone(), at);
            }
            // The core knows the Manager at hand relays none.
            Rpc::SendMigrationSignal { migration_id, .. } if self.published => {
                return Err(format!(
                    "migration {migration_id} signals a Manager that relays no migration signals"
                ));
            }
            Rpc::StartJob { job_id, .. } => {
                if self.dropped.contains(job_id) {
                    return Err(format!("StartJob for {job_id}, which the spec has dropped"));
                }
                if self.broken.contains(&bundle_of(job_id)) {
                    return Err(format!("StartJob for {job_id} of broken bundle {}", bundle_of(job_id)));
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn observe_notification(
        &mut self,
        at: UnixMillis,
        notification: &Notification,
        core: &AutoManagerCore,
        took_out_of_service: bool,
    ) -> Result<(), String> {
        match notification {
            Notification::MigrationPhase(state) => {
                // "A `handover` migration runs as `overlap`", and says so.
                if self.published
                    && (state.strategy == norsk_auto_manager::model::MigrationStrategy::Handover
                        || state.note.is_some()
                            && state.strategy != norsk_auto_manager::model::MigrationStrategy::Overlap)
                {
                    return Err(format!(
                        "migration {} runs as {:?} ({:?}) on a Manager that relays no migration signals",
                        state.migration_id, state.strategy, state.note
                    ));
                }
                // A lost migration's job is placed afresh away from its
                // source.
                if state.phase == norsk_auto_manager::automanager::MigrationPhase::Lost {
                    self.excluded.insert(state.job_id.clone(), state.source_node_id.clone());
                }
                if state.phase.is_ended() {
                    self.migrations.remove(&state.migration_id);
                    if state.phase != norsk_auto_manager::automanager::MigrationPhase::Done {
                        self.abandoned_targets.insert((
                            state.job_id.clone(),
                            state.target_key.clone(),
                            state.target_node_id.clone(),
                        ));
                    }
                    self.ended_targets.insert((
                        state.job_id.clone(),
                        state.target_key.clone(),
                        state.target_node_id.clone(),
                    ));
                } else {
                    self.migrations.insert(state.migration_id.clone(), (**state).clone());
                }
            }
            Notification::JobDropped { job_id, .. } => {
                self.seen_dropped.insert(job_id.clone());
            }
            Notification::BundleBroken { bundle_id, .. } => {
                self.seen_broken.insert(bundle_id.clone());
            }
            Notification::PlacementDecision(info) => {
                if let Decision::Placed { node_id, .. } = &info.decision
                    && core.is_cordoned(node_id)
                {
                    return Err(format!("{} placed on cordoned node {node_id}", info.job_id));
                }
                if self.broken.contains(&info.bundle_id) {
                    return Err(format!("broken bundle {} got a placement", info.bundle_id));
                }
                if self.dropped.contains(&info.job_id) {
                    return Err(format!("dropped job {} got a placement", info.job_id));
                }
                // A drain's migration targets are re-placements but not
                // recoveries from a failure.
                if info.recovery && !took_out_of_service {
                    if let Some(last) = self.last_recovery.get(&info.job_id)
                        && at - last < MIN_RECOVERY_INTERVAL_MS
                    {
                        return Err(format!("recoveries of {} {}ms apart", info.job_id, at - last));
                    }
                    self.last_recovery.insert(info.job_id.clone(), at);
                }
            }
            Notification::DrainProgress(state) => {
                let running = self.running_drains.get(&state.node_id);
                if running.is_some_and(|r| r.started != state.started) && !state.phase.is_final() {
                    return Err(format!("a second drain of {} while one runs", state.node_id));
                }
                if state.phase.is_final() {
                    self.running_drains.remove(&state.node_id);
                    // "`uncordonNode` withdraws the notice with the drain."
                    if state.phase == DrainPhase::Failed
                        && matches!(&self.command, Some((_, Command::UncordonNode(n))) if n == &state.node_id)
                    {
                        self.interrupted.remove(&state.node_id);
                    }
                } else {
                    self.running_drains.insert(state.node_id.clone(), (**state).clone());
                }
                // `failed`: cancelled by `uncordonNode` before its
                // terminate, or its node stopped, left or was terminated
                // with a job still on it — never out of nothing.
                if state.phase == DrainPhase::Failed {
                    let uncordoned =
                        matches!(&self.command, Some((_, Command::UncordonNode(n))) if n == &state.node_id);
                    if !uncordoned
                        && !self.lost_nodes.contains(&state.node_id)
                        && !self.terminated_since(&state.node_id, state.started)
                    {
                        return Err(format!(
                            "drain of {} failed with its node up, not terminated and not uncordoned: {:?}",
                            state.node_id, state.reason
                        ));
                    }
                }
                // `partial`: "nothing terminated, node still cordoned".
                if state.phase == DrainPhase::Partial {
                    if self.terminated_since(&state.node_id, state.started) {
                        return Err(format!(
                            "drain of {} partial, but its node was terminated",
                            state.node_id
                        ));
                    }
                    if !core.is_cordoned(&state.node_id) {
                        return Err(format!(
                            "drain of {} partial, but its node is not cordoned",
                            state.node_id
                        ));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether the core asked for `node` to be terminated at or after
    /// `since`.
    fn terminated_since(&self, node: &NodeId, since: UnixMillis) -> bool {
        self.terminated.get(node).is_some_and(|&at| at >= since)
    }

    /// Every invariant, after a step.
    pub(super) fn check(&mut self, core: &AutoManagerCore, manager: &ManagerView) -> Result<(), String> {
        self.terminal_outcomes()?;
        self.one_node_per_job(manager)?;
        self.no_orphans(core, manager)?;
        self.capacity(manager)?;
        self.no_leaked_node(manager)?;
        self.single_use_released(core, manager)?;
        self.drains_end(manager)?;
        core_views(core, manager)
    }

    /// The core's terminal outcomes this step are those the spec calls
    /// for.
    fn terminal_outcomes(&mut self) -> Result<(), String> {
        let expected = (
            std::mem::take(&mut self.expected_dropped),
            std::mem::take(&mut self.expected_broken),
        );
        let seen = (
            std::mem::take(&mut self.seen_dropped),
            std::mem::take(&mut self.seen_broken),
        );
        if let Some(job) = expected.0.difference(&seen.0).next() {
            return Err(format!(
                "{job} must be dropped ({}), no jobDropped",
                self.restarts_of(job)
            ));
        }
        let allowed = (
            std::mem::take(&mut self.allowed_dropped),
            std::mem::take(&mut self.allowed_broken),
        );
        for job in seen.0.difference(&expected.0) {
            if !allowed.0.contains(job) {
                return Err(format!(
                    "{job} dropped, but the spec restarts it ({})",
                    self.restarts_of(job)
                ));
            }
            self.dropped.insert(job.clone());
        }
        if let Some(bundle) = expected.1.difference(&seen.1).next() {
            return Err(format!("bundle {bundle} must be broken, no bundleBroken"));
        }
        for bundle in seen.1.difference(&expected.1) {
            let Some(job) = allowed.1.get(bundle) else {
                return Err(format!("bundle {bundle} broken, but the spec restarts its jobs"));
            };
            self.broken.insert(bundle.clone());
            self.dropped.insert(job.clone());
        }
        Ok(())
    }

    fn restarts_of(&self, job: &JobId) -> String {
        format!(
            "restarts counted at {:?}, uncertain since a promotion {:?}",
            self.restarts
                .get(job)
                .into_iter()
                .flatten()
                .map(|&(at, _)| at)
                .collect::<Vec<_>>(),
            self.uncertain.get(job).map(Vec::as_slice).unwrap_or_default()
        )
    }

    /// No job runs on two nodes outside a migration overlap.
    fn one_node_per_job(&self, manager: &ManagerView) -> Result<(), String> {
        let mut by_job: BTreeMap<&JobId, Vec<(&InstanceKey, &NodeId)>> = BTreeMap::new();
        for (job, key, instance) in manager.live() {
            by_job.entry(job).or_default().push((key, &instance.node));
        }
        for (job, live) in by_job.into_iter().filter(|(_, l)| l.len() > 1) {
            let overlap = self.in_flight_of(job).is_some_and(|m| {
                live.len() == 2
                    && live.iter().all(|(k, n)| {
                        (**k == m.source_key && **n == m.source_node_id)
                            || (**k == m.target_key && **n == m.target_node_id)
                    })
            });
            if !overlap {
                return Err(format!("{job} runs on two nodes outside a migration overlap: {live:?}"));
            }
        }
        Ok(())
    }

    /// Every live instance is the job's placement of record or its
    /// migration target.
    fn no_orphans(&self, core: &AutoManagerCore, manager: &ManagerView) -> Result<(), String> {
        for (job, key, instance) in manager.live() {
            let record = core.job(job);
            let is = |b: Option<&Binding>| b.is_some_and(|b| &b.instance_key == key && b.node_id == instance.node);
            if !record.is_some_and(|r| is(r.binding.as_ref()) || is(r.migration_target())) {
                return Err(format!(
                    "orphan instance: {job} runs as {key} on {}, the core says {:?} (target {:?})",
                    instance.node,
                    record.and_then(|r| r.binding.as_ref()),
                    record.and_then(|r| r.migration_target())
                ));
            }
        }
        Ok(())
    }

    /// A node the core asked for that has not started within its tier's
    /// timeout has been terminated.
    fn no_leaked_node(&self, manager: &ManagerView) -> Result<(), String> {
        for (node, &asked) in &self.created {
            let launching = match manager.nodes.get(node) {
                Some(n) => n.phase == NodePhase::Starting,
                // Not answered yet.
                None => manager
                    .pending
                    .iter()
                    .any(|(_, _, rpc)| matches!(rpc, Rpc::CreateNode { node_id, .. } if node_id == node)),
            };
            if launching && manager.now > asked + AWS_PROVISION_TIMEOUT_MS && !self.terminated.contains_key(node) {
                return Err(format!(
                    "leaked node {node}: asked for at {asked}, not started within {AWS_PROVISION_TIMEOUT_MS} ms, \
                     not terminated"
                ));
            }
        }
        Ok(())
    }

    /// A single-use job's cloud node is terminated once nothing is left on
    /// it.
    fn single_use_released(&self, core: &AutoManagerCore, manager: &ManagerView) -> Result<(), String> {
        for node in &self.single_use_hosts {
            if self.terminated.contains_key(node)
                || manager.nodes.get(node).is_none_or(|n| n.phase == NodePhase::Stopping)
                || manager.instances.values().any(|i| &i.node == node)
                || manager.starting().any(|(_, _, n)| n == node)
                || core
                    .jobs()
                    .any(|r| r.is_bound_to(node) || r.migration_target().is_some_and(|t| &t.node_id == node))
            {
                continue;
            }
            return Err(format!("single-use node {node} empty and not released"));
        }
        Ok(())
    }

    /// A drain past its timeout has ended, or (forced) terminated its node.
    fn drains_end(&self, manager: &ManagerView) -> Result<(), String> {
        for drain in self.running_drains.values() {
            let deadline = drain.started + drain.timeout_ms as i64;
            if manager.now <= deadline
                || self.terminated_since(&drain.node_id, drain.started)
                || !manager.nodes.contains_key(&drain.node_id)
            {
                continue;
            }
            return Err(if drain.force {
                format!("forced drain of {} not terminated at its timeout", drain.node_id)
            } else {
                format!("drain of {} still {:?} past its timeout", drain.node_id, drain.phase)
            });
        }
        Ok(())
    }

    /// Liveness, once faults stopped and the fleet settled: every job the
    /// spec keeps live runs where the core says, unless no node could hold
    /// it.
    pub(super) fn live(&self, core: &AutoManagerCore, manager: &ManagerView) -> Result<(), String> {
        // No leaked node: what the core terminated is gone.
        if let Some(node) = self.terminated.keys().find(|n| manager.nodes.contains_key(*n)) {
            return Err(format!("{node} was terminated but Manager still runs it"));
        }
        for record in core.jobs() {
            let job = &record.job.job_id;
            if self.ended.contains(job)
                || self.dropped.contains(job)
                || self.broken.contains(&bundle_of(job))
                || record.job.dormant
            {
                continue;
            }
            let runs = record.binding.as_ref().is_some_and(|b| {
                manager
                    .instances
                    .get(&(job.clone(), b.instance_key.clone()))
                    .is_some_and(|i| i.node == b.node_id && i.running && !i.held)
            });
            if runs {
                continue;
            }
            if let Some(room) = room_for(job, self.excluded.get(job), core, manager) {
                return Err(format!(
                    "{job} is live but not running after the fleet settled ({room}); the core says {:?}",
                    record.binding
                ));
            }
        }
        Ok(())
    }
}

/// Where `job` (with the co-located peers it must join or bring along)
/// would fit now, if anywhere: a running node other than the one its
/// re-placement keeps away from (`excluded`, unless its group is there),
/// with the room, the ports and
/// no exclusive company (none at all for an exclusive job), or a new `aws`
/// node within `maxNodes`.
fn room_for(job: &JobId, excluded: Option<&NodeId>, core: &AutoManagerCore, manager: &ManagerView) -> Option<String> {
    let spec = manager.spec_of(job)?;
    let bundle = manager.bundles.get(&bundle_of(job))?;
    let replica = job.as_str().split('/').nth(1)?;
    let peer_id = |name: &str| JobId(format!("{}/{replica}/{name}", bundle.bundle_id));
    // The co-located group, as `random_bundle` makes them.
    let grouped = |s: &JobSpec| co_located(&bundle.spec, s);
    let group: Vec<&JobSpec> = if grouped(spec) {
        bundle.spec.jobs.iter().filter(|s| grouped(s)).collect()
    } else {
        vec![spec]
    };
    // A peer already running decides the node.
    let running_peer = group.iter().find_map(|s| {
        let peer = peer_id(&s.job_name);
        manager
            .instances
            .iter()
            .find(|((j, _), i)| *j == peer && i.running && !i.held)
            .map(|(_, i)| i.node.clone())
    });
    // A deferred start the port keeps (a published Manager) is none of
    // Manager's instances: it may be kept for a node long gone.
    let movers: Vec<&JobSpec> = group
        .iter()
        .copied()
        .filter(|s| {
            let peer = peer_id(&s.job_name);
            !manager.instances.iter().any(|((j, _), i)| *j == peer && !i.kept)
        })
        .collect();
    let need: f64 = movers.iter().map(|s| s.requirements.required_capacity).sum();
    let need_cores: u32 = movers.iter().map(|s| s.requirements.required_cores).sum();
    let need_gpu: f64 = movers.iter().map(|s| s.requirements.required_gpu_capacity).sum();
    let capabilities: BTreeSet<&String> = movers
        .iter()
        .flat_map(|s| s.requirements.required_capabilities.iter())
        .collect();
    // The jobs of the replica a mover is kept apart from, either way round.
    let apart: BTreeSet<JobId> = bundle
        .spec
        .jobs
        .iter()
        .filter(|other| {
            movers
                .iter()
                .any(|m| m.separate_from.contains(&other.job_name) || other.separate_from.contains(&m.job_name))
        })
        .map(|other| peer_id(&other.job_name))
        .collect();
    let ports: Vec<String> = movers
        .iter()
        .flat_map(|s| s.requirements.required_host_ports.iter().map(|p| p.to_string()))
        .collect();
    let exclusive = movers.iter().any(|s| s.exclusive);
    // A member rejoins its group even on the node its re-placement keeps
    // away from.
    let excluded = excluded.filter(|node| running_peer.as_ref() != Some(*node));
    let fits = |node: &NodeId, n: &ManagerNode| {
        if n.phase != NodePhase::Running || core.is_cordoned(node) || excluded == Some(node) {
            return false;
        }
        let here: Vec<&JobId> = manager
            .instances
            .iter()
            .filter(|(_, i)| &i.node == node)
            .map(|((j, _), _)| j)
            .collect();
        let mut used = Load::default();
        for s in here.iter().filter_map(|j| manager.spec_of(j)) {
            used.add(&s.requirements);
        }
        let taken: BTreeSet<String> = here
            .iter()
            .filter_map(|j| manager.spec_of(j))
            .flat_map(|s| s.requirements.required_host_ports.iter().map(|p| p.to_string()))
            .collect();
        let company: Vec<&JobId> = here
            .iter()
            .copied()
            .filter(|j| !group.iter().any(|s| peer_id(&s.job_name) == **j))
            .collect();
        // An exclusive job keeps a node to itself (its group excepted).
        let held = company.iter().any(|j| manager.spec_of(j).is_some_and(|s| s.exclusive));
        // Placement can count only on what the operator knows the node
        // holds.
        let known = n.known(manager.published);
        used.capacity + need <= known.capacity + 1e-9
            && used.cores + need_cores <= known.cores
            && used.gpu + need_gpu <= known.gpu + 1e-9
            && capabilities.iter().all(|c| known.capabilities.contains(c))
            && !here.iter().any(|j| apart.contains(*j))
            && !ports.iter().any(|p| taken.contains(p))
            && (!exclusive || company.is_empty())
            && !held
    };
    match running_peer {
        Some(node) => manager
            .nodes
            .get(&node)
            .filter(|n| fits(&node, n))
            .map(|_| format!("it fits beside its group on {node}")),
        None => {
            if let Some((node, _)) = manager.nodes.iter().find(|(id, n)| fits(id, n)) {
                return Some(format!("it fits on {node}"));
            }
            let aws = manager
                .nodes
                .iter()
                .filter(|(id, _)| id.as_str().starts_with("production-aws-"))
                .count();
            let aws_fits = need <= super::AWS_CAPACITY
                && need_cores <= super::AWS_CAPACITY as u32
                && need_gpu == 0.0
                && capabilities.is_empty();
            let max_nodes = manager.aws_max_nodes;
            (aws < max_nodes && aws_fits).then(|| format!("a new aws node would hold it ({aws} of {max_nodes})"))
        }
    }
}

impl Reference {
    /// What Manager runs on each node, with the starts on their way to it,
    /// fits the node: capacity, and each host port claimed once. Not
    /// counted: the start of a job whose window is over (Manager refuses
    /// it), and of a target whose migration has ended (the rollback
    /// released its reservation, and it is stopped as soon as it is
    /// created).
    fn capacity(&self, manager: &ManagerView) -> Result<(), String> {
        let mut load: BTreeMap<&NodeId, (Load, Vec<String>)> = BTreeMap::new();
        let starting = manager
            .starting()
            .filter(|(job, key, node)| {
                // A start sent again for an instance Manager already holds
                // there (its first answer was lost) is that instance.
                let held_there = manager
                    .instances
                    .get(&((*job).clone(), (*key).clone()))
                    .is_some_and(|i| &i.node == *node);
                !held_there
                    && !self.ended.contains(*job)
                    && !self
                        .ended_targets
                        .contains(&((*job).clone(), (*key).clone(), (*node).clone()))
            })
            // Two starts of one instance to one node (the second sent by a
            // successor that never heard of the first) make one instance.
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(|(job, _, node)| (job, node));
        let placed = manager.live().map(|(job, _, i)| (job, &i.node)).chain(starting);
        for (job, node) in placed {
            let Some(spec) = manager.spec_of(job) else { continue };
            if let Some(n) = manager.nodes.get(node)
                && let Some(missing) = spec
                    .requirements
                    .required_capabilities
                    .iter()
                    .find(|c| !n.capabilities.contains(c))
            {
                return Err(format!("{job} placed on {node}, which lacks capability {missing}"));
            }
            let entry = load.entry(node).or_default();
            entry.0.add(&spec.requirements);
            for port in &spec.requirements.required_host_ports {
                let port = port.to_string();
                if entry.1.contains(&port) {
                    return Err(format!("port {port} over-committed on {node}"));
                }
                entry.1.push(port);
            }
        }
        for (node, (used, _)) in load {
            let Some(n) = manager.nodes.get(node) else { continue };
            if used.capacity > n.capacity + 1e-9 {
                return Err(format!("{node} over-committed: {} of {}", used.capacity, n.capacity));
            }
            if used.cores > n.cores {
                return Err(format!("{node} over-committed: {} of {} cores", used.cores, n.cores));
            }
            if used.gpu > n.gpu + 1e-9 {
                return Err(format!("{node} GPU over-committed: {} of {}", used.gpu, n.gpu));
            }
        }
        separated(manager)
    }
}

/// The core's published views say what they must.
fn core_views(core: &AutoManagerCore, manager: &ManagerView) -> Result<(), String> {
    // No job bound to a node that is gone, and no node over-committed by
    // what the core holds there.
    let mut used: BTreeMap<NodeId, f64> = BTreeMap::new();
    for record in core.jobs() {
        let Some(binding) = &record.binding else { continue };
        *used.entry(binding.node_id.clone()).or_default() += record.job.spec.requirements.required_capacity;
    }
    for (node_id, capacity) in &used {
        let Some(node) = core.fleet().get(node_id) else {
            return Err(format!("job bound to unknown node {node_id}"));
        };
        // A node terminated with jobs on it (a forced drain, an eviction)
        // keeps them until Manager reports it stopping.
        let drained = core.drain_status(node_id).is_some();
        if (node.terminated && !node.cordoned && !drained) || node.is_going() {
            let bound: Vec<String> = core
                .jobs()
                .filter(|r| r.binding.as_ref().is_some_and(|b| &b.node_id == node_id))
                .map(|r| {
                    format!(
                        "{} as {}",
                        r.job.job_id,
                        r.binding.as_ref().map_or("", |b| b.instance_key.as_str())
                    )
                })
                .collect();
            return Err(format!(
                "job bound to a node that is gone: {node_id} ({})",
                bound.join(", ")
            ));
        }
        // Without the worker's inventory (a node launching, or any node of
        // a published Manager), what the operator knows it holds.
        let known = manager
            .nodes
            .get(node_id)
            .map_or(4.0, |n| n.known(manager.published).capacity);
        let usable = node.inventory.as_ref().map_or(known, |i| i.usable_capacity());
        if *capacity > usable + 1e-9 {
            let bound: Vec<String> = core
                .jobs()
                .filter_map(|r| {
                    let b = r.binding.as_ref().filter(|b| &b.node_id == node_id)?;
                    Some(format!("{} as {} ({:?})", r.job.job_id, b.instance_key, b.phase))
                })
                .collect();
            return Err(format!(
                "{node_id} over-committed in the core's view: {capacity} of {usable}, bound there: {}",
                bound.join(", ")
            ));
        }
    }
    // A spare that took a job (Manager accepted its start there) is an
    // ordinary node from then on.
    let accepted: BTreeSet<&NodeId> = core.jobs().filter_map(|r| r.accepted_on()).collect();
    if let Some(node) = accepted.iter().find(|n| core.spare_spec(n).is_some()) {
        return Err(format!("{node} carries an accepted job and is still a spare"));
    }
    // The reconciler's count, the status and the pool gauge agree, and
    // nothing is counted consumed that was not untagged for a job.
    let status = core.hot_spare_status();
    let metrics = core.metrics(manager.now);
    let gauge = metrics.pools.iter().find(|p| p.pool_name == "production");
    if let (Some(status), Some(gauge)) = (status.first(), gauge) {
        let spares: Vec<&NodeId> = core
            .fleet()
            .iter()
            .filter(|n| core.spare_spec(&n.id).is_some() && !accepted.contains(&n.id))
            .map(|n| &n.id)
            .collect();
        if gauge.live_spares != status.live || status.live + status.provisioning != spares.len() as u32 {
            return Err(format!(
                "spare counts disagree: status {status:?}, gauge {}, spares {spares:?}",
                gauge.live_spares
            ));
        }
        if status.consumed != manager.spares_untagged {
            return Err(format!(
                "{} spares counted consumed, {} untagged for a job",
                status.consumed, manager.spares_untagged
            ));
        }
    }
    // At most one drain per node, and a drain `done` terminated its node
    // unless it was a maintenance drain (`after: keep`), which keeps it;
    // "done" only if every job moved: none went down with the node.
    let mut drained = BTreeSet::new();
    for drain in core.drains() {
        if !drained.insert(drain.node_id.clone()) {
            return Err(format!("two drains of {}", drain.node_id));
        }
        if drain.phase == DrainPhase::Done
            && drain.after == DrainAfter::Terminate
            && core.fleet().get(&drain.node_id).is_some_and(|n| !n.terminated)
        {
            return Err(format!("drain of {} done, the node not terminated", drain.node_id));
        }
        if drain.phase == DrainPhase::Done && drain.jobs.iter().any(|j| !j.status.left_the_node()) {
            return Err(format!(
                "drain of {} done with a job left behind: {drain:?}",
                drain.node_id
            ));
        }
    }
    // A co-located group is never split across nodes, but for the cut-over
    // of a migration of it.
    for bundle in manager.bundles.values() {
        for replica in 0..bundle.spec.replica_count() {
            let members: Vec<_> = bundle
                .spec
                .jobs
                .iter()
                .filter(|j| co_located(&bundle.spec, j))
                .filter_map(|j| core.job(&JobId(format!("{}/{replica}/{}", bundle.bundle_id, j.job_name))))
                .collect();
            if members.iter().any(|r| r.migration.is_some()) {
                continue;
            }
            let nodes: BTreeSet<&NodeId> = members
                .iter()
                .filter_map(|r| r.binding.as_ref().map(|b| &b.node_id))
                .collect();
            if nodes.len() > 1 {
                return Err(format!(
                    "co-located group of {}/{replica} split across {nodes:?}",
                    bundle.bundle_id
                ));
            }
        }
    }
    // A job is never left running nowhere before the point of no return:
    // its source still runs where its binding says.
    for m in core.migrations() {
        if !m.is_in_flight() || m.past_point_of_no_return {
            continue;
        }
        let source_runs = manager
            .instances
            .get(&(m.job_id.clone(), m.source_key.clone()))
            .is_some_and(|i| i.running && i.node == m.source_node_id);
        let bound_there = core
            .job(&m.job_id)
            .and_then(|r| r.binding.as_ref())
            .is_some_and(|b| b.node_id == m.source_node_id && b.instance_key == m.source_key);
        if !source_runs || !bound_there {
            return Err(format!(
                "{} left running nowhere before the point of no return of {} ({:?})",
                m.job_id, m.migration_id, m.phase
            ));
        }
    }
    Ok(())
}

/// What the jobs on one node ask of it.
#[derive(Default)]
struct Load {
    capacity: f64,
    cores: u32,
    gpu: f64,
}

impl Load {
    fn add(&mut self, requirements: &norsk_auto_manager::model::Requirements) {
        self.capacity += requirements.required_capacity;
        self.cores += requirements.required_cores;
        self.gpu += requirements.required_gpu_capacity;
    }
}

/// `separateFrom` is a hard rule: no running instance of a job shares a
/// node with a running instance of a job of its replica it is kept apart
/// from (an instance told to stop no longer counts, as for capacity).
fn separated(manager: &ManagerView) -> Result<(), String> {
    let running: Vec<(&JobId, &NodeId)> = manager
        .live()
        .filter(|(_, _, i)| i.running)
        .map(|(j, _, i)| (j, &i.node))
        .collect();
    for (job, node) in &running {
        let Some(spec) = manager.spec_of(job) else { continue };
        let Some((replica, _)) = job.as_str().rsplit_once('/') else {
            continue;
        };
        for apart in &spec.separate_from {
            let peer = JobId(format!("{replica}/{apart}"));
            if running.iter().any(|(j, n)| **j == peer && n == node) {
                return Err(format!(
                    "{job} runs beside {peer} on {node}, which it is kept apart from"
                ));
            }
        }
    }
    Ok(())
}

/// Whether `job` is in its replica's co-located group, as `random_bundle`
/// makes them: every job declaring no rule under `sameNodeDefault`, or
/// `j0` and the jobs joining it.
fn co_located(bundle: &norsk_auto_manager::model::BundleSpec, job: &JobSpec) -> bool {
    if bundle.intra_replica_placement.same_node_default {
        return job.co_locate_with.is_empty() && job.separate_from.is_empty();
    }
    job.job_name == "j0" || job.co_locate_with.iter().any(|peer| peer == "j0")
}
